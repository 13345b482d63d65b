//! ns per sample for engine dispatch + the delta handler (3 and 8 counters).
//!
//! Each sample is virtualised (40/48-bit counters with a known max rate, so the
//! multi-wrap check runs), turned into an `OverflowArg`, and written by the delta handler
//! into a 256 KiB ring. The ring is drained between batches of 1024 samples so it never
//! fills; `dispatch` times the dispatches only, `dispatch+drain` includes the drain.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hrperf_abi::format::{MODE_POLL, SAMPLE_POLL};
use hrperf_abi::{Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{Buffer, CounterConfig, CpuSession, Registry, RingReader, Sample, Selector, Session};
use hrperf_fmt_delta::{DELTA_OPS, DELTA_UUID};

const BATCH: usize = 1024;

struct Bench {
    words: Vec<u64>,
    cpu: CpuSession,
    next: Sample,
    nr: usize,
}

impl Bench {
    fn new(nr: usize) -> Bench {
        let mut reg: Registry<4> = Registry::new();
        reg.register_static(&DELTA_OPS).unwrap();
        let fmt = reg.acquire(Selector::Uuid(DELTA_UUID)).unwrap();
        let params = SessionParams {
            size: std::mem::size_of::<SessionParams>() as u32,
            mode: MODE_POLL,
            nr_counters: nr as u32,
            cpu: u32::MAX,
            sample_period: 0,
            poll_interval_ns: 10_000,
            data_size_hint: 256 << 10,
            flags: 0,
            reserved: 0,
        };
        let cfg: Vec<_> = (0..nr)
            .map(|i| CounterConfig { width: if i % 2 == 0 { 48 } else { 40 }, max_rate_per_sec: 5_000_000_000 })
            .collect();
        let s = Session::new(fmt, &params, &[], &cfg).unwrap();
        let mut words = vec![0u64; s.buffer_size() as usize / 8];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, &[]).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        let next = Sample { kind: SAMPLE_POLL, pid: 1, tid: 1, ovfl_counter: u32::MAX, nr: nr as u32, ..Sample::default() };
        Bench { words, cpu, next, nr }
    }

    /// The next `BATCH` samples: 10 µs apart, counters advancing at different rates.
    fn batch(&mut self, out: &mut Vec<Sample>) {
        out.clear();
        for _ in 0..BATCH {
            self.next.time_ns += 10_000;
            for i in 0..self.nr {
                self.next.raw[i] = self.next.raw[i].wrapping_add(20_000 + 7_919 * i as u64) & ((1 << 40) - 1);
            }
            out.push(self.next);
        }
    }

    fn dispatch_all(&mut self, samples: &[Sample]) {
        let mut buf = Buffer::from_words(&mut self.words).unwrap();
        for s in samples {
            black_box(self.cpu.dispatch(&mut buf, black_box(s), &Services::NONE));
        }
    }

    fn drain(&mut self) -> u64 {
        let buf = Buffer::from_words(&mut self.words).unwrap();
        let mut bytes = 0u64;
        RingReader::new(&buf).unwrap().drain(|r| bytes += r.len() as u64).unwrap();
        bytes
    }

    fn check_no_drops(&mut self) {
        let h = Buffer::from_words(&mut self.words).unwrap().header();
        assert_eq!(h.drops, 0, "the ring filled: the benchmark would measure drops");
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("delta");
    g.throughput(Throughput::Elements(1));
    for nr in [3usize, 8] {
        g.bench_function(BenchmarkId::new("dispatch", nr), |b| {
            let mut bench = Bench::new(nr);
            let mut samples = Vec::with_capacity(BATCH);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    bench.batch(&mut samples);
                    let n = left.min(BATCH);
                    let t = Instant::now();
                    bench.dispatch_all(&samples[..n]);
                    total += t.elapsed();
                    black_box(bench.drain());
                    left -= n;
                }
                total
            });
            bench.check_no_drops();
        });
        g.bench_function(BenchmarkId::new("dispatch+drain", nr), |b| {
            let mut bench = Bench::new(nr);
            let mut samples = Vec::with_capacity(BATCH);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    bench.batch(&mut samples);
                    let n = left.min(BATCH);
                    let t = Instant::now();
                    bench.dispatch_all(&samples[..n]);
                    black_box(bench.drain());
                    total += t.elapsed();
                    left -= n;
                }
                total
            });
            bench.check_no_drops();
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
