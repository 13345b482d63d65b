//! The per-CPU buffer and its single-producer record ring.
//!
//! A buffer is a [`BufferHeader`] (128 B, the core's), then format-owned bytes. Ring
//! formats lay it out with [`RingLayout`]:
//!
//! ```text
//! 0    BufferHeader         head/tail/records/drops/... (atomics shared with the reader)
//! 128  ring control (64 B)  producer-private: drops not yet reported by a LOST record
//! 192  format private area  (RingLayout::private_offset, format-defined)
//! ..   data area            data_offset (64-aligned) .. + data_size (a power of two)
//! ```
//!
//! The writer ([`RingWriter`]) only ever writes whole records: when the space left before
//! the end of the data area is too short, it writes a [`RecordType::PAD`] record filling
//! it and continues at offset 0. A record that does not fit is dropped and counted in
//! `BufferHeader::drops`; before the next record that fits, a [`RecordType::LOST`] record
//! ([`LostRecord`]) says how many were dropped since the previous record. `head` is
//! published with release ordering after the record bytes.
//!
//! The reader ([`RingReader`]) loads `head` with acquire ordering, hands every record but
//! PAD from `tail` to `head` to a closure, and publishes the new `tail` with release
//! ordering (or, over a read-only mapping, reports it so the kernel can store it).
//!
//! # Concurrency contract
//!
//! One producer (the CPU's dispatch) and at most one consumer per buffer. The consumer
//! touches only the header (through atomics) and the published bytes `[tail, head)` of
//! the data area; everything else belongs to the producer. Format callbacks other than
//! `handler` (`init`, `restart`, `stop`, `exit`) must not run concurrently with the
//! handler on the same buffer.

use core::marker::PhantomData;
use core::mem::offset_of;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use hrperf_abi::format::Uuid;
use hrperf_abi::record::{LostRecord, RecordHeader};
use hrperf_abi::buffer::{BUFFER_MAGIC, BUFFER_VERSION};
use hrperf_abi::{BufferHeader, RecordType};

use super::error::EngineError;

/// Size of the producer-private ring control block after the header.
pub const RING_CTRL_SIZE: usize = 64;
/// Offset of the ring control block.
pub const RING_CTRL_OFFSET: usize = BufferHeader::SIZE;
/// Where a ring format's private area starts.
pub const PRIVATE_OFFSET: usize = RING_CTRL_OFFSET + RING_CTRL_SIZE;
/// Smallest ring data area.
pub const MIN_DATA_SIZE: u64 = 64;
/// Alignment of the data area (a cache line).
pub const DATA_ALIGN: u64 = 64;
/// Smallest buffer: the header and the ring control block are the core's.
pub const MIN_BUFFER_SIZE: usize = PRIVATE_OFFSET;
/// Largest record (the header's `size` is a `u16`, and records are 8-byte multiples).
pub const MAX_RECORD_SIZE: usize = 0xfff8;

const LOST_SIZE: u64 = core::mem::size_of::<LostRecord>() as u64;
/// The control block's word counting drops not yet reported by a LOST record.
const CTRL_LOST: usize = RING_CTRL_OFFSET;

const OFF_DATA_OFFSET: usize = offset_of!(BufferHeader, data_offset);
const OFF_DATA_SIZE: usize = offset_of!(BufferHeader, data_size);
const OFF_HEAD: usize = offset_of!(BufferHeader, head);
const OFF_TAIL: usize = offset_of!(BufferHeader, tail);
const OFF_RECORDS: usize = offset_of!(BufferHeader, records);
const OFF_DROPS: usize = offset_of!(BufferHeader, drops);
pub(crate) const OFF_OVERFLOWS: usize = offset_of!(BufferHeader, overflows);
pub(crate) const OFF_MASKED: usize = offset_of!(BufferHeader, masked);
pub(crate) const OFF_MULTI_WRAPS: usize = offset_of!(BufferHeader, multi_wraps);
pub(crate) const OFF_NOTIFY_SEQ: usize = offset_of!(BufferHeader, notify_seq);

/// One CPU's buffer: a pointer and a length, as the kernel's `vmalloc` or a userspace
/// `Vec<u64>` provides it.
///
/// Methods taking `&mut self` act as the producer; `&self` methods only use atomics on
/// the header or read published ring bytes, as the consumer may.
///
/// # Invariants
///
/// `ptr` is 8-byte aligned and valid for reads and writes of `len >= MIN_BUFFER_SIZE`
/// initialised bytes for `'a`, and the concurrency contract of the [module](self) holds.
#[derive(Debug)]
pub struct Buffer<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _bytes: PhantomData<&'a mut [u8]>,
}

impl<'a> Buffer<'a> {
    /// Wraps raw memory (the kernel's per-CPU `vmalloc_user` area, or a mapping).
    ///
    /// Fails if `ptr` is not 8-byte aligned or `len` is below [`MIN_BUFFER_SIZE`].
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads and writes of `len` initialised bytes for `'a` (for
    /// reads only if only [`RingReader`] and [`header`](Self::header) are used, as over
    /// a read-only mapping). While any other `Buffer` over the same memory exists, the
    /// two must keep the module's concurrency contract: one producer, one consumer.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize) -> Result<Buffer<'a>, EngineError> {
        if ptr.as_ptr() as usize % 8 != 0 {
            return Err(EngineError::Invalid { what: "buffer is not 8-byte aligned" });
        }
        if len < MIN_BUFFER_SIZE {
            return Err(EngineError::Invalid { what: "buffer is smaller than header + ring control" });
        }
        // INVARIANT: alignment and size checked; validity is the caller's contract.
        Ok(Buffer { ptr, len, _bytes: PhantomData })
    }

    /// Wraps a byte slice; fails unless it is 8-byte aligned and `MIN_BUFFER_SIZE` long.
    pub fn from_slice(bytes: &'a mut [u8]) -> Result<Buffer<'a>, EngineError> {
        let len = bytes.len();
        // SAFETY: the exclusive borrow makes the bytes valid, initialised and ours for 'a.
        unsafe { Self::from_raw(NonNull::from(bytes).cast(), len) }
    }

    /// Wraps a word slice (always aligned); fails unless it is `MIN_BUFFER_SIZE` long.
    pub fn from_words(words: &'a mut [u64]) -> Result<Buffer<'a>, EngineError> {
        let len = core::mem::size_of_val(words);
        // SAFETY: as for `from_slice`; u64s are 8-aligned initialised bytes.
        unsafe { Self::from_raw(NonNull::from(words).cast(), len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer holds at least `MIN_BUFFER_SIZE` bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the buffer, for the producer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The header or ring-control word at `off` (a private constant below
    /// `MIN_BUFFER_SIZE`, 8-aligned), shared with the consumer.
    fn atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off + 8 <= MIN_BUFFER_SIZE <= len` and 8-aligned in an 8-aligned
        // buffer (invariant); every concurrent access to these words is atomic (module
        // contract), and the reference does not outlive the borrow of `self`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast::<u64>()) }
    }

    fn load(&self, off: usize, order: Ordering) -> u64 {
        self.atomic(off).load(order)
    }

    /// Adds one to a producer-owned header counter; only the producer writes it, so a
    /// load and a release store suffice (no locked read-modify-write).
    pub(crate) fn bump(&mut self, off: usize) -> u64 {
        let a = self.atomic(off);
        let v = a.load(Ordering::Relaxed).wrapping_add(1);
        a.store(v, Ordering::Release);
        v
    }

    fn header_u32(&self, off: usize) -> u32 {
        // SAFETY: `off` is a u32 field of the header (in bounds, 4-aligned); these fields
        // are written only before the buffer is shared.
        unsafe { self.ptr.as_ptr().add(off).cast::<u32>().read() }
    }

    /// A snapshot of the header; counters are read atomically, one at a time.
    pub fn header(&self) -> BufferHeader {
        let mut uuid = [0u8; 16];
        // SAFETY: the UUID field lies inside the header; written only before sharing.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset_of!(BufferHeader, format_uuid)),
                uuid.as_mut_ptr(),
                16,
            )
        };
        let a = |off| self.load(off, Ordering::Acquire);
        BufferHeader {
            magic: self.header_u32(offset_of!(BufferHeader, magic)),
            version: self.header_u32(offset_of!(BufferHeader, version)),
            header_size: self.header_u32(offset_of!(BufferHeader, header_size)),
            cpu: self.header_u32(offset_of!(BufferHeader, cpu)),
            format_uuid: Uuid(uuid),
            buf_size: a(offset_of!(BufferHeader, buf_size)),
            data_offset: a(OFF_DATA_OFFSET),
            data_size: a(OFF_DATA_SIZE),
            head: a(OFF_HEAD),
            tail: a(OFF_TAIL),
            records: a(OFF_RECORDS),
            drops: a(OFF_DROPS),
            overflows: a(OFF_OVERFLOWS),
            masked: a(OFF_MASKED),
            multi_wraps: a(OFF_MULTI_WRAPS),
            notify_seq: a(OFF_NOTIFY_SEQ),
            reserved: [0],
        }
    }

    /// Writes a fresh header for `cpu` and `format` (all counters zero, no data area).
    pub(crate) fn init_header(&mut self, cpu: u32, format: Uuid) {
        let h = BufferHeader {
            magic: BUFFER_MAGIC,
            version: BUFFER_VERSION,
            header_size: BufferHeader::SIZE as u32,
            cpu,
            format_uuid: format,
            buf_size: self.len as u64,
            data_offset: 0,
            data_size: 0,
            head: 0,
            tail: 0,
            records: 0,
            drops: 0,
            overflows: 0,
            masked: 0,
            multi_wraps: 0,
            notify_seq: 0,
            reserved: [0],
        };
        // SAFETY: the header fits (invariant) and is aligned; the buffer is not shared
        // with a consumer before init.
        unsafe { self.ptr.as_ptr().cast::<BufferHeader>().write(h) };
    }

    /// `words` u64s of the format's private bytes at `offset`, for the producer.
    ///
    /// `None` unless the range lies after the header, 8-aligned, inside the buffer, and
    /// outside the data area the header describes (which the consumer reads).
    pub fn private_mut(&mut self, offset: usize, words: usize) -> Option<&mut [u64]> {
        let end = words.checked_mul(8).and_then(|b| b.checked_add(offset))?;
        if offset < BufferHeader::SIZE || offset % 8 != 0 || end > self.len {
            return None;
        }
        let data_off = self.load(OFF_DATA_OFFSET, Ordering::Relaxed);
        let data_end = data_off.saturating_add(self.load(OFF_DATA_SIZE, Ordering::Relaxed));
        if (offset as u64) < data_end && data_off < end as u64 {
            return None;
        }
        // SAFETY: in bounds and 8-aligned (checked); outside the header and the data
        // area, so only the producer (`&mut self`) touches these bytes.
        Some(unsafe {
            core::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset).cast::<u64>(), words)
        })
    }
}

/// Where a ring format puts its private area and its ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the format's private area ([`PRIVATE_OFFSET`]).
    pub private_offset: u64,
    /// Bytes of private area asked for.
    pub private_size: u64,
    /// Offset of the ring's data area (64-aligned).
    pub data_offset: u64,
    /// Size of the data area, a power of two.
    pub data_size: u64,
    /// Bytes the whole buffer needs (what `getsize` reports).
    pub buf_size: u64,
}

impl RingLayout {
    /// A layout with `private_size` bytes of private area and a `data_size` ring (a power
    /// of two, at least [`MIN_DATA_SIZE`]).
    pub fn new(private_size: u64, data_size: u64) -> Result<RingLayout, EngineError> {
        if !data_size.is_power_of_two() || data_size < MIN_DATA_SIZE {
            return Err(EngineError::Invalid { what: "ring size must be a power of two >= 64" });
        }
        let too_big = EngineError::Invalid { what: "ring buffer size overflows" };
        let data_offset = (PRIVATE_OFFSET as u64)
            .checked_add(private_size)
            .and_then(|e| e.checked_next_multiple_of(DATA_ALIGN))
            .ok_or(too_big)?;
        let buf_size = data_offset.checked_add(data_size).ok_or(too_big)?;
        Ok(RingLayout {
            private_offset: PRIVATE_OFFSET as u64,
            private_size,
            data_offset,
            data_size,
            buf_size,
        })
    }

    /// Lays the ring out in `buf` (from a format's `init`): sets the header's
    /// `data_offset`, `data_size`, `head` and `tail`, and clears the ring control block.
    pub fn init(&self, buf: &mut Buffer<'_>) -> Result<(), EngineError> {
        let ok = RingLayout::new(self.private_size, self.data_size) == Ok(*self);
        if !ok {
            return Err(EngineError::Invalid { what: "ring layout was not made by RingLayout::new" });
        }
        if (buf.len() as u64) < self.buf_size {
            return Err(EngineError::Invalid { what: "buffer is smaller than the ring layout" });
        }
        let store = |off, v| buf.atomic(off).store(v, Ordering::Relaxed);
        store(OFF_DATA_OFFSET, self.data_offset);
        store(OFF_DATA_SIZE, self.data_size);
        store(OFF_HEAD, 0);
        store(OFF_TAIL, 0);
        for w in (RING_CTRL_OFFSET..PRIVATE_OFFSET).step_by(8) {
            store(w, 0);
        }
        Ok(())
    }
}

/// The data area as the header describes it, validated once per writer or reader.
#[derive(Clone, Copy, Debug)]
struct Ring {
    data: NonNull<u8>,
    offset: u64,
    size: u64,
    mask: u64,
}

impl Ring {
    fn new(buf: &Buffer<'_>) -> Result<Ring, EngineError> {
        let off = buf.load(OFF_DATA_OFFSET, Ordering::Relaxed);
        let size = buf.load(OFF_DATA_SIZE, Ordering::Relaxed);
        let end = off.checked_add(size);
        let fits = end.is_some_and(|e| e <= buf.len() as u64);
        if !size.is_power_of_two() || size < MIN_DATA_SIZE || off % 8 != 0 {
            return Err(EngineError::Invalid { what: "buffer has no ring data area" });
        }
        if off < PRIVATE_OFFSET as u64 || !fits {
            return Err(EngineError::Invalid { what: "ring data area lies outside the buffer" });
        }
        // SAFETY: `off + size <= len` (checked), so the offset is in bounds of the
        // non-null buffer and the result is non-null. (`NonNull::add` needs rustc 1.80.)
        let data = unsafe { NonNull::new_unchecked(buf.ptr.as_ptr().add(off as usize)) };
        Ok(Ring { data, offset: off, size, mask: size - 1 })
    }

    /// Pointer to the byte at monotonic position `pos`.
    fn at(&self, pos: u64) -> *mut u8 {
        // SAFETY: `pos & mask < size`, inside the data area.
        unsafe { self.data.as_ptr().add((pos & self.mask) as usize) }
    }

    /// Where a piece of `n` bytes starting at `pos` goes: it pads to the start of the
    /// data area if it would cross the end. Returns (pad bytes, start of the piece).
    fn place(&self, pos: u64, n: u64) -> (u64, u64) {
        let to_end = self.size - (pos & self.mask);
        if n > to_end {
            (to_end, pos + to_end)
        } else {
            (0, pos)
        }
    }

    /// Writes a record header at `pos`.
    ///
    /// # Safety
    ///
    /// `pos` is 8-aligned, the 8 bytes there are unpublished and the producer's.
    unsafe fn put_header(&self, pos: u64, kind: RecordType, misc: u16, size: u64) {
        let h = RecordHeader { kind, misc, size: size as u16 };
        // SAFETY: the caller's contract; data area and pos are 8-aligned, so the header
        // (align 4) is aligned, and 8 bytes fit before the end of the data area.
        unsafe { self.at(pos).cast::<RecordHeader>().write(h) };
    }
}

/// Why a record was not written. Either way it was counted in `drops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteError {
    /// Not enough free space in the ring.
    Full,
    /// The record's size is not a multiple of 8 in `8..=MAX_RECORD_SIZE` that fits the
    /// data area (or its header disagrees with its length).
    BadSize,
}

/// The producer side of a buffer's ring.
#[derive(Debug)]
pub struct RingWriter<'b, 'a> {
    buf: &'b mut Buffer<'a>,
    ring: Ring,
}

impl<'b, 'a> RingWriter<'b, 'a> {
    /// A writer over the ring that `RingLayout::init` set up in `buf`.
    #[inline]
    pub fn new(buf: &'b mut Buffer<'a>) -> Result<RingWriter<'b, 'a>, EngineError> {
        let ring = Ring::new(buf)?;
        Ok(RingWriter { buf, ring })
    }

    /// Size of the data area.
    pub fn data_size(&self) -> u64 {
        self.ring.size
    }

    /// Bytes written and not yet consumed (the whole area if `tail` is corrupt).
    pub fn used(&self) -> u64 {
        let head = self.buf.load(OFF_HEAD, Ordering::Relaxed);
        let tail = self.buf.load(OFF_TAIL, Ordering::Acquire);
        head.wrapping_sub(tail).min(self.ring.size)
    }

    /// Drops not yet reported by a LOST record.
    pub fn pending_lost(&self) -> u64 {
        self.buf.load(CTRL_LOST, Ordering::Relaxed)
    }

    /// `N` u64s of the format's private area at `offset` (in
    /// `PRIVATE_OFFSET..data_offset`, 8-aligned), like [`Buffer::private_mut`] but
    /// against the layout this writer already validated, and as an array so that
    /// constant indices need no bounds checks.
    #[inline]
    pub fn private_mut<const N: usize>(&mut self, offset: usize) -> Option<&mut [u64; N]> {
        let end = N.checked_mul(8).and_then(|b| b.checked_add(offset))?;
        if offset < PRIVATE_OFFSET || offset % 8 != 0 || end as u64 > self.ring.offset {
            return None;
        }
        // SAFETY: 8-aligned, after the ring control block and before the data area,
        // which lies inside the buffer (validated in `Ring::new`): producer-only bytes,
        // borrowed through `&mut self`.
        Some(unsafe { &mut *self.buf.ptr.as_ptr().add(offset).cast::<[u64; N]>() })
    }

    /// Writes a record of `size` bytes (header included): the header `{kind, misc,
    /// size}` is written here, `fill` writes the `size - 8` payload bytes.
    ///
    /// On failure the record is counted in `drops` and reported by the LOST record that
    /// precedes the next one written; `fill` is not called.
    #[inline]
    pub fn write_with<F: FnOnce(&mut [u8])>(
        &mut self,
        kind: RecordType,
        misc: u16,
        size: usize,
        fill: F,
    ) -> Result<(), WriteError> {
        self.write_upto(kind, size, |p| {
            fill(p);
            (size, misc)
        })
    }

    /// Writes a record of at most `max_size` bytes whose final size is known only once
    /// it is filled (a variable-length stack captured straight into the ring): the
    /// space is reserved for `max_size` (so a record is dropped when `max_size` does not
    /// fit), `fill` writes up to `max_size - 8` payload bytes and returns the record's
    /// real `(size, misc)`; `size` is clamped to `8..=max_size` and rounded up to 8.
    /// Only the real size is published.
    #[inline]
    pub fn write_upto<F: FnOnce(&mut [u8]) -> (usize, u16)>(
        &mut self,
        kind: RecordType,
        max_size: usize,
        fill: F,
    ) -> Result<(), WriteError> {
        let size = max_size;
        let size64 = size as u64;
        if size < 8 || size % 8 != 0 || size > MAX_RECORD_SIZE || size64 > self.ring.size {
            self.drop_one();
            return Err(WriteError::BadSize);
        }
        let head = self.buf.load(OFF_HEAD, Ordering::Relaxed);
        let tail = self.buf.load(OFF_TAIL, Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        let lost = self.pending_lost();

        // Plan every piece first, so that a record that does not fit writes nothing.
        let mut pos = head;
        let mut lost_at = None;
        let mut pads = [(0u64, 0u64); 2];
        if lost > 0 {
            let (pad, at) = self.ring.place(pos, LOST_SIZE);
            pads[0] = (pad, pos);
            lost_at = Some(at);
            pos = at + LOST_SIZE;
        }
        let (pad, at) = self.ring.place(pos, size64);
        pads[1] = (pad, pos);
        let end = at + size64;
        // `used > size` means a corrupt tail: treat as full rather than overwrite.
        if used > self.ring.size || end - head > self.ring.size - used {
            self.drop_one();
            return Err(WriteError::Full);
        }

        // SAFETY (all blocks below): every position lies in [head, end), which is free
        // (end - head <= size - used) and so unpublished and the producer's; positions
        // are 8-aligned because head, record sizes and pads are multiples of 8.
        for (pad, from) in pads {
            if pad > 0 {
                // SAFETY: see above; pad < the piece after it <= MAX_RECORD_SIZE fits u16.
                unsafe { self.ring.put_header(from, RecordType::PAD, 0, pad) };
            }
        }
        if let Some(at) = lost_at {
            let rec = LostRecord {
                header: RecordHeader { kind: RecordType::LOST, misc: 0, size: LOST_SIZE as u16 },
                lost,
            };
            // SAFETY: see above; 16 bytes fit (placed), 8-aligned.
            unsafe { self.ring.at(at).cast::<LostRecord>().write(rec) };
        }
        // SAFETY: see above; the payload [at + 8, at + size) is inside the data area
        // (placed without crossing its end) and nobody else references it.
        let payload = unsafe { core::slice::from_raw_parts_mut(self.ring.at(at).add(8), size - 8) };
        let (real, misc) = fill(payload);
        let real = (real.max(8).min(size).wrapping_add(7) & !7) as u64;
        // SAFETY: see above.
        unsafe { self.ring.put_header(at, kind, misc, real) };

        if lost > 0 {
            self.buf.atomic(CTRL_LOST).store(0, Ordering::Relaxed);
        }
        self.buf.bump(OFF_RECORDS);
        self.buf.atomic(OFF_HEAD).store(at + real, Ordering::Release);
        Ok(())
    }

    /// Writes a complete record (header included); its header's `size` must equal
    /// `record.len()`.
    pub fn write(&mut self, record: &[u8]) -> Result<(), WriteError> {
        let h = match record.get(..8) {
            Some(b) => RecordHeader {
                kind: RecordType(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
                misc: u16::from_ne_bytes([b[4], b[5]]),
                size: u16::from_ne_bytes([b[6], b[7]]),
            },
            None => {
                self.drop_one();
                return Err(WriteError::BadSize);
            }
        };
        if h.size as usize != record.len() {
            self.drop_one();
            return Err(WriteError::BadSize);
        }
        let body = record.get(8..).unwrap_or(&[]);
        self.write_with(h.kind, h.misc, record.len(), |p| p.copy_from_slice(body))
    }

    /// Writes a LOST record for drops not yet reported, if any and if it fits (e.g. when
    /// the session stops, so the stream ends with the gap marked). Returns whether no
    /// drop is left unreported.
    pub fn flush_lost(&mut self) -> bool {
        let lost = self.pending_lost();
        if lost == 0 {
            return true;
        }
        let head = self.buf.load(OFF_HEAD, Ordering::Relaxed);
        let tail = self.buf.load(OFF_TAIL, Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        let (pad, at) = self.ring.place(head, LOST_SIZE);
        let end = at + LOST_SIZE;
        if used > self.ring.size || end - head > self.ring.size - used {
            return false;
        }
        if pad > 0 {
            // SAFETY: as in `write_with`: [head, end) is free and the producer's.
            unsafe { self.ring.put_header(head, RecordType::PAD, 0, pad) };
        }
        let rec = LostRecord {
            header: RecordHeader { kind: RecordType::LOST, misc: 0, size: LOST_SIZE as u16 },
            lost,
        };
        // SAFETY: as above.
        unsafe { self.ring.at(at).cast::<LostRecord>().write(rec) };
        self.buf.atomic(CTRL_LOST).store(0, Ordering::Relaxed);
        self.buf.atomic(OFF_HEAD).store(end, Ordering::Release);
        true
    }

    fn drop_one(&mut self) {
        self.buf.bump(OFF_DROPS);
        let lost = self.buf.atomic(CTRL_LOST);
        lost.store(lost.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }
}

/// What one [`RingReader::read`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Records handed to the closure (LOST records included, PAD not).
    pub records: u64,
    /// Bytes advanced over, PAD included.
    pub bytes: u64,
    /// Sum of the `lost` counts of the LOST records seen.
    pub lost: u64,
    /// The position after the last record read: the new `tail`.
    pub tail: u64,
}

/// The consumer side of a buffer's ring.
#[derive(Debug)]
pub struct RingReader<'b, 'a> {
    buf: &'b Buffer<'a>,
    ring: Ring,
}

impl<'b, 'a> RingReader<'b, 'a> {
    /// A reader over the ring described by `buf`'s header.
    pub fn new(buf: &'b Buffer<'a>) -> Result<RingReader<'b, 'a>, EngineError> {
        let ring = Ring::new(buf)?;
        Ok(RingReader { buf, ring })
    }

    /// Size of the data area.
    pub fn data_size(&self) -> u64 {
        self.ring.size
    }

    /// Bytes published and not yet consumed.
    pub fn available(&self) -> u64 {
        let head = self.buf.load(OFF_HEAD, Ordering::Acquire);
        head.wrapping_sub(self.buf.load(OFF_TAIL, Ordering::Relaxed))
    }

    /// Drops the producer has not yet reported by a LOST record.
    pub fn pending_lost(&self) -> u64 {
        self.buf.load(CTRL_LOST, Ordering::Relaxed)
    }

    /// Hands each record in `[tail, head)` (PAD skipped) to `f`, oldest first, without
    /// publishing anything: over a read-only mapping, pass the returned
    /// [`ReadStats::tail`] to the kernel (`HRPERF_IOC_CONSUME`).
    ///
    /// A malformed record (size not a multiple of 8 in range, or crossing the end of the
    /// data area or `head`) ends the read with an error; the stats of what was read
    /// before it are lost with it, so use [`drain`](Self::drain) to get past it.
    pub fn read<F: FnMut(&[u8])>(&self, mut f: F) -> Result<ReadStats, EngineError> {
        let head = self.buf.load(OFF_HEAD, Ordering::Acquire);
        let tail = self.buf.load(OFF_TAIL, Ordering::Relaxed);
        let mut st = ReadStats { tail, ..ReadStats::default() };
        let corrupt = Err(EngineError::Invalid { what: "corrupt record in ring buffer" });
        if head.wrapping_sub(tail) > self.ring.size || tail % 8 != 0 {
            return corrupt;
        }
        let mut pos = tail;
        while pos != head {
            let off = pos & self.ring.mask;
            // SAFETY: `pos` is in [tail, head), published by the producer's release store
            // of `head` that the acquire load above synchronises with; 8 bytes from an
            // 8-aligned offset of a power-of-two area >= 64 lie inside it.
            let h = unsafe { self.ring.at(pos).cast::<RecordHeader>().read() };
            let size = h.size as u64;
            if size < 8 || size % 8 != 0 || off + size > self.ring.size || size > head - pos {
                return corrupt;
            }
            if h.kind != RecordType::PAD {
                // SAFETY: [pos, pos + size) is published (checked against head) and inside
                // the data area (checked against its end); the producer does not write
                // it until the tail passes it.
                let rec = unsafe { core::slice::from_raw_parts(self.ring.at(pos), size as usize) };
                if h.kind == RecordType::LOST {
                    if let Some(b) = rec.get(8..16) {
                        let mut w = [0u8; 8];
                        w.copy_from_slice(b);
                        st.lost = st.lost.wrapping_add(u64::from_ne_bytes(w));
                    }
                }
                st.records += 1;
                f(rec);
            }
            pos += size;
            st.bytes += size;
        }
        st.tail = pos;
        Ok(st)
    }

    /// Publishes that everything before `tail` was consumed (release store). `tail` must
    /// lie between the current tail and `head`, on a record boundary the reader found.
    pub fn consume(&self, tail: u64) -> Result<(), EngineError> {
        let head = self.buf.load(OFF_HEAD, Ordering::Acquire);
        let old = self.buf.load(OFF_TAIL, Ordering::Relaxed);
        if tail.wrapping_sub(old) > head.wrapping_sub(old) || tail % 8 != 0 {
            return Err(EngineError::Invalid { what: "consumed position is outside [tail, head]" });
        }
        self.buf.atomic(OFF_TAIL).store(tail, Ordering::Release);
        Ok(())
    }

    /// [`read`](Self::read) then [`consume`](Self::consume): the in-process drain. On a
    /// malformed record everything up to `head` is discarded (so the producer can go on)
    /// and the error returned.
    pub fn drain<F: FnMut(&[u8])>(&self, f: F) -> Result<ReadStats, EngineError> {
        match self.read(f) {
            Ok(st) => {
                self.buf.atomic(OFF_TAIL).store(st.tail, Ordering::Release);
                Ok(st)
            }
            Err(e) => {
                let head = self.buf.load(OFF_HEAD, Ordering::Acquire);
                self.buf.atomic(OFF_TAIL).store(head, Ordering::Release);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;

    const KIND: RecordType = RecordType(0x1_0000);

    fn words_for(layout: &RingLayout) -> Vec<u64> {
        vec![0u64; layout.buf_size as usize / 8]
    }

    fn setup<'a>(words: &'a mut [u64], layout: &RingLayout) -> Buffer<'a> {
        let mut buf = Buffer::from_words(words).unwrap();
        buf.init_header(3, Uuid([1; 16]));
        layout.init(&mut buf).unwrap();
        buf
    }

    /// Writes a record of `size` bytes whose payload starts with `seq`.
    fn put(buf: &mut Buffer<'_>, size: usize, seq: u64) -> Result<(), WriteError> {
        RingWriter::new(buf).unwrap().write_with(KIND, 7, size, |p| {
            p[..8].copy_from_slice(&seq.to_ne_bytes());
            for b in &mut p[8..] {
                *b = seq as u8;
            }
        })
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Rec {
        Data { seq: u64, size: usize },
        Lost(u64),
    }

    fn parse(rec: &[u8]) -> Rec {
        let kind = u32::from_ne_bytes(rec[0..4].try_into().unwrap());
        let size = u16::from_ne_bytes(rec[6..8].try_into().unwrap()) as usize;
        assert_eq!(size, rec.len());
        let word = u64::from_ne_bytes(rec[8..16].try_into().unwrap());
        match RecordType(kind) {
            RecordType::LOST => {
                assert_eq!(size, 16);
                Rec::Lost(word)
            }
            KIND => {
                assert_eq!(u16::from_ne_bytes(rec[4..6].try_into().unwrap()), 7);
                assert!(rec[16..].iter().all(|&b| b == word as u8));
                Rec::Data { seq: word, size }
            }
            k => panic!("unexpected record kind {k:?}"),
        }
    }

    fn drain_all(buf: &Buffer<'_>) -> (Vec<Rec>, ReadStats) {
        let mut out = Vec::new();
        let st = RingReader::new(buf).unwrap().drain(|r| out.push(parse(r))).unwrap();
        (out, st)
    }

    #[test]
    fn buffer_constructors() {
        let mut words = vec![0u64; 64];
        let bytes: &mut [u8] = bytemuck_bytes(&mut words);
        assert!(Buffer::from_slice(&mut bytes[1..257]).is_err());
        assert!(Buffer::from_slice(&mut bytes[..MIN_BUFFER_SIZE - 8]).is_err());
        let b = Buffer::from_slice(&mut bytes[8..8 + MIN_BUFFER_SIZE]).unwrap();
        assert_eq!(b.len(), MIN_BUFFER_SIZE);
        assert!(!b.is_empty());
        let mut small = vec![0u64; MIN_BUFFER_SIZE / 8 - 1];
        assert!(Buffer::from_words(&mut small).is_err());
    }

    fn bytemuck_bytes(words: &mut [u64]) -> &mut [u8] {
        let len = core::mem::size_of_val(words);
        // SAFETY: u64s are plain bytes; the borrow is carried over.
        unsafe { core::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
    }

    #[test]
    fn layout_rules() {
        let l = RingLayout::new(80, 4096).unwrap();
        assert_eq!(l.private_offset, 192);
        assert_eq!(l.data_offset, 320);
        assert_eq!(l.buf_size, 320 + 4096);
        assert_eq!(RingLayout::new(0, 64).unwrap().data_offset, 192);
        assert!(RingLayout::new(0, 32).is_err());
        assert!(RingLayout::new(0, 100).is_err());
        assert!(RingLayout::new(u64::MAX - 100, 64).is_err());
        // A buffer smaller than the layout is refused.
        let mut words = vec![0u64; 40];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        assert!(l.init(&mut buf).is_err());
        // No ring set up: writer and reader refuse.
        assert!(RingWriter::new(&mut buf).is_err());
        assert!(RingReader::new(&buf).is_err());
    }

    #[test]
    fn header_fields_and_private_area() {
        let l = RingLayout::new(16, 64).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        let h = buf.header();
        assert_eq!((h.magic, h.version, h.header_size, h.cpu), (BUFFER_MAGIC, 1, 128, 3));
        assert_eq!(h.format_uuid, Uuid([1; 16]));
        assert_eq!((h.buf_size, h.data_offset, h.data_size), (l.buf_size, 256, 64));
        let p = buf.private_mut(PRIVATE_OFFSET, 2).unwrap();
        p[1] = 42;
        assert_eq!(buf.private_mut(PRIVATE_OFFSET + 8, 1).unwrap()[0], 42);
        assert!(buf.private_mut(64, 1).is_none(), "header");
        assert!(buf.private_mut(PRIVATE_OFFSET + 4, 1).is_none(), "unaligned");
        assert!(buf.private_mut(248, 2).is_none(), "overlaps the data area");
        assert!(buf.private_mut(l.buf_size as usize, 1).is_none(), "past the end");
        assert!(buf.private_mut(PRIVATE_OFFSET, usize::MAX).is_none(), "overflow");
    }

    #[test]
    fn writer_private_area() {
        let l = RingLayout::new(16, 64).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        let mut wr = RingWriter::new(&mut buf).unwrap();
        wr.private_mut::<2>(PRIVATE_OFFSET).unwrap()[1] = 7;
        assert_eq!(wr.private_mut::<1>(PRIVATE_OFFSET + 8).unwrap(), &[7]);
        assert!(wr.private_mut::<1>(RING_CTRL_OFFSET).is_none(), "ring control");
        assert!(wr.private_mut::<1>(PRIVATE_OFFSET + 4).is_none(), "unaligned");
        assert!(wr.private_mut::<9>(PRIVATE_OFFSET).is_none(), "into the data area");
        assert!(wr.private_mut::<1>(usize::MAX - 4).is_none(), "overflow");
        assert_eq!(wr.private_mut::<8>(PRIVATE_OFFSET).unwrap().len(), 8);
    }

    #[test]
    fn drops_counted_exactly_and_lost_record_written() {
        // 64-byte ring, 24-byte records: two fit (48 bytes), the rest are dropped.
        let l = RingLayout::new(0, 64).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        let mut ok = 0;
        for seq in 0..10 {
            match put(&mut buf, 24, seq) {
                Ok(()) => ok += 1,
                Err(e) => assert_eq!(e, WriteError::Full),
            }
        }
        assert_eq!(ok, 2);
        let h = buf.header();
        assert_eq!((h.records, h.drops), (2, 8), "drops == injected excess");
        assert_eq!(RingWriter::new(&mut buf).unwrap().pending_lost(), 8);
        let (recs, st) = drain_all(&buf);
        assert_eq!(recs, [Rec::Data { seq: 0, size: 24 }, Rec::Data { seq: 1, size: 24 }]);
        assert_eq!((st.records, st.bytes, st.tail, st.lost), (2, 48, 48, 0));
        // Next record: LOST(16) first. At offset 48 LOST fits exactly (16 bytes to the
        // end), the record goes to offset 0.
        put(&mut buf, 24, 100).unwrap();
        let (recs, st) = drain_all(&buf);
        assert_eq!(recs, [Rec::Lost(8), Rec::Data { seq: 100, size: 24 }]);
        assert_eq!((st.records, st.bytes, st.lost, st.tail), (2, 40, 8, 88));
        let h = buf.header();
        assert_eq!((h.records, h.drops, h.head, h.tail), (3, 8, 88, 88));
        assert_eq!(RingReader::new(&buf).unwrap().pending_lost(), 0);
    }

    #[test]
    fn wrap_around_with_pad() {
        let l = RingLayout::new(0, 64).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        put(&mut buf, 24, 1).unwrap();
        put(&mut buf, 24, 2).unwrap();
        assert_eq!(drain_all(&buf).0.len(), 2);
        // 16 bytes left before the end: a PAD fills them, the record goes to offset 0.
        put(&mut buf, 24, 3).unwrap();
        assert_eq!(buf.header().head, 48 + 16 + 24);
        // The PAD header is really there, at data offset 48.
        let data = l.data_offset as usize;
        let raw = bytemuck_bytes(&mut w[..]);
        assert_eq!(&raw[data + 48..data + 52], &0u32.to_ne_bytes());
        assert_eq!(&raw[data + 54..data + 56], &16u16.to_ne_bytes());
        let mut buf = Buffer::from_words(&mut w).unwrap();
        let (recs, st) = drain_all(&buf);
        assert_eq!(recs, [Rec::Data { seq: 3, size: 24 }]);
        assert_eq!((st.records, st.bytes), (1, 40));
        // A record as large as the whole area fits only into an empty, aligned ring.
        put(&mut buf, 40, 4).unwrap();
        assert_eq!(put(&mut buf, 64, 5), Err(WriteError::Full));
        drain_all(&buf);
        // Head is at 128 (offset 0): the full-size record fits after the LOST record? No:
        // LOST (16) + 64 > 64, so it is dropped again, and stays pending.
        assert_eq!(put(&mut buf, 64, 6), Err(WriteError::Full));
        assert_eq!(RingWriter::new(&mut buf).unwrap().pending_lost(), 2);
        put(&mut buf, 16, 7).unwrap();
        let (recs, _) = drain_all(&buf);
        assert_eq!(recs, [Rec::Lost(2), Rec::Data { seq: 7, size: 16 }]);
    }

    #[test]
    fn bad_sizes_are_counted_drops() {
        let l = RingLayout::new(0, 128).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        let mut wr = RingWriter::new(&mut buf).unwrap();
        assert_eq!(wr.write(&[1, 2, 3]), Err(WriteError::BadSize));
        // Header says 16 bytes, slice has 24.
        let mut rec = [0u8; 24];
        rec[6..8].copy_from_slice(&16u16.to_ne_bytes());
        assert_eq!(wr.write(&rec), Err(WriteError::BadSize));
        rec[0..4].copy_from_slice(&KIND.0.to_ne_bytes());
        rec[4..6].copy_from_slice(&7u16.to_ne_bytes());
        rec[6..8].copy_from_slice(&24u16.to_ne_bytes());
        rec[8..16].copy_from_slice(&9u64.to_ne_bytes());
        rec[16..].fill(9);
        wr.write(&rec).unwrap();
        let h = buf.header();
        assert_eq!((h.records, h.drops), (1, 2));
        let (recs, _) = drain_all(&buf);
        assert_eq!(recs, [Rec::Lost(2), Rec::Data { seq: 9, size: 24 }]);
    }

    #[test]
    fn put_checks_sizes_directly() {
        let l = RingLayout::new(0, 128).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        let mut wr = RingWriter::new(&mut buf).unwrap();
        let mut called = false;
        for size in [0, 4, 12, 136, 0x1_0000] {
            assert_eq!(wr.write_with(KIND, 0, size, |_| called = true), Err(WriteError::BadSize));
        }
        assert!(!called);
        assert_eq!(wr.write_with(KIND, 0, 8, |p| assert!(p.is_empty())), Ok(()));
        assert_eq!(buf.header().drops, 5);
    }

    /// A long run against a model: every record is read once, in order, and every gap in
    /// the sequence is announced by a LOST record with exactly its size.
    #[test]
    fn model_check_long_run() {
        let l = RingLayout::new(0, 256).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut written, mut dropped) = (0u64, 0u64);
        let mut expect_seq = 0u64;
        let mut pending_gap = 0u64;
        let mut seen_lost = 0u64;
        let mut pads = 0u64;
        for seq in 0..20_000u64 {
            let size = 16 + 8 * (next() % 7) as usize;
            match put(&mut buf, size, seq) {
                Ok(()) => written += 1,
                Err(e) => {
                    assert_eq!(e, WriteError::Full);
                    dropped += 1;
                }
            }
            if next() % 5 == 0 {
                let mut recs = Vec::new();
                let st = RingReader::new(&buf).unwrap().drain(|r| recs.push(parse(r))).unwrap();
                let data_bytes: u64 = recs
                    .iter()
                    .map(|r| match r {
                        Rec::Data { size, .. } => *size as u64,
                        Rec::Lost(_) => 16,
                    })
                    .sum();
                pads += st.bytes - data_bytes;
                for r in recs {
                    match r {
                        Rec::Lost(n) => {
                            assert_eq!(pending_gap, 0, "two LOST records in a row");
                            pending_gap = n;
                            seen_lost += n;
                        }
                        Rec::Data { seq, .. } => {
                            assert_eq!(seq, expect_seq + pending_gap, "gap not announced");
                            expect_seq = seq + 1;
                            pending_gap = 0;
                        }
                    }
                }
            }
        }
        let h = buf.header();
        assert!(dropped > 1_000 && written > 1_000, "both paths exercised");
        assert!(pads > 0, "wrap-around exercised");
        assert_eq!(h.records, written);
        assert_eq!(h.drops, dropped);
        let pending = RingWriter::new(&mut buf).unwrap().pending_lost();
        // Drops after the last written record are pending; all others were announced.
        let (recs, _) = drain_all(&buf);
        let late: u64 = recs.iter().map(|r| if let Rec::Lost(n) = r { *n } else { 0 }).sum();
        assert_eq!(seen_lost + late + pending, dropped);
    }

    #[test]
    fn flush_lost_marks_the_end() {
        let l = RingLayout::new(0, 64).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        assert!(RingWriter::new(&mut buf).unwrap().flush_lost());
        put(&mut buf, 32, 1).unwrap();
        put(&mut buf, 24, 2).unwrap();
        put(&mut buf, 24, 3).unwrap_err();
        // 8 bytes free: no room for the LOST record yet.
        assert!(!RingWriter::new(&mut buf).unwrap().flush_lost());
        drain_all(&buf);
        // Head at 56: 8 bytes to the end, so PAD then LOST at offset 0.
        assert!(RingWriter::new(&mut buf).unwrap().flush_lost());
        let (recs, st) = drain_all(&buf);
        assert_eq!(recs, [Rec::Lost(1)]);
        assert_eq!((st.bytes, st.lost), (24, 1));
        assert_eq!(buf.header().records, 2, "LOST and PAD are not counted as records");
    }

    #[test]
    fn read_consume_and_corruption() {
        let l = RingLayout::new(0, 128).unwrap();
        let mut w = words_for(&l);
        let mut buf = setup(&mut w, &l);
        put(&mut buf, 24, 1).unwrap();
        put(&mut buf, 24, 2).unwrap();
        {
            let r = RingReader::new(&buf).unwrap();
            assert_eq!(r.available(), 48);
            assert_eq!(r.data_size(), 128);
            // Read without publishing: the tail stays, a second read sees the same.
            let st = r.read(|_| {}).unwrap();
            assert_eq!((st.records, st.tail), (2, 48));
            assert_eq!(r.read(|_| {}).unwrap().records, 2);
            assert!(r.consume(56).is_err(), "beyond head");
            assert!(r.consume(20).is_err(), "unaligned");
            r.consume(24).unwrap();
            assert_eq!(r.available(), 24);
            assert!(r.consume(16).is_err(), "behind tail");
        }
        let (recs, _) = drain_all(&buf);
        assert_eq!(recs, [Rec::Data { seq: 2, size: 24 }]);
        // Corrupt the next record's size: the reader reports it and skips to head.
        put(&mut buf, 24, 3).unwrap();
        let data = l.data_offset as usize;
        bytemuck_bytes(&mut w[..])[data + 48 + 6] = 3;
        let buf = Buffer::from_words(&mut w).unwrap();
        let r = RingReader::new(&buf).unwrap();
        assert!(r.read(|_| {}).is_err());
        assert!(r.drain(|_| {}).is_err());
        assert_eq!(r.available(), 0);
    }
}
