//! Tests of the kmod client, recorder and daemon against the fake device: no kernel
//! module, no root. The kernel side itself is proven by `tools/vm/test.sh`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hrperf_abi::capture::{CLOCK_PERF, SOURCE_KMOD};
use hrperf_abi::format::{MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL};
use hrperf_abi::record::{MISC_INSTRUCTED, MISC_OVERFLOW, MISC_POLL};
use hrperf_abi::RecordType;
use hrperf_fmt_delta::record::{parse, DeltaSample};

use super::control::{self, Request};
use super::fake::{FakeAction, FakeChild, FakeKmod};
use super::record::{record_kmod_to_file, KmodRecordOptions, Recorder};
use super::*;
use crate::capture::Reader;
use crate::record::RecordSummary;
use crate::source::perf::parse_events;

fn cfg(events: &str, mode: Mode) -> KmodConfig {
    KmodConfig {
        events: parse_events(events).unwrap(),
        mode,
        ..KmodConfig::default()
    }
}

fn fake() -> Arc<FakeKmod> {
    Arc::new(FakeKmod::new(2))
}

/// Every delta record of a capture, per CPU, in file order.
fn deltas(path: &Path) -> (Reader, Vec<(u32, Vec<DeltaSample>)>, u64) {
    let r = Reader::open(path).unwrap();
    let mut per: Vec<(u32, Vec<DeltaSample>)> = Vec::new();
    let mut lost = 0;
    for chunk in &mut r.chunks() {
        let chunk = chunk.unwrap();
        for rec in chunk.records() {
            let rec = rec.unwrap();
            if rec.header.kind == RecordType::LOST {
                lost += rec.lost().unwrap().unwrap_or(0);
                continue;
            }
            let d = parse(rec.bytes).unwrap();
            match per.iter_mut().find(|(c, _)| *c == d.cpu) {
                Some((_, v)) => v.push(d),
                None => per.push((d.cpu, vec![d])),
            }
        }
    }
    per.sort_by_key(|(c, _)| *c);
    (r, per, lost)
}

fn record(sys: &Arc<FakeKmod>, opts: &KmodRecordOptions, dir: &Path) -> (PathBuf, RecordSummary) {
    let path = dir.join("k.data");
    let stop = AtomicBool::new(false);
    let s = record_kmod_to_file(sys.clone(), opts, &path, &stop, &mut |_| {}).unwrap();
    (path, s)
}

fn assert_clean(sys: &FakeKmod) {
    assert_eq!(sys.open_fds(), 0, "descriptors left open");
    assert_eq!(sys.live_buffers(), 0, "buffers left allocated or mapped");
    assert_eq!(sys.sessions(), 0, "sessions left");
    assert!(
        sys.format_users().iter().all(|(_, u)| *u == 0),
        "format still pinned"
    );
}

#[test]
fn missing_module_says_insmod() {
    let sys = fake();
    sys.set_open_errno(Some(libc::ENOENT));
    let e = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed)).unwrap_err();
    assert!(matches!(e, KmodError::NotLoaded { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("insmod hrperf-core.ko") && msg.contains("/dev/hrperf"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
}

#[test]
fn permission_denied_says_dev_mode() {
    let sys = fake();
    sys.set_open_errno(Some(libc::EACCES));
    let msg = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("dev_mode=") && msg.contains("dev_gid="),
        "{msg}"
    );
}

#[test]
fn unregistered_format_lists_what_is() {
    let sys = fake();
    let mut c = cfg("cpu-clock", Mode::Instructed);
    c.format = "pebs".into();
    let msg = Session::create(sys.clone(), &c).unwrap_err().to_string();
    assert!(
        msg.contains("insmod fmt-pebs.ko") && msg.contains("registered formats: delta"),
        "{msg}"
    );
    sys.unregister_all();
    let msg = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("insmod fmt-delta.ko") && msg.contains("registered formats: none"),
        "{msg}"
    );
    assert_clean(&sys);
}

#[test]
fn abi_mismatch_and_refusals_are_explained() {
    let sys = fake();
    sys.set_abi_version(99);
    let msg = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("ABI 99"), "{msg}");
    let sys = fake();
    sys.fail("HRPERF_IOC_CREATE", libc::ENOENT);
    let e = Session::create(sys.clone(), &cfg("cycles", Mode::Instructed)).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT));
    assert!(
        e.to_string().contains("not available on this machine"),
        "{e}"
    );
    let sys = fake();
    sys.fail("HRPERF_IOC_CREATE", libc::ENODEV);
    assert!(
        Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed))
            .unwrap_err()
            .to_string()
            .contains("unloading")
    );
    assert_clean(&sys);
    let e = Session::create(fake(), &cfg("cpu-clock", Mode::Overflow { period: 0 })).unwrap_err();
    assert!(e.to_string().contains("positive"), "{e}");
}

#[test]
fn instructed_session_reads_rings_in_place() {
    let sys = fake();
    let mut s =
        Session::create(sys.clone(), &cfg("cpu-clock,page-faults", Mode::Instructed)).unwrap();
    assert_eq!(s.mode(), MODE_INSTRUCTED);
    assert_eq!(s.cpus(), vec![0, 1]);
    let e = s.poll().unwrap_err();
    assert!(
        e.to_string().contains("instructed mode, or it is paused"),
        "{e}"
    );
    s.start().unwrap();
    assert!(s
        .start()
        .unwrap_err()
        .to_string()
        .contains("already running"));
    for _ in 0..3 {
        sys.advance(1_000_000);
        s.poll_log().unwrap();
    }
    assert!(s.wait(0).unwrap(), "LOG makes the session readable");
    let mut chunk = Vec::new();
    for i in 0..2 {
        let (cpu, n) = s.drain_cpu(i, &mut chunk).unwrap();
        assert_eq!((cpu, n), (i as u32, 3));
        let mut off = 0;
        let mut last = 0;
        while off < chunk.len() {
            let d = parse(&chunk[off..]).unwrap();
            assert_eq!(d.misc & MISC_INSTRUCTED, MISC_INSTRUCTED);
            assert!(d.time_ns > last);
            last = d.time_ns;
            assert_eq!(
                d.deltas[0], 1_000_000,
                "cpu-clock counts the ns between polls"
            );
            assert_eq!(d.deltas[1], 1000, "the fake's counter 1 counts 1 per µs");
            off += d.nr as usize * 8 + 40;
        }
    }
    assert!(!s.wait(0).unwrap(), "CONSUME acknowledged the notification");
    let (_, n) = s.drain_cpu(0, &mut chunk).unwrap();
    assert_eq!(n, 0, "nothing is read twice");
    let st = s.stats().unwrap();
    assert_eq!(st.iter().map(|c| c.records).collect::<Vec<_>>(), vec![3, 3]);
    drop(s);
    assert_clean(&sys);
}

#[test]
fn records_overflow_of_a_command_into_a_capture() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    sys.push_child(FakeChild {
        run_ns: 50_000_000,
        exit_status: 3,
        ..FakeChild::default()
    });
    let opts = KmodRecordOptions {
        config: cfg(
            "cpu-clock,page-faults",
            Mode::Overflow { period: 1_000_000 },
        ),
        command: vec!["work".into(), "--hard".into()],
        ..KmodRecordOptions::default()
    };
    let (path, s) = record(&sys, &opts, dir.path());
    assert_eq!(s.exit_status, 3);
    let (r, per, lost) = deltas(&path);
    let m = r.meta();
    assert_eq!(
        (m.source, m.clock, m.mode, m.sample_period),
        (SOURCE_KMOD, CLOCK_PERF, MODE_OVERFLOW, 1_000_000)
    );
    assert_eq!(m.format_name, "delta");
    assert_eq!(
        m.event_names().collect::<Vec<_>>(),
        vec!["cpu-clock", "page-faults"]
    );
    assert_eq!(m.cpus, vec![0, 1]);
    assert_eq!(m.command, vec!["work", "--hard"]);
    assert_eq!(lost, 0);
    assert_eq!(per.len(), 2);
    for (cpu, recs) in &per {
        // one sample per ms while the command ran (50 ms), each CPU stamping its own time
        assert_eq!(recs.len(), 50, "cpu {cpu}");
        assert!(recs.windows(2).all(|w| w[0].time_ns < w[1].time_ns));
        assert!(recs
            .iter()
            .all(|d| d.misc & MISC_OVERFLOW != 0 && d.deltas[0] == 1_000_000));
        let sum: u64 = recs.iter().map(|d| d.deltas[0]).sum();
        assert_eq!(sum, 50_000_000);
    }
    let scan = r.scan();
    assert!(
        scan.error.is_none() && scan.warnings.is_empty(),
        "{:?}",
        scan.warnings
    );
    let end = scan.end.unwrap();
    assert_eq!(
        (end.total_records, end.total_drops, end.exit_status),
        (100, 0, 3)
    );
    assert_eq!(
        scan.cpus
            .iter()
            .map(|c| c.stats.unwrap().records)
            .sum::<u64>(),
        100
    );
    assert_eq!(s.records, 100);
    assert_eq!(s.elapsed_ns, 50_000_000);
    // The command got the session's descriptor, kept across exec and named in its env.
    let sp = sys.spawned();
    assert_eq!(sp.len(), 1);
    let fd = sp[0].keep_fd.unwrap();
    assert!(sp[0].env.contains(&format!("HRPERF_FD={fd}")));
    assert_eq!(sp[0].argv, vec!["work", "--hard"]);
    assert!(sys
        .calls()
        .ends_with(&["HRPERF_IOC_STATS".into(), "HRPERF_IOC_DESTROY".into()]));
    assert_clean(&sys);
}

#[test]
fn records_poll_mode_for_a_duration() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    let opts = KmodRecordOptions {
        config: KmodConfig {
            cpus: Some(vec![1]),
            ..cfg("cpu-clock,context-switches", Mode::Poll { interval_ns: 0 })
        },
        duration_ns: Some(30_000_000),
        ..KmodRecordOptions::default()
    };
    let (path, _) = record(&sys, &opts, dir.path());
    let (r, per, _) = deltas(&path);
    assert_eq!(r.meta().mode, MODE_POLL);
    assert_eq!(
        r.meta().poll_interval_ns,
        1_000_000,
        "the module's poll_us resolved"
    );
    assert_eq!(r.meta().cpus, vec![1]);
    assert_eq!(per.len(), 1);
    assert_eq!(per[0].1.len(), 30);
    assert!(per[0].1.iter().all(|d| d.misc == MISC_POLL && d.cpu == 1));
    assert_eq!(r.scan().cpus[0].stats.unwrap().poll_ticks, 30);
    assert_clean(&sys);
}

#[test]
fn module_default_mode_is_used() {
    let sys = fake();
    let s = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Default)).unwrap();
    assert_eq!(
        (s.mode(), s.sample_period()),
        (MODE_OVERFLOW, DEFAULT_PERIOD)
    );
    drop(s);
    sys.set_default_mode(MODE_POLL);
    let s = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Default)).unwrap();
    assert_eq!((s.mode(), s.poll_interval_ns()), (MODE_POLL, 1_000_000));
}

#[test]
fn a_program_marks_regions_on_the_recorded_session() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    sys.push_child(FakeChild {
        run_ns: 40_000_000,
        actions: vec![
            (10_000_000, FakeAction::PollLog),
            (20_000_000, FakeAction::PollLog),
            (35_000_000, FakeAction::PollLog),
        ],
        ..FakeChild::default()
    });
    let opts = KmodRecordOptions {
        config: cfg("cpu-clock,page-faults", Mode::Instructed),
        command: vec!["app".into()],
        ..KmodRecordOptions::default()
    };
    let (path, _) = record(&sys, &opts, dir.path());
    let (_, per, _) = deltas(&path);
    for (_, recs) in &per {
        let d0: Vec<u64> = recs.iter().map(|d| d.deltas[0]).collect();
        assert_eq!(d0, vec![10_000_000, 10_000_000, 15_000_000]);
        assert!(recs.iter().all(|d| d.misc == MISC_INSTRUCTED));
    }
    assert_clean(&sys);
}

#[test]
fn pausing_excludes_the_paused_time() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    sys.push_child(FakeChild {
        run_ns: 50_000_000,
        actions: vec![
            (10_000_000, FakeAction::Stop),
            (30_000_000, FakeAction::Start),
        ],
        ..FakeChild::default()
    });
    let opts = KmodRecordOptions {
        config: cfg("cpu-clock", Mode::Overflow { period: 1_000_000 }),
        command: vec!["app".into()],
        ..KmodRecordOptions::default()
    };
    let (path, _) = record(&sys, &opts, dir.path());
    let (_, per, _) = deltas(&path);
    for (_, recs) in &per {
        assert_eq!(recs.len(), 30);
        assert_eq!(recs.iter().map(|d| d.deltas[0]).sum::<u64>(), 30_000_000);
    }
    assert_clean(&sys);
}

#[test]
fn a_missing_command_leaves_nothing_behind() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    let opts = KmodRecordOptions {
        config: cfg("cpu-clock", Mode::Instructed),
        command: vec!["no-such-program".into()],
        ..KmodRecordOptions::default()
    };
    let path = dir.path().join("k.data");
    let e = record_kmod_to_file(
        sys.clone(),
        &opts,
        &path,
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("cannot run 'no-such-program'"),
        "{e}"
    );
    assert!(!path.exists());
    assert_clean(&sys);
}

#[test]
fn full_rings_count_drops_and_mark_them() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.data");
    let c = KmodConfig {
        data_size: 4096,
        ..cfg("cpu-clock", Mode::Overflow { period: 100_000 })
    };
    let session = Session::create(sys.clone(), &c).unwrap();
    let mut rec = Recorder::new(
        session,
        std::fs::File::create(&path).unwrap(),
        &path,
        &[],
        false,
    )
    .unwrap();
    rec.start().unwrap();
    sys.advance(300_000_000); // nobody reads meanwhile: the 4 KiB rings fill
    let s = rec.finish(0).unwrap();
    assert!(s.drops > 0);
    let (r, per, lost) = deltas(&path);
    let scan = r.scan();
    assert_eq!(scan.end.unwrap().total_drops, s.drops);
    assert!(lost > 0 && lost <= s.drops);
    for (cpu, recs) in &per {
        let st = scan
            .cpus
            .iter()
            .find(|c| c.cpu == *cpu)
            .unwrap()
            .stats
            .unwrap();
        assert_eq!(st.overflows, st.records + st.drops);
        // delta never loses events across drops: the deltas add up to all the time from
        // the start (the fake's t0, CPU i stamping t + i) to the last record written
        let last = recs.last().unwrap().time_ns - u64::from(*cpu);
        assert_eq!(
            recs.iter().map(|d| d.deltas[0]).sum::<u64>(),
            last - 1_000_000_000
        );
    }
    assert_clean(&sys);
}

#[test]
fn daemon_serves_start_pause_poll_log_and_stop() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    let sockdir = dir.path().join("ctl");
    let socket = sockdir.join("ctl.sock");
    let output = dir.path().join("d.data");
    let session =
        Session::create(sys.clone(), &cfg("cpu-clock,page-faults", Mode::Instructed)).unwrap();
    let file = std::fs::File::create(&output).unwrap();
    let mut rec = Recorder::new(session, file, &output, &[], false).unwrap();
    rec.start().unwrap();
    let listener = control::Listener::bind(&socket).unwrap();
    assert!(control::Listener::bind(&socket)
        .unwrap_err()
        .to_string()
        .contains("already running"));
    let server = {
        let sys = sys.clone();
        let output = output.clone();
        std::thread::spawn(move || {
            let stop = AtomicBool::new(false);
            daemon::serve(sys.as_ref(), rec, &listener, &output, &stop)
        })
    };
    let status = control::call(&socket, Request::Status).unwrap();
    assert!(
        status.contains(
            "state=running mode=instructed format=delta events=cpu-clock,page-faults cpus=0,1"
        ),
        "{status}"
    );
    assert_eq!(
        control::call(&socket, Request::PollLog).unwrap(),
        "polled and logged"
    );
    control::call(&socket, Request::Poll).unwrap();
    control::call(&socket, Request::Log).unwrap();
    assert_eq!(control::call(&socket, Request::Pause).unwrap(), "paused");
    let e = control::call(&socket, Request::Poll).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL));
    assert!(e.to_string().contains("paused"), "{e}");
    assert!(control::call(&socket, Request::Pause)
        .unwrap_err()
        .to_string()
        .contains("already paused"));
    assert!(control::call(&socket, Request::Status)
        .unwrap()
        .contains("state=paused"));
    assert_eq!(control::call(&socket, Request::Start).unwrap(), "started");
    control::call(&socket, Request::PollLog).unwrap();
    let bye = control::call(&socket, Request::Stop).unwrap();
    assert!(bye.contains("6 records from 2 CPUs, 0 drops"), "{bye}");
    let summary = server.join().unwrap().unwrap();
    assert_eq!(summary.records, 6);
    assert!(!socket.exists(), "the socket is removed on exit");
    let e = control::call(&socket, Request::Status).unwrap_err();
    assert!(e.to_string().contains("hrperf start"), "{e}");
    let (_, per, _) = deltas(&output);
    assert!(per
        .iter()
        .all(|(_, r)| r.len() == 3 && r.iter().all(|d| d.misc == MISC_INSTRUCTED)));
    assert_clean(&sys);
}

#[test]
fn daemon_rejects_unknown_requests() {
    use std::io::{BufRead, BufReader, Write};
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s").join("ctl.sock");
    let output = dir.path().join("d.data");
    let session = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed)).unwrap();
    let rec = Recorder::new(
        session,
        std::fs::File::create(&output).unwrap(),
        &output,
        &[],
        false,
    )
    .unwrap();
    let listener = control::Listener::bind(&socket).unwrap();
    let server = {
        let sys = sys.clone();
        std::thread::spawn(move || {
            daemon::serve(
                sys.as_ref(),
                rec,
                &listener,
                &output,
                &AtomicBool::new(false),
            )
        })
    };
    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    writeln!(s, "reboot").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert_eq!(line, "err 22 unknown request 'reboot'\n");
    assert!(control::call(&socket, Request::Status)
        .unwrap()
        .contains("state=paused"));
    control::call(&socket, Request::Stop).unwrap();
    server.join().unwrap().unwrap();
}

#[test]
fn descriptors_pass_over_the_socket() {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut fds = [0i32; 2];
    // SAFETY: a valid array for pipe to fill.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors owned by nothing else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    control::send_with_fd(a.as_raw_fd(), b"ok\n", wr.as_raw_fd()).unwrap();
    drop(wr);
    let mut buf = [0u8; 16];
    let (n, got) = control::recv_with_fd(b.as_raw_fd(), &mut buf).unwrap();
    assert_eq!(&buf[..n], b"ok\n");
    let mut w = std::fs::File::from(got.unwrap());
    w.write_all(b"through").unwrap();
    drop(w);
    let mut s = String::new();
    std::fs::File::from(rd).read_to_string(&mut s).unwrap();
    assert_eq!(s, "through");
}

#[test]
fn programs_attach_by_inherited_descriptor_or_say_how_to_start() {
    let sys = fake();
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("none.sock");
    let s = Session::create(sys.clone(), &cfg("cpu-clock", Mode::Instructed)).unwrap();
    let fd = s.fd();
    assert_eq!(
        control::attach(sys.as_ref(), Some(&fd.to_string()), &nowhere).unwrap(),
        control::Attached::Inherited(fd)
    );
    let e = control::attach(sys.as_ref(), Some("12x"), &nowhere).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EBADF));
    let e = control::attach(sys.as_ref(), Some("999"), &nowhere).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EBADF));
    let e = control::attach(sys.as_ref(), None, &nowhere).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT));
    assert!(e.to_string().contains("hrperf start"), "{e}");
}

#[test]
fn socket_directory_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = control::prepare_dir(&open.join("ctl.sock")).unwrap_err();
    assert!(e.to_string().contains("mode 0700"), "{e}");
    let fresh = dir.path().join("a/b");
    control::prepare_dir(&fresh.join("ctl.sock")).unwrap();
    assert_eq!(
        std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        control::socket_path(Some(Path::new("/x/y.sock"))),
        PathBuf::from("/x/y.sock")
    );
    for r in [
        "start", "pause", "poll", "log", "poll-log", "status", "fd", "stop",
    ] {
        assert_eq!(Request::parse(r).unwrap().as_str(), r);
    }
    assert!(Request::parse("halt").is_none());
}

/// CREATE of a PEBS format refused with ENODEV (no PEBS-capable PMU detected by the
/// kernel) says so in one line; ENODEV elsewhere still means "module unloading".
#[test]
fn pebs_enodev_is_one_readable_line() {
    let e = ioctl_error(PEBS_CREATE, std::io::Error::from_raw_os_error(libc::ENODEV));
    let s = e.to_string();
    assert!(s.contains("no PEBS-capable PMU"), "{s}");
    assert!(!s.contains('\n'));
    let other = ioctl_error(
        "HRPERF_IOC_START",
        std::io::Error::from_raw_os_error(libc::ENODEV),
    );
    assert!(other.to_string().contains("unloading"));
}

/// The aggregating format's records of a capture: intervals and entries, in file order.
fn aggregates(
    path: &Path,
) -> (
    Vec<hrperf_fmt_aggregate::record::IntervalRecord>,
    Vec<hrperf_fmt_aggregate::record::EntryRecord>,
) {
    use hrperf_fmt_aggregate::record::{parse_entry, parse_interval, REC_ENTRY, REC_INTERVAL};
    let r = Reader::open(path).unwrap();
    let (mut ivs, mut entries) = (Vec::new(), Vec::new());
    for chunk in &mut r.chunks() {
        for rec in chunk.unwrap().records() {
            let rec = rec.unwrap();
            if rec.header.kind == REC_INTERVAL {
                ivs.push(parse_interval(rec.bytes).unwrap());
            } else if rec.header.kind == REC_ENTRY {
                entries.push(parse_entry(rec.bytes).unwrap());
            }
        }
    }
    (ivs, entries)
}

#[test]
fn records_aggregate_intervals_in_place_and_closes_them() {
    use hrperf_fmt_aggregate::record::{IV_FL_INCONSISTENT, KEY_IP, KEY_PID_IP, KEY_STACK};
    use hrperf_fmt_aggregate::{AggregateArg, AGGREGATE_OPS};
    for key in [KEY_IP, KEY_PID_IP, KEY_STACK] {
        let sys = fake();
        sys.register(&AGGREGATE_OPS);
        sys.set_ips(5);
        let dir = tempfile::tempdir().unwrap();
        sys.push_child(FakeChild {
            run_ns: 50_000_000,
            ..FakeChild::default()
        });
        let mut config = cfg("cpu-clock", Mode::Overflow { period: 100_000 });
        config.format = "aggregate".into();
        config.format_arg = AggregateArg {
            key,
            ..AggregateArg::default()
        }
        .to_bytes()
        .to_vec();
        let opts = KmodRecordOptions {
            config,
            command: vec!["work".into()],
            switch_interval_ns: 10_000_000,
            ..KmodRecordOptions::default()
        };
        let (path, s) = record(&sys, &opts, dir.path());
        let r = Reader::open(&path).unwrap();
        assert_eq!(r.meta().format_name, "aggregate");
        assert_eq!(
            r.meta().format_arg, opts.config.format_arg,
            "the argument reached the session and the capture"
        );
        let scan = r.scan();
        assert!(scan.error.is_none() && scan.warnings.is_empty(), "{:?}", scan.warnings);
        let (ivs, entries) = aggregates(&path);
        let acks = sys.acks();
        let switches = sys.switches();
        assert_eq!(s.aggregate.len(), 2);
        for cpu in [0u32, 1] {
            let mine: Vec<_> = ivs.iter().filter(|iv| iv.cpu == cpu).collect();
            let n = mine.len() as u64;
            // 50 ms closed every 10 ms, and once more at the end.
            assert!(n >= 5, "key {key} cpu {cpu}: {n} intervals");
            // Published intervals are read and acknowledged in order, each once.
            assert_eq!(
                mine.iter().map(|iv| iv.seq).collect::<Vec<_>>(),
                (1..=n).collect::<Vec<_>>()
            );
            assert_eq!(
                acks.iter().filter(|a| a.0 == cpu).map(|a| a.1).collect::<Vec<_>>(),
                (1..=n).collect::<Vec<_>>()
            );
            // Every interval was closed by a RESTART (none filled its table).
            assert_eq!(switches.iter().filter(|&&c| c == cpu).count() as u64, n);
            // Conservation: per interval, Σ count + other == samples.
            for iv in &mine {
                assert_eq!(iv.flags & IV_FL_INCONSISTENT, 0);
                assert_eq!(iv.key_kind, key);
                let rows: Vec<_> = entries
                    .iter()
                    .filter(|e| e.cpu == cpu && e.seq == iv.seq)
                    .collect();
                assert_eq!(rows.len() as u64, iv.entries);
                let counted: u64 = rows.iter().map(|e| e.count).sum();
                assert_eq!(counted + iv.other_count, iv.samples);
                if key == KEY_PID_IP {
                    assert!(rows.iter().all(|e| e.pid == 77));
                }
                if key != KEY_STACK && iv.samples >= 5 {
                    assert_eq!(rows.len(), 5, "the fake's five IPs");
                }
            }
            // Every dispatched sample is in exactly one interval.
            let samples: u64 = mine.iter().map(|iv| iv.samples).sum();
            let st = s.per_cpu.iter().find(|c| c.cpu == cpu).unwrap();
            assert_eq!(samples, st.overflows);
            assert_eq!(samples, 500, "50 ms at one sample per 100 µs");
            let a = s.aggregate.iter().find(|a| a.cpu == cpu).unwrap();
            assert_eq!((a.intervals, a.samples, a.dispatched), (n, samples, samples));
            assert_eq!(a.inconsistent, 0);
        }
        assert_eq!(s.samples, 1000);
        assert!(sys.calls().iter().any(|c| c == "HRPERF_IOC_RESTART"));
        assert_clean(&sys);
    }
}

#[test]
fn interval_drain_reads_a_full_table_switch_and_acks_it() {
    use hrperf_fmt_aggregate::{AggregateArg, AGGREGATE_OPS};
    let sys = fake();
    sys.register(&AGGREGATE_OPS);
    sys.set_ips(64);
    let mut config = cfg("cpu-clock", Mode::Overflow { period: 100_000 });
    config.format = "aggregate".into();
    // 16 slots, switch at half full: the handler switches by itself every 8 new keys.
    config.format_arg = AggregateArg {
        slots: 16,
        switch_permille: 500,
        ..AggregateArg::default()
    }
    .to_bytes()
    .to_vec();
    let mut s = Session::create(sys.clone(), &config).unwrap();
    assert!(s.has_intervals());
    s.start().unwrap();
    sys.advance(1_000_000); // 10 samples per CPU: one switch at the 8th key (or 9th sample)
    assert!(s.wait(0).unwrap(), "a published interval wakes the reader");
    let mut chunk = Vec::new();
    let mut agg = crate::record::AggCpuSummary::default();
    let (cpu, n) = s.drain_intervals(0, &mut chunk, &mut agg).unwrap();
    assert_eq!(cpu, 0);
    assert!(n >= 2, "an INTERVAL and its entries: {n}");
    assert_eq!(agg.intervals, 1);
    assert_eq!(sys.acks(), vec![(0, 1)]);
    let (_, n) = s.drain_intervals(0, &mut chunk, &mut agg).unwrap();
    assert_eq!((n, agg.intervals), (0, 1), "nothing is read twice");
    // Close the active interval: RESTART publishes it, the next drain reads it.
    s.restart_cpu(0).unwrap();
    let e = s.restart_cpu(0).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EBUSY), "not switched before the ack: {e}");
    let (_, n) = s.drain_intervals(0, &mut chunk, &mut agg).unwrap();
    assert!(n >= 1);
    assert_eq!(agg.intervals, 2);
    assert_eq!(agg.samples, 10, "Σ samples of the two intervals");
    assert!(!s.wait(0).unwrap(), "CONSUME acknowledged the notifications");
    s.stop().unwrap();
    drop(s);
    assert_clean(&sys);
}

/// The fake with the PEBS format registered and the simulated PMU reported by INFO.
fn pebs_fake() -> Arc<FakeKmod> {
    use hrperf_fmt_pebs::{Layout, PebsFormat, PEBS_OPS};
    let sys = fake();
    sys.register(&PEBS_OPS);
    sys.set_pebs(
        hrperf_abi::ioctl::pebs_state::SIMULATED,
        PebsFormat::simulated_for(Layout::Adaptive).0,
    );
    sys
}

fn pebs_config(data_cfg: u64, area_size: u64) -> KmodConfig {
    let mut config = cfg("cpu-clock", Mode::Overflow { period: 100_000 });
    config.format = "pebs".into();
    let mut arg = hrperf_fmt_pebs::PebsArg::new();
    arg.data_cfg = data_cfg;
    arg.area_size = area_size;
    config.format_arg = arg.to_bytes().to_vec();
    config
}

/// Zero-copy PEBS through the kmod recorder: CPUs masked at their threshold are read
/// in place and restarted, the rest is read once the session stopped; every record the
/// assist wrote is in the capture exactly once, decodes, and carries the simulated flag
/// and its time; the handler copied nothing.
#[test]
fn records_pebs_in_place_restarting_only_masked_cpus() {
    use hrperf_fmt_pebs::layout::DATACFG_MEMINFO;
    use hrperf_fmt_pebs::record::{self as prec, FL_SIMULATED, FL_TIME};
    let sys = pebs_fake();
    let dir = tempfile::tempdir().unwrap();
    sys.push_child(FakeChild {
        run_ns: 50_000_000,
        ..FakeChild::default()
    });
    // 4 KiB of 64-byte records (basic + meminfo): 64 records, the PMI at 63.
    let opts = KmodRecordOptions {
        config: pebs_config(DATACFG_MEMINFO, 4096),
        command: vec!["work".into()],
        ..KmodRecordOptions::default()
    };
    let (path, s) = record(&sys, &opts, dir.path());
    let r = Reader::open(&path).unwrap();
    assert_eq!(r.meta().format_name, "pebs");
    assert_eq!(r.meta().tsc_hz, 1_000_000_000, "the simulated TSC counts ns");
    let mut per_cpu = [0u64; 2];
    let mut last_time = [0u64; 2];
    for chunk in &mut r.chunks() {
        for rec in chunk.unwrap().records() {
            let rec = rec.unwrap();
            let p = prec::parse(rec.bytes).unwrap();
            assert_eq!(p.prefix.flags, FL_SIMULATED | FL_TIME);
            let cpu = p.prefix.cpu as usize;
            assert!(p.prefix.time_ns >= last_time[cpu], "time goes forward per CPU");
            last_time[cpu] = p.prefix.time_ns;
            assert_eq!(p.pebs.mem.map(|m| (m.data_source, m.latency)), Some((1, 5)));
            assert_eq!(p.pebs.tsc, Some(p.prefix.time_ns), "TSC ns at 1 GHz is the time");
            per_cpu[cpu] += 1;
        }
    }
    // 50 ms at one overflow per 100 µs: 500 assists per CPU, none lost while masked
    // (the reader answers each NOTIFY at once in virtual time).
    assert_eq!(per_cpu, [500, 500]);
    assert_eq!(s.pebs.len(), 2);
    for p in &s.pebs {
        assert_eq!(p.records, 500);
        assert_eq!(p.header.records_copied, 0);
        assert_eq!(p.header.lost, 0);
        // 7 full areas (7 × 63 = 441), restarted; 59 records read after STOP.
        assert_eq!((p.header.threshold_hits, p.header.restarts), (7, 7));
        assert_eq!(p.drains, 8);
        let st = s.per_cpu.iter().find(|c| c.cpu == p.cpu).unwrap();
        assert_eq!(st.overflows, 7, "only threshold PMIs reach the handler");
    }
    let restarts = sys.calls().iter().filter(|c| *c == "HRPERF_IOC_RESTART").count();
    assert_eq!(restarts, 14);
    assert_clean(&sys);
}

/// A refused PEBS CREATE says why, from INFO: the kernel's reason, the CPU and MSR
/// value it names, and what to do; the errno is kept.
#[test]
fn pebs_refusals_name_the_kernels_reason() {
    use hrperf_abi::ioctl::pebs_state;
    let err = |sys: &Arc<FakeKmod>, config: &KmodConfig| {
        match Session::create(sys.clone(), config) {
            Ok(_) => panic!("CREATE accepted"),
            Err(e) => e,
        }
    };
    let sys = pebs_fake();
    sys.set_pebs(pebs_state::NO_PMU, 0);
    let e = err(&sys, &pebs_config(0, 0));
    let s = e.to_string();
    assert!(s.contains("refused zero-copy PEBS: no hardware PMU"), "{s}");
    assert!(s.contains("--source sim") && !s.contains('\n'), "{s}");
    assert_eq!(e.errno(), Some(libc::ENODEV));

    let sys = pebs_fake();
    sys.refuse_pebs(pebs_state::PEBS_IN_USE, 1, 0x1);
    let e = err(&sys, &pebs_config(0, 0));
    let s = e.to_string();
    assert!(s.contains("perf is using PEBS on that CPU") && s.contains("on CPU 1 (0x1)"), "{s}");
    assert_eq!(e.errno(), Some(libc::EBUSY));

    let sys = pebs_fake();
    sys.set_pebs(pebs_state::KPTI, 0);
    let e = err(&sys, &pebs_config(0, 0));
    assert!(e.to_string().contains("pti=off"), "{e}");
    assert_eq!(e.errno(), Some(libc::EOPNOTSUPP));

    let sys = pebs_fake();
    let mut two = pebs_config(0, 0);
    two.events = parse_events("cpu-clock,page-faults").unwrap();
    let e = err(&sys, &two);
    assert!(e.to_string().contains("exactly one raw (rNNNN) or generic hardware event"), "{e}");
    assert_eq!(e.errno(), Some(libc::EINVAL));
    assert_clean(&sys);
}
