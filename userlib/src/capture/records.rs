//! Iterating the records of a chunk payload (or of any byte buffer of whole records).

use std::path::Path;

use hrperf_abi::record::{LostRecord, RecordHeader};
use hrperf_abi::RecordType;
use zerocopy::FromBytes;

use super::error::{ChunkProblem, RecordProblem};
use super::CaptureError;

/// One record: its header and all its bytes (header included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// File offset of the record (or offset into the buffer, see [`Records::over`]).
    pub offset: u64,
    /// The header as read.
    pub header: RecordHeader,
    /// `header.size` bytes, header included.
    pub bytes: &'a [u8],
}

impl Record<'_> {
    /// The record's type.
    pub fn kind(&self) -> RecordType {
        self.header.kind
    }

    /// For a [`RecordType::LOST`] record, the number of records it says were dropped;
    /// `Ok(None)` for any other type.
    pub fn lost(&self) -> Result<Option<u64>, RecordProblem> {
        if self.header.kind != RecordType::LOST {
            return Ok(None);
        }
        LostRecord::read_from_prefix(self.bytes)
            .map(|(l, _)| Some(l.lost))
            .map_err(|_| RecordProblem::Lost {
                size: self.header.size,
            })
    }
}

/// Iterator over the records in a payload; see [`super::Chunk::records`].
///
/// Each record's `size` is checked (≥ 8, a multiple of 8, within the payload) before its
/// bytes are handed out; a bad one yields one `Err` naming its offset, and iteration
/// ends. `PAD` records are skipped. Allocates nothing.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
    chunk: u64,
    declared: Option<u64>,
    seen: u64,
    path: &'a Path,
    done: bool,
}

impl<'a> Records<'a> {
    pub(super) fn for_chunk(
        path: &'a Path,
        chunk: u64,
        base: u64,
        buf: &'a [u8],
        declared: Option<u64>,
    ) -> Self {
        Records {
            buf,
            pos: 0,
            base,
            chunk,
            declared,
            seen: 0,
            path,
            done: false,
        }
    }

    /// Iterates the records of any buffer of whole records (e.g. a ring's contents);
    /// offsets are relative to `buf`.
    pub fn over(buf: &'a [u8]) -> Self {
        Records::for_chunk(Path::new("<buffer>"), 0, 0, buf, None)
    }

    /// Records (PAD included) consumed so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    #[cold]
    fn fail(&mut self, problem: RecordProblem) -> Option<Result<Record<'a>, CaptureError>> {
        let offset = self.base + self.pos as u64;
        self.done = true;
        self.pos = self.buf.len();
        Some(Err(CaptureError::BadRecord {
            path: self.path.to_owned(),
            offset,
            chunk: self.chunk,
            problem,
        }))
    }

    #[cold]
    fn finish(&mut self) -> Option<Result<Record<'a>, CaptureError>> {
        self.done = true;
        match self.declared {
            Some(declared) if declared != self.seen => Some(Err(CaptureError::BadChunk {
                path: self.path.to_owned(),
                offset: self.chunk,
                problem: ChunkProblem::RecordCount {
                    declared,
                    found: self.seen,
                },
            })),
            _ => None,
        }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, CaptureError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            let rest = &self.buf[self.pos..];
            if rest.is_empty() {
                return self.finish();
            }
            let Ok((header, _)) = RecordHeader::read_from_prefix(rest) else {
                return self.fail(RecordProblem::Truncated {
                    remaining: rest.len() as u64,
                });
            };
            let size = header.size;
            if size < 8 {
                return self.fail(RecordProblem::TooSmall { size });
            }
            if size % 8 != 0 {
                return self.fail(RecordProblem::Misaligned { size });
            }
            let Some(bytes) = rest.get(..size as usize) else {
                return self.fail(RecordProblem::PastChunk {
                    size,
                    remaining: rest.len() as u64,
                });
            };
            let offset = self.base + self.pos as u64;
            self.pos += size as usize;
            self.seen += 1;
            if header.kind == RecordType::PAD {
                continue;
            }
            return Some(Ok(Record {
                offset,
                header,
                bytes,
            }));
        }
    }
}

impl std::iter::FusedIterator for Records<'_> {}
