//! The zero-copy PEBS format: `PEBS_OPS`, perfmon2's `"pebs"` sampling format
//! (`perfmon_pebs_core_smpl.c`, `perfmon_pebs_smpl.h`) for hrperf.
//!
//! Each CPU's buffer holds, after the core's `BufferHeader`, the format's
//! [`PebsHeader`] and the DS save area, then the PEBS record area, 256-byte aligned:
//!
//! ```text
//!   0  BufferHeader (core)        data_offset = AREA_OFFSET, data_size = area bytes
//! 192  PebsHeader (128 B)         layout, data cfg, record size, counts (overflows,
//!                                 threshold hits, full, restarts, records copied = 0)
//! 320  DsArea (448 B)             base/index/abs max/threshold/reset values
//! 768  PEBS record area           records written by the CPU (or the simulated assist)
//!                                 from pebs_buffer_base up to pebs_index
//! ```
//!
//! The DS pointers are linear addresses of the buffer as `init` saw it (the kernel's
//! mapping); a reader in another mapping uses only differences (`pebs_index -
//! pebs_buffer_base` is the number of record bytes). The CPU writes records straight
//! into the area; **the handler never reads or copies a record**: at the threshold PMI
//! it counts, and returns `CTRL_NOTIFY | CTRL_MASK`; `restart` resets `pebs_index` to the
//! base and the engine unmasks. `PebsHeader::records_copied` stays 0 to prove it.
//!
//! Argument: [`PebsArg`]. A session without a PEBS-capable PMU is refused by
//! `validate` with `-ENODEV`: the core (kmod) or source (sim, perf) overwrites
//! `PebsArg::flags`' [`ARG_FL_PMU_PRESENT`] bit and `PebsArg::pebs_format` with what it
//! detected before the format sees the argument; an empty argument means "nothing was
//! detected".

use core::mem::offset_of;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use hrperf_abi::errno::{E2BIG, EFAULT, EINVAL, ENODEV};
use hrperf_abi::format::{
    FormatOps, OverflowArg, Services, SessionParams, Uuid, CTRL_MASK, CTRL_NOTIFY, FMT_FL_PEBS,
    FORMAT_ABI_VERSION, MODE_OVERFLOW,
};
use hrperf_abi::{BufferHeader, MAX_COUNTERS};
use hrperf_engine::pmu::arm_value;
use hrperf_engine::ring::PRIVATE_OFFSET;
use hrperf_engine::Buffer;

use super::datasrc::DsrcKind;
use super::ds::{self, ds_off, Counter, DsArea, ThresholdPolicy, DS_RESET_SLOTS, DS_SIZE};
use super::layout::{self, Layout, PebsFormat, DATACFG_VALID, MAX_LBR_ENTRIES};

/// The PEBS format's UUID.
pub const PEBS_UUID: Uuid = Uuid([
    0x8b, 0x3e, 0x51, 0xc4, 0x27, 0x6d, 0x4f, 0x90, 0xa6, 0x1b, 0x5d, 0xe2, 0x97, 0x04, 0xc8, 0x3a,
]);
/// The PEBS format's name.
pub const PEBS_NAME: &str = "pebs";
/// The PEBS format's version, `major << 16 | minor` (1.0).
pub const PEBS_VERSION: u32 = 0x0001_0000;

/// Record area size when neither the argument nor the session asks (Linux's
/// `PEBS_BUFFER_SIZE`, 64 KiB).
pub const DEFAULT_AREA_SIZE: u64 = 64 << 10;
/// Largest record area.
pub const MAX_AREA_SIZE: u64 = 1 << 30;
/// Alignment of the record area (perfmon2's `PEBS_PADDING_ORDER`).
pub const AREA_ALIGN: u64 = 256;
/// Offset of [`PebsHeader`] in the buffer.
pub const HDR_OFFSET: usize = PRIVATE_OFFSET;
/// Size of [`PebsHeader`].
pub const HDR_SIZE: usize = core::mem::size_of::<PebsHeader>();
/// Offset of the DS save area in the buffer.
pub const DS_OFFSET: usize = HDR_OFFSET + HDR_SIZE;
/// Offset of the PEBS record area in the buffer.
pub const AREA_OFFSET: usize = (DS_OFFSET + DS_SIZE).next_multiple_of(AREA_ALIGN as usize);
/// [`PebsHeader::version`].
pub const HDR_VERSION: u32 = 1;

/// [`PebsArg::flags`]: a PEBS-capable PMU is present (set by the core, not the user).
pub const ARG_FL_PMU_PRESENT: u32 = 1 << 0;
/// Every defined [`PebsArg::flags`] bit.
pub const ARG_FL_KNOWN: u32 = ARG_FL_PMU_PRESENT;
/// [`PebsArg::policy`]: large PEBS with a fixed period, else a PMI per record.
pub const POLICY_AUTO: u32 = 0;
/// [`PebsArg::policy`]: a PMI after every record.
pub const POLICY_SINGLE: u32 = 1;
/// [`PebsArg::policy`]: a PMI only when the area is nearly full (needs a fixed period).
pub const POLICY_LARGE: u32 = 2;
/// GP counter reset values in [`PebsArg::reset`]; fixed counters follow.
pub const ARG_GP_RESETS: usize = 8;
/// Fixed counter reset values in [`PebsArg::reset`].
pub const ARG_FIXED_RESETS: usize = 4;

/// The format's argument (ABI rules of `hrperf_abi`: sized, append-only, zero means
/// default, unknown non-zero tail → `E2BIG`, unknown flags → `EINVAL`).
///
/// ```
/// use hrperf_fmt_pebs::format::{PebsArg, ARG_FL_PMU_PRESENT, POLICY_LARGE};
/// use hrperf_fmt_pebs::layout::{Layout, PebsFormat, DATACFG_MEMINFO};
/// use hrperf_fmt_pebs::datasrc::DseTable;
/// let mut arg = PebsArg::new();
/// // Filled by the core from what it detected, never trusted from the user:
/// arg.flags |= ARG_FL_PMU_PRESENT;
/// arg.pebs_format = PebsFormat::simulated(Layout::Adaptive, DseTable::Skylake).0;
/// // The user's choices:
/// arg.data_cfg = DATACFG_MEMINFO;
/// arg.ld_lat_threshold = 30;
/// arg.policy = POLICY_LARGE;
/// let bytes = arg.to_bytes();
/// assert_eq!(hrperf_fmt_pebs::format::parse_arg(&bytes), Ok(arg));
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PebsArg {
    /// Bytes filled by the caller: [`PEBS_ARG_SIZE`] (or more with a zero tail).
    pub size: u32,
    /// `ARG_FL_*`.
    pub flags: u32,
    /// The detected [`PebsFormat`] word (set by the core).
    pub pebs_format: u32,
    /// `POLICY_*`.
    pub policy: u32,
    /// MSR_PEBS_DATA_CFG for adaptive PEBS (0: basic group only; must be 0 before fmt4).
    pub data_cfg: u64,
    /// MSR_PEBS_LD_LAT_THRESHOLD in core cycles (0: not a load-latency event).
    pub ld_lat_threshold: u32,
    /// Counter width in bits for default reset values (0: 48).
    pub counter_width: u32,
    /// Record area size in bytes (0: the session's `data_size_hint`, else 64 KiB).
    pub area_size: u64,
    /// Raw counter reload values, GP 0..8 then fixed 0..4; 0 means "arm for the
    /// session's sample period" (`2^width - period`).
    pub reset: [u64; ARG_GP_RESETS + ARG_FIXED_RESETS],
    /// How records' data-source words read ([`DsrcKind`] id); 0 with a load-latency
    /// threshold means `LoadLatency`.
    pub dsrc_kind: u32,
    /// Reserved, zero.
    pub reserved: u32,
}
/// Size of [`PebsArg`] in this version.
pub const PEBS_ARG_SIZE: usize = core::mem::size_of::<PebsArg>();
const _: () = assert!(PEBS_ARG_SIZE == 144);

impl PebsArg {
    /// A zeroed argument with `size` set.
    pub fn new() -> PebsArg {
        PebsArg { size: PEBS_ARG_SIZE as u32, ..PebsArg::default() }
    }

    /// The argument as bytes (native endian), to pass as the format argument.
    pub fn to_bytes(&self) -> [u8; PEBS_ARG_SIZE] {
        let mut b = [0u8; PEBS_ARG_SIZE];
        let mut w = Writer { b: &mut b, at: 0 };
        w.put(&self.size.to_ne_bytes());
        w.put(&self.flags.to_ne_bytes());
        w.put(&self.pebs_format.to_ne_bytes());
        w.put(&self.policy.to_ne_bytes());
        w.put(&self.data_cfg.to_ne_bytes());
        w.put(&self.ld_lat_threshold.to_ne_bytes());
        w.put(&self.counter_width.to_ne_bytes());
        w.put(&self.area_size.to_ne_bytes());
        for r in &self.reset {
            w.put(&r.to_ne_bytes());
        }
        w.put(&self.dsrc_kind.to_ne_bytes());
        w.put(&self.reserved.to_ne_bytes());
        b
    }
}

struct Writer<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, v: &[u8]) {
        if let Some(d) = self.b.get_mut(self.at..self.at + v.len()) {
            d.copy_from_slice(v);
        }
        self.at += v.len();
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Option<u32> {
        let v = super::bytes::ne32(self.b, self.at);
        self.at += 4;
        v
    }
    fn u64(&mut self) -> Option<u64> {
        let v = super::bytes::ne64(self.b, self.at);
        self.at += 8;
        v
    }
}

/// Parses the format argument; `Err` holds the positive errno. An empty argument is
/// `ENODEV`: nobody said a PEBS-capable PMU is present.
pub fn parse_arg(arg: &[u8]) -> Result<PebsArg, i32> {
    if arg.is_empty() {
        return Err(ENODEV);
    }
    let mut r = Reader { b: arg, at: 0 };
    let mut a = PebsArg::default();
    let mut read = || -> Option<()> {
        a.size = r.u32()?;
        a.flags = r.u32()?;
        a.pebs_format = r.u32()?;
        a.policy = r.u32()?;
        a.data_cfg = r.u64()?;
        a.ld_lat_threshold = r.u32()?;
        a.counter_width = r.u32()?;
        a.area_size = r.u64()?;
        for v in a.reset.iter_mut() {
            *v = r.u64()?;
        }
        a.dsrc_kind = r.u32()?;
        a.reserved = r.u32()?;
        Some(())
    };
    read().ok_or(EINVAL)?;
    if a.size as usize != arg.len() {
        return Err(EINVAL);
    }
    if arg.get(PEBS_ARG_SIZE..).unwrap_or(&[]).iter().any(|&b| b != 0) {
        return Err(E2BIG);
    }
    if a.flags & !ARG_FL_KNOWN != 0 || a.reserved != 0 {
        return Err(EINVAL);
    }
    Ok(a)
}

/// Everything `init` lays out, computed once from the session and the argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Record layout.
    pub layout: Layout,
    /// The detected format word.
    pub pebs_format: PebsFormat,
    /// PEBS_DATA_CFG (adaptive), else 0.
    pub data_cfg: u64,
    /// Bytes per record.
    pub record_size: u64,
    /// Records the area holds.
    pub capacity: u64,
    /// Records before the PMI (the threshold, counted from the base).
    pub threshold_records: u64,
    /// The effective policy (`POLICY_SINGLE` or `POLICY_LARGE`).
    pub policy: u32,
    /// Reload values, GP 0..8 then fixed 0..4.
    pub reset: [u64; ARG_GP_RESETS + ARG_FIXED_RESETS],
    /// Load-latency threshold.
    pub ld_lat_threshold: u32,
    /// Data-source interpretation.
    pub dsrc_kind: DsrcKind,
    /// Bytes each CPU's buffer needs (what `getsize` reports).
    pub buf_size: u64,
}

/// Checks the session and argument and computes the buffer layout; `Err` holds the
/// positive errno (`ENODEV`: no PEBS-capable PMU; `EINVAL`: a bad combination).
pub fn plan(params: &SessionParams, arg: &PebsArg) -> Result<Plan, i32> {
    if arg.flags & ARG_FL_PMU_PRESENT == 0 {
        return Err(ENODEV);
    }
    let fmt = PebsFormat(arg.pebs_format);
    let layout = fmt.layout().ok_or(ENODEV)?;
    let nr = params.nr_counters;
    if (params.size as usize) < core::mem::size_of::<SessionParams>()
        || params.mode != MODE_OVERFLOW
        || nr == 0
        || nr as usize > MAX_COUNTERS
    {
        return Err(EINVAL);
    }
    if arg.data_cfg & !DATACFG_VALID != 0
        || layout::lbr_entries(arg.data_cfg) > MAX_LBR_ENTRIES
        || (arg.data_cfg != 0 && !(layout == Layout::Adaptive && fmt.has(PebsFormat::BASELINE)))
    {
        return Err(EINVAL);
    }
    let record_size = layout::record_size(layout, arg.data_cfg).map_err(|_| EINVAL)? as u64;
    let area = match (arg.area_size, params.data_size_hint) {
        (0, 0) => DEFAULT_AREA_SIZE,
        (0, hint) => hint,
        (size, _) => size,
    };
    if area > MAX_AREA_SIZE {
        return Err(EINVAL);
    }
    let capacity = area / record_size;
    let fixed_period = params.sample_period != 0;
    let policy = match arg.policy {
        POLICY_AUTO if fixed_period => POLICY_LARGE,
        POLICY_AUTO | POLICY_SINGLE => POLICY_SINGLE,
        POLICY_LARGE if fixed_period => POLICY_LARGE,
        _ => return Err(EINVAL),
    };
    // One record of headroom per counter that may still write before the PMI is taken.
    let reserve = u64::from(nr);
    if capacity == 0 || (policy == POLICY_LARGE && capacity <= reserve) {
        return Err(EINVAL);
    }
    let tp = if policy == POLICY_LARGE {
        ThresholdPolicy::Large { reserve }
    } else {
        ThresholdPolicy::Single
    };
    let threshold_records = ds::threshold(0, record_size, capacity, tp) / record_size;
    let width = match arg.counter_width {
        0 => 48,
        w @ 32..=64 => w,
        _ => return Err(EINVAL),
    };
    let mut reset = arg.reset;
    for (i, r) in reset.iter_mut().enumerate() {
        let used = if i < ARG_GP_RESETS { i < nr as usize } else { true };
        if *r == 0 && used && fixed_period {
            *r = arm_value(width, params.sample_period);
        }
    }
    let dsrc_kind = match (arg.dsrc_kind, arg.ld_lat_threshold) {
        (0, 0) => DsrcKind::None,
        (0, _) => DsrcKind::LoadLatency,
        (k, _) if k <= 0xff && DsrcKind::from_id(k as u8) != DsrcKind::None => {
            DsrcKind::from_id(k as u8)
        }
        _ => return Err(EINVAL),
    };
    Ok(Plan {
        layout,
        pebs_format: fmt,
        data_cfg: arg.data_cfg,
        record_size,
        capacity,
        threshold_records,
        policy,
        reset,
        ld_lat_threshold: arg.ld_lat_threshold,
        dsrc_kind,
        buf_size: AREA_OFFSET as u64 + capacity * record_size,
    })
}

/// The format's header in each CPU's buffer, at [`HDR_OFFSET`] (perfmon2's
/// `pfm_pebs_smpl_hdr`). Counters are only incremented, by the handler and restart.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PebsHeader {
    /// [`HDR_VERSION`].
    pub version: u32,
    /// `size_of::<PebsHeader>()`.
    pub header_size: u32,
    /// The [`PebsFormat`] word.
    pub pebs_format: u32,
    /// Layout id.
    pub layout: u32,
    /// PEBS_DATA_CFG.
    pub data_cfg: u64,
    /// Bytes per record.
    pub record_size: u32,
    /// Effective `POLICY_*`.
    pub policy: u32,
    /// Offset of the DS area from the buffer start.
    pub ds_offset: u64,
    /// Offset of the record area from the buffer start (perfmon2's `start_offs`).
    pub area_offset: u64,
    /// Bytes of the record area (whole records).
    pub area_size: u64,
    /// Records the area holds.
    pub capacity: u64,
    /// Handler calls (threshold PMIs dispatched to the format).
    pub overflows: u64,
    /// Handler calls that found the threshold reached (returned NOTIFY|MASK).
    pub threshold_hits: u64,
    /// Handler calls that found no room for another record.
    pub full: u64,
    /// Restarts (pebs_index reset to the base).
    pub restarts: u64,
    /// Records the handler copied: always 0 (zero-copy).
    pub records_copied: u64,
    /// Records the simulated assist could not write because the area was full (real
    /// hardware does not count them; the kmod leaves this 0).
    pub lost: u64,
    /// MSR_PEBS_LD_LAT_THRESHOLD.
    pub ld_lat_threshold: u32,
    /// Data-source interpretation ([`DsrcKind`] id).
    pub dsrc_kind: u32,
    /// Reserved, zero.
    pub reserved: u64,
}
const _: () = assert!(HDR_SIZE == 128);
const _: () = assert!(AREA_OFFSET == 768);

/// Byte offsets of [`PebsHeader`]'s counters from the buffer start.
pub mod hdr_off {
    use super::{offset_of, PebsHeader, HDR_OFFSET};
    /// `overflows`.
    pub const OVERFLOWS: usize = HDR_OFFSET + offset_of!(PebsHeader, overflows);
    /// `threshold_hits`.
    pub const THRESHOLD_HITS: usize = HDR_OFFSET + offset_of!(PebsHeader, threshold_hits);
    /// `full`.
    pub const FULL: usize = HDR_OFFSET + offset_of!(PebsHeader, full);
    /// `restarts`.
    pub const RESTARTS: usize = HDR_OFFSET + offset_of!(PebsHeader, restarts);
    /// `records_copied`.
    pub const RECORDS_COPIED: usize = HDR_OFFSET + offset_of!(PebsHeader, records_copied);
    /// `lost`.
    pub const LOST: usize = HDR_OFFSET + offset_of!(PebsHeader, lost);
}

/// The 64-bit word at `off` of `buf` as an atomic (shared with the reader and, for the
/// DS words, with the CPU's PEBS microcode).
pub(crate) fn word<'a>(buf: &'a Buffer<'_>, off: usize) -> Option<&'a AtomicU64> {
    if off % 8 != 0 || off.checked_add(8)? > buf.len() {
        return None;
    }
    // SAFETY: `off + 8 <= len` and 8-aligned in an 8-aligned buffer (Buffer's
    // invariant); every concurrent access to these header/DS words is atomic (or the
    // CPU's own DS update), and the reference lives no longer than the borrow of `buf`.
    Some(unsafe { AtomicU64::from_ptr(buf.as_ptr().add(off).cast::<u64>().cast_mut()) })
}

fn load(buf: &Buffer<'_>, off: usize) -> Option<u64> {
    word(buf, off).map(|w| w.load(Ordering::Acquire))
}

fn bump(buf: &Buffer<'_>, off: usize) {
    if let Some(w) = word(buf, off) {
        // Only the producer side (handler/restart/assist, never concurrently on one
        // buffer) writes these counters: load + release store, no locked RMW.
        w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }
}

fn read_u32(buf: &Buffer<'_>, off: usize) -> Option<u32> {
    if off % 4 != 0 || off.checked_add(4)? > buf.len() {
        return None;
    }
    // SAFETY: in bounds and 4-aligned; these fields are written only by `init`, before
    // the buffer is shared.
    Some(unsafe { buf.as_ptr().add(off).cast::<u32>().read() })
}

/// A snapshot of the buffer's [`PebsHeader`], if `init` laid one out that is
/// consistent with the buffer (version, sizes, offsets, record size).
pub fn read_header(buf: &Buffer<'_>) -> Option<PebsHeader> {
    let o = |f: usize| HDR_OFFSET + f;
    let h = PebsHeader {
        version: read_u32(buf, o(offset_of!(PebsHeader, version)))?,
        header_size: read_u32(buf, o(offset_of!(PebsHeader, header_size)))?,
        pebs_format: read_u32(buf, o(offset_of!(PebsHeader, pebs_format)))?,
        layout: read_u32(buf, o(offset_of!(PebsHeader, layout)))?,
        data_cfg: load(buf, o(offset_of!(PebsHeader, data_cfg)))?,
        record_size: read_u32(buf, o(offset_of!(PebsHeader, record_size)))?,
        policy: read_u32(buf, o(offset_of!(PebsHeader, policy)))?,
        ds_offset: load(buf, o(offset_of!(PebsHeader, ds_offset)))?,
        area_offset: load(buf, o(offset_of!(PebsHeader, area_offset)))?,
        area_size: load(buf, o(offset_of!(PebsHeader, area_size)))?,
        capacity: load(buf, o(offset_of!(PebsHeader, capacity)))?,
        overflows: load(buf, hdr_off::OVERFLOWS)?,
        threshold_hits: load(buf, hdr_off::THRESHOLD_HITS)?,
        full: load(buf, hdr_off::FULL)?,
        restarts: load(buf, hdr_off::RESTARTS)?,
        records_copied: load(buf, hdr_off::RECORDS_COPIED)?,
        lost: load(buf, hdr_off::LOST)?,
        ld_lat_threshold: read_u32(buf, o(offset_of!(PebsHeader, ld_lat_threshold)))?,
        dsrc_kind: read_u32(buf, o(offset_of!(PebsHeader, dsrc_kind)))?,
        reserved: 0,
    };
    let layout = Layout::from_id(h.layout)?;
    let size_ok = layout::record_size(layout, h.data_cfg).ok()? as u64 == u64::from(h.record_size);
    let area_end = h.area_offset.checked_add(h.area_size)?;
    let ok = h.version == HDR_VERSION
        && h.header_size as usize == HDR_SIZE
        && size_ok
        && h.record_size != 0
        && h.ds_offset as usize == DS_OFFSET
        && h.area_offset as usize == AREA_OFFSET
        && h.capacity.checked_mul(u64::from(h.record_size)) == Some(h.area_size)
        && area_end <= buf.len() as u64;
    ok.then_some(h)
}

/// A snapshot of the DS save area's PEBS words (BTS words and reset values included).
pub fn read_ds(buf: &Buffer<'_>) -> Option<DsArea> {
    let w = |off: usize| load(buf, DS_OFFSET + off);
    let mut ds = DsArea {
        bts_buffer_base: w(0)?,
        bts_index: w(8)?,
        bts_absolute_maximum: w(16)?,
        bts_interrupt_threshold: w(24)?,
        pebs_buffer_base: w(ds_off::PEBS_BUFFER_BASE)?,
        pebs_index: w(ds_off::PEBS_INDEX)?,
        pebs_absolute_maximum: w(ds_off::PEBS_ABS_MAX)?,
        pebs_interrupt_threshold: w(ds_off::PEBS_THRESHOLD)?,
        pebs_event_reset: [0; DS_RESET_SLOTS],
    };
    for (i, r) in ds.pebs_event_reset.iter_mut().enumerate() {
        *r = w(ds_off::PEBS_RESET + 8 * i)?;
    }
    Some(ds)
}

/// Sets `pebs_index` (restart, and the simulated assist).
pub(crate) fn store_index(buf: &Buffer<'_>, value: u64) -> bool {
    match word(buf, DS_OFFSET + ds_off::PEBS_INDEX) {
        Some(w) => {
            w.store(value, Ordering::Release);
            true
        }
        None => false,
    }
}

/// Bumps the `lost` counter (the simulated assist).
pub(crate) fn bump_lost(buf: &Buffer<'_>) {
    bump(buf, hdr_off::LOST);
}

/// Lays the format out in `buf` (the `init` callback's logic).
pub fn init_buffer(buf: &mut Buffer<'_>, p: &Plan) -> Result<(), i32> {
    if (buf.len() as u64) < p.buf_size {
        return Err(EINVAL);
    }
    let base = (buf.as_ptr() as u64).wrapping_add(AREA_OFFSET as u64);
    let area_size = p.capacity * p.record_size;
    let h = PebsHeader {
        version: HDR_VERSION,
        header_size: HDR_SIZE as u32,
        pebs_format: p.pebs_format.0,
        layout: p.layout.id(),
        data_cfg: p.data_cfg,
        record_size: p.record_size as u32,
        policy: p.policy,
        ds_offset: DS_OFFSET as u64,
        area_offset: AREA_OFFSET as u64,
        area_size,
        capacity: p.capacity,
        ld_lat_threshold: p.ld_lat_threshold,
        dsrc_kind: p.dsrc_kind as u32,
        ..PebsHeader::default()
    };
    let mut ds = DsArea {
        bts_buffer_base: 0,
        bts_index: 0,
        bts_absolute_maximum: 0,
        bts_interrupt_threshold: 0,
        pebs_buffer_base: base,
        pebs_index: base,
        pebs_absolute_maximum: base.wrapping_add(area_size),
        pebs_interrupt_threshold: base.wrapping_add(p.threshold_records * p.record_size),
        pebs_event_reset: [0; DS_RESET_SLOTS],
    };
    let fmt = p.pebs_format.format();
    for (i, r) in p.reset.iter().enumerate() {
        let c = if i < ARG_GP_RESETS {
            Counter::Gp(i as u32)
        } else {
            Counter::Fixed((i - ARG_GP_RESETS) as u32)
        };
        if let Some(slot) = ds::reset_slot(fmt, c).and_then(|s| ds.pebs_event_reset.get_mut(s)) {
            *slot = *r;
        }
    }
    let ptr = buf.as_mut_ptr();
    // SAFETY: `buf_size >= AREA_OFFSET >= DS_OFFSET + DS_SIZE` bytes are valid and ours
    // (`&mut`, before the buffer is shared); both offsets are 8-aligned in an 8-aligned
    // buffer, matching the structs' alignment.
    unsafe {
        ptr.add(HDR_OFFSET).cast::<PebsHeader>().write(h);
        ptr.add(DS_OFFSET).cast::<DsArea>().write(ds);
    }
    // The core's header describes the record area (read by `mmap` users).
    let data = [
        (offset_of!(BufferHeader, data_offset), AREA_OFFSET as u64),
        (offset_of!(BufferHeader, data_size), area_size),
    ];
    for (off, v) in data {
        word(buf, off).ok_or(EINVAL)?.store(v, Ordering::Release);
    }
    Ok(())
}

/// The DS words the handler looks at: index, threshold, absolute maximum, base, and
/// the record size from the header.
fn ds_words(buf: &Buffer<'_>) -> Option<(u64, u64, u64, u64, u64)> {
    Some((
        load(buf, DS_OFFSET + ds_off::PEBS_INDEX)?,
        load(buf, DS_OFFSET + ds_off::PEBS_THRESHOLD)?,
        load(buf, DS_OFFSET + ds_off::PEBS_ABS_MAX)?,
        load(buf, DS_OFFSET + ds_off::PEBS_BUFFER_BASE)?,
        u64::from(read_u32(buf, HDR_OFFSET + offset_of!(PebsHeader, record_size))?),
    ))
}

/// Whether `pebs_index` reached the interrupt threshold or the area has no room for
/// another record: the condition the CPU raises the PMI on (the kernel checks it on
/// every NMI too, in case perf's handler took the interrupt first).
pub fn threshold_reached(buf: &Buffer<'_>) -> bool {
    match ds_words(buf) {
        Some((index, thr, max, _, size)) => index >= thr || max.saturating_sub(index) < size,
        None => false,
    }
}

/// Sets the DS reset value of `slot` (the kernel, once it knows which counter it took;
/// `init` fills the slots of counters `0..nr_counters`). `false` if out of range.
pub fn set_reset(buf: &Buffer<'_>, slot: usize, value: u64) -> bool {
    if slot >= DS_RESET_SLOTS {
        return false;
    }
    match word(buf, DS_OFFSET + ds_off::PEBS_RESET + 8 * slot) {
        Some(w) => {
            w.store(value, Ordering::Release);
            true
        }
        None => false,
    }
}

/// The handler's logic. Never touches a record: counts the PMI and, when `pebs_index`
/// reached the interrupt threshold (or the area has no room for another record), asks
/// the core to notify the reader and mask this CPU until `restart`.
#[inline]
pub fn handle(buf: &Buffer<'_>) -> u32 {
    bump(buf, hdr_off::OVERFLOWS);
    let Some((index, thr, max, base, record_size)) = ds_words(buf) else {
        return CTRL_NOTIFY | CTRL_MASK;
    };
    if index < base || index > max {
        // Corrupt DS area: stop sampling here and let the reader see it.
        return CTRL_NOTIFY | CTRL_MASK;
    }
    if index >= thr || max - index < record_size {
        bump(buf, hdr_off::THRESHOLD_HITS);
        if max - index < record_size {
            bump(buf, hdr_off::FULL);
        }
        return CTRL_NOTIFY | CTRL_MASK;
    }
    0
}

/// Resets `pebs_index` to the base (the `restart` callback's logic).
pub fn restart_buffer(buf: &Buffer<'_>) -> Result<(), i32> {
    let base = load(buf, DS_OFFSET + ds_off::PEBS_BUFFER_BASE).ok_or(EINVAL)?;
    if !store_index(buf, base) {
        return Err(EINVAL);
    }
    bump(buf, hdr_off::RESTARTS);
    Ok(())
}

/// The table to register: `hrperf_register_format(&PEBS_OPS)` in the kernel,
/// `Registry::register_static(&PEBS_OPS)` in userspace.
pub static PEBS_OPS: FormatOps = FormatOps {
    size: core::mem::size_of::<FormatOps>() as u32,
    abi_version: FORMAT_ABI_VERSION,
    name: match hrperf_abi::fixed_name(PEBS_NAME) {
        Some(n) => n,
        None => [0; hrperf_abi::NAME_LEN],
    },
    uuid: PEBS_UUID,
    version: PEBS_VERSION,
    arg_size: PEBS_ARG_SIZE as u32,
    flags: FMT_FL_PEBS,
    reserved: 0,
    owner: core::ptr::null_mut(),
    validate: Some(pebs_validate),
    getsize: Some(pebs_getsize),
    init: Some(pebs_init),
    handler: Some(pebs_handler),
    restart: Some(pebs_restart),
    exit: None,
    start: None,
    stop: None,
};

/// Reads the C arguments every callback gets; `Err` holds the positive errno.
///
/// # Safety
///
/// `params` is null or valid for reads; `arg` is valid for `arg_len` bytes of reads if
/// `arg_len > 0`, for the duration of the call.
unsafe fn c_plan(params: *const SessionParams, arg: *const u8, arg_len: usize) -> Result<Plan, i32> {
    // SAFETY: forwarded contract.
    let (params, arg) = unsafe { hrperf_engine::callback::session_args(params, arg, arg_len) }?;
    plan(params, &parse_arg(arg)?)
}

/// Wraps the core's buffer pointer.
///
/// # Safety
///
/// `buf` is null or valid for reads and writes of `buf_len` bytes for `'a`, shared
/// only as the engine's concurrency contract allows.
unsafe fn c_buf<'a>(buf: *mut u8, buf_len: usize) -> Result<Buffer<'a>, i32> {
    let ptr = NonNull::new(buf).ok_or(EFAULT)?;
    // SAFETY: the caller's contract.
    unsafe { Buffer::from_raw(ptr, buf_len) }.map_err(|e| e.errno())
}

/// `validate` callback: `-ENODEV` without a PEBS-capable PMU.
///
/// # Safety
///
/// The `ValidateFn` contract: `params` valid for reads, `arg` for `arg_len` bytes.
pub unsafe extern "C" fn pebs_validate(params: *const SessionParams, arg: *const u8, arg_len: usize) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { c_plan(params, arg, arg_len) } {
        Ok(_) => 0,
        Err(e) => -e,
    }
}

/// `getsize` callback: header + PEBS header + DS area + record area.
///
/// # Safety
///
/// The `GetSizeFn` contract: as `validate`, and `size` valid for a write.
pub unsafe extern "C" fn pebs_getsize(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
    size: *mut u64,
) -> i32 {
    // SAFETY: forwarded contract.
    let p = match unsafe { c_plan(params, arg, arg_len) } {
        Ok(p) => p,
        Err(e) => return -e,
    };
    // SAFETY: forwarded contract.
    unsafe { hrperf_engine::callback::write_size(size, p.buf_size) }
}

/// `init` callback: fills the PEBS header and the DS area (base, index, absolute
/// maximum, threshold, reset values).
///
/// # Safety
///
/// The `InitFn` contract: `buf` is this CPU's buffer of `buf_len` bytes (8-aligned,
/// header filled), exclusively the format's during the call; the rest as `validate`.
pub unsafe extern "C" fn pebs_init(
    buf: *mut u8,
    buf_len: usize,
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    let p = match unsafe { c_plan(params, arg, arg_len) } {
        Ok(p) => p,
        Err(e) => return -e,
    };
    // SAFETY: forwarded contract.
    match unsafe { c_buf(buf, buf_len) }.and_then(|mut b| init_buffer(&mut b, &p)) {
        Ok(()) => 0,
        Err(e) => -e,
    }
}

/// `handler` callback; see [`handle`].
///
/// # Safety
///
/// The `HandlerFn` contract: `buf` as for `init` (after `init`).
pub unsafe extern "C" fn pebs_handler(
    buf: *mut u8,
    buf_len: usize,
    _arg: *const OverflowArg,
    _services: *const Services,
) -> u32 {
    // SAFETY: forwarded contract.
    match unsafe { c_buf(buf, buf_len) } {
        Ok(b) => handle(&b),
        Err(_) => CTRL_NOTIFY | CTRL_MASK,
    }
}

/// `restart` callback: `pebs_index = pebs_buffer_base`; asks for nothing (the engine
/// unmasks).
///
/// # Safety
///
/// The `RestartFn` contract: `buf` as for `init`, `ctrl` null or valid for a write.
pub unsafe extern "C" fn pebs_restart(buf: *mut u8, buf_len: usize, ctrl: *mut u32) -> i32 {
    if !ctrl.is_null() {
        // SAFETY: non-null and writable, the caller's contract.
        unsafe { ctrl.write(0) };
    }
    // SAFETY: forwarded contract.
    match unsafe { c_buf(buf, buf_len) }.and_then(|b| restart_buffer(&b)) {
        Ok(()) => 0,
        Err(e) => -e,
    }
}
