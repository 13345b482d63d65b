//! The consumer side: reading published intervals in place (zero-copy) and turning
//! them into capture records. Used by userspace (the recorder, the kmod reader over its
//! read-only mapping) while the producer keeps counting into the other table.
//!
//! ```no_run
//! # use hrperf_fmt_aggregate::consumer::{AggView, Access};
//! # fn get() -> (core::ptr::NonNull<u8>, usize) { unimplemented!() }
//! let (ptr, len) = get(); // one CPU's buffer, e.g. from the mmap of /dev/hrperf
//! // SAFETY: (the caller's) the mapping is valid for reads for as long as `view` lives.
//! let view = unsafe { AggView::from_raw(ptr, len, Access::ReadWrite) }.unwrap();
//! if let Some(iv) = view.pending() {
//!     iv.emit_records(|rec| { /* write rec to the capture file */ });
//!     view.ack(iv).unwrap(); // over a read-only mapping: hand `iv.finish()` to the kernel
//! }
//! view.request_switch().unwrap(); // or the RESTART ioctl
//! ```
//!
//! Every read of the shared area is a relaxed atomic load of one word, after the
//! acquire load of `C_PUBLISHED`, and only of the published table, which the producer
//! does not touch until it sees our acknowledgement (crate docs, "Handoff"). Nothing here
//! trusts the contents: every offset is checked against the mapping, and slots or stacks
//! that make no sense are skipped and flagged ([`IV_FL_INCONSISTENT`]).

use core::marker::PhantomData;
use core::mem::offset_of;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use hrperf_abi::buffer::BUFFER_MAGIC;
use hrperf_abi::BufferHeader;
use hrperf_engine::Buffer;

use super::layout::*;
use super::record::{
    self, EntryRecord, IntervalRecord, StackRecord, IV_FL_INCONSISTENT, KEY_IP, KEY_PID_IP,
    KEY_STACK, MAX_STACK_DEPTH, MAX_STACK_RECORD_SIZE, STACK_FL_KERNEL, STACK_FL_TRUNCATED,
};

/// Whether the consumer may write its line (ack, switch requests) itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A read-only mapping (`/dev/hrperf`): acknowledgements go through the kernel.
    ReadOnly,
    /// Writable memory (userspace sources): [`AggView::ack`] stores directly.
    ReadWrite,
}

/// Why a buffer cannot be read as an aggregate buffer, or a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewError {
    /// The buffer header or the control block is not this format's, or its layout
    /// lies outside the buffer.
    NotAggregate,
    /// The view is read-only; pass the sequence number to the kernel instead.
    ReadOnly,
    /// Not the interval the producer published last (nothing to acknowledge).
    NotPending,
}

impl core::fmt::Display for ViewError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ViewError::NotAggregate => "buffer is not an initialised aggregate-format buffer",
            ViewError::ReadOnly => "the view is read-only: acknowledge through the kernel",
            ViewError::NotPending => "that interval is not the one waiting to be consumed",
        })
    }
}

/// The consumer's view of one CPU's buffer.
///
/// # Invariants
///
/// `base` is valid for reads of `len` bytes (and writes of the consumer line if
/// `access` is `ReadWrite`) for `'a`, 8-aligned; the control block at `ctrl` and both
/// tables (`table0`, `table_bytes`, `slots` slots, `stack_slots` stack entries of
/// `stack_entry` bytes) lie inside `len`, 8-aligned.
#[derive(Debug)]
pub struct AggView<'a> {
    base: NonNull<u8>,
    len: usize,
    access: Access,
    cpu: u32,
    key: u32,
    counter: u32,
    ctrl: usize,
    table0: usize,
    table_bytes: usize,
    slots: usize,
    stack_slots: usize,
    stack_entry: usize,
    _mem: PhantomData<&'a [u8]>,
}

// SAFETY: the view only performs atomic accesses on the shared words; the memory is
// valid for 'a wherever the view is used (the constructor's contract).
unsafe impl Send for AggView<'_> {}
// SAFETY: as above; all methods take `&self` and use atomics.
unsafe impl Sync for AggView<'_> {}

impl<'a> AggView<'a> {
    /// A read-only view of a buffer the engine manages (acknowledging needs a
    /// [`Access::ReadWrite`] view from [`from_raw`](Self::from_raw), or the kernel).
    pub fn from_buffer(buf: &'a Buffer<'_>) -> Result<AggView<'a>, ViewError> {
        // SAFETY: a `Buffer` is valid for reads of `len` bytes while borrowed.
        unsafe {
            AggView::from_raw(
                NonNull::new(buf.as_ptr() as *mut u8).ok_or(ViewError::NotAggregate)?,
                buf.len(),
                Access::ReadOnly,
            )
        }
    }

    /// A view of one CPU's buffer at `ptr` (`len` bytes), after checking the header,
    /// the control block and that the tables lie inside.
    ///
    /// # Safety
    ///
    /// `ptr` is valid for reads of `len` bytes for `'a` (and, with
    /// [`Access::ReadWrite`], for writes of the consumer line), and the only concurrent
    /// writer is the buffer's producer (this format's handler/restart).
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        access: Access,
    ) -> Result<AggView<'a>, ViewError> {
        let bad = Err(ViewError::NotAggregate);
        if ptr.as_ptr() as usize % 8 != 0 || len < BufferHeader::SIZE {
            return bad;
        }
        let load = |off: usize| {
            // SAFETY: callers pass 8-aligned offsets with `off + 8 <= len`; atomic, as
            // the producer may write concurrently.
            unsafe { AtomicU64::from_ptr(ptr.as_ptr().add(off).cast::<u64>()) }
                .load(Ordering::Acquire)
        };
        let header_u32 = |off: usize| {
            // SAFETY: a u32 field of the header (4-aligned, inside `len`), written by
            // the core before the buffer is shared and never after.
            unsafe { ptr.as_ptr().add(off).cast::<u32>().read() }
        };
        if header_u32(offset_of!(BufferHeader, magic)) != BUFFER_MAGIC {
            return bad;
        }
        let cpu = header_u32(offset_of!(BufferHeader, cpu));
        let data_off = load(offset_of!(BufferHeader, data_offset));
        let data_size = load(offset_of!(BufferHeader, data_size));
        let end = data_off.checked_add(data_size);
        if data_off < BufferHeader::SIZE as u64
            || data_off % 64 != 0
            || end.map_or(true, |e| e > len as u64)
            || data_size < TABLES_OFFSET as u64
        {
            return bad;
        }
        let ctrl = data_off as usize;
        if load(ctrl + C_MAGIC) != CONTROL_MAGIC {
            return bad;
        }
        let (kw, sw, stw) = (
            load(ctrl + C_KEY),
            load(ctrl + C_SLOTS),
            load(ctrl + C_STACKS),
        );
        let table_bytes = load(ctrl + C_TABLE_BYTES);
        let (key, counter) = (kw as u32, (kw >> 32) as u32);
        let slots = u64::from(sw as u32);
        let stack_slots = u64::from(stw as u32);
        let depth = ((stw >> 32) & 0xffff).max(stw >> 48 & 0xffff);
        if !matches!(key, KEY_IP | KEY_PID_IP | KEY_STACK)
            || slots > u64::from(MAX_SLOTS)
            || stack_slots > u64::from(MAX_SLOTS)
            || depth > MAX_STACK_DEPTH as u64
            || table_bytes % 8 != 0
        {
            return bad;
        }
        let stack_entry = if key == KEY_STACK {
            STACK_ENTRY_FIXED as u64 + 8 * depth.max(1)
        } else {
            0
        };
        let need = TABLE_HEADER_SIZE as u64 + slots * SLOT_SIZE as u64 + stack_slots * stack_entry;
        if need > table_bytes
            || (TABLES_OFFSET as u64).checked_add(table_bytes.saturating_mul(2)) != Some(data_size)
        {
            return bad;
        }
        // INVARIANT: the regions were checked against `len` above; validity is the
        // caller's contract.
        Ok(AggView {
            base: ptr,
            len,
            access,
            cpu,
            key,
            counter,
            ctrl,
            table0: ctrl + TABLES_OFFSET,
            table_bytes: table_bytes as usize,
            slots: slots as usize,
            stack_slots: stack_slots as usize,
            stack_entry: stack_entry as usize,
            _mem: PhantomData,
        })
    }

    /// The word at `off` (8-aligned, inside the regions of the invariant).
    fn word(&self, off: usize) -> &AtomicU64 {
        let off = off.min(self.len.saturating_sub(8)) & !7;
        // SAFETY: clamped inside the buffer and aligned; valid for reads (invariant);
        // accessed atomically because the producer may write it concurrently.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast::<u64>()) }
    }

    /// CPU of the buffer.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// `KEY_*` of the session.
    pub fn key_kind(&self) -> u32 {
        self.key
    }

    /// Slots per table.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of one table (what a drain reads from the mapping at most).
    pub fn table_bytes(&self) -> usize {
        self.table_bytes
    }

    /// The last interval the producer published (0: none yet).
    pub fn published(&self) -> u64 {
        self.word(self.ctrl + C_PUBLISHED).load(Ordering::Acquire)
    }

    /// The last interval acknowledged by the consumer.
    pub fn acked(&self) -> u64 {
        self.word(self.ctrl + U_ACK).load(Ordering::Relaxed)
    }

    /// The interval being filled.
    pub fn active(&self) -> u64 {
        self.word(self.ctrl + C_ACTIVE).load(Ordering::Relaxed)
    }

    /// Switches the producer had to postpone because the consumer was behind.
    pub fn switch_waits(&self) -> u64 {
        self.word(self.ctrl + C_SWITCH_WAITS)
            .load(Ordering::Relaxed)
    }

    /// The published interval not yet acknowledged, if any: safe to read in place
    /// until [`ack`](Self::ack) (or the kernel's acknowledgement).
    pub fn pending(&self) -> Option<Interval<'_, 'a>> {
        // Acquire (in `published`): pairs with the producer's release store, so the
        // table's contents are visible.
        let seq = self.published();
        if seq == 0 || seq == self.acked() {
            return None;
        }
        let table = self.table0 + table_of(seq) * self.table_bytes;
        Some(Interval {
            view: self,
            seq,
            table,
        })
    }

    /// Tells the producer the interval was read: it may reuse its table. Release
    /// ordering: every read of the table happens before the producer's acquire load.
    pub fn ack(&self, iv: Interval<'_, '_>) -> Result<(), ViewError> {
        if self.access == Access::ReadOnly {
            return Err(ViewError::ReadOnly);
        }
        self.ack_seq(iv.finish())
    }

    /// [`ack`](Self::ack) by sequence number, as the kernel does on the reader's behalf
    /// (the CONSUME ioctl): refused unless `seq` is the published interval.
    pub fn ack_seq(&self, seq: u64) -> Result<(), ViewError> {
        if self.access == Access::ReadOnly {
            return Err(ViewError::ReadOnly);
        }
        if seq == 0 || seq != self.published() {
            return Err(ViewError::NotPending);
        }
        self.word(self.ctrl + U_ACK).store(seq, Ordering::Release);
        Ok(())
    }

    /// Asks the producer to switch at its next sample (a CPU without samples switches
    /// only on `restart`). It switches once the published interval is acknowledged.
    pub fn request_switch(&self) -> Result<(), ViewError> {
        if self.access == Access::ReadOnly {
            return Err(ViewError::ReadOnly);
        }
        let w = self.word(self.ctrl + U_REQ);
        // Single consumer: load + store, no read-modify-write needed.
        w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        Ok(())
    }
}

/// One published interval, read in place.
#[derive(Debug)]
pub struct Interval<'v, 'a> {
    view: &'v AggView<'a>,
    seq: u64,
    table: usize,
}

/// One key of an interval, as read from the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Process id (0 for `KEY_IP`).
    pub pid: u32,
    /// Instruction pointer (0 for `KEY_STACK`).
    pub ip: u64,
    /// Kernel stack id (`KEY_STACK`).
    pub kstack_id: u32,
    /// User stack id (`KEY_STACK`).
    pub ustack_id: u32,
    /// Samples.
    pub count: u64,
    /// Counter deltas.
    pub sum: u64,
}

impl Interval<'_, '_> {
    /// Interval number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Ends the read; returns the sequence number to acknowledge.
    pub fn finish(self) -> u64 {
        self.seq
    }

    fn th(&self, w: usize) -> u64 {
        self.view.word(self.table + w).load(Ordering::Relaxed)
    }

    /// The interval's summary from the table header (`entries`/`stacks` are the
    /// producer's counts of used slots; [`emit_records`](Self::emit_records) reports
    /// what it found). `IV_FL_INCONSISTENT` if the header does not hold this interval.
    pub fn summary(&self) -> IntervalRecord {
        let mut flags = self.th(T_FLAGS) as u32;
        if self.th(T_SEQ) != self.seq {
            flags |= IV_FL_INCONSISTENT;
        }
        IntervalRecord {
            cpu: self.view.cpu,
            key_kind: self.view.key,
            seq: self.seq,
            start_ns: self.th(T_START),
            end_ns: self.th(T_END),
            samples: self.th(T_SAMPLES),
            entries: self.th(T_USED),
            other_count: self.th(T_OTHER_COUNT),
            other_sum: self.th(T_OTHER_SUM),
            misses: self.th(T_MISSES),
            sum_total: self.th(T_SUM),
            stacks: self.th(T_STACK_USED),
            stack_misses: self.th(T_STACK_MISSES),
            stack_truncated: self.th(T_STACK_TRUNC),
            multi_wraps: self.th(T_MULTI_WRAPS),
            counter: self.view.counter,
            flags,
        }
    }

    /// Calls `f` for every key of the interval, in table order.
    pub fn for_each_entry(&self, mut f: impl FnMut(Entry)) {
        let gen = gen_of(self.seq);
        let base = self.table + TABLE_HEADER_SIZE;
        for i in 0..self.view.slots {
            let s = base + i * SLOT_SIZE;
            let tag = self.view.word(s + 8).load(Ordering::Relaxed);
            if tag as u32 != gen {
                continue;
            }
            let k0 = self.view.word(s).load(Ordering::Relaxed);
            let (ip, kid, uid) = match self.view.key {
                KEY_STACK => (0, (k0 >> 32) as u32, k0 as u32),
                _ => (k0, 0, 0),
            };
            f(Entry {
                pid: (tag >> 32) as u32,
                ip,
                kstack_id: kid,
                ustack_id: uid,
                count: self.view.word(s + 16).load(Ordering::Relaxed),
                sum: self.view.word(s + 24).load(Ordering::Relaxed),
            });
        }
    }

    /// Copies stack `id` into `out`; returns `(frames, STACK_FL_*)`, or `None` if the
    /// id names no stack of this interval.
    pub fn stack(&self, id: u32, out: &mut [u64]) -> Option<(usize, u32)> {
        let i = (id as usize).checked_sub(1)?;
        if i >= self.view.stack_slots || self.view.stack_entry == 0 {
            return None;
        }
        let e = self.table
            + TABLE_HEADER_SIZE
            + self.view.slots * SLOT_SIZE
            + i * self.view.stack_entry;
        let tag = self.view.word(e).load(Ordering::Relaxed);
        let n = (tag >> 32 & 0xffff) as usize;
        let max = (self.view.stack_entry - STACK_ENTRY_FIXED) / 8;
        if tag as u32 != gen_of(self.seq) || n == 0 || n > max || n > out.len() {
            return None;
        }
        for (f, o) in out.iter_mut().enumerate().take(n) {
            *o = self
                .view
                .word(e + STACK_ENTRY_FIXED + 8 * f)
                .load(Ordering::Relaxed);
        }
        Some((
            n,
            (tag >> 48) as u32 & (STACK_FL_KERNEL | STACK_FL_TRUNCATED),
        ))
    }

    /// Emits the interval as capture records: one INTERVAL, then a STACK per stored
    /// stack (stack keys), then an ENTRY per key. The interval record's `entries` and
    /// `stacks` count the records that follow. Each record is passed to `f` in a
    /// buffer that lives for the call. Returns the summary as written.
    pub fn emit_records(&self, mut f: impl FnMut(&[u8])) -> IntervalRecord {
        let mut s = self.summary();
        // First pass: count what is really there (the header's counts are the
        // producer's; a consumer trusts only what it reads).
        let (mut entries, mut stacks, mut count, mut sum) = (0u64, 0u64, 0u64, 0u64);
        self.for_each_entry(|e| {
            entries += 1;
            count = count.wrapping_add(e.count);
            sum = sum.wrapping_add(e.sum);
        });
        let mut frames = [0u64; MAX_STACK_DEPTH];
        if self.view.key == KEY_STACK {
            for id in 1..=self.view.stack_slots as u32 {
                if self.stack(id, &mut frames).is_some() {
                    stacks += 1;
                }
            }
        }
        if entries != s.entries
            || stacks != s.stacks
            || count.wrapping_add(s.other_count) != s.samples
            || sum.wrapping_add(s.other_sum) != s.sum_total
        {
            s.flags |= IV_FL_INCONSISTENT;
        }
        s.entries = entries;
        s.stacks = stacks;
        let mut buf = [0u8; MAX_STACK_RECORD_SIZE];
        if let Some(r) = record::write_interval(&s, &mut buf).and_then(|n| buf.get(..n)) {
            f(r);
        }
        if self.view.key == KEY_STACK {
            for id in 1..=self.view.stack_slots as u32 {
                if let Some((n, flags)) = self.stack(id, &mut frames) {
                    let r = StackRecord {
                        cpu: s.cpu,
                        stack_id: id,
                        seq: s.seq,
                        depth: n as u32,
                        flags,
                    };
                    let frames = frames.get(..n).unwrap_or(&[]);
                    if let Some(r) =
                        record::write_stack(&r, frames, &mut buf).and_then(|n| buf.get(..n))
                    {
                        f(r);
                    }
                }
            }
        }
        self.for_each_entry(|e| {
            let r = EntryRecord {
                cpu: s.cpu,
                key_kind: s.key_kind,
                seq: s.seq,
                start_ns: s.start_ns,
                end_ns: s.end_ns,
                pid: e.pid,
                ip: e.ip,
                kstack_id: e.kstack_id,
                ustack_id: e.ustack_id,
                count: e.count,
                sum: e.sum,
            };
            if let Some(r) = record::write_entry(&r, &mut buf).and_then(|n| buf.get(..n)) {
                f(r);
            }
        });
        s
    }
}
