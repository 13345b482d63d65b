//! The userspace path end to end on the simulated PMU: sim source → engine (64-bit
//! virtualisation, dispatch) → delta format → per-CPU ring → capture file → reader.
//!
//! Expected values are computed independently of the engine: the same seeded simulator is
//! run alone, its raw N-bit readings unwrapped here, and every decoded delta compared.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use hrperf::capture::Reader;
use hrperf::record::{record, RecordOptions, RecordSummary};
use hrperf::source::sim::{parse_events, SimConfig, SimSource, Workload};
use hrperf::source::{RawSample, Source};
use hrperf_abi::capture::CHUNK_DATA;
use hrperf_abi::format::{MODE_OVERFLOW, SAMPLE_OVERFLOW};
use hrperf_abi::RecordType;
use hrperf_fmt_delta::record::{parse, DeltaSample};

/// Runs the simulator alone (the reference the recording is checked against).
fn raw_run(cfg: &SimConfig) -> Vec<RawSample> {
    SimSource::new(cfg.clone()).unwrap().run_standalone().unwrap()
}

/// Expected cumulative 64-bit counts at each raw sample, per CPU, keyed by time: the
/// raw readings unwrapped (one wrap at most between reads, which the short intervals
/// guarantee), the leader's re-arm jumps taken out.
fn expected_cumulative(cfg: &SimConfig, samples: &[RawSample]) -> HashMap<(u32, u64), Vec<u64>> {
    let mask = if cfg.width == 64 { u64::MAX } else { (1u64 << cfg.width) - 1 };
    let nr = cfg.events.len();
    let src = SimSource::new(cfg.clone()).unwrap();
    let mut last: HashMap<u32, Vec<u64>> =
        (0..cfg.cpus).map(|c| (c, src.start_values(c)[..nr].to_vec())).collect();
    let mut total: HashMap<u32, Vec<u64>> = (0..cfg.cpus).map(|c| (c, vec![0; nr])).collect();
    let mut out = HashMap::new();
    for s in samples {
        let l = last.get_mut(&s.cpu).unwrap();
        let t = total.get_mut(&s.cpu).unwrap();
        for ((t, l), &raw) in t.iter_mut().zip(l.iter_mut()).zip(&s.raw) {
            *t += raw.wrapping_sub(*l) & mask;
            *l = raw;
        }
        out.insert((s.cpu, s.time_ns), t.clone());
        if s.kind == SAMPLE_OVERFLOW {
            l[0] = hrperf::source::sim::arm_value(cfg.width, cfg.period);
        }
    }
    out
}

fn record_sim(cfg: &SimConfig, opts: &RecordOptions, path: &Path) -> RecordSummary {
    let mut src = SimSource::new(cfg.clone()).unwrap();
    let file = std::fs::File::create(path).unwrap();
    record(&mut src, opts, file, path, &AtomicBool::new(false), &mut |_| {}).unwrap()
}

/// Every DATA record of the capture: (cpu, delta sample or LOST count).
fn decode_all(path: &Path) -> (Vec<DeltaSample>, HashMap<u32, u64>) {
    let reader = Reader::open(path).unwrap();
    let mut samples = Vec::new();
    let mut lost = HashMap::new();
    for chunk in reader.chunks() {
        let chunk = chunk.unwrap();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            let rec = rec.unwrap();
            if rec.kind() == RecordType::LOST {
                *lost.entry(chunk.cpu).or_insert(0) += rec.lost().unwrap().unwrap();
            } else {
                samples.push(parse(rec.bytes).unwrap());
            }
        }
    }
    (samples, lost)
}

fn check_against_truth(cfg: &SimConfig, decoded: &[DeltaSample]) {
    let raw = raw_run(cfg);
    let want = expected_cumulative(cfg, &raw);
    let nr = cfg.events.len();
    let mut cum: HashMap<u32, Vec<u64>> = HashMap::new();
    for d in decoded {
        let c = cum.entry(d.cpu).or_insert_with(|| vec![0; nr]);
        for (c, d) in c.iter_mut().zip(&d.deltas) {
            *c += d;
        }
        let w = want.get(&(d.cpu, d.time_ns)).unwrap_or_else(|| panic!("no raw sample at cpu {} t {}", d.cpu, d.time_ns));
        assert_eq!(&c[..], &w[..], "cpu {} at {} ns", d.cpu, d.time_ns);
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hrperf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn steady_poll_deltas_are_exact() {
    let mut cfg = SimConfig::new(parse_events("cycles,instructions,llc-misses").unwrap());
    cfg.workload = Workload::Steady;
    cfg.duration_ns = 1_000_000;
    cfg.poll_interval_ns = 100_000;
    let path = tmp("steady.data");
    let sum = record_sim(&cfg, &RecordOptions { host_info: false, ..RecordOptions::default() }, &path);
    let (decoded, lost) = decode_all(&path);
    assert_eq!(sum.drops, 0);
    assert!(lost.is_empty());
    assert_eq!(decoded.len(), 20);
    let cpu0: Vec<_> = decoded.iter().filter(|d| d.cpu == 0).collect();
    assert_eq!(cpu0.len(), 10);
    for d in &cpu0 {
        // 100 µs at 3 GHz, IPC 2, one LLC miss per 1000 instructions.
        assert_eq!(&d.deltas[..3], &[300_000, 600_000, 600]);
    }
    let cpu1: Vec<_> = decoded.iter().filter(|d| d.cpu == 1).collect();
    // CPU 1 reads 200 ns after the deadline: its first interval is 200 ns longer.
    assert_eq!(cpu1[0].time_ns, 100_200);
    assert_eq!(&cpu1[0].deltas[..3], &[300_600, 601_200, 601]);
    check_against_truth(&cfg, &decoded);
}

#[test]
fn phases_poll_across_40_and_48_bit_wraps() {
    for width in [40u8, 48] {
        let mut cfg = SimConfig::new(parse_events("cycles,instructions,llc-misses,branch-misses").unwrap());
        cfg.width = width;
        cfg.seed = 42;
        cfg.duration_ns = 20_000_000;
        cfg.poll_interval_ns = 50_000;
        cfg.counter_start = (1u64 << width) - 20_000_000; // wraps within ~7 ms
        let path = tmp(&format!("wrap{width}.data"));
        let sum = record_sim(&cfg, &RecordOptions { host_info: false, ..RecordOptions::default() }, &path);
        assert_eq!(sum.drops, 0);
        assert_eq!(sum.multi_wraps, 0);
        let (decoded, _) = decode_all(&path);
        assert_eq!(decoded.len(), 2 * 400);
        check_against_truth(&cfg, &decoded);
        // The counters really wrapped: raw readings went backwards during the run.
        let cpu0: Vec<u64> = raw_run(&cfg).iter().filter(|s| s.cpu == 0).map(|s| s.raw[0]).collect();
        assert!(cpu0.windows(2).any(|w| w[1] < w[0]), "no wrap in {width}-bit run");
    }
}

#[test]
fn overflow_mode_samples_carry_ips_and_exact_deltas() {
    let mut cfg = SimConfig::new(parse_events("cycles,instructions,llc-misses").unwrap());
    cfg.mode = MODE_OVERFLOW;
    cfg.period = 300_000; // 100 µs of cycles
    cfg.duration_ns = 10_000_000;
    cfg.width = 40;
    cfg.counter_start = (1 << 40) - 10_000_000;
    let path = tmp("ovf.data");
    let sum = record_sim(&cfg, &RecordOptions { host_info: false, ..RecordOptions::default() }, &path);
    let (decoded, _) = decode_all(&path);
    assert_eq!(sum.drops, 0);
    assert_eq!(decoded.len() as u64, sum.samples);
    assert!(decoded.len() > 50, "{} samples", decoded.len());
    assert!(decoded.iter().all(|d| d.ip != 0 && d.ovfl_counter == 0));
    check_against_truth(&cfg, &decoded);
}

#[test]
fn tiny_ring_counts_every_drop_and_loses_no_counts() {
    let mut cfg = SimConfig::new(parse_events("cycles,instructions,llc-misses").unwrap());
    cfg.mode = MODE_OVERFLOW;
    cfg.period = 3_000; // 1 µs: a million samples per second per CPU
    cfg.duration_ns = 5_000_000;
    cfg.tick_ns = 100;
    let opts = RecordOptions {
        host_info: false,
        data_size: 4096,
        wake_on_notify: false,
        drain_interval_ns: 1_000_000,
        ..RecordOptions::default()
    };
    let path = tmp("tiny.data");
    let sum = record_sim(&cfg, &opts, &path);
    let (decoded, lost) = decode_all(&path);
    let lost_total: u64 = lost.values().sum();
    assert!(sum.drops > 1000, "expected drops, got {}", sum.drops);
    // Every drop is counted, in the stats and by LOST records in the stream.
    assert_eq!(lost_total, sum.drops);
    let reader = Reader::open(&path).unwrap();
    let scan = reader.scan();
    assert_eq!(scan.totals().drops(), sum.drops);
    // Every sample was either written or counted as dropped.
    assert_eq!(decoded.len() as u64 + sum.drops, sum.samples);
    // Deltas of written records still add up to the true totals (nothing lost with them).
    check_against_truth(&cfg, &decoded);
}

#[test]
fn same_seed_gives_identical_bytes() {
    let mut cfg = SimConfig::new(parse_events("cycles,instructions").unwrap());
    cfg.duration_ns = 5_000_000;
    let opts = RecordOptions { host_info: false, ..RecordOptions::default() };
    let (a, b) = (tmp("rep-a.data"), tmp("rep-b.data"));
    record_sim(&cfg, &opts, &a);
    record_sim(&cfg, &opts, &b);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    cfg.seed = 9;
    record_sim(&cfg, &opts, &b);
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}
