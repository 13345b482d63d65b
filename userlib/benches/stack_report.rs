//! Stack-profile throughput: 1 M synthetic llc-stack records (4,000 distinct call paths,
//! 8–40 frames, kernel + user, 3 processes) aggregated and symbolized through kallsyms
//! and SYM_TABLE symbols, from an in-memory capture. Reported as records (stacks) per
//! second; a second case adds the function table and folded output.
//!
//! `cargo bench -p libhrperf --bench stack_report`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hrperf::capture::{CaptureMeta, Reader, Writer};
use hrperf::stacks::{Profile, ProfileOptions, SortBy};
use hrperf_abi::capture::{EndInfo, SYM_KALLSYMS, SYM_TABLE};
use hrperf_fmt_llc_stack::record::{encode, StackFixed};

const RECORDS: u64 = 1_000_000;
const PATHS: u64 = 4_000;
const USER_FUNCS: u64 = 5_000;
const KERNEL_FUNCS: u64 = 20_000;
const KBASE: u64 = 0xffff_ffff_8100_0000;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn capture() -> Reader {
    let meta = CaptureMeta {
        format_name: hrperf_fmt_llc_stack::LLC_STACK_NAME.into(),
        format_uuid: hrperf_fmt_llc_stack::LLC_STACK_UUID,
        cpus: vec![0],
        ..CaptureMeta::default()
    };
    let mut w = Writer::new(Vec::new(), &meta).unwrap();
    let mut kallsyms = String::new();
    for i in 0..KERNEL_FUNCS {
        kallsyms.push_str(&format!("{:x} T kfunc_{i}\n", KBASE + i * 0x100));
    }
    w.write_symbols(SYM_KALLSYMS, 0, kallsyms.as_bytes()).unwrap();
    let mut table = String::new();
    for i in 0..USER_FUNCS {
        table.push_str(&format!(
            "{:x} 80 app::module::function_{i} [app]\n",
            0x40_0000 + i * 0x80
        ));
    }
    w.write_symbols(SYM_TABLE, 0, table.as_bytes()).unwrap();
    // The call paths: (kernel frames, user frames).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let paths: Vec<(Vec<u64>, Vec<u64>)> = (0..PATHS)
        .map(|_| {
            let nk = (xorshift(&mut seed) % 12) as usize;
            let nu = 8 + (xorshift(&mut seed) % 28) as usize;
            let k = (0..nk)
                .map(|_| KBASE + (xorshift(&mut seed) % KERNEL_FUNCS) * 0x100 + 8)
                .collect();
            let u = (0..nu)
                .map(|_| 0x40_0000 + (xorshift(&mut seed) % USER_FUNCS) * 0x80 + 4)
                .collect();
            (k, u)
        })
        .collect();
    let mut chunk = Vec::new();
    let mut n = 0u64;
    for i in 0..RECORDS {
        // Skewed: low path numbers are hot, as in real profiles.
        let r = xorshift(&mut seed);
        let p = &paths[((r % PATHS) * (r % PATHS) / PATHS) as usize];
        let f = StackFixed {
            pid: 100 + (i % 3) as u32,
            weight: 100_000,
            ..StackFixed::default()
        };
        encode(&mut chunk, &f, &p.0, &p.1);
        n += 1;
        if chunk.len() > 1 << 20 {
            w.write_chunk(0, &chunk, n).unwrap();
            chunk.clear();
            n = 0;
        }
    }
    w.write_chunk(0, &chunk, n).unwrap();
    let out = w
        .finish(EndInfo {
            end_time_ns: 0,
            total_records: RECORDS,
            total_drops: 0,
            exit_status: 0,
            reserved: 0,
        })
        .unwrap();
    Reader::from_bytes("bench.data", out).unwrap()
}

fn bench(c: &mut Criterion) {
    let reader = capture();
    let opts = ProfileOptions::default();
    let mut g = c.benchmark_group("stack_report");
    g.sample_size(10);
    g.throughput(Throughput::Elements(RECORDS));
    g.bench_function("aggregate_symbolize", |b| {
        b.iter(|| black_box(Profile::from_reader(&reader, &opts).unwrap().total_weight()))
    });
    g.bench_function("with_table_and_folded", |b| {
        b.iter(|| {
            let p = Profile::from_reader(&reader, &opts).unwrap();
            let top = p.functions(SortBy::Inclusive).len();
            let mut out = Vec::new();
            p.folded(&mut out, false).unwrap();
            black_box((top, out.len()))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
