//! The capture reader: maps the file, checks the header and metadata once, then walks the
//! chunks lazily, checking each one (magic, size, CRC) before handing out its bytes.

use std::fs::File;
use std::io::Read;
use std::mem::offset_of;
use std::path::{Path, PathBuf};

use hrperf_abi::capture::{
    ChunkHeader, EndInfo, FileHeader, Section, SymbolsHeader, CHUNK_SYMBOLS, BYTE_ORDER_MARK, CHUNK_DATA, CHUNK_END, CHUNK_MAGIC,
    CHUNK_STATS, FILE_MAGIC, FILE_VERSION, SECTION_COMMAND, SECTION_CPUS, SECTION_CPU_MODEL,
    SECTION_EVENT, SECTION_FORMAT_ARG, SECTION_HOSTNAME, SECTION_KERNEL, SECTION_SIM_CONFIG,
};
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::{align8, name_bytes, EventDesc};
use zerocopy::FromBytes;

use super::error::{ChunkProblem, HeaderProblem, SectionProblem};
use super::records::Records;
use super::{CaptureError, CaptureMeta, Warning};
use crate::source::EventSpec;

/// Files up to this size are read into memory rather than mapped.
const READ_LIMIT: u64 = 64 * 1024;
/// Mappings up to this size are populated up front (`MAP_POPULATE`: one bulk fault-in
/// instead of one fault per page; ~20% faster decoding); larger files are faulted in as
/// read, so decoding starts at once and memory is not pinned.
const POPULATE_LIMIT: u64 = 512 << 20;

/// The file's bytes: mapped, or read when mapping is not possible (pipes) or not worth it.
enum Data {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Data {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Map(m) => m,
            Data::Owned(v) => v,
        }
    }
}

/// An open capture file whose header and metadata have been checked.
///
/// Chunks are checked one at a time as [`Reader::chunks`] reaches them, so a file whose
/// tail is damaged still yields every chunk before the damage.
///
/// Regular files larger than 64 KiB are memory-mapped: do not truncate or rewrite a
/// capture while a `Reader` has it open (appending, as a running recorder does, is fine;
/// the reader sees the file as it was when opened).
pub struct Reader {
    path: PathBuf,
    data: Data,
    header: FileHeader,
    meta: CaptureMeta,
    chunks_start: usize,
    warnings: Vec<Warning>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("path", &self.path)
            .field("len", &self.data.bytes().len())
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// Opens and checks `path`. Regular files are memory-mapped; anything else (a pipe)
    /// is read into memory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let io = |op, source| CaptureError::Io {
            path: path.to_owned(),
            op,
            source,
        };
        let mut file = File::open(path).map_err(|e| io("open", e))?;
        let md = file.metadata().map_err(|e| io("stat", e))?;
        let data = if md.is_file() && md.len() > READ_LIMIT {
            let mut opts = memmap2::MmapOptions::new();
            if md.len() <= POPULATE_LIMIT {
                opts.populate();
            }
            // SAFETY: the mapping is read-only, and its bytes are only ever read as plain
            // `u8`s and copied out through bounds-checked zerocopy reads, so no invariant
            // rests on the contents. What remains is the hazard of every file mapping
            // (perf's own reader has it too): another process truncating or rewriting the
            // file while it is mapped; `Reader` documents that this is not supported.
            let map = unsafe { opts.map(&file) }.map_err(|e| io("mmap", e))?;
            // Advice is only a hint; ignore a kernel that declines it.
            let _ = map.advise(memmap2::Advice::Sequential);
            Data::Map(map)
        } else {
            let mut v = Vec::with_capacity(md.len() as usize);
            file.read_to_end(&mut v).map_err(|e| io("read", e))?;
            Data::Owned(v)
        };
        Self::from_data(path.to_owned(), data)
    }

    /// Checks a capture held in memory; `name` names it in errors.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, CaptureError> {
        Self::from_data(name.into(), Data::Owned(bytes))
    }

    fn from_data(path: PathBuf, data: Data) -> Result<Self, CaptureError> {
        let (header, meta, chunks_start, warnings) = parse_head(&path, data.bytes())?;
        Ok(Reader {
            path,
            data,
            header,
            meta,
            chunks_start,
            warnings,
        })
    }

    /// The file's path (or the name given to [`Reader::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file header as read.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// The recording's metadata.
    pub fn meta(&self) -> &CaptureMeta {
        &self.meta
    }

    /// What was noticed in the header and metadata (e.g. skipped unknown sections).
    /// Chunk-level warnings come from [`Chunks::warnings`] and [`Reader::scan`].
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.data.bytes().len() as u64
    }

    /// Offset of the first chunk.
    pub fn chunks_offset(&self) -> u64 {
        self.chunks_start as u64
    }

    /// Iterates the chunks in file order, checking each.
    pub fn chunks(&self) -> Chunks<'_> {
        Chunks {
            reader: self,
            pos: self.chunks_start,
            done: false,
            end: None,
            after_end_warned: false,
            warnings: Vec::new(),
        }
    }
}

/// A checked chunk: its header fields and its payload.
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    /// File offset of the chunk header.
    pub offset: u64,
    /// `CHUNK_*` (unknown kinds are yielded too, with a warning; skip them).
    pub kind: u32,
    /// CPU the records came from (`u32::MAX` for STATS/END).
    pub cpu: u32,
    /// Records the header declares (DATA chunks).
    pub nrecords: u64,
    /// The payload (CRC checked; a multiple of 8 bytes).
    pub payload: &'a [u8],
    path: &'a Path,
}

impl<'a> Chunk<'a> {
    /// File offset of the payload.
    pub fn payload_offset(&self) -> u64 {
        self.offset + size_of::<ChunkHeader>() as u64
    }

    /// The records of a DATA chunk (nothing for other kinds). `PAD` records are skipped;
    /// after the last record the declared count is checked.
    pub fn records(&self) -> Records<'a> {
        if self.kind == CHUNK_DATA {
            Records::for_chunk(
                self.path,
                self.offset,
                self.payload_offset(),
                self.payload,
                Some(self.nrecords),
            )
        } else {
            Records::for_chunk(self.path, self.offset, self.payload_offset(), &[], None)
        }
    }

    /// The entries of a STATS chunk (nothing for other kinds).
    pub fn stats(&self) -> impl Iterator<Item = CpuStats> + 'a {
        let payload = if self.kind == CHUNK_STATS {
            self.payload
        } else {
            &[]
        };
        payload
            .chunks_exact(size_of::<CpuStats>())
            .filter_map(|c| CpuStats::read_from_bytes(c).ok())
    }

    /// A SYMBOLS chunk's `(kind, pid, text)` (`None` for other kinds).
    pub fn symbols(&self) -> Option<(u32, u32, &'a [u8])> {
        if self.kind != CHUNK_SYMBOLS {
            return None;
        }
        let (h, rest) = SymbolsHeader::read_from_prefix(self.payload).ok()?;
        Some((h.kind, h.pid, rest.get(..h.len as usize)?))
    }

    /// The end information of an END chunk.
    pub fn end_info(&self) -> Option<EndInfo> {
        if self.kind != CHUNK_END {
            return None;
        }
        EndInfo::read_from_prefix(self.payload).ok().map(|(e, _)| e)
    }
}

/// Iterator over a capture's chunks; see [`Reader::chunks`].
///
/// Yields `Err` at most once, for the first damaged chunk, and then ends. After the end,
/// [`Chunks::warnings`] says whether the recording finished.
#[derive(Debug)]
pub struct Chunks<'a> {
    reader: &'a Reader,
    pos: usize,
    done: bool,
    end: Option<EndInfo>,
    after_end_warned: bool,
    warnings: Vec<Warning>,
}

impl<'a> Chunks<'a> {
    /// The END chunk's information, once it has been reached.
    pub fn end(&self) -> Option<&EndInfo> {
        self.end.as_ref()
    }

    /// Chunk-level warnings so far: unknown chunk kinds, data after END, and, once the
    /// iteration reached the end of the file cleanly without an END chunk,
    /// [`Warning::NoEndChunk`].
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// File offset of the next chunk.
    pub fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn bad(
        &mut self,
        offset: usize,
        problem: ChunkProblem,
    ) -> Option<Result<Chunk<'a>, CaptureError>> {
        self.done = true;
        Some(Err(CaptureError::BadChunk {
            path: self.reader.path.clone(),
            offset: offset as u64,
            problem,
        }))
    }
}

impl<'a> Iterator for Chunks<'a> {
    type Item = Result<Chunk<'a>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let data = self.reader.data.bytes();
        let pos = self.pos;
        let Some(rest) = data.get(pos..).filter(|r| !r.is_empty()) else {
            self.done = true;
            if self.end.is_none() {
                self.warnings.push(Warning::NoEndChunk);
            }
            return None;
        };
        const HDR: usize = size_of::<ChunkHeader>();
        let Ok((h, after)) = ChunkHeader::read_from_prefix(rest) else {
            return self.bad(
                pos,
                ChunkProblem::Truncated {
                    need: HDR as u64,
                    have: rest.len() as u64,
                },
            );
        };
        if h.magic != CHUNK_MAGIC {
            return self.bad(pos, ChunkProblem::BadMagic { found: h.magic });
        }
        if h.flags != 0 || h.reserved != 0 {
            return self.bad(
                pos,
                ChunkProblem::Reserved {
                    flags: h.flags,
                    reserved: h.reserved,
                },
            );
        }
        if h.size % 8 != 0 {
            return self.bad(pos, ChunkProblem::Misaligned { size: h.size });
        }
        let Some(payload) = usize::try_from(h.size).ok().and_then(|n| after.get(..n)) else {
            return self.bad(
                pos,
                ChunkProblem::PastEof {
                    size: h.size,
                    available: after.len() as u64,
                },
            );
        };
        let crc = super::writer::chunk_crc(&h, payload);
        if crc != h.crc32 {
            return self.bad(
                pos,
                ChunkProblem::Crc {
                    expected: h.crc32,
                    actual: crc,
                },
            );
        }
        if matches!(h.kind, CHUNK_STATS | CHUNK_END | CHUNK_SYMBOLS) && h.records != 0 {
            return self.bad(
                pos,
                ChunkProblem::RecordCount {
                    declared: h.records,
                    found: 0,
                },
            );
        }
        match h.kind {
            CHUNK_DATA => {}
            CHUNK_STATS if payload.len() % size_of::<CpuStats>() != 0 => {
                return self.bad(pos, ChunkProblem::Stats { size: h.size });
            }
            CHUNK_STATS => {}
            CHUNK_SYMBOLS => match SymbolsHeader::read_from_prefix(payload) {
                Ok((s, rest)) if s.len as usize <= rest.len() => {}
                _ => return self.bad(pos, ChunkProblem::Symbols { size: h.size }),
            },
            CHUNK_END => match EndInfo::read_from_prefix(payload) {
                Ok((e, _)) => self.end = Some(e),
                Err(_) => return self.bad(pos, ChunkProblem::End { size: h.size }),
            },
            kind => self.warnings.push(Warning::UnknownChunk {
                offset: pos as u64,
                kind,
            }),
        }
        if self.end.is_some() && h.kind != CHUNK_END && !self.after_end_warned {
            self.after_end_warned = true;
            self.warnings
                .push(Warning::DataAfterEnd { offset: pos as u64 });
        }
        self.pos = pos + HDR + payload.len();
        Some(Ok(Chunk {
            offset: pos as u64,
            kind: h.kind,
            cpu: h.cpu,
            nrecords: h.records,
            payload,
            path: &self.reader.path,
        }))
    }
}

impl std::iter::FusedIterator for Chunks<'_> {}

type Head = (FileHeader, CaptureMeta, usize, Vec<Warning>);

/// Checks the header and metadata; returns them, where chunks start, and warnings.
fn parse_head(path: &Path, data: &[u8]) -> Result<Head, CaptureError> {
    let hdr_err = |offset: usize, problem| CaptureError::BadHeader {
        path: path.to_owned(),
        offset: offset as u64,
        problem,
    };
    const MIN: usize = size_of::<FileHeader>();
    let truncated = |need: usize| {
        hdr_err(
            0,
            HeaderProblem::Truncated {
                need: need as u64,
                have: data.len() as u64,
            },
        )
    };
    let u32_at = |off: usize| -> Option<u32> {
        data.get(off..off + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };

    // Magic first, on whatever prefix there is, so a short non-capture is named as such.
    let n = data.len().min(8);
    if data[..n] != FILE_MAGIC[..n] {
        let mut found = [0u8; 8];
        found[..n].copy_from_slice(&data[..n]);
        return Err(CaptureError::NotACapture {
            path: path.to_owned(),
            found,
        });
    }
    let bom_off = offset_of!(FileHeader, byte_order);
    let bom = u32_at(bom_off).ok_or_else(|| truncated(MIN))?;
    if bom != BYTE_ORDER_MARK {
        if bom == BYTE_ORDER_MARK.swap_bytes() {
            return Err(CaptureError::OtherByteOrder {
                path: path.to_owned(),
                found: bom,
            });
        }
        return Err(hdr_err(
            bom_off,
            HeaderProblem::ByteOrderMark { found: bom },
        ));
    }
    let version = u32_at(offset_of!(FileHeader, version)).ok_or_else(|| truncated(MIN))?;
    if version != FILE_VERSION {
        return Err(CaptureError::UnsupportedVersion {
            path: path.to_owned(),
            found: version,
            supported: FILE_VERSION,
        });
    }
    let hs_off = offset_of!(FileHeader, header_size);
    let header_size = u32_at(hs_off).ok_or_else(|| truncated(MIN))?;
    if (header_size as usize) < MIN {
        return Err(hdr_err(
            hs_off,
            HeaderProblem::HeaderSize {
                found: header_size,
                min: MIN as u32,
            },
        ));
    }
    let header_size = header_size as usize;
    if data.len() < header_size {
        return Err(truncated(header_size));
    }
    let (h, _) = FileHeader::read_from_prefix(data).map_err(|_| truncated(MIN))?;
    if h.flags != 0 {
        return Err(hdr_err(
            offset_of!(FileHeader, flags),
            HeaderProblem::Reserved {
                found: h.flags.into(),
            },
        ));
    }
    if h.reserved0 != 0 {
        return Err(hdr_err(
            offset_of!(FileHeader, reserved0),
            HeaderProblem::Reserved {
                found: h.reserved0.into(),
            },
        ));
    }
    if let Some(i) = h.reserved.iter().position(|&r| r != 0) {
        return Err(hdr_err(
            offset_of!(FileHeader, reserved) + 8 * i,
            HeaderProblem::Reserved {
                found: h.reserved[i],
            },
        ));
    }
    let name_off = offset_of!(FileHeader, format_name);
    let name = name_bytes(&h.format_name);
    if name.len() == h.format_name.len() || h.format_name[name.len()..].iter().any(|&b| b != 0) {
        return Err(hdr_err(name_off, HeaderProblem::FormatName));
    }
    let format_name = std::str::from_utf8(name)
        .map_err(|_| hdr_err(name_off, HeaderProblem::FormatName))?
        .to_owned();
    let ms_off = offset_of!(FileHeader, metadata_size);
    let available = (data.len() - header_size) as u64;
    if h.metadata_size > available {
        return Err(hdr_err(
            ms_off,
            HeaderProblem::MetadataPastEof {
                size: h.metadata_size,
                available,
            },
        ));
    }
    if h.metadata_size % 8 != 0 {
        return Err(hdr_err(
            ms_off,
            HeaderProblem::MetadataMisaligned {
                size: h.metadata_size,
            },
        ));
    }
    let meta_end = header_size + h.metadata_size as usize;
    // Every header and metadata byte is covered, so damage to free-valued fields (UUID,
    // times, event encodings, CPU numbers) is caught too, not only structural damage.
    let crc_off = offset_of!(FileHeader, header_crc32);
    let actual = super::writer::header_crc(&data[..header_size], &data[header_size..meta_end]);
    if actual != h.header_crc32 {
        return Err(hdr_err(
            crc_off,
            HeaderProblem::Crc {
                expected: h.header_crc32,
                actual,
            },
        ));
    }

    let mut meta = CaptureMeta {
        format_name,
        format_uuid: h.format_uuid,
        format_version: h.format_version,
        source: h.source,
        clock: h.clock,
        tsc_hz: h.tsc_hz,
        mode: h.mode,
        sample_period: h.sample_period,
        poll_interval_ns: h.poll_interval_ns,
        start_time_ns: h.start_time_ns,
        start_wall_ns: h.start_wall_ns,
        ..CaptureMeta::default()
    };
    let mut warnings = Vec::new();
    parse_sections(path, data, header_size, meta_end, &mut meta, &mut warnings)?;
    if meta.events.len() as u64 != u64::from(h.nr_events) {
        return Err(hdr_err(
            offset_of!(FileHeader, nr_events),
            HeaderProblem::CountMismatch {
                what: "events",
                header: h.nr_events.into(),
                found: meta.events.len() as u64,
            },
        ));
    }
    if meta.cpus.len() as u64 != u64::from(h.nr_cpus) {
        return Err(hdr_err(
            offset_of!(FileHeader, nr_cpus),
            HeaderProblem::CountMismatch {
                what: "CPUs",
                header: h.nr_cpus.into(),
                found: meta.cpus.len() as u64,
            },
        ));
    }
    Ok((h, meta, meta_end, warnings))
}

fn parse_sections(
    path: &Path,
    data: &[u8],
    start: usize,
    end: usize,
    meta: &mut CaptureMeta,
    warnings: &mut Vec<Warning>,
) -> Result<(), CaptureError> {
    let mut pos = start;
    let mut seen: u32 = 0; // bit per single-instance kind seen
    while pos < end {
        let bad = |problem| CaptureError::BadSection {
            path: path.to_owned(),
            offset: pos as u64,
            problem,
        };
        let rest = &data[pos..end];
        let Ok((s, after)) = Section::read_from_prefix(rest) else {
            return Err(bad(SectionProblem::PastEnd {
                need: 8,
                have: rest.len() as u64,
            }));
        };
        let padded = align8(s.size as usize);
        let Some(body) = after.get(..padded) else {
            return Err(bad(SectionProblem::PastEnd {
                need: 8 + padded as u64,
                have: rest.len() as u64,
            }));
        };
        let (payload, padding) = body.split_at(s.size as usize);
        if padding.iter().any(|&b| b != 0) {
            return Err(bad(SectionProblem::Padding));
        }
        let text = |kind| {
            std::str::from_utf8(payload)
                .map(str::to_owned)
                .map_err(|_| bad(SectionProblem::Text { kind }))
        };
        if s.kind != SECTION_EVENT && (1..32).contains(&s.kind) && s.kind <= SECTION_SIM_CONFIG {
            let bit = 1u32 << s.kind;
            if seen & bit != 0 {
                return Err(bad(SectionProblem::Duplicate { kind: s.kind }));
            }
            seen |= bit;
        }
        match s.kind {
            SECTION_EVENT => {
                let Ok((desc, name)) = EventDesc::read_from_prefix(payload) else {
                    return Err(bad(SectionProblem::EventTooShort { size: s.size }));
                };
                let name = std::str::from_utf8(name)
                    .map_err(|_| bad(SectionProblem::Text { kind: s.kind }))?
                    .to_owned();
                meta.events.push(EventSpec { name, desc });
            }
            SECTION_CPUS => {
                if payload.len() % 4 != 0 {
                    return Err(bad(SectionProblem::CpuList { size: s.size }));
                }
                meta.cpus = payload
                    .chunks_exact(4)
                    .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
            }
            SECTION_CPU_MODEL => meta.cpu_model = text(s.kind)?,
            SECTION_HOSTNAME => meta.hostname = text(s.kind)?,
            SECTION_KERNEL => meta.kernel_release = text(s.kind)?,
            SECTION_SIM_CONFIG => meta.sim_config = text(s.kind)?,
            SECTION_FORMAT_ARG => meta.format_arg = payload.to_vec(),
            SECTION_COMMAND => {
                let Some(args) = payload.strip_suffix(&[0]) else {
                    return Err(bad(SectionProblem::Text { kind: s.kind }));
                };
                meta.command = args
                    .split(|&b| b == 0)
                    .map(|a| std::str::from_utf8(a).map(str::to_owned))
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad(SectionProblem::Text { kind: s.kind }))?;
            }
            kind => warnings.push(Warning::UnknownSection {
                offset: pos as u64,
                kind,
            }),
        }
        pos += 8 + padded;
    }
    Ok(())
}
