//! The kmod recorder: a [`Session`]'s rings into a capture file, the same file
//! [`crate::record`] writes for the userspace sources (`hrperf record --source kmod`).
//!
//! ```text
//! Session::create ─ (fork the command, held) ─ Writer (header, metadata) ─ START ─ exec
//!   loop: poll(session fd, pidfd; ≤ 100 ms) → drain every CPU → a DATA chunk each
//!         until the command exits, --duration passes, or Ctrl-C
//! STOP ─ last drain ─ STATS chunk (HRPERF_IOC_STATS) ─ END chunk ─ DESTROY
//! ```
//!
//! What differs from the userspace sources, and why:
//!
//! - **Counters are per CPU, system-wide.** hrperf-core.ko programs one pinned counter
//!   set per CPU (hiresperf's model), so `hrperf record -- cmd` records *all* activity on
//!   the monitored CPUs while `cmd` runs, like `perf record -a -- cmd`.
//! - **Clock.** Record timestamps are the kernel's `local_clock()` ns
//!   ([`CLOCK_PERF`]): each CPU stamps its own reads. Userspace cannot read that clock,
//!   so the capture's `start_time_ns` and the END chunk's `end_time_ns` are 0 (unknown);
//!   the recording's length is measured on `CLOCK_MONOTONIC` for the summary.
//! - **The command gets the session.** Its descriptor is inherited by the command, named
//!   by `HRPERF_FD` ([`super::ENV_FD`]), so a program linked with `libhrperf.so` can mark
//!   its regions (`hrperf_poll_log()`) or pause the recording (`hrperf_pause()`) on the
//!   very session being recorded.
//!
//! Nothing is dropped silently: the kernel counts drops per CPU (LOST records in band,
//! totals in the buffer header); the STATS chunk carries the kernel's per-CPU counts.
//!
//! **Stack formats** (`FMT_FL_STACKS`, e.g. llc-stack): the kernel captures the stacks
//! into the records itself; the recorder adds what symbolizing them needs later
//! ([`crate::symsnap`]): `/proc/kallsyms` at the start, and the maps of every process
//! seen in a stack record.
//!
//! **Interval formats** (`FMT_FL_INTERVALS`, e.g. aggregate): the buffers hold
//! double-buffered tables, not rings. A drain reads every published interval in place
//! from the read-only mapping ([`Session::drain_intervals`]), writes it as INTERVAL,
//! STACK and ENTRY records, and acknowledges it (`HRPERF_IOC_CONSUME` with the
//! interval's sequence number). Every [`KmodRecordOptions::switch_interval_ns`] and at
//! the end the recorder closes every CPU's active interval (drain → `HRPERF_IOC_RESTART`
//! → drain), so every sample is in exactly one interval of the capture. The maps of
//! every process named by an entry are snapshotted for symbolizing.

use std::ffi::CString;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hrperf_abi::capture::{EndInfo, CLOCK_PERF, SOURCE_KMOD};
use hrperf_abi::format::FMT_FL_STACKS;
use hrperf_abi::ioctl::CpuStats;
use hrperf_fmt_aggregate::record::parse_entry;
use hrperf_fmt_llc_stack::record::StackRecord;
use hrperf_fmt_pebs::record::FL_SIMULATED;
use hrperf_fmt_pebs::PebsFormat;

use super::sys::{wall_ns, HeldChild};
use super::{ioctl_error, KmodConfig, KmodError, KmodSys, Session, ENV_FD};
use crate::capture::{CaptureMeta, Writer};
use crate::record::{AggCpuSummary, Live, PebsCpuSummary, RecordSummary, DEFAULT_SWITCH_INTERVAL_NS};
use crate::symsnap::SymbolSnapshots;

/// Reader wake-up interval when the format sends no NOTIFY (ms).
pub const DEFAULT_DRAIN_MS: u32 = 100;

/// How to record from `/dev/hrperf`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmodRecordOptions {
    /// The session.
    pub config: KmodConfig,
    /// The command to run while recording (empty: record until `duration_ns` or stop).
    pub command: Vec<String>,
    /// Stop after this long (`CLOCK_MONOTONIC`).
    pub duration_ns: Option<u64>,
    /// Drain at least this often, in ms (0: [`DEFAULT_DRAIN_MS`]).
    pub drain_ms: u32,
    /// Store host name, kernel release and wall-clock start time.
    pub host_info: bool,
    /// Interval formats: close every CPU's interval this often (0:
    /// [`DEFAULT_SWITCH_INTERVAL_NS`]).
    pub switch_interval_ns: u64,
}

/// A session being written to a capture file: create it with [`Recorder::new`], call
/// [`Recorder::drain`] whenever the session is readable (and periodically), then
/// [`Recorder::finish`].
#[derive(Debug)]
pub struct Recorder<W: Write> {
    session: Session,
    writer: Writer<W>,
    chunk: Vec<u8>,
    sys: Arc<dyn KmodSys>,
    started_ns: Option<u64>,
    stopped_ns: Option<u64>,
    drains: u64,
    /// Symbol snapshots, for a stack format.
    snapshots: Option<SymbolSnapshots>,
    /// Stack records drained.
    stacks: u64,
    /// Notes for the summary (e.g. kallsyms unreadable).
    notes: Vec<String>,
    /// Interval formats: per-CPU accounting, in buffer order (empty for ring formats).
    agg: Vec<AggCpuSummary>,
    /// Interval formats: close every CPU's interval this often (ns).
    switch_every_ns: u64,
    /// When the intervals were last closed (`KmodSys::now_ns`).
    last_switch_ns: u64,
    /// PEBS formats: per-CPU accounting, in buffer order (empty otherwise).
    pebs: Vec<PebsCpuSummary>,
}

/// The capture metadata of a session.
pub fn capture_meta(session: &Session, command: &[String], host_info: bool) -> CaptureMeta {
    let f = session.format();
    CaptureMeta {
        format_name: super::format_name(f),
        format_uuid: f.uuid,
        format_version: f.version,
        source: SOURCE_KMOD,
        clock: CLOCK_PERF,
        // PEBS records carry the TSC (the simulated PMU's counts local_clock() ns).
        tsc_hz: if session.has_pebs() { u64::from(session.module_info().tsc_khz) * 1000 } else { 0 },
        mode: session.mode(),
        sample_period: session.sample_period(),
        poll_interval_ns: session.poll_interval_ns(),
        start_time_ns: 0,
        start_wall_ns: if host_info { wall_ns() } else { 0 },
        events: session.events().to_vec(),
        cpus: session.cpus(),
        cpu_model: if host_info {
            cpu_model()
        } else {
            String::new()
        },
        command: command.to_vec(),
        hostname: if host_info {
            read_trimmed("/proc/sys/kernel/hostname")
        } else {
            String::new()
        },
        kernel_release: if host_info {
            read_trimmed("/proc/sys/kernel/osrelease")
        } else {
            String::new()
        },
        format_arg: session.format_arg().to_vec(),
        sim_config: String::new(),
    }
}

impl<W: Write> Recorder<W> {
    /// Writes the capture's header and metadata for `session` to `out` (named `name` in
    /// errors).
    pub fn new(
        session: Session,
        out: W,
        name: &Path,
        command: &[String],
        host_info: bool,
    ) -> Result<Self, KmodError> {
        let meta = capture_meta(&session, command, host_info);
        let mut writer = Writer::with_name(out, name, &meta)?;
        let sys = session.sys.clone();
        let mut notes = Vec::new();
        let mut snapshots = None;
        let agg = if session.has_intervals() {
            session
                .cpus()
                .into_iter()
                .map(|cpu| AggCpuSummary {
                    cpu,
                    ..AggCpuSummary::default()
                })
                .collect()
        } else {
            Vec::new()
        };
        let pebs = if session.has_pebs() {
            session.cpus().into_iter().map(|cpu| PebsCpuSummary { cpu, ..PebsCpuSummary::default() }).collect()
        } else {
            Vec::new()
        };
        if session.format().flags & FMT_FL_STACKS != 0 {
            let mut snap = SymbolSnapshots::new();
            notes.extend(snap.write_kallsyms(&mut writer)?);
            snapshots = Some(snap);
        }
        Ok(Recorder {
            session,
            writer,
            chunk: Vec::with_capacity(64 << 10),
            sys,
            started_ns: None,
            stopped_ns: None,
            drains: 0,
            snapshots,
            stacks: 0,
            notes,
            agg,
            switch_every_ns: DEFAULT_SWITCH_INTERVAL_NS,
            last_switch_ns: 0,
            pebs,
        })
    }

    /// Interval formats: close every CPU's interval every `ns` (0:
    /// [`DEFAULT_SWITCH_INTERVAL_NS`]).
    pub fn set_switch_interval(&mut self, ns: u64) {
        self.switch_every_ns = if ns == 0 {
            DEFAULT_SWITCH_INTERVAL_NS
        } else {
            ns
        };
    }

    /// The longest the caller may wait before the next [`drain`](Self::drain) (ms):
    /// the interval switch period for an interval format, else `max_ms`.
    pub fn wake_ms(&self, max_ms: u32) -> u32 {
        if self.agg.is_empty() {
            return max_ms;
        }
        let every = self.switch_every_ns.div_ceil(1_000_000).max(1);
        max_ms.min(u32::try_from(every).unwrap_or(u32::MAX))
    }

    /// The session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session, to start, pause or instruct it.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Starts (or resumes) the session.
    pub fn start(&mut self) -> Result<(), KmodError> {
        self.session.start()?;
        self.started_ns.get_or_insert(self.sys.now_ns());
        self.last_switch_ns = self.sys.now_ns();
        self.stopped_ns = None;
        Ok(())
    }

    /// Pauses the session and drains what it wrote up to the pause.
    pub fn pause(&mut self) -> Result<(), KmodError> {
        self.session.stop()?;
        self.stopped_ns = Some(self.sys.now_ns());
        self.drain()?;
        Ok(())
    }

    /// Moves every record published in every CPU's ring into the capture (one chunk per
    /// CPU that had any); returns the records moved. Every hundredth call also writes a
    /// statistics snapshot and flushes, so an interrupted recording keeps them.
    ///
    /// For an interval format, reads every published interval instead, and closes every
    /// CPU's active interval when the switch period has passed.
    pub fn drain(&mut self) -> Result<u64, KmodError> {
        let mut total = 0;
        if !self.agg.is_empty() {
            for i in 0..self.agg.len() {
                total += self.drain_intervals(i)?;
            }
            let now = self.sys.now_ns();
            if self.session.is_running()
                && now.saturating_sub(self.last_switch_ns) >= self.switch_every_ns
            {
                total += self.close_intervals()?;
            }
        }
        if !self.pebs.is_empty() {
            total += self.drain_pebs(false)?;
        }
        let ring_slots = if self.agg.is_empty() && self.pebs.is_empty() {
            self.session.slots.len()
        } else {
            0
        };
        for i in 0..ring_slots {
            let (cpu, n) = self.session.drain_cpu(i, &mut self.chunk)?;
            if n > 0 {
                self.writer.write_chunk(cpu, &self.chunk, n)?;
                total += n;
                if let Some(snap) = self.snapshots.as_mut() {
                    for pid in stack_pids(&self.chunk) {
                        self.stacks += 1;
                        snap.note_pid(pid, &mut self.writer)?;
                    }
                }
            }
        }
        if let Some(snap) = self.snapshots.as_mut() {
            snap.refresh(&mut self.writer)?;
        }
        self.drains += 1;
        if self.drains % 100 == 0 {
            let stats = self.session.stats()?;
            self.writer.write_stats(&stats)?;
            self.writer.flush()?;
        }
        Ok(total)
    }

    /// PEBS formats: moves the records of every CPU that is not counting into the
    /// capture, read in place: CPUs masked at their threshold (then RESTART), or every
    /// CPU once the session is stopped (`all`). A CPU still counting is left alone:
    /// resetting its index would lose the records its PMU is writing.
    fn drain_pebs(&mut self, all: bool) -> Result<u64, KmodError> {
        let word = PebsFormat(self.session.module_info().pebs_format);
        let flags = if word.has(PebsFormat::SIMULATED) { FL_SIMULATED } else { 0 };
        let mut total = 0;
        for i in 0..self.pebs.len() {
            let waiting = self.session.pebs_waiting(i)?;
            if !all && !waiting {
                continue;
            }
            let (cpu, n) = self.session.drain_pebs(i, &mut self.chunk, flags)?;
            if n > 0 {
                self.writer.write_chunk(cpu, &self.chunk, n)?;
            }
            if !all {
                // Masked at its threshold (else skipped above): count again.
                self.session.restart_cpu(i)?;
            }
            if let Some(p) = self.pebs.get_mut(i) {
                p.records += n;
                p.drains += u64::from(n > 0);
            }
            total += n;
        }
        Ok(total)
    }

    /// Interval formats: moves the `i`-th CPU's published intervals into one capture
    /// chunk (acknowledging them) and snapshots the maps of the processes they name.
    fn drain_intervals(&mut self, i: usize) -> Result<u64, KmodError> {
        let Some(agg) = self.agg.get_mut(i) else {
            return Ok(0);
        };
        let (cpu, n) = self.session.drain_intervals(i, &mut self.chunk, agg)?;
        if n > 0 {
            self.writer.write_chunk(cpu, &self.chunk, n)?;
            if let Some(snap) = self.snapshots.as_mut() {
                for pid in entry_pids(&self.chunk) {
                    snap.note_pid(pid, &mut self.writer)?;
                }
            }
        }
        Ok(n)
    }

    /// Interval formats: closes every CPU's active interval, so that everything counted
    /// so far is in the capture: drain (acknowledging the published interval), RESTART
    /// (which publishes the active one), drain. Returns the records moved.
    pub fn close_intervals(&mut self) -> Result<u64, KmodError> {
        let mut total = 0;
        for i in 0..self.agg.len() {
            total += self.drain_intervals(i)?;
            let mut tries = 0;
            loop {
                match self.session.restart_cpu(i) {
                    Ok(()) => break,
                    // The handler published an interval since the drain (a full table):
                    // acknowledge it and switch again.
                    Err(e) if e.errno() == Some(libc::EBUSY) && tries < 16 => {
                        tries += 1;
                        total += self.drain_intervals(i)?;
                    }
                    Err(e) => return Err(e),
                }
            }
            total += self.drain_intervals(i)?;
        }
        self.last_switch_ns = self.sys.now_ns();
        Ok(total)
    }

    /// Progress so far.
    pub fn live(&self) -> Result<Live, KmodError> {
        let headers = self.session.headers()?;
        Ok(Live {
            elapsed_ns: self.elapsed_ns(),
            samples: headers.iter().map(|h| h.overflows).sum(),
            records: self.writer.records_written(),
            drops: headers.iter().map(|h| h.drops).sum(),
            bytes: self.writer.offset(),
        })
    }

    fn elapsed_ns(&self) -> u64 {
        match self.started_ns {
            Some(s) => self
                .stopped_ns
                .unwrap_or_else(|| self.sys.now_ns())
                .saturating_sub(s),
            None => 0,
        }
    }

    /// Stops the session (if it still runs), drains it, writes the kernel's statistics
    /// and the END chunk, and destroys the session.
    pub fn finish(mut self, exit_status: i32) -> Result<RecordSummary, KmodError> {
        match self.session.stop() {
            Ok(()) => self.stopped_ns = Some(self.sys.now_ns()),
            // Not running: paused by us or by a process holding the same file.
            Err(e) if e.errno() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
        self.stopped_ns.get_or_insert_with(|| self.sys.now_ns());
        if !self.pebs.is_empty() {
            // Stopped: no CPU counts any more, every record is final.
            self.drain_pebs(true)?;
            for i in 0..self.pebs.len() {
                let h = self.session.pebs_header(i)?;
                if let Some(p) = self.pebs.get_mut(i) {
                    p.header = h;
                }
            }
            if let Some(note) = self.session.pebs_conflict_note() {
                self.notes.push(note);
            }
        } else if self.agg.is_empty() {
            self.drain()?;
        } else {
            // The active intervals too: every dispatched sample ends in the capture.
            self.close_intervals()?;
        }
        let stats = self.session.stats()?;
        self.writer.write_stats(&stats)?;
        let mut s = summarize(&stats);
        for mut a in std::mem::take(&mut self.agg) {
            a.dispatched = stats
                .iter()
                .find(|st| st.cpu == a.cpu)
                .map_or(0, |st| st.overflows);
            s.aggregate.push(a);
        }
        s.pebs = std::mem::take(&mut self.pebs);
        s.stacks = self.stacks;
        s.notes = std::mem::take(&mut self.notes);
        s.exit_status = exit_status;
        s.records = self.writer.records_written();
        s.elapsed_ns = self.elapsed_ns();
        let end = EndInfo {
            end_time_ns: 0,
            total_records: s.records,
            total_drops: s.drops,
            exit_status,
            reserved: 0,
        };
        let before_end = self.writer.offset();
        self.writer.finish(end)?;
        s.bytes = before_end
            + (size_of::<hrperf_abi::capture::ChunkHeader>() + size_of::<EndInfo>()) as u64;
        // The file is complete; a failed DESTROY only means another holder ended it.
        let _ = self.session.destroy();
        Ok(s)
    }
}

/// The pid of every stack record in `chunk` (records as the ring holds them).
fn stack_pids(chunk: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let mut off = 0;
    std::iter::from_fn(move || loop {
        let h = chunk.get(off..off + 8)?;
        let size = usize::from(u16::from_ne_bytes([h[6], h[7]]));
        let rec = chunk.get(off..off + size)?;
        if size < 8 {
            return None;
        }
        off += size;
        if let Ok(r) = StackRecord::parse(rec) {
            return Some(r.fixed.pid);
        }
    })
}

/// The pid of every ENTRY record of the aggregating format in `chunk` that names one.
fn entry_pids(chunk: &[u8]) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut off = 0;
    while let Some(h) = chunk.get(off..off + 8) {
        let size = usize::from(u16::from_ne_bytes([h[6], h[7]]));
        let Some(rec) = chunk.get(off..off + size).filter(|_| size >= 8) else {
            break;
        };
        off += size;
        if let Ok(e) = parse_entry(rec) {
            if e.pid != 0 && !pids.contains(&e.pid) {
                pids.push(e.pid);
            }
        }
    }
    pids
}

/// Totals of the kernel's per-CPU statistics.
fn summarize(stats: &[CpuStats]) -> RecordSummary {
    RecordSummary {
        samples: stats.iter().map(|s| s.overflows).sum(),
        drops: stats.iter().map(|s| s.drops).sum(),
        masked: stats.iter().map(|s| s.masked).sum(),
        multi_wraps: stats.iter().map(|s| s.multi_wraps).sum(),
        per_cpu: stats.to_vec(),
        ..RecordSummary::default()
    }
}

/// A command forked and held before `execve`, with the session's descriptor inherited.
fn spawn_command(sys: &dyn KmodSys, command: &[String], fd: i32) -> Result<HeldChild, KmodError> {
    let cmd_err = |source| KmodError::Command {
        cmd: command.join(" "),
        source,
    };
    let to_c = |s: &str| {
        CString::new(s).map_err(|_| cmd_err(std::io::Error::from_raw_os_error(libc::EINVAL)))
    };
    let path = sys.find_program(&command[0]).map_err(cmd_err)?;
    let argv = command
        .iter()
        .map(|a| to_c(a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut envp = Vec::new();
    for (k, v) in std::env::vars_os() {
        if k == ENV_FD {
            continue;
        }
        let mut kv = k.into_encoded_bytes();
        kv.push(b'=');
        kv.extend_from_slice(v.as_encoded_bytes());
        if let Ok(c) = CString::new(kv) {
            envp.push(c);
        }
    }
    envp.push(to_c(&format!("{ENV_FD}={fd}"))?);
    sys.spawn_held(&path, &argv, &envp, Some(fd))
        .map_err(cmd_err)
}

/// The recorded command: held before exec, then running, then reaped. Dropped while
/// held it lets the child exit (EOF on its go pipe); while running it kills and reaps it.
struct Child<'a> {
    sys: &'a dyn KmodSys,
    held: Option<HeldChild>,
    pid: i32,
    running: bool,
}

impl Child<'_> {
    fn release(&mut self, cmd: &[String]) -> Result<(), KmodError> {
        if let Some(h) = self.held.take() {
            self.running = true;
            self.sys
                .release_child(&h)
                .map_err(|source| KmodError::Command {
                    cmd: cmd.join(" "),
                    source,
                })?;
        }
        Ok(())
    }

    /// Whether it exited (and how), without waiting.
    fn try_wait(&mut self) -> Result<Option<i32>, KmodError> {
        if !self.running {
            return Ok(None);
        }
        let exited = self
            .sys
            .wait_child(self.pid, true)
            .map_err(|source| KmodError::Syscall {
                call: format!("wait4({})", self.pid),
                source,
            })?;
        if exited.is_some() {
            self.running = false;
        }
        Ok(exited.map(|e| e.status))
    }

    /// Ends it with `signal` and reaps it; its exit status.
    fn end(&mut self, signal: i32) -> i32 {
        if let Some(h) = self.held.take() {
            self.sys.close(h.go_fd); // EOF: the held child _exits without exec
            self.sys.close(h.err_fd);
            self.running = true;
        }
        if !self.running {
            return 0;
        }
        self.running = false;
        let _ = self.sys.kill(self.pid, signal);
        self.sys
            .wait_child(self.pid, false)
            .ok()
            .flatten()
            .map_or(0, |e| e.status)
    }
}

impl Drop for Child<'_> {
    fn drop(&mut self) {
        if self.held.is_some() || self.running {
            self.end(libc::SIGKILL);
        }
    }
}

/// Records a session into the capture file at `path` (an existing file there is moved
/// to `<path>.old` first, once the session exists). Returns when the command exits,
/// `opts.duration_ns` passes, or `stop` is set (then the command gets SIGTERM).
pub fn record_kmod_to_file(
    sys: Arc<dyn KmodSys>,
    opts: &KmodRecordOptions,
    path: &Path,
    stop: &AtomicBool,
    live: &mut dyn FnMut(&Live),
) -> Result<RecordSummary, KmodError> {
    let session = Session::create(sys.clone(), &opts.config)?;
    let mut child = match opts.command.first() {
        Some(_) => {
            let h = spawn_command(sys.as_ref(), &opts.command, session.fd())?;
            Some(Child {
                sys: sys.as_ref(),
                pid: h.pid,
                held: Some(h),
                running: false,
            })
        }
        None => None,
    };
    if path.exists() {
        let mut old = path.as_os_str().to_owned();
        old.push(".old");
        std::fs::rename(path, &old).map_err(|e| {
            KmodError::Config(format!(
                "cannot move the existing {} aside: {e}",
                path.display()
            ))
        })?;
    }
    let file = std::fs::File::create(path)
        .map_err(|e| KmodError::Config(format!("cannot create {}: {e}", path.display())))?;
    let mut rec = Recorder::new(session, file, path, &opts.command, opts.host_info)?;
    rec.set_switch_interval(opts.switch_interval_ns);
    rec.start()?;
    let mut pidfd = None;
    if let Some(c) = child.as_mut() {
        c.release(&opts.command)?;
        pidfd = sys.pidfd_open(c.pid).ok();
    }
    let result = record_loop(
        sys.as_ref(),
        &mut rec,
        child.as_mut(),
        pidfd,
        opts,
        stop,
        live,
    );
    if let Some(p) = pidfd {
        sys.close(p);
    }
    let exit_status = result?;
    rec.finish(exit_status)
}

/// Drains until the command exits, the duration passes or `stop` is set; returns the
/// command's exit status (0 without one).
fn record_loop<W: Write>(
    sys: &dyn KmodSys,
    rec: &mut Recorder<W>,
    mut child: Option<&mut Child<'_>>,
    pidfd: Option<i32>,
    opts: &KmodRecordOptions,
    stop: &AtomicBool,
    live: &mut dyn FnMut(&Live),
) -> Result<i32, KmodError> {
    let drain_ms = rec.wake_ms(if opts.drain_ms == 0 {
        DEFAULT_DRAIN_MS
    } else {
        opts.drain_ms
    });
    let start = sys.now_ns();
    let mut last_live = start;
    loop {
        let elapsed = sys.now_ns().saturating_sub(start);
        let left_ms = opts
            .duration_ns
            .map(|d| d.saturating_sub(elapsed).div_ceil(1_000_000));
        let timeout = left_ms.map_or(drain_ms, |l| l.min(u64::from(drain_ms)) as u32);
        let mut fds = vec![libc::pollfd {
            fd: rec.session.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if let Some(p) = pidfd {
            fds.push(libc::pollfd {
                fd: p,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        sys.poll(&mut fds, timeout as i32)
            .map_err(|source| KmodError::Syscall {
                call: "poll(/dev/hrperf)".into(),
                source,
            })?;
        rec.drain()?;
        if let Some(c) = child.as_deref_mut() {
            if let Some(status) = c.try_wait()? {
                return Ok(status);
            }
        }
        let now = sys.now_ns();
        if opts
            .duration_ns
            .is_some_and(|d| now.saturating_sub(start) >= d)
            || stop.load(Ordering::Relaxed)
        {
            // --duration or Ctrl-C ended the recording first: end the command like perf.
            return Ok(child.map_or(0, |c| c.end(libc::SIGTERM)));
        }
        if now.saturating_sub(last_live) >= 200_000_000 {
            last_live = now;
            live(&rec.live()?);
        }
    }
}

/// Runs one instructed-mode request on an open session descriptor (the C API's calls
/// and `hrperf poll|log|poll-log` on an attached fd).
pub fn instruct(sys: &dyn KmodSys, fd: i32, req: super::Ioctl<'static>) -> Result<(), KmodError> {
    let name = req.name();
    sys.ioctl(fd, req).map_err(|e| ioctl_error(name, e))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod stack_tests {
    use hrperf_fmt_llc_stack::record::{encode, StackFixed};

    use super::stack_pids;

    #[test]
    fn stack_pids_skips_other_records_and_stops_at_damage() {
        let mut chunk = Vec::new();
        let rec = |pid| StackFixed {
            pid,
            ..StackFixed::default()
        };
        assert!(encode(
            &mut chunk,
            &rec(7),
            &[0xffff_ffff_8100_0000],
            &[0x40_1000]
        ));
        // A LOST record (type 1, 16 bytes) between two stack records.
        chunk.extend(1u32.to_ne_bytes());
        chunk.extend(0u16.to_ne_bytes());
        chunk.extend(16u16.to_ne_bytes());
        chunk.extend(5u64.to_ne_bytes());
        assert!(encode(&mut chunk, &rec(9), &[], &[0x40_2000, 0x40_3000]));
        assert_eq!(stack_pids(&chunk).collect::<Vec<_>>(), [7, 9]);
        // A zero size or a record running past the end ends the walk, never panics.
        chunk.extend([0u8; 8]);
        assert_eq!(stack_pids(&chunk).count(), 2);
        assert_eq!(stack_pids(&chunk[..chunk.len() - 20]).count(), 1);
    }
}
