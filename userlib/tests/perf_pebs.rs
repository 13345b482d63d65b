//! PEBS through perf, from the public API: the synthesis of a perf sample into a
//! perf-sourced PEBS capture record (`hrperf_fmt_pebs::record::encode_perf`) read back
//! through `record::parse`, the layout decoder and the data-source decoder; and, on a
//! machine without a hardware PMU (the development VM), the one-line refusal.
//!
//! The perf source's open fallbacks and the recorder path run against the syscall fake
//! in `userlib/src/source/perf/pebs/tests.rs` (the fake is not public).

use hrperf::source::perf::{parse_events, PerfConfig, PerfSource, Sampling, Target};
use hrperf_fmt_pebs::datasrc::perf::*;
use hrperf_fmt_pebs::datasrc::{DsrcKind, HitMiss, Lock, MemAccess, MemLevel, MemOp, Snoop, Tlb};
use hrperf_fmt_pebs::layout::{self, Layout, PebsFormat, DATACFG_MEMINFO};
use hrperf_fmt_pebs::record::{
    encode_perf, parse, ParseError, PerfMemSample, FL_PERF_SOURCED, FL_TIME, HW_OFFSET, PERF_RECORD_SIZE,
};

fn lvl(l: u64) -> u64 {
    s(l, LVL_SHIFT)
}

/// `perf_mem_data_src` values as Linux reports them, and their decoding.
fn cases() -> Vec<(&'static str, u64, MemLevel, HitMiss, Snoop, Tlb, Lock)> {
    let load = s(OP_LOAD, OP_SHIFT);
    let tlb_hit = s(TLB_HIT | TLB_L1 | TLB_L2, TLB_SHIFT);
    vec![
        (
            "L1 hit",
            load | lvl(LVL_HIT | LVL_L1) | s(LVLNUM_L1, LVLNUM_SHIFT) | s(SNOOP_NONE, SNOOP_SHIFT) | tlb_hit,
            MemLevel::L1,
            HitMiss::Hit,
            Snoop::None,
            Tlb::Hit,
            Lock::Unlocked,
        ),
        (
            "L3 hit",
            load | lvl(LVL_HIT | LVL_L3) | s(LVLNUM_L3, LVLNUM_SHIFT) | s(SNOOP_HIT, SNOOP_SHIFT) | tlb_hit,
            MemLevel::L3,
            HitMiss::Hit,
            Snoop::Hit,
            Tlb::Hit,
            Lock::Unlocked,
        ),
        (
            "local DRAM",
            load | lvl(LVL_HIT | LVL_LOC_RAM) | s(LVLNUM_RAM, LVLNUM_SHIFT) | s(SNOOP_MISS, SNOOP_SHIFT) | tlb_hit,
            MemLevel::LocalDram,
            HitMiss::Hit,
            Snoop::Miss,
            Tlb::Hit,
            Lock::Unlocked,
        ),
        (
            "TLB miss",
            load | lvl(LVL_HIT | LVL_L2) | s(LVLNUM_L2, LVLNUM_SHIFT) | s(TLB_MISS | TLB_L2, TLB_SHIFT),
            MemLevel::L2,
            HitMiss::Hit,
            Snoop::Unknown,
            Tlb::Miss,
            Lock::Unlocked,
        ),
        (
            "lock",
            load | lvl(LVL_HIT | LVL_L1) | s(LVLNUM_L1, LVLNUM_SHIFT) | s(LOCK_LOCKED, LOCK_SHIFT) | tlb_hit,
            MemLevel::L1,
            HitMiss::Hit,
            Snoop::Unknown,
            Tlb::Hit,
            Lock::Locked,
        ),
    ]
}

#[test]
fn perf_samples_decode_to_exactly_their_fields() {
    for (i, (name, ds, level, hit, snoop, tlb, lock)) in cases().into_iter().enumerate() {
        for (instr, retire) in [(None, None), (Some(7u16), None), (Some(7), Some(40u16))] {
            let sample = PerfMemSample {
                cpu: 3,
                time_ns: Some(123_456_789 + i as u64),
                ip: 0xffff_ffff_8100_0000 + i as u64,
                addr: 0x7fff_0000_1000 + 64 * i as u64,
                data_src: ds,
                latency: 20 + 50 * i as u64,
                instr_latency: instr,
                retire_latency: retire,
            };
            let mut b = [0u8; PERF_RECORD_SIZE];
            assert_eq!(encode_perf(&sample, &mut b), Ok(PERF_RECORD_SIZE), "{name}");
            let c = parse(&b).unwrap();
            assert_eq!(c.prefix.flags, FL_PERF_SOURCED | FL_TIME, "{name}");
            assert_eq!((c.prefix.cpu, c.prefix.time_ns), (3, sample.time_ns.unwrap()));
            assert_eq!(c.dsrc_kind, DsrcKind::PerfMemDataSrc);
            assert_eq!(c.pebs.layout, Layout::Adaptive);
            // The hardware bytes decode on their own as an adaptive basic+meminfo record.
            let hw = layout::decode(Layout::Adaptive, &b[HW_OFFSET..]).unwrap();
            assert_eq!(hw, c.pebs);
            assert_eq!((hw.data_cfg, hw.size()), (DATACFG_MEMINFO, 64));
            assert_eq!((hw.ip, hw.eventing_ip, hw.tsc), (sample.ip, Some(sample.ip), Some(0)));
            let m = hw.mem.unwrap();
            assert_eq!((m.address, m.data_source), (sample.addr, ds), "{name}");
            let fmt = c.prefix.pebs_format;
            assert_eq!(fmt.layout(), Some(Layout::Adaptive));
            match instr {
                Some(n) => {
                    assert!(fmt.has(PebsFormat::INSTR_LATENCY));
                    assert_eq!((m.latency >> 32, m.latency & 0xffff), (sample.latency, u64::from(n)));
                }
                None => {
                    assert!(!fmt.has(PebsFormat::INSTR_LATENCY));
                    assert_eq!(m.latency, sample.latency);
                }
            }
            assert_eq!(fmt.has(PebsFormat::TIMING_INFO), retire.is_some());
            assert_eq!(hw.retire_latency, retire.unwrap_or(0));
            let a = MemAccess::from_intel(fmt, c.dsrc_kind, m.data_source);
            assert_eq!(
                (a.op, a.level, a.hit, a.snoop, a.tlb, a.lock),
                (MemOp::Load, level, hit, snoop, tlb, lock),
                "{name}"
            );
        }
    }
}

#[test]
fn latency_edges_and_small_buffers() {
    // A cache latency too wide for the split keeps the latency, not the instruction one.
    let wide = PerfMemSample { latency: 0x1_0000, instr_latency: Some(3), ..PerfMemSample::default() };
    assert!(!wide.pebs_format().has(PebsFormat::INSTR_LATENCY));
    assert_eq!(wide.latency_word(), 0x1_0000);
    // PERF_SAMPLE_WEIGHT beyond 32 bits saturates (the non-split word is read as 32 bits).
    let huge = PerfMemSample { latency: u64::MAX, ..PerfMemSample::default() };
    assert_eq!(huge.latency_word(), u64::from(u32::MAX));
    // No time: no FL_TIME.
    let mut b = [0u8; PERF_RECORD_SIZE];
    encode_perf(&PerfMemSample::default(), &mut b).unwrap();
    assert_eq!(parse(&b).unwrap().prefix.flags, FL_PERF_SOURCED);
    // Short output: an error, never a panic or half a record.
    for n in 0..PERF_RECORD_SIZE {
        let mut short = vec![0u8; n];
        assert_eq!(encode_perf(&huge, &mut short), Err(ParseError::NoSpace), "{n}");
    }
}

/// On a machine without a hardware PMU the perf source refuses PEBS in one line that
/// names precise sampling; with a PMU (not available to the project) this checks
/// nothing.
#[test]
fn no_pmu_means_no_precise_sampling() {
    let devices = std::path::Path::new("/sys/bus/event_source/devices");
    if ["cpu", "cpu_core", "cpu_atom"].iter().any(|d| devices.join(d).exists()) {
        eprintln!("skipped: this machine has a hardware PMU");
        return;
    }
    let mut cfg = PerfConfig::new(
        parse_events("cycles").unwrap(),
        Sampling::Period(10_000),
        Target::Command(vec!["true".into()]),
    );
    cfg.pebs = true;
    let e = PerfSource::new(cfg).unwrap_err().to_string();
    assert!(e.starts_with("no precise (PEBS) sampling for cycles on this machine: no hardware PMU"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}
