//! The kernel module's commands: `record --source kmod`, `status`, and the hiresperf-style
//! session commands `start | pause | poll | log | poll-log | stop`.
//!
//! A session lives as long as its `/dev/hrperf` file is open, so `hrperf start` forks a
//! daemon that holds it, records it into a capture file and answers a UNIX socket; the
//! other commands send it one request each. The design, the protocol and the socket's
//! access rules are in `hrperf::source::kmod::control`.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use hrperf::record::Live;
use hrperf::source::kmod::control::{self, Listener, Request};
use hrperf::source::kmod::record::{record_kmod_to_file, KmodRecordOptions, Recorder};
use hrperf::source::kmod::sys::{daemonize, redirect, Forked};
use hrperf::source::kmod::{
    daemon, format_name, mode_name, Device, KmodConfig, KmodError, KmodSys, LinuxKmodSys, Mode,
    Session, DEFAULT_DEVICE,
};
use hrperf::source::perf;
use hrperf_abi::format::{FMT_FL_INTERVALS, FMT_FL_PEBS, FMT_FL_RING, FMT_FL_STACKS};
use hrperf_abi::ioctl::pebs_state;

use crate::args::{parse_size, CtlArgs, RecordArgs, StartArgs};
use crate::record::{catch_signals, exit_code, live_line, print_summary, STOP};
use crate::{CliError, CliResult};

/// Events when none are given (as for the perf source).
const DEFAULT_EVENTS: &str = "cpu-clock,task-clock,page-faults";

/// The session mode from the mode options.
fn mode_of(period: Option<u64>, poll_us: Option<u64>, instructed: bool) -> Result<Mode, CliError> {
    Ok(match (period, poll_us, instructed) {
        (Some(0), _, _) | (_, Some(0), _) => {
            return Err(CliError("-c and --poll-us take a positive number".into()))
        }
        (Some(p), _, _) => Mode::Overflow { period: p },
        (_, Some(us), _) => Mode::Poll {
            interval_ns: us.saturating_mul(1000),
        },
        (_, _, true) => Mode::Instructed,
        _ => Mode::Default,
    })
}

/// A session configuration from the common options.
fn session_config(
    format: Option<&str>,
    events: Option<&str>,
    mode: Mode,
    cpus: Option<&str>,
    data_size: u64,
) -> Result<KmodConfig, CliError> {
    Ok(KmodConfig {
        device: PathBuf::from(DEFAULT_DEVICE),
        format: format.unwrap_or("delta").to_string(),
        events: perf::parse_events(events.unwrap_or(DEFAULT_EVENTS))?,
        mode,
        cpus: cpus.map(perf::parse_cpu_list).transpose()?,
        data_size,
        format_arg: Vec::new(),
    })
}

fn sys() -> Arc<dyn KmodSys> {
    Arc::new(LinuxKmodSys)
}

/// Period of the simulated PEBS PMU's trigger, cpu-clock ns (the kmod sim default).
const DEFAULT_SIM_PEBS_PERIOD: u64 = 100_000;

/// `--format pebs` with the kmod source: the events, period and format argument, with
/// defaults chosen by the PMU the module uses (INFO): on the CPU's PEBS a precise
/// `cycles` event, on the simulated PMU (`pebs_sim=`) `cpu-clock` every 100 µs as the
/// PEBS counter's overflow. The record layout is the kernel's: `--pebs-format` does not
/// apply. Memory info is asked for where the layout is adaptive.
fn pebs_session(a: &RecordArgs) -> Result<PebsSession, CliError> {
    if a.pebs_format != "adaptive" {
        return Err(CliError(
            "--pebs-format chooses the simulated PMU of --source sim; with --source kmod the kernel detects the record layout (on its simulated PMU: insmod hrperf-core.ko pebs_sim=fmt0|fmt1|fmt2|fmt3|adaptive)".into(),
        ));
    }
    if a.poll_us.is_some() || a.instructed {
        return Err(CliError("PEBS samples on counter overflow: use -c PERIOD, not --poll-us or --instructed".into()));
    }
    let info = Device::open(sys(), Path::new(DEFAULT_DEVICE)).and_then(|d| d.info())?;
    let word = hrperf_fmt_pebs::PebsFormat(info.pebs_format);
    let simulated = info.pebs_state == pebs_state::SIMULATED;
    let adaptive = word.layout() == Some(hrperf_fmt_pebs::Layout::Adaptive) && word.has(hrperf_fmt_pebs::PebsFormat::BASELINE);
    let mut arg = hrperf_fmt_pebs::PebsArg::new();
    arg.data_cfg = match &a.pebs_data_cfg {
        Some(g) => hrperf::source::sim::pebs::parse_data_cfg(g)?,
        None if adaptive => hrperf_fmt_pebs::layout::DATACFG_MEMINFO,
        None => 0,
    };
    // The kernel keeps it only for the load-latency event (the simulated PMU's is one).
    arg.ld_lat_threshold = a.pebs_ld_lat.unwrap_or(hrperf::source::sim::pebs::DEFAULT_LD_LAT);
    let events = a.events.clone().or_else(|| Some(if simulated { "cpu-clock" } else { "cycles" }.to_string()));
    let period = a.period.or(Some(if simulated { DEFAULT_SIM_PEBS_PERIOD } else { crate::record::DEFAULT_PEBS_PERIOD }));
    Ok(PebsSession { events, period, format_arg: arg.to_bytes().to_vec() })
}

/// What [`pebs_session`] chose.
struct PebsSession {
    events: Option<String>,
    period: Option<u64>,
    format_arg: Vec<u8>,
}

/// `hrperf record --source kmod`, with the format argument built from the format's
/// options and, for an interval format, the interval switch period (0: default).
pub fn run_record(
    a: &RecordArgs,
    duration_ns: Option<u64>,
    data_size: u64,
    format_arg: Vec<u8>,
    switch_interval_ns: u64,
) -> CliResult {
    if a.freq.is_some() {
        return Err(CliError(
            "the kmod source samples by period: use -c PERIOD (e.g. -c 100000: every 100 µs of cpu-clock)".into(),
        ));
    }
    if a.command.is_empty() && !a.all_cpus && a.cpus.is_none() {
        return Err(CliError(
            "nothing to record: give a command (-- CMD ...), -a or -C CPUS".into(),
        ));
    }
    let pebs = hrperf::record::format_needs_pebs(&a.format);
    let PebsSession { events, period, format_arg } = if pebs {
        pebs_session(a)?
    } else {
        PebsSession { events: a.events.clone(), period: a.period, format_arg }
    };
    let mut config = session_config(
        Some(&a.format),
        events.as_deref(),
        mode_of(period, a.poll_us, a.instructed)?,
        a.cpus.as_deref(),
        data_size,
    )?;
    config.format_arg = format_arg;
    if a.command.is_empty() && duration_ns.is_none() {
        eprintln!("hrperf: recording until Ctrl-C (or give --duration)");
    }
    let opts = KmodRecordOptions {
        config,
        command: a.command.clone(),
        duration_ns,
        drain_ms: a.drain_ms.map_or(0, |ms| ms.clamp(1, 10_000) as u32),
        host_info: true,
        switch_interval_ns,
    };
    catch_signals();
    let tty = std::io::stderr().is_terminal() && !a.quiet;
    let mut live = |l: &Live| {
        if tty {
            live_line(l);
        }
    };
    let summary =
        record_kmod_to_file(sys(), &opts, &a.output, &STOP, &mut live).map_err(|e| match e {
            KmodError::NotLoaded { .. } | KmodError::Permission { .. } => {
            CliError(format!("{e}; or record with --source perf"))
        }
            e => CliError(e.to_string()),
        })?;
    if tty {
        eprint!("\r\x1b[K");
    }
    if !a.quiet {
        print_summary(&a.output, &summary);
    }
    Ok(exit_code(summary.exit_status))
}

fn flags_text(flags: u32) -> String {
    let names: Vec<&str> = [
        (FMT_FL_RING, "ring"),
        (FMT_FL_PEBS, "pebs"),
        (FMT_FL_STACKS, "stacks"),
        (FMT_FL_INTERVALS, "intervals"),
    ]
    .iter()
    .filter(|(f, _)| flags & f != 0)
    .map(|(_, n)| *n)
    .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    }
}

/// `hrperf status`.
pub fn run_status(a: CtlArgs) -> CliResult {
    let dev = Device::open(sys(), Path::new(DEFAULT_DEVICE))?;
    let info = dev.info()?;
    let formats = dev.formats()?;
    let v = info.module_version;
    let mut out = std::io::stdout().lock();
    let socket = control::socket_path(a.socket.as_deref());
    let daemon = control::call(&socket, Request::Status).ok();
    let res = (|| -> std::io::Result<()> {
        writeln!(
            out,
            "module:        hrperf-core {}.{}.{} at {DEFAULT_DEVICE} (ioctl ABI {})",
            v >> 16,
            (v >> 8) & 0xff,
            v & 0xff,
            info.abi_version
        )?;
        writeln!(
            out,
            "default mode:  {} (module parameter mode=)",
            mode_name(info.default_mode)
        )?;
        writeln!(out, "poll interval: {} us (poll_us=)", info.poll_us)?;
        writeln!(out, "online CPUs:   {}", info.nr_cpus)?;
        writeln!(out, "sessions:      {} open", info.nr_sessions)?;
        writeln!(
            out,
            "drops:         {} (sessions closed since load)",
            info.total_drops
        )?;
        let pebs = match info.pebs_state {
            pebs_state::HARDWARE | pebs_state::SIMULATED => format!(
                "{} (record format {}, word {:#x})",
                pebs_state::text(info.pebs_state),
                info.pebs_format & 0xf,
                info.pebs_format
            ),
            state => format!("not available: {}", pebs_state::text(state)),
        };
        writeln!(out, "PEBS:          {pebs}")?;
        if info.pebs_refusal != pebs_state::UNKNOWN {
            let cpu = match info.pebs_refusal_cpu {
                u32::MAX => String::new(),
                c => format!(" on CPU {c} ({:#x})", info.pebs_refusal_value),
            };
            writeln!(out, "  last refusal: {}{cpu}", pebs_state::text(info.pebs_refusal))?;
        }
        writeln!(out, "formats:       {} registered", formats.len())?;
        writeln!(
            out,
            "  {:<12} {:<36} {:<8} {:<12} USERS",
            "NAME", "UUID", "VERSION", "FLAGS"
        )?;
        for f in &formats {
            writeln!(
                out,
                "  {:<12} {:<36} {:<8} {:<12} {}",
                format_name(f),
                f.uuid.to_string(),
                format!("{}.{}", f.version >> 16, f.version & 0xffff),
                flags_text(f.flags),
                f.users
            )?;
        }
        match &daemon {
            Some(s) => writeln!(out, "hrperf start:  {s} (socket {})", socket.display())?,
            None => writeln!(
                out,
                "hrperf start:  no session (socket {})",
                socket.display()
            )?,
        }
        out.flush()
    })();
    match res {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// The session commands that only send a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctl {
    /// `hrperf pause`.
    Pause,
    /// `hrperf poll`.
    Poll,
    /// `hrperf log`.
    Log,
    /// `hrperf poll-log`.
    PollLog,
    /// `hrperf stop`.
    Stop,
}

/// `hrperf pause | poll | log | poll-log | stop`.
pub fn run_ctl(a: CtlArgs, what: Ctl) -> CliResult {
    let socket = control::socket_path(a.socket.as_deref());
    let req = match what {
        Ctl::Pause => Request::Pause,
        Ctl::Poll => Request::Poll,
        Ctl::Log => Request::Log,
        Ctl::PollLog => Request::PollLog,
        Ctl::Stop => Request::Stop,
    };
    let reply = control::call(&socket, req)?;
    if matches!(what, Ctl::Pause | Ctl::Stop) {
        eprintln!("[hrperf] {reply}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `hrperf start`: resume the running session, or fork a daemon with a new one.
pub fn run_start(a: StartArgs) -> CliResult {
    let socket = control::socket_path(a.socket.as_deref());
    if control::is_running(&socket) {
        if a.has_session_options() {
            return Err(CliError(format!(
                "an hrperf session is already running (socket {}): `hrperf start` without options resumes it, `hrperf stop` ends it",
                socket.display()
            )));
        }
        let reply = control::call(&socket, Request::Start)?;
        eprintln!("[hrperf] {reply}");
        return Ok(ExitCode::SUCCESS);
    }
    let data_size = a
        .buffer_size
        .as_deref()
        .map(parse_size)
        .transpose()?
        .unwrap_or(0);
    let config = session_config(
        a.format.as_deref(),
        a.events.as_deref(),
        mode_of(a.period, a.poll_us, a.instructed)?,
        a.cpus.as_deref(),
        data_size,
    )?;
    let output = absolute(a.output.as_deref().unwrap_or(Path::new("hrperf.data")))?;
    control::prepare_dir(&socket)?;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    match daemonize().map_err(|e| CliError(format!("cannot fork the session daemon: {e}")))? {
        Forked::Parent { pid, mut ready } => {
            let mut text = String::new();
            let _ = ready.read_to_string(&mut text);
            let text = text.trim_end();
            if let Some(status) = text.strip_prefix("ok ") {
                eprintln!("[hrperf] session started (daemon pid {pid}): {status}");
                eprintln!("[hrperf] control it with hrperf pause|start|poll|log|poll-log|stop; messages in {}.log", socket.display());
                Ok(ExitCode::SUCCESS)
            } else if let Some(err) = text.strip_prefix("err ") {
                Err(CliError(err.to_string()))
            } else {
                Err(CliError(format!(
                    "the session daemon (pid {pid}) exited before it was ready; see {}.log",
                    socket.display()
                )))
            }
        }
        Forked::Daemon { ready } => {
            std::process::exit(daemon_main(&config, &output, &socket, a.paused, ready))
        }
    }
}

fn absolute(p: &Path) -> Result<PathBuf, CliError> {
    if p.is_absolute() {
        return Ok(p.to_owned());
    }
    let cwd = std::env::current_dir()
        .map_err(|e| CliError(format!("cannot resolve {}: {e}", p.display())))?;
    Ok(cwd.join(p))
}

/// The daemon: sets up the session, reports on `ready`, serves until `hrperf stop`.
fn daemon_main(
    config: &KmodConfig,
    output: &Path,
    socket: &Path,
    paused: bool,
    mut ready: std::fs::File,
) -> i32 {
    // Nothing of ours may hold the caller's stdout/stderr (a pipe would never close).
    let mut log = socket.as_os_str().to_owned();
    log.push(".log");
    let log = PathBuf::from(log);
    for fd in [1, 2] {
        if let Err(e) = redirect(fd, &log, true) {
            let _ = writeln!(ready, "err cannot open {}: {e}", log.display());
            return 2;
        }
    }
    catch_signals();
    let sys = sys();
    let setup = || -> Result<(Recorder<std::fs::File>, Listener), KmodError> {
        let session = Session::create(sys.clone(), config)?;
        let listener = Listener::bind(socket)?;
        if output.exists() {
            let mut old = output.as_os_str().to_owned();
            old.push(".old");
            std::fs::rename(output, &old).map_err(|e| {
                KmodError::Config(format!(
                    "cannot move the existing {} aside: {e}",
                    output.display()
                ))
            })?;
        }
        let file = std::fs::File::create(output)
            .map_err(|e| KmodError::Config(format!("cannot create {}: {e}", output.display())))?;
        let mut rec = Recorder::new(session, file, output, &[], true)?;
        if !paused {
            rec.start()?;
        }
        Ok((rec, listener))
    };
    let (rec, listener) = match setup() {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(ready, "err {e}");
            return 2;
        }
    };
    let s = rec.session();
    let events: Vec<&str> = s.events().iter().map(|e| e.name.as_str()).collect();
    let cpus: Vec<String> = s.cpus().iter().map(u32::to_string).collect();
    let _ = writeln!(
        ready,
        "ok {} mode, {}, events {}, CPUs {}, writing {}",
        mode_name(s.mode()),
        if paused { "paused" } else { "running" },
        events.join(","),
        cpus.join(","),
        output.display()
    );
    drop(ready);
    eprintln!(
        "hrperf daemon {}: serving {}",
        std::process::id(),
        socket.display()
    );
    match daemon::serve(sys.as_ref(), rec, &listener, output, &STOP) {
        Ok(s) => {
            eprintln!(
                "hrperf daemon: wrote {}: {} records, {} drops",
                output.display(),
                s.records,
                s.drops
            );
            0
        }
        Err(e) => {
            eprintln!("hrperf daemon: error: {e}");
            2
        }
    }
}
