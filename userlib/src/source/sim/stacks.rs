//! The simulated program's call stacks: a small database-like program ("simapp", pid
//! 1000) with fixed functions, a kernel with fixed functions, and a fixed set of call
//! paths. With stacks asked for ([`Source::want_stacks`](crate::source::Source)), every
//! overflow sample of a CPU gets one path: in the `steady` workload the paths follow
//! [`SCHEDULE`] in order (so the counts per path, and every inclusive and self count,
//! are exactly predictable from the number of samples), in the `phases` workload a
//! path is drawn (from a generator of its own, so the rest of the simulation is the
//! same with or without stacks) among the paths of the current phase's kind.
//!
//! Symbols: the kernel's as `/proc/kallsyms` text, the program's and its library's as a
//! `SYM_TABLE` — the capture carries both, so sim captures symbolize anywhere.

use hrperf_abi::capture::{SYM_COMM, SYM_KALLSYMS, SYM_TABLE};

use crate::source::{SampleStack, SymbolText};

/// Process id of the simulated program.
pub const SIM_PID: u32 = 1000;
/// Command name of the simulated program.
pub const SIM_COMM: &[u8] = b"simapp";
/// Command name of the idle task (pid 0).
pub const IDLE_COMM: &[u8] = b"swapper";

/// A function of the simulated program or kernel: name, start, size, object.
#[derive(Clone, Copy, Debug)]
pub struct Func {
    /// Symbol name.
    pub name: &'static str,
    /// Start address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// Object (`simapp`, `libc.so.6`, or `[kernel]`).
    pub object: &'static str,
}

const fn f(name: &'static str, start: u64, size: u64, object: &'static str) -> Func {
    Func { name, start, size, object }
}

/// The program's and its library's functions.
pub const USER_FUNCS: &[Func] = &[
    f("main", 0x40_1000, 0x100, "simapp"),
    f("run_queries", 0x40_1100, 0x200, "simapp"),
    f("hash_join", 0x40_1300, 0x300, "simapp"),
    f("scan_table", 0x40_1600, 0x200, "simapp"),
    f("btree_lookup", 0x40_1800, 0x200, "simapp"),
    // Where the phases workload's other phases run (PEBS samples).
    f("stream_copy", 0x40_4000, 0x400, "simapp"),
    f("parse_json", 0x40_8000, 0x1000, "simapp"),
    f("__memmove_avx_unaligned_erms", 0x7f00_0010_0000, 0x400, "libc.so.6"),
    f("__libc_read", 0x7f00_0010_1000, 0x80, "libc.so.6"),
];

/// The kernel's functions.
pub const KERNEL_FUNCS: &[Func] = &[
    f("entry_SYSCALL_64", 0xffff_ffff_8100_0000, 0x100, "[kernel]"),
    f("do_syscall_64", 0xffff_ffff_8100_0100, 0x100, "[kernel]"),
    f("__x64_sys_read", 0xffff_ffff_8100_0200, 0x40, "[kernel]"),
    f("ksys_read", 0xffff_ffff_8100_0240, 0xc0, "[kernel]"),
    f("vfs_read", 0xffff_ffff_8100_0300, 0x200, "[kernel]"),
    f("copy_user_generic", 0xffff_ffff_8100_0500, 0x100, "[kernel]"),
    f("asm_exc_page_fault", 0xffff_ffff_8100_0600, 0x40, "[kernel]"),
    f("exc_page_fault", 0xffff_ffff_8100_0640, 0xc0, "[kernel]"),
    f("handle_mm_fault", 0xffff_ffff_8100_0700, 0x300, "[kernel]"),
    f("clear_page_erms", 0xffff_ffff_8100_0a00, 0x40, "[kernel]"),
    f("generic_perform_write", 0xffff_ffff_8100_0a40, 0x15c0, "[kernel]"),
    f("cpu_startup_entry", 0xffff_ffff_8180_0000, 0x40, "[kernel]"),
    f("do_idle", 0xffff_ffff_8180_0040, 0x100, "[kernel]"),
    f("default_idle_call", 0xffff_ffff_8180_0140, 0x40, "[kernel]"),
    f("default_idle", 0xffff_ffff_8180_0180, 0x20, "[kernel]"),
];

/// A call path: kernel functions then user functions, innermost first, by name.
#[derive(Clone, Copy, Debug)]
pub struct Path {
    /// Kernel functions, innermost first.
    pub kernel: &'static [&'static str],
    /// User functions, innermost first.
    pub user: &'static [&'static str],
}

/// The paths. Indices are used by [`SCHEDULE`] and the phase choice.
pub const PATHS: &[Path] = &[
    // 0..=3: user-mode samples.
    Path { kernel: &[], user: &["scan_table", "run_queries", "main"] },
    Path { kernel: &[], user: &["btree_lookup", "hash_join", "run_queries", "main"] },
    Path { kernel: &[], user: &["hash_join", "run_queries", "main"] },
    // Recursion: btree_lookup counts once per stack in inclusive counts.
    Path { kernel: &[], user: &["btree_lookup", "btree_lookup", "btree_lookup", "hash_join", "run_queries", "main"] },
    // 4..=5: kernel-mode samples of the program.
    Path {
        kernel: &["copy_user_generic", "vfs_read", "ksys_read", "__x64_sys_read", "do_syscall_64", "entry_SYSCALL_64"],
        user: &["__libc_read", "scan_table", "run_queries", "main"],
    },
    Path {
        kernel: &["clear_page_erms", "handle_mm_fault", "exc_page_fault", "asm_exc_page_fault"],
        user: &["__memmove_avx_unaligned_erms", "hash_join", "run_queries", "main"],
    },
    // 6: the idle task (pid 0): kernel only.
    Path { kernel: &["default_idle", "default_idle_call", "do_idle", "cpu_startup_entry"], user: &[] },
];

/// The steady workload's path order, repeated: per 13 samples, path 0 four times, path 1
/// three times, paths 2, 4 twice, paths 3, 5 once (no idle: steady CPUs are busy).
pub const SCHEDULE: [u8; 13] = [0, 1, 2, 0, 4, 1, 0, 3, 2, 1, 5, 0, 4];

/// Paths a `phases`-workload sample may take: user phases, the syscall phase, idle.
pub const USER_PATHS: [u8; 4] = [0, 1, 2, 3];
/// See [`USER_PATHS`].
pub const KERNEL_PATHS: [u8; 2] = [4, 5];
/// See [`USER_PATHS`].
pub const IDLE_PATHS: [u8; 1] = [6];

fn lookup(name: &str) -> Option<&'static Func> {
    USER_FUNCS.iter().chain(KERNEL_FUNCS).find(|f| f.name == name)
}

/// Address of a frame of `name`: the leaf at +0x10 (where the sample hit), callers in
/// their middle (the return address after their call).
fn frame(name: &str, leaf: bool) -> u64 {
    lookup(name).map_or(0, |f| f.start + if leaf { 0x10 } else { f.size / 2 })
}

/// The paths as addresses, built once per source.
#[derive(Clone, Debug)]
pub struct StackTable {
    kernel: Vec<Vec<u64>>,
    user: Vec<Vec<u64>>,
}

impl Default for StackTable {
    fn default() -> Self {
        Self::new()
    }
}

impl StackTable {
    /// Builds the address form of [`PATHS`].
    pub fn new() -> StackTable {
        let mut kernel = Vec::new();
        let mut user = Vec::new();
        for p in PATHS {
            kernel.push(p.kernel.iter().enumerate().map(|(i, n)| frame(n, i == 0)).collect());
            // The user stack's first frame is where user mode was left: the leaf of a
            // user-mode sample, a call site when the kernel was entered.
            user.push(p.user.iter().enumerate().map(|(i, n)| frame(n, i == 0 && p.kernel.is_empty())).collect());
        }
        StackTable { kernel, user }
    }

    /// The stacks of path `i`.
    pub fn stack(&self, i: usize) -> Option<SampleStack<'_>> {
        let kernel = self.kernel.get(i)?;
        let user = self.user.get(i)?;
        let comm = if PATHS.get(i).is_some_and(|p| p.user.is_empty()) { IDLE_COMM } else { SIM_COMM };
        Some(SampleStack { kernel, user, comm })
    }

    /// The sample's IP for path `i`: its innermost frame.
    pub fn ip(&self, i: usize) -> u64 {
        let k = self.kernel.get(i).and_then(|k| k.first());
        let u = self.user.get(i).and_then(|u| u.first());
        k.or(u).copied().unwrap_or(0)
    }

    /// Whether path `i` was sampled in kernel mode.
    pub fn is_kernel(&self, i: usize) -> bool {
        self.kernel.get(i).is_some_and(|k| !k.is_empty())
    }
}

/// The symbol text of the simulated machine.
pub fn symbols() -> Vec<SymbolText> {
    let mut kallsyms = String::new();
    for f in KERNEL_FUNCS {
        kallsyms.push_str(&format!("{:016x} T {}\n", f.start, f.name));
    }
    let mut table = String::new();
    for f in USER_FUNCS {
        table.push_str(&format!("{:x} {:x} {} [{}]\n", f.start, f.size, f.name, f.object));
    }
    vec![
        SymbolText { kind: SYM_KALLSYMS, pid: 0, text: kallsyms.into_bytes() },
        SymbolText { kind: SYM_TABLE, pid: 0, text: table.into_bytes() },
        SymbolText { kind: SYM_COMM, pid: SIM_PID, text: SIM_COMM.to_vec() },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_names_known_functions_and_stacks_match() {
        let t = StackTable::new();
        for (i, p) in PATHS.iter().enumerate() {
            for n in p.kernel.iter().chain(p.user) {
                assert!(lookup(n).is_some(), "{n}");
            }
            let s = t.stack(i).unwrap();
            assert_eq!(s.kernel.len(), p.kernel.len());
            assert_eq!(s.user.len(), p.user.len());
            assert!(s.kernel.iter().chain(s.user).all(|&a| a != 0));
            assert_eq!(t.ip(i), *s.kernel.first().or(s.user.first()).unwrap());
        }
        assert!(SCHEDULE.iter().all(|&p| (p as usize) < PATHS.len()));
        assert!(t.stack(PATHS.len()).is_none());
        // Every frame lies inside its own function.
        for (i, p) in PATHS.iter().enumerate() {
            let s = t.stack(i).unwrap();
            for (name, addr) in p.kernel.iter().zip(s.kernel).chain(p.user.iter().zip(s.user)) {
                let f = lookup(name).unwrap();
                assert!((f.start..f.start + f.size).contains(addr), "{name}: {addr:#x}");
            }
        }
    }

    #[test]
    fn functions_do_not_overlap() {
        let mut all: Vec<_> = USER_FUNCS.iter().chain(KERNEL_FUNCS).collect();
        all.sort_by_key(|f| f.start);
        for w in all.windows(2) {
            assert!(w[0].start + w[0].size <= w[1].start, "{} overlaps {}", w[0].name, w[1].name);
        }
    }
}
