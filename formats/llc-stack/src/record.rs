//! The llc-stack format's record layout, shared by the handler (writer), the importers
//! and the decoder. One variable-length record per sample:
//!
//! ```text
//! off  size  field
//!   0     8  RecordHeader { kind: STACK_SAMPLE, misc: MISC_*, size: 80 + 8*(nk+nu) }
//!   8     8  time_ns     in the capture's clock
//!  16     8  ip          interrupted instruction pointer
//!  24     8  addr        data address if the source gives one, else 0
//!  32     8  weight      events this record stands for (the sample period; an
//!                        imported perf sample's period, a stap line's count)
//!  40     4  cpu
//!  44     4  pid         tgid, 0 if unknown
//!  48     4  tid
//!  52     4  flags       STK_*
//!  56     2  nr_kernel   nk
//!  58     2  nr_user     nu
//!  60     4  reserved (0)
//!  64    16  comm        task command name, NUL-padded
//!  80  8*nk  kernel frames, innermost first (the first is `ip` for a kernel sample)
//!  ..  8*nu  user frames, innermost first (the first is the user IP)
//! ```
//!
//! A record's stack, leaf first, is its kernel frames followed by its user frames; a
//! record with neither stands for the single frame `ip`.

use hrperf_abi::bytes::{ne16, ne32, ne64};
use hrperf_abi::record::RecordHeader;
use hrperf_abi::RecordType;

/// Record type of a stack sample.
pub const STACK_SAMPLE: RecordType = RecordType::STACK_BASE;
/// Size of the fixed part of a stack record.
pub const FIXED_SIZE: usize = 80;
/// Frames one record can hold (kernel + user): the record size fits the header's u16.
pub const MAX_FRAMES: usize = (hrperf_engine::ring::MAX_RECORD_SIZE - FIXED_SIZE) / 8;
/// Bytes of the `comm` field.
pub const COMM_LEN: usize = 16;

/// `flags`: the kernel stack was cut at the depth limit.
pub const STK_KERNEL_TRUNCATED: u32 = 1 << 0;
/// `flags`: the user stack was cut at the depth limit.
pub const STK_USER_TRUNCATED: u32 = 1 << 1;
/// `flags`: no kernel stack was captured (not asked for, or no service).
pub const STK_NO_KERNEL_STACK: u32 = 1 << 2;
/// `flags`: no user stack was captured (not asked for, no service, or a kernel thread).
pub const STK_NO_USER_STACK: u32 = 1 << 3;
/// `flags`: `ip` is a kernel address (the source said so).
pub const STK_KERNEL_IP: u32 = 1 << 4;
/// `flags`: the record was written from a perf_event_open sample (PERF_SAMPLE_CALLCHAIN).
pub const STK_PERF_SOURCED: u32 = 1 << 5;
/// `flags`: the record was imported (perf.data or stap output), not recorded.
pub const STK_IMPORTED: u32 = 1 << 6;
/// All defined flags.
pub const STK_ALL: u32 = (1 << 7) - 1;

/// Size of a record holding `frames` frames.
pub const fn record_size(frames: usize) -> usize {
    FIXED_SIZE + 8 * frames
}

/// The fixed fields of a stack record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackFixed {
    /// `MISC_*` bits of the header.
    pub misc: u16,
    /// Timestamp.
    pub time_ns: u64,
    /// Interrupted IP.
    pub ip: u64,
    /// Data address, 0 if none.
    pub addr: u64,
    /// Events this record stands for.
    pub weight: u64,
    /// CPU.
    pub cpu: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `STK_*`.
    pub flags: u32,
    /// Command name, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

impl StackFixed {
    /// The command name up to the first NUL.
    pub fn comm(&self) -> &[u8] {
        hrperf_abi::name_bytes(&self.comm)
    }
}

/// A parsed stack record, borrowing its frames from the bytes it was parsed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackRecord<'a> {
    /// The fixed fields.
    pub fixed: StackFixed,
    nr_kernel: usize,
    nr_user: usize,
    frames: &'a [u8],
}

/// Why bytes are not a valid stack record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// Fewer bytes than the header or the fixed part.
    Short {
        /// Bytes given.
        len: usize,
    },
    /// Not a [`STACK_SAMPLE`] record.
    WrongType(u32),
    /// `size` disagrees with the bytes given or with the frame counts.
    BadSize {
        /// The header's size.
        size: u16,
        /// What the frame counts imply.
        expected: usize,
    },
    /// Undefined flag bits or a non-zero reserved field.
    Reserved,
}

impl core::fmt::Display for ParseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ParseError::Short { len } => write!(f, "stack record of {len} bytes is shorter than its {FIXED_SIZE}-byte fixed part"),
            ParseError::WrongType(t) => write!(f, "record type {t:#x} is not a stack sample ({:#x})", STACK_SAMPLE.0),
            ParseError::BadSize { size, expected } => {
                write!(f, "stack record size {size} does not match its frame counts ({expected} bytes)")
            }
            ParseError::Reserved => f.write_str("stack record has undefined flags or a non-zero reserved field"),
        }
    }
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    ne16(b, off).unwrap_or(0)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    ne32(b, off).unwrap_or(0)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    ne64(b, off).unwrap_or(0)
}

impl<'a> StackRecord<'a> {
    /// Parses one record (header included; `bytes.len()` must equal its size). Never
    /// panics, whatever the bytes.
    pub fn parse(bytes: &'a [u8]) -> Result<StackRecord<'a>, ParseError> {
        if bytes.len() < FIXED_SIZE {
            return Err(ParseError::Short { len: bytes.len() });
        }
        let kind = u32_at(bytes, 0);
        if kind != STACK_SAMPLE.0 {
            return Err(ParseError::WrongType(kind));
        }
        let size = u16_at(bytes, 6);
        let nr_kernel = usize::from(u16_at(bytes, 56));
        let nr_user = usize::from(u16_at(bytes, 58));
        let expected = record_size(nr_kernel + nr_user);
        if usize::from(size) != expected || bytes.len() != expected {
            return Err(ParseError::BadSize { size, expected });
        }
        let flags = u32_at(bytes, 52);
        if flags & !STK_ALL != 0 || u32_at(bytes, 60) != 0 {
            return Err(ParseError::Reserved);
        }
        let mut comm = [0u8; COMM_LEN];
        if let Some(c) = bytes.get(64..80) {
            comm.copy_from_slice(c);
        }
        Ok(StackRecord {
            fixed: StackFixed {
                misc: u16_at(bytes, 4),
                time_ns: u64_at(bytes, 8),
                ip: u64_at(bytes, 16),
                addr: u64_at(bytes, 24),
                weight: u64_at(bytes, 32),
                cpu: u32_at(bytes, 40),
                pid: u32_at(bytes, 44),
                tid: u32_at(bytes, 48),
                flags,
                comm,
            },
            nr_kernel,
            nr_user,
            frames: bytes.get(FIXED_SIZE..).unwrap_or(&[]),
        })
    }

    /// Number of kernel frames.
    pub fn nr_kernel(&self) -> usize {
        self.nr_kernel
    }

    /// Number of user frames.
    pub fn nr_user(&self) -> usize {
        self.nr_user
    }

    /// Kernel frames, innermost first.
    pub fn kernel(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let f = self.frames;
        (0..self.nr_kernel).map(move |i| u64_at(f, 8 * i))
    }

    /// User frames, innermost first.
    pub fn user(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        let f = self.frames;
        let base = self.nr_kernel;
        (0..self.nr_user).map(move |i| u64_at(f, 8 * (base + i)))
    }
}

/// Writes the fixed part of a record into `out[..FIXED_SIZE]` (header included; the
/// record's size is `record_size(nr_kernel + nr_user)`). Returns `false` (writing
/// nothing) if `out` is too short or the frame counts do not fit one record.
pub fn write_fixed(out: &mut [u8], f: &StackFixed, nr_kernel: usize, nr_user: usize) -> bool {
    let frames = nr_kernel + nr_user;
    if frames > MAX_FRAMES || out.len() < FIXED_SIZE {
        return false;
    }
    let header = RecordHeader { kind: STACK_SAMPLE, misc: f.misc, size: record_size(frames) as u16 };
    out[0..4].copy_from_slice(&header.kind.0.to_ne_bytes());
    out[4..6].copy_from_slice(&header.misc.to_ne_bytes());
    out[6..8].copy_from_slice(&header.size.to_ne_bytes());
    write_body(&mut out[8..], f, nr_kernel, nr_user)
}

/// Writes the fixed fields after the header into `body` (a record's bytes from offset
/// 8, as the ring's writer hands them out). Returns `false` (writing nothing) if `body`
/// is shorter than `FIXED_SIZE - 8` or the frame counts do not fit one record.
pub fn write_body(body: &mut [u8], f: &StackFixed, nr_kernel: usize, nr_user: usize) -> bool {
    if nr_kernel + nr_user > MAX_FRAMES || body.len() < FIXED_SIZE - 8 {
        return false;
    }
    let mut put = |off: usize, b: &[u8]| {
        if let Some(d) = body.get_mut(off - 8..off - 8 + b.len()) {
            d.copy_from_slice(b);
        }
    };
    put(8, &f.time_ns.to_ne_bytes());
    put(16, &f.ip.to_ne_bytes());
    put(24, &f.addr.to_ne_bytes());
    put(32, &f.weight.to_ne_bytes());
    put(40, &f.cpu.to_ne_bytes());
    put(44, &f.pid.to_ne_bytes());
    put(48, &f.tid.to_ne_bytes());
    put(52, &f.flags.to_ne_bytes());
    put(56, &(nr_kernel as u16).to_ne_bytes());
    put(58, &(nr_user as u16).to_ne_bytes());
    put(60, &0u32.to_ne_bytes());
    put(64, &f.comm);
    true
}

/// Writes frames (as native-endian u64) into `out`, which must hold them.
pub fn write_frames(out: &mut [u8], frames: impl Iterator<Item = u64>) {
    for (chunk, v) in out.chunks_exact_mut(8).zip(frames) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Appends a whole record to a byte sink (userspace importers and tests); returns
/// `false` if the stacks do not fit one record (cut them first).
pub fn encode(out: &mut impl Extend<u8>, f: &StackFixed, kernel: &[u64], user: &[u64]) -> bool {
    let mut fixed = [0u8; FIXED_SIZE];
    if !write_fixed(&mut fixed, f, kernel.len(), user.len()) {
        return false;
    }
    out.extend(fixed);
    for v in kernel.iter().chain(user) {
        out.extend(v.to_ne_bytes());
    }
    true
}
