//! Decoder plugin for the zero-copy PEBS format: `libhrperf_decode_pebs.so`.
//!
//! Implements the plugin ABI of [`hrperf_abi::plugin`]: one exported entry,
//! [`hrperf_decoder_plugin`], returning a static [`PluginDecl`] with five record kinds,
//! one per hardware layout (`RecordType::PEBS_BASE + 0..=4`: `pebs_core`, `pebs_nhm`,
//! `pebs_hsw`, `pebs_skl`, `pebs_adaptive`), all with the same fields. The capture record
//! layout is [`hrperf_fmt_pebs::record`]; the same records come from the kernel module,
//! the simulator and perf (`source`). Fields, in order (names are stable: JSON keys and
//! CSV columns); a field the record does not have is absent:
//!
//! | field | kind | meaning |
//! |---|---|---|
//! | `cpu` | U64 | CPU whose DS area held the record |
//! | `time_ns` | TIME | sample time (perf-sourced or simulated records that carry one) |
//! | `tsc` | U64 | TSC at the PEBS assist (fmt3, adaptive) |
//! | `ip` | HEX | the record's IP (legacy: trap-like next IP; adaptive: eventing IP) |
//! | `eventing_ip` | HEX | the instruction that caused the event (fmt2+, adaptive) |
//! | `data_addr` | HEX | data linear address |
//! | `latency` | U64 | load latency in core cycles (cache latency on CPUs that split it) |
//! | `instr_latency` | U64 | instruction latency (Alder Lake / Sapphire Rapids and later) |
//! | `data_source` | HEX | the raw data-source word |
//! | `mem_op` | STR | `load`, `store`, `prefetch`, `exec`, `na` |
//! | `mem_level` | STR | `L1`, `LFB`, `L2`, `L2-MHB`, `L3`, `L4`, `MSC`, `any-cache`, `remote-cache`, `local-dram`, `remote-dram`, `pmem`, `cxl`, `io`, `uncached`, `na` |
//! | `mem_hit` | STR | `hit`, `miss`, `na` at `mem_level` |
//! | `mem_remote` | U64 | 1 if served from another node/socket |
//! | `mem_snoop` | STR | `none`, `hit`, `miss`, `none-or-miss`, `hitm`, `fwd`, `peer`, `na` |
//! | `mem_tlb` | STR | `hit`, `miss`, `na` |
//! | `mem_lock` | STR | `locked`, `no`, `na` |
//! | `mem_blocked` | STR | `data`, `addr`, `data+addr`, `na` |
//! | `applicable_counters` | HEX | counters the record applies to (bit i GP i, 32+j fixed j) |
//! | `tsx_tuning` | HEX | TSX abort information (fmt2+, adaptive meminfo) |
//! | `retire_latency` | U64 | adaptive retire latency (CPUs with `pebs_timing_info`) |
//! | `regs` | HEX_LIST | flags, ip, ax, bx, cx, dx, si, di, bp, sp, r8..r15 (always this order) |
//! | `xmm` | HEX_LIST | xmm0..15, low then high word each |
//! | `lbr` | HEX_LIST | from, to, info per LBR entry, most recent first |
//! | `lbr_count` | U64 | LBR entries |
//! | `layout` | STR | `core`, `nhm`, `hsw`, `skl`, `adaptive` |
//! | `pebs_format` | HEX | the `PebsFormat` word (record format, capability bits, data-source table) |
//! | `source` | STR | `hw`, `sim` or `perf` |
//!
//! `regs` points at a per-thread copy (the adaptive group stores registers in another
//! order), valid until the next `decode` call on the same thread; every other pointer
//! points into the record or at static strings. Decoding never panics on any bytes:
//! every access goes through [`hrperf_fmt_pebs::record::parse`], which checks sizes.

use core::cell::Cell;

use hrperf_abi::plugin::{
    c_name, decode_entry,
    DecodeCtx, FieldDesc, FieldValue, PluginDecl, RecordKindDesc, DECODE_EMALFORMED,
    DECODE_ESPACE, DECODE_ETRUNCATED, DECODE_EUNKNOWN, FIELD_HEX, FIELD_HEX_LIST,
    FIELD_STR, FIELD_TIME, FIELD_U64, PLUGIN_ABI_VERSION,
};
use hrperf_fmt_pebs::datasrc::{DsrcKind, MemAccess};
use hrperf_fmt_pebs::layout::{Layout, PebsFormat, GPR_WORDS};
use hrperf_fmt_pebs::record::{self, ParseError, FL_PERF_SOURCED, FL_SIMULATED, FL_TIME};
use hrperf_fmt_pebs::{PEBS_UUID, PEBS_VERSION};

/// Format version this decoder understands.
pub const FORMAT_VERSION: u32 = PEBS_VERSION;

/// Index of each field in [`FIELDS`].
pub mod idx {
    /// `cpu`.
    pub const CPU: usize = 0;
    /// `time_ns`.
    pub const TIME_NS: usize = 1;
    /// `tsc`.
    pub const TSC: usize = 2;
    /// `ip`.
    pub const IP: usize = 3;
    /// `eventing_ip`.
    pub const EVENTING_IP: usize = 4;
    /// `data_addr`.
    pub const DATA_ADDR: usize = 5;
    /// `latency`.
    pub const LATENCY: usize = 6;
    /// `instr_latency`.
    pub const INSTR_LATENCY: usize = 7;
    /// `data_source`.
    pub const DATA_SOURCE: usize = 8;
    /// `mem_op`.
    pub const MEM_OP: usize = 9;
    /// `mem_level`.
    pub const MEM_LEVEL: usize = 10;
    /// `mem_hit`.
    pub const MEM_HIT: usize = 11;
    /// `mem_remote`.
    pub const MEM_REMOTE: usize = 12;
    /// `mem_snoop`.
    pub const MEM_SNOOP: usize = 13;
    /// `mem_tlb`.
    pub const MEM_TLB: usize = 14;
    /// `mem_lock`.
    pub const MEM_LOCK: usize = 15;
    /// `mem_blocked`.
    pub const MEM_BLOCKED: usize = 16;
    /// `applicable_counters`.
    pub const APPLICABLE: usize = 17;
    /// `tsx_tuning`.
    pub const TSX_TUNING: usize = 18;
    /// `retire_latency`.
    pub const RETIRE_LATENCY: usize = 19;
    /// `regs`.
    pub const REGS: usize = 20;
    /// `xmm`.
    pub const XMM: usize = 21;
    /// `lbr`.
    pub const LBR: usize = 22;
    /// `lbr_count`.
    pub const LBR_COUNT: usize = 23;
    /// `layout`.
    pub const LAYOUT: usize = 24;
    /// `pebs_format`.
    pub const PEBS_FORMAT: usize = 25;
    /// `source`.
    pub const SOURCE: usize = 26;
    /// Number of fields.
    pub const N: usize = 27;
}

/// The fields of every PEBS kind, in decode order.
pub static FIELDS: [FieldDesc; idx::N] = [
    FieldDesc::new(b"cpu\0", FIELD_U64),
    FieldDesc::new(b"time_ns\0", FIELD_TIME),
    FieldDesc::new(b"tsc\0", FIELD_U64),
    FieldDesc::new(b"ip\0", FIELD_HEX),
    FieldDesc::new(b"eventing_ip\0", FIELD_HEX),
    FieldDesc::new(b"data_addr\0", FIELD_HEX),
    FieldDesc::new(b"latency\0", FIELD_U64),
    FieldDesc::new(b"instr_latency\0", FIELD_U64),
    FieldDesc::new(b"data_source\0", FIELD_HEX),
    FieldDesc::new(b"mem_op\0", FIELD_STR),
    FieldDesc::new(b"mem_level\0", FIELD_STR),
    FieldDesc::new(b"mem_hit\0", FIELD_STR),
    FieldDesc::new(b"mem_remote\0", FIELD_U64),
    FieldDesc::new(b"mem_snoop\0", FIELD_STR),
    FieldDesc::new(b"mem_tlb\0", FIELD_STR),
    FieldDesc::new(b"mem_lock\0", FIELD_STR),
    FieldDesc::new(b"mem_blocked\0", FIELD_STR),
    FieldDesc::new(b"applicable_counters\0", FIELD_HEX),
    FieldDesc::new(b"tsx_tuning\0", FIELD_HEX),
    FieldDesc::new(b"retire_latency\0", FIELD_U64),
    FieldDesc::new(b"regs\0", FIELD_HEX_LIST),
    FieldDesc::new(b"xmm\0", FIELD_HEX_LIST),
    FieldDesc::new(b"lbr\0", FIELD_HEX_LIST),
    FieldDesc::new(b"lbr_count\0", FIELD_U64),
    FieldDesc::new(b"layout\0", FIELD_STR),
    FieldDesc::new(b"pebs_format\0", FIELD_HEX),
    FieldDesc::new(b"source\0", FIELD_STR),
];

const fn kind(layout: Layout, name: &'static [u8]) -> RecordKindDesc {
    RecordKindDesc {
        record_type: record::record_type(layout).0,
        nr_fields: idx::N as u32,
        name: c_name(name),
        fields: FIELDS.as_ptr(),
    }
}

/// The record kinds, indexed by layout id.
pub static KINDS: [RecordKindDesc; 5] = [
    kind(Layout::Core, b"pebs_core\0"),
    kind(Layout::Nehalem, b"pebs_nhm\0"),
    kind(Layout::Haswell, b"pebs_hsw\0"),
    kind(Layout::Skylake, b"pebs_skl\0"),
    kind(Layout::Adaptive, b"pebs_adaptive\0"),
];

/// The declaration [`hrperf_decoder_plugin`] returns.
pub static DECL: PluginDecl = PluginDecl {
    abi_version: PLUGIN_ABI_VERSION,
    size: core::mem::size_of::<PluginDecl>() as u32,
    name: c_name(b"pebs\0"),
    description: c_name(b"PEBS records (fmt0..fmt5, zero-copy DS area): IPs, data addresses, latency, data source\0"),
    uuid: PEBS_UUID,
    format_version: FORMAT_VERSION,
    nr_kinds: KINDS.len() as u32,
    kinds: KINDS.as_ptr(),
    decode: Some(decode),
};

/// The plugin entry: returns the static declaration.
#[no_mangle]
pub extern "C" fn hrperf_decoder_plugin() -> *const PluginDecl {
    &DECL
}

thread_local! {
    /// The registers of the last decoded record, in canonical order.
    static REGS: Cell<[u64; GPR_WORDS]> = const { Cell::new([0; GPR_WORDS]) };
}

/// Decodes `rec` (one record, header included) into `out[..27]`, as the ABI's `decode`
/// does; returns the kind's index (the layout id) or a negative `DECODE_E*` code.
pub fn decode_record(rec: &[u8], out: &mut [FieldValue]) -> i32 {
    if out.len() < idx::N {
        return DECODE_ESPACE;
    }
    let c = match record::parse(rec) {
        Ok(c) => c,
        Err(ParseError::Truncated) => return DECODE_ETRUNCATED,
        Err(ParseError::WrongType(_)) => return DECODE_EUNKNOWN,
        Err(_) => return DECODE_EMALFORMED,
    };
    let p = c.pebs;
    let fmt: PebsFormat = c.prefix.pebs_format;
    let split_latency = fmt.has(PebsFormat::INSTR_LATENCY) && p.layout == Layout::Adaptive;
    out[idx::CPU] = FieldValue::int(FIELD_U64, c.prefix.cpu.into());
    out[idx::TIME_NS] = FieldValue::opt(FIELD_TIME, (c.prefix.flags & FL_TIME != 0).then_some(c.prefix.time_ns));
    out[idx::TSC] = FieldValue::opt(FIELD_U64, p.tsc);
    out[idx::IP] = FieldValue::int(FIELD_HEX, p.ip);
    out[idx::EVENTING_IP] = FieldValue::opt(FIELD_HEX, p.eventing_ip);
    out[idx::DATA_ADDR] = FieldValue::opt(FIELD_HEX, p.mem.map(|m| m.address));
    out[idx::LATENCY] = FieldValue::opt(
        FIELD_U64,
        p.mem.map(|m| if split_latency { (m.latency >> 32) & 0xffff } else { m.latency & 0xffff_ffff }),
    );
    out[idx::INSTR_LATENCY] = FieldValue::opt(FIELD_U64, p.mem.filter(|_| split_latency).map(|m| m.latency & 0xffff));
    out[idx::DATA_SOURCE] = FieldValue::opt(FIELD_HEX, p.mem.map(|m| m.data_source));
    let access = p
        .mem
        .filter(|_| c.dsrc_kind != DsrcKind::None)
        .map(|m| MemAccess::from_intel(fmt, c.dsrc_kind, m.data_source));
    match access {
        Some(a) => {
            out[idx::MEM_OP] = FieldValue::text(a.op.name());
            out[idx::MEM_LEVEL] = FieldValue::text(a.level.name());
            out[idx::MEM_HIT] = FieldValue::text(a.hit.name());
            out[idx::MEM_REMOTE] = FieldValue::int(FIELD_U64, a.remote.into());
            out[idx::MEM_SNOOP] = FieldValue::text(a.snoop.name());
            out[idx::MEM_TLB] = FieldValue::text(a.tlb.name());
            out[idx::MEM_LOCK] = FieldValue::text(a.lock.name());
            out[idx::MEM_BLOCKED] = FieldValue::text(a.blocked.name());
        }
        None => {
            for i in [idx::MEM_OP, idx::MEM_LEVEL, idx::MEM_HIT, idx::MEM_SNOOP, idx::MEM_TLB, idx::MEM_LOCK, idx::MEM_BLOCKED] {
                out[i] = FieldValue::absent(FIELD_STR);
            }
            out[idx::MEM_REMOTE] = FieldValue::absent(FIELD_U64);
        }
    }
    out[idx::APPLICABLE] = FieldValue::opt(FIELD_HEX, p.applicable_counters);
    out[idx::TSX_TUNING] = FieldValue::opt(FIELD_HEX, p.mem.and_then(|m| m.tsx_tuning));
    out[idx::RETIRE_LATENCY] = FieldValue::opt(
        FIELD_U64,
        (p.layout == Layout::Adaptive && fmt.has(PebsFormat::TIMING_INFO)).then_some(p.retire_latency.into()),
    );
    out[idx::REGS] = match p.regs {
        Some(g) => REGS.with(|r| {
            r.set(g.to_legacy());
            FieldValue { kind: FIELD_HEX_LIST, flags: 0, value: 0, ptr: r.as_ptr().cast(), len: GPR_WORDS as u64 }
        }),
        None => FieldValue::absent(FIELD_HEX_LIST),
    };
    out[idx::XMM] = match p.xmm_bytes() {
        Some(b) => FieldValue::hex_list(b),
        None => FieldValue::absent(FIELD_HEX_LIST),
    };
    out[idx::LBR] = if p.lbr_count() > 0 { FieldValue::hex_list(p.lbr_bytes()) } else { FieldValue::absent(FIELD_HEX_LIST) };
    out[idx::LBR_COUNT] = FieldValue::int(FIELD_U64, p.lbr_count() as u64);
    out[idx::LAYOUT] = FieldValue::text(p.layout.name());
    out[idx::PEBS_FORMAT] = FieldValue::int(FIELD_HEX, fmt.0.into());
    out[idx::SOURCE] = FieldValue::text(if c.prefix.flags & FL_PERF_SOURCED != 0 {
        "perf"
    } else if c.prefix.flags & FL_SIMULATED != 0 {
        "sim"
    } else {
        "hw"
    });
    p.layout.id() as i32
}

/// The ABI entry for decoding; see [`hrperf_abi::plugin::DecodeFn`].
///
/// # Safety
///
/// `ctx` is null or valid; `rec` is null or valid for `len` bytes; `out` is null or
/// valid for `out_cap` writable values, all for the duration of the call.
pub unsafe extern "C" fn decode(
    ctx: *const DecodeCtx,
    rec: *const u8,
    len: usize,
    out: *mut FieldValue,
    out_cap: u32,
) -> i32 {
    // SAFETY: this function's contract is decode_entry's.
    unsafe { decode_entry(ctx, rec, len, out, out_cap, decode_record) }
}

#[cfg(test)]
mod tests;
