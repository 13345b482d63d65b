//! Function symbols of ELF files on disk (executables, PIEs, shared objects), read with
//! the `object` crate, and an LRU cache of parsed files.
//!
//! An address of process P in a mapping `start-end offset path` is a file offset
//! `addr - start + offset`; the `PT_LOAD` segment holding that offset turns it into the
//! link-time virtual address the symbol table is in.

use std::borrow::Cow;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lru::LruCache;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

/// Demangles a Rust (legacy or v0) or C++ symbol name; other names come back unchanged.
/// C++ names lose their parameter lists, as in `perf report` (which demangles without
/// `DMGL_PARAMS`), and Rust names their hash suffix.
pub fn demangle(name: &str) -> Cow<'_, str> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return Cow::Owned(format!("{d:#}"));
    }
    if name.starts_with("_Z") {
        let opts = cpp_demangle::DemangleOptions::new().no_params();
        // cpp_demangle is fuzzed, but the names come from arbitrary files: stay up if it panics.
        let d = std::panic::catch_unwind(|| {
            cpp_demangle::Symbol::new(name.as_bytes())
                .ok()
                .and_then(|s| s.demangle(&opts).ok())
        });
        if let Ok(Some(d)) = d {
            return Cow::Owned(d);
        }
    }
    Cow::Borrowed(name)
}

#[derive(Clone, Copy, Debug)]
struct Sym {
    start: u64,
    size: u64,
    name_off: u32,
    name_len: u32,
    weak: bool,
    global: bool,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    offset: u64,
    filesz: u64,
    vaddr: u64,
}

/// The function symbols and load segments of one ELF file.
#[derive(Debug)]
pub struct ElfSymbols {
    syms: Vec<Sym>,
    // All (mangled) names back to back; `Sym` points into it (fewer allocations).
    names: String,
    segments: Vec<Segment>,
    /// Whether the symbols came from `.dynsym` (no `.symtab` in the file or its
    /// separate debug file).
    pub dynamic_only: bool,
    build_id: Option<Vec<u8>>,
}

/// A symbol found in an ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfHit<'a> {
    /// The name as stored (mangled).
    pub name: &'a str,
    /// Offset of the address from the symbol's start.
    pub offset: u64,
    /// The symbol's size.
    pub size: u64,
}

impl ElfSymbols {
    /// Reads the function symbols of the ELF file at `path`: `.symtab`, else `.dynsym`.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: the map is read-only and dropped before this returns; a file changed
        // under it can give wrong symbols (as for any reader), and `object` checks every
        // offset it follows.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("{}: mmap: {e}", path.display()))?;
        let mut syms = Self::parse(&map).map_err(|e| format!("{}: {e}", path.display()))?;
        drop(map);
        if syms.dynamic_only {
            // A stripped file: its .symtab may be in a separate debug file, as perf finds it.
            if let Some(debug) = syms.build_id.as_deref().and_then(debug_file) {
                if let Ok(d) = Self::open_plain(&debug) {
                    if !d.dynamic_only {
                        (syms.syms, syms.names, syms.dynamic_only) = (d.syms, d.names, false);
                    }
                }
            }
        }
        Ok(syms)
    }

    fn open_plain(path: &Path) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        // SAFETY: as in `open`.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
        Self::parse(&map)
    }

    /// Reads the function symbols of an ELF image in memory.
    pub fn parse(data: &[u8]) -> Result<Self, String> {
        let file = object::File::parse(data).map_err(|e| e.to_string())?;
        let mut out = ElfSymbols {
            syms: Vec::new(),
            names: String::new(),
            segments: Vec::new(),
            dynamic_only: false,
            build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        };
        for seg in file.segments() {
            let (offset, filesz) = seg.file_range();
            out.segments.push(Segment {
                offset,
                filesz,
                vaddr: seg.address(),
            });
        }
        out.add_symbols(file.symbols());
        if out.syms.is_empty() {
            out.dynamic_only = true;
            out.add_symbols(file.dynamic_symbols());
        }
        let names = std::mem::take(&mut out.names);
        let name = |s: &Sym| {
            names
                .get(s.name_off as usize..s.name_off as usize + s.name_len as usize)
                .unwrap_or("")
        };
        // Aliases at one address (`memcpy`, `__memcpy_avx`): keep the one perf picks.
        out.syms.sort_by(|a, b| {
            a.start.cmp(&b.start).then_with(|| {
                super::symbols::alias_rank(b.size, b.weak, b.global, name(b)).cmp(&super::symbols::alias_rank(
                    a.size,
                    a.weak,
                    a.global,
                    name(a),
                ))
            })
        });
        out.syms.dedup_by_key(|s| s.start);
        out.names = names;
        // Zero-sized symbols (hand-written assembly) run to the next symbol, as in perf.
        for i in 0..out.syms.len() {
            if out.syms[i].size == 0 {
                let next = out
                    .syms
                    .get(i + 1)
                    .map_or(out.syms[i].start.saturating_add(1), |n| n.start);
                out.syms[i].size = next.saturating_sub(out.syms[i].start).max(1);
            }
        }
        Ok(out)
    }

    fn add_symbols<'d, S: ObjectSymbol<'d>>(&mut self, syms: impl Iterator<Item = S>) {
        for s in syms {
            if s.kind() != SymbolKind::Text || !s.is_definition() || s.address() == 0 {
                continue;
            }
            let Ok(name) = s.name() else { continue };
            if name.is_empty() {
                continue;
            }
            let (Ok(name_off), Ok(name_len)) = (u32::try_from(self.names.len()), u32::try_from(name.len())) else {
                continue;
            };
            self.names.push_str(name);
            self.syms.push(Sym {
                start: s.address(),
                size: s.size(),
                name_off,
                name_len,
                weak: s.is_weak(),
                global: s.is_global(),
            });
        }
    }

    /// Number of function symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// Whether the file has no function symbols.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    /// The link-time virtual address of file offset `offset` (through the `PT_LOAD`
    /// segment holding it).
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.offset && offset - s.offset < s.filesz.max(1))
            .map(|s| s.vaddr.wrapping_add(offset - s.offset))
    }

    /// The symbol containing virtual address `vaddr`.
    pub fn lookup_vaddr(&self, vaddr: u64) -> Option<ElfHit<'_>> {
        let i = self.syms.partition_point(|s| s.start <= vaddr);
        let s = self.syms[..i].iter().rev().take(4).find(|s| vaddr - s.start < s.size)?;
        let name = self
            .names
            .get(s.name_off as usize..s.name_off as usize + s.name_len as usize)?;
        Some(ElfHit {
            name,
            offset: vaddr - s.start,
            size: s.size,
        })
    }

    /// The symbol containing file offset `offset`.
    pub fn lookup_offset(&self, offset: u64) -> Option<ElfHit<'_>> {
        self.lookup_vaddr(self.vaddr_of_offset(offset)?)
    }
}

/// The separate debug file of a build id, if installed
/// (`/usr/lib/debug/.build-id/ab/cdef....debug`).
fn debug_file(build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    let p = PathBuf::from(format!("/usr/lib/debug/.build-id/{first:02x}/{hex}.debug"));
    p.is_file().then_some(p)
}

/// Parsed ELF files by path, least recently used dropped first. A file that cannot be
/// read is remembered as such, so it is not retried for every frame.
#[derive(Debug)]
pub struct ElfCache {
    cache: LruCache<PathBuf, Option<Arc<ElfSymbols>>>,
    /// Files parsed (misses), for tests and statistics.
    pub loads: u64,
}

/// Parsed files kept by default.
pub const DEFAULT_ELF_CACHE: usize = 64;

impl ElfCache {
    /// A cache of at most `capacity` files (at least 1).
    pub fn new(capacity: usize) -> Self {
        ElfCache {
            cache: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            loads: 0,
        }
    }

    /// The symbols of `path`, parsed on first use; `None` if it is not a readable ELF file.
    pub fn get(&mut self, path: &Path) -> Option<Arc<ElfSymbols>> {
        if let Some(e) = self.cache.get(path) {
            return e.clone();
        }
        self.loads += 1;
        let e = ElfSymbols::open(path).ok().map(Arc::new);
        self.cache.put(path.to_path_buf(), e.clone());
        e
    }
}

impl Default for ElfCache {
    fn default() -> Self {
        Self::new(DEFAULT_ELF_CACHE)
    }
}
