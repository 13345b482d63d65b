//! Data-source decoding: Intel's PEBS data-source encodings (per microarchitecture, as
//! Linux's `ds.c` maps them) and perf's `perf_mem_data_src`, both into one [`MemAccess`].
//!
//! Reference: `arch/x86/events/intel/ds.c` (`union intel_x86_pebs_dse`,
//! `pebs_data_source[]`, `intel_pmu_pebs_data_source_nhm/skl/grt/cmt`,
//! `lnc_pebs_data_source[]`, `load_latency_data`, `store_latency_data`,
//! `precise_store_data`, `precise_datala_hsw`, `adl_/mtl_latency_data_small`,
//! `lnl_latency_data`, `pebs_set_tlb_lock`) and `include/uapi/linux/perf_event.h`
//! (`union perf_mem_data_src`, `PERF_MEM_*`). Intel SDM Vol. 3B, "Load Latency
//! Performance Monitoring Facility" (data source encoding tables).
//!
//! The Intel path first converts the hardware encoding into the `perf_mem_data_src`
//! value Linux would report ([`intel_to_perf`]), so PEBS records from hardware, the
//! simulator and perf all end in the same [`MemAccess::from_perf`].

use super::layout::PebsFormat;

/// `perf_mem_data_src` bit fields and values (`include/uapi/linux/perf_event.h`).
pub mod perf {
    /// Shift of `mem_op` (5 bits).
    pub const OP_SHIFT: u32 = 0;
    /// Not available.
    pub const OP_NA: u64 = 0x01;
    /// Load.
    pub const OP_LOAD: u64 = 0x02;
    /// Store.
    pub const OP_STORE: u64 = 0x04;
    /// Prefetch.
    pub const OP_PFETCH: u64 = 0x08;
    /// Code (execution).
    pub const OP_EXEC: u64 = 0x10;

    /// Shift of `mem_lvl` (14 bits).
    pub const LVL_SHIFT: u32 = 5;
    /// Not available.
    pub const LVL_NA: u64 = 0x01;
    /// Hit level.
    pub const LVL_HIT: u64 = 0x02;
    /// Miss level.
    pub const LVL_MISS: u64 = 0x04;
    /// L1.
    pub const LVL_L1: u64 = 0x08;
    /// Line fill buffer.
    pub const LVL_LFB: u64 = 0x10;
    /// L2.
    pub const LVL_L2: u64 = 0x20;
    /// L3.
    pub const LVL_L3: u64 = 0x40;
    /// Local DRAM.
    pub const LVL_LOC_RAM: u64 = 0x80;
    /// Remote DRAM, 1 hop.
    pub const LVL_REM_RAM1: u64 = 0x100;
    /// Remote DRAM, 2 hops.
    pub const LVL_REM_RAM2: u64 = 0x200;
    /// Remote cache, 1 hop.
    pub const LVL_REM_CCE1: u64 = 0x400;
    /// Remote cache, 2 hops.
    pub const LVL_REM_CCE2: u64 = 0x800;
    /// I/O memory.
    pub const LVL_IO: u64 = 0x1000;
    /// Uncached memory.
    pub const LVL_UNC: u64 = 0x2000;

    /// Shift of `mem_snoop` (5 bits).
    pub const SNOOP_SHIFT: u32 = 19;
    /// Not available.
    pub const SNOOP_NA: u64 = 0x01;
    /// No snoop.
    pub const SNOOP_NONE: u64 = 0x02;
    /// Snoop hit.
    pub const SNOOP_HIT: u64 = 0x04;
    /// Snoop miss.
    pub const SNOOP_MISS: u64 = 0x08;
    /// Snoop hit modified.
    pub const SNOOP_HITM: u64 = 0x10;

    /// Shift of `mem_lock` (2 bits).
    pub const LOCK_SHIFT: u32 = 24;
    /// Not available.
    pub const LOCK_NA: u64 = 0x01;
    /// Locked transaction.
    pub const LOCK_LOCKED: u64 = 0x02;

    /// Shift of `mem_dtlb` (7 bits).
    pub const TLB_SHIFT: u32 = 26;
    /// Not available.
    pub const TLB_NA: u64 = 0x01;
    /// Hit.
    pub const TLB_HIT: u64 = 0x02;
    /// Miss.
    pub const TLB_MISS: u64 = 0x04;
    /// L1 TLB.
    pub const TLB_L1: u64 = 0x08;
    /// L2 TLB.
    pub const TLB_L2: u64 = 0x10;
    /// Hardware walker.
    pub const TLB_WK: u64 = 0x20;
    /// OS fault handler.
    pub const TLB_OS: u64 = 0x40;

    /// Shift of `mem_lvl_num` (4 bits).
    pub const LVLNUM_SHIFT: u32 = 33;
    /// L1.
    pub const LVLNUM_L1: u64 = 0x01;
    /// L2.
    pub const LVLNUM_L2: u64 = 0x02;
    /// L3.
    pub const LVLNUM_L3: u64 = 0x03;
    /// L4.
    pub const LVLNUM_L4: u64 = 0x04;
    /// L2 miss-handling buffer.
    pub const LVLNUM_L2_MHB: u64 = 0x05;
    /// Memory-side cache.
    pub const LVLNUM_MSC: u64 = 0x06;
    /// Uncached.
    pub const LVLNUM_UNC: u64 = 0x08;
    /// CXL.
    pub const LVLNUM_CXL: u64 = 0x09;
    /// I/O.
    pub const LVLNUM_IO: u64 = 0x0a;
    /// Any cache.
    pub const LVLNUM_ANY_CACHE: u64 = 0x0b;
    /// LFB / L1 miss-handling buffer.
    pub const LVLNUM_LFB: u64 = 0x0c;
    /// RAM.
    pub const LVLNUM_RAM: u64 = 0x0d;
    /// Persistent memory.
    pub const LVLNUM_PMEM: u64 = 0x0e;
    /// Not available.
    pub const LVLNUM_NA: u64 = 0x0f;

    /// Shift of `mem_remote` (1 bit).
    pub const REMOTE_SHIFT: u32 = 37;
    /// Remote.
    pub const REMOTE_REMOTE: u64 = 0x01;

    /// Shift of `mem_snoopx` (2 bits).
    pub const SNOOPX_SHIFT: u32 = 38;
    /// Forward.
    pub const SNOOPX_FWD: u64 = 0x01;
    /// Transfer from a peer.
    pub const SNOOPX_PEER: u64 = 0x02;

    /// Shift of `mem_blk` (3 bits).
    pub const BLK_SHIFT: u32 = 40;
    /// Not available.
    pub const BLK_NA: u64 = 0x01;
    /// Data could not be forwarded.
    pub const BLK_DATA: u64 = 0x02;
    /// Address conflict.
    pub const BLK_ADDR: u64 = 0x04;

    /// Shift of `mem_hops` (3 bits).
    pub const HOPS_SHIFT: u32 = 43;

    /// `PERF_MEM_S(a, b)`: `value << shift`.
    pub const fn s(value: u64, shift: u32) -> u64 {
        value << shift
    }

    /// `PERF_MEM_NA`: every field "not available".
    pub const MEM_NA: u64 = s(OP_NA, OP_SHIFT)
        | s(LVL_NA, LVL_SHIFT)
        | s(SNOOP_NA, SNOOP_SHIFT)
        | s(LOCK_NA, LOCK_SHIFT)
        | s(TLB_NA, TLB_SHIFT)
        | s(LVLNUM_NA, LVLNUM_SHIFT);
}

use perf::*;

/// Which `ds.c` data-source table a CPU's encodings index (bits 11:8 of [`PebsFormat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DseTable {
    /// No data source (fmt0, or unknown).
    None = 0,
    /// Nehalem/Westmere: `pebs_data_source` patched by `intel_pmu_pebs_data_source_nhm`.
    Nehalem = 1,
    /// Sandy Bridge .. Broadwell: `pebs_data_source` as is.
    SandyBridge = 2,
    /// Skylake and later big cores: patched by `__intel_pmu_pebs_data_source_skl`.
    Skylake = 3,
    /// Gracemont (Alder Lake E-core): patched by `__intel_pmu_pebs_data_source_grt`,
    /// read by `adl_latency_data_small` (bit 4 lock, bit 5 TLB).
    Gracemont = 4,
    /// Crestmont/Skymont E-cores: patched by `__intel_pmu_pebs_data_source_cmt`, read by
    /// `mtl_latency_data_small` (5-bit source, bit 5 lock, bit 6 TLB, bit 7 block).
    Crestmont = 5,
    /// Lion Cove (Lunar/Arrow Lake P-core): `lnc_pebs_data_source`, 8-bit source, read
    /// by `lnl_latency_data`.
    LionCove = 6,
}

impl DseTable {
    /// The table with this id; unknown ids are [`DseTable::None`].
    pub const fn from_id(id: u32) -> DseTable {
        match id {
            1 => DseTable::Nehalem,
            2 => DseTable::SandyBridge,
            3 => DseTable::Skylake,
            4 => DseTable::Gracemont,
            5 => DseTable::Crestmont,
            6 => DseTable::LionCove,
            _ => DseTable::None,
        }
    }
}

/// How a record's data-source word must be read; it depends on the event that was
/// sampled (as `get_data_src` in `ds.c` decides from the event's flags), so the
/// capture record prefix carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DsrcKind {
    /// No data source for this event.
    None = 0,
    /// A load-latency event (`MEM_TRANS_RETIRED.LOAD_LATENCY`, `mem-loads`).
    LoadLatency = 1,
    /// A store-latency event (Ice Lake+ `mem-stores` via STLAT).
    StoreLatency = 2,
    /// Sandy/Ivy Bridge precise store (`MEM_TRANS_RETIRED.PRECISE_STORE`).
    PreciseStore = 3,
    /// Haswell+ precise memory load event with a data address (`DATALA_LD`).
    DataLaLoad = 4,
    /// Haswell+ precise memory store event with a data address (`DATALA_ST`).
    DataLaStore = 5,
    /// The word is already a `perf_mem_data_src` (perf-sourced records).
    PerfMemDataSrc = 6,
}

impl DsrcKind {
    /// The kind with this id; unknown ids are [`DsrcKind::None`].
    pub const fn from_id(id: u8) -> DsrcKind {
        match id {
            1 => DsrcKind::LoadLatency,
            2 => DsrcKind::StoreLatency,
            3 => DsrcKind::PreciseStore,
            4 => DsrcKind::DataLaLoad,
            5 => DsrcKind::DataLaStore,
            6 => DsrcKind::PerfMemDataSrc,
            _ => DsrcKind::None,
        }
    }
}

const fn p(v: u64, shift: u32) -> u64 {
    s(v, shift)
}
const OP_LH: u64 = p(OP_LOAD, OP_SHIFT) | p(LVL_HIT, LVL_SHIFT);
const fn level(v: u64) -> u64 {
    p(v, LVLNUM_SHIFT)
}
const REM: u64 = p(REMOTE_REMOTE, REMOTE_SHIFT);
const SNOOP_NONE_MISS: u64 = p(SNOOP_NONE, SNOOP_SHIFT) | p(SNOOP_MISS, SNOOP_SHIFT);
const fn lvl(v: u64) -> u64 {
    p(v, LVL_SHIFT)
}
const fn snoop(v: u64) -> u64 {
    p(v, SNOOP_SHIFT)
}
const fn snoopx(v: u64) -> u64 {
    p(v, SNOOPX_SHIFT)
}

/// `pebs_data_source[]`, the Sandy Bridge and later version (16 entries).
pub const SNB_TABLE: [u64; 16] = [
    p(OP_LOAD, OP_SHIFT) | lvl(LVL_MISS) | level(LVLNUM_L3) | snoop(SNOOP_NA), // 0x00 ukn L3
    OP_LH | lvl(LVL_L1) | level(LVLNUM_L1) | snoop(SNOOP_NONE),              // 0x01 L1 local
    OP_LH | lvl(LVL_LFB) | level(LVLNUM_LFB) | snoop(SNOOP_NONE),            // 0x02 LFB hit
    OP_LH | lvl(LVL_L2) | level(LVLNUM_L2) | snoop(SNOOP_NONE),              // 0x03 L2 hit
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_NONE),              // 0x04 L3 hit
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_MISS), // 0x05 L3 hit, snoop miss
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HIT),  // 0x06 L3 hit, snoop hit
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM), // 0x07 L3 hit, snoop hitm
    OP_LH | lvl(LVL_REM_CCE1) | REM | level(LVLNUM_L3) | snoop(SNOOP_HIT), // 0x08 L3 miss snoop hit
    OP_LH | lvl(LVL_REM_CCE1) | REM | level(LVLNUM_L3) | snoop(SNOOP_HITM), // 0x09 L3 miss hitm
    OP_LH | lvl(LVL_LOC_RAM) | level(LVLNUM_RAM) | snoop(SNOOP_HIT), // 0x0a L3 miss, shared
    OP_LH | lvl(LVL_REM_RAM1) | REM | level(LVLNUM_L3) | snoop(SNOOP_HIT), // 0x0b L3 miss, shared
    OP_LH | lvl(LVL_LOC_RAM) | level(LVLNUM_RAM) | SNOOP_NONE_MISS, // 0x0c L3 miss, excl
    OP_LH | lvl(LVL_REM_RAM1) | level(LVLNUM_RAM) | REM | SNOOP_NONE_MISS, // 0x0d L3 miss, excl
    OP_LH | lvl(LVL_IO) | level(LVLNUM_NA) | snoop(SNOOP_NONE),  // 0x0e I/O
    OP_LH | lvl(LVL_UNC) | level(LVLNUM_NA) | snoop(SNOOP_NONE), // 0x0f uncached
];

/// `intel_pmu_pebs_data_source_nhm`.
pub const NHM_TABLE: [u64; 16] = {
    let mut t = SNB_TABLE;
    t[0x05] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HIT);
    t[0x06] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM);
    t[0x07] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM);
    t
};

/// `__intel_pmu_pebs_data_source_skl(pmem, ..)`.
pub const fn skl_table(pmem: bool) -> [u64; 16] {
    let pmem_or_l4 = if pmem { level(LVLNUM_PMEM) } else { level(LVLNUM_L4) };
    let mut t = SNB_TABLE;
    t[0x08] = OP_LH | pmem_or_l4 | snoop(SNOOP_HIT);
    t[0x09] = OP_LH | pmem_or_l4 | REM | snoop(SNOOP_HIT);
    t[0x0b] = OP_LH | level(LVLNUM_RAM) | REM | snoop(SNOOP_NONE);
    t[0x0c] = OP_LH | level(LVLNUM_ANY_CACHE) | REM | snoopx(SNOOPX_FWD);
    t[0x0d] = OP_LH | level(LVLNUM_ANY_CACHE) | REM | snoop(SNOOP_HITM);
    t
}

/// `__intel_pmu_pebs_data_source_grt`.
pub const GRT_TABLE: [u64; 16] = {
    let mut t = SNB_TABLE;
    t[0x05] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HIT);
    t[0x06] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM);
    t[0x08] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoopx(SNOOPX_FWD);
    t
};

/// `__intel_pmu_pebs_data_source_cmt`.
pub const CMT_TABLE: [u64; 16] = {
    let mut t = SNB_TABLE;
    t[0x07] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoopx(SNOOPX_FWD);
    t[0x08] = OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM);
    t[0x0a] = OP_LH | lvl(LVL_LOC_RAM) | level(LVLNUM_RAM) | snoop(SNOOP_NONE);
    t[0x0b] = OP_LH | level(LVLNUM_RAM) | REM | snoop(SNOOP_NONE);
    t[0x0c] = OP_LH | level(LVLNUM_RAM) | REM | snoopx(SNOOPX_FWD);
    t[0x0d] = OP_LH | level(LVLNUM_RAM) | REM | snoop(SNOOP_HITM);
    t
};

/// `lnc_pebs_data_source[]` (Lion Cove; entries past 0x11 are reserved, 0).
pub const LNC_TABLE: [u64; 0x12] = [
    p(OP_LOAD, OP_SHIFT) | lvl(LVL_MISS) | level(LVLNUM_L3) | snoop(SNOOP_NA), // 0x00 ukn L3
    OP_LH | lvl(LVL_L1) | level(LVLNUM_L1) | snoop(SNOOP_NONE),              // 0x01 L1 hit
    OP_LH | lvl(LVL_L1) | level(LVLNUM_L1) | snoop(SNOOP_NONE),              // 0x02 L1 hit
    OP_LH | lvl(LVL_LFB) | level(LVLNUM_LFB) | snoop(SNOOP_NONE),            // 0x03 LFB/L1 MHB
    0,                                                                        // 0x04 reserved
    OP_LH | lvl(LVL_L2) | level(LVLNUM_L2) | snoop(SNOOP_NONE),              // 0x05 L2 hit
    OP_LH | level(LVLNUM_L2_MHB) | snoop(SNOOP_NONE),                         // 0x06 L2 MHB hit
    0,                                                                        // 0x07 reserved
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_NONE),              // 0x08 L3 hit
    0,                                                                        // 0x09 reserved
    0,                                                                        // 0x0a reserved
    0,                                                                        // 0x0b reserved
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoopx(SNOOPX_FWD),             // 0x0c L3 hit fwd
    OP_LH | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM),              // 0x0d L3 hit hitm
    0,                                                                        // 0x0e reserved
    p(OP_LOAD, OP_SHIFT) | lvl(LVL_MISS) | lvl(LVL_L3) | level(LVLNUM_L3) | snoop(SNOOP_HITM), // 0x0f
    OP_LH | level(LVLNUM_MSC) | snoop(SNOOP_NONE),                            // 0x10 MSC hit
    OP_LH | lvl(LVL_LOC_RAM) | level(LVLNUM_RAM) | snoop(SNOOP_NONE),        // 0x11 local mem
];

const SKL_TABLE: [u64; 16] = skl_table(false);
const SKL_PMEM_TABLE: [u64; 16] = skl_table(true);

fn table16(fmt: PebsFormat) -> &'static [u64; 16] {
    match fmt.dse_table() {
        DseTable::Nehalem => &NHM_TABLE,
        DseTable::Skylake if fmt.has(PebsFormat::PMEM) => &SKL_PMEM_TABLE,
        DseTable::Skylake | DseTable::LionCove => &SKL_TABLE,
        DseTable::Gracemont => &GRT_TABLE,
        DseTable::Crestmont => &CMT_TABLE,
        DseTable::None | DseTable::SandyBridge => &SNB_TABLE,
    }
}

fn at16(t: &[u64; 16], i: u64) -> u64 {
    t.get((i & 0xf) as usize).copied().unwrap_or(0)
}

/// `pebs_set_tlb_lock`.
const fn tlb_lock(tlb_miss: bool, lock: bool) -> u64 {
    let t = if tlb_miss {
        p(TLB_MISS, TLB_SHIFT) | p(TLB_L2, TLB_SHIFT)
    } else {
        p(TLB_HIT, TLB_SHIFT) | p(TLB_L1, TLB_SHIFT) | p(TLB_L2, TLB_SHIFT)
    };
    if lock {
        t | p(LOCK_LOCKED, LOCK_SHIFT)
    } else {
        t
    }
}

const fn bit(v: u64, n: u32) -> bool {
    (v >> n) & 1 != 0
}

const OP_MASK: u64 = 0x1f;

fn with_op(v: u64, op: u64) -> u64 {
    (v & !(OP_MASK << OP_SHIFT)) | p(op, OP_SHIFT)
}

/// `load_latency_data`.
fn load_latency(fmt: PebsFormat, dse: u64) -> u64 {
    let mut val = at16(table16(fmt), dse);
    if fmt.has(PebsFormat::NO_TLB) {
        return val | p(TLB_NA, TLB_SHIFT) | p(LOCK_NA, LOCK_SHIFT);
    }
    val |= tlb_lock(bit(dse, 4), bit(dse, 5));
    if !fmt.has(PebsFormat::BLOCK) {
        return val | p(BLK_NA, BLK_SHIFT);
    }
    if bit(dse, 6) {
        val |= p(BLK_DATA, BLK_SHIFT);
    }
    if bit(dse, 7) {
        val |= p(BLK_ADDR, BLK_SHIFT);
    }
    if !bit(dse, 6) && !bit(dse, 7) {
        val |= p(BLK_NA, BLK_SHIFT);
    }
    val
}

/// `store_latency_data`.
fn store_latency(fmt: PebsFormat, dse: u64) -> u64 {
    let val = at16(table16(fmt), dse) | tlb_lock(bit(dse, 4), bit(dse, 5)) | p(BLK_NA, BLK_SHIFT);
    with_op(val, OP_STORE)
}

/// `__adl_latency_data_small(dse, tlb, lock, blk)`.
fn small_core(fmt: PebsFormat, dse: u64, tlb: bool, lock: bool, blk: bool) -> u64 {
    let val = at16(table16(fmt), dse) | tlb_lock(tlb, lock);
    val | if blk { p(BLK_DATA, BLK_SHIFT) } else { p(BLK_NA, BLK_SHIFT) }
}

/// `lnl_latency_data` for the P-core.
fn lion_cove(dse: u64, store: bool) -> u64 {
    let mut val = LNC_TABLE.get((dse & 0xff) as usize).copied().unwrap_or(0);
    if val == 0 {
        val = p(OP_LOAD, OP_SHIFT) | level(LVLNUM_NA) | snoop(SNOOP_NA);
    }
    val |= tlb_lock(bit(dse, 10), bit(dse, 11));
    if bit(dse, 12) {
        val |= p(BLK_DATA, BLK_SHIFT);
    }
    if bit(dse, 13) {
        val |= p(BLK_ADDR, BLK_SHIFT);
    }
    if !bit(dse, 12) && !bit(dse, 13) {
        val |= p(BLK_NA, BLK_SHIFT);
    }
    if store {
        with_op(val, OP_STORE)
    } else {
        val
    }
}

/// `precise_store_data`.
fn precise_store(dse: u64) -> u64 {
    let mut val =
        p(OP_STORE, OP_SHIFT) | snoop(SNOOP_NA) | lvl(LVL_L1) | p(TLB_L2, TLB_SHIFT);
    val |= if bit(dse, 4) { p(TLB_MISS, TLB_SHIFT) } else { p(TLB_HIT, TLB_SHIFT) };
    val |= if bit(dse, 0) { lvl(LVL_HIT) } else { lvl(LVL_MISS) };
    if bit(dse, 5) {
        val |= p(LOCK_LOCKED, LOCK_SHIFT);
    }
    val
}

/// `precise_datala_hsw`.
fn datala_hsw(dse: u64, store: bool) -> u64 {
    let mut val = with_op(MEM_NA, if store { OP_STORE } else { OP_LOAD });
    if store {
        let l = LVL_L1 | if bit(dse, 0) { LVL_HIT } else { LVL_MISS };
        val = (val & !(0x3fff << LVL_SHIFT)) | lvl(l);
    }
    val
}

/// The `perf_mem_data_src` value Linux reports for a PEBS data-source word `dse` of a
/// `kind` event on a CPU described by `fmt` (the dispatch of `get_data_src`).
pub fn intel_to_perf(fmt: PebsFormat, kind: DsrcKind, dse: u64) -> u64 {
    let table = fmt.dse_table();
    match kind {
        DsrcKind::None => MEM_NA,
        DsrcKind::PerfMemDataSrc => dse,
        DsrcKind::PreciseStore => precise_store(dse),
        DsrcKind::DataLaLoad => datala_hsw(dse, false),
        DsrcKind::DataLaStore => datala_hsw(dse, true),
        DsrcKind::LoadLatency | DsrcKind::StoreLatency => {
            let store = kind == DsrcKind::StoreLatency;
            match table {
                DseTable::Gracemont => small_core(fmt, dse, bit(dse, 5), bit(dse, 4), bit(dse, 6)),
                DseTable::Crestmont => small_core(fmt, dse, bit(dse, 6), bit(dse, 5), bit(dse, 7)),
                DseTable::LionCove => lion_cove(dse, store),
                _ if store => store_latency(fmt, dse),
                _ => load_latency(fmt, dse),
            }
        }
    }
}

/// The memory operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemOp {
    /// Not available.
    Unknown,
    /// Load.
    Load,
    /// Store.
    Store,
    /// Prefetch.
    Prefetch,
    /// Instruction fetch.
    Exec,
}

/// Where the access was served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemLevel {
    /// Not available.
    Unknown,
    /// L1 data cache.
    L1,
    /// Line fill buffer (L1 miss-handling buffer).
    Lfb,
    /// L2.
    L2,
    /// L2 miss-handling buffer.
    L2Mhb,
    /// L3 / LLC.
    L3,
    /// L4 (eDRAM).
    L4,
    /// Memory-side cache.
    MemSideCache,
    /// Some cache, level unknown.
    AnyCache,
    /// A cache in another socket/node.
    RemoteCache,
    /// Local DRAM.
    LocalDram,
    /// Remote DRAM.
    RemoteDram,
    /// Persistent memory.
    Pmem,
    /// CXL memory.
    Cxl,
    /// Memory-mapped I/O.
    Io,
    /// Uncached memory.
    Uncached,
}

/// Whether the level named was a hit or a miss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HitMiss {
    /// Not said.
    Unknown,
    /// Served there.
    Hit,
    /// Missed there (e.g. "L3 miss" with no further detail).
    Miss,
}

/// Snoop result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Snoop {
    /// Not available.
    Unknown,
    /// No snoop needed.
    None,
    /// Snoop hit (clean line in another core).
    Hit,
    /// Snoop miss.
    Miss,
    /// Either no snoop or a snoop miss (the encoding does not say).
    NoneOrMiss,
    /// Snoop hit modified (dirty line in another core: true/false sharing).
    HitM,
    /// Forwarded from another cache.
    Fwd,
    /// Transferred from a peer cache.
    Peer,
}

/// Data TLB outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tlb {
    /// Not available.
    Unknown,
    /// Hit in the L1 or second-level TLB.
    Hit,
    /// Missed the second-level TLB (page walk).
    Miss,
}

/// Locked access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lock {
    /// Not available.
    Unknown,
    /// Not locked.
    Unlocked,
    /// A locked (atomic) access.
    Locked,
}

/// Why a load was blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// Not available.
    Unknown,
    /// Store data could not be forwarded.
    Data,
    /// Possible address conflict with a preceding store.
    Addr,
    /// Both.
    DataAndAddr,
}

/// The common form every data source decodes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemAccess {
    /// Operation.
    pub op: MemOp,
    /// Level that served (or missed) the access.
    pub level: MemLevel,
    /// Hit or miss at `level`.
    pub hit: HitMiss,
    /// The data came from another socket/node.
    pub remote: bool,
    /// Snoop result.
    pub snoop: Snoop,
    /// TLB outcome.
    pub tlb: Tlb,
    /// Lock.
    pub lock: Lock,
    /// Store blocking.
    pub blocked: Blocked,
}

const fn field(v: u64, shift: u32, width: u32) -> u64 {
    (v >> shift) & ((1 << width) - 1)
}

impl MemAccess {
    /// Decodes a `perf_mem_data_src` value.
    pub fn from_perf(v: u64) -> MemAccess {
        let op = field(v, OP_SHIFT, 5);
        let lv = field(v, LVL_SHIFT, 14);
        let sn = field(v, SNOOP_SHIFT, 5);
        let lk = field(v, LOCK_SHIFT, 2);
        let tl = field(v, TLB_SHIFT, 7);
        let num = field(v, LVLNUM_SHIFT, 4);
        let remote = field(v, REMOTE_SHIFT, 1) != 0
            || lv & (LVL_REM_RAM1 | LVL_REM_RAM2 | LVL_REM_CCE1 | LVL_REM_CCE2) != 0;
        let sx = field(v, SNOOPX_SHIFT, 2);
        let blk = field(v, BLK_SHIFT, 3);

        let op = if op & OP_LOAD != 0 {
            MemOp::Load
        } else if op & OP_STORE != 0 {
            MemOp::Store
        } else if op & OP_PFETCH != 0 {
            MemOp::Prefetch
        } else if op & OP_EXEC != 0 {
            MemOp::Exec
        } else {
            MemOp::Unknown
        };

        let by_num = match num {
            LVLNUM_L1 | LVLNUM_L2 | LVLNUM_L3 | LVLNUM_L4 | LVLNUM_ANY_CACHE | LVLNUM_L2_MHB
            | LVLNUM_MSC | LVLNUM_LFB
                if remote =>
            {
                Some(MemLevel::RemoteCache)
            }
            LVLNUM_L1 => Some(MemLevel::L1),
            LVLNUM_L2 => Some(MemLevel::L2),
            LVLNUM_L3 => Some(MemLevel::L3),
            LVLNUM_L4 => Some(MemLevel::L4),
            LVLNUM_L2_MHB => Some(MemLevel::L2Mhb),
            LVLNUM_MSC => Some(MemLevel::MemSideCache),
            LVLNUM_UNC => Some(MemLevel::Uncached),
            LVLNUM_CXL => Some(MemLevel::Cxl),
            LVLNUM_IO => Some(MemLevel::Io),
            LVLNUM_ANY_CACHE => Some(MemLevel::AnyCache),
            LVLNUM_LFB => Some(MemLevel::Lfb),
            LVLNUM_RAM if remote => Some(MemLevel::RemoteDram),
            LVLNUM_RAM => Some(MemLevel::LocalDram),
            LVLNUM_PMEM => Some(MemLevel::Pmem),
            _ => None,
        };
        let level = if lv & (LVL_REM_RAM1 | LVL_REM_RAM2) != 0 {
            MemLevel::RemoteDram
        } else if lv & LVL_LOC_RAM != 0 {
            MemLevel::LocalDram
        } else if let Some(l) = by_num {
            l
        } else if lv & (LVL_REM_CCE1 | LVL_REM_CCE2) != 0 {
            MemLevel::RemoteCache
        } else if lv & LVL_L1 != 0 {
            MemLevel::L1
        } else if lv & LVL_LFB != 0 {
            MemLevel::Lfb
        } else if lv & LVL_L2 != 0 {
            MemLevel::L2
        } else if lv & LVL_L3 != 0 {
            MemLevel::L3
        } else if lv & LVL_IO != 0 {
            MemLevel::Io
        } else if lv & LVL_UNC != 0 {
            MemLevel::Uncached
        } else {
            MemLevel::Unknown
        };
        let hit = if lv & LVL_HIT != 0 {
            HitMiss::Hit
        } else if lv & LVL_MISS != 0 {
            HitMiss::Miss
        } else {
            HitMiss::Unknown
        };
        let snoop = if sn & SNOOP_HITM != 0 {
            Snoop::HitM
        } else if sx & SNOOPX_FWD != 0 {
            Snoop::Fwd
        } else if sx & SNOOPX_PEER != 0 {
            Snoop::Peer
        } else if sn & SNOOP_HIT != 0 {
            Snoop::Hit
        } else if sn & SNOOP_NONE != 0 && sn & SNOOP_MISS != 0 {
            Snoop::NoneOrMiss
        } else if sn & SNOOP_MISS != 0 {
            Snoop::Miss
        } else if sn & SNOOP_NONE != 0 {
            Snoop::None
        } else {
            Snoop::Unknown
        };
        let tlb = if tl & TLB_MISS != 0 {
            Tlb::Miss
        } else if tl & TLB_HIT != 0 {
            Tlb::Hit
        } else {
            Tlb::Unknown
        };
        // `pebs_set_tlb_lock` reports the lock only when set; the TLB bits show the
        // encoding carried lock information at all.
        let lock = if lk & LOCK_LOCKED != 0 {
            Lock::Locked
        } else if lk & LOCK_NA == 0 && tl & (TLB_HIT | TLB_MISS) != 0 {
            Lock::Unlocked
        } else {
            Lock::Unknown
        };
        let blocked = match (blk & BLK_DATA != 0, blk & BLK_ADDR != 0) {
            (true, true) => Blocked::DataAndAddr,
            (true, false) => Blocked::Data,
            (false, true) => Blocked::Addr,
            (false, false) => Blocked::Unknown,
        };
        MemAccess { op, level, hit, remote, snoop, tlb, lock, blocked }
    }

    /// Decodes a PEBS data-source word (see [`intel_to_perf`]).
    pub fn from_intel(fmt: PebsFormat, kind: DsrcKind, dse: u64) -> MemAccess {
        MemAccess::from_perf(intel_to_perf(fmt, kind, dse))
    }
}

impl MemOp {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            MemOp::Unknown => "na",
            MemOp::Load => "load",
            MemOp::Store => "store",
            MemOp::Prefetch => "prefetch",
            MemOp::Exec => "exec",
        }
    }
}

impl MemLevel {
    /// Short name, as shown in reports.
    pub const fn name(self) -> &'static str {
        match self {
            MemLevel::Unknown => "na",
            MemLevel::L1 => "L1",
            MemLevel::Lfb => "LFB",
            MemLevel::L2 => "L2",
            MemLevel::L2Mhb => "L2-MHB",
            MemLevel::L3 => "L3",
            MemLevel::L4 => "L4",
            MemLevel::MemSideCache => "MSC",
            MemLevel::AnyCache => "any-cache",
            MemLevel::RemoteCache => "remote-cache",
            MemLevel::LocalDram => "local-dram",
            MemLevel::RemoteDram => "remote-dram",
            MemLevel::Pmem => "pmem",
            MemLevel::Cxl => "cxl",
            MemLevel::Io => "io",
            MemLevel::Uncached => "uncached",
        }
    }
}

impl HitMiss {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            HitMiss::Unknown => "na",
            HitMiss::Hit => "hit",
            HitMiss::Miss => "miss",
        }
    }
}

impl Snoop {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Snoop::Unknown => "na",
            Snoop::None => "none",
            Snoop::Hit => "hit",
            Snoop::Miss => "miss",
            Snoop::NoneOrMiss => "none-or-miss",
            Snoop::HitM => "hitm",
            Snoop::Fwd => "fwd",
            Snoop::Peer => "peer",
        }
    }
}

impl Tlb {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Tlb::Unknown => "na",
            Tlb::Hit => "hit",
            Tlb::Miss => "miss",
        }
    }
}

impl Lock {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Lock::Unknown => "na",
            Lock::Unlocked => "no",
            Lock::Locked => "locked",
        }
    }
}

impl Blocked {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Blocked::Unknown => "na",
            Blocked::Data => "data",
            Blocked::Addr => "addr",
            Blocked::DataAndAddr => "data+addr",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Layout, PebsFormat};

    fn fmt(table: DseTable, bits: u32) -> PebsFormat {
        PebsFormat::new(3, bits, table)
    }

    #[test]
    fn snb_load_latency_levels() {
        let f = fmt(DseTable::SandyBridge, 0);
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x01);
        assert_eq!((a.op, a.level, a.hit, a.snoop), (MemOp::Load, MemLevel::L1, HitMiss::Hit, Snoop::None));
        assert_eq!((a.tlb, a.lock, a.blocked), (Tlb::Hit, Lock::Unlocked, Blocked::Unknown));
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x02);
        assert_eq!(a.level, MemLevel::Lfb);
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x07 | 1 << 4 | 1 << 5);
        assert_eq!((a.level, a.snoop, a.tlb, a.lock), (MemLevel::L3, Snoop::HitM, Tlb::Miss, Lock::Locked));
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x00);
        assert_eq!((a.level, a.hit, a.snoop), (MemLevel::L3, HitMiss::Miss, Snoop::Unknown));
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x08);
        assert_eq!((a.level, a.remote, a.snoop), (MemLevel::RemoteCache, true, Snoop::Hit));
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x0c);
        assert_eq!((a.level, a.remote, a.snoop), (MemLevel::LocalDram, false, Snoop::NoneOrMiss));
        let a = MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x0d);
        assert_eq!((a.level, a.remote), (MemLevel::RemoteDram, true));
        assert_eq!(MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x0e).level, MemLevel::Io);
        assert_eq!(MemAccess::from_intel(f, DsrcKind::LoadLatency, 0x0f).level, MemLevel::Uncached);
        // Exact perf value of 0x03 with no TLB miss, as ds.c computes it.
        let want = OP_LH | lvl(LVL_L2) | level(LVLNUM_L2) | snoop(SNOOP_NONE)
            | p(TLB_HIT | TLB_L1 | TLB_L2, TLB_SHIFT) | p(BLK_NA, BLK_SHIFT);
        assert_eq!(intel_to_perf(f, DsrcKind::LoadLatency, 0x03), want);
    }

    #[test]
    fn nhm_skl_and_block() {
        let nhm = fmt(DseTable::Nehalem, PebsFormat::NO_TLB);
        let a = MemAccess::from_intel(nhm, DsrcKind::LoadLatency, 0x05 | 1 << 4);
        assert_eq!((a.snoop, a.tlb, a.lock), (Snoop::Hit, Tlb::Unknown, Lock::Unknown));
        let skl = fmt(DseTable::Skylake, 0);
        assert_eq!(MemAccess::from_intel(skl, DsrcKind::LoadLatency, 0x08).level, MemLevel::L4);
        let a = MemAccess::from_intel(skl, DsrcKind::LoadLatency, 0x0d);
        assert_eq!((a.level, a.snoop), (MemLevel::RemoteCache, Snoop::HitM));
        let a = MemAccess::from_intel(skl, DsrcKind::LoadLatency, 0x0c);
        assert_eq!(a.snoop, Snoop::Fwd);
        assert_eq!(MemAccess::from_intel(skl, DsrcKind::LoadLatency, 0x0b).level, MemLevel::RemoteDram);
        let pmem = fmt(DseTable::Skylake, PebsFormat::PMEM | PebsFormat::BLOCK);
        let a = MemAccess::from_intel(pmem, DsrcKind::LoadLatency, 0x09 | 1 << 6 | 1 << 7);
        assert_eq!((a.level, a.remote, a.blocked), (MemLevel::Pmem, true, Blocked::DataAndAddr));
        let st = MemAccess::from_intel(skl, DsrcKind::StoreLatency, 0x01 | 1 << 4);
        assert_eq!((st.op, st.level, st.tlb), (MemOp::Store, MemLevel::L1, Tlb::Miss));
    }

    #[test]
    fn small_cores_and_lion_cove() {
        // Gracemont: bit 4 is the lock, bit 5 the TLB miss.
        let grt = fmt(DseTable::Gracemont, 0);
        let a = MemAccess::from_intel(grt, DsrcKind::LoadLatency, 0x08 | 1 << 4);
        assert_eq!((a.level, a.snoop, a.lock, a.tlb), (MemLevel::L3, Snoop::Fwd, Lock::Locked, Tlb::Hit));
        let a = MemAccess::from_intel(grt, DsrcKind::LoadLatency, 0x01 | 1 << 5 | 1 << 6);
        assert_eq!((a.lock, a.tlb, a.blocked), (Lock::Unlocked, Tlb::Miss, Blocked::Data));
        // Crestmont: 5-bit source, bit 5 lock, bit 6 TLB, bit 7 fwd block.
        let cmt = fmt(DseTable::Crestmont, 0);
        let a = MemAccess::from_intel(cmt, DsrcKind::LoadLatency, 0x0c | 1 << 6);
        assert_eq!((a.level, a.remote, a.snoop, a.tlb), (MemLevel::RemoteDram, true, Snoop::Fwd, Tlb::Miss));
        // Lion Cove: 8-bit source; STLB miss bit 10, lock bit 11.
        let lnc = fmt(DseTable::LionCove, 0);
        let a = MemAccess::from_intel(lnc, DsrcKind::LoadLatency, 0x06 | 1 << 10 | 1 << 11);
        assert_eq!((a.level, a.tlb, a.lock), (MemLevel::L2Mhb, Tlb::Miss, Lock::Locked));
        assert_eq!(MemAccess::from_intel(lnc, DsrcKind::LoadLatency, 0x10).level, MemLevel::MemSideCache);
        assert_eq!(MemAccess::from_intel(lnc, DsrcKind::LoadLatency, 0x11).level, MemLevel::LocalDram);
        let r = MemAccess::from_intel(lnc, DsrcKind::LoadLatency, 0x04);
        assert_eq!((r.op, r.level), (MemOp::Load, MemLevel::Unknown));
        assert_eq!(MemAccess::from_intel(lnc, DsrcKind::StoreLatency, 0x05).op, MemOp::Store);
    }

    #[test]
    fn stores_and_perf_values() {
        let a = MemAccess::from_intel(PebsFormat::default(), DsrcKind::PreciseStore, 0x01 | 1 << 5);
        assert_eq!((a.op, a.level, a.hit, a.tlb, a.lock), (MemOp::Store, MemLevel::L1, HitMiss::Hit, Tlb::Hit, Lock::Locked));
        let a = MemAccess::from_intel(PebsFormat::default(), DsrcKind::DataLaStore, 0);
        assert_eq!((a.op, a.level, a.hit), (MemOp::Store, MemLevel::L1, HitMiss::Miss));
        let a = MemAccess::from_intel(PebsFormat::default(), DsrcKind::DataLaLoad, 1);
        assert_eq!((a.op, a.level, a.tlb), (MemOp::Load, MemLevel::Unknown, Tlb::Unknown));
        let na = MemAccess::from_perf(MEM_NA);
        assert_eq!((na.op, na.level, na.snoop, na.tlb, na.lock), (MemOp::Unknown, MemLevel::Unknown, Snoop::Unknown, Tlb::Unknown, Lock::Unknown));
        // A perf-sourced value goes through unchanged.
        let v = OP_LH | lvl(LVL_L2) | level(LVLNUM_L2);
        assert_eq!(intel_to_perf(PebsFormat::simulated(Layout::Adaptive, DseTable::None), DsrcKind::PerfMemDataSrc, v), v);
        let a = MemAccess::from_perf(p(OP_STORE, OP_SHIFT) | level(LVLNUM_CXL) | snoopx(SNOOPX_PEER));
        assert_eq!((a.op, a.level, a.snoop), (MemOp::Store, MemLevel::Cxl, Snoop::Peer));
        assert_eq!(MemLevel::RemoteDram.name(), "remote-dram");
    }

    #[test]
    fn every_encoding_decodes() {
        for t in 0..8 {
            let f = PebsFormat::new(4, PebsFormat::BLOCK, DseTable::from_id(t));
            for k in 0..8 {
                for dse in (0..0x4000u64).step_by(7) {
                    let _ = MemAccess::from_intel(f, DsrcKind::from_id(k), dse);
                }
                let _ = MemAccess::from_intel(f, DsrcKind::from_id(k), u64::MAX);
            }
        }
    }
}
