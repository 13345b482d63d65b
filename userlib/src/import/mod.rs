//! Importing call stacks from other tools into llc-stack captures, so `hrperf report`
//! works on them as on a recording.
//!
//! - [`perf_data`]: a `perf record -g` file (`perf.data`, read with the
//!   [`linux_perf_data`] crate): every sample becomes a stack record weighted by its
//!   period, `MMAP`/`MMAP2` records become `/proc/<pid>/maps`-style text per process, `COMM`s
//!   name the tasks, and the running machine's `/proc/kallsyms` resolves kernel frames.
//! - [`stap`]: the `!`-separated stack-count text that SystemTap scripts and perf
//!   post-processing scripts print (`vfs_read+0x5/0x90!ksys_read+0x71/0xf0 1234`): each
//!   line becomes one record weighted by its count, with synthetic addresses that a
//!   `SYM_TABLE` maps back to the function names.
//!
//! Records are written with [`hrperf_fmt_llc_stack::record::encode`] and carry
//! `STK_IMPORTED`. Both importers keep going as far as their input allows: damage in the
//! middle of the input ends the import with everything read so far written and
//! finished, and the damage described in [`ImportSummary::damage`] (the caller reports it
//! as an error).
//!
//! ```no_run
//! use hrperf::import::{import_perf_data, PerfDataOptions};
//!
//! let summary = import_perf_data(
//!     "perf.data".as_ref(),
//!     "hrperf.data".as_ref(),
//!     &PerfDataOptions::default(),
//!     &mut |_done, _total| {},
//! )?;
//! eprintln!("{} samples, {} with call stacks", summary.samples, summary.stacks);
//! # Ok::<(), hrperf::import::ImportError>(())
//! ```

pub mod perf_data;
pub mod stap;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use hrperf_abi::capture::EndInfo;
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::record::MISC_TRUNCATED;
use hrperf_fmt_llc_stack::record::{
    encode, StackFixed, MAX_FRAMES, STK_KERNEL_TRUNCATED, STK_USER_TRUNCATED,
};

use crate::capture::{CaptureError, CaptureMeta, Writer};

pub use perf_data::{import_perf_data, PerfDataOptions};
pub use stap::{import_stap, StapOptions};

/// Why an import could not start (or its output could not be written).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The input could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The input.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The input is not something this importer reads (bad header, compressed, empty).
    #[error("{path}: {problem}")]
    Input {
        /// The input.
        path: PathBuf,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// Writing the capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

/// What an import did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportSummary {
    /// Samples (perf) or stack lines (stap) read.
    pub samples: u64,
    /// Of those, the ones that had a call stack (perf: a callchain; stap: every line).
    pub stacks: u64,
    /// Stack records written.
    pub records: u64,
    /// Frames written over all records.
    pub frames: u64,
    /// Sum of the records' weights (periods or counts).
    pub weight: u64,
    /// Stacks cut because they had more frames than one record holds.
    pub truncated: u64,
    /// Samples the input itself says were lost (perf's `PERF_RECORD_LOST`).
    pub lost: u64,
    /// Input records (perf) or lines (stap) not imported, by kind.
    pub skipped: BTreeMap<String, u64>,
    /// `SYMBOLS` chunks written (kallsyms, maps, comms, tables).
    pub symbol_chunks: u64,
    /// Things the user should know (e.g. kernel addresses hidden in /proc/kallsyms).
    pub notes: Vec<String>,
    /// Damage that ended the import early, with where it is (file offset or line);
    /// everything before it was imported and the capture is complete.
    pub damage: Option<String>,
}

impl ImportSummary {
    fn skip(&mut self, kind: impl Into<String>) {
        *self.skipped.entry(kind.into()).or_default() += 1;
    }
}

/// Bytes of records buffered per CPU before a chunk is written.
const CHUNK_BYTES: usize = 1 << 20;

/// Streams stack records into a capture: one DATA chunk per CPU per [`CHUNK_BYTES`].
struct StackSink {
    writer: Writer<File>,
    /// Per CPU: buffered records, their count, and per-CPU totals for the stats.
    cpus: BTreeMap<u32, CpuBuf>,
    end_time_ns: u64,
}

#[derive(Default)]
struct CpuBuf {
    bytes: Vec<u8>,
    pending: u64,
    records: u64,
}

impl StackSink {
    fn create(path: &Path, meta: &CaptureMeta) -> Result<StackSink, ImportError> {
        Ok(StackSink {
            writer: Writer::create(path, meta)?,
            cpus: BTreeMap::new(),
            end_time_ns: 0,
        })
    }

    /// Writes one stack record; stacks deeper than a record holds are cut (user frames
    /// first) and flagged.
    fn push(
        &mut self,
        summary: &mut ImportSummary,
        mut fixed: StackFixed,
        kernel: &[u64],
        user: &[u64],
    ) -> Result<(), ImportError> {
        let nk = kernel.len().min(MAX_FRAMES);
        let nu = user.len().min(MAX_FRAMES - nk);
        if nk < kernel.len() {
            fixed.flags |= STK_KERNEL_TRUNCATED;
        }
        if nu < user.len() {
            fixed.flags |= STK_USER_TRUNCATED;
        }
        if nk < kernel.len() || nu < user.len() {
            fixed.misc |= MISC_TRUNCATED;
            summary.truncated += 1;
        }
        self.end_time_ns = self.end_time_ns.max(fixed.time_ns);
        let buf = self.cpus.entry(fixed.cpu).or_default();
        // Cannot fail: the frame counts were cut to what one record holds.
        encode(&mut buf.bytes, &fixed, &kernel[..nk], &user[..nu]);
        buf.pending += 1;
        buf.records += 1;
        summary.records += 1;
        summary.frames += (nk + nu) as u64;
        summary.weight = summary.weight.saturating_add(fixed.weight);
        if buf.bytes.len() >= CHUNK_BYTES {
            let cpu = fixed.cpu;
            self.flush_cpu(cpu)?;
        }
        Ok(())
    }

    fn flush_cpu(&mut self, cpu: u32) -> Result<(), ImportError> {
        if let Some(buf) = self.cpus.get_mut(&cpu) {
            self.writer.write_chunk(cpu, &buf.bytes, buf.pending)?;
            buf.bytes.clear();
            buf.pending = 0;
        }
        Ok(())
    }

    fn symbols(
        &mut self,
        summary: &mut ImportSummary,
        kind: u32,
        pid: u32,
        text: &[u8],
    ) -> Result<(), ImportError> {
        self.writer.write_symbols(kind, pid, text)?;
        summary.symbol_chunks += 1;
        Ok(())
    }

    /// Writes what is buffered, the per-CPU statistics and the END chunk.
    fn finish(mut self) -> Result<(), ImportError> {
        let cpus: Vec<u32> = self.cpus.keys().copied().collect();
        for cpu in cpus {
            self.flush_cpu(cpu)?;
        }
        let stats: Vec<CpuStats> = self
            .cpus
            .iter()
            .map(|(&cpu, b)| CpuStats {
                cpu,
                records: b.records,
                overflows: b.records,
                ..zerocopy::FromZeros::new_zeroed()
            })
            .collect();
        self.writer.write_stats(&stats)?;
        let total_records = self.writer.records_written();
        self.writer.finish(EndInfo {
            end_time_ns: self.end_time_ns,
            total_records,
            total_drops: 0,
            exit_status: 0,
            reserved: 0,
        })?;
        Ok(())
    }
}

/// The capture metadata every import starts from: the llc-stack format's name, UUID and
/// version, overflow mode.
fn llc_stack_meta() -> CaptureMeta {
    CaptureMeta {
        format_name: hrperf_fmt_llc_stack::LLC_STACK_NAME.into(),
        format_uuid: hrperf_fmt_llc_stack::LLC_STACK_UUID,
        format_version: hrperf_fmt_llc_stack::LLC_STACK_VERSION,
        mode: hrperf_abi::format::MODE_OVERFLOW,
        ..CaptureMeta::default()
    }
}

/// A task name as the record's NUL-padded `comm` field (cut to 15 bytes).
fn comm_field(name: &[u8]) -> [u8; hrperf_fmt_llc_stack::record::COMM_LEN] {
    let mut comm = [0u8; hrperf_fmt_llc_stack::record::COMM_LEN];
    let name = hrperf_abi::name_bytes(name);
    let n = name.len().min(comm.len() - 1);
    comm[..n].copy_from_slice(&name[..n]);
    comm
}

/// The lines of kallsyms `text` that resolve `addrs` exactly as the whole text does:
/// for each address, the text-symbol lines at the start of the symbol containing it and
/// at the start of the next text symbol (which ends it). Other lines are left out.
pub(crate) fn kallsyms_subset(text: &[u8], addrs: &[u64]) -> Vec<u8> {
    let text = String::from_utf8_lossy(text);
    let mut starts: Vec<u64> = Vec::new();
    let lines: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|line| crate::stacks::symbols::kallsyms_text_line(line).map(|(addr, ..)| (addr, line)))
        .collect();
    starts.extend(lines.iter().map(|l| l.0));
    starts.sort_unstable();
    starts.dedup();
    let mut keep = std::collections::HashSet::new();
    for &a in addrs {
        let i = starts.partition_point(|&s| s <= a);
        if i == 0 {
            continue;
        }
        keep.insert(starts[i - 1]);
        if let Some(&next) = starts.get(i) {
            keep.insert(next);
        }
    }
    let mut out = Vec::new();
    for (addr, line) in lines {
        if keep.contains(&addr) {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::kallsyms_subset;
    use crate::stacks::symbols::Kallsyms;

    #[test]
    fn a_kallsyms_subset_resolves_like_the_whole() {
        let text = b"ffffffff81000000 T _stext\nffffffff81000000 T _text\nffffffff81000100 t foo\n\
ffffffff81000200 D some_data\nffffffff81000300 T bar\nffffffff81000400 T baz\t[mod]\n\
ffffffff81000500 T qux\n0000000000000000 T hidden\nnot a line\n";
        let addrs = [0xffff_ffff_8100_0110, 0xffff_ffff_8100_0450, 0xffff_ffff_8000_0000, 0xffff_ffff_8100_0900];
        let subset = kallsyms_subset(text, &addrs);
        let (full, part) = (Kallsyms::parse(text), Kallsyms::parse(&subset));
        for a in addrs {
            assert_eq!(full.lookup(a), part.lookup(a), "{a:#x}");
        }
        let s = String::from_utf8(subset).unwrap();
        assert!(s.contains("foo") && s.contains("bar") && s.contains("baz") && s.contains("qux"), "{s}");
        assert!(!s.contains("_stext") && !s.contains("some_data"), "{s}");
    }
}
