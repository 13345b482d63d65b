//! PEBS through perf (`hrperf record --source perf --format pebs`): the leader samples
//! with `precise_ip` and the memory fields, and every perf sample becomes the PEBS
//! capture record the zero-copy path writes, marked perf-sourced.
//!
//! Reference: `include/uapi/linux/perf_event.h` (`PERF_SAMPLE_*`, the
//! `PERF_RECORD_SAMPLE` field order, `union perf_sample_weight`, `union
//! perf_mem_data_src`); `arch/x86/events/core.c` (`x86_pmu_hw_config`: a `precise_ip`
//! above what the PMU supports is `EOPNOTSUPP`); `kernel/events/core.c`
//! (`perf_copy_attr`: unknown `sample_type` bits are `EINVAL`; `PERF_SAMPLE_PHYS_ADDR`
//! needs `perf_allow_kernel`, else `EACCES`); `tools/perf/util/evsel.c` (perf's own
//! `precise_ip` and `WEIGHT_STRUCT` fallbacks).
//!
//! - **Open**: the (only) event is opened with `precise_ip` 3, then 2, then 1 (starting
//!   at the level of an explicit `:p`/`:pp`/`:ppp`): `EINVAL`/`EOPNOTSUPP` means "try
//!   lower". `sample_type` is [`PEBS_SAMPLE_TYPE`]; `EINVAL` with
//!   `PERF_SAMPLE_WEIGHT_STRUCT` is retried at the same level with `PERF_SAMPLE_WEIGHT`
//!   (kernels before 5.12), `EACCES`/`EPERM` with `PERF_SAMPLE_PHYS_ADDR` is retried
//!   without it (it needs root or `CAP_PERFMON`/`CAP_SYS_ADMIN`). Below 1 the source
//!   gives up: "no precise (PEBS) sampling for EVENT on this machine". A machine without
//!   a hardware PMU (`ENOENT`/`ENODEV`) gets the same message with the reason; a
//!   software event is refused before anything is opened (the kernel accepts
//!   `precise_ip` on software events and ignores it).
//! - **Samples**: each `PERF_RECORD_SAMPLE` is synthesised into a capture record by
//!   [`hrperf_fmt_pebs::record::encode_perf`] (adaptive basic + meminfo, `dsrc_kind =
//!   PerfMemDataSrc`, `FL_PERF_SOURCED | FL_TIME`) and queued per CPU in the
//!   [`PerfPebs`] handle, which the recorder empties into capture chunks
//!   ([`RecordOptions::perf_pebs`](crate::record::RecordOptions::perf_pebs)). There is
//!   no DS area and no zero-copy handler on this path: the kernel's perf copied the
//!   record already. `PERF_RECORD_LOST`/`LOST_SAMPLES` count as source losses as in
//!   every overflow recording. The physical address has no field in the capture record
//!   and is not kept.
//!
//! Verified only against the syscall fake (`fake.rs`, the tests below): no machine the
//! project runs on has a PMU with PEBS, so this has not met a real PEBS record.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use hrperf_abi::event::EVENT_FL_PRECISE;
use hrperf_abi::format::SAMPLE_OVERFLOW;
use hrperf_abi::MAX_COUNTERS;
use hrperf_fmt_pebs::record::{encode_perf, PerfMemSample, PERF_RECORD_SIZE};

use super::ring::{
    Record, MISC_CPUMODE_MASK, MISC_GUEST_KERNEL, MISC_KERNEL, PERF_RECORD_LOST,
    PERF_RECORD_LOST_SAMPLES, PERF_RECORD_SAMPLE, PERF_RECORD_THROTTLE, PERF_RECORD_UNTHROTTLE,
};
use super::sys::{
    PerfEventAttr, ATTR_PRECISE_IP_SHIFT, PERF_FLAG_FD_CLOEXEC, PERF_SAMPLE_ADDR, PERF_SAMPLE_CPU,
    PERF_SAMPLE_IP, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
};
use super::{EventSpec, PerfSource, RawSample, SourceError};

/// `PERF_SAMPLE_WEIGHT`: `u64 weight`.
pub const PERF_SAMPLE_WEIGHT: u64 = 1 << 14;
/// `PERF_SAMPLE_DATA_SRC`: `u64 data_src` (`union perf_mem_data_src`).
pub const PERF_SAMPLE_DATA_SRC: u64 = 1 << 15;
/// `PERF_SAMPLE_PHYS_ADDR`: `u64 phys_addr` (Linux 4.13+, privileged).
pub const PERF_SAMPLE_PHYS_ADDR: u64 = 1 << 19;
/// `PERF_SAMPLE_WEIGHT_STRUCT`: `union perf_sample_weight { u64 full; struct { u32
/// var1_dw; u16 var2_w; u16 var3_w; } }` in the `WEIGHT` slot (Linux 5.12+).
pub const PERF_SAMPLE_WEIGHT_STRUCT: u64 = 1 << 24;

/// `sample_type` of a PEBS leader before any fallback.
pub const PEBS_SAMPLE_TYPE: u64 = PERF_SAMPLE_IP
    | PERF_SAMPLE_TID
    | PERF_SAMPLE_TIME
    | PERF_SAMPLE_CPU
    | PERF_SAMPLE_ADDR
    | PERF_SAMPLE_DATA_SRC
    | PERF_SAMPLE_WEIGHT_STRUCT
    | PERF_SAMPLE_PHYS_ADDR;

/// Highest `precise_ip`.
const MAX_PRECISE: u8 = 3;

/// What the kernel accepted for a CPU's PEBS leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PebsSettings {
    /// `precise_ip` (1..=3).
    pub precise_ip: u8,
    /// `PERF_SAMPLE_WEIGHT_STRUCT` (else `PERF_SAMPLE_WEIGHT`).
    pub weight_struct: bool,
    /// `PERF_SAMPLE_PHYS_ADDR`.
    pub phys_addr: bool,
}

impl PebsSettings {
    /// The leader's `sample_type`.
    pub fn sample_type(&self) -> u64 {
        let weight = if self.weight_struct {
            PERF_SAMPLE_WEIGHT_STRUCT
        } else {
            PERF_SAMPLE_WEIGHT
        };
        let phys = if self.phys_addr {
            PERF_SAMPLE_PHYS_ADDR
        } else {
            0
        };
        (PEBS_SAMPLE_TYPE & !(PERF_SAMPLE_WEIGHT_STRUCT | PERF_SAMPLE_PHYS_ADDR)) | weight | phys
    }
}

/// One CPU's synthesised capture records not yet taken by the recorder.
#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    records: u64,
}

#[derive(Debug, Default)]
struct State {
    /// By CPU.
    settings: BTreeMap<u32, PebsSettings>,
    /// By CPU (the CPU whose ring held the sample).
    pending: BTreeMap<u32, Pending>,
    /// Records synthesised so far.
    records: u64,
    /// Samples too short for their `sample_type` (not synthesised).
    bad_samples: u64,
}

/// The perf source's PEBS output, shared with the recorder (as the sim source's
/// `PebsPmu` is): capture records per CPU, ready to be written as they are.
#[derive(Clone, Debug, Default)]
pub struct PerfPebs(Arc<Mutex<State>>);

impl PerfPebs {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `cpu`'s queued capture records: `(bytes, count)`, records back to back.
    pub fn take(&self, cpu: u32) -> (Vec<u8>, u64) {
        match self.lock().pending.remove(&cpu) {
            Some(p) => (p.bytes, p.records),
            None => (Vec::new(), 0),
        }
    }

    /// What the kernel accepted on `cpu`.
    pub fn settings(&self, cpu: u32) -> Option<PebsSettings> {
        self.lock().settings.get(&cpu).copied()
    }

    /// The lowest `precise_ip` any CPU got (what a summary should say).
    pub fn precise_ip(&self) -> Option<u8> {
        self.lock().settings.values().map(|s| s.precise_ip).min()
    }

    /// Capture records synthesised so far.
    pub fn records(&self) -> u64 {
        self.lock().records
    }

    /// Samples too short for their `sample_type` (counted, not synthesised).
    pub fn bad_samples(&self) -> u64 {
        self.lock().bad_samples
    }

    fn push(&self, ring_cpu: u32, s: &PerfMemSample) {
        let mut st = self.lock();
        let p = st.pending.entry(ring_cpu).or_default();
        let at = p.bytes.len();
        p.bytes.resize(at + PERF_RECORD_SIZE, 0);
        match encode_perf(s, &mut p.bytes[at..]) {
            Ok(n) => {
                p.bytes.truncate(at + n);
                p.records += 1;
                st.records += 1;
            }
            // Cannot happen (the buffer is PERF_RECORD_SIZE); never write half a record.
            Err(_) => {
                p.bytes.truncate(at);
                st.bad_samples += 1;
            }
        }
    }
}

/// The PEBS fields of one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PebsFields {
    pub misc: u16,
    pub ip: u64,
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub addr: u64,
    pub cpu: u32,
    /// `PERF_SAMPLE_WEIGHT`, or `var1_dw, var2_w, var3_w` of `WEIGHT_STRUCT`.
    pub weight: (u64, u16, u16),
    pub data_src: u64,
    pub phys_addr: u64,
}

impl PebsFields {
    fn mem_sample(&self, settings: PebsSettings) -> PerfMemSample {
        let (var1, var2, var3) = self.weight;
        PerfMemSample {
            cpu: self.cpu,
            time_ns: Some(self.time),
            ip: self.ip,
            addr: self.addr,
            data_src: self.data_src,
            latency: var1,
            instr_latency: (settings.weight_struct && var2 != 0).then_some(var2),
            retire_latency: (settings.weight_struct && var3 != 0).then_some(var3),
        }
    }
}

/// Decodes a `PERF_RECORD_SAMPLE` of a PEBS leader with `sample_type`: `IP, TID, TIME,
/// ADDR, CPU` then `WEIGHT`/`WEIGHT_STRUCT, DATA_SRC` then `PHYS_ADDR` (the uapi
/// order; nothing between them is sampled). `None` if the record is too short.
pub(super) fn parse_sample(sample_type: u64, rec: &Record<'_>) -> Option<PebsFields> {
    let (_, misc, _) = rec.header()?;
    let mut f = PebsFields {
        misc,
        ..PebsFields::default()
    };
    let mut off = 8;
    let mut next = |bit: u64| -> Option<Option<usize>> {
        if sample_type & bit == 0 {
            return Some(None);
        }
        let at = off;
        off += 8;
        (at + 8 <= rec.len()).then_some(Some(at))
    };
    if let Some(o) = next(PERF_SAMPLE_IP)? {
        f.ip = rec.u64_at(o)?;
    }
    if let Some(o) = next(PERF_SAMPLE_TID)? {
        f.pid = rec.u32_at(o)?;
        f.tid = rec.u32_at(o + 4)?;
    }
    if let Some(o) = next(PERF_SAMPLE_TIME)? {
        f.time = rec.u64_at(o)?;
    }
    if let Some(o) = next(PERF_SAMPLE_ADDR)? {
        f.addr = rec.u64_at(o)?;
    }
    if let Some(o) = next(PERF_SAMPLE_CPU)? {
        f.cpu = rec.u32_at(o)?;
    }
    if let Some(o) = next(PERF_SAMPLE_WEIGHT_STRUCT)? {
        let var1 = rec.u32_at(o)?;
        let var2 = u16::from_ne_bytes(rec.bytes_at::<2>(o + 4)?);
        let var3 = u16::from_ne_bytes(rec.bytes_at::<2>(o + 6)?);
        f.weight = (u64::from(var1), var2, var3);
    } else if let Some(o) = next(PERF_SAMPLE_WEIGHT)? {
        f.weight = (rec.u64_at(o)?, 0, 0);
    }
    if let Some(o) = next(PERF_SAMPLE_DATA_SRC)? {
        f.data_src = rec.u64_at(o)?;
    }
    if let Some(o) = next(PERF_SAMPLE_PHYS_ADDR)? {
        f.phys_addr = rec.u64_at(o)?;
    }
    Some(f)
}

/// The errno's name, for messages.
fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ENOENT) => "ENOENT".into(),
        Some(libc::ENODEV) => "ENODEV".into(),
        _ => e.to_string(),
    }
}

/// Checks a PEBS configuration before anything is opened or forked.
/// `--pebs-ld-lat` for PEBS through perf: the load-latency threshold (core cycles) goes
/// into the leader's `config1`, perf's `ldlat` field (`config1:0-15` in
/// `/sys/bus/event_source/devices/cpu/format/ldlat`). It means something only for the
/// load-latency event MEM_TRANS_RETIRED.LOAD_LATENCY (`-e r01cd`), so anything else is
/// refused rather than silently ignored.
pub fn set_load_latency(events: &mut [EventSpec], cycles: u32) -> Result<(), SourceError> {
    use hrperf_abi::event::EVENT_TYPE_RAW;
    use hrperf_fmt_pebs::coexist::LOAD_LATENCY_EVENT;
    let [ev] = events else {
        return Err(SourceError::Config("--pebs-ld-lat needs exactly one event, the load-latency event (-e r01cd)".into()));
    };
    if ev.desc.kind != EVENT_TYPE_RAW || ev.desc.config & 0xffff != LOAD_LATENCY_EVENT {
        return Err(SourceError::Config(format!(
            "--pebs-ld-lat applies to the load-latency event (-e r01cd, MEM_TRANS_RETIRED.LOAD_LATENCY), not {}",
            ev.name
        )));
    }
    if cycles == 0 || cycles > 0xffff {
        return Err(SourceError::Config(format!("--pebs-ld-lat takes 1 to 65535 cycles, not {cycles}")));
    }
    ev.desc.config1 = u64::from(cycles);
    Ok(())
}

pub(super) fn validate_pebs(events: &[EventSpec], overflow: bool) -> Result<(), SourceError> {
    let bad = |m: String| Err(SourceError::Config(m));
    if !overflow {
        return bad("PEBS samples on counter overflow: use -c PERIOD or -F FREQ, not --poll-us".into());
    }
    match events {
        [ev] if !super::needs_pmu(&ev.desc) => bad(format!(
            "no precise (PEBS) sampling for {}: it is a software event; give a hardware event \
             (e.g. -e cycles, or a raw load-latency event -e rNNNN)",
            ev.name
        )),
        [_] => Ok(()),
        _ => bad(format!(
            "--format pebs with the perf source samples one event, got {}: give one -e EVENT",
            events.len()
        )),
    }
}

impl PerfSource {
    /// The PEBS output of a `--format pebs` source (`PerfConfig::pebs`), for
    /// [`RecordOptions::perf_pebs`](crate::record::RecordOptions::perf_pebs).
    pub fn pebs(&self) -> Option<PerfPebs> {
        self.pebs.clone()
    }

    /// Opens the PEBS leader of `cpu` with the `precise_ip`/`sample_type` fallbacks of
    /// the module docs, starting from what an earlier CPU settled on.
    pub(super) fn open_pebs_leader(
        &mut self,
        base: &PerfEventAttr,
        pid: i32,
        cpu: u32,
        ev: &EventSpec,
    ) -> Result<i32, SourceError> {
        let pebs = self.pebs.clone().unwrap_or_default();
        let first = pebs.lock().settings.values().next().copied();
        let asked = if ev.desc.flags & EVENT_FL_PRECISE != 0 {
            ((ev.desc.flags >> 8) & 3) as u8
        } else {
            0
        };
        let top = match (first, asked) {
            (Some(s), _) => s.precise_ip,
            (None, 0) => MAX_PRECISE,
            (None, n) => n,
        };
        let mut phys = first.is_none_or(|s| s.phys_addr);
        let mut refused: Vec<String> = Vec::new();
        for precise in (1..=top).rev() {
            let mut weight_struct = first.is_none_or(|s| s.weight_struct);
            loop {
                let settings = PebsSettings {
                    precise_ip: precise,
                    weight_struct,
                    phys_addr: phys,
                };
                let mut attr = *base;
                attr.flags = (attr.flags & !(3 << ATTR_PRECISE_IP_SHIFT))
                    | (u64::from(precise) << ATTR_PRECISE_IP_SHIFT);
                attr.sample_type = settings.sample_type();
                let e = match self.sys.perf_event_open(
                    &attr,
                    pid,
                    cpu as i32,
                    -1,
                    PERF_FLAG_FD_CLOEXEC,
                ) {
                    Ok(fd) => {
                        if first.is_none() {
                            self.pebs_notes(ev, top, settings, &refused);
                        }
                        pebs.lock().settings.insert(cpu, settings);
                        return Ok(fd);
                    }
                    Err(e) => e,
                };
                match e.raw_os_error() {
                    Some(libc::EACCES) | Some(libc::EPERM) if phys => phys = false,
                    Some(libc::EINVAL) if weight_struct => weight_struct = false,
                    Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => {
                        refused.push(format!("{precise} ({})", errno_name(&e)));
                        break;
                    }
                    Some(libc::ENOENT) | Some(libc::ENODEV) => {
                        let why = match self.open_error(e, ev, cpu) {
                            SourceError::NoPmu { detail, .. } => {
                                format!("no hardware PMU ({detail})")
                            }
                            other => other.to_string(),
                        };
                        return Err(no_precise(&ev.name, &why));
                    }
                    _ => return Err(self.open_error(e, ev, cpu)),
                }
            }
        }
        Err(no_precise(
            &ev.name,
            &format!(
                "perf_event_open on cpu {cpu} refused precise_ip {}",
                refused.join(", ")
            ),
        ))
    }

    fn pebs_notes(&mut self, ev: &EventSpec, top: u8, s: PebsSettings, refused: &[String]) {
        if s.precise_ip < top {
            self.note(format!(
                "{}: precise_ip {} (the PMU refused precise_ip {})",
                ev.name,
                s.precise_ip,
                refused.join(", ")
            ));
        }
        if !s.weight_struct {
            self.note(
                "the kernel refused PERF_SAMPLE_WEIGHT_STRUCT (EINVAL, before Linux 5.12); \
                 latencies come from PERF_SAMPLE_WEIGHT, without instruction or retire latency"
                    .into(),
            );
        }
        if !s.phys_addr {
            self.note(
                "PERF_SAMPLE_PHYS_ADDR was refused (it needs root or CAP_PERFMON); sampling \
                 without physical addresses"
                    .into(),
            );
        }
    }

    /// Drains every ring of a PEBS source: samples become capture records in the
    /// [`PerfPebs`] handle (and plain samples in `out`, for the recorder's clock and
    /// counts; they are not dispatched to a format).
    pub(super) fn drain_pebs(&mut self, out: &mut Vec<RawSample>) {
        let Some(pebs) = self.pebs.clone() else {
            return;
        };
        let nr = self.info.events.len() as u32;
        for g in &mut self.groups {
            let Some(ring) = &g.ring else {
                continue;
            };
            let Some(settings) = pebs.settings(g.cpu) else {
                continue;
            };
            let sample_type = settings.sample_type();
            let (stats, cpu) = (&mut g.stats, g.cpu);
            let drained = ring.drain(|rec| {
                let Some((kind, _, _)) = rec.header() else {
                    return;
                };
                match kind {
                    PERF_RECORD_SAMPLE => match parse_sample(sample_type, &rec) {
                        Some(f) => {
                            pebs.push(cpu, &f.mem_sample(settings));
                            let mode = f.misc & MISC_CPUMODE_MASK;
                            out.push(RawSample {
                                cpu: f.cpu,
                                kind: SAMPLE_OVERFLOW,
                                pid: f.pid,
                                tid: f.tid,
                                time_ns: f.time,
                                ip: f.ip,
                                kernel_ip: mode == MISC_KERNEL || mode == MISC_GUEST_KERNEL,
                                addr: f.addr,
                                ovfl_counter: 0,
                                nr,
                                raw: [0; MAX_COUNTERS],
                            });
                            stats.samples += 1;
                        }
                        None => {
                            pebs.lock().bad_samples += 1;
                            stats.corrupt_bytes += rec.len() as u64;
                        }
                    },
                    PERF_RECORD_LOST => stats.lost += rec.u64_at(16).unwrap_or(0),
                    PERF_RECORD_LOST_SAMPLES => stats.lost += rec.u64_at(8).unwrap_or(0),
                    PERF_RECORD_THROTTLE => stats.throttles += 1,
                    PERF_RECORD_UNTHROTTLE => stats.unthrottles += 1,
                    _ => {}
                }
            });
            stats.corrupt_bytes += drained.corrupt_bytes;
        }
    }
}

fn no_precise(event: &str, why: &str) -> SourceError {
    SourceError::Config(format!(
        "no precise (PEBS) sampling for {event} on this machine: {why}; record with --source sim \
         for the simulated PEBS PMU"
    ))
}

#[cfg(test)]
mod tests;
