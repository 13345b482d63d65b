//! Tests: byte vectors built by hand from the documented layouts, robustness on bad
//! bytes, detection, and the zero-copy path end to end (engine session + PEBS_OPS +
//! simulated assist + drain + restart).

extern crate std;
use std::vec;
use std::vec::Vec;

use hrperf_abi::errno::{E2BIG, EINVAL, ENODEV};
use hrperf_abi::format::{CTRL_MASK, CTRL_NOTIFY, MODE_OVERFLOW, MODE_POLL, SAMPLE_OVERFLOW};
use hrperf_abi::{RecordType, Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{Buffer, CounterConfig, CpuSession, EngineError, Registry, Sample, Selector, Session};

use super::assist::{self, AssistOutcome};
use super::datasrc::{DseTable, DsrcKind, HitMiss, MemAccess, MemLevel, Snoop, Tlb};
use super::ds::Counter;
use super::format::{self, PebsArg, ARG_FL_PMU_PRESENT, POLICY_LARGE, POLICY_SINGLE};
use super::layout::*;
use super::record::{self, ParseError, Prefix, FL_SIMULATED};
use super::{PEBS_OPS, PEBS_UUID};

// ---------------------------------------------------------------- byte vectors

/// A record of `size` bytes with `words` (byte offset, value) stored little-endian,
/// independent of the encoder under test.
fn bytes_of(size: usize, words: &[(usize, u64)]) -> Vec<u8> {
    let mut b = vec![0u8; size];
    for &(off, v) in words {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Distinct values for the 18 GPR words, legacy order.
fn gpr_values() -> [u64; GPR_WORDS] {
    let mut w = [0u64; GPR_WORDS];
    for (i, v) in w.iter_mut().enumerate() {
        *v = 0x1111_0000_0000_0000 + ((i as u64) << 8) + 0xaa;
    }
    w
}

fn sample() -> PebsSample {
    let mut s = PebsSample {
        regs: Gprs::from_legacy(&gpr_values()),
        eventing_ip: 0x40_1230,
        applicable_counters: 0b101,
        data_addr: 0x7fff_dead_b000,
        data_source: 0x04 | 1 << 4,
        latency: 187,
        tsx_tuning: 0xff_0000_0033,
        tsc: 0x0123_4567_89ab_cdef,
        retire_latency: 0,
        ..PebsSample::default()
    };
    for (i, x) in s.xmm.iter_mut().enumerate() {
        *x = 0x5800_0000_0000_0000 | i as u64;
    }
    for (i, e) in s.lbr.iter_mut().enumerate() {
        let i = i as u64;
        *e = LbrEntry { from: 0x40_0000 + 16 * i, to: 0x50_0000 + 16 * i, info: 0x8000_0000_0000_0000 | i };
    }
    s
}

fn legacy_words(layout: Layout) -> Vec<(usize, u64)> {
    let s = sample();
    let mut w: Vec<(usize, u64)> = gpr_values().iter().enumerate().map(|(i, v)| (8 * i, *v)).collect();
    if layout as u32 >= 1 {
        w.extend([(144, s.applicable_counters), (152, s.data_addr), (160, s.data_source), (168, s.latency)]);
    }
    if layout as u32 >= 2 {
        w.extend([(176, s.eventing_ip), (184, s.tsx_tuning)]);
    }
    if layout as u32 >= 3 {
        w.push((192, s.tsc));
    }
    w
}

#[test]
fn legacy_layouts_field_by_field() {
    let s = sample();
    let g = gpr_values();
    for (layout, size) in [
        (Layout::Core, 144),
        (Layout::Nehalem, 176),
        (Layout::Haswell, 192),
        (Layout::Skylake, 200),
    ] {
        let want = bytes_of(size, &legacy_words(layout));
        // The encoder produces exactly the documented bytes.
        let mut out = vec![0xeeu8; 300];
        assert_eq!(encode(layout, 0, &s, &mut out), Ok(size), "{layout:?}");
        assert_eq!(&out[..size], &want[..], "{layout:?}");
        // The decoder reads every field back from the documented offsets.
        let r = decode(layout, &want).unwrap();
        assert_eq!(r.size(), size);
        let regs = r.regs.unwrap();
        assert_eq!(regs.to_legacy(), g);
        assert_eq!((regs.flags, regs.ip, regs.ax, regs.bx, regs.cx, regs.dx), (g[0], g[1], g[2], g[3], g[4], g[5]));
        assert_eq!((regs.si, regs.di, regs.bp, regs.sp, regs.r8, regs.r15), (g[6], g[7], g[8], g[9], g[10], g[17]));
        assert_eq!(r.ip, g[1]);
        let nhm = layout != Layout::Core;
        assert_eq!(r.applicable_counters, nhm.then_some(0b101));
        match r.mem {
            Some(m) => {
                assert!(nhm);
                assert_eq!((m.address, m.data_source, m.latency), (s.data_addr, s.data_source, 187));
                assert_eq!(m.tsx_tuning, (layout as u32 >= 2).then_some(s.tsx_tuning));
            }
            None => assert!(!nhm),
        }
        assert_eq!(r.eventing_ip, (layout as u32 >= 2).then_some(0x40_1230));
        assert_eq!(r.tsc, (layout == Layout::Skylake).then_some(s.tsc));
        assert_eq!((r.lbr_count(), r.xmm_bytes(), r.data_cfg), (0, None, 0));
        // Extra bytes after the record are not part of it.
        let mut longer = want.clone();
        longer.extend([1, 2, 3]);
        assert_eq!(decode(layout, &longer).unwrap().bytes, &want[..]);
        // A legacy layout refuses adaptive groups.
        assert_eq!(encode(layout, DATACFG_MEMINFO, &s, &mut out), Err(LayoutError::BadConfig));
    }
}

/// The bytes of an adaptive record for `cfg`, laid out by hand in the documented group
/// order: basic, meminfo, gprs (adaptive register order), xmm, lbr.
fn adaptive_bytes(cfg: u64) -> Vec<u8> {
    let s = sample();
    let mut size = 32;
    let mut w = vec![];
    let mut at = 32;
    if cfg & DATACFG_MEMINFO != 0 {
        w.extend([(at, s.data_addr), (at + 8, s.data_source), (at + 16, s.latency), (at + 24, s.tsx_tuning)]);
        at += 32;
    }
    if cfg & DATACFG_GP != 0 {
        let g = gpr_values();
        // flags ip ax cx dx bx sp bp si di r8..r15, from the legacy-ordered values.
        let order = [0, 1, 2, 4, 5, 3, 9, 8, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17];
        for (i, li) in order.iter().enumerate() {
            w.push((at + 8 * i, g[*li]));
        }
        at += 144;
    }
    if cfg & DATACFG_XMMS != 0 {
        for i in 0..32 {
            w.push((at + 8 * i, s.xmm[i]));
        }
        at += 256;
    }
    if cfg & DATACFG_LBRS != 0 {
        let n = ((cfg >> 24) & 0xff) as usize + 1;
        for i in 0..n {
            w.extend([(at, s.lbr[i].from), (at + 8, s.lbr[i].to), (at + 16, s.lbr[i].info)]);
            at += 24;
        }
    }
    size += at - 32;
    let format_size = ((size as u64) << 48) | cfg;
    w.extend([(0, format_size), (8, s.eventing_ip), (16, s.applicable_counters), (24, s.tsc)]);
    bytes_of(size, &w)
}

const ADAPTIVE_CASES: [(u64, usize); 7] = [
    (0, 32),
    (DATACFG_MEMINFO, 64),
    (DATACFG_GP, 176),
    (DATACFG_XMMS, 288),
    (datacfg_lbr(8), 32 + 8 * 24),
    (datacfg_lbr(32), 32 + 32 * 24),
    (DATACFG_MEMINFO | DATACFG_GP | DATACFG_XMMS | datacfg_lbr(32), 1232),
];

#[test]
fn adaptive_layouts_field_by_field() {
    let s = sample();
    for (cfg, size) in ADAPTIVE_CASES {
        assert_eq!(adaptive_size(cfg), size, "cfg {cfg:#x}");
        let want = adaptive_bytes(cfg);
        assert_eq!(want.len(), size);
        let mut out = vec![0u8; 2048];
        assert_eq!(encode(Layout::Adaptive, cfg, &s, &mut out), Ok(size), "cfg {cfg:#x}");
        assert_eq!(&out[..size], &want[..], "cfg {cfg:#x}");

        let r = decode(Layout::Adaptive, &want).unwrap();
        assert_eq!((r.size(), r.data_cfg, r.retire_latency), (size, cfg, 0));
        assert_eq!((r.ip, r.eventing_ip), (0x40_1230, Some(0x40_1230)));
        assert_eq!((r.applicable_counters, r.tsc), (Some(0b101), Some(s.tsc)));
        match r.mem {
            Some(m) => {
                assert_ne!(cfg & DATACFG_MEMINFO, 0);
                assert_eq!(m, MemInfo { address: s.data_addr, data_source: s.data_source, latency: 187, tsx_tuning: Some(s.tsx_tuning) });
            }
            None => assert_eq!(cfg & DATACFG_MEMINFO, 0),
        }
        match r.regs {
            Some(g) => assert_eq!(g, s.regs),
            None => assert_eq!(cfg & DATACFG_GP, 0),
        }
        match r.xmm(15) {
            Some(x) => assert_eq!(x, (s.xmm[30], s.xmm[31])),
            None => assert_eq!(cfg & DATACFG_XMMS, 0),
        }
        let n = lbr_entries(cfg);
        assert_eq!(r.lbr_count(), n);
        assert_eq!(r.lbr_bytes().len(), 24 * n);
        for i in 0..n {
            assert_eq!(r.lbr(i), Some(s.lbr[i]));
        }
        assert_eq!(r.lbr(n), None);
    }
    // Retire latency sits in format_size[47:32].
    let mut t = s;
    t.retire_latency = 0x1234;
    let mut out = [0u8; 64];
    encode(Layout::Adaptive, 0, &t, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), (32 << 48) | (0x1234 << 32));
    assert_eq!(decode(Layout::Adaptive, &out).unwrap().retire_latency, 0x1234);
    // Configurations the encoder refuses.
    assert_eq!(encode(Layout::Adaptive, 1 << 4, &s, &mut out), Err(LayoutError::BadConfig));
    assert_eq!(encode(Layout::Adaptive, datacfg_lbr(33), &s, &mut [0u8; 2048]), Err(LayoutError::BadConfig));
    assert_eq!(encode(Layout::Adaptive, DATACFG_GP, &s, &mut out), Err(LayoutError::NoSpace));
}

#[test]
fn truncated_and_malformed_records_are_errors() {
    let mut all: Vec<(Layout, Vec<u8>)> = [Layout::Core, Layout::Nehalem, Layout::Haswell, Layout::Skylake]
        .iter()
        .map(|&l| (l, bytes_of(l.fixed_size().unwrap(), &legacy_words(l))))
        .collect();
    all.extend(ADAPTIVE_CASES.iter().map(|&(c, _)| (Layout::Adaptive, adaptive_bytes(c))));
    for (layout, rec) in &all {
        for n in 0..rec.len() {
            assert_eq!(decode(*layout, &rec[..n]), Err(LayoutError::Truncated), "{layout:?} len {n}");
        }
    }
    let good = adaptive_bytes(DATACFG_MEMINFO);
    let set_fs = |v: u64| {
        let mut b = good.clone();
        b[..8].copy_from_slice(&v.to_le_bytes());
        b
    };
    // Size field disagreeing with the groups, unknown group bits, size zero.
    assert_eq!(decode(Layout::Adaptive, &set_fs((72 << 48) | 1)), Err(LayoutError::Malformed));
    assert_eq!(decode(Layout::Adaptive, &set_fs((64 << 48) | 1 | 1 << 5)), Err(LayoutError::Malformed));
    assert_eq!(decode(Layout::Adaptive, &set_fs(1)), Err(LayoutError::Malformed));
    // A consistent header claiming more groups than the bytes hold is truncated.
    assert_eq!(decode(Layout::Adaptive, &set_fs((176 << 48) | 2)), Err(LayoutError::Truncated));
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
    let mut rng = Rng(0x853c_49e6_748f_ea9b);
    let mut decoded = 0;
    for i in 0..60_000 {
        let len = (rng.next() % 1400) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 3 == 0 && len >= 8 {
            // A plausible adaptive header, so decoding gets past the first check.
            let cfg = rng.next() & (0xf | 0x1f << 24);
            let size = if i % 2 == 0 { adaptive_size(cfg) as u64 } else { rng.next() % 1400 };
            b[..8].copy_from_slice(&((size << 48) | cfg).to_le_bytes());
        }
        for l in [Layout::Core, Layout::Nehalem, Layout::Haswell, Layout::Skylake, Layout::Adaptive] {
            if let Ok(r) = decode(l, &b) {
                decoded += 1;
                assert!(r.size() <= b.len());
                assert_eq!(r.lbr_bytes().len(), 24 * r.lbr_count());
                let _ = (r.xmm(3), r.lbr(r.lbr_count().saturating_sub(1)));
                if let Some(m) = r.mem {
                    let _ = MemAccess::from_intel(PebsFormat(rng.next() as u32), DsrcKind::from_id(i as u8 % 8), m.data_source);
                }
            }
        }
        let _ = record::parse(&b);
    }
    assert!(decoded > 1000, "random input never reached a full decode");
}

// ---------------------------------------------------------------- capture records

#[test]
fn capture_record_roundtrip_and_errors() {
    let s = sample();
    let fmt = PebsFormat::simulated(Layout::Skylake, DseTable::Skylake);
    let prefix = Prefix { cpu: 7, pebs_format: fmt, dsrc_kind: DsrcKind::LoadLatency as u8, flags: FL_SIMULATED, time_ns: 0 };
    let mut out = vec![0u8; record::MAX_CAPTURE_RECORD];
    let n = record::encode_wrapped(Layout::Skylake, 0, &prefix, &s, &mut out).unwrap();
    assert_eq!(n, 32 + 200);
    let rec = &out[..n];
    assert_eq!(u32::from_ne_bytes(rec[0..4].try_into().unwrap()), RecordType::PEBS_BASE.0 + 3);
    assert_eq!(u16::from_ne_bytes(rec[6..8].try_into().unwrap()), 232);
    assert_eq!(&rec[32..], &bytes_of(200, &legacy_words(Layout::Skylake))[..]);
    let c = record::parse(rec).unwrap();
    assert_eq!((c.prefix, c.dsrc_kind), (prefix, DsrcKind::LoadLatency));
    assert_eq!((c.pebs.layout, c.pebs.tsc), (Layout::Skylake, Some(s.tsc)));
    let m = MemAccess::from_intel(c.prefix.pebs_format, c.dsrc_kind, c.pebs.mem.unwrap().data_source);
    assert_eq!((m.level, m.snoop, m.tlb), (MemLevel::L3, Snoop::None, Tlb::Miss));

    for k in 0..n {
        assert!(record::parse(&rec[..k]).is_err(), "len {k}");
    }
    let mut bad = rec.to_vec();
    bad[0..4].copy_from_slice(&RecordType::DELTA.0.to_ne_bytes());
    assert_eq!(record::parse(&bad), Err(ParseError::WrongType(0x1000)));
    let mut bad = rec.to_vec();
    bad[16..18].copy_from_slice(&192u16.to_ne_bytes());
    assert_eq!(record::parse(&bad), Err(ParseError::Malformed));
    let mut bad = rec.to_vec();
    bad[19] = 1;
    assert_eq!(record::parse(&bad), Err(ParseError::Malformed));
    let mut bad = rec.to_vec();
    bad[0..4].copy_from_slice(&(RecordType::PEBS_BASE.0 + 2).to_ne_bytes());
    assert_eq!(record::parse(&bad), Err(ParseError::Malformed), "hsw header over a skl record");
}

// ---------------------------------------------------------------- detection

#[test]
fn detection() {
    let intel = |model, pdcm| CpuInfo { intel: true, family: 6, model, ds: true, dtes64: true, pdcm, ..CpuInfo::default() };
    // Core 2 (Merom) without PERF_CAPABILITIES: fmt0.
    let f = detect(&intel(0x0f, false), None).unwrap();
    assert_eq!((f.format(), f.layout()), (0, Some(Layout::Core)));
    // Nehalem: fmt1, its table, no TLB bits.
    let f = detect(&intel(0x1a, true), Some(1 << 8 | cap_trap())).unwrap();
    assert_eq!((f.layout(), f.dse_table(), f.has(PebsFormat::NO_TLB), f.has(PebsFormat::TRAP)), (Some(Layout::Nehalem), DseTable::Nehalem, true, true));
    // Skylake-X: fmt3, pmem.
    let f = detect(&intel(0x55, true), Some(3 << 8)).unwrap();
    assert_eq!((f.layout(), f.dse_table(), f.has(PebsFormat::PMEM)), (Some(Layout::Skylake), DseTable::Skylake, true));
    // Ice Lake: fmt4 with baseline.
    let f = detect(&intel(0x7e, true), Some(4 << 8 | 1 << 14)).unwrap();
    assert_eq!((f.layout(), f.has(PebsFormat::BASELINE)), (Some(Layout::Adaptive), true));
    // Alder Lake E-core: Gracemont table; Sapphire Rapids fmt5: adaptive layout.
    let mut adl = intel(0x97, true);
    adl.atom_core = true;
    assert_eq!(detect(&adl, Some(4 << 8 | 1 << 14)).unwrap().dse_table(), DseTable::Gracemont);
    let f = detect(&intel(0x8f, true), Some(5 << 8 | 1 << 14 | 1 << 17)).unwrap();
    assert_eq!((f.layout(), f.has(PebsFormat::TIMING_INFO), f.has(PebsFormat::BLOCK)), (Some(Layout::Adaptive), true, true));
    // Baseline is ignored below fmt4, as in intel_ds_init.
    assert!(!detect(&intel(0x4e, true), Some(3 << 8 | 1 << 14)).unwrap().has(PebsFormat::BASELINE));
    // No PEBS.
    assert_eq!(detect(&CpuInfo::default(), None), Err(DetectError::NotIntel));
    assert_eq!(detect(&CpuInfo { ds: false, ..intel(0x55, true) }, None), Err(DetectError::NoDebugStore));
    assert_eq!(detect(&CpuInfo { dtes64: false, ..intel(0x55, true) }, None), Err(DetectError::NoDtes64));
    assert_eq!(detect(&CpuInfo { pebs_unavailable: true, ..intel(0x55, true) }, None), Err(DetectError::PebsUnavailable));
    assert_eq!(detect(&intel(0x55, true), Some(6 << 8)), Err(DetectError::UnknownFormat(6)));
    // The word is a plain u32 for the capture; zero is "unknown".
    assert_eq!(PebsFormat(0).layout(), None);
    assert_eq!(PebsFormat(f.0).layout(), Some(Layout::Adaptive));
}

fn cap_trap() -> u64 {
    super::ds::cap::PEBS_TRAP
}

// ---------------------------------------------------------------- the format, end to end

fn params(nr: u32, period: u64) -> SessionParams {
    SessionParams {
        size: core::mem::size_of::<SessionParams>() as u32,
        mode: MODE_OVERFLOW,
        nr_counters: nr,
        cpu: u32::MAX,
        sample_period: period,
        poll_interval_ns: 0,
        data_size_hint: 0,
        flags: 0,
        reserved: 0,
    }
}

fn arg_for(fmt: PebsFormat, data_cfg: u64, area: u64, policy: u32) -> PebsArg {
    PebsArg {
        flags: ARG_FL_PMU_PRESENT,
        pebs_format: fmt.0,
        policy,
        data_cfg,
        ld_lat_threshold: 3,
        area_size: area,
        ..PebsArg::new()
    }
}

fn session(p: &SessionParams, arg: &[u8]) -> Result<Session, EngineError> {
    let mut reg: Registry<4> = Registry::new();
    reg.register_static(&PEBS_OPS).unwrap();
    let fmt = reg.acquire(Selector::Uuid(PEBS_UUID)).unwrap();
    let counters = [CounterConfig { width: 48, max_rate_per_sec: 0 }; 1];
    Session::new(fmt, p, arg, &counters[..p.nr_counters as usize])
}

#[test]
fn validate_refuses_what_it_cannot_do() {
    let errno = |r: Result<Session, EngineError>| r.map(|_| 0).unwrap_or_else(|e| e.errno());
    let skl = PebsFormat::simulated(Layout::Skylake, DseTable::Skylake);
    let icl = PebsFormat::simulated(Layout::Adaptive, DseTable::Skylake);
    // No PEBS-capable PMU: no argument at all, or the core did not set the flag.
    assert_eq!(errno(session(&params(1, 1000), &[])), ENODEV);
    let mut a = arg_for(skl, 0, 0, 0);
    a.flags = 0;
    assert_eq!(errno(session(&params(1, 1000), &a.to_bytes())), ENODEV);
    assert_eq!(
        session(&params(1, 1000), &[]).unwrap_err(),
        EngineError::Format { call: "validate", errno: ENODEV }
    );
    // An unknown format word is no PEBS either.
    assert_eq!(errno(session(&params(1, 1000), &arg_for(PebsFormat(0), 0, 0, 0).to_bytes())), ENODEV);
    // Bad combinations.
    assert_eq!(errno(session(&params(1, 1000), &arg_for(skl, DATACFG_MEMINFO, 0, 0).to_bytes())), EINVAL);
    assert_eq!(errno(session(&params(1, 1000), &arg_for(icl, 1 << 5, 0, 0).to_bytes())), EINVAL);
    assert_eq!(errno(session(&params(1, 1000), &arg_for(icl, datacfg_lbr(64), 0, 0).to_bytes())), EINVAL);
    let mut p = params(1, 1000);
    p.mode = MODE_POLL;
    p.poll_interval_ns = 1000;
    assert_eq!(errno(session(&p, &arg_for(skl, 0, 0, 0).to_bytes())), EINVAL);
    assert_eq!(errno(session(&params(1, 1000), &arg_for(skl, 0, 100, 0).to_bytes())), EINVAL, "area < 1 record");
    assert_eq!(errno(session(&params(1, 1000), &arg_for(skl, 0, 0, 7).to_bytes())), EINVAL, "policy");
    // ABI rules: a longer argument with a non-zero tail.
    let mut long = arg_for(skl, 0, 0, 0).to_bytes().to_vec();
    long.extend([0u8; 8]);
    let n = long.len() as u32;
    long[0..4].copy_from_slice(&n.to_ne_bytes());
    assert_eq!(errno(session(&params(1, 1000), &long)), 0, "zero tail is fine");
    long[150] = 1;
    assert_eq!(errno(session(&params(1, 1000), &long)), E2BIG);
    // And the good ones size the buffer: header + DS + whole records.
    let s = session(&params(1, 1000), &arg_for(skl, 0, 4096, 0).to_bytes()).unwrap();
    assert_eq!(s.buffer_size(), 768 + 20 * 200);
    let s = session(&params(1, 1000), &arg_for(icl, DATACFG_MEMINFO | DATACFG_GP, 0, 0).to_bytes()).unwrap();
    assert_eq!(s.buffer_size(), 768 + (65536 / 208) * 208, "basic 32 + meminfo 32 + gprs 144");
}

/// One CPU of a PEBS session over a `Vec<u64>` buffer.
struct Rig {
    words: Vec<u64>,
    cpu: CpuSession,
    raw: u64,
    t: u64,
}

impl Rig {
    fn new(p: &SessionParams, arg: &PebsArg) -> Rig {
        let bytes = arg.to_bytes();
        let s = session(p, &bytes).unwrap();
        let mut words = vec![0u64; (s.buffer_size() as usize).div_ceil(8)];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(3, &mut buf, &bytes).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        Rig { words, cpu, raw: 0, t: 0 }
    }

    fn buf(&mut self) -> Buffer<'_> {
        Buffer::from_words(&mut self.words).unwrap()
    }

    fn assist(&mut self, s: &PebsSample) -> AssistOutcome {
        let mut b = Buffer::from_words(&mut self.words).unwrap();
        assist::assist(&mut b, Counter::Gp(0), s).unwrap()
    }

    /// The threshold PMI, dispatched through the engine as the core would.
    fn pmi(&mut self) -> u32 {
        self.raw += 1000;
        self.t += 1000;
        let mut sample = Sample { kind: SAMPLE_OVERFLOW, nr: 1, ovfl_counter: 0, time_ns: self.t, ..Sample::default() };
        sample.raw[0] = self.raw;
        let mut b = Buffer::from_words(&mut self.words).unwrap();
        self.cpu.dispatch(&mut b, &sample, &Services::NONE)
    }

    /// Wraps the records in place into capture records and parses them back.
    fn drain(&mut self) -> Vec<Vec<u8>> {
        let b = self.buf();
        let mut out = vec![];
        let st = assist::drain(&b, 3, FL_SIMULATED, None, |r| out.push(r.to_vec())).unwrap();
        assert_eq!((st.records as usize, st.undecodable), (out.len(), 0));
        out
    }

    fn restart(&mut self) {
        let mut b = Buffer::from_words(&mut self.words).unwrap();
        assert_eq!(self.cpu.restart(&mut b).unwrap(), 0);
    }

    fn header(&mut self) -> format::PebsHeader {
        format::read_header(&self.buf()).unwrap()
    }
}

fn nth_sample(i: u64) -> PebsSample {
    let mut s = sample();
    s.regs.ip = 0x40_0000 + i;
    s.regs.ax = i;
    s.eventing_ip = 0x41_0000 + i;
    s.data_addr = 0x7f00_0000_0000 + 64 * i;
    s.latency = 10 + i;
    s.data_source = i % 16;
    s.tsc = 1_000_000 + i;
    s.applicable_counters = 0;
    s.xmm[0] = i;
    s.lbr[0].from = i;
    s
}

/// Runs `n` samples through the zero-copy path and checks every record comes back.
fn end_to_end(fmt: PebsFormat, data_cfg: u64, n: u64, capacity: u64, policy: u32) {
    let layout = fmt.layout().unwrap();
    let size = record_size(layout, data_cfg).unwrap() as u64;
    let arg = arg_for(fmt, data_cfg, capacity * size, policy);
    let mut rig = Rig::new(&params(1, 10_000), &arg);
    let h = rig.header();
    assert_eq!((h.capacity, u64::from(h.record_size), h.layout), (capacity, size, layout.id()));
    let ds = format::read_ds(&rig.buf()).unwrap();
    let reload = (1u64 << 48) - 10_000;
    assert_eq!(ds.pebs_event_reset[0], reload, "default reset = -period");
    assert_eq!(ds.pebs_absolute_maximum - ds.pebs_buffer_base, capacity * size);
    let threshold = (ds.pebs_interrupt_threshold - ds.pebs_buffer_base) / size;
    assert_eq!(threshold, if policy == POLICY_SINGLE { 1 } else { capacity - 1 }, "large PEBS leaves one record per counter");

    let mut got: Vec<Vec<u8>> = vec![];
    let mut pmis = 0;
    for i in 0..n {
        let o = rig.assist(&nth_sample(i));
        assert!(o.written && !o.full, "sample {i}");
        assert_eq!(o.reload, reload);
        if o.pmi {
            pmis += 1;
            assert_eq!(rig.pmi(), CTRL_NOTIFY | CTRL_MASK, "threshold reached");
            assert!(rig.cpu.is_masked());
            got.extend(rig.drain());
            rig.restart();
            assert!(!rig.cpu.is_masked());
        }
    }
    got.extend(rig.drain()); // what is left when recording stops
    assert_eq!(pmis, n / threshold);

    // Every record generated is read back exactly.
    assert_eq!(got.len() as u64, n);
    for (i, rec) in got.iter().enumerate() {
        let c = record::parse(rec).unwrap();
        let mut want = nth_sample(i as u64);
        want.applicable_counters = 1; // the assist sets the counter's bit
        let mut hw = vec![0u8; size as usize];
        encode(layout, data_cfg, &want, &mut hw).unwrap();
        assert_eq!(c.pebs.bytes, &hw[..], "record {i}");
        assert_eq!((c.prefix.cpu, c.prefix.pebs_format, c.dsrc_kind), (3, fmt, DsrcKind::LoadLatency));
        assert_eq!(c.pebs.applicable_counters.unwrap_or(1), 1);
        if let Some(m) = c.pebs.mem {
            assert_eq!((m.address, m.latency), (want.data_addr, want.latency));
        }
    }
    let h = rig.header();
    assert_eq!(h.records_copied, 0, "the handler never copies a record");
    assert_eq!((h.overflows, h.threshold_hits, h.restarts), (pmis, pmis, pmis));
    assert_eq!((h.full, h.lost), (0, 0));
    assert_eq!(rig.buf().header().overflows, pmis);
}

#[test]
fn end_to_end_every_layout() {
    for layout in [Layout::Core, Layout::Nehalem, Layout::Haswell, Layout::Skylake] {
        let fmt = PebsFormat::simulated(layout, DseTable::Skylake);
        end_to_end(fmt, 0, 100, 16, POLICY_LARGE);
        end_to_end(fmt, 0, 7, 4, POLICY_SINGLE);
    }
    let icl = PebsFormat::simulated(Layout::Adaptive, DseTable::Skylake);
    for (cfg, _) in ADAPTIVE_CASES {
        end_to_end(icl, cfg, 60, 8, POLICY_LARGE);
    }
}

#[test]
fn buffer_full_without_restart_keeps_what_was_written() {
    let fmt = PebsFormat::simulated(Layout::Adaptive, DseTable::Skylake);
    let cfg = DATACFG_MEMINFO;
    let arg = arg_for(fmt, cfg, 5 * 64, POLICY_LARGE);
    let mut rig = Rig::new(&params(1, 10_000), &arg);
    let mut dispatched = 0;
    let mut ctrls = vec![];
    for i in 0..12 {
        let o = rig.assist(&nth_sample(i));
        assert_eq!(o.written, i < 5, "sample {i}");
        assert_eq!(o.full, i >= 5);
        if o.pmi {
            dispatched += 1;
            ctrls.push(rig.pmi());
        }
    }
    // The threshold (4 of 5 records) raised the first PMI; the format masked the CPU;
    // every later PMI was counted by the engine, not handed to the format.
    assert_eq!(ctrls[0], CTRL_NOTIFY | CTRL_MASK);
    assert!(ctrls[1..].iter().all(|&c| c == CTRL_MASK));
    let h = rig.header();
    assert_eq!((h.overflows, h.threshold_hits, h.records_copied), (1, 1, 0));
    assert_eq!(h.lost, 7, "seven records did not fit");
    let bh = rig.buf().header();
    assert_eq!((bh.overflows, bh.masked), (1, dispatched - 1));
    // Everything already written is intact.
    let got = rig.drain();
    assert_eq!(got.len(), 5);
    for (i, rec) in got.iter().enumerate() {
        let c = record::parse(rec).unwrap();
        assert_eq!(c.pebs.ip, 0x41_0000 + i as u64);
        assert_eq!(c.pebs.mem.unwrap().address, 0x7f00_0000_0000 + 64 * i as u64);
    }
    // A restart recycles the area; the next record lands at the base again.
    rig.restart();
    let o = rig.assist(&nth_sample(99));
    assert_eq!((o.written, o.offset), (true, 0));
    let h = rig.header();
    assert_eq!(h.restarts, 1);
    // Without restart, a PMI with the area full also counts `full` once unmasked.
    for i in 0..5 {
        rig.assist(&nth_sample(i));
    }
    assert_eq!(rig.pmi(), CTRL_NOTIFY | CTRL_MASK);
    assert_eq!(rig.header().full, 1);
}

#[test]
fn data_source_through_the_whole_path() {
    // A Skylake-table load-latency record: 0x0d with STLB miss = remote cache HITM.
    let fmt = PebsFormat::simulated(Layout::Adaptive, DseTable::Skylake);
    let mut rig = Rig::new(&params(1, 10_000), &arg_for(fmt, DATACFG_MEMINFO, 4 * 64, POLICY_SINGLE));
    let mut s = nth_sample(0);
    s.data_source = 0x0d | 1 << 4;
    assert!(rig.assist(&s).pmi);
    let rec = rig.drain().pop().unwrap();
    let c = record::parse(&rec).unwrap();
    let m = MemAccess::from_intel(c.prefix.pebs_format, c.dsrc_kind, c.pebs.mem.unwrap().data_source);
    assert_eq!((m.level, m.remote, m.snoop, m.tlb, m.hit), (MemLevel::RemoteCache, true, Snoop::HitM, Tlb::Miss, HitMiss::Hit));
}

#[test]
fn assist_refuses_foreign_buffers() {
    let mut words = vec![0u64; 256];
    let mut b = Buffer::from_words(&mut words).unwrap();
    assert_eq!(assist::assist(&mut b, Counter::Gp(0), &sample()), Err(assist::AssistError::NotPebs));
    assert!(assist::view(&b).is_err());
    let fmt = PebsFormat::simulated(Layout::Skylake, DseTable::Skylake);
    let mut rig = Rig::new(&params(1, 10_000), &arg_for(fmt, 0, 0, 0));
    let mut b = rig.buf();
    assert_eq!(assist::assist(&mut b, Counter::Fixed(0), &sample()), Err(assist::AssistError::BadCounter));
    // A corrupt index (not on a record boundary) is refused, not followed.
    let base = format::read_ds(&b).unwrap().pebs_buffer_base;
    assert!(format::store_index(&b, base + 3));
    assert_eq!(assist::assist(&mut b, Counter::Gp(0), &sample()), Err(assist::AssistError::Corrupt));
    assert_eq!(format::handle(&b), 0, "below the threshold: nothing to do");
}

#[test]
fn tsc_clock_converts_exactly_and_never_overflows() {
    let c = assist::TscClock { tsc_hz: 3_000_000_000, tsc_base: 300, time_base: 1_000 };
    assert_eq!(c.ns(300), Some(1_000));
    assert_eq!(c.ns(3_000_000_300), Some(1_000_001_000));
    assert_eq!(c.ns(u64::MAX), Some(1_000 + ((u64::MAX - 300) as u128 * 1_000_000_000 / 3_000_000_000) as u64));
    let huge = assist::TscClock { tsc_hz: 1, tsc_base: 0, time_base: u64::MAX - 5 };
    assert_eq!(huge.ns(u64::MAX), Some(u64::MAX));
    assert_eq!(assist::TscClock { tsc_hz: 0, ..c }.ns(5), None);
}
