//! Poll-mode deadlines: every `interval_ns`, without drift, counting missed ticks.
//!
//! The next deadline is always the previous deadline plus the interval (never "now plus
//! the interval"), so a late tick does not shift the whole schedule; when a tick is late
//! by whole intervals, those ticks are counted as missed instead of being run in a burst.

/// The result of [`PollSchedule::due`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tick {
    /// A tick is due now: read the counters.
    pub due: bool,
    /// Ticks skipped because we were late by whole intervals.
    pub missed: u64,
}

/// One CPU's poll deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollSchedule {
    interval: u64,
    next: u64,
    ticks: u64,
    missed: u64,
}

impl PollSchedule {
    /// Ticks every `interval_ns` (0 is taken as 1 ns), the first at `start_ns + interval_ns`.
    pub fn new(interval_ns: u64, start_ns: u64) -> PollSchedule {
        let interval = interval_ns.max(1);
        PollSchedule { interval, next: start_ns.saturating_add(interval), ticks: 0, missed: 0 }
    }

    /// Restarts the deadlines from `start_ns` (after a pause), keeping the tick counts.
    pub fn restart_at(&mut self, start_ns: u64) {
        self.next = start_ns.saturating_add(self.interval);
    }

    /// The interval in ns.
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// The next deadline.
    pub fn next_deadline(&self) -> u64 {
        self.next
    }

    /// Nanoseconds from `now_ns` to the next deadline (0 if it has passed).
    pub fn ns_until(&self, now_ns: u64) -> u64 {
        self.next.saturating_sub(now_ns)
    }

    /// Ticks that were due so far.
    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    /// Ticks missed so far.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Whether a tick is due at `now_ns`; if so the deadline advances past `now_ns`.
    pub fn due(&mut self, now_ns: u64) -> Tick {
        if now_ns < self.next {
            return Tick::default();
        }
        // `interval >= 1` always; checked_div only keeps a panic path out of the kernel.
        let missed = (now_ns - self.next).checked_div(self.interval).unwrap_or(0);
        let steps = missed.saturating_add(1);
        self.next = self.next.saturating_add(steps.saturating_mul(self.interval));
        self.ticks = self.ticks.saturating_add(1);
        self.missed = self.missed.saturating_add(missed);
        Tick { due: true, missed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_time_ticks() {
        let mut p = PollSchedule::new(100, 1_000);
        assert_eq!(p.next_deadline(), 1_100);
        assert_eq!(p.ns_until(1_030), 70);
        assert_eq!(p.due(1_099), Tick { due: false, missed: 0 });
        assert_eq!(p.due(1_100), Tick { due: true, missed: 0 });
        assert_eq!(p.due(1_100), Tick { due: false, missed: 0 });
        assert_eq!(p.next_deadline(), 1_200);
        assert_eq!(p.ns_until(1_300), 0);
    }

    #[test]
    fn late_ticks_do_not_drift() {
        let mut p = PollSchedule::new(100, 0);
        // 30 ns late: no tick missed, the next deadline is still 200, not 230.
        assert_eq!(p.due(130), Tick { due: true, missed: 0 });
        assert_eq!(p.next_deadline(), 200);
        // 99 ns late: still no whole interval missed, next deadline 300.
        assert_eq!(p.due(299), Tick { due: true, missed: 0 });
        assert_eq!(p.next_deadline(), 300);
        // 100 ns late: the tick of 400 is missed.
        assert_eq!(p.due(400), Tick { due: true, missed: 1 });
        assert_eq!(p.next_deadline(), 500);
    }

    #[test]
    fn missed_ticks_counted() {
        let mut p = PollSchedule::new(100, 0);
        // Deadline 100; at 450 the ticks of 200, 300, 400 are missed.
        assert_eq!(p.due(450), Tick { due: true, missed: 3 });
        assert_eq!(p.next_deadline(), 500);
        assert_eq!(p.due(500), Tick { due: true, missed: 0 });
        assert_eq!((p.ticks(), p.missed()), (2, 3));
        p.restart_at(10_000);
        assert_eq!(p.due(10_050), Tick::default());
        assert_eq!(p.due(10_100), Tick { due: true, missed: 0 });
        assert_eq!((p.ticks(), p.missed()), (3, 3));
        // Over a long run, ticks + missed == elapsed / interval exactly.
        let mut p = PollSchedule::new(7, 3);
        let mut now = 3;
        for i in 0..1_000u64 {
            now += 1 + (i * 13) % 20;
            p.due(now);
        }
        assert_eq!(p.ticks() + p.missed(), (now - 3) / 7);
        assert_eq!(p.next_deadline(), 3 + ((now - 3) / 7 + 1) * 7);
    }

    #[test]
    fn degenerate_inputs() {
        let mut p = PollSchedule::new(0, 0);
        assert_eq!(p.interval(), 1);
        assert_eq!(p.due(10), Tick { due: true, missed: 9 });
        let mut p = PollSchedule::new(u64::MAX, u64::MAX - 1);
        assert_eq!(p.next_deadline(), u64::MAX);
        assert_eq!(p.due(u64::MAX), Tick { due: true, missed: 0 });
    }
}
