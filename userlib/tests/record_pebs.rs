//! The zero-copy PEBS path end to end on the simulated PMU: sim source with PEBS → the
//! simulated assist writes records into each CPU's DS-managed buffer → threshold PMI
//! dispatched through the engine to `PEBS_OPS` → the recorder reads the records in place
//! (`assist::drain`) and restarts → capture file → `hrperf_fmt_pebs::record::parse`.
//!
//! Expected values come from the simulator's own log of what its assist wrote
//! (`PebsPmu::generated`), re-encoded here with the documented layout encoder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use hrperf::capture::Reader;
use hrperf::record::{record, RecordError, RecordOptions, RecordSummary};
use hrperf::source::sim::pebs::{page_size_of, Generated, PebsConfig, PebsPmu, REGIONS};
use hrperf::source::sim::{parse_events, SimConfig, SimSource};
use hrperf_abi::capture::CHUNK_DATA;
use hrperf_abi::format::MODE_OVERFLOW;
use hrperf_fmt_pebs::datasrc::{MemAccess, MemLevel};
use hrperf_fmt_pebs::layout::{self, Layout, DATACFG_GP, DATACFG_MEMINFO, DATACFG_XMMS};
use hrperf_fmt_pebs::record::{parse, FL_SIMULATED, FL_TIME};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hrperf-pebs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn sim_cfg(layout: Layout, data_cfg: u64, area: u64, seed: u64) -> SimConfig {
    let mut cfg = SimConfig::new(parse_events("loads,cycles").unwrap());
    cfg.seed = seed;
    cfg.cpus = 2;
    cfg.duration_ns = 20_000_000;
    cfg.mode = MODE_OVERFLOW;
    cfg.period = 5_000;
    cfg.pebs = Some(PebsConfig { layout, data_cfg, area_size: area, keep_log: true, ..PebsConfig::new() });
    cfg
}

fn opts(pmu: PebsPmu) -> RecordOptions {
    RecordOptions {
        format: "pebs".into(),
        host_info: false,
        // Drain only on the threshold PMI (and at the end), so the accounting is exact.
        drain_interval_ns: 10_000_000_000,
        pebs_pmu: Some(pmu),
        ..RecordOptions::default()
    }
}

fn record_file(cfg: &SimConfig, opts: impl FnOnce(PebsPmu) -> RecordOptions, path: &Path) -> (RecordSummary, PebsPmu) {
    let mut src = SimSource::new(cfg.clone()).unwrap();
    let pmu = src.pebs_pmu().unwrap();
    let mut o = opts(pmu.clone());
    o.sim_config = cfg.describe(); // as the CLI does: regions and page sizes travel with the capture
    let file = std::fs::File::create(path).unwrap();
    let sum = record(&mut src, &o, file, path, &AtomicBool::new(false), &mut |_| {}).unwrap();
    (sum, pmu)
}

/// Every capture record, per CPU in order, as its raw bytes.
fn records(path: &Path) -> BTreeMap<u32, Vec<Vec<u8>>> {
    let reader = Reader::open(path).unwrap();
    let mut out: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    for chunk in reader.chunks() {
        let chunk = chunk.unwrap();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            out.entry(chunk.cpu).or_default().push(rec.unwrap().bytes.to_vec());
        }
    }
    out
}

/// Records one layout and checks every record against what the simulator generated,
/// and the zero-copy accounting. Returns the number of records.
fn check_layout(layout: Layout, data_cfg: u64) -> u64 {
    let pcfg = PebsConfig { layout, data_cfg, ..PebsConfig::new() };
    let size = layout::record_size(layout, data_cfg).unwrap() as u64;
    let capacity = 40;
    let cfg = sim_cfg(layout, data_cfg, capacity * size, 7);
    let path = tmp(&format!("l{}-{data_cfg:x}.data", layout.id()));
    let (sum, pmu) = record_file(&cfg, opts, &path);
    let got = records(&path);
    let gen: Vec<Generated> = pmu.generated();
    let mut total = 0;
    assert_eq!(sum.pebs.len(), 2);
    for p in &sum.pebs {
        let want: Vec<&Generated> = gen.iter().filter(|g| g.cpu == p.cpu).collect();
        let have = got.get(&p.cpu).map_or(&[][..], Vec::as_slice);
        assert!(want.len() > 100, "{layout:?} cpu {}: only {} records", p.cpu, want.len());
        assert_eq!(have.len(), want.len(), "{layout:?} {data_cfg:#x} cpu {}", p.cpu);
        for (i, (rec, g)) in have.iter().zip(&want).enumerate() {
            let c = parse(rec).unwrap();
            let mut hw = vec![0u8; size as usize];
            layout::encode(layout, data_cfg, &g.sample, &mut hw).unwrap();
            assert_eq!(c.pebs.bytes, &hw[..], "{layout:?} {data_cfg:#x} cpu {} record {i}", p.cpu);
            // Layouts with a TSC (Skylake, adaptive) carry the sample time in the
            // capture clock: the simulated TSC runs at 3 GHz from time 0.
            let timed = matches!(layout, Layout::Skylake | Layout::Adaptive);
            let flags = FL_SIMULATED | if timed { FL_TIME } else { 0 };
            assert_eq!((c.prefix.cpu, c.prefix.pebs_format, c.prefix.flags), (p.cpu, pcfg.pebs_format(), flags));
            assert_eq!(c.prefix.time_ns, if timed { g.sample.tsc / 3 } else { 0 });
            if timed {
                assert_eq!(c.prefix.time_ns, g.time_ns, "{layout:?} cpu {} record {i}", p.cpu);
            }
        }
        // Zero copy, and every record accounted for by threshold PMIs and restarts.
        let h = p.header;
        let threshold = h.capacity - 2; // large PEBS: one record of headroom per counter
        assert_eq!(h.capacity, capacity);
        assert_eq!(h.records_copied, 0, "the handler never copies a record");
        assert_eq!((h.overflows, h.threshold_hits), (p.hw.pmis, p.hw.pmis), "every PMI reached the threshold");
        assert_eq!(h.restarts, p.drains);
        assert!(p.drains == p.hw.pmis || p.drains == p.hw.pmis + 1, "one restart per PMI, plus the final drain");
        assert_eq!(p.records, p.hw.written);
        assert_eq!(p.records / threshold, p.hw.pmis, "{} records, threshold {threshold}", p.records);
        assert_eq!(p.records % threshold, p.records - p.hw.pmis * threshold);
        assert_eq!((h.lost, h.full, p.hw.full, p.hw.masked, p.hw.unattached), (0, 0, 0, 0, 0));
        assert_eq!(p.hw.assists, p.hw.written);
        total += p.records;
        eprintln!(
            "{layout:?} data_cfg {data_cfg:#x} cpu {}: {} records, {} threshold PMIs, {} restarts, {} copied",
            p.cpu, p.records, p.hw.pmis, h.restarts, h.records_copied
        );
    }
    assert_eq!(sum.drops + sum.masked, 0);
    assert_eq!(sum.records, total);
    total
}

#[test]
fn every_legacy_layout_decodes_to_what_the_simulator_wrote() {
    for layout in [Layout::Core, Layout::Nehalem, Layout::Haswell, Layout::Skylake] {
        check_layout(layout, 0);
    }
}

#[test]
fn adaptive_combinations_decode_to_what_the_simulator_wrote() {
    for cfg in [
        0,
        DATACFG_MEMINFO,
        DATACFG_MEMINFO | DATACFG_GP,
        DATACFG_XMMS,
        layout::datacfg_lbr(8),
        DATACFG_MEMINFO | DATACFG_GP | DATACFG_XMMS | layout::datacfg_lbr(32),
    ] {
        check_layout(Layout::Adaptive, cfg);
    }
}

#[test]
fn data_addresses_latencies_and_sources_are_realistic() {
    let cfg = sim_cfg(Layout::Adaptive, DATACFG_MEMINFO, 0, 3);
    let path = tmp("realistic.data");
    let (_, _) = record_file(&cfg, opts, &path);
    let mut by_level: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    let mut pages: BTreeMap<u64, u64> = BTreeMap::new();
    for recs in records(&path).values() {
        for rec in recs {
            let c = parse(rec).unwrap();
            let m = c.pebs.mem.unwrap();
            let a = MemAccess::from_intel(c.prefix.pebs_format, c.dsrc_kind, m.data_source);
            let name = match a.level {
                MemLevel::L1 => "L1",
                MemLevel::Lfb => "LFB",
                MemLevel::L2 => "L2",
                MemLevel::L3 => "L3",
                MemLevel::LocalDram => "DRAM",
                l => panic!("unexpected level {l:?}"),
            };
            let e = by_level.entry(name).or_insert((0, u64::MAX, 0));
            e.0 += 1;
            e.1 = e.1.min(m.latency);
            e.2 = e.2.max(m.latency);
            *pages.entry(page_size_of(m.address).expect("address in a simulated region")).or_default() += 1;
        }
    }
    // Latencies by level, as the simulator's table gives them.
    assert!(by_level["L1"].2 < 10 && by_level["L1"].1 >= 4, "{by_level:?}");
    assert!(by_level["L2"].1 >= 12 && by_level["L2"].2 < 20, "{by_level:?}");
    assert!(by_level["L3"].1 >= 40 && by_level["L3"].2 < 80, "{by_level:?}");
    assert!(by_level["DRAM"].1 >= 180, "{by_level:?}");
    // 4K, 2M (the huge array) and 1G (kernel direct map) pages all show up.
    for r in REGIONS {
        assert!(pages.get(&r.page_size).copied().unwrap_or(0) > 0, "{} pages: {pages:?}", r.name);
    }
}

#[test]
fn same_seed_same_bytes() {
    let a = tmp("seed-a.data");
    let b = tmp("seed-b.data");
    let c = tmp("seed-c.data");
    let cfg = sim_cfg(Layout::Adaptive, DATACFG_MEMINFO | DATACFG_GP, 0, 11);
    record_file(&cfg, opts, &a);
    record_file(&cfg, opts, &b);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let mut other = cfg.clone();
    other.seed = 12;
    record_file(&other, opts, &c);
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
}

#[test]
fn slow_reader_masks_and_counts_what_it_misses() {
    // The reader wakes only every 2 ms: after a threshold PMI the CPU stays masked (PEBS
    // disabled) until then; those overflows are counted, nothing written is lost.
    let cfg = sim_cfg(Layout::Skylake, 0, 16 * 200, 5);
    let path = tmp("slow.data");
    let slow = |pmu| RecordOptions { wake_on_notify: false, drain_interval_ns: 2_000_000, ..opts(pmu) };
    let (sum, _) = record_file(&cfg, slow, &path);
    let got = records(&path);
    let mut masked = 0;
    for p in &sum.pebs {
        assert_eq!(p.records, p.hw.written);
        assert_eq!(got[&p.cpu].len() as u64, p.records);
        assert_eq!(p.header.records_copied, 0);
        assert!(p.hw.masked > 0, "cpu {}: {:?}", p.cpu, p.hw);
        assert_eq!((p.hw.unattached, p.hw.full, p.header.lost), (0, 0, 0));
        masked += p.hw.masked;
    }
    assert_eq!(sum.masked, masked, "overflows while masked are reported");
}

#[test]
fn pebs_without_a_pebs_pmu_is_refused() {
    let mut cfg = SimConfig::new(parse_events("loads").unwrap());
    cfg.mode = MODE_OVERFLOW;
    cfg.period = 5_000;
    cfg.duration_ns = 1_000_000;
    let mut src = SimSource::new(cfg).unwrap();
    let o = RecordOptions { format: "pebs".into(), host_info: false, ..RecordOptions::default() };
    let path = tmp("nopmu.data");
    let file = std::fs::File::create(&path).unwrap();
    let e = record(&mut src, &o, file, &path, &AtomicBool::new(false), &mut |_| {}).unwrap_err();
    assert!(matches!(e, RecordError::NoPebsPmu { .. }), "{e}");
    assert!(e.to_string().contains("needs a PEBS-capable PMU"), "{e}");
}

#[test]
fn report_profile_matches_what_the_simulator_generated() {
    use hrperf::pebs_report::{lat_bucket, profile};
    use hrperf_fmt_pebs::datasrc::DsrcKind;
    let cfg = sim_cfg(Layout::Adaptive, DATACFG_MEMINFO, 0, 9);
    let path = tmp("report.data");
    let (_, pmu) = record_file(&cfg, opts, &path);
    let gen = pmu.generated();
    let p = profile(&Reader::open(&path).unwrap(), 5).unwrap();
    assert_eq!((p.records, p.with_address, p.malformed), (gen.len() as u64, gen.len() as u64, 0));
    // Page sizes come from the regions stored in the capture.
    let mut sizes: BTreeMap<Option<u64>, u64> = BTreeMap::new();
    let mut levels: BTreeMap<&str, u64> = BTreeMap::new();
    let mut hist = [0u64; hrperf::pebs_report::LAT_BUCKETS];
    let fmt = PebsConfig::new().pebs_format();
    for g in &gen {
        *sizes.entry(page_size_of(g.sample.data_addr)).or_default() += 1;
        let m = MemAccess::from_intel(fmt, DsrcKind::LoadLatency, g.sample.data_source);
        *levels.entry(m.level.name()).or_default() += 1;
        hist[lat_bucket(g.sample.latency)] += 1;
    }
    let got_sizes: BTreeMap<Option<u64>, u64> = p.by_page_size.iter().map(|(s, b)| (*s, b.count)).collect();
    assert_eq!(got_sizes, sizes);
    assert!(got_sizes.contains_key(&Some(2 << 20)) && got_sizes.contains_key(&Some(1 << 30)));
    let got_levels: BTreeMap<&str, u64> = p.by_level.iter().map(|(l, b)| (l.name(), b.count)).collect();
    assert_eq!(got_levels, levels);
    assert_eq!(p.latency_hist, hist);
    assert_eq!(p.top_lines.len(), 5);
    assert!(p.top_lines.windows(2).all(|w| w[0].1.count >= w[1].1.count));
    // By function: every sampled IP lies in a function of the simulated program or
    // kernel, found here from the simulator's own table, independently of the symbolizer.
    use hrperf::source::sim::stacks::{KERNEL_FUNCS, USER_FUNCS};
    let mut funcs: BTreeMap<String, u64> = BTreeMap::new();
    for g in &gen {
        let ip = g.sample.eventing_ip;
        let f = USER_FUNCS.iter().chain(KERNEL_FUNCS).find(|f| (f.start..f.start + f.size).contains(&ip));
        *funcs.entry(f.map_or("none".into(), |f| f.name.to_string())).or_default() += 1;
    }
    assert!(!funcs.contains_key("none"), "{funcs:?}");
    let all = profile(&Reader::open(&path).unwrap(), 1000).unwrap();
    let got: BTreeMap<String, u64> = all.top_symbols.iter().map(|(n, _, b)| (n.clone(), b.count)).collect();
    assert_eq!(got, funcs);
    assert!(funcs.len() >= 4, "{funcs:?}");
}
