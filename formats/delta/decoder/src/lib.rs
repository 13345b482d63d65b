//! Decoder plugin for the counter-delta format: `libhrperf_decode_delta.so`.
//!
//! Implements the plugin ABI of [`hrperf_abi::plugin`]: one exported entry,
//! [`hrperf_decoder_plugin`], returning a static [`PluginDecl`] with one record kind,
//! `delta` ([`RecordType::DELTA`]), whose layout is [`hrperf_fmt_delta::record`]. Fields,
//! in order (names are stable: they are JSON keys and CSV columns):
//!
//! | field | kind | meaning |
//! |---|---|---|
//! | `cpu` | U64 | CPU the sample was taken on |
//! | `time_ns` | TIME | the CPU's read time, in the capture's clock |
//! | `pid`, `tid` | U64 | process and thread |
//! | `trigger` | STR | `overflow`, `poll` or `instructed` |
//! | `ip` | HEX | interrupted IP; absent unless `trigger` is `overflow` |
//! | `ovfl_counter` | U64 | index of the overflowed counter; absent unless overflow |
//! | `multi_wrap` | U64 | bit i: counter i's delta may hide more than one wrap |
//! | `counters` | COUNTERS | the deltas, one per event of the capture |
//!
//! The crate is also an `rlib`, so the host's tests and a statically linked fallback can
//! use [`DECL`] and [`decode_record`] directly. Decoding never panics on any bytes: every
//! access goes through [`hrperf_fmt_delta::record::parse`], which checks sizes.

use hrperf_abi::plugin::{
    c_name, decode_entry,
    DecodeCtx, FieldDesc, FieldValue, PluginDecl, RecordKindDesc, DECODE_EMALFORMED,
    DECODE_ESPACE, DECODE_ETRUNCATED, DECODE_EUNKNOWN, FIELD_COUNTERS, FIELD_HEX,
    FIELD_STR, FIELD_TIME, FIELD_U64, PLUGIN_ABI_VERSION,
};
use hrperf_abi::record::{MISC_INSTRUCTED, MISC_OVERFLOW, MISC_POLL};
use hrperf_abi::RecordType;
use hrperf_fmt_delta::record::{self, ParseError, FIXED_SIZE, NO_OVERFLOW_COUNTER};

/// Format version this decoder understands: 1.0.
pub const FORMAT_VERSION: u32 = 1 << 16;

/// Index of each field in [`FIELDS`].
mod idx {
    pub const CPU: usize = 0;
    pub const TIME_NS: usize = 1;
    pub const PID: usize = 2;
    pub const TID: usize = 3;
    pub const TRIGGER: usize = 4;
    pub const IP: usize = 5;
    pub const OVFL_COUNTER: usize = 6;
    pub const MULTI_WRAP: usize = 7;
    pub const COUNTERS: usize = 8;
    pub const N: usize = 9;
}

/// The `delta` kind's fields, in decode order.
pub static FIELDS: [FieldDesc; idx::N] = [
    FieldDesc::new(b"cpu\0", FIELD_U64),
    FieldDesc::new(b"time_ns\0", FIELD_TIME),
    FieldDesc::new(b"pid\0", FIELD_U64),
    FieldDesc::new(b"tid\0", FIELD_U64),
    FieldDesc::new(b"trigger\0", FIELD_STR),
    FieldDesc::new(b"ip\0", FIELD_HEX),
    FieldDesc::new(b"ovfl_counter\0", FIELD_U64),
    FieldDesc::new(b"multi_wrap\0", FIELD_U64),
    FieldDesc::new(b"counters\0", FIELD_COUNTERS),
];

/// The record kinds this plugin decodes.
pub static KINDS: [RecordKindDesc; 1] = [RecordKindDesc {
    record_type: RecordType::DELTA.0,
    nr_fields: idx::N as u32,
    name: c_name(b"delta\0"),
    fields: FIELDS.as_ptr(),
}];

/// The declaration [`hrperf_decoder_plugin`] returns.
pub static DECL: PluginDecl = PluginDecl {
    abi_version: PLUGIN_ABI_VERSION,
    size: core::mem::size_of::<PluginDecl>() as u32,
    name: c_name(b"delta\0"),
    description: c_name(
        b"per-CPU 64-bit counter deltas per overflow, poll tick or instructed read\0",
    ),
    uuid: hrperf_fmt_delta::DELTA_UUID,
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

static TRIGGER_OVERFLOW: &str = "overflow";
static TRIGGER_POLL: &str = "poll";
static TRIGGER_INSTRUCTED: &str = "instructed";

/// Decodes `rec` (one record, header included) into `out[..9]`, as the ABI's `decode`
/// does; returns 0 (the `delta` kind's index) or a negative `DECODE_E*` code.
///
/// The `counters` value points into `rec` (at byte 40; unaligned reads by the host), and
/// `trigger` at static strings, so both live as long as `rec`.
pub fn decode_record(rec: &[u8], out: &mut [FieldValue]) -> i32 {
    if out.len() < idx::N {
        return DECODE_ESPACE;
    }
    let s = match record::parse(rec) {
        Ok(s) => s,
        Err(ParseError::Truncated) => return DECODE_ETRUNCATED,
        Err(ParseError::WrongType(_)) => return DECODE_EUNKNOWN,
        Err(_) => return DECODE_EMALFORMED,
    };
    let overflow = s.misc & MISC_OVERFLOW != 0
        || (s.misc & (MISC_POLL | MISC_INSTRUCTED) == 0 && s.ovfl_counter != NO_OVERFLOW_COUNTER);
    let trigger = if overflow {
        TRIGGER_OVERFLOW
    } else if s.misc & MISC_INSTRUCTED != 0 {
        TRIGGER_INSTRUCTED
    } else {
        TRIGGER_POLL
    };
    // `parse` checked that `rec` holds FIXED_SIZE + 8 * nr bytes; `get` keeps this
    // panic-free even so.
    let Some(deltas) = rec.get(FIXED_SIZE..FIXED_SIZE + 8 * s.nr as usize) else {
        return DECODE_ETRUNCATED;
    };
    out[idx::CPU] = FieldValue::int(FIELD_U64, s.cpu.into());
    out[idx::TIME_NS] = FieldValue::int(FIELD_TIME, s.time_ns);
    out[idx::PID] = FieldValue::int(FIELD_U64, s.pid.into());
    out[idx::TID] = FieldValue::int(FIELD_U64, s.tid.into());
    out[idx::TRIGGER] = FieldValue {
        kind: FIELD_STR,
        flags: 0,
        value: 0,
        ptr: trigger.as_ptr(),
        len: trigger.len() as u64,
    };
    out[idx::IP] = if overflow {
        FieldValue::int(FIELD_HEX, s.ip)
    } else {
        FieldValue::absent(FIELD_HEX)
    };
    out[idx::OVFL_COUNTER] = if overflow && s.ovfl_counter != NO_OVERFLOW_COUNTER {
        FieldValue::int(FIELD_U64, s.ovfl_counter.into())
    } else {
        FieldValue::absent(FIELD_U64)
    };
    out[idx::MULTI_WRAP] = FieldValue::int(FIELD_U64, s.multi_wrap.into());
    out[idx::COUNTERS] = FieldValue {
        kind: FIELD_COUNTERS,
        flags: 0,
        value: 0,
        ptr: deltas.as_ptr(),
        len: u64::from(s.nr),
    };
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
    use hrperf_abi::plugin::{DECODE_EFAULT, FIELD_FL_ABSENT};
    use core::ffi::CStr;
    use hrperf_fmt_delta::record::{write, DeltaSample, MAX_RECORD_SIZE};

    fn sample(nr: u8, misc: u16, ovfl: u8) -> DeltaSample {
        let mut deltas = [0u64; 8];
        for (i, d) in deltas.iter_mut().enumerate() {
            *d = 1000 + i as u64;
        }
        DeltaSample {
            misc,
            cpu: 3,
            pid: 42,
            tid: 43,
            ovfl_counter: ovfl,
            multi_wrap: 0b10,
            time_ns: 123_456,
            ip: 0xffff_ffff_8100_0000,
            nr,
            deltas,
        }
    }

    fn encode(s: &DeltaSample) -> Vec<u8> {
        let mut b = vec![0u8; MAX_RECORD_SIZE];
        let n = write(s, &mut b).unwrap();
        b.truncate(n);
        b
    }

    fn ctx() -> DecodeCtx {
        DecodeCtx {
            size: core::mem::size_of::<DecodeCtx>() as u32,
            nr_counters: 3,
            cpu: 3,
            clock: 0,
            format_version: FORMAT_VERSION,
            reserved: 0,
        }
    }

    fn call(rec: &[u8], out: &mut [FieldValue]) -> i32 {
        let c = ctx();
        // SAFETY: all pointers come from live references of the stated lengths.
        unsafe {
            decode(
                &c,
                rec.as_ptr(),
                rec.len(),
                out.as_mut_ptr(),
                out.len() as u32,
            )
        }
    }

    fn str_of(v: &FieldValue) -> &'static str {
        // SAFETY: STR values of this plugin point at static strings.
        let b = unsafe { core::slice::from_raw_parts(v.ptr, v.len as usize) };
        core::str::from_utf8(b).unwrap()
    }

    #[test]
    fn declaration_is_consistent() {
        // SAFETY: the entry returns a pointer to the static DECL.
        let d = unsafe { &*hrperf_decoder_plugin() };
        assert_eq!(d.abi_version, PLUGIN_ABI_VERSION);
        assert_eq!(d.size as usize, core::mem::size_of::<PluginDecl>());
        assert_eq!(d.uuid, hrperf_fmt_delta::DELTA_UUID);
        // SAFETY: static NUL-terminated strings.
        let name = unsafe { CStr::from_ptr(d.name) };
        assert_eq!(name.to_bytes(), b"delta");
        let names: Vec<&str> = FIELDS
            .iter()
            // SAFETY: static NUL-terminated strings.
            .map(|f| unsafe { CStr::from_ptr(f.name) }.to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "cpu",
                "time_ns",
                "pid",
                "tid",
                "trigger",
                "ip",
                "ovfl_counter",
                "multi_wrap",
                "counters"
            ]
        );
    }

    #[test]
    fn decodes_overflow_sample() {
        let rec = encode(&sample(3, MISC_OVERFLOW, 1));
        let mut out = [FieldValue::EMPTY; idx::N];
        assert_eq!(call(&rec, &mut out), 0);
        assert_eq!(out[idx::CPU].value, 3);
        assert_eq!(out[idx::TIME_NS].value, 123_456);
        assert_eq!(out[idx::PID].value, 42);
        assert_eq!(out[idx::TID].value, 43);
        assert_eq!(str_of(&out[idx::TRIGGER]), "overflow");
        assert_eq!(out[idx::IP].flags, 0);
        assert_eq!(out[idx::IP].value, 0xffff_ffff_8100_0000);
        assert_eq!(out[idx::OVFL_COUNTER].value, 1);
        assert_eq!(out[idx::MULTI_WRAP].value, 2);
        let c = out[idx::COUNTERS];
        assert_eq!(c.len, 3);
        // SAFETY: the counters point into `rec`, 3 u64s.
        let b = unsafe { core::slice::from_raw_parts(c.ptr, 24) };
        let vals: Vec<u64> = b
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [1000, 1001, 1002]);
    }

    #[test]
    fn poll_and_instructed_have_no_ip() {
        for (misc, want) in [(MISC_POLL, "poll"), (MISC_INSTRUCTED, "instructed")] {
            let rec = encode(&sample(2, misc, NO_OVERFLOW_COUNTER));
            let mut out = [FieldValue::EMPTY; idx::N];
            assert_eq!(call(&rec, &mut out), 0);
            assert_eq!(str_of(&out[idx::TRIGGER]), want);
            assert_ne!(out[idx::IP].flags & FIELD_FL_ABSENT, 0);
            assert_ne!(out[idx::OVFL_COUNTER].flags & FIELD_FL_ABSENT, 0);
            assert_eq!(out[idx::COUNTERS].len, 2);
        }
    }

    #[test]
    fn errors_not_panics() {
        let mut out = [FieldValue::EMPTY; idx::N];
        let c = ctx();
        // SAFETY: null pointers are what is being tested; the plugin must not use them.
        unsafe {
            assert_eq!(
                decode(core::ptr::null(), [0u8; 8].as_ptr(), 8, out.as_mut_ptr(), 9),
                DECODE_EFAULT
            );
            assert_eq!(
                decode(&c, core::ptr::null(), 8, out.as_mut_ptr(), 9),
                DECODE_EFAULT
            );
            assert_eq!(
                decode(&c, [0u8; 8].as_ptr(), 8, core::ptr::null_mut(), 9),
                DECODE_EFAULT
            );
            assert_eq!(
                decode(&c, [0u8; 8].as_ptr(), 8, out.as_mut_ptr(), 8),
                DECODE_ESPACE
            );
        }
        let rec = encode(&sample(3, MISC_OVERFLOW, 0));
        for n in 0..rec.len() {
            assert_eq!(call(&rec[..n], &mut out), DECODE_ETRUNCATED, "length {n}");
        }
        let mut other = rec.clone();
        other[0..4].copy_from_slice(&RecordType::LOST.0.to_ne_bytes());
        assert_eq!(call(&other, &mut out), DECODE_EUNKNOWN);
        let mut bad_nr = rec.clone();
        bad_nr[20] = 9;
        assert_eq!(call(&bad_nr, &mut out), DECODE_EMALFORMED);
        bad_nr[20] = 0;
        assert_eq!(call(&bad_nr, &mut out), DECODE_EMALFORMED);
    }

    /// xorshift64*: deterministic noise without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut out = [FieldValue::EMPTY; idx::N];
        let valid = encode(&sample(8, MISC_OVERFLOW, 7));
        let mut ok = 0;
        for i in 0..200_000 {
            let len = (rng.next() % 120) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if i % 2 == 0 && len >= 8 {
                // Often a plausible header, so parsing goes past the first check.
                b[0..4].copy_from_slice(&RecordType::DELTA.0.to_ne_bytes());
                let size = (rng.next() % 112) as u16;
                b[6..8].copy_from_slice(&size.to_ne_bytes());
                if len > 20 {
                    b[20] = (rng.next() % 10) as u8;
                }
            }
            if i % 5 == 0 {
                // A valid record with a few flipped bytes.
                b = valid.clone();
                for _ in 0..3 {
                    let at = (rng.next() as usize) % b.len();
                    b[at] ^= rng.next() as u8 | 1;
                }
            }
            let rc = call(&b, &mut out);
            assert!(rc == 0 || (-5..0).contains(&rc), "rc {rc}");
            if rc == 0 {
                ok += 1;
                let n = out[idx::COUNTERS].len as usize;
                assert!((1..=8).contains(&n));
                // The counters lie inside the record.
                let start = out[idx::COUNTERS].ptr as usize - b.as_ptr() as usize;
                assert!(start + 8 * n <= b.len());
            }
        }
        assert!(
            ok > 0,
            "no random record decoded; the test does not reach the decoder"
        );
    }
}
