//! `hrperf::import`: stap text and perf.data files to llc-stack captures, including
//! damaged input (never a panic; everything before the damage is kept).

use std::path::Path;
use std::process::Command;

use hrperf::capture::Reader;
use hrperf::import::{import_perf_data, import_stap, ImportError, PerfDataOptions, StapOptions};
use hrperf_abi::capture::{SYM_COMM, SYM_MAPS, SYM_TABLE};
use hrperf_fmt_llc_stack::record::{
    StackRecord, STK_IMPORTED, STK_NO_USER_STACK, STK_PERF_SOURCED,
};

/// Every stack record of a capture: (weight, kernel frames, user frames, flags, comm).
type Rec = (u64, Vec<u64>, Vec<u64>, u32, Vec<u8>);

/// Every SYMBOLS chunk of a capture: (kind, pid, text).
type Syms = Vec<(u32, u32, Vec<u8>)>;

fn records(path: &Path) -> (Vec<Rec>, Syms) {
    let r = Reader::open(path).unwrap();
    assert_eq!(r.meta().format_name, "llc-stack");
    let mut recs = Vec::new();
    let mut syms = Vec::new();
    let mut chunks = r.chunks();
    for chunk in &mut chunks {
        let chunk = chunk.unwrap();
        if let Some((kind, pid, text)) = chunk.symbols() {
            syms.push((kind, pid, text.to_vec()));
        }
        for rec in chunk.records() {
            let rec = rec.unwrap();
            let s = StackRecord::parse(rec.bytes).unwrap();
            recs.push((
                s.fixed.weight,
                s.kernel().collect(),
                s.user().collect(),
                s.fixed.flags,
                s.fixed.comm().to_vec(),
            ));
        }
    }
    assert!(chunks.warnings().is_empty(), "{:?}", chunks.warnings());
    (recs, syms)
}

fn table_names(syms: &[(u32, u32, Vec<u8>)]) -> Vec<(u64, String)> {
    let (_, _, text) = syms.iter().find(|s| s.0 == SYM_TABLE).expect("a SYM_TABLE");
    String::from_utf8_lossy(text)
        .lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next().unwrap(), 16).unwrap();
            let _size = f.next().unwrap();
            (addr, f.collect::<Vec<_>>().join(" "))
        })
        .collect()
}

const STAP: &str = "# stap output
vfs_read+0x5/0x90!ksys_read+0x71/0xf0!do_syscall_64 1234

0xffffffff81234567 : vfs_read+0x9/0x90 [kernel]!0xffffffff81000000 : ksys_read+0x1/0xf0 [kernel]\t7
xfs_file_read_iter+0x10/0x20 [xfs]!vfs_read+0x5/0x90 3
";

#[test]
fn stap_lines_become_weighted_kernel_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("s.txt"), dir.path().join("s.data"));
    std::fs::write(&input, STAP).unwrap();
    let s = import_stap(&input, &out, &StapOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((s.samples, s.records, s.damage.clone()), (3, 3, None));
    assert_eq!((s.frames, s.weight), (3 + 2 + 2, 1234 + 7 + 3));
    let (recs, syms) = records(&out);
    let names = table_names(&syms);
    let name = |a: u64| names.iter().find(|n| n.0 == a).unwrap().1.clone();
    let frames: Vec<Vec<String>> = recs
        .iter()
        .map(|r| r.1.iter().map(|&a| name(a)).collect())
        .collect();
    assert_eq!(frames[0], ["vfs_read", "ksys_read", "do_syscall_64"]);
    assert_eq!(frames[1], ["vfs_read [kernel]", "ksys_read [kernel]"]);
    assert_eq!(frames[2], ["xfs_file_read_iter [xfs]", "vfs_read"]);
    assert_eq!(recs[0].1[0], recs[2].1[1], "one address per function");
    assert_eq!(recs.iter().map(|r| r.0).collect::<Vec<_>>(), [1234, 7, 3]);
    for r in &recs {
        assert!(r.2.is_empty(), "stap stacks are all kernel frames");
        assert_eq!(
            r.3 & (STK_IMPORTED | STK_NO_USER_STACK),
            STK_IMPORTED | STK_NO_USER_STACK
        );
    }
    // Root first: the same stacks, reversed.
    let s = import_stap(
        &input,
        &out,
        &StapOptions {
            root_first: true,
            ..StapOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(s.records, 3);
    let (recs, syms) = records(&out);
    let names = table_names(&syms);
    let first: Vec<&str> = recs[0]
        .1
        .iter()
        .map(|a| names.iter().find(|n| n.0 == *a).unwrap().1.as_str())
        .collect();
    assert_eq!(first, ["do_syscall_64", "ksys_read", "vfs_read"]);
}

#[test]
fn a_bad_stap_line_stops_the_import_and_keeps_what_came_before() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("s.txt"), dir.path().join("s.data"));
    std::fs::write(
        &input,
        "a!b 1\nc!d 2\nthis line has no count\ne 3\na!!b 4\n\u{0}\u{ff}garbage\n",
    )
    .unwrap();
    let s = import_stap(&input, &out, &StapOptions::default(), &mut |_, _| {}).unwrap();
    let damage = s.damage.expect("damage reported");
    assert!(damage.contains("s.txt:3:"), "{damage}");
    assert_eq!(s.records, 2);
    let (recs, _) = records(&out);
    assert_eq!(
        recs.len(),
        2,
        "the lines before the damage are in a finished capture"
    );
    // --skip-bad: counted and skipped.
    let opts = StapOptions {
        skip_bad: true,
        ..StapOptions::default()
    };
    let s = import_stap(&input, &out, &opts, &mut |_, _| {}).unwrap();
    assert_eq!(s.damage, None);
    assert_eq!(
        (s.records, s.skipped.get("malformed line").copied()),
        (3, Some(3))
    );
    assert!(
        s.notes.iter().any(|n| n.contains("3, 5, 6")),
        "{:?}",
        s.notes
    );
}

#[test]
fn missing_and_garbage_inputs_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.data");
    let missing = dir.path().join("nope");
    assert!(matches!(
        import_stap(&missing, &out, &StapOptions::default(), &mut |_, _| {}),
        Err(ImportError::Read { .. })
    ));
    assert!(matches!(
        import_perf_data(&missing, &out, &PerfDataOptions::default(), &mut |_, _| {}),
        Err(ImportError::Read { .. })
    ));
    // Not a perf.data file at all, and a header that promises more than the file holds.
    let garbage = dir.path().join("garbage");
    let mut seed = 0x1234_5678u64;
    for len in [0usize, 7, 104, 4096] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 33) as u8
            })
            .collect();
        std::fs::write(&garbage, &bytes).unwrap();
        let r = import_perf_data(&garbage, &out, &PerfDataOptions::default(), &mut |_, _| {});
        assert!(
            matches!(r, Err(ImportError::Input { .. })),
            "{len} bytes: {r:?}"
        );
        let mut fake = b"PERFILE2".to_vec();
        fake.extend_from_slice(&bytes);
        std::fs::write(&garbage, &fake).unwrap();
        let r = import_perf_data(&garbage, &out, &PerfDataOptions::default(), &mut |_, _| {});
        assert!(r.is_err() || r.unwrap().records == 0);
    }
}

/// A `perf record -g` of a short command, or `None` (with the reason printed) when perf
/// cannot record here.
fn perf_record(dir: &Path) -> Option<std::path::PathBuf> {
    let data = dir.join("x.perf.data");
    let out = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-g", "-F", "4000", "-o"])
        .arg(&data)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() && data.exists() => Some(data),
        Ok(o) => {
            eprintln!(
                "SKIP perf.data import tests: perf record failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("SKIP perf.data import tests: perf not runnable: {e}");
            None
        }
    }
}

#[test]
fn perf_data_import_and_truncated_files() {
    let dir = tempfile::tempdir().unwrap();
    let Some(data) = perf_record(dir.path()) else {
        return;
    };
    let out = dir.path().join("x.data");
    let opts = PerfDataOptions { kallsyms: None };
    let s = import_perf_data(&data, &out, &opts, &mut |_, _| {}).unwrap();
    assert_eq!(s.damage, None);
    assert!(s.samples > 0, "{s:?}");
    assert_eq!(s.records, s.samples);
    assert_eq!(
        s.stacks, s.samples,
        "perf record -g: every sample has a callchain"
    );
    let (recs, syms) = records(&out);
    assert_eq!(recs.len() as u64, s.records);
    assert_eq!(recs.iter().map(|r| r.0).sum::<u64>(), s.weight);
    for r in &recs {
        assert_eq!(
            r.3 & (STK_IMPORTED | STK_PERF_SOURCED),
            STK_IMPORTED | STK_PERF_SOURCED
        );
        assert!(!r.1.is_empty() || !r.2.is_empty());
    }
    assert!(recs.iter().any(|r| r.4 == b"sh"), "comm from COMM records");
    let maps = syms
        .iter()
        .find(|s| s.0 == SYM_MAPS)
        .expect("maps of the command");
    let text = String::from_utf8_lossy(&maps.2);
    assert!(
        text.lines()
            .any(|l| l.contains(" r-xp ") && l.contains("sh")),
        "{text}"
    );
    assert!(syms.iter().any(|s| s.0 == SYM_COMM && s.2 == b"sh"));

    // Cut the file anywhere: an error or a damage report, never a panic, and whatever
    // was imported is a readable capture.
    let bytes = std::fs::read(&data).unwrap();
    let cut = dir.path().join("cut.perf.data");
    for frac in [1, 3, 10, 50, 90, 97, 99] {
        let n = bytes.len() * frac / 100;
        std::fs::write(&cut, &bytes[..n]).unwrap();
        match import_perf_data(&cut, &out, &opts, &mut |_, _| {}) {
            Ok(s) => {
                let (recs, _) = records(&out);
                assert_eq!(recs.len() as u64, s.records);
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    // Flip bytes in the data section: same.
    let mut bad = bytes.clone();
    for i in (bad.len() / 3..bad.len()).step_by(97) {
        bad[i] ^= 0xa5;
    }
    std::fs::write(&cut, &bad).unwrap();
    if let Ok(s) = import_perf_data(&cut, &out, &opts, &mut |_, _| {}) {
        let (recs, _) = records(&out);
        assert_eq!(recs.len() as u64, s.records);
    }
}
