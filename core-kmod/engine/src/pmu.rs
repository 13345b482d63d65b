//! The PMU programming model: what the engine needs from counters, as a trait that the
//! kernel (MSRs or perf kernel counters) and the userspace simulator implement.
//!
//! Counters count up and set their bit in [`Pmu::overflow_status`] when they wrap past
//! `2^width - 1`. Sampling every `period` events means writing [`arm_value`]`(width,
//! period)` into the counter after each overflow (the handler's `CTRL_RESET`); the engine
//! is then told the new raw value with `CpuSession::set_raw`.

use hrperf_abi::{EventDesc, MAX_COUNTERS};

use super::counter::width_mask;
use super::error::EngineError;

/// A performance-monitoring unit with `nr_counters()` programmable counters.
///
/// Calls happen on the CPU owning the PMU. An index at or above `nr_counters()` is a
/// caller bug: `program` returns an error, `read` returns 0 and `write` does nothing.
pub trait Pmu {
    /// Number of counters.
    fn nr_counters(&self) -> usize;
    /// Width in bits (32..=64) of counter `idx`'s raw value.
    fn width(&self, idx: usize) -> u32;
    /// Makes counter `idx` count `event`; it starts counting on [`enable`](Self::enable).
    fn program(&mut self, idx: usize, event: &EventDesc) -> Result<(), EngineError>;
    /// The raw value of counter `idx` (`width` bits).
    fn read(&mut self, idx: usize) -> u64;
    /// Sets the raw value of counter `idx` (bits above `width` are ignored).
    fn write(&mut self, idx: usize, raw: u64);
    /// Starts all programmed counters.
    fn enable(&mut self);
    /// Stops all counters (values are kept).
    fn disable(&mut self);
    /// Bit i set: counter i overflowed since the bit was last acknowledged.
    fn overflow_status(&mut self) -> u64;
    /// Clears the overflow bits in `mask`.
    fn ack(&mut self, mask: u64);
}

/// The raw value that makes a `width`-bit counter overflow after exactly `period` events:
/// `2^width - period`. `period` is clamped to `1..=2^width` (so 0 arms for one event and
/// anything longer than the counter arms for a full wrap, raw 0).
pub const fn arm_value(width: u32, period: u64) -> u64 {
    let mask = width_mask(width);
    let period = if period == 0 { 1 } else { period };
    if period > mask {
        return 0;
    }
    // mask - (period - 1) == 2^width - period, without computing 2^64.
    mask - (period - 1)
}

/// Events a `width`-bit counter at `raw` still counts before it overflows.
pub const fn events_to_overflow(width: u32, raw: u64) -> u64 {
    // 2^width - raw, as (mask - raw) + 1; saturates for width 64 at raw 0.
    (width_mask(width) - (raw & width_mask(width))).saturating_add(1)
}

/// Re-arms counter `idx` to overflow after `period` events; returns the raw value
/// written, for `CpuSession::set_raw`.
pub fn rearm<P: Pmu + ?Sized>(pmu: &mut P, idx: usize, period: u64) -> u64 {
    let raw = arm_value(pmu.width(idx), period);
    pmu.write(idx, raw);
    raw
}

/// Reads the first `min(nr_counters, MAX_COUNTERS)` counters into `raw`; returns how many.
pub fn read_all<P: Pmu + ?Sized>(pmu: &mut P, raw: &mut [u64; MAX_COUNTERS]) -> usize {
    let n = pmu.nr_counters().min(MAX_COUNTERS);
    for (i, r) in raw.iter_mut().enumerate().take(n) {
        *r = pmu.read(i);
    }
    n
}

/// The counter indices set in an overflow bitmask, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverflowBits(pub u64);

impl Iterator for OverflowBits {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// A minimal software PMU for the tests.
    struct FakePmu {
        width: u32,
        raw: [u64; 4],
        status: u64,
        enabled: bool,
        events: [u64; 4],
    }

    impl FakePmu {
        fn new(width: u32) -> Self {
            FakePmu { width, raw: [0; 4], status: 0, enabled: false, events: [0; 4] }
        }
        fn count(&mut self, idx: usize, n: u64) {
            if !self.enabled {
                return;
            }
            let mask = width_mask(self.width);
            let before = self.raw[idx];
            let after = before.wrapping_add(n) & mask;
            if n >= events_to_overflow(self.width, before) {
                self.status |= 1 << idx;
            }
            self.raw[idx] = after;
        }
    }

    impl Pmu for FakePmu {
        fn nr_counters(&self) -> usize {
            4
        }
        fn width(&self, _: usize) -> u32 {
            self.width
        }
        fn program(&mut self, idx: usize, e: &EventDesc) -> Result<(), EngineError> {
            let slot = self.events.get_mut(idx).ok_or(EngineError::Invalid { what: "idx" })?;
            *slot = e.config;
            Ok(())
        }
        fn read(&mut self, idx: usize) -> u64 {
            self.raw.get(idx).copied().unwrap_or(0)
        }
        fn write(&mut self, idx: usize, raw: u64) {
            if let Some(r) = self.raw.get_mut(idx) {
                *r = raw & width_mask(self.width);
            }
        }
        fn enable(&mut self) {
            self.enabled = true;
        }
        fn disable(&mut self) {
            self.enabled = false;
        }
        fn overflow_status(&mut self) -> u64 {
            self.status
        }
        fn ack(&mut self, mask: u64) {
            self.status &= !mask;
        }
    }

    #[test]
    fn arm_values() {
        assert_eq!(arm_value(48, 1000), (1 << 48) - 1000);
        assert_eq!(arm_value(40, 1), (1 << 40) - 1);
        assert_eq!(arm_value(32, 0), 0xffff_ffff);
        assert_eq!(arm_value(32, 1 << 32), 0);
        assert_eq!(arm_value(32, u64::MAX), 0);
        assert_eq!(arm_value(64, 5), u64::MAX - 4);
        assert_eq!(arm_value(64, u64::MAX), 1);
        assert_eq!(events_to_overflow(48, arm_value(48, 12_345)), 12_345);
        assert_eq!(events_to_overflow(64, 0), u64::MAX);
        assert_eq!(events_to_overflow(32, 0), 1 << 32);
    }

    #[test]
    fn armed_counter_overflows_after_exactly_period_events() {
        let mut pmu = FakePmu::new(40);
        let ev = EventDesc { kind: 0, flags: 0, config: 0xc0, config1: 0, config2: 0 };
        pmu.program(0, &ev).unwrap();
        assert!(pmu.program(9, &ev).is_err());
        assert_eq!(pmu.events[0], 0xc0);
        let written = rearm(&mut pmu, 0, 1000);
        assert_eq!(written, (1 << 40) - 1000);
        pmu.enable();
        pmu.count(0, 999);
        assert_eq!(pmu.overflow_status(), 0);
        pmu.count(0, 1);
        assert_eq!(pmu.overflow_status(), 1);
        assert_eq!(pmu.read(0), 0);
        pmu.ack(1);
        assert_eq!(pmu.overflow_status(), 0);
        pmu.disable();
        pmu.count(0, 5);
        assert_eq!(pmu.read(0), 0);
        pmu.write(1, 77);
        let mut raw = [9; MAX_COUNTERS];
        assert_eq!(read_all(&mut pmu, &mut raw), 4);
        assert_eq!(raw, [0, 77, 0, 0, 9, 9, 9, 9]);
    }

    #[test]
    fn overflow_bits() {
        let v: Vec<_> = OverflowBits(0b1010_0001).collect();
        assert_eq!(v, [0, 5, 7]);
        assert_eq!(OverflowBits(0).next(), None);
        assert_eq!(OverflowBits(1 << 63).next(), Some(63));
    }
}
