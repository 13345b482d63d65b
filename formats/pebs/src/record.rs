//! The PEBS capture record: how a hardware PEBS record travels in a capture file, so the
//! file is self-describing and one decoder serves records from the kernel module, the
//! simulator and perf.
//!
//! ```text
//! off  size  field
//!   0     8  RecordHeader { kind: RecordType::PEBS_BASE + layout id (0 core, 1 nhm,
//!                          2 hsw, 3 skl, 4 adaptive), misc: MISC_OVERFLOW (| MISC_KERNEL),
//!                          size: 32 + align8(hw_size) }
//!   8     4  cpu          CPU whose DS area held the record
//!  12     4  pebs_format  PebsFormat word (record format, capability bits, data-source
//!                         table; see layout::PebsFormat)
//!  16     2  hw_size      bytes of the hardware record below
//!  18     1  dsrc_kind    how the data-source word reads (datasrc::DsrcKind)
//!  19     1  reserved (0)
//!  20     4  flags        FL_PERF_SOURCED | FL_SIMULATED | FL_TIME
//!  24     8  time_ns      sample time in the capture's clock when FL_TIME, else 0
//!  32    hw  the hardware PEBS record, byte for byte as the CPU wrote it
//!            (little-endian, layout per layout.rs), zero-padded to a multiple of 8
//! ```
//!
//! The prefix is in the writer's byte order like every hrperf record; the hardware
//! bytes are always little-endian (x86). Perf-sourced records carry an adaptive record
//! (basic + meminfo groups) synthesised from the perf sample, with `dsrc_kind =
//! PerfMemDataSrc` and `FL_PERF_SOURCED` (and `FL_TIME` with the sample time):
//! [`encode_perf`] from a [`PerfMemSample`].

use hrperf_abi::record::{RecordHeader, MISC_OVERFLOW};
use hrperf_abi::{align8, RecordType};

use super::bytes::{ne16, ne32, ne64, put};
use super::datasrc::{DseTable, DsrcKind};
use super::layout::{self, Layout, LayoutError, PebsFormat, PebsRecord, PebsSample};

/// Offset of the hardware record in a capture record.
pub const HW_OFFSET: usize = 32;
/// Largest capture record.
pub const MAX_CAPTURE_RECORD: usize = HW_OFFSET + align8(layout::MAX_RECORD_SIZE);
const _: () = assert!(MAX_CAPTURE_RECORD <= 0xfff8);

/// Flag: the record was synthesised from a perf sample (`--source perf`).
pub const FL_PERF_SOURCED: u32 = 1 << 0;
/// Flag: the simulated PEBS assist wrote the hardware record.
pub const FL_SIMULATED: u32 = 1 << 1;
/// Flag: `time_ns` is valid.
pub const FL_TIME: u32 = 1 << 2;
/// Every defined flag.
pub const FL_KNOWN: u32 = FL_PERF_SOURCED | FL_SIMULATED | FL_TIME;

/// The record type of a layout's capture records.
pub const fn record_type(layout: Layout) -> RecordType {
    RecordType(RecordType::PEBS_BASE.0 + layout.id())
}

/// The layout of a PEBS capture record type, if it is one.
pub fn layout_of(kind: RecordType) -> Option<Layout> {
    kind.0.checked_sub(RecordType::PEBS_BASE.0).and_then(Layout::from_id)
}

/// The fixed prefix after the record header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prefix {
    /// CPU.
    pub cpu: u32,
    /// The PEBS format word.
    pub pebs_format: PebsFormat,
    /// `DsrcKind` as its id.
    pub dsrc_kind: u8,
    /// `FL_*`.
    pub flags: u32,
    /// Sample time (with `FL_TIME`).
    pub time_ns: u64,
}

/// Why bytes are not a PEBS capture record, or one cannot be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// Fewer bytes than the header or the declared size needs.
    Truncated,
    /// Not a PEBS record type.
    WrongType(u32),
    /// The header, prefix and hardware record disagree (sizes, reserved bits).
    Malformed,
    /// The hardware record does not decode.
    Layout(LayoutError),
    /// The output buffer is too small.
    NoSpace,
}

/// Wraps the hardware record `hw` of `layout` into a capture record in `out`; returns
/// its size. `hw` must be exactly one record (its size is checked by decoding it).
pub fn wrap(layout: Layout, prefix: &Prefix, hw: &[u8], out: &mut [u8]) -> Result<usize, ParseError> {
    let rec = layout::decode(layout, hw).map_err(ParseError::Layout)?;
    if rec.size() != hw.len() || prefix.flags & !FL_KNOWN != 0 {
        return Err(ParseError::Malformed);
    }
    let size = HW_OFFSET + align8(hw.len());
    let out = out.get_mut(..size).ok_or(ParseError::NoSpace)?;
    out.fill(0);
    let mut ok = put(out, 0, &record_type(layout).0.to_ne_bytes());
    ok &= put(out, 4, &MISC_OVERFLOW.to_ne_bytes());
    ok &= put(out, 6, &(size as u16).to_ne_bytes());
    ok &= put(out, 8, &prefix.cpu.to_ne_bytes());
    ok &= put(out, 12, &prefix.pebs_format.0.to_ne_bytes());
    ok &= put(out, 16, &(hw.len() as u16).to_ne_bytes());
    ok &= put(out, 18, &[prefix.dsrc_kind, 0]);
    ok &= put(out, 20, &prefix.flags.to_ne_bytes());
    ok &= put(out, 24, &prefix.time_ns.to_ne_bytes());
    ok &= put(out, HW_OFFSET, hw);
    if ok {
        Ok(size)
    } else {
        Err(ParseError::NoSpace)
    }
}

/// Encodes `sample` as a `layout` record (with `data_cfg`) and wraps it, in one step:
/// what the perf source does for each perf sample, and what tests use.
pub fn encode_wrapped(
    layout: Layout,
    data_cfg: u64,
    prefix: &Prefix,
    sample: &PebsSample,
    out: &mut [u8],
) -> Result<usize, ParseError> {
    let mut hw = [0u8; layout::MAX_RECORD_SIZE];
    let n = layout::encode(layout, data_cfg, sample, &mut hw).map_err(ParseError::Layout)?;
    wrap(layout, prefix, hw.get(..n).ok_or(ParseError::Malformed)?, out)
}

/// The fields of one perf sample (`perf_event_open` with `precise_ip`, `sample_type`
/// `IP | TIME | CPU | ADDR | DATA_SRC | WEIGHT_STRUCT` or `WEIGHT`) that a perf-sourced
/// capture record carries ([`encode_perf`]). `PERF_SAMPLE_PHYS_ADDR` has no field in the
/// capture record and is not carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfMemSample {
    /// `PERF_SAMPLE_CPU`.
    pub cpu: u32,
    /// `PERF_SAMPLE_TIME` in the capture's clock, if sampled.
    pub time_ns: Option<u64>,
    /// `PERF_SAMPLE_IP` (with `precise_ip`, the eventing IP).
    pub ip: u64,
    /// `PERF_SAMPLE_ADDR`: the data linear address.
    pub addr: u64,
    /// `PERF_SAMPLE_DATA_SRC`: a `union perf_mem_data_src` value.
    pub data_src: u64,
    /// Load (cache) latency in core cycles: `weight.var1_dw` of
    /// `PERF_SAMPLE_WEIGHT_STRUCT`, or the whole `PERF_SAMPLE_WEIGHT`. Values above
    /// `u32::MAX` are saturated.
    pub latency: u64,
    /// Instruction latency (`weight.var2_w` of `PERF_SAMPLE_WEIGHT_STRUCT`), on CPUs
    /// that report it (Alder Lake, Sapphire Rapids and later); carried only while
    /// `latency` fits the 16-bit cache-latency field of that split.
    pub instr_latency: Option<u16>,
    /// Retire latency (`weight.var3_w` of `PERF_SAMPLE_WEIGHT_STRUCT`), on CPUs that
    /// report it.
    pub retire_latency: Option<u16>,
}

/// The `data_cfg` of the adaptive record a perf sample is synthesised into (basic +
/// meminfo groups).
pub const PERF_DATA_CFG: u64 = layout::DATACFG_MEMINFO;
/// Size of a perf-sourced capture record.
pub const PERF_RECORD_SIZE: usize = HW_OFFSET + layout::adaptive_size(PERF_DATA_CFG);

impl PerfMemSample {
    /// The `PebsFormat` word of the synthesised record: adaptive (fmt4, baseline), no
    /// Intel data-source table (the word is already `perf_mem_data_src`),
    /// `INSTR_LATENCY` when the latency word is split, `TIMING_INFO` with a retire
    /// latency.
    pub fn pebs_format(&self) -> PebsFormat {
        let mut bits = PebsFormat::BASELINE;
        if self.split_latency() {
            bits |= PebsFormat::INSTR_LATENCY;
        }
        if self.retire_latency.is_some() {
            bits |= PebsFormat::TIMING_INFO;
        }
        PebsFormat::new(4, bits, DseTable::None)
    }

    fn split_latency(&self) -> bool {
        self.instr_latency.is_some() && self.latency <= 0xffff
    }

    /// The meminfo latency word as the hardware lays it out: instruction latency in
    /// bits 15:0 and cache latency in 47:32 when split, else the latency.
    pub fn latency_word(&self) -> u64 {
        match self.instr_latency {
            Some(instr) if self.split_latency() => (self.latency << 32) | u64::from(instr),
            _ => self.latency.min(u64::from(u32::MAX)),
        }
    }
}

/// Synthesises the capture record of a perf sample into `out` (at least
/// [`PERF_RECORD_SIZE`] bytes): an adaptive record with the basic and meminfo groups
/// (eventing IP, data address, `perf_mem_data_src`, latency word; no TSC, no
/// applicable-counter bits — perf reports neither), `dsrc_kind = PerfMemDataSrc`,
/// `FL_PERF_SOURCED`, and `FL_TIME` with the sample time. Returns its size.
pub fn encode_perf(s: &PerfMemSample, out: &mut [u8]) -> Result<usize, ParseError> {
    let prefix = Prefix {
        cpu: s.cpu,
        pebs_format: s.pebs_format(),
        dsrc_kind: DsrcKind::PerfMemDataSrc as u8,
        flags: FL_PERF_SOURCED | if s.time_ns.is_some() { FL_TIME } else { 0 },
        time_ns: s.time_ns.unwrap_or(0),
    };
    let sample = PebsSample {
        eventing_ip: s.ip,
        data_addr: s.addr,
        data_source: s.data_src,
        latency: s.latency_word(),
        retire_latency: s.retire_latency.unwrap_or(0),
        ..PebsSample::default()
    };
    encode_wrapped(Layout::Adaptive, PERF_DATA_CFG, &prefix, &sample, out)
}

/// A parsed capture record; the hardware record is decoded in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureRecord<'a> {
    /// The record header.
    pub header: RecordHeader,
    /// The prefix.
    pub prefix: Prefix,
    /// The data-source interpretation.
    pub dsrc_kind: DsrcKind,
    /// The decoded hardware record (borrowing the input).
    pub pebs: PebsRecord<'a>,
}

/// Parses a PEBS capture record from the start of `b` (which may hold more bytes).
/// Never panics.
pub fn parse(b: &[u8]) -> Result<CaptureRecord<'_>, ParseError> {
    let t = ParseError::Truncated;
    let kind = RecordType(ne32(b, 0).ok_or(t)?);
    let misc = ne16(b, 4).ok_or(t)?;
    let size = ne16(b, 6).ok_or(t)?;
    let layout = layout_of(kind).ok_or(ParseError::WrongType(kind.0))?;
    let rec = b.get(..size as usize).ok_or(t)?;
    if rec.len() < HW_OFFSET {
        return Err(if b.len() < HW_OFFSET { t } else { ParseError::Malformed });
    }
    let hw_size = ne16(rec, 16).ok_or(t)? as usize;
    let reserved = rec.get(19).copied().ok_or(t)?;
    let prefix = Prefix {
        cpu: ne32(rec, 8).ok_or(t)?,
        pebs_format: PebsFormat(ne32(rec, 12).ok_or(t)?),
        dsrc_kind: rec.get(18).copied().ok_or(t)?,
        flags: ne32(rec, 20).ok_or(t)?,
        time_ns: ne64(rec, 24).ok_or(t)?,
    };
    if size as usize != HW_OFFSET + align8(hw_size) || reserved != 0 || prefix.flags & !FL_KNOWN != 0 {
        return Err(ParseError::Malformed);
    }
    let hw = rec.get(HW_OFFSET..HW_OFFSET + hw_size).ok_or(t)?;
    let pebs = layout::decode(layout, hw).map_err(|e| match e {
        // A record shorter than its own size field, inside a complete capture record,
        // is a contradiction, not a truncation.
        LayoutError::Truncated => ParseError::Malformed,
        e => ParseError::Layout(e),
    })?;
    if pebs.size() != hw_size {
        return Err(ParseError::Malformed);
    }
    Ok(CaptureRecord {
        header: RecordHeader { kind, misc, size },
        prefix,
        dsrc_kind: DsrcKind::from_id(prefix.dsrc_kind),
        pebs,
    })
}
