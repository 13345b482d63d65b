//! Call-stack profiles of `llc-stack` captures: symbolization, aggregation, and the
//! views `hrperf report` prints (top functions by inclusive or self weight, callers and
//! callees of one function, folded stacks, flame graphs).
//!
//! ```no_run
//! # fn main() -> Result<(), hrperf::stacks::StackError> {
//! use hrperf::capture::Reader;
//! use hrperf::stacks::{Profile, ProfileOptions, SortBy};
//!
//! let reader = Reader::open("stacks.data")?;
//! let profile = Profile::from_reader(&reader, &ProfileOptions::default())?;
//! for f in profile.functions(SortBy::Inclusive).iter().take(10) {
//!     println!("{:6.2}% {:6.2}% {}", profile.pct(f.inclusive), profile.pct(f.self_weight), f.name);
//! }
//! profile.folded(&mut std::io::stdout().lock(), false)?;
//! # Ok(()) }
//! ```
//!
//! Symbols come from the capture's `CHUNK_SYMBOLS` ([`symbols`]): kernel frames through
//! the captured kallsyms, user frames through the process's captured maps and the mapped
//! ELF file on disk ([`elf`]), `SYM_TABLE` entries first wherever they cover an address.
//! A frame nothing resolves is `[unknown] 0x<addr>` (or `[unknown] <object>+0x<offset>`
//! when its mapping is known); symbolization never fails a report.
//!
//! Functions are identified by name, like `perf report --sort symbol`: kernel functions
//! by their kallsyms name, user functions by their (demangled) ELF symbol name.

pub mod elf;
mod output;
mod profile;
pub mod symbols;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use profile::{
    Edge, FrameFilter, FunctionStats, Profile, ProfileBuilder, ProfileOptions, ProfileStats, SortBy, WeightBy,
    NO_KERNEL_FRAMES, NO_USER_FRAMES,
};

use crate::capture::CaptureError;
use elf::{demangle, ElfCache};
use symbols::{Mapping, SymbolData};

/// Why a stack profile cannot be made or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StackError {
    /// Reading the capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The capture holds another format's records.
    #[error("{path} holds '{format}' records; the stack report needs a capture recorded with --format llc-stack")]
    NotLlcStack {
        /// The capture.
        path: String,
        /// Its format.
        format: String,
    },
    /// Writing output failed.
    #[error("writing {what}: {source}")]
    Io {
        /// What was written (a path, or `output`).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A flame graph of no stacks was asked for.
    #[error("no stacks with a non-zero weight to draw in {}", path.display())]
    Empty {
        /// The flame graph's path.
        path: PathBuf,
    },
}

/// Object name of the kernel image, as perf names it.
pub const KERNEL_OBJECT: &str = "[kernel.kallsyms]";
/// Object name when nothing is known about an address.
pub const UNKNOWN_OBJECT: &str = "[unknown]";

/// What a frame address resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Function name (demangled), or `[unknown] ...` when unresolved.
    pub name: Arc<str>,
    /// Object: `[kernel.kallsyms]`, `[module]`, a file's base name, or `[unknown]`.
    pub object: Arc<str>,
    /// Offset from the symbol's start and the symbol's size, when resolved.
    pub offset_size: Option<(u64, u64)>,
    /// Whether the frame is a kernel frame.
    pub kernel: bool,
}

impl Symbol {
    /// Whether a symbol was found.
    pub fn resolved(&self) -> bool {
        self.offset_size.is_some()
    }

    /// The frame as a raw-frame display shows it: `sym+0xoff/0xsize [object]`
    /// (the `name [object]` when unresolved).
    pub fn raw(&self) -> String {
        match self.offset_size {
            Some((off, size)) => format!(
                "{}+{off:#x}/{size:#x} [{}]",
                self.name,
                self.object.trim_matches(['[', ']'])
            ),
            None => format!("{} [{}]", self.name, self.object.trim_matches(['[', ']'])),
        }
    }
}

/// Resolves frame addresses against a capture's symbol data, caching every result per
/// `(kernel?, pid, address)` and parsed ELF files in an LRU.
#[derive(Debug)]
pub struct Symbolizer {
    data: SymbolData,
    elf: ElfCache,
    cache: HashMap<(bool, u32, u64), Symbol>,
    objects: HashMap<Box<str>, Arc<str>>,
    root: Option<PathBuf>,
}

impl Symbolizer {
    /// A symbolizer over `data`, keeping at most `elf_cache` parsed ELF files.
    pub fn new(data: SymbolData, elf_cache: usize) -> Self {
        Symbolizer {
            data,
            elf: ElfCache::new(elf_cache),
            cache: HashMap::new(),
            objects: HashMap::new(),
            root: None,
        }
    }

    /// Looks mapped files up under `root` instead of `/` (a copy of the recording
    /// machine's files, a container's root).
    pub fn with_root(mut self, root: Option<PathBuf>) -> Self {
        self.root = root;
        self
    }

    /// The symbol data.
    pub fn data(&self) -> &SymbolData {
        &self.data
    }

    /// ELF files parsed so far (cache misses).
    pub fn elf_loads(&self) -> u64 {
        self.elf.loads
    }

    fn object(&mut self, name: &str) -> Arc<str> {
        if let Some(o) = self.objects.get(name) {
            return o.clone();
        }
        let o: Arc<str> = name.into();
        self.objects.insert(name.into(), o.clone());
        o
    }

    /// Resolves `addr`, a kernel frame if `kernel`, else a user frame of process `pid`.
    pub fn symbolize(&mut self, kernel: bool, pid: u32, addr: u64) -> Symbol {
        // Kernel addresses are the same in every process unless a process has its own table.
        let key_pid = if kernel && !self.data.tables.contains_key(&pid) {
            0
        } else {
            pid
        };
        if let Some(s) = self.cache.get(&(kernel, key_pid, addr)) {
            return s.clone();
        }
        let s = self.resolve(kernel, pid, addr);
        self.cache.insert((kernel, key_pid, addr), s.clone());
        s
    }

    fn resolve(&mut self, kernel: bool, pid: u32, addr: u64) -> Symbol {
        let mapping = if kernel {
            None
        } else {
            self.data.spaces.get(&pid).and_then(|s| s.lookup(addr)).cloned()
        };
        if let Some(e) = self.data.table_lookup(pid, addr) {
            let (name, off, size) = (e.name.clone(), addr - e.start, e.size);
            let object = match (&e.object, &mapping) {
                (Some(o), _) => o.to_string(),
                (None, Some(m)) if !m.path.is_empty() => basename(&m.path).to_string(),
                (None, _) if kernel => KERNEL_OBJECT.to_string(),
                (None, _) => UNKNOWN_OBJECT.to_string(),
            };
            return Symbol {
                name: (*name).into(),
                object: self.object(&object),
                offset_size: Some((off, size)),
                kernel,
            };
        }
        if kernel {
            if let Some(e) = self.data.kallsyms.lookup(addr) {
                let object = e
                    .object
                    .as_ref()
                    .map_or_else(|| KERNEL_OBJECT.to_string(), |m| format!("[{m}]"));
                let (name, off, size) = (e.name.clone(), addr - e.start, e.size);
                return Symbol {
                    name: (*name).into(),
                    object: self.object(&object),
                    offset_size: Some((off, size)),
                    kernel,
                };
            }
            return Symbol {
                name: format!("[unknown] {addr:#x}").into(),
                object: self.object(KERNEL_OBJECT),
                offset_size: None,
                kernel,
            };
        }
        let Some(m) = mapping else {
            return Symbol {
                name: format!("[unknown] {addr:#x}").into(),
                object: self.object(UNKNOWN_OBJECT),
                offset_size: None,
                kernel,
            };
        };
        self.resolve_elf(&m, addr)
    }

    fn resolve_elf(&mut self, m: &Mapping, addr: u64) -> Symbol {
        let file_off = (addr - m.start).wrapping_add(m.offset);
        let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
        let base = if path.is_empty() { "[anon]" } else { basename(path) };
        let object = self.object(base);
        if path.starts_with('/') {
            let full = match &self.root {
                Some(r) => r.join(path.trim_start_matches('/')),
                None => PathBuf::from(path),
            };
            if let Some(elf) = self.elf.get(&full) {
                if let Some(hit) = elf.lookup_offset(file_off) {
                    return Symbol {
                        name: demangle(hit.name).into(),
                        object,
                        offset_size: Some((hit.offset, hit.size)),
                        kernel: false,
                    };
                }
            }
        }
        Symbol {
            name: format!("[unknown] {base}+{file_off:#x}").into(),
            object,
            offset_size: None,
            kernel: false,
        }
    }
}

/// The last component of a path (the whole string if it has none).
fn basename(path: &str) -> &str {
    Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or(path)
}
