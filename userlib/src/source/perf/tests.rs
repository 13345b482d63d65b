//! Unit tests of [`PerfSource`] against the fake system calls: attr construction, group
//! setup, error mapping, ring reading and the poll loop, without a kernel.

use std::sync::Arc;
use std::time::Duration;

use super::fake::{id_of, FakeSys, CHILD_PID};
use super::ring::tests::{sample_record, simple_record};
use super::ring::{PERF_RECORD_LOST, PERF_RECORD_THROTTLE};
use super::sys::*;
use super::*;

fn cfg(events: &str, sampling: Sampling, target: Target) -> PerfConfig {
    PerfConfig::new(parse_events(events).unwrap(), sampling, target)
}

fn cmd() -> Target {
    Target::Command(vec!["work".into(), "arg".into()])
}

fn open(fake: &Arc<FakeSys>, c: PerfConfig) -> Result<PerfSource, SourceError> {
    PerfSource::with_sys(c, Box::new(fake.clone()))
}

#[test]
fn command_overflow_groups_and_attrs() {
    let fake = FakeSys::new();
    let src = open(
        &fake,
        cfg("cpu-clock,page-faults", Sampling::Period(100_000), cmd()),
    )
    .unwrap();
    let s = fake.state();
    assert_eq!(s.spawned, vec![vec!["work".to_string(), "arg".to_string()]]);
    assert_eq!(s.opens.len(), 4, "2 CPUs x 2 events");
    for (cpu, pair) in s.opens.chunks(2).enumerate() {
        let (leader, member) = (&pair[0], &pair[1]);
        let leader_fd = leader.result.unwrap();
        assert_eq!(
            (leader.pid, leader.cpu, leader.group_fd),
            (CHILD_PID, cpu as i32, -1)
        );
        assert_eq!(
            (member.pid, member.cpu, member.group_fd),
            (CHILD_PID, cpu as i32, leader_fd)
        );
        assert_eq!(leader.flags, PERF_FLAG_FD_CLOEXEC);
        let a = &leader.attr;
        assert_eq!((a.kind, a.config, a.size), (1, 0, PERF_ATTR_SIZE));
        assert_eq!(a.sample_period_or_freq, 100_000);
        assert_eq!(a.sample_type, SAMPLE_TYPE);
        assert_eq!(a.read_format, PERF_FORMAT_GROUP | PERF_FORMAT_ID);
        assert_eq!(
            a.flags,
            ATTR_DISABLED | ATTR_INHERIT | ATTR_ENABLE_ON_EXEC | ATTR_USE_CLOCKID | ATTR_WATERMARK
        );
        assert_eq!(a.clockid, libc::CLOCK_MONOTONIC);
        assert_eq!(a.wakeup, 64 * 4096 / 4);
        let m = &member.attr;
        assert_eq!(
            (m.kind, m.config, m.sample_type, m.sample_period_or_freq),
            (1, 2, 0, 0)
        );
        assert_eq!(m.flags, ATTR_INHERIT | ATTR_USE_CLOCKID);
        assert!(s.rings.contains_key(&leader_fd), "leader is mapped");
        assert!(
            !s.rings.contains_key(&member.result.unwrap()),
            "members are not"
        );
    }
    drop(s);
    let info = src.info();
    assert_eq!(
        (info.source, info.clock, info.mode),
        (SOURCE_PERF, CLOCK_MONOTONIC, MODE_OVERFLOW)
    );
    assert_eq!((info.sample_period, info.poll_interval_ns), (100_000, 0));
    assert_eq!(
        (info.widths.clone(), info.max_rates.clone()),
        (vec![64, 64], vec![0, 0])
    );
    assert_eq!(info.cpus, vec![0, 1]);
    assert_eq!(info.cpu_model, "Fake CPU @ 1GHz");
    assert_eq!(src.child_pid(), Some(CHILD_PID as u32));
    assert!(src.inherits());
}

#[test]
fn freq_and_modifiers_reach_the_attr() {
    let fake = FakeSys::new();
    let _src = open(
        &fake,
        cfg("task-clock:u", Sampling::Freq(999), Target::Cpus(vec![1])),
    )
    .unwrap();
    let s = fake.state();
    assert_eq!(s.opens.len(), 1);
    let o = &s.opens[0];
    assert_eq!((o.pid, o.cpu), (-1, 1));
    assert_eq!(o.attr.sample_period_or_freq, 999);
    assert_eq!(
        o.attr.flags,
        ATTR_DISABLED
            | ATTR_FREQ
            | ATTR_EXCLUDE_KERNEL
            | ATTR_EXCLUDE_HV
            | ATTR_USE_CLOCKID
            | ATTR_WATERMARK
    );
}

#[test]
fn system_wide_poll_enables_at_start_and_reads_on_absolute_deadlines() {
    let fake = FakeSys::new();
    let c = cfg(
        "cpu-clock,task-clock",
        Sampling::Poll {
            interval_ns: 1_000_000,
        },
        Target::SystemWide,
    );
    let mut src = open(&fake, c).unwrap();
    {
        let s = fake.state();
        assert!(s.rings.is_empty(), "no ring in poll mode");
        assert!(s.spawned.is_empty());
        let leader = &s.opens[0];
        assert_eq!((leader.pid, leader.attr.sample_type), (-1, 0));
        assert_eq!(leader.attr.flags, ATTR_DISABLED | ATTR_USE_CLOCKID);
    }
    src.start().unwrap();
    let start = src.info().start_time_ns;
    let leaders: Vec<i32> = src.groups.iter().map(|g| g.fds[0]).collect();
    {
        let s = fake.state();
        let enables: Vec<_> = s.ioctls.iter().filter(|i| i.1 == IOC_ENABLE).collect();
        assert_eq!(
            enables,
            [
                &(leaders[0], IOC_ENABLE, IOC_FLAG_GROUP),
                &(leaders[1], IOC_ENABLE, IOC_FLAG_GROUP)
            ]
        );
    }
    let mut out = Vec::new();
    for _ in 0..5 {
        assert_eq!(
            src.next(&mut out, Duration::from_secs(1)).unwrap(),
            Progress::Running
        );
    }
    assert_eq!(out.len(), 10, "one sample per CPU per interval");
    // Deadlines are start + k * interval, whatever the time spent in between.
    let sleeps = fake.state().sleeps.clone();
    assert_eq!(
        sleeps,
        (1..=5).map(|k| start + k * 1_000_000).collect::<Vec<_>>()
    );
    for (i, s) in out.iter().enumerate() {
        assert_eq!(
            (s.kind, s.cpu, s.nr, s.ovfl_counter, s.pid),
            (SAMPLE_POLL, (i % 2) as u32, 2, u32::MAX, 0)
        );
        assert_eq!(s.raw[0], s.raw[1], "fake reads every counter as the clock");
        assert!(s.time_ns >= s.raw[0], "timed right after the read");
    }
    // A late caller skips whole intervals instead of bursting.
    fake.state().clock += 3_500_000;
    out.clear();
    src.next(&mut out, Duration::ZERO).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(src.missed_polls(), 2, "deadlines 7 and 8 ms were skipped");
    src.stop().unwrap();
    out.clear();
    assert_eq!(
        src.next(&mut out, Duration::from_secs(1)).unwrap(),
        Progress::Finished
    );
    assert_eq!(out.len(), 2, "final read of every CPU");
    assert_eq!(
        src.next(&mut out, Duration::from_secs(1)).unwrap(),
        Progress::Finished
    );
    let fin = src.finish().unwrap();
    assert_eq!(fin.exit_status, 0);
    assert_eq!(fin.lost, vec![(0, 0), (1, 0)]);
    assert!(fake.state().ioctls.iter().any(|i| i.1 == IOC_DISABLE));
}

#[test]
fn poll_values_are_mapped_by_id() {
    let fake = FakeSys::new();
    let c = cfg(
        "cpu-clock,task-clock,page-faults",
        Sampling::Poll { interval_ns: 1000 },
        Target::Cpus(vec![0]),
    );
    let mut src = open(&fake, c).unwrap();
    let leader = src.groups[0].fds[0];
    // Swap the ids of the two members: values must follow their ids, not positions.
    src.groups[0].ids.swap(1, 2);
    fake.state().values.insert(leader, vec![7, 8, 9]);
    src.start().unwrap();
    let mut out = Vec::new();
    src.next(&mut out, Duration::from_secs(1)).unwrap();
    assert_eq!(&out[0].raw[..3], &[7, 9, 8]);
}

#[test]
fn command_poll_finishes_when_the_child_exits() {
    let fake = FakeSys::new();
    fake.state().child_status = 3;
    let c = cfg(
        "cpu-clock",
        Sampling::Poll {
            interval_ns: 1_000_000,
        },
        cmd(),
    );
    let mut src = open(&fake, c).unwrap();
    src.start().unwrap();
    assert_eq!(fake.state().released, 1);
    assert!(
        !fake.state().ioctls.iter().any(|i| i.1 == IOC_ENABLE),
        "enable_on_exec, no ioctl"
    );
    let mut out = Vec::new();
    let mut calls = 0;
    while src.next(&mut out, Duration::from_secs(1)).unwrap() == Progress::Running {
        calls += 1;
        assert!(calls < 100);
    }
    assert!(out
        .iter()
        .all(|s| s.pid == CHILD_PID as u32 && s.tid == CHILD_PID as u32));
    // The last two samples are the final read of both CPUs.
    assert_eq!(out.len() % 2, 0);
    assert_eq!(src.child_cpu_time_ns(), Some(5_000_000));
    let fin = src.finish().unwrap();
    assert_eq!(fin.exit_status, 3);
    assert!(fake.state().killed.is_empty());
}

#[test]
fn overflow_reads_rings_including_split_records() {
    let fake = FakeSys::new();
    fake.state().child_runs_for = 2;
    let c = PerfConfig {
        mmap_pages: 1,
        ..cfg("cpu-clock,page-faults", Sampling::Period(1000), cmd())
    };
    let mut src = open(&fake, c).unwrap();
    src.start().unwrap();
    let (l0, m0) = (src.groups[0].fds[0], src.groups[0].fds[1]);
    let l1 = src.groups[1].fds[0];
    {
        let mut s = fake.state();
        let ring = s.rings.get_mut(&l0).unwrap();
        // Start near the end of the 4 KiB data area so the second sample wraps.
        ring.set_pos(4096 - 104);
        // Values deliberately listed member first: mapped back by id.
        ring.push(&sample_record(
            2,
            0x401000,
            42,
            43,
            1_000,
            0,
            1000,
            &[(5, id_of(m0)), (1000, id_of(l0))],
        ));
        ring.push(&sample_record(
            1,
            0xffff_ffff_8100_0000,
            42,
            44,
            2_000,
            0,
            1000,
            &[(1000 + 1000, id_of(l0)), (6, id_of(m0))],
        ));
        ring.push(&simple_record(PERF_RECORD_LOST, &[id_of(l0), 17]));
        ring.push(&simple_record(PERF_RECORD_THROTTLE, &[3_000, id_of(l0), 0]));
        let ring1 = s.rings.get_mut(&l1).unwrap();
        ring1.push(&sample_record(
            2,
            0x402000,
            42,
            42,
            1_500,
            1,
            1000,
            &[(1000, id_of(l1)), (0, id_of(l1 + 1))],
        ));
    }
    let mut out = Vec::new();
    assert_eq!(
        src.next(&mut out, Duration::from_secs(1)).unwrap(),
        Progress::Running
    );
    assert_eq!(out.len(), 3);
    let a = out[0];
    assert_eq!(
        (a.kind, a.cpu, a.pid, a.tid, a.time_ns, a.ip, a.kernel_ip),
        (SAMPLE_OVERFLOW, 0, 42, 43, 1_000, 0x401000, false)
    );
    assert_eq!((a.nr, a.ovfl_counter, a.raw[0], a.raw[1]), (2, 0, 1000, 5));
    assert_eq!(a.addr, 0xdead_0000);
    // A command's samples carry per-thread values; the source sums them per CPU.
    let b = out[1];
    assert_eq!(
        (b.tid, b.time_ns, b.kernel_ip, b.raw[0], b.raw[1]),
        (44, 2_000, true, 3000, 11)
    );
    assert_eq!((out[2].cpu, out[2].raw[0]), (1, 1000));
    let st = src.stats();
    assert_eq!(
        (
            st[0].samples,
            st[0].lost,
            st[0].throttles,
            st[0].corrupt_bytes
        ),
        (2, 17, 1, 0)
    );
    // Child exits: the final drain still delivers what is in the rings.
    fake.state()
        .rings
        .get_mut(&l1)
        .unwrap()
        .push(&sample_record(
            2,
            1,
            42,
            42,
            2_500,
            1,
            1000,
            &[(2000, id_of(l1)), (0, id_of(l1 + 1))],
        ));
    out.clear();
    while src.next(&mut out, Duration::from_millis(100)).unwrap() == Progress::Running {}
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].raw[0], 2000, "same thread: its increase is added");
    assert!(src.notes().iter().any(|n| n.contains("throttled")));
    let fin = src.finish().unwrap();
    assert_eq!(fin.lost, vec![(0, 17), (1, 0)]);
    // Everything is released on drop.
    drop(src);
    let s = fake.state();
    for o in &s.opens {
        assert!(s.closed.contains(&o.result.unwrap()));
    }
}

#[test]
fn system_wide_overflow_values_pass_through() {
    let fake = FakeSys::new();
    let mut src = open(
        &fake,
        cfg("cpu-clock", Sampling::Period(1000), Target::Cpus(vec![0])),
    )
    .unwrap();
    src.start().unwrap();
    let l0 = src.groups[0].fds[0];
    {
        let mut s = fake.state();
        let ring = s.rings.get_mut(&l0).unwrap();
        ring.push(&sample_record(2, 1, 7, 7, 1, 0, 1000, &[(5000, id_of(l0))]));
        ring.push(&sample_record(2, 1, 8, 9, 2, 0, 1000, &[(6000, id_of(l0))]));
    }
    let mut out = Vec::new();
    src.next(&mut out, Duration::ZERO).unwrap();
    let raw: Vec<u64> = out.iter().map(|s| s.raw[0]).collect();
    assert_eq!(
        raw,
        [5000, 6000],
        "CPU-wide counts need no per-thread folding"
    );
}

#[test]
fn finish_without_drain_counts_ring_samples_as_lost() {
    let fake = FakeSys::new();
    fake.state().child_runs_for = 1000;
    let mut src = open(&fake, cfg("cpu-clock", Sampling::Period(1000), cmd())).unwrap();
    src.start().unwrap();
    let l0 = src.groups[0].fds[0];
    {
        let mut s = fake.state();
        let ring = s.rings.get_mut(&l0).unwrap();
        ring.push(&sample_record(2, 1, 1, 1, 1, 0, 1000, &[(1, id_of(l0))]));
        ring.push(&sample_record(2, 1, 1, 1, 2, 0, 1000, &[(2, id_of(l0))]));
    }
    let fin = src.finish().unwrap();
    assert_eq!(fin.lost, vec![(0, 2), (1, 0)]);
    assert_eq!(
        fin.exit_status,
        -libc::SIGTERM,
        "a running command is terminated"
    );
    assert_eq!(fake.state().killed, vec![(CHILD_PID, libc::SIGTERM)]);
}

#[test]
fn permission_error_names_paranoid() {
    let fake = FakeSys::new();
    fake.state().open_hook = Some(Box::new(|_, cpu| (cpu == 1).then_some(libc::EACCES)));
    let err = open(
        &fake,
        cfg("cpu-clock", Sampling::Period(1000), Target::SystemWide),
    )
    .unwrap_err();
    let SourceError::Permission(msg) = &err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("perf_event_open(cpu-clock, cpu 1)"), "{msg}");
    assert!(
        msg.contains("/proc/sys/kernel/perf_event_paranoid is 2"),
        "{msg}"
    );
    // CPU 0's group was opened and mapped; all of it is released.
    let s = fake.state();
    assert_eq!(s.opens.iter().filter(|o| o.result.is_ok()).count(), 1);
    assert!(s.closed.contains(&s.opens[0].result.unwrap()));
}

#[test]
fn hardware_event_without_pmu_is_no_pmu() {
    let fake = FakeSys::new();
    fake.state().open_hook = Some(Box::new(|a, _| (a.kind == 0).then_some(libc::ENOENT)));
    let err = open(
        &fake,
        cfg(
            "cpu-clock,cycles",
            Sampling::Poll { interval_ns: 1000 },
            cmd(),
        ),
    )
    .unwrap_err();
    match &err {
        SourceError::NoPmu { event, detail } => {
            assert_eq!(event, "cycles");
            assert!(
                detail.contains("ENOENT") && detail.contains("breakpoint, software, tracepoint"),
                "{detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("needs a hardware PMU"));
    // The held child is disposed of: its go pipe closed and it is reaped.
    let s = fake.state();
    assert_eq!(s.released, 0);
    assert!(s.closed.len() >= 3);
}

#[test]
fn unsupported_event_on_a_real_pmu_is_a_syscall_error() {
    let fake = FakeSys::new();
    fake.state().dirs.insert(
        "/sys/bus/event_source/devices".into(),
        vec!["cpu".into(), "software".into()],
    );
    fake.state().open_hook = Some(Box::new(|a, _| (a.kind == 0).then_some(libc::EOPNOTSUPP)));
    let err = open(
        &fake,
        cfg(
            "stalled-cycles-frontend",
            Sampling::Period(1000),
            Target::SystemWide,
        ),
    )
    .unwrap_err();
    match &err {
        SourceError::Syscall { call, source } => {
            assert_eq!(call, "perf_event_open(stalled-cycles-frontend, cpu 0)");
            assert!(source.to_string().contains("EOPNOTSUPP"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_errors_name_event_and_cpu() {
    let fake = FakeSys::new();
    fake.state().open_hook = Some(Box::new(|a, cpu| {
        (a.config == 1 && cpu == 1).then_some(libc::EMFILE)
    }));
    let err = open(
        &fake,
        cfg(
            "cpu-clock,task-clock",
            Sampling::Period(1000),
            Target::SystemWide,
        ),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("perf_event_open(task-clock, cpu 1) failed"),
        "{err}"
    );
    let fake = FakeSys::new();
    fake.state().mmap_errno = Some(libc::EPERM);
    let err = open(
        &fake,
        cfg("cpu-clock", Sampling::Period(1000), Target::SystemWide),
    )
    .unwrap_err();
    assert!(
        matches!(&err, SourceError::Permission(m) if m.contains("perf_event_mlock_kb")),
        "{err}"
    );
}

#[test]
fn inherit_with_sample_read_falls_back_without_inherit() {
    let fake = FakeSys::new();
    fake.state().open_hook = Some(Box::new(|a, _| {
        (a.flags & ATTR_INHERIT != 0 && a.sample_type & PERF_SAMPLE_READ != 0)
            .then_some(libc::EINVAL)
    }));
    let src = open(
        &fake,
        cfg("cpu-clock,page-faults", Sampling::Period(1000), cmd()),
    )
    .unwrap();
    assert!(!src.inherits());
    assert!(src.notes()[0].contains("inherit"), "{:?}", src.notes());
    let s = fake.state();
    assert_eq!(s.opens.len(), 5, "one rejected open, then 2 x 2");
    assert!(s.opens[0].result.is_err());
    assert!(s.opens[1..]
        .iter()
        .all(|o| o.result.is_ok() && o.attr.flags & ATTR_INHERIT == 0));
}

#[test]
fn poll_mode_keeps_inherit() {
    let fake = FakeSys::new();
    let _src = open(
        &fake,
        cfg("cpu-clock", Sampling::Poll { interval_ns: 1000 }, cmd()),
    )
    .unwrap();
    assert!(fake
        .state()
        .opens
        .iter()
        .all(|o| o.attr.flags & ATTR_INHERIT != 0));
}

#[test]
fn command_errors() {
    let fake = FakeSys::new();
    let t = Target::Command(vec!["missing-program".into()]);
    let err = open(&fake, cfg("cpu-clock", Sampling::Period(1000), t)).unwrap_err();
    assert!(
        matches!(&err, SourceError::Command { cmd, .. } if cmd == "missing-program"),
        "{err:?}"
    );
    assert!(
        fake.state().opens.is_empty(),
        "nothing opened for a command that cannot run"
    );

    let fake = FakeSys::new();
    fake.state().exec_errno = Some(libc::EACCES);
    let mut src = open(&fake, cfg("cpu-clock", Sampling::Period(1000), cmd())).unwrap();
    let err = src.start().unwrap_err();
    assert!(
        matches!(&err, SourceError::Command { source, .. } if source.raw_os_error() == Some(libc::EACCES))
    );
    assert_eq!(
        src.next(&mut Vec::new(), Duration::ZERO).unwrap(),
        Progress::Finished
    );
}

#[test]
fn dropping_before_start_disposes_of_the_held_child() {
    let fake = FakeSys::new();
    let src = open(&fake, cfg("cpu-clock", Sampling::Period(1000), cmd())).unwrap();
    let (go, err) = match &src.child {
        Child::Held(h) => (h.go_fd, h.err_fd),
        other => panic!("{other:?}"),
    };
    drop(src);
    let s = fake.state();
    assert!(s.closed.contains(&go) && s.closed.contains(&err));
    assert_eq!(s.released, 0);
}

#[test]
fn mask_and_restart() {
    let fake = FakeSys::new();
    let mut src = open(
        &fake,
        cfg("cpu-clock", Sampling::Period(1000), Target::SystemWide),
    )
    .unwrap();
    src.start().unwrap();
    let l1 = src.groups[1].fds[0];
    src.control(1, hrperf_abi::format::CTRL_RESET);
    src.control(1, CTRL_MASK | hrperf_abi::format::CTRL_RESET);
    src.control(1, CTRL_MASK);
    assert_eq!(
        fake.state()
            .ioctls
            .iter()
            .filter(|i| **i == (l1, IOC_DISABLE, IOC_FLAG_GROUP))
            .count(),
        1
    );
    src.restart(None).unwrap();
    assert_eq!(
        fake.state()
            .ioctls
            .iter()
            .filter(|i| **i == (l1, IOC_ENABLE, IOC_FLAG_GROUP))
            .count(),
        2
    );
    assert!(!src.groups[1].masked);
}

#[test]
fn config_validation() {
    let fake = FakeSys::new();
    let bad = |c: PerfConfig| match open(&fake, c) {
        Err(SourceError::Config(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(bad(cfg("cpu-clock", Sampling::Period(0), Target::SystemWide)).contains("period"));
    assert!(bad(cfg("cpu-clock", Sampling::Freq(0), Target::SystemWide)).contains("frequency"));
    assert!(bad(cfg(
        "cpu-clock",
        Sampling::Poll { interval_ns: 0 },
        Target::SystemWide
    ))
    .contains("interval"));
    let c = PerfConfig {
        mmap_pages: 3,
        ..cfg("cpu-clock", Sampling::Period(1), Target::SystemWide)
    };
    assert!(bad(c).contains("power of two"));
    assert!(bad(cfg(
        "cpu-clock",
        Sampling::Period(1),
        Target::Cpus(vec![0, 5])
    ))
    .contains("CPU 5 is not online"));
    assert!(bad(cfg(
        "cpu-clock",
        Sampling::Period(1),
        Target::Command(vec![])
    ))
    .contains("empty command"));
    let c = PerfConfig {
        workload: Some(vec!["x".into()]),
        ..cfg("cpu-clock", Sampling::Period(1), cmd())
    };
    assert!(bad(c).contains("workload"));
    let c = PerfConfig {
        events: vec![],
        ..cfg("cpu-clock", Sampling::Period(1), cmd())
    };
    assert!(bad(c).contains("no events"));
}

#[test]
fn workload_with_cpu_list_counts_system_wide() {
    let fake = FakeSys::new();
    let c = PerfConfig::from_cli(
        parse_events("cpu-clock").unwrap(),
        Sampling::Poll {
            interval_ns: 1_000_000,
        },
        false,
        Some(vec![1]),
        vec!["work".into()],
    )
    .unwrap();
    assert_eq!(
        (c.target.clone(), c.workload.clone()),
        (Target::Cpus(vec![1]), Some(vec!["work".into()]))
    );
    let mut src = open(&fake, c).unwrap();
    assert_eq!(fake.state().opens[0].pid, -1);
    src.start().unwrap();
    let s = fake.state();
    assert_eq!(s.released, 1);
    assert!(
        s.ioctls.iter().any(|i| i.1 == IOC_ENABLE),
        "system-wide counters are enabled by ioctl"
    );
    drop(s);
    let mut out = Vec::new();
    while src.next(&mut out, Duration::from_secs(1)).unwrap() == Progress::Running {}
    assert!(out.iter().all(|s| s.pid == 0 && s.cpu == 1));
    let leader = src.groups[0].fds[0];
    assert!(
        fake.state()
            .ioctls
            .contains(&(leader, IOC_DISABLE, IOC_FLAG_GROUP)),
        "disabled when the workload ended, before the final read"
    );
}

#[test]
fn cli_and_cpu_lists() {
    assert_eq!(
        parse_cpu_list("0-3,8,2,10-11\n").unwrap(),
        vec![0, 1, 2, 3, 8, 10, 11]
    );
    assert_eq!(parse_cpu_list("5").unwrap(), vec![5]);
    for bad in ["", "1,,2", "3-1", "a", "1-", "300"] {
        assert!(
            matches!(parse_cpu_list(bad), Err(SourceError::Config(_))),
            "{bad}"
        );
    }
    let ev = parse_events("cpu-clock").unwrap();
    let c = PerfConfig::from_cli(
        ev.clone(),
        Sampling::Period(1),
        false,
        None,
        vec!["ls".into()],
    )
    .unwrap();
    assert_eq!(
        (c.target, c.workload),
        (Target::Command(vec!["ls".into()]), None)
    );
    let c = PerfConfig::from_cli(ev.clone(), Sampling::Period(1), true, None, vec![]).unwrap();
    assert_eq!((c.target, c.workload), (Target::SystemWide, None));
    assert!(PerfConfig::from_cli(ev, Sampling::Period(1), false, None, vec![]).is_err());
}

/// `rec` (a sample from `sample_record`) with a callchain of `chain` appended, whose `nr`
/// says `declared` entries (default: `chain.len()`).
fn with_callchain(mut rec: Vec<u8>, chain: &[u64], declared: Option<u64>) -> Vec<u8> {
    rec.extend_from_slice(&declared.unwrap_or(chain.len() as u64).to_ne_bytes());
    for e in chain {
        rec.extend_from_slice(&e.to_ne_bytes());
    }
    let size = rec.len() as u16;
    rec[6..8].copy_from_slice(&size.to_ne_bytes());
    rec
}

/// A `PERF_RECORD_COMM` for `pid`/`tid` named `name`, padded to 8 bytes.
fn comm_record(pid: u32, tid: u32, name: &str) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&super::ring::PERF_RECORD_COMM.to_ne_bytes());
    v.extend_from_slice(&0u16.to_ne_bytes());
    v.extend_from_slice(&0u16.to_ne_bytes());
    v.extend_from_slice(&pid.to_ne_bytes());
    v.extend_from_slice(&tid.to_ne_bytes());
    v.extend_from_slice(name.as_bytes());
    v.push(0);
    v.resize(v.len().next_multiple_of(8), 0);
    let size = v.len() as u16;
    v[6..8].copy_from_slice(&size.to_ne_bytes());
    v
}

const HV: u64 = -32i64 as u64;

#[test]
fn split_callchain_follows_the_context_markers() {
    let (mut k, mut u) = (Vec::new(), Vec::new());
    let n = split_callchain(
        [
            PERF_CONTEXT_KERNEL,
            0xffff_0001,
            0xffff_0002,
            HV,
            0xffff_0003,
            PERF_CONTEXT_USER,
            0x4001,
            0x4002,
        ],
        false,
        &mut k,
        &mut u,
    );
    assert_eq!(n, 5);
    assert_eq!(
        k,
        [0xffff_0001, 0xffff_0002, 0xffff_0003],
        "other markers are skipped"
    );
    assert_eq!(u, [0x4001, 0x4002]);
    // No marker: the sample's cpumode decides.
    let (mut k, mut u) = (Vec::new(), Vec::new());
    split_callchain([1, 2], true, &mut k, &mut u);
    split_callchain([3], false, &mut k, &mut u);
    assert_eq!((k, u), (vec![1, 2], vec![3]));
    // Only markers: nothing.
    let (mut k, mut u) = (Vec::new(), Vec::new());
    assert_eq!(
        split_callchain([u64::MAX, PERF_CONTEXT_MAX], false, &mut k, &mut u),
        0
    );
    assert!(k.is_empty() && u.is_empty());
}

#[test]
fn want_stacks_reopens_the_leader_with_callchains() {
    let fake = FakeSys::new();
    let mut src = open(
        &fake,
        cfg("cpu-clock,page-faults", Sampling::Period(1000), cmd()),
    )
    .unwrap();
    assert!(src.has_stacks());
    let first: Vec<i32> = fake
        .state()
        .opens
        .iter()
        .map(|o| o.result.unwrap())
        .collect();
    src.want_stacks(true, false).unwrap();
    let s = fake.state();
    assert_eq!(s.opens.len(), 8, "2 CPUs x 2 events, opened twice");
    for fd in &first {
        assert!(s.closed.contains(fd), "the first counters are closed");
    }
    for pair in s.opens[4..].chunks(2) {
        let (leader, member) = (&pair[0].attr, &pair[1].attr);
        assert_eq!(leader.sample_type, SAMPLE_TYPE | PERF_SAMPLE_CALLCHAIN);
        assert_eq!(
            leader.flags & (ATTR_COMM | ATTR_COMM_EXEC | ATTR_EXCLUDE_CALLCHAIN_USER),
            ATTR_COMM | ATTR_COMM_EXEC | ATTR_EXCLUDE_CALLCHAIN_USER
        );
        assert_eq!(leader.flags & ATTR_EXCLUDE_CALLCHAIN_KERNEL, 0);
        assert!(
            leader.flags & ATTR_ENABLE_ON_EXEC != 0,
            "still enabled at exec"
        );
        assert_eq!(member.sample_type, 0, "members do not sample");
        assert_eq!(pair[0].pid, CHILD_PID);
    }
    drop(s);
    assert_eq!(src.groups.len(), 2);
    // Asking again for the same is a no-op; user only flips the exclusion.
    src.want_stacks(true, false).unwrap();
    assert_eq!(fake.state().opens.len(), 8);
    src.want_stacks(false, true).unwrap();
    let s = fake.state();
    let leader = &s.opens[8].attr;
    assert_eq!(
        leader.flags & (ATTR_EXCLUDE_CALLCHAIN_KERNEL | ATTR_EXCLUDE_CALLCHAIN_USER),
        ATTR_EXCLUDE_CALLCHAIN_KERNEL
    );
    drop(s);
    src.start().unwrap();
    assert!(matches!(
        src.want_stacks(true, true),
        Err(SourceError::Config(m)) if m.contains("before")
    ));
}

#[test]
fn want_stacks_needs_overflow_mode() {
    let fake = FakeSys::new();
    let mut src = open(
        &fake,
        cfg(
            "cpu-clock",
            Sampling::Poll {
                interval_ns: 1_000_000,
            },
            cmd(),
        ),
    )
    .unwrap();
    assert!(matches!(
        src.want_stacks(true, true),
        Err(SourceError::Config(m)) if m.contains("overflow")
    ));
    // Neither stack: nothing to do, not an error.
    src.want_stacks(false, false).unwrap();
}

#[test]
fn overflow_samples_carry_their_callchains_and_comms() {
    let fake = FakeSys::new();
    fake.state().child_runs_for = 1000;
    fake.state().files.insert(
        "/proc/42/task/45/comm".into(),
        "from-proc-name-too-long\n".into(),
    );
    let c = PerfConfig {
        mmap_pages: 1,
        ..cfg("cpu-clock", Sampling::Period(1000), cmd())
    };
    let mut src = open(&fake, c).unwrap();
    src.want_stacks(true, true).unwrap();
    src.start().unwrap();
    let l0 = src.groups[0].fds[0];
    {
        let mut s = fake.state();
        let ring = s.rings.get_mut(&l0).unwrap();
        // Wrap the ring so a callchain is split across its end.
        ring.set_pos(4096 - 120);
        ring.push(&comm_record(42, 43, "stackburn"));
        // A kernel sample: kernel frames, a hypervisor marker, then user frames.
        ring.push(&with_callchain(
            sample_record(1, 0xffff_8100, 42, 43, 1_000, 0, 1000, &[(1000, id_of(l0))]),
            &[
                PERF_CONTEXT_KERNEL,
                0xffff_8100,
                0xffff_8200,
                HV,
                PERF_CONTEXT_USER,
                0x401000,
                0x402000,
                0x403000,
            ],
            None,
        ));
        // A user sample of another thread (comm from /proc, cut to 15 bytes).
        ring.push(&with_callchain(
            sample_record(2, 0x401234, 42, 45, 2_000, 0, 1000, &[(2000, id_of(l0))]),
            &[PERF_CONTEXT_USER, 0x401234, 0x405000],
            None,
        ));
        // A callchain whose nr lies: cut to the entries present.
        ring.push(&with_callchain(
            sample_record(2, 0x401000, 42, 43, 3_000, 0, 1000, &[(3000, id_of(l0))]),
            &[PERF_CONTEXT_USER, 0x401000],
            Some(u64::MAX),
        ));
        // A garbage nr with no entries at all.
        ring.push(&with_callchain(
            sample_record(2, 0x401000, 42, 43, 4_000, 0, 1000, &[(4000, id_of(l0))]),
            &[],
            Some(1 << 40),
        ));
        // A sample whose record ends before its callchain's nr: corrupt, skipped.
        ring.push(&sample_record(
            2,
            0x401000,
            42,
            43,
            5_000,
            0,
            1000,
            &[(5000, id_of(l0))],
        ));
    }
    let mut out = vec![RawSample {
        time_ns: 7,
        ..out_placeholder()
    }];
    src.next(&mut out, Duration::ZERO).unwrap();
    assert_eq!(out.len(), 1 + 4, "the placeholder and 4 samples");
    let st = src.stack(0).unwrap();
    assert_eq!(st.kernel, [0xffff_8100, 0xffff_8200]);
    assert_eq!(st.user, [0x401000, 0x402000, 0x403000]);
    assert_eq!(st.comm, b"stackburn");
    let st = src.stack(1).unwrap();
    assert!(st.kernel.is_empty());
    assert_eq!(st.user, [0x401234, 0x405000]);
    assert_eq!(st.comm, b"from-proc-name-");
    let st = src.stack(2).unwrap();
    assert_eq!(st.user, [0x401000]);
    let st = src.stack(3).unwrap();
    assert!(st.kernel.is_empty() && st.user.is_empty());
    assert_eq!(src.stack(4), None);
    let stats = src.stats()[0];
    assert_eq!(stats.samples, 4);
    assert_eq!(stats.bad_callchains, 2);
    assert!(stats.corrupt_bytes > 0, "the record without its nr");
    // The next call starts a new batch.
    out.clear();
    src.next(&mut out, Duration::ZERO).unwrap();
    assert!(out.is_empty());
    assert_eq!(src.stack(0), None);
}

fn out_placeholder() -> RawSample {
    RawSample {
        cpu: 0,
        kind: SAMPLE_POLL,
        pid: 0,
        tid: 0,
        time_ns: 0,
        ip: 0,
        kernel_ip: false,
        addr: 0,
        ovfl_counter: 0,
        nr: 0,
        raw: [0; MAX_COUNTERS],
    }
}
