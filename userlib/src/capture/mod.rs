//! The capture file (`hrperf.data`): a streaming [`Writer`] and a checked, zero-copy
//! [`Reader`].
//!
//! The layout is defined once, in [`hrperf_abi::capture`]:
//!
//! ```text
//! FileHeader (header_size bytes)
//! metadata: Section{kind,size} + payload (padded to 8), ... (metadata_size bytes in all)
//! chunks:   ChunkHeader + payload, ... until EOF; a finished recording ends STATS, END
//! ```
//!
//! Writing, as the recorder does it:
//!
//! ```no_run
//! # fn main() -> Result<(), hrperf::capture::CaptureError> {
//! use hrperf::capture::{CaptureMeta, Reader, Writer};
//! use hrperf_abi::capture::EndInfo;
//!
//! let meta = CaptureMeta { format_name: "delta".into(), ..CaptureMeta::default() };
//! let mut w = Writer::create("hrperf.data".as_ref(), &meta)?;
//! let records: Vec<u8> = Vec::new(); // whole records copied out of CPU 0's ring
//! w.write_chunk(0, &records, 0)?;
//! w.write_stats(&[])?;
//! w.finish(EndInfo { end_time_ns: 0, total_records: 0, total_drops: 0, exit_status: 0, reserved: 0 })?;
//!
//! let r = Reader::open("hrperf.data")?;
//! let mut chunks = r.chunks();
//! for chunk in &mut chunks {
//!     for rec in chunk?.records() {
//!         let rec = rec?;
//!         println!("type {:#x}, {} bytes at offset {}", rec.header.kind.0, rec.bytes.len(), rec.offset);
//!     }
//! }
//! for w in chunks.warnings() {
//!     eprintln!("warning: {w}");
//! }
//! # Ok(()) }
//! ```
//!
//! Everything in the file is checked before use: a damaged chunk is reported with its file
//! offset and what was wrong, after which iteration stops; every intact chunk before it
//! still decodes. The metadata is not covered by a checksum in file version 1, so damage
//! there is caught only where it breaks a structural check (magic, sizes, counts, UTF-8).

mod error;
mod reader;
mod records;
mod scan;
mod writer;

use hrperf_abi::format::Uuid;

use crate::source::EventSpec;

pub use error::{
    CaptureError, ChunkProblem, HeaderProblem, RecordProblem, SectionProblem, Warning,
};
pub use reader::{Chunk, Chunks, Reader};
pub use records::{Record, Records};
pub use scan::{CpuSummary, Scan};
pub use writer::{chunk_crc, header_crc, Writer};

/// Everything the capture file says about a recording besides its chunks.
///
/// The writer takes it as given: it inserts no time or host information of its own, so
/// identical inputs give byte-identical files (the sim source relies on this).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureMeta {
    /// Name of the format that wrote the records (shorter than 32 bytes).
    pub format_name: String,
    /// UUID of that format.
    pub format_uuid: Uuid,
    /// Its version, `major << 16 | minor`.
    pub format_version: u32,
    /// `hrperf_abi::capture::SOURCE_*`.
    pub source: u32,
    /// `hrperf_abi::capture::CLOCK_*` of every timestamp in the file.
    pub clock: u32,
    /// TSC frequency in Hz if known, else 0.
    pub tsc_hz: u64,
    /// `hrperf_abi::format::MODE_*`.
    pub mode: u32,
    /// Sampling period (overflow mode), else 0.
    pub sample_period: u64,
    /// Poll interval in ns (poll mode), else 0.
    pub poll_interval_ns: u64,
    /// Clock value when recording started.
    pub start_time_ns: u64,
    /// `CLOCK_REALTIME` ns when recording started (0 for reproducible sim captures).
    pub start_wall_ns: u64,
    /// The counters, leader first.
    pub events: Vec<EventSpec>,
    /// The recorded CPUs.
    pub cpus: Vec<u32>,
    /// CPU model string.
    pub cpu_model: String,
    /// The recorded command and its arguments (none may contain a NUL byte).
    pub command: Vec<String>,
    /// Host name.
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel_release: String,
    /// The format argument bytes given to the session.
    pub format_arg: Vec<u8>,
    /// The simulator's seed and model parameters, `key=value` lines (sim source only).
    pub sim_config: String,
}

impl CaptureMeta {
    /// The event names, in counter order (how counter values are labelled).
    pub fn event_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.events.iter().map(|e| e.name.as_str())
    }
}
