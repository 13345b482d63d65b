//! The report of an aggregating-format capture (`hrperf report --format aggregate`).
//!
//! Reads every INTERVAL, STACK and ENTRY record through the format's own parsers
//! ([`hrperf_fmt_aggregate::record`]), and builds:
//!
//! - the **top keys** over all intervals and CPUs, by sample count or by counter sum.
//!   Keys are merged by content: `ip` keys by IP, `pid_ip` by (pid, IP), stack keys by
//!   pid and the frames of their kernel and user stacks (stack ids are only meaningful
//!   within one interval of one CPU, so they are resolved through that interval's STACK
//!   records first; `STACK_ID_NONE` is "no stack", `STACK_ID_LOST` "stack not kept");
//! - the **time series**: one row per drained interval (CPU, seq, start/end, samples,
//!   distinct keys, other, misses, counter sum), ordered by start time.
//!
//! Totals are checked against the conservation invariant per interval
//! (Σcount + other == samples); intervals that break it are counted in
//! [`AggReport::inconsistent`].

use std::collections::HashMap;

use hrperf_abi::capture::CHUNK_DATA;
use hrperf_fmt_aggregate::record::{
    self as agg, IntervalRecord, IV_FL_INCONSISTENT, REC_ENTRY, REC_INTERVAL, REC_STACK, STACK_ID_LOST,
    STACK_ID_NONE,
};

use crate::capture::{CaptureError, Reader};

/// How the top keys are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankBy {
    /// Samples.
    Count,
    /// Sum of the counter's deltas.
    Sum,
}

/// A stack as a report key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StackKey {
    /// No stack (`STACK_ID_NONE`: no stack service, or an empty stack).
    None,
    /// A stack the stack table had no room for (`STACK_ID_LOST`).
    Lost,
    /// An id with no STACK record in its interval (a damaged capture).
    Unknown(u32),
    /// The frames, innermost first.
    Frames(Vec<u64>),
}

/// A key merged over intervals and CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Process id (0 for `ip` keys).
    pub pid: u32,
    /// Instruction pointer (0 for stack keys).
    pub ip: u64,
    /// Kernel stack (stack keys; `None` otherwise).
    pub kstack: StackKey,
    /// User stack.
    pub ustack: StackKey,
}

/// One key's totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRow {
    /// The key.
    pub key: Key,
    /// Samples over all intervals.
    pub count: u64,
    /// Counter deltas over all intervals.
    pub sum: u64,
    /// Interval rows (CPU, seq) it appears in.
    pub intervals: u64,
}

/// One drained interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntervalRow {
    /// The interval record.
    pub iv: IntervalRecord,
    /// ENTRY records read for it (distinct keys).
    pub keys: u64,
    /// Σ of their counts.
    pub count: u64,
}

/// The whole report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AggReport {
    /// `KEY_*` of the capture (of its first interval; 0 if none).
    pub key_kind: u32,
    /// Index of the summed counter.
    pub counter: u32,
    /// Every interval, ordered by start time, then CPU and seq.
    pub intervals: Vec<IntervalRow>,
    /// The top keys, ranked as asked.
    pub top: Vec<KeyRow>,
    /// Distinct keys over the whole capture.
    pub distinct_keys: u64,
    /// Σ interval samples.
    pub samples: u64,
    /// Σ interval counter sums.
    pub sum_total: u64,
    /// Σ other counts.
    pub other_count: u64,
    /// Σ other sums.
    pub other_sum: u64,
    /// Σ misses.
    pub misses: u64,
    /// Intervals flagged inconsistent or whose entries do not add up.
    pub inconsistent: u64,
    /// Records of this format that did not parse.
    pub malformed: u64,
}

/// Why a report cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AggReportError {
    /// Reading the capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The capture holds another format's records.
    #[error("{path} holds '{format}' records; the aggregate report needs a capture recorded with --format aggregate")]
    NotAggregate {
        /// The capture.
        path: String,
        /// Its format.
        format: String,
    },
    /// Stack output was asked of a capture not keyed by stack.
    #[error("{path} is keyed by {key}, not by stack: --folded and --flamegraph need a capture recorded with --agg-key stack")]
    NotStackKeys {
        /// The capture.
        path: String,
        /// Its key kind.
        key: String,
    },
}

/// Builds the report of `reader`'s aggregate records, keeping the `top` keys by `by`.
pub fn report(reader: &Reader, top: usize, by: RankBy) -> Result<AggReport, AggReportError> {
    let meta = reader.meta();
    if meta.format_uuid != hrperf_fmt_aggregate::AGGREGATE_UUID && meta.format_name != hrperf_fmt_aggregate::AGGREGATE_NAME
    {
        return Err(AggReportError::NotAggregate {
            path: reader.path().display().to_string(),
            format: meta.format_name.clone(),
        });
    }
    let mut r = AggReport::default();
    let mut keys: HashMap<Key, KeyRow> = HashMap::new();
    // Stacks of the current (cpu, seq): ids are scoped to one interval of one CPU, and
    // the STACK records of an interval come right after its INTERVAL record.
    let mut stacks: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut cur: Option<(u32, u64)> = None;
    let resolve = |stacks: &HashMap<u32, Vec<u64>>, id: u32| match id {
        STACK_ID_NONE => StackKey::None,
        STACK_ID_LOST => StackKey::Lost,
        id => stacks.get(&id).map_or(StackKey::Unknown(id), |f| StackKey::Frames(f.clone())),
    };
    for chunk in reader.chunks() {
        let chunk = chunk?;
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            let b = rec?.bytes;
            let Ok(h) = agg::header(b) else {
                r.malformed += 1;
                continue;
            };
            if h.kind == REC_INTERVAL {
                let Ok(iv) = agg::parse_interval(b) else {
                    r.malformed += 1;
                    continue;
                };
                if r.intervals.is_empty() {
                    r.key_kind = iv.key_kind;
                    r.counter = iv.counter;
                }
                stacks.clear();
                cur = Some((iv.cpu, iv.seq));
                r.intervals.push(IntervalRow { iv, keys: 0, count: 0 });
            } else if h.kind == REC_STACK {
                let Ok((s, frames)) = agg::parse_stack(b) else {
                    r.malformed += 1;
                    continue;
                };
                if cur == Some((s.cpu, s.seq)) {
                    let f = (0..s.depth as usize).filter_map(|i| agg::frame(frames, i)).collect();
                    stacks.insert(s.stack_id, f);
                }
            } else if h.kind == REC_ENTRY {
                let Ok(e) = agg::parse_entry(b) else {
                    r.malformed += 1;
                    continue;
                };
                let same = cur == Some((e.cpu, e.seq));
                let key = Key {
                    pid: e.pid,
                    ip: e.ip,
                    kstack: if same { resolve(&stacks, e.kstack_id) } else { StackKey::Unknown(e.kstack_id) },
                    ustack: if same { resolve(&stacks, e.ustack_id) } else { StackKey::Unknown(e.ustack_id) },
                };
                let row = keys.entry(key.clone()).or_insert(KeyRow { key, count: 0, sum: 0, intervals: 0 });
                row.count += e.count;
                row.sum = row.sum.wrapping_add(e.sum);
                row.intervals += 1;
                if let Some(iv) = r.intervals.last_mut().filter(|_| same) {
                    iv.keys += 1;
                    iv.count += e.count;
                }
            }
        }
    }
    for row in &r.intervals {
        let iv = &row.iv;
        r.samples += iv.samples;
        r.sum_total = r.sum_total.wrapping_add(iv.sum_total);
        r.other_count += iv.other_count;
        r.other_sum = r.other_sum.wrapping_add(iv.other_sum);
        r.misses += iv.misses;
        if iv.flags & IV_FL_INCONSISTENT != 0 || row.count + iv.other_count != iv.samples || row.keys != iv.entries {
            r.inconsistent += 1;
        }
    }
    r.intervals.sort_by_key(|row| (row.iv.start_ns, row.iv.cpu, row.iv.seq));
    r.distinct_keys = keys.len() as u64;
    let mut rows: Vec<KeyRow> = keys.into_values().collect();
    match by {
        RankBy::Count => rows.sort_by(|a, b| b.count.cmp(&a.count).then(b.sum.cmp(&a.sum)).then(a.key.cmp(&b.key))),
        RankBy::Sum => rows.sort_by(|a, b| b.sum.cmp(&a.sum).then(b.count.cmp(&a.count)).then(a.key.cmp(&b.key))),
    }
    rows.truncate(top);
    r.top = rows;
    Ok(r)
}

/// A symbolized call-stack profile of a stack-keyed (`--agg-key stack`) aggregate
/// capture: every key's kernel and user stacks with its count (or counter sum) as the
/// weight, fed to [`crate::stacks::ProfileBuilder`] with the capture's symbols — so
/// `--folded`, `--flamegraph` and the inclusive/self table work on in-kernel aggregates
/// as on logged stacks (weigh by `WeightBy::Weight`: each key is one record carrying
/// its count or sum as weight). Returns the profile and the samples (or sum) of keys whose
/// stacks were not kept (`STACK_ID_LOST`, damaged ids), which are left out of it.
pub fn stack_profile(
    reader: &Reader,
    by: RankBy,
    options: &crate::stacks::ProfileOptions,
) -> Result<(crate::stacks::Profile, u64), AggReportError> {
    use hrperf_fmt_llc_stack::record::{encode, StackFixed, STK_IMPORTED, STK_KERNEL_IP};
    let r = report(reader, usize::MAX, by)?;
    if r.key_kind != hrperf_fmt_aggregate::record::KEY_STACK && !r.intervals.is_empty() {
        return Err(AggReportError::NotStackKeys {
            path: reader.path().display().to_string(),
            key: hrperf_fmt_aggregate::record::key_name(r.key_kind).to_string(),
        });
    }
    let mut b = crate::stacks::ProfileBuilder::new(options);
    for chunk in reader.chunks() {
        if let Some((kind, pid, text)) = chunk?.symbols() {
            b.add_symbols(kind, pid, text);
        }
    }
    let mut left_out = 0u64;
    let mut rec = Vec::new();
    for row in &r.top {
        let weight = match by {
            RankBy::Count => row.count,
            RankBy::Sum => row.sum,
        };
        let frames = |s: &StackKey| match s {
            StackKey::None => Some(Vec::new()),
            StackKey::Frames(f) => Some(f.clone()),
            StackKey::Lost | StackKey::Unknown(_) => None,
        };
        let (Some(kernel), Some(user)) = (frames(&row.key.kstack), frames(&row.key.ustack)) else {
            left_out = left_out.saturating_add(weight);
            continue;
        };
        if kernel.is_empty() && user.is_empty() {
            left_out = left_out.saturating_add(weight);
            continue;
        }
        let fixed = StackFixed {
            ip: kernel.first().or(user.first()).copied().unwrap_or(0),
            weight,
            pid: row.key.pid,
            flags: STK_IMPORTED | if kernel.is_empty() { 0 } else { STK_KERNEL_IP },
            ..StackFixed::default()
        };
        rec.clear();
        // A key's stacks are at most MAX_STACK_DEPTH (128) frames each: always fits.
        if encode(&mut rec, &fixed, &kernel, &user) {
            b.add_record_bytes(&rec);
        }
    }
    Ok((b.finish(), left_out))
}
