//! Decode throughput over a synthetic capture of ~1M delta records (3 counters each):
//!
//! - `typed`: open + chunk checks (CRC) + record iteration + `hrperf_fmt_delta::record::parse`
//! - `plugin`: the same, but each record through the loaded `libhrperf_decode_delta.so`
//! - `json`: `decode_capture` into JSON lines written to `io::sink()`
//!
//! Run: `cargo bench -p libhrperf --bench decode -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hrperf::capture::{CaptureMeta, Reader, Writer};
use hrperf::decode::{decode_capture, decode_ctx, JsonSink};
use hrperf::plugin::{DecodeScratch, Plugin, Value};
use hrperf::source::EventSpec;
use hrperf_abi::capture::{EndInfo, CHUNK_DATA, CLOCK_SIM, SOURCE_SIM};
use hrperf_abi::event::EVENT_TYPE_SOFTWARE;
use hrperf_abi::record::{MISC_OVERFLOW, MISC_POLL};
use hrperf_abi::EventDesc;
use hrperf_fmt_delta::record::{self, DeltaSample, NO_OVERFLOW_COUNTER};

const RECORDS: u64 = 1 << 20;
const PER_CHUNK: u64 = 1024;

fn meta() -> CaptureMeta {
    let ev = |name: &str, config| EventSpec {
        name: name.into(),
        desc: EventDesc {
            kind: EVENT_TYPE_SOFTWARE,
            flags: 0,
            config,
            config1: 0,
            config2: 0,
        },
    };
    CaptureMeta {
        format_name: "delta".into(),
        format_uuid: hrperf_fmt_delta::DELTA_UUID,
        format_version: 1 << 16,
        source: SOURCE_SIM,
        clock: CLOCK_SIM,
        events: vec![
            ev("cpu-clock", 0),
            ev("task-clock", 1),
            ev("page-faults", 2),
        ],
        cpus: vec![0, 1],
        ..CaptureMeta::default()
    }
}

/// Writes the synthetic capture: 2 CPUs, chunks of 1024 records.
fn synthesize(path: &Path) {
    let mut w = Writer::create(path, &meta()).unwrap();
    let mut chunk = Vec::with_capacity(PER_CHUNK as usize * record::record_size(3));
    let mut rec = [0u8; record::MAX_RECORD_SIZE];
    let mut i = 0u64;
    while i < RECORDS {
        let cpu = ((i / PER_CHUNK) % 2) as u32;
        chunk.clear();
        for j in 0..PER_CHUNK {
            let n = i + j;
            let overflow = n & 3 == 0;
            let s = DeltaSample {
                misc: if overflow { MISC_OVERFLOW } else { MISC_POLL },
                cpu,
                pid: 1000,
                tid: 1000 + cpu,
                ovfl_counter: if overflow { 0 } else { NO_OVERFLOW_COUNTER },
                multi_wrap: 0,
                time_ns: n * 1000,
                ip: 0x40_0000 + (n % 4096) * 4,
                nr: 3,
                deltas: [1_000_000 + n % 977, 999_000 + n % 13, n % 3, 0, 0, 0, 0, 0],
            };
            let len = record::write(&s, &mut rec).unwrap();
            chunk.extend_from_slice(&rec[..len]);
        }
        w.write_chunk(cpu, &chunk, PER_CHUNK).unwrap();
        i += PER_CHUNK;
    }
    w.finish(EndInfo {
        end_time_ns: RECORDS * 1000,
        total_records: RECORDS,
        total_drops: 0,
        exit_status: 0,
        reserved: 0,
    })
    .unwrap();
}

/// Full pass to the typed stage; returns a checksum so nothing is optimised away.
fn typed(path: &Path) -> u64 {
    let r = Reader::open(path).unwrap();
    let mut sum = 0u64;
    for chunk in r.chunks() {
        let chunk = chunk.unwrap();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            let s = record::parse(rec.unwrap().bytes).unwrap();
            sum = sum.wrapping_add(s.deltas[0]).wrapping_add(s.time_ns);
        }
    }
    sum
}

fn through_plugin(path: &Path, plugin: &Plugin) -> u64 {
    let r = Reader::open(path).unwrap();
    let mut scratch = DecodeScratch::new();
    let mut sum = 0u64;
    for chunk in r.chunks() {
        let chunk = chunk.unwrap();
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        let ctx = decode_ctx(r.meta(), chunk.cpu);
        for rec in chunk.records() {
            let d = plugin
                .decode(&ctx, rec.unwrap().bytes, &mut scratch)
                .unwrap();
            if let (Value::Time(t), Value::Counters(c)) = (d.value(1), d.value(8)) {
                sum = sum.wrapping_add(t).wrapping_add(c.get(0).unwrap_or(0));
            }
        }
    }
    sum
}

/// The delta plugin built next to this bench (`target/<profile>/` or its `deps/`).
fn plugin_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let profile = deps.parent()?;
    [
        profile.join("libhrperf_decode_delta.so"),
        deps.join("libhrperf_decode_delta.so"),
    ]
    .into_iter()
    .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
    .max()
    .map(|(_, p)| p)
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.data");
    synthesize(&path);
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "synthetic capture: {RECORDS} delta records (3 counters, {} B each) in {:.1} MB",
        record::record_size(3),
        size as f64 / 1e6
    );

    let mut g = c.benchmark_group("decode");
    g.sample_size(10);
    g.throughput(Throughput::Elements(RECORDS));
    g.bench_function("typed", |b| b.iter(|| black_box(typed(&path))));
    g.throughput(Throughput::Bytes(size));
    g.bench_function("typed_bytes", |b| b.iter(|| black_box(typed(&path))));
    g.throughput(Throughput::Elements(RECORDS));
    match plugin_path().map(|p| Plugin::load(&p)) {
        Some(Ok(plugin)) => {
            g.bench_function("plugin", |b| b.iter(|| black_box(through_plugin(&path, &plugin))));
            g.bench_function("json", |b| {
                b.iter(|| {
                    let r = Reader::open(&path).unwrap();
                    let s = decode_capture(&r, &plugin, &mut JsonSink::new(std::io::sink())).unwrap();
                    black_box(s.records)
                })
            });
        }
        Some(Err(e)) => eprintln!("skipping plugin and json benches: {e}"),
        None => eprintln!("skipping plugin and json benches: libhrperf_decode_delta.so not built (cargo build --release --workspace)"),
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
