//! End-to-end tests: registry → session → dispatch → tables → drained records.

extern crate std;
use std::boxed::Box;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::vec;
use std::vec::Vec;

use core::ffi::c_void;
use core::ptr::NonNull;

use hrperf_abi::errno::{E2BIG, EBUSY, EINVAL};
use hrperf_abi::format::{
    CTRL_NOTIFY, CTRL_RESET, CTRL_SWITCH, FMT_FL_INTERVALS, FMT_FL_STACKS, MODE_OVERFLOW,
    MODE_POLL, SAMPLE_OVERFLOW, SAMPLE_POLL,
};
use hrperf_abi::{RecordType, Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{
    Buffer, CounterConfig, CpuSession, EngineError, Registry, Sample, Selector, Session,
};

use super::consumer::{Access, AggView, ViewError};
use super::record::*;
use super::*;

fn params(mode: u32, nr: u32) -> SessionParams {
    SessionParams {
        size: core::mem::size_of::<SessionParams>() as u32,
        mode,
        nr_counters: nr,
        cpu: u32::MAX,
        sample_period: 10_000,
        poll_interval_ns: 1_000_000,
        data_size_hint: 0,
        flags: 0,
        reserved: 0,
    }
}

const W48: CounterConfig = CounterConfig {
    width: 48,
    max_rate_per_sec: 0,
};
const MASK48: u64 = (1 << 48) - 1;

fn session(arg: &AggregateArg, nr: usize) -> Session {
    let mut reg: Registry<4> = Registry::new();
    reg.register_static(&AGGREGATE_OPS).unwrap();
    let fmt = reg.acquire(Selector::Uuid(AGGREGATE_UUID)).unwrap();
    Session::new(
        fmt,
        &params(MODE_OVERFLOW, nr as u32),
        &arg.to_bytes(),
        &vec![W48; nr],
    )
    .unwrap()
}

/// Per key `(pid, ip, kstack id, ustack id)`: (count, sum).
type KeyTotals = BTreeMap<(u32, u64, u32, u32), (u64, u64)>;
/// Per key `(pid, kernel frames, user frames)`: (count, sum).
type StackTotals = BTreeMap<(u32, Vec<u64>, Vec<u64>), (u64, u64)>;

/// What a consumer collected from drained intervals (through the capture records).
#[derive(Default, Debug)]
struct Collected {
    intervals: Vec<IntervalRecord>,
    entries: Vec<EntryRecord>,
    /// (seq, stack id) → (flags, frames)
    stacks: BTreeMap<(u64, u32), (u32, Vec<u64>)>,
    bytes: u64,
}

impl Collected {
    fn take(&mut self, rec: &[u8]) {
        self.bytes += rec.len() as u64;
        let h = header(rec).unwrap();
        assert_eq!(h.size as usize, rec.len());
        match h.kind {
            k if k == REC_INTERVAL => self.intervals.push(parse_interval(rec).unwrap()),
            k if k == REC_ENTRY => self.entries.push(parse_entry(rec).unwrap()),
            k if k == REC_STACK => {
                let (s, frames) = parse_stack(rec).unwrap();
                let v = (0..s.depth as usize)
                    .map(|i| frame(frames, i).unwrap())
                    .collect();
                assert!(self
                    .stacks
                    .insert((s.seq, s.stack_id), (s.flags, v))
                    .is_none());
            }
            k => panic!("unexpected record {k:?}"),
        }
    }

    /// Drains `view` if an interval is pending: checks it against its own records.
    fn drain(&mut self, view: &AggView<'_>) -> bool {
        let Some(iv) = view.pending() else {
            return false;
        };
        let before = (self.entries.len(), self.intervals.len());
        let s = iv.emit_records(|r| self.take(r));
        assert_eq!(self.intervals.len(), before.1 + 1);
        assert_eq!(s.flags & IV_FL_INCONSISTENT, 0, "{s:?}");
        let mine = &self.entries[before.0..];
        assert_eq!(mine.len() as u64, s.entries);
        // Conservation, per interval, exactly.
        let count: u64 = mine.iter().map(|e| e.count).sum();
        let sum: u64 = mine.iter().map(|e| e.sum).sum();
        assert_eq!(count + s.other_count, s.samples, "{s:?}");
        assert_eq!(sum + s.other_sum, s.sum_total, "{s:?}");
        assert_eq!(s.misses, s.other_count);
        for e in mine {
            assert_eq!(
                (e.seq, e.start_ns, e.end_ns, e.cpu),
                (s.seq, s.start_ns, s.end_ns, s.cpu)
            );
            assert!(e.count > 0);
        }
        view.ack(iv).unwrap();
        true
    }

    fn samples(&self) -> u64 {
        self.intervals.iter().map(|i| i.samples).sum()
    }

    fn other(&self) -> u64 {
        self.intervals.iter().map(|i| i.other_count).sum()
    }

    fn sum_total(&self) -> u64 {
        self.intervals.iter().map(|i| i.sum_total).sum()
    }

    /// Per key `(pid, ip, kstack, ustack)`: (count, sum) over all intervals.
    fn by_key(&self) -> KeyTotals {
        let mut m = BTreeMap::new();
        for e in &self.entries {
            let v = m
                .entry((e.pid, e.ip, e.kstack_id, e.ustack_id))
                .or_insert((0, 0));
            v.0 += e.count;
            v.1 += e.sum;
        }
        m
    }

    /// Intervals are numbered 1.. without gaps and tile time.
    fn check_tiling(&self) {
        for (i, w) in self.intervals.iter().enumerate() {
            assert_eq!(w.seq, i as u64 + 1);
            assert!(w.start_ns <= w.end_ns, "{w:?}");
        }
        for w in self.intervals.windows(2) {
            assert_eq!(w[1].start_ns, w[0].end_ns, "no gap, no overlap");
        }
    }
}

/// One CPU's session with its buffer memory, single-threaded.
struct Rig {
    words: Vec<u64>,
    cpu: CpuSession,
}

impl Rig {
    fn new(arg: &AggregateArg, nr: usize) -> Rig {
        let s = session(arg, nr);
        let mut words = vec![0xa5a5_a5a5_a5a5_a5a5u64; (s.buffer_size() as usize).div_ceil(8)];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(3, &mut buf, &arg.to_bytes()).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        Rig { words, cpu }
    }

    fn dispatch_with(&mut self, s: &Sample, svc: &Services) -> u32 {
        let mut buf = Buffer::from_words(&mut self.words).unwrap();
        self.cpu.dispatch(&mut buf, s, svc)
    }

    fn dispatch(&mut self, s: &Sample) -> u32 {
        self.dispatch_with(s, &Services::NONE)
    }

    fn restart(&mut self) -> Result<u32, EngineError> {
        let mut buf = Buffer::from_words(&mut self.words).unwrap();
        self.cpu.restart(&mut buf)
    }

    fn view(&mut self) -> AggView<'_> {
        let len = self.words.len() * 8;
        let ptr = NonNull::new(self.words.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: the words outlive the view (borrowed mutably through `self`).
        unsafe { AggView::from_raw(ptr, len, Access::ReadWrite) }.unwrap()
    }

    fn drain(&mut self, c: &mut Collected) -> bool {
        let v = self.view();
        c.drain(&v)
    }

    /// Closes the active interval and drains everything (end of a session).
    fn finish(&mut self, c: &mut Collected) {
        self.drain(c);
        assert_eq!(self.restart(), Ok(CTRL_SWITCH | CTRL_NOTIFY));
        assert!(self.drain(c));
    }

    fn overflows(&mut self) -> u64 {
        Buffer::from_words(&mut self.words)
            .unwrap()
            .header()
            .overflows
    }
}

/// xorshift64*: deterministic noise without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A synthetic workload: key `j` (of `keys`) appears `keys - j` times, shuffled; the
/// summed counter advances by a pseudo-random step per sample. Records the truth.
struct Workload {
    seq: Vec<usize>,
    steps: Vec<u64>,
}

impl Workload {
    fn new(keys: usize, seed: u64) -> Workload {
        let mut seq: Vec<usize> = (0..keys)
            .flat_map(|j| std::iter::repeat(j).take(keys - j))
            .collect();
        let mut rng = Rng(seed);
        for i in (1..seq.len()).rev() {
            seq.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let steps = seq.iter().map(|_| 1_000 + rng.next() % 5_000).collect();
        Workload { seq, steps }
    }
}

fn ip_of(j: usize) -> u64 {
    0xffff_ffff_8100_0000 + 0x40 * j as u64
}

fn overflow(t: u64, pid: u32, ip: u64, v: u64) -> Sample {
    let mut s = Sample {
        cpu: 3,
        kind: SAMPLE_OVERFLOW,
        pid,
        tid: pid,
        time_ns: t,
        ip,
        kernel_ip: true,
        ovfl_counter: 0,
        nr: 2,
        ..Sample::default()
    };
    // Counter 0 is the sampling counter; counter 1 (summed in most tests) is the truth.
    s.raw[0] = t & MASK48;
    s.raw[1] = v & MASK48;
    s
}

fn arg(key: u32, slots: u32, probe: u32, flags: u32) -> AggregateArg {
    AggregateArg {
        key,
        slots,
        probe,
        counter: 1,
        flags,
        ..AggregateArg::default()
    }
}

/// Runs `w` through `rig` (pid from `pid_of`), draining at every NOTIFY when `drain`
/// (and requesting a switch every `req_every` samples if non-zero). Returns the truth:
/// per key (pid, ip): (count, sum), and the final counter value.
fn run(
    rig: &mut Rig,
    c: &mut Collected,
    w: &Workload,
    pid_of: impl Fn(usize) -> u32,
    drain: bool,
    req_every: usize,
) -> (KeyTotals, u64) {
    let mut truth = BTreeMap::new();
    let mut v = 0u64;
    for (i, (&j, &step)) in w.seq.iter().zip(&w.steps).enumerate() {
        v += step;
        let pid = pid_of(i);
        let ctrl = rig.dispatch(&overflow(i as u64 + 1, pid, ip_of(j), v));
        assert_ne!(ctrl & CTRL_RESET, 0, "overflow samples re-arm");
        let e = truth.entry((pid, ip_of(j), 0, 0)).or_insert((0, 0));
        e.0 += 1;
        e.1 += step;
        if drain && ctrl & CTRL_NOTIFY != 0 {
            rig.drain(c);
        }
        if req_every != 0 && i % req_every == req_every - 1 {
            rig.drain(c);
            rig.view().request_switch().unwrap();
        }
    }
    (truth, v)
}

#[test]
fn exact_counts_and_sums_ip_key() {
    // 200 keys, 20_100 samples, one interval (a big table never reaches the threshold).
    let w = Workload::new(200, 1);
    let mut rig = Rig::new(&arg(0, 1024, 0, 0), 2);
    let mut c = Collected::default();
    let (truth, v) = run(&mut rig, &mut c, &w, |_| 77, false, 0);
    assert_eq!(rig.view().published(), 0, "no switch below the threshold");
    rig.finish(&mut c);
    assert_eq!(c.intervals.len(), 1);
    let iv = c.intervals[0];
    assert_eq!(
        (iv.samples, iv.entries, iv.other_count, iv.misses),
        (20_100, 200, 0, 0)
    );
    assert_eq!((iv.key_kind, iv.counter, iv.cpu, iv.seq), (KEY_IP, 1, 3, 1));
    assert_eq!((iv.start_ns, iv.end_ns), (1, 20_100));
    assert_eq!(iv.flags, IV_FL_CLOSED_RESTART);
    assert_eq!(
        iv.sum_total, v,
        "sum of deltas == the counter's final value"
    );
    // KEY_IP drops the pid: compare against the truth with pid 0.
    let want: BTreeMap<_, _> = truth
        .iter()
        .map(|(&(_, ip, k, u), &cs)| ((0, ip, k, u), cs))
        .collect();
    assert_eq!(c.by_key(), want);
    // Key j was seen 200 - j times.
    assert_eq!(c.by_key()[&(0, ip_of(0), 0, 0)].0, 200);
    assert_eq!(c.by_key()[&(0, ip_of(199), 0, 0)].0, 1);
    assert_eq!(rig.overflows(), 20_100);
}

#[test]
fn pid_ip_key_separates_processes() {
    let w = Workload::new(100, 2);
    let mut rig = Rig::new(&arg(KEY_PID_IP, 2048, 0, 0), 2);
    let mut c = Collected::default();
    let (truth, v) = run(&mut rig, &mut c, &w, |i| 1000 + (i % 3) as u32, false, 0);
    rig.finish(&mut c);
    assert_eq!(c.by_key(), truth);
    assert!(
        truth.len() > 250,
        "the same IP under three pids is three keys"
    );
    assert_eq!(c.intervals[0].entries as usize, truth.len());
    assert_eq!(c.sum_total(), v);
}

#[test]
fn exact_across_automatic_and_requested_switches() {
    // 64 slots, threshold 50% = 32 keys: 300 keys force many automatic switches; the
    // consumer drains at each NOTIFY and also asks for a switch every 997 samples.
    let w = Workload::new(300, 3);
    let mut a = arg(KEY_PID_IP, 64, 64, 0);
    a.switch_permille = 500;
    let mut rig = Rig::new(&a, 2);
    let mut c = Collected::default();
    let (truth, v) = run(&mut rig, &mut c, &w, |i| (i % 2) as u32, true, 997);
    rig.finish(&mut c);
    c.check_tiling();
    assert!(c.intervals.len() > 100, "{} intervals", c.intervals.len());
    let auto = c
        .intervals
        .iter()
        .filter(|i| i.flags & IV_FL_CLOSED_AUTO != 0)
        .count();
    let req = c
        .intervals
        .iter()
        .filter(|i| i.flags & IV_FL_CLOSED_REQUEST != 0)
        .count();
    assert!(auto > 100 && req > 10, "auto {auto}, requested {req}");
    // The consumer kept up, so nothing went to `other` and every key is exact.
    assert_eq!(c.other(), 0);
    assert_eq!(c.by_key(), truth);
    assert_eq!(c.samples(), w.seq.len() as u64);
    assert_eq!(c.samples(), rig.overflows());
    assert_eq!(c.sum_total(), v);
    // Automatic switches close at exactly 32 keys.
    for i in c
        .intervals
        .iter()
        .filter(|i| i.flags & IV_FL_CLOSED_AUTO != 0)
    {
        assert_eq!(i.entries, 32, "{i:?}");
    }
}

#[test]
fn consumer_behind_postpones_the_switch_and_counts_misses() {
    // 16 slots probed fully, threshold 100%: keys beyond the 16th go to `other` while
    // the consumer does not acknowledge; nothing is lost.
    let mut a = arg(KEY_IP, 16, 16, 0);
    a.switch_permille = 1000;
    let mut rig = Rig::new(&a, 2);
    let mut c = Collected::default();
    let mut v = 0;
    let mut t = 0;
    let mut send = |rig: &mut Rig, j: usize| {
        t += 1;
        v += 10;
        rig.dispatch(&overflow(t, 1, ip_of(j), v))
    };
    // Interval 1: 16 keys → switch at the 16th.
    for j in 0..15 {
        assert_eq!(send(&mut rig, j), CTRL_RESET);
    }
    assert_eq!(send(&mut rig, 15), CTRL_RESET | CTRL_SWITCH | CTRL_NOTIFY);
    // Interval 2: 16 new keys fill it; the 16th wants a switch but interval 1 is not
    // acknowledged: NOTIFY once, then keep counting.
    for j in 100..115 {
        assert_eq!(send(&mut rig, j), CTRL_RESET);
    }
    assert_eq!(send(&mut rig, 115), CTRL_RESET | CTRL_NOTIFY);
    assert_eq!(rig.view().switch_waits(), 1);
    // 40 samples of 20 keys not in the table → other; 10 of a known key → its slot.
    for r in 0..2 {
        for j in 200..220 {
            assert_eq!(send(&mut rig, j), CTRL_RESET, "round {r}");
        }
    }
    for _ in 0..10 {
        send(&mut rig, 100);
    }
    assert_eq!(rig.view().switch_waits(), 51);
    assert_eq!(
        rig.restart(),
        Err(EngineError::Format {
            call: "restart",
            errno: EBUSY
        })
    );
    // The consumer catches up: the next sample switches.
    assert!(rig.drain(&mut c));
    assert_eq!(send(&mut rig, 7), CTRL_RESET | CTRL_SWITCH | CTRL_NOTIFY);
    rig.finish(&mut c);
    c.check_tiling();
    let s: Vec<_> = c
        .intervals
        .iter()
        .map(|i| (i.samples, i.entries, i.other_count, i.misses))
        .collect();
    // Key 7 arrives when interval 2 is full: `other`, then the switch.
    assert_eq!(
        s,
        [(16, 16, 0, 0), (16 + 40 + 10 + 1, 16, 41, 41), (0, 0, 0, 0)]
    );
    assert_eq!(c.intervals[1].other_sum, 410);
    assert_eq!(c.intervals[1].flags, IV_FL_CLOSED_AUTO);
    assert_eq!(c.intervals[2].flags, IV_FL_CLOSED_RESTART);
    assert_eq!(c.by_key()[&(0, ip_of(100), 0, 0)], (11, 110));
    assert_eq!(
        c.by_key()[&(0, ip_of(7), 0, 0)],
        (1, 10),
        "the second one is in `other`"
    );
    assert_eq!(c.samples(), t);
    assert_eq!(c.sum_total(), v);
}

#[test]
fn small_table_with_short_probes_conserves_totals() {
    // 16 slots, probe 2, no automatic switch, 60 keys: many misses; every key that got
    // a slot is exact, and the keys that did not are exactly `other`.
    let w = Workload::new(60, 4);
    let mut rig = Rig::new(&arg(KEY_IP, 16, 2, AGG_ARG_FL_NO_AUTO_SWITCH), 2);
    let mut c = Collected::default();
    let (truth, v) = run(&mut rig, &mut c, &w, |_| 0, false, 0);
    rig.finish(&mut c);
    let iv = c.intervals[0];
    assert!(iv.misses > 0 && iv.entries <= 16, "{iv:?}");
    let got = c.by_key();
    let truth: BTreeMap<_, _> = truth
        .iter()
        .map(|(&(_, ip, k, u), &cs)| ((0, ip, k, u), cs))
        .collect();
    let mut absent = (0, 0);
    for (k, want) in &truth {
        match got.get(k) {
            Some(have) => assert_eq!(have, want, "a key with a slot is exact"),
            None => {
                absent.0 += want.0;
                absent.1 += want.1;
            }
        }
    }
    assert_eq!((iv.other_count, iv.other_sum), absent);
    assert_eq!(iv.misses, iv.other_count);
    assert_eq!(iv.samples, w.seq.len() as u64);
    assert_eq!(iv.sum_total, v);
}

/// A fake stack service: the stacks of "the interrupted context" are set per sample.
#[derive(Default)]
struct FakeStacks {
    kernel: Vec<u64>,
    user: Vec<u64>,
    calls: u32,
}

unsafe fn fill(frames: &[u64], out: *mut u64, max: u32) -> u32 {
    let n = frames.len().min(max as usize);
    // SAFETY: the format passes room for `max` frames.
    unsafe { core::ptr::copy_nonoverlapping(frames.as_ptr(), out, n) };
    n as u32
}

unsafe extern "C" fn fake_kstack(ctx: *mut c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: ctx is the test's FakeStacks, alive during dispatch.
    let f = unsafe { &mut *ctx.cast::<FakeStacks>() };
    f.calls += 1;
    // SAFETY: forwarded.
    unsafe { fill(&f.kernel, out, max) }
}

unsafe extern "C" fn fake_ustack(ctx: *mut c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: as above.
    let f = unsafe { &mut *ctx.cast::<FakeStacks>() };
    f.calls += 1;
    // SAFETY: forwarded.
    unsafe { fill(&f.user, out, max) }
}

fn services(f: &mut FakeStacks) -> Services {
    Services {
        size: core::mem::size_of::<Services>() as u32,
        reserved: 0,
        ctx: (f as *mut FakeStacks).cast(),
        kernel_stack: Some(fake_kstack),
        user_stack: Some(fake_ustack),
        comm: None,
    }
}

fn kstack(j: u64, depth: usize) -> Vec<u64> {
    (0..depth as u64)
        .map(|d| 0xffff_ffff_8200_0000 + j * 0x1000 + d * 8)
        .collect()
}

fn ustack(j: u64, depth: usize) -> Vec<u64> {
    (0..depth as u64)
        .map(|d| 0x5555_0000_0000 + j * 0x1000 + d * 8)
        .collect()
}

#[test]
fn stack_keys_with_known_stacks() {
    let mut a = arg(KEY_STACK, 256, 0, 0);
    a.kstack_depth = 6;
    a.ustack_depth = 8;
    let mut rig = Rig::new(&a, 2);
    let mut f = FakeStacks::default();
    let mut c = Collected::default();
    // (pid, kernel stack, user stack) triples; stack 9 is deeper than the limits.
    let mix: [(u32, u64, usize, u64, usize, u64); 6] = [
        // pid, kstack j, kdepth, ustack j, udepth, times
        (10, 1, 4, 1, 5, 50),
        (10, 2, 3, 1, 5, 30),
        (11, 1, 4, 2, 2, 20),
        (12, 0, 0, 3, 7, 15), // a user-only sample: empty kernel stack → id NONE
        (13, 9, 10, 9, 12, 5), // both truncated
        (10, 1, 4, 1, 5, 7),  // the first triple again
    ];
    let mut t = 0;
    let mut v = 0;
    let mut sums = StackTotals::new();
    for &(pid, kj, kd, uj, ud, times) in &mix {
        for _ in 0..times {
            f.kernel = kstack(kj, kd);
            f.user = ustack(uj, ud);
            t += 1;
            v += 3;
            let svc = services(&mut f);
            rig.dispatch_with(&overflow(t, pid, 0x400000 + t, v), &svc);
            let mut k = kstack(kj, kd);
            k.truncate(6);
            let mut u = ustack(uj, ud);
            u.truncate(8);
            let e = sums.entry((pid, k, u)).or_insert((0, 0));
            e.0 += 1;
            e.1 += 3;
        }
    }
    assert_eq!(f.calls, 2 * 127);
    rig.finish(&mut c);
    let iv = c.intervals[0];
    assert_eq!((iv.samples, iv.entries, iv.other_count), (127, 5, 0));
    // Kernel stacks 1, 2, 9 and user stacks 1, 2, 3, 9: seven distinct stacks.
    assert_eq!((iv.stacks, iv.stack_misses), (7, 0));
    assert_eq!(
        iv.stack_truncated,
        2 * 5,
        "kernel and user stack of 5 samples"
    );
    assert_eq!(
        iv.flags & (IV_FL_NO_KSTACK_SERVICE | IV_FL_NO_USTACK_SERVICE),
        0
    );
    // Resolve the ids through the STACK records and compare with the truth.
    let frames = |id: u32, kernel: bool| -> Vec<u64> {
        if id == STACK_ID_NONE {
            return Vec::new();
        }
        let (flags, v) = &c.stacks[&(1, id)];
        assert_eq!(*flags & STACK_FL_KERNEL != 0, kernel);
        // Only stack 9 is deeper than the limits.
        assert_eq!(*flags & STACK_FL_TRUNCATED != 0, v[0] & 0xf000 == 0x9000);
        v.clone()
    };
    let mut got = BTreeMap::new();
    for e in &c.entries {
        assert_eq!((e.key_kind, e.ip), (KEY_STACK, 0));
        got.insert(
            (e.pid, frames(e.kstack_id, true), frames(e.ustack_id, false)),
            (e.count, e.sum),
        );
    }
    assert_eq!(got, sums);
    assert_eq!(c.stacks.len(), 7);
}

#[test]
fn stacks_without_services_or_room() {
    // No services at all: ids are NONE and the interval says why.
    let mut rig = Rig::new(&arg(KEY_STACK, 64, 0, 0), 2);
    let mut c = Collected::default();
    for t in 1..=5 {
        rig.dispatch(&overflow(t, 4, 0x1000, t * 2));
    }
    rig.finish(&mut c);
    let iv = c.intervals[0];
    assert_eq!(
        iv.flags & (IV_FL_NO_KSTACK_SERVICE | IV_FL_NO_USTACK_SERVICE),
        3
    );
    assert_eq!((iv.entries, iv.stacks), (1, 0));
    assert_eq!(
        (
            c.entries[0].pid,
            c.entries[0].kstack_id,
            c.entries[0].ustack_id
        ),
        (4, 0, 0)
    );
    assert_eq!(c.entries[0].count, 5);

    // A 16-entry stack table, 40 distinct kernel stacks, no automatic switch: 16 are
    // stored, the others are counted under STACK_ID_LOST.
    let mut a = arg(KEY_STACK, 64, 16, AGG_ARG_FL_NO_AUTO_SWITCH);
    a.stack_slots = 16;
    a.kstack_depth = 3;
    a.flags |= AGG_ARG_FL_NO_USTACK; // user stacks off: ids NONE, no flag
    let mut rig = Rig::new(&a, 2);
    let mut f = FakeStacks::default();
    let mut c = Collected::default();
    for j in 0..40u64 {
        f.kernel = kstack(j, 3);
        let svc = services(&mut f);
        rig.dispatch_with(&overflow(j + 1, 1, 0, j), &svc);
    }
    assert_eq!(f.calls, 40, "user stacks are not asked for");
    rig.finish(&mut c);
    let iv = c.intervals[0];
    assert_eq!(
        (iv.stacks, iv.stack_misses, iv.samples, iv.flags & 3),
        (16, 24, 40, 0)
    );
    let lost = c.by_key()[&(1, 0, STACK_ID_LOST, STACK_ID_NONE)];
    assert_eq!(lost.0, 24);
    assert_eq!(iv.entries, 17);
}

#[test]
fn poll_samples_and_counter_choice() {
    // Poll mode: no IP (key 0), no CTRL_RESET; summing counter 0.
    let mut reg: Registry<2> = Registry::new();
    reg.register_static(&AGGREGATE_OPS).unwrap();
    let fmt = reg.acquire(Selector::Name(b"aggregate")).unwrap();
    let a = AggregateArg {
        counter: 0,
        ..AggregateArg::default()
    };
    let s = Session::new(fmt, &params(MODE_POLL, 1), &a.to_bytes(), &[W48]).unwrap();
    let mut words = vec![0u64; s.buffer_size() as usize / 8];
    let mut buf = Buffer::from_words(&mut words).unwrap();
    let mut cpu = s.init_cpu(0, &mut buf, &a.to_bytes()).unwrap();
    cpu.start(&mut buf, &[100, 0, 0, 0, 0, 0, 0, 0], 0).unwrap();
    for t in 1..=4u64 {
        let mut smp = Sample {
            kind: SAMPLE_POLL,
            ovfl_counter: u32::MAX,
            nr: 1,
            time_ns: t * 10,
            ..Sample::default()
        };
        smp.raw[0] = 100 + t * t;
        assert_eq!(cpu.dispatch(&mut buf, &smp, &Services::NONE), 0);
    }
    assert_eq!(cpu.restart(&mut buf), Ok(CTRL_SWITCH | CTRL_NOTIFY));
    let view = AggView::from_buffer(&buf).unwrap();
    let iv = view.pending().unwrap();
    let s = iv.summary();
    assert_eq!(
        (s.samples, s.sum_total, s.start_ns, s.end_ns),
        (4, 16, 10, 40)
    );
    let mut n = 0;
    iv.for_each_entry(|e| {
        assert_eq!((e.ip, e.pid, e.count, e.sum), (0, 0, 4, 16));
        n += 1;
    });
    assert_eq!(n, 1);
    // A view over a read-only mapping cannot acknowledge itself.
    assert_eq!(view.ack(iv), Err(ViewError::ReadOnly));
}

#[test]
fn restart_switches_and_needs_the_ack() {
    let mut rig = Rig::new(&arg(KEY_IP, 64, 0, 0), 2);
    let mut c = Collected::default();
    // Restart with no sample at all: an empty interval 1 at time 0.
    assert_eq!(rig.restart(), Ok(CTRL_SWITCH | CTRL_NOTIFY));
    assert_eq!(
        rig.restart(),
        Err(EngineError::Format {
            call: "restart",
            errno: EBUSY
        })
    );
    {
        let v = rig.view();
        assert_eq!((v.published(), v.acked(), v.active()), (1, 0, 2));
        assert_eq!(v.ack_seq(2), Err(ViewError::NotPending));
    }
    assert!(rig.drain(&mut c));
    assert!(!rig.drain(&mut c), "nothing pending twice");
    rig.dispatch(&overflow(50, 1, 0x10, 5));
    rig.dispatch(&overflow(60, 1, 0x10, 9));
    rig.finish(&mut c);
    let s: Vec<_> = c
        .intervals
        .iter()
        .map(|i| (i.seq, i.start_ns, i.end_ns, i.samples, i.sum_total))
        .collect();
    // The interval opened before any sample starts at its first sample.
    assert_eq!(s, [(1, 0, 0, 0, 0), (2, 50, 60, 2, 9)]);
    // The request path: a switch request is honoured at the next sample.
    rig.view().request_switch().unwrap();
    assert_eq!(
        rig.dispatch(&overflow(70, 1, 0x10, 10)),
        CTRL_RESET | CTRL_SWITCH | CTRL_NOTIFY
    );
    assert_eq!(
        rig.dispatch(&overflow(80, 1, 0x10, 12)),
        CTRL_RESET,
        "one switch per request"
    );
    rig.drain(&mut c);
    assert_eq!(c.intervals[2].flags, IV_FL_CLOSED_REQUEST);
    assert_eq!(
        (
            c.intervals[2].start_ns,
            c.intervals[2].end_ns,
            c.intervals[2].samples
        ),
        (60, 70, 1)
    );
}

// ---------------------------------------------------------------- concurrency

/// Buffer memory shared by a producer thread and the consumer thread.
struct SharedMem {
    words: Box<[AtomicU64]>,
}

impl SharedMem {
    fn new(bytes: usize) -> Arc<SharedMem> {
        Arc::new(SharedMem {
            words: (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn ptr(&self) -> NonNull<u8> {
        NonNull::new(self.words.as_ptr() as *mut u8).unwrap()
    }

    fn len(&self) -> usize {
        self.words.len() * 8
    }

    /// The producer's handle.
    ///
    /// # Safety
    ///
    /// One producer at a time (the engine's contract).
    unsafe fn buffer(&self) -> Buffer<'_> {
        // SAFETY: atomics are interior-mutable, valid for the Arc's life; the caller
        // keeps a single producer.
        unsafe { Buffer::from_raw(self.ptr(), self.len()) }.unwrap()
    }

    fn view(&self) -> AggView<'_> {
        // SAFETY: as above; the view is the only consumer.
        unsafe { AggView::from_raw(self.ptr(), self.len(), Access::ReadWrite) }.unwrap()
    }
}

/// Per-CPU truth of a producer thread: per key index (count, sum), samples, counter.
struct Truth {
    keys: Vec<(u64, u64)>,
    samples: u64,
    value: u64,
}

const KEYS: usize = 300;

/// The consumer's running totals of one CPU.
#[derive(Default)]
struct Seen {
    keys: BTreeMap<u64, (u64, u64)>,
    intervals: u64,
    samples: u64,
    other: (u64, u64),
    sum_total: u64,
    last_seq: u64,
    last_end: Option<u64>,
}

impl Seen {
    fn drain(&mut self, view: &AggView<'_>) -> bool {
        let Some(iv) = view.pending() else {
            return false;
        };
        let s = iv.summary();
        assert_eq!(s.seq, self.last_seq + 1, "every interval, in order");
        assert_eq!(s.flags & IV_FL_INCONSISTENT, 0);
        if let Some(end) = self.last_end {
            assert_eq!(s.start_ns, end, "intervals tile time");
        }
        let (mut count, mut sum) = (0, 0);
        iv.for_each_entry(|e| {
            let v = self.keys.entry(e.ip).or_default();
            v.0 += e.count;
            v.1 += e.sum;
            count += e.count;
            sum += e.sum;
        });
        assert_eq!(
            count + s.other_count,
            s.samples,
            "per-interval conservation"
        );
        assert_eq!(sum + s.other_sum, s.sum_total);
        self.samples += s.samples;
        self.other.0 += s.other_count;
        self.other.1 += s.other_sum;
        self.sum_total += s.sum_total;
        self.intervals += 1;
        self.last_seq = s.seq;
        self.last_end = Some(s.end_ns);
        view.ack(iv).unwrap();
        true
    }
}

#[test]
fn concurrent_producers_and_switching_consumer_conserve_totals() {
    const CPUS: usize = 2;
    const SAMPLES: u64 = 2_500_000;
    // 256 slots, threshold 50%, 300 keys: automatic switches all the time, and misses
    // whenever the consumer lags; the consumer also requests switches continuously.
    let mut a = arg(KEY_IP, 256, 8, 0);
    a.switch_permille = 500;
    let s = session(&a, 2);
    let mems: Vec<_> = (0..CPUS)
        .map(|_| SharedMem::new(s.buffer_size() as usize))
        .collect();
    let done = Arc::new(AtomicBool::new(false));

    let producers: Vec<_> = mems
        .iter()
        .enumerate()
        .map(|(cpu, mem)| {
            let mut cs = {
                // SAFETY: the only producer until the thread below starts.
                let mut buf = unsafe { mem.buffer() };
                let mut cs = s.init_cpu(cpu as u32, &mut buf, &a.to_bytes()).unwrap();
                cs.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
                cs
            };
            let mem = Arc::clone(mem);
            std::thread::spawn(move || {
                // SAFETY: as above.
                let mut buf = unsafe { mem.buffer() };
                let mut rng = Rng(0x1234_5678 + cpu as u64);
                let mut truth = Truth {
                    keys: vec![(0, 0); KEYS],
                    samples: 0,
                    value: 0,
                };
                for t in 1..=SAMPLES {
                    // Skewed keys: low indices are hot.
                    let r = rng.next();
                    let j = ((r % KEYS as u64) * ((r >> 32) % KEYS as u64) / KEYS as u64) as usize;
                    let step = 1 + (r >> 50) % 64;
                    truth.value += step;
                    truth.keys[j].0 += 1;
                    truth.keys[j].1 += step;
                    truth.samples += 1;
                    let mut smp = overflow(t, 1, ip_of(j), truth.value);
                    smp.cpu = cpu as u32;
                    cs.dispatch(&mut buf, &smp, &Services::NONE);
                }
                (cs, truth)
            })
        })
        .collect();

    let consumer = {
        let mems: Vec<_> = mems.iter().map(Arc::clone).collect();
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let views: Vec<_> = mems.iter().map(|m| m.view()).collect();
            let mut seen: Vec<Seen> = (0..CPUS).map(|_| Seen::default()).collect();
            let mut requests = 0u64;
            while !done.load(Ordering::Acquire) {
                for (v, s) in views.iter().zip(seen.iter_mut()) {
                    s.drain(v);
                    v.request_switch().unwrap();
                    requests += 1;
                }
                std::thread::yield_now();
            }
            for (v, s) in views.iter().zip(seen.iter_mut()) {
                s.drain(v);
            }
            (seen, requests)
        })
    };

    let results: Vec<_> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    let (mut seen, requests) = consumer.join().unwrap();
    assert!(requests > 100, "the consumer ran: {requests} requests");

    for (cpu, ((mut cs, truth), mem)) in results.into_iter().zip(&mems).enumerate() {
        // The producer has stopped: close the last interval and drain it.
        // SAFETY: the producer thread was joined; we are the only producer now.
        let mut buf = unsafe { mem.buffer() };
        assert_eq!(cs.restart(&mut buf), Ok(CTRL_SWITCH | CTRL_NOTIFY));
        let s = &mut seen[cpu];
        assert!(s.drain(&mem.view()));
        assert!(s.intervals > 10, "cpu {cpu}: {} intervals", s.intervals);
        assert_eq!(
            s.samples, truth.samples,
            "cpu {cpu}: every sample in one interval"
        );
        assert_eq!(s.sum_total, truth.value, "cpu {cpu}: sums conserved");
        // SAFETY: as above.
        assert_eq!(unsafe { mem.buffer() }.header().overflows, truth.samples);
        // Per key: what the tables hold plus `other` is exactly the truth.
        let (mut c, mut sm) = (0, 0);
        for (j, &(tc, ts)) in truth.keys.iter().enumerate() {
            let (gc, gs) = s.keys.get(&ip_of(j)).copied().unwrap_or_default();
            assert!(gc <= tc && gs <= ts, "cpu {cpu} key {j}");
            c += tc - gc;
            sm += ts - gs;
        }
        assert_eq!(
            (c, sm),
            s.other,
            "cpu {cpu}: the missing samples are `other`, exactly"
        );
        std::println!(
            "cpu {cpu}: {} samples, {} intervals, {} in other, {} switch waits",
            s.samples,
            s.intervals,
            s.other.0,
            mem.view().switch_waits()
        );
    }
}

// ---------------------------------------------------------------- ABI and robustness

fn validate(p: &SessionParams, arg: &[u8]) -> i32 {
    let f = AGGREGATE_OPS.validate.unwrap();
    // SAFETY: valid pointers for the call.
    unsafe { f(p, arg.as_ptr(), arg.len()) }
}

fn getsize(p: &SessionParams, arg: &[u8]) -> Result<u64, i32> {
    let f = AGGREGATE_OPS.getsize.unwrap();
    let mut size = 0;
    // SAFETY: valid pointers for the call.
    match unsafe { f(p, arg.as_ptr(), arg.len(), &mut size) } {
        0 => Ok(size),
        e => Err(e),
    }
}

#[test]
fn argument_rules() {
    let p = params(MODE_OVERFLOW, 2);
    let ok = |a: AggregateArg| validate(&p, &a.to_bytes());
    assert_eq!(validate(&p, &[]), 0);
    assert_eq!(ok(AggregateArg::default()), 0);
    assert_eq!(ok(arg(KEY_STACK, 1 << 20, 1 << 20, 0)), 0);
    for bad in [
        AggregateArg {
            key: 4,
            ..Default::default()
        },
        AggregateArg {
            slots: 100,
            ..Default::default()
        },
        AggregateArg {
            slots: 8,
            ..Default::default()
        },
        AggregateArg {
            slots: 1 << 21,
            ..Default::default()
        },
        AggregateArg {
            slots: 16,
            probe: 17,
            ..Default::default()
        },
        AggregateArg {
            counter: 2,
            ..Default::default()
        },
        AggregateArg {
            switch_permille: 1001,
            ..Default::default()
        },
        AggregateArg {
            flags: 2,
            ..Default::default()
        },
        AggregateArg {
            reserved: [0, 1],
            ..Default::default()
        },
        AggregateArg {
            stack_slots: 64,
            ..Default::default()
        }, // stacks without KEY_STACK
        AggregateArg {
            key: KEY_STACK,
            kstack_depth: 129,
            ..Default::default()
        },
        AggregateArg {
            key: KEY_STACK,
            stack_slots: 48,
            ..Default::default()
        },
    ] {
        assert_eq!(ok(bad), -EINVAL, "{bad:?}");
    }
    // Sized: too short, size disagreeing with the length, newer with a zero or
    // non-zero tail.
    let b = AggregateArg::default().to_bytes();
    assert_eq!(validate(&p, &b[..40]), -EINVAL);
    let mut long = [0u8; 56];
    long[..48].copy_from_slice(&b);
    assert_eq!(validate(&p, &long), -EINVAL, "size says 48, 56 given");
    long[..4].copy_from_slice(&56u32.to_ne_bytes());
    assert_eq!(validate(&p, &long), 0);
    long[50] = 1;
    assert_eq!(validate(&p, &long), -E2BIG);
    assert_eq!(parse_arg(&long), Err(E2BIG));
    // Session parameters.
    assert_eq!(validate(&params(MODE_OVERFLOW, 0), &[]), -EINVAL);
    assert_eq!(validate(&params(9, 1), &[]), -EINVAL);
    let f = AGGREGATE_OPS.validate.unwrap();
    // SAFETY: null params are refused, not dereferenced.
    assert!(unsafe { f(core::ptr::null(), [].as_ptr(), 0) } < 0);
    // SAFETY: a non-zero length with a null argument is refused.
    assert!(unsafe { f(&p, core::ptr::null(), 48) } < 0);
    // Through the engine: the non-zero tail is E2BIG before the format is asked.
    let mut reg: Registry<1> = Registry::new();
    reg.register_static(&AGGREGATE_OPS).unwrap();
    let fmt = reg.acquire(Selector::Name(b"aggregate")).unwrap();
    assert_eq!(
        Session::new(fmt, &p, &long, &[W48; 2]).unwrap_err().errno(),
        E2BIG
    );
}

#[test]
fn getsize_and_layout() {
    let p = params(MODE_OVERFLOW, 1);
    // Private 16 words → data at 256; control 128; tables: 128 + 4096 * 32 each.
    let t = 128 + 4096 * 32;
    assert_eq!(getsize(&p, &[]), Ok(256 + 128 + 2 * t));
    let cfg = config(&p, &AggregateArg::default()).unwrap();
    assert_eq!(
        (cfg.key, cfg.slots, cfg.probe, cfg.threshold),
        (KEY_IP, 4096, 16, 3072)
    );
    let l = cfg.layout().unwrap();
    assert_eq!((l.data_offset, l.table0, l.table_bytes), (256, 384, t));
    // Stacks: scratch of 33 words; entries of 16 + 8 * 32 bytes.
    let a = AggregateArg {
        key: KEY_STACK,
        slots: 64,
        ..AggregateArg::default()
    };
    let cfg = config(&p, &a).unwrap();
    assert_eq!(
        (cfg.stack_slots, cfg.kdepth, cfg.udepth, cfg.stack_threshold),
        (1024, 32, 32, 768)
    );
    let l = cfg.layout().unwrap();
    assert_eq!(l.data_offset, 576, "128 + 128 + 33 * 8, rounded up to 64");
    assert_eq!(l.table_bytes, 128 + 64 * 32 + 1024 * 272);
    assert_eq!(getsize(&p, &a.to_bytes()), Ok(l.buf_size));
    let noauto = AggregateArg {
        flags: AGG_ARG_FL_NO_AUTO_SWITCH,
        ..AggregateArg::default()
    };
    assert_eq!(config(&p, &noauto).unwrap().threshold, u64::MAX);
}

#[test]
fn ops_table_registers() {
    let mut reg: Registry<2> = Registry::new();
    reg.register_static(&AGGREGATE_OPS).unwrap();
    let info = reg.iter().next().unwrap();
    assert_eq!(hrperf_abi::name_bytes(&info.name), b"aggregate");
    assert_eq!(
        (info.uuid, info.version, info.arg_size, info.flags),
        (
            AGGREGATE_UUID,
            0x0001_0000,
            48,
            FMT_FL_STACKS | FMT_FL_INTERVALS
        )
    );
    // Callbacks refuse what is not theirs instead of touching it.
    let mut junk = vec![0u64; 64];
    let h = AGGREGATE_OPS.handler.unwrap();
    let r = AGGREGATE_OPS.restart.unwrap();
    let a = hrperf_abi::OverflowArg {
        size: 136,
        kind: 0,
        cpu: 0,
        pid: 0,
        tid: 0,
        ovfl_counter: 0,
        nr_counters: 1,
        multi_wrap: 0,
        time_ns: 0,
        ip: 0,
        addr: 0,
        last_reset: 0,
        values: [0; 8],
        flags: 0,
        reserved: 0,
    };
    let mut ctrl = 7;
    // SAFETY: valid pointers; the buffer is not initialised, so nothing is written.
    unsafe {
        assert_eq!(h(junk.as_mut_ptr().cast(), 512, &a, core::ptr::null()), 0);
        assert_eq!(
            h(
                junk.as_mut_ptr().cast(),
                512,
                core::ptr::null(),
                core::ptr::null()
            ),
            0
        );
        assert_eq!(r(junk.as_mut_ptr().cast(), 512, &mut ctrl), -EINVAL);
    }
    assert_eq!(ctrl, 0);
    assert!(junk.iter().all(|&w| w == 0));
    assert_eq!(RecordType::AGGREGATE_BASE, REC_INTERVAL);
}

#[test]
fn corrupt_private_words_are_refused() {
    // The handler re-checks the layout it keeps in the producer-private words on every
    // call: whatever those words say, it never writes outside the buffer (guard words
    // on both sides would show it) and every sample is still counted by the engine.
    const GUARD: usize = 4096;
    const PATTERN: u64 = 0x5a5a_5a5a_5a5a_5a5a;
    let a = arg(KEY_STACK, 16, 0, 0);
    let s = session(&a, 2);
    let n = (s.buffer_size() as usize).div_ceil(8);
    let mut words = vec![PATTERN; GUARD + n + GUARD];
    let mut cpu = {
        let mut buf = Buffer::from_words(&mut words[GUARD..GUARD + n]).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, &a.to_bytes()).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        cpu
    };
    let clean = words[GUARD..GUARD + n].to_vec();
    let priv0 = GUARD + layout::PRIV_OFFSET / 8;
    let mut rng = Rng(7);
    let mut f = FakeStacks {
        kernel: kstack(1, 40),
        user: ustack(1, 40),
        calls: 0,
    };
    for i in 0..3_000u64 {
        words[GUARD..GUARD + n].copy_from_slice(&clean);
        // One of: cur, gen, cfg, mask, probe, threshold, table0, table bytes, stack
        // mask, depths, stack threshold.
        let w = priv0 + 1 + (rng.next() % 15) as usize;
        words[w] = match i % 4 {
            0 => rng.next(),
            1 => u64::MAX,
            2 => ((8 * n) as u64).wrapping_sub(rng.next() % 4096) & !7,
            _ => words[w] << (1 + rng.next() % 8),
        };
        let svc = services(&mut f);
        let mut buf = Buffer::from_words(&mut words[GUARD..GUARD + n]).unwrap();
        let before = buf.header().overflows;
        cpu.dispatch(&mut buf, &overflow(i + 1, 1, 0x10, i), &svc);
        assert_eq!(buf.header().overflows - before, 1);
        assert!(
            words[..GUARD]
                .iter()
                .chain(&words[GUARD + n..])
                .all(|&g| g == PATTERN),
            "round {i}"
        );
    }
}

#[test]
fn views_refuse_other_buffers_and_survive_corruption() {
    let mut junk = vec![0u64; 256];
    let ptr = NonNull::new(junk.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: the vector outlives the call.
    let v = unsafe { AggView::from_raw(ptr, 2048, Access::ReadOnly) };
    assert_eq!(v.unwrap_err(), ViewError::NotAggregate);

    // A real buffer with one interval, then random bytes written over its table: the
    // reader must not panic, and must flag what does not add up.
    let mut a = arg(KEY_STACK, 16, 0, AGG_ARG_FL_NO_AUTO_SWITCH);
    (a.stack_slots, a.kstack_depth, a.ustack_depth) = (16, 4, 4);
    let mut rig = Rig::new(&a, 2);
    let mut f = FakeStacks::default();
    for j in 0..12u64 {
        f.kernel = kstack(j % 5, 1 + j as usize % 4);
        f.user = ustack(j % 3, 2);
        let svc = services(&mut f);
        rig.dispatch_with(&overflow(j + 1, j as u32 % 2, 0, j), &svc);
    }
    assert_eq!(rig.restart(), Ok(CTRL_SWITCH | CTRL_NOTIFY));
    let tsize = rig.view().table_bytes();
    let data_off = Buffer::from_words(&mut rig.words)
        .unwrap()
        .header()
        .data_offset as usize;
    let t1 = (data_off + 128 + tsize) / 8; // interval 1 is in table 1
    let clean: Vec<u64> = rig.words.clone();
    let mut rng = Rng(99);
    let mut flagged = 0;
    for round in 0..300 {
        rig.words.copy_from_slice(&clean);
        for _ in 0..1 + round % 20 {
            let w = t1 + (rng.next() as usize % (tsize / 8));
            rig.words[w] = match rng.next() % 4 {
                0 => rng.next(),
                1 => rig.words[w] ^ 1 << (rng.next() % 64),
                2 => u64::MAX,
                _ => 0,
            };
        }
        let v = rig.view();
        let iv = v.pending().unwrap();
        let mut n = 0;
        let s = iv.emit_records(|r| {
            n += r.len();
            assert!(r.len() % 8 == 0 && header(r).unwrap().size as usize == r.len());
        });
        if s.flags & IV_FL_INCONSISTENT != 0 {
            flagged += 1;
        }
    }
    std::println!("{flagged} of 300 corrupted tables flagged");
    assert!(flagged > 100, "corruption is noticed: {flagged}");
}

#[test]
fn record_roundtrip_and_parse_errors() {
    let iv = IntervalRecord {
        cpu: 1,
        key_kind: KEY_IP,
        seq: 2,
        start_ns: 3,
        end_ns: 4,
        samples: 5,
        entries: 6,
        other_count: 7,
        other_sum: 8,
        misses: 9,
        sum_total: 10,
        stacks: 11,
        stack_misses: 12,
        stack_truncated: 13,
        multi_wraps: 14,
        counter: 15,
        flags: 16,
    };
    let mut b = [0u8; 2048];
    assert_eq!(write_interval(&iv, &mut b), Some(INTERVAL_SIZE));
    assert_eq!(parse_interval(&b[..INTERVAL_SIZE]), Ok(iv));
    assert_eq!(
        parse_interval(&b[..INTERVAL_SIZE - 1]),
        Err(ParseError::Truncated)
    );
    assert_eq!(
        parse_entry(&b[..INTERVAL_SIZE]),
        Err(ParseError::WrongType(REC_INTERVAL.0))
    );
    let e = EntryRecord {
        cpu: 1,
        key_kind: KEY_PID_IP,
        seq: 2,
        start_ns: 3,
        end_ns: 4,
        pid: 5,
        ip: 6,
        kstack_id: 7,
        ustack_id: 8,
        count: 9,
        sum: 10,
    };
    assert_eq!(write_entry(&e, &mut b), Some(ENTRY_SIZE));
    assert_eq!(parse_entry(&b[..ENTRY_SIZE]), Ok(e));
    assert_eq!(write_entry(&e, &mut b[..79]), None);
    let s = StackRecord {
        cpu: 1,
        stack_id: 2,
        seq: 3,
        depth: 0,
        flags: STACK_FL_KERNEL,
    };
    let frames = [0xa, 0xb, 0xc];
    assert_eq!(write_stack(&s, &frames, &mut b), Some(56));
    let (got, fb) = parse_stack(&b[..56]).unwrap();
    assert_eq!(got, StackRecord { depth: 3, ..s });
    assert_eq!((frame(fb, 2), frame(fb, 3)), (Some(0xc), None));
    assert_eq!(write_stack(&s, &[], &mut b), None);
    assert_eq!(write_stack(&s, &[0; 129], &mut b), None);
    b[24] = 4; // depth disagrees with size
    assert_eq!(parse_stack(&b[..56]).unwrap_err(), ParseError::Malformed);
    assert_eq!(key_name(KEY_STACK), "stack");
}
