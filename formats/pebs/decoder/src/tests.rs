//! Plugin tests: every field of every layout, and no panic on any bytes.

use core::ffi::CStr;

use hrperf_abi::plugin::{
    DecodeCtx, FieldValue, DECODE_EFAULT, DECODE_EMALFORMED, DECODE_ESPACE, DECODE_ETRUNCATED, DECODE_EUNKNOWN,
    FIELD_FL_ABSENT,
};
use hrperf_abi::RecordType;
use hrperf_fmt_pebs::datasrc::{DseTable, DsrcKind};
use hrperf_fmt_pebs::layout::{datacfg_lbr, Gprs, LbrEntry, PebsSample, DATACFG_GP, DATACFG_MEMINFO, DATACFG_XMMS};
use hrperf_fmt_pebs::record::{self, Prefix, FL_PERF_SOURCED, FL_SIMULATED, FL_TIME, MAX_CAPTURE_RECORD};

use super::*;

fn sample() -> PebsSample {
    let mut s = PebsSample {
        regs: Gprs { flags: 0x246, ip: 0x40_1005, ax: 1, bx: 2, cx: 3, dx: 4, si: 5, di: 6, bp: 7, sp: 8, r8: 9, r9: 10, r10: 11, r11: 12, r12: 13, r13: 14, r14: 15, r15: 16 },
        eventing_ip: 0x40_1000,
        applicable_counters: 1,
        data_addr: 0x7ffd_0000_1040,
        data_source: 0x03, // L2 hit on the SNB/SKL tables
        latency: (42 << 32) | 7,
        tsx_tuning: 0x1_0000_0005,
        tsc: 123_456_789,
        retire_latency: 33,
        ..PebsSample::default()
    };
    for (i, x) in s.xmm.iter_mut().enumerate() {
        *x = 0x100 + i as u64;
    }
    for (i, e) in s.lbr.iter_mut().enumerate() {
        *e = LbrEntry { from: 0x1000 + i as u64, to: 0x2000 + i as u64, info: i as u64 };
    }
    s
}

fn rec(layout: Layout, cfg: u64, fmt: PebsFormat, dsrc: DsrcKind, flags: u32) -> Vec<u8> {
    let prefix = Prefix { cpu: 5, pebs_format: fmt, dsrc_kind: dsrc as u8, flags, time_ns: 777 };
    let mut out = vec![0u8; MAX_CAPTURE_RECORD];
    let n = record::encode_wrapped(layout, cfg, &prefix, &sample(), &mut out).unwrap();
    out.truncate(n);
    out
}

fn call(rec: &[u8], out: &mut [FieldValue]) -> i32 {
    let c = DecodeCtx { size: core::mem::size_of::<DecodeCtx>() as u32, nr_counters: 1, cpu: 5, clock: 0, format_version: FORMAT_VERSION, reserved: 0 };
    // SAFETY: all pointers come from live references of the stated lengths.
    unsafe { decode(&c, rec.as_ptr(), rec.len(), out.as_mut_ptr(), out.len() as u32) }
}

fn s(v: &FieldValue) -> &'static str {
    assert_eq!(v.flags & FIELD_FL_ABSENT, 0);
    // SAFETY: STR values of this plugin point at static strings.
    core::str::from_utf8(unsafe { core::slice::from_raw_parts(v.ptr, v.len as usize) }).unwrap()
}

fn words(v: &FieldValue) -> Vec<u64> {
    assert_eq!(v.flags & FIELD_FL_ABSENT, 0);
    // SAFETY: lists point at `len` (unaligned) u64s inside the record or the TLS copy.
    let b = unsafe { core::slice::from_raw_parts(v.ptr, 8 * v.len as usize) };
    b.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn absent_(v: &FieldValue) -> bool {
    v.flags & FIELD_FL_ABSENT != 0
}

#[test]
fn declaration_is_consistent() {
    // SAFETY: the entry returns a pointer to the static DECL.
    let d = unsafe { &*hrperf_decoder_plugin() };
    assert_eq!((d.abi_version, d.uuid, d.nr_kinds), (PLUGIN_ABI_VERSION, PEBS_UUID, 5));
    // SAFETY: static NUL-terminated strings.
    assert_eq!(unsafe { CStr::from_ptr(d.name) }.to_bytes(), b"pebs");
    for (i, k) in KINDS.iter().enumerate() {
        assert_eq!(k.record_type, RecordType::PEBS_BASE.0 + i as u32);
        assert_eq!(k.nr_fields as usize, idx::N);
    }
    // SAFETY: static NUL-terminated strings.
    let names: Vec<&str> = FIELDS.iter().map(|f| unsafe { CStr::from_ptr(f.name) }.to_str().unwrap()).collect();
    assert_eq!(names[idx::MEM_LEVEL], "mem_level");
    assert_eq!(names[idx::SOURCE], "source");
    assert_eq!(names.len(), idx::N);
}

#[test]
fn skylake_record_every_field() {
    let fmt = PebsFormat::simulated(Layout::Skylake, DseTable::Skylake);
    let r = rec(Layout::Skylake, 0, fmt, DsrcKind::LoadLatency, FL_SIMULATED);
    let mut out = [FieldValue::EMPTY; idx::N];
    assert_eq!(call(&r, &mut out), 3);
    let v = |i: usize| out[i].value;
    assert_eq!((v(idx::CPU), v(idx::TSC), v(idx::IP), v(idx::EVENTING_IP)), (5, 123_456_789, 0x40_1005, 0x40_1000));
    assert!(absent_(&out[idx::TIME_NS]), "no FL_TIME");
    assert_eq!((v(idx::DATA_ADDR), v(idx::LATENCY), v(idx::DATA_SOURCE)), (0x7ffd_0000_1040, 7, 3));
    assert!(absent_(&out[idx::INSTR_LATENCY]));
    assert_eq!((s(&out[idx::MEM_OP]), s(&out[idx::MEM_LEVEL]), s(&out[idx::MEM_HIT])), ("load", "L2", "hit"));
    assert_eq!((s(&out[idx::MEM_SNOOP]), s(&out[idx::MEM_TLB]), s(&out[idx::MEM_LOCK]), s(&out[idx::MEM_BLOCKED])), ("none", "hit", "no", "na"));
    assert_eq!((v(idx::MEM_REMOTE), v(idx::APPLICABLE), v(idx::TSX_TUNING)), (0, 1, 0x1_0000_0005));
    assert!(absent_(&out[idx::RETIRE_LATENCY]));
    let mut want = vec![0x246, 0x40_1005];
    want.extend(1..=16u64);
    assert_eq!(words(&out[idx::REGS]), want, "flags ip ax bx cx dx si di bp sp r8..r15");
    assert!(absent_(&out[idx::XMM]) && absent_(&out[idx::LBR]));
    assert_eq!((v(idx::LBR_COUNT), s(&out[idx::LAYOUT]), v(idx::PEBS_FORMAT), s(&out[idx::SOURCE])), (0, "skl", u64::from(fmt.0), "sim"));
}

#[test]
fn legacy_layouts_absent_fields() {
    let mut out = [FieldValue::EMPTY; idx::N];
    let core = rec(Layout::Core, 0, PebsFormat::simulated(Layout::Core, DseTable::None), DsrcKind::None, 0);
    assert_eq!(call(&core, &mut out), 0);
    for i in [idx::TSC, idx::EVENTING_IP, idx::DATA_ADDR, idx::LATENCY, idx::MEM_LEVEL, idx::APPLICABLE, idx::TSX_TUNING] {
        assert!(absent_(&out[i]), "field {i}");
    }
    assert_eq!((out[idx::IP].value, s(&out[idx::SOURCE]), s(&out[idx::LAYOUT])), (0x40_1005, "hw", "core"));
    let nhm = rec(Layout::Nehalem, 0, PebsFormat::simulated(Layout::Nehalem, DseTable::Nehalem), DsrcKind::LoadLatency, 0);
    assert_eq!(call(&nhm, &mut out), 1);
    assert!(absent_(&out[idx::EVENTING_IP]) && absent_(&out[idx::TSX_TUNING]) && absent_(&out[idx::TSC]));
    assert_eq!((out[idx::DATA_ADDR].value, s(&out[idx::MEM_LEVEL])), (0x7ffd_0000_1040, "L2"));
    let hsw = rec(Layout::Haswell, 0, PebsFormat::simulated(Layout::Haswell, DseTable::SandyBridge), DsrcKind::LoadLatency, 0);
    assert_eq!(call(&hsw, &mut out), 2);
    assert_eq!((out[idx::EVENTING_IP].value, out[idx::TSX_TUNING].value), (0x40_1000, 0x1_0000_0005));
    assert!(absent_(&out[idx::TSC]));
}

#[test]
fn adaptive_groups() {
    let fmt = PebsFormat::new(5, PebsFormat::BASELINE | PebsFormat::TIMING_INFO | PebsFormat::INSTR_LATENCY, DseTable::Skylake);
    let mut out = [FieldValue::EMPTY; idx::N];
    // Basic only.
    let r = rec(Layout::Adaptive, 0, fmt, DsrcKind::LoadLatency, 0);
    assert_eq!(call(&r, &mut out), 4);
    assert_eq!((out[idx::IP].value, out[idx::EVENTING_IP].value, out[idx::TSC].value), (0x40_1000, 0x40_1000, 123_456_789));
    assert_eq!(out[idx::RETIRE_LATENCY].value, 33);
    for i in [idx::DATA_ADDR, idx::MEM_LEVEL, idx::REGS, idx::XMM, idx::LBR] {
        assert!(absent_(&out[i]), "field {i}");
    }
    // Everything, 32 LBR entries, perf-sourced with a time.
    let all = DATACFG_MEMINFO | DATACFG_GP | DATACFG_XMMS | datacfg_lbr(32);
    let r = rec(Layout::Adaptive, all, fmt, DsrcKind::LoadLatency, FL_PERF_SOURCED | FL_TIME);
    assert_eq!(r.len(), 32 + 1232);
    assert_eq!(call(&r, &mut out), 4);
    assert_eq!((out[idx::TIME_NS].value, s(&out[idx::SOURCE])), (777, "perf"));
    assert_eq!((out[idx::LATENCY].value, out[idx::INSTR_LATENCY].value), (42, 7), "cache / instruction latency split");
    let regs = words(&out[idx::REGS]);
    assert_eq!(&regs[..4], &[0x246, 0x40_1005, 1, 2], "canonical order: flags ip ax bx");
    assert_eq!(regs[17], 16);
    assert_eq!(words(&out[idx::XMM]), (0..32).map(|i| 0x100 + i).collect::<Vec<u64>>());
    let lbr = words(&out[idx::LBR]);
    assert_eq!((lbr.len(), out[idx::LBR_COUNT].value), (96, 32));
    assert_eq!(&lbr[..6], &[0x1000, 0x2000, 0, 0x1001, 0x2001, 1]);
    // 8 LBR entries.
    let r = rec(Layout::Adaptive, datacfg_lbr(8), fmt, DsrcKind::None, 0);
    assert_eq!(call(&r, &mut out), 4);
    assert_eq!((out[idx::LBR].len, out[idx::LBR_COUNT].value), (24, 8));
    // A perf_mem_data_src value from the perf source decodes the same way.
    let mut p = sample();
    p.data_source = 0x02 | (0x22 << 5) | (0x02 << 33) | (0x04 << 26); // load, L2 hit, TLB miss
    let prefix = Prefix { cpu: 1, pebs_format: fmt, dsrc_kind: DsrcKind::PerfMemDataSrc as u8, flags: FL_PERF_SOURCED, time_ns: 0 };
    let mut b = vec![0u8; MAX_CAPTURE_RECORD];
    let n = record::encode_wrapped(Layout::Adaptive, DATACFG_MEMINFO, &prefix, &p, &mut b).unwrap();
    assert_eq!(call(&b[..n], &mut out), 4);
    assert_eq!((s(&out[idx::MEM_LEVEL]), s(&out[idx::MEM_TLB]), s(&out[idx::MEM_OP])), ("L2", "miss", "load"));
}

#[test]
fn errors_not_panics() {
    let mut out = [FieldValue::EMPTY; idx::N];
    let c = DecodeCtx { size: 24, nr_counters: 1, cpu: 0, clock: 0, format_version: 0, reserved: 0 };
    // SAFETY: null pointers are what is being tested; the plugin must not use them.
    unsafe {
        assert_eq!(decode(core::ptr::null(), [0u8; 8].as_ptr(), 8, out.as_mut_ptr(), 27), DECODE_EFAULT);
        assert_eq!(decode(&c, core::ptr::null(), 8, out.as_mut_ptr(), 27), DECODE_EFAULT);
        assert_eq!(decode(&c, [0u8; 8].as_ptr(), 8, core::ptr::null_mut(), 27), DECODE_EFAULT);
        assert_eq!(decode(&c, [0u8; 8].as_ptr(), 8, out.as_mut_ptr(), 26), DECODE_ESPACE);
    }
    let fmt = PebsFormat::simulated(Layout::Adaptive, DseTable::Skylake);
    let r = rec(Layout::Adaptive, DATACFG_MEMINFO | DATACFG_GP, fmt, DsrcKind::LoadLatency, 0);
    for n in 0..r.len() {
        assert_eq!(call(&r[..n], &mut out), DECODE_ETRUNCATED, "length {n}");
    }
    let mut other = r.clone();
    other[0..4].copy_from_slice(&RecordType::DELTA.0.to_ne_bytes());
    assert_eq!(call(&other, &mut out), DECODE_EUNKNOWN);
    let mut bad = r.clone();
    bad[32 + 6] ^= 0x01; // the adaptive record's own size field
    assert_eq!(call(&bad, &mut out), DECODE_EMALFORMED);
}

/// xorshift64*.
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
    let fmt = PebsFormat::simulated(Layout::Adaptive, DseTable::LionCove);
    let valid = [
        rec(Layout::Adaptive, DATACFG_MEMINFO | datacfg_lbr(4), fmt, DsrcKind::LoadLatency, 0),
        rec(Layout::Skylake, 0, fmt, DsrcKind::StoreLatency, 0),
        rec(Layout::Core, 0, fmt, DsrcKind::None, 0),
    ];
    let mut ok = 0;
    for i in 0..100_000 {
        let len = (rng.next() % 400) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 2 == 0 && len >= 32 {
            // A plausible header so parsing gets past the first checks.
            let layout = (rng.next() % 6) as u32;
            b[0..4].copy_from_slice(&(RecordType::PEBS_BASE.0 + layout).to_ne_bytes());
            b[6..8].copy_from_slice(&(len as u16 & !7).to_ne_bytes());
            b[16..18].copy_from_slice(&((len as u16).saturating_sub(32)).to_ne_bytes());
            b[19] = 0;
            b[20..24].copy_from_slice(&0u32.to_ne_bytes());
        }
        if i % 5 == 0 {
            // A valid record with a few flipped bytes.
            b = valid[i % 3].clone();
            for _ in 0..3 {
                let at = (rng.next() as usize) % b.len();
                b[at] ^= rng.next() as u8 | 1;
            }
        }
        let rc = call(&b, &mut out);
        assert!((0..5).contains(&rc) || (-5..0).contains(&rc), "rc {rc}");
        if rc >= 0 {
            ok += 1;
            for f in [idx::XMM, idx::LBR] {
                if !absent_(&out[f]) {
                    let start = out[f].ptr as usize - b.as_ptr() as usize;
                    assert!(start + 8 * out[f].len as usize <= b.len());
                }
            }
        }
    }
    assert!(ok > 0, "no random record decoded; the test does not reach the decoder");
}
