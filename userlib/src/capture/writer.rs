//! The streaming capture writer: header and metadata once, then chunks as they come.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use hrperf_abi::capture::{
    ChunkHeader, EndInfo, FileHeader, Section, SymbolsHeader, CHUNK_SYMBOLS, BYTE_ORDER_MARK, CHUNK_DATA, CHUNK_END, CHUNK_MAGIC,
    CHUNK_STATS, FILE_MAGIC, FILE_VERSION, SECTION_COMMAND, SECTION_CPUS, SECTION_CPU_MODEL,
    SECTION_EVENT, SECTION_FORMAT_ARG, SECTION_HOSTNAME, SECTION_KERNEL, SECTION_SIM_CONFIG,
};
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::record::RecordHeader;
use hrperf_abi::{align8, fixed_name, NAME_LEN};
use zerocopy::{FromBytes, IntoBytes};

use super::{CaptureError, CaptureMeta};

/// Buffer size of the underlying `BufWriter`.
const BUF_SIZE: usize = 1 << 20;

/// Writes a capture file as a stream: [`Writer::new`] writes the header and metadata,
/// [`Writer::write_chunk`] one chunk of records per call, [`Writer::finish`] the END
/// chunk. Nothing but the current chunk's bytes is ever buffered beyond the `BufWriter`.
///
/// The output is a pure function of the inputs: the writer adds no time, host or random
/// data of its own.
///
/// Dropping a writer without [`Writer::finish`] flushes what was written (errors ignored)
/// and leaves a file without an END chunk, which readers report as unfinished.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: BufWriter<W>,
    path: PathBuf,
    offset: u64,
    records: u64,
    chunks: u64,
}

impl Writer<File> {
    /// Creates (or truncates) `path` and writes the header and metadata.
    pub fn create(path: &Path, meta: &CaptureMeta) -> Result<Self, CaptureError> {
        let file = File::create(path).map_err(|source| CaptureError::Io {
            path: path.to_owned(),
            op: "create",
            source,
        })?;
        Self::with_name(file, path, meta)
    }
}

impl<W: Write> Writer<W> {
    /// Writes the header and metadata of `meta` to `out`.
    pub fn new(out: W, meta: &CaptureMeta) -> Result<Self, CaptureError> {
        Self::with_name(out, Path::new("<output>"), meta)
    }

    /// As [`Writer::new`], naming `out` as `name` in errors.
    pub fn with_name(out: W, name: &Path, meta: &CaptureMeta) -> Result<Self, CaptureError> {
        let metadata = encode_metadata(meta)?;
        let format_name = fixed_name(&meta.format_name)
            .filter(|_| !meta.format_name.as_bytes().contains(&0))
            .ok_or_else(|| CaptureError::InvalidInput {
                problem: format!(
                    "format name '{}' must be shorter than {NAME_LEN} bytes and contain no NUL",
                    meta.format_name
                ),
            })?;
        let header = FileHeader {
            magic: FILE_MAGIC,
            byte_order: BYTE_ORDER_MARK,
            header_size: size_of::<FileHeader>() as u32,
            version: FILE_VERSION,
            flags: 0,
            format_uuid: meta.format_uuid,
            format_name,
            format_version: meta.format_version,
            source: meta.source,
            clock: meta.clock,
            mode: meta.mode,
            nr_events: count_u32(meta.events.len(), "events")?,
            nr_cpus: count_u32(meta.cpus.len(), "CPUs")?,
            tsc_hz: meta.tsc_hz,
            start_time_ns: meta.start_time_ns,
            start_wall_ns: meta.start_wall_ns,
            sample_period: meta.sample_period,
            poll_interval_ns: meta.poll_interval_ns,
            metadata_size: metadata.len() as u64,
            header_crc32: 0,
            reserved0: 0,
            reserved: [0; 5],
        };
        let header = FileHeader { header_crc32: header_crc(header.as_bytes(), &metadata), ..header };
        let mut w = Writer {
            out: BufWriter::with_capacity(BUF_SIZE, out),
            path: name.to_owned(),
            offset: 0,
            records: 0,
            chunks: 0,
        };
        w.put(header.as_bytes(), "write header")?;
        w.put(&metadata, "write metadata")?;
        Ok(w)
    }

    /// Appends a DATA chunk of `records` from `cpu`'s buffer.
    ///
    /// `records` is a whole number of records (each a [`RecordHeader`] with a `size` that
    /// is a multiple of 8 and at least 8), and `nrecords` their count, every record
    /// (`PAD` and `LOST` included). Both are checked, so a framing bug in the caller is
    /// caught here and not in a reader months later. An empty `records` writes nothing.
    pub fn write_chunk(
        &mut self,
        cpu: u32,
        records: &[u8],
        nrecords: u64,
    ) -> Result<(), CaptureError> {
        let found = count_records(records)?;
        if found != nrecords {
            return Err(CaptureError::InvalidInput {
                problem: format!(
                    "chunk for CPU {cpu} holds {found} records, the caller said {nrecords}"
                ),
            });
        }
        if records.is_empty() {
            return Ok(());
        }
        self.records += nrecords;
        self.chunk(CHUNK_DATA, cpu, records, nrecords, "write chunk")
    }

    /// Appends a STATS chunk of per-CPU statistics.
    ///
    /// May be called more than once (e.g. periodically, so a crashed recording still has
    /// statistics); each entry is a cumulative snapshot, and readers keep the last one per
    /// CPU.
    pub fn write_stats(&mut self, stats: &[CpuStats]) -> Result<(), CaptureError> {
        self.chunk(CHUNK_STATS, u32::MAX, stats.as_bytes(), 0, "write stats")
    }

    /// Appends a SYMBOLS chunk: `text` of kind `SYM_*` for process `pid` (see
    /// [`hrperf_abi::capture::CHUNK_SYMBOLS`]).
    pub fn write_symbols(&mut self, kind: u32, pid: u32, text: &[u8]) -> Result<(), CaptureError> {
        let len = u32::try_from(text.len()).map_err(|_| CaptureError::InvalidInput {
            problem: format!("symbol text of {} bytes is larger than 4 GiB", text.len()),
        })?;
        let header = SymbolsHeader { kind, pid, len, reserved: 0 };
        let mut payload = Vec::with_capacity(16 + text.len() + 8);
        payload.extend_from_slice(header.as_bytes());
        payload.extend_from_slice(text);
        payload.resize(payload.len().next_multiple_of(8), 0);
        self.chunk(CHUNK_SYMBOLS, u32::MAX, &payload, 0, "write symbols")
    }

    /// Writes the END chunk, flushes, and returns the underlying writer.
    pub fn finish(mut self, end: EndInfo) -> Result<W, CaptureError> {
        self.chunk(CHUNK_END, u32::MAX, end.as_bytes(), 0, "write end")?;
        self.flush()?;
        let path = self.path;
        self.out.into_inner().map_err(|e| CaptureError::Io {
            path,
            op: "flush",
            source: e.into_error(),
        })
    }

    /// Flushes buffered chunks to the underlying writer (so a crash loses no finished
    /// chunk).
    pub fn flush(&mut self) -> Result<(), CaptureError> {
        self.out.flush().map_err(|source| CaptureError::Io {
            path: self.path.clone(),
            op: "flush",
            source,
        })
    }

    /// Bytes written so far (the offset of the next chunk).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Records written in DATA chunks so far.
    pub fn records_written(&self) -> u64 {
        self.records
    }

    /// Chunks written so far (all kinds).
    pub fn chunks_written(&self) -> u64 {
        self.chunks
    }

    fn chunk(
        &mut self,
        kind: u32,
        cpu: u32,
        payload: &[u8],
        records: u64,
        op: &'static str,
    ) -> Result<(), CaptureError> {
        debug_assert_eq!(payload.len() % 8, 0);
        let header = ChunkHeader {
            magic: CHUNK_MAGIC,
            kind,
            cpu,
            flags: 0,
            size: payload.len() as u64,
            records,
            crc32: 0,
            reserved: 0,
        };
        let header = ChunkHeader { crc32: chunk_crc(&header, payload), ..header };
        self.put(header.as_bytes(), op)?;
        self.put(payload, op)?;
        self.chunks += 1;
        Ok(())
    }

    fn put(&mut self, bytes: &[u8], op: &'static str) -> Result<(), CaptureError> {
        self.out
            .write_all(bytes)
            .map_err(|source| CaptureError::Io {
                path: self.path.clone(),
                op,
                source,
            })?;
        self.offset += bytes.len() as u64;
        Ok(())
    }
}

fn count_u32(n: usize, what: &str) -> Result<u32, CaptureError> {
    u32::try_from(n).map_err(|_| CaptureError::InvalidInput {
        problem: format!("too many {what} ({n})"),
    })
}

/// Counts the records in `buf`, checking that they frame it exactly.
fn count_records(buf: &[u8]) -> Result<u64, CaptureError> {
    let bad = |off: usize, what: String| CaptureError::InvalidInput {
        problem: format!("record at byte {off} of the chunk: {what}"),
    };
    if buf.len() & 7 != 0 {
        return Err(CaptureError::InvalidInput {
            problem: format!(
                "chunk payload of {} bytes is not a multiple of 8",
                buf.len()
            ),
        });
    }
    let mut pos = 0;
    let mut n = 0u64;
    while pos < buf.len() {
        let Ok((h, _)) = RecordHeader::read_from_prefix(&buf[pos..]) else {
            return Err(bad(pos, "truncated header".into()));
        };
        let size = h.size as usize;
        if size < 8 || size & 7 != 0 || size > buf.len() - pos {
            return Err(bad(
                pos,
                format!("bad size {size} ({} bytes left)", buf.len() - pos),
            ));
        }
        pos += size;
        n += 1;
    }
    Ok(n)
}

/// Encodes the metadata sections of `meta`, in a fixed order.
fn encode_metadata(meta: &CaptureMeta) -> Result<Vec<u8>, CaptureError> {
    let mut out = Vec::new();
    for e in &meta.events {
        let mut payload = e.desc.as_bytes().to_vec();
        payload.extend_from_slice(e.name.as_bytes());
        section(&mut out, SECTION_EVENT, &payload)?;
    }
    section(&mut out, SECTION_CPUS, meta.cpus.as_bytes())?;
    let texts = [
        (SECTION_CPU_MODEL, meta.cpu_model.as_bytes()),
        (SECTION_HOSTNAME, meta.hostname.as_bytes()),
        (SECTION_KERNEL, meta.kernel_release.as_bytes()),
        (SECTION_FORMAT_ARG, meta.format_arg.as_slice()),
        (SECTION_SIM_CONFIG, meta.sim_config.as_bytes()),
    ];
    for (kind, bytes) in texts {
        if !bytes.is_empty() {
            section(&mut out, kind, bytes)?;
        }
    }
    if !meta.command.is_empty() {
        let mut payload = Vec::new();
        for arg in &meta.command {
            if arg.as_bytes().contains(&0) {
                return Err(CaptureError::InvalidInput {
                    problem: format!("command argument {arg:?} contains a NUL byte"),
                });
            }
            payload.extend_from_slice(arg.as_bytes());
            payload.push(0);
        }
        section(&mut out, SECTION_COMMAND, &payload)?;
    }
    Ok(out)
}

fn section(out: &mut Vec<u8>, kind: u32, payload: &[u8]) -> Result<(), CaptureError> {
    let size = u32::try_from(payload.len()).map_err(|_| CaptureError::InvalidInput {
        problem: format!(
            "metadata section {kind} is {} bytes, over 4 GiB",
            payload.len()
        ),
    })?;
    out.extend_from_slice(Section { kind, size }.as_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len() + align8(payload.len()) - payload.len(), 0);
    Ok(())
}

/// The checksum of a chunk: its header with `crc32` zeroed, then its payload.
pub fn chunk_crc(header: &ChunkHeader, payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(ChunkHeader { crc32: 0, ..*header }.as_bytes());
    crc.update(payload);
    crc.finalize()
}

/// The checksum of the file header (`header_size` bytes, `header_crc32` taken as zero)
/// and the metadata after it.
pub fn header_crc(header: &[u8], metadata: &[u8]) -> u32 {
    let at = std::mem::offset_of!(FileHeader, header_crc32);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header[..at.min(header.len())]);
    if header.len() >= at + 4 {
        crc.update(&[0; 4]);
        crc.update(&header[at + 4..]);
    }
    crc.update(metadata);
    crc.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: u32, size: u16) -> Vec<u8> {
        let mut b = vec![0u8; size.max(8) as usize];
        b[0..4].copy_from_slice(&kind.to_ne_bytes());
        b[6..8].copy_from_slice(&size.to_ne_bytes());
        b
    }

    #[test]
    fn counts_and_checks_framing() {
        assert_eq!(count_records(&[]).unwrap(), 0);
        let mut b = rec(0x1000, 16);
        b.extend(rec(0, 8));
        b.extend(rec(1, 24));
        assert_eq!(count_records(&b).unwrap(), 3);
        assert!(count_records(&b[..b.len() - 8]).is_err());
        assert!(count_records(&rec(0x1000, 0)).is_err());
        assert!(count_records(&rec(0x1000, 12)[..8]).is_err());
        assert!(count_records(&b[..4]).is_err());
    }

    #[test]
    fn sections_are_padded() {
        let mut out = Vec::new();
        section(&mut out, 9, b"abc").unwrap();
        assert_eq!(out.len(), 16);
        assert_eq!(&out[8..11], b"abc");
        assert!(out[11..].iter().all(|&b| b == 0));
    }
}
