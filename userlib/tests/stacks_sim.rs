//! Golden test of the call-stack path end to end with known stacks: the `sim` source's
//! steady workload gives its overflow samples the call paths of
//! `hrperf::source::sim::stacks::SCHEDULE` in order, so for 24 samples per CPU (two
//! CPUs, 20 ms, llc-misses every 5000) every path's count is known by hand:
//!
//! ```text
//! per CPU: 13 samples of one full schedule + its first 11 positions
//! path 0 scan_table                         4 + 3 = 7
//! path 1 btree_lookup <- hash_join          3 + 3 = 6
//! path 2 hash_join                          2 + 2 = 4
//! path 3 btree_lookup x3 (recursion)        1 + 1 = 2
//! path 4 read syscall (kernel) <- scan_table 2 + 1 = 3
//! path 5 page fault (kernel) <- memmove      1 + 1 = 2
//! ```
//!
//! The capture goes through the engine, the llc-stack handler (stacks via the
//! recorder's Services), the capture file and the symbolizer (the simulator's kallsyms
//! text and SYM_TABLE in the capture); inclusive and self weights and the folded output
//! must be exact.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use hrperf::record::{record, RecordOptions};
use hrperf::source::sim::{parse_events, SimConfig, SimSource, Workload};
use hrperf::stacks::{FrameFilter, Profile, ProfileOptions, SortBy, WeightBy};
use hrperf_abi::format::MODE_OVERFLOW;

const PERIOD: u64 = 5000;

fn capture(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hrperf-stacks-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let mut cfg = SimConfig::new(parse_events("llc-misses,cycles").unwrap());
    cfg.cpus = 2;
    cfg.duration_ns = 20_000_000;
    cfg.mode = MODE_OVERFLOW;
    cfg.period = PERIOD;
    cfg.workload = Workload::Steady;
    let mut src = SimSource::new(cfg).unwrap();
    let opts = RecordOptions { format: "llc-stack".into(), host_info: false, ..RecordOptions::default() };
    let file = std::fs::File::create(&path).unwrap();
    let sum = record(&mut src, &opts, file, &path, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!((sum.samples, sum.stacks, sum.drops), (48, 48, 0), "{sum:?}");
    path
}

fn profile(path: &std::path::Path, frames: FrameFilter) -> Profile {
    let reader = hrperf::capture::Reader::open(path).unwrap();
    let opts = ProfileOptions { frames, ..ProfileOptions::default() };
    Profile::from_reader(&reader, &opts).unwrap()
}

/// (inclusive samples, self samples) per function, by hand from the path counts above
/// (both CPUs: paths 0..=5 have 14, 12, 8, 4, 6, 4 samples).
fn expected() -> BTreeMap<&'static str, (u64, u64)> {
    let (p0, p1, p2, p3, p4, p5) = (14, 12, 8, 4, 6, 4);
    let read = p4;
    let fault = p5;
    BTreeMap::from([
        ("main", (48, 0)),
        ("run_queries", (48, 0)),
        ("scan_table", (p0 + p4, p0)),
        ("hash_join", (p1 + p2 + p3 + p5, p2)),
        ("btree_lookup", (p1 + p3, p1 + p3)),
        ("__libc_read", (read, 0)),
        ("entry_SYSCALL_64", (read, 0)),
        ("do_syscall_64", (read, 0)),
        ("__x64_sys_read", (read, 0)),
        ("ksys_read", (read, 0)),
        ("vfs_read", (read, 0)),
        ("copy_user_generic", (read, read)),
        ("__memmove_avx_unaligned_erms", (fault, 0)),
        ("asm_exc_page_fault", (fault, 0)),
        ("exc_page_fault", (fault, 0)),
        ("handle_mm_fault", (fault, 0)),
        ("clear_page_erms", (fault, fault)),
    ])
}

#[test]
fn inclusive_and_self_counts_are_exact() {
    let path = capture("exact.data");
    let p = profile(&path, FrameFilter::All);
    assert_eq!(p.total_samples(), 48);
    assert_eq!(p.total_weight(), 48 * PERIOD);
    assert_eq!(p.stats().unresolved_frames, 0, "every frame symbolizes from the capture");
    let got: BTreeMap<&str, (u64, u64)> = p
        .functions(SortBy::Inclusive)
        .into_iter()
        .map(|f| (&*f.name, (f.inclusive_samples, f.self_samples)))
        .collect();
    assert_eq!(got, expected());
    for f in p.functions(SortBy::Inclusive) {
        assert_eq!((f.inclusive, f.self_weight), (f.inclusive_samples * PERIOD, f.self_samples * PERIOD), "{}", f.name);
        assert_eq!(f.kernel, f.object.starts_with("[kernel"), "{} in {}", f.name, f.object);
    }
    // Sorted by self weight, the leaves come first.
    let by_self: Vec<&str> = p.functions(SortBy::SelfWeight).iter().take(2).map(|f| &*f.name).collect();
    assert_eq!(by_self, ["btree_lookup", "scan_table"]);
}

#[test]
fn folded_output_matches_the_golden_file() {
    let path = capture("folded.data");
    let p = profile(&path, FrameFilter::All);
    let mut out = Vec::new();
    p.folded(&mut out, false).unwrap();
    let got = String::from_utf8(out).unwrap();
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/sim-stacks.folded");
    if std::env::var_os("HRPERF_BLESS").is_some() {
        std::fs::write(golden, &got).unwrap();
    }
    let want = std::fs::read_to_string(golden).unwrap();
    assert_eq!(got, want, "re-bless with HRPERF_BLESS=1 if the change is intended");
    // Independently of the golden file: the six paths, root first, weights by hand.
    let lines: BTreeMap<String, u64> = p.folded_lines(false);
    let k = PERIOD;
    let read = "main;run_queries;scan_table;__libc_read;entry_SYSCALL_64;do_syscall_64;__x64_sys_read;ksys_read;vfs_read;copy_user_generic";
    let fault = "main;run_queries;hash_join;__memmove_avx_unaligned_erms;asm_exc_page_fault;exc_page_fault;handle_mm_fault;clear_page_erms";
    let want: BTreeMap<String, u64> = [
        ("main;run_queries;scan_table", 14 * k),
        ("main;run_queries;hash_join;btree_lookup", 12 * k),
        ("main;run_queries;hash_join", 8 * k),
        ("main;run_queries;hash_join;btree_lookup;btree_lookup;btree_lookup", 4 * k),
        (read, 6 * k),
        (fault, 4 * k),
    ]
    .into_iter()
    .map(|(s, w)| (s.to_string(), w))
    .collect();
    assert_eq!(lines, want);
}

#[test]
fn kernel_and_user_filters_conserve_the_total() {
    let path = capture("filters.data");
    for (filter, empty, present) in [
        (FrameFilter::KernelOnly, "[no kernel frames]", "copy_user_generic"),
        (FrameFilter::UserOnly, "[no user frames]", "scan_table"),
    ] {
        let p = profile(&path, filter);
        assert_eq!(p.total_samples(), 48);
        assert!(p.function(present).is_some());
        let f = |n: &str| p.function(n).map(|f| f.inclusive_samples);
        match filter {
            // 38 samples had no kernel frame; the 10 that had keep theirs only.
            FrameFilter::KernelOnly => {
                assert_eq!(f(empty), Some(38));
                assert_eq!(f("main"), None);
                assert_eq!(f("copy_user_generic"), Some(6));
            }
            // Every simulated sample has user frames.
            _ => {
                assert_eq!(f(empty), None);
                assert_eq!(f("copy_user_generic"), None);
                assert_eq!(f("main"), Some(48));
            }
        }
    }
    let by_samples = {
        let reader = hrperf::capture::Reader::open(&path).unwrap();
        Profile::from_reader(&reader, &ProfileOptions { weight: WeightBy::Samples, ..ProfileOptions::default() }).unwrap()
    };
    assert_eq!(by_samples.total_weight(), 48);
}
