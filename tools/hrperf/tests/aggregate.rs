//! `hrperf record/decode/report --format aggregate` through the binary: the sim and
//! perf sources into the double-buffered aggregate tables, the capture decoded through
//! `libhrperf_decode_aggregate.so` (built next to the binary by `cargo build
//! --workspace`) with one row per key per interval, the top-N and time-series report,
//! and one-line errors with status 2.

mod common;

use common::*;

use std::collections::{BTreeMap, BTreeSet};

/// Checks the decoded rows: one row per key per interval, entries adding up to each
/// interval's samples minus other. Returns (intervals, entry rows, Σ samples).
fn check_decoded(rows: &[serde_json::Value]) -> (u64, u64, u64) {
    let mut intervals: BTreeMap<(u64, u64), (u64, u64, u64)> = BTreeMap::new(); // samples, entries, other
    let mut seen: BTreeSet<(u64, u64, String, String)> = BTreeSet::new();
    let mut per_iv: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new(); // rows, Σcount
    for r in rows {
        let cpu = r["cpu"].as_u64().unwrap();
        let seq = r["seq"].as_u64().unwrap();
        match r["kind"].as_str().unwrap() {
            "aggregate_interval" => {
                let v = (r["samples"].as_u64().unwrap(), r["entries"].as_u64().unwrap(), r["other_count"].as_u64().unwrap());
                assert!(intervals.insert((cpu, seq), v).is_none(), "interval ({cpu}, {seq}) twice");
            }
            "aggregate_entry" => {
                let key = (cpu, seq, r["pid"].to_string(), r["ip"].to_string());
                assert!(seen.insert(key.clone()), "key {key:?} twice in one interval");
                let e = per_iv.entry((cpu, seq)).or_default();
                e.0 += 1;
                e.1 += r["count"].as_u64().unwrap();
            }
            k => panic!("unexpected row kind {k}"),
        }
    }
    let mut samples = 0;
    for (k, (s, entries, other)) in &intervals {
        let (n, count) = per_iv.get(k).copied().unwrap_or_default();
        assert_eq!(n, *entries, "interval {k:?}: one row per key");
        assert_eq!(count + other, *s, "interval {k:?}: Σcount + other == samples");
        samples += s;
    }
    (intervals.len() as u64, seen.len() as u64, samples)
}

fn stat(stderr: &str, word: &str) -> u64 {
    // "[hrperf] aggregate: N samples in M intervals, ..."
    let line = stderr.lines().find(|l| l.starts_with("[hrperf] aggregate:")).unwrap_or_else(|| panic!("no summary in {stderr}"));
    let toks: Vec<&str> = line.split_whitespace().collect();
    let i = toks.iter().position(|t| t.trim_end_matches(',') == word).unwrap();
    toks[i - 1].trim_start_matches('(').parse().unwrap()
}

#[test]
fn sim_record_decode_and_report() {
    plugin_built("aggregate");
    let d = tmpdir("sim");
    let data = d.join("agg.data");
    let f = data.to_str().unwrap();
    let out = hrperf(&[
        "record", "--source", "sim", "--format", "aggregate", "-c", "5000", "--agg-key", "pid-ip", "--agg-interval-ms",
        "10", "--duration", "60ms", "-o", f,
    ]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let (samples, intervals) = (stat(&err, "samples"), stat(&err, "intervals"));
    assert_eq!(intervals, 12, "6 per CPU: {err}");

    let rows = jsonl(&data);
    let (ivs, entries, decoded_samples) = check_decoded(&rows);
    assert_eq!((ivs, decoded_samples), (intervals, samples));
    assert!(entries > 1000, "{entries} key rows");
    assert!(rows.iter().filter(|r| r["kind"] == "aggregate_entry").all(|r| r["pid"] == 1000 && r["key"] == "pid_ip"));
    // The table output has the same rows.
    let table = ok(&hrperf(&["decode", "-i", f]));
    assert_eq!(table.lines().count() as u64, 1 + ivs + entries);

    let rep = ok(&hrperf(&["report", "--format", "aggregate", "-i", f, "--top", "5", "--time-series"]));
    assert!(rep.contains(&format!("{samples} samples in {intervals} intervals on 2 CPUs")), "{rep}");
    assert!(rep.contains("Top 5 keys by samples"), "{rep}");
    let top: Vec<&str> = rep.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains("pid 1000 0x")).collect();
    assert_eq!(top.len(), 5, "{rep}");
    let counts: Vec<u64> = top.iter().map(|l| l.split_whitespace().nth(4).unwrap().parse().unwrap()).collect();
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "ranked by count: {counts:?}");
    let series_at = rep.find("Time series").unwrap();
    let series: Vec<&str> = rep[series_at..].lines().skip(2).filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(series.len() as u64, intervals, "{rep}");
    let series_samples: u64 = series.iter().map(|l| l.split_whitespace().nth(4).unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(series_samples, samples);

    // By the counter sum; and the capture's own format is the default report.
    let by_sum = ok(&hrperf(&["report", "-i", f, "--by", "sum", "--top", "3"]));
    assert!(by_sum.contains("Top 3 keys by cycles"), "{by_sum}");
    assert!(!by_sum.contains("Time series"));
}

#[test]
fn small_table_misses_show_in_the_report() {
    plugin_built("aggregate");
    let d = tmpdir("small");
    let data = d.join("small.data");
    let f = data.to_str().unwrap();
    // 16 slots, a reader that wakes only every 20 ms: switches wait, keys overflow.
    let out = hrperf(&[
        "record", "--source", "sim", "--format", "aggregate", "-c", "5000", "--agg-slots", "16", "--drain-ms", "20",
        "--duration", "50ms", "-o", f,
    ]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let misses = stat(&err, "table");
    assert!(misses > 0, "{err}");
    let (_, _, samples) = check_decoded(&jsonl(&data));
    assert_eq!(samples, stat(&err, "samples"));
    let rep = ok(&hrperf(&["report", "-i", f]));
    assert!(rep.contains(&format!("of which {misses} table misses")), "{rep}");
    assert!(rep.contains("(other: no table slot)"), "{rep}");
}

#[test]
fn stack_key_counts_per_call_stack() {
    plugin_built("aggregate");
    let d = tmpdir("stack");
    let data = d.join("stack.data");
    let f = data.to_str().unwrap();
    let out = hrperf(&["record", "--source", "sim", "--format", "aggregate", "-c", "5000", "--agg-key", "stack", "--duration", "20ms", "-o", f]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("samples with stacks"), "{err}");
    let rep = ok(&hrperf(&["report", "-i", f]));
    // The simulated program's stacks: kernel + user frames resolved from stack ids.
    assert!(rep.contains("key stack") && rep.contains("pid 1000 kstack - ustack 0x401810;0x401480;0x401200;0x401080"), "{rep}");
    assert!(rep.contains("kstack 0xffffffff81000510;"), "{rep}");
    // The same stacks symbolized and folded, weighted by their counts: every sample once.
    let folded = ok(&hrperf(&["report", f, "--folded"]));
    let total: u64 = folded.lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert!(rep.contains(&format!("  {total} samples in ")), "{total} vs {rep}");
    assert!(folded.lines().any(|l| l.starts_with("main;run_queries;scan_table;__libc_read;entry_SYSCALL_64;") && l.contains(";vfs_read;copy_user_generic ")), "{folded}");
    let svg = d.join("agg.svg");
    ok(&hrperf(&["report", f, "--by", "sum", "--flamegraph", svg.to_str().unwrap()]));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("btree_lookup"));
    let e = hrperf(&["report", f, "--samples"]);
    assert_eq!(e.status.code(), Some(2));
}

#[test]
fn perf_record_on_a_workload_conserves_samples() {
    plugin_built("aggregate");
    let d = tmpdir("perf");
    let data = d.join("perf.data");
    let f = data.to_str().unwrap();
    let out = hrperf(&[
        "record", "--source", "perf", "--format", "aggregate", "-e", "cpu-clock", "-c", "100000", "--agg-interval-ms", "50",
        "-o", f, "--", BURN, "--ms", "300",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if err.contains("perf_event_open") && !out.status.success() {
        eprintln!("SKIP: perf_event_open not allowed here: {err}");
        return;
    }
    ok(&out);
    let (samples, intervals) = (stat(&err, "samples"), stat(&err, "intervals"));
    assert!(samples > 1000, "300 ms at 100 µs: {err}");
    let (ivs, _, decoded) = check_decoded(&jsonl(&data));
    assert_eq!((ivs, decoded), (intervals, samples));
    let info = ok(&hrperf(&["info", "-i", f]));
    // Σ samples in the intervals == samples dispatched (the per-CPU overflows).
    let overflows: u64 = info
        .lines()
        .skip_while(|l| !l.starts_with("per CPU:"))
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(4).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    assert_eq!(overflows, samples, "{info}");
    let rep = ok(&hrperf(&["report", "-i", f, "--time-series"]));
    assert!(rep.contains("key ip, summed counter cpu-clock"), "{rep}");
}

#[test]
fn bad_aggregate_input_is_one_line_and_status_2() {
    let d = tmpdir("bad");
    let f = d.join("x.data");
    let f = f.to_str().unwrap();
    let rec = |extra: &[&str]| {
        let mut a = vec!["record", "--source", "sim", "-c", "5000", "--duration", "5ms", "-o", f];
        a.extend_from_slice(extra);
        hrperf(&a)
    };
    one_line_error(&rec(&["--format", "aggregate", "--agg-slots", "100"]), "--agg-slots 100: give a power of two");
    one_line_error(&rec(&["--format", "aggregate", "--agg-slots", "8"]), "power of two in 16..=1048576");
    one_line_error(&rec(&["--format", "aggregate", "--agg-interval-ms", "0"]), "--agg-interval-ms takes a positive");
    one_line_error(&rec(&["--agg-key", "ip"]), "need --format aggregate");
    // A delta capture has no aggregate report; --by belongs to aggregate.
    ok(&rec(&[]));
    one_line_error(&hrperf(&["report", "--format", "aggregate", "-i", f]), "needs a capture recorded with --format aggregate");
    one_line_error(&hrperf(&["report", "-i", f]), "holds 'delta' records; hrperf report needs a capture recorded with --format pebs or --format aggregate");
    one_line_error(&hrperf(&["report", "--format", "pebs", "-i", f, "--by", "sum"]), "--by and --time-series apply to --format aggregate");
    one_line_error(&hrperf(&["report", "--format", "bogus", "-i", f]), "reports available are: pebs, aggregate");
}

#[test]
fn help_shows_every_aggregate_flag_with_an_example() {
    let rec = ok(&hrperf(&["record", "--help"]));
    for flag in ["--agg-key", "--agg-slots", "--agg-interval-ms"] {
        assert!(rec.contains(flag), "{flag} not in record --help");
        assert!(rec.lines().any(|l| l.trim_start().starts_with("hrperf record") && l.contains(flag)), "no example with {flag}");
    }
    let rep = ok(&hrperf(&["report", "--help"]));
    for flag in ["--by", "--time-series", "--top"] {
        assert!(rep.contains(flag), "{flag} not in report --help");
        assert!(rep.lines().any(|l| l.trim_start().starts_with("hrperf report") && l.contains(flag)), "no example with {flag}");
    }
}
