//! The `perf` source: counters from `perf_event_open(2)`, read through perf's mmap ring
//! (overflow mode) or with `read(2)` of each CPU's group (poll mode).
//!
//! Reference: perf_event_open(2); `include/uapi/linux/perf_event.h` (Linux 6.18);
//! `tools/perf/builtin-record.c` for the workload handling.
//!
//! For every recorded CPU the source opens one *group*: the first event is the leader, the
//! others are opened with `group_fd` = the leader, all with
//! `read_format = PERF_FORMAT_GROUP | PERF_FORMAT_ID` and `use_clockid`/`CLOCK_MONOTONIC`,
//! so sample times and poll times share one clock.
//!
//! - **Overflow mode** ([`Sampling::Period`], [`Sampling::Freq`]): the leader samples with
//!   `sample_type = IP | TID | TIME | ADDR | CPU | PERIOD | READ`; `READ` with `GROUP` puts
//!   every counter of the group into each sample ([`RawSample::raw`], leader first). Each
//!   leader has a ring of `1 + mmap_pages` pages. `PERF_RECORD_LOST`/`LOST_SAMPLES` are
//!   counted per CPU into [`Finish::lost`]; `PERF_RECORD_THROTTLE` is counted
//!   ([`PerfSource::stats`]) and reported as a note.
//! - **Call stacks** ([`Source::want_stacks`], for stack formats): the leader also samples
//!   `PERF_SAMPLE_CALLCHAIN` (with `exclude_callchain_kernel`/`_user` for the stacks not
//!   wanted) and `comm`, so `PERF_RECORD_COMM` names the tasks. Each callchain is split at
//!   its context markers (`PERF_CONTEXT_KERNEL`/`_USER`; other markers are skipped) into
//!   kernel and user frames, innermost first, kept in an arena per [`Source::next`] call
//!   and handed out by [`Source::stack`]. A task whose `COMM` was not seen is named from
//!   `/proc/<pid>/task/<tid>/comm` once (empty if it is gone). A callchain whose `nr`
//!   claims more entries than its record holds is cut to what it holds and counted in
//!   [`PerfCpuStats::bad_callchains`].
//! - **PEBS** ([`PerfConfig::pebs`], `--format pebs`): one hardware event sampled with
//!   `precise_ip` (3, then 2, then 1) and `IP | TID | TIME | CPU | ADDR | DATA_SRC |
//!   WEIGHT_STRUCT | PHYS_ADDR` (with fallbacks); every sample becomes a perf-sourced PEBS
//!   capture record in [`PerfSource::pebs`]. See the `pebs` module; run only against the
//!   syscall fake so far (no PEBS-capable PMU available).
//! - **Poll mode** ([`Sampling::Poll`]): no interrupts; every `interval_ns` (absolute
//!   deadlines on `CLOCK_MONOTONIC`, so no drift) each CPU's group is read with one
//!   `read(2)` and becomes one `SAMPLE_POLL` sample timed right after that read. When the
//!   workload ends (or after [`PerfSource::stop`]) one final read of every CPU makes the
//!   totals complete.
//!
//! Raw values are 64-bit counts, cumulative since the counters were enabled, *per CPU* in
//! every mode (what the engine expects of a counter):
//!
//! - poll samples and system-wide overflow samples: the kernel's count of the CPU's group
//!   (for [`Target::Command`] the command and all its descendants on that CPU, children
//!   folded in by the kernel's `inherit`);
//! - overflow samples of a [`Target::Command`]: with `inherit`, Linux 6.12+ puts the
//!   counts of the sampled *thread* on that CPU into each sample (commit 7e8b255650fc,
//!   "perf: Support PERF_SAMPLE_READ with inherit"; verified on 6.18: the values restart
//!   from zero for every new process). The source keeps the last values of each
//!   `(cpu, tid)` and adds each thread's increase to a per-CPU total, so `raw[]` is the
//!   per-CPU count of the whole command tree as seen at its samples. Older kernels reject
//!   `inherit` with `PERF_SAMPLE_READ` (`EINVAL`); the source then opens the counters
//!   without `inherit` (only the command's own process is counted, not the processes it
//!   starts) and says so in a note ([`PerfSource::notes`], [`PerfSource::inherits`]).
//!
//! Targets: [`Target::Command`] forks the command held on a pipe, opens its counters with
//! `enable_on_exec` (so nothing before its `execve` is counted) and lets it exec in
//! [`Source::start`]; counters follow its children (`inherit`). [`Target::SystemWide`]
//! (`-a`) and [`Target::Cpus`] (`-C`) count everything on those CPUs; with
//! [`PerfConfig::workload`] a command runs while they count and its end ends the recording
//! (perf's `perf record -a -- cmd` / `-C 0 -- cmd` semantics: system-wide on those CPUs,
//! not "the command on those CPUs").
//!
//! ```no_run
//! use std::time::Duration;
//! use hrperf::source::{Progress, Source};
//! use hrperf::source::perf::{parse_events, PerfConfig, PerfSource, Sampling, Target};
//!
//! let events = parse_events("cpu-clock,page-faults")?;
//! let cmd = Target::Command(vec!["ls".into(), "-l".into()]);
//! let mut src = PerfSource::new(PerfConfig::new(events, Sampling::Period(100_000), cmd))?;
//! src.start()?;
//! let mut samples = Vec::new();
//! while src.next(&mut samples, Duration::from_millis(100))? == Progress::Running {}
//! let finish = src.finish()?;
//! println!("{} samples, exit status {}", samples.len(), finish.exit_status);
//! # Ok::<(), hrperf::source::SourceError>(())
//! ```

mod events;
#[cfg(test)]
mod fake;
mod pebs;
mod ring;
mod sys;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::time::Duration;

use hrperf_abi::capture::{CLOCK_MONOTONIC, SOURCE_PERF};
use hrperf_abi::event::{EVENT_FL_KERNEL_ONLY, EVENT_FL_PRECISE, EVENT_FL_USER_ONLY};
use hrperf_abi::format::{CTRL_MASK, MODE_OVERFLOW, MODE_POLL, SAMPLE_OVERFLOW, SAMPLE_POLL};
use hrperf_abi::{MAX_COUNTERS, MAX_CPUS};

pub use events::{known_events, parse_events};
pub use self::pebs::{set_load_latency, PebsSettings, PerfPebs};

use self::events::needs_pmu;
pub use self::ring::{split_callchain, PERF_CONTEXT_KERNEL, PERF_CONTEXT_MAX, PERF_CONTEXT_USER};

use self::ring::{
    Ring, SampleLayout, MISC_CPUMODE_MASK, MISC_GUEST_KERNEL, MISC_KERNEL, PERF_RECORD_COMM,
    PERF_RECORD_LOST, PERF_RECORD_LOST_SAMPLES, PERF_RECORD_SAMPLE, PERF_RECORD_THROTTLE,
    PERF_RECORD_UNTHROTTLE,
};
use self::sys::{
    ChildExit, HeldChild, LinuxSys, PerfEventAttr, Sys, ATTR_COMM, ATTR_COMM_EXEC, ATTR_DISABLED,
    ATTR_ENABLE_ON_EXEC, ATTR_EXCLUDE_CALLCHAIN_KERNEL, ATTR_EXCLUDE_CALLCHAIN_USER,
    ATTR_EXCLUDE_HV, ATTR_EXCLUDE_KERNEL, ATTR_EXCLUDE_USER, ATTR_FREQ, ATTR_INHERIT,
    ATTR_PRECISE_IP_SHIFT, ATTR_USE_CLOCKID, ATTR_WATERMARK, IOC_DISABLE, IOC_ENABLE,
    IOC_FLAG_GROUP, PERF_ATTR_SIZE, PERF_FLAG_FD_CLOEXEC, PERF_FORMAT_GROUP, PERF_FORMAT_ID,
    PERF_SAMPLE_ADDR, PERF_SAMPLE_CALLCHAIN, PERF_SAMPLE_CPU, PERF_SAMPLE_IP, PERF_SAMPLE_PERIOD,
    PERF_SAMPLE_READ, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
};
use super::{EventSpec, Finish, Progress, RawSample, SampleStack, Source, SourceError, SourceInfo};

/// `sample_type` of the leader in overflow mode.
const SAMPLE_TYPE: u64 = PERF_SAMPLE_IP
    | PERF_SAMPLE_TID
    | PERF_SAMPLE_TIME
    | PERF_SAMPLE_ADDR
    | PERF_SAMPLE_CPU
    | PERF_SAMPLE_PERIOD
    | PERF_SAMPLE_READ;
/// `read_format` of every counter.
const READ_FORMAT: u64 = PERF_FORMAT_GROUP | PERF_FORMAT_ID;
/// How long [`Source::finish`] waits for a command after `SIGTERM` before `SIGKILL`.
const TERM_GRACE_NS: u64 = 1_000_000_000;
/// Longest single wait when the end of the command cannot be polled for (no pidfd).
const CHILD_CHECK_NS: u64 = 10_000_000;

/// How the counters produce samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sampling {
    /// Overflow mode: a sample every `n` events of the leader (`-c n`; ns for the clock
    /// events).
    Period(u64),
    /// Overflow mode: the kernel adapts the period to about `hz` samples per second
    /// (`-F hz`).
    Freq(u64),
    /// Poll mode: read every CPU's counters every `interval_ns` (`--poll-us`).
    Poll {
        /// Interval in ns.
        interval_ns: u64,
    },
}

impl Sampling {
    /// `hrperf_abi::format::MODE_*`.
    pub fn mode(&self) -> u32 {
        match self {
            Sampling::Period(_) | Sampling::Freq(_) => MODE_OVERFLOW,
            Sampling::Poll { .. } => MODE_POLL,
        }
    }
}

/// What is counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Run this command (`argv`, looked up in `$PATH`) and count it and its descendants on
    /// every online CPU; recording ends when it exits.
    Command(Vec<String>),
    /// Everything on every online CPU (`-a`).
    SystemWide,
    /// Everything on these CPUs (`-C 0,2-3`).
    Cpus(Vec<u32>),
}

/// Configuration of a [`PerfSource`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfConfig {
    /// The counters, leader first (at most [`MAX_COUNTERS`]); see [`parse_events`].
    pub events: Vec<EventSpec>,
    /// Overflow (period or frequency) or poll.
    pub sampling: Sampling,
    /// What is counted.
    pub target: Target,
    /// With [`Target::SystemWide`]/[`Target::Cpus`]: a command run while counting; its
    /// end ends the recording. Must be `None` with [`Target::Command`].
    pub workload: Option<Vec<String>>,
    /// Data pages of each CPU's ring (overflow mode), a power of two.
    pub mmap_pages: usize,
    /// PEBS through perf (`--format pebs`): one hardware event sampled with
    /// `precise_ip` and the memory fields, each sample synthesised into a PEBS capture
    /// record ([`PerfSource::pebs`]; see the `pebs` module docs). Overflow mode only.
    pub pebs: bool,
}

impl PerfConfig {
    /// Default [`PerfConfig::mmap_pages`]: 64 pages (256 KiB) per CPU.
    pub const DEFAULT_MMAP_PAGES: usize = 64;

    /// A configuration with no workload and the default ring size.
    pub fn new(events: Vec<EventSpec>, sampling: Sampling, target: Target) -> PerfConfig {
        PerfConfig {
            events,
            sampling,
            target,
            workload: None,
            mmap_pages: Self::DEFAULT_MMAP_PAGES,
            pebs: false,
        }
    }

    /// The configuration for `hrperf record`'s `-a`, `-C LIST` and `-- CMD...`: `-C` wins
    /// over `-a`; without either, the command is the target; with one, the command (if
    /// any) is the workload. Neither CPUs nor a command is a [`SourceError::Config`].
    pub fn from_cli(
        events: Vec<EventSpec>,
        sampling: Sampling,
        system_wide: bool,
        cpus: Option<Vec<u32>>,
        command: Vec<String>,
    ) -> Result<PerfConfig, SourceError> {
        let command = (!command.is_empty()).then_some(command);
        let (target, workload) = match (cpus, system_wide, command) {
            (Some(c), _, w) => (Target::Cpus(c), w),
            (None, true, w) => (Target::SystemWide, w),
            (None, false, Some(cmd)) => (Target::Command(cmd), None),
            (None, false, None) => {
                return Err(SourceError::Config(
                    "nothing to record: give a command (-- CMD ...), -a or -C CPUS".into(),
                ))
            }
        };
        Ok(PerfConfig {
            workload,
            ..PerfConfig::new(events, sampling, target)
        })
    }
}

/// Parses a CPU list such as `0-3,8,10-11` (`-C`, `/sys/devices/system/cpu/online`) into
/// sorted, distinct CPU numbers below [`MAX_CPUS`].
pub fn parse_cpu_list(list: &str) -> Result<Vec<u32>, SourceError> {
    let bad = |why: &str| SourceError::Config(format!("bad CPU list '{}': {why}", list.trim()));
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(bad("empty entry"));
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u32 = lo
            .parse()
            .map_err(|_| bad(&format!("'{part}' is not a number or range")))?;
        let hi: u32 = hi
            .parse()
            .map_err(|_| bad(&format!("'{part}' is not a number or range")))?;
        if lo > hi {
            return Err(bad(&format!("range '{part}' is backwards")));
        }
        if hi as usize >= MAX_CPUS {
            return Err(bad(&format!(
                "CPU {hi} is beyond the {MAX_CPUS} hrperf supports"
            )));
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Per-CPU counts of what the ring reported, for `hrperf record`'s summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfCpuStats {
    /// The CPU.
    pub cpu: u32,
    /// Samples delivered (overflow records, or poll reads).
    pub samples: u64,
    /// Samples the kernel lost (`PERF_RECORD_LOST`/`LOST_SAMPLES`), plus any still in the
    /// ring when [`Source::finish`] was called without a final drain.
    pub lost: u64,
    /// `PERF_RECORD_THROTTLE`s: the kernel lowered the rate (`perf_event_max_sample_rate`).
    pub throttles: u64,
    /// `PERF_RECORD_UNTHROTTLE`s.
    pub unthrottles: u64,
    /// Ring bytes skipped because a record header was impossible (never seen in practice).
    pub corrupt_bytes: u64,
    /// Samples whose callchain claimed more entries than the record holds (the stack
    /// was cut to what it holds; the sample was kept).
    pub bad_callchains: u64,
}

/// `comm` length of a task (`TASK_COMM_LEN`).
const COMM_LEN: usize = 16;

/// Where one sample's stacks lie in a [`StackBatch`].
#[derive(Clone, Copy, Debug)]
struct StackSpan {
    kernel: (usize, usize),
    user: (usize, usize),
    comm: [u8; COMM_LEN],
}

/// The stacks of the samples one [`Source::next`] call appended, in order.
#[derive(Debug, Default)]
struct StackBatch {
    kernel: Vec<u64>,
    user: Vec<u64>,
    spans: Vec<StackSpan>,
}

impl StackBatch {
    fn clear(&mut self) {
        self.kernel.clear();
        self.user.clear();
        self.spans.clear();
    }
}

/// One CPU's group.
#[derive(Debug)]
struct Group {
    cpu: u32,
    /// Leader first.
    fds: Vec<i32>,
    /// `PERF_EVENT_IOC_ID` of each fd.
    ids: Vec<u64>,
    /// Overflow mode: the leader's ring.
    ring: Option<Ring>,
    stats: PerfCpuStats,
    masked: bool,
    /// The leader's fd reported `POLLHUP`/`POLLERR` (task gone); not polled any more.
    hup: bool,
    /// Overflow samples of a task target: last per-thread values seen, by tid.
    threads: HashMap<u32, [u64; MAX_COUNTERS]>,
    /// Overflow samples of a task target: per-CPU totals built from them.
    totals: [u64; MAX_COUNTERS],
}

impl Group {
    /// Index in the group of the counter with `id`.
    fn index_of(&self, id: u64) -> Option<usize> {
        self.ids.iter().position(|&i| i == id)
    }
}

/// The recorded command.
#[derive(Debug)]
enum Child {
    None,
    /// Forked, waiting on the go pipe.
    Held(HeldChild),
    /// Exec'd; `pidfd` if the kernel has `pidfd_open`.
    Running {
        pid: i32,
        pidfd: Option<i32>,
    },
    Exited(ChildExit),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Created,
    Running,
    /// [`PerfSource::stop`] was called: the next `next` drains and finishes.
    Stopping,
    /// Drained; `next` returns `Finished`.
    Drained,
    /// [`Source::finish`] ran.
    Closed,
}

/// The perf_event_open source. See the [module documentation](self).
///
/// `Send`: it can be moved to a recording thread.
pub struct PerfSource {
    sys: Box<dyn Sys>,
    info: SourceInfo,
    sampling: Sampling,
    groups: Vec<Group>,
    layout: SampleLayout,
    child: Child,
    /// The command line, for messages.
    cmd_text: String,
    /// pid reported in poll samples (the command's, or 0 system-wide).
    target_pid: u32,
    /// The command's (or workload's) pid once forked.
    child_pid: Option<u32>,
    /// Whether the counters follow children.
    inherit: bool,
    phase: Phase,
    next_poll_ns: u64,
    missed_polls: u64,
    notes: Vec<String>,
    read_buf: Vec<u8>,
    /// The configuration, to reopen the counters when stacks are asked for.
    config: PerfConfig,
    /// `(kernel, user)` call stacks asked for by [`Source::want_stacks`].
    stacks: Option<(bool, bool)>,
    /// Stacks of the last `next` call's samples.
    batch: StackBatch,
    /// Command names by tid, from `PERF_RECORD_COMM` (or `/proc` once).
    comms: HashMap<u32, [u8; COMM_LEN]>,
    /// PEBS through perf: the synthesised capture records (`PerfConfig::pebs`).
    pebs: Option<PerfPebs>,
}

impl std::fmt::Debug for PerfSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerfSource")
            .field("info", &self.info)
            .field("groups", &self.groups)
            .field("child", &self.child)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

/// What a command needs to be exec'd, built before `fork`.
struct Exec {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

fn c_string(s: &[u8], what: &str) -> Result<CString, SourceError> {
    CString::new(s).map_err(|_| SourceError::Config(format!("{what} contains a NUL byte")))
}

impl PerfSource {
    /// Validates `config`, opens (and, in overflow mode, maps) every counter and, for a
    /// command, forks it held before `execve`; [`Source::start`] lets it run.
    pub fn new(config: PerfConfig) -> Result<PerfSource, SourceError> {
        Self::with_sys(config, Box::new(LinuxSys))
    }

    fn with_sys(config: PerfConfig, sys: Box<dyn Sys>) -> Result<PerfSource, SourceError> {
        validate(&config)?;
        let online = sys
            .read_file("/sys/devices/system/cpu/online")
            .map_err(|source| SourceError::Syscall {
                call: "read(/sys/devices/system/cpu/online)".into(),
                source,
            })
            .and_then(|s| parse_cpu_list(&s))?;
        let cpus = match &config.target {
            Target::Command(_) | Target::SystemWide => online.clone(),
            Target::Cpus(list) => {
                let mut list = list.clone();
                list.sort_unstable();
                list.dedup();
                if let Some(c) = list.iter().find(|c| !online.contains(c)) {
                    return Err(SourceError::Config(format!(
                        "CPU {c} is not online (online: {})",
                        cpu_list_text(&online)
                    )));
                }
                list
            }
        };
        let command = match (&config.target, &config.workload) {
            (Target::Command(c), _) => Some(c.clone()),
            (_, w) => w.clone(),
        };
        let (sample_period, poll_interval_ns) = match config.sampling {
            Sampling::Period(p) => (p, 0),
            Sampling::Freq(_) => (0, 0),
            Sampling::Poll { interval_ns } => (0, interval_ns),
        };
        let n = config.events.len();
        let start = sys.now_ns();
        let info = SourceInfo {
            source: SOURCE_PERF,
            clock: CLOCK_MONOTONIC,
            tsc_hz: 0,
            mode: config.sampling.mode(),
            sample_period,
            poll_interval_ns,
            events: config.events.clone(),
            widths: vec![64; n],
            max_rates: vec![0; n],
            cpus: cpus.clone(),
            cpu_model: cpu_model(&*sys),
            start_time_ns: start,
        };
        let mut src = PerfSource {
            sys,
            info,
            sampling: config.sampling.clone(),
            groups: Vec::new(),
            layout: SampleLayout::new(SAMPLE_TYPE, READ_FORMAT),
            child: Child::None,
            cmd_text: command.as_ref().map(|c| c.join(" ")).unwrap_or_default(),
            target_pid: 0,
            child_pid: None,
            inherit: matches!(config.target, Target::Command(_)),
            phase: Phase::Created,
            next_poll_ns: 0,
            missed_polls: 0,
            notes: Vec::new(),
            read_buf: vec![0; 8 + 16 * n],
            config: config.clone(),
            stacks: None,
            batch: StackBatch::default(),
            comms: HashMap::new(),
            pebs: config.pebs.then(PerfPebs::default),
        };
        // On any error below, Drop closes what was opened and disposes of the held child.
        if let Some(cmd) = &command {
            let exec = src.prepare_exec(cmd)?;
            let child = src
                .sys
                .spawn_held(&exec.path, &exec.argv, &exec.envp)
                .map_err(|source| SourceError::Command {
                    cmd: src.cmd_text.clone(),
                    source,
                })?;
            src.child_pid = Some(child.pid as u32);
            if matches!(config.target, Target::Command(_)) {
                src.target_pid = child.pid as u32;
            }
            src.child = Child::Held(child);
        }
        let pid = if src.target_pid != 0 {
            src.target_pid as i32
        } else {
            -1
        };
        for &cpu in &cpus {
            src.open_group(&config, pid, cpu)?;
        }
        Ok(src)
    }

    fn prepare_exec(&self, cmd: &[String]) -> Result<Exec, SourceError> {
        use std::os::unix::ffi::OsStrExt;
        let path = self
            .sys
            .find_program(&cmd[0])
            .map_err(|source| SourceError::Command {
                cmd: self.cmd_text.clone(),
                source,
            })?;
        let argv = cmd
            .iter()
            .map(|a| c_string(a.as_bytes(), "a command argument"))
            .collect::<Result<_, _>>()?;
        let envp = std::env::vars_os()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                c_string(&kv, "an environment variable")
            })
            .collect::<Result<_, _>>()?;
        Ok(Exec { path, argv, envp })
    }

    /// The attr of event `index` of a group.
    fn attr(&self, config: &PerfConfig, index: usize, task: bool) -> PerfEventAttr {
        let desc = &config.events[index].desc;
        let mut a = PerfEventAttr {
            kind: desc.kind,
            size: PERF_ATTR_SIZE,
            config: desc.config,
            config1: desc.config1,
            config2: desc.config2,
            read_format: READ_FORMAT,
            flags: ATTR_USE_CLOCKID,
            clockid: libc::CLOCK_MONOTONIC,
            ..PerfEventAttr::default()
        };
        if desc.flags & EVENT_FL_USER_ONLY != 0 {
            a.flags |= ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV;
        }
        if desc.flags & EVENT_FL_KERNEL_ONLY != 0 {
            a.flags |= ATTR_EXCLUDE_USER;
        }
        if desc.flags & EVENT_FL_PRECISE != 0 {
            a.flags |= u64::from((desc.flags >> 8) & 3) << ATTR_PRECISE_IP_SHIFT;
        }
        if task && self.inherit {
            a.flags |= ATTR_INHERIT;
        }
        if index == 0 {
            // Only the leader is enabled/disabled; members follow it.
            a.flags |= ATTR_DISABLED;
            if task {
                a.flags |= ATTR_ENABLE_ON_EXEC;
            }
            match config.sampling {
                Sampling::Period(p) => a.sample_period_or_freq = p,
                Sampling::Freq(hz) => {
                    a.sample_period_or_freq = hz;
                    a.flags |= ATTR_FREQ;
                }
                Sampling::Poll { .. } => {}
            }
            if config.sampling.mode() == MODE_OVERFLOW {
                a.sample_type = SAMPLE_TYPE;
                if let Some((kernel, user)) = self.stacks {
                    a.sample_type |= PERF_SAMPLE_CALLCHAIN;
                    a.flags |= ATTR_COMM | ATTR_COMM_EXEC;
                    if !kernel {
                        a.flags |= ATTR_EXCLUDE_CALLCHAIN_KERNEL;
                    }
                    if !user {
                        a.flags |= ATTR_EXCLUDE_CALLCHAIN_USER;
                    }
                }
                // Wake poll() when a quarter of the ring is full; next() also drains on
                // every call, so small timeouts still see samples promptly.
                a.flags |= ATTR_WATERMARK;
                a.wakeup = (config.mmap_pages * self.sys.page_size() / 4) as u32;
            }
        }
        a
    }

    fn open_group(&mut self, config: &PerfConfig, pid: i32, cpu: u32) -> Result<(), SourceError> {
        let task = pid != -1;
        let mut group = Group {
            cpu,
            fds: Vec::new(),
            ids: Vec::new(),
            ring: None,
            stats: PerfCpuStats {
                cpu,
                ..PerfCpuStats::default()
            },
            masked: false,
            hup: false,
            threads: HashMap::new(),
            totals: [0; MAX_COUNTERS],
        };
        let result = self.open_group_into(config, pid, cpu, task, &mut group);
        // Keep what was opened even on error: Drop releases it.
        self.groups.push(group);
        result
    }

    fn open_group_into(
        &mut self,
        config: &PerfConfig,
        pid: i32,
        cpu: u32,
        task: bool,
        group: &mut Group,
    ) -> Result<(), SourceError> {
        for (index, ev) in config.events.iter().enumerate() {
            let group_fd = group.fds.first().copied().unwrap_or(-1);
            let mut attr = self.attr(config, index, task);
            if index == 0 && self.pebs.is_some() {
                // PEBS: precise_ip and sample_type fallbacks (see the pebs module docs).
                let fd = self.open_pebs_leader(&attr, pid, cpu, ev)?;
                group.fds.push(fd);
                let id = self
                    .sys
                    .event_id(fd)
                    .map_err(|source| SourceError::Syscall {
                        call: format!("ioctl(PERF_EVENT_IOC_ID, {}, cpu {cpu})", ev.name),
                        source,
                    })?;
                group.ids.push(id);
                continue;
            }
            let mut res =
                self.sys
                    .perf_event_open(&attr, pid, cpu as i32, group_fd, PERF_FLAG_FD_CLOEXEC);
            if let Err(e) = &res {
                if e.raw_os_error() == Some(libc::EINVAL)
                    && attr.flags & ATTR_INHERIT != 0
                    && attr.sample_type & PERF_SAMPLE_READ != 0
                    && self.groups.is_empty()
                {
                    // Kernels before 6.12 reject inherit + PERF_SAMPLE_READ. Retry once
                    // without inherit; if that works, every later counter goes without it.
                    attr.flags &= !ATTR_INHERIT;
                    let retry = self.sys.perf_event_open(
                        &attr,
                        pid,
                        cpu as i32,
                        group_fd,
                        PERF_FLAG_FD_CLOEXEC,
                    );
                    if retry.is_ok() {
                        self.inherit = false;
                        self.note(format!(
                            "this kernel rejects inherit with PERF_SAMPLE_READ (EINVAL); counting \
                             only '{}' itself, not the processes it starts (Linux 6.12+ counts them)",
                            self.cmd_text
                        ));
                    }
                    res = retry;
                }
            }
            let fd = res.map_err(|e| self.open_error(e, ev, cpu))?;
            group.fds.push(fd);
            let id = self
                .sys
                .event_id(fd)
                .map_err(|source| SourceError::Syscall {
                    call: format!("ioctl(PERF_EVENT_IOC_ID, {}, cpu {cpu})", ev.name),
                    source,
                })?;
            group.ids.push(id);
        }
        if config.sampling.mode() == MODE_OVERFLOW {
            let page = self.sys.page_size();
            let len = (1 + config.mmap_pages) * page;
            let ev = &config.events[0].name;
            let ptr = self.sys.mmap(group.fds[0], len).map_err(|e| {
                let call = format!("mmap({ev} ring, cpu {cpu}, {} pages)", config.mmap_pages);
                match e.raw_os_error() {
                    Some(libc::EPERM) | Some(libc::EACCES) => SourceError::Permission(format!(
                        "{call}: {e}; the ring exceeds the locked-memory limit for perf \
                         (/proc/sys/kernel/perf_event_mlock_kb, RLIMIT_MEMLOCK): use fewer \
                         mmap pages or raise the limit"
                    )),
                    _ => SourceError::Syscall { call, source: e },
                }
            })?;
            // SAFETY: `ptr` is a fresh perf mapping of `len` bytes (page aligned) that is
            // unmapped only in Drop, after the Ring is gone; only this Ring writes data_tail.
            let ring = unsafe { Ring::new(ptr, len, page) };
            let Some(ring) = ring else {
                // SAFETY: the mapping was just created and nothing else refers to it.
                unsafe { self.sys.munmap(ptr, len) };
                return Err(SourceError::Syscall {
                    call: format!("mmap({ev} ring, cpu {cpu})"),
                    source: io::Error::other(
                        "the kernel's ring header has an impossible data_offset/data_size",
                    ),
                });
            };
            group.ring = Some(ring);
        }
        Ok(())
    }

    fn open_error(&self, e: io::Error, ev: &EventSpec, cpu: u32) -> SourceError {
        let call = format!("perf_event_open({}, cpu {cpu})", ev.name);
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => {
                let paranoid = self
                    .sys
                    .read_file("/proc/sys/kernel/perf_event_paranoid")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "unreadable".into());
                SourceError::Permission(format!(
                    "{call}: {e}; /proc/sys/kernel/perf_event_paranoid is {paranoid}: run as root \
                     or with CAP_PERFMON, lower it (sysctl kernel.perf_event_paranoid=1), or count \
                     user space only (e.g. {}:u)",
                    ev.name.split(':').next().unwrap_or(&ev.name)
                ))
            }
            Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV)
                if needs_pmu(&ev.desc) =>
            {
                let devices = self.sys.list_dir("/sys/bus/event_source/devices");
                let core = ["cpu", "cpu_core", "cpu_atom"];
                let has_core = devices.as_ref().is_ok_and(|d| {
                    d.iter().any(|n| {
                        core.contains(&n.as_str()) || n.starts_with("armv") || n.starts_with("arm_")
                    })
                });
                let errno = if e.raw_os_error() == Some(libc::ENOENT) {
                    "ENOENT"
                } else if e.raw_os_error() == Some(libc::ENODEV) {
                    "ENODEV"
                } else {
                    "EOPNOTSUPP"
                };
                if has_core {
                    SourceError::Syscall {
                        call,
                        source: io::Error::new(
                            e.kind(),
                            format!("the CPU's PMU does not support this event ({errno})"),
                        ),
                    }
                } else {
                    let found = match devices {
                        Ok(d) if !d.is_empty() => d.join(", "),
                        Ok(_) => "nothing".into(),
                        Err(err) => format!("unreadable: {err}"),
                    };
                    SourceError::NoPmu {
                        event: ev.name.clone(),
                        detail: format!(
                            "perf_event_open on cpu {cpu} returned {errno}; \
                             /sys/bus/event_source/devices has {found} but no cpu, cpu_core or cpu_atom"
                        ),
                    }
                }
            }
            _ => SourceError::Syscall { call, source: e },
        }
    }

    /// Records a note found while opening (the caller shows [`PerfSource::notes`]).
    fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Records a note found while recording and prints it to stderr at once: a caller that
    /// holds the source as a `dyn Source` cannot ask for it.
    fn runtime_note(&mut self, note: String) {
        eprintln!("hrperf: perf source: {note}");
        self.notes.push(note);
    }

    /// Notes for the user: fallbacks taken while opening (for the caller to print) and
    /// what was seen while recording (throttling; those are also printed to stderr when
    /// they happen).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Whether the counters follow the command's children (`inherit`); `false` after the
    /// pre-6.12 fallback and for system-wide targets.
    pub fn inherits(&self) -> bool {
        self.inherit
    }

    /// The pid of the recorded command (or workload) once forked, also after it exited.
    pub fn child_pid(&self) -> Option<u32> {
        self.child_pid
    }

    /// User + system CPU time (ns) of the recorded command and its reaped descendants,
    /// once it has exited (from `wait4`'s rusage).
    pub fn child_cpu_time_ns(&self) -> Option<u64> {
        match &self.child {
            Child::Exited(e) => Some(e.cpu_time_ns),
            _ => None,
        }
    }

    /// Per-CPU counts so far.
    pub fn stats(&self) -> Vec<PerfCpuStats> {
        self.groups.iter().map(|g| g.stats).collect()
    }

    /// Poll deadlines skipped because the caller came back too late (poll mode).
    pub fn missed_polls(&self) -> u64 {
        self.missed_polls
    }

    /// Stops counting: the next [`Source::next`] drains what is left (poll mode: one final
    /// read of every CPU) and returns [`Progress::Finished`]. For a system-wide target
    /// this is how a recording ends (Ctrl-C, `--duration`); a command still running is
    /// left alone until [`Source::finish`]. Calling it twice is harmless.
    pub fn stop(&mut self) -> Result<(), SourceError> {
        if self.phase == Phase::Running {
            self.set_enabled(false)?;
            self.phase = Phase::Stopping;
        }
        Ok(())
    }

    /// Re-enables CPUs masked by a format's `CTRL_MASK` (all of them with `None`), as
    /// perfmon2's `pfm_restart`.
    pub fn restart(&mut self, cpu: Option<u32>) -> Result<(), SourceError> {
        for i in 0..self.groups.len() {
            let g = &self.groups[i];
            if g.masked && !matches!(cpu, Some(c) if c != g.cpu) {
                self.group_ioctl(i, IOC_ENABLE)?;
                self.groups[i].masked = false;
            }
        }
        Ok(())
    }

    fn group_ioctl(&self, i: usize, request: u64) -> Result<(), SourceError> {
        let g = &self.groups[i];
        self.sys
            .ioctl(g.fds[0], request, IOC_FLAG_GROUP)
            .map_err(|source| SourceError::Syscall {
                call: format!(
                    "ioctl(PERF_EVENT_IOC_{}, {} group, cpu {})",
                    if request == IOC_ENABLE {
                        "ENABLE"
                    } else {
                        "DISABLE"
                    },
                    self.info.events[0].name,
                    g.cpu
                ),
                source,
            })
    }

    fn set_enabled(&mut self, on: bool) -> Result<(), SourceError> {
        for i in 0..self.groups.len() {
            if on && self.groups[i].masked {
                continue;
            }
            self.group_ioctl(i, if on { IOC_ENABLE } else { IOC_DISABLE })?;
        }
        Ok(())
    }

    /// At the end of a system-wide recording whose workload exited: stop counting before
    /// the final read/drain. (Task counters stopped with their task; after
    /// [`PerfSource::stop`] everything is already disabled.)
    fn end_counting(&mut self) -> Result<(), SourceError> {
        if self.phase == Phase::Running && self.target_pid == 0 {
            self.set_enabled(false)?;
        }
        Ok(())
    }

    /// Checks (without blocking) whether the command has exited; reaps it if so.
    fn child_exited(&mut self) -> Result<bool, SourceError> {
        let Child::Running { pid, pidfd } = self.child else {
            return Ok(matches!(self.child, Child::Exited(_)));
        };
        let exit = self
            .sys
            .wait_child(pid, true)
            .map_err(|source| SourceError::Syscall {
                call: format!("wait4({pid})"),
                source,
            })?;
        match exit {
            Some(e) => {
                if let Some(fd) = pidfd {
                    self.sys.close(fd);
                }
                self.child = Child::Exited(e);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn has_running_child(&self) -> bool {
        matches!(self.child, Child::Running { .. })
    }

    fn pidfd(&self) -> Option<i32> {
        match self.child {
            Child::Running { pidfd, .. } => pidfd,
            _ => None,
        }
    }

    /// Drains every ring into `out`.
    fn drain_all(&mut self, out: &mut Vec<RawSample>) {
        if self.pebs.is_some() {
            self.drain_pebs(out);
            return;
        }
        let nr = self.info.events.len();
        let layout = self.layout;
        let stacks = self.stacks.is_some();
        let (batch, comms, sys) = (&mut self.batch, &mut self.comms, &self.sys);
        // Task targets get per-thread values in samples (see the module docs).
        let per_thread = self.target_pid != 0;
        for g in &mut self.groups {
            let Some(ring) = &g.ring else {
                continue;
            };
            let ids = &g.ids;
            let stats = &mut g.stats;
            let (threads, totals) = (&mut g.threads, &mut g.totals);
            let drained = ring.drain(|rec| {
                let Some((kind, _, _)) = rec.header() else {
                    return;
                };
                match kind {
                    PERF_RECORD_SAMPLE => match layout.parse(&rec) {
                        Some(s) => {
                            let mut raw = [0u64; MAX_COUNTERS];
                            for i in 0..s.nr.min(nr) {
                                let at = ids.iter().position(|&id| id == s.ids[i]).unwrap_or(i);
                                if at < MAX_COUNTERS {
                                    raw[at] = s.values[i];
                                }
                            }
                            if per_thread {
                                let last = threads.entry(s.tid).or_insert([0; MAX_COUNTERS]);
                                for i in 0..nr {
                                    // Lower than before: a new thread that reuses the tid.
                                    let delta = raw[i].checked_sub(last[i]).unwrap_or(raw[i]);
                                    last[i] = raw[i];
                                    totals[i] = totals[i].wrapping_add(delta);
                                    raw[i] = totals[i];
                                }
                            }
                            let mode = s.misc & MISC_CPUMODE_MASK;
                            if stacks {
                                let (k0, u0) = (batch.kernel.len(), batch.user.len());
                                s.callchain_into(&rec, &mut batch.kernel, &mut batch.user);
                                stats.bad_callchains += u64::from(s.chain_cut);
                                let comm = *comms
                                    .entry(s.tid)
                                    .or_insert_with(|| proc_comm(&**sys, s.pid, s.tid));
                                batch.spans.push(StackSpan {
                                    kernel: (k0, batch.kernel.len()),
                                    user: (u0, batch.user.len()),
                                    comm,
                                });
                            }
                            out.push(RawSample {
                                cpu: s.cpu,
                                kind: SAMPLE_OVERFLOW,
                                pid: s.pid,
                                tid: s.tid,
                                time_ns: s.time,
                                ip: s.ip,
                                kernel_ip: mode == MISC_KERNEL || mode == MISC_GUEST_KERNEL,
                                addr: s.addr,
                                ovfl_counter: 0,
                                nr: nr as u32,
                                raw,
                            });
                            stats.samples += 1;
                        }
                        None => stats.corrupt_bytes += rec.len() as u64,
                    },
                    PERF_RECORD_LOST => stats.lost += rec.u64_at(16).unwrap_or(0),
                    PERF_RECORD_LOST_SAMPLES => stats.lost += rec.u64_at(8).unwrap_or(0),
                    PERF_RECORD_COMM => {
                        if let Some(tid) = rec.u32_at(12) {
                            let mut comm = [0u8; COMM_LEN];
                            for (i, c) in comm.iter_mut().enumerate() {
                                match rec.bytes_at::<1>(16 + i) {
                                    Some([b]) if b != 0 => *c = b,
                                    _ => break,
                                }
                            }
                            comms.insert(tid, comm);
                        }
                    }
                    PERF_RECORD_THROTTLE => stats.throttles += 1,
                    PERF_RECORD_UNTHROTTLE => stats.unthrottles += 1,
                    _ => {}
                }
            });
            stats.corrupt_bytes += drained.corrupt_bytes;
        }
    }

    /// Counts what is still in the rings as lost (finish without a final drain).
    fn discard_rings(&mut self) {
        for g in &mut self.groups {
            let Some(ring) = &g.ring else {
                continue;
            };
            let stats = &mut g.stats;
            ring.drain(|rec| match rec.header().map(|h| h.0) {
                Some(PERF_RECORD_SAMPLE) => stats.lost += 1,
                Some(PERF_RECORD_LOST) => stats.lost += rec.u64_at(16).unwrap_or(0),
                Some(PERF_RECORD_LOST_SAMPLES) => stats.lost += rec.u64_at(8).unwrap_or(0),
                _ => {}
            });
        }
    }

    /// Reads every (unmasked) CPU's group into poll samples.
    fn read_all(&mut self, out: &mut Vec<RawSample>) -> Result<(), SourceError> {
        let nr = self.info.events.len();
        for gi in 0..self.groups.len() {
            if self.groups[gi].masked {
                continue;
            }
            let fd = self.groups[gi].fds[0];
            let n =
                self.sys
                    .read(fd, &mut self.read_buf)
                    .map_err(|source| SourceError::Syscall {
                        call: format!(
                            "read({} group, cpu {})",
                            self.info.events[0].name, self.groups[gi].cpu
                        ),
                        source,
                    })?;
            let time_ns = self.sys.now_ns();
            let g = &mut self.groups[gi];
            let word = |i: usize| -> Option<u64> {
                let b = self.read_buf.get(i * 8..i * 8 + 8)?;
                Some(u64::from_ne_bytes(b.try_into().ok()?))
            };
            let got = word(0).filter(|&k| (k as usize) <= MAX_COUNTERS && 8 + 16 * k as usize <= n);
            let Some(got) = got else {
                return Err(SourceError::Syscall {
                    call: format!("read({} group, cpu {})", self.info.events[0].name, g.cpu),
                    source: io::Error::other(format!("short or malformed group read ({n} bytes)")),
                });
            };
            let mut raw = [0u64; MAX_COUNTERS];
            for i in 0..got as usize {
                let (value, id) = (word(1 + 2 * i).unwrap_or(0), word(2 + 2 * i).unwrap_or(0));
                let at = g.index_of(id).unwrap_or(i);
                if at < MAX_COUNTERS {
                    raw[at] = value;
                }
            }
            out.push(RawSample {
                cpu: g.cpu,
                kind: SAMPLE_POLL,
                pid: self.target_pid,
                tid: self.target_pid,
                time_ns,
                ip: 0,
                kernel_ip: false,
                addr: 0,
                ovfl_counter: u32::MAX,
                nr: nr as u32,
                raw,
            });
            g.stats.samples += 1;
        }
        Ok(())
    }

    /// Waits until `until_ns`, returning early if the command exits (when that can be
    /// polled for). Sub-ms precision comes from `clock_nanosleep(TIMER_ABSTIME)`.
    fn wait_until(&mut self, until_ns: u64) -> Result<(), SourceError> {
        let now = self.sys.now_ns();
        if until_ns <= now {
            return Ok(());
        }
        if self.has_running_child() {
            match self.pidfd() {
                Some(fd) if until_ns - now > 2_000_000 => {
                    let mut p = [libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    }];
                    let ms = ((until_ns - now) / 1_000_000 - 1).min(i32::MAX as u64) as i32;
                    self.poll(&mut p, ms)?;
                    if p[0].revents != 0 {
                        return Ok(());
                    }
                }
                Some(_) => {}
                None => {
                    self.sys.sleep_until_ns(until_ns.min(now + CHILD_CHECK_NS));
                    return Ok(());
                }
            }
        }
        self.sys.sleep_until_ns(until_ns);
        Ok(())
    }

    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, SourceError> {
        self.sys
            .poll(fds, timeout_ms)
            .map_err(|source| SourceError::Syscall {
                call: "poll(perf fds)".into(),
                source,
            })
    }

    fn next_poll(
        &mut self,
        out: &mut Vec<RawSample>,
        timeout: Duration,
    ) -> Result<Progress, SourceError> {
        let interval = self.info.poll_interval_ns;
        let until = self
            .sys
            .now_ns()
            .saturating_add(timeout.as_nanos().min(u64::MAX as u128) as u64);
        loop {
            if self.phase == Phase::Stopping || self.child_exited()? {
                self.end_counting()?;
                self.read_all(out)?;
                self.phase = Phase::Drained;
                return Ok(Progress::Finished);
            }
            let now = self.sys.now_ns();
            if now >= self.next_poll_ns {
                self.read_all(out)?;
                // Absolute deadlines: start + k * interval. If we are late by whole
                // intervals, skip them (and count them) instead of bursting.
                self.next_poll_ns += interval;
                if self.next_poll_ns <= now {
                    let missed = (now - self.next_poll_ns) / interval + 1;
                    self.missed_polls += missed;
                    self.next_poll_ns += missed * interval;
                }
                return Ok(Progress::Running);
            }
            if now >= until {
                return Ok(Progress::Running);
            }
            self.wait_until(self.next_poll_ns.min(until))?;
        }
    }

    fn next_overflow(
        &mut self,
        out: &mut Vec<RawSample>,
        timeout: Duration,
    ) -> Result<Progress, SourceError> {
        let until = self
            .sys
            .now_ns()
            .saturating_add(timeout.as_nanos().min(u64::MAX as u128) as u64);
        loop {
            let before = out.len();
            self.drain_all(out);
            if self.phase == Phase::Stopping || self.child_exited()? {
                self.end_counting()?;
                // Whatever the kernel wrote before the end is in the rings now.
                self.drain_all(out);
                self.phase = Phase::Drained;
                self.report_throttling();
                return Ok(Progress::Finished);
            }
            let now = self.sys.now_ns();
            if out.len() > before || now >= until {
                return Ok(Progress::Running);
            }
            let mut wait_ns = until - now;
            let mut fds: Vec<libc::pollfd> = self
                .groups
                .iter()
                .filter(|g| !g.hup)
                .map(|g| libc::pollfd {
                    fd: g.fds[0],
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            match self.pidfd() {
                Some(fd) => fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }),
                None if self.has_running_child() => wait_ns = wait_ns.min(CHILD_CHECK_NS),
                None => {}
            }
            let ms = wait_ns.div_ceil(1_000_000).min(i32::MAX as u64) as i32;
            self.poll(&mut fds, ms)?;
            for p in &fds {
                if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    if let Some(g) = self.groups.iter_mut().find(|g| g.fds[0] == p.fd) {
                        g.hup = true;
                    }
                }
            }
        }
    }

    fn report_throttling(&mut self) {
        let throttled: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.stats.throttles > 0)
            .map(|g| format!("cpu {}: {}x", g.cpu, g.stats.throttles))
            .collect();
        if !throttled.is_empty() {
            self.runtime_note(format!(
                "the kernel throttled sampling ({}); samples are missing while throttled — use \
                 a longer period or raise /proc/sys/kernel/perf_event_max_sample_rate",
                throttled.join(", ")
            ));
        }
    }

    /// Reaps the command, terminating it first if it still runs.
    fn reap_child(&mut self) -> Result<i32, SourceError> {
        match std::mem::replace(&mut self.child, Child::None) {
            Child::None => Ok(0),
            Child::Exited(e) => {
                self.child = Child::Exited(e);
                Ok(e.status)
            }
            Child::Held(h) => {
                // Never started: it must not run. Closing the go pipe makes it _exit(127),
                // but another thread's held child may hold a copy of the pipe, so kill too.
                self.sys.close(h.go_fd);
                self.sys.close(h.err_fd);
                let _ = self.sys.kill(h.pid, libc::SIGKILL);
                let e = self.wait_blocking(h.pid)?;
                self.child = Child::Exited(e);
                Ok(0)
            }
            Child::Running { pid, pidfd } => {
                self.child = Child::Running { pid, pidfd };
                if !self.child_exited()? {
                    let _ = self.sys.kill(pid, libc::SIGTERM);
                    let deadline = self.sys.now_ns() + TERM_GRACE_NS;
                    while !self.child_exited()? {
                        if self.sys.now_ns() >= deadline {
                            let _ = self.sys.kill(pid, libc::SIGKILL);
                            let e = self.wait_blocking(pid)?;
                            if let Some(fd) = pidfd {
                                self.sys.close(fd);
                            }
                            self.child = Child::Exited(e);
                            break;
                        }
                        let t = self.sys.now_ns() + 5_000_000;
                        self.sys.sleep_until_ns(t);
                    }
                }
                match self.child {
                    Child::Exited(e) => Ok(e.status),
                    _ => Ok(0),
                }
            }
        }
    }

    fn wait_blocking(&self, pid: i32) -> Result<ChildExit, SourceError> {
        self.sys
            .wait_child(pid, false)
            .map_err(|source| SourceError::Syscall {
                call: format!("wait4({pid})"),
                source,
            })?
            .ok_or_else(|| SourceError::Syscall {
                call: format!("wait4({pid})"),
                source: io::Error::other("blocking wait returned no status"),
            })
    }
}

fn validate(c: &PerfConfig) -> Result<(), SourceError> {
    let bad = |m: String| Err(SourceError::Config(m));
    if c.events.is_empty() {
        return bad("no events given (try -e cpu-clock)".into());
    }
    if c.events.len() > MAX_COUNTERS {
        return bad(format!(
            "too many events: at most {MAX_COUNTERS}, got {}",
            c.events.len()
        ));
    }
    match c.sampling {
        Sampling::Period(0) => return bad("the sampling period must be at least 1".into()),
        Sampling::Freq(0) => return bad("the sampling frequency must be at least 1 Hz".into()),
        Sampling::Poll { interval_ns: 0 } => {
            return bad("the poll interval must be at least 1 ns".into())
        }
        _ => {}
    }
    if c.pebs {
        pebs::validate_pebs(&c.events, c.sampling.mode() == MODE_OVERFLOW)?;
    }
    if c.sampling.mode() == MODE_OVERFLOW
        && (!c.mmap_pages.is_power_of_two() || c.mmap_pages > 1 << 20)
    {
        return bad(format!(
            "mmap pages must be a power of two (1, 2, 4, ...), got {}",
            c.mmap_pages
        ));
    }
    match (&c.target, &c.workload) {
        (Target::Command(cmd), None) if cmd.is_empty() || cmd[0].is_empty() => {
            bad("empty command".into())
        }
        (Target::Command(_), Some(_)) => bad(
            "a workload command goes with a system-wide or CPU-list target, not a command target"
                .into(),
        ),
        (_, Some(w)) if w.is_empty() || w[0].is_empty() => bad("empty workload command".into()),
        (Target::Cpus(list), _) if list.is_empty() => bad("empty CPU list".into()),
        _ => Ok(()),
    }
}

fn cpu_list_text(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `/proc/cpuinfo`'s first "model name", else "unknown".
fn cpu_model(sys: &dyn Sys) -> String {
    sys.read_file("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
        })
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

impl Source for PerfSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn start(&mut self) -> Result<(), SourceError> {
        if self.phase != Phase::Created {
            return Err(SourceError::Config(
                "the perf source was already started".into(),
            ));
        }
        let now = self.sys.now_ns();
        self.info.start_time_ns = now;
        self.next_poll_ns = now + self.info.poll_interval_ns;
        let task = self.target_pid != 0;
        if !task {
            // System-wide: enable before the workload (if any) runs.
            self.set_enabled(true)?;
        }
        if let Child::Held(h) = std::mem::replace(&mut self.child, Child::None) {
            // Command target: its counters enable themselves at execve (enable_on_exec).
            let released = self.sys.release_child(&h);
            self.sys.close(h.go_fd);
            self.sys.close(h.err_fd);
            if let Err(source) = released {
                let exit = self.wait_blocking(h.pid)?;
                self.child = Child::Exited(exit);
                self.phase = Phase::Drained;
                return Err(SourceError::Command {
                    cmd: self.cmd_text.clone(),
                    source,
                });
            }
            let pidfd = self.sys.pidfd_open(h.pid).ok();
            self.child = Child::Running { pid: h.pid, pidfd };
        }
        self.phase = Phase::Running;
        Ok(())
    }

    /// Appends samples; returns [`Progress::Finished`] (with the last samples appended in
    /// the same call) once the command has exited or [`PerfSource::stop`] was called, and
    /// everything is drained.
    fn next(
        &mut self,
        out: &mut Vec<RawSample>,
        timeout: Duration,
    ) -> Result<Progress, SourceError> {
        self.batch.clear();
        match self.phase {
            Phase::Created => Err(SourceError::Config("next() before start()".into())),
            Phase::Drained | Phase::Closed => Ok(Progress::Finished),
            Phase::Running | Phase::Stopping => match self.sampling {
                Sampling::Poll { .. } => self.next_poll(out, timeout),
                _ => self.next_overflow(out, timeout),
            },
        }
    }

    fn has_stacks(&self) -> bool {
        true
    }

    /// Reopens the counters so that the leader samples `PERF_SAMPLE_CALLCHAIN` (kernel
    /// and/or user frames) and reports `COMM`s. Only before [`Source::start`], and only in
    /// overflow mode; asking for neither stack changes nothing.
    fn want_stacks(&mut self, kernel: bool, user: bool) -> Result<(), SourceError> {
        if self.phase != Phase::Created {
            return Err(SourceError::Config(
                "call stacks must be asked for before the perf source starts".into(),
            ));
        }
        if !kernel && !user {
            return Ok(());
        }
        if self.sampling.mode() != MODE_OVERFLOW {
            return Err(SourceError::Config(
                "call stacks need overflow sampling (-c PERIOD or -F FREQ), not poll mode".into(),
            ));
        }
        if self.stacks == Some((kernel, user)) {
            return Ok(());
        }
        self.stacks = Some((kernel, user));
        self.layout = SampleLayout::new(SAMPLE_TYPE | PERF_SAMPLE_CALLCHAIN, READ_FORMAT);
        self.close_groups();
        let pid = if self.target_pid != 0 {
            self.target_pid as i32
        } else {
            -1
        };
        let config = self.config.clone();
        for &cpu in &self.info.cpus.clone() {
            self.open_group(&config, pid, cpu)?;
        }
        Ok(())
    }

    fn stack(&self, index: usize) -> Option<SampleStack<'_>> {
        let span = self.batch.spans.get(index)?;
        Some(SampleStack {
            kernel: self.batch.kernel.get(span.kernel.0..span.kernel.1)?,
            user: self.batch.user.get(span.user.0..span.user.1)?,
            comm: hrperf_abi::name_bytes(&span.comm),
        })
    }

    /// `CTRL_MASK` disables that CPU's group until [`PerfSource::restart`];
    /// `CTRL_RESET` is ignored (perf re-arms the period itself).
    fn control(&mut self, cpu: u32, ctrl: u32) {
        if ctrl & CTRL_MASK == 0 {
            return;
        }
        if let Some(i) = self.groups.iter().position(|g| g.cpu == cpu && !g.masked) {
            if self.group_ioctl(i, IOC_DISABLE).is_ok() {
                self.groups[i].masked = true;
            }
        }
    }

    /// Disables the counters, reaps the command (`SIGTERM`, then `SIGKILL` after 1 s, if
    /// it still runs) and reports how it ended. Call it after [`Source::next`] returned
    /// [`Progress::Finished`]; samples still in a ring otherwise are counted in
    /// [`Finish::lost`], never dropped silently.
    fn stop(&mut self) -> Result<(), SourceError> {
        PerfSource::stop(self)
    }

    fn finish(&mut self) -> Result<Finish, SourceError> {
        if self.phase == Phase::Closed {
            return Err(SourceError::Config("finish() called twice".into()));
        }
        if matches!(self.phase, Phase::Running) {
            self.set_enabled(false)?;
        }
        if matches!(self.phase, Phase::Running | Phase::Stopping) {
            self.discard_rings();
        }
        let exit_status = self.reap_child()?;
        self.phase = Phase::Closed;
        Ok(Finish {
            exit_status,
            end_time_ns: self.sys.now_ns(),
            lost: self.groups.iter().map(|g| (g.cpu, g.stats.lost)).collect(),
        })
    }
}

/// A task's command name from `/proc` (empty if it cannot be read).
fn proc_comm(sys: &dyn Sys, pid: u32, tid: u32) -> [u8; COMM_LEN] {
    let mut comm = [0u8; COMM_LEN];
    if let Ok(text) = sys.read_file(&format!("/proc/{pid}/task/{tid}/comm")) {
        let name = text.trim_end_matches('\n').as_bytes();
        let n = name.len().min(COMM_LEN - 1);
        comm[..n].copy_from_slice(&name[..n]);
    }
    comm
}

impl PerfSource {
    /// Unmaps every ring and closes every counter.
    fn close_groups(&mut self) {
        for g in self.groups.drain(..) {
            if let Some(ring) = g.ring {
                let (ptr, len) = ring.mapping();
                // SAFETY: `ptr`/`len` are this group's mapping; its Ring was consumed by
                // `mapping()`, so nothing uses the mapping any more.
                unsafe { self.sys.munmap(ptr, len) };
            }
            for fd in g.fds {
                self.sys.close(fd);
            }
        }
    }
}

impl Drop for PerfSource {
    fn drop(&mut self) {
        self.close_groups();
        match std::mem::replace(&mut self.child, Child::None) {
            Child::Held(h) => {
                self.sys.close(h.go_fd);
                self.sys.close(h.err_fd);
                let _ = self.sys.kill(h.pid, libc::SIGKILL);
                let _ = self.sys.wait_child(h.pid, false);
            }
            Child::Running { pid, pidfd } => {
                // Dropped without finish(): do not leave the command running or a zombie.
                let _ = self.sys.kill(pid, libc::SIGKILL);
                let _ = self.sys.wait_child(pid, false);
                if let Some(fd) = pidfd {
                    self.sys.close(fd);
                }
            }
            Child::None | Child::Exited(_) => {}
        }
    }
}

const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<PerfSource>();
};
