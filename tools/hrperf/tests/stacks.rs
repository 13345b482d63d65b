//! `hrperf report` on llc-stack captures through the binary: the function table, folded
//! stacks, the SVG flame graph, callers/callees, JSON, and one-line errors with status 2.
//! Captures are built here with known stacks and a SYM_TABLE, so nothing depends on
//! the machine's symbols.

mod common;

use common::*;

use std::path::{Path, PathBuf};

use hrperf::capture::{CaptureMeta, Writer};
use hrperf_abi::capture::{EndInfo, SYM_KALLSYMS, SYM_TABLE};
use hrperf_fmt_llc_stack::record::{encode, StackFixed};

fn rec(pid: u32, weight: u64, kernel: &[u64], user: &[u64]) -> Vec<u8> {
    let mut comm = [0u8; 16];
    comm[..3].copy_from_slice(b"app");
    let f = StackFixed {
        pid,
        tid: pid,
        weight,
        comm,
        ..StackFixed::default()
    };
    let mut out = Vec::new();
    assert!(encode(&mut out, &f, kernel, user));
    out
}

fn write(path: &Path, format: &str, records: &[Vec<u8>]) {
    let meta = CaptureMeta {
        format_name: format.into(),
        format_uuid: if format == "llc-stack" {
            hrperf_fmt_llc_stack::LLC_STACK_UUID
        } else {
            Default::default()
        },
        cpus: vec![0],
        ..CaptureMeta::default()
    };
    let mut w = Writer::create(path, &meta).unwrap();
    w.write_symbols(
        SYM_KALLSYMS,
        0,
        b"ffffffff81001000 T do_syscall_64\nffffffff81002000 T page_fault\n",
    )
    .unwrap();
    w.write_symbols(
        SYM_TABLE,
        0,
        b"401000 100 main [app]\n401100 100 foo [app]\n401200 100 bar [app]\n",
    )
    .unwrap();
    w.write_chunk(0, &records.concat(), records.len() as u64).unwrap();
    w.finish(EndInfo {
        end_time_ns: 0,
        total_records: records.len() as u64,
        total_drops: 0,
        exit_status: 0,
        reserved: 0,
    })
    .unwrap();
}

/// main;foo;bar 6, main;foo;do_syscall_64;page_fault 3, main;bar 1 (total 10).
fn stacks_capture(dir: &Path) -> PathBuf {
    let p = dir.join("stacks.data");
    write(
        &p,
        "llc-stack",
        &[
            rec(10, 6, &[], &[0x401210, 0x401110, 0x401010]),
            rec(
                10,
                3,
                &[0xffff_ffff_8100_2008, 0xffff_ffff_8100_1008],
                &[0x401120, 0x401020],
            ),
            rec(10, 1, &[], &[0x401230, 0x401030]),
        ],
    );
    p
}

#[test]
fn table_folded_callers_json() {
    let d = tmpdir("stacks-table");
    let cap = stacks_capture(&d);
    let f = cap.to_str().unwrap();

    let table = ok(&hrperf(&["report", f]));
    assert!(table.contains("Call-stack profile of"), "{table}");
    let main = table
        .lines()
        .find(|l| l.ends_with(" main") || l.contains(" main "))
        .unwrap();
    assert!(main.contains("100.00%") && main.contains("0.00%"), "{main}");
    let bar = table.lines().find(|l| l.contains(" bar ")).unwrap();
    assert!(bar.trim_start().starts_with("70.00%  70.00%"), "{bar}");

    let folded = ok(&hrperf(&["report", "-i", f, "--folded"]));
    assert_eq!(
        folded,
        "main;bar 1\nmain;foo;bar 6\nmain;foo;do_syscall_64;page_fault 3\n"
    );
    let with_comm = ok(&hrperf(&["report", f, "--folded", "--folded-comm", "--kernel-only"]));
    assert_eq!(with_comm, "app;[no kernel frames] 7\napp;do_syscall_64;page_fault 3\n");
    let samples = ok(&hrperf(&["report", f, "--folded", "--samples"]));
    assert_eq!(
        samples,
        "main;bar 1\nmain;foo;bar 1\nmain;foo;do_syscall_64;page_fault 1\n"
    );

    let callers = ok(&hrperf(&["report", f, "--callers", "bar", "--callees", "foo"]));
    assert!(callers.contains("Callers of [.] bar: inclusive 70.00%"), "{callers}");
    assert!(
        callers.lines().any(|l| l.contains("foo") && l.contains("60.00%")),
        "{callers}"
    );
    assert!(callers.contains("Callees of [.] foo"), "{callers}");
    assert!(
        callers
            .lines()
            .any(|l| l.contains("do_syscall_64") && l.contains("30.00%")),
        "{callers}"
    );

    let json: serde_json::Value = serde_json::from_str(&ok(&hrperf(&[
        "report",
        f,
        "--json",
        "--sort",
        "self",
        "--callers",
        "bar",
    ])))
    .unwrap();
    assert_eq!(json["total_weight"], 10);
    assert_eq!(json["functions"][0]["name"], "bar");
    assert_eq!(json["functions"][0]["self"], 7);
    assert_eq!(json["functions"][0]["inclusive"], 7);
    assert_eq!(json["callers"]["edges"][0]["name"], "foo");
    assert_eq!(json["callers"]["edges"][0]["weight"], 6);
    let top1: serde_json::Value = serde_json::from_str(&ok(&hrperf(&["report", f, "--json", "--top", "1"]))).unwrap();
    assert_eq!(top1["functions"].as_array().unwrap().len(), 1);
    assert_eq!(top1["functions"][0]["name"], "main");
}

#[test]
fn flamegraph_svg_is_written() {
    let d = tmpdir("stacks-svg");
    let cap = stacks_capture(&d);
    let svg = d.join("out.svg");
    let out = hrperf(&["report", cap.to_str().unwrap(), "--flamegraph", svg.to_str().unwrap()]);
    ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("page_fault") && text.contains("main"),
        "{}",
        text.len()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("flame graph"));
}

#[test]
fn one_line_errors() {
    let d = tmpdir("stacks-errors");
    let cap = stacks_capture(&d);
    let f = cap.to_str().unwrap();
    one_line_error(
        &hrperf(&["report", f, "--callers", "ba"]),
        "function 'ba' is in no stack",
    );
    one_line_error(&hrperf(&["report", f, "--callers", "ba"]), "did you mean 'bar'");
    one_line_error(
        &hrperf(&["report", f, "--folded-comm"]),
        "--folded-comm needs --folded or --flamegraph",
    );
    one_line_error(&hrperf(&["report", f, "--folded", "--json"]), "--folded prints only");
    one_line_error(
        &hrperf(&["report", f, "--by", "sum"]),
        "--by and --time-series apply to --format aggregate",
    );
    one_line_error(
        &hrperf(&["report", f, "--format", "nope"]),
        "pebs, aggregate, llc-stack",
    );
    let bad_dir = d.join("no/such/dir/x.svg");
    one_line_error(
        &hrperf(&["report", f, "--flamegraph", bad_dir.to_str().unwrap()]),
        "x.svg",
    );
    let out = hrperf(&["report", f, "--kernel-only", "--user-only"]);
    assert_eq!(out.status.code(), Some(2));

    // Stack options on another format's capture.
    let delta = d.join("delta.data");
    write(&delta, "delta", &[]);
    one_line_error(
        &hrperf(&["report", delta.to_str().unwrap(), "--format", "pebs", "--folded"]),
        "--folded applies to llc-stack reports",
    );
    one_line_error(
        &hrperf(&["report", delta.to_str().unwrap(), "--format", "llc-stack"]),
        "--format llc-stack",
    );
}

#[test]
fn help_has_examples() {
    let help = ok(&hrperf(&["report", "--help"]));
    assert!(help.contains("EXAMPLES") && help.contains("--flamegraph app.svg") && help.contains("--callers"));
}
