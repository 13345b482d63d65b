//! The symbol data a capture carries in its `CHUNK_SYMBOLS` chunks, parsed: the kernel's
//! `/proc/kallsyms`, each process's `/proc/<pid>/maps` snapshots, comms, and synthetic
//! `SYM_TABLE`s (see [`hrperf_abi::capture::SYM_TABLE`]).
//!
//! Every parser skips lines it cannot read: symbol text comes from the machine that
//! recorded, so a damaged or unexpected line costs at most that line's symbols.

use std::collections::{BTreeMap, HashMap};

use hrperf_abi::capture::{SYM_COMM, SYM_KALLSYMS, SYM_MAPS, SYM_TABLE};

/// One symbol: a half-open address range `[start, start + size)` and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymEntry {
    /// First address.
    pub start: u64,
    /// Bytes covered (at least 1).
    pub size: u64,
    /// The symbol name as given (already demangled for tables; kallsyms names as is).
    pub name: Box<str>,
    /// Object (kernel module, library) it belongs to, if the text said.
    pub object: Option<Box<str>>,
}

/// A sorted symbol table with range lookup.
#[derive(Clone, Debug, Default)]
pub struct SymTable {
    entries: Vec<SymEntry>,
}

impl SymTable {
    /// Sorts `entries` by start (ties: the larger one first, so nested symbols resolve
    /// to the innermost one that starts last).
    pub fn new(mut entries: Vec<SymEntry>) -> Self {
        entries.sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
        SymTable { entries }
    }

    /// Parses `SYM_TABLE` text: lines `start size name [object]`, hex start and size
    /// (with or without `0x`). Malformed lines and zero sizes are skipped.
    pub fn parse(text: &[u8]) -> Self {
        let text = String::from_utf8_lossy(text);
        let mut entries = Vec::new();
        for line in text.lines() {
            let mut it = line.trim().splitn(3, char::is_whitespace);
            let (Some(start), Some(size), Some(rest)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            if size == 0 || start.checked_add(size).is_none() {
                continue;
            }
            // Names may hold spaces (demangled C++); a trailing `[object]` is the object.
            let rest = rest.trim();
            let (name, object) = match rest.rsplit_once(" [") {
                Some((n, o)) if o.ends_with(']') => (n.trim_end(), Some(&o[..o.len() - 1])),
                _ => (rest, None),
            };
            if name.is_empty() {
                continue;
            }
            let object = object.filter(|o| !o.is_empty());
            entries.push(SymEntry {
                start,
                size,
                name: name.into(),
                object: object.map(Into::into),
            });
        }
        SymTable::new(entries)
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no symbols.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The symbol containing `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&SymEntry> {
        let i = self.entries.partition_point(|e| e.start <= addr);
        // Nested or overlapping symbols: look back a few entries for one that still covers it.
        self.entries[..i].iter().rev().take(4).find(|e| addr - e.start < e.size)
    }
}

/// How much perf prefers a symbol among aliases at one address (`choose_best_symbol`):
/// non-zero size, not weak, global, fewer leading underscores, longer name. Larger wins.
pub(crate) fn alias_rank(
    size: u64,
    weak: bool,
    global: bool,
    name: &str,
) -> (bool, bool, bool, std::cmp::Reverse<usize>, usize) {
    let underscores = name.bytes().take_while(|&b| b == b'_').count();
    (size != 0, !weak, global, std::cmp::Reverse(underscores), name.len())
}

/// Parses a hex number with or without a `0x` prefix.
pub(crate) fn hex(s: &str) -> Option<u64> {
    let s = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u64::from_str_radix(s, 16).ok()
}

/// One `/proc/kallsyms` line if it is a text symbol perf keeps (types t/T/w/W, a
/// non-zero address): `(address, name, module, type)`.
pub(crate) fn kallsyms_text_line(line: &str) -> Option<(u64, &str, Option<&str>, &str)> {
    let mut it = line.split_whitespace();
    let (addr, kind, name) = (hex(it.next()?)?, it.next()?, it.next()?);
    if addr == 0 || !matches!(kind, "t" | "T" | "w" | "W") {
        return None;
    }
    let module = it.next().map(|m| m.trim_start_matches('[').trim_end_matches(']')).filter(|m| !m.is_empty());
    Some((addr, name, module, kind))
}

/// The kernel's symbols from `/proc/kallsyms` text: text symbols only (types t/T/w/W,
/// as perf keeps), each running to the next one's start (kallsyms has no sizes).
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    table: SymTable,
}

/// The span given to the last kernel symbol, which has no successor to end at.
const LAST_SYMBOL_SPAN: u64 = 0x1000;

impl Kallsyms {
    /// Parses kallsyms text (`addr type name [module]`). All-zero addresses (hidden by
    /// `kptr_restrict`) give an empty table.
    pub fn parse(text: &[u8]) -> Self {
        let text = String::from_utf8_lossy(text);
        let mut raw: Vec<(u64, &str, Option<&str>, &str)> = text.lines().filter_map(kallsyms_text_line).collect();
        // Aliases at one address: keep the one perf picks.
        let rank = |r: &(u64, &str, Option<&str>, &str)| {
            alias_rank(1, matches!(r.3, "w" | "W"), matches!(r.3, "T" | "W"), r.1)
        };
        raw.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| rank(b).cmp(&rank(a))));
        raw.dedup_by_key(|r| r.0);
        let mut entries = Vec::with_capacity(raw.len());
        for (i, &(start, name, module, _)) in raw.iter().enumerate() {
            let end = raw.get(i + 1).map_or(start.saturating_add(LAST_SYMBOL_SPAN), |n| n.0);
            entries.push(SymEntry {
                start,
                size: (end - start).max(1),
                name: name.into(),
                object: module.map(Into::into),
            });
        }
        Kallsyms {
            table: SymTable { entries },
        }
    }

    /// The symbol containing `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&SymEntry> {
        self.table.lookup(addr)
    }

    /// Number of text symbols.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no symbol was read.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// One mapping of a process's address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// Whether the mapping is executable.
    pub exec: bool,
    /// The path or pseudo-name (`[vdso]`, `[heap]`); empty for anonymous memory.
    pub path: Box<str>,
}

/// A process's address space merged from its maps snapshots: a later snapshot's
/// mappings replace whatever earlier ones had in their ranges.
#[derive(Clone, Debug, Default)]
pub struct AddressSpace {
    // Non-overlapping, keyed by start.
    maps: BTreeMap<u64, Mapping>,
}

impl AddressSpace {
    /// Adds one `/proc/<pid>/maps` snapshot (lines `start-end perms offset dev inode
    /// [path]`); later calls win where ranges overlap.
    pub fn add_snapshot(&mut self, text: &[u8]) {
        let text = String::from_utf8_lossy(text);
        for line in text.lines() {
            if let Some(m) = parse_maps_line(line) {
                self.insert(m);
            }
        }
    }

    fn insert(&mut self, m: Mapping) {
        let overlapping: Vec<u64> = self
            .maps
            .range(..m.end)
            .rev()
            .take_while(|(_, o)| o.end > m.start)
            .map(|(&s, _)| s)
            .collect();
        for s in overlapping {
            let Some(old) = self.maps.remove(&s) else { continue };
            if old.start < m.start {
                self.maps.insert(
                    old.start,
                    Mapping {
                        end: m.start,
                        ..old.clone()
                    },
                );
            }
            if old.end > m.end {
                let offset = old.offset.wrapping_add(m.end - old.start);
                self.maps.insert(
                    m.end,
                    Mapping {
                        start: m.end,
                        offset,
                        ..old
                    },
                );
            }
        }
        self.maps.insert(m.start, m);
    }

    /// The mapping containing `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&Mapping> {
        self.maps
            .range(..=addr)
            .next_back()
            .map(|(_, m)| m)
            .filter(|m| addr < m.end)
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// Whether no mapping is known.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let (range, perms, offset) = (it.next()?, it.next()?, it.next()?);
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path = it.next().unwrap_or("").trim();
    let (start, end) = range.split_once('-')?;
    let (start, end, offset) = (hex(start)?, hex(end)?, hex(offset)?);
    if end <= start {
        return None;
    }
    Some(Mapping {
        start,
        end,
        offset,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        path: path.into(),
    })
}

/// All the symbol data of a capture.
#[derive(Clone, Debug, Default)]
pub struct SymbolData {
    /// The kernel's symbols (the last `SYM_KALLSYMS` chunk).
    pub kallsyms: Kallsyms,
    /// Address spaces by pid.
    pub spaces: HashMap<u32, AddressSpace>,
    /// Command names by pid.
    pub comms: HashMap<u32, Box<str>>,
    /// `SYM_TABLE`s by pid (0: every process and the kernel).
    pub tables: HashMap<u32, SymTable>,
    /// Chunks of kinds this reader does not know (skipped).
    pub unknown_chunks: u64,
}

impl SymbolData {
    /// Takes one SYMBOLS chunk's `(kind, pid, text)`.
    pub fn add(&mut self, kind: u32, pid: u32, text: &[u8]) {
        match kind {
            SYM_KALLSYMS => {
                let k = Kallsyms::parse(text);
                // A later chunk whose addresses were hidden must not erase a readable one.
                if !k.is_empty() || self.kallsyms.is_empty() {
                    self.kallsyms = k;
                }
            }
            SYM_MAPS => self.spaces.entry(pid).or_default().add_snapshot(text),
            SYM_COMM => {
                let c = String::from_utf8_lossy(text);
                let c = c.trim_end_matches(['\n', '\0']);
                if !c.is_empty() {
                    self.comms.insert(pid, c.into());
                }
            }
            SYM_TABLE => {
                let new = SymTable::parse(text);
                let t = self.tables.entry(pid).or_default();
                let mut entries = std::mem::take(&mut t.entries);
                entries.extend(new.entries);
                *t = SymTable::new(entries);
            }
            _ => self.unknown_chunks += 1,
        }
    }

    /// The `SYM_TABLE` entry covering `addr` in `pid`'s table, else the global one.
    pub fn table_lookup(&self, pid: u32, addr: u64) -> Option<&SymEntry> {
        let own = if pid != 0 {
            self.tables.get(&pid).and_then(|t| t.lookup(addr))
        } else {
            None
        };
        own.or_else(|| self.tables.get(&0).and_then(|t| t.lookup(addr)))
    }
}
