//! The decoder-plugin ABI: what a `cdylib` decoder exports and the host checks.
//!
//! A plugin exports exactly one symbol, [`PLUGIN_ENTRY_SYMBOL`], of type
//! [`PluginEntryFn`], returning a `'static` [`PluginDecl`]. The host checks
//! `abi_version` and `size` before it reads anything else or calls any other function,
//! and refuses a plugin built against another ABI version with a message naming both.
//!
//! Decoding: for each record, the host calls `decode`, which writes one [`FieldValue`]
//! per field of the record kind's schema, in schema order. A plugin never panics and
//! never reads outside `rec[..len]`: malformed bytes give a negative `DECODE_E*` code.

use core::ffi::c_char;

use crate::format::Uuid;

/// Version of this ABI; a plugin with another one is refused.
pub const PLUGIN_ABI_VERSION: u32 = 1;
/// Name of the entry symbol every plugin exports.
pub const PLUGIN_ENTRY_SYMBOL: &[u8] = b"hrperf_decoder_plugin\0";

/// The entry point's type.
pub type PluginEntryFn = unsafe extern "C" fn() -> *const PluginDecl;

/// A plain unsigned integer.
pub const FIELD_U64: u32 = 1;
/// A signed integer (`value` holds its two's complement).
pub const FIELD_I64: u32 = 2;
/// An unsigned integer best shown in hex (addresses, IPs).
pub const FIELD_HEX: u32 = 3;
/// A string: `ptr`/`len` UTF-8 bytes, valid until the next `decode` call.
pub const FIELD_STR: u32 = 4;
/// The session's counters: `len` `u64`s at `ptr` (possibly unaligned), named after the
/// capture file's events in order.
pub const FIELD_COUNTERS: u32 = 5;
/// A list of addresses (e.g. a stack): `len` `u64`s at `ptr` (possibly unaligned).
pub const FIELD_HEX_LIST: u32 = 6;
/// A nanosecond timestamp in the capture's clock.
pub const FIELD_TIME: u32 = 7;

/// Field flag: absent in this record (e.g. IP in a poll sample); shown empty/null.
pub const FIELD_FL_ABSENT: u32 = 1 << 0;

/// The record was truncated (shorter than its header says or than its kind needs).
pub const DECODE_ETRUNCATED: i32 = -1;
/// The record's type is not one this plugin declares.
pub const DECODE_EUNKNOWN: i32 = -2;
/// The record's contents are inconsistent (bad size, count out of range).
pub const DECODE_EMALFORMED: i32 = -3;
/// `out_cap` is smaller than the schema's field count.
pub const DECODE_ESPACE: i32 = -4;
/// A null pointer was passed.
pub const DECODE_EFAULT: i32 = -5;

/// One field of a record kind's schema.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FieldDesc {
    /// Stable field name (`snake_case`, NUL-terminated, static): JSON keys and CSV columns.
    pub name: *const c_char,
    /// `FIELD_*`.
    pub kind: u32,
    /// Reserved, zero.
    pub flags: u32,
}

impl FieldDesc {
    /// A field named by `name`, a NUL-terminated static string.
    pub const fn new(name: &'static [u8], kind: u32) -> FieldDesc {
        FieldDesc { name: c_name(name), kind, flags: 0 }
    }
}

/// A NUL-terminated static byte string as the `*const c_char` the declaration holds
/// (plugin, kind and field names). A missing NUL fails the build of a `static`.
pub const fn c_name(s: &'static [u8]) -> *const c_char {
    assert!(!s.is_empty() && s[s.len() - 1] == 0, "names in a plugin declaration are NUL-terminated");
    s.as_ptr().cast()
}

/// What every plugin's [`DecodeFn`] does before touching memory: null pointers give
/// [`DECODE_EFAULT`]; otherwise `decode_record` gets the record and the output slots as
/// slices and its result is returned.
///
/// # Safety
///
/// The [`DecodeFn`] contract: `rec` is null or valid for `len` bytes and `out` null or
/// valid for `out_cap` writable values, for the duration of the call.
pub unsafe fn decode_entry(
    ctx: *const DecodeCtx,
    rec: *const u8,
    len: usize,
    out: *mut FieldValue,
    out_cap: u32,
    decode_record: impl FnOnce(&[u8], &mut [FieldValue]) -> i32,
) -> i32 {
    if ctx.is_null() || rec.is_null() || out.is_null() {
        return DECODE_EFAULT;
    }
    // SAFETY: non-null, and valid for `len` bytes per this function's contract.
    let rec = unsafe { core::slice::from_raw_parts(rec, len) };
    // SAFETY: non-null, and valid for `out_cap` writable values per the contract.
    let out = unsafe { core::slice::from_raw_parts_mut(out, out_cap as usize) };
    decode_record(rec, out)
}

/// The schema of one record type a plugin decodes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RecordKindDesc {
    /// The [`crate::RecordType`] value.
    pub record_type: u32,
    /// Number of entries at `fields`.
    pub nr_fields: u32,
    /// Kind name (NUL-terminated, static), e.g. `"delta"`.
    pub name: *const c_char,
    /// The fields, in the order `decode` writes them.
    pub fields: *const FieldDesc,
}

/// What the host tells `decode` about the capture.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeCtx {
    /// Bytes valid in this struct.
    pub size: u32,
    /// Counters in the session (the capture's event count).
    pub nr_counters: u32,
    /// CPU of the chunk the record came from.
    pub cpu: u32,
    /// `CLOCK_*` of the capture.
    pub clock: u32,
    /// The capture's `format_version`.
    pub format_version: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// One decoded value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FieldValue {
    /// `FIELD_*`, as in the schema.
    pub kind: u32,
    /// `FIELD_FL_*`.
    pub flags: u32,
    /// The integer value (`U64`, `I64`, `HEX`, `TIME`).
    pub value: u64,
    /// Bytes or `u64`s for `STR`, `COUNTERS`, `HEX_LIST`.
    pub ptr: *const u8,
    /// Length: bytes for `STR`, elements for lists.
    pub len: u64,
}

impl FieldValue {
    /// An empty value (what the host preloads before `decode`).
    pub const EMPTY: FieldValue = FieldValue {
        kind: 0,
        flags: FIELD_FL_ABSENT,
        value: 0,
        ptr: core::ptr::null(),
        len: 0,
    };

    /// An integer value of `kind` (`FIELD_U64`, `FIELD_I64`, `FIELD_HEX`, `FIELD_TIME`).
    pub const fn int(kind: u32, value: u64) -> FieldValue {
        FieldValue { kind, flags: 0, value, ptr: core::ptr::null(), len: 0 }
    }

    /// A value of `kind` absent from this record.
    pub const fn absent(kind: u32) -> FieldValue {
        FieldValue { kind, flags: FIELD_FL_ABSENT, value: 0, ptr: core::ptr::null(), len: 0 }
    }

    /// [`FieldValue::int`] if `value` is there, else [`FieldValue::absent`].
    pub const fn opt(kind: u32, value: Option<u64>) -> FieldValue {
        match value {
            Some(v) => FieldValue::int(kind, v),
            None => FieldValue::absent(kind),
        }
    }

    /// A `FIELD_STR` pointing at `s` (valid as long as `s`).
    pub fn text(s: &(impl AsRef<[u8]> + ?Sized)) -> FieldValue {
        let b = s.as_ref();
        FieldValue { kind: FIELD_STR, flags: 0, value: 0, ptr: b.as_ptr(), len: b.len() as u64 }
    }

    /// A `FIELD_HEX_LIST` of the `bytes.len() / 8` native-endian u64s at `bytes`.
    pub fn hex_list(bytes: &[u8]) -> FieldValue {
        FieldValue { kind: FIELD_HEX_LIST, flags: 0, value: 0, ptr: bytes.as_ptr(), len: (bytes.len() / 8) as u64 }
    }
}

/// Decodes one record (`rec[..len]`, header included) into `out[..out_cap]`.
/// Returns the index into [`PluginDecl::kinds`] of the record's kind (≥ 0) having written
/// that kind's `nr_fields` values, or a negative `DECODE_E*` code.
pub type DecodeFn = unsafe extern "C" fn(
    ctx: *const DecodeCtx,
    rec: *const u8,
    len: usize,
    out: *mut FieldValue,
    out_cap: u32,
) -> i32;

/// The declaration a plugin's entry returns.
#[repr(C)]
#[derive(Debug)]
pub struct PluginDecl {
    /// [`PLUGIN_ABI_VERSION`] the plugin was built against; checked first.
    pub abi_version: u32,
    /// `size_of::<PluginDecl>()` as compiled into the plugin.
    pub size: u32,
    /// Format name (NUL-terminated, static), e.g. `"delta"`.
    pub name: *const c_char,
    /// One-line description (NUL-terminated, static).
    pub description: *const c_char,
    /// UUID of the format it decodes.
    pub uuid: Uuid,
    /// Newest format version it understands, `major << 16 | minor`.
    pub format_version: u32,
    /// Number of entries at `kinds`.
    pub nr_kinds: u32,
    /// The record kinds it decodes.
    pub kinds: *const RecordKindDesc,
    /// The decode entry point.
    pub decode: Option<DecodeFn>,
}

// SAFETY: a declaration is immutable static data (pointers to static strings/tables).
unsafe impl Sync for PluginDecl {}
// SAFETY: as above.
unsafe impl Sync for RecordKindDesc {}
// SAFETY: as above.
unsafe impl Sync for FieldDesc {}

#[cfg(target_pointer_width = "64")]
mod layout {
    use super::*;
    assert_layout!(FieldDesc, size 16, align 8);
    assert_layout!(RecordKindDesc, size 24, align 8);
    assert_layout!(DecodeCtx, size 24, align 4);
    assert_layout!(FieldValue, size 32, align 8);
    assert_layout!(PluginDecl, size 64, align 8);
}
