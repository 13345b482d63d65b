//! Decoder plugin for the call-stack format: `libhrperf_decode_llc_stack.so`.
//!
//! One record kind, `stack` (`hrperf_fmt_llc_stack::record::STACK_SAMPLE`). Fields, in
//! order (names are stable: they are JSON keys and CSV columns):
//!
//! | field | kind | meaning |
//! |---|---|---|
//! | `cpu` | U64 | CPU the sample was taken on |
//! | `time_ns` | TIME | sample time, in the capture's clock |
//! | `pid`, `tid` | U64 | process and thread |
//! | `comm` | STR | the task's command name (empty if the source had none) |
//! | `ip` | HEX | interrupted IP |
//! | `mode` | STR | `kernel` or `user`: where the IP is |
//! | `addr` | HEX | data address; absent when the source gave none |
//! | `weight` | U64 | events the record stands for (the sample period, or a count) |
//! | `kernel_stack` | HEX_LIST | kernel frames, innermost first |
//! | `user_stack` | HEX_LIST | user frames, innermost first |
//! | `truncated` | STR | which stacks were cut at their depth limit: `kernel`, `user`, `kernel+user` or empty |
//! | `flags` | HEX | the record's `STK_*` flags |
//!
//! Addresses are raw; `hrperf report` symbolizes them. Decoding never panics on any
//! bytes: everything goes through `StackRecord::parse`, which checks sizes.

use hrperf_abi::plugin::{
    c_name, decode_entry, DecodeCtx, FieldDesc, FieldValue, PluginDecl, RecordKindDesc, DECODE_EMALFORMED,
    DECODE_ESPACE, DECODE_ETRUNCATED, DECODE_EUNKNOWN, FIELD_HEX, FIELD_HEX_LIST, FIELD_STR,
    FIELD_TIME, FIELD_U64, PLUGIN_ABI_VERSION,
};
use hrperf_fmt_llc_stack::record::{
    ParseError, StackRecord, FIXED_SIZE, STACK_SAMPLE, STK_KERNEL_IP, STK_KERNEL_TRUNCATED, STK_USER_TRUNCATED,
};
use hrperf_fmt_llc_stack::{LLC_STACK_UUID, LLC_STACK_VERSION};

/// Format version this decoder understands.
pub const FORMAT_VERSION: u32 = LLC_STACK_VERSION;

/// Index of each field in [`FIELDS`].
mod idx {
    pub const CPU: usize = 0;
    pub const TIME_NS: usize = 1;
    pub const PID: usize = 2;
    pub const TID: usize = 3;
    pub const COMM: usize = 4;
    pub const IP: usize = 5;
    pub const MODE: usize = 6;
    pub const ADDR: usize = 7;
    pub const WEIGHT: usize = 8;
    pub const KERNEL_STACK: usize = 9;
    pub const USER_STACK: usize = 10;
    pub const TRUNCATED: usize = 11;
    pub const FLAGS: usize = 12;
    pub const N: usize = 13;
}

/// The `stack` kind's fields, in decode order.
pub static FIELDS: [FieldDesc; idx::N] = [
    FieldDesc::new(b"cpu\0", FIELD_U64),
    FieldDesc::new(b"time_ns\0", FIELD_TIME),
    FieldDesc::new(b"pid\0", FIELD_U64),
    FieldDesc::new(b"tid\0", FIELD_U64),
    FieldDesc::new(b"comm\0", FIELD_STR),
    FieldDesc::new(b"ip\0", FIELD_HEX),
    FieldDesc::new(b"mode\0", FIELD_STR),
    FieldDesc::new(b"addr\0", FIELD_HEX),
    FieldDesc::new(b"weight\0", FIELD_U64),
    FieldDesc::new(b"kernel_stack\0", FIELD_HEX_LIST),
    FieldDesc::new(b"user_stack\0", FIELD_HEX_LIST),
    FieldDesc::new(b"truncated\0", FIELD_STR),
    FieldDesc::new(b"flags\0", FIELD_HEX),
];

/// The record kinds this plugin decodes.
pub static KINDS: [RecordKindDesc; 1] = [RecordKindDesc {
    record_type: STACK_SAMPLE.0,
    nr_fields: idx::N as u32,
    name: c_name(b"stack\0"),
    fields: FIELDS.as_ptr(),
}];

/// The declaration [`hrperf_decoder_plugin`] returns.
pub static DECL: PluginDecl = PluginDecl {
    abi_version: PLUGIN_ABI_VERSION,
    size: core::mem::size_of::<PluginDecl>() as u32,
    name: c_name(b"llc-stack\0"),
    description: c_name(b"kernel and user call stacks per overflow of the trigger event\0"),
    uuid: LLC_STACK_UUID,
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

/// Decodes `rec` (one record, header included) into `out[..13]`, as the ABI's `decode`
/// does; returns 0 (the `stack` kind) or a negative `DECODE_E*` code. String and list
/// values point into `rec` or at static strings.
pub fn decode_record(rec: &[u8], out: &mut [FieldValue]) -> i32 {
    if out.len() < idx::N {
        return DECODE_ESPACE;
    }
    let r = match StackRecord::parse(rec) {
        Ok(r) => r,
        Err(ParseError::Short { .. }) => return DECODE_ETRUNCATED,
        Err(ParseError::WrongType(_)) => return DECODE_EUNKNOWN,
        Err(ParseError::BadSize { size, .. }) if usize::from(size) > rec.len() => return DECODE_ETRUNCATED,
        Err(_) => return DECODE_EMALFORMED,
    };
    let f = &r.fixed;
    let nk = r.nr_kernel();
    let nu = r.nr_user();
    // `parse` checked the size covers both lists; `get` keeps this panic-free anyway.
    let (Some(kernel), Some(user)) = (
        rec.get(FIXED_SIZE..FIXED_SIZE + 8 * nk),
        rec.get(FIXED_SIZE + 8 * nk..FIXED_SIZE + 8 * (nk + nu)),
    ) else {
        return DECODE_ETRUNCATED;
    };
    // The comm field sits at bytes 64..80 of the record.
    let comm_len = f.comm().len();
    let comm = rec.get(64..64 + comm_len).unwrap_or(&[]);
    let truncated: &'static [u8] = match (f.flags & STK_KERNEL_TRUNCATED != 0, f.flags & STK_USER_TRUNCATED != 0) {
        (true, true) => b"kernel+user",
        (true, false) => b"kernel",
        (false, true) => b"user",
        (false, false) => b"",
    };
    let mode: &'static [u8] = if f.flags & STK_KERNEL_IP != 0 { b"kernel" } else { b"user" };
    out[idx::CPU] = FieldValue::int(FIELD_U64, f.cpu.into());
    out[idx::TIME_NS] = FieldValue::int(FIELD_TIME, f.time_ns);
    out[idx::PID] = FieldValue::int(FIELD_U64, f.pid.into());
    out[idx::TID] = FieldValue::int(FIELD_U64, f.tid.into());
    out[idx::COMM] = FieldValue::text(comm);
    out[idx::IP] = FieldValue::int(FIELD_HEX, f.ip);
    out[idx::MODE] = FieldValue::text(mode);
    out[idx::ADDR] = FieldValue::opt(FIELD_HEX, (f.addr != 0).then_some(f.addr));
    out[idx::WEIGHT] = FieldValue::int(FIELD_U64, f.weight);
    out[idx::KERNEL_STACK] = FieldValue::hex_list(kernel);
    out[idx::USER_STACK] = FieldValue::hex_list(user);
    out[idx::TRUNCATED] = FieldValue::text(truncated);
    out[idx::FLAGS] = FieldValue::int(FIELD_HEX, f.flags.into());
    0
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
mod tests {
    use super::*;
    use hrperf_abi::plugin::FIELD_FL_ABSENT;
    use hrperf_fmt_llc_stack::record::{encode, StackFixed, STK_USER_TRUNCATED};

    fn empty() -> [FieldValue; idx::N] {
        [FieldValue::int(0, 0); idx::N]
    }

    fn list_of(v: &FieldValue) -> Vec<u64> {
        // SAFETY: the value points into the record, alive in the test.
        let b = unsafe { core::slice::from_raw_parts(v.ptr, v.len as usize * 8) };
        b.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    fn str_of(v: &FieldValue) -> &[u8] {
        // SAFETY: as above.
        unsafe { core::slice::from_raw_parts(v.ptr, v.len as usize) }
    }

    fn sample() -> Vec<u8> {
        let f = StackFixed {
            misc: 0,
            time_ns: 123,
            ip: 0xffff_ffff_8100_0010,
            addr: 0,
            weight: 5000,
            cpu: 3,
            pid: 77,
            tid: 78,
            flags: STK_KERNEL_IP | STK_USER_TRUNCATED,
            comm: *b"dd\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        };
        let mut v = Vec::new();
        assert!(encode(&mut v, &f, &[0xffff_ffff_8100_0010, 0xffff_ffff_8100_0200], &[0x40_1000, 0x40_2000, 0x40_3000]));
        v
    }

    #[test]
    fn every_field_is_decoded() {
        let rec = sample();
        let mut out = empty();
        assert_eq!(decode_record(&rec, &mut out), 0);
        assert_eq!(out[idx::CPU].value, 3);
        assert_eq!(out[idx::TIME_NS].value, 123);
        assert_eq!(out[idx::PID].value, 77);
        assert_eq!(out[idx::TID].value, 78);
        assert_eq!(str_of(&out[idx::COMM]), b"dd");
        assert_eq!(out[idx::IP].value, 0xffff_ffff_8100_0010);
        assert_eq!(str_of(&out[idx::MODE]), b"kernel");
        assert_eq!(out[idx::ADDR].flags, FIELD_FL_ABSENT);
        assert_eq!(out[idx::WEIGHT].value, 5000);
        assert_eq!(list_of(&out[idx::KERNEL_STACK]), vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0200]);
        assert_eq!(list_of(&out[idx::USER_STACK]), vec![0x40_1000, 0x40_2000, 0x40_3000]);
        assert_eq!(str_of(&out[idx::TRUNCATED]), b"user");
        assert_eq!(out[idx::FLAGS].value, u64::from(STK_KERNEL_IP | STK_USER_TRUNCATED));
    }

    #[test]
    fn truncated_malformed_and_foreign_records_are_errors_not_panics() {
        let rec = sample();
        let mut out = empty();
        for cut in 0..rec.len() {
            assert!(decode_record(&rec[..cut], &mut out) < 0, "cut at {cut}");
        }
        let mut other = rec.clone();
        other[0] = 0x01;
        assert_eq!(decode_record(&other, &mut out), DECODE_EUNKNOWN);
        let mut bad = rec.clone();
        bad[60] = 1;
        assert_eq!(decode_record(&bad, &mut out), DECODE_EMALFORMED);
        assert_eq!(decode_record(&rec, &mut out[..3]), DECODE_ESPACE);
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = rec.clone();
            let i = (x % b.len() as u64) as usize;
            b[i] = (x >> 24) as u8;
            let _ = decode_record(&b, &mut out);
        }
    }

    #[test]
    fn the_declaration_is_consistent() {
        assert_eq!(DECL.nr_kinds, 1);
        assert_eq!(KINDS[0].nr_fields as usize, FIELDS.len());
        assert_eq!(hrperf_decoder_plugin(), &DECL as *const _);
    }
}
