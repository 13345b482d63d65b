//! `hrperf record`: builds the source from the arguments, runs the recorder with a live
//! progress line, prints a summary, and exits with the recorded command's status.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use hrperf::record::{format_needs_pebs, record_to_file, Live, RecordOptions, RecordSummary};
use hrperf::source::perf::{self, PerfConfig, PerfSource, Sampling};
use hrperf::source::sim::pebs::{parse_data_cfg, parse_layout, PebsConfig, DEFAULT_LD_LAT};
use hrperf::source::sim::{self, SimConfig, SimSource, Workload};
use hrperf::source::Source;
use hrperf_abi::format::{MODE_OVERFLOW, MODE_POLL};

use hrperf_fmt_aggregate::record::{KEY_IP, KEY_PID_IP, KEY_STACK};
use hrperf_fmt_aggregate::AggregateArg;
use hrperf_fmt_llc_stack::{LlcStackArg, ARG_NO_KERNEL_STACK, ARG_NO_USER_STACK, LLC_STACK_ARG_SIZE, LLC_STACK_NAME, MAX_DEPTH};

use crate::args::{parse_duration_ns, parse_size, AggKey, RecordArgs, SourceKind, WorkloadKind};
use crate::{CliError, CliResult};

/// Default poll interval when no mode is given.
const DEFAULT_POLL_US: u64 = 1000;
/// Default sampling period of the PEBS counter (`--format pebs`, sim and perf sources).
pub(crate) const DEFAULT_PEBS_PERIOD: u64 = 10_000;
/// Default sampling period of the trigger event (sim source, `--format llc-stack`).
const DEFAULT_STACK_PERIOD: u64 = 5000;
/// Default sampling frequency (perf source, `--format llc-stack`).
const DEFAULT_STACK_FREQ: u64 = 999;
/// Set by SIGINT/SIGTERM: finish the capture cleanly instead of dying.
pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub(crate) fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Runs `hrperf record`.
pub fn run(a: RecordArgs) -> CliResult {
    let source_kind = match a.source {
        SourceKind::Auto if Path::new("/dev/hrperf").exists() => SourceKind::Kmod,
        SourceKind::Auto => SourceKind::Perf,
        k => k,
    };
    let duration_ns = a.duration.as_deref().map(parse_duration_ns).transpose()?;
    let data_size = a.buffer_size.as_deref().map(parse_size).transpose()?.unwrap_or(0);
    let mut opts = RecordOptions {
        format: a.format.clone(),
        data_size,
        drain_interval_ns: a.drain_ms.map_or(0, |ms| ms.saturating_mul(1_000_000)),
        wake_on_notify: a.drain_ms.is_none(),
        duration_ns,
        command: a.command.clone(),
        host_info: true,
        sim_config: String::new(),
        pebs_pmu: None,
        format_arg: Vec::new(),
        switch_interval_ns: 0,
        perf_pebs: None,
    };
    let has_agg_options = a.agg_key.is_some() || a.agg_slots.is_some() || a.agg_interval_ms.is_some();
    if has_agg_options && a.format != hrperf_fmt_aggregate::AGGREGATE_NAME {
        return Err(CliError("--agg-key, --agg-slots and --agg-interval-ms need --format aggregate".into()));
    }
    if a.format == hrperf_fmt_aggregate::AGGREGATE_NAME {
        let (arg, interval_ns) = aggregate_arg(&a)?;
        opts.format_arg = arg.to_bytes().to_vec();
        opts.switch_interval_ns = interval_ns;
    }
    let stack_options = a.kernel_depth.is_some() || a.user_depth.is_some() || a.no_kernel_stack || a.no_user_stack;
    if a.format == LLC_STACK_NAME {
        opts.format_arg = llc_stack_arg(&a)?.to_bytes().to_vec();
    } else if stack_options {
        return Err(CliError(
            "--kernel-depth, --user-depth, --no-kernel-stack and --no-user-stack need --format llc-stack".into(),
        ));
    }
    let pebs = format_needs_pebs(&a.format);
    if pebs && source_kind == SourceKind::Perf && (a.pebs_data_cfg.is_some() || a.pebs_format != "adaptive") {
        return Err(CliError(
            "--pebs-format and --pebs-data-cfg configure the simulated PMU (--source sim); with --source perf the kernel's perf chooses the PEBS record".into(),
        ));
    }

    if a.instructed && source_kind != SourceKind::Kmod {
        return Err(CliError(
            "--instructed needs the kernel module's session (--source kmod, with hrperf-core.ko loaded)".into(),
        ));
    }
    let mut source: Box<dyn Source> = match source_kind {
        SourceKind::Sim => {
            let cfg = sim_config(&a, duration_ns)?;
            opts.sim_config = cfg.describe();
            opts.host_info = false; // a sim capture is reproducible byte for byte
            opts.duration_ns = None; // the simulator stops at its own virtual duration
            let src = SimSource::new(cfg)?;
            opts.pebs_pmu = src.pebs_pmu();
            Box::new(src)
        }
        SourceKind::Perf => {
            // PEBS through perf: one precise hardware event (perf record's default is cycles:P).
            let default_events = if pebs { "cycles" } else { "cpu-clock,task-clock,page-faults" };
            let mut events = perf::parse_events(a.events.as_deref().unwrap_or(default_events))?;
            if let (true, Some(cycles)) = (pebs, a.pebs_ld_lat) {
                perf::set_load_latency(&mut events, cycles)?;
            }
            let sampling = match (a.period, a.freq, a.poll_us) {
                (Some(0), _, _) | (_, Some(0), _) | (_, _, Some(0)) => {
                    return Err(CliError("-c, -F and --poll-us take a positive number".into()))
                }
                (_, _, Some(_)) if pebs => {
                    return Err(CliError("PEBS samples on counter overflow: use -c PERIOD or -F FREQ, not --poll-us".into()))
                }
                (None, None, None) if pebs => Sampling::Period(DEFAULT_PEBS_PERIOD),
                (_, _, Some(_)) if a.format == LLC_STACK_NAME => {
                    return Err(CliError("call stacks are taken on counter overflow: use -c PERIOD or -F FREQ, not --poll-us".into()))
                }
                (None, None, None) if a.format == LLC_STACK_NAME => Sampling::Freq(DEFAULT_STACK_FREQ),
                (Some(p), _, _) => Sampling::Period(p),
                (_, Some(f), _) => Sampling::Freq(f),
                (_, _, p) => Sampling::Poll { interval_ns: p.unwrap_or(DEFAULT_POLL_US).saturating_mul(1000) },
            };
            let cpus = a.cpus.as_deref().map(perf::parse_cpu_list).transpose()?;
            if a.command.is_empty() && !a.all_cpus && cpus.is_some() && duration_ns.is_none() {
                eprintln!("hrperf: recording CPUs until Ctrl-C (or give --duration)");
            }
            if a.command.is_empty() && a.all_cpus && duration_ns.is_none() {
                eprintln!("hrperf: recording all CPUs until Ctrl-C (or give --duration)");
            }
            let mut cfg = PerfConfig::from_cli(events, sampling, a.all_cpus, cpus, a.command.clone())?;
            cfg.pebs = pebs;
            let src = PerfSource::new(cfg)?;
            for note in src.notes() {
                eprintln!("hrperf: note: {note}");
            }
            opts.perf_pebs = src.pebs();
            Box::new(src)
        }
        SourceKind::Kmod => {
            return crate::kmod::run_record(&a, duration_ns, data_size, opts.format_arg, opts.switch_interval_ns)
        }
        SourceKind::Auto => unreachable!("auto was resolved above"),
    };

    catch_signals();
    let tty = std::io::stderr().is_terminal() && !a.quiet;
    let mut live = |l: &Live| {
        if tty {
            live_line(l);
        }
    };
    let summary = record_to_file(source.as_mut(), &opts, &a.output, &STOP, &mut live)?;
    if tty {
        eprint!("\r\x1b[K");
    }
    if !a.quiet {
        print_summary(&a.output, &summary);
        if let Some(p) = &opts.perf_pebs {
            eprintln!(
                "[hrperf] PEBS via perf (precise_ip {}): {} records synthesised from perf samples (perf-sourced; no DS area, nothing read in place)",
                p.precise_ip().unwrap_or(0),
                p.records()
            );
        }
    }
    Ok(exit_code(summary.exit_status))
}

/// The aggregating format's argument and switch interval from `--agg-*`.
fn aggregate_arg(a: &RecordArgs) -> Result<(AggregateArg, u64), CliError> {
    let key = match a.agg_key.unwrap_or(AggKey::Ip) {
        AggKey::Ip => KEY_IP,
        AggKey::PidIp => KEY_PID_IP,
        AggKey::Stack => KEY_STACK,
    };
    let slots = a.agg_slots.unwrap_or(0);
    if a.agg_slots.is_some() && !(slots.is_power_of_two() && (16..=1 << 20).contains(&slots)) {
        return Err(CliError(format!("--agg-slots {slots}: give a power of two in 16..=1048576, e.g. 4096")));
    }
    let interval_ns = match a.agg_interval_ms {
        Some(0) => return Err(CliError("--agg-interval-ms takes a positive number of milliseconds".into())),
        Some(ms) => ms.saturating_mul(1_000_000),
        None => 0,
    };
    Ok((AggregateArg { key, slots, ..AggregateArg::default() }, interval_ns))
}

/// The call-stack format's argument from `--kernel-depth`, `--user-depth` and
/// `--no-{kernel,user}-stack`.
pub(crate) fn llc_stack_arg(a: &RecordArgs) -> Result<LlcStackArg, CliError> {
    for (flag, v) in [("--kernel-depth", a.kernel_depth), ("--user-depth", a.user_depth)] {
        if let Some(d) = v.filter(|&d| d == 0 || d > MAX_DEPTH) {
            return Err(CliError(format!("{flag} {d}: give a depth in 1..={MAX_DEPTH}")));
        }
    }
    let mut flags = 0;
    if a.no_kernel_stack {
        flags |= ARG_NO_KERNEL_STACK;
    }
    if a.no_user_stack {
        flags |= ARG_NO_USER_STACK;
    }
    Ok(LlcStackArg {
        size: LLC_STACK_ARG_SIZE as u32,
        flags,
        data_size: 0,
        max_kernel: a.kernel_depth.unwrap_or(0),
        max_user: a.user_depth.unwrap_or(0),
        reserved: 0,
    })
}

/// The live progress line on stderr (a terminal).
pub(crate) fn live_line(l: &Live) {
    eprint!(
        "\r\x1b[K[hrperf] {:.1} s  samples {}  records {}  drops {}  {}",
        l.elapsed_ns as f64 / 1e9,
        l.samples,
        l.records,
        l.drops,
        human_bytes(l.bytes)
    );
    let _ = std::io::stderr().flush();
}

fn sim_config(a: &RecordArgs, duration_ns: Option<u64>) -> Result<SimConfig, CliError> {
    if !a.command.is_empty() {
        return Err(CliError(
            "the sim source runs its own simulated workload; drop the command, or record it with --source perf".into(),
        ));
    }
    if a.all_cpus || a.cpus.is_some() {
        return Err(CliError("the sim source simulates --sim-cpus CPUs; -a and -C do not apply".into()));
    }
    let pebs = format_needs_pebs(&a.format);
    let stacks = a.format == LLC_STACK_NAME;
    let default_events = if pebs {
        "loads"
    } else if stacks {
        "llc-misses,cycles,instructions"
    } else {
        "cycles,instructions,llc-misses"
    };
    let events = sim::parse_events(a.events.as_deref().unwrap_or(default_events))?;
    let mut cfg = SimConfig::new(events);
    cfg.seed = a.seed;
    cfg.cpus = a.sim_cpus;
    cfg.width = a.counter_width;
    cfg.workload = match a.workload {
        WorkloadKind::Phases => Workload::Phases,
        WorkloadKind::Steady => Workload::Steady,
    };
    cfg.duration_ns = duration_ns.unwrap_or(100_000_000);
    if a.freq.is_some() {
        return Err(CliError("the sim source samples by period: use -c PERIOD instead of -F".into()));
    }
    if pebs {
        let layout = parse_layout(&a.pebs_format)?;
        let data_cfg = match (&a.pebs_data_cfg, layout) {
            (Some(g), _) => parse_data_cfg(g)?,
            (None, hrperf_fmt_pebs::Layout::Adaptive) => hrperf_fmt_pebs::layout::DATACFG_MEMINFO,
            (None, _) => 0,
        };
        let p = PebsConfig { layout, data_cfg, ld_lat_threshold: a.pebs_ld_lat.unwrap_or(DEFAULT_LD_LAT), ..PebsConfig::new() };
        p.check()?;
        cfg.pebs = Some(p);
        if a.poll_us.is_some() {
            return Err(CliError("PEBS samples on counter overflow: use -c PERIOD, not --poll-us".into()));
        }
        cfg.mode = MODE_OVERFLOW;
        cfg.period = a.period.unwrap_or(DEFAULT_PEBS_PERIOD);
        return Ok(cfg);
    }
    if stacks && a.poll_us.is_some() {
        return Err(CliError("call stacks are taken on counter overflow: use -c PERIOD, not --poll-us".into()));
    }
    match (a.period, a.poll_us) {
        (Some(p), _) => {
            cfg.mode = MODE_OVERFLOW;
            cfg.period = p;
        }
        (None, _) if stacks => {
            cfg.mode = MODE_OVERFLOW;
            cfg.period = DEFAULT_STACK_PERIOD;
        }
        (None, p) => {
            cfg.mode = MODE_POLL;
            cfg.poll_interval_ns = p.unwrap_or(DEFAULT_POLL_US).saturating_mul(1000);
        }
    }
    Ok(cfg)
}

pub(crate) fn print_summary(path: &Path, s: &RecordSummary) {
    let cpus = s.per_cpu.len();
    eprintln!(
        "[hrperf] wrote {}: {} records from {} CPU{} in {:.3} s, {}",
        path.display(),
        s.records,
        cpus,
        if cpus == 1 { "" } else { "s" },
        s.elapsed_ns as f64 / 1e9,
        human_bytes(s.bytes)
    );
    if !s.pebs.is_empty() {
        let sum = |f: fn(&hrperf::record::PebsCpuSummary) -> u64| s.pebs.iter().map(f).sum::<u64>();
        eprintln!(
            "[hrperf] PEBS: {} records read in place, {} threshold interrupts, {} restarts, {} records copied by the handler",
            sum(|p| p.records),
            sum(|p| p.header.threshold_hits),
            sum(|p| p.header.restarts),
            sum(|p| p.header.records_copied)
        );
    }
    if !s.aggregate.is_empty() {
        let sum = |f: fn(&hrperf::record::AggCpuSummary) -> u64| s.aggregate.iter().map(f).sum::<u64>();
        eprintln!(
            "[hrperf] aggregate: {} samples in {} intervals, {} key rows, {} in other ({} table misses), {} postponed switches",
            sum(|c| c.samples),
            sum(|c| c.intervals),
            sum(|c| c.entries),
            sum(|c| c.other_count),
            sum(|c| c.misses),
            sum(|c| c.switch_waits)
        );
    }
    if s.stacks > 0 {
        eprintln!("[hrperf] call stacks: {} samples with stacks", s.stacks);
    }
    for note in &s.notes {
        eprintln!("[hrperf] note: {note}");
    }
    if s.drops > 0 {
        eprintln!(
            "[hrperf] WARNING: {} records dropped because a CPU buffer was full (marked by LOST records); enlarge it with --buffer-size",
            s.drops
        );
    }
    if s.source_lost > 0 {
        eprintln!("[hrperf] WARNING: {} samples lost by the source before hrperf saw them", s.source_lost);
    }
    if s.masked > 0 {
        eprintln!("[hrperf] note: {} samples arrived while the format had masked a CPU", s.masked);
    }
    if s.multi_wraps > 0 {
        eprintln!(
            "[hrperf] WARNING: {} samples may hide a second counter wrap (flagged multi_wrap; their deltas are lower bounds)",
            s.multi_wraps
        );
    }
}

/// The command's status as ours: its exit code, or 128+signal like a shell.
pub(crate) fn exit_code(status: i32) -> ExitCode {
    let code = if status < 0 { 128 + (-status).min(127) } else { status.min(255) };
    ExitCode::from(code as u8)
}

pub(crate) fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
