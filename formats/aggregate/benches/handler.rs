//! ns per sample for the aggregating format's handler (hashing included), for `ip` and
//! `(pid, ip)` keys, alone and behind engine dispatch; and the bytes that cross to
//! userspace per sample, compared with the delta format on the same synthetic run.
//!
//! Workload: 2 counters (the sampling counter and the summed one, 48-bit), 1000
//! distinct IPs with a skewed distribution (hot keys dominate, as in real profiles),
//! 16 pids, samples 10 µs apart; tables of 4096 slots. The timings use the harder
//! variant, pids independent of IPs (16,000 `(pid, ip)` keys). Between batches of 1024 samples
//! (outside the timed part) the consumer drains the published interval in place and
//! requests a switch, so the handler switches tables all the time, as in a recording.
//!
//! - `handler/<key>`: `hrperf_fmt_aggregate::handle` on a prepared `OverflowArg`.
//! - `dispatch/<key>`: `CpuSession::dispatch` (virtualisation + `OverflowArg` + handler),
//!   directly comparable with `formats/delta/benches/dispatch.rs`.
//!
//! The bytes comparison is printed before the timings: for the same 1,000,000 samples,
//! what the delta format's ring carries (one record per sample) against what the
//! aggregate drain reads in place (table header + slot array per interval) and writes
//! to the capture (INTERVAL + ENTRY records), for intervals of 1024, 10,240 and
//! 102,400 samples (10 ms, 100 ms and 1 s at this rate), with pids tied to IPs (a
//! profile: 1000 keys) and independent of them (16,000 keys).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hrperf_abi::format::{MODE_OVERFLOW, SAMPLE_OVERFLOW};
use hrperf_abi::{OverflowArg, Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{
    Buffer, CounterConfig, CpuSession, Registry, RingReader, Sample, Selector, Session,
};
use hrperf_fmt_aggregate::consumer::{Access, AggView};
use hrperf_fmt_aggregate::record::{KEY_IP, KEY_PID_IP};
use hrperf_fmt_aggregate::{AggregateArg, AGGREGATE_OPS};
use hrperf_fmt_delta::DELTA_OPS;

const BATCH: usize = 1024;
const KEYS: u64 = 1000;
const PIDS: u64 = 16;
const MASK48: u64 = (1 << 48) - 1;

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

/// The synthetic sample stream (raw, before virtualisation).
struct Gen {
    rng: Rng,
    next: Sample,
    value: u64,
    /// The pid is a function of the IP (each address belongs to one process, as in a
    /// profile): 1000 distinct `(pid, ip)` keys. Else uniform and independent: 16,000.
    correlated: bool,
}

impl Gen {
    fn new(correlated: bool) -> Gen {
        let next = Sample {
            kind: SAMPLE_OVERFLOW,
            ovfl_counter: 0,
            nr: 2,
            kernel_ip: true,
            ..Sample::default()
        };
        Gen {
            rng: Rng(0x5eed),
            next,
            value: 0,
            correlated,
        }
    }

    fn sample(&mut self) -> Sample {
        let r = self.rng.next();
        // Skewed: the product of two uniforms favours small key indices.
        let key = (r % KEYS) * ((r >> 20) % KEYS) / KEYS;
        let pid = if self.correlated {
            key % PIDS
        } else {
            (r >> 40) % PIDS
        };
        self.next.time_ns += 10_000;
        self.value += 20_000 + (r >> 50) % 4_096;
        self.next.ip = 0xffff_ffff_8100_0000 + key * 0x40;
        self.next.pid = 1000 + pid as u32;
        self.next.tid = self.next.pid;
        self.next.raw[0] = self.next.time_ns & MASK48;
        self.next.raw[1] = self.value & MASK48;
        self.next
    }

    fn batch(&mut self, out: &mut Vec<Sample>) {
        out.clear();
        out.extend((0..BATCH).map(|_| self.sample()));
    }
}

fn params() -> SessionParams {
    SessionParams {
        size: std::mem::size_of::<SessionParams>() as u32,
        mode: MODE_OVERFLOW,
        nr_counters: 2,
        cpu: u32::MAX,
        sample_period: 10_000,
        poll_interval_ns: 0,
        data_size_hint: 256 << 10,
        flags: 0,
        reserved: 0,
    }
}

const CFG: [CounterConfig; 2] = [CounterConfig {
    width: 48,
    max_rate_per_sec: 5_000_000_000,
}; 2];

/// One CPU's session of either format, with its buffer.
struct Rig {
    words: Vec<u64>,
    cpu: CpuSession,
}

impl Rig {
    fn new(ops: &'static hrperf_abi::format::FormatOps, arg: &[u8]) -> Rig {
        let mut reg: Registry<4> = Registry::new();
        reg.register_static(ops).unwrap();
        let fmt = reg.acquire(Selector::Uuid(ops.uuid)).unwrap();
        let s = Session::new(fmt, &params(), arg, &CFG).unwrap();
        let mut words = vec![0u64; (s.buffer_size() as usize).div_ceil(8)];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, arg).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        Rig { words, cpu }
    }

    fn aggregate(key: u32) -> Rig {
        let a = AggregateArg {
            key,
            slots: 4096,
            counter: 1,
            ..AggregateArg::default()
        };
        Rig::new(&AGGREGATE_OPS, &a.to_bytes())
    }

    fn dispatch_all(&mut self, samples: &[Sample]) {
        let mut buf = Buffer::from_words(&mut self.words).unwrap();
        for s in samples {
            black_box(self.cpu.dispatch(&mut buf, black_box(s), &Services::NONE));
        }
    }

    /// The `OverflowArg`s dispatch would build (for timing the handler alone).
    fn args(&mut self, samples: &[Sample], out: &mut Vec<OverflowArg>) {
        out.clear();
        let mut v = self.cpu.values();
        for s in samples {
            v[0] = s.raw[0];
            v[1] = s.raw[1];
            out.push(OverflowArg {
                size: std::mem::size_of::<OverflowArg>() as u32,
                kind: s.kind,
                cpu: 0,
                pid: s.pid,
                tid: s.tid,
                ovfl_counter: 0,
                nr_counters: 2,
                multi_wrap: 0,
                time_ns: s.time_ns,
                ip: s.ip,
                addr: 0,
                last_reset: 0,
                values: v,
                flags: 1,
                reserved: 0,
            });
        }
    }

    fn view(&mut self) -> AggView<'_> {
        let len = self.words.len() * 8;
        let ptr = std::ptr::NonNull::new(self.words.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: the words outlive the view (borrowed through `self`).
        unsafe { AggView::from_raw(ptr, len, Access::ReadWrite) }.unwrap()
    }

    /// Aggregate: drains the published interval (if any) into records and asks for a
    /// switch. Returns (table bytes read in place, capture bytes written, samples).
    fn drain_aggregate(&mut self, switch: bool) -> (u64, u64, u64) {
        let view = self.view();
        let mut out = (0, 0, 0);
        if let Some(iv) = view.pending() {
            // In place: the header and the slot array (entries are found by scanning).
            out.0 = 128 + 32 * view.slots() as u64;
            let s = iv.emit_records(|r| out.1 += r.len() as u64);
            out.2 = s.samples;
            view.ack(iv).unwrap();
        }
        if switch {
            view.request_switch().unwrap();
        }
        out
    }

    /// Delta: drains the ring; returns the bytes read.
    fn drain_delta(&mut self) -> u64 {
        let buf = Buffer::from_words(&mut self.words).unwrap();
        let mut bytes = 0u64;
        RingReader::new(&buf)
            .unwrap()
            .drain(|r| bytes += r.len() as u64)
            .unwrap();
        assert_eq!(buf.header().drops, 0);
        bytes
    }
}

/// Bytes per sample crossing to userspace: delta vs aggregate, same 1,000,000 samples.
fn bytes_report() {
    const N: usize = 1_000_000;
    let mut delta = Rig::new(&DELTA_OPS, &[]);
    let mut g = Gen::new(true);
    let mut samples = Vec::with_capacity(BATCH);
    let mut delta_bytes = 0;
    for _ in 0..N / BATCH {
        g.batch(&mut samples);
        delta.dispatch_all(&samples);
        delta_bytes += delta.drain_delta();
    }
    let n = (N / BATCH * BATCH) as f64;
    println!("bytes to userspace per sample, {} samples, {KEYS} IPs (skewed), {PIDS} pids, 4096-slot tables:", n as u64);
    println!(
        "  delta (2 counters)                    ring records: {:7.2} B/sample",
        delta_bytes as f64 / n
    );
    for (key, name, correlated) in [
        (KEY_IP, "ip", true),
        (KEY_PID_IP, "pid_ip", true),
        (KEY_PID_IP, "pid_ip/16k", false),
    ] {
        for interval in [BATCH, 10_240, 102_400] {
            let mut agg = Rig::aggregate(key);
            let mut g = Gen::new(correlated);
            let (mut read, mut written, mut counted, mut intervals) = (0, 0, 0, 0);
            for i in 0..N / BATCH {
                g.batch(&mut samples);
                agg.dispatch_all(&samples);
                let switch = (i + 1) * BATCH % interval == 0;
                let (r, w, s) = agg.drain_aggregate(switch);
                (read, written, counted) = (read + r, written + w, counted + s);
                intervals += u64::from(r > 0);
            }
            // Close and drain the last interval.
            let (_, w, s) = agg.drain_aggregate(false);
            (written, counted) = (written + w, counted + s);
            {
                let mut buf = Buffer::from_words(&mut agg.words).unwrap();
                let _ = agg.cpu.restart(&mut buf);
            }
            let (r, w, s) = agg.drain_aggregate(false);
            (read, written, counted) = (read + r, written + w, counted + s);
            assert_eq!(counted, n as u64, "every sample in some interval");
            println!(
                "  aggregate {name:<10} {:>6}-sample intervals ({intervals:>4}): table read in place {:6.2} B/sample, capture records {:6.2} B/sample (delta/aggregate {:.2})",
                interval,
                read as f64 / n,
                written as f64 / n,
                delta_bytes as f64 / written as f64,
            );
        }
    }
}

fn bench(c: &mut Criterion) {
    bytes_report();
    let mut g = c.benchmark_group("aggregate");
    g.throughput(Throughput::Elements(1));
    for (key, name) in [(KEY_IP, "ip"), (KEY_PID_IP, "pid_ip")] {
        g.bench_function(BenchmarkId::new("handler", name), |b| {
            let mut rig = Rig::aggregate(key);
            let mut gen = Gen::new(false);
            let (mut samples, mut args) = (Vec::with_capacity(BATCH), Vec::with_capacity(BATCH));
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    gen.batch(&mut samples);
                    rig.args(&samples, &mut args);
                    let n = left.min(BATCH);
                    let mut buf = Buffer::from_words(&mut rig.words).unwrap();
                    let t = Instant::now();
                    for a in &args[..n] {
                        black_box(hrperf_fmt_aggregate::handle(&mut buf, black_box(a), None));
                    }
                    total += t.elapsed();
                    black_box(rig.drain_aggregate(true));
                    left -= n;
                }
                total
            });
        });
        g.bench_function(BenchmarkId::new("dispatch", name), |b| {
            let mut rig = Rig::aggregate(key);
            let mut gen = Gen::new(false);
            let mut samples = Vec::with_capacity(BATCH);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    gen.batch(&mut samples);
                    let n = left.min(BATCH);
                    let t = Instant::now();
                    rig.dispatch_all(&samples[..n]);
                    total += t.elapsed();
                    black_box(rig.drain_aggregate(true));
                    left -= n;
                }
                total
            });
        });
    }
    g.bench_function(BenchmarkId::new("delta-dispatch", "2"), |b| {
        let mut rig = Rig::new(&DELTA_OPS, &[]);
        let mut gen = Gen::new(false);
        let mut samples = Vec::with_capacity(BATCH);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                gen.batch(&mut samples);
                let n = left.min(BATCH);
                let t = Instant::now();
                rig.dispatch_all(&samples[..n]);
                total += t.elapsed();
                black_box(rig.drain_delta());
                left -= n;
            }
            total
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
