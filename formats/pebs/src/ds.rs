//! The DS save area, the PEBS MSRs, the programming sequence and "large PEBS"
//! threshold sizing, behind [`PebsMsrs`] so the kernel writes real MSRs and the
//! simulator models them ([`SimMsrs`]).
//!
//! Reference: Intel SDM Vol. 3B, "Debug Store (DS) Mechanism" (the 64-bit DS save area
//! layout), "Processor Event Based Sampling (PEBS)" (IA32_PEBS_ENABLE, counter reset,
//! interrupt threshold) and Vol. 4 (MSR numbers); Linux
//! `arch/x86/include/asm/intel_ds.h` (`struct debug_store`, `MAX_PEBS_EVENTS_FMT4`,
//! `MAX_PEBS_EVENTS`, `MAX_FIXED_PEBS_EVENTS`), `arch/x86/events/intel/ds.c`
//! (`intel_pmu_pebs_enable`, `pebs_update_threshold`, `alloc_pebs_buffer`),
//! `arch/x86/include/asm/msr-index.h`, `arch/x86/include/asm/perf_event.h`.
//!
//! ```text
//! DS save area (64-bit, DTES64)           offset
//!   bts_buffer_base                        0x00
//!   bts_index                              0x08
//!   bts_absolute_maximum                   0x10
//!   bts_interrupt_threshold                0x18
//!   pebs_buffer_base                       0x20
//!   pebs_index                             0x28   next record is written here
//!   pebs_absolute_maximum                  0x30   no record is written at or past it
//!   pebs_interrupt_threshold               0x38   PMI once pebs_index reaches it
//!   pebs_event_reset[48]                   0x40   counter reload values:
//!       fmt <= 4: GP counter i at [i] (i < 8), fixed counter j at [8 + j]
//!       fmt 5:    GP counter i at [i] (i < 32), fixed counter j at [32 + j]
//! ```

/// Reset slots in the DS area (`MAX_PEBS_EVENTS + MAX_FIXED_PEBS_EVENTS`).
pub const DS_RESET_SLOTS: usize = 48;
/// GP counters with a reset slot before fmt5 (`MAX_PEBS_EVENTS_FMT4`).
pub const MAX_PEBS_EVENTS_FMT4: usize = 8;
/// GP counters with a reset slot from fmt5 (`MAX_PEBS_EVENTS`).
pub const MAX_PEBS_EVENTS: usize = 32;
/// Fixed counters with a reset slot (`MAX_FIXED_PEBS_EVENTS`).
pub const MAX_FIXED_PEBS_EVENTS: usize = 16;

/// The 64-bit DS save area (`struct debug_store`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsArea {
    /// BTS buffer base (unused by hrperf: 0).
    pub bts_buffer_base: u64,
    /// BTS index.
    pub bts_index: u64,
    /// BTS absolute maximum.
    pub bts_absolute_maximum: u64,
    /// BTS interrupt threshold.
    pub bts_interrupt_threshold: u64,
    /// Linear address of the first PEBS record.
    pub pebs_buffer_base: u64,
    /// Linear address where the next record goes.
    pub pebs_index: u64,
    /// Linear address no record may reach past (base + whole records).
    pub pebs_absolute_maximum: u64,
    /// Linear address at which a record write raises the PMI.
    pub pebs_interrupt_threshold: u64,
    /// Counter reload values (see the module docs for the slots).
    pub pebs_event_reset: [u64; DS_RESET_SLOTS],
}
/// Size of [`DsArea`].
pub const DS_SIZE: usize = core::mem::size_of::<DsArea>();
const _: () = assert!(DS_SIZE == 0x40 + 8 * DS_RESET_SLOTS);

/// Byte offsets inside [`DsArea`].
pub mod ds_off {
    /// `pebs_buffer_base`.
    pub const PEBS_BUFFER_BASE: usize = 0x20;
    /// `pebs_index`.
    pub const PEBS_INDEX: usize = 0x28;
    /// `pebs_absolute_maximum`.
    pub const PEBS_ABS_MAX: usize = 0x30;
    /// `pebs_interrupt_threshold`.
    pub const PEBS_THRESHOLD: usize = 0x38;
    /// `pebs_event_reset[0]`.
    pub const PEBS_RESET: usize = 0x40;
}

/// A counter, as PEBS and the global MSRs number them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// General-purpose counter `IA32_PMCi`.
    Gp(u32),
    /// Fixed counter `IA32_FIXED_CTRj`.
    Fixed(u32),
}

impl Counter {
    /// The counter's bit in IA32_PERF_GLOBAL_CTRL/STATUS, IA32_PEBS_ENABLE and the
    /// records' applicable-counters field: `i` for GP, `32 + j` for fixed.
    pub const fn global_bit(self) -> Option<u32> {
        match self {
            Counter::Gp(i) if i < 32 => Some(i),
            Counter::Fixed(j) if j < 16 => Some(32 + j),
            _ => None,
        }
    }
}

/// The DS reset slot of `counter` for PEBS record format `pebs_format`
/// (`intel_pmu_pebs_enable`); `None` if the counter cannot do PEBS in that format.
pub const fn reset_slot(pebs_format: u32, counter: Counter) -> Option<usize> {
    let (gp, base) = if pebs_format < 5 {
        (MAX_PEBS_EVENTS_FMT4, MAX_PEBS_EVENTS_FMT4)
    } else {
        (MAX_PEBS_EVENTS, MAX_PEBS_EVENTS)
    };
    match counter {
        Counter::Gp(i) if (i as usize) < gp => Some(i as usize),
        // Fixed counters do PEBS from fmt4 on (extended PEBS).
        Counter::Fixed(j) if pebs_format >= 4 && (j as usize) < MAX_FIXED_PEBS_EVENTS => {
            Some(base + j as usize)
        }
        _ => None,
    }
}

/// MSR numbers (Intel SDM Vol. 4; `msr-index.h`).
pub mod msr {
    /// IA32_PMC0 (`MSR_IA32_PERFCTR0`); PMCi = base + i.
    pub const IA32_PMC0: u32 = 0xc1;
    /// IA32_A_PMC0, the full-width alias (PERF_CAPABILITIES bit 13); A_PMCi = base + i.
    pub const IA32_A_PMC0: u32 = 0x4c1;
    /// IA32_PERFEVTSEL0; PERFEVTSELi = base + i.
    pub const IA32_PERFEVTSEL0: u32 = 0x186;
    /// IA32_FIXED_CTR0; FIXED_CTRj = base + j.
    pub const IA32_FIXED_CTR0: u32 = 0x309;
    /// IA32_PERF_CAPABILITIES.
    pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
    /// IA32_FIXED_CTR_CTRL.
    pub const IA32_FIXED_CTR_CTRL: u32 = 0x38d;
    /// IA32_PERF_GLOBAL_STATUS.
    pub const IA32_PERF_GLOBAL_STATUS: u32 = 0x38e;
    /// IA32_PERF_GLOBAL_CTRL.
    pub const IA32_PERF_GLOBAL_CTRL: u32 = 0x38f;
    /// IA32_PERF_GLOBAL_OVF_CTRL (IA32_PERF_GLOBAL_STATUS_RESET from v4): write 1 to clear.
    pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
    /// IA32_PEBS_ENABLE.
    pub const IA32_PEBS_ENABLE: u32 = 0x3f1;
    /// MSR_PEBS_DATA_CFG (adaptive PEBS).
    pub const MSR_PEBS_DATA_CFG: u32 = 0x3f2;
    /// MSR_PEBS_LD_LAT_THRESHOLD (load-latency threshold in core cycles).
    pub const MSR_PEBS_LD_LAT_THRESHOLD: u32 = 0x3f6;
    /// IA32_DS_AREA: linear address of the DS save area.
    pub const IA32_DS_AREA: u32 = 0x600;
    /// IA32_MISC_ENABLE.
    pub const IA32_MISC_ENABLE: u32 = 0x1a0;
    /// IA32_MISC_ENABLE bit 12: PEBS unavailable.
    pub const MISC_ENABLE_PEBS_UNAVAIL: u64 = 1 << 12;
}

/// IA32_PERFEVTSELx bits (`ARCH_PERFMON_EVENTSEL_*`).
pub mod evtsel {
    /// Event select, bits 7:0.
    pub const EVENT: u64 = 0xff;
    /// Unit mask, bits 15:8.
    pub const UMASK: u64 = 0xff00;
    /// Count in ring 3.
    pub const USR: u64 = 1 << 16;
    /// Count in ring 0.
    pub const OS: u64 = 1 << 17;
    /// Edge detect.
    pub const EDGE: u64 = 1 << 18;
    /// Pin control.
    pub const PC: u64 = 1 << 19;
    /// PMI on overflow (cleared for PEBS: the PMI comes from the DS threshold).
    pub const INT: u64 = 1 << 20;
    /// Any thread.
    pub const ANY: u64 = 1 << 21;
    /// Enable.
    pub const EN: u64 = 1 << 22;
    /// Invert counter mask.
    pub const INV: u64 = 1 << 23;
    /// Counter mask, bits 31:24.
    pub const CMASK: u64 = 0xff << 24;
    /// Ice Lake+: the record of this counter is adaptive (`ICL_EVENTSEL_ADAPTIVE`).
    pub const ADAPTIVE: u64 = 1 << 34;
}

/// IA32_FIXED_CTR_CTRL fields: 4 bits per fixed counter (`INTEL_FIXED_*`).
pub mod fixed_ctrl {
    /// Count in ring 0.
    pub const OS: u64 = 1 << 0;
    /// Count in ring 3.
    pub const USR: u64 = 1 << 1;
    /// Any thread.
    pub const ANY: u64 = 1 << 2;
    /// PMI on overflow.
    pub const PMI: u64 = 1 << 3;
    /// `bits` (a combination of the above) for fixed counter `j`.
    pub const fn bits(j: u32, bits: u64) -> u64 {
        (bits & 0xf) << (4 * j)
    }
    /// Ice Lake+: fixed counter `j`'s records are adaptive (`ICL_FIXED_0_ADAPTIVE`).
    pub const fn adaptive(j: u32) -> u64 {
        1 << (32 + 4 * j)
    }
}

/// IA32_PERF_GLOBAL_STATUS bits (`GLOBAL_STATUS_*`).
pub mod status {
    /// The DS buffer reached its PEBS/BTS interrupt threshold.
    pub const BUFFER_OVF: u64 = 1 << 62;
    /// Condition changed.
    pub const COND_CHG: u64 = 1 << 63;
}

/// IA32_PEBS_ENABLE bits.
pub mod pebs_enable {
    /// PEBS on GP counter `i`.
    pub const fn pmc(i: u32) -> u64 {
        1 << (i & 31)
    }
    /// Extended PEBS (fmt4+): PEBS on fixed counter `j`.
    pub const fn fixed(j: u32) -> u64 {
        1 << (32 + (j & 15))
    }
    /// Load latency on GP counter `i` (PMU version < 5: Nehalem .. Skylake).
    pub const fn load_latency(i: u32) -> u64 {
        1 << (32 + (i & 31))
    }
    /// Sandy/Ivy Bridge precise store (`PEBS_ST`).
    pub const PRECISE_STORE: u64 = 1 << 63;
}

/// IA32_PERF_CAPABILITIES bits (`union perf_capabilities`).
pub mod cap {
    /// LBR format, bits 5:0.
    pub const LBR_FORMAT: u64 = 0x3f;
    /// PEBS trap: the record's IP is the instruction after the eventing one.
    pub const PEBS_TRAP: u64 = 1 << 6;
    /// PEBS saves architectural registers.
    pub const PEBS_ARCH_REG: u64 = 1 << 7;
    /// Shift of the PEBS record format, bits 11:8.
    pub const PEBS_FORMAT_SHIFT: u32 = 8;
    /// Mask of the PEBS record format after shifting.
    pub const PEBS_FORMAT_MASK: u64 = 0xf;
    /// Freeze while SMM.
    pub const SMM_FREEZE: u64 = 1 << 12;
    /// Full-width counter writes through IA32_A_PMCx.
    pub const FULL_WIDTH_WRITE: u64 = 1 << 13;
    /// Adaptive PEBS groups beyond basic (PEBS baseline).
    pub const PEBS_BASELINE: u64 = 1 << 14;
    /// Perf metrics.
    pub const PERF_METRICS: u64 = 1 << 15;
    /// PEBS output to Intel PT available.
    pub const PEBS_OUTPUT_PT: u64 = 1 << 16;
    /// PEBS timing info (retire latency).
    pub const PEBS_TIMING_INFO: u64 = 1 << 17;
}

/// Model-specific register access: `rdmsr`/`wrmsr` on the current CPU in the kernel, a
/// model in the simulator.
pub trait PebsMsrs {
    /// Reads an MSR.
    fn rdmsr(&mut self, msr: u32) -> u64;
    /// Writes an MSR.
    fn wrmsr(&mut self, msr: u32, value: u64);
}

/// When the PMI fires (perfmon2's `intr_thres`, Linux's large PEBS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThresholdPolicy {
    /// After every record (`pebs_buffer_base + record_size`): what a session without a
    /// fixed period needs (the period may change per sample).
    Single,
    /// "Large PEBS": when the area is nearly full, leaving `reserve` records of room
    /// (one per PEBS counter that can still write before the PMI is taken).
    Large {
        /// Records of headroom below the absolute maximum.
        reserve: u64,
    },
}

/// Computes `pebs_interrupt_threshold` for an area at `base` holding `capacity` records
/// of `record_size` bytes (`pebs_update_threshold`). The result is always in
/// `base + record_size ..= base + capacity * record_size`.
pub fn threshold(base: u64, record_size: u64, capacity: u64, policy: ThresholdPolicy) -> u64 {
    let records = match policy {
        ThresholdPolicy::Single => 1,
        ThresholdPolicy::Large { reserve } => capacity.saturating_sub(reserve).max(1),
    };
    base.wrapping_add(records.min(capacity.max(1)).wrapping_mul(record_size))
}

/// How to program one PEBS counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PebsProgram {
    /// The counter (GP counters only for PEBS before fmt4).
    pub counter: Counter,
    /// PERFEVTSELx value (event, umask, USR/OS, cmask...) for a GP counter, or the
    /// IA32_FIXED_CTR_CTRL field bits (`fixed_ctrl::OS | USR`) for a fixed one; EN,
    /// INT and ADAPTIVE are managed here.
    pub event: u64,
    /// Initial raw counter value (`-period` masked to the counter width).
    pub start_value: u64,
    /// Linear address of the DS save area.
    pub ds_area: u64,
    /// PEBS record format (`PERF_CAPABILITIES[11:8]`).
    pub pebs_format: u32,
    /// Adaptive PEBS: MSR_PEBS_DATA_CFG (0 = basic group only); written from fmt4.
    pub data_cfg: u64,
    /// Load-latency threshold in cycles (0: not a load-latency event).
    pub ld_lat_threshold: u32,
    /// PMU version < 5 (load latency needs its IA32_PEBS_ENABLE bit).
    pub pmu_version_below_5: bool,
    /// Sandy/Ivy Bridge precise-store event.
    pub precise_store: bool,
    /// Counter writes through the full-width IA32_A_PMCx aliases.
    pub full_width: bool,
}

/// Why a program is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DsError {
    /// The counter cannot do PEBS with this format (fixed counters need fmt4+, indices
    /// beyond the architectural range).
    BadCounter,
}

/// The global-control bit of the programmed counter.
fn counter_bit(p: &PebsProgram) -> Result<u64, DsError> {
    if matches!(p.counter, Counter::Fixed(_)) && p.pebs_format < 4 {
        return Err(DsError::BadCounter);
    }
    let bit = p.counter.global_bit().ok_or(DsError::BadCounter)?;
    Ok(1 << bit)
}

/// The IA32_PEBS_ENABLE bits `p` owns: the counter's, its load-latency bit before PMU
/// v5, the precise-store bit.
pub fn enable_bits(p: &PebsProgram) -> u64 {
    let mut enable = match p.counter {
        Counter::Gp(i) => {
            let ll = p.ld_lat_threshold != 0 && p.pmu_version_below_5;
            pebs_enable::pmc(i) | if ll { pebs_enable::load_latency(i) } else { 0 }
        }
        Counter::Fixed(j) => pebs_enable::fixed(j),
    };
    if p.precise_store {
        enable |= pebs_enable::PRECISE_STORE;
    }
    enable
}

/// The counter's control value when counting: PERFEVTSELx with EN, without INT (the PMI
/// comes from the DS threshold), ADAPTIVE from fmt4; for a fixed counter its
/// IA32_FIXED_CTR_CTRL field (and adaptive bit), PMI cleared. Also what the ownership
/// checks of [`coexist`](super::coexist) expect to find.
pub fn counting_control(p: &PebsProgram) -> u64 {
    match p.counter {
        Counter::Gp(_) => {
            let sel = (p.event & !evtsel::INT & !evtsel::ADAPTIVE) | evtsel::EN;
            if p.pebs_format >= 4 {
                sel | evtsel::ADAPTIVE
            } else {
                sel
            }
        }
        Counter::Fixed(j) => fixed_ctrl::bits(j, p.event & !fixed_ctrl::PMI) | fixed_ctrl::adaptive(j),
    }
}

/// Turns the counter on (`on`) or off through its own control bits only, so perf's
/// counters on the same CPU, and IA32_PERF_GLOBAL_CTRL which perf rewrites on every PMU
/// enable, are not touched: PERFEVTSELx.EN for a GP counter, the counter's field of
/// IA32_FIXED_CTR_CTRL for a fixed one.
fn set_counting<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram, on: bool) {
    match p.counter {
        Counter::Gp(i) => {
            let sel = counting_control(p);
            m.wrmsr(msr::IA32_PERFEVTSEL0 + i, if on { sel } else { sel & !evtsel::EN });
        }
        Counter::Fixed(j) => {
            let old = m.rdmsr(msr::IA32_FIXED_CTR_CTRL);
            let clear = fixed_ctrl::bits(j, 0xf) | fixed_ctrl::adaptive(j);
            let new = if on { (old & !clear) | counting_control(p) } else { old & !clear };
            m.wrmsr(msr::IA32_FIXED_CTR_CTRL, new);
        }
    }
}

/// What [`program`] changed that [`stop`] gives back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// IA32_DS_AREA before: perf's per-CPU `debug_store` (perf writes it once, when it
    /// reserves the PMU, and never again), or 0.
    pub ds_area: u64,
    /// The counter's IA32_PERF_GLOBAL_CTRL bit was set before (perf enables every
    /// counter there and gates each by its own control bits).
    pub global_enabled: bool,
}

/// Programs PEBS on one counter, in the order the SDM and `intel_pmu_pebs_enable`
/// imply, touching only what this counter owns so it can run beside perf's counters on
/// the same CPU: the counter off in IA32_PERF_GLOBAL_CTRL → DS area (the old pointer is
/// returned) → data config / load-latency threshold → counter value → event select
/// (EN, no INT, ADAPTIVE on fmt4+) → its IA32_PEBS_ENABLE bits → its stale status bits
/// acknowledged → the counter on in IA32_PERF_GLOBAL_CTRL. The DS area itself (base,
/// index, maximum, threshold, reset values) must already be filled (the format's `init`
/// does it). Call [`claim`](super::coexist::claim) first: MSR_PEBS_DATA_CFG and
/// MSR_PEBS_LD_LAT_THRESHOLD are per CPU, not per counter.
pub fn program<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram) -> Result<Saved, DsError> {
    let bit = counter_bit(p)?;
    let ctrl = m.rdmsr(msr::IA32_PERF_GLOBAL_CTRL);
    m.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, ctrl & !bit);
    let saved = Saved { ds_area: m.rdmsr(msr::IA32_DS_AREA), global_enabled: ctrl & bit != 0 };
    m.wrmsr(msr::IA32_DS_AREA, p.ds_area);
    if p.pebs_format >= 4 {
        m.wrmsr(msr::MSR_PEBS_DATA_CFG, p.data_cfg);
    }
    if p.ld_lat_threshold != 0 {
        m.wrmsr(msr::MSR_PEBS_LD_LAT_THRESHOLD, u64::from(p.ld_lat_threshold));
    }
    match p.counter {
        Counter::Gp(i) => {
            let ctr = if p.full_width { msr::IA32_A_PMC0 } else { msr::IA32_PMC0 };
            m.wrmsr(ctr + i, p.start_value);
        }
        Counter::Fixed(j) => m.wrmsr(msr::IA32_FIXED_CTR0 + j, p.start_value),
    }
    set_counting(m, p, true);
    let pebs = m.rdmsr(msr::IA32_PEBS_ENABLE);
    m.wrmsr(msr::IA32_PEBS_ENABLE, pebs | enable_bits(p));
    m.wrmsr(msr::IA32_PERF_GLOBAL_OVF_CTRL, bit | status::BUFFER_OVF);
    let ctrl = m.rdmsr(msr::IA32_PERF_GLOBAL_CTRL);
    m.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, ctrl | bit);
    Ok(saved)
}

/// In the threshold PMI: reads IA32_PERF_GLOBAL_STATUS and acknowledges this counter's
/// bits in it (BUFFER_OVF and the counter's overflow bit) and no other, so perf's PMI
/// handler, which runs after hrperf's, still sees its own. Returns the bits
/// acknowledged (0: the PMI was not this counter's).
pub fn ack_pmi<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram) -> Result<u64, DsError> {
    let bit = counter_bit(p)?;
    let st = m.rdmsr(msr::IA32_PERF_GLOBAL_STATUS) & (bit | status::BUFFER_OVF);
    if st != 0 {
        m.wrmsr(msr::IA32_PERF_GLOBAL_OVF_CTRL, st);
    }
    Ok(st)
}

/// Masks the counter after the threshold PMI (the format returned `CTRL_MASK`): it
/// stops counting, so no record is written until [`restart`].
pub fn mask<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram) -> Result<(), DsError> {
    counter_bit(p)?;
    set_counting(m, p, false);
    Ok(())
}

/// After the format's `restart` (which reset `pebs_index`): acknowledges any status
/// bit of this counter left over and turns the counter back on. Returns the status
/// bits acknowledged.
pub fn restart<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram) -> Result<u64, DsError> {
    let st = ack_pmi(m, p)?;
    set_counting(m, p, true);
    Ok(st)
}

/// Whether the counter's control bits are still the ones [`program`] set (counting or
/// masked): perf has not scheduled an event of its own onto it.
fn counter_is_ours<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram) -> bool {
    let want = counting_control(p);
    match p.counter {
        Counter::Gp(i) => {
            let sel = m.rdmsr(msr::IA32_PERFEVTSEL0 + i);
            sel == want || sel == want & !evtsel::EN
        }
        Counter::Fixed(j) => {
            let field = m.rdmsr(msr::IA32_FIXED_CTR_CTRL) & (fixed_ctrl::bits(j, 0xf) | fixed_ctrl::adaptive(j));
            field == want || field == 0
        }
    }
}

/// Stops PEBS on the counter and gives back what [`program`] took, as far as it is still
/// ours (after a conflict perf may own the counter or the DS area again; those are left
/// alone): counter off and its event select (or fixed field) cleared, its
/// IA32_PEBS_ENABLE bits cleared, its status bits acknowledged, IA32_DS_AREA restored
/// (perf's pointer, so the CPU never writes into a freed buffer and perf's own PEBS
/// works again), its global-control bit as it was.
pub fn stop<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram, saved: &Saved) -> Result<(), DsError> {
    let bit = counter_bit(p)?;
    let ours = counter_is_ours(m, p);
    if ours {
        let ctrl = m.rdmsr(msr::IA32_PERF_GLOBAL_CTRL);
        m.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, ctrl & !bit);
        match p.counter {
            Counter::Gp(i) => m.wrmsr(msr::IA32_PERFEVTSEL0 + i, 0),
            Counter::Fixed(_) => set_counting(m, p, false),
        }
    }
    let pebs = m.rdmsr(msr::IA32_PEBS_ENABLE);
    m.wrmsr(msr::IA32_PEBS_ENABLE, pebs & !enable_bits(p));
    ack_pmi(m, p)?;
    if m.rdmsr(msr::IA32_DS_AREA) == p.ds_area {
        m.wrmsr(msr::IA32_DS_AREA, saved.ds_area);
    }
    if ours && saved.global_enabled {
        let ctrl = m.rdmsr(msr::IA32_PERF_GLOBAL_CTRL);
        m.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, ctrl | bit);
    }
    Ok(())
}

/// Number of MSRs [`SimMsrs`] can hold.
pub const SIM_MSRS: usize = 32;

/// A simulated MSR file: the simulator's [`PebsMsrs`]. Unwritten MSRs read as 0 (or
/// as set with [`set`](Self::set)); IA32_PERF_GLOBAL_OVF_CTRL clears the written bits
/// of IA32_PERF_GLOBAL_STATUS, as the hardware does. Writes beyond [`SIM_MSRS`]
/// distinct MSRs are counted in `dropped` (never silently lost).
#[derive(Clone, Copy, Debug)]
pub struct SimMsrs {
    regs: [(u32, u64); SIM_MSRS],
    len: usize,
    /// Number of `wrmsr` calls.
    pub writes: u64,
    /// Writes that found no free slot.
    pub dropped: u64,
}

impl Default for SimMsrs {
    fn default() -> Self {
        SimMsrs { regs: [(0, 0); SIM_MSRS], len: 0, writes: 0, dropped: 0 }
    }
}

impl SimMsrs {
    /// An empty MSR file.
    pub fn new() -> SimMsrs {
        SimMsrs::default()
    }

    /// The current value of `msr`.
    pub fn get(&self, msr: u32) -> u64 {
        self.regs.iter().take(self.len).find(|r| r.0 == msr).map_or(0, |r| r.1)
    }

    /// Sets `msr` as the hardware would (e.g. PERF_GLOBAL_STATUS bits).
    pub fn set(&mut self, msr: u32, value: u64) {
        let len = self.len;
        if let Some(r) = self.regs.iter_mut().take(len).find(|r| r.0 == msr) {
            r.1 = value;
        } else if let Some(r) = self.regs.get_mut(len) {
            *r = (msr, value);
            self.len += 1;
        } else {
            self.dropped += 1;
        }
    }
}

impl PebsMsrs for SimMsrs {
    fn rdmsr(&mut self, msr: u32) -> u64 {
        self.get(msr)
    }

    fn wrmsr(&mut self, m: u32, value: u64) {
        self.writes += 1;
        if m == msr::IA32_PERF_GLOBAL_OVF_CTRL {
            let st = self.get(msr::IA32_PERF_GLOBAL_STATUS);
            self.set(msr::IA32_PERF_GLOBAL_STATUS, st & !value);
        } else {
            self.set(m, value);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    #[derive(Default)]
    struct Log(Vec<(char, u32, u64)>, SimMsrs);
    impl PebsMsrs for Log {
        fn rdmsr(&mut self, m: u32) -> u64 {
            let v = self.1.rdmsr(m);
            self.0.push(('r', m, v));
            v
        }
        fn wrmsr(&mut self, m: u32, v: u64) {
            self.0.push(('w', m, v));
            self.1.wrmsr(m, v);
        }
    }

    fn prog(counter: Counter, fmt: u32) -> PebsProgram {
        PebsProgram {
            counter,
            event: 0x01cd | evtsel::USR | evtsel::OS | evtsel::INT,
            start_value: (1u64 << 48) - 10_000,
            ds_area: 0xffff_c900_0010_0140,
            pebs_format: fmt,
            data_cfg: 0x1f00_000b,
            ld_lat_threshold: 30,
            pmu_version_below_5: fmt < 4,
            precise_store: false,
            full_width: true,
        }
    }

    #[test]
    fn layout_and_slots() {
        assert_eq!(DS_SIZE, 448);
        assert_eq!(core::mem::offset_of!(DsArea, pebs_buffer_base), ds_off::PEBS_BUFFER_BASE);
        assert_eq!(core::mem::offset_of!(DsArea, pebs_index), ds_off::PEBS_INDEX);
        assert_eq!(core::mem::offset_of!(DsArea, pebs_absolute_maximum), ds_off::PEBS_ABS_MAX);
        assert_eq!(core::mem::offset_of!(DsArea, pebs_interrupt_threshold), ds_off::PEBS_THRESHOLD);
        assert_eq!(core::mem::offset_of!(DsArea, pebs_event_reset), ds_off::PEBS_RESET);
        assert_eq!(reset_slot(3, Counter::Gp(3)), Some(3));
        assert_eq!(reset_slot(4, Counter::Gp(8)), None);
        assert_eq!(reset_slot(3, Counter::Fixed(0)), None);
        assert_eq!(reset_slot(4, Counter::Fixed(1)), Some(9));
        assert_eq!(reset_slot(5, Counter::Gp(8)), Some(8));
        assert_eq!(reset_slot(5, Counter::Fixed(1)), Some(33));
        assert_eq!(reset_slot(5, Counter::Fixed(16)), None);
        assert_eq!(Counter::Fixed(2).global_bit(), Some(34));
    }

    #[test]
    fn threshold_sizing() {
        // Single: PMI after the first record.
        assert_eq!(threshold(0x1000, 200, 327, ThresholdPolicy::Single), 0x1000 + 200);
        // Large: leave room for `reserve` records below the absolute maximum.
        assert_eq!(threshold(0x1000, 200, 327, ThresholdPolicy::Large { reserve: 8 }), 0x1000 + 319 * 200);
        // Never below one record, never above capacity.
        assert_eq!(threshold(0, 32, 4, ThresholdPolicy::Large { reserve: 9 }), 32);
        assert_eq!(threshold(0, 32, 4, ThresholdPolicy::Large { reserve: 0 }), 128);
    }

    /// perf's state on the CPU before hrperf takes a counter: its debug_store in
    /// IA32_DS_AREA, every counter enabled in IA32_PERF_GLOBAL_CTRL (`intel_ctrl`), a
    /// cycles event on GP0 and the NMI watchdog on fixed counter 1.
    fn perf_owned() -> SimMsrs {
        let mut m = SimMsrs::new();
        m.set(msr::IA32_DS_AREA, 0xfffffe00_00001000);
        m.set(msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
        m.set(msr::IA32_PERFEVTSEL0, 0x53_003c);
        m.set(msr::IA32_FIXED_CTR_CTRL, 0xb0);
        m
    }

    #[test]
    fn programming_sequence_adaptive_gp() {
        let mut m = Log(Vec::new(), perf_owned());
        let p = prog(Counter::Gp(1), 4);
        let saved = program(&mut m, &p).unwrap();
        assert_eq!(saved, Saved { ds_area: 0xfffffe00_00001000, global_enabled: true });
        let w: Vec<(u32, u64)> = m.0.iter().filter(|e| e.0 == 'w').map(|e| (e.1, e.2)).collect();
        assert_eq!(
            w,
            [
                (msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000d),
                (msr::IA32_DS_AREA, p.ds_area),
                (msr::MSR_PEBS_DATA_CFG, 0x1f00_000b),
                (msr::MSR_PEBS_LD_LAT_THRESHOLD, 30),
                (msr::IA32_A_PMC0 + 1, (1 << 48) - 10_000),
                (msr::IA32_PERFEVTSEL0 + 1, 0x01cd | evtsel::USR | evtsel::OS | evtsel::EN | evtsel::ADAPTIVE),
                (msr::IA32_PEBS_ENABLE, 0b10),
                (msr::IA32_PERF_GLOBAL_OVF_CTRL, 0b10 | status::BUFFER_OVF),
                (msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f),
            ]
        );
        // perf's counters were never touched.
        assert_eq!(m.1.get(msr::IA32_PERFEVTSEL0), 0x53_003c);
        assert_eq!(m.1.get(msr::IA32_FIXED_CTR_CTRL), 0xb0);
        // The threshold PMI: only this counter's bits are acknowledged; perf's GP0
        // overflow stays for perf's handler.
        m.1.set(msr::IA32_PERF_GLOBAL_STATUS, status::BUFFER_OVF | 0b11);
        assert_eq!(ack_pmi(&mut m, &p).unwrap(), status::BUFFER_OVF | 0b10);
        assert_eq!(m.1.get(msr::IA32_PERF_GLOBAL_STATUS), 0b01);
        mask(&mut m, &p).unwrap();
        assert_eq!(m.1.get(msr::IA32_PERFEVTSEL0 + 1) & evtsel::EN, 0);
        // perf's enable_all rewrites IA32_PERF_GLOBAL_CTRL: a masked counter stays off.
        m.1.set(msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000f);
        assert_eq!(m.1.get(msr::IA32_PERFEVTSEL0 + 1) & evtsel::EN, 0);
        assert_eq!(restart(&mut m, &p).unwrap(), 0, "nothing left to acknowledge");
        assert_ne!(m.1.get(msr::IA32_PERFEVTSEL0 + 1) & evtsel::EN, 0);
        m.1.set(msr::IA32_PERF_GLOBAL_STATUS, status::BUFFER_OVF | 0b01);
        stop(&mut m, &p, &saved).unwrap();
        assert_eq!(m.1.get(msr::IA32_DS_AREA), 0xfffffe00_00001000, "perf's DS area is back");
        assert_eq!(m.1.get(msr::IA32_PEBS_ENABLE), 0);
        assert_eq!(m.1.get(msr::IA32_PERFEVTSEL0 + 1), 0);
        assert_eq!(m.1.get(msr::IA32_PERF_GLOBAL_CTRL), 0x7_0000_000f);
        assert_eq!(m.1.get(msr::IA32_PERF_GLOBAL_STATUS), 0b01, "perf's status bit kept");
        assert_eq!(m.1.get(msr::IA32_PERFEVTSEL0), 0x53_003c);
    }

    #[test]
    fn legacy_load_latency_and_fixed() {
        let mut m = SimMsrs::new();
        let mut p = prog(Counter::Gp(3), 1);
        p.full_width = false;
        let saved = program(&mut m, &p).unwrap();
        assert_eq!(saved, Saved::default());
        assert_eq!(m.get(msr::IA32_PEBS_ENABLE), 1 << 3 | 1 << 35);
        assert_eq!(enable_bits(&p), 1 << 3 | 1 << 35);
        assert_eq!(m.get(msr::MSR_PEBS_DATA_CFG), 0, "no data cfg before fmt4");
        assert_eq!(m.get(msr::IA32_PMC0 + 3), (1 << 48) - 10_000);
        assert_eq!(m.get(msr::IA32_PERFEVTSEL0 + 3) & evtsel::INT, 0);
        stop(&mut m, &p, &saved).unwrap();
        assert_eq!(m.get(msr::IA32_PERF_GLOBAL_CTRL), 0, "was not enabled before");
        assert_eq!(program(&mut m, &prog(Counter::Fixed(0), 3)), Err(DsError::BadCounter));
        let mut m = SimMsrs::new();
        m.set(msr::IA32_FIXED_CTR_CTRL, 0xf0);
        let mut p = prog(Counter::Fixed(0), 4);
        p.event = fixed_ctrl::OS | fixed_ctrl::USR | fixed_ctrl::PMI;
        let saved = program(&mut m, &p).unwrap();
        assert_eq!(m.get(msr::IA32_FIXED_CTR_CTRL), 0xf0 | 0x3 | 1 << 32);
        assert_eq!(m.get(msr::IA32_PEBS_ENABLE), 1 << 32);
        assert_eq!(m.get(msr::IA32_PERF_GLOBAL_CTRL), 1 << 32);
        mask(&mut m, &p).unwrap();
        assert_eq!(m.get(msr::IA32_FIXED_CTR_CTRL), 0xf0);
        restart(&mut m, &p).unwrap();
        assert_eq!(m.get(msr::IA32_FIXED_CTR_CTRL), 0xf0 | 0x3 | 1 << 32);
        stop(&mut m, &p, &saved).unwrap();
        assert_eq!(m.get(msr::IA32_FIXED_CTR_CTRL), 0xf0);
    }
}
