//! A full pass over a capture that counts what it holds, per CPU (for `hrperf info`).

use std::collections::BTreeMap;

use hrperf_abi::capture::{EndInfo, CHUNK_DATA, CHUNK_STATS, CHUNK_SYMBOLS};
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::RecordType;

use super::{CaptureError, Reader, Warning};

/// What one CPU contributed to a capture: records found in its chunks, LOST records, and
/// the last statistics snapshot the recorder wrote for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSummary {
    /// The CPU.
    pub cpu: u32,
    /// DATA chunks.
    pub chunks: u64,
    /// Records found in them, neither `PAD` nor `LOST`.
    pub records: u64,
    /// `LOST` records found.
    pub lost_records: u64,
    /// Sum of their counts: records the buffer said were dropped, in band.
    pub lost: u64,
    /// The last STATS entry for this CPU, if any.
    pub stats: Option<CpuStats>,
}

impl CpuSummary {
    /// Records dropped: the recorder's count if it wrote one, else what LOST records say
    /// (whichever is larger: a drop at the very end has no LOST record after it).
    pub fn drops(&self) -> u64 {
        self.stats.map_or(0, |s| s.drops).max(self.lost)
    }

    /// Overflows (or poll ticks) dispatched, from the statistics.
    pub fn overflows(&self) -> u64 {
        self.stats.map_or(0, |s| s.overflows)
    }

    /// Overflows that arrived while the format had the CPU masked.
    pub fn masked(&self) -> u64 {
        self.stats.map_or(0, |s| s.masked)
    }

    /// Samples flagged as possibly hiding a second counter wrap.
    pub fn multi_wraps(&self) -> u64 {
        self.stats.map_or(0, |s| s.multi_wraps)
    }

    /// Records the kernel/source says it wrote, from the statistics (else those found).
    pub fn records_written(&self) -> u64 {
        self.stats
            .map_or(self.records + self.lost_records, |s| s.records)
    }
}

/// The result of [`Reader::scan`].
#[derive(Debug, Default)]
pub struct Scan {
    /// Intact chunks, all kinds.
    pub chunks: u64,
    /// Payload bytes of intact DATA chunks.
    pub data_bytes: u64,
    /// Per CPU, in CPU order.
    pub cpus: Vec<CpuSummary>,
    /// Records per type (`PAD` excluded), over all CPUs.
    pub record_types: BTreeMap<u32, u64>,
    /// SYMBOLS chunks per `SYM_*` kind: (chunks, text bytes, distinct pids).
    pub symbols: BTreeMap<u32, (u64, u64, u64)>,
    /// The END chunk's information, if the recording finished.
    pub end: Option<EndInfo>,
    /// Header, metadata and chunk warnings.
    pub warnings: Vec<Warning>,
    /// The first damage found; everything above counts only what came before it.
    pub error: Option<CaptureError>,
}

impl Scan {
    /// All CPUs added up (`cpu` is `u32::MAX`; `stats` is the sum, if any CPU had some).
    pub fn totals(&self) -> CpuSummary {
        let mut t = CpuSummary {
            cpu: u32::MAX,
            ..CpuSummary::default()
        };
        for c in &self.cpus {
            t.chunks += c.chunks;
            t.records += c.records;
            t.lost_records += c.lost_records;
            t.lost += c.lost;
            if let Some(s) = c.stats {
                let acc = t.stats.get_or_insert(CpuStats { cpu: u32::MAX, ..CpuStats::default() });
                acc.masked_now += s.masked_now;
                acc.records += s.records;
                acc.drops += s.drops;
                acc.overflows += s.overflows;
                acc.masked += s.masked;
                acc.multi_wraps += s.multi_wraps;
                acc.poll_ticks += s.poll_ticks;
                acc.missed_ticks += s.missed_ticks;
            }
        }
        t
    }

    /// Records of `kind` found.
    pub fn count(&self, kind: RecordType) -> u64 {
        self.record_types.get(&kind.0).copied().unwrap_or(0)
    }
}

impl Reader {
    /// Reads every chunk and record header once (checking CRCs and framing) and counts
    /// what the capture holds. Never fails: damage ends the pass and is in
    /// [`Scan::error`].
    pub fn scan(&self) -> Scan {
        let mut scan = Scan {
            warnings: self.warnings().to_vec(),
            ..Scan::default()
        };
        let mut symbol_pids = std::collections::HashSet::new();
        let mut cpus: BTreeMap<u32, CpuSummary> = self
            .meta()
            .cpus
            .iter()
            .map(|&cpu| {
                (
                    cpu,
                    CpuSummary {
                        cpu,
                        ..CpuSummary::default()
                    },
                )
            })
            .collect();
        let mut chunks = self.chunks();
        'chunks: for chunk in &mut chunks {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    scan.error = Some(e);
                    break;
                }
            };
            scan.chunks += 1;
            match chunk.kind {
                CHUNK_DATA => {
                    scan.data_bytes += chunk.payload.len() as u64;
                    let c = cpus.entry(chunk.cpu).or_insert_with(|| CpuSummary {
                        cpu: chunk.cpu,
                        ..CpuSummary::default()
                    });
                    c.chunks += 1;
                    for rec in chunk.records() {
                        let rec = match rec {
                            Ok(r) => r,
                            Err(e) => {
                                scan.error = Some(e);
                                break 'chunks;
                            }
                        };
                        *scan.record_types.entry(rec.kind().0).or_default() += 1;
                        match rec.lost() {
                            Ok(Some(n)) => {
                                c.lost_records += 1;
                                c.lost += n;
                            }
                            Ok(None) => c.records += 1,
                            Err(problem) => {
                                scan.error = Some(CaptureError::BadRecord {
                                    path: self.path().to_owned(),
                                    offset: rec.offset,
                                    chunk: chunk.offset,
                                    problem,
                                });
                                break 'chunks;
                            }
                        }
                    }
                }
                CHUNK_SYMBOLS => {
                    if let Some((kind, pid, text)) = chunk.symbols() {
                        let e = scan.symbols.entry(kind).or_default();
                        e.0 += 1;
                        e.1 += text.len() as u64;
                        if pid != 0 && symbol_pids.insert((kind, pid)) {
                            e.2 += 1;
                        }
                    }
                }
                CHUNK_STATS => {
                    for s in chunk.stats() {
                        cpus.entry(s.cpu)
                            .or_insert_with(|| CpuSummary {
                                cpu: s.cpu,
                                ..CpuSummary::default()
                            })
                            .stats = Some(s);
                    }
                }
                _ => {}
            }
        }
        scan.end = chunks.end().copied();
        scan.warnings.extend_from_slice(chunks.warnings());
        scan.cpus = cpus.into_values().collect();
        scan
    }
}
