//! The decoder against records a real drain produced, and against noise.

use core::ffi::CStr;

use hrperf_abi::plugin::{FIELD_FL_ABSENT, FIELD_HEX_LIST};
use hrperf_abi::RecordType;
use hrperf_fmt_aggregate::record::{
    write_entry, write_interval, write_stack, EntryRecord, IntervalRecord, StackRecord, ENTRY_SIZE,
    INTERVAL_SIZE, IV_FL_CLOSED_REQUEST, KEY_PID_IP, STACK_FL_TRUNCATED,
};

use super::*;
use hrperf_abi::plugin::DECODE_EFAULT;

fn ctx() -> DecodeCtx {
    DecodeCtx {
        size: core::mem::size_of::<DecodeCtx>() as u32,
        nr_counters: 2,
        cpu: 1,
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

fn names(fields: &[FieldDesc]) -> Vec<&'static str> {
    fields
        .iter()
        // SAFETY: static NUL-terminated strings.
        .map(|f| unsafe { CStr::from_ptr(f.name) }.to_str().unwrap())
        .collect()
}

fn interval() -> IntervalRecord {
    IntervalRecord {
        cpu: 1,
        key_kind: KEY_PID_IP,
        seq: 7,
        start_ns: 1_000,
        end_ns: 2_000,
        samples: 100,
        entries: 2,
        other_count: 5,
        other_sum: 50,
        misses: 5,
        sum_total: 1_000,
        stacks: 0,
        stack_misses: 0,
        stack_truncated: 0,
        multi_wraps: 1,
        counter: 1,
        flags: IV_FL_CLOSED_REQUEST,
    }
}

fn entry(key_kind: u32) -> EntryRecord {
    EntryRecord {
        cpu: 1,
        key_kind,
        seq: 7,
        start_ns: 1_000,
        end_ns: 2_000,
        pid: 42,
        ip: 0xffff_ffff_8100_0040,
        kstack_id: 3,
        ustack_id: 4,
        count: 60,
        sum: 600,
    }
}

fn encoded() -> Vec<Vec<u8>> {
    let mut b = [0u8; 2048];
    let mut v = Vec::new();
    let n = write_interval(&interval(), &mut b).unwrap();
    v.push(b[..n].to_vec());
    for k in [KEY_IP, KEY_PID_IP, KEY_STACK] {
        let n = write_entry(&entry(k), &mut b).unwrap();
        v.push(b[..n].to_vec());
    }
    let s = StackRecord {
        cpu: 1,
        stack_id: 3,
        seq: 7,
        depth: 0,
        flags: STACK_FL_KERNEL | STACK_FL_TRUNCATED,
    };
    let n = write_stack(&s, &[0xa0, 0xb0, 0xc0], &mut b).unwrap();
    v.push(b[..n].to_vec());
    v
}

#[test]
fn declaration_is_consistent() {
    // SAFETY: the entry returns a pointer to the static DECL.
    let d = unsafe { &*hrperf_decoder_plugin() };
    assert_eq!(d.abi_version, PLUGIN_ABI_VERSION);
    assert_eq!(d.size as usize, core::mem::size_of::<PluginDecl>());
    assert_eq!(d.uuid, hrperf_fmt_aggregate::AGGREGATE_UUID);
    assert_eq!(d.format_version, hrperf_fmt_aggregate::AGGREGATE_VERSION);
    // SAFETY: static NUL-terminated strings.
    assert_eq!(unsafe { CStr::from_ptr(d.name) }.to_bytes(), b"aggregate");
    let kinds: Vec<_> = KINDS
        .iter()
        .map(|k| {
            // SAFETY: static NUL-terminated strings.
            let name = unsafe { CStr::from_ptr(k.name) };
            (k.record_type, name.to_str().unwrap(), k.nr_fields)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (0x1300, "aggregate_interval", 18),
            (0x1301, "aggregate_entry", 11),
            (0x1302, "aggregate_stack", 7)
        ]
    );
    assert_eq!(
        names(&ENTRY_FIELDS),
        [
            "cpu",
            "seq",
            "interval_start",
            "interval_end",
            "key",
            "pid",
            "ip",
            "kstack_id",
            "ustack_id",
            "count",
            "sum"
        ]
    );
    assert_eq!(
        names(&STACK_FIELDS),
        [
            "cpu",
            "seq",
            "stack_id",
            "stack",
            "truncated",
            "depth",
            "frames"
        ]
    );
    assert_eq!(
        names(&INTERVAL_FIELDS)[..5],
        ["cpu", "seq", "interval_start", "interval_end", "key"]
    );
    assert_eq!(names(&INTERVAL_FIELDS).len(), iv::N);
}

#[test]
fn decodes_every_kind() {
    let recs = encoded();
    let mut out = [FieldValue::EMPTY; 32];

    assert_eq!(call(&recs[0], &mut out), KIND_INTERVAL);
    assert_eq!((out[iv::CPU].value, out[iv::SEQ].value), (1, 7));
    assert_eq!((out[iv::START].value, out[iv::END].value), (1_000, 2_000));
    assert_eq!(str_of(&out[iv::KEY]), "pid_ip");
    assert_eq!((out[iv::SAMPLES].value, out[iv::ENTRIES].value), (100, 2));
    assert_eq!(
        (
            out[iv::OTHER_COUNT].value,
            out[iv::OTHER_SUM].value,
            out[iv::MISSES].value
        ),
        (5, 50, 5)
    );
    assert_eq!(
        (
            out[iv::SUM_TOTAL].value,
            out[iv::MULTI_WRAPS].value,
            out[iv::COUNTER].value
        ),
        (1_000, 1, 1)
    );
    assert_eq!(str_of(&out[iv::CLOSED_BY]), "request");
    assert_eq!(out[iv::FLAGS].value, u64::from(IV_FL_CLOSED_REQUEST));

    // ip key: no pid, no stacks.
    assert_eq!(call(&recs[1], &mut out), KIND_ENTRY);
    assert_eq!(str_of(&out[en::KEY]), "ip");
    assert_ne!(out[en::PID].flags & FIELD_FL_ABSENT, 0);
    assert_eq!(
        (out[en::IP].flags, out[en::IP].value),
        (0, 0xffff_ffff_8100_0040)
    );
    assert_ne!(out[en::KSTACK].flags & FIELD_FL_ABSENT, 0);
    assert_eq!((out[en::COUNT].value, out[en::SUM].value), (60, 600));
    // pid_ip key.
    assert_eq!(call(&recs[2], &mut out), KIND_ENTRY);
    assert_eq!((out[en::PID].flags, out[en::PID].value), (0, 42));
    assert_ne!(out[en::USTACK].flags & FIELD_FL_ABSENT, 0);
    // stack key: stack ids, no IP.
    assert_eq!(call(&recs[3], &mut out), KIND_ENTRY);
    assert_eq!(str_of(&out[en::KEY]), "stack");
    assert_ne!(out[en::IP].flags & FIELD_FL_ABSENT, 0);
    assert_eq!(
        (
            out[en::KSTACK].value,
            out[en::USTACK].value,
            out[en::PID].value
        ),
        (3, 4, 42)
    );

    assert_eq!(call(&recs[4], &mut out), KIND_STACK);
    assert_eq!(
        (
            out[st::ID].value,
            out[st::TRUNCATED].value,
            out[st::DEPTH].value
        ),
        (3, 1, 3)
    );
    assert_eq!(str_of(&out[st::KIND]), "kernel");
    let f = out[st::FRAMES];
    assert_eq!((f.kind, f.len), (FIELD_HEX_LIST, 3));
    // SAFETY: the frames point into `recs[4]`, 3 u64s.
    let b = unsafe { core::slice::from_raw_parts(f.ptr, 24) };
    let frames: Vec<u64> = b
        .chunks(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(frames, [0xa0, 0xb0, 0xc0]);
}

#[test]
fn errors_not_panics() {
    let recs = encoded();
    let mut out = [FieldValue::EMPTY; 32];
    let c = ctx();
    // SAFETY: null pointers are what is being tested; the plugin must not use them.
    unsafe {
        assert_eq!(
            decode(core::ptr::null(), recs[0].as_ptr(), 8, out.as_mut_ptr(), 32),
            DECODE_EFAULT
        );
        assert_eq!(
            decode(&c, core::ptr::null(), 8, out.as_mut_ptr(), 32),
            DECODE_EFAULT
        );
        assert_eq!(
            decode(&c, recs[0].as_ptr(), 8, core::ptr::null_mut(), 32),
            DECODE_EFAULT
        );
    }
    assert_eq!(call(&recs[0], &mut out[..iv::N - 1]), DECODE_ESPACE);
    assert_eq!(
        call(&recs[1], &mut out[..en::N]),
        KIND_ENTRY,
        "exactly enough room"
    );
    // Every truncation of every record is an error, never a panic.
    for r in &recs {
        for n in 0..r.len() {
            let rc = call(&r[..n], &mut out);
            assert!(
                rc == DECODE_ETRUNCATED || rc == DECODE_EMALFORMED,
                "len {n}: {rc}"
            );
        }
    }
    let mut other = recs[0].clone();
    other[0..4].copy_from_slice(&RecordType::LOST.0.to_ne_bytes());
    assert_eq!(call(&other, &mut out), DECODE_EUNKNOWN);
    let mut bad = recs[1].clone();
    bad[6..8].copy_from_slice(&(ENTRY_SIZE as u16 + 8).to_ne_bytes());
    bad.extend_from_slice(&[0; 8]);
    assert_eq!(
        call(&bad, &mut out),
        DECODE_EMALFORMED,
        "an entry has one size"
    );
    let mut deep = recs[4].clone();
    deep[24] = 2; // depth 2 in a 3-frame record
    assert_eq!(call(&deep, &mut out), DECODE_EMALFORMED);
    assert_eq!(INTERVAL_SIZE, 128);
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
    let mut out = [FieldValue::EMPTY; 32];
    let recs = encoded();
    let mut ok = [0u32; 3];
    for i in 0..200_000 {
        let len = (rng.next() % 200) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 2 == 0 && len >= 8 {
            // A plausible header, so parsing goes past the first check.
            let kind = 0x1300 + (rng.next() % 4) as u32;
            b[0..4].copy_from_slice(&kind.to_ne_bytes());
            let size = (rng.next() % 200) as u16 & !7;
            b[6..8].copy_from_slice(&size.to_ne_bytes());
            if len >= 28 && rng.next() % 2 == 0 {
                b[24..28].copy_from_slice(&((size as u32).saturating_sub(32) / 8).to_ne_bytes());
            }
        }
        if i % 5 == 0 {
            // A valid record with a few flipped bytes.
            b = recs[(rng.next() % recs.len() as u64) as usize].clone();
            for _ in 0..3 {
                let at = (rng.next() as usize) % b.len();
                b[at] ^= rng.next() as u8 | 1;
            }
        }
        let rc = call(&b, &mut out);
        assert!((0..3).contains(&rc) || (-5..0).contains(&rc), "rc {rc}");
        if rc >= 0 {
            ok[rc as usize] += 1;
        }
        if rc == KIND_STACK {
            let f = out[st::FRAMES];
            let start = f.ptr as usize - b.as_ptr() as usize;
            assert!(
                start + 8 * f.len as usize <= b.len(),
                "frames inside the record"
            );
        }
    }
    assert!(
        ok.iter().all(|&n| n > 0),
        "every kind decoded sometimes: {ok:?}"
    );
}
