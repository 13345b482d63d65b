//! hrperf's call-stack profile of an imported perf.data against `perf report`'s own.
//!
//! `perf record -e cpu-clock -g -F 999` runs `tests/workloads/stackburn.c` (compiled here
//! with frame pointers), `hrperf import` turns the perf.data into an llc-stack capture,
//! and for every function above 0.5 % the inclusive ("Children") and self percentages of
//! [`hrperf::stacks::Profile`] must match `perf report --children` / `--no-children`
//! (`--sort symbol -g none`) within 0.1 percentage point (perf prints two decimals).
//!
//! Skipped with a printed reason when there is no C compiler, no `perf`, or perf may not
//! record (`perf_event_paranoid`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hrperf::capture::Reader;
use hrperf::stacks::{Profile, ProfileOptions, SortBy};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn skip(why: &str) {
    eprintln!("SKIP stacks_perf: {why}");
}

/// Compiles stackburn into `dir`, or says why not.
fn build_stackburn(dir: &Path) -> Result<PathBuf, String> {
    let src = repo_root().join("tests/workloads/stackburn.c");
    let exe = dir.join("stackburn");
    let out = Command::new("cc")
        .args([
            "-O1",
            "-fno-omit-frame-pointer",
            "-fno-inline",
            "-fno-optimize-sibling-calls",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("no C compiler (cc): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(exe)
}

/// `perf report` percentages by symbol: `(children or self %, kernel?)`.
fn perf_report(data: &Path, children: bool) -> Result<BTreeMap<String, f64>, String> {
    let out = Command::new("perf")
        .arg("report")
        .arg("-i")
        .arg(data)
        .arg(if children {
            "--children"
        } else {
            "--no-children"
        })
        .args([
            "--stdio",
            "--sort",
            "symbol",
            "-g",
            "none",
            "--percent-limit",
            "0",
        ])
        .output()
        .map_err(|e| format!("perf report: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "perf report failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut pct = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        // "  78.48%     0.00%  [.] burn_middle   -  -" (children) or "43.54%  [.] burn_leaf_a"
        let mut f = t.split_whitespace();
        let Some(first) = f.next().and_then(|p| p.strip_suffix('%')) else {
            continue;
        };
        let Ok(v) = first.parse::<f64>() else {
            continue;
        };
        let mut rest: Vec<&str> = f.collect();
        if children {
            rest.remove(0); // the self column
        }
        // rest: ["[.]" or "[k]", name..., IPC columns "-", "-"]
        if rest.len() < 2 || !rest[0].starts_with('[') {
            continue;
        }
        let name = rest[1].to_string();
        pct.insert(name, v);
    }
    Ok(pct)
}

#[test]
fn imported_perf_data_matches_perf_report() {
    let dir = tempfile::tempdir().unwrap();
    let exe = match build_stackburn(dir.path()) {
        Ok(e) => e,
        Err(why) => return skip(&why),
    };
    let data = dir.path().join("X.perf.data");
    let rec = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-g", "-F", "999", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .arg("1")
        .output();
    match rec {
        Err(e) => return skip(&format!("perf is not installed ({e})")),
        Ok(o) if !o.status.success() || !data.exists() => {
            let paranoid =
                std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
            return skip(&format!(
                "perf record failed (perf_event_paranoid {}): {}",
                paranoid.trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(_) => {}
    }
    let capture = dir.path().join("X.data");
    let imp = Command::new(env!("CARGO_BIN_EXE_hrperf"))
        .arg("import")
        .arg(&data)
        .arg("-o")
        .arg(&capture)
        .output()
        .unwrap();
    assert!(
        imp.status.success(),
        "hrperf import: {}",
        String::from_utf8_lossy(&imp.stderr)
    );

    let reader = Reader::open(&capture).unwrap();
    let profile = Profile::from_reader(&reader, &ProfileOptions::default()).unwrap();
    let perf_children = perf_report(&data, true).unwrap();
    let perf_self = perf_report(&data, false).unwrap();
    let ours: BTreeMap<String, (f64, f64)> = profile
        .functions(SortBy::Inclusive)
        .iter()
        .map(|f| {
            (
                f.name.to_string(),
                (profile.pct(f.inclusive), profile.pct(f.self_weight)),
            )
        })
        .collect();

    eprintln!(
        "{:<28} {:>9} {:>9} {:>9} {:>9}",
        "function", "perf incl", "hrperf", "perf self", "hrperf"
    );
    let mut compared = 0;
    let mut bad = Vec::new();
    for (name, &pc) in &perf_children {
        if pc < 0.5 {
            continue;
        }
        let ps = perf_self.get(name).copied().unwrap_or(0.0);
        let close = |(i, s): (f64, f64)| (i - pc).abs() <= 0.1 && (s - ps).abs() <= 0.1;
        let (hi, hs) = match ours.get(name) {
            Some(&v) => v,
            None => {
                // A symbol perf finds by means hrperf's symbolizer lacks (e.g. libc's local
                // __libc_start_call_main, which perf resolves without a .symtab): the same
                // weights must then sit on one of hrperf's "[unknown] object+0x..." frames.
                match ours
                    .iter()
                    .find(|(n, &v)| n.starts_with("[unknown]") && close(v))
                {
                    Some((n, &v)) => {
                        eprintln!("note: hrperf leaves perf's {name} unresolved, as {n}");
                        v
                    }
                    None => (f64::NAN, f64::NAN),
                }
            }
        };
        eprintln!("{name:<28} {pc:>8.2}% {hi:>8.2}% {ps:>8.2}% {hs:>8.2}%");
        compared += 1;
        if !close((hi, hs)) {
            bad.push(format!(
                "{name}: perf {pc:.2}%/{ps:.2}%, hrperf {hi:.2}%/{hs:.2}%"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "inclusive/self percentages differ by more than 0.1 point:\n{}",
        bad.join("\n")
    );
    for f in [
        "main",
        "run_rounds",
        "burn_outer",
        "burn_middle",
        "burn_leaf_a",
        "burn_leaf_b",
        "burn_solo",
    ] {
        assert!(
            perf_children.contains_key(f) && ours.contains_key(f),
            "{f} is in both profiles"
        );
    }
    assert!(compared >= 7, "{compared} functions compared");

    // The same workload recorded by hrperf itself (perf source, callchains into the
    // llc-stack format): a second run, so the shares agree statistically, not exactly.
    let own = dir.path().join("own.data");
    let out = Command::new(env!("CARGO_BIN_EXE_hrperf"))
        .args(["record", "-q", "--source", "perf", "--format", "llc-stack", "-e", "cpu-clock", "-F", "999", "-o"])
        .arg(&own)
        .arg("--")
        .arg(&exe)
        .arg("1")
        .output()
        .unwrap();
    assert!(out.status.success(), "hrperf record: {}", String::from_utf8_lossy(&out.stderr));
    let p2 = Profile::from_reader(&Reader::open(&own).unwrap(), &ProfileOptions::default()).unwrap();
    assert!(p2.total_samples() > 300, "{} samples", p2.total_samples());
    eprintln!("{:<28} {:>9} {:>9} {:>9} {:>9}", "hrperf record (2nd run)", "perf incl", "hrperf", "perf self", "hrperf");
    for f in ["main", "burn_middle", "burn_leaf_a", "burn_leaf_b", "burn_outer", "burn_solo"] {
        let s = p2.function(f).unwrap_or_else(|| panic!("{f} in hrperf's own recording"));
        let (hi, hs) = (p2.pct(s.inclusive), p2.pct(s.self_weight));
        let (pc, ps) = (perf_children[f], perf_self.get(f).copied().unwrap_or(0.0));
        eprintln!("{f:<28} {pc:>8.2}% {hi:>8.2}% {ps:>8.2}% {hs:>8.2}%");
        assert!((hi - pc).abs() <= 4.0 && (hs - ps).abs() <= 4.0, "{f}: perf {pc:.2}/{ps:.2}, hrperf {hi:.2}/{hs:.2}");
    }
}
