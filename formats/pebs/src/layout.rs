//! Every PEBS record layout, byte for byte: encoders (for the simulated assist) and
//! decoders that never panic on any bytes.
//!
//! Reference: Linux `arch/x86/events/intel/ds.c` (`struct pebs_record_core`,
//! `pebs_record_nhm`, `pebs_record_hsw`, `pebs_record_skl`,
//! `setup_pebs_adaptive_sample_data`, `adaptive_pebs_record_size_update`, `intel_ds_init`)
//! and `arch/x86/include/asm/perf_event.h` (`struct pebs_basic`, `pebs_meminfo`,
//! `pebs_gprs`, `pebs_xmm`, `PEBS_DATACFG_*`); Intel SDM Vol. 3B, "Processor Event Based
//! Sampling (PEBS)" (the per-microarchitecture PEBS record format tables and
//! "Adaptive PEBS").
//!
//! All fields are 64-bit little-endian words; offsets in bytes:
//!
//! ```text
//! fmt0 Core 2 / Atom (pebs_record_core, 144 B)
//!   0 flags (RFLAGS)   8 ip    16 ax  24 bx  32 cx  40 dx  48 si  56 di  64 bp  72 sp
//!  80 r8  88 r9  96 r10  104 r11  112 r12  120 r13  128 r14  136 r15
//! fmt1 Nehalem .. Ivy Bridge (pebs_record_nhm, 176 B) = fmt0 +
//! 144 status (IA32_PERF_GLOBAL_STATUS: applicable counters)  152 dla (data linear address)
//! 160 dse (data source encoding)  168 lat (load latency, core cycles)
//! fmt2 Haswell / Broadwell (pebs_record_hsw, 192 B) = fmt1 +
//! 176 real_ip (eventing IP)  184 tsx_tuning
//! fmt3 Skylake .. (pebs_record_skl, 200 B) = fmt2 +
//! 192 tsc
//! fmt4/5 adaptive (Ice Lake and later): groups in this order, as PEBS_DATA_CFG selects
//!   basic   (32 B): 0 format_size [31:0 record format group = the PEBS_DATA_CFG bits,
//!                   47:32 retire latency (when PERF_CAPABILITIES.pebs_timing_info),
//!                   63:48 record size in bytes]  8 ip (eventing IP)
//!                   16 applicable_counters  24 tsc
//!   meminfo (32 B, DATACFG bit 0): address, aux (data source), latency, tsx_tuning
//!   gprs   (144 B, bit 1): flags ip ax cx dx bx sp bp si di r8 .. r15   (note the order)
//!   xmm    (256 B, bit 2): xmm0..xmm15, two words each (low, high)
//!   lbr    (24 B x N, bit 3, N = DATACFG[31:24] + 1): from, to, info
//! ```

use super::bytes::{le64, put_le64};
use super::datasrc::DseTable;
use super::ds::cap;

/// A PEBS record layout. The numeric value is the layout id used in capture record
/// types (`RecordType::PEBS_BASE + id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Layout {
    /// fmt0: Core 2, Atom (Bonnell): `pebs_record_core`, 144 bytes.
    Core = 0,
    /// fmt1: Nehalem, Westmere, Sandy Bridge, Ivy Bridge: `pebs_record_nhm`, 176 bytes.
    Nehalem = 1,
    /// fmt2: Haswell, Broadwell: `pebs_record_hsw`, 192 bytes.
    Haswell = 2,
    /// fmt3: Skylake to Comet Lake, Goldmont: `pebs_record_skl`, 200 bytes.
    Skylake = 3,
    /// fmt4 and fmt5: adaptive PEBS (Ice Lake and later), 32 bytes + selected groups.
    Adaptive = 4,
}

/// Size of a `pebs_record_core`.
pub const CORE_SIZE: usize = 144;
/// Size of a `pebs_record_nhm`.
pub const NHM_SIZE: usize = 176;
/// Size of a `pebs_record_hsw`.
pub const HSW_SIZE: usize = 192;
/// Size of a `pebs_record_skl`.
pub const SKL_SIZE: usize = 200;
/// Size of the adaptive basic group (`struct pebs_basic`).
pub const BASIC_SIZE: usize = 32;
/// Size of the adaptive memory-info group (`struct pebs_meminfo`).
pub const MEMINFO_SIZE: usize = 32;
/// Size of the adaptive GPR group (`struct pebs_gprs`).
pub const GPRS_SIZE: usize = 144;
/// Size of the adaptive XMM group (`struct pebs_xmm`).
pub const XMM_SIZE: usize = 256;
/// Size of one LBR entry (`struct lbr_entry`).
pub const LBR_ENTRY_SIZE: usize = 24;
/// LBR entries the adaptive record can carry (`PEBS_DATA_CFG[31:24] + 1`).
pub const MAX_LBR_ENCODABLE: usize = 256;
/// Deepest LBR stack of any CPU (architectural LBR depth ≤ 32): what the simulated
/// assist writes at most.
pub const MAX_LBR_ENTRIES: usize = 32;

/// `PEBS_DATA_CFG` bit: the memory-info group.
pub const DATACFG_MEMINFO: u64 = 1 << 0;
/// `PEBS_DATA_CFG` bit: the GPR group.
pub const DATACFG_GP: u64 = 1 << 1;
/// `PEBS_DATA_CFG` bit: the XMM group.
pub const DATACFG_XMMS: u64 = 1 << 2;
/// `PEBS_DATA_CFG` bit: the LBR group.
pub const DATACFG_LBRS: u64 = 1 << 3;
/// Shift of the "LBR entries - 1" field of `PEBS_DATA_CFG`.
pub const DATACFG_LBR_SHIFT: u32 = 24;
/// Every bit of `PEBS_DATA_CFG` (and of the record format group) that has a meaning.
pub const DATACFG_VALID: u64 = 0xf | (0xff << DATACFG_LBR_SHIFT);
/// Shift of the record size in the basic group's `format_size`.
pub const FORMAT_SIZE_SHIFT: u32 = 48;
/// Shift of the retire latency in the basic group's `format_size`.
pub const RETIRE_LATENCY_SHIFT: u32 = 32;

/// Byte offsets of the legacy (fmt0..fmt3) records.
pub mod off {
    /// RFLAGS.
    pub const FLAGS: usize = 0;
    /// IP (the instruction after the eventing one on trap-like PEBS).
    pub const IP: usize = 8;
    /// First GPR (`ax`); GPRs follow in `Gprs::to_legacy` order up to `r15` at 136.
    pub const AX: usize = 16;
    /// IA32_PERF_GLOBAL_STATUS (fmt1+).
    pub const STATUS: usize = 144;
    /// Data linear address (fmt1+).
    pub const DLA: usize = 152;
    /// Data source encoding (fmt1+).
    pub const DSE: usize = 160;
    /// Load latency in core cycles (fmt1+).
    pub const LAT: usize = 168;
    /// Eventing IP (fmt2+).
    pub const REAL_IP: usize = 176;
    /// TSX tuning (fmt2+).
    pub const TSX_TUNING: usize = 184;
    /// TSC (fmt3).
    pub const TSC: usize = 192;
    /// Adaptive basic group: `format_size`.
    pub const BASIC_FORMAT_SIZE: usize = 0;
    /// Adaptive basic group: eventing IP.
    pub const BASIC_IP: usize = 8;
    /// Adaptive basic group: applicable counters.
    pub const BASIC_APPLICABLE: usize = 16;
    /// Adaptive basic group: TSC.
    pub const BASIC_TSC: usize = 24;
}

impl Layout {
    /// The layout of PEBS record format `fmt` (`PERF_CAPABILITIES[11:8]`); fmt5 records
    /// use the adaptive layout (only the DS reset slots differ, see `ds::reset_slot`).
    pub const fn from_format(fmt: u32) -> Option<Layout> {
        match fmt {
            0 => Some(Layout::Core),
            1 => Some(Layout::Nehalem),
            2 => Some(Layout::Haswell),
            3 => Some(Layout::Skylake),
            4 | 5 => Some(Layout::Adaptive),
            _ => None,
        }
    }

    /// The layout with this id (its `u32` value).
    pub const fn from_id(id: u32) -> Option<Layout> {
        match id {
            0 => Some(Layout::Core),
            1 => Some(Layout::Nehalem),
            2 => Some(Layout::Haswell),
            3 => Some(Layout::Skylake),
            4 => Some(Layout::Adaptive),
            _ => None,
        }
    }

    /// The layout id.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The record size of a legacy layout; `None` for adaptive (see [`adaptive_size`]).
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            Layout::Core => Some(CORE_SIZE),
            Layout::Nehalem => Some(NHM_SIZE),
            Layout::Haswell => Some(HSW_SIZE),
            Layout::Skylake => Some(SKL_SIZE),
            Layout::Adaptive => None,
        }
    }

    /// Short name: `core`, `nhm`, `hsw`, `skl`, `adaptive`.
    pub const fn name(self) -> &'static str {
        match self {
            Layout::Core => "core",
            Layout::Nehalem => "nhm",
            Layout::Haswell => "hsw",
            Layout::Skylake => "skl",
            Layout::Adaptive => "adaptive",
        }
    }
}

/// LBR entries an adaptive record with this `PEBS_DATA_CFG` carries.
pub const fn lbr_entries(data_cfg: u64) -> usize {
    if data_cfg & DATACFG_LBRS != 0 {
        (((data_cfg >> DATACFG_LBR_SHIFT) & 0xff) + 1) as usize
    } else {
        0
    }
}

/// The `PEBS_DATA_CFG` bits asking for `n` LBR entries (1..=256; 0 asks for none).
pub const fn datacfg_lbr(n: usize) -> u64 {
    if n == 0 || n > MAX_LBR_ENCODABLE {
        0
    } else {
        DATACFG_LBRS | (((n - 1) as u64) << DATACFG_LBR_SHIFT)
    }
}

/// Size of an adaptive record for `data_cfg` (`adaptive_pebs_record_size_update`, with
/// the LBR count taken from the configuration as the hardware does). Bits outside
/// [`DATACFG_VALID`] are ignored here; [`record_size`] rejects them.
pub const fn adaptive_size(data_cfg: u64) -> usize {
    let mut sz = BASIC_SIZE;
    if data_cfg & DATACFG_MEMINFO != 0 {
        sz += MEMINFO_SIZE;
    }
    if data_cfg & DATACFG_GP != 0 {
        sz += GPRS_SIZE;
    }
    if data_cfg & DATACFG_XMMS != 0 {
        sz += XMM_SIZE;
    }
    sz + lbr_entries(data_cfg) * LBR_ENTRY_SIZE
}

/// Largest record of any layout (adaptive with every group and 256 LBR entries).
pub const MAX_RECORD_SIZE: usize = adaptive_size(DATACFG_VALID);

/// Why bytes are not a record of a layout, or a record cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// Fewer bytes than the layout (or the record's own size field) needs.
    Truncated,
    /// The record contradicts itself: an adaptive size field that disagrees with its
    /// group bits, unknown group bits, or a size of zero.
    Malformed,
    /// The configuration cannot be encoded: `PEBS_DATA_CFG` groups on a legacy layout,
    /// reserved `PEBS_DATA_CFG` bits, or more LBR entries than [`MAX_LBR_ENTRIES`].
    BadConfig,
    /// The output buffer is too small.
    NoSpace,
}

/// Record size of `layout` under `data_cfg` (which must be 0 for legacy layouts).
pub fn record_size(layout: Layout, data_cfg: u64) -> Result<usize, LayoutError> {
    match layout.fixed_size() {
        Some(s) if data_cfg == 0 => Ok(s),
        Some(_) => Err(LayoutError::BadConfig),
        None if data_cfg & !DATACFG_VALID != 0 => Err(LayoutError::BadConfig),
        None => Ok(adaptive_size(data_cfg)),
    }
}

/// The 16 general-purpose registers with RFLAGS and IP, as PEBS saves them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gprs {
    /// RFLAGS.
    pub flags: u64,
    /// IP (legacy records: the IP field; adaptive: the GPR group's IP, off by one
    /// instruction on trap-like PEBS, unlike the basic group's eventing IP).
    pub ip: u64,
    /// RAX.
    pub ax: u64,
    /// RBX.
    pub bx: u64,
    /// RCX.
    pub cx: u64,
    /// RDX.
    pub dx: u64,
    /// RSI.
    pub si: u64,
    /// RDI.
    pub di: u64,
    /// RBP.
    pub bp: u64,
    /// RSP.
    pub sp: u64,
    /// R8.
    pub r8: u64,
    /// R9.
    pub r9: u64,
    /// R10.
    pub r10: u64,
    /// R11.
    pub r11: u64,
    /// R12.
    pub r12: u64,
    /// R13.
    pub r13: u64,
    /// R14.
    pub r14: u64,
    /// R15.
    pub r15: u64,
}

/// Number of words in a GPR block (flags, ip and 16 registers).
pub const GPR_WORDS: usize = 18;

impl Gprs {
    /// Names of the words of [`to_legacy`](Self::to_legacy), in order (the canonical
    /// order the decoder reports registers in).
    pub const LEGACY_NAMES: [&'static str; GPR_WORDS] = [
        "flags", "ip", "ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "r8", "r9", "r10", "r11",
        "r12", "r13", "r14", "r15",
    ];

    /// The words in legacy record order (`pebs_record_core`): flags, ip, ax, bx, cx, dx,
    /// si, di, bp, sp, r8..r15.
    pub const fn to_legacy(&self) -> [u64; GPR_WORDS] {
        [
            self.flags, self.ip, self.ax, self.bx, self.cx, self.dx, self.si, self.di, self.bp,
            self.sp, self.r8, self.r9, self.r10, self.r11, self.r12, self.r13, self.r14,
            self.r15,
        ]
    }

    /// From words in legacy record order.
    pub const fn from_legacy(w: &[u64; GPR_WORDS]) -> Gprs {
        Gprs {
            flags: w[0],
            ip: w[1],
            ax: w[2],
            bx: w[3],
            cx: w[4],
            dx: w[5],
            si: w[6],
            di: w[7],
            bp: w[8],
            sp: w[9],
            r8: w[10],
            r9: w[11],
            r10: w[12],
            r11: w[13],
            r12: w[14],
            r13: w[15],
            r14: w[16],
            r15: w[17],
        }
    }

    /// The words in adaptive GPR-group order (`pebs_gprs`): flags, ip, ax, cx, dx, bx,
    /// sp, bp, si, di, r8..r15.
    pub const fn to_adaptive(&self) -> [u64; GPR_WORDS] {
        [
            self.flags, self.ip, self.ax, self.cx, self.dx, self.bx, self.sp, self.bp, self.si,
            self.di, self.r8, self.r9, self.r10, self.r11, self.r12, self.r13, self.r14,
            self.r15,
        ]
    }

    /// From words in adaptive GPR-group order.
    pub const fn from_adaptive(w: &[u64; GPR_WORDS]) -> Gprs {
        Gprs {
            flags: w[0],
            ip: w[1],
            ax: w[2],
            cx: w[3],
            dx: w[4],
            bx: w[5],
            sp: w[6],
            bp: w[7],
            si: w[8],
            di: w[9],
            r8: w[10],
            r9: w[11],
            r10: w[12],
            r11: w[13],
            r12: w[14],
            r13: w[15],
            r14: w[16],
            r15: w[17],
        }
    }
}

/// One LBR entry (`struct lbr_entry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbrEntry {
    /// Branch source.
    pub from: u64,
    /// Branch target.
    pub to: u64,
    /// LBR_INFO (mispredict, cycles, ...).
    pub info: u64,
}

/// Everything a PEBS assist can write, for the encoders (the simulated assist fills
/// one per sample). Fields a layout does not have are ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PebsSample {
    /// Architectural state: RFLAGS, IP (the trap-like "next" IP) and GPRs.
    pub regs: Gprs,
    /// The eventing IP (fmt2/fmt3 `real_ip`, adaptive basic `ip`).
    pub eventing_ip: u64,
    /// Counters this record applies to (fmt1+ `status`, adaptive `applicable_counters`).
    pub applicable_counters: u64,
    /// Data linear address (fmt1+ `dla`, adaptive `meminfo.address`).
    pub data_addr: u64,
    /// Data source encoding (fmt1+ `dse`, adaptive `meminfo.aux`).
    pub data_source: u64,
    /// Load latency (fmt1+ `lat`, adaptive `meminfo.latency`).
    pub latency: u64,
    /// TSX tuning (fmt2+ `tsx_tuning`, adaptive `meminfo.tsx_tuning`).
    pub tsx_tuning: u64,
    /// TSC (fmt3 `tsc`, adaptive basic `tsc`).
    pub tsc: u64,
    /// Retire latency (adaptive `format_size[47:32]`, with `pebs_timing_info`).
    pub retire_latency: u16,
    /// XMM0..15, low then high word each.
    pub xmm: [u64; 32],
    /// LBR entries, most recent first; as many as the configuration asks for are used.
    pub lbr: [LbrEntry; MAX_LBR_ENTRIES],
}

impl Default for PebsSample {
    fn default() -> Self {
        PebsSample {
            regs: Gprs::default(),
            eventing_ip: 0,
            applicable_counters: 0,
            data_addr: 0,
            data_source: 0,
            latency: 0,
            tsx_tuning: 0,
            tsc: 0,
            retire_latency: 0,
            xmm: [0; 32],
            lbr: [LbrEntry::default(); MAX_LBR_ENTRIES],
        }
    }
}

/// Writes `sample` as a `layout` record (with `data_cfg` for adaptive; 0 for legacy)
/// into `out`, byte-exact as the CPU's microcode lays it out. Returns the record size.
pub fn encode(
    layout: Layout,
    data_cfg: u64,
    sample: &PebsSample,
    out: &mut [u8],
) -> Result<usize, LayoutError> {
    let size = record_size(layout, data_cfg)?;
    if lbr_entries(data_cfg) > MAX_LBR_ENTRIES {
        return Err(LayoutError::BadConfig);
    }
    let out = out.get_mut(..size).ok_or(LayoutError::NoSpace)?;
    out.fill(0);
    let mut ok = true;
    let mut put = |off: usize, v: u64| ok &= put_le64(out, off, v);
    if layout == Layout::Adaptive {
        let format_size = ((size as u64) << FORMAT_SIZE_SHIFT)
            | (u64::from(sample.retire_latency) << RETIRE_LATENCY_SHIFT)
            | (data_cfg & DATACFG_VALID);
        put(off::BASIC_FORMAT_SIZE, format_size);
        put(off::BASIC_IP, sample.eventing_ip);
        put(off::BASIC_APPLICABLE, sample.applicable_counters);
        put(off::BASIC_TSC, sample.tsc);
        let mut at = BASIC_SIZE;
        if data_cfg & DATACFG_MEMINFO != 0 {
            put(at, sample.data_addr);
            put(at + 8, sample.data_source);
            put(at + 16, sample.latency);
            put(at + 24, sample.tsx_tuning);
            at += MEMINFO_SIZE;
        }
        if data_cfg & DATACFG_GP != 0 {
            for (i, w) in sample.regs.to_adaptive().iter().enumerate() {
                put(at + 8 * i, *w);
            }
            at += GPRS_SIZE;
        }
        if data_cfg & DATACFG_XMMS != 0 {
            for (i, w) in sample.xmm.iter().enumerate() {
                put(at + 8 * i, *w);
            }
            at += XMM_SIZE;
        }
        for e in sample.lbr.iter().take(lbr_entries(data_cfg)) {
            put(at, e.from);
            put(at + 8, e.to);
            put(at + 16, e.info);
            at += LBR_ENTRY_SIZE;
        }
    } else {
        for (i, w) in sample.regs.to_legacy().iter().enumerate() {
            put(8 * i, *w);
        }
        if layout as u32 >= Layout::Nehalem as u32 {
            put(off::STATUS, sample.applicable_counters);
            put(off::DLA, sample.data_addr);
            put(off::DSE, sample.data_source);
            put(off::LAT, sample.latency);
        }
        if layout as u32 >= Layout::Haswell as u32 {
            put(off::REAL_IP, sample.eventing_ip);
            put(off::TSX_TUNING, sample.tsx_tuning);
        }
        if layout == Layout::Skylake {
            put(off::TSC, sample.tsc);
        }
    }
    if ok {
        Ok(size)
    } else {
        Err(LayoutError::NoSpace)
    }
}

/// The memory-access fields of a record (fmt1+ or the adaptive meminfo group).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// Data linear address.
    pub address: u64,
    /// Data source encoding (`dse` / `aux`), to decode with `datasrc`.
    pub data_source: u64,
    /// Latency word as recorded (see `PebsFormat::instr_latency` for its split).
    pub latency: u64,
    /// TSX tuning (fmt2+ and adaptive); `None` on fmt1.
    pub tsx_tuning: Option<u64>,
}

/// A decoded record: scalar fields copied out, variable groups (XMM, LBR) read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PebsRecord<'a> {
    /// The layout.
    pub layout: Layout,
    /// Exactly the record's bytes.
    pub bytes: &'a [u8],
    /// The IP word: legacy `ip` (trap-like: after the eventing instruction), adaptive
    /// basic `ip` (the eventing IP).
    pub ip: u64,
    /// The eventing IP where the layout has one (fmt2, fmt3, adaptive).
    pub eventing_ip: Option<u64>,
    /// Applicable counters (fmt1+ status, adaptive applicable_counters).
    pub applicable_counters: Option<u64>,
    /// TSC (fmt3, adaptive).
    pub tsc: Option<u64>,
    /// Memory info (fmt1+, adaptive with the meminfo group).
    pub mem: Option<MemInfo>,
    /// Registers (legacy always, adaptive with the GPR group).
    pub regs: Option<Gprs>,
    /// Adaptive record format group (the `PEBS_DATA_CFG` bits it was written with); 0
    /// for legacy.
    pub data_cfg: u64,
    /// Adaptive `format_size[47:32]` (retire latency where the CPU reports it), else 0.
    pub retire_latency: u16,
    xmm_off: Option<usize>,
    lbr_off: usize,
    lbr_nr: usize,
}

impl<'a> PebsRecord<'a> {
    /// Record size in bytes.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The 256 bytes of the XMM group, if captured (32 little-endian words).
    pub fn xmm_bytes(&self) -> Option<&'a [u8]> {
        let off = self.xmm_off?;
        self.bytes.get(off..off + XMM_SIZE)
    }

    /// XMM register `i` (0..16) as (low, high) words, if captured.
    pub fn xmm(&self, i: usize) -> Option<(u64, u64)> {
        let b = self.xmm_bytes()?;
        Some((le64(b, 16 * i)?, le64(b, 16 * i + 8)?))
    }

    /// Number of LBR entries captured (0 if none).
    pub fn lbr_count(&self) -> usize {
        self.lbr_nr
    }

    /// The LBR group's bytes (`lbr_count() * 24`, little-endian from/to/info words).
    pub fn lbr_bytes(&self) -> &'a [u8] {
        self.bytes
            .get(self.lbr_off..self.lbr_off + self.lbr_nr * LBR_ENTRY_SIZE)
            .unwrap_or(&[])
    }

    /// LBR entry `i`, if captured.
    pub fn lbr(&self, i: usize) -> Option<LbrEntry> {
        if i >= self.lbr_nr {
            return None;
        }
        let b = self.lbr_bytes();
        let at = i * LBR_ENTRY_SIZE;
        Some(LbrEntry { from: le64(b, at)?, to: le64(b, at + 8)?, info: le64(b, at + 16)? })
    }
}

fn gprs_at(b: &[u8], at: usize, adaptive: bool) -> Option<Gprs> {
    let mut w = [0u64; GPR_WORDS];
    for (i, v) in w.iter_mut().enumerate() {
        *v = le64(b, at + 8 * i)?;
    }
    Some(if adaptive { Gprs::from_adaptive(&w) } else { Gprs::from_legacy(&w) })
}

/// The size an adaptive record at the start of `b` declares (`format_size[63:48]`).
pub fn adaptive_declared_size(b: &[u8]) -> Option<usize> {
    le64(b, off::BASIC_FORMAT_SIZE).map(|w| (w >> FORMAT_SIZE_SHIFT) as usize)
}

/// Decodes one `layout` record from the start of `b` (which may hold more bytes after
/// it). Never panics: every read is bounds-checked.
pub fn decode(layout: Layout, b: &[u8]) -> Result<PebsRecord<'_>, LayoutError> {
    let t = LayoutError::Truncated;
    if layout == Layout::Adaptive {
        let fs = le64(b, off::BASIC_FORMAT_SIZE).ok_or(t)?;
        let size = (fs >> FORMAT_SIZE_SHIFT) as usize;
        let group = fs & 0xffff_ffff;
        if size == 0 || group & !DATACFG_VALID != 0 || adaptive_size(group) != size {
            return Err(LayoutError::Malformed);
        }
        let bytes = b.get(..size).ok_or(t)?;
        let mut r = PebsRecord {
            layout,
            bytes,
            ip: le64(bytes, off::BASIC_IP).ok_or(t)?,
            eventing_ip: None,
            applicable_counters: Some(le64(bytes, off::BASIC_APPLICABLE).ok_or(t)?),
            tsc: Some(le64(bytes, off::BASIC_TSC).ok_or(t)?),
            mem: None,
            regs: None,
            data_cfg: group,
            retire_latency: ((fs >> RETIRE_LATENCY_SHIFT) & 0xffff) as u16,
            xmm_off: None,
            lbr_off: 0,
            lbr_nr: 0,
        };
        r.eventing_ip = Some(r.ip);
        let mut at = BASIC_SIZE;
        if group & DATACFG_MEMINFO != 0 {
            r.mem = Some(MemInfo {
                address: le64(bytes, at).ok_or(t)?,
                data_source: le64(bytes, at + 8).ok_or(t)?,
                latency: le64(bytes, at + 16).ok_or(t)?,
                tsx_tuning: Some(le64(bytes, at + 24).ok_or(t)?),
            });
            at += MEMINFO_SIZE;
        }
        if group & DATACFG_GP != 0 {
            r.regs = Some(gprs_at(bytes, at, true).ok_or(t)?);
            at += GPRS_SIZE;
        }
        if group & DATACFG_XMMS != 0 {
            r.xmm_off = Some(at);
            at += XMM_SIZE;
        }
        r.lbr_off = at;
        r.lbr_nr = lbr_entries(group);
        return Ok(r);
    }
    let size = layout.fixed_size().unwrap_or(CORE_SIZE);
    let bytes = b.get(..size).ok_or(t)?;
    let regs = gprs_at(bytes, 0, false).ok_or(t)?;
    let nhm = layout as u32 >= Layout::Nehalem as u32;
    let hsw = layout as u32 >= Layout::Haswell as u32;
    let w = |o: usize| le64(bytes, o).ok_or(t);
    Ok(PebsRecord {
        layout,
        bytes,
        ip: regs.ip,
        eventing_ip: if hsw { Some(w(off::REAL_IP)?) } else { None },
        applicable_counters: if nhm { Some(w(off::STATUS)?) } else { None },
        tsc: if layout == Layout::Skylake { Some(w(off::TSC)?) } else { None },
        mem: if nhm {
            Some(MemInfo {
                address: w(off::DLA)?,
                data_source: w(off::DSE)?,
                latency: w(off::LAT)?,
                tsx_tuning: if hsw { Some(w(off::TSX_TUNING)?) } else { None },
            })
        } else {
            None
        },
        regs: Some(regs),
        data_cfg: 0,
        retire_latency: 0,
        xmm_off: None,
        lbr_off: size,
        lbr_nr: 0,
    })
}

/// The record size of the `layout` record at the start of `b`: fixed for legacy
/// layouts, the declared size for adaptive ones (checked against its groups).
pub fn size_at(layout: Layout, b: &[u8]) -> Result<usize, LayoutError> {
    decode(layout, b).map(|r| r.size())
}

/// What the capture records about the CPU's PEBS: the record format, its capability
/// bits and how to read data-source encodings. A plain `u32` (zero-extended into the
/// capture's format argument and every record prefix):
///
/// ```text
/// bits  3:0  PEBS record format (PERF_CAPABILITIES[11:8]): 0..5
/// bit     4  baseline: adaptive groups beyond the basic one are available
/// bit     5  pebs_trap (PERF_CAPABILITIES bit 6): IP is the next instruction
/// bit     6  pebs_arch_reg (bit 7)
/// bit     7  pebs_timing_info (bit 17): adaptive retire latency is valid
/// bits 11:8  data-source table (DseTable)
/// bit    12  pmem: SKL-table encodings 0x08/0x09 mean persistent memory
/// bit    13  no_tlb: data-source encodings carry no TLB/lock bits (Nehalem)
/// bit    14  block: data-source encodings carry store-block bits
/// bit    15  valid: detected (a zero word means "unknown")
/// bit    16  simulated: the simulated PMU wrote the records
/// bit    17  instr_latency: adaptive latency = instruction latency [15:0] and cache
///            latency [47:32] (Alder Lake, Sapphire Rapids and later)
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PebsFormat(pub u32);

impl PebsFormat {
    /// Bits 3:0.
    pub const FORMAT_MASK: u32 = 0xf;
    /// Bit 4.
    pub const BASELINE: u32 = 1 << 4;
    /// Bit 5.
    pub const TRAP: u32 = 1 << 5;
    /// Bit 6.
    pub const ARCH_REG: u32 = 1 << 6;
    /// Bit 7.
    pub const TIMING_INFO: u32 = 1 << 7;
    /// Shift of the data-source table id.
    pub const DSE_SHIFT: u32 = 8;
    /// Bit 12.
    pub const PMEM: u32 = 1 << 12;
    /// Bit 13.
    pub const NO_TLB: u32 = 1 << 13;
    /// Bit 14.
    pub const BLOCK: u32 = 1 << 14;
    /// Bit 15.
    pub const VALID: u32 = 1 << 15;
    /// Bit 16.
    pub const SIMULATED: u32 = 1 << 16;
    /// Bit 17.
    pub const INSTR_LATENCY: u32 = 1 << 17;
    /// Every defined bit.
    pub const KNOWN: u32 = 0x3_ffff;

    /// A word for record format `fmt` with the given extra bits and data-source table.
    pub const fn new(fmt: u32, bits: u32, table: DseTable) -> PebsFormat {
        PebsFormat(
            (fmt & Self::FORMAT_MASK)
                | (bits & !Self::FORMAT_MASK & !(0xf << Self::DSE_SHIFT))
                | ((table as u32) << Self::DSE_SHIFT)
                | Self::VALID,
        )
    }

    /// The word the simulated PMU reports for `layout` (fmt4 with baseline for adaptive).
    pub const fn simulated(layout: Layout, table: DseTable) -> PebsFormat {
        let extra = if matches!(layout, Layout::Adaptive) { Self::BASELINE } else { 0 };
        PebsFormat::new(layout as u32, extra | Self::SIMULATED, table)
    }

    /// The word a simulated PMU of `layout`'s generation reports: the data-source table
    /// of that generation (Nehalem without TLB bits, Sandy Bridge for Haswell, Skylake for
    /// Skylake and adaptive) and the `simulated` bit. Used by the `sim` source and by
    /// hrperf-core's `pebs_sim=`.
    pub const fn simulated_for(layout: Layout) -> PebsFormat {
        let (table, extra) = match layout {
            Layout::Core => (DseTable::None, 0),
            Layout::Nehalem => (DseTable::Nehalem, Self::NO_TLB),
            Layout::Haswell => (DseTable::SandyBridge, 0),
            Layout::Skylake | Layout::Adaptive => (DseTable::Skylake, 0),
        };
        PebsFormat(PebsFormat::simulated(layout, table).0 | extra)
    }

    /// PEBS record format number.
    pub const fn format(self) -> u32 {
        self.0 & Self::FORMAT_MASK
    }

    /// The record layout, if the format is known (and the word valid).
    pub const fn layout(self) -> Option<Layout> {
        if self.0 & Self::VALID == 0 {
            return None;
        }
        Layout::from_format(self.format())
    }

    /// Whether `bit` (one of the associated constants) is set.
    pub const fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    /// The data-source table.
    pub const fn dse_table(self) -> DseTable {
        DseTable::from_id((self.0 >> Self::DSE_SHIFT) & 0xf)
    }
}

/// What a CPU says about itself, as needed to detect PEBS (CPUID leaf 1 and
/// `IA32_MISC_ENABLE`; the kernel glue and the perf source fill it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuInfo {
    /// Vendor is GenuineIntel.
    pub intel: bool,
    /// Display family (CPUID.1:EAX, extended family folded in).
    pub family: u32,
    /// Display model (extended model folded in).
    pub model: u32,
    /// `CPUID.1:EDX[21]` DS: the debug store exists.
    pub ds: bool,
    /// `CPUID.1:ECX[2]` DTES64: 64-bit DS layout.
    pub dtes64: bool,
    /// `CPUID.1:ECX[15]` PDCM: `IA32_PERF_CAPABILITIES` exists.
    pub pdcm: bool,
    /// `IA32_MISC_ENABLE[12]`: PEBS unavailable.
    pub pebs_unavailable: bool,
    /// On a hybrid CPU, this CPU is an efficiency (Atom) core.
    pub atom_core: bool,
}

/// Why a CPU has no usable PEBS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DetectError {
    /// Not an Intel CPU (AMD has IBS, not PEBS).
    NotIntel,
    /// No debug store (CPUID.1:EDX.DS = 0).
    NoDebugStore,
    /// Only the 32-bit DS layout (no DTES64), which is not supported (as in Linux).
    NoDtes64,
    /// `IA32_MISC_ENABLE` says PEBS is unavailable.
    PebsUnavailable,
    /// A PEBS record format this code does not know.
    UnknownFormat(u32),
}

/// Detects PEBS as Linux's `intel_ds_init` does: the format comes from
/// `IA32_PERF_CAPABILITIES[11:8]` (read only when PDCM is set; `perf_capabilities` is
/// that MSR's value, `None` if it could not be read), fmt0 without it; the data-source
/// table from the family/model (`intel_pmu_init` in `arch/x86/events/intel/core.c`).
pub fn detect(cpu: &CpuInfo, perf_capabilities: Option<u64>) -> Result<PebsFormat, DetectError> {
    if !cpu.intel {
        return Err(DetectError::NotIntel);
    }
    if !cpu.ds {
        return Err(DetectError::NoDebugStore);
    }
    if !cpu.dtes64 {
        return Err(DetectError::NoDtes64);
    }
    if cpu.pebs_unavailable {
        return Err(DetectError::PebsUnavailable);
    }
    let caps = if cpu.pdcm { perf_capabilities.unwrap_or(0) } else { 0 };
    let fmt = ((caps >> cap::PEBS_FORMAT_SHIFT) & cap::PEBS_FORMAT_MASK) as u32;
    if Layout::from_format(fmt).is_none() {
        return Err(DetectError::UnknownFormat(fmt));
    }
    let mut bits = 0;
    if fmt >= 4 && caps & cap::PEBS_BASELINE != 0 {
        bits |= PebsFormat::BASELINE;
    }
    if caps & cap::PEBS_TRAP != 0 {
        bits |= PebsFormat::TRAP;
    }
    if caps & cap::PEBS_ARCH_REG != 0 {
        bits |= PebsFormat::ARCH_REG;
    }
    if caps & cap::PEBS_TIMING_INFO != 0 {
        bits |= PebsFormat::TIMING_INFO;
    }
    let (table, model_bits) = if cpu.family == 6 {
        model_data_source(cpu.model, cpu.atom_core)
    } else {
        (DseTable::SandyBridge, 0)
    };
    Ok(PebsFormat::new(fmt, bits | model_bits, table))
}

/// The data-source table and flags of a family-6 model, as `intel_pmu_init` sets them
/// up (`intel_pmu_pebs_data_source_nhm/skl/adl/mtl/lnl/cmt`, `pebs_no_tlb`,
/// `pebs_block`, `PMU_FL_INSTR_LATENCY`). Unknown models get the Sandy Bridge table,
/// the kernel's default.
pub const fn model_data_source(model: u32, atom_core: bool) -> (DseTable, u32) {
    const P: u32 = PebsFormat::PMEM;
    const B: u32 = PebsFormat::BLOCK;
    const I: u32 = PebsFormat::INSTR_LATENCY;
    match model {
        // Nehalem, Westmere: no TLB/lock bits.
        0x1a | 0x1e | 0x1f | 0x2e | 0x25 | 0x2c | 0x2f => {
            (DseTable::Nehalem, PebsFormat::NO_TLB)
        }
        // Sandy Bridge, Ivy Bridge, Haswell, Broadwell.
        0x2a | 0x2d | 0x3a | 0x3e | 0x3c | 0x3f | 0x45 | 0x46 | 0x3d | 0x47 | 0x4f | 0x56 => {
            (DseTable::SandyBridge, 0)
        }
        // Skylake-X / Cascade Lake / Cooper Lake, Ice Lake-X/D: persistent memory.
        0x55 | 0x6a | 0x6c => (DseTable::Skylake, P),
        // Skylake, Kaby/Coffee/Comet Lake, Ice Lake, Tiger Lake, Rocket Lake.
        0x4e | 0x5e | 0x8e | 0x9e | 0xa5 | 0xa6 | 0x7d | 0x7e | 0x8c | 0x8d | 0xa7 => {
            (DseTable::Skylake, 0)
        }
        // Sapphire / Emerald / Granite Rapids.
        0x8f | 0xcf | 0xad | 0xae => (DseTable::Skylake, P | B | I),
        // Alder Lake, Raptor Lake (hybrid: Golden/Raptor Cove + Gracemont).
        0x97 | 0x9a | 0xb7 | 0xba | 0xbf => {
            if atom_core {
                (DseTable::Gracemont, I)
            } else {
                (DseTable::Skylake, B | I)
            }
        }
        // Alder Lake-N: Gracemont only.
        0xbe => (DseTable::Gracemont, I),
        // Meteor Lake (Redwood Cove + Crestmont).
        0xaa | 0xac => {
            if atom_core {
                (DseTable::Crestmont, I)
            } else {
                (DseTable::Skylake, B | I)
            }
        }
        // Sierra Forest, Grand Ridge: Crestmont only.
        0xaf | 0xb6 => (DseTable::Crestmont, 0),
        // Lunar Lake, Arrow Lake (Lion Cove + Skymont).
        0xbd | 0xc5 | 0xc6 => {
            if atom_core {
                (DseTable::Crestmont, I)
            } else {
                (DseTable::LionCove, I)
            }
        }
        _ => (DseTable::SandyBridge, 0),
    }
}
