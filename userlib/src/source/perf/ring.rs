//! Reading perf's mmap ring: `struct perf_event_mmap_page` then 2^n data pages.
//!
//! Reference: `include/uapi/linux/perf_event.h` (the `data_head`/`data_tail` comment) and
//! `kernel/events/ring_buffer.c`. The kernel advances `data_head`; we read it with an
//! acquire (the uapi's `smp_rmb()`), consume the bytes in `[data_tail, data_head)`, then
//! publish the new `data_tail` with a release (the uapi's `smp_mb()` before the store). The
//! mapping is writable, so the kernel never overwrites unread data: it drops samples and
//! later writes a `PERF_RECORD_LOST` instead. A record that runs past the end of the data
//! area is seen as [`Record::Split`] (aya's `perf_buffer.rs`).

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use hrperf_abi::MAX_COUNTERS;

use super::sys::{
    MMAP_DATA_HEAD, MMAP_DATA_OFFSET, MMAP_DATA_SIZE, MMAP_DATA_TAIL, PERF_FORMAT_GROUP,
    PERF_FORMAT_ID, PERF_SAMPLE_ADDR, PERF_SAMPLE_CALLCHAIN, PERF_SAMPLE_CPU, PERF_SAMPLE_IP,
    PERF_SAMPLE_PERIOD, PERF_SAMPLE_READ, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
};

/// `PERF_RECORD_COMM`: `{ header, u32 pid, u32 tid, char comm[] }`.
pub const PERF_RECORD_COMM: u32 = 3;
/// `PERF_RECORD_LOST`: `{ header, u64 id, u64 lost }`.
pub const PERF_RECORD_LOST: u32 = 2;
/// `PERF_RECORD_THROTTLE`.
pub const PERF_RECORD_THROTTLE: u32 = 5;
/// `PERF_RECORD_UNTHROTTLE`.
pub const PERF_RECORD_UNTHROTTLE: u32 = 6;
/// `PERF_RECORD_SAMPLE`.
pub const PERF_RECORD_SAMPLE: u32 = 9;
/// `PERF_RECORD_LOST_SAMPLES`: `{ header, u64 lost }`.
pub const PERF_RECORD_LOST_SAMPLES: u32 = 13;

/// Callchain context marker: the frames that follow are kernel frames.
pub const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
/// Callchain context marker: the frames that follow are user frames.
pub const PERF_CONTEXT_USER: u64 = -512i64 as u64;
/// Callchain entries at or above this value are context markers, not addresses.
pub const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;

/// `PERF_RECORD_MISC_CPUMODE_MASK`.
pub const MISC_CPUMODE_MASK: u16 = 7;
/// `PERF_RECORD_MISC_KERNEL`.
pub const MISC_KERNEL: u16 = 1;
/// `PERF_RECORD_MISC_GUEST_KERNEL`.
pub const MISC_GUEST_KERNEL: u16 = 4;

/// One record in the ring, borrowed in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// Contiguous.
    Single(&'a [u8]),
    /// Wrapped around the end of the data area: the tail part, then the head part.
    Split(&'a [u8], &'a [u8]),
}

impl Record<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Record::Single(a) => a.len(),
            Record::Split(a, b) => a.len() + b.len(),
        }
    }

    /// Copies `N` bytes at `off`, `None` if out of range.
    pub fn bytes_at<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        match *self {
            Record::Single(a) => out.copy_from_slice(a.get(off..off.checked_add(N)?)?),
            Record::Split(a, b) => {
                if off.checked_add(N)? > a.len() + b.len() {
                    return None;
                }
                for (i, byte) in out.iter_mut().enumerate() {
                    let p = off + i;
                    *byte = if p < a.len() { a[p] } else { b[p - a.len()] };
                }
            }
        }
        Some(out)
    }

    /// The `u64` at `off`.
    pub fn u64_at(&self, off: usize) -> Option<u64> {
        self.bytes_at::<8>(off).map(u64::from_ne_bytes)
    }

    /// The `u32` at `off`.
    pub fn u32_at(&self, off: usize) -> Option<u32> {
        self.bytes_at::<4>(off).map(u32::from_ne_bytes)
    }

    /// `perf_event_header`: `(type, misc, size)`.
    pub fn header(&self) -> Option<(u32, u16, u16)> {
        let b = self.bytes_at::<8>(0)?;
        Some((
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            u16::from_ne_bytes([b[4], b[5]]),
            u16::from_ne_bytes([b[6], b[7]]),
        ))
    }
}

/// What one [`Ring::drain`] found wrong with the ring itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Records handed to the callback.
    pub records: u64,
    /// Bytes skipped because a header was impossible (size 0, or beyond `data_head`).
    pub corrupt_bytes: u64,
}

/// A mapped perf ring buffer.
///
/// # Invariants
///
/// `base` points to a live shared mapping of at least `data_offset + data_size` bytes
/// whose first page is a `perf_event_mmap_page`; `data_size` is a power of two and a
/// multiple of 8. Only the kernel writes `data_head` and the data area; only this object
/// writes `data_tail`.
#[derive(Debug)]
pub struct Ring {
    base: NonNull<u8>,
    len: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by the `Ring` (shared only with the kernel, through atomics
// and the head/tail protocol), so moving it to another thread is sound.
unsafe impl Send for Ring {}

impl Ring {
    /// Wraps a mapping of `len` bytes (`1 + 2^n` pages).
    ///
    /// # Safety
    ///
    /// `base` is a perf ring mapping of `len` bytes (or a fake laid out the same way),
    /// 8-byte aligned, that stays mapped for the life of the returned `Ring`, and nothing
    /// else writes its `data_tail`.
    pub unsafe fn new(base: NonNull<u8>, len: usize, page_size: usize) -> Option<Ring> {
        // SAFETY: the caller guarantees the control page is mapped and aligned; the
        // offset/size fields are written once by the kernel before mmap returns.
        let (off, size) = unsafe {
            (
                std::ptr::read_volatile(base.as_ptr().add(MMAP_DATA_OFFSET).cast::<u64>()) as usize,
                std::ptr::read_volatile(base.as_ptr().add(MMAP_DATA_SIZE).cast::<u64>()) as usize,
            )
        };
        // Kernels before 4.1 leave both zero: data starts after the first page.
        let (data_offset, data_size) = if size == 0 {
            (page_size, len.checked_sub(page_size)?)
        } else {
            (off, size)
        };
        if !data_size.is_power_of_two()
            || data_size < 8
            || data_offset.checked_add(data_size)? > len
        {
            return None;
        }
        // INVARIANT: checked above; the mapping's lifetime is the caller's promise.
        Some(Ring {
            base,
            len,
            data_offset,
            data_size,
        })
    }

    /// Gives up the ring, returning its mapping `(ptr, len)` for `munmap`.
    pub fn mapping(self) -> (NonNull<u8>, usize) {
        (self.base, self.len)
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the 8-aligned control-page fields, inside the live
        // mapping (type invariant); the kernel accesses them atomically too.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast::<u64>()) }
    }

    /// `data_head`, with acquire ordering: the data before it is visible.
    pub fn head(&self) -> u64 {
        let head = self.word(MMAP_DATA_HEAD).load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        head
    }

    /// `data_tail` as last published.
    pub fn tail(&self) -> u64 {
        self.word(MMAP_DATA_TAIL).load(Ordering::Relaxed)
    }

    /// Publishes `data_tail` with release ordering: our reads of the data come first.
    pub fn set_tail(&self, tail: u64) {
        self.word(MMAP_DATA_TAIL).store(tail, Ordering::Release);
    }

    /// The `len` bytes at ring position `pos`, which must lie in `[data_tail, data_head)`.
    fn record_at(&self, pos: u64, len: usize) -> Record<'_> {
        let off = (pos as usize) & (self.data_size - 1);
        let first = len.min(self.data_size - off);
        // SAFETY: `off + first <= data_size` and `len - first < data_size`, so both slices
        // lie inside the data area (type invariant); the caller only asks for published
        // bytes between data_tail and data_head, which the kernel does not write until we
        // move data_tail past them.
        unsafe {
            let data = self.base.as_ptr().add(self.data_offset);
            let a = std::slice::from_raw_parts(data.add(off), first);
            if first == len {
                Record::Single(a)
            } else {
                Record::Split(a, std::slice::from_raw_parts(data, len - first))
            }
        }
    }

    /// Hands every complete record in the ring to `f`, then frees their space.
    pub fn drain(&self, mut f: impl FnMut(Record<'_>)) -> DrainStats {
        let head = self.head();
        let mut tail = self.tail();
        let mut stats = DrainStats::default();
        while tail != head {
            let avail = head.wrapping_sub(tail);
            let size = if avail >= 8 && avail <= self.data_size as u64 {
                self.record_at(tail, 8)
                    .header()
                    .map_or(0, |h| u64::from(h.2))
            } else {
                0
            };
            if size < 8 || size > avail {
                // Not a record we can trust: skip to the head rather than loop forever.
                stats.corrupt_bytes += avail;
                tail = head;
                break;
            }
            f(self.record_at(tail, size as usize));
            stats.records += 1;
            tail = tail.wrapping_add(size);
        }
        self.set_tail(tail);
        stats
    }
}

/// Offsets of the fields of a `PERF_RECORD_SAMPLE`, computed once from `sample_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleLayout {
    ip: Option<usize>,
    tid: Option<usize>,
    time: Option<usize>,
    addr: Option<usize>,
    cpu: Option<usize>,
    period: Option<usize>,
    read: Option<usize>,
    /// Offset just past the fixed-size fields (where `READ` starts, if present).
    end_fixed: usize,
    callchain: bool,
    with_ids: bool,
    group: bool,
}

/// A decoded sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// `perf_event_header.misc`.
    pub misc: u16,
    /// `PERF_SAMPLE_IP`.
    pub ip: u64,
    /// `PERF_SAMPLE_TID`: pid.
    pub pid: u32,
    /// `PERF_SAMPLE_TID`: tid.
    pub tid: u32,
    /// `PERF_SAMPLE_TIME`.
    pub time: u64,
    /// `PERF_SAMPLE_ADDR`.
    pub addr: u64,
    /// `PERF_SAMPLE_CPU`.
    pub cpu: u32,
    /// `PERF_SAMPLE_PERIOD`.
    pub period: u64,
    /// Counter values (`PERF_SAMPLE_READ`), group order.
    pub values: [u64; MAX_COUNTERS],
    /// Their ids (`PERF_FORMAT_ID`), else 0.
    pub ids: [u64; MAX_COUNTERS],
    /// Valid entries in `values`/`ids`.
    pub nr: usize,
    /// `PERF_SAMPLE_CALLCHAIN`: offset in the record of the first entry.
    pub chain_off: usize,
    /// Callchain entries present in the record (at most what `nr` declared).
    pub chain_len: usize,
    /// The callchain's `nr` claimed more entries than the record holds (cut to
    /// `chain_len`).
    pub chain_cut: bool,
}

impl Sample {
    /// Appends the sample's callchain, split at its context markers, to `kernel` and
    /// `user` (see [`split_callchain`]); nothing without `PERF_SAMPLE_CALLCHAIN`.
    pub fn callchain_into(&self, rec: &Record<'_>, kernel: &mut Vec<u64>, user: &mut Vec<u64>) {
        let kernel_ip = matches!(
            self.misc & MISC_CPUMODE_MASK,
            MISC_KERNEL | MISC_GUEST_KERNEL
        );
        let entries = (0..self.chain_len).map_while(|i| rec.u64_at(self.chain_off + 8 * i));
        split_callchain(entries, kernel_ip, kernel, user);
    }
}

/// Splits `PERF_SAMPLE_CALLCHAIN` entries (innermost first) at the context markers:
/// frames after [`PERF_CONTEXT_KERNEL`] go to `kernel`, after [`PERF_CONTEXT_USER`] to
/// `user`; other markers (hypervisor, guest; every value at or above
/// [`PERF_CONTEXT_MAX`]) are skipped and leave the context as it was. Frames before any
/// marker belong to the kernel if `kernel_ip` (the sample's cpumode says so), else to
/// the user. Returns the number of frames appended.
pub fn split_callchain(
    entries: impl IntoIterator<Item = u64>,
    kernel_ip: bool,
    kernel: &mut Vec<u64>,
    user: &mut Vec<u64>,
) -> usize {
    let mut in_kernel = kernel_ip;
    let mut n = 0;
    for e in entries {
        match e {
            PERF_CONTEXT_KERNEL => in_kernel = true,
            PERF_CONTEXT_USER => in_kernel = false,
            m if m >= PERF_CONTEXT_MAX => {}
            ip => {
                if in_kernel {
                    kernel.push(ip);
                } else {
                    user.push(ip);
                }
                n += 1;
            }
        }
    }
    n
}

impl SampleLayout {
    /// Layout for `sample_type`; `read_format` supports `GROUP` and `ID` only.
    pub fn new(sample_type: u64, read_format: u64) -> SampleLayout {
        let mut off = 8;
        let mut field = |bit: u64, size: usize| {
            (sample_type & bit != 0).then(|| {
                let at = off;
                off += size;
                at
            })
        };
        // Order from perf_event.h's PERF_RECORD_SAMPLE comment; IDENTIFIER, ID and
        // STREAM_ID are never requested here.
        let ip = field(PERF_SAMPLE_IP, 8);
        let tid = field(PERF_SAMPLE_TID, 8);
        let time = field(PERF_SAMPLE_TIME, 8);
        let addr = field(PERF_SAMPLE_ADDR, 8);
        let cpu = field(PERF_SAMPLE_CPU, 8);
        let period = field(PERF_SAMPLE_PERIOD, 8);
        let read = field(PERF_SAMPLE_READ, 0);
        SampleLayout {
            end_fixed: off,
            callchain: sample_type & PERF_SAMPLE_CALLCHAIN != 0,
            ip,
            tid,
            time,
            addr,
            cpu,
            period,
            read,
            with_ids: read_format & PERF_FORMAT_ID != 0,
            group: read_format & PERF_FORMAT_GROUP != 0,
        }
    }

    /// Decodes a `PERF_RECORD_SAMPLE`; `None` if it is shorter than the layout says. A
    /// callchain whose `nr` claims more entries than the record holds is cut to what it
    /// holds ([`Sample::chain_cut`]); the rest of the sample is kept.
    pub fn parse(&self, rec: &Record<'_>) -> Option<Sample> {
        let (_, misc, _) = rec.header()?;
        let mut s = Sample {
            misc,
            ..Sample::default()
        };
        let get = |off: Option<usize>| off.map_or(Some(0), |o| rec.u64_at(o));
        s.ip = get(self.ip)?;
        if let Some(o) = self.tid {
            s.pid = rec.u32_at(o)?;
            s.tid = rec.u32_at(o + 4)?;
        }
        s.time = get(self.time)?;
        s.addr = get(self.addr)?;
        if let Some(o) = self.cpu {
            s.cpu = rec.u32_at(o)?;
        }
        s.period = get(self.period)?;
        let mut end = self.end_fixed;
        if let Some(mut o) = self.read {
            let stride = if self.with_ids { 16 } else { 8 };
            let nr = if self.group {
                let nr = rec.u64_at(o)?;
                o += 8;
                usize::try_from(nr).ok()?
            } else {
                1
            };
            if nr > MAX_COUNTERS {
                return None;
            }
            for i in 0..nr {
                s.values[i] = rec.u64_at(o + i * stride)?;
                if self.with_ids {
                    s.ids[i] = rec.u64_at(o + i * stride + 8)?;
                }
            }
            s.nr = nr;
            end = o + nr * stride;
        }
        if self.callchain {
            let declared = rec.u64_at(end)?;
            s.chain_off = end + 8;
            let room = (rec.len().saturating_sub(s.chain_off) / 8) as u64;
            s.chain_len = declared.min(room) as usize;
            s.chain_cut = declared > room;
        }
        Some(s)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fake ring: an 8-aligned buffer laid out like a perf mmap.
    pub(crate) struct FakeRing {
        pub buf: Vec<u64>,
        pub page: usize,
    }

    impl FakeRing {
        pub fn new(page: usize, data_pages: usize) -> FakeRing {
            let mut r = FakeRing {
                buf: vec![0; page * (1 + data_pages) / 8],
                page,
            };
            r.buf[MMAP_DATA_OFFSET / 8] = page as u64;
            r.buf[MMAP_DATA_SIZE / 8] = (page * data_pages) as u64;
            r
        }

        pub fn ptr(&mut self) -> NonNull<u8> {
            NonNull::new(self.buf.as_mut_ptr().cast()).unwrap()
        }

        pub fn len(&self) -> usize {
            self.buf.len() * 8
        }

        /// Writes a record at the current head (wrapping) and advances the head.
        pub fn push(&mut self, rec: &[u8]) {
            assert_eq!(rec.len() % 8, 0);
            let size = self.len() - self.page;
            let head = self.buf[MMAP_DATA_HEAD / 8];
            let bytes: &mut [u8] = bytemuck_bytes(&mut self.buf);
            for (i, b) in rec.iter().enumerate() {
                let p = (head as usize + i) % size;
                bytes[self.page + p] = *b;
            }
            self.buf[MMAP_DATA_HEAD / 8] = head + rec.len() as u64;
        }

        pub fn set_pos(&mut self, pos: u64) {
            self.buf[MMAP_DATA_HEAD / 8] = pos;
            self.buf[MMAP_DATA_TAIL / 8] = pos;
        }
    }

    fn bytemuck_bytes(words: &mut [u64]) -> &mut [u8] {
        // SAFETY: u64 has no padding and any byte pattern is a valid u8; the length is
        // the same memory in bytes and the borrow is carried over.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) }
    }

    /// Builds a `PERF_RECORD_SAMPLE` for IP|TID|TIME|ADDR|CPU|PERIOD|READ with GROUP|ID.
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per sample field, test only"
    )]
    pub(crate) fn sample_record(
        misc: u16,
        ip: u64,
        pid: u32,
        tid: u32,
        time: u64,
        cpu: u32,
        period: u64,
        values: &[(u64, u64)],
    ) -> Vec<u8> {
        let mut v = Vec::new();
        let size = 8 + 6 * 8 + 8 + values.len() * 16;
        v.extend_from_slice(&PERF_RECORD_SAMPLE.to_ne_bytes());
        v.extend_from_slice(&misc.to_ne_bytes());
        v.extend_from_slice(&(size as u16).to_ne_bytes());
        v.extend_from_slice(&ip.to_ne_bytes());
        v.extend_from_slice(&pid.to_ne_bytes());
        v.extend_from_slice(&tid.to_ne_bytes());
        v.extend_from_slice(&time.to_ne_bytes());
        v.extend_from_slice(&0xdead_0000u64.to_ne_bytes());
        v.extend_from_slice(&cpu.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&period.to_ne_bytes());
        v.extend_from_slice(&(values.len() as u64).to_ne_bytes());
        for (val, id) in values {
            v.extend_from_slice(&val.to_ne_bytes());
            v.extend_from_slice(&id.to_ne_bytes());
        }
        assert_eq!(v.len(), size);
        v
    }

    pub(crate) fn simple_record(kind: u32, words: &[u64]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&((8 + words.len() * 8) as u16).to_ne_bytes());
        for w in words {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        v
    }

    pub(crate) const FULL: u64 = PERF_SAMPLE_IP
        | PERF_SAMPLE_TID
        | PERF_SAMPLE_TIME
        | PERF_SAMPLE_ADDR
        | PERF_SAMPLE_CPU
        | PERF_SAMPLE_PERIOD
        | PERF_SAMPLE_READ;

    #[test]
    fn layout_offsets() {
        let l = SampleLayout::new(FULL, PERF_FORMAT_GROUP | PERF_FORMAT_ID);
        assert_eq!(
            (l.ip, l.tid, l.time, l.addr, l.cpu, l.period, l.read),
            (
                Some(8),
                Some(16),
                Some(24),
                Some(32),
                Some(40),
                Some(48),
                Some(56)
            )
        );
        let l = SampleLayout::new(PERF_SAMPLE_TID | PERF_SAMPLE_CPU, 0);
        assert_eq!(
            (l.ip, l.tid, l.cpu, l.read),
            (None, Some(8), Some(16), None)
        );
    }

    #[test]
    fn records_in_order_and_split_across_the_end() {
        let mut fake = FakeRing::new(4096, 1);
        // Start 40 bytes before the end so the second record wraps.
        fake.set_pos(4096 * 3 - 40);
        let a = simple_record(PERF_RECORD_LOST, &[7, 3]);
        let b = sample_record(
            1,
            0xffff_ffff_8100_0000,
            10,
            11,
            123,
            1,
            1000,
            &[(5, 100), (6, 101)],
        );
        fake.push(&a);
        fake.push(&b);
        // SAFETY: the fake buffer outlives `ring` and is laid out like a perf mmap.
        let ring = unsafe { Ring::new(fake.ptr(), fake.len(), 4096) }.unwrap();
        let layout = SampleLayout::new(FULL, PERF_FORMAT_GROUP | PERF_FORMAT_ID);
        let mut seen = Vec::new();
        let stats = ring.drain(|rec| {
            let split = matches!(rec, Record::Split(..));
            let (kind, _, size) = rec.header().unwrap();
            assert_eq!(size as usize, rec.len());
            seen.push((
                kind,
                split,
                layout.parse(&rec).filter(|_| kind == PERF_RECORD_SAMPLE),
            ));
        });
        assert_eq!(
            stats,
            DrainStats {
                records: 2,
                corrupt_bytes: 0
            }
        );
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[0].0, seen[0].1), (PERF_RECORD_LOST, false));
        assert_eq!((seen[1].0, seen[1].1), (PERF_RECORD_SAMPLE, true));
        let s = seen[1].2.unwrap();
        assert_eq!(
            (s.ip, s.pid, s.tid, s.time, s.cpu, s.period),
            (0xffff_ffff_8100_0000, 10, 11, 123, 1, 1000)
        );
        assert_eq!(s.addr, 0xdead_0000);
        assert_eq!(
            (s.nr, &s.values[..2], &s.ids[..2]),
            (2, &[5, 6][..], &[100, 101][..])
        );
        assert_eq!(ring.tail(), ring.head());
        // Nothing new: nothing handed out.
        assert_eq!(ring.drain(|_| panic!("no records")).records, 0);
    }

    #[test]
    fn split_inside_a_field() {
        // A record whose `u64` ip straddles the end byte-wise cannot occur (records are
        // 8-aligned), but the reader must not care: check bytes_at on an odd split.
        let a = [1u8, 2, 3];
        let b = [4u8, 5, 6, 7, 8, 9];
        let r = Record::Split(&a, &b);
        assert_eq!(
            r.u64_at(1),
            Some(u64::from_ne_bytes([2, 3, 4, 5, 6, 7, 8, 9]))
        );
        assert_eq!(r.u64_at(2), None);
        assert_eq!(r.u32_at(0), Some(u32::from_ne_bytes([1, 2, 3, 4])));
    }

    #[test]
    fn corrupt_header_skips_to_head() {
        let mut fake = FakeRing::new(4096, 1);
        fake.push(&[0u8; 16]); // size 0
                               // SAFETY: as above.
        let ring = unsafe { Ring::new(fake.ptr(), fake.len(), 4096) }.unwrap();
        let stats = ring.drain(|_| panic!("no records"));
        assert_eq!(
            stats,
            DrainStats {
                records: 0,
                corrupt_bytes: 16
            }
        );
        assert_eq!(ring.tail(), 16);
    }

    #[test]
    fn short_sample_is_rejected() {
        let layout = SampleLayout::new(FULL, PERF_FORMAT_GROUP | PERF_FORMAT_ID);
        let mut rec = sample_record(0, 1, 2, 3, 4, 0, 1, &[(1, 1), (2, 2)]);
        rec.truncate(rec.len() - 8);
        assert_eq!(layout.parse(&Record::Single(&rec)), None);
        // A group count beyond MAX_COUNTERS is rejected, not trusted.
        let mut rec = sample_record(0, 1, 2, 3, 4, 0, 1, &[(1, 1)]);
        rec[56..64].copy_from_slice(&99u64.to_ne_bytes());
        assert_eq!(layout.parse(&Record::Single(&rec)), None);
    }
}
