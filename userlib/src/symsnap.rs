//! Snapshots of what symbolizing call stacks later needs, taken while recording real
//! sources (perf, kmod) and written into the capture as `CHUNK_SYMBOLS`:
//! `/proc/kallsyms` once, and `/proc/<pid>/maps` + `/proc/<pid>/comm` of every process
//! that shows up in samples — when it first shows up, and again (only if its mappings
//! changed) at most once per [`REFRESH`] while it keeps showing up, so libraries loaded
//! later are covered. A process that exits between its samples and the snapshot leaves
//! its user frames `[unknown]` in reports; nothing fails.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::time::{Duration, Instant};

use hrperf_abi::capture::{SYM_COMM, SYM_KALLSYMS, SYM_MAPS};

use crate::capture::{CaptureError, Writer};

/// How often the mappings of active processes are looked at again.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Whether kallsyms `text` shows every address as 0 (hidden by `kptr_restrict`): its
/// first lines are enough to tell.
pub(crate) fn kallsyms_hidden(text: &[u8]) -> bool {
    let mut lines = text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).take(64).peekable();
    lines.peek().is_some() && lines.all(|l| l.iter().take_while(|&&b| b != b' ').all(|&b| b == b'0'))
}

/// The snapshots taken so far; see the module docs.
#[derive(Debug)]
pub struct SymbolSnapshots {
    maps_hash: HashMap<u32, u64>,
    recent: HashSet<u32>,
    last_refresh: Instant,
    proc_root: String,
}

impl Default for SymbolSnapshots {
    fn default() -> Self {
        Self::new()
    }
}

fn hash(text: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl SymbolSnapshots {
    /// No snapshot taken yet; reads `/proc`.
    pub fn new() -> Self {
        Self::with_proc_root("/proc")
    }

    /// Reads another directory laid out like `/proc` (tests).
    pub fn with_proc_root(root: &str) -> Self {
        SymbolSnapshots {
            maps_hash: HashMap::new(),
            recent: HashSet::new(),
            last_refresh: Instant::now(),
            proc_root: root.to_string(),
        }
    }

    /// Writes the kernel's symbol table. Returns a note for the user when it cannot be
    /// read or its addresses are hidden (`kptr_restrict`), in which case kernel frames
    /// will show as `[unknown]`.
    pub fn write_kallsyms<W: Write>(&mut self, w: &mut Writer<W>) -> Result<Option<String>, CaptureError> {
        let path = format!("{}/kallsyms", self.proc_root);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) => return Ok(Some(format!("cannot read {path} ({e}): kernel frames will not be symbolized"))),
        };
        let hidden = kallsyms_hidden(&text);
        w.write_symbols(SYM_KALLSYMS, 0, &text)?;
        Ok(hidden.then(|| {
            format!("{path} shows no addresses (kernel.kptr_restrict; run as root): kernel frames will not be symbolized")
        }))
    }

    /// Notes that `pid` was sampled: snapshots it if it is new.
    pub fn note_pid<W: Write>(&mut self, pid: u32, w: &mut Writer<W>) -> Result<(), CaptureError> {
        if pid == 0 {
            return Ok(());
        }
        if self.maps_hash.contains_key(&pid) {
            self.recent.insert(pid);
            return Ok(());
        }
        self.snapshot(pid, w, true)
    }

    /// Looks again at the processes sampled since the last refresh, if [`REFRESH`] has
    /// passed; writes the mappings that changed.
    pub fn refresh<W: Write>(&mut self, w: &mut Writer<W>) -> Result<(), CaptureError> {
        if self.last_refresh.elapsed() < REFRESH {
            return Ok(());
        }
        self.last_refresh = Instant::now();
        let pids: Vec<u32> = self.recent.drain().collect();
        for pid in pids {
            self.snapshot(pid, w, false)?;
        }
        Ok(())
    }

    /// Processes snapshotted so far.
    pub fn pids(&self) -> usize {
        self.maps_hash.len()
    }

    fn snapshot<W: Write>(&mut self, pid: u32, w: &mut Writer<W>, first: bool) -> Result<(), CaptureError> {
        let maps = std::fs::read(format!("{}/{pid}/maps", self.proc_root));
        let Ok(maps) = maps else {
            // Gone already: remember it so it is not retried on every sample.
            self.maps_hash.entry(pid).or_insert(0);
            return Ok(());
        };
        let h = hash(&maps);
        if self.maps_hash.get(&pid) == Some(&h) {
            return Ok(());
        }
        self.maps_hash.insert(pid, h);
        w.write_symbols(SYM_MAPS, pid, &maps)?;
        if first {
            if let Ok(comm) = std::fs::read(format!("{}/{pid}/comm", self.proc_root)) {
                let comm = comm.strip_suffix(b"\n").unwrap_or(&comm);
                w.write_symbols(SYM_COMM, pid, comm)?;
            }
        }
        Ok(())
    }
}
