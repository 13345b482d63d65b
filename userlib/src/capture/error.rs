//! Capture-file errors and warnings: each names the file, the byte offset and the problem.

use std::fmt;
use std::io;
use std::path::PathBuf;

use hrperf_abi::capture::{BYTE_ORDER_MARK, FILE_MAGIC};

/// Why a capture file cannot be written or read (further).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Reading, writing or mapping the file failed.
    #[error("{}: {op} failed: {source}", path.display())]
    Io {
        /// The file (`<output>` for a writer over a plain stream).
        path: PathBuf,
        /// What was being done, e.g. `open`, `write chunk`.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The file does not start with [`FILE_MAGIC`].
    #[error("{}: not an hrperf capture file: bytes at offset 0 are {}, expected \"HRPERFDT\"", path.display(), Magic(found))]
    NotACapture {
        /// The file.
        path: PathBuf,
        /// The first 8 bytes (fewer are zero-filled).
        found: [u8; 8],
    },
    /// The byte-order mark reads swapped: the file comes from a host of the other byte
    /// order.
    #[error("{}: written on a host of the other byte order (byte-order mark at offset 8 reads {found:#010x}, expected {:#010x}); decode it on a host with the writer's byte order", path.display(), BYTE_ORDER_MARK)]
    OtherByteOrder {
        /// The file.
        path: PathBuf,
        /// The mark as read on this host.
        found: u32,
    },
    /// The file's version is not one this reader understands.
    #[error("{}: capture file version {found} (at offset 16) is not supported; this hrperf reads version {supported}{}", path.display(), if *found > *supported { ", so the file was written by a newer hrperf" } else { "" })]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this reader reads.
        supported: u32,
    },
    /// The fixed file header is inconsistent.
    #[error("{}: bad file header at offset {offset}: {problem}", path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// Offset of the offending field.
        offset: u64,
        /// What is wrong.
        problem: HeaderProblem,
    },
    /// A metadata section is inconsistent.
    #[error("{}: bad metadata section at offset {offset}: {problem}", path.display())]
    BadSection {
        /// The file.
        path: PathBuf,
        /// Offset of the section's header.
        offset: u64,
        /// What is wrong.
        problem: SectionProblem,
    },
    /// A chunk is truncated or damaged; chunks before it are intact.
    #[error("{}: bad chunk at offset {offset}: {problem}", path.display())]
    BadChunk {
        /// The file.
        path: PathBuf,
        /// Offset of the chunk's header.
        offset: u64,
        /// What is wrong.
        problem: ChunkProblem,
    },
    /// A record inside an intact chunk does not frame correctly.
    #[error("{}: bad record at offset {offset} (in the chunk at offset {chunk}): {problem}", path.display())]
    BadRecord {
        /// The file.
        path: PathBuf,
        /// Offset of the record's header.
        offset: u64,
        /// Offset of the chunk holding it.
        chunk: u64,
        /// What is wrong.
        problem: RecordProblem,
    },
    /// The writer was given something the file cannot represent.
    #[error("cannot write capture: {problem}")]
    InvalidInput {
        /// What is wrong.
        problem: String,
    },
}

impl CaptureError {
    /// The file offset the error is about, if it is about one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            CaptureError::NotACapture { .. } => Some(0),
            CaptureError::OtherByteOrder { .. } => Some(8),
            CaptureError::UnsupportedVersion { .. } => Some(16),
            CaptureError::BadHeader { offset, .. }
            | CaptureError::BadSection { offset, .. }
            | CaptureError::BadChunk { offset, .. }
            | CaptureError::BadRecord { offset, .. } => Some(*offset),
            CaptureError::Io { .. } | CaptureError::InvalidInput { .. } => None,
        }
    }
}

struct Magic<'a>(&'a [u8; 8]);

impl fmt::Display for Magic<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for &b in self.0 {
            if b.is_ascii_graphic() || b == b' ' {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        f.write_str("\"")
    }
}

const _: () = assert!(FILE_MAGIC.len() == 8);

/// What is wrong with a file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderProblem {
    /// The file ends inside the header.
    #[error("the file ends inside the header ({have} bytes, the header needs {need})")]
    Truncated {
        /// Bytes needed.
        need: u64,
        /// Bytes there.
        have: u64,
    },
    /// The byte-order mark is neither this host's nor the other byte order's.
    #[error(
        "byte-order mark {found:#010x} is not {:#010x} in either byte order",
        BYTE_ORDER_MARK
    )]
    ByteOrderMark {
        /// The mark as read.
        found: u32,
    },
    /// `header_size` is smaller than version 1's header.
    #[error("header_size {found} is smaller than the {min}-byte version-1 header")]
    HeaderSize {
        /// `header_size`.
        found: u32,
        /// The smallest valid value.
        min: u32,
    },
    /// Reserved flags or fields are non-zero (damage, or a feature this reader lacks).
    #[error("reserved header field is non-zero ({found:#x})")]
    Reserved {
        /// The offending value.
        found: u64,
    },
    /// The format name is not NUL-terminated, zero-padded UTF-8.
    #[error("the format name is not NUL-terminated, zero-padded UTF-8")]
    FormatName,
    /// The header and metadata checksum does not match: they are damaged.
    #[error("header/metadata checksum mismatch (stored {expected:#010x}, computed {actual:#010x}): the header or metadata is damaged")]
    Crc {
        /// Stored.
        expected: u32,
        /// Computed.
        actual: u32,
    },
    /// The metadata runs past the end of the file.
    #[error(
        "metadata_size {size} runs past the end of the file ({available} bytes after the header)"
    )]
    MetadataPastEof {
        /// `metadata_size`.
        size: u64,
        /// Bytes after the header.
        available: u64,
    },
    /// `metadata_size` is not a multiple of 8.
    #[error("metadata_size {size} is not a multiple of 8")]
    MetadataMisaligned {
        /// `metadata_size`.
        size: u64,
    },
    /// The header's event or CPU count disagrees with the metadata sections.
    #[error("the header says {header} {what}, the metadata holds {found}")]
    CountMismatch {
        /// `events` or `CPUs`.
        what: &'static str,
        /// Count in the header.
        header: u64,
        /// Count in the sections.
        found: u64,
    },
}

/// What is wrong with a metadata section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SectionProblem {
    /// The section (header or padded payload) runs past the end of the metadata.
    #[error("{need} bytes of section run past the end of the metadata ({have} bytes left)")]
    PastEnd {
        /// Bytes the section needs, padding included.
        need: u64,
        /// Bytes left in the metadata.
        have: u64,
    },
    /// An event section is too short for its [`hrperf_abi::EventDesc`].
    #[error("event section of {size} bytes is shorter than an event descriptor (32 bytes)")]
    EventTooShort {
        /// Payload size.
        size: u32,
    },
    /// The CPU list's size is not a multiple of 4.
    #[error("CPU list of {size} bytes is not a whole number of u32s")]
    CpuList {
        /// Payload size.
        size: u32,
    },
    /// A text section is not valid UTF-8 (or a command is not NUL-terminated).
    #[error("section kind {kind} is not valid (NUL-terminated where required) UTF-8")]
    Text {
        /// The section kind.
        kind: u32,
    },
    /// A section that may appear once appears again.
    #[error("section kind {kind} appears twice")]
    Duplicate {
        /// The section kind.
        kind: u32,
    },
    /// Padding bytes after the payload are not zero.
    #[error("padding after the payload is not zero")]
    Padding,
}

/// What is wrong with a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkProblem {
    /// The file ends inside the chunk header.
    #[error("the file ends inside the chunk header ({have} of {need} bytes)")]
    Truncated {
        /// Header bytes needed.
        need: u64,
        /// Bytes left in the file.
        have: u64,
    },
    /// The chunk does not start with [`hrperf_abi::capture::CHUNK_MAGIC`].
    #[error(
        "bad chunk magic {found:#010x} (expected {:#010x})",
        hrperf_abi::capture::CHUNK_MAGIC
    )]
    BadMagic {
        /// The value found.
        found: u32,
    },
    /// The payload runs past the end of the file (a recording cut short).
    #[error("payload of {size} bytes runs past the end of the file ({available} bytes left)")]
    PastEof {
        /// Declared payload size.
        size: u64,
        /// Bytes left after the chunk header.
        available: u64,
    },
    /// The payload size is not a multiple of 8.
    #[error("payload size {size} is not a multiple of 8")]
    Misaligned {
        /// Declared payload size.
        size: u64,
    },
    /// The payload's CRC-32 differs from the header's.
    #[error("CRC-32 mismatch: header says {expected:#010x}, payload has {actual:#010x}")]
    Crc {
        /// CRC in the header.
        expected: u32,
        /// CRC of the payload as read.
        actual: u32,
    },
    /// Reserved flags or fields are non-zero.
    #[error(
        "reserved chunk header fields are non-zero (flags {flags:#x}, reserved {reserved:#x})"
    )]
    Reserved {
        /// `flags`.
        flags: u32,
        /// `reserved`.
        reserved: u32,
    },
    /// A stats chunk's payload is not a whole number of `CpuStats`.
    #[error("stats payload of {size} bytes is not a whole number of 64-byte CpuStats")]
    Stats {
        /// Payload size.
        size: u64,
    },
    /// A symbols chunk's payload is shorter than its header or the text it declares.
    #[error("symbols payload of {size} bytes is shorter than its header or its declared text")]
    Symbols {
        /// Payload size.
        size: u64,
    },
    /// An end chunk's payload is too short for `EndInfo`.
    #[error("end payload of {size} bytes is shorter than EndInfo (32 bytes)")]
    End {
        /// Payload size.
        size: u64,
    },
    /// A data chunk holds a different number of records than its header declares.
    #[error("the header declares {declared} records, the payload holds {found}")]
    RecordCount {
        /// `records` in the header.
        declared: u64,
        /// Records found.
        found: u64,
    },
}

/// What is wrong with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordProblem {
    /// Fewer than 8 bytes are left for a record header.
    #[error("only {remaining} bytes left in the chunk, less than a record header")]
    Truncated {
        /// Bytes left.
        remaining: u64,
    },
    /// The header's size is below the header's own 8 bytes.
    #[error("record size {size} is smaller than its 8-byte header")]
    TooSmall {
        /// `size`.
        size: u16,
    },
    /// The header's size is not a multiple of 8.
    #[error("record size {size} is not a multiple of 8")]
    Misaligned {
        /// `size`.
        size: u16,
    },
    /// The record runs past the end of its chunk.
    #[error("record size {size} runs past the end of the chunk ({remaining} bytes left)")]
    PastChunk {
        /// `size`.
        size: u16,
        /// Bytes left in the chunk.
        remaining: u64,
    },
    /// A `LOST` record is shorter than [`hrperf_abi::record::LostRecord`].
    #[error("LOST record of {size} bytes is shorter than 16")]
    Lost {
        /// `size`.
        size: u16,
    },
}

/// Something a reader noticed that does not stop it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// The file has no END chunk: the recorder did not finish (crash, kill, full disk).
    NoEndChunk,
    /// Chunks follow the END chunk.
    DataAfterEnd {
        /// Offset of the first chunk after END.
        offset: u64,
    },
    /// A chunk of a kind this reader does not know was skipped.
    UnknownChunk {
        /// Its offset.
        offset: u64,
        /// Its kind.
        kind: u32,
    },
    /// A metadata section of a kind this reader does not know was skipped.
    UnknownSection {
        /// Its offset.
        offset: u64,
        /// Its kind.
        kind: u32,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::NoEndChunk => f.write_str("recording did not finish (no end chunk)"),
            Warning::DataAfterEnd { offset } => {
                write!(f, "chunks follow the end chunk (from offset {offset})")
            }
            Warning::UnknownChunk { offset, kind } => {
                write!(f, "skipped a chunk of unknown kind {kind} at offset {offset} (written by a newer hrperf?)")
            }
            Warning::UnknownSection { offset, kind } => {
                write!(f, "skipped a metadata section of unknown kind {kind} at offset {offset} (written by a newer hrperf?)")
            }
        }
    }
}
