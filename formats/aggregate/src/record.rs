//! The aggregating format's capture records: one drained interval of one CPU is an
//! [`IntervalRecord`], then its stacks ([`StackRecord`], stack keys only), then one
//! [`EntryRecord`] per key. Shared by the drain helper (writer, [`crate::consumer`]) and
//! the decoder plugin (parser).
//!
//! Every record starts with a [`RecordHeader`] whose `kind` is in the format's range
//! ([`RecordType::AGGREGATE_BASE`] + n) and whose `size` covers the whole record; all
//! integers are native-endian, all records 8-byte multiples. Entries and stacks repeat
//! the interval's `cpu` and `seq` (and entries its time bounds), so each record decodes
//! on its own: stack ids are only meaningful within one `(cpu, seq)`.
//!
//! ```text
//! INTERVAL (AGGREGATE_BASE + 0), 128 bytes
//! off  size  field
//!   0     8  RecordHeader { kind, misc: 0, size: 128 }
//!   8     4  cpu
//!  12     4  key_kind        KEY_IP | KEY_PID_IP | KEY_STACK
//!  16     8  seq             interval number on this CPU (1, 2, ...)
//!  24     8  start_ns        the interval's start (see the crate docs)
//!  32     8  end_ns          the interval's end
//!  40     8  samples         samples counted into the interval
//!  48     8  entries         ENTRY records that follow for this interval
//!  56     8  other_count     samples in the "other" bucket (no slot)
//!  64     8  other_sum       their counter deltas
//!  72     8  misses          samples that went to "other" for lack of a slot
//!  80     8  sum_total       all counter deltas of the interval (entries + other)
//!  88     8  stacks          STACK records that follow for this interval
//!  96     8  stack_misses    stacks not stored (stack table full): id STACK_ID_LOST
//! 104     8  stack_truncated stacks cut at the depth limit
//! 112     8  multi_wraps     samples whose delta may hide a counter wrap (lower bound)
//! 120     4  counter         index of the summed counter
//! 124     4  flags           IV_FL_*
//!
//! ENTRY (AGGREGATE_BASE + 1), 80 bytes: one key of one interval
//!   8     4  cpu
//!  12     4  key_kind
//!  16     8  seq
//!  24     8  start_ns
//!  32     8  end_ns
//!  40     4  pid             0 for KEY_IP
//!  44     4  reserved (0)
//!  48     8  ip              0 for KEY_STACK
//!  56     4  kstack_id       KEY_STACK only: STACK_ID_NONE, STACK_ID_LOST or a STACK id
//!  60     4  ustack_id
//!  64     8  count           samples with this key
//!  72     8  sum             their counter deltas
//!
//! STACK (AGGREGATE_BASE + 2), 32 + 8 * depth bytes
//!   8     4  cpu
//!  12     4  stack_id        >= 1, unique within (cpu, seq)
//!  16     8  seq
//!  24     4  depth           frames that follow (1..=MAX_STACK_DEPTH)
//!  28     4  flags           STACK_FL_*
//!  32 8*depth frames         innermost first
//! ```

use hrperf_abi::bytes::{ne32, ne64, put};
use hrperf_abi::record::RecordHeader;
use hrperf_abi::RecordType;

/// Interval header record type.
pub const REC_INTERVAL: RecordType = RecordType(RecordType::AGGREGATE_BASE.0);
/// Entry (one key) record type.
pub const REC_ENTRY: RecordType = RecordType(RecordType::AGGREGATE_BASE.0 + 1);
/// Stack record type.
pub const REC_STACK: RecordType = RecordType(RecordType::AGGREGATE_BASE.0 + 2);

/// Size of an interval record.
pub const INTERVAL_SIZE: usize = 128;
/// Size of an entry record.
pub const ENTRY_SIZE: usize = 80;
/// Size of a stack record's fixed part.
pub const STACK_FIXED_SIZE: usize = 32;
/// Deepest stack a record (and the format) holds.
pub const MAX_STACK_DEPTH: usize = 128;
/// Largest stack record.
pub const MAX_STACK_RECORD_SIZE: usize = stack_record_size(MAX_STACK_DEPTH);

/// Size of a stack record with `depth` frames.
pub const fn stack_record_size(depth: usize) -> usize {
    STACK_FIXED_SIZE + 8 * depth
}

/// Key kind: the interrupted instruction pointer.
pub const KEY_IP: u32 = 1;
/// Key kind: process id and instruction pointer.
pub const KEY_PID_IP: u32 = 2;
/// Key kind: process id, kernel stack id and user stack id.
pub const KEY_STACK: u32 = 3;

/// Stack id: no stack (the service was absent, or the stack was empty).
pub const STACK_ID_NONE: u32 = 0;
/// Stack id: a stack was captured but the stack table had no slot for it.
pub const STACK_ID_LOST: u32 = u32::MAX;

/// [`StackRecord::flags`]: the stack was cut at the depth limit.
pub const STACK_FL_TRUNCATED: u32 = 1 << 0;
/// [`StackRecord::flags`]: a kernel stack (else a user stack).
pub const STACK_FL_KERNEL: u32 = 1 << 1;

/// [`IntervalRecord::flags`]: a sample of the interval found no kernel-stack service.
pub const IV_FL_NO_KSTACK_SERVICE: u32 = 1 << 0;
/// [`IntervalRecord::flags`]: a sample of the interval found no user-stack service.
pub const IV_FL_NO_USTACK_SERVICE: u32 = 1 << 1;
/// [`IntervalRecord::flags`]: closed by the handler at the fill threshold.
pub const IV_FL_CLOSED_AUTO: u32 = 1 << 2;
/// [`IntervalRecord::flags`]: closed by the handler on the consumer's switch request.
pub const IV_FL_CLOSED_REQUEST: u32 = 1 << 3;
/// [`IntervalRecord::flags`]: closed by `restart`.
pub const IV_FL_CLOSED_RESTART: u32 = 1 << 4;
/// [`IntervalRecord::flags`]: the consumer saw slots or stacks it could not make sense
/// of (the table was inconsistent); they were skipped and the totals may disagree.
pub const IV_FL_INCONSISTENT: u32 = 1 << 5;

/// The key kind's name, as reports show it.
pub fn key_name(kind: u32) -> &'static str {
    match kind {
        KEY_IP => "ip",
        KEY_PID_IP => "pid_ip",
        KEY_STACK => "stack",
        _ => "unknown",
    }
}

/// A drained interval's summary (owned copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntervalRecord {
    /// CPU.
    pub cpu: u32,
    /// `KEY_*`.
    pub key_kind: u32,
    /// Interval number on this CPU.
    pub seq: u64,
    /// Start of the interval.
    pub start_ns: u64,
    /// End of the interval.
    pub end_ns: u64,
    /// Samples counted into it.
    pub samples: u64,
    /// Entry records that follow.
    pub entries: u64,
    /// Samples in the "other" bucket.
    pub other_count: u64,
    /// Their counter deltas.
    pub other_sum: u64,
    /// Samples that went to "other" for lack of a slot.
    pub misses: u64,
    /// All counter deltas of the interval.
    pub sum_total: u64,
    /// Stack records that follow.
    pub stacks: u64,
    /// Stacks not stored for lack of a stack-table slot.
    pub stack_misses: u64,
    /// Stacks cut at the depth limit.
    pub stack_truncated: u64,
    /// Samples whose delta may hide a counter wrap.
    pub multi_wraps: u64,
    /// Index of the summed counter.
    pub counter: u32,
    /// `IV_FL_*`.
    pub flags: u32,
}

/// One key of one interval (owned copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryRecord {
    /// CPU.
    pub cpu: u32,
    /// `KEY_*`.
    pub key_kind: u32,
    /// Interval number.
    pub seq: u64,
    /// Interval start.
    pub start_ns: u64,
    /// Interval end.
    pub end_ns: u64,
    /// Process id (0 for [`KEY_IP`]).
    pub pid: u32,
    /// Instruction pointer (0 for [`KEY_STACK`]).
    pub ip: u64,
    /// Kernel stack id ([`KEY_STACK`]).
    pub kstack_id: u32,
    /// User stack id ([`KEY_STACK`]).
    pub ustack_id: u32,
    /// Samples.
    pub count: u64,
    /// Counter deltas summed.
    pub sum: u64,
}

/// A stack record's fixed part; the frames follow it in the record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackRecord {
    /// CPU.
    pub cpu: u32,
    /// Stack id (≥ 1).
    pub stack_id: u32,
    /// Interval number.
    pub seq: u64,
    /// Frames in the record.
    pub depth: u32,
    /// `STACK_FL_*`.
    pub flags: u32,
}

/// Why bytes are not a valid record of this format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// Fewer bytes than the header or the declared size needs.
    Truncated,
    /// The header's type is not the one asked for.
    WrongType(u32),
    /// The declared size disagrees with the kind (or the depth).
    Malformed,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    ne32(b, off).unwrap_or(0)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    ne64(b, off).unwrap_or(0)
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    put(b, off, &v.to_ne_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, &v.to_ne_bytes());
}

/// Reads the record header at the start of `b`.
pub fn header(b: &[u8]) -> Result<RecordHeader, ParseError> {
    if b.len() < 8 {
        return Err(ParseError::Truncated);
    }
    Ok(RecordHeader {
        kind: RecordType(u32_at(b, 0)),
        misc: u16::from_ne_bytes([b[4], b[5]]),
        size: u16::from_ne_bytes([b[6], b[7]]),
    })
}

fn put_header(b: &mut [u8], kind: RecordType, size: usize) {
    put32(b, 0, kind.0);
    if let Some(s) = b.get_mut(4..8) {
        s[0..2].copy_from_slice(&0u16.to_ne_bytes());
        s[2..4].copy_from_slice(&(size as u16).to_ne_bytes());
    }
}

/// Checks the header of `b` against `kind`, and its declared size: exactly `fixed` if
/// `exact`, else at least `fixed`, a multiple of 8, within `b`. Returns that size.
fn check(b: &[u8], kind: RecordType, fixed: usize, exact: bool) -> Result<usize, ParseError> {
    let h = header(b)?;
    if h.kind != kind {
        return Err(ParseError::WrongType(h.kind.0));
    }
    let size = h.size as usize;
    if b.len() < fixed || size > b.len() {
        return Err(ParseError::Truncated);
    }
    if (exact && size != fixed) || size < fixed || size % 8 != 0 {
        return Err(ParseError::Malformed);
    }
    Ok(size)
}

/// Writes an interval record into `out` (at least [`INTERVAL_SIZE`] bytes); returns
/// the bytes written or `None` if `out` is too small.
pub fn write_interval(r: &IntervalRecord, out: &mut [u8]) -> Option<usize> {
    let b = out.get_mut(..INTERVAL_SIZE)?;
    put_header(b, REC_INTERVAL, INTERVAL_SIZE);
    put32(b, 8, r.cpu);
    put32(b, 12, r.key_kind);
    put64(b, 16, r.seq);
    put64(b, 24, r.start_ns);
    put64(b, 32, r.end_ns);
    put64(b, 40, r.samples);
    put64(b, 48, r.entries);
    put64(b, 56, r.other_count);
    put64(b, 64, r.other_sum);
    put64(b, 72, r.misses);
    put64(b, 80, r.sum_total);
    put64(b, 88, r.stacks);
    put64(b, 96, r.stack_misses);
    put64(b, 104, r.stack_truncated);
    put64(b, 112, r.multi_wraps);
    put32(b, 120, r.counter);
    put32(b, 124, r.flags);
    Some(INTERVAL_SIZE)
}

/// Parses an interval record from the start of `b`. Never panics.
pub fn parse_interval(b: &[u8]) -> Result<IntervalRecord, ParseError> {
    check(b, REC_INTERVAL, INTERVAL_SIZE, true)?;
    Ok(IntervalRecord {
        cpu: u32_at(b, 8),
        key_kind: u32_at(b, 12),
        seq: u64_at(b, 16),
        start_ns: u64_at(b, 24),
        end_ns: u64_at(b, 32),
        samples: u64_at(b, 40),
        entries: u64_at(b, 48),
        other_count: u64_at(b, 56),
        other_sum: u64_at(b, 64),
        misses: u64_at(b, 72),
        sum_total: u64_at(b, 80),
        stacks: u64_at(b, 88),
        stack_misses: u64_at(b, 96),
        stack_truncated: u64_at(b, 104),
        multi_wraps: u64_at(b, 112),
        counter: u32_at(b, 120),
        flags: u32_at(b, 124),
    })
}

/// Writes an entry record into `out` (at least [`ENTRY_SIZE`] bytes).
pub fn write_entry(r: &EntryRecord, out: &mut [u8]) -> Option<usize> {
    let b = out.get_mut(..ENTRY_SIZE)?;
    put_header(b, REC_ENTRY, ENTRY_SIZE);
    put32(b, 8, r.cpu);
    put32(b, 12, r.key_kind);
    put64(b, 16, r.seq);
    put64(b, 24, r.start_ns);
    put64(b, 32, r.end_ns);
    put32(b, 40, r.pid);
    put32(b, 44, 0);
    put64(b, 48, r.ip);
    put32(b, 56, r.kstack_id);
    put32(b, 60, r.ustack_id);
    put64(b, 64, r.count);
    put64(b, 72, r.sum);
    Some(ENTRY_SIZE)
}

/// Parses an entry record from the start of `b`. Never panics.
pub fn parse_entry(b: &[u8]) -> Result<EntryRecord, ParseError> {
    check(b, REC_ENTRY, ENTRY_SIZE, true)?;
    Ok(EntryRecord {
        cpu: u32_at(b, 8),
        key_kind: u32_at(b, 12),
        seq: u64_at(b, 16),
        start_ns: u64_at(b, 24),
        end_ns: u64_at(b, 32),
        pid: u32_at(b, 40),
        ip: u64_at(b, 48),
        kstack_id: u32_at(b, 56),
        ustack_id: u32_at(b, 60),
        count: u64_at(b, 64),
        sum: u64_at(b, 72),
    })
}

/// Writes a stack record with `frames` (at most [`MAX_STACK_DEPTH`], at least one)
/// into `out`; `r.depth` is ignored and taken from `frames`. Returns the bytes written.
pub fn write_stack(r: &StackRecord, frames: &[u64], out: &mut [u8]) -> Option<usize> {
    if frames.is_empty() || frames.len() > MAX_STACK_DEPTH {
        return None;
    }
    let size = stack_record_size(frames.len());
    let b = out.get_mut(..size)?;
    put_header(b, REC_STACK, size);
    put32(b, 8, r.cpu);
    put32(b, 12, r.stack_id);
    put64(b, 16, r.seq);
    put32(b, 24, frames.len() as u32);
    put32(b, 28, r.flags);
    for (i, f) in frames.iter().enumerate() {
        put64(b, STACK_FIXED_SIZE + 8 * i, *f);
    }
    Some(size)
}

/// Parses a stack record from the start of `b`: its fixed part and the frame bytes
/// (`8 * depth` bytes, native-endian `u64`s, possibly unaligned). Never panics.
pub fn parse_stack(b: &[u8]) -> Result<(StackRecord, &[u8]), ParseError> {
    let size = check(b, REC_STACK, STACK_FIXED_SIZE, false)?;
    let depth = u32_at(b, 24);
    if depth == 0 || depth as usize > MAX_STACK_DEPTH || size != stack_record_size(depth as usize) {
        return Err(ParseError::Malformed);
    }
    let frames = b.get(STACK_FIXED_SIZE..size).ok_or(ParseError::Truncated)?;
    Ok((
        StackRecord {
            cpu: u32_at(b, 8),
            stack_id: u32_at(b, 12),
            seq: u64_at(b, 16),
            depth,
            flags: u32_at(b, 28),
        },
        frames,
    ))
}

/// Frame `i` of a stack record's frame bytes (from [`parse_stack`]).
pub fn frame(frames: &[u8], i: usize) -> Option<u64> {
    let off = i.checked_mul(8)?;
    let s = frames.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_ne_bytes(a))
}
