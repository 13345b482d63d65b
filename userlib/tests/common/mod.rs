//! Helpers shared by the integration tests: a small capture, record builders, and where
//! the built delta plugin lives.

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::path::PathBuf;

use hrperf::capture::{CaptureMeta, Writer};
use hrperf::source::EventSpec;
use hrperf_abi::capture::{EndInfo, CLOCK_SIM, SOURCE_SIM};
use hrperf_abi::event::{EVENT_TYPE_SIM, EVENT_TYPE_SOFTWARE};
use hrperf_abi::format::MODE_OVERFLOW;
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::record::{MISC_INSTRUCTED, MISC_OVERFLOW, MISC_POLL};
use hrperf_abi::{EventDesc, RecordType};
use hrperf_fmt_delta::record::{self, DeltaSample, NO_OVERFLOW_COUNTER};

pub fn event(name: &str, kind: u32, config: u64) -> EventSpec {
    EventSpec {
        name: name.into(),
        desc: EventDesc {
            kind,
            flags: 0,
            config,
            config1: 0,
            config2: 0,
        },
    }
}

/// Metadata with every field set (odd-length strings and bytes, so padding is exercised).
pub fn meta() -> CaptureMeta {
    CaptureMeta {
        format_name: "delta".into(),
        format_uuid: hrperf_fmt_delta::DELTA_UUID,
        format_version: 1 << 16,
        source: SOURCE_SIM,
        clock: CLOCK_SIM,
        tsc_hz: 2_400_000_000,
        mode: MODE_OVERFLOW,
        sample_period: 100_000,
        poll_interval_ns: 0,
        start_time_ns: 1_000,
        start_wall_ns: 0,
        events: vec![
            event("cpu-clock", EVENT_TYPE_SOFTWARE, 0),
            event("page-faults", EVENT_TYPE_SOFTWARE, 2),
            event("sim-instructions", EVENT_TYPE_SIM, 1),
        ],
        cpus: vec![0, 1],
        cpu_model: "hrperf simulated Skylake".into(),
        command: vec!["./app".into(), "--iterations".into(), "3".into()],
        hostname: "testhost".into(),
        kernel_release: "6.12.0-test".into(),
        format_arg: vec![1, 2, 3, 4, 5],
        sim_config: "seed=42\nmodel=skl\n".into(),
    }
}

/// The `i`-th test sample of `cpu`: overflow, poll or instructed in turn.
pub fn sample(cpu: u32, i: u64) -> DeltaSample {
    let (misc, ovfl) = match i % 3 {
        0 => (MISC_OVERFLOW, 0),
        1 => (MISC_POLL, NO_OVERFLOW_COUNTER),
        _ => (MISC_INSTRUCTED, NO_OVERFLOW_COUNTER),
    };
    let mut deltas = [0u64; 8];
    deltas[0] = 1_000_000 + i;
    deltas[1] = i % 5;
    deltas[2] = 3_000_000 + 7 * i;
    DeltaSample {
        misc,
        cpu,
        pid: 100 + cpu,
        tid: 200 + cpu,
        ovfl_counter: ovfl,
        multi_wrap: (i % 7 == 6) as u8,
        time_ns: 1_000 + 1_000 * i,
        ip: 0x40_1000 + i,
        nr: 3,
        deltas,
    }
}

pub fn delta_bytes(s: &DeltaSample) -> Vec<u8> {
    let mut b = vec![0u8; record::MAX_RECORD_SIZE];
    let n = record::write(s, &mut b).expect("valid sample");
    b.truncate(n);
    b
}

pub fn lost_bytes(n: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&RecordType::LOST.0.to_ne_bytes());
    b.extend_from_slice(&0u16.to_ne_bytes());
    b.extend_from_slice(&16u16.to_ne_bytes());
    b.extend_from_slice(&n.to_ne_bytes());
    b
}

pub fn pad_bytes(size: u16) -> Vec<u8> {
    let mut b = vec![0u8; size as usize];
    b[6..8].copy_from_slice(&size.to_ne_bytes());
    b
}

/// A record of a type no plugin knows, 24 bytes.
pub fn foreign_bytes() -> Vec<u8> {
    let mut b = vec![0xabu8; 24];
    b[0..4].copy_from_slice(&0x1_2345u32.to_ne_bytes());
    b[4..6].copy_from_slice(&0u16.to_ne_bytes());
    b[6..8].copy_from_slice(&24u16.to_ne_bytes());
    b
}

/// One chunk's worth of records for `cpu`, samples `from..to`.
pub fn samples(cpu: u32, from: u64, to: u64) -> (Vec<u8>, u64) {
    let mut b = Vec::new();
    for i in from..to {
        b.extend(delta_bytes(&sample(cpu, i)));
    }
    (b, to - from)
}

pub fn stats(cpu: u32, records: u64, drops: u64) -> CpuStats {
    CpuStats {
        cpu,
        masked_now: 0,
        records,
        drops,
        overflows: records + drops,
        masked: 1,
        multi_wraps: 2,
        poll_ticks: 0,
        missed_ticks: 0,
    }
}

pub fn end_info(total_records: u64, total_drops: u64) -> EndInfo {
    EndInfo {
        end_time_ns: 99_000,
        total_records,
        total_drops,
        exit_status: 0,
        reserved: 0,
    }
}

/// The small capture most tests use:
///
/// - chunk A: CPU 0, samples 0..4
/// - chunk B: CPU 1, samples 0..3, a LOST(5), a PAD, sample 3
/// - chunk C: CPU 0, samples 4..6 and a record of an unknown type
/// - STATS (CPU 0, 1), END
///
/// 10 delta records, 1 LOST record (5 lost), 1 unknown record: 12 records yielded.
pub fn small_capture() -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), &meta()).unwrap();
    let (a, n) = samples(0, 0, 4);
    w.write_chunk(0, &a, n).unwrap();
    let (mut b, _) = samples(1, 0, 3);
    b.extend(lost_bytes(5));
    b.extend(pad_bytes(16));
    b.extend(delta_bytes(&sample(1, 3)));
    w.write_chunk(1, &b, 6).unwrap();
    let (mut c, _) = samples(0, 4, 6);
    c.extend(foreign_bytes());
    w.write_chunk(0, &c, 3).unwrap();
    w.write_stats(&[stats(0, 7, 0), stats(1, 5, 6)]).unwrap();
    w.finish(end_info(12, 6)).unwrap()
}

/// File offsets of the chunks of `bytes` (walking headers without checks).
pub fn chunk_offsets(bytes: &[u8]) -> Vec<u64> {
    let r = hrperf::capture::Reader::from_bytes("x", bytes.to_vec()).unwrap();
    r.chunks().map(|c| c.unwrap().offset).collect()
}

/// The built delta plugin: `target/<profile>/libhrperf_decode_delta.so` (from
/// `cargo build`) or `target/<profile>/deps/` (built as this package's dev-dependency),
/// whichever is newer.
pub fn delta_plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("exe dir").to_owned();
    let profile = deps.parent().expect("profile dir").to_owned();
    let candidates = [
        profile.join("libhrperf_decode_delta.so"),
        deps.join("libhrperf_decode_delta.so"),
    ];
    candidates
        .iter()
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| {
            panic!(
                "the delta decoder plugin is not built (looked for {} and {}); run `cargo build --workspace` first",
                candidates[0].display(),
                candidates[1].display()
            )
        })
}

/// Recomputes the header/metadata checksum after a test edited header or metadata bytes
/// on purpose, so the reader reaches the structural check under test.
pub fn reseal_header(bytes: &mut [u8]) {
    use std::mem::offset_of;
    let hs_off = offset_of!(hrperf_abi::capture::FileHeader, header_size);
    let ms_off = offset_of!(hrperf_abi::capture::FileHeader, metadata_size);
    let header_size = u32::from_ne_bytes(bytes[hs_off..hs_off + 4].try_into().unwrap()) as usize;
    let meta = u64::from_ne_bytes(bytes[ms_off..ms_off + 8].try_into().unwrap()) as usize;
    let crc = hrperf::capture::header_crc(&bytes[..header_size], &bytes[header_size..header_size + meta]);
    let at = offset_of!(hrperf_abi::capture::FileHeader, header_crc32);
    bytes[at..at + 4].copy_from_slice(&crc.to_ne_bytes());
}
