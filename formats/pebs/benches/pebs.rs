//! The zero-copy PEBS format: decode and drain throughput per record layout, and the
//! format handler's cost per threshold interrupt.
//!
//! - `decode/<layout>`: `layout::decode` over 4096 records encoded back to back in one
//!   byte buffer (IP, TSC, data address and LBR count of each read and folded into a
//!   `black_box`ed value), records/s.
//! - `drain/<layout>`: the userspace zero-copy reader, `assist::drain` over a session
//!   buffer holding 4096 records written by the simulated assist: read in place, wrap
//!   each into a capture record (TSC converted to the capture clock, as the recorder
//!   does), records/s.
//! - `handler/threshold=<T>`: one threshold PMI dispatched through the engine
//!   (`CpuSession::dispatch`: counter virtualisation, `OverflowArg`, the PEBS handler,
//!   which answers NOTIFY|MASK) plus `CpuSession::restart` (the format resets
//!   `pebs_index`), with the DS area holding T records (adaptive basic+meminfo, 64 B).
//!   The simulated assist is not timed: each of 32 one-CPU sessions is filled once with
//!   T real records; before every timed batch the bench puts `pebs_index` back at T
//!   records (the store the hardware's assist would have made), then times one
//!   dispatch + restart per session. ns per interrupt and ns per record (= per
//!   interrupt / T) are printed on stderr for each T.
//!
//! What the numbers show (2-core development VM, one run of `cargo bench -p
//! hrperf-fmt-pebs --bench pebs`; the table is in formats/pebs/README.md):
//!
//! - The handler costs the same 10-14 ns per interrupt at T = 8, 64 and 512 records
//!   (10.1, 10.0, 9.4 ns; a second run on the shared VM: 9.9, 14.3, 14.0 ns, noise
//!   with no trend in T): it is O(1) per interrupt, not per record. It reads four DS
//!   words and bumps header counters; it never touches a record (`records_copied`
//!   stays 0, asserted after the run). Its cost per record therefore falls as 1/T:
//!   ≈1.3 ns at T = 8, 0.16 ns at T = 64, 0.02 ns at T = 512.
//! - The per-record work is all in userspace. `decode` runs at 120-140 M records/s for
//!   fmt0-fmt3, ~80 M/s for adaptive basic (+meminfo) and ~23 M/s once the GPR group
//!   is present; XMM and 32 LBR entries add nothing (they are read in place, not
//!   copied out), so the all-groups record decodes as fast as meminfo+GPR.
//! - `drain` (decode + wrap into a capture record, one copy of the record's bytes)
//!   runs at ~40 M records/s for the legacy layouts and small adaptive records,
//!   ~10 M/s with GPRs and ~8 M/s for the 1232-byte all-groups + 32 LBR record.
//!
//! The handler numbers are a simulation (no PEBS-capable PMU here, see the README): a
//! real PMI adds the interrupt entry/exit and the MSR accesses of `ds::restart`.

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hrperf_abi::format::{CTRL_MASK, CTRL_NOTIFY, MODE_OVERFLOW, SAMPLE_OVERFLOW};
use hrperf_abi::{Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{Buffer, CounterConfig, CpuSession, Registry, Sample, Selector, Session};
use hrperf_fmt_pebs::assist::{self, TscClock};
use hrperf_fmt_pebs::datasrc::DseTable;
use hrperf_fmt_pebs::ds::{ds_off, Counter};
use hrperf_fmt_pebs::format::{self, PebsArg, ARG_FL_PMU_PRESENT, DS_OFFSET, POLICY_LARGE};
use hrperf_fmt_pebs::layout::{
    self, datacfg_lbr, Gprs, LbrEntry, PebsSample, DATACFG_GP, DATACFG_MEMINFO, DATACFG_XMMS,
};
use hrperf_fmt_pebs::record::FL_SIMULATED;
use hrperf_fmt_pebs::{Layout, PebsFormat, PEBS_OPS, PEBS_UUID};

/// Records per decode / drain run.
const N: usize = 4096;
/// Sessions (CPUs) per timed handler batch.
const RIGS: usize = 32;
/// Records in the DS area at each threshold interrupt.
const THRESHOLDS: [u64; 3] = [8, 64, 512];
/// The handler bench's configuration: adaptive basic + meminfo (64-byte records).
const HANDLER_CFG: (Layout, u64) = (Layout::Adaptive, DATACFG_MEMINFO);

/// Every layout benchmarked: name, layout, `PEBS_DATA_CFG`.
const LAYOUTS: [(&str, Layout, u64); 8] = [
    ("fmt0-core", Layout::Core, 0),
    ("fmt1-nhm", Layout::Nehalem, 0),
    ("fmt2-hsw", Layout::Haswell, 0),
    ("fmt3-skl", Layout::Skylake, 0),
    ("adaptive-basic", Layout::Adaptive, 0),
    ("adaptive-basic+meminfo", Layout::Adaptive, DATACFG_MEMINFO),
    (
        "adaptive-meminfo+gpr",
        Layout::Adaptive,
        DATACFG_MEMINFO | DATACFG_GP,
    ),
    (
        "adaptive-all+32lbr",
        Layout::Adaptive,
        DATACFG_MEMINFO | DATACFG_GP | DATACFG_XMMS | datacfg_lbr(32),
    ),
];

/// Sample `i`: every field distinct, as the tests' `nth_sample`.
fn nth_sample(i: u64) -> PebsSample {
    let mut w = [0u64; layout::GPR_WORDS];
    for (k, v) in w.iter_mut().enumerate() {
        *v = 0x1111_0000_0000_0000 + ((k as u64) << 8) + i;
    }
    let mut s = PebsSample {
        regs: Gprs::from_legacy(&w),
        eventing_ip: 0x41_0000 + i,
        applicable_counters: 0,
        data_addr: 0x7f00_0000_0000 + 64 * i,
        data_source: i % 16,
        latency: 10 + i % 500,
        tsx_tuning: 0,
        tsc: 1_000_000 + 3_000 * i,
        ..PebsSample::default()
    };
    s.regs.ip = 0x40_0000 + i;
    for (k, x) in s.xmm.iter_mut().enumerate() {
        *x = 0x5800_0000_0000_0000 | (k as u64) | i << 8;
    }
    for (k, e) in s.lbr.iter_mut().enumerate() {
        let k = k as u64;
        *e = LbrEntry {
            from: 0x40_0000 + 16 * k + i,
            to: 0x50_0000 + 16 * k,
            info: k,
        };
    }
    s
}

/// `N` records of `layout` / `cfg` back to back.
fn encoded(layout: Layout, cfg: u64) -> Vec<u8> {
    let size = layout::record_size(layout, cfg).unwrap();
    let mut v = vec![0u8; N * size];
    for (i, out) in v.chunks_exact_mut(size).enumerate() {
        assert_eq!(
            layout::encode(layout, cfg, &nth_sample(i as u64), out),
            Ok(size)
        );
    }
    v
}

/// Decodes every record of `bytes`, folding a few fields so none is optimised away.
fn decode_all(layout: Layout, mut bytes: &[u8]) -> (u64, u64) {
    let (mut n, mut acc) = (0u64, 0u64);
    while !bytes.is_empty() {
        let r = match layout::decode(layout, bytes) {
            Ok(r) => r,
            Err(e) => panic!("record {n}: {e:?}"),
        };
        acc = acc.wrapping_add(r.ip)
            ^ r.tsc.unwrap_or(0)
            ^ r.mem.map_or(0, |m| m.address)
            ^ r.lbr_count() as u64;
        bytes = &bytes[r.size()..];
        n += 1;
    }
    (n, acc)
}

/// One CPU of a PEBS session over a `Vec<u64>` buffer (as `Rig` in `src/tests.rs`).
struct Rig {
    words: Vec<u64>,
    cpu: CpuSession,
    raw: u64,
    t: u64,
}

impl Rig {
    /// A session for `layout` / `cfg` whose area holds `capacity` records ("large
    /// PEBS": the threshold is `capacity - 1` records with one counter).
    fn new(layout: Layout, cfg: u64, capacity: u64) -> Rig {
        let fmt = PebsFormat::simulated(layout, DseTable::Skylake);
        let size = layout::record_size(layout, cfg).unwrap() as u64;
        let arg = PebsArg {
            flags: ARG_FL_PMU_PRESENT,
            pebs_format: fmt.0,
            policy: POLICY_LARGE,
            data_cfg: cfg,
            ld_lat_threshold: 3,
            area_size: capacity * size,
            ..PebsArg::new()
        };
        let params = SessionParams {
            size: std::mem::size_of::<SessionParams>() as u32,
            mode: MODE_OVERFLOW,
            nr_counters: 1,
            cpu: u32::MAX,
            sample_period: 10_000,
            poll_interval_ns: 0,
            data_size_hint: 0,
            flags: 0,
            reserved: 0,
        };
        let bytes = arg.to_bytes();
        let mut reg: Registry<4> = Registry::new();
        reg.register_static(&PEBS_OPS).unwrap();
        let f = reg.acquire(Selector::Uuid(PEBS_UUID)).unwrap();
        let counters = [CounterConfig {
            width: 48,
            max_rate_per_sec: 0,
        }];
        let s = Session::new(f, &params, &bytes, &counters).unwrap();
        let mut words = vec![0u64; (s.buffer_size() as usize).div_ceil(8)];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(3, &mut buf, &bytes).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        Rig {
            words,
            cpu,
            raw: 0,
            t: 0,
        }
    }

    fn buf(&mut self) -> Buffer<'_> {
        Buffer::from_words(&mut self.words).unwrap()
    }

    /// `n` simulated PEBS assists (the hardware's work); whether the last raised a PMI.
    fn fill(&mut self, n: u64) -> bool {
        let mut b = self.buf();
        let mut pmi = false;
        for i in 0..n {
            let o = assist::assist(&mut b, Counter::Gp(0), &nth_sample(i)).unwrap();
            assert!(o.written && !o.full, "record {i} did not fit");
            pmi = o.pmi;
        }
        pmi
    }

    fn pebs_index(&mut self) -> u64 {
        format::read_ds(&self.buf()).unwrap().pebs_index
    }

    /// Puts `pebs_index` back where the assist left it (one store, as the hardware).
    fn set_pebs_index(&mut self, index: u64) {
        let mut b = self.buf();
        b.private_mut(DS_OFFSET + ds_off::PEBS_INDEX, 1).unwrap()[0] = index;
    }

    /// The next threshold PMI, as the core builds it.
    fn next_pmi(&mut self) -> Sample {
        self.raw += 10_000;
        self.t += 1_000;
        let mut s = Sample {
            kind: SAMPLE_OVERFLOW,
            nr: 1,
            ovfl_counter: 0,
            time_ns: self.t,
            ..Sample::default()
        };
        s.raw[0] = self.raw;
        s
    }
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(N as u64));
    for (name, layout, cfg) in LAYOUTS {
        let bytes = encoded(layout, cfg);
        assert_eq!(decode_all(layout, &bytes).0, N as u64);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(decode_all(layout, black_box(&bytes))))
        });
    }
    g.finish();
}

fn bench_drain(c: &mut Criterion) {
    let mut g = c.benchmark_group("drain");
    g.throughput(Throughput::Elements(N as u64));
    let clock = TscClock {
        tsc_hz: 3_000_000_000,
        tsc_base: 0,
        time_base: 0,
    };
    for (name, layout, cfg) in LAYOUTS {
        let mut rig = Rig::new(layout, cfg, N as u64);
        rig.fill(N as u64);
        let buf = rig.buf();
        let drain = || {
            let mut bytes = 0usize;
            let st = assist::drain(&buf, 3, FL_SIMULATED, Some(clock), |r| {
                bytes += black_box(r).len()
            })
            .unwrap();
            (st, bytes)
        };
        let (st, _) = drain();
        assert_eq!((st.records, st.undecodable), (N as u64, 0));
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(drain()))
        });
    }
    g.finish();
}

fn bench_handler(c: &mut Criterion) {
    let mut g = c.benchmark_group("handler");
    g.throughput(Throughput::Elements(1));
    let (layout, cfg) = HANDLER_CFG;
    let want = CTRL_NOTIFY | CTRL_MASK;
    let mut results = vec![];
    for t in THRESHOLDS {
        // Each session's area holds t + 1 records; the threshold is t. The assist writes
        // t real records once; only the index is put back before each interrupt.
        let mut rigs: Vec<Rig> = (0..RIGS).map(|_| Rig::new(layout, cfg, t + 1)).collect();
        let mut full = vec![];
        for rig in &mut rigs {
            assert!(rig.fill(t), "the T-th record must reach the threshold");
            full.push(rig.pebs_index());
        }
        let (elapsed, interrupts, wrong) =
            (Cell::new(Duration::ZERO), Cell::new(0u64), Cell::new(0u64));
        g.bench_function(BenchmarkId::from_parameter(format!("threshold={t}")), |b| {
            let mut samples = Vec::with_capacity(RIGS);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                let mut bad = 0u64;
                while left > 0 {
                    let n = left.min(RIGS);
                    // Not timed: the hardware's assist (here: the index it advanced).
                    samples.clear();
                    for (rig, &index) in rigs[..n].iter_mut().zip(&full) {
                        rig.set_pebs_index(index);
                        samples.push(rig.next_pmi());
                    }
                    let start = Instant::now();
                    for (rig, s) in rigs[..n].iter_mut().zip(&samples) {
                        let mut b = Buffer::from_words(&mut rig.words).unwrap();
                        let ctrl = rig.cpu.dispatch(&mut b, black_box(s), &Services::NONE);
                        bad += u64::from(ctrl != want);
                        bad += u64::from(rig.cpu.restart(&mut b).unwrap() != 0);
                    }
                    total += start.elapsed();
                    left -= n;
                }
                elapsed.set(elapsed.get() + total);
                interrupts.set(interrupts.get() + iters);
                wrong.set(wrong.get() + bad);
                total
            });
        });
        assert_eq!(
            wrong.get(),
            0,
            "every interrupt must NOTIFY|MASK and every restart succeed"
        );
        for rig in &mut rigs {
            assert!(!rig.cpu.is_masked());
            let h = format::read_header(&rig.buf()).unwrap();
            assert_eq!(h.records_copied, 0, "the handler never copies a record");
            assert_eq!((h.threshold_hits, h.restarts), (h.overflows, h.overflows));
            assert_eq!((h.full, h.lost), (0, 0));
        }
        if interrupts.get() > 0 {
            // Not when only listing or filtering the benchmarks.
            let per_irq = elapsed.get().as_nanos() as f64 / interrupts.get() as f64;
            results.push((t, per_irq));
        }
    }
    g.finish();
    if results.is_empty() {
        return;
    }
    eprintln!("\nPEBS handler per threshold interrupt (engine dispatch + handler + restart; mean over warm-up and measurement):");
    for (t, per_irq) in results {
        eprintln!(
            "  T = {t:>3} records: {per_irq:7.2} ns per interrupt, {:7.3} ns per record",
            per_irq / t as f64
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1));
    targets = bench_decode, bench_drain, bench_handler
}
criterion_main!(benches);
