//! Decoder plugin for the aggregating format: `libhrperf_decode_aggregate.so`.
//!
//! Implements the plugin ABI of [`hrperf_abi::plugin`]: one exported entry,
//! [`hrperf_decoder_plugin`], returning a static [`PluginDecl`] with three record kinds
//! whose layouts are [`hrperf_fmt_aggregate::record`]. Field names are stable (JSON keys,
//! CSV columns) and shared between kinds where they mean the same thing, so a table of
//! all rows lines up.
//!
//! `aggregate_interval` — one summary row per drained interval:
//!
//! | field | kind | meaning |
//! |---|---|---|
//! | `cpu`, `seq` | U64 | CPU and interval number on it |
//! | `interval_start`, `interval_end` | TIME | the interval's bounds |
//! | `key` | STR | `ip`, `pid_ip` or `stack` |
//! | `counter` | U64 | index of the summed counter |
//! | `samples` | U64 | samples counted in the interval |
//! | `entries`, `stacks` | U64 | entry and stack rows that follow |
//! | `other_count`, `other_sum` | U64 | the "other" bucket |
//! | `misses` | U64 | samples that went to "other" for lack of a slot |
//! | `sum_total` | U64 | all counter deltas of the interval |
//! | `stack_misses`, `stack_truncated`, `multi_wraps` | U64 | see the format |
//! | `closed_by` | STR | `auto`, `request`, `restart` (or empty) |
//! | `flags` | HEX | `IV_FL_*` |
//!
//! `aggregate_entry` — one row per key per interval: `cpu`, `seq`, `interval_start`,
//! `interval_end`, `key`, `pid` (absent for `ip` keys), `ip` (HEX, absent for `stack`
//! keys), `kstack_id`, `ustack_id` (absent unless `stack`), `count`, `sum`.
//!
//! `aggregate_stack` — one row per stored stack of an interval: `cpu`, `seq`,
//! `stack_id`, `stack` (STR `kernel`/`user`), `truncated` (0/1), `depth`, `frames`
//! (HEX_LIST, innermost first).
//!
//! The crate is also an `rlib`, so the host's tests can use [`DECL`] and
//! [`decode_record`] directly. Decoding never panics on any bytes: every access goes
//! through the format's parsers, which check sizes.

use hrperf_abi::plugin::{
    c_name,
    DecodeCtx, FieldDesc, FieldValue, PluginDecl, RecordKindDesc, DECODE_EMALFORMED,
    DECODE_ESPACE, DECODE_ETRUNCATED, DECODE_EUNKNOWN, FIELD_HEX, FIELD_HEX_LIST,
    FIELD_STR, FIELD_TIME, FIELD_U64, PLUGIN_ABI_VERSION,
};
use hrperf_fmt_aggregate::record::{
    self, ParseError, IV_FL_CLOSED_AUTO, IV_FL_CLOSED_REQUEST, IV_FL_CLOSED_RESTART, KEY_IP,
    KEY_STACK, REC_ENTRY, REC_INTERVAL, REC_STACK, STACK_FL_KERNEL, STACK_FL_TRUNCATED,
};

/// Format version this decoder understands: 1.0.
pub const FORMAT_VERSION: u32 = 1 << 16;

/// Index of each `aggregate_interval` field in [`INTERVAL_FIELDS`].
pub mod iv {
    /// `cpu`.
    pub const CPU: usize = 0;
    /// `seq`.
    pub const SEQ: usize = 1;
    /// `interval_start`.
    pub const START: usize = 2;
    /// `interval_end`.
    pub const END: usize = 3;
    /// `key`.
    pub const KEY: usize = 4;
    /// `counter`.
    pub const COUNTER: usize = 5;
    /// `samples`.
    pub const SAMPLES: usize = 6;
    /// `entries`.
    pub const ENTRIES: usize = 7;
    /// `stacks`.
    pub const STACKS: usize = 8;
    /// `other_count`.
    pub const OTHER_COUNT: usize = 9;
    /// `other_sum`.
    pub const OTHER_SUM: usize = 10;
    /// `misses`.
    pub const MISSES: usize = 11;
    /// `sum_total`.
    pub const SUM_TOTAL: usize = 12;
    /// `stack_misses`.
    pub const STACK_MISSES: usize = 13;
    /// `stack_truncated`.
    pub const STACK_TRUNCATED: usize = 14;
    /// `multi_wraps`.
    pub const MULTI_WRAPS: usize = 15;
    /// `closed_by`.
    pub const CLOSED_BY: usize = 16;
    /// `flags`.
    pub const FLAGS: usize = 17;
    /// Number of fields.
    pub const N: usize = 18;
}

/// Index of each `aggregate_entry` field in [`ENTRY_FIELDS`].
pub mod en {
    /// `cpu`.
    pub const CPU: usize = 0;
    /// `seq`.
    pub const SEQ: usize = 1;
    /// `interval_start`.
    pub const START: usize = 2;
    /// `interval_end`.
    pub const END: usize = 3;
    /// `key`.
    pub const KEY: usize = 4;
    /// `pid`.
    pub const PID: usize = 5;
    /// `ip`.
    pub const IP: usize = 6;
    /// `kstack_id`.
    pub const KSTACK: usize = 7;
    /// `ustack_id`.
    pub const USTACK: usize = 8;
    /// `count`.
    pub const COUNT: usize = 9;
    /// `sum`.
    pub const SUM: usize = 10;
    /// Number of fields.
    pub const N: usize = 11;
}

/// Index of each `aggregate_stack` field in [`STACK_FIELDS`].
pub mod st {
    /// `cpu`.
    pub const CPU: usize = 0;
    /// `seq`.
    pub const SEQ: usize = 1;
    /// `stack_id`.
    pub const ID: usize = 2;
    /// `stack`.
    pub const KIND: usize = 3;
    /// `truncated`.
    pub const TRUNCATED: usize = 4;
    /// `depth`.
    pub const DEPTH: usize = 5;
    /// `frames`.
    pub const FRAMES: usize = 6;
    /// Number of fields.
    pub const N: usize = 7;
}

/// The `aggregate_interval` kind's fields, in decode order.
pub static INTERVAL_FIELDS: [FieldDesc; iv::N] = [
    FieldDesc::new(b"cpu\0", FIELD_U64),
    FieldDesc::new(b"seq\0", FIELD_U64),
    FieldDesc::new(b"interval_start\0", FIELD_TIME),
    FieldDesc::new(b"interval_end\0", FIELD_TIME),
    FieldDesc::new(b"key\0", FIELD_STR),
    FieldDesc::new(b"counter\0", FIELD_U64),
    FieldDesc::new(b"samples\0", FIELD_U64),
    FieldDesc::new(b"entries\0", FIELD_U64),
    FieldDesc::new(b"stacks\0", FIELD_U64),
    FieldDesc::new(b"other_count\0", FIELD_U64),
    FieldDesc::new(b"other_sum\0", FIELD_U64),
    FieldDesc::new(b"misses\0", FIELD_U64),
    FieldDesc::new(b"sum_total\0", FIELD_U64),
    FieldDesc::new(b"stack_misses\0", FIELD_U64),
    FieldDesc::new(b"stack_truncated\0", FIELD_U64),
    FieldDesc::new(b"multi_wraps\0", FIELD_U64),
    FieldDesc::new(b"closed_by\0", FIELD_STR),
    FieldDesc::new(b"flags\0", FIELD_HEX),
];

/// The `aggregate_entry` kind's fields, in decode order.
pub static ENTRY_FIELDS: [FieldDesc; en::N] = [
    FieldDesc::new(b"cpu\0", FIELD_U64),
    FieldDesc::new(b"seq\0", FIELD_U64),
    FieldDesc::new(b"interval_start\0", FIELD_TIME),
    FieldDesc::new(b"interval_end\0", FIELD_TIME),
    FieldDesc::new(b"key\0", FIELD_STR),
    FieldDesc::new(b"pid\0", FIELD_U64),
    FieldDesc::new(b"ip\0", FIELD_HEX),
    FieldDesc::new(b"kstack_id\0", FIELD_U64),
    FieldDesc::new(b"ustack_id\0", FIELD_U64),
    FieldDesc::new(b"count\0", FIELD_U64),
    FieldDesc::new(b"sum\0", FIELD_U64),
];

/// The `aggregate_stack` kind's fields, in decode order.
pub static STACK_FIELDS: [FieldDesc; st::N] = [
    FieldDesc::new(b"cpu\0", FIELD_U64),
    FieldDesc::new(b"seq\0", FIELD_U64),
    FieldDesc::new(b"stack_id\0", FIELD_U64),
    FieldDesc::new(b"stack\0", FIELD_STR),
    FieldDesc::new(b"truncated\0", FIELD_U64),
    FieldDesc::new(b"depth\0", FIELD_U64),
    FieldDesc::new(b"frames\0", FIELD_HEX_LIST),
];

/// Index of `aggregate_interval` in [`KINDS`].
pub const KIND_INTERVAL: i32 = 0;
/// Index of `aggregate_entry` in [`KINDS`].
pub const KIND_ENTRY: i32 = 1;
/// Index of `aggregate_stack` in [`KINDS`].
pub const KIND_STACK: i32 = 2;

/// The record kinds this plugin decodes.
pub static KINDS: [RecordKindDesc; 3] = [
    RecordKindDesc {
        record_type: REC_INTERVAL.0,
        nr_fields: iv::N as u32,
        name: c_name(b"aggregate_interval\0"),
        fields: INTERVAL_FIELDS.as_ptr(),
    },
    RecordKindDesc {
        record_type: REC_ENTRY.0,
        nr_fields: en::N as u32,
        name: c_name(b"aggregate_entry\0"),
        fields: ENTRY_FIELDS.as_ptr(),
    },
    RecordKindDesc {
        record_type: REC_STACK.0,
        nr_fields: st::N as u32,
        name: c_name(b"aggregate_stack\0"),
        fields: STACK_FIELDS.as_ptr(),
    },
];

/// The declaration [`hrperf_decoder_plugin`] returns.
pub static DECL: PluginDecl = PluginDecl {
    abi_version: PLUGIN_ABI_VERSION,
    size: core::mem::size_of::<PluginDecl>() as u32,
    name: c_name(b"aggregate\0"),
    description: c_name(
        b"per-CPU, per-interval sample counts and counter sums per key (ip, pid+ip or stacks)\0",
    ),
    uuid: hrperf_fmt_aggregate::AGGREGATE_UUID,
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

fn closed_by(flags: u32) -> &'static str {
    if flags & IV_FL_CLOSED_AUTO != 0 {
        "auto"
    } else if flags & IV_FL_CLOSED_REQUEST != 0 {
        "request"
    } else if flags & IV_FL_CLOSED_RESTART != 0 {
        "restart"
    } else {
        ""
    }
}

fn code(e: ParseError) -> i32 {
    match e {
        ParseError::Truncated => DECODE_ETRUNCATED,
        ParseError::WrongType(_) => DECODE_EUNKNOWN,
        _ => DECODE_EMALFORMED,
    }
}

/// Decodes `rec` (one record, header included) into `out`, as the ABI's `decode` does;
/// returns the kind's index in [`KINDS`] or a negative `DECODE_E*` code.
///
/// `key`, `closed_by` and `stack` point at static strings; `frames` points into `rec`
/// (unaligned `u64`s), so it lives as long as `rec`.
pub fn decode_record(rec: &[u8], out: &mut [FieldValue]) -> i32 {
    let h = match record::header(rec) {
        Ok(h) => h,
        Err(e) => return code(e),
    };
    let (kind, need) = match h.kind {
        k if k == REC_INTERVAL => (KIND_INTERVAL, iv::N),
        k if k == REC_ENTRY => (KIND_ENTRY, en::N),
        k if k == REC_STACK => (KIND_STACK, st::N),
        _ => return DECODE_EUNKNOWN,
    };
    let Some(out) = out.get_mut(..need) else {
        return DECODE_ESPACE;
    };
    let res = match kind {
        KIND_INTERVAL => decode_interval(rec, out),
        KIND_ENTRY => decode_entry(rec, out),
        _ => decode_stack(rec, out),
    };
    match res {
        Ok(()) => kind,
        Err(e) => code(e),
    }
}

fn decode_interval(rec: &[u8], out: &mut [FieldValue]) -> Result<(), ParseError> {
    let r = record::parse_interval(rec)?;
    let vals = [
        FieldValue::int(FIELD_U64, r.cpu.into()),
        FieldValue::int(FIELD_U64, r.seq),
        FieldValue::int(FIELD_TIME, r.start_ns),
        FieldValue::int(FIELD_TIME, r.end_ns),
        FieldValue::text(record::key_name(r.key_kind)),
        FieldValue::int(FIELD_U64, r.counter.into()),
        FieldValue::int(FIELD_U64, r.samples),
        FieldValue::int(FIELD_U64, r.entries),
        FieldValue::int(FIELD_U64, r.stacks),
        FieldValue::int(FIELD_U64, r.other_count),
        FieldValue::int(FIELD_U64, r.other_sum),
        FieldValue::int(FIELD_U64, r.misses),
        FieldValue::int(FIELD_U64, r.sum_total),
        FieldValue::int(FIELD_U64, r.stack_misses),
        FieldValue::int(FIELD_U64, r.stack_truncated),
        FieldValue::int(FIELD_U64, r.multi_wraps),
        FieldValue::text(closed_by(r.flags)),
        FieldValue::int(FIELD_HEX, r.flags.into()),
    ];
    for (o, v) in out.iter_mut().zip(vals) {
        *o = v;
    }
    Ok(())
}

fn decode_entry(rec: &[u8], out: &mut [FieldValue]) -> Result<(), ParseError> {
    let r = record::parse_entry(rec)?;
    let stack = r.key_kind == KEY_STACK;
    let vals = [
        FieldValue::int(FIELD_U64, r.cpu.into()),
        FieldValue::int(FIELD_U64, r.seq),
        FieldValue::int(FIELD_TIME, r.start_ns),
        FieldValue::int(FIELD_TIME, r.end_ns),
        FieldValue::text(record::key_name(r.key_kind)),
        if r.key_kind == KEY_IP {
            FieldValue::absent(FIELD_U64)
        } else {
            FieldValue::int(FIELD_U64, r.pid.into())
        },
        if stack {
            FieldValue::absent(FIELD_HEX)
        } else {
            FieldValue::int(FIELD_HEX, r.ip)
        },
        if stack {
            FieldValue::int(FIELD_U64, r.kstack_id.into())
        } else {
            FieldValue::absent(FIELD_U64)
        },
        if stack {
            FieldValue::int(FIELD_U64, r.ustack_id.into())
        } else {
            FieldValue::absent(FIELD_U64)
        },
        FieldValue::int(FIELD_U64, r.count),
        FieldValue::int(FIELD_U64, r.sum),
    ];
    for (o, v) in out.iter_mut().zip(vals) {
        *o = v;
    }
    Ok(())
}

fn decode_stack(rec: &[u8], out: &mut [FieldValue]) -> Result<(), ParseError> {
    let (r, frames) = record::parse_stack(rec)?;
    let vals = [
        FieldValue::int(FIELD_U64, r.cpu.into()),
        FieldValue::int(FIELD_U64, r.seq),
        FieldValue::int(FIELD_U64, r.stack_id.into()),
        FieldValue::text(if r.flags & STACK_FL_KERNEL != 0 {
            "kernel"
        } else {
            "user"
        }),
        FieldValue::int(FIELD_U64, u64::from(r.flags & STACK_FL_TRUNCATED != 0)),
        FieldValue::int(FIELD_U64, r.depth.into()),
        FieldValue {
            kind: FIELD_HEX_LIST,
            flags: 0,
            value: 0,
            ptr: frames.as_ptr(),
            len: (frames.len() / 8) as u64,
        },
    ];
    for (o, v) in out.iter_mut().zip(vals) {
        *o = v;
    }
    Ok(())
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
    unsafe { hrperf_abi::plugin::decode_entry(ctx, rec, len, out, out_cap, decode_record) }
}

#[cfg(test)]
mod tests;
