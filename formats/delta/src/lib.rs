//! delta format (being written).
#![no_std]
