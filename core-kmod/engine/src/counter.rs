//! 64-bit virtualisation of N-bit hardware counters (perfmon2's
//! `pfm_intr_process_64bit_ovfls`), for any width from 32 to 64 bits.
//!
//! A hardware counter of `width` bits wraps every `2^width` events. Between two readings
//! the engine sees only `raw` modulo `2^width`, so a reading lower than the previous one
//! means (at least) one wrap. Whether a *second* wrap could hide in an interval is
//! decided from the counter's maximum event rate: if `elapsed_ns * max_rate / 1e9` could
//! reach `delta + 2^width`, the true count may be `delta + k * 2^width` for some `k >= 1`,
//! and the update is flagged [`Update::multi_wrap`]. The delta is then a lower bound; it
//! is never silently wrong.

use super::error::EngineError;

/// Smallest supported counter width in bits.
pub const MIN_WIDTH: u32 = 32;
/// Largest supported counter width in bits.
pub const MAX_WIDTH: u32 = 64;

const NS_PER_SEC: u128 = 1_000_000_000;

/// The all-ones mask of a `width`-bit counter (`width` in `1..=64`).
pub const fn width_mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// The result of one [`VirtualCounter::update`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Update {
    /// The 64-bit running total since [`VirtualCounter::start`] (wraps at 2^64).
    pub value: u64,
    /// Events since the previous reading (one wrap assumed at most).
    pub delta: u64,
    /// The interval was long enough for another wrap to hide: `delta` is a lower bound.
    pub multi_wrap: bool,
}

/// One counter made 64-bit.
///
/// # Invariants
///
/// `mask == width_mask(width)`, `width` is in `MIN_WIDTH..=MAX_WIDTH`,
/// `last_raw <= mask`, and `safe_ns == safe_interval_ns(mask, max_rate)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtualCounter {
    width: u32,
    mask: u64,
    max_rate: u64,
    safe_ns: u64,
    last_raw: u64,
    last_time: u64,
    value: u64,
    started: bool,
}

impl VirtualCounter {
    /// A counter of `width` bits (32..=64) that counts at most `max_rate_per_sec` events
    /// per second; 0 means unknown (then only one wrap per interval can be assumed and
    /// nothing is flagged).
    pub fn new(width: u32, max_rate_per_sec: u64) -> Result<Self, EngineError> {
        if !(MIN_WIDTH..=MAX_WIDTH).contains(&width) {
            return Err(EngineError::Invalid { what: "counter width must be 32..=64 bits" });
        }
        let mask = width_mask(width);
        // INVARIANT: width checked above; last_raw starts at 0; safe_ns computed here.
        Ok(VirtualCounter {
            width,
            mask,
            max_rate: max_rate_per_sec,
            safe_ns: safe_interval_ns(mask, max_rate_per_sec),
            last_raw: 0,
            last_time: 0,
            value: 0,
            started: false,
        })
    }

    /// Width in bits.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Maximum events per second (0: unknown).
    pub fn max_rate(&self) -> u64 {
        self.max_rate
    }

    /// The 64-bit total so far.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The raw reading the next delta is taken from.
    pub fn last_raw(&self) -> u64 {
        self.last_raw
    }

    /// Whether [`start`](Self::start) has been called.
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// Starts counting from `raw` at `time_ns`: the 64-bit value restarts at 0.
    pub fn start(&mut self, raw: u64, time_ns: u64) {
        self.value = 0;
        self.resume(raw, time_ns);
    }

    /// Takes a new baseline `raw` at `time_ns` but keeps the 64-bit value, so events
    /// between a pause and this call are not counted.
    pub fn resume(&mut self, raw: u64, time_ns: u64) {
        self.last_raw = raw & self.mask;
        self.last_time = time_ns;
        self.started = true;
    }

    /// The counter was written with `raw` (e.g. re-armed to overflow after a period):
    /// the next delta is taken from `raw`, the value and the time are unchanged.
    pub fn set_raw(&mut self, raw: u64) {
        self.last_raw = raw & self.mask;
    }

    /// Folds the reading `raw` taken at `time_ns` into the 64-bit value.
    ///
    /// A reading below the previous one is one wrap. Bits above `width` are ignored. A
    /// clock that went backwards counts as no elapsed time. Before `start`, the first
    /// reading becomes the baseline and the delta is 0.
    pub fn update(&mut self, raw: u64, time_ns: u64) -> Update {
        if !self.started {
            self.start(raw, time_ns);
            return Update::default();
        }
        let elapsed = time_ns.saturating_sub(self.last_time);
        self.last_time = time_ns;
        self.update_after(raw, elapsed)
    }

    /// Folds in `raw`, read `elapsed_ns` after the previous reading, for a started
    /// counter whose time the caller keeps (a CPU session reads all its counters at
    /// once); the counter's own last time is then left stale.
    #[inline]
    pub(crate) fn update_after(&mut self, raw: u64, elapsed_ns: u64) -> Update {
        let raw = raw & self.mask;
        let delta = raw.wrapping_sub(self.last_raw) & self.mask;
        // Fast path: most intervals are far too short for a hidden wrap.
        let multi_wrap = elapsed_ns >= self.safe_ns
            && could_hide_wrap(self.width, self.max_rate, elapsed_ns, delta);
        self.value = self.value.wrapping_add(delta);
        self.last_raw = raw;
        Update { value: self.value, delta, multi_wrap }
    }
}

/// An interval shorter than this cannot hide a wrap: `floor(mask / rate) * 1e9` ns, as
/// `elapsed * rate < floor(mask / rate) * rate * 1e9 <= mask * 1e9 < 2^width * 1e9`.
/// `u64::MAX` (never) for an unknown rate; 64-bit division only.
fn safe_interval_ns(mask: u64, max_rate: u64) -> u64 {
    match mask.checked_div(max_rate) {
        Some(secs) => secs.saturating_mul(NS_PER_SEC as u64),
        None => u64::MAX,
    }
}

/// Whether `elapsed_ns` at up to `max_rate` events/s could have produced
/// `delta + 2^width` events, i.e. whether the true count could be a wrap more than seen.
/// Integer only: compares `elapsed * rate >= (delta + 2^width) * 1e9` in u128, which
/// cannot overflow (< 2^128 and < 2^96) and needs no u128 division.
fn could_hide_wrap(width: u32, max_rate: u64, elapsed_ns: u64, delta: u64) -> bool {
    if max_rate == 0 {
        return false;
    }
    let possible = (elapsed_ns as u128) * (max_rate as u128);
    let hidden = (delta as u128 + (1u128 << width)) * NS_PER_SEC;
    possible >= hidden
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn widths_are_checked() {
        assert!(VirtualCounter::new(31, 0).is_err());
        assert!(VirtualCounter::new(65, 0).is_err());
        assert_eq!(VirtualCounter::new(0, 0).unwrap_err().errno(), 22);
        for w in [32, 40, 48, 63, 64] {
            assert_eq!(VirtualCounter::new(w, 0).unwrap().width(), w);
        }
        assert_eq!(width_mask(40), 0xff_ffff_ffff);
        assert_eq!(width_mask(64), u64::MAX);
    }

    #[test]
    fn wrap_40_bits() {
        let top = 1u64 << 40;
        let mut c = VirtualCounter::new(40, 0).unwrap();
        c.start(top - 100, 0);
        let u = c.update(50, 10);
        assert_eq!(u, Update { value: 150, delta: 150, multi_wrap: false });
        let u = c.update(1050, 20);
        assert_eq!(u, Update { value: 1150, delta: 1000, multi_wrap: false });
    }

    #[test]
    fn wrap_48_bits_and_high_bits_ignored() {
        let top = 1u64 << 48;
        let mut c = VirtualCounter::new(48, 0).unwrap();
        // Bits above the width (sign extension some PMUs show) are masked off.
        c.start(0xffff_0000_0000_0000 | (top - 1), 0);
        assert_eq!(c.last_raw(), top - 1);
        let u = c.update(0xffff_0000_0000_0000 | 4, 1);
        assert_eq!(u.delta, 5);
        assert_eq!(u.value, 5);
    }

    #[test]
    fn exact_total_over_many_wraps() {
        // Counter of 40 bits advancing by an odd stride that wraps every few readings.
        let width = 40;
        let mask = width_mask(width);
        let stride = (1u64 << 38) + 12_345;
        let mut c = VirtualCounter::new(width, 0).unwrap();
        let start = mask - 7;
        c.start(start, 0);
        let mut truth: u64 = 0;
        let mut sum_deltas: u64 = 0;
        for i in 1..=10_000u64 {
            truth += stride;
            let raw = start.wrapping_add(truth) & mask;
            let u = c.update(raw, i);
            assert_eq!(u.delta, stride);
            sum_deltas += u.delta;
            assert_eq!(u.value, truth);
        }
        assert_eq!(sum_deltas, 10_000 * stride);
        assert_eq!(c.value(), 10_000 * stride);
    }

    #[test]
    fn width_64_passthrough() {
        let mut c = VirtualCounter::new(64, 0).unwrap();
        c.start(u64::MAX - 1, 0);
        assert_eq!(c.update(3, 1), Update { value: 5, delta: 5, multi_wrap: false });
        assert_eq!(c.update(1 << 63, 2).delta, (1 << 63) - 3);
        // Even at an absurd rate a 64-bit counter cannot hide a wrap in a second.
        let mut c = VirtualCounter::new(64, u64::MAX).unwrap();
        c.start(0, 0);
        assert!(!c.update(10, S).multi_wrap);
    }

    #[test]
    fn width_32() {
        let mut c = VirtualCounter::new(32, 0).unwrap();
        c.start(0xffff_fff0, 0);
        assert_eq!(c.update(0x10, 1).delta, 0x20);
        assert_eq!(c.update(0xffff_ffff, 2).delta, 0xffff_ffef);
        assert_eq!(c.value(), 0x20 + 0xffff_ffef);
    }

    #[test]
    fn backwards_reading_is_one_wrap() {
        let mut c = VirtualCounter::new(48, 0).unwrap();
        c.start(1_000, 0);
        // Lower than before: one full wrap minus the step back.
        let u = c.update(999, 1);
        assert_eq!(u.delta, (1 << 48) - 1);
        // Equal reading: nothing happened.
        assert_eq!(c.update(999, 2).delta, 0);
    }

    #[test]
    fn multi_wrap_flagged_exactly_when_possible() {
        // 32-bit counter at <= 4e9 events/s: 2^32 events take 1.073741824 s.
        let rate = 4_000_000_000;
        let mut c = VirtualCounter::new(32, rate).unwrap();
        c.start(0, 0);
        // 1 s: at most 4e9 < 2^32 + 100 events: no second wrap possible.
        assert!(!c.update(100, S).multi_wrap);
        // 2 s: up to 8e9 >= 2^32 + delta: flagged, delta still the lower bound.
        let u = c.update(200, 3 * S);
        assert!(u.multi_wrap);
        assert_eq!(u.delta, 100);
        // Boundary: elapsed * rate == (delta + 2^32) * 1e9 exactly is flagged, 1 ns less is not.
        // delta = 2^32 * 3 / 4 = 3221225472; (delta + 2^32) * 1e9 / 4e9 = 1879048192 ns.
        let mut c = VirtualCounter::new(32, rate).unwrap();
        c.start(0, 0);
        assert!(c.update(3_221_225_472, 1_879_048_192).multi_wrap);
        let mut c = VirtualCounter::new(32, rate).unwrap();
        c.start(0, 0);
        assert!(!c.update(3_221_225_472, 1_879_048_191).multi_wrap);
    }

    #[test]
    fn multi_wrap_48_bits_at_cpu_speed() {
        // 48 bits at 5e9/s (cycles at 5 GHz): 2^48 events take ~56_295 s (15.6 h).
        let mut c = VirtualCounter::new(48, 5_000_000_000).unwrap();
        c.start(0, 0);
        assert!(!c.update(1 << 40, 50_000 * S).multi_wrap);
        assert!(c.update(1 << 41, 110_000 * S).multi_wrap);
        // Unknown rate: never flagged, whatever the interval.
        let mut c = VirtualCounter::new(48, 0).unwrap();
        c.start(0, 0);
        assert!(!c.update(1, u64::MAX).multi_wrap);
    }

    #[test]
    fn fast_path_threshold_is_sound() {
        // Exhaustive over small interval grids: the fast path never hides a flag.
        for (width, rate) in [(32, 1), (32, 3_000_000_000), (32, 5_000_000_000), (40, 7), (48, 5_000_000_000), (64, u64::MAX)] {
            let safe = safe_interval_ns(width_mask(width), rate);
            for elapsed in [0, 1, safe.saturating_sub(1), safe, safe.saturating_add(1)] {
                if elapsed < safe {
                    assert!(!could_hide_wrap(width, rate, elapsed, 0), "{width} {rate} {elapsed}");
                }
            }
        }
        assert_eq!(safe_interval_ns(width_mask(32), 0), u64::MAX);
        assert_eq!(safe_interval_ns(width_mask(32), 5_000_000_000), 0);
        assert_eq!(safe_interval_ns(width_mask(48), 5_000_000_000), 56_294 * S);
    }

    #[test]
    fn clock_backwards_and_update_before_start() {
        let mut c = VirtualCounter::new(32, 1_000_000_000_000).unwrap();
        assert_eq!(c.update(77, 5 * S), Update::default());
        assert!(c.is_started());
        let u = c.update(80, S);
        assert_eq!(u, Update { value: 3, delta: 3, multi_wrap: false });
    }

    #[test]
    fn resume_and_set_raw_keep_value() {
        let mut c = VirtualCounter::new(40, 0).unwrap();
        c.start(0, 0);
        c.update(500, 1);
        // Paused: 1000 events are not counted.
        c.resume(1_500, 2);
        assert_eq!(c.update(1_600, 3).value, 600);
        // Re-armed to overflow after 100 events.
        let arm = (1u64 << 40) - 100;
        c.set_raw(arm);
        let u = c.update(5, 4);
        assert_eq!(u.delta, 105);
        assert_eq!(u.value, 705);
    }
}
