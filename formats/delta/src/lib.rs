//! The counter-delta format (being written).
#![no_std]

pub mod record;
