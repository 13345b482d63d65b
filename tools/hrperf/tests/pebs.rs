//! `hrperf record --source sim --format pebs` end to end through the binary: the
//! simulated PEBS PMU writes records into the zero-copy buffers, the capture decodes
//! through `libhrperf_decode_pebs.so` (built next to the binary by `cargo build
//! --workspace`), and the errors are one line with status 2.

mod common;

use common::*;

use std::collections::BTreeMap;

fn hex(v: &serde_json::Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn sim_pebs_decodes_with_addresses_latencies_and_levels() {
    plugin_built("pebs");
    let d = tmpdir("adaptive");
    let data = d.join("pebs.data");
    let out = hrperf(&[
        "record", "--source", "sim", "--format", "pebs", "-e", "loads", "-c", "10000", "--duration", "20ms",
        "--pebs-data-cfg", "meminfo+gpr", "-q", "-o", data.to_str().unwrap(),
    ]);
    ok(&out);
    let recs = jsonl(&data);
    assert!(recs.len() > 1000, "{} records", recs.len());
    let mut levels: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in &recs {
        assert_eq!(r["kind"], "pebs_adaptive");
        assert_eq!(r["source"], "sim");
        assert_eq!(r["mem_op"], "load");
        let addr = hex(&r["data_addr"]);
        assert!(addr >= 0x5555_0000_0000, "data address {addr:#x}");
        let lat = r["latency"].as_u64().unwrap();
        let e = levels.entry(r["mem_level"].as_str().unwrap().to_string()).or_insert((u64::MAX, 0));
        e.0 = e.0.min(lat);
        e.1 = e.1.max(lat);
        // The GPR group: RAX holds the data address in the simulated workload.
        let regs = r["regs"].as_array().unwrap();
        assert_eq!(hex(&regs[2]), addr);
    }
    for l in ["L1", "LFB", "L2", "L3", "local-dram"] {
        assert!(levels.contains_key(l), "level {l} missing: {levels:?}");
    }
    assert!(levels["L1"].1 < levels["L3"].0 && levels["L3"].1 < levels["local-dram"].0, "{levels:?}");
    // Byte-reproducible for a seed.
    let again = d.join("again.data");
    ok(&hrperf(&[
        "record", "--source", "sim", "--format", "pebs", "-e", "loads", "-c", "10000", "--duration", "20ms",
        "--pebs-data-cfg", "meminfo+gpr", "-q", "-o", again.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read(&data).unwrap(), std::fs::read(&again).unwrap());
}

#[test]
fn every_legacy_layout_records_and_decodes() {
    plugin_built("pebs");
    let d = tmpdir("legacy");
    for (fmt, kind) in [("fmt0", "pebs_core"), ("fmt1", "pebs_nhm"), ("fmt2", "pebs_hsw"), ("fmt3", "pebs_skl")] {
        let data = d.join(format!("{fmt}.data"));
        ok(&hrperf(&[
            "record", "--source", "sim", "--format", "pebs", "--pebs-format", fmt, "--duration", "5ms", "-q", "-o",
            data.to_str().unwrap(),
        ]));
        let recs = jsonl(&data);
        assert!(recs.len() > 100, "{fmt}: {} records", recs.len());
        assert!(recs.iter().all(|r| r["kind"] == kind), "{fmt}");
        if fmt != "fmt0" {
            assert!(recs.iter().all(|r| r["data_addr"].is_string() && r["latency"].as_u64().unwrap() >= 3), "{fmt}");
        }
    }
}

#[test]
fn pebs_errors_are_one_line() {
    let d = tmpdir("errors");
    let data = d.join("x.data");
    let o = data.to_str().unwrap();
    one_line_error(
        &hrperf(&["record", "--source", "perf", "--format", "pebs", "-e", "cpu-clock", "-o", o, "--", "true"]),
        "no precise (PEBS) sampling for cpu-clock: it is a software event",
    );
    one_line_error(
        &hrperf(&["record", "--source", "perf", "--format", "pebs", "--poll-us", "100", "-o", o, "--", "true"]),
        "-c PERIOD or -F FREQ",
    );
    one_line_error(
        &hrperf(&["record", "--source", "perf", "--format", "pebs", "--pebs-data-cfg", "gpr", "-o", o, "--", "true"]),
        "configure the simulated PMU",
    );
    one_line_error(
        &hrperf(&["record", "--source", "sim", "--format", "pebs", "--pebs-format", "fmt9", "-o", o]),
        "unknown PEBS record format 'fmt9'",
    );
    one_line_error(
        &hrperf(&["record", "--source", "sim", "--format", "pebs", "--pebs-format", "fmt3", "--pebs-data-cfg", "gpr", "-o", o]),
        "need the adaptive layout",
    );
    one_line_error(
        &hrperf(&["record", "--source", "sim", "--format", "pebs", "--pebs-data-cfg", "lbr:99", "-o", o]),
        "unknown PEBS data group",
    );
    one_line_error(&hrperf(&["record", "--source", "sim", "--format", "pebs", "--poll-us", "100", "-o", o]), "-c PERIOD");
}

/// `--source perf --format pebs` on a machine without a hardware PMU (the development
/// VM): one line naming precise sampling, status 2, no capture. The perf-sourced path
/// itself is tested against the syscall fake (`userlib/src/source/perf/pebs/tests.rs`).
#[test]
fn perf_pebs_without_a_pmu_is_one_line_naming_precise_sampling() {
    let devices = std::path::Path::new("/sys/bus/event_source/devices");
    if ["cpu", "cpu_core", "cpu_atom"].iter().any(|d| devices.join(d).exists()) {
        eprintln!("skipped: this machine has a hardware PMU");
        return;
    }
    let d = tmpdir("perf-pebs");
    let data = d.join("x.data");
    let out = hrperf(&[
        "record", "--source", "perf", "--format", "pebs", "-e", "cycles", "-c", "10000", "-o", data.to_str().unwrap(),
        "--", "true",
    ]);
    one_line_error(&out, "no precise (PEBS) sampling for cycles on this machine");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no hardware PMU") && err.contains("--source sim"), "{err}");
    assert!(!data.exists());
    // The default event is cycles too.
    one_line_error(
        &hrperf(&["record", "--source", "perf", "--format", "pebs", "-o", data.to_str().unwrap(), "--", "true"]),
        "no precise (PEBS) sampling for cycles on this machine",
    );
}

#[test]
fn report_shows_levels_page_sizes_and_latency_histogram() {
    let d = tmpdir("report");
    let data = d.join("pebs.data");
    ok(&hrperf(&["record", "--source", "sim", "--format", "pebs", "--duration", "20ms", "-q", "-o", data.to_str().unwrap()]));
    let text = ok(&hrperf(&["report", "--format", "pebs", "-i", data.to_str().unwrap(), "--top", "3"]));
    for want in [
        "By memory level",
        "local-dram",
        "By page size",
        "Hottest cache lines",
        "Hottest pages",
        "Latency histogram",
    ] {
        assert!(text.contains(want), "'{want}' missing:\n{text}");
    }
    let sizes: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("By page size"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(sizes, ["4K", "2M", "1G"], "{text}");
    // A capture of another format is refused in one line.
    let delta = d.join("delta.data");
    ok(&hrperf(&["record", "--source", "sim", "--duration", "2ms", "-q", "-o", delta.to_str().unwrap()]));
    one_line_error(&hrperf(&["report", "-i", delta.to_str().unwrap()]), "needs a capture recorded with --format pebs");
    one_line_error(&hrperf(&["report", "--format", "delta", "-i", delta.to_str().unwrap()]), "no report for format 'delta'");
}
