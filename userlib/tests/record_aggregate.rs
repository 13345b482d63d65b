//! The aggregating format end to end in userspace: source → engine → `AGGREGATE_OPS`
//! (double-buffered in-buffer hash tables) → the recorder drains each published
//! interval in place and acknowledges it, closes intervals every switch period and at
//! the end → capture → `hrperf_fmt_aggregate::record` parsers.
//!
//! The expected per-key counts come from the simulator on its own
//! (`SimSource::run_standalone`), counted here independently of the format.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use hrperf::capture::Reader;
use hrperf::record::{record, RecordOptions, RecordSummary};
use hrperf::source::perf::{parse_events as perf_events, PerfConfig, PerfSource, Sampling, Target};
use hrperf::source::sim::{parse_events, SimConfig, SimSource, Workload};
use hrperf::source::SourceError;
use hrperf_abi::capture::CHUNK_DATA;
use hrperf_abi::format::{MODE_OVERFLOW, SAMPLE_OVERFLOW};
use hrperf_fmt_aggregate::record::{
    self as agg, EntryRecord, IntervalRecord, IV_FL_INCONSISTENT, KEY_IP, KEY_PID_IP, KEY_STACK,
    REC_ENTRY, REC_INTERVAL, REC_STACK,
};
use hrperf_fmt_aggregate::{AggregateArg, AGG_ARG_FL_NO_AUTO_SWITCH};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hrperf-agg-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn sim_cfg(seed: u64) -> SimConfig {
    let mut cfg = SimConfig::new(parse_events("cycles,instructions").unwrap());
    cfg.seed = seed;
    cfg.cpus = 2;
    cfg.duration_ns = 50_000_000;
    cfg.mode = MODE_OVERFLOW;
    cfg.period = 5_000;
    cfg.workload = Workload::Phases;
    cfg
}

fn opts(arg: AggregateArg, interval_ns: u64) -> RecordOptions {
    RecordOptions {
        format: "aggregate".into(),
        host_info: false,
        format_arg: arg.to_bytes().to_vec(),
        switch_interval_ns: interval_ns,
        ..RecordOptions::default()
    }
}

/// One CPU's intervals as read back from the capture: each with its entries.
type Intervals = BTreeMap<u32, Vec<(IntervalRecord, Vec<EntryRecord>)>>;

fn read_capture(path: &Path) -> Intervals {
    let reader = Reader::open(path).unwrap();
    let mut out: Intervals = BTreeMap::new();
    for chunk in reader.chunks() {
        let chunk = chunk.unwrap();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            let b = rec.unwrap().bytes;
            let h = agg::header(b).unwrap();
            let ivs = out.entry(chunk.cpu).or_default();
            if h.kind == REC_INTERVAL {
                let iv = agg::parse_interval(b).unwrap();
                assert_eq!(iv.cpu, chunk.cpu);
                ivs.push((iv, Vec::new()));
            } else if h.kind == REC_ENTRY {
                let e = agg::parse_entry(b).unwrap();
                let (iv, entries) = ivs.last_mut().expect("entry before its interval");
                assert_eq!((e.cpu, e.seq, e.start_ns, e.end_ns), (iv.cpu, iv.seq, iv.start_ns, iv.end_ns));
                entries.push(e);
            } else if h.kind != REC_STACK {
                panic!("unexpected record type {:#x}", h.kind.0);
            }
        }
    }
    out
}

/// Checks the conservation invariant of every interval and that the intervals tile
/// each CPU's session (seq 1, 2, … with no gap, each starting where the last ended);
/// returns per CPU (samples, other) summed over intervals.
fn check_intervals(ivs: &Intervals, sum: &RecordSummary) -> BTreeMap<u32, (u64, u64)> {
    let mut totals = BTreeMap::new();
    for (&cpu, list) in ivs {
        let (mut samples, mut other) = (0u64, 0u64);
        let mut end = 0;
        for (i, (iv, entries)) in list.iter().enumerate() {
            assert_eq!(iv.seq, i as u64 + 1, "cpu {cpu}: intervals in order, none missing");
            assert_eq!(iv.flags & IV_FL_INCONSISTENT, 0, "cpu {cpu} interval {}", iv.seq);
            assert_eq!(iv.entries, entries.len() as u64);
            let count: u64 = entries.iter().map(|e| e.count).sum();
            let csum: u64 = entries.iter().map(|e| e.sum).sum();
            assert_eq!(count + iv.other_count, iv.samples, "cpu {cpu} interval {}: Σcount + other == samples", iv.seq);
            assert_eq!(csum + iv.other_sum, iv.sum_total, "cpu {cpu} interval {}: Σsum + other_sum == sum_total", iv.seq);
            assert_eq!(iv.misses, iv.other_count, "cpu {cpu} interval {}", iv.seq);
            assert!(entries.iter().all(|e| e.count > 0));
            if iv.samples > 0 {
                assert!(iv.start_ns <= iv.end_ns, "cpu {cpu} interval {}", iv.seq);
                assert!(iv.start_ns >= end, "cpu {cpu} interval {}: starts after the previous ended", iv.seq);
                end = iv.end_ns;
            }
            samples += iv.samples;
            other += iv.other_count;
        }
        totals.insert(cpu, (samples, other));
    }
    // Every dispatched sample is in exactly one interval of the capture.
    assert_eq!(sum.aggregate.len(), sum.per_cpu.len());
    for a in &sum.aggregate {
        let (samples, other) = totals.get(&a.cpu).copied().unwrap_or_default();
        assert_eq!(samples, a.dispatched, "cpu {}: Σ interval samples == samples dispatched", a.cpu);
        assert_eq!((a.samples, a.other_count, a.inconsistent), (samples, other, 0));
        assert_eq!(a.intervals, ivs.get(&a.cpu).map_or(0, Vec::len) as u64);
    }
    let all: u64 = totals.values().map(|t| t.0).sum();
    assert_eq!(all, sum.samples, "Σ interval samples == samples the source delivered");
    assert_eq!((sum.drops, sum.masked, sum.source_lost), (0, 0, 0));
    totals
}

/// Per CPU, key → count summed over all intervals.
fn counts_by_key(ivs: &Intervals) -> BTreeMap<u32, BTreeMap<(u32, u64), u64>> {
    ivs.iter()
        .map(|(&cpu, list)| {
            let mut m = BTreeMap::new();
            for e in list.iter().flat_map(|(_, es)| es) {
                *m.entry((e.pid, e.ip)).or_insert(0) += e.count;
            }
            (cpu, m)
        })
        .collect()
}

/// The simulator's own samples counted per CPU by `key`.
fn truth(cfg: &SimConfig, key: u32) -> BTreeMap<u32, BTreeMap<(u32, u64), u64>> {
    let samples = SimSource::new(cfg.clone()).unwrap().run_standalone().unwrap();
    let mut out: BTreeMap<u32, BTreeMap<(u32, u64), u64>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.kind == SAMPLE_OVERFLOW) {
        let k = match key {
            KEY_IP => (0, s.ip),
            KEY_PID_IP => (s.pid, s.ip),
            _ => (s.pid, 0),
        };
        *out.entry(s.cpu).or_default().entry(k).or_insert(0) += 1;
    }
    out
}

fn record_sim(cfg: &SimConfig, o: &RecordOptions, name: &str) -> (RecordSummary, Intervals) {
    let path = tmp(name);
    let mut src = SimSource::new(cfg.clone()).unwrap();
    let file = std::fs::File::create(&path).unwrap();
    let sum = record(&mut src, o, file, &path, &AtomicBool::new(false), &mut |_| {}).unwrap();
    let ivs = read_capture(&path);
    (sum, ivs)
}

#[test]
fn sim_phases_counts_are_exact_per_ip_and_per_pid_ip_over_many_intervals() {
    for (key, name) in [(KEY_IP, "ip"), (KEY_PID_IP, "pid-ip")] {
        let cfg = sim_cfg(11);
        let want = truth(&cfg, key);
        let arg = AggregateArg { key, slots: 4096, ..AggregateArg::default() };
        let (sum, ivs) = record_sim(&cfg, &opts(arg, 5_000_000), &format!("exact-{name}.data"));
        let totals = check_intervals(&ivs, &sum);
        let got = counts_by_key(&ivs);
        assert_eq!(got, want, "key {name}: per-key counts equal the simulator's");
        for (cpu, list) in &ivs {
            assert!(list.len() >= 10, "cpu {cpu}: {} intervals, want several (5 ms over 50 ms)", list.len());
            assert!(list.iter().all(|(iv, _)| iv.key_kind == key));
            let (samples, other) = totals[cpu];
            assert_eq!(other, 0, "a 4096-slot table holds every key");
            assert_eq!(samples, want[cpu].values().sum::<u64>());
            assert!(want[cpu].len() > 100, "cpu {cpu}: a real distribution ({} keys)", want[cpu].len());
        }
        // The key carries the pid for pid-ip (the sim's workload runs as pid 1000) and
        // none for ip.
        let pids: std::collections::BTreeSet<u32> = got.values().flat_map(|m| m.keys().map(|k| k.0)).collect();
        let want_pids: std::collections::BTreeSet<u32> = if key == KEY_PID_IP { [1000].into() } else { [0].into() };
        assert_eq!(pids, want_pids);
        eprintln!(
            "key {name}: {} samples, {} intervals, {} key rows",
            sum.samples,
            sum.aggregate.iter().map(|a| a.intervals).sum::<u64>(),
            sum.aggregate.iter().map(|a| a.entries).sum::<u64>()
        );
    }
}

#[test]
fn small_table_counts_misses_and_conserves_totals() {
    let cfg = sim_cfg(5);
    let want = truth(&cfg, KEY_IP);
    // 16 slots and no switch at the fill threshold: the table fills in every interval
    // and the rest of its samples go to "other".
    let arg = AggregateArg { key: KEY_IP, slots: 16, flags: AGG_ARG_FL_NO_AUTO_SWITCH, ..AggregateArg::default() };
    let (sum, ivs) = record_sim(&cfg, &opts(arg, 5_000_000), "small.data");
    let totals = check_intervals(&ivs, &sum);
    let got = counts_by_key(&ivs);
    for (cpu, list) in &ivs {
        assert!(list.len() >= 10);
        let (samples, other) = totals[cpu];
        assert!(other > samples / 2, "cpu {cpu}: {other} of {samples} in other");
        assert_eq!(samples, want[cpu].values().sum::<u64>(), "cpu {cpu}: nothing lost");
        assert_eq!(got[cpu].values().sum::<u64>() + other, samples, "cpu {cpu}: Σcount + other == samples");
        for (k, &n) in &got[cpu] {
            assert!(n <= want[cpu].get(k).copied().unwrap_or(0), "cpu {cpu} key {k:?}: never over-counted");
        }
        assert!(list.iter().all(|(iv, es)| es.len() <= 16 && iv.misses == iv.other_count));
        assert!(list.iter().filter(|(iv, _)| iv.misses > 0).count() >= 5, "cpu {cpu}: misses in several intervals");
    }
    eprintln!(
        "16 slots: {} samples, {} misses over {} intervals",
        sum.samples,
        sum.aggregate.iter().map(|a| a.misses).sum::<u64>(),
        sum.aggregate.iter().map(|a| a.intervals).sum::<u64>()
    );
}

#[test]
fn auto_switch_with_a_slow_reader_postpones_and_conserves() {
    let cfg = sim_cfg(9);
    let want = truth(&cfg, KEY_PID_IP);
    // 16 slots switch at 12 keys; a reader that wakes only every 20 ms lets the
    // published table wait, so switches are postponed and the overflow goes to other.
    let arg = AggregateArg { key: KEY_PID_IP, slots: 16, ..AggregateArg::default() };
    let o = RecordOptions { wake_on_notify: false, drain_interval_ns: 20_000_000, ..opts(arg, 1_000_000_000) };
    let (sum, ivs) = record_sim(&cfg, &o, "slow.data");
    let totals = check_intervals(&ivs, &sum);
    for (cpu, (samples, _)) in &totals {
        assert_eq!(*samples, want[cpu].values().sum::<u64>());
        assert!(ivs[cpu].len() >= 2);
    }
    assert!(sum.aggregate.iter().all(|a| a.switch_waits > 0 && a.misses > 0), "{:?}", sum.aggregate);
    // With a prompt reader the same table switches at the threshold and never misses.
    let (sum2, ivs2) = record_sim(&cfg, &opts(arg, 1_000_000_000), "prompt.data");
    check_intervals(&ivs2, &sum2);
    assert_eq!(counts_by_key(&ivs2), want);
    assert!(sum2.aggregate.iter().all(|a| a.intervals > 100 && a.misses == 0), "{:?}", sum2.aggregate);
}

/// Per CPU: (pid, kernel frames, user frames) → samples.
type StackCounts = BTreeMap<u32, BTreeMap<(u32, Vec<u64>, Vec<u64>), u64>>;

#[test]
fn stack_keys_count_exactly_per_pid_and_call_stack() {
    let cfg = sim_cfg(3);
    let mut want: StackCounts = BTreeMap::new();
    for (s, k, u) in SimSource::new(cfg.clone()).unwrap().run_standalone_stacks().unwrap() {
        if s.kind == SAMPLE_OVERFLOW {
            *want.entry(s.cpu).or_default().entry((s.pid, k, u)).or_insert(0) += 1;
        }
    }
    let arg = AggregateArg { key: KEY_STACK, ..AggregateArg::default() };
    let o = opts(arg, 10_000_000);
    let path = tmp("stack.data");
    let mut src = SimSource::new(cfg.clone()).unwrap();
    let file = std::fs::File::create(&path).unwrap();
    let sum = record(&mut src, &o, file, &path, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert!(sum.stacks > 0 && sum.stacks == sum.samples, "every sample had its stacks: {sum:?}");

    // Stack ids resolve through the stack records of the same CPU and interval.
    let reader = Reader::open(&path).unwrap();
    let mut frames: BTreeMap<(u32, u64, u32), Vec<u64>> = BTreeMap::new();
    let mut entries = Vec::new();
    let mut intervals: Intervals = BTreeMap::new();
    for chunk in reader.chunks() {
        let chunk = chunk.unwrap();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            let b = rec.unwrap().bytes;
            let h = agg::header(b).unwrap();
            if h.kind == REC_STACK {
                let (st, fr) = agg::parse_stack(b).unwrap();
                let list = (0..st.depth as usize).map(|i| agg::frame(fr, i).unwrap()).collect();
                frames.insert((st.cpu, st.seq, st.stack_id), list);
            } else if h.kind == REC_ENTRY {
                let e = agg::parse_entry(b).unwrap();
                entries.push(e);
                intervals.entry(chunk.cpu).or_default().last_mut().expect("entry after its interval").1.push(e);
            } else if h.kind == REC_INTERVAL {
                intervals.entry(chunk.cpu).or_default().push((agg::parse_interval(b).unwrap(), Vec::new()));
            }
        }
    }
    check_intervals(&intervals, &sum);
    let resolve = |cpu: u32, seq: u64, id: u32| -> Vec<u64> {
        if id == 0 {
            Vec::new()
        } else {
            frames.get(&(cpu, seq, id)).cloned().unwrap_or_else(|| panic!("cpu {cpu} interval {seq}: no stack {id}"))
        }
    };
    let mut got: StackCounts = BTreeMap::new();
    for e in &entries {
        let key = (e.pid, resolve(e.cpu, e.seq, e.kstack_id), resolve(e.cpu, e.seq, e.ustack_id));
        *got.entry(e.cpu).or_default().entry(key).or_insert(0) += e.count;
    }
    assert_eq!(got, want);
    let distinct: usize = got.values().map(BTreeMap::len).sum();
    assert!(distinct >= 6, "several distinct stacks per CPU: {distinct}");
}

#[test]
fn perf_cpu_clock_overflow_conserves_every_sample() {
    let events = perf_events("cpu-clock").unwrap();
    let busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
    let target = Target::Command(vec!["sh".into(), "-c".into(), busy.into()]);
    let mut src = match PerfSource::new(PerfConfig::new(events, Sampling::Period(100_000), target)) {
        Ok(s) => s,
        Err(e @ SourceError::Permission(_)) => {
            eprintln!("SKIP: perf_event_open not allowed here: {e}");
            return;
        }
        Err(e) => panic!("cannot open cpu-clock: {e}"),
    };
    let path = tmp("perf.data");
    let arg = AggregateArg { key: KEY_PID_IP, ..AggregateArg::default() };
    let o = RecordOptions { command: vec!["sh".into()], ..opts(arg, 20_000_000) };
    let file = std::fs::File::create(&path).unwrap();
    let sum = record(&mut src, &o, file, &path, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!(sum.exit_status, 0);
    let ivs = read_capture(&path);
    let totals = check_intervals(&ivs, &sum);
    let samples: u64 = totals.values().map(|t| t.0).sum();
    let intervals: u64 = sum.aggregate.iter().map(|a| a.intervals).sum();
    // ~0.25 s of CPU at one sample per 100 µs.
    assert!(samples > 500, "{samples} samples");
    assert!(intervals >= 3, "{intervals} intervals");
    let pids: std::collections::BTreeSet<u32> = ivs.values().flatten().flat_map(|(_, es)| es.iter().map(|e| e.pid)).collect();
    assert!(pids.iter().any(|&p| p != 0), "the workload's pid is a key: {pids:?}");
    eprintln!("perf: {samples} samples in {intervals} intervals, {} dispatched", sum.samples);
}

#[test]
fn aggregated_stacks_fold_like_logged_stacks_of_the_same_run() {
    use hrperf::agg_report::{stack_profile, RankBy};
    use hrperf::stacks::{Profile, ProfileOptions, WeightBy};
    // One simulated run, recorded twice: aggregated in the buffer by stack, and logged
    // one record per sample (llc-stack). The simulator is deterministic, so the folded
    // stacks (by samples) must be identical.
    let cfg = sim_cfg(5);
    let (sum, _) = record_sim(&cfg, &opts(AggregateArg { key: KEY_STACK, ..AggregateArg::default() }, 10_000_000), "fold-agg.data");
    let logged = tmp("fold-llc.data");
    let mut src = SimSource::new(cfg.clone()).unwrap();
    let o = RecordOptions { format: "llc-stack".into(), host_info: false, ..RecordOptions::default() };
    let s2 = record(&mut src, &o, std::fs::File::create(&logged).unwrap(), &logged, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!(sum.samples, s2.samples);
    let samples = ProfileOptions { weight: WeightBy::Samples, ..ProfileOptions::default() };
    // The aggregate's keys carry their count as the weight of one synthesized record.
    let (agg, left_out) =
        stack_profile(&Reader::open(tmp("fold-agg.data")).unwrap(), RankBy::Count, &ProfileOptions::default()).unwrap();
    let log = Profile::from_reader(&Reader::open(&logged).unwrap(), &samples).unwrap();
    assert_eq!(left_out, 0);
    assert_eq!(agg.total_weight(), sum.samples);
    assert_eq!(agg.folded_lines(false), log.folded_lines(false));
    assert!(agg.folded_lines(false).keys().any(|l| l.ends_with("vfs_read;copy_user_generic")), "kernel frames symbolized");
    // A capture keyed by ip has no stacks to fold.
    let (_, _) = record_sim(&cfg, &opts(AggregateArg { key: KEY_IP, ..AggregateArg::default() }, 10_000_000), "fold-ip.data");
    let e = stack_profile(&Reader::open(tmp("fold-ip.data")).unwrap(), RankBy::Count, &samples).unwrap_err();
    assert!(e.to_string().contains("--agg-key stack"), "{e}");
}
