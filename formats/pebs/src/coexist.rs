//! Taking a CPU's PMU for zero-copy PEBS beside perf, in the kernel: whether PEBS is
//! usable at all ([`verdict`], from what the kernel reads about the CPU), whether a CPU
//! can be taken now ([`claim`]), whether it is still ours ([`check_owned`]), and the
//! PEBS event select of a perf-style event ([`event_select`]).
//!
//! Linux's perf owns the PMU: it writes IA32_DS_AREA once per CPU when it reserves the
//! hardware, enables every counter in IA32_PERF_GLOBAL_CTRL and gates each counter by
//! its own PERFEVTSELx.EN, and touches IA32_PEBS_ENABLE only while it has PEBS events.
//! hrperf therefore
//!
//! - refuses a CPU where IA32_PEBS_ENABLE is not zero (perf has PEBS events there:
//!   [`Refusal::PebsInUse`], `EBUSY`);
//! - takes the highest general-purpose counter whose PERFEVTSELx.EN is clear (perf
//!   assigns counters from 0 upwards), or refuses ([`Refusal::NoFreeCounter`], `EBUSY`);
//! - programs only that counter's bits and gives perf's DS area back at the end
//!   (`ds::program` / `ds::stop`);
//! - checks at every threshold interrupt and restart that the counter, the PEBS enable
//!   bits and the DS area are still as programmed: perf does not know the counter is
//!   taken and may schedule an event onto it; then PEBS stops on that CPU and the
//!   conflict is reported ([`Refusal::Conflict`]).
//!
//! Nothing here has run on a PEBS-capable PMU: it is verified against the simulated MSR
//! file (`ds::SimMsrs`), in userspace tests and in the kernel's simulated PMU.

use hrperf_abi::ioctl::pebs_state;

use super::ds::{self, evtsel, msr, PebsMsrs, PebsProgram, MAX_PEBS_EVENTS, MAX_PEBS_EVENTS_FMT4};
use super::layout::{self, CpuInfo, DetectError, PebsFormat};

/// What the kernel reads about the CPU and its PMU (`boot_cpu_data`, CPUID, two MSRs
/// read with `rdmsrl_safe`, whether perf registered a hardware PMU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PmuFacts {
    /// CPUID leaf 1 and the vendor, as PEBS detection needs them.
    pub cpu: CpuInfo,
    /// perf registered a hardware PMU (a hardware cycles counter can be created).
    pub hw_pmu: bool,
    /// CPUID leaf 0xA: architectural performance monitoring version (0: none).
    pub pmu_version: u32,
    /// CPUID leaf 0xA: general-purpose counters per logical CPU.
    pub gp_counters: u32,
    /// CPUID leaf 0xA: width of the general-purpose counters in bits.
    pub gp_width: u32,
    /// A hybrid CPU (`X86_FEATURE_HYBRID_CPU`).
    pub hybrid: bool,
    /// Kernel page-table isolation is on (`X86_FEATURE_PTI`).
    pub pti: bool,
    /// IA32_MISC_ENABLE could be read (its PEBS-unavailable bit is in `cpu`).
    pub misc_enable_read: bool,
    /// IA32_PERF_CAPABILITIES, if PDCM is set and it could be read.
    pub perf_capabilities: Option<u64>,
    /// IA32_PERF_CAPABILITIES bit 13: counters are written through IA32_A_PMCx.
    pub full_width: bool,
}

/// What the kernel may use, when PEBS is usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelPebs {
    /// The record format word (layout, data-source table...).
    pub format: PebsFormat,
    /// PMU version (load latency needs its enable bit before v5).
    pub pmu_version: u32,
    /// General-purpose counters that can do PEBS in this format.
    pub pebs_counters: u32,
    /// Counter width in bits.
    pub counter_width: u32,
    /// Counters are written through IA32_A_PMCx.
    pub full_width: bool,
}

/// Why PEBS cannot be used, now or on this machine (each is one [`pebs_state`] code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No hardware PMU.
    NoPmu,
    /// From PEBS detection (vendor, DS, DTES64, IA32_MISC_ENABLE, record format).
    Detect(DetectError),
    /// No architectural performance monitoring.
    NoArchPerfmon,
    /// A hybrid CPU.
    Hybrid,
    /// KPTI is on.
    Kpti,
    /// IA32_MISC_ENABLE or IA32_PERF_CAPABILITIES could not be read.
    MsrUnreadable,
    /// IA32_PEBS_ENABLE was not zero (the value found).
    PebsInUse(u64),
    /// Every PEBS-capable counter is enabled (their PERFEVTSELx.EN bits).
    NoFreeCounter(u64),
    /// The counter, PEBS enable bits or DS area changed under us (the value found).
    Conflict(u64),
    /// The event cannot be a hardware PEBS event.
    BadEvent,
}

impl Refusal {
    /// The [`pebs_state`] code.
    pub const fn state(self) -> u32 {
        match self {
            Refusal::NoPmu => pebs_state::NO_PMU,
            Refusal::Detect(DetectError::NotIntel) => pebs_state::NOT_INTEL,
            Refusal::Detect(DetectError::NoDebugStore) => pebs_state::NO_DEBUG_STORE,
            Refusal::Detect(DetectError::NoDtes64) => pebs_state::NO_DTES64,
            Refusal::Detect(DetectError::PebsUnavailable) => pebs_state::PEBS_UNAVAILABLE,
            Refusal::Detect(_) => pebs_state::UNKNOWN_FORMAT,
            Refusal::NoArchPerfmon => pebs_state::NO_ARCH_PERFMON,
            Refusal::Hybrid => pebs_state::HYBRID,
            Refusal::Kpti => pebs_state::KPTI,
            Refusal::MsrUnreadable => pebs_state::MSR_UNREADABLE,
            Refusal::PebsInUse(_) => pebs_state::PEBS_IN_USE,
            Refusal::NoFreeCounter(_) => pebs_state::NO_FREE_COUNTER,
            Refusal::Conflict(_) => pebs_state::CONFLICT,
            Refusal::BadEvent => pebs_state::BAD_EVENT,
        }
    }

    /// The MSR value behind the refusal, 0 if none.
    pub const fn value(self) -> u64 {
        match self {
            Refusal::PebsInUse(v) | Refusal::NoFreeCounter(v) | Refusal::Conflict(v) => v,
            _ => 0,
        }
    }

    /// The positive errno a session refused for this gets.
    pub const fn errno(self) -> i32 {
        pebs_state::errno(self.state())
    }
}

/// Decides from `f` whether the kernel can use the CPU's PEBS, in the order a user
/// should hear the reasons: no PMU at all first (every virtual machine without a vPMU),
/// then what `intel_ds_init` checks, then what hrperf's kernel path needs.
pub fn verdict(f: &PmuFacts) -> Result<KernelPebs, Refusal> {
    if !f.hw_pmu {
        return Err(Refusal::NoPmu);
    }
    if f.cpu.intel && f.cpu.ds && !f.misc_enable_read {
        return Err(Refusal::MsrUnreadable);
    }
    if f.cpu.pdcm && f.perf_capabilities.is_none() && f.cpu.intel && f.cpu.ds {
        return Err(Refusal::MsrUnreadable);
    }
    let format = layout::detect(&f.cpu, f.perf_capabilities).map_err(Refusal::Detect)?;
    if f.pmu_version == 0 || f.gp_counters == 0 {
        return Err(Refusal::NoArchPerfmon);
    }
    if f.hybrid {
        return Err(Refusal::Hybrid);
    }
    if f.pti {
        return Err(Refusal::Kpti);
    }
    let limit = if format.format() < 5 { MAX_PEBS_EVENTS_FMT4 } else { MAX_PEBS_EVENTS } as u32;
    Ok(KernelPebs {
        format,
        pmu_version: f.pmu_version,
        pebs_counters: f.gp_counters.min(limit),
        counter_width: f.gp_width.clamp(32, 64),
        full_width: f.full_width,
    })
}

/// Takes a general-purpose counter of this CPU for PEBS, if perf leaves one: refuses
/// when perf has PEBS events here (IA32_PEBS_ENABLE ≠ 0), else returns the highest of
/// the first `pebs_counters` counters whose PERFEVTSELx.EN is clear.
pub fn claim<M: PebsMsrs + ?Sized>(m: &mut M, pebs_counters: u32) -> Result<u32, Refusal> {
    let pebs = m.rdmsr(msr::IA32_PEBS_ENABLE);
    if pebs != 0 {
        return Err(Refusal::PebsInUse(pebs));
    }
    let n = pebs_counters.min(MAX_PEBS_EVENTS as u32);
    let mut in_use = 0u64;
    for i in (0..n).rev() {
        if m.rdmsr(msr::IA32_PERFEVTSEL0 + i) & evtsel::EN == 0 {
            return Ok(i);
        }
        in_use |= 1 << i;
    }
    Err(Refusal::NoFreeCounter(in_use))
}

/// Checks that general-purpose counter `i`, taken by [`claim`] at session creation, can
/// still be programmed (at START, which may come much later or after a pause): perf has
/// no PEBS events here and has not enabled an event on it meanwhile.
pub fn check_free<M: PebsMsrs + ?Sized>(m: &mut M, i: u32) -> Result<(), Refusal> {
    let pebs = m.rdmsr(msr::IA32_PEBS_ENABLE);
    if pebs != 0 {
        return Err(Refusal::PebsInUse(pebs));
    }
    if i >= MAX_PEBS_EVENTS as u32 || m.rdmsr(msr::IA32_PERFEVTSEL0 + i) & evtsel::EN != 0 {
        return Err(Refusal::NoFreeCounter(1u64 << (i & 63)));
    }
    Ok(())
}

/// Checks that what [`ds::program`] set for `p` is still there: the counter's event
/// select (counting, or masked when `masked`), IA32_PEBS_ENABLE holding exactly `p`'s
/// bits, IA32_DS_AREA pointing at `p`'s DS area. A difference means perf scheduled an
/// event onto the counter, started PEBS, or re-reserved the PMU.
pub fn check_owned<M: PebsMsrs + ?Sized>(m: &mut M, p: &PebsProgram, masked: bool) -> Result<(), Refusal> {
    let expect = ds::counting_control(p);
    if let ds::Counter::Gp(i) = p.counter {
        let sel = m.rdmsr(msr::IA32_PERFEVTSEL0 + i);
        let want = if masked { expect & !evtsel::EN } else { expect };
        if sel != want {
            return Err(Refusal::Conflict(sel));
        }
    }
    let pebs = m.rdmsr(msr::IA32_PEBS_ENABLE);
    if pebs != ds::enable_bits(p) {
        return Err(Refusal::Conflict(pebs));
    }
    let area = m.rdmsr(msr::IA32_DS_AREA);
    if area != p.ds_area {
        return Err(Refusal::Conflict(area));
    }
    Ok(())
}

/// MEM_TRANS_RETIRED.LOAD_LATENCY (event 0xcd, umask 0x01): the load-latency event, the
/// only one MSR_PEBS_LD_LAT_THRESHOLD (and, before PMU v5, the load-latency enable bit
/// of IA32_PEBS_ENABLE) applies to, as perf's `PERF_X86_EVENT_PEBS_LDLAT` events.
pub const LOAD_LATENCY_EVENT: u64 = 0x01cd;

/// The load-latency threshold to program for event select `sel`: `ld_lat` for the
/// load-latency event, 0 (none) for any other.
pub const fn load_latency_for(sel: u64, ld_lat: u32) -> u32 {
    if sel & (evtsel::EVENT | evtsel::UMASK) == LOAD_LATENCY_EVENT {
        ld_lat
    } else {
        0
    }
}

/// PERFEVTSELx bits a raw event may set (`X86_RAW_EVENT_MASK` on Intel): event, unit
/// mask, edge, invert, counter mask.
pub const RAW_EVENT_MASK: u64 = evtsel::EVENT | evtsel::UMASK | evtsel::EDGE | evtsel::INV | evtsel::CMASK;

/// The event select of a PEBS event: a raw perf config (`rNNNN`, or the encoding perf
/// maps a generic hardware event to) limited to [`RAW_EVENT_MASK`], with the privilege
/// levels to count. `None` for an empty event or no privilege level.
pub const fn event_select(config: u64, user: bool, kernel: bool) -> Option<u64> {
    let sel = config & RAW_EVENT_MASK;
    if sel & evtsel::EVENT == 0 || !(user || kernel) {
        return None;
    }
    Some(sel | if user { evtsel::USR } else { 0 } | if kernel { evtsel::OS } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasrc::DseTable;
    use crate::ds::{status, Counter, SimMsrs};
    use crate::layout::Layout;

    fn skylake() -> PmuFacts {
        PmuFacts {
            cpu: CpuInfo { intel: true, family: 6, model: 0x5e, ds: true, dtes64: true, pdcm: true, ..CpuInfo::default() },
            hw_pmu: true,
            pmu_version: 4,
            gp_counters: 4,
            gp_width: 48,
            misc_enable_read: true,
            perf_capabilities: Some(0x33c5),
            full_width: true,
            ..PmuFacts::default()
        }
    }

    #[test]
    fn verdict_skylake_and_every_refusal() {
        let v = verdict(&skylake()).unwrap();
        assert_eq!(v.format.layout(), Some(Layout::Skylake));
        assert_eq!(v.format.dse_table(), DseTable::Skylake);
        assert_eq!((v.pebs_counters, v.counter_width, v.pmu_version, v.full_width), (4, 48, 4, true));
        // What the QEMU guest and most VMs report: perf has no hardware PMU.
        assert_eq!(verdict(&PmuFacts::default()), Err(Refusal::NoPmu));
        type Case = (fn(&mut PmuFacts), Refusal, u32);
        let cases: [Case; 9] = [
            (|f| f.hw_pmu = false, Refusal::NoPmu, pebs_state::NO_PMU),
            (|f| f.cpu.intel = false, Refusal::Detect(DetectError::NotIntel), pebs_state::NOT_INTEL),
            (|f| f.cpu.ds = false, Refusal::Detect(DetectError::NoDebugStore), pebs_state::NO_DEBUG_STORE),
            (|f| f.cpu.dtes64 = false, Refusal::Detect(DetectError::NoDtes64), pebs_state::NO_DTES64),
            (|f| f.cpu.pebs_unavailable = true, Refusal::Detect(DetectError::PebsUnavailable), pebs_state::PEBS_UNAVAILABLE),
            (|f| f.perf_capabilities = None, Refusal::MsrUnreadable, pebs_state::MSR_UNREADABLE),
            (|f| f.pmu_version = 0, Refusal::NoArchPerfmon, pebs_state::NO_ARCH_PERFMON),
            (|f| f.hybrid = true, Refusal::Hybrid, pebs_state::HYBRID),
            (|f| f.pti = true, Refusal::Kpti, pebs_state::KPTI),
        ];
        for (change, refusal, state) in cases {
            let mut f = skylake();
            change(&mut f);
            assert_eq!(verdict(&f), Err(refusal));
            assert_eq!(refusal.state(), state);
        }
        assert_eq!(Refusal::Kpti.errno(), hrperf_abi::errno::EOPNOTSUPP);
        assert_eq!(Refusal::NoPmu.errno(), hrperf_abi::errno::ENODEV);
        assert_eq!(Refusal::PebsInUse(1).errno(), hrperf_abi::errno::EBUSY);
        // A future record format: refused by name, not guessed.
        let mut f = skylake();
        f.perf_capabilities = Some(0x7 << 8);
        assert_eq!(verdict(&f), Err(Refusal::Detect(DetectError::UnknownFormat(7))));
        assert_eq!(Refusal::Detect(DetectError::UnknownFormat(7)).state(), pebs_state::UNKNOWN_FORMAT);
        // Sapphire Rapids (fmt5): up to 32 PEBS counters, here 8.
        let mut f = skylake();
        f.cpu.model = 0x8f;
        f.gp_counters = 8;
        f.perf_capabilities = Some(0x5 << 8 | 1 << 14);
        let v = verdict(&f).unwrap();
        assert_eq!((v.format.format(), v.pebs_counters), (5, 8));
        assert!(v.format.has(PebsFormat::BASELINE));
    }

    #[test]
    fn claim_takes_the_highest_free_counter_and_refuses_perf_pebs() {
        let mut m = SimMsrs::new();
        assert_eq!(claim(&mut m, 4), Ok(3));
        m.set(msr::IA32_PERFEVTSEL0 + 3, evtsel::EN | 0x3c);
        m.set(msr::IA32_PERFEVTSEL0, evtsel::EN | 0xc0);
        assert_eq!(claim(&mut m, 4), Ok(2));
        m.set(msr::IA32_PERFEVTSEL0 + 2, evtsel::EN | 0x2e);
        m.set(msr::IA32_PERFEVTSEL0 + 1, evtsel::EN | 0xc4);
        assert_eq!(claim(&mut m, 4), Err(Refusal::NoFreeCounter(0b1111)));
        let mut m = SimMsrs::new();
        m.set(msr::IA32_PEBS_ENABLE, 1);
        assert_eq!(claim(&mut m, 4), Err(Refusal::PebsInUse(1)));
        assert_eq!(Refusal::PebsInUse(1).value(), 1);
        // START re-checks the counter CREATE took.
        assert_eq!(check_free(&mut m, 3), Err(Refusal::PebsInUse(1)));
        m.set(msr::IA32_PEBS_ENABLE, 0);
        assert_eq!(check_free(&mut m, 3), Ok(()));
        m.set(msr::IA32_PERFEVTSEL0 + 3, evtsel::EN | 0x3c);
        assert_eq!(check_free(&mut m, 3), Err(Refusal::NoFreeCounter(1 << 3)));
    }

    #[test]
    fn ownership_checks_see_what_perf_changed() {
        let mut m = SimMsrs::new();
        m.set(msr::IA32_DS_AREA, 0xfffffe00_00001000);
        let i = claim(&mut m, 4).unwrap();
        let p = PebsProgram {
            counter: Counter::Gp(i),
            event: event_select(0x01cd, true, true).unwrap(),
            start_value: (1 << 48) - 1000,
            ds_area: 0xffffc900_00100140,
            pebs_format: 4,
            data_cfg: 1,
            ld_lat_threshold: 3,
            pmu_version_below_5: true,
            precise_store: false,
            full_width: true,
        };
        let saved = ds::program(&mut m, &p).unwrap();
        assert_eq!(check_owned(&mut m, &p, false), Ok(()));
        assert_eq!(check_owned(&mut m, &p, true), Err(Refusal::Conflict(ds::counting_control(&p))));
        ds::mask(&mut m, &p).unwrap();
        assert_eq!(check_owned(&mut m, &p, true), Ok(()));
        ds::restart(&mut m, &p).unwrap();
        // perf schedules an event onto the counter (INT set, no ADAPTIVE).
        let perf_sel = evtsel::EN | evtsel::INT | evtsel::USR | evtsel::OS | 0xc0;
        m.set(msr::IA32_PERFEVTSEL0 + i, perf_sel);
        assert_eq!(check_owned(&mut m, &p, false), Err(Refusal::Conflict(perf_sel)));
        m.set(msr::IA32_PERFEVTSEL0 + i, ds::counting_control(&p));
        // perf starts a PEBS event of its own on GP0.
        m.set(msr::IA32_PEBS_ENABLE, ds::enable_bits(&p) | 1);
        assert_eq!(check_owned(&mut m, &p, false), Err(Refusal::Conflict(ds::enable_bits(&p) | 1)));
        m.set(msr::IA32_PEBS_ENABLE, ds::enable_bits(&p));
        // perf released and re-reserved the PMU: its DS area is back.
        m.set(msr::IA32_DS_AREA, 0xfffffe00_00002000);
        assert_eq!(check_owned(&mut m, &p, false), Err(Refusal::Conflict(0xfffffe00_00002000)));
        m.set(msr::IA32_DS_AREA, p.ds_area);
        m.set(msr::IA32_PERF_GLOBAL_STATUS, status::BUFFER_OVF);
        ds::stop(&mut m, &p, &saved).unwrap();
        assert_eq!(m.get(msr::IA32_DS_AREA), 0xfffffe00_00001000);
        assert_eq!(claim(&mut m, 4), Ok(3), "the counter is free again");
    }

    #[test]
    fn stop_after_a_conflict_leaves_perfs_counter_and_ds_area_alone() {
        let mut m = SimMsrs::new();
        m.set(msr::IA32_DS_AREA, 0xfffffe00_00001000);
        let p = PebsProgram {
            counter: Counter::Gp(claim(&mut m, 4).unwrap()),
            event: event_select(0x01c2, true, true).unwrap(),
            start_value: 0,
            ds_area: 0xffffc900_00100140,
            pebs_format: 3,
            data_cfg: 0,
            ld_lat_threshold: 0,
            pmu_version_below_5: true,
            precise_store: false,
            full_width: false,
        };
        let saved = ds::program(&mut m, &p).unwrap();
        // perf scheduled a cycles event onto counter 3 and re-reserved the PMU.
        let perf_sel = evtsel::EN | evtsel::INT | evtsel::OS | 0x3c;
        m.set(msr::IA32_PERFEVTSEL0 + 3, perf_sel);
        m.set(msr::IA32_DS_AREA, 0xfffffe00_00003000);
        assert!(matches!(check_owned(&mut m, &p, false), Err(Refusal::Conflict(_))));
        ds::stop(&mut m, &p, &saved).unwrap();
        assert_eq!(m.get(msr::IA32_PERFEVTSEL0 + 3), perf_sel, "perf's event kept");
        assert_eq!(m.get(msr::IA32_DS_AREA), 0xfffffe00_00003000, "perf's new DS area kept");
        assert_eq!(m.get(msr::IA32_PEBS_ENABLE), 0, "our PEBS bit is gone");
        assert_ne!(m.get(msr::IA32_PERF_GLOBAL_CTRL) & 1 << 3, 0, "perf's counter still enabled");
    }

    #[test]
    fn event_selects() {
        assert_eq!(event_select(0x01cd, true, false), Some(0x01cd | evtsel::USR));
        // perf's raw config may carry bits that are not PERFEVTSELx's to set.
        assert_eq!(
            event_select(0x1_0000_01cd | evtsel::INT | evtsel::EN | evtsel::ANY, true, true),
            Some(0x01cd | evtsel::USR | evtsel::OS)
        );
        assert_eq!(event_select(0x0100_003c | evtsel::EDGE | evtsel::INV, false, true), Some(0x0100_003c | evtsel::EDGE | evtsel::INV | evtsel::OS));
        assert_eq!(event_select(0xff00, true, true), None, "no event code");
        assert_eq!(load_latency_for(event_select(0x01cd, true, false).unwrap(), 30), 30);
        assert_eq!(load_latency_for(event_select(0x003c, true, true).unwrap(), 30), 0, "cycles: no load latency");
        assert_eq!(load_latency_for(event_select(0x02cd, true, true).unwrap(), 30), 0, "precise stores");
        assert_eq!(event_select(0xc0, false, false), None);
    }
}
