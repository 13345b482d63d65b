// SPDX-License-Identifier: GPL-2.0
//! Zero-copy PEBS sessions, the PMU side: what hrperf-core does for a format with
//! `FMT_FL_PEBS` (fmt-pebs.ko) besides calling its callbacks.
//!
//! The format lays out each CPU's buffer (its header, the DS save area, the record
//! area) and counts threshold interrupts; this module owns the PMU around it, with the
//! logic of `hrperf_fmt_pebs::{coexist, ds}`:
//!
//! - **at load** it decides which PMU PEBS sessions use ([`Support::detect`]): the CPU's
//!   own (`coexist::verdict` from CPUID, IA32_MISC_ENABLE, IA32_PERF_CAPABILITIES and
//!   whether perf registered a hardware PMU), the simulated one (`pebs_sim=`), or none,
//!   with the reason `HRPERF_IOC_INFO` reports;
//! - **at CREATE** it overwrites the format argument's PMU fields with what it detected
//!   and, on each CPU, takes a general-purpose counter perf leaves free (`EBUSY` with the
//!   reason when perf uses PEBS there or every counter);
//! - **at START** it programs PEBS on that counter with the DS area inside the buffer
//!   userspace maps (`ds::program`), remembering perf's DS area;
//! - **the threshold PMI** arrives as an NMI: its own status bits are acknowledged
//!   before perf's handler runs, the ownership of counter, PEBS bits and DS area is
//!   checked (`coexist::check_owned`), the format's handler counts, and its `CTRL_MASK`
//!   stops the counter through its own enable bit until RESTART;
//! - **at RESTART** the format resets the index and the counter counts again;
//! - **at STOP** PEBS is stopped and perf's DS area given back (`ds::stop`).
//!
//! Hardware sessions also hold one disabled perf hardware counter: perf keeps the PMU
//! reserved (so it does not rewrite IA32_DS_AREA under us) and its NMI handler active
//! (it unmasks the local APIC's LVTPC, which a module cannot: `apic_write` is not
//! exported).
//!
//! **The simulated PMU** (`pebs_sim=fmt0|fmt1|fmt2|fmt3|adaptive`) runs the same code
//! against a modelled MSR file per CPU (`ds::SimMsrs`, seeded with what perf would
//! have programmed, `pebs_sim_busy=` marking CPUs where perf uses PEBS). The session's
//! event, a real perf counter, plays the PEBS counter's overflow: each overflow runs the
//! simulated PEBS assist (`assist::assist`) into the real DS area, in the real mapped
//! buffer, if and only if the modelled MSRs say the counter counts; reaching the
//! threshold raises the simulated PMI, handled by the same function as the NMI. The
//! record carries the interrupted context's IP, registers and stack pointer (as data
//! address); its data source (L1 hit) and latency are fixed values.
//!
//! **Honesty:** the hardware path is written against the Intel SDM and the kernel's
//! `arch/x86/events/intel/{core,ds}.c` and has not run on a PEBS-capable PMU (none was
//! available); the simulated path runs in the QEMU test.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use kernel::prelude::*;

use crate::abi::event::{EventDesc, EVENT_FL_KERNEL_ONLY, EVENT_FL_USER_ONLY, EVENT_TYPE_HARDWARE, EVENT_TYPE_RAW};
use crate::abi::ioctl::{pebs_state, ModuleInfo};
use crate::abi::MAX_CPUS;
use crate::engine::pmu::arm_value;
use crate::engine::Buffer;
use crate::pebs::assist;
use crate::pebs::coexist::{self, KernelPebs, Refusal};
use crate::pebs::ds::{self, msr, status, Counter, PebsMsrs, PebsProgram, Saved, SimMsrs};
use crate::pebs::format::{self as pf, parse_arg, PebsArg, ARG_FL_PMU_PRESENT};
use crate::pebs::layout::{Gprs, Layout, PebsFormat, PebsSample};
use crate::session::CpuSlot;
use crate::shim::{self, KernelMsrs, OverflowInfo, PebsNmi};

/// Which PMU zero-copy PEBS sessions use.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Backend {
    /// The CPU's own PEBS.
    Hardware(KernelPebs),
    /// The simulated PMU (`pebs_sim=`).
    Simulated(KernelPebs),
    /// None, and why.
    Unavailable(Refusal),
}

/// The simulated PMU: general-purpose counters, width, PMU version.
const SIM_COUNTERS: u32 = 4;
/// What perf would have left on a CPU: its `debug_store` (a fake address, one page per
/// CPU), every counter enabled globally (`intel_ctrl`: 4 GP + 3 fixed), a cycles event
/// on GP0 (the NMI watchdog).
const SIM_PERF_DS_AREA: u64 = 0xffff_fe00_0000_1000;
const SIM_PERF_GLOBAL_CTRL: u64 = 0x7_0000_000f;
const SIM_PERF_EVTSEL0: u64 = 0x53_003c;
/// The simulated data source (L1 hit in the Sandy Bridge/Skylake tables) and latency.
const SIM_DSE_L1: u64 = 0x01;
const SIM_LATENCY: u64 = 5;
/// The simulated PMU's event when the session's event is not a raw one:
/// MEM_TRANS_RETIRED.LOAD_LATENCY.
const SIM_EVENT: u64 = 0x01cd;

/// The last refusal (`pebs_state << 32 | cpu`) and its MSR value, for `HRPERF_IOC_INFO`.
/// Statics: the NMI path records conflicts too.
static LAST_REFUSAL: AtomicU64 = AtomicU64::new(0);
static LAST_REFUSAL_VALUE: AtomicU64 = AtomicU64::new(0);

/// Records `r` on `cpu` (`u32::MAX`: none) as the last refusal. Any context.
fn note_refusal(r: Refusal, cpu: u32) {
    LAST_REFUSAL_VALUE.store(r.value(), Ordering::Relaxed);
    LAST_REFUSAL.store(u64::from(r.state()) << 32 | u64::from(cpu), Ordering::Release);
}

/// PEBS as decided at module load.
pub(crate) struct Support {
    backend: Backend,
    tsc_khz: u32,
    /// The PMI handler, while PEBS is usable.
    _nmi: Option<PebsNmi>,
}

impl Support {
    /// Decides at load. Errors only for a `pebs_sim=` value that is not a layout.
    pub(crate) fn detect() -> Result<Support> {
        let (facts, tsc_khz) = shim::cpu_facts();
        let backend = match shim::param_pebs_sim() {
            b"" => coexist::verdict(&facts).map_or_else(Backend::Unavailable, Backend::Hardware),
            name => {
                let layout = sim_layout(name).ok_or_else(|| {
                    pr_err!("pebs_sim= must be fmt0, fmt1, fmt2, fmt3 or adaptive\n");
                    EINVAL
                })?;
                Backend::Simulated(KernelPebs {
                    format: PebsFormat::simulated_for(layout),
                    pmu_version: 4,
                    pebs_counters: SIM_COUNTERS,
                    counter_width: 48,
                    full_width: true,
                })
            }
        };
        let nmi = match backend {
            Backend::Unavailable(_) => None,
            _ => Some(PebsNmi::register()?),
        };
        let s = Support { backend, tsc_khz, _nmi: nmi };
        match backend {
            Backend::Unavailable(r) => pr_info!(
                "PEBS: not available: {} (CPU family {} model {:#x}, PMU v{})\n",
                pebs_state::text(r.state()),
                facts.cpu.family,
                facts.cpu.model,
                facts.pmu_version
            ),
            Backend::Hardware(k) | Backend::Simulated(k) => pr_info!(
                "PEBS: {}, record format {} (word {:#x}), {} PEBS counters of {} bits\n",
                pebs_state::text(s.state()),
                k.format.format(),
                k.format.0,
                k.pebs_counters,
                k.counter_width
            ),
        }
        Ok(s)
    }

    /// The `pebs_state` code.
    pub(crate) fn state(&self) -> u32 {
        match self.backend {
            Backend::Hardware(_) => pebs_state::HARDWARE,
            Backend::Simulated(_) => pebs_state::SIMULATED,
            Backend::Unavailable(r) => r.state(),
        }
    }

    /// Fills `HRPERF_IOC_INFO`'s PEBS fields.
    pub(crate) fn fill_info(&self, info: &mut ModuleInfo) {
        info.pebs_state = self.state();
        info.pebs_format = match self.backend {
            Backend::Hardware(k) | Backend::Simulated(k) => k.format.0,
            Backend::Unavailable(_) => 0,
        };
        let last = LAST_REFUSAL.load(Ordering::Acquire);
        info.pebs_refusal = (last >> 32) as u32;
        info.pebs_refusal_cpu = if last == 0 { u32::MAX } else { last as u32 };
        info.pebs_refusal_value = LAST_REFUSAL_VALUE.load(Ordering::Relaxed);
        info.tsc_khz = match self.backend {
            // The simulated TSC is the record's local_clock() ns: 1 GHz.
            Backend::Simulated(_) => 1_000_000,
            _ => self.tsc_khz,
        };
    }

    /// Refuses a session: records why (for INFO), logs it, gives the errno.
    pub(crate) fn refuse(&self, r: Refusal, cpu: u32) -> Error {
        note_refusal(r, cpu);
        if cpu == u32::MAX {
            pr_info!("PEBS session refused: {}\n", pebs_state::text(r.state()));
        } else {
            pr_info!("PEBS session refused on CPU {}: {} ({:#x})\n", cpu, pebs_state::text(r.state()), r.value());
        }
        Error::from_errno(-r.errno())
    }

    /// For a `FMT_FL_PEBS` session: checks the events against the backend, rewrites the
    /// format argument with what the kernel detected (never the user's word), and says
    /// how to program each CPU. The argument is the format's `PebsArg` (empty: defaults).
    pub(crate) fn prepare(&self, events: &[EventDesc], period: u64, arg: &mut KVec<u8>) -> Result<SessionPebs> {
        let (kernel, simulated) = match self.backend {
            Backend::Hardware(k) => (k, false),
            Backend::Simulated(k) => (k, true),
            Backend::Unavailable(r) => return Err(self.refuse(r, u32::MAX)),
        };
        let [ev] = events else { return Err(self.refuse(Refusal::BadEvent, u32::MAX)) };
        let user = ev.flags & EVENT_FL_KERNEL_ONLY == 0;
        let kern = ev.flags & EVENT_FL_USER_ONLY == 0;
        let config = match ev.kind {
            EVENT_TYPE_RAW => Some(ev.config),
            EVENT_TYPE_HARDWARE if !simulated => shim::hw_event_config(ev.config),
            // The simulated PMU counts its load event; the session's event triggers it.
            _ if simulated => Some(SIM_EVENT),
            _ => None,
        };
        let event = config
            .and_then(|c| coexist::event_select(c, user, kern))
            .ok_or_else(|| self.refuse(Refusal::BadEvent, u32::MAX))?;
        let mut a = if arg.is_empty() { PebsArg::new() } else { parse_arg(arg).map_err(|e| Error::from_errno(-e))? };
        // Only the load-latency event has a latency threshold (and records a latency).
        a.ld_lat_threshold = coexist::load_latency_for(event, a.ld_lat_threshold);
        a.flags |= ARG_FL_PMU_PRESENT;
        a.pebs_format = kernel.format.0;
        a.counter_width = kernel.counter_width;
        *arg = KVec::new();
        arg.extend_from_slice(&a.to_bytes(), GFP_KERNEL)?;
        Ok(SessionPebs {
            kernel,
            simulated,
            event,
            ld_lat_threshold: a.ld_lat_threshold,
            data_cfg: a.data_cfg,
            reset: arm_value(kernel.counter_width, period),
        })
    }
}

/// `pebs_sim=` → layout.
fn sim_layout(name: &[u8]) -> Option<Layout> {
    Some(match name {
        b"fmt0" | b"core" => Layout::Core,
        b"fmt1" | b"nhm" => Layout::Nehalem,
        b"fmt2" | b"hsw" => Layout::Haswell,
        b"fmt3" | b"skl" => Layout::Skylake,
        b"adaptive" | b"fmt4" => Layout::Adaptive,
        _ => return None,
    })
}

/// How a session programs PEBS on each CPU.
#[derive(Clone, Copy)]
pub(crate) struct SessionPebs {
    kernel: KernelPebs,
    /// The simulated PMU.
    simulated: bool,
    event: u64,
    ld_lat_threshold: u32,
    data_cfg: u64,
    /// Raw counter value that overflows after one period.
    reset: u64,
}

impl SessionPebs {
    /// The CPU's own PEBS (not the simulated PMU): the PMI comes as an NMI, and perf
    /// counters only hold the PMU.
    pub(crate) fn hardware(&self) -> bool {
        !self.simulated
    }

    /// This CPU's PMU state for the session (on a hardware session, the CPU's own MSRs;
    /// on the simulated PMU, a modelled MSR file with perf's state on CPU `cpu`).
    pub(crate) fn cpu_state(&self, cpu: u32) -> PebsCpu {
        let msrs = if self.simulated {
            let mut m = SimMsrs::new();
            m.set(msr::IA32_DS_AREA, SIM_PERF_DS_AREA + u64::from(cpu) * 0x1000);
            m.set(msr::IA32_PERF_GLOBAL_CTRL, SIM_PERF_GLOBAL_CTRL);
            m.set(msr::IA32_PERFEVTSEL0, SIM_PERF_EVTSEL0);
            if cpu < 64 && shim::param_pebs_sim_busy() & 1 << cpu != 0 {
                // perf's PEBS event on GP0.
                m.set(msr::IA32_PEBS_ENABLE, 1);
            }
            Msrs::Sim(m)
        } else {
            Msrs::Cpu(KernelMsrs::default())
        };
        PebsCpu { msrs, prog: None, saved: Saved::default(), armed: false, conflict: None }
    }

    /// On CPU `cpu`, with the buffer initialised by the format: takes a counter and sets
    /// its DS reset value. Runs on that CPU (cross call).
    pub(crate) fn claim(&self, pc: &mut PebsCpu, buf: &Buffer<'_>) -> core::result::Result<(), Refusal> {
        let i = coexist::claim(&mut pc.msrs, self.kernel.pebs_counters)?;
        if pc.msrs.faults() != 0 {
            return Err(Refusal::MsrUnreadable);
        }
        let counter = Counter::Gp(i);
        let slot = ds::reset_slot(self.kernel.format.format(), counter).ok_or(Refusal::NoFreeCounter(0))?;
        pf::set_reset(buf, slot, self.reset);
        pc.prog = Some(PebsProgram {
            counter,
            event: self.event,
            start_value: self.reset,
            ds_area: (buf.as_ptr() as u64).wrapping_add(pf::DS_OFFSET as u64),
            pebs_format: self.kernel.format.format(),
            data_cfg: self.data_cfg,
            ld_lat_threshold: self.ld_lat_threshold,
            pmu_version_below_5: self.kernel.pmu_version < 5,
            precise_store: false,
            full_width: self.kernel.full_width,
        });
        Ok(())
    }
}

/// A CPU's MSRs: the real ones or the simulated PMU's.
pub(crate) enum Msrs {
    /// The CPU's (`rdmsrl_safe`/`wrmsrl_safe`).
    Cpu(KernelMsrs),
    /// The simulated PMU's.
    Sim(SimMsrs),
}

impl Msrs {
    fn faults(&self) -> u32 {
        match self {
            Msrs::Cpu(k) => k.faults,
            Msrs::Sim(s) => s.dropped as u32,
        }
    }
}

impl PebsMsrs for Msrs {
    fn rdmsr(&mut self, m: u32) -> u64 {
        match self {
            Msrs::Cpu(k) => k.rdmsr(m),
            Msrs::Sim(s) => s.rdmsr(m),
        }
    }

    fn wrmsr(&mut self, m: u32, v: u64) {
        match self {
            Msrs::Cpu(k) => k.wrmsr(m, v),
            Msrs::Sim(s) => s.wrmsr(m, v),
        }
    }
}

/// One CPU's PEBS state in a session (in its `CpuSlot`, guarded like the engine state).
pub(crate) struct PebsCpu {
    msrs: Msrs,
    /// The counter taken and how it is programmed (set by `claim`).
    prog: Option<PebsProgram>,
    saved: Saved,
    /// PEBS is programmed on the CPU.
    armed: bool,
    /// Why PEBS stopped on this CPU during the session.
    conflict: Option<Refusal>,
}

/// What a PMI was.
pub(crate) enum Pmi {
    /// Not this CPU's PEBS interrupt.
    NotOurs,
    /// Handled; the format's control bits.
    Handled(u32),
    /// Ours, but perf took the counter, PEBS or the DS area: PEBS stopped on the CPU
    /// (the reason is noted for `HRPERF_IOC_INFO`).
    Conflict,
}

impl PebsCpu {
    /// START on this CPU: programs PEBS. Errors leave nothing programmed.
    pub(crate) fn arm(&mut self, cpu: u32) -> core::result::Result<(), Refusal> {
        let (Some(p), Some(i)) = (self.prog, self.prog.as_ref().and_then(gp_index)) else {
            return Err(Refusal::NoFreeCounter(0));
        };
        // perf may have taken the counter or started PEBS since CREATE (or a pause).
        coexist::check_free(&mut self.msrs, i).inspect_err(|&r| note_refusal(r, cpu))?;
        self.saved = ds::program(&mut self.msrs, &p).map_err(|_| Refusal::NoFreeCounter(0))?;
        if self.msrs.faults() != 0 {
            let _ = ds::stop(&mut self.msrs, &p, &self.saved);
            return Err(Refusal::MsrUnreadable);
        }
        self.armed = true;
        Ok(())
    }

    /// Stops the counter until RESTART (START of a session paused while the CPU was
    /// masked: its records still wait to be read).
    pub(crate) fn mask(&mut self) {
        if let (true, Some(p)) = (self.armed, self.prog) {
            let _ = ds::mask(&mut self.msrs, &p);
        }
    }

    /// STOP on this CPU: PEBS off, perf's DS area back (what is still ours).
    pub(crate) fn disarm(&mut self, cpu: u32) {
        if let (true, Some(p)) = (self.armed, self.prog) {
            let _ = ds::stop(&mut self.msrs, &p, &self.saved);
        }
        self.armed = false;
        if let Some(r) = self.conflict {
            pr_warn!("PEBS on CPU {} stopped during the session: {} ({:#x})\n", cpu, pebs_state::text(r.state()), r.value());
        }
    }

    /// RESTART on this CPU, after the format reset the index: acknowledge and count
    /// again, if the counter is still ours.
    pub(crate) fn restart(&mut self, cpu: u32) -> Pmi {
        let Some(p) = self.prog else { return Pmi::NotOurs };
        if !self.armed {
            return Pmi::NotOurs;
        }
        if let Err(r) = coexist::check_owned(&mut self.msrs, &p, true) {
            return self.give_up(&p, r, cpu);
        }
        let _ = ds::restart(&mut self.msrs, &p);
        Pmi::Handled(0)
    }

    /// Ownership lost: stop what is still ours, remember why.
    fn give_up(&mut self, p: &PebsProgram, r: Refusal, cpu: u32) -> Pmi {
        let _ = ds::stop(&mut self.msrs, p, &self.saved);
        self.armed = false;
        self.conflict = Some(r);
        note_refusal(r, cpu);
        Pmi::Conflict
    }

    /// The threshold PMI, or any NMI on this CPU while armed: acknowledges this
    /// counter's status bits, and if they were set (or the threshold was reached and the
    /// interrupt went to perf's handler first) hands it to the format through `dispatch`.
    /// A `CTRL_MASK` answer stops the counter until RESTART.
    pub(crate) fn pmi(
        &mut self,
        cpu: u32,
        buf: &mut Buffer<'_>,
        masked: bool,
        dispatch: impl FnOnce(&mut Buffer<'_>) -> u32,
    ) -> Pmi {
        let Some(p) = self.prog else { return Pmi::NotOurs };
        if !self.armed {
            return Pmi::NotOurs;
        }
        let acked = ds::ack_pmi(&mut self.msrs, &p).unwrap_or(0);
        if acked == 0 && (masked || !pf::threshold_reached(buf)) {
            return Pmi::NotOurs;
        }
        if let Err(r) = coexist::check_owned(&mut self.msrs, &p, masked) {
            return self.give_up(&p, r, cpu);
        }
        let ctrl = dispatch(buf);
        if ctrl & crate::abi::format::CTRL_MASK != 0 && !masked {
            let _ = ds::mask(&mut self.msrs, &p);
        }
        Pmi::Handled(ctrl)
    }

    /// The simulated PMU: one overflow of the session's event is one overflow of the
    /// modelled PEBS counter. If the modelled MSRs let it count (event select enabled,
    /// its IA32_PEBS_ENABLE and global-control bits set, IA32_DS_AREA pointing at this
    /// buffer's DS area), the assist writes a record at the DS index; reaching the
    /// threshold sets BUFFER_OVF and the counter's status bit and raises the PMI, given
    /// to [`pmi`](Self::pmi). `None` if nothing was written.
    pub(crate) fn sim_overflow(
        &mut self,
        o: &OverflowInfo,
        cpu: u32,
        buf: &mut Buffer<'_>,
        masked: bool,
        dispatch: impl FnOnce(&mut Buffer<'_>) -> u32,
    ) -> Option<Pmi> {
        let (Msrs::Sim(m), Some(p)) = (&mut self.msrs, self.prog) else { return None };
        let i = gp_index(&p)?;
        let bit = 1u64 << i;
        let counting = m.get(msr::IA32_PERFEVTSEL0 + i) & ds::evtsel::EN != 0
            && m.get(msr::IA32_PEBS_ENABLE) & bit != 0
            && m.get(msr::IA32_PERF_GLOBAL_CTRL) & bit != 0
            && m.get(msr::IA32_DS_AREA) == p.ds_area;
        if !counting {
            return None;
        }
        let out = assist::assist(buf, p.counter, &sim_sample(o, p.ld_lat_threshold)).ok()?;
        if !out.pmi {
            return None;
        }
        let st = m.get(msr::IA32_PERF_GLOBAL_STATUS);
        m.set(msr::IA32_PERF_GLOBAL_STATUS, st | status::BUFFER_OVF | bit);
        Some(self.pmi(cpu, buf, masked, dispatch))
    }
}

/// What the simulated assist writes for one overflow: the interrupted context's IP and
/// registers (stack pointer as the data address), the overflow time as TSC (ns), an L1
/// hit of fixed latency.
fn sim_sample(o: &OverflowInfo, ld_lat: u32) -> PebsSample {
    let mut regs = o.gprs().map(|w| Gprs::from_adaptive(&w)).unwrap_or_default();
    regs.ip = o.ip;
    PebsSample {
        regs,
        eventing_ip: o.ip,
        data_addr: regs.sp,
        data_source: SIM_DSE_L1,
        latency: SIM_LATENCY.max(u64::from(ld_lat)),
        tsc: o.time_ns,
        ..PebsSample::default()
    }
}

/// The general-purpose counter `p` programs (hrperf-core takes GP counters only: perf
/// rewrites IA32_FIXED_CTR_CTRL on every PMU enable).
fn gp_index(p: &PebsProgram) -> Option<u32> {
    match p.counter {
        Counter::Gp(i) => Some(i),
        Counter::Fixed(_) => None,
    }
}

// ---- the NMI path ----------------------------------------------------------------------------

const NO_SLOT: AtomicPtr<CpuSlot> = AtomicPtr::new(core::ptr::null_mut());
/// The slot whose PEBS is armed on each CPU (hardware sessions). Published and withdrawn
/// only on the CPU itself with IRQs off, so an NMI there sees either a live slot or null.
static ARMED: [AtomicPtr<CpuSlot>; MAX_CPUS] = [NO_SLOT; MAX_CPUS];

/// Publishes `slot` as this CPU's armed PEBS slot (`None`: withdraws it). Must run on
/// `cpu` with IRQs off (cross call).
///
/// # Safety
///
/// A published slot must stay alive until withdrawn.
pub(crate) unsafe fn publish(cpu: u32, slot: Option<&CpuSlot>) {
    if let Some(a) = ARMED.get(cpu as usize) {
        let p = slot.map_or(core::ptr::null_mut(), |s| (s as *const CpuSlot).cast_mut());
        a.store(p, Ordering::Release);
    }
}

/// Every NMI while PEBS is usable: this CPU's armed slot, if any, takes it.
pub(crate) fn on_nmi(o: &OverflowInfo) -> bool {
    let cpu = shim::this_cpu();
    let Some(a) = ARMED.get(cpu as usize) else { return false };
    // SAFETY: published and withdrawn on this CPU only (see `ARMED`), alive while
    // published (`publish`'s contract); an NMI is not interrupted by the withdrawal.
    match unsafe { a.load(Ordering::Acquire).as_ref() } {
        Some(slot) => slot.on_pebs_pmi(o),
        None => false,
    }
}
