//! The recorder: drives a [`Source`] through the engine and a format into a capture file.
//!
//! ```text
//! source.next() ─► RawSample ─► CpuSession::dispatch ─► format handler ─► per-CPU ring
//!        ▲                              │ CTRL_RESET/MASK                      │ drain
//!        └──────── source.control() ◄───┘                  capture chunks ◄────┘
//! ```
//!
//! This is the same path the kernel module takes (its overflow handler calls the same
//! engine and the same format code); here the per-CPU buffers are ordinary memory and
//! the "reader" drains them into the capture file on the format's NOTIFY and at least
//! every `drain_interval_ns` of source time. Every drop is counted per CPU and written
//! to the capture (LOST records inline, totals in the stats chunk).
//!
//! Zero-copy PEBS formats (`FMT_FL_PEBS`) take a different buffer path: the PMU writes
//! the records into the buffer itself, so the buffers are lent to the PMU
//! ([`RecordOptions::pebs_pmu`], the `sim` source's [`PebsPmu`]) while the source runs;
//! the PMU's threshold interrupt is the only sample dispatched through the engine; a
//! drain reads the records in place (`hrperf_fmt_pebs::assist::drain` wraps each into a
//! capture record), then `CpuSession::restart` resets the DS index and the PMU's PEBS
//! is re-enabled. The format argument's PMU fields come from the PMU, never the user.
//!
//! PEBS through perf (`--source perf --format pebs`, [`RecordOptions::perf_pebs`]) has
//! no DS area and goes through neither the engine nor the zero-copy handler: the
//! kernel's perf already copied each record, and the perf source synthesised it into a
//! perf-sourced PEBS capture record (`hrperf_fmt_pebs::record::encode_perf`). The
//! recorder writes those straight into per-CPU capture chunks, with the capture's format
//! name and UUID those of `pebs`, so `hrperf decode` and `hrperf report --format pebs`
//! read them as any PEBS capture; perf's `LOST` records count as source losses
//! ([`record_perf_pebs`]).
//!
//! The aggregating format (`aggregate`, double-buffered hash tables) is not a ring
//! either: a drain reads each published interval in place
//! (`hrperf_fmt_aggregate::consumer::AggView::pending`), writes it as capture records
//! (`Interval::emit_records`) and acknowledges it, on the handler's NOTIFY/SWITCH and on
//! every periodic drain. Every [`RecordOptions::switch_interval_ns`] of source time the
//! recorder closes the active interval of every CPU (drain → `CpuSession::restart`, which
//! switches → drain), and at the end it does the same after stopping, so every
//! dispatched sample is in exactly one interval of the capture. Userspace sources have
//! no stack service: `KEY_STACK` sessions record stack ids `STACK_ID_NONE` (0) and the
//! intervals carry `IV_FL_NO_*STACK_SERVICE`.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hrperf_abi::capture::EndInfo;
use hrperf_abi::capture::{SOURCE_KMOD, SOURCE_PERF};
use hrperf_abi::format::{
    SessionParams, CTRL_NOTIFY, CTRL_RESET, FMT_FL_PEBS, FMT_FL_STACKS, MODE_OVERFLOW, MODE_POLL,
};
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::{FormatOps, Services};
use hrperf_engine::{Buffer, CounterConfig, CpuSession, EngineError, Format, Registry, RingReader, Selector, Session};

use hrperf_fmt_aggregate::consumer::{Access, AggView};
use hrperf_fmt_aggregate::record::IV_FL_INCONSISTENT;
use hrperf_fmt_pebs::format::PebsHeader;

use crate::capture::{CaptureError, CaptureMeta, Writer};
use crate::source::perf::PerfPebs;
use crate::source::sim::pebs::{PebsCpuCounts, PebsPmu};
use crate::source::{SampleStack, Source, SourceError};
use crate::symsnap::SymbolSnapshots;

/// The formats built into the userspace engine (the kernel gets them from fmt-*.ko).
pub static BUILTIN_FORMATS: &[&FormatOps] = &[
    &hrperf_fmt_delta::DELTA_OPS,
    &hrperf_fmt_pebs::PEBS_OPS,
    &hrperf_fmt_aggregate::AGGREGATE_OPS,
    &hrperf_fmt_llc_stack::LLC_STACK_OPS,
];

/// Default [`RecordOptions::switch_interval_ns`]: 100 ms.
pub const DEFAULT_SWITCH_INTERVAL_NS: u64 = 100_000_000;

/// Whether the built-in format `name` is a zero-copy PEBS format (needs a PEBS-capable
/// PMU: [`RecordOptions::pebs_pmu`]).
pub fn format_needs_pebs(name: &str) -> bool {
    BUILTIN_FORMATS.iter().any(|f| hrperf_abi::name_bytes(&f.name) == name.as_bytes() && f.flags & FMT_FL_PEBS != 0)
}

/// A registry holding [`BUILTIN_FORMATS`].
pub fn builtin_registry() -> Registry<16> {
    let mut r = Registry::new();
    for ops in BUILTIN_FORMATS {
        // The built-in tables are valid and distinct; a failure here is a build bug
        // that the unit tests catch.
        let _ = r.register_static(ops);
    }
    r
}

/// How to record.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// Format name (e.g. `delta`).
    pub format: String,
    /// Per-CPU data area size in bytes; 0 for the format's default.
    pub data_size: u64,
    /// The reader drains every CPU at least this often, in source time; 0 for 10 ms.
    pub drain_interval_ns: u64,
    /// Drain a CPU as soon as its format asks (CTRL_NOTIFY). Off models a reader that
    /// only wakes on its interval.
    pub wake_on_notify: bool,
    /// Stop after this much source time.
    pub duration_ns: Option<u64>,
    /// The recorded command (stored in the capture).
    pub command: Vec<String>,
    /// Store host name and kernel release (off for reproducible sim captures).
    pub host_info: bool,
    /// Simulator configuration text (sim source).
    pub sim_config: String,
    /// The PEBS-capable PMU that writes records into the buffers of a `FMT_FL_PEBS`
    /// format (the sim source's [`SimSource::pebs_pmu`](crate::source::sim::SimSource::pebs_pmu)).
    /// Without one such formats are refused: no PEBS-capable PMU.
    pub pebs_pmu: Option<PebsPmu>,
    /// The format argument (e.g. `AggregateArg::to_bytes()`); empty for the format's
    /// defaults. Ignored for PEBS formats, whose argument comes from the PMU.
    pub format_arg: Vec<u8>,
    /// Aggregating format: close every CPU's interval this often, in source time
    /// (drain, restart, drain); 0 for [`DEFAULT_SWITCH_INTERVAL_NS`].
    pub switch_interval_ns: u64,
    /// PEBS through perf: the perf source's synthesised PEBS capture records
    /// ([`PerfSource::pebs`](crate::source::perf::PerfSource::pebs)). With a
    /// `FMT_FL_PEBS` format and no [`RecordOptions::pebs_pmu`], the recording takes
    /// [`record_perf_pebs`]'s path.
    pub perf_pebs: Option<PerfPebs>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            format: "delta".into(),
            data_size: 0,
            drain_interval_ns: 0,
            wake_on_notify: true,
            duration_ns: None,
            command: Vec::new(),
            host_info: true,
            sim_config: String::new(),
            pebs_pmu: None,
            format_arg: Vec::new(),
            switch_interval_ns: 0,
            perf_pebs: None,
        }
    }
}

/// Progress shown while recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Source time since start.
    pub elapsed_ns: u64,
    /// Samples dispatched.
    pub samples: u64,
    /// Records in the capture so far.
    pub records: u64,
    /// Records dropped so far (buffers full), all CPUs.
    pub drops: u64,
    /// Capture bytes so far.
    pub bytes: u64,
}

/// What a recording produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordSummary {
    /// Samples the source delivered.
    pub samples: u64,
    /// Records written to the capture (LOST markers included).
    pub records: u64,
    /// Records dropped because a buffer was full.
    pub drops: u64,
    /// Samples the source lost before hrperf saw them (perf ring overruns).
    pub source_lost: u64,
    /// Samples that arrived while a CPU was masked.
    pub masked: u64,
    /// Samples flagged as possibly hiding a second counter wrap.
    pub multi_wraps: u64,
    /// Capture size in bytes.
    pub bytes: u64,
    /// Per-CPU statistics as written to the capture (drops include source losses).
    pub per_cpu: Vec<CpuStats>,
    /// Exit status of the recorded command.
    pub exit_status: i32,
    /// Source time recorded.
    pub elapsed_ns: u64,
    /// Per-CPU accounting of a zero-copy PEBS recording (empty otherwise).
    pub pebs: Vec<PebsCpuSummary>,
    /// Per-CPU accounting of an aggregating-format recording (empty otherwise).
    pub aggregate: Vec<AggCpuSummary>,
    /// Things the user should know about the capture (e.g. kernel symbols hidden).
    pub notes: Vec<String>,
    /// Samples dispatched with call stacks from the source (stack formats).
    pub stacks: u64,
}

/// How one CPU's aggregated intervals were accounted for (sums over the intervals
/// drained into the capture).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggCpuSummary {
    /// CPU.
    pub cpu: u32,
    /// Intervals drained.
    pub intervals: u64,
    /// Samples counted in them (Σ interval `samples`).
    pub samples: u64,
    /// Entry records written (one per key per interval).
    pub entries: u64,
    /// Samples in the "other" buckets.
    pub other_count: u64,
    /// Samples that found no slot.
    pub misses: u64,
    /// Intervals whose table was inconsistent when read (`IV_FL_INCONSISTENT`).
    pub inconsistent: u64,
    /// Switches the handler postponed because the reader was behind.
    pub switch_waits: u64,
    /// Samples dispatched to the format on this CPU (`BufferHeader::overflows`).
    pub dispatched: u64,
}

impl AggCpuSummary {
    /// Adds one drained interval's totals.
    pub fn add_interval(&mut self, s: &hrperf_fmt_aggregate::record::IntervalRecord) {
        self.intervals += 1;
        self.samples += s.samples;
        self.entries += s.entries;
        self.other_count += s.other_count;
        self.misses += s.misses;
        self.inconsistent += u64::from(s.flags & IV_FL_INCONSISTENT != 0);
    }
}

/// How one CPU's PEBS records were accounted for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PebsCpuSummary {
    /// CPU.
    pub cpu: u32,
    /// Records read in place and written to the capture.
    pub records: u64,
    /// Drains that found records (each followed by a restart).
    pub drains: u64,
    /// The format's header at the end (threshold PMIs, restarts, records copied = 0, lost).
    pub header: PebsHeader,
    /// What the PMU counted (assists, records written, PMIs, masked overflows).
    pub hw: PebsCpuCounts,
}

/// Why a recording failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Writing the capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The format is not built in.
    #[error("unknown format '{name}'; formats available in userspace: {known}")]
    UnknownFormat {
        /// The name asked for.
        name: String,
        /// The known names.
        known: String,
    },
    /// A zero-copy PEBS format without a PEBS-capable PMU.
    #[error("format '{format}' needs a PEBS-capable PMU and this source has none ({detail}); record with --source sim for a simulated PEBS PMU")]
    NoPebsPmu {
        /// The format.
        format: String,
        /// What the source is.
        detail: String,
    },
    /// The engine or the format refused.
    #[error("{what}: {error}")]
    Engine {
        /// What was being done.
        what: String,
        /// The engine's error.
        error: EngineError,
    },
}

fn engine(what: impl Into<String>) -> impl FnOnce(EngineError) -> RecordError {
    let what = what.into();
    move |error| RecordError::Engine { what, error }
}

/// One CPU's session state and buffer.
struct CpuSlot {
    cpu: u32,
    session: CpuSession,
    words: Vec<u64>,
    /// PEBS accounting (zero-copy formats).
    pebs: PebsCpuSummary,
    /// Aggregate accounting (the aggregating format).
    agg: AggCpuSummary,
}

impl CpuSlot {
    fn buffer(&mut self) -> Result<Buffer<'_>, RecordError> {
        Buffer::from_words(&mut self.words).map_err(engine("buffer"))
    }

    fn stats(&mut self) -> Result<CpuStats, RecordError> {
        let buf = Buffer::from_words(&mut self.words).map_err(engine("buffer"))?;
        Ok(self.session.stats(&buf))
    }
}

/// Records `source` into the capture file at `path` (an existing file there is renamed to
/// `<path>.old` first, so nothing is lost).
pub fn record_to_file(
    source: &mut dyn Source,
    opts: &RecordOptions,
    path: &Path,
    stop: &AtomicBool,
    live: &mut dyn FnMut(&Live),
) -> Result<RecordSummary, RecordError> {
    if path.exists() {
        let mut old = path.as_os_str().to_owned();
        old.push(".old");
        std::fs::rename(path, &old).map_err(|e| {
            SourceError::Config(format!("cannot move the existing {} aside: {e}", path.display()))
        })?;
    }
    let file = std::fs::File::create(path)
        .map_err(|e| SourceError::Config(format!("cannot create {}: {e}", path.display())))?;
    record(source, opts, file, path, stop, live)
}

/// Records `source` into `out` (named `name` in errors). Returns when the source
/// finishes, `opts.duration_ns` of source time has passed, or `stop` is set.
pub fn record<W: Write>(
    source: &mut dyn Source,
    opts: &RecordOptions,
    out: W,
    name: &Path,
    stop: &AtomicBool,
    live: &mut dyn FnMut(&Live),
) -> Result<RecordSummary, RecordError> {
    let info = source.info().clone();
    let mut registry = builtin_registry();
    let format: Format = registry.acquire(Selector::Name(opts.format.as_bytes())).map_err(|_| {
        let known: Vec<_> = registry.iter().collect();
        RecordError::UnknownFormat { name: opts.format.clone(), known: crate::source::kmod::format_names(&known) }
    })?;

    let pebs = if format.ops().flags & FMT_FL_PEBS != 0 {
        match (&opts.pebs_pmu, &opts.perf_pebs) {
            (Some(pmu), _) => Some(pmu.clone()),
            (None, Some(tap)) => {
                let ops = format.ops();
                let _ = registry.release(format);
                return record_perf_pebs(source, opts, tap, ops, out, name, stop, live);
            }
            (None, None) => {
                let _ = registry.release(format);
                return Err(RecordError::NoPebsPmu {
                    format: opts.format.clone(),
                    detail: format!("{} source", crate::decode::source_name(info.source)),
                });
            }
        }
    } else {
        None
    };
    // The argument's PMU fields are filled from the PMU, as hrperf-core does from CPUID.
    let format_arg: Vec<u8> = match &pebs {
        Some(p) => p.arg().to_bytes().to_vec(),
        None => opts.format_arg.clone(),
    };
    let aggregate = format.ops().uuid == hrperf_fmt_aggregate::AGGREGATE_UUID;
    let (want_kernel, want_user) = stacks_wanted(format.ops(), &format_arg);
    let stacks = (want_kernel || want_user) && source.has_stacks();
    if stacks {
        source.want_stacks(want_kernel, want_user)?;
    }
    let kind = match (&pebs, aggregate) {
        (Some(p), _) => BufKind::Pebs(p),
        (None, true) => BufKind::Aggregate,
        (None, false) => BufKind::Ring,
    };

    let nr = info.events.len();
    let params = SessionParams {
        size: core::mem::size_of::<SessionParams>() as u32,
        mode: info.mode,
        nr_counters: nr as u32,
        cpu: u32::MAX,
        sample_period: if info.mode == MODE_OVERFLOW { info.sample_period.max(1) } else { 0 },
        poll_interval_ns: if info.mode == MODE_POLL { info.poll_interval_ns } else { 0 },
        data_size_hint: opts.data_size,
        flags: 0,
        reserved: 0,
    };
    let counters: Vec<CounterConfig> = (0..nr)
        .map(|i| CounterConfig {
            width: u32::from(info.widths.get(i).copied().unwrap_or(64)),
            max_rate_per_sec: info.max_rates.get(i).copied().unwrap_or(0),
        })
        .collect();
    let session = Session::new(format, &params, &format_arg, &counters).map_err(engine(format!("format '{}' refused the session", opts.format)))?;
    let words = session.buffer_size().div_ceil(8) as usize;

    let mut slots: Vec<CpuSlot> = Vec::with_capacity(info.cpus.len());
    let mut index = vec![usize::MAX; info.cpus.iter().max().map_or(0, |&c| c as usize + 1)];
    for &cpu in &info.cpus {
        let mut mem = vec![0u64; words];
        let mut buf = Buffer::from_words(&mut mem).map_err(engine("allocating a buffer"))?;
        let cs = session.init_cpu(cpu, &mut buf, &format_arg).map_err(engine(format!("initialising CPU {cpu}")))?;
        index[cpu as usize] = slots.len();
        let pebs = PebsCpuSummary { cpu, ..PebsCpuSummary::default() };
        let agg = AggCpuSummary { cpu, ..AggCpuSummary::default() };
        slots.push(CpuSlot { cpu, session: cs, words: mem, pebs, agg });
    }

    let meta = capture_meta(opts, &info, format.ops(), params.sample_period, params.poll_interval_ns, &format_arg);
    let mut writer = Writer::with_name(out, name, &meta)?;
    let mut notes = Vec::new();
    // Stacks are symbolized later from what is captured now (see `symsnap`).
    let real_source = matches!(info.source, SOURCE_PERF | SOURCE_KMOD);
    let mut snapshots = (stacks && real_source).then(SymbolSnapshots::new);
    if stacks || pebs.is_some() {
        for t in source.symbols() {
            writer.write_symbols(t.kind, t.pid, &t.text)?;
        }
    }
    if let Some(snap) = snapshots.as_mut() {
        notes.extend(snap.write_kallsyms(&mut writer)?);
    }

    source.start()?;
    for slot in &mut slots {
        let raw = source.start_values(slot.cpu);
        let cpu = slot.cpu;
        let mut buf = Buffer::from_words(&mut slot.words).map_err(engine("buffer"))?;
        slot.session.start(&mut buf, &raw, info.start_time_ns).map_err(engine(format!("starting CPU {cpu}")))?;
    }

    let drain_every = if opts.drain_interval_ns == 0 { 10_000_000 } else { opts.drain_interval_ns };
    let switch_every = if opts.switch_interval_ns == 0 { DEFAULT_SWITCH_INTERVAL_NS } else { opts.switch_interval_ns };
    let mut last_switch = info.start_time_ns;
    let mut chunk = Vec::with_capacity(64 << 10);
    let mut batch = Vec::with_capacity(4096);
    let mut notified = vec![false; slots.len()];
    let mut samples = 0u64;
    let mut now_ns = info.start_time_ns;
    let mut last_drain = info.start_time_ns;
    let mut last_live = Instant::now();
    let mut drains = 0u64;
    let services = Services::NONE;
    let mut stacked = 0u64;
    let mut stopping = false;
    let mut stop_deadline = None;
    loop {
        batch.clear();
        // PEBS: the PMU owns the DS areas while the source runs (see the module docs).
        if let Some(pmu) = &pebs {
            for slot in &mut slots {
                pmu.lend(slot.cpu, std::mem::take(&mut slot.words));
            }
        }
        let progress = source.next(&mut batch, Duration::from_millis(100));
        if let Some(pmu) = &pebs {
            for slot in &mut slots {
                if let Some(w) = pmu.take(slot.cpu) {
                    slot.words = w;
                }
            }
        }
        let progress = progress?;
        for (j, s) in batch.iter().enumerate() {
            let Some(&i) = index.get(s.cpu as usize).filter(|&&i| i != usize::MAX) else { continue };
            let slot = &mut slots[i];
            let mut buf = Buffer::from_words(&mut slot.words).map_err(engine("buffer"))?;
            let stack = if stacks { source.stack(j) } else { None };
            let ctrl = match stack {
                Some(st) => {
                    stacked += 1;
                    let ctx = StackCtx(st);
                    slot.session.dispatch(&mut buf, s, &ctx.services())
                }
                None => slot.session.dispatch(&mut buf, s, &services),
            };
            samples += 1;
            now_ns = now_ns.max(s.time_ns);
            if ctrl & !CTRL_NOTIFY != 0 {
                source.control(s.cpu, ctrl);
                if ctrl & CTRL_RESET != 0 {
                    if let Some((idx, raw)) = source.written(s.cpu) {
                        slot.session.set_raw(idx, raw);
                    }
                }
            }
            if ctrl & CTRL_NOTIFY != 0 {
                notified[i] = true;
            }
        }
        if let Some(snap) = snapshots.as_mut() {
            for s in &batch {
                snap.note_pid(s.pid, &mut writer)?;
            }
            snap.refresh(&mut writer)?;
        }
        if opts.wake_on_notify {
            for (i, n) in notified.iter_mut().enumerate() {
                if std::mem::take(n) {
                    drain(&mut slots[i], kind, &mut writer, &mut chunk)?;
                }
            }
        }
        let finished = progress == crate::source::Progress::Finished;
        let timed_out = opts.duration_ns.is_some_and(|d| now_ns.saturating_sub(info.start_time_ns) >= d);
        if now_ns.saturating_sub(last_drain) >= drain_every || finished {
            for slot in &mut slots {
                drain(slot, kind, &mut writer, &mut chunk)?;
            }
            last_drain = now_ns;
            drains += 1;
            if drains.is_multiple_of(100) {
                // Periodic statistics, so an interrupted recording still has them.
                let stats = slots.iter_mut().map(CpuSlot::stats).collect::<Result<Vec<_>, _>>()?;
                writer.write_stats(&stats)?;
                writer.flush()?;
            }
        }
        if aggregate && now_ns.saturating_sub(last_switch) >= switch_every && !finished {
            // Close every CPU's interval: the capture gets one interval per CPU per
            // switch period (a CPU without samples gets an empty one).
            for slot in &mut slots {
                close_interval(slot, &mut writer, &mut chunk)?;
            }
            last_switch = now_ns;
        }
        if last_live.elapsed() >= Duration::from_millis(200) {
            last_live = Instant::now();
            let drops = slots.iter_mut().map(|s| s.stats().map(|st| st.drops)).sum::<Result<u64, _>>()?;
            live(&Live {
                elapsed_ns: now_ns.saturating_sub(info.start_time_ns),
                samples,
                records: writer.records_written(),
                drops,
                bytes: writer.offset(),
            });
        }
        if finished {
            break;
        }
        if !stopping && (timed_out || stop.load(Ordering::Relaxed)) {
            // Let the source hand over what it still holds before finishing.
            source.stop()?;
            stopping = true;
            stop_deadline = Some(Instant::now() + Duration::from_secs(5));
        }
        if stop_deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }

    let finish = source.finish()?;
    let mut summary =
        RecordSummary { samples, exit_status: finish.exit_status, notes, stacks: stacked, ..RecordSummary::default() };
    for slot in &mut slots {
        let cpu = slot.cpu;
        {
            let mut buf = Buffer::from_words(&mut slot.words).map_err(engine("buffer"))?;
            slot.session.stop(&mut buf).map_err(engine(format!("stopping CPU {cpu}")))?;
        }
        if aggregate {
            // The active interval too: every dispatched sample ends in the capture.
            close_interval(slot, &mut writer, &mut chunk)?;
        } else {
            drain(slot, kind, &mut writer, &mut chunk)?;
        }
        let mut buf = Buffer::from_words(&mut slot.words).map_err(engine("buffer"))?;
        let mut st = slot.session.stats(&buf);
        if aggregate {
            let mut a = slot.agg;
            a.dispatched = st.overflows;
            summary.aggregate.push(a);
        }
        let lost = finish.lost.iter().filter(|(c, _)| *c == cpu).map(|(_, n)| n).sum::<u64>();
        if let Some(pmu) = &pebs {
            let mut p = slot.pebs;
            p.header = hrperf_fmt_pebs::format::read_header(&buf).unwrap_or_default();
            p.hw = pmu.counts(cpu);
            // Records the PMU could not write (area full) and overflows while PEBS was
            // masked are losses too: nothing is dropped silently.
            st.drops += p.header.lost;
            summary.masked += p.hw.masked;
            summary.pebs.push(p);
        }
        summary.drops += st.drops;
        summary.source_lost += lost;
        summary.masked += st.masked;
        summary.multi_wraps += st.multi_wraps;
        st.drops += lost;
        summary.per_cpu.push(st);
        slot.session.exit(&mut buf).map_err(engine(format!("closing CPU {cpu}")))?;
    }
    let _ = registry.release(format);
    writer.write_stats(&summary.per_cpu)?;
    summary.records = writer.records_written();
    summary.elapsed_ns = finish.end_time_ns.max(now_ns).saturating_sub(info.start_time_ns);
    let end = EndInfo {
        end_time_ns: finish.end_time_ns.max(now_ns),
        total_records: summary.records,
        total_drops: summary.drops + summary.source_lost,
        exit_status: finish.exit_status,
        reserved: 0,
    };
    let offset_before_end = writer.offset();
    writer.finish(end)?;
    summary.bytes = offset_before_end + (core::mem::size_of::<hrperf_abi::capture::ChunkHeader>() + core::mem::size_of::<EndInfo>()) as u64;
    Ok(summary)
}

/// The capture header of a recording of `info` with format `ops`.
fn capture_meta(
    opts: &RecordOptions,
    info: &crate::source::SourceInfo,
    ops: &FormatOps,
    sample_period: u64,
    poll_interval_ns: u64,
    format_arg: &[u8],
) -> CaptureMeta {
    CaptureMeta {
        format_name: opts.format.clone(),
        format_uuid: ops.uuid,
        format_version: ops.version,
        source: info.source,
        clock: info.clock,
        tsc_hz: info.tsc_hz,
        mode: info.mode,
        sample_period,
        poll_interval_ns,
        start_time_ns: info.start_time_ns,
        start_wall_ns: if opts.host_info { wall_ns() } else { 0 },
        events: info.events.clone(),
        cpus: info.cpus.clone(),
        cpu_model: info.cpu_model.clone(),
        command: opts.command.clone(),
        hostname: if opts.host_info { read_trimmed("/proc/sys/kernel/hostname") } else { String::new() },
        kernel_release: if opts.host_info { read_trimmed("/proc/sys/kernel/osrelease") } else { String::new() },
        format_arg: format_arg.to_vec(),
        sim_config: opts.sim_config.clone(),
    }
}

/// PEBS through perf: runs `source` (a perf source opened with `PerfConfig::pebs`) and
/// writes the capture records it synthesised (`tap`) straight into per-CPU capture
/// chunks, on the recorder's drain schedule and at the end. No engine session and no
/// zero-copy handler: there is no DS area. The capture's format is `ops` (`pebs`), its
/// format argument empty (no PMU description: every record carries its own
/// `PebsFormat` word). Per CPU: records counted as written, samples as overflows,
/// perf's losses as drops (and [`RecordSummary::source_lost`]).
#[expect(clippy::too_many_arguments, reason = "the arguments of `record`, plus the tap and the format")]
pub fn record_perf_pebs<W: Write>(
    source: &mut dyn Source,
    opts: &RecordOptions,
    tap: &PerfPebs,
    ops: &FormatOps,
    out: W,
    name: &Path,
    stop: &AtomicBool,
    live: &mut dyn FnMut(&Live),
) -> Result<RecordSummary, RecordError> {
    let info = source.info().clone();
    if info.mode != MODE_OVERFLOW {
        return Err(SourceError::Config("PEBS samples on counter overflow: use -c PERIOD or -F FREQ, not --poll-us".into()).into());
    }
    let meta = capture_meta(opts, &info, ops, info.sample_period.max(1), 0, &[]);
    let mut writer = Writer::with_name(out, name, &meta)?;
    let mut index = vec![usize::MAX; info.cpus.iter().max().map_or(0, |&c| c as usize + 1)];
    let mut stats: Vec<CpuStats> = Vec::with_capacity(info.cpus.len());
    for &cpu in &info.cpus {
        index[cpu as usize] = stats.len();
        stats.push(CpuStats { cpu, ..CpuStats::default() });
    }
    let write_pending = |writer: &mut Writer<W>, stats: &mut [CpuStats]| -> Result<(), RecordError> {
        for st in stats.iter_mut() {
            let (bytes, n) = tap.take(st.cpu);
            if n > 0 {
                writer.write_chunk(st.cpu, &bytes, n)?;
                st.records += n;
            }
        }
        Ok(())
    };

    source.start()?;
    let drain_every = if opts.drain_interval_ns == 0 { 10_000_000 } else { opts.drain_interval_ns };
    let mut batch = Vec::with_capacity(4096);
    let (mut samples, mut now_ns, mut last_drain, mut drains) = (0u64, info.start_time_ns, info.start_time_ns, 0u64);
    let mut last_live = Instant::now();
    let (mut stopping, mut stop_deadline) = (false, None);
    loop {
        batch.clear();
        let progress = source.next(&mut batch, Duration::from_millis(100))?;
        for s in &batch {
            samples += 1;
            now_ns = now_ns.max(s.time_ns);
            if let Some(&i) = index.get(s.cpu as usize).filter(|&&i| i != usize::MAX) {
                stats[i].overflows += 1;
            }
        }
        let finished = progress == crate::source::Progress::Finished;
        if now_ns.saturating_sub(last_drain) >= drain_every || finished {
            write_pending(&mut writer, &mut stats)?;
            last_drain = now_ns;
            drains += 1;
            if drains.is_multiple_of(100) {
                writer.write_stats(&stats)?;
                writer.flush()?;
            }
        }
        if last_live.elapsed() >= Duration::from_millis(200) {
            last_live = Instant::now();
            live(&Live {
                elapsed_ns: now_ns.saturating_sub(info.start_time_ns),
                samples,
                records: writer.records_written(),
                drops: 0,
                bytes: writer.offset(),
            });
        }
        if finished {
            break;
        }
        let timed_out = opts.duration_ns.is_some_and(|d| now_ns.saturating_sub(info.start_time_ns) >= d);
        if !stopping && (timed_out || stop.load(Ordering::Relaxed)) {
            source.stop()?;
            stopping = true;
            stop_deadline = Some(Instant::now() + Duration::from_secs(5));
        }
        if stop_deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    let finish = source.finish()?;
    // Whatever was synthesised but not yet written (a stop deadline) goes in too.
    write_pending(&mut writer, &mut stats)?;
    let mut summary = RecordSummary { samples, exit_status: finish.exit_status, ..RecordSummary::default() };
    for st in &mut stats {
        let lost = finish.lost.iter().filter(|(c, _)| *c == st.cpu).map(|(_, n)| n).sum::<u64>();
        summary.source_lost += lost;
        st.drops += lost;
    }
    summary.per_cpu = stats;
    writer.write_stats(&summary.per_cpu)?;
    summary.records = writer.records_written();
    summary.elapsed_ns = finish.end_time_ns.max(now_ns).saturating_sub(info.start_time_ns);
    let end = EndInfo {
        end_time_ns: finish.end_time_ns.max(now_ns),
        total_records: summary.records,
        total_drops: summary.source_lost,
        exit_status: finish.exit_status,
        reserved: 0,
    };
    let offset_before_end = writer.offset();
    writer.finish(end)?;
    summary.bytes = offset_before_end + (core::mem::size_of::<hrperf_abi::capture::ChunkHeader>() + core::mem::size_of::<EndInfo>()) as u64;
    Ok(summary)
}

/// Which stacks a session of `ops` with argument `arg` needs from the source:
/// `(kernel, user)`. Stack formats (`FMT_FL_STACKS`) unless their argument opts out;
/// the aggregating format when keyed by stack.
fn stacks_wanted(ops: &FormatOps, arg: &[u8]) -> (bool, bool) {
    if ops.uuid == hrperf_fmt_llc_stack::LLC_STACK_UUID {
        let a = hrperf_fmt_llc_stack::parse_arg(arg).unwrap_or_default();
        return (
            a.flags & hrperf_fmt_llc_stack::ARG_NO_KERNEL_STACK == 0,
            a.flags & hrperf_fmt_llc_stack::ARG_NO_USER_STACK == 0,
        );
    }
    if ops.uuid == hrperf_fmt_aggregate::AGGREGATE_UUID {
        return match hrperf_fmt_aggregate::parse_arg(arg) {
            Ok(a) if a.key == hrperf_fmt_aggregate::record::KEY_STACK => (
                a.flags & hrperf_fmt_aggregate::AGG_ARG_FL_NO_KSTACK == 0,
                a.flags & hrperf_fmt_aggregate::AGG_ARG_FL_NO_USTACK == 0,
            ),
            _ => (false, false),
        };
    }
    let any = ops.flags & FMT_FL_STACKS != 0;
    (any, any)
}

/// The `Services` a userspace source offers a format for one sample: the stacks the
/// source captured with it (what hrperf-core's services capture in the kernel).
struct StackCtx<'a>(SampleStack<'a>);

impl StackCtx<'_> {
    fn services(&self) -> Services {
        Services {
            size: core::mem::size_of::<Services>() as u32,
            reserved: 0,
            ctx: (self as *const Self).cast_mut().cast(),
            kernel_stack: Some(ctx_kernel_stack),
            user_stack: Some(ctx_user_stack),
            comm: Some(ctx_comm),
        }
    }
}

/// Copies up to `max` frames to `out`.
///
/// # Safety
///
/// `out` is valid for `max` u64 writes (the `Services` contract).
unsafe fn copy_frames(src: &[u64], out: *mut u64, max: u32) -> u32 {
    let n = src.len().min(max as usize);
    // SAFETY: n <= max, the caller's contract; `src` does not overlap the ring.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), out, n) };
    n as u32
}

/// # Safety
///
/// `ctx` is the `StackCtx` whose `services()` gave this function (alive during the
/// dispatch); `out` as for [`copy_frames`].
unsafe extern "C" fn ctx_kernel_stack(ctx: *mut core::ffi::c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: the function's contract.
    let c = unsafe { &*ctx.cast::<StackCtx<'_>>() };
    // SAFETY: forwarded.
    unsafe { copy_frames(c.0.kernel, out, max) }
}

/// # Safety
///
/// As [`ctx_kernel_stack`].
unsafe extern "C" fn ctx_user_stack(ctx: *mut core::ffi::c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: the function's contract.
    let c = unsafe { &*ctx.cast::<StackCtx<'_>>() };
    // SAFETY: forwarded.
    unsafe { copy_frames(c.0.user, out, max) }
}

/// # Safety
///
/// `ctx` as for [`ctx_kernel_stack`]; `out` valid for `len` byte writes.
unsafe extern "C" fn ctx_comm(ctx: *mut core::ffi::c_void, out: *mut u8, len: u32) -> u32 {
    // SAFETY: the function's contract.
    let c = unsafe { &*ctx.cast::<StackCtx<'_>>() };
    let n = c.0.comm.len().min(len as usize);
    // SAFETY: n <= len, the caller's contract.
    unsafe { core::ptr::copy_nonoverlapping(c.0.comm.as_ptr(), out, n) };
    n as u32
}

/// How a format's buffer is read.
#[derive(Clone, Copy)]
enum BufKind<'p> {
    /// The engine's record ring.
    Ring,
    /// Zero-copy PEBS records written by this PMU.
    Pebs(&'p PebsPmu),
    /// The aggregating format's double-buffered tables.
    Aggregate,
}

/// Aggregating format: drains the published interval, switches (restart), and drains
/// the interval that closed, so everything counted so far is in the capture.
fn close_interval<W: Write>(slot: &mut CpuSlot, writer: &mut Writer<W>, chunk: &mut Vec<u8>) -> Result<(), RecordError> {
    drain(slot, BufKind::Aggregate, writer, chunk)?;
    let cpu = slot.cpu;
    let mut buf = Buffer::from_words(&mut slot.words).map_err(engine("buffer"))?;
    // Cannot be EBUSY: the drain above acknowledged the published interval.
    slot.session.restart(&mut buf).map_err(engine(format!("switching CPU {cpu}'s aggregate tables")))?;
    drain(slot, BufKind::Aggregate, writer, chunk)
}

/// Reads every published interval of `slot`'s aggregate tables in place into one
/// capture chunk and acknowledges it (the producer may then reuse its table).
fn drain_aggregate<W: Write>(slot: &mut CpuSlot, writer: &mut Writer<W>, chunk: &mut Vec<u8>) -> Result<(), RecordError> {
    chunk.clear();
    let mut n = 0u64;
    let cpu = slot.cpu;
    let len = slot.words.len() * 8;
    let bad = |e: hrperf_fmt_aggregate::consumer::ViewError| {
        RecordError::Source(SourceError::Config(format!("reading CPU {cpu}'s aggregate tables: {e}")))
    };
    let Some(ptr) = core::ptr::NonNull::new(slot.words.as_mut_ptr().cast::<u8>()) else {
        return Ok(());
    };
    // SAFETY: `slot.words` is this CPU's buffer, `len` bytes, 8-aligned, and is neither
    // moved nor otherwise accessed while `view` lives (this function); the producer
    // (dispatch/restart) runs on this thread only, so nothing writes it concurrently.
    let view = unsafe { AggView::from_raw(ptr, len, Access::ReadWrite) }.map_err(bad)?;
    let a = &mut slot.agg;
    while let Some(iv) = view.pending() {
        let s = iv.emit_records(|rec| {
            chunk.extend_from_slice(rec);
            n += 1;
        });
        a.add_interval(&s);
        view.ack(iv).map_err(bad)?;
    }
    a.switch_waits = view.switch_waits();
    if n > 0 {
        writer.write_chunk(cpu, chunk, n)?;
    }
    Ok(())
}

/// Moves every record in `slot`'s ring into one capture chunk; for a PEBS format, reads
/// the PMU's records in place into one chunk, then restarts the CPU and re-enables PEBS;
/// for the aggregating format, drains the published interval ([`drain_aggregate`]).
fn drain<W: Write>(slot: &mut CpuSlot, kind: BufKind<'_>, writer: &mut Writer<W>, chunk: &mut Vec<u8>) -> Result<(), RecordError> {
    let pebs = match kind {
        BufKind::Ring => None,
        BufKind::Pebs(p) => Some(p),
        BufKind::Aggregate => return drain_aggregate(slot, writer, chunk),
    };
    chunk.clear();
    let mut n = 0u64;
    let cpu = slot.cpu;
    if let Some(pmu) = pebs {
        let masked = slot.session.is_masked() || pmu.is_masked(cpu);
        let mut buf = Buffer::from_words(&mut slot.words).map_err(engine("buffer"))?;
        let st = hrperf_fmt_pebs::assist::drain(&buf, cpu, pmu.record_flags(), Some(pmu.tsc_clock()), |rec| {
            chunk.extend_from_slice(rec);
            n += 1;
        })
        .map_err(|e| SourceError::Config(format!("reading CPU {cpu}'s PEBS records: {e:?}")))?;
        if st.records == 0 && !masked {
            return Ok(());
        }
        writer.write_chunk(cpu, chunk, n)?;
        slot.pebs.records += st.records;
        slot.pebs.drains += 1;
        // The records are in the capture: recycle the area (pebs_index = base), unmask.
        slot.session.restart(&mut buf).map_err(engine(format!("restarting CPU {cpu}")))?;
        pmu.unmask(cpu);
        return Ok(());
    }
    let buf = slot.buffer()?;
    let reader = RingReader::new(&buf).map_err(engine(format!("reading CPU {cpu}'s ring")))?;
    reader
        .drain(|rec| {
            chunk.extend_from_slice(rec);
            n += 1;
        })
        .map_err(engine(format!("reading CPU {cpu}'s ring")))?;
    writer.write_chunk(cpu, chunk, n)?;
    Ok(())
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}
