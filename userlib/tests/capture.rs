//! Capture file: writer → reader round trips, and every kind of damage gives an error
//! (never a panic) while the intact chunks before it still decode.

mod common;

use std::mem::offset_of;

use common::*;
use hrperf::capture::{
    CaptureError, ChunkProblem, HeaderProblem, Reader, RecordProblem, SectionProblem, Warning,
    Writer,
};
use hrperf_abi::capture::{
    ChunkHeader, FileHeader, Section, CHUNK_DATA, CHUNK_END, CHUNK_MAGIC, CHUNK_STATS,
    FILE_VERSION, SECTION_HOSTNAME,
};
use hrperf_abi::record::RecordHeader;
use hrperf_abi::RecordType;
use hrperf_fmt_delta::record;

/// Everything a reader gets out of a capture: per record (cpu, offset, bytes), plus how
/// iteration ended.
#[derive(Debug, Default)]
struct Walk {
    records: Vec<(u32, u64, Vec<u8>)>,
    chunk_kinds: Vec<u32>,
    error: Option<CaptureError>,
    warnings: Vec<Warning>,
}

fn walk(r: &Reader) -> Walk {
    let mut w = Walk {
        warnings: r.warnings().to_vec(),
        ..Walk::default()
    };
    let mut chunks = r.chunks();
    'outer: for c in &mut chunks {
        let c = match c {
            Ok(c) => c,
            Err(e) => {
                w.error = Some(e);
                break;
            }
        };
        w.chunk_kinds.push(c.kind);
        for rec in c.records() {
            match rec {
                Ok(rec) => w.records.push((c.cpu, rec.offset, rec.bytes.to_vec())),
                Err(e) => {
                    w.error = Some(e);
                    break 'outer;
                }
            }
        }
    }
    w.warnings.extend_from_slice(chunks.warnings());
    w
}

fn read(bytes: &[u8]) -> Result<Reader, CaptureError> {
    Reader::from_bytes("test.data", bytes.to_vec())
}

#[test]
fn round_trip_meta_chunks_stats_end() {
    let bytes = small_capture();
    let r = read(&bytes).unwrap();
    assert_eq!(r.meta(), &meta());
    assert_eq!(r.header().version, FILE_VERSION);
    assert!(r.warnings().is_empty());

    let w = walk(&r);
    assert!(w.error.is_none(), "{:?}", w.error);
    assert!(w.warnings.is_empty(), "{:?}", w.warnings);
    assert_eq!(
        w.chunk_kinds,
        [CHUNK_DATA, CHUNK_DATA, CHUNK_DATA, CHUNK_STATS, CHUNK_END]
    );
    // 10 deltas + 1 LOST + 1 foreign; the PAD is skipped.
    assert_eq!(w.records.len(), 12);
    let deltas: Vec<_> = w
        .records
        .iter()
        .filter_map(|(cpu, _, b)| record::parse(b).ok().map(|s| (*cpu, s)))
        .collect();
    assert_eq!(deltas.len(), 10);
    assert_eq!(deltas[0], (0, sample(0, 0)));
    assert_eq!(deltas[4], (1, sample(1, 0)));
    assert_eq!(deltas[7], (1, sample(1, 3)));
    assert_eq!(deltas[9], (0, sample(0, 5)));
    // Offsets are real file offsets.
    for (_, off, b) in &w.records {
        let off = *off as usize;
        assert_eq!(&bytes[off..off + b.len()], &b[..]);
    }

    let mut chunks = r.chunks();
    let stats: Vec<_> = chunks
        .by_ref()
        .filter_map(Result::ok)
        .flat_map(|c| c.stats())
        .collect();
    assert_eq!(stats, [common::stats(0, 7, 0), common::stats(1, 5, 6)]);
    assert_eq!(chunks.end(), Some(&end_info(12, 6)));
}

#[test]
fn writer_is_deterministic_and_streams_to_files() {
    assert_eq!(small_capture(), small_capture());

    let dir = tempfile::tempdir().unwrap();
    // Small (read into memory) and large (memory-mapped) files.
    for n in [10u64, 5_000] {
        let path = dir.path().join(format!("cap{n}.data"));
        let mut w = Writer::create(&path, &meta()).unwrap();
        let (a, k) = samples(0, 0, n);
        w.write_chunk(0, &a, k).unwrap();
        assert_eq!(w.records_written(), n);
        w.write_stats(&[common::stats(0, n, 0)]).unwrap();
        let offset = w.offset();
        let file = w.finish(end_info(n, 0)).unwrap();
        drop(file);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), offset + 40 + 32);

        let r = Reader::open(&path).unwrap();
        assert_eq!(r.meta(), &meta());
        let w = walk(&r);
        assert!(w.error.is_none() && w.warnings.is_empty());
        assert_eq!(w.records.len() as u64, n);
        let scan = r.scan();
        assert_eq!(scan.totals().records, n);
        assert!(scan.end.is_some());
    }
}

#[test]
fn writer_rejects_what_the_file_cannot_hold() {
    let mut w = Writer::new(Vec::new(), &meta()).unwrap();
    let (a, _) = samples(0, 0, 2);
    let invalid = |e: CaptureError| assert!(matches!(e, CaptureError::InvalidInput { .. }), "{e}");
    invalid(w.write_chunk(0, &a, 3).unwrap_err());
    invalid(w.write_chunk(0, &a[..a.len() - 4], 2).unwrap_err());
    invalid(w.write_chunk(0, &a[..a.len() - 8], 2).unwrap_err());
    invalid(w.write_chunk(0, &[0u8; 8], 1).unwrap_err());
    // Nothing half-written: a valid chunk still goes through.
    w.write_chunk(0, &a, 2).unwrap();
    w.write_chunk(0, &[], 0).unwrap();
    let bytes = w.finish(end_info(2, 0)).unwrap();
    assert_eq!(walk(&read(&bytes).unwrap()).records.len(), 2);

    let mut m = meta();
    m.format_name = "x".repeat(32);
    invalid(Writer::new(Vec::new(), &m).unwrap_err());
    let mut m = meta();
    m.command.push("a\0b".into());
    invalid(Writer::new(Vec::new(), &m).unwrap_err());
}

#[test]
fn empty_metadata_round_trips() {
    let m = hrperf::capture::CaptureMeta {
        format_name: "delta".into(),
        ..Default::default()
    };
    let bytes = Writer::new(Vec::new(), &m)
        .unwrap()
        .finish(end_info(0, 0))
        .unwrap();
    let r = read(&bytes).unwrap();
    assert_eq!(r.meta(), &m);
    let w = walk(&r);
    assert!(w.error.is_none() && w.warnings.is_empty() && w.records.is_empty());
}

/// Cutting the file at every byte: an error (header/metadata, or the chunk cut through),
/// or, at a chunk boundary, the "did not finish" warning. Never a panic, and every
/// record that is yielded is one of the full file's, in order.
#[test]
fn truncation_at_every_offset() {
    let bytes = small_capture();
    let full = walk(&read(&bytes).unwrap());
    let chunks = chunk_offsets(&bytes);
    let first_chunk = chunks[0] as usize;
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        let r = match read(cut) {
            Ok(r) => r,
            Err(e) => {
                assert!(
                    len < first_chunk,
                    "length {len}: open failed past the metadata: {e}"
                );
                let msg = e.to_string();
                assert!(msg.contains("test.data"), "{msg}");
                if (8..192).contains(&len) {
                    assert!(
                        matches!(
                            e,
                            CaptureError::BadHeader {
                                problem: HeaderProblem::Truncated { .. },
                                ..
                            }
                        ),
                        "{e}"
                    );
                }
                continue;
            }
        };
        assert!(len >= first_chunk, "length {len}: metadata cut but opened");
        let w = walk(&r);
        assert_eq!(
            &full.records[..w.records.len()],
            &w.records[..],
            "length {len}"
        );
        if chunks.contains(&(len as u64)) {
            assert!(w.error.is_none(), "length {len}: {:?}", w.error);
            assert!(
                w.warnings.contains(&Warning::NoEndChunk),
                "length {len}: {:?}",
                w.warnings
            );
        } else {
            let e = w.error.unwrap_or_else(|| panic!("length {len}: no error"));
            // The error names the chunk that was cut, by offset.
            let at = *chunks.iter().filter(|&&c| c < len as u64).max().unwrap();
            assert_eq!(e.offset(), Some(at), "length {len}: {e}");
            assert!(e.to_string().contains(&format!("offset {at}")), "{e}");
            assert!(
                matches!(
                    e,
                    CaptureError::BadChunk {
                        problem: ChunkProblem::Truncated { .. } | ChunkProblem::PastEof { .. },
                        ..
                    }
                ),
                "length {len}: {e}"
            );
        }
    }
}

fn flip(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at] ^= 0xff;
    b
}

/// Flipping any byte never panics. In chunks: the payload is covered by the CRC and
/// the header's fields are checked, except `cpu` (and `kind`, which turns into an unknown
/// kind that is skipped with a warning). In the file header every structural field is
/// caught; free values (UUID, clock values, event encodings, CPU numbers, the format
/// argument, a text section's kind) cannot be, as version 1 has no metadata checksum.
/// Every single-byte flip anywhere is caught: in the header or metadata by the header
/// checksum (or an earlier structural check), in a chunk by its checksum (which covers the
/// chunk header too), with the error naming the damaged chunk's offset and every chunk
/// before it still decoding.
#[test]
fn flipped_bytes_are_caught() {
    let bytes = small_capture();
    let full = walk(&read(&bytes).unwrap());
    let chunks = chunk_offsets(&bytes);
    let first_chunk = chunks[0] as usize;
    for at in 0..bytes.len() {
        let b = flip(&bytes, at);
        let opened = read(&b);
        if at < first_chunk {
            assert!(opened.is_err(), "flip at {at} (header/metadata) not caught");
            continue;
        }
        let r = opened.unwrap_or_else(|e| panic!("flip at {at} in a chunk failed open: {e}"));
        let w = walk(&r);
        let chunk = *chunks.iter().filter(|&&c| c as usize <= at).max().unwrap() as usize;
        let e = w.error.unwrap_or_else(|| panic!("flip at {at} (chunk at {chunk}, byte {}) not caught", at - chunk));
        assert_eq!(e.offset(), Some(chunk as u64), "flip at {at}: {e}");
        let before: Vec<_> = full.records.iter().filter(|r| (r.1 as usize) < chunk).cloned().collect();
        assert_eq!(&w.records[..before.len()], &before[..], "flip at {at}");
        if at - chunk >= size_of::<ChunkHeader>() {
            assert!(matches!(e, CaptureError::BadChunk { problem: ChunkProblem::Crc { .. }, .. }), "flip at {at}: {e}");
        }
    }
}

#[test]
fn bad_magic_is_not_a_capture() {
    let mut b = small_capture();
    b[0..8].copy_from_slice(b"PERFILE2");
    let e = read(&b).unwrap_err();
    assert!(matches!(e, CaptureError::NotACapture { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("not an hrperf capture")
            && msg.contains("PERFILE2")
            && msg.contains("offset 0"),
        "{msg}"
    );
    assert!(matches!(
        read(b"hello").unwrap_err(),
        CaptureError::NotACapture { .. }
    ));
    assert!(matches!(
        read(b"").unwrap_err(),
        CaptureError::BadHeader { .. }
    ));
}

#[test]
fn other_byte_order_is_named() {
    let mut b = small_capture();
    let off = offset_of!(FileHeader, byte_order);
    b[off..off + 4].reverse();
    let e = read(&b).unwrap_err();
    assert!(matches!(e, CaptureError::OtherByteOrder { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("written on a host of the other byte order"),
        "{e}"
    );
}

#[test]
fn future_version_is_refused() {
    let mut b = small_capture();
    let off = offset_of!(FileHeader, version);
    b[off..off + 4].copy_from_slice(&2u32.to_ne_bytes());
    let e = read(&b).unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("newer hrperf"), "{e}");
}

/// A newer writer's longer header: the extra bytes are skipped via header_size.
#[test]
fn longer_header_is_skipped() {
    let b = small_capture();
    let mut longer = b[..192].to_vec();
    longer.extend_from_slice(&[0xee; 16]);
    longer.extend_from_slice(&b[192..]);
    let off = offset_of!(FileHeader, header_size);
    longer[off..off + 4].copy_from_slice(&208u32.to_ne_bytes());
    reseal_header(&mut longer);
    let r = read(&longer).unwrap();
    assert_eq!(r.meta(), &meta());
    let w = walk(&r);
    assert!(w.error.is_none());
    assert_eq!(w.records.len(), 12);
}

fn section_bytes(kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(v.len() + (8 - payload.len() % 8) % 8, 0);
    v
}

/// Inserts `extra` metadata bytes at the end of the metadata (fixing metadata_size).
fn with_extra_section(b: &[u8], extra: &[u8]) -> Vec<u8> {
    let first = chunk_offsets(b)[0] as usize;
    let mut out = b[..first].to_vec();
    out.extend_from_slice(extra);
    out.extend_from_slice(&b[first..]);
    let off = offset_of!(FileHeader, metadata_size);
    let size = u64::from_ne_bytes(out[off..off + 8].try_into().unwrap()) + extra.len() as u64;
    out[off..off + 8].copy_from_slice(&size.to_ne_bytes());
    reseal_header(&mut out);
    out
}

#[test]
fn unknown_sections_are_skipped_with_a_warning() {
    let b = with_extra_section(&small_capture(), &section_bytes(0x77, b"future data"));
    let r = read(&b).unwrap();
    assert_eq!(r.meta(), &meta());
    assert!(matches!(
        r.warnings(),
        [Warning::UnknownSection { kind: 0x77, .. }]
    ));
    assert_eq!(walk(&r).records.len(), 12);
}

#[test]
fn bad_sections_are_errors() {
    let base = small_capture();
    // Duplicate host name.
    let e = read(&with_extra_section(
        &base,
        &section_bytes(SECTION_HOSTNAME, b"again"),
    ))
    .unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::BadSection {
                problem: SectionProblem::Duplicate { .. },
                ..
            }
        ),
        "{e}"
    );
    // A section that claims more than the metadata holds.
    let mut s = section_bytes(0x77, b"12345678");
    s[4..8].copy_from_slice(&64u32.to_ne_bytes());
    let e = read(&with_extra_section(&base, &s)).unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::BadSection {
                problem: SectionProblem::PastEnd { .. },
                ..
            }
        ),
        "{e}"
    );
    let first = chunk_offsets(&base)[0];
    assert_eq!(e.offset(), Some(first), "{e}");
    // Non-zero padding.
    let mut s = section_bytes(0x77, b"123");
    s[12] = 1;
    let e = read(&with_extra_section(&base, &s)).unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::BadSection {
                problem: SectionProblem::Padding,
                ..
            }
        ),
        "{e}"
    );
    const _: () = assert!(size_of::<Section>() == 8);
}

/// Appends a hand-made chunk (correct CRC unless `crc` is given) to a capture that has
/// no END chunk yet.
fn raw_chunk(kind: u32, cpu: u32, payload: &[u8], records: u64, size: Option<u64>) -> Vec<u8> {
    let h = ChunkHeader {
        magic: CHUNK_MAGIC,
        kind,
        cpu,
        flags: 0,
        size: size.unwrap_or(payload.len() as u64),
        records,
        crc32: 0,
        reserved: 0,
    };
    let h = ChunkHeader { crc32: hrperf::capture::chunk_crc(&h, payload), ..h };
    let mut v = zerocopy::IntoBytes::as_bytes(&h).to_vec();
    v.extend_from_slice(payload);
    v
}

/// A capture of two intact chunks (4 + 2 records) without END, and its length.
fn unfinished() -> (Vec<u8>, usize) {
    let mut w = Writer::new(Vec::new(), &meta()).unwrap();
    let (a, n) = samples(0, 0, 4);
    w.write_chunk(0, &a, n).unwrap();
    let (a, n) = samples(1, 0, 2);
    w.write_chunk(1, &a, n).unwrap();
    let off = w.offset() as usize;
    let mut all = w.finish(end_info(6, 0)).unwrap();
    all.truncate(off);
    (all, off)
}

#[test]
fn missing_end_is_a_warning_not_an_error() {
    let (b, _) = unfinished();
    let r = read(&b).unwrap();
    let w = walk(&r);
    assert!(w.error.is_none());
    assert_eq!(w.records.len(), 6);
    assert_eq!(w.warnings, [Warning::NoEndChunk]);
    assert_eq!(
        Warning::NoEndChunk.to_string(),
        "recording did not finish (no end chunk)"
    );
    let scan = r.scan();
    assert!(scan.end.is_none() && scan.error.is_none());
    assert!(scan.warnings.contains(&Warning::NoEndChunk));
}

#[test]
fn chunk_size_past_eof() {
    let (mut b, off) = unfinished();
    b.extend(raw_chunk(
        CHUNK_DATA,
        0,
        &delta_bytes(&sample(0, 9)),
        1,
        Some(1 << 40),
    ));
    let w = walk(&read(&b).unwrap());
    assert_eq!(w.records.len(), 6, "intact chunks still decode");
    let e = w.error.unwrap();
    assert!(
        matches!(e, CaptureError::BadChunk { problem: ChunkProblem::PastEof { size, .. }, .. } if size == 1 << 40),
        "{e}"
    );
    assert_eq!(e.offset(), Some(off as u64));
    assert!(
        e.to_string().contains(&format!("offset {off}")) && e.to_string().contains("test.data"),
        "{e}"
    );
}

#[test]
fn bad_chunk_magic_crc_size() {
    let payload = delta_bytes(&sample(0, 9));
    type Check = fn(&ChunkProblem) -> bool;
    let cases: Vec<(Vec<u8>, Check)> = vec![
        (
            {
                let mut c = raw_chunk(CHUNK_DATA, 0, &payload, 1, None);
                c[0] = b'X';
                c
            },
            |p| matches!(p, ChunkProblem::BadMagic { .. }),
        ),
        (
            {
                let mut c = raw_chunk(CHUNK_DATA, 0, &payload, 1, None);
                c[45] ^= 1;
                c
            },
            |p| matches!(p, ChunkProblem::Crc { .. }),
        ),
        (
            raw_chunk(CHUNK_DATA, 0, &payload, 1, Some(payload.len() as u64 - 4)),
            |p| matches!(p, ChunkProblem::Misaligned { .. }),
        ),
        (raw_chunk(CHUNK_STATS, u32::MAX, &[0u8; 40], 0, None), |p| {
            matches!(p, ChunkProblem::Stats { .. })
        }),
        (raw_chunk(CHUNK_END, u32::MAX, &[0u8; 16], 0, None), |p| {
            matches!(p, ChunkProblem::End { .. })
        }),
        (raw_chunk(CHUNK_DATA, 0, &payload, 2, None), |p| {
            matches!(
                p,
                ChunkProblem::RecordCount {
                    declared: 2,
                    found: 1
                }
            )
        }),
        (
            {
                let mut c = raw_chunk(CHUNK_DATA, 0, &payload, 1, None);
                c[12] = 1;
                c
            },
            |p| matches!(p, ChunkProblem::Reserved { .. }),
        ),
        (
            raw_chunk(CHUNK_DATA, 0, &payload, 1, None)[..20].to_vec(),
            |p| matches!(p, ChunkProblem::Truncated { need: 40, have: 20 }),
        ),
    ];
    for (i, (chunk, want)) in cases.into_iter().enumerate() {
        let (mut b, off) = unfinished();
        b.extend(chunk);
        let w = walk(&read(&b).unwrap());
        assert_eq!(
            w.records.len(),
            6 + (i == 5) as usize,
            "case {i}: intact chunks still decode"
        );
        match w.error {
            Some(CaptureError::BadChunk {
                offset, problem, ..
            }) => {
                assert_eq!(offset, off as u64, "case {i}");
                assert!(want(&problem), "case {i}: {problem}");
            }
            other => panic!("case {i}: {other:?}"),
        }
    }
}

#[test]
fn bad_record_sizes() {
    let good = delta_bytes(&sample(0, 9));
    for (size, want) in [
        (0u16, RecordProblem::TooSmall { size: 0 }),
        (4, RecordProblem::TooSmall { size: 4 }),
        (12, RecordProblem::Misaligned { size: 12 }),
        (63, RecordProblem::Misaligned { size: 63 }),
        (
            4096,
            RecordProblem::PastChunk {
                size: 4096,
                remaining: 64,
            },
        ),
    ] {
        let (mut b, off) = unfinished();
        // A good record, then the bad one (a copy of the good with its size changed).
        let mut payload = good.clone();
        let mut bad = good.clone();
        bad[6..8].copy_from_slice(&size.to_ne_bytes());
        payload.extend(bad);
        b.extend(raw_chunk(CHUNK_DATA, 0, &payload, 2, None));
        let w = walk(&read(&b).unwrap());
        assert_eq!(
            w.records.len(),
            7,
            "size {size}: the intact chunks and the good record decode"
        );
        let e = w.error.unwrap();
        let rec_off = (off + 40 + 64) as u64;
        match &e {
            CaptureError::BadRecord {
                offset,
                chunk,
                problem,
                ..
            } => {
                assert_eq!((*offset, *chunk, *problem), (rec_off, off as u64, want));
            }
            other => panic!("size {size}: {other}"),
        }
        assert!(e.to_string().contains(&format!("offset {rec_off}")), "{e}");
    }
    // A LOST record too short for its count.
    let (mut b, _) = unfinished();
    let mut lost = lost_bytes(3)[..8].to_vec();
    lost[6..8].copy_from_slice(&8u16.to_ne_bytes());
    b.extend(raw_chunk(CHUNK_DATA, 0, &lost, 1, None));
    let scan = read(&b).unwrap().scan();
    assert!(matches!(
        scan.error,
        Some(CaptureError::BadRecord {
            problem: RecordProblem::Lost { size: 8 },
            ..
        })
    ));
    const _: () = assert!(size_of::<RecordHeader>() == 8);
}

#[test]
fn records_over_a_plain_buffer() {
    let (mut a, _) = samples(0, 0, 3);
    a.extend(pad_bytes(24));
    let recs: Vec<_> = hrperf::capture::Records::over(&a)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(recs.len(), 3);
    assert_eq!(recs[1].offset, 64);
    assert_eq!(recs[2].kind(), RecordType::DELTA);
    a.truncate(a.len() - 8);
    let last = hrperf::capture::Records::over(&a).last().unwrap();
    assert!(last.is_err());
}

#[test]
fn scan_aggregates_per_cpu() {
    let bytes = small_capture();
    let scan = read(&bytes).unwrap().scan();
    assert!(scan.error.is_none() && scan.warnings.is_empty());
    assert_eq!(scan.chunks, 5);
    assert_eq!(scan.cpus.len(), 2);
    let c0 = &scan.cpus[0];
    assert_eq!(
        (c0.cpu, c0.chunks, c0.records, c0.lost, c0.drops()),
        (0, 2, 7, 0, 0)
    );
    let c1 = &scan.cpus[1];
    assert_eq!(
        (c1.cpu, c1.chunks, c1.records, c1.lost_records, c1.lost),
        (1, 1, 4, 1, 5)
    );
    // The recorder's count (6) is larger than the in-band LOST count (5).
    assert_eq!(c1.drops(), 6);
    assert_eq!((c1.overflows(), c1.masked(), c1.multi_wraps()), (11, 1, 2));
    assert_eq!(scan.count(RecordType::DELTA), 10);
    assert_eq!(scan.count(RecordType::LOST), 1);
    assert_eq!(scan.count(RecordType(0x1_2345)), 1);
    let t = scan.totals();
    assert_eq!((t.records, t.drops(), t.lost), (11, 6, 5));
    assert_eq!(scan.end, Some(end_info(12, 6)));
}

/// Later STATS chunks replace earlier ones (they are cumulative snapshots).
#[test]
fn last_stats_snapshot_wins() {
    let mut w = Writer::new(Vec::new(), &meta()).unwrap();
    w.write_stats(&[common::stats(0, 1, 1)]).unwrap();
    let (a, n) = samples(0, 0, 2);
    w.write_chunk(0, &a, n).unwrap();
    w.write_stats(&[common::stats(0, 2, 3)]).unwrap();
    let b = w.finish(end_info(2, 3)).unwrap();
    let scan = read(&b).unwrap().scan();
    assert_eq!(scan.cpus[0].stats.unwrap().drops, 3);
    assert_eq!(scan.cpus[0].records_written(), 2);
}

#[test]
fn data_after_end_and_unknown_chunks_warn() {
    let mut b = small_capture();
    b.extend(raw_chunk(0x99, 0, &[0u8; 8], 0, None));
    let w = walk(&read(&b).unwrap());
    assert!(w.error.is_none());
    assert!(w
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::UnknownChunk { kind: 0x99, .. })));
    assert!(w
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::DataAfterEnd { .. })));
}
