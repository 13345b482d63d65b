//! hrperf engine (being written).
#![no_std]
