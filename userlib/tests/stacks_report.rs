//! Call-stack profiles (`hrperf::stacks`) of hand-built llc-stack captures: exact
//! inclusive and self weights (recursion counted once per stack), folded stacks,
//! callers/callees, frame filters, symbolization through kallsyms, SYM_TABLE, captured
//! maps and real ELF files (this test binary, libc), and garbage that must not panic.

use std::path::Path;

use hrperf::capture::{CaptureMeta, Reader, Writer};
use hrperf::stacks::elf::{demangle, ElfCache, ElfSymbols};
use hrperf::stacks::symbols::{AddressSpace, Kallsyms, SymTable, SymbolData};
use hrperf::stacks::{
    FrameFilter, Profile, ProfileBuilder, ProfileOptions, SortBy, StackError, Symbolizer, WeightBy, NO_KERNEL_FRAMES,
    NO_USER_FRAMES,
};
use hrperf_abi::capture::{EndInfo, SYM_COMM, SYM_KALLSYMS, SYM_MAPS, SYM_TABLE};
use hrperf_fmt_llc_stack::record::{encode, StackFixed, STK_KERNEL_IP, STK_USER_TRUNCATED};

fn meta() -> CaptureMeta {
    CaptureMeta {
        format_name: hrperf_fmt_llc_stack::LLC_STACK_NAME.into(),
        format_uuid: hrperf_fmt_llc_stack::LLC_STACK_UUID,
        format_version: hrperf_fmt_llc_stack::LLC_STACK_VERSION,
        cpus: vec![0],
        ..CaptureMeta::default()
    }
}

/// One record's bytes.
fn rec(pid: u32, comm: &str, weight: u64, flags: u32, ip: u64, kernel: &[u64], user: &[u64]) -> Vec<u8> {
    let mut c = [0u8; 16];
    c[..comm.len()].copy_from_slice(comm.as_bytes());
    let f = StackFixed {
        pid,
        tid: pid,
        weight,
        flags,
        ip,
        comm: c,
        ..StackFixed::default()
    };
    let mut out = Vec::new();
    assert!(encode(&mut out, &f, kernel, user));
    out
}

/// A capture of `records` (one DATA chunk) after the symbol chunks `syms`.
fn capture(records: &[Vec<u8>], syms: &[(u32, u32, &[u8])]) -> Reader {
    let mut w = Writer::new(Vec::new(), &meta()).unwrap();
    for &(kind, pid, text) in syms {
        w.write_symbols(kind, pid, text).unwrap();
    }
    let bytes: Vec<u8> = records.concat();
    w.write_chunk(0, &bytes, records.len() as u64).unwrap();
    let n = records.len() as u64;
    let out = w
        .finish(EndInfo {
            end_time_ns: 0,
            total_records: n,
            total_drops: 0,
            exit_status: 0,
            reserved: 0,
        })
        .unwrap();
    Reader::from_bytes("test.data", out).unwrap()
}

const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 T do_syscall_64
ffffffff81001000 t __pfx_do_syscall_64
ffffffff81002000 t page_fault
ffffffff81002800 d some_data
ffffffff81003000 t memset_k\t[mymod]
ffffffff81004000 T end_sym
";

const TABLE: &str = "\
401000 100 main [app]
401100 100 foo [app]
401200 100 bar [app]
401300 100 recurse [app]
";

const K_SYSCALL: u64 = 0xffff_ffff_8100_1010;
const K_FAULT: u64 = 0xffff_ffff_8100_2010;
const K_MEMSET: u64 = 0xffff_ffff_8100_3010;

/// The reference capture: see each record's comment; total weight 32 in 7 records.
fn reference() -> Reader {
    let records = vec![
        // main;foo;bar, 10
        rec(100, "app", 10, 0, 0x401210, &[], &[0x401210, 0x401110, 0x401010]),
        // main;foo;do_syscall_64;page_fault, 5
        rec(100, "app", 5, 0, K_FAULT, &[K_FAULT, K_SYSCALL], &[0x401120, 0x401020]),
        // main;recurse;recurse;recurse, 7 (recursion counts once)
        rec(
            100,
            "app",
            7,
            0,
            0x401310,
            &[],
            &[0x401310, 0x401320, 0x401330, 0x401030],
        ),
        // no stack: the kernel IP alone, memset_k in [mymod], 3
        rec(100, "app", 3, STK_KERNEL_IP, K_MEMSET, &[], &[]),
        // pid without maps or table, truncated, comm from SYM_COMM: [unknown] 0x7000, 2
        rec(200, "", 2, STK_USER_TRUNCATED, 0x7000, &[], &[0x7000]),
        // main;foo;bar again, 4 (merges with the first)
        rec(100, "app", 4, 0, 0x401220, &[], &[0x401220, 0x401130, 0x401040]),
        // an address nothing covers: [unknown] 0x500000, 1
        rec(100, "app", 1, 0, 0x500000, &[], &[0x500000]),
    ];
    capture(
        &records,
        &[
            (SYM_KALLSYMS, 0, KALLSYMS.as_bytes()),
            (SYM_TABLE, 100, TABLE.as_bytes()),
            (SYM_COMM, 200, b"other\n"),
        ],
    )
}

fn weights(p: &Profile, sort: SortBy) -> Vec<(String, u64, u64)> {
    p.functions(sort)
        .iter()
        .map(|f| (f.name.to_string(), f.inclusive, f.self_weight))
        .collect()
}

fn folded(p: &Profile, comm: bool) -> String {
    let mut out = Vec::new();
    p.folded(&mut out, comm).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn exact_inclusive_and_self_weights() {
    let p = Profile::from_reader(&reference(), &ProfileOptions::default()).unwrap();
    assert_eq!(p.total_weight(), 32);
    assert_eq!(p.total_samples(), 7);
    let w = weights(&p, SortBy::Inclusive);
    let expect: Vec<(String, u64, u64)> = [
        ("main", 26, 0),
        ("foo", 19, 0),
        ("bar", 14, 14),
        ("recurse", 7, 7),
        // Ties on inclusive weight: the larger self weight first.
        ("page_fault", 5, 5),
        ("do_syscall_64", 5, 0),
        ("memset_k", 3, 3),
        ("[unknown] 0x7000", 2, 2),
        ("[unknown] 0x500000", 1, 1),
    ]
    .iter()
    .map(|&(n, i, s)| (n.to_string(), i, s))
    .collect();
    assert_eq!(w, expect);
    // Self weights conserve the total.
    assert_eq!(
        p.functions(SortBy::SelfWeight)
            .iter()
            .map(|f| f.self_weight)
            .sum::<u64>(),
        32
    );
    let by_self = weights(&p, SortBy::SelfWeight);
    assert_eq!(by_self[0].0, "bar");
    assert_eq!(by_self[1].0, "recurse");
    let bar = p.function("bar").unwrap();
    assert_eq!((bar.inclusive_samples, bar.self_samples), (2, 2));
    assert_eq!(&*bar.object, "app");
    assert!(!bar.kernel);
    let m = p.function("memset_k").unwrap();
    assert_eq!(&*m.object, "[mymod]");
    assert!(m.kernel);
    assert_eq!(&*p.function("do_syscall_64").unwrap().object, "[kernel.kallsyms]");
    assert!((p.pct(p.function("main").unwrap().inclusive) - 81.25).abs() < 1e-9);
    let s = p.stats();
    assert_eq!(
        (s.records, s.malformed, s.user_truncated, s.kernel_truncated),
        (7, 0, 1, 0)
    );
    // Raw stacks: the two main;foo;bar records differ in their addresses.
    assert_eq!(s.distinct_stacks, 7);
    assert_eq!(s.unresolved_frames, 2);
}

#[test]
fn folded_stacks_sorted_and_merged() {
    let p = Profile::from_reader(&reference(), &ProfileOptions::default()).unwrap();
    assert_eq!(
        folded(&p, false),
        "[unknown] 0x500000 1\n\
         [unknown] 0x7000 2\n\
         main;foo;bar 14\n\
         main;foo;do_syscall_64;page_fault 5\n\
         main;recurse;recurse;recurse 7\n\
         memset_k 3\n"
    );
    assert_eq!(
        folded(&p, true),
        "app;[unknown] 0x500000 1\n\
         app;main;foo;bar 14\n\
         app;main;foo;do_syscall_64;page_fault 5\n\
         app;main;recurse;recurse;recurse 7\n\
         app;memset_k 3\n\
         other;[unknown] 0x7000 2\n"
    );
}

#[test]
fn callers_and_callees() {
    let p = Profile::from_reader(&reference(), &ProfileOptions::default()).unwrap();
    let e = |v: Vec<hrperf::stacks::Edge>| {
        v.into_iter()
            .map(|e| (e.name.to_string(), e.weight, e.samples))
            .collect::<Vec<_>>()
    };
    assert_eq!(e(p.callers("foo").unwrap()), [("main".to_string(), 19, 3)]);
    assert_eq!(
        e(p.callees("foo").unwrap()),
        [("bar".to_string(), 14, 2), ("do_syscall_64".to_string(), 5, 1)]
    );
    // Recursion: recurse calls itself; each edge once per stack.
    assert_eq!(
        e(p.callers("recurse").unwrap()),
        [("main".to_string(), 7, 1), ("recurse".to_string(), 7, 1)]
    );
    assert_eq!(e(p.callees("recurse").unwrap()), [("recurse".to_string(), 7, 1)]);
    assert_eq!(e(p.callers("main").unwrap()), []);
    assert_eq!(e(p.callees("page_fault").unwrap()), []);
    assert!(p.callers("nope").is_none());
}

#[test]
fn frame_filters_conserve_the_total() {
    let opts = ProfileOptions {
        frames: FrameFilter::KernelOnly,
        ..ProfileOptions::default()
    };
    let p = Profile::from_reader(&reference(), &opts).unwrap();
    assert_eq!(p.total_weight(), 32);
    assert_eq!(
        weights(&p, SortBy::Inclusive),
        [
            (NO_KERNEL_FRAMES.to_string(), 24, 24),
            ("page_fault".into(), 5, 5),
            ("do_syscall_64".into(), 5, 0),
            ("memset_k".into(), 3, 3)
        ]
    );
    let opts = ProfileOptions {
        frames: FrameFilter::UserOnly,
        ..ProfileOptions::default()
    };
    let p = Profile::from_reader(&reference(), &opts).unwrap();
    assert_eq!(p.total_weight(), 32);
    assert_eq!(
        p.function(NO_USER_FRAMES).map(|f| (f.inclusive, f.self_weight)),
        Some((3, 3))
    );
    assert_eq!(p.function("foo").map(|f| (f.inclusive, f.self_weight)), Some((19, 5)));
    assert!(p.function("page_fault").is_none());
    assert_eq!(
        folded(&p, false),
        "[no user frames] 3\n[unknown] 0x500000 1\n[unknown] 0x7000 2\nmain;foo 5\nmain;foo;bar 14\nmain;recurse;recurse;recurse 7\n"
    );
}

#[test]
fn sample_counts_instead_of_weights() {
    let opts = ProfileOptions {
        weight: WeightBy::Samples,
        ..ProfileOptions::default()
    };
    let p = Profile::from_reader(&reference(), &opts).unwrap();
    assert_eq!(p.total_weight(), 7);
    assert_eq!(p.function("main").map(|f| (f.inclusive, f.self_weight)), Some((4, 0)));
    assert_eq!(p.function("bar").map(|f| (f.inclusive, f.self_weight)), Some((2, 2)));
}

#[test]
fn malformed_records_lost_and_wrong_format() {
    let mut bad = rec(100, "app", 9, 0, 0x401010, &[], &[0x401010]);
    bad[58] = 3; // nr_user no longer matches the size
                 // A LOST record: header {kind 1, misc 0, size 16}, then the count.
    let mut lost = Vec::new();
    lost.extend(1u32.to_ne_bytes());
    lost.extend(0u16.to_ne_bytes());
    lost.extend(16u16.to_ne_bytes());
    lost.extend(42u64.to_ne_bytes());
    let r = capture(
        &[bad, lost, rec(100, "app", 1, 0, 0x401010, &[], &[0x401010])],
        &[(SYM_TABLE, 0, TABLE.as_bytes())],
    );
    let p = Profile::from_reader(&r, &ProfileOptions::default()).unwrap();
    assert_eq!((p.stats().malformed, p.stats().lost, p.stats().records), (1, 42, 1));
    assert_eq!(p.total_weight(), 1);
    // pid 0 tables serve every process.
    assert_eq!(p.function("main").map(|f| f.self_weight), Some(1));

    let mut w = Writer::new(
        Vec::new(),
        &CaptureMeta {
            format_name: "delta".into(),
            ..CaptureMeta::default()
        },
    )
    .unwrap();
    w.write_symbols(SYM_COMM, 1, b"x").unwrap();
    let out = w
        .finish(EndInfo {
            end_time_ns: 0,
            total_records: 0,
            total_drops: 0,
            exit_status: 0,
            reserved: 0,
        })
        .unwrap();
    let r = Reader::from_bytes("delta.data", out).unwrap();
    let e = Profile::from_reader(&r, &ProfileOptions::default()).unwrap_err();
    assert!(matches!(e, StackError::NotLlcStack { .. }), "{e}");
    assert!(e.to_string().contains("--format llc-stack"), "{e}");
}

#[test]
fn raw_frame_display_and_kallsyms_details() {
    let mut data = SymbolData::default();
    data.add(SYM_KALLSYMS, 0, KALLSYMS.as_bytes());
    // Data symbols are not functions; aliases keep the name perf picks (fewer underscores).
    assert_eq!(data.kallsyms.len(), 5);
    let mut s = Symbolizer::new(data, 4);
    assert_eq!(
        s.symbolize(true, 1, K_SYSCALL).raw(),
        "do_syscall_64+0x10/0x1000 [kernel.kallsyms]"
    );
    assert_eq!(s.symbolize(true, 1, K_MEMSET).raw(), "memset_k+0x10/0x1000 [mymod]");
    // page_fault runs to memset_k: the data symbol in between is not text.
    assert_eq!(
        s.symbolize(true, 1, 0xffff_ffff_8100_2900).raw(),
        "page_fault+0x900/0x1000 [kernel.kallsyms]"
    );
    let u = s.symbolize(true, 1, 0x1234);
    assert!(!u.resolved());
    assert_eq!(&*u.name, "[unknown] 0x1234");
    // The same address as a user frame of a pid without maps.
    assert_eq!(&*s.symbolize(false, 1, K_SYSCALL).name, "[unknown] 0xffffffff81001010");
    // Hidden kallsyms (kptr_restrict) resolve nothing, and do not replace a readable table.
    let mut data = SymbolData::default();
    data.add(SYM_KALLSYMS, 0, KALLSYMS.as_bytes());
    data.add(
        SYM_KALLSYMS,
        0,
        b"0000000000000000 T _stext\n0000000000000000 T do_syscall_64\n",
    );
    assert_eq!(data.kallsyms.len(), 5);
    assert!(Kallsyms::parse(b"0000000000000000 T _stext\n").is_empty());
}

#[test]
fn maps_snapshots_merge_later_wins() {
    let mut a = AddressSpace::default();
    a.add_snapshot(b"00400000-00500000 r-xp 00000000 08:01 1 /bin/old\n7f0000000000-7f0000010000 r-xp 00001000 08:01 2 /lib/liba.so\n");
    a.add_snapshot(b"00480000-00490000 r-xp 00002000 08:01 3 /bin/new\n");
    assert_eq!(&*a.lookup(0x400100).unwrap().path, "/bin/old");
    assert_eq!(&*a.lookup(0x480100).unwrap().path, "/bin/new");
    let tail = a.lookup(0x4a0000).unwrap();
    assert_eq!((&*tail.path, tail.start, tail.offset), ("/bin/old", 0x490000, 0x90000));
    assert_eq!(&*a.lookup(0x7f0000000010).unwrap().path, "/lib/liba.so");
    assert!(a.lookup(0x500000).is_none());
    // A mapped file that is missing or not ELF: `[unknown] <basename>+0x<file offset>`.
    let mut data = SymbolData::default();
    data.add(
        SYM_MAPS,
        7,
        b"7f0000000000-7f0000010000 r-xp 00001000 08:01 2 /nonexistent/libgone.so (deleted)\n",
    );
    data.add(SYM_MAPS, 7, b"00600000-00601000 r-xp 00000000 00:00 0 [vdso]\n");
    let mut s = Symbolizer::new(data, 4);
    let g = s.symbolize(false, 7, 0x7f0000000020);
    assert_eq!((&*g.name, &*g.object), ("[unknown] libgone.so+0x1020", "libgone.so"));
    assert_eq!(&*s.symbolize(false, 7, 0x600010).name, "[unknown] [vdso]+0x10");
}

#[test]
fn sym_table_names_with_spaces_and_per_pid_priority() {
    let t = SymTable::parse(b"1000 10 std::vector<int> push_back [libx.so]\n2000 0 zero\nzz 10 bad\n3000 10 plain\n");
    assert_eq!(t.len(), 2);
    let e = t.lookup(0x1005).unwrap();
    assert_eq!(
        (&*e.name, e.object.as_deref()),
        ("std::vector<int> push_back", Some("libx.so"))
    );
    assert!(t.lookup(0x1010).is_none());
    let mut data = SymbolData::default();
    data.add(SYM_TABLE, 0, b"1000 100 global_fn\n");
    data.add(SYM_TABLE, 5, b"1000 100 own_fn [own]\n");
    data.add(SYM_KALLSYMS, 0, KALLSYMS.as_bytes());
    // Tables cover kernel addresses too (the simulator's kernel), before kallsyms.
    data.add(SYM_TABLE, 0, b"ffffffff81001000 20 sim_syscall [simkernel]\n");
    let mut s = Symbolizer::new(data, 4);
    assert_eq!(&*s.symbolize(false, 5, 0x1001).name, "own_fn");
    assert_eq!(&*s.symbolize(false, 6, 0x1001).name, "global_fn");
    let k = s.symbolize(true, 6, K_SYSCALL);
    assert_eq!(k.raw(), "sim_syscall+0x10/0x20 [simkernel]");
    assert_eq!(
        s.symbolize(true, 6, K_SYSCALL + 0x100).raw(),
        "do_syscall_64+0x110/0x1000 [kernel.kallsyms]"
    );
}

#[test]
fn demangling() {
    assert_eq!(
        demangle("_ZN3std2rt10lang_start17h0123456789abcdefE"),
        "std::rt::lang_start"
    );
    assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
    assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar");
    assert_eq!(demangle("memcpy"), "memcpy");
    assert_eq!(demangle("_Zgarbage!"), "_Zgarbage!");
}

#[test]
fn garbage_never_panics() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        let len = (next() % 600) as usize;
        let mut text: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 2 == 0 {
            // Mostly printable, with the separators the parsers split on.
            for b in &mut text {
                *b = b"0123456789abcdefx -[]\n\tTtWw/ ()"[(*b as usize) % 31];
            }
        }
        let mut data = SymbolData::default();
        for kind in 0..6 {
            data.add(kind, (next() % 3) as u32, &text);
        }
        let _ = ElfSymbols::parse(&text);
        let mut s = Symbolizer::new(data, 2);
        for _ in 0..20 {
            let a = next();
            let _ = s.symbolize(a & 1 == 0, (next() % 3) as u32, a).raw();
        }
        let mut b = ProfileBuilder::new(&ProfileOptions::default());
        b.add_record_bytes(&text);
        b.add_symbols(SYM_KALLSYMS, 0, &text);
        let _ = b.finish();
    }
    // A truncated real ELF file.
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    for cut in [16, 64, 1000, exe.len() / 2] {
        let _ = ElfSymbols::parse(&exe[..cut]);
    }
}

/// A function whose address the ELF test resolves (C name: not mangled).
#[inline(never)]
#[no_mangle]
pub extern "C" fn hrperf_stacks_test_target(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3).wrapping_add(1)
}

/// A Rust function: its symbol is mangled and must come back demangled.
#[inline(never)]
fn rust_target_fn(x: u64) -> u64 {
    std::hint::black_box(x).rotate_left(7) ^ 0x55
}

fn self_maps() -> Vec<u8> {
    std::fs::read("/proc/self/maps").unwrap()
}

#[test]
fn symbolizes_this_test_binary_through_its_maps() {
    let c_fn = hrperf_stacks_test_target as extern "C" fn(u64) -> u64 as usize as u64;
    let rust_fn = rust_target_fn as fn(u64) -> u64 as usize as u64;
    assert_eq!(hrperf_stacks_test_target(1) + rust_target_fn(0), 4 + (0x55));
    let pid = std::process::id();
    let maps = self_maps();
    let exe = std::env::current_exe().unwrap();
    let base = exe.file_name().unwrap().to_str().unwrap().to_string();
    // Leaf inside the C function, its caller inside the Rust one.
    let r = capture(
        &[rec(pid, "test", 5, 0, c_fn + 1, &[], &[c_fn + 1, rust_fn + 2])],
        &[(SYM_MAPS, pid, &maps)],
    );
    let p = Profile::from_reader(&r, &ProfileOptions::default()).unwrap();
    let leaf = p
        .function("hrperf_stacks_test_target")
        .unwrap_or_else(|| panic!("not resolved: {:?}", weights(&p, SortBy::Inclusive)));
    assert_eq!((leaf.inclusive, leaf.self_weight), (5, 5));
    assert_eq!(&*leaf.object, base);
    let caller = p
        .functions(SortBy::Inclusive)
        .into_iter()
        .find(|f| f.self_weight == 0)
        .unwrap();
    assert!(caller.name.ends_with("rust_target_fn"), "{}", caller.name);
    assert!(caller.name.starts_with("stacks_report::"), "{}", caller.name);
    assert_eq!(p.stats().elf_loads, 1);
    assert_eq!(
        folded(&p, false),
        format!("{};hrperf_stacks_test_target 5\n", caller.name)
    );

    // The raw frame: offset from the symbol's start and its size, from .symtab.
    let mut data = SymbolData::default();
    data.add(SYM_MAPS, pid, &maps);
    let mut s = Symbolizer::new(data, 1);
    let sym = s.symbolize(false, pid, c_fn + 1);
    let (off, size) = sym.offset_size.unwrap();
    assert_eq!(off, 1);
    assert!(size > 1, "size {size}");
    assert_eq!(sym.raw(), format!("hrperf_stacks_test_target+0x1/{size:#x} [{base}]"));
}

#[test]
fn symbolizes_a_system_library() {
    let getpid = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
    let maps = self_maps();
    let mut space = AddressSpace::default();
    space.add_snapshot(&maps);
    let Some(m) = space.lookup(getpid).filter(|m| {
        Path::new(&*m.path)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libc"))
    }) else {
        eprintln!("SKIP: getpid at {getpid:#x} is not in a mapped libc (static build?)");
        return;
    };
    let lib = m.path.to_string();
    let pid = std::process::id();
    let mut data = SymbolData::default();
    data.add(SYM_MAPS, pid, &maps);
    let mut s = Symbolizer::new(data, 4);
    let sym = s.symbolize(false, pid, getpid);
    assert!(sym.name.ends_with("getpid"), "{} in {lib}", sym.name);
    assert_eq!(sym.offset_size.map(|o| o.0), Some(0));
    assert_eq!(&*sym.object, Path::new(&lib).file_name().unwrap().to_str().unwrap());
    // Cached: a second lookup does not parse the file again.
    let _ = s.symbolize(false, pid, getpid + 1);
    assert_eq!(s.elf_loads(), 1);
}

#[test]
fn flamegraph_svg() {
    let p = Profile::from_reader(&reference(), &ProfileOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("f.svg");
    p.flamegraph(&svg, "test", true).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml"), "{}", &text[..100.min(text.len())]);
    assert!(text.contains("recurse") && text.contains("page_fault"));
    // Nothing to draw is an error, not an empty file.
    let empty = capture(&[], &[]);
    let p = Profile::from_reader(&empty, &ProfileOptions::default()).unwrap();
    assert!(matches!(
        p.flamegraph(&dir.path().join("e.svg"), "t", false),
        Err(StackError::Empty { .. })
    ));
}

#[test]
fn one_name_in_several_objects_is_one_function() {
    let r = capture(
        &[
            rec(1, "a", 2, 0, 0x1004, &[], &[0x1004]),
            rec(2, "b", 3, 0, 0x1004, &[], &[0x1004]),
        ],
        &[
            (SYM_TABLE, 1, b"1000 10 main [a]\n"),
            (SYM_TABLE, 2, b"1000 10 main [b]\n"),
        ],
    );
    let p = Profile::from_reader(&r, &ProfileOptions::default()).unwrap();
    let m = p.function("main").unwrap();
    assert_eq!((m.inclusive, m.self_weight, &*m.object), (5, 5, "[multiple]"));
    assert_eq!(p.functions(SortBy::Inclusive).len(), 1);
}

#[test]
fn elf_cache_is_lru() {
    let exe = std::env::current_exe().unwrap();
    let other = Path::new("/proc/self/exe");
    let mut c = ElfCache::new(1);
    assert!(c.get(&exe).is_some());
    assert!(c.get(&exe).is_some());
    assert_eq!(c.loads, 1);
    assert!(c.get(other).is_some());
    assert!(c.get(&exe).is_some());
    assert_eq!(c.loads, 3, "capacity 1: the second file evicted the first");
    // Unreadable files are remembered too.
    assert!(c.get(Path::new("/nonexistent/x.so")).is_none());
    assert!(c.get(Path::new("/nonexistent/x.so")).is_none());
    assert_eq!(c.loads, 4);
}
