//! `hrperf import perf.data`: a `perf record` file to an llc-stack capture.
//!
//! Reference: `tools/perf/Documentation/perf.data-file-format.txt` (Linux) and
//! `include/uapi/linux/perf_event.h` for the records; the file is parsed by the
//! [`linux_perf_data`] crate (records in time order, round by round).
//!
//! | perf.data | capture |
//! |---|---|
//! | `PERF_RECORD_SAMPLE` | one llc-stack record: time, ip, addr, cpu, pid, tid, weight = `PERIOD` (1 without), `STK_IMPORTED \| STK_PERF_SOURCED`; the callchain split at its context markers into kernel and user frames (a sample without a callchain stands for `[ip]`) |
//! | `PERF_RECORD_COMM` | the task's `comm` in later records; `SYM_COMM` per process |
//! | `PERF_RECORD_MMAP`/`MMAP2` (user) | `SYM_MAPS` per process: `start-end perms offset 00:00 0 path` lines, as `/proc/<pid>/maps` |
//! | `PERF_RECORD_FORK` | the child process starts with its parent's maps and name |
//! | `PERF_RECORD_LOST` | counted ([`ImportSummary::lost`]) |
//! | kernel MMAPs, others | counted by kind in [`ImportSummary::skipped`] |
//!
//! Kernel frames are resolved with the running machine's `/proc/kallsyms` (written as
//! `SYM_KALLSYMS`), as `perf report` does for a file recorded on the same machine.
//! Timestamps are perf's clock (`CLOCK_PERF`), or `CLOCK_MONOTONIC` for `perf record -k
//! monotonic`.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use hrperf_abi::capture::{
    CLOCK_MONOTONIC, CLOCK_PERF, SOURCE_PERF, SYM_COMM, SYM_KALLSYMS, SYM_MAPS,
};
use hrperf_abi::record::{MISC_KERNEL, MISC_OVERFLOW};
use hrperf_fmt_llc_stack::record::{
    StackFixed, STK_IMPORTED, STK_KERNEL_IP, STK_NO_KERNEL_STACK, STK_NO_USER_STACK,
    STK_PERF_SOURCED,
};
use linux_perf_data::linux_perf_event_reader::{
    AttrFlags, ClockId, CpuMode, EventRecord, PerfClock, RecordType, SampleFormat, SamplingPolicy,
};
use linux_perf_data::{PerfFileReader, PerfFileRecord};

use super::{comm_field, llc_stack_meta, ImportError, ImportSummary, StackSink};
use crate::source::perf::split_callchain;
use crate::source::EventSpec;

/// Options of [`import_perf_data`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfDataOptions {
    /// Kernel symbols to store (`SYM_KALLSYMS`): `/proc/kallsyms` by default; `None`
    /// stores none (kernel frames then stay addresses).
    pub kallsyms: Option<PathBuf>,
}

impl Default for PerfDataOptions {
    fn default() -> Self {
        PerfDataOptions {
            kallsyms: Some(PathBuf::from("/proc/kallsyms")),
        }
    }
}

/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: an `MMAP2` carries a build id instead of inode data.
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// A reader that tracks the file offset the parser has reached (for progress and
/// damage offsets), shared with the importer through `pos`.
struct Counting<R> {
    inner: R,
    pos: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos.set(self.pos.get() + n as u64);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let at = self.inner.seek(to)?;
        self.pos.set(at);
        Ok(at)
    }
}

/// What is known about a process while reading.
#[derive(Default)]
struct Process {
    /// `/proc/<pid>/maps`-style lines of its user mappings.
    maps: String,
    /// Its command name (the main thread's latest `COMM`).
    comm: Vec<u8>,
}

/// Imports the perf.data file `input` into an llc-stack capture at `output`.
/// `progress(bytes_read, file_size)` is called every few thousand records.
///
/// Errors only if the input cannot be opened or is not a readable perf.data file, or
/// the output cannot be written; damage in the middle of the records ends the import
/// with what was read before it written and finished, and is described in
/// [`ImportSummary::damage`].
pub fn import_perf_data(
    input: &Path,
    output: &Path,
    opts: &PerfDataOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportSummary, ImportError> {
    let read_err = |source: io::Error| ImportError::Read {
        path: input.to_owned(),
        source,
    };
    let mut file = File::open(input).map_err(read_err)?;
    let total = file.metadata().map_err(read_err)?.len();
    check_sections(&mut file, total).map_err(|problem| ImportError::Input {
        path: input.to_owned(),
        problem,
    })?;
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    let pos = Rc::new(Cell::new(0));
    let reader = Counting {
        inner: BufReader::with_capacity(1 << 20, file),
        pos: pos.clone(),
    };
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(reader).map_err(|e| ImportError::Input {
        path: input.to_owned(),
        problem: format!("not a perf.data file hrperf can read: {e}"),
    })?;

    let mut summary = ImportSummary::default();
    let mut meta = llc_stack_meta();
    meta.source = SOURCE_PERF;
    meta.clock = CLOCK_PERF;
    let attrs = perf_file.event_attributes();
    for (i, a) in attrs.iter().enumerate() {
        let name = a
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("event{i}"));
        let desc = crate::source::perf::parse_events(&name)
            .ok()
            .and_then(|v| v.into_iter().next())
            .map(|e| e.desc)
            .unwrap_or_else(zerocopy::FromZeros::new_zeroed);
        let attr = a.attributes();
        if i == 0 {
            if let SamplingPolicy::Period(p) = attr.sampling_policy {
                meta.sample_period = p.get();
            }
            if matches!(attr.clock, PerfClock::ClockId(ClockId::Monotonic)) {
                meta.clock = CLOCK_MONOTONIC;
            }
        }
        meta.events.push(EventSpec { name, desc });
    }
    // Per attr: whether its samples have a callchain / a period, and what they exclude.
    let attr_info: Vec<(bool, bool, u32)> = attrs
        .iter()
        .map(|a| {
            let at = a.attributes();
            let mut no = 0;
            if at.flags.contains(AttrFlags::EXCLUDE_CALLCHAIN_KERNEL) {
                no |= STK_NO_KERNEL_STACK;
            }
            if at.flags.contains(AttrFlags::EXCLUDE_CALLCHAIN_USER) {
                no |= STK_NO_USER_STACK;
            }
            (
                at.sample_format.contains(SampleFormat::CALLCHAIN),
                at.sample_format.contains(SampleFormat::PERIOD),
                no,
            )
        })
        .collect();
    if let Ok(Some(cmd)) = perf_file.cmdline() {
        meta.command = cmd.iter().map(|s| s.replace('\0', "")).collect();
    }
    if let Ok(Some(h)) = perf_file.hostname() {
        meta.hostname = h.to_owned();
    }
    if let Ok(Some(r)) = perf_file.os_release() {
        meta.kernel_release = r.to_owned();
    }
    if let Ok(Some(d)) = perf_file.cpu_desc() {
        meta.cpu_model = d.to_owned();
    }
    if let Ok(Some(n)) = perf_file.nr_cpus() {
        meta.cpus = (0..n.nr_cpus_available.min(hrperf_abi::MAX_CPUS as u32)).collect();
    }
    if let Ok(Some(range)) = perf_file.sample_time_range() {
        meta.start_time_ns = range.first_sample_time;
    }

    let mut sink = StackSink::create(output, &meta)?;
    let mut procs: HashMap<i32, Process> = HashMap::new();
    let mut comms: HashMap<i32, [u8; 16]> = HashMap::new();
    // Every kernel address a sample holds, to store just the kallsyms lines they need.
    let mut kernel_addrs: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let (mut kernel, mut user) = (
        Vec::<u64>::with_capacity(128),
        Vec::<u64>::with_capacity(128),
    );
    let mut nrec: u64 = 0;
    loop {
        let record = match record_iter.next_record(&mut perf_file) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                summary.damage = Some(format!(
                    "damaged perf.data at file offset {} (after {nrec} records): {e}",
                    pos.get()
                ));
                break;
            }
        };
        nrec += 1;
        if nrec % 16384 == 0 {
            progress(pos.get(), total);
        }
        let (attr_index, raw) = match record {
            PerfFileRecord::EventRecord { attr_index, record } => (attr_index, record),
            PerfFileRecord::UserRecord(u) => {
                summary.skip(format!("perf {:?}", u.record_type));
                continue;
            }
        };
        // linux-perf-event-reader asserts on an MMAP2 build id longer than 20 bytes;
        // check it here so that damaged input is counted, not a panic.
        if raw.record_type == RecordType::MMAP2 && raw.misc & MISC_MMAP_BUILD_ID != 0 {
            let len = raw.data.get(32..33).map(|d| d.as_slice()[0]);
            if len.is_none_or(|l| l > 20) {
                summary.skip("malformed MMAP2");
                continue;
            }
        }
        let parsed = match raw.parse() {
            Ok(p) => p,
            Err(_) => {
                summary.skip(format!("malformed {:?}", raw.record_type));
                continue;
            }
        };
        match parsed {
            EventRecord::Sample(s) => {
                summary.samples += 1;
                let (has_chain, has_period, no_stacks) = attr_info
                    .get(attr_index)
                    .copied()
                    .unwrap_or((false, false, 0));
                let kernel_ip = matches!(s.cpu_mode, CpuMode::Kernel | CpuMode::GuestKernel);
                let ip = s.ip.unwrap_or(0);
                kernel.clear();
                user.clear();
                let mut flags = STK_IMPORTED | STK_PERF_SOURCED;
                match s.callchain.filter(|_| has_chain) {
                    Some(chain) => {
                        summary.stacks += 1;
                        split_callchain(
                            (0..chain.len()).map_while(|i| chain.get(i)),
                            kernel_ip,
                            &mut kernel,
                            &mut user,
                        );
                        flags |= no_stacks;
                    }
                    None if kernel_ip => kernel.push(ip),
                    None => user.push(ip),
                }
                if kernel_ip {
                    flags |= STK_KERNEL_IP;
                }
                let pid = s.pid.unwrap_or(0);
                let tid = s.tid.unwrap_or(pid);
                let comm = comms
                    .get(&tid)
                    .or_else(|| comms.get(&pid))
                    .copied()
                    .unwrap_or_default();
                let weight = if has_period { s.period.unwrap_or(1) } else { 1 };
                let fixed = StackFixed {
                    misc: MISC_OVERFLOW | if kernel_ip { MISC_KERNEL } else { 0 },
                    time_ns: s.timestamp.unwrap_or(0),
                    ip,
                    addr: s.addr.unwrap_or(0),
                    weight,
                    cpu: s.cpu.unwrap_or(0),
                    pid: pid as u32,
                    tid: tid as u32,
                    flags,
                    comm,
                };
                kernel_addrs.extend(kernel.iter().copied());
                sink.push(&mut summary, fixed, &kernel, &user)?;
            }
            EventRecord::Comm(c) => {
                let name = c.name.as_slice();
                comms.insert(c.tid, comm_field(&name));
                let p = procs.entry(c.pid).or_default();
                if c.pid == c.tid || p.comm.is_empty() {
                    p.comm = hrperf_abi::name_bytes(&name).to_vec();
                }
            }
            EventRecord::Mmap(m) => {
                if m.pid == -1 || matches!(m.cpu_mode, CpuMode::Kernel | CpuMode::GuestKernel) {
                    summary.skip("kernel MMAP (kallsyms is used)");
                    continue;
                }
                let perms = if m.is_executable { "r-xp" } else { "r--p" };
                map_line(
                    procs.entry(m.pid).or_default(),
                    m.address,
                    m.length,
                    perms,
                    m.page_offset,
                    &m.path.as_slice(),
                );
            }
            EventRecord::Mmap2(m) => {
                if m.pid == -1 || matches!(m.cpu_mode, CpuMode::Kernel | CpuMode::GuestKernel) {
                    summary.skip("kernel MMAP2 (kallsyms is used)");
                    continue;
                }
                let prot = m.protection;
                let perms = [
                    if prot & 1 != 0 { 'r' } else { '-' },
                    if prot & 2 != 0 { 'w' } else { '-' },
                    if prot & 4 != 0 { 'x' } else { '-' },
                    if m.flags & 1 != 0 { 's' } else { 'p' },
                ]
                .iter()
                .collect::<String>();
                map_line(
                    procs.entry(m.pid).or_default(),
                    m.address,
                    m.length,
                    &perms,
                    m.page_offset,
                    &m.path.as_slice(),
                );
            }
            EventRecord::Fork(f) => {
                if f.pid != f.ppid {
                    // A new process: it starts with its parent's address space and name.
                    let (maps, comm) = procs
                        .get(&f.ppid)
                        .map(|p| (p.maps.clone(), p.comm.clone()))
                        .unwrap_or_default();
                    procs.insert(f.pid, Process { maps, comm });
                }
                if let Some(c) = comms.get(&f.ptid).copied() {
                    comms.insert(f.tid, c);
                }
            }
            EventRecord::Exit(_) => {}
            EventRecord::Lost(l) => summary.lost += l.count,
            other => summary.skip(record_kind(&other)),
        }
    }
    progress(total, total);

    if let Some(path) = &opts.kallsyms {
        match std::fs::read(path) {
            Ok(text) => {
                if crate::symsnap::kallsyms_hidden(&text) {
                    summary.notes.push(format!(
                        "{} shows every address as 0 (kptr_restrict): kernel frames stay \
                         unresolved; import as root or lower /proc/sys/kernel/kptr_restrict",
                        path.display()
                    ));
                }
                // Only the symbols the samples hit (and the ones ending them): the
                // capture stays small and reports do not parse 100k+ lines each time.
                let addrs: Vec<u64> = kernel_addrs.drain().collect();
                let subset = super::kallsyms_subset(&text, &addrs);
                sink.symbols(&mut summary, SYM_KALLSYMS, 0, &subset)?;
            }
            Err(e) => summary.notes.push(format!(
                "kernel symbols not stored: cannot read {}: {e}",
                path.display()
            )),
        }
        if !meta.kernel_release.is_empty() {
            if let Ok(now) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
                if now.trim() != meta.kernel_release.trim() {
                    summary.notes.push(format!(
                        "the perf.data was recorded on kernel {}, this machine runs {}: \
                         kernel symbols may not match",
                        meta.kernel_release,
                        now.trim()
                    ));
                }
            }
        }
    }
    let mut pids: Vec<(&i32, &Process)> = procs.iter().collect();
    pids.sort_by_key(|(pid, _)| **pid);
    for (&pid, p) in pids {
        let Ok(pid) = u32::try_from(pid) else {
            continue;
        };
        if !p.maps.is_empty() {
            sink.symbols(&mut summary, SYM_MAPS, pid, p.maps.as_bytes())?;
        }
        if !p.comm.is_empty() {
            sink.symbols(&mut summary, SYM_COMM, pid, &p.comm)?;
        }
    }
    sink.finish()?;
    Ok(summary)
}

/// Checks that every section the perf.data header names lies inside the file, before
/// the parser trusts their sizes (it allocates them whole: a damaged size must not become
/// a huge allocation). A file whose magic is not perf's is left to the parser to report.
///
/// Layout (`tools/perf/util/header.h`): `perf_file_header { u64 magic, size, attr_size;
/// perf_file_section attrs, data, event_types; u64 adds_features[4] }`, and after the
/// data section one `perf_file_section { u64 offset, size }` per feature bit set.
fn check_sections(file: &mut File, len: u64) -> Result<(), String> {
    let mut h = [0u8; 104];
    if file.read_exact(&mut h).is_err() {
        return Err(format!(
            "not a perf.data file: {len} bytes, shorter than perf's 104-byte header"
        ));
    }
    let big = match &h[0..8] {
        b"PERFILE2" => false,
        b"2ELIFREP" => true,
        _ => return Ok(()),
    };
    let word = |b: &[u8], i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8 * i..8 * i + 8]);
        if big {
            u64::from_be_bytes(w)
        } else {
            u64::from_le_bytes(w)
        }
    };
    let inside = |what: &str, at: usize, off: u64, size: u64| -> Result<(), String> {
        match off.checked_add(size) {
            Some(end) if end <= len => Ok(()),
            _ => Err(format!(
                "damaged perf.data: the {what} section (header offset {at}) says {size} bytes                  at file offset {off}, but the file has {len} bytes (truncated, or perf                  record did not finish)"
            )),
        }
    };
    inside("attrs", 24, word(&h, 3), word(&h, 4))?;
    let (data_off, data_size) = (word(&h, 5), word(&h, 6));
    inside("data", 40, data_off, data_size)?;
    let features: u32 = (0..4).map(|i| word(&h, 9 + i).count_ones()).sum();
    let table = data_off + data_size;
    inside("feature table", 72, table, 16 * u64::from(features))?;
    file.seek(SeekFrom::Start(table))
        .map_err(|e| format!("cannot seek to the feature table at offset {table}: {e}"))?;
    let mut t = vec![0u8; 16 * features as usize];
    file.read_exact(&mut t)
        .map_err(|e| format!("cannot read the feature table at offset {table}: {e}"))?;
    for i in 0..features as usize {
        let at = table + 16 * i as u64;
        inside("feature", at as usize, word(&t, 2 * i), word(&t, 2 * i + 1))?;
    }
    Ok(())
}

/// Appends one `/proc/<pid>/maps` line.
fn map_line(p: &mut Process, start: u64, len: u64, perms: &str, offset: u64, path: &[u8]) {
    use std::fmt::Write;
    let path = String::from_utf8_lossy(hrperf_abi::name_bytes(path));
    let _ = writeln!(
        p.maps,
        "{start:x}-{:x} {perms} {offset:08x} 00:00 0 {path}",
        start.saturating_add(len)
    );
}

/// A name for a record kind that is not imported.
fn record_kind(r: &EventRecord<'_>) -> String {
    match r {
        EventRecord::Throttle(_) => "THROTTLE".into(),
        EventRecord::Unthrottle(_) => "UNTHROTTLE".into(),
        EventRecord::ContextSwitch(_) => "SWITCH".into(),
        EventRecord::Raw(raw) => format!("{:?}", raw.record_type),
        _ => "other".into(),
    }
}

/// Names of skipped kinds in a stable order, for printing.
pub fn skipped_text(skipped: &BTreeMap<String, u64>) -> String {
    skipped
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
