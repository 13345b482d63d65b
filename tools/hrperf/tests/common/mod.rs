//! Helpers shared by the end-to-end tests of the `hrperf` binary.
#![allow(dead_code, reason = "each test file uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test.
pub const HRPERF: &str = env!("CARGO_BIN_EXE_hrperf");
/// The test workload.
pub const BURN: &str = env!("CARGO_BIN_EXE_hrperf-burn");

/// A fresh, empty directory for one test.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hrperf-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `hrperf ARGS` with plugins found only next to the binary.
pub fn hrperf(args: &[&str]) -> Output {
    Command::new(HRPERF).args(args).env_remove("HRPERF_PLUGIN_PATH").output().unwrap()
}

/// Fails unless the decoder plugin `libhrperf_decode_<format>.so` is next to the binary.
pub fn plugin_built(format: &str) {
    let dir = Path::new(HRPERF).parent().unwrap();
    let so = format!("libhrperf_decode_{format}.so");
    assert!(
        dir.join(&so).exists(),
        "{so} missing next to {HRPERF}: run `cargo build --workspace` first (tools/test.sh does)"
    );
}

/// The stdout of a successful run; otherwise fails showing both streams.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A failure must be exit status 2 and exactly one line on stderr saying what went wrong.
pub fn one_line_error(out: &Output, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("hrperf: error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected, got: {err}");
    assert!(lines[0].contains(expect), "'{expect}' not in: {}", lines[0]);
}

/// `hrperf decode --output jsonl` of a capture, parsed.
pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    let out = hrperf(&["decode", "-i", path.to_str().unwrap(), "--output", "jsonl"]);
    ok(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}
