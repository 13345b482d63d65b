//! The simulated PEBS hardware of the `sim` source: the PEBS assist of each simulated CPU,
//! the memory the workload touches, and the DS-managed buffers the assist writes into.
//!
//! Reference: Intel SDM Vol. 3B, "Processor Event Based Sampling (PEBS)" and "Debug Store
//! (DS) Mechanism"; the record layouts, the DS area and the assist itself are
//! `hrperf_fmt_pebs` (`layout`, `ds`, `assist`) — this module only decides *what* the
//! simulated CPU writes and *when*.
//!
//! # Where the hardware lives
//!
//! A [`PebsPmu`] is a shared handle (`Arc<Mutex<..>>`) with two holders:
//!
//! - the [`SimSource`](super::SimSource), whose step runs the PEBS assist: when the PEBS
//!   counter (session counter 0, PMC0) overflows, [`hrperf_fmt_pebs::assist::assist`]
//!   writes a record of the configured layout at `pebs_index` of that CPU's buffer, the
//!   counter is reloaded from the DS reset slot the assist returns, and only when
//!   `pebs_index` reaches the interrupt threshold does the source deliver an overflow
//!   sample (the threshold PMI, "large PEBS");
//! - the recorder ([`crate::record`]), given the handle in
//!   [`RecordOptions::pebs_pmu`](crate::record::RecordOptions::pebs_pmu) for formats with
//!   `FMT_FL_PEBS`: it fills the format argument from the PMU ([`PebsPmu::arg`]:
//!   `ARG_FL_PMU_PRESENT` and the simulated `PebsFormat` word — the user never sets
//!   them), lends each CPU's buffer to the PMU while the source runs
//!   ([`PebsPmu::lend`] / [`PebsPmu::take`]), and after a threshold PMI reads the
//!   records in place (`assist::drain`), calls `CpuSession::restart` and re-enables the
//!   CPU's PEBS ([`PebsPmu::unmask`]).
//!
//! On hardware the CPU and the reader see the same pages at once; here ownership makes
//! the hand-over explicit (two pointer moves per batch; the buffer never moves, so the
//! DS area's linear addresses stay valid). The format handler never copies a record.
//!
//! # The memory model
//!
//! The workload's loads go to four regions, each with a known page size, so reports can
//! tell 4K from 2M and 1G pages: a heap of 4 KiB pages, a 2 MiB-page (THP/hugetlbfs)
//! array, the thread stacks (4 KiB pages) and, for kernel phases, the kernel's direct
//! map (1 GiB pages). Each phase picks regions and a memory level with its own weights;
//! the latency is drawn from the level's range (core cycles) and the data-source
//! encoding is the Intel one for that level in the layout's data-source table
//! (`pebs_data_source[]`: 0x01 L1, 0x02 LFB, 0x03 L2, 0x04 L3, 0x0a local DRAM; bit 4
//! STLB miss, bit 5 locked), all seeded and deterministic.

use std::sync::{Arc, Mutex, MutexGuard};

use hrperf_engine::Buffer;
use hrperf_fmt_pebs::assist::{self, AssistOutcome};
use hrperf_fmt_pebs::datasrc::DsrcKind;
use hrperf_fmt_pebs::ds::Counter;
use hrperf_fmt_pebs::format::{PebsArg, ARG_FL_PMU_PRESENT, POLICY_AUTO};
use hrperf_fmt_pebs::layout::{self, Gprs, LbrEntry, PebsSample};
use hrperf_fmt_pebs::record::FL_SIMULATED;
use hrperf_fmt_pebs::{Layout, PebsFormat};

use super::{Rng, CORE_MHZ};

/// Default load-latency threshold (core cycles): every simulated load is at least this
/// slow, so every overflow of the PEBS counter yields a record.
pub const DEFAULT_LD_LAT: u32 = 3;

/// What the simulated PEBS hardware is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PebsConfig {
    /// The record layout the simulated CPU writes (fmt0..fmt3, or adaptive).
    pub layout: Layout,
    /// MSR_PEBS_DATA_CFG (adaptive only; 0 = basic group only).
    pub data_cfg: u64,
    /// MSR_PEBS_LD_LAT_THRESHOLD in core cycles.
    pub ld_lat_threshold: u32,
    /// Record area per CPU in bytes (0: the format's default, 64 KiB).
    pub area_size: u64,
    /// Keep every record the assist wrote, for tests ([`PebsPmu::generated`]).
    pub keep_log: bool,
}

impl PebsConfig {
    /// Adaptive PEBS with the basic and memory-info groups: what `--pebs-format`
    /// defaults to.
    pub fn new() -> PebsConfig {
        PebsConfig {
            layout: Layout::Adaptive,
            data_cfg: layout::DATACFG_MEMINFO,
            ld_lat_threshold: DEFAULT_LD_LAT,
            area_size: 0,
            keep_log: false,
        }
    }

    /// The `PebsFormat` word the simulated CPU reports (what `PERF_CAPABILITIES` and
    /// the CPU model would give): the layout's format number, the data-source table of
    /// that generation (Nehalem without TLB bits, Sandy Bridge for Haswell, Skylake for
    /// Skylake and adaptive), and the `simulated` bit.
    pub fn pebs_format(&self) -> PebsFormat {
        PebsFormat::simulated_for(self.layout)
    }

    /// Checks the configuration (the format checks it again in `validate`).
    pub fn check(&self) -> Result<(), String> {
        if self.data_cfg != 0 && self.layout != Layout::Adaptive {
            return Err("PEBS data groups (--pebs-data-cfg) need the adaptive layout (--pebs-format adaptive)".into());
        }
        if self.data_cfg & !layout::DATACFG_VALID != 0 || layout::lbr_entries(self.data_cfg) > layout::MAX_LBR_ENTRIES {
            return Err(format!("PEBS data configuration {:#x} is not valid (groups: meminfo, gpr, xmm, lbr[:1..32])", self.data_cfg));
        }
        Ok(())
    }
}

impl Default for PebsConfig {
    fn default() -> Self {
        PebsConfig::new()
    }
}

/// Parses `--pebs-format`: `fmt0`/`core`, `fmt1`/`nhm`, `fmt2`/`hsw`, `fmt3`/`skl`,
/// `adaptive`/`fmt4`.
pub fn parse_layout(s: &str) -> Result<Layout, String> {
    Ok(match s {
        "fmt0" | "core" => Layout::Core,
        "fmt1" | "nhm" => Layout::Nehalem,
        "fmt2" | "hsw" => Layout::Haswell,
        "fmt3" | "skl" => Layout::Skylake,
        "fmt4" | "adaptive" => Layout::Adaptive,
        _ => return Err(format!("unknown PEBS record format '{s}': use fmt0, fmt1, fmt2, fmt3 or adaptive")),
    })
}

/// Parses `--pebs-data-cfg`: `+`- or `,`-separated groups `basic` (always present),
/// `meminfo`, `gpr`, `xmm`, `lbr` (8 entries) or `lbr:N` (1..=32), or a number
/// (`0x..`) written to MSR_PEBS_DATA_CFG as is.
pub fn parse_data_cfg(s: &str) -> Result<u64, String> {
    if let Some(hex) = s.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).map_err(|_| format!("bad PEBS data configuration '{s}'"));
    }
    let mut cfg = 0;
    for g in s.split(['+', ',']).map(str::trim) {
        cfg |= match g {
            "basic" | "" => 0,
            "meminfo" | "mem" => layout::DATACFG_MEMINFO,
            "gpr" | "gprs" => layout::DATACFG_GP,
            "xmm" => layout::DATACFG_XMMS,
            "lbr" => layout::datacfg_lbr(8),
            g => match g.strip_prefix("lbr:").and_then(|n| n.parse::<usize>().ok()) {
                Some(n @ 1..=32) => layout::datacfg_lbr(n),
                _ => {
                    return Err(format!(
                        "unknown PEBS data group '{g}': use basic, meminfo, gpr, xmm, lbr or lbr:N (N in 1..=32), joined by '+'"
                    ))
                }
            },
        };
    }
    Ok(cfg)
}

/// A memory region of the simulated workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Name (for reports and tests).
    pub name: &'static str,
    /// First byte.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// Page size backing it.
    pub page_size: u64,
}

/// The regions the simulated workload touches, by [`RegionId`].
pub const REGIONS: [Region; 4] = [
    Region { name: "heap", base: 0x5555_5560_0000, size: 16 << 20, page_size: 4 << 10 },
    Region { name: "huge", base: 0x7f3a_0000_0000, size: 64 << 20, page_size: 2 << 20 },
    Region { name: "stack", base: 0x7ffd_8000_0000, size: 256 << 10, page_size: 4 << 10 },
    Region { name: "kernel", base: 0xffff_8881_0000_0000, size: 1 << 30, page_size: 1 << 30 },
];

/// Index into [`REGIONS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum RegionId {
    /// 4 KiB-page heap.
    Heap = 0,
    /// 2 MiB-page array.
    Huge = 1,
    /// Thread stacks.
    Stack = 2,
    /// Kernel direct map (1 GiB pages).
    Kernel = 3,
}

/// The page size backing `addr` if it is in a simulated region.
pub fn page_size_of(addr: u64) -> Option<u64> {
    REGIONS.iter().find(|r| addr.wrapping_sub(r.base) < r.size).map(|r| r.page_size)
}

/// Memory level a simulated load is served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Level {
    /// L1 data cache.
    L1 = 0,
    /// Line fill buffer.
    Lfb = 1,
    /// L2.
    L2 = 2,
    /// L3.
    L3 = 3,
    /// Local DRAM.
    Dram = 4,
}

impl Level {
    /// The Intel data-source encoding (low 4 bits) for this level, the same in the
    /// Nehalem, Sandy Bridge and Skylake tables.
    pub const fn dse(self) -> u64 {
        match self {
            Level::L1 => 0x01,
            Level::Lfb => 0x02,
            Level::L2 => 0x03,
            Level::L3 => 0x04,
            Level::Dram => 0x0a,
        }
    }

    /// Latency range in core cycles, `(min, span)`.
    const fn latency(self) -> (u64, u64) {
        match self {
            Level::L1 => (4, 4),
            Level::Lfb => (9, 30),
            Level::L2 => (12, 6),
            Level::L3 => (40, 35),
            Level::Dram => (180, 170),
        }
    }

    const ALL: [Level; 5] = [Level::L1, Level::Lfb, Level::L2, Level::L3, Level::Dram];
}

/// How a workload phase touches memory: region weights (heap, huge, stack, kernel) and
/// level weights (L1, LFB, L2, L3, DRAM), both per mille.
#[derive(Clone, Copy, Debug)]
pub(super) struct MemProfile {
    regions: [u64; 4],
    levels: [u64; 5],
    /// STLB-miss probability per mille for 4 KiB-page accesses that miss L2.
    stlb_miss_4k: u64,
    /// Locked accesses per mille.
    locked: u64,
}

/// Memory profile of each entry of the source's phase table (compute, memory, branchy,
/// syscall, idle) and of the steady workload.
pub(super) const PROFILES: [MemProfile; 5] = [
    MemProfile { regions: [450, 50, 500, 0], levels: [900, 40, 50, 10, 0], stlb_miss_4k: 20, locked: 0 },
    MemProfile { regions: [350, 600, 50, 0], levels: [300, 100, 150, 200, 250], stlb_miss_4k: 300, locked: 0 },
    MemProfile { regions: [600, 0, 400, 0], levels: [800, 30, 120, 40, 10], stlb_miss_4k: 50, locked: 0 },
    MemProfile { regions: [0, 0, 300, 700], levels: [600, 50, 200, 120, 30], stlb_miss_4k: 0, locked: 50 },
    MemProfile { regions: [0, 0, 200, 800], levels: [500, 0, 300, 200, 0], stlb_miss_4k: 0, locked: 100 },
];
/// Memory profile of the steady workload.
pub(super) const STEADY_PROFILE: MemProfile =
    MemProfile { regions: [500, 250, 250, 0], levels: [700, 50, 150, 60, 40], stlb_miss_4k: 100, locked: 0 };

fn pick(rng: &mut Rng, weights: &[u64]) -> usize {
    let total: u64 = weights.iter().sum();
    let mut x = rng.below(total.max(1));
    for (i, &w) in weights.iter().enumerate() {
        if x < w {
            return i;
        }
        x -= w;
    }
    weights.len() - 1
}

/// Builds the sample the PEBS assist records for one load of a phase: the eventing IP
/// `ip`, a data address in a region the profile picks, the level's latency and data
/// source, the TSC at `time_ns`, and registers consistent with the access.
pub(super) fn make_sample(rng: &mut Rng, prof: &MemProfile, ip: u64, kernel: bool, time_ns: u64, ld_lat: u32, tlb_bits: bool) -> PebsSample {
    let rid = pick(rng, &prof.regions);
    let region = REGIONS[rid];
    let level = Level::ALL[pick(rng, &prof.levels)];
    // Stack accesses cluster near the stack pointer; others spread over the region.
    let sp = REGIONS[RegionId::Stack as usize].base + REGIONS[RegionId::Stack as usize].size - 0x1000 - (rng.below(64) << 6);
    let offset = if rid == RegionId::Stack as usize {
        (sp - region.base) + (rng.below(32) << 3)
    } else {
        rng.below(region.size) & !7
    };
    let addr = region.base + offset;
    let (lat_min, lat_span) = level.latency();
    let latency = (lat_min + rng.below(lat_span)).max(u64::from(ld_lat));
    let mut dse = level.dse();
    // Drawn unconditionally, so every layout sees the same accesses for a seed.
    let (stlb, lock) = (rng.below(1000), rng.below(1000));
    let beyond_l2 = matches!(level, Level::L3 | Level::Dram);
    if tlb_bits && region.page_size == 4 << 10 && beyond_l2 && stlb < prof.stlb_miss_4k {
        dse |= 1 << 4;
    }
    if tlb_bits && lock < prof.locked {
        dse |= 1 << 5;
    }
    let index = rng.below(1 << 16);
    let regs = Gprs {
        flags: if kernel { 0x046 } else { 0x246 },
        // Trap-like PEBS: the IP after the eventing instruction (a 4-byte load).
        ip: ip + 4,
        ax: addr,
        bx: addr - (index << 3),
        cx: index,
        dx: rng.next() & 0xffff_ffff,
        si: region.base,
        di: rng.next(),
        bp: sp + 0x40,
        sp,
        r8: rng.below(1 << 20),
        r9: 0,
        r10: rng.next(),
        r11: 0x246,
        r12: region.base + region.size,
        r13: rng.below(4096),
        r14: 0,
        r15: time_ns,
    };
    let mut s = PebsSample {
        regs,
        eventing_ip: ip,
        applicable_counters: 0,
        data_addr: addr,
        data_source: dse,
        latency,
        tsx_tuning: 0,
        tsc: time_ns * CORE_MHZ / 1000,
        retire_latency: 0,
        ..PebsSample::default()
    };
    for (i, x) in s.xmm.iter_mut().enumerate() {
        *x = if i % 2 == 0 { rng.next() } else { 0 };
    }
    let mut to = ip;
    for e in s.lbr.iter_mut() {
        let from = to.wrapping_sub(4 + (rng.below(64) << 2));
        *e = LbrEntry { from, to, info: rng.below(200) | (rng.below(2) << 63) };
        to = from.wrapping_sub(rng.below(256) << 2);
    }
    s
}

/// One record the simulated assist wrote (ground truth for tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generated {
    /// CPU.
    pub cpu: u32,
    /// Virtual time of the assist.
    pub time_ns: u64,
    /// What the assist encoded (with the PEBS counter's applicable bit set).
    pub sample: PebsSample,
}

/// Per-CPU counts of the simulated PEBS hardware.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PebsCpuCounts {
    /// Overflows of the PEBS counter while PEBS was enabled (assists attempted).
    pub assists: u64,
    /// Records written into the buffer.
    pub written: u64,
    /// Assists that found the area full (record lost, counted in the format header too).
    pub full: u64,
    /// Threshold PMIs raised.
    pub pmis: u64,
    /// Overflows while the CPU's PEBS was disabled by the format's mask (no record).
    pub masked: u64,
    /// Overflows with no buffer attached (a source run without a recorder).
    pub unattached: u64,
}

#[derive(Debug)]
struct State {
    cfg: PebsConfig,
    width: u8,
    buffers: Vec<Option<Vec<u64>>>,
    masked: Vec<bool>,
    counts: Vec<PebsCpuCounts>,
    log: Vec<Generated>,
}

/// The simulated PEBS hardware, shared by the sim source and the recorder (see the
/// module docs).
#[derive(Clone, Debug)]
pub struct PebsPmu(Arc<Mutex<State>>);

impl PebsPmu {
    /// PEBS hardware for `cpus` CPUs with `width`-bit counters.
    pub(super) fn new(cfg: PebsConfig, cpus: u32, width: u8) -> PebsPmu {
        let n = cpus as usize;
        PebsPmu(Arc::new(Mutex::new(State {
            cfg,
            width,
            buffers: vec![None; n],
            masked: vec![false; n],
            counts: vec![PebsCpuCounts::default(); n],
            log: Vec::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration.
    pub fn config(&self) -> PebsConfig {
        self.lock().cfg
    }

    /// The format argument as the core would fill it from the detected PMU:
    /// `ARG_FL_PMU_PRESENT`, the simulated `PebsFormat` word, the data configuration,
    /// the load-latency threshold, the counter width and the area size; large PEBS.
    pub fn arg(&self) -> PebsArg {
        let s = self.lock();
        PebsArg {
            flags: ARG_FL_PMU_PRESENT,
            pebs_format: s.cfg.pebs_format().0,
            policy: POLICY_AUTO,
            data_cfg: s.cfg.data_cfg,
            ld_lat_threshold: if s.cfg.layout == Layout::Core { 0 } else { s.cfg.ld_lat_threshold },
            counter_width: u32::from(s.width),
            area_size: s.cfg.area_size,
            dsrc_kind: if s.cfg.layout == Layout::Core { 0 } else { DsrcKind::LoadLatency as u32 },
            ..PebsArg::new()
        }
    }

    /// Capture-record flags of records this PMU wrote (`FL_SIMULATED`).
    pub fn record_flags(&self) -> u32 {
        FL_SIMULATED
    }

    /// How this PMU's record TSCs map to the capture clock: the simulated TSC runs at
    /// the core clock from 0 at time 0.
    pub fn tsc_clock(&self) -> hrperf_fmt_pebs::assist::TscClock {
        hrperf_fmt_pebs::assist::TscClock { tsc_hz: CORE_MHZ * 1_000_000, tsc_base: 0, time_base: 0 }
    }

    /// Hands `cpu`'s buffer to the PMU (its DS area is live while the source runs).
    pub fn lend(&self, cpu: u32, words: Vec<u64>) {
        if let Some(b) = self.lock().buffers.get_mut(cpu as usize) {
            *b = Some(words);
        }
    }

    /// Takes `cpu`'s buffer back for reading.
    pub fn take(&self, cpu: u32) -> Option<Vec<u64>> {
        self.lock().buffers.get_mut(cpu as usize).and_then(Option::take)
    }

    /// Disables `cpu`'s PEBS (the format's `CTRL_MASK`).
    pub fn mask(&self, cpu: u32) {
        if let Some(m) = self.lock().masked.get_mut(cpu as usize) {
            *m = true;
        }
    }

    /// Re-enables `cpu`'s PEBS after the reader's restart.
    pub fn unmask(&self, cpu: u32) {
        if let Some(m) = self.lock().masked.get_mut(cpu as usize) {
            *m = false;
        }
    }

    /// Whether `cpu`'s PEBS is disabled by a mask.
    pub fn is_masked(&self, cpu: u32) -> bool {
        self.lock().masked.get(cpu as usize).copied().unwrap_or(false)
    }

    /// Counts for `cpu`.
    pub fn counts(&self, cpu: u32) -> PebsCpuCounts {
        self.lock().counts.get(cpu as usize).copied().unwrap_or_default()
    }

    /// Every record the assist wrote, in order (with [`PebsConfig::keep_log`]).
    pub fn generated(&self) -> Vec<Generated> {
        self.lock().log.clone()
    }

    /// The PEBS assist for one overflow of the PEBS counter on `cpu` (PMC0). Returns
    /// the assist's outcome, or `None` if no record was attempted (masked, no buffer).
    pub(super) fn assist(&self, cpu: u32, time_ns: u64, sample: &PebsSample) -> Option<AssistOutcome> {
        let mut guard = self.lock();
        let s = &mut *guard;
        let i = cpu as usize;
        let counts = s.counts.get_mut(i)?;
        if s.masked.get(i).copied().unwrap_or(false) {
            counts.masked += 1;
            return None;
        }
        let Some(words) = s.buffers.get_mut(i).and_then(Option::as_mut) else {
            counts.unattached += 1;
            return None;
        };
        counts.assists += 1;
        let mut buf = Buffer::from_words(words).ok()?;
        let mut sample = *sample;
        sample.applicable_counters = 1;
        let out = assist::assist(&mut buf, Counter::Gp(0), &sample).ok()?;
        if out.written {
            counts.written += 1;
            if s.cfg.keep_log {
                s.log.push(Generated { cpu, time_ns, sample });
            }
        }
        if out.full {
            counts.full += 1;
        }
        if out.pmi {
            counts.pmis += 1;
        }
        Some(out)
    }

    /// Whether the data-source words carry STLB/lock bits in this layout.
    pub(super) fn tlb_bits(&self) -> bool {
        !self.lock().cfg.pebs_format().has(PebsFormat::NO_TLB)
    }

    /// The load-latency threshold.
    pub(super) fn ld_lat(&self) -> u32 {
        self.lock().cfg.ld_lat_threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hrperf_fmt_pebs::datasrc::{MemAccess, MemLevel, Tlb};

    #[test]
    fn encodings_decode_to_their_levels_in_every_table() {
        let want = [MemLevel::L1, MemLevel::Lfb, MemLevel::L2, MemLevel::L3, MemLevel::LocalDram];
        for layout in [Layout::Nehalem, Layout::Haswell, Layout::Skylake, Layout::Adaptive] {
            let fmt = PebsConfig { layout, data_cfg: 0, ..PebsConfig::new() }.pebs_format();
            for (l, w) in Level::ALL.iter().zip(want) {
                let m = MemAccess::from_intel(fmt, DsrcKind::LoadLatency, l.dse());
                assert_eq!(m.level, w, "{layout:?} {l:?}");
            }
        }
        let skl = PebsConfig::new().pebs_format();
        let m = MemAccess::from_intel(skl, DsrcKind::LoadLatency, Level::Dram.dse() | 1 << 4);
        assert_eq!(m.tlb, Tlb::Miss);
    }

    #[test]
    fn parse_flags() {
        assert_eq!(parse_layout("fmt2"), Ok(Layout::Haswell));
        assert!(parse_layout("fmt9").is_err());
        assert_eq!(parse_data_cfg("basic"), Ok(0));
        assert_eq!(parse_data_cfg("meminfo+gpr"), Ok(layout::DATACFG_MEMINFO | layout::DATACFG_GP));
        assert_eq!(parse_data_cfg("lbr:4"), Ok(layout::datacfg_lbr(4)));
        assert_eq!(parse_data_cfg("0x3"), Ok(3));
        assert!(parse_data_cfg("lbr:0").is_err());
        assert!(parse_data_cfg("bogus").is_err());
    }

    #[test]
    fn regions_know_their_page_sizes() {
        assert_eq!(page_size_of(REGIONS[1].base + 5), Some(2 << 20));
        assert_eq!(page_size_of(REGIONS[3].base), Some(1 << 30));
        assert_eq!(page_size_of(0x1000), None);
        assert_eq!(REGIONS[1].base % (2 << 20), 0);
        assert_eq!(REGIONS[3].base % (1 << 30), 0);
    }
}
