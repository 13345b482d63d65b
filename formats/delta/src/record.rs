//! The delta format's record layout, shared by the handler (writer) and the decoder.
//!
//! ```text
//! off  size  field
//!   0     8  RecordHeader { kind: RecordType::DELTA, misc: MISC_*, size: 40 + 8*nr }
//!   8     4  cpu
//!  12     4  pid   (tgid; 0 if unknown)
//!  16     4  tid
//!  20     1  nr            counters that follow (1..=8)
//!  21     1  ovfl_counter  index of the overflowed counter, 0xff for poll/instructed
//!  22     1  multi_wrap    bit i: delta i may hide more than one counter wrap
//!  23     1  reserved (0)
//!  24     8  time_ns       this CPU's own read time, in the capture's clock
//!  32     8  ip            interrupted IP (overflow mode), 0 otherwise
//!  40  8*nr  deltas        64-bit increments since this CPU's previous record
//! ```

use hrperf_abi::record::RecordHeader;
use hrperf_abi::{RecordType, MAX_COUNTERS};

/// Size of the fixed part of a delta record.
pub const FIXED_SIZE: usize = 40;
/// Size of a delta record carrying `nr` counters.
pub const fn record_size(nr: usize) -> usize {
    FIXED_SIZE + 8 * nr
}
/// Largest delta record.
pub const MAX_RECORD_SIZE: usize = record_size(MAX_COUNTERS);
/// `ovfl_counter` value of poll and instructed samples.
pub const NO_OVERFLOW_COUNTER: u8 = 0xff;

/// A decoded delta record (owned copy; decoding never borrows past the call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaSample {
    /// `MISC_*` bits of the header.
    pub misc: u16,
    /// CPU.
    pub cpu: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Overflowed counter, or [`NO_OVERFLOW_COUNTER`].
    pub ovfl_counter: u8,
    /// Per-counter multi-wrap bits.
    pub multi_wrap: u8,
    /// Timestamp.
    pub time_ns: u64,
    /// Instruction pointer.
    pub ip: u64,
    /// Valid entries in `deltas`.
    pub nr: u8,
    /// Counter deltas.
    pub deltas: [u64; MAX_COUNTERS],
}

/// Why bytes are not a valid delta record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// Fewer bytes than the header or the declared size needs.
    Truncated,
    /// The header's type is not [`RecordType::DELTA`].
    WrongType(u32),
    /// `nr` is 0 or above 8, or `size` disagrees with `nr`.
    Malformed,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_ne_bytes(a)
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(a)
}

/// Reads the record header at the start of `b`.
pub fn header(b: &[u8]) -> Result<RecordHeader, ParseError> {
    if b.len() < 8 {
        return Err(ParseError::Truncated);
    }
    Ok(RecordHeader {
        kind: RecordType(u32_at(b, 0)),
        misc: u16_at(b, 4),
        size: u16_at(b, 6),
    })
}

/// Parses a delta record from the start of `b` (which may hold more bytes after it).
/// Never panics: every offset is checked against the declared and the actual size.
pub fn parse(b: &[u8]) -> Result<DeltaSample, ParseError> {
    let h = header(b)?;
    if h.kind != RecordType::DELTA {
        return Err(ParseError::WrongType(h.kind.0));
    }
    if b.len() < FIXED_SIZE || (h.size as usize) > b.len() {
        return Err(ParseError::Truncated);
    }
    let nr = b[20] as usize;
    if nr == 0 || nr > MAX_COUNTERS || h.size as usize != record_size(nr) {
        return Err(ParseError::Malformed);
    }
    let mut deltas = [0u64; MAX_COUNTERS];
    for (i, d) in deltas.iter_mut().enumerate().take(nr) {
        *d = u64_at(b, FIXED_SIZE + 8 * i);
    }
    Ok(DeltaSample {
        misc: h.misc,
        cpu: u32_at(b, 8),
        pid: u32_at(b, 12),
        tid: u32_at(b, 16),
        ovfl_counter: b[21],
        multi_wrap: b[22],
        time_ns: u64_at(b, 24),
        ip: u64_at(b, 32),
        nr: nr as u8,
        deltas,
    })
}

/// Writes `s` as a record into `out` (which must hold `record_size(s.nr)` bytes);
/// returns the bytes written, or `None` if `out` is too small or `s.nr` is invalid.
pub fn write(s: &DeltaSample, out: &mut [u8]) -> Option<usize> {
    let size = record_size(valid_nr(s)?);
    let out = out.get_mut(..size)?;
    let (head, body) = out.split_at_mut(8);
    head[0..4].copy_from_slice(&RecordType::DELTA.0.to_ne_bytes());
    head[4..6].copy_from_slice(&s.misc.to_ne_bytes());
    head[6..8].copy_from_slice(&(size as u16).to_ne_bytes());
    write_body(s, body)
}

/// Writes everything of `s` after the [`RecordHeader`] into `body` (which must hold
/// `record_size(s.nr) - 8` bytes), for writers whose ring writes the header itself.
/// Returns the record size, or `None` if `body` is too small or `s.nr` is invalid.
pub fn write_body(s: &DeltaSample, body: &mut [u8]) -> Option<usize> {
    let size = write_fixed(s, body)?;
    for (i, d) in s.deltas.iter().enumerate().take(s.nr as usize) {
        put_delta(body, i, *d);
    }
    Some(size)
}

/// Writes the fixed fields of `s` (all but the header and the deltas) into `body`, as
/// [`write_body`] does; the deltas follow with [`put_delta`].
pub fn write_fixed(s: &DeltaSample, body: &mut [u8]) -> Option<usize> {
    let size = record_size(valid_nr(s)?);
    if body.len() < size - 8 {
        return None;
    }
    // A fixed-size array: the constant offsets below need no bounds checks.
    let out: &mut [u8; FIXED_SIZE - 8] = body.get_mut(..FIXED_SIZE - 8)?.try_into().ok()?;
    out[0..4].copy_from_slice(&s.cpu.to_ne_bytes());
    out[4..8].copy_from_slice(&s.pid.to_ne_bytes());
    out[8..12].copy_from_slice(&s.tid.to_ne_bytes());
    out[12] = s.nr;
    out[13] = s.ovfl_counter;
    out[14] = s.multi_wrap;
    out[15] = 0;
    out[16..24].copy_from_slice(&s.time_ns.to_ne_bytes());
    out[24..32].copy_from_slice(&s.ip.to_ne_bytes());
    Some(size)
}

/// Writes delta `i` into a record `body` (the bytes after the header); false if it does
/// not fit. One 8-byte store: a bulk copy of a variable length would become a memcpy
/// call, which costs more than the copy at these sizes.
#[inline]
pub fn put_delta(body: &mut [u8], i: usize, delta: u64) -> bool {
    let off = FIXED_SIZE - 8 + 8 * i;
    match body.get_mut(off..off + 8) {
        Some(c) => {
            c.copy_from_slice(&delta.to_ne_bytes());
            true
        }
        None => false,
    }
}

fn valid_nr(s: &DeltaSample) -> Option<usize> {
    let nr = s.nr as usize;
    (1..=MAX_COUNTERS).contains(&nr).then_some(nr)
}
