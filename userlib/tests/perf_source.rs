//! The perf source against the real kernel: software events, a real workload, real
//! `perf_event_open`, mmap rings and group reads.
//!
//! Needs `perf_event_open` to be allowed (root, CAP_PERFMON or perf_event_paranoid <= 1
//! for the system-wide test); tests that cannot run say why on stderr and pass.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hrperf::source::perf::{parse_events, PerfConfig, PerfSource, Sampling, Target};
use hrperf::source::{Finish, Progress, RawSample, Source, SourceError};
use hrperf_abi::format::{MODE_OVERFLOW, MODE_POLL, SAMPLE_OVERFLOW, SAMPLE_POLL};

/// About 0.25 s of CPU in dash, entirely inside the shell process.
const BUSY: &str = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";

fn sh(script: &str) -> Target {
    Target::Command(vec!["sh".into(), "-c".into(), script.into()])
}

/// Whether this process may open a per-task software counter; prints why not.
fn perf_usable() -> bool {
    let probe = PerfConfig::new(
        parse_events("task-clock").unwrap(),
        Sampling::Poll {
            interval_ns: 1_000_000,
        },
        Target::Cpus(vec![first_cpu()]),
    );
    match PerfSource::new(probe) {
        Ok(_) => true,
        Err(e @ SourceError::Permission(_)) => {
            eprintln!("SKIP: perf_event_open not allowed here: {e}");
            false
        }
        Err(e) => panic!("cannot open a software counter: {e}"),
    }
}

fn first_cpu() -> u32 {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    hrperf::source::perf::parse_cpu_list(&online).unwrap()[0]
}

/// Starts `src`, collects samples until it finishes (15 s at most), finishes it.
fn record(src: &mut PerfSource) -> (Vec<RawSample>, Finish) {
    src.start().unwrap();
    let t0 = Instant::now();
    let mut out = Vec::new();
    while src.next(&mut out, Duration::from_millis(100)).unwrap() == Progress::Running {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the workload did not finish"
        );
    }
    let fin = src.finish().unwrap();
    (out, fin)
}

/// Sum over CPUs of the per-CPU deltas of counter `i` (raw values are cumulative).
fn summed_deltas(samples: &[RawSample], i: usize) -> u64 {
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut sum = 0;
    for s in samples {
        let prev = last.insert(s.cpu, s.raw[i]).unwrap_or(0);
        assert!(
            s.raw[i] >= prev,
            "counter {i} went backwards on cpu {}",
            s.cpu
        );
        sum += s.raw[i] - prev;
    }
    sum
}

#[test]
fn poll_mode_cpu_clock_matches_the_child_cpu_time() {
    if !perf_usable() {
        return;
    }
    let events = parse_events("cpu-clock,task-clock,page-faults").unwrap();
    let cfg = PerfConfig::new(
        events,
        Sampling::Poll {
            interval_ns: 1_000_000,
        },
        sh(BUSY),
    );
    let mut src = PerfSource::new(cfg).unwrap();
    assert_eq!(src.info().mode, MODE_POLL);
    let cpus = src.info().cpus.clone();
    let t0 = Instant::now();
    let (samples, fin) = record(&mut src);
    let wall = t0.elapsed();
    assert_eq!(fin.exit_status, 0);
    let child_ns = src.child_cpu_time_ns().expect("child reaped");
    assert!(samples
        .iter()
        .all(|s| s.kind == SAMPLE_POLL && s.nr == 3 && s.ovfl_counter == u32::MAX));
    let pid = src.child_pid().unwrap_or(0);
    assert!(samples.iter().all(|s| s.pid == pid || pid == 0));
    // Per CPU, times increase and each round reads every CPU.
    for &cpu in &cpus {
        let times: Vec<u64> = samples
            .iter()
            .filter(|s| s.cpu == cpu)
            .map(|s| s.time_ns)
            .collect();
        assert!(
            times.windows(2).all(|w| w[0] < w[1]),
            "cpu {cpu}: times not increasing"
        );
        assert!(times.len() >= 10, "cpu {cpu}: only {} polls", times.len());
    }
    let cpu_clock = summed_deltas(&samples, 0);
    let task_clock = summed_deltas(&samples, 1);
    let faults = summed_deltas(&samples, 2);
    let ratio = cpu_clock as f64 / child_ns as f64;
    let per_cpu = samples.len() as f64 / cpus.len() as f64;
    eprintln!(
        "poll 1 ms: {} samples over {} CPUs in {:.3} s wall ({:.0} reads/s per CPU); \
         cpu-clock {:.3} ms, task-clock {:.3} ms, child rusage {:.3} ms (cpu-clock/rusage = {ratio:.4}); \
         page-faults {faults}; missed deadlines {}",
        samples.len(),
        cpus.len(),
        wall.as_secs_f64(),
        per_cpu / wall.as_secs_f64(),
        cpu_clock as f64 / 1e6,
        task_clock as f64 / 1e6,
        child_ns as f64 / 1e6,
        src.missed_polls(),
    );
    assert!(
        (0.95..=1.05).contains(&ratio),
        "cpu-clock {cpu_clock} ns vs child CPU time {child_ns} ns"
    );
    let tc_ratio = task_clock as f64 / cpu_clock as f64;
    assert!(
        (0.95..=1.05).contains(&tc_ratio),
        "task-clock {task_clock} vs cpu-clock {cpu_clock}"
    );
    assert!(faults > 0, "an exec'd shell takes page faults");
}

#[test]
fn overflow_mode_cpu_clock_samples() {
    if !perf_usable() {
        return;
    }
    let period = 100_000;
    let events = parse_events("cpu-clock,page-faults").unwrap();
    let mut src =
        PerfSource::new(PerfConfig::new(events, Sampling::Period(period), sh(BUSY))).unwrap();
    assert_eq!(
        (src.info().mode, src.info().sample_period),
        (MODE_OVERFLOW, period)
    );
    let t0 = Instant::now();
    let (samples, fin) = record(&mut src);
    let wall = t0.elapsed();
    assert_eq!(fin.exit_status, 0);
    let child_ns = src.child_cpu_time_ns().unwrap();
    let pid = src.child_pid().unwrap_or_default();
    eprintln!(
        "overflow cpu-clock/{period} ns: {} samples in {:.3} s wall ({:.0}/s), child CPU {:.3} ms → \
         expected ≈{}; lost {:?}; inherit {}; notes {:?}; stats {:?}",
        samples.len(),
        wall.as_secs_f64(),
        samples.len() as f64 / wall.as_secs_f64(),
        child_ns as f64 / 1e6,
        child_ns / period,
        fin.lost,
        src.inherits(),
        src.notes(),
        src.stats(),
    );
    assert!(!samples.is_empty());
    for s in &samples {
        assert_eq!((s.kind, s.nr, s.ovfl_counter), (SAMPLE_OVERFLOW, 2, 0));
        assert_ne!(s.ip, 0, "overflow samples carry the interrupted IP");
        assert_ne!(s.tid, 0);
        assert!(src.info().cpus.contains(&s.cpu));
    }
    // The shell loop runs in the shell itself: every sample is from the child.
    let mut by_task: HashMap<(u32, u32), usize> = HashMap::new();
    for s in &samples {
        *by_task.entry((s.pid, s.tid)).or_default() += 1;
    }
    assert!(
        samples.iter().all(|s| s.pid == pid),
        "samples from other processes: child {pid}, {by_task:?}"
    );
    // Times increase per CPU (each CPU has its own ring, written in order).
    let mut last: HashMap<u32, u64> = HashMap::new();
    for s in &samples {
        let prev = last.insert(s.cpu, s.time_ns).unwrap_or(0);
        assert!(s.time_ns >= prev, "cpu {}: time went back", s.cpu);
    }
    // raw[] is cumulative per CPU: the leader grows by about one period per sample.
    let mut last: HashMap<u32, u64> = HashMap::new();
    for s in &samples {
        let prev = last.insert(s.cpu, s.raw[0]).unwrap_or(0);
        assert!(s.raw[0] > prev, "cpu-clock did not grow between samples");
    }
    let total: u64 = last.values().sum();
    let per_sample = total as f64 / samples.len() as f64 / period as f64;
    assert!(
        (0.9..=1.1).contains(&per_sample),
        "{per_sample} periods per sample"
    );
    let expected = child_ns / period;
    let n = samples.len() as u64;
    assert!(
        n * 2 >= expected && n <= expected * 3 / 2 + 5,
        "{n} samples for {child_ns} ns of CPU at one per {period} ns (expected ≈{expected})"
    );
    assert!(
        fin.lost.iter().all(|&(_, l)| l == 0),
        "lost samples: {:?}",
        fin.lost
    );
}

#[test]
fn frequency_mode_runs() {
    if !perf_usable() {
        return;
    }
    let events = parse_events("task-clock").unwrap();
    let mut src = PerfSource::new(PerfConfig::new(events, Sampling::Freq(1000), sh(BUSY))).unwrap();
    let (samples, fin) = record(&mut src);
    assert_eq!(fin.exit_status, 0);
    let child_ms = src.child_cpu_time_ns().unwrap() / 1_000_000;
    eprintln!(
        "freq 1000 Hz: {} samples for {child_ms} ms of CPU",
        samples.len()
    );
    assert!(!samples.is_empty());
}

#[test]
fn hardware_event_without_pmu_is_no_pmu() {
    if std::path::Path::new("/sys/bus/event_source/devices/cpu").exists()
        || std::path::Path::new("/sys/bus/event_source/devices/cpu_core").exists()
    {
        eprintln!(
            "SKIP: this machine has a hardware PMU; the no-PMU error path cannot be exercised"
        );
        return;
    }
    if !perf_usable() {
        return;
    }
    let events = parse_events("cpu-clock,cycles").unwrap();
    for target in [sh("exit 0"), Target::SystemWide] {
        let err = PerfSource::new(PerfConfig::new(
            events.clone(),
            Sampling::Period(100_000),
            target,
        ))
        .unwrap_err();
        let msg = err.to_string();
        eprintln!("cycles without a PMU: {msg}");
        match err {
            SourceError::NoPmu { event, detail } => {
                assert_eq!(event, "cycles");
                assert!(detail.contains("software"), "{detail}");
            }
            other => panic!("expected NoPmu, got {other:?}"),
        }
        assert!(msg.contains("needs a hardware PMU"));
    }
}

#[test]
fn unknown_event_lists_known_ones() {
    match parse_events("cpu-clock,no-such-event") {
        Err(e @ SourceError::UnknownEvent { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no-such-event")
                    && msg.contains("cpu-clock")
                    && msg.contains("cycles"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_or_unexecutable_command_is_a_command_error() {
    if !perf_usable() {
        return;
    }
    let ev = parse_events("cpu-clock").unwrap();
    for argv in [["hrperf-no-such-command-xyz"], ["/nonexistent/dir/cmd"]] {
        let t = Target::Command(argv.iter().map(|s| s.to_string()).collect());
        match PerfSource::new(PerfConfig::new(ev.clone(), Sampling::Period(100_000), t)) {
            Err(SourceError::Command { cmd, source }) => {
                assert_eq!(cmd, argv[0]);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
    }
    // Found but not executable: the exec itself fails, reported by start().
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-executable");
    std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
    let t = Target::Command(vec![path.to_string_lossy().into_owned()]);
    let mut src = PerfSource::new(PerfConfig::new(ev, Sampling::Period(100_000), t)).unwrap();
    match src.start() {
        Err(e @ SourceError::Command { .. }) => eprintln!("exec failure: {e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        src.next(&mut Vec::new(), Duration::ZERO).unwrap(),
        Progress::Finished
    );
}

#[test]
fn exit_status_is_propagated() {
    if !perf_usable() {
        return;
    }
    let ev = parse_events("task-clock").unwrap();
    for (script, status) in [("exit 3", 3), ("kill -9 $$", -9)] {
        let mut src = PerfSource::new(PerfConfig::new(
            ev.clone(),
            Sampling::Period(1_000_000),
            sh(script),
        ))
        .unwrap();
        let (_, fin) = record(&mut src);
        assert_eq!(fin.exit_status, status, "{script}");
        assert!(fin.end_time_ns >= src.info().start_time_ns);
    }
}

#[test]
fn system_wide_poll_until_stopped() {
    if !perf_usable() {
        return;
    }
    let ev = parse_events("cpu-clock,context-switches").unwrap();
    let cfg = PerfConfig::from_cli(
        ev,
        Sampling::Poll {
            interval_ns: 5_000_000,
        },
        true,
        None,
        vec![],
    )
    .unwrap();
    let mut src = match PerfSource::new(cfg) {
        Ok(s) => s,
        Err(e @ SourceError::Permission(_)) => {
            eprintln!("SKIP: system-wide counting not allowed: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    src.start().unwrap();
    let mut out = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        assert_eq!(
            src.next(&mut out, Duration::from_millis(20)).unwrap(),
            Progress::Running
        );
    }
    src.stop().unwrap();
    assert_eq!(
        src.next(&mut out, Duration::from_millis(20)).unwrap(),
        Progress::Finished
    );
    let fin = src.finish().unwrap();
    assert_eq!(fin.exit_status, 0);
    let cpus = src.info().cpus.clone();
    // cpu-clock system-wide counts wall time per CPU: ~100 ms each.
    for &cpu in &cpus {
        let last = out
            .iter()
            .rev()
            .find(|s| s.cpu == cpu)
            .expect("samples from every CPU");
        assert!(
            last.raw[0] > 50_000_000,
            "cpu {cpu}: cpu-clock {} ns after ~100 ms",
            last.raw[0]
        );
        assert!(last.pid == 0 && last.kind == SAMPLE_POLL);
    }
}

#[test]
fn cpu_list_with_a_workload_ends_with_it() {
    if !perf_usable() {
        return;
    }
    let cpu = first_cpu();
    let ev = parse_events("cpu-clock").unwrap();
    let cfg = PerfConfig::from_cli(
        ev,
        Sampling::Period(1_000_000),
        false,
        Some(vec![cpu]),
        vec!["sh".into(), "-c".into(), "exit 5".into()],
    )
    .unwrap();
    let mut src = match PerfSource::new(cfg) {
        Ok(s) => s,
        Err(e @ SourceError::Permission(_)) => {
            eprintln!("SKIP: CPU-wide counting not allowed: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (samples, fin) = record(&mut src);
    assert_eq!(fin.exit_status, 5);
    assert!(samples.iter().all(|s| s.cpu == cpu));
    assert_eq!(fin.lost, vec![(cpu, 0)]);
}

#[test]
fn children_of_the_command_are_followed() {
    if !perf_usable() {
        return;
    }
    // Two child shells do the work; the top shell only waits for them.
    let small = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done";
    let script = format!("sh -c '{small}'; sh -c '{small}'");
    // Overflow: samples come from the children (inherit with PERF_SAMPLE_READ, 6.12+).
    let ev = parse_events("cpu-clock").unwrap();
    let mut src = PerfSource::new(PerfConfig::new(
        ev.clone(),
        Sampling::Period(100_000),
        sh(&script),
    ))
    .unwrap();
    let (samples, fin) = record(&mut src);
    assert_eq!(fin.exit_status, 0);
    let top = src.child_pid().unwrap();
    let mut pids: Vec<u32> = samples
        .iter()
        .map(|s| s.pid)
        .filter(|&p| p != top)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    if src.inherits() {
        assert!(
            pids.len() >= 2,
            "expected samples from both child shells, got pids {pids:?} (top {top})"
        );
        // Per-thread values folded into per-CPU totals: monotonic per CPU, about one
        // period per sample across processes.
        let mut last: HashMap<u32, u64> = HashMap::new();
        for s in &samples {
            let prev = last.insert(s.cpu, s.raw[0]).unwrap_or(0);
            assert!(s.raw[0] > prev, "cpu {}: per-CPU total went back", s.cpu);
        }
        let per_sample = last.values().sum::<u64>() as f64 / samples.len() as f64 / 100_000.0;
        eprintln!(
            "children: {} samples from pids {pids:?}, {per_sample:.3} periods per sample",
            samples.len()
        );
        assert!(
            (0.9..=1.1).contains(&per_sample),
            "{per_sample} periods per sample"
        );
    } else {
        eprintln!(
            "SKIP (children): counters do not follow children here: {:?}",
            src.notes()
        );
    }
    // Poll: the group reads include the children's counts (the kernel folds them in).
    let cfg = PerfConfig::new(
        ev,
        Sampling::Poll {
            interval_ns: 2_000_000,
        },
        sh(&script),
    );
    let mut src = PerfSource::new(cfg).unwrap();
    let (samples, _) = record(&mut src);
    let child_ns = src.child_cpu_time_ns().unwrap();
    let ratio = summed_deltas(&samples, 0) as f64 / child_ns as f64;
    eprintln!("children: poll cpu-clock / rusage of the command tree = {ratio:.4}");
    assert!((0.95..=1.05).contains(&ratio), "ratio {ratio}");
}

#[test]
fn the_command_gets_default_sigpipe_and_no_blocked_signals() {
    if !perf_usable() {
        return;
    }
    // The test harness (a Rust program) ignores SIGPIPE; an ignored signal survives exec,
    // so the source must reset it (as std::process::Command does). Exit 1 if SIGPIPE
    // (bit 12 of SigIgn) is ignored, 2 if any signal is blocked.
    let script = "ign=$(awk '/^SigIgn/{print $2}' /proc/$$/status); \
                  blk=$(awk '/^SigBlk/{print $2}' /proc/$$/status); \
                  [ $(( (0x$ign >> 12) & 1 )) -eq 0 ] || exit 1; \
                  [ $(( 0x$blk )) -eq 0 ] || exit 2; exit 0";
    let ev = parse_events("task-clock").unwrap();
    let mut src =
        PerfSource::new(PerfConfig::new(ev, Sampling::Period(1_000_000), sh(script))).unwrap();
    let (_, fin) = record(&mut src);
    assert_eq!(
        fin.exit_status, 0,
        "1: SIGPIPE ignored, 2: signals blocked in the command"
    );
}
