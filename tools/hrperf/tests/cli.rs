//! End-to-end tests of the `hrperf` binary: real recordings (perf and sim sources), the
//! decoder plugin loaded from next to the binary, and the one-line errors with status 2.
//!
//! The plugin `libhrperf_decode_delta.so` must have been built next to the binary
//! (`cargo build --workspace`, which `tools/test.sh` runs first).

mod common;

use common::*;

use std::path::Path;
use std::process::Command;

#[test]
fn perf_poll_cpu_clock_matches_workload_cpu_time() {
    plugin_built("delta");
    let d = tmpdir("perf-poll");
    let data = d.join("p.data");
    let out = Command::new(HRPERF)
        .args(["record", "--source", "perf", "-e", "cpu-clock,task-clock,page-faults", "--poll-us", "1000", "-o"])
        .arg(&data)
        .args(["--", BURN, "--ms", "400", "--touch-mb", "8"])
        .output()
        .unwrap();
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let cpu_us: f64 = err
        .split("cpu_time_us=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("workload did not report its CPU time: {err}"));
    let recs = jsonl(&data);
    let deltas: Vec<&serde_json::Value> = recs.iter().filter(|r| r["kind"] == "delta").collect();
    assert!(deltas.len() > 300, "{} records for 400 ms of 1 ms polls", deltas.len());
    let cpu_clock_ns: f64 = deltas.iter().map(|r| r["counters"]["cpu-clock"].as_u64().unwrap() as f64).sum();
    let faults: u64 = deltas.iter().map(|r| r["counters"]["page-faults"].as_u64().unwrap()).sum();
    let ratio = cpu_clock_ns / 1e3 / cpu_us;
    eprintln!("cpu-clock {:.1} ms vs workload CPU time {:.1} ms: ratio {ratio:.4}; {faults} page faults", cpu_clock_ns / 1e6, cpu_us / 1e3);
    assert!((0.95..=1.05).contains(&ratio), "summed cpu-clock is {ratio:.4} of the workload's CPU time");
    assert!(faults >= 2048, "touching 8 MiB should fault at least 2048 pages, saw {faults}");
    // Per CPU, timestamps increase.
    for cpu in 0..2 {
        let t: Vec<u64> = deltas.iter().filter(|r| r["cpu"] == cpu).map(|r| r["time_ns"].as_u64().unwrap()).collect();
        assert!(t.windows(2).all(|w| w[0] < w[1]), "cpu {cpu} timestamps not increasing");
    }
}

#[test]
fn perf_overflow_samples_have_ips_and_exit_status_is_the_commands() {
    plugin_built("delta");
    let d = tmpdir("perf-ovf");
    let data = d.join("o.data");
    let out = Command::new(HRPERF)
        .args(["record", "--source", "perf", "-e", "cpu-clock,page-faults", "-c", "100000", "-o"])
        .arg(&data)
        .args(["--", "sh", "-c", &format!("{BURN} --ms 150; exit 7")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let recs = jsonl(&data);
    let samples: Vec<_> = recs.iter().filter(|r| r["trigger"] == "overflow").collect();
    assert!(samples.len() > 500, "{} samples for 150 ms at 100 µs", samples.len());
    assert!(samples.iter().all(|r| r["ip"].as_str().is_some_and(|ip| ip.starts_with("0x")) && r["tid"].as_u64() > Some(0)));
}

#[test]
fn sim_recording_is_byte_reproducible() {
    let d = tmpdir("sim-repro");
    let rec = |name: &str, seed: &str| {
        let p = d.join(name);
        ok(&hrperf(&["record", "--source", "sim", "--seed", seed, "--sim-cpus", "3", "--counter-width", "40", "--duration", "20ms", "-c", "30000", "-q", "-o", p.to_str().unwrap()]));
        std::fs::read(p).unwrap()
    };
    let (a, b, c) = (rec("a.data", "7"), rec("b.data", "7"), rec("c.data", "8"));
    assert!(a.len() > 10_000);
    assert_eq!(a, b, "same seed, different bytes");
    assert_ne!(a, c, "different seeds gave the same capture");
}

/// The committed golden capture is what the current code records for its configuration,
/// and decodes to the committed CSV. Regenerate both with `HRPERF_BLESS=1` after an
/// intended format change (tests/golden/README.md says how they were made).
#[test]
fn sim_golden_capture_and_decode() {
    plugin_built("delta");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let d = tmpdir("golden");
    let data = d.join("sim-steady.data");
    ok(&hrperf(&["record", "--source", "sim", "--workload", "steady", "--duration", "1ms", "--poll-us", "250", "-e", "cycles,instructions,llc-misses,branches", "-q", "-o", data.to_str().unwrap()]));
    let csv = ok(&hrperf(&["decode", "-i", data.to_str().unwrap(), "--output", "csv"]));
    if std::env::var_os("HRPERF_BLESS").is_some() {
        std::fs::copy(&data, golden.join("sim-steady.data")).unwrap();
        std::fs::write(golden.join("sim-steady.csv"), &csv).unwrap();
    }
    assert_eq!(std::fs::read(&data).unwrap(), std::fs::read(golden.join("sim-steady.data")).unwrap(), "capture bytes changed");
    assert_eq!(csv, std::fs::read_to_string(golden.join("sim-steady.csv")).unwrap());
    // And the golden values are the model's exact rates: 250 µs at 3 GHz, IPC 2.
    let first = csv.lines().nth(1).unwrap();
    assert!(first.starts_with("delta,0,250000,0,0,poll,,,0,750000,1500000,1500,300000,"), "{first}");
}

#[test]
fn tiny_buffer_drops_are_counted_and_shown() {
    plugin_built("delta");
    let d = tmpdir("drops");
    let data = d.join("t.data");
    let out = hrperf(&["record", "--source", "sim", "-c", "3000", "--duration", "5ms", "--buffer-size", "4k", "--drain-ms", "1", "-o", data.to_str().unwrap()]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let warned: u64 = err
        .split("WARNING: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drop warning: {err}"));
    assert!(warned > 1000);
    let info = ok(&hrperf(&["info", "-i", data.to_str().unwrap()]));
    assert!(info.contains(&format!("dropped:       {warned} ")), "{info}");
    let lost: u64 = jsonl(&data).iter().filter(|r| r["kind"] == "lost").map(|r| r["lost"].as_u64().unwrap()).sum();
    assert_eq!(lost, warned, "LOST records in the stream must add up to the drop count");
}

#[test]
fn bad_input_is_one_line_and_status_2() {
    let d = tmpdir("errors");
    let p = d.join("x.data");
    let ps = p.to_str().unwrap();
    one_line_error(&hrperf(&["record", "--source", "sim", "--format", "nope", "-q", "-o", ps]), "unknown format 'nope'");
    one_line_error(&hrperf(&["record", "--source", "perf", "-e", "cpu-clock,bogus", "--", "true"]), "unknown event 'bogus'");
    one_line_error(&hrperf(&["record", "--source", "perf", "-C", "0-x", "--duration", "10ms"]), "bad CPU list");
    one_line_error(&hrperf(&["record", "--source", "perf", "--", "/no/such/cmd"]), "/no/such/cmd");
    one_line_error(&hrperf(&["record", "--source", "sim", "--counter-width", "16", "-q", "-o", ps]), "width");
    one_line_error(&hrperf(&["decode", "-i", d.join("missing.data").to_str().unwrap()]), "missing.data");
    std::fs::write(&p, b"definitely not a capture").unwrap();
    one_line_error(&hrperf(&["info", "-i", ps]), "x.data");
    one_line_error(&hrperf(&["decode", "-i", ps]), "x.data");
    if Path::new("/sys/bus/event_source/devices/cpu").exists() {
        eprintln!("skipping the no-PMU check: this machine has a hardware PMU");
    } else {
        one_line_error(&hrperf(&["record", "--source", "perf", "-e", "cycles", "--", "true"]), "needs a hardware PMU");
    }
}

#[test]
fn missing_plugin_is_a_clear_error() {
    let d = tmpdir("noplugin");
    let data = d.join("s.data");
    ok(&hrperf(&["record", "--source", "sim", "--duration", "1ms", "-q", "-o", data.to_str().unwrap()]));
    // A copy of the binary with no plugin beside it and none on the path.
    let lonely = d.join("hrperf");
    std::fs::copy(HRPERF, &lonely).unwrap();
    let out = Command::new(&lonely).args(["decode", "-i"]).arg(&data).env("HRPERF_PLUGIN_PATH", d.join("empty")).output().unwrap();
    one_line_error(&out, "no decoder plugin for format 'delta'");
    let out = Command::new(&lonely).arg("formats").env("HRPERF_PLUGIN_PATH", "").output().unwrap();
    one_line_error(&out, "no decoder plugins found");
    // ... and HRPERF_PLUGIN_PATH finds it.
    let out = Command::new(&lonely).arg("formats").env("HRPERF_PLUGIN_PATH", Path::new(HRPERF).parent().unwrap()).output().unwrap();
    assert!(ok(&out).contains("delta"));
}

#[test]
fn truncated_capture_decodes_what_is_intact_then_names_the_offset() {
    plugin_built("delta");
    let d = tmpdir("trunc");
    let data = d.join("s.data");
    ok(&hrperf(&["record", "--source", "sim", "--duration", "10ms", "--poll-us", "100", "-q", "-o", data.to_str().unwrap()]));
    let full = jsonl(&data).len();
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = hrperf(&["decode", "-i", data.to_str().unwrap(), "--output", "jsonl"]);
    one_line_error(&out, "offset");
    let got = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!(got > full / 3 && got < full, "{got} of {full} records decoded before the damage");
}

#[test]
fn csv_has_one_column_per_event() {
    plugin_built("delta");
    let d = tmpdir("csv");
    let data = d.join("s.data");
    ok(&hrperf(&["record", "--source", "sim", "-e", "cycles,llc-misses", "--duration", "2ms", "-q", "-o", data.to_str().unwrap()]));
    let csv = ok(&hrperf(&["decode", "-i", data.to_str().unwrap(), "--output", "csv"]));
    let header = csv.lines().next().unwrap();
    assert_eq!(header, "kind,cpu,time_ns,pid,tid,trigger,ip,ovfl_counter,multi_wrap,cycles,llc-misses,lost");
    let cols = header.split(',').count();
    assert!(csv.lines().skip(1).all(|l| l.split(',').count() == cols));
    // DuckDB reads it as is, when the module is installed (tools/test.sh tries to).
    let probe = Command::new("python3").args(["-c", "import duckdb"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipping the DuckDB read_csv_auto check: python3 module duckdb not installed");
        return;
    }
    let csv_path = d.join("s.csv");
    std::fs::write(&csv_path, &csv).unwrap();
    let q = format!(
        "import duckdb; print(duckdb.sql(\"SELECT count(*), sum(cycles), typeof(any_value(cycles)) FROM read_csv_auto('{}') WHERE kind='delta'\").fetchall()[0])",
        csv_path.display()
    );
    let out = Command::new("python3").args(["-c", &q]).output().unwrap();
    let row = ok(&out);
    let rows = csv.lines().count() - 1;
    assert!(row.starts_with(&format!("({rows}, ")), "{row}");
    assert!(row.contains("BIGINT"), "{row}");
}

#[test]
fn every_subcommand_help_has_examples() {
    for sub in ["record", "decode", "info", "formats"] {
        let out = ok(&hrperf(&[sub, "--help"]));
        assert!(out.contains("EXAMPLES:"), "hrperf {sub} --help has no examples");
    }
    assert!(ok(&hrperf(&["--help"])).contains("EXAMPLES:"));
}
