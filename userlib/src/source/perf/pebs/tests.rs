//! PEBS through perf against the syscall fake: the `precise_ip` / `WEIGHT_STRUCT` /
//! `PHYS_ADDR` fallbacks by errno injection, and samples with known fields recorded
//! into a capture that decodes back to exactly those fields.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use hrperf_abi::capture::CHUNK_DATA;
use hrperf_fmt_pebs::datasrc::perf::*;
use hrperf_fmt_pebs::datasrc::{DsrcKind, Lock, MemAccess, MemLevel, MemOp, Tlb};
use hrperf_fmt_pebs::layout::{Layout, PebsFormat, DATACFG_MEMINFO};
use hrperf_fmt_pebs::record::{parse, FL_PERF_SOURCED, FL_TIME};

use super::super::fake::{FakeSys, Open};
use super::super::ring::tests::simple_record;
use super::super::ring::{PERF_RECORD_LOST, PERF_RECORD_SAMPLE};
use super::super::sys::PerfEventAttr;
use super::super::{parse_events, PerfConfig, PerfSource, Sampling, Target};
use super::*;
use crate::capture::Reader;
use crate::record::{record, RecordOptions};

fn pebs_cfg(events: &str) -> PerfConfig {
    let mut c = PerfConfig::new(
        parse_events(events).unwrap(),
        Sampling::Period(10_000),
        Target::Command(vec!["work".into()]),
    );
    c.mmap_pages = 1;
    c.pebs = true;
    c
}

fn open(fake: &Arc<FakeSys>, c: PerfConfig) -> Result<PerfSource, SourceError> {
    PerfSource::with_sys(c, Box::new(fake.clone()))
}

fn precise(a: &PerfEventAttr) -> u8 {
    ((a.flags >> ATTR_PRECISE_IP_SHIFT) & 3) as u8
}

/// `(cpu, precise_ip, weight_struct, phys_addr, ok)` of every open.
fn tries(opens: &[Open]) -> Vec<(i32, u8, bool, bool, bool)> {
    opens
        .iter()
        .map(|o| {
            (
                o.cpu,
                precise(&o.attr),
                o.attr.sample_type & PERF_SAMPLE_WEIGHT_STRUCT != 0,
                o.attr.sample_type & PERF_SAMPLE_PHYS_ADDR != 0,
                o.result.is_ok(),
            )
        })
        .collect()
}

fn hook(fake: &Arc<FakeSys>, f: impl FnMut(&PerfEventAttr, i32) -> Option<i32> + Send + 'static) {
    fake.state().open_hook = Some(Box::new(f));
}

#[test]
fn full_attr_when_everything_is_accepted() {
    let fake = FakeSys::new();
    let src = open(&fake, pebs_cfg("cycles")).unwrap();
    let s = fake.state();
    assert_eq!(
        tries(&s.opens),
        [(0, 3, true, true, true), (1, 3, true, true, true)]
    );
    let a = s.opens[0].attr;
    assert_eq!(a.sample_type, PEBS_SAMPLE_TYPE);
    assert_eq!(a.sample_type & super::super::sys::PERF_SAMPLE_READ, 0);
    assert_eq!(a.sample_period_or_freq, 10_000);
    let pebs = src.pebs().unwrap();
    assert_eq!(
        pebs.settings(1),
        Some(PebsSettings {
            precise_ip: 3,
            weight_struct: true,
            phys_addr: true
        })
    );
    assert!(src.notes().is_empty(), "{:?}", src.notes());
}

#[test]
fn precise_ip_falls_back_3_2_1() {
    let fake = FakeSys::new();
    hook(&fake, |a, _| (precise(a) > 1).then_some(libc::EOPNOTSUPP));
    let src = open(&fake, pebs_cfg("cycles")).unwrap();
    assert_eq!(
        tries(&fake.state().opens),
        [
            (0, 3, true, true, false),
            (0, 2, true, true, false),
            (0, 1, true, true, true),
            // The next CPU starts where the first settled.
            (1, 1, true, true, true),
        ]
    );
    assert_eq!(src.pebs().unwrap().precise_ip(), Some(1));
    assert!(src.notes()[0].contains("precise_ip 1"), "{:?}", src.notes());

    // EINVAL for the level: WEIGHT instead of WEIGHT_STRUCT is tried at each level
    // first (EINVAL is also how a kernel refuses WEIGHT_STRUCT), then the next level.
    let fake = FakeSys::new();
    hook(&fake, |a, _| (precise(a) > 1).then_some(libc::EINVAL));
    let src = open(&fake, pebs_cfg("cycles")).unwrap();
    let t = tries(&fake.state().opens);
    assert_eq!(
        &t[..5],
        [
            (0, 3, true, true, false),
            (0, 3, false, true, false),
            (0, 2, true, true, false),
            (0, 2, false, true, false),
            (0, 1, true, true, true),
        ]
    );
    assert!(src.pebs().unwrap().settings(0).unwrap().weight_struct);

    // An explicit :pp starts at 2.
    let fake = FakeSys::new();
    open(&fake, pebs_cfg("cycles:pp")).unwrap();
    assert_eq!(precise(&fake.state().opens[0].attr), 2);
}

#[test]
fn weight_struct_falls_back_to_weight() {
    let fake = FakeSys::new();
    hook(&fake, |a, _| {
        (a.sample_type & PERF_SAMPLE_WEIGHT_STRUCT != 0).then_some(libc::EINVAL)
    });
    let src = open(&fake, pebs_cfg("cycles")).unwrap();
    let s = fake.state();
    assert_eq!(
        tries(&s.opens),
        [
            (0, 3, true, true, false),
            (0, 3, false, true, true),
            (1, 3, false, true, true),
        ]
    );
    let st = s.opens[1].attr.sample_type;
    assert_eq!(st & PERF_SAMPLE_WEIGHT, PERF_SAMPLE_WEIGHT);
    assert_eq!(st, (PEBS_SAMPLE_TYPE & !PERF_SAMPLE_WEIGHT_STRUCT) | PERF_SAMPLE_WEIGHT);
    assert!(
        src.notes().iter().any(|n| n.contains("WEIGHT_STRUCT")),
        "{:?}",
        src.notes()
    );
}

#[test]
fn phys_addr_is_dropped_when_refused() {
    let fake = FakeSys::new();
    hook(&fake, |a, _| {
        (a.sample_type & PERF_SAMPLE_PHYS_ADDR != 0).then_some(libc::EACCES)
    });
    let src = open(&fake, pebs_cfg("cycles")).unwrap();
    assert_eq!(
        tries(&fake.state().opens),
        [
            (0, 3, true, true, false),
            (0, 3, true, false, true),
            (1, 3, true, false, true),
        ]
    );
    assert!(!src.pebs().unwrap().settings(0).unwrap().phys_addr);
    assert!(src.notes().iter().any(|n| n.contains("PHYS_ADDR")));
    // EACCES without PHYS_ADDR is the usual permission error.
    let fake = FakeSys::new();
    hook(&fake, |_, _| Some(libc::EACCES));
    let e = open(&fake, pebs_cfg("cycles")).unwrap_err().to_string();
    assert!(e.contains("perf_event_paranoid"), "{e}");
}

#[test]
fn no_precise_level_is_one_clear_error() {
    let fake = FakeSys::new();
    hook(&fake, |_, _| Some(libc::EOPNOTSUPP));
    let e = open(&fake, pebs_cfg("cycles")).unwrap_err().to_string();
    assert!(
        e.starts_with("no precise (PEBS) sampling for cycles on this machine: "),
        "{e}"
    );
    assert!(e.contains("3 (EOPNOTSUPP), 2 (EOPNOTSUPP), 1 (EOPNOTSUPP)"), "{e}");
    assert!(!e.contains('\n'));
    let s = fake.state();
    assert_eq!(s.opens.len(), 3);
    // The held command was disposed of.
    assert!(!s.killed.is_empty());
    drop(s);

    // No hardware PMU (this machine): ENOENT names the missing PMU.
    let fake = FakeSys::new();
    hook(&fake, |_, _| Some(libc::ENOENT));
    let e = open(&fake, pebs_cfg("cycles")).unwrap_err().to_string();
    assert!(
        e.starts_with("no precise (PEBS) sampling for cycles on this machine: no hardware PMU"),
        "{e}"
    );
    assert!(e.contains("--source sim") && !e.contains('\n'), "{e}");
    assert_eq!(fake.state().opens.len(), 1);
}

#[test]
fn bad_configurations_are_refused_before_anything_runs() {
    for (events, sampling, want) in [
        ("cpu-clock", Sampling::Period(1000), "software event"),
        ("cycles,instructions", Sampling::Period(1000), "one event"),
        (
            "cycles",
            Sampling::Poll {
                interval_ns: 1_000_000,
            },
            "-c PERIOD",
        ),
    ] {
        let fake = FakeSys::new();
        let c = PerfConfig {
            sampling,
            ..pebs_cfg(events)
        };
        let e = open(&fake, c).unwrap_err().to_string();
        assert!(e.contains(want), "{events}: {e}");
        let s = fake.state();
        assert!(s.opens.is_empty() && s.spawned.is_empty(), "{events}");
    }
}

/// One `PERF_RECORD_SAMPLE` for `settings.sample_type()`.
#[derive(Clone, Copy, Debug)]
struct Sample {
    ip: u64,
    tid: u32,
    time: u64,
    addr: u64,
    cpu: u32,
    weight: (u32, u16, u16),
    data_src: u64,
    phys: u64,
}

fn sample_bytes(s: &Sample, settings: PebsSettings) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&PERF_RECORD_SAMPLE.to_ne_bytes());
    v.extend_from_slice(&2u16.to_ne_bytes()); // misc: PERF_RECORD_MISC_USER
    v.extend_from_slice(&0u16.to_ne_bytes()); // size, below
    v.extend_from_slice(&s.ip.to_ne_bytes());
    v.extend_from_slice(&(s.tid + 1000).to_ne_bytes());
    v.extend_from_slice(&s.tid.to_ne_bytes());
    v.extend_from_slice(&s.time.to_ne_bytes());
    v.extend_from_slice(&s.addr.to_ne_bytes());
    v.extend_from_slice(&s.cpu.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    if settings.weight_struct {
        v.extend_from_slice(&s.weight.0.to_ne_bytes());
        v.extend_from_slice(&s.weight.1.to_ne_bytes());
        v.extend_from_slice(&s.weight.2.to_ne_bytes());
    } else {
        v.extend_from_slice(&u64::from(s.weight.0).to_ne_bytes());
    }
    v.extend_from_slice(&s.data_src.to_ne_bytes());
    if settings.phys_addr {
        v.extend_from_slice(&s.phys.to_ne_bytes());
    }
    let size = v.len() as u16;
    v[6..8].copy_from_slice(&size.to_ne_bytes());
    v
}

fn lvl(l: u64) -> u64 {
    s(l, LVL_SHIFT)
}

/// The five accesses of the test, as `perf_mem_data_src` values and what they decode to.
fn accesses() -> [(u64, MemLevel, Tlb, Lock); 5] {
    let load = s(OP_LOAD, OP_SHIFT);
    let tlb_hit = s(TLB_HIT | TLB_L1, TLB_SHIFT);
    [
        // L1 hit
        (
            load | lvl(LVL_HIT | LVL_L1) | s(LVLNUM_L1, LVLNUM_SHIFT) | s(SNOOP_NONE, SNOOP_SHIFT) | tlb_hit,
            MemLevel::L1,
            Tlb::Hit,
            Lock::Unlocked,
        ),
        // L3 hit
        (
            load | lvl(LVL_HIT | LVL_L3) | s(LVLNUM_L3, LVLNUM_SHIFT) | s(SNOOP_HIT, SNOOP_SHIFT) | tlb_hit,
            MemLevel::L3,
            Tlb::Hit,
            Lock::Unlocked,
        ),
        // local DRAM
        (
            load | lvl(LVL_HIT | LVL_LOC_RAM) | s(LVLNUM_RAM, LVLNUM_SHIFT) | s(SNOOP_MISS, SNOOP_SHIFT) | tlb_hit,
            MemLevel::LocalDram,
            Tlb::Hit,
            Lock::Unlocked,
        ),
        // a TLB miss (L2 hit)
        (
            load | lvl(LVL_HIT | LVL_L2) | s(LVLNUM_L2, LVLNUM_SHIFT) | s(TLB_MISS | TLB_L2, TLB_SHIFT),
            MemLevel::L2,
            Tlb::Miss,
            Lock::Unlocked,
        ),
        // a locked access (L1 hit)
        (
            load | lvl(LVL_HIT | LVL_L1) | s(LVLNUM_L1, LVLNUM_SHIFT) | s(LOCK_LOCKED, LOCK_SHIFT) | tlb_hit,
            MemLevel::L1,
            Tlb::Hit,
            Lock::Locked,
        ),
    ]
}

/// Records samples with known fields through the recorder and checks the capture.
fn record_and_check(fail: Option<u64>) {
    let fake = FakeSys::new();
    if let Some(bit) = fail {
        hook(&fake, move |a, _| (a.sample_type & bit != 0).then_some(libc::EINVAL));
    }
    let mut src = open(&fake, pebs_cfg("cycles:u")).unwrap();
    let pebs = src.pebs().unwrap();
    let settings = pebs.settings(0).unwrap();
    assert_eq!(settings.weight_struct, fail.is_none());
    let mut want = Vec::new();
    {
        let mut st = fake.state();
        let fds: Vec<i32> = st.opens.iter().filter_map(|o| o.result.ok()).collect();
        for (i, (ds, level, tlb, lock)) in accesses().into_iter().enumerate() {
            let cpu = (i % 2) as u32;
            let s = Sample {
                ip: 0x40_1000 + 0x10 * i as u64,
                tid: 7 + i as u32,
                time: 2_000_000 + 1000 * i as u64,
                addr: 0x7f00_0000_0000 + 0x1040 * i as u64,
                cpu,
                // cache latency, instruction latency, retire latency
                weight: (30 + 100 * i as u32, 5 + i as u16, if i == 4 { 9 } else { 0 }),
                data_src: ds,
                phys: 0x1_2345_6000 + i as u64,
            };
            st.rings.get_mut(&fds[cpu as usize]).unwrap().push(&sample_bytes(&s, settings));
            want.push((s, level, tlb, lock));
        }
        // perf lost 3 samples on CPU 1.
        st.rings
            .get_mut(&fds[1])
            .unwrap()
            .push(&simple_record(PERF_RECORD_LOST, &[0, 3]));
    }
    let opts = RecordOptions {
        format: "pebs".into(),
        host_info: false,
        perf_pebs: Some(pebs.clone()),
        ..RecordOptions::default()
    };
    let mut bytes = Vec::new();
    let sum = record(
        &mut src,
        &opts,
        &mut bytes,
        std::path::Path::new("perf-pebs.data"),
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!((sum.samples, sum.records, sum.drops, sum.source_lost), (5, 5, 0, 3));
    assert_eq!(sum.per_cpu.iter().map(|c| (c.cpu, c.records, c.drops, c.overflows)).collect::<Vec<_>>(), [(0, 3, 0, 3), (1, 2, 3, 2)]);
    assert_eq!(pebs.records(), 5);

    let reader = Reader::from_bytes("perf-pebs.data", bytes).unwrap();
    assert_eq!(reader.meta().format_name, "pebs");
    assert_eq!(reader.meta().format_uuid, hrperf_fmt_pebs::PEBS_UUID);
    let mut got = Vec::new();
    let mut stats = Vec::new();
    for chunk in reader.chunks() {
        let chunk = chunk.unwrap();
        stats = chunk.stats().map(|c| (c.cpu, c.records, c.drops)).collect::<Vec<_>>().into_iter().chain(stats).collect();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            got.push((chunk.cpu, rec.unwrap().bytes.to_vec()));
        }
    }
    assert_eq!(stats, [(0, 3, 0), (1, 2, 3)]);
    got.sort_by_key(|(_, b)| parse(b).unwrap().prefix.time_ns);
    assert_eq!(got.len(), 5);
    for ((chunk_cpu, b), (s, level, tlb, lock)) in got.iter().zip(&want) {
        let c = parse(b).unwrap();
        assert_eq!(*chunk_cpu, s.cpu);
        assert_eq!(c.pebs.layout, Layout::Adaptive);
        assert_eq!(c.pebs.data_cfg, DATACFG_MEMINFO);
        assert_eq!(c.dsrc_kind, DsrcKind::PerfMemDataSrc);
        assert_eq!(c.prefix.flags, FL_PERF_SOURCED | FL_TIME);
        assert_eq!((c.prefix.cpu, c.prefix.time_ns), (s.cpu, s.time));
        assert_eq!((c.pebs.ip, c.pebs.eventing_ip), (s.ip, Some(s.ip)));
        let m = c.pebs.mem.unwrap();
        assert_eq!((m.address, m.data_source), (s.addr, s.data_src));
        let fmt = c.prefix.pebs_format;
        assert_eq!(fmt.layout(), Some(Layout::Adaptive));
        if fail.is_none() {
            // WEIGHT_STRUCT: the hardware's split latency word.
            assert!(fmt.has(PebsFormat::INSTR_LATENCY));
            assert_eq!(m.latency, (u64::from(s.weight.0) << 32) | u64::from(s.weight.1));
            assert_eq!(fmt.has(PebsFormat::TIMING_INFO), s.weight.2 != 0);
            assert_eq!(c.pebs.retire_latency, s.weight.2);
        } else {
            assert!(!fmt.has(PebsFormat::INSTR_LATENCY) && !fmt.has(PebsFormat::TIMING_INFO));
            assert_eq!(m.latency, u64::from(s.weight.0));
        }
        let a = MemAccess::from_intel(fmt, c.dsrc_kind, m.data_source);
        assert_eq!((a.op, a.level, a.tlb, a.lock), (MemOp::Load, *level, *tlb, *lock), "{s:?}");
    }

    // `hrperf report --format pebs` reads the capture unchanged.
    let prof = crate::pebs_report::profile(&reader, 5).unwrap();
    assert_eq!((prof.records, prof.with_address, prof.malformed), (5, 5, 0));
    let levels: Vec<(MemLevel, u64, u64)> = prof.by_level.iter().map(|(l, b)| (*l, b.count, b.tlb_misses)).collect();
    assert_eq!(
        levels,
        [(MemLevel::L1, 2, 0), (MemLevel::L2, 1, 1), (MemLevel::L3, 1, 0), (MemLevel::LocalDram, 1, 0)]
    );

    // `hrperf decode`'s plugin, when the workspace build put it next to the test binary.
    let Some(so) = pebs_plugin() else {
        eprintln!("skipped the plugin check: libhrperf_decode_pebs.so not built (cargo build --workspace)");
        return;
    };
    let plugin = crate::plugin::Plugin::load(&so).unwrap();
    let ctx = crate::decode::decode_ctx(reader.meta(), 0);
    let mut scratch = crate::plugin::DecodeScratch::new();
    for ((_, b), (s, level, tlb, lock)) in got.iter().zip(&want) {
        let d = plugin.decode(&ctx, b, &mut scratch).unwrap();
        let f: std::collections::HashMap<String, String> =
            d.fields().map(|(k, v)| (k.name.clone(), format!("{v:?}"))).collect();
        assert_eq!(f["source"], format!("{:?}", crate::plugin::Value::Str("perf")));
        assert_eq!(f["data_addr"], format!("{:?}", crate::plugin::Value::Hex(s.addr)));
        assert_eq!(f["ip"], format!("{:?}", crate::plugin::Value::Hex(s.ip)));
        assert_eq!(f["time_ns"], format!("{:?}", crate::plugin::Value::Time(s.time)));
        assert_eq!(f["latency"], format!("{:?}", crate::plugin::Value::U64(u64::from(s.weight.0))));
        assert_eq!(f["mem_level"], format!("{:?}", crate::plugin::Value::Str(level.name())));
        let tlb = match tlb {
            Tlb::Hit => "hit",
            Tlb::Miss => "miss",
            Tlb::Unknown => "na",
        };
        assert_eq!(f["mem_tlb"], format!("{:?}", crate::plugin::Value::Str(tlb)));
        let lock = if *lock == Lock::Locked { "locked" } else { "no" };
        assert_eq!(f["mem_lock"], format!("{:?}", crate::plugin::Value::Str(lock)));
    }
}

/// `target/<profile>/libhrperf_decode_pebs.so` (the test binary is in `deps/` below it).
fn pebs_plugin() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let so = dir.join("libhrperf_decode_pebs.so");
    so.exists().then_some(so)
}

#[test]
fn samples_become_perf_sourced_pebs_records() {
    record_and_check(None);
}

#[test]
fn samples_with_plain_weight() {
    record_and_check(Some(PERF_SAMPLE_WEIGHT_STRUCT));
}

#[test]
fn short_or_hostile_samples_never_panic() {
    let settings = PebsSettings {
        precise_ip: 1,
        weight_struct: true,
        phys_addr: true,
    };
    let full = sample_bytes(
        &Sample {
            ip: 1,
            tid: 2,
            time: 3,
            addr: 4,
            cpu: 0,
            weight: (5, 6, 7),
            data_src: 8,
            phys: 9,
        },
        settings,
    );
    let st = settings.sample_type();
    let f = parse_sample(st, &Record::Single(&full)).unwrap();
    assert_eq!((f.ip, f.tid, f.time, f.addr, f.weight, f.data_src, f.phys_addr), (1, 2, 3, 4, (5, 6, 7), 8, 9));
    for n in 0..full.len() {
        assert_eq!(parse_sample(st, &Record::Single(&full[..n])), None, "{n} bytes");
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let junk: Vec<u8> = (0..(x % 96) as usize).map(|i| (x >> (i % 56)) as u8).collect();
        let _ = parse_sample(x, &Record::Single(&junk));
    }
}

/// `--pebs-ld-lat` reaches perf as the load-latency event's `config1` (perf's `ldlat`);
/// on any other event, or out of range, it is refused instead of ignored.
#[test]
fn load_latency_threshold_goes_to_config1_of_the_load_latency_event() {
    let fake = FakeSys::new();
    let mut c = pebs_cfg("r01cd");
    super::set_load_latency(&mut c.events, 30).unwrap();
    open(&fake, c).unwrap();
    let s = fake.state();
    assert!(s.opens.iter().all(|o| o.attr.config == 0x01cd && o.attr.config1 == 30));
    for (ev, cycles, want) in [("cycles", 30, "applies to the load-latency event"), ("r01cd", 0, "1 to 65535"), ("r01cd", 70_000, "1 to 65535")] {
        let mut c = pebs_cfg(ev);
        let e = super::set_load_latency(&mut c.events, cycles).unwrap_err().to_string();
        assert!(e.contains(want), "{ev} {cycles}: {e}");
    }
}
