//! Sources of samples: each turns its counters into [`RawSample`]s that the engine
//! virtualises and hands to the session's format.
//!
//! A source reports raw counter readings as its hardware shows them (`width` bits each,
//! see [`SourceInfo::widths`]); the engine makes them 64-bit and detects multi-wraps.

use std::io;
use std::time::Duration;

use hrperf_abi::{EventDesc, MAX_COUNTERS};

mod child;
pub mod kmod;
pub mod perf;
pub mod sim;

/// One overflow, poll reading or instructed reading, before the engine: the engine's
/// [`hrperf_engine::Sample`], which the kernel module's handlers build too.
pub use hrperf_engine::Sample as RawSample;

/// A named event with its encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// Name as the user wrote it, e.g. `cpu-clock`.
    pub name: String,
    /// Encoding.
    pub desc: EventDesc,
}

/// The call stacks a source captured with one sample (for stack formats, which get them
/// through the engine's [`hrperf_abi::Services`] as they would from hrperf-core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleStack<'a> {
    /// Kernel frames, innermost first (the first is the IP of a kernel sample).
    pub kernel: &'a [u64],
    /// User frames, innermost first (the first is the user IP).
    pub user: &'a [u64],
    /// The task's command name, if the source knows it (empty otherwise).
    pub comm: &'a [u8],
}

/// Text a source gathered for symbolizing its stacks later, written to the capture as a
/// `CHUNK_SYMBOLS` (see `hrperf_abi::capture::SYM_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolText {
    /// `hrperf_abi::capture::SYM_*`.
    pub kind: u32,
    /// Process the text belongs to (0: none / every process).
    pub pid: u32,
    /// The text.
    pub text: Vec<u8>,
}

/// What a source tells the recorder before the first sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceInfo {
    /// `hrperf_abi::capture::SOURCE_*`.
    pub source: u32,
    /// `hrperf_abi::capture::CLOCK_*` of `RawSample::time_ns`.
    pub clock: u32,
    /// TSC frequency if known, else 0.
    pub tsc_hz: u64,
    /// `hrperf_abi::format::MODE_*`.
    pub mode: u32,
    /// Sampling period of the leader (overflow mode), else 0.
    pub sample_period: u64,
    /// Poll interval (poll mode), else 0.
    pub poll_interval_ns: u64,
    /// The counters, leader first.
    pub events: Vec<EventSpec>,
    /// Width in bits (32..=64) of each counter's raw reading.
    pub widths: Vec<u8>,
    /// Upper bound on each counter's events per second (for multi-wrap detection);
    /// 0 means unknown (then only a backwards reading can reveal a wrap).
    pub max_rates: Vec<u64>,
    /// CPUs that produce samples.
    pub cpus: Vec<u32>,
    /// CPU model string.
    pub cpu_model: String,
    /// Clock value at start.
    pub start_time_ns: u64,
}

/// What one call to [`Source::next`] produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Samples were appended (possibly none if the timeout passed).
    Running,
    /// The workload ended (or the sim ran its course); the source has been drained.
    Finished,
}

/// How a source ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finish {
    /// Exit status of the recorded command (`-signal` if killed by one), 0 if none.
    pub exit_status: i32,
    /// Clock value at the end.
    pub end_time_ns: u64,
    /// Samples the source itself lost before hrperf saw them (e.g. perf's
    /// `PERF_RECORD_LOST`), per CPU: `(cpu, lost)`.
    pub lost: Vec<(u32, u64)>,
}

/// Errors of every source; each names what failed and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// The call, e.g. `perf_event_open(cpu-clock, cpu 0)`.
        call: String,
        /// The OS error.
        source: io::Error,
    },
    /// A hardware event was asked for on a machine without a hardware PMU.
    #[error("event '{event}' needs a hardware PMU, and this machine has none ({detail}); use software events (cpu-clock, task-clock, page-faults, context-switches, cpu-migrations) or --source sim")]
    NoPmu {
        /// The event.
        event: String,
        /// What was found instead.
        detail: String,
    },
    /// The event name is not known to this source.
    #[error("unknown event '{name}' for the {source_name} source; known events: {known}")]
    UnknownEvent {
        /// The name given.
        name: String,
        /// The source.
        source_name: &'static str,
        /// Comma-separated list of known names.
        known: String,
    },
    /// The configuration cannot be honoured.
    #[error("{0}")]
    Config(String),
    /// The command to record could not be started.
    #[error("cannot run '{cmd}': {source}")]
    Command {
        /// The command.
        cmd: String,
        /// The OS error.
        source: io::Error,
    },
    /// Not allowed (perf_event_paranoid, device permissions).
    #[error("permission denied: {0}")]
    Permission(String),
}

/// A source of samples.
pub trait Source {
    /// What the source measures; valid from construction.
    fn info(&self) -> &SourceInfo;
    /// Starts counting (and the workload, if the source runs one).
    fn start(&mut self) -> Result<(), SourceError>;
    /// Appends samples to `out`, waiting up to `timeout` for some.
    fn next(&mut self, out: &mut Vec<RawSample>, timeout: Duration) -> Result<Progress, SourceError>;
    /// Applies the format's control bits (`CTRL_RESET`, `CTRL_MASK`) for `cpu` after a
    /// sample was dispatched. Sources whose hardware re-arms itself ignore `CTRL_RESET`.
    fn control(&mut self, cpu: u32, ctrl: u32);
    /// The counter write the last [`control`](Self::control) did on `cpu` (re-arming the
    /// overflowed counter after `CTRL_RESET`): `(counter index, raw value written)`, so
    /// the engine virtualises from the new value. Sources whose kernel re-arms and
    /// virtualises by itself (perf) write nothing.
    fn written(&mut self, _cpu: u32) -> Option<(usize, u64)> {
        None
    }
    /// Raw readings of `cpu`'s counters when counting starts (what the engine's 64-bit
    /// values start from). perf counters start at zero.
    fn start_values(&self, _cpu: u32) -> [u64; MAX_COUNTERS] {
        [0; MAX_COUNTERS]
    }
    /// Whether the source can deliver call stacks with its samples ([`Source::stack`]);
    /// it is told before `start` with [`Source::want_stacks`].
    fn has_stacks(&self) -> bool {
        false
    }
    /// Asks for call stacks with every overflow sample (a stack format is recorded).
    /// Called before [`start`](Self::start); sources without stacks ignore it.
    fn want_stacks(&mut self, _kernel: bool, _user: bool) -> Result<(), SourceError> {
        Ok(())
    }
    /// The stacks captured with sample `index` of the samples the last
    /// [`next`](Self::next) call appended (0 = the first it appended); `None` if the
    /// source has none for it.
    fn stack(&self, _index: usize) -> Option<SampleStack<'_>> {
        None
    }
    /// Symbol text the source itself knows (the simulator's kernel and program symbol
    /// tables); the recorder adds `/proc` snapshots for real sources.
    fn symbols(&self) -> Vec<SymbolText> {
        Vec::new()
    }
    /// Asks the source to stop early (Ctrl-C, `--duration`): counting stops, and the
    /// following [`next`](Self::next) calls deliver what is still buffered (and a final
    /// reading in poll mode) and then return [`Progress::Finished`].
    fn stop(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
    /// Stops counting, reaps the workload and reports how it ended.
    fn finish(&mut self) -> Result<Finish, SourceError>;
}
