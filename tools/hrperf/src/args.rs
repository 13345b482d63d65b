//! Command-line grammar (clap derive). Each subcommand's arguments are converted to
//! library configuration types before any work starts.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// hrperf — a pluggable sampling-format profiler for Linux performance counters.
#[derive(Debug, Parser)]
#[command(
    name = "hrperf",
    version,
    about = "hrperf — microsecond counter time series, overflow sampling and pluggable sampling formats for Linux performance counters",
    after_help = "EXAMPLES:\n  hrperf record -e cpu-clock,task-clock,page-faults --poll-us 1000 -- ./app\n  hrperf decode --output csv > samples.csv\n  hrperf info\n  hrperf formats\n  hrperf status                          # the kernel module and its formats\n  hrperf start --poll-us 100; hrperf pause; hrperf start; hrperf stop\n\nSources: kmod (/dev/hrperf, when hrperf-core.ko is loaded), perf (perf_event_open,\nthe default otherwise) and sim (a deterministic simulated PMU, no hardware needed)."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record counters of a command, of CPUs, or of the simulated PMU into a capture file.
    #[command(after_help = RECORD_EXAMPLES)]
    Record(RecordArgs),
    /// Decode a capture file through its format's decoder plugin.
    #[command(after_help = DECODE_EXAMPLES)]
    Decode(DecodeArgs),
    /// Show a capture file's header, events, CPUs, record and drop counts.
    #[command(after_help = "EXAMPLES:\n  hrperf info\n  hrperf info -i run1.data")]
    Info(InfoArgs),
    /// List the decoder plugins found (name, UUID, version, path).
    #[command(after_help = "EXAMPLES:\n  hrperf formats\n  HRPERF_PLUGIN_PATH=/opt/myfmt hrperf formats\n\nPlugins (libhrperf_decode_*.so) are searched next to the hrperf binary, in each\ndirectory of $HRPERF_PLUGIN_PATH, and in <prefix>/lib/hrperf/plugins.")]
    Formats,
    /// Show the kernel module: version, default mode, poll interval, registered formats
    /// with their users, open sessions, drops; and the `hrperf start` session, if any.
    #[command(after_help = STATUS_EXAMPLES)]
    Status(CtlArgs),
    /// Start a session that outlives this command (a daemon records it to a file), or
    /// resume a paused one.
    #[command(after_help = START_EXAMPLES)]
    Start(StartArgs),
    /// Pause the `hrperf start` session (counters stop; the file stays open).
    #[command(after_help = CTL_EXAMPLES)]
    Pause(CtlArgs),
    /// Instructed mode: every CPU reads its counters now (one record each).
    #[command(after_help = CTL_EXAMPLES)]
    Poll(CtlArgs),
    /// Instructed mode: wake the recorder to collect what `poll` recorded.
    #[command(after_help = CTL_EXAMPLES)]
    Log(CtlArgs),
    /// Instructed mode: `poll` and `log` in one call.
    #[command(name = "poll-log", after_help = CTL_EXAMPLES)]
    PollLog(CtlArgs),
    /// Finish the `hrperf start` session: last records, statistics, end of file; the
    /// session is destroyed.
    #[command(after_help = CTL_EXAMPLES)]
    Stop(CtlArgs),
    /// Profile a capture: for PEBS, memory accesses by level, page size, cache line,
    /// page and IP, and a latency histogram; for aggregate, the top keys by count or
    /// counter sum and a per-interval time series; for llc-stack, functions by inclusive
    /// and self weight, callers/callees, folded stacks and flame graphs.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Import call stacks from a perf.data file (perf record -g) or from stap /
    /// stack-count text into an llc-stack capture for `hrperf report`.
    #[command(after_help = IMPORT_EXAMPLES)]
    Import(ImportArgs),
}

const IMPORT_EXAMPLES: &str = "EXAMPLES:
  perf record -g -F 999 -o app.perf.data -- ./app
  hrperf import app.perf.data -o app.data
  hrperf report -i app.data
  # stack-count text (stap, perf scripts): frames joined by '!', then a count
  stap -e '...print(sprint_backtrace()...' > stacks.txt
  hrperf import --stap stacks.txt -o stacks.data
  hrperf import --stap stacks.txt --root-first --skip-bad -o stacks.data

perf.data: every sample becomes one stack record weighted by its period (1 if the file
has none), its callchain split into kernel and user frames at perf's context markers
(a sample without a callchain stands for its IP); MMAP/MMAP2 records become per-process
maps and COMMs name the tasks; kernel frames are resolved with this machine's
/proc/kallsyms (as perf report does), so import on the machine that recorded.
Compressed files (perf record -z) are not supported: re-record without -z.

stap text: one stack per line, innermost frame first (--root-first for the other
order); frames like 'vfs_read+0x5/0x90', 'sym [module]' or
'0xffffffff81234567 : sym+0x5/0x90 [kernel]' stand for the function. Stap stacks are
not split into kernel and user parts: every frame is stored as a kernel frame, with a
synthetic address that the capture's symbol table maps back to the name. Blank lines
and '#' comments are skipped; a malformed line stops the import at that line (what came
before is kept) unless --skip-bad.

Counts (samples, stacks, skipped records by kind) are printed on stderr at the end;
damage in the input is one error line naming the file offset or line, exit status 2.";

/// `hrperf import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// perf.data file to import [default: perf.data].
    #[arg(value_name = "PERF_DATA", conflicts_with = "stap")]
    pub perf_data: Option<PathBuf>,
    /// Import stack-count text: frames joined by '!', whitespace, a count, per line.
    #[arg(long, value_name = "FILE")]
    pub stap: Option<PathBuf>,
    /// Output capture file.
    #[arg(short, long, default_value = "hrperf.data")]
    pub output: PathBuf,
    /// stap: frames are listed outermost (root) first.
    #[arg(long, requires = "stap")]
    pub root_first: bool,
    /// stap: count and skip malformed lines instead of stopping at the first.
    #[arg(long, requires = "stap")]
    pub skip_bad: bool,
    /// perf.data: kernel symbols to store [default: /proc/kallsyms].
    #[arg(long, value_name = "FILE", conflicts_with = "stap")]
    pub kallsyms: Option<PathBuf>,
    /// perf.data: store no kernel symbols.
    #[arg(long, conflicts_with_all = ["stap", "kallsyms"])]
    pub no_kallsyms: bool,
    /// No progress line.
    #[arg(short, long)]
    pub quiet: bool,
}

const REPORT_EXAMPLES: &str = "EXAMPLES:
  hrperf record --source sim --format pebs -o pebs.data
  hrperf report --format pebs -i pebs.data
  hrperf report --format pebs -i pebs.data --top 20
  hrperf record --source sim --format aggregate -c 5000 --agg-interval-ms 10 -o agg.data
  hrperf report -i agg.data                          # the capture's format: aggregate
  hrperf report --format aggregate -i agg.data --top 20 --by sum
  hrperf report --format aggregate -i agg.data --time-series
  hrperf record --format llc-stack -c 100000 -o stacks.data -- ./app
  hrperf report stacks.data                          # top 20 functions, inclusive and self
  hrperf report stacks.data --sort self --top 40 --user-only
  hrperf report stacks.data --callers memcpy         # who calls memcpy, and how much
  hrperf report stacks.data --folded > app.folded    # for flamegraph.pl / inferno / speedscope
  hrperf report stacks.data --flamegraph app.svg --folded-comm
  hrperf report stacks.data --samples --json

llc-stack reports symbolize with the kallsyms and /proc/PID/maps captured at record time
and the ELF files mapped then (still on disk here); what cannot be resolved shows as
[unknown]. Weights are the samples' periods (perf's percentages); --samples counts records.

Page sizes (4K / 2M / 1G) are known where the capture says which address ranges are
backed by which pages (captures of the simulated PMU do); elsewhere they show as unknown
and pages are counted in 4 KiB granules.";

/// `hrperf report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Capture file.
    #[arg(short, long, default_value = "hrperf.data")]
    pub input: PathBuf,
    /// Capture file (instead of -i).
    #[arg(value_name = "CAPTURE", conflicts_with = "input")]
    pub capture: Option<PathBuf>,
    /// Report kind: pebs, aggregate or llc-stack [default: the capture's format].
    #[arg(long, value_name = "NAME")]
    pub format: Option<String>,
    /// Rows in the top tables (pebs: hottest lines, pages and IPs; aggregate: top keys;
    /// llc-stack: functions) [default: 10; llc-stack: 20].
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Aggregate: rank the top keys by samples (count) or by the counter's sum.
    #[arg(long, value_enum, value_name = "RANK")]
    pub by: Option<ReportBy>,
    /// Aggregate: also print one row per interval per CPU: start, end, samples, distinct
    /// keys, other, misses, counter sum.
    #[arg(long)]
    pub time_series: bool,
    /// llc-stack: order functions by inclusive weight (the function or its callees
    /// running) or self weight (the function running) [default: inclusive].
    #[arg(long, value_enum, value_name = "WEIGHT")]
    pub sort: Option<StackSort>,
    /// llc-stack: the callers of function FUNC (those directly above it in its stacks).
    #[arg(long, value_name = "FUNC")]
    pub callers: Option<String>,
    /// llc-stack: the callees of function FUNC (those directly below it).
    #[arg(long, value_name = "FUNC")]
    pub callees: Option<String>,
    /// llc-stack: print folded stacks (`root;...;leaf weight`, sorted) instead of a table.
    #[arg(long)]
    pub folded: bool,
    /// llc-stack: start each folded stack (and flame-graph tower) with the command name.
    #[arg(long)]
    pub folded_comm: bool,
    /// llc-stack: also write an SVG flame graph to FILE.
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
    /// llc-stack: keep only the kernel frames of each stack.
    #[arg(long, conflicts_with = "user_only")]
    pub kernel_only: bool,
    /// llc-stack: keep only the user frames of each stack.
    #[arg(long)]
    pub user_only: bool,
    /// llc-stack: weigh each record as 1 instead of its weight (sample period).
    #[arg(long)]
    pub samples: bool,
    /// llc-stack: print the table (or callers/callees) as one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl ReportArgs {
    /// The first llc-stack-only option given, for the error when another format's
    /// report is asked for.
    pub fn stack_option(&self) -> Option<&'static str> {
        [
            (self.sort.is_some(), "--sort"),
            (self.callers.is_some(), "--callers"),
            (self.callees.is_some(), "--callees"),
            (self.folded, "--folded"),
            (self.folded_comm, "--folded-comm"),
            (self.flamegraph.is_some(), "--flamegraph"),
            (self.kernel_only, "--kernel-only"),
            (self.user_only, "--user-only"),
            (self.samples, "--samples"),
            (self.json, "--json"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }
}

/// Function order of `hrperf report` on an llc-stack capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StackSort {
    /// Weight of the stacks holding the function (perf report --children).
    Inclusive,
    /// Weight of the stacks it is the leaf of (perf report --no-children).
    #[value(name = "self")]
    SelfWeight,
}

/// Ranking of `hrperf report --format aggregate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportBy {
    /// Samples per key.
    Count,
    /// Counter sum per key.
    Sum,
}

const STATUS_EXAMPLES: &str = "EXAMPLES:
  hrperf status
  HRPERF_SOCKET=/run/hrperf/lab.sock hrperf status

Needs hrperf-core.ko (insmod hrperf-core.ko); /dev/hrperf is root-only unless the module
was loaded with dev_mode= and dev_gid=.";

const START_EXAMPLES: &str = "EXAMPLES:
  # hiresperf-style: poll every CPU each 100 us until `hrperf stop`:
  hrperf start -e cpu-clock,context-switches --poll-us 100 -o poll.data
  hrperf pause; hrperf start          # pause and resume the same session
  hrperf stop                         # finish poll.data
  # instructed mode, regions marked by a program (libhrperf.so: hrperf_poll_log())
  # or from the shell:
  hrperf start --instructed -e cpu-clock,page-faults -o regions.data
  hrperf poll-log; ./phase1; hrperf poll-log; ./phase2; hrperf poll-log
  hrperf stop && hrperf decode -i regions.data
  # create paused, so the program's hrperf_start()/hrperf_pause() bracket its work:
  hrperf start --instructed --paused && ./app && hrperf stop

The session lives in a small daemon that holds /dev/hrperf, writes the capture file and
listens on a UNIX socket ($HRPERF_SOCKET, else $XDG_RUNTIME_DIR/hrperf/ctl.sock, else
/tmp/hrperf-<uid>/ctl.sock; its directory must be private, mode 0700). Programs linked
with libhrperf.so get the session's descriptor from it and call the ioctls directly.
Without a mode option the module's default (mode=) is used. Daemon messages go to
<socket>.log. With a session running, `hrperf start` without session options resumes it.";

const CTL_EXAMPLES: &str = "EXAMPLES:
  hrperf start --instructed -o run.data
  hrperf poll-log                     # one record per CPU: counts since the last one
  hrperf poll; hrperf log             # the same in two steps
  hrperf pause; hrperf start          # pause and resume
  hrperf stop                         # finish run.data
  hrperf --help                       # all subcommands

These talk to the session `hrperf start` made ($HRPERF_SOCKET or --socket). poll, log
and poll-log need an instructed-mode session that is running.";

/// Options of the commands that talk to an `hrperf start` session.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Control socket of the session [default: $HRPERF_SOCKET, else
    /// $XDG_RUNTIME_DIR/hrperf/ctl.sock, else /tmp/hrperf-UID/ctl.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// `hrperf start`.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// Sampling format (a registered fmt-NAME.ko) [default: delta].
    #[arg(long)]
    pub format: Option<String>,
    /// Events, comma-separated, the sampling leader first [default: cpu-clock,task-clock,page-faults].
    #[arg(short = 'e', long = "event", value_name = "EVENT,...")]
    pub events: Option<String>,
    /// Overflow mode: one sample every PERIOD events of the leader.
    #[arg(short = 'c', long, value_name = "PERIOD", conflicts_with_all = ["poll_us", "instructed"])]
    pub period: Option<u64>,
    /// Poll mode: every CPU reads its counters every N µs (10..=10000000).
    #[arg(long, value_name = "N", conflicts_with_all = ["period", "instructed"])]
    pub poll_us: Option<u64>,
    /// Instructed mode: counters are read only on `hrperf poll`/`poll-log` or a
    /// program's hrperf_poll()/hrperf_poll_log().
    #[arg(long, conflicts_with_all = ["period", "poll_us"])]
    pub instructed: bool,
    /// These CPUs only, e.g. 0-3,6 [default: all online CPUs].
    #[arg(short = 'C', long = "cpu", value_name = "CPUS")]
    pub cpus: Option<String>,
    /// Output file [default: hrperf.data].
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Per-CPU buffer data area, bytes (k/m suffixes) [default: the format's].
    #[arg(long, value_name = "BYTES")]
    pub buffer_size: Option<String>,
    /// Create the session paused (start it with `hrperf start` or hrperf_start()).
    #[arg(long)]
    pub paused: bool,
    /// Control socket [default: $HRPERF_SOCKET, else $XDG_RUNTIME_DIR/hrperf/ctl.sock,
    /// else /tmp/hrperf-UID/ctl.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl StartArgs {
    /// Whether any option describes a new session (as opposed to resuming one).
    pub fn has_session_options(&self) -> bool {
        self.format.is_some()
            || self.events.is_some()
            || self.period.is_some()
            || self.poll_us.is_some()
            || self.instructed
            || self.cpus.is_some()
            || self.output.is_some()
            || self.buffer_size.is_some()
            || self.paused
    }
}

const RECORD_EXAMPLES: &str = "EXAMPLES:
  # 1 ms counter time series of a command, per CPU (perf source):
  hrperf record -e cpu-clock,task-clock,page-faults --poll-us 1000 -- ./app arg1
  # overflow sampling: a record every 100 µs of cpu-clock, with the interrupted IP:
  hrperf record -e cpu-clock,page-faults -c 100000 -- ./app
  # all CPUs for 5 seconds, 100 µs polls:
  hrperf record -a --duration 5s --poll-us 100 -o system.data
  # the kernel module (auto-chosen when /dev/hrperf exists), overflow every 100 µs:
  hrperf record --source kmod -e cpu-clock,page-faults -c 100000 -- ./app
  # kmod, instructed: the program marks its regions with hrperf_poll_log():
  hrperf record --source kmod --instructed -e cpu-clock,page-faults -- ./app
  # the simulated PMU: 4 CPUs, 40-bit counters, reproducible for a seed:
  hrperf record --source sim -e cycles,instructions,llc-misses --sim-cpus 4 --counter-width 40 --seed 7 --duration 200ms
  # zero-copy PEBS on the simulated PMU (adaptive records with memory info and GPRs):
  hrperf record --source sim --format pebs -e loads -c 10000 --pebs-format adaptive --pebs-data-cfg meminfo+gpr
  # in-buffer aggregation (double-buffered hash tables), 10 ms intervals, by (pid, IP):
  hrperf record --source sim --format aggregate -c 5000 --agg-key pid-ip --agg-interval-ms 10
  hrperf record --format aggregate -e cpu-clock -c 100000 --agg-slots 1024 -- ./app
  hrperf report --format aggregate --top 20 --by sum --time-series
  # call stacks (kernel + user) per overflow; then the symbolized report:
  hrperf record --format llc-stack -e cpu-clock -F 999 -- ./app
  hrperf record --source kmod --format llc-stack -e cpu-clock -c 200000 --kernel-depth 32 -- ./app
  hrperf record --source sim --format llc-stack --workload steady --duration 20ms
  # stacks aggregated in the buffer, then folded:
  hrperf record --format aggregate --agg-key stack -e cpu-clock -c 100000 -- ./app
  # PEBS through perf's precise sampling (needs a PEBS-capable PMU):
  hrperf record --source perf --format pebs -e cycles -c 10000 -- ./app
  # zero-copy PEBS in the kernel (insmod fmt-pebs.ko): the CPU's PEBS, a raw or generic
  # hardware event; `hrperf status` says whether the module can use PEBS and why not:
  hrperf record --source kmod --format pebs -e r01cd -c 20000 --pebs-ld-lat 30 -- ./app
  # the kernel's simulated PEBS PMU (insmod hrperf-core.ko pebs_sim=adaptive):
  hrperf record --source kmod --format pebs --pebs-data-cfg meminfo+gpr -- ./app

The live line on stderr shows records written and drops; drops are never silent: they
are counted per CPU in the capture and shown by `hrperf info` and `hrperf decode`.
With --source kmod, hrperf-core.ko counts per CPU (all activity on the monitored CPUs
while the command runs, like perf's -a) and the command inherits the session (HRPERF_FD)
for libhrperf.so's hrperf_poll_log()/hrperf_pause(). Without -c/--poll-us/--instructed the
module's default mode (mode=) is used.
Exit status: the recorded command's, or 2 for a usage or setup error.";

const DECODE_EXAMPLES: &str = "EXAMPLES:
  hrperf decode                          # hrperf.data as an aligned table
  hrperf decode --output jsonl | head
  hrperf decode -i run.data --output csv > run.csv
  duckdb -c \"SELECT cpu, sum(\\\"cpu-clock\\\") FROM read_csv_auto('run.csv') GROUP BY cpu\"
  hrperf decode --format delta -i other.data   # force a decoder";

/// Where samples come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    /// kmod if /dev/hrperf exists, else perf.
    Auto,
    /// The simulated PMU.
    Sim,
    /// perf_event_open.
    Perf,
    /// /dev/hrperf (hrperf-core.ko).
    Kmod,
}

/// The simulated workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// Seeded phases (compute, memory, branchy, syscall, idle) with noise.
    Phases,
    /// Constant rates, exactly predictable counts.
    Steady,
}

/// `hrperf record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Sample source.
    #[arg(long, value_enum, default_value_t = SourceKind::Auto)]
    pub source: SourceKind,
    /// Sampling format (kernel side: a fmt-*.ko module; userspace: built in).
    #[arg(long, default_value = "delta")]
    pub format: String,
    /// Events, comma-separated, the sampling leader first
    /// [default: perf: cpu-clock,task-clock,page-faults; sim: cycles,instructions,llc-misses].
    #[arg(short = 'e', long = "event", value_name = "EVENT,...")]
    pub events: Option<String>,
    /// Overflow mode: one sample every PERIOD events of the leader.
    #[arg(short = 'c', long, value_name = "PERIOD", conflicts_with_all = ["freq", "poll_us"])]
    pub period: Option<u64>,
    /// Overflow mode: about FREQ samples per second (perf source).
    #[arg(short = 'F', long, value_name = "FREQ", conflicts_with_all = ["period", "poll_us"])]
    pub freq: Option<u64>,
    /// Poll mode: read all counters on each CPU every N µs [default mode, N = 1000].
    #[arg(long, value_name = "N", conflicts_with_all = ["period", "freq"])]
    pub poll_us: Option<u64>,
    /// Instructed mode (kmod source): counters are read only when asked: the recorded
    /// program's hrperf_poll()/hrperf_poll_log() (libhrperf.so), on the session it
    /// inherits (HRPERF_FD).
    #[arg(long, conflicts_with_all = ["period", "freq", "poll_us"])]
    pub instructed: bool,
    /// All CPUs (system-wide).
    #[arg(short = 'a', long, conflicts_with = "cpus")]
    pub all_cpus: bool,
    /// These CPUs only, e.g. 0-3,6.
    #[arg(short = 'C', long = "cpu", value_name = "CPUS")]
    pub cpus: Option<String>,
    /// Output file.
    #[arg(short = 'o', long, default_value = "hrperf.data")]
    pub output: PathBuf,
    /// Stop after this long (e.g. 500ms, 5s); for sim, the virtual duration [sim default 100ms].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<String>,
    /// Per-CPU buffer data area, bytes (k/m suffixes) [default: the format's, 256k for delta].
    #[arg(long, value_name = "BYTES")]
    pub buffer_size: Option<String>,
    /// Reader wake-up interval in ms of source time; when set, the reader wakes only on
    /// this interval and not on the format's NOTIFY (models a slow reader).
    #[arg(long, value_name = "MS")]
    pub drain_ms: Option<u64>,
    /// No live progress line.
    #[arg(short, long)]
    pub quiet: bool,
    /// sim: seed of the workload model.
    #[arg(long, default_value_t = 1, help_heading = "Simulated PMU (--source sim)")]
    pub seed: u64,
    /// sim: number of simulated CPUs.
    #[arg(long, default_value_t = 2, help_heading = "Simulated PMU (--source sim)")]
    pub sim_cpus: u32,
    /// sim: counter width in bits (32..=64).
    #[arg(long, default_value_t = 48, help_heading = "Simulated PMU (--source sim)")]
    pub counter_width: u8,
    /// sim: workload model.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Phases, help_heading = "Simulated PMU (--source sim)")]
    pub workload: WorkloadKind,
    /// PEBS (--format pebs): record layout the simulated CPU writes: fmt0 (Core 2), fmt1
    /// (Nehalem), fmt2 (Haswell), fmt3 (Skylake) or adaptive (Ice Lake+). sim only: with
    /// --source kmod the kernel detects it (its simulated PMU: pebs_sim= at insmod).
    #[arg(long, value_name = "FMT", default_value = "adaptive", help_heading = "PEBS (--format pebs)")]
    pub pebs_format: String,
    /// PEBS: adaptive groups (MSR_PEBS_DATA_CFG), joined by '+': basic, meminfo, gpr,
    /// xmm, lbr, lbr:N; or a hex value [default: basic+meminfo for adaptive].
    #[arg(long, value_name = "GROUPS", help_heading = "PEBS (--format pebs)")]
    pub pebs_data_cfg: Option<String>,
    /// PEBS: load-latency threshold in core cycles (MSR_PEBS_LD_LAT_THRESHOLD; perf's ldlat)
    /// of the load-latency event (-e r01cd) [default: 3 on the simulated PMUs].
    #[arg(long, value_name = "CYCLES", help_heading = "PEBS (--format pebs)")]
    pub pebs_ld_lat: Option<u32>,
    /// Aggregate: the key samples are counted under: ip, pid-ip, or stack (pid, kernel
    /// and user stack ids, the stacks stored once per interval) [default: ip].
    #[arg(long, value_enum, value_name = "KEY", help_heading = "Aggregate (--format aggregate)")]
    pub agg_key: Option<AggKey>,
    /// Aggregate: hash-table slots per interval, a power of two in 16..=1048576; keys
    /// that find no slot are counted in the interval's "other" bucket [default: 4096].
    #[arg(long, value_name = "N", help_heading = "Aggregate (--format aggregate)")]
    pub agg_slots: Option<u32>,
    /// Aggregate: close an interval on every CPU each N ms of source time (the tables
    /// also switch on their own when 75% full) [default: 100].
    #[arg(long, value_name = "MS", help_heading = "Aggregate (--format aggregate)")]
    pub agg_interval_ms: Option<u64>,
    /// Call stacks: kernel frames kept per sample, at most 1024 [default: 64].
    #[arg(long, value_name = "N", help_heading = "Call stacks (--format llc-stack)")]
    pub kernel_depth: Option<u16>,
    /// Call stacks: user frames kept per sample, at most 1024 [default: 127].
    #[arg(long, value_name = "N", help_heading = "Call stacks (--format llc-stack)")]
    pub user_depth: Option<u16>,
    /// Call stacks: do not capture kernel stacks.
    #[arg(long, help_heading = "Call stacks (--format llc-stack)")]
    pub no_kernel_stack: bool,
    /// Call stacks: do not capture user stacks.
    #[arg(long, conflicts_with = "no_kernel_stack", help_heading = "Call stacks (--format llc-stack)")]
    pub no_user_stack: bool,
    /// The command to record, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Aggregate key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AggKey {
    /// The interrupted instruction pointer.
    Ip,
    /// Process id and instruction pointer.
    PidIp,
    /// Process id, kernel stack id, user stack id.
    Stack,
}

/// Output of `hrperf decode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputKind {
    /// JSON lines, one object per record, stable field names.
    Jsonl,
    /// CSV with a header row (DuckDB's read_csv_auto reads it).
    Csv,
    /// An aligned table for people.
    Table,
}

/// `hrperf decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// Capture file.
    #[arg(short, long, default_value = "hrperf.data")]
    pub input: PathBuf,
    /// Decode with this format's plugin instead of the one the file names.
    #[arg(long, value_name = "NAME")]
    pub format: Option<String>,
    /// Output form.
    #[arg(long, value_enum, default_value_t = OutputKind::Table)]
    pub output: OutputKind,
}

/// `hrperf info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Capture file.
    #[arg(short, long, default_value = "hrperf.data")]
    pub input: PathBuf,
}

/// Parses a duration such as `250ms`, `5s`, `1.5s`, `100us`, `2m`.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "" => 1e9,
        "m" | "min" => 60e9,
        _ => return Err(format!("bad duration '{s}': use a number with ns, us, ms, s or m, e.g. 500ms")),
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration '{s}': use e.g. 500ms or 2s"))?;
    let ns = v * scale;
    if !(1.0..1e18).contains(&ns) {
        return Err(format!("bad duration '{s}': must be positive and under 30 years"));
    }
    Ok(ns as u64)
}

/// Parses a byte size such as `4096`, `64k`, `4m`, `1g`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.strip_suffix(['k', 'm', 'g']) {
        Some(n) => (n, match t.as_bytes()[t.len() - 1] { b'k' => 1u64 << 10, b'm' => 1 << 20, _ => 1 << 30 }),
        None => (t.as_str(), 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad size '{s}': use bytes with an optional k, m or g suffix, e.g. 64k"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration_ns("250ms").unwrap(), 250_000_000);
        assert_eq!(parse_duration_ns("1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration_ns("100us").unwrap(), 100_000);
        assert!(parse_duration_ns("5 parsecs").is_err());
        assert!(parse_duration_ns("0s").is_err());
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("0").is_err());
        assert!(parse_size("12q").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
