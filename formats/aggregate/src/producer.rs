//! The producer side: the overflow handler and the switch, run on the buffer's CPU
//! (interrupt context in the kernel). No allocation, no locks, no floats, no panics.
//!
//! Every access to the data area (control block, consumer line, tables) is an atomic
//! load or store on a word, so the consumer may read published tables and write its
//! line concurrently without a data race; the orderings that make the handoff correct
//! are the two documented in the crate docs (`C_PUBLISHED` release, `U_ACK` acquire).
//! The private words and the stack scratch are the producer's alone and are read and
//! written plainly.

use core::sync::atomic::{AtomicU64, Ordering};

use hrperf_abi::format::{
    OverflowArg, Services, CTRL_NOTIFY, CTRL_RESET, CTRL_SWITCH, SAMPLE_OVERFLOW,
};
use hrperf_abi::MAX_COUNTERS;

use super::layout::*;
use super::record::{
    IV_FL_CLOSED_AUTO, IV_FL_CLOSED_REQUEST, IV_FL_CLOSED_RESTART, IV_FL_NO_KSTACK_SERVICE,
    IV_FL_NO_USTACK_SERVICE, KEY_IP, KEY_PID_IP, KEY_STACK, MAX_STACK_DEPTH, STACK_FL_KERNEL,
    STACK_FL_TRUNCATED, STACK_ID_LOST, STACK_ID_NONE,
};

/// Multiplier of the key hash (2^64 / φ).
const K1: u64 = 0x9e37_79b9_7f4a_7c15;
/// Multiplier mixing the pid into the key.
const K2: u64 = 0xff51_afd7_ed55_8ccd;

/// Hash of a key: the well-mixed middle bits of a multiply (index = hash & mask).
#[inline(always)]
fn hash(k0: u64, pid: u32) -> u64 {
    let x = k0 ^ u64::from(pid).wrapping_mul(K2);
    (x ^ (x >> 31)).wrapping_mul(K1) >> 32
}

/// A validated view of one buffer for the producer.
///
/// # Invariants
///
/// `base` is valid for reads and writes of `len` bytes, 8-aligned; the private words
/// `[PRIV_OFFSET, SCRATCH_OFFSET)` and the scratch are the producer's alone; the control
/// block at `ctrl`, the two tables at `table0` and `table0 + table_bytes` (each a
/// header, `mask + 1` slots and, with stacks, `stack_mask + 1` entries of `stack_entry`
/// bytes) lie inside `len`, 8-aligned; the scratch holds `max_depth + 1` words and ends
/// before `ctrl`.
pub(crate) struct Prod {
    base: *mut u8,
    ctrl: usize,
    table0: usize,
    table_bytes: usize,
    mask: usize,
    stack_mask: usize,
    stack_entry: usize,
    stack_slots_off: usize,
    kdepth: u32,
    udepth: u32,
    /// Probe bound, at most the number of slots (so the loops are bounded whatever the
    /// private words say).
    probe: usize,
}

impl Prod {
    /// Checks the private words `init` wrote against `len`.
    ///
    /// # Safety
    ///
    /// `base` is valid for reads and writes of `len` bytes, 8-aligned, and the caller
    /// is the buffer's producer (handler or restart; never two at once).
    #[inline(always)]
    pub(crate) unsafe fn new(base: *mut u8, len: usize) -> Option<Prod> {
        if len < SCRATCH_OFFSET || base as usize % 8 != 0 {
            return None;
        }
        let p = |i: usize| {
            // SAFETY: `i < PRIV_WORDS`, so the word is inside `len` (checked), aligned,
            // and producer-private (the caller's contract).
            unsafe { base.add(PRIV_OFFSET + 8 * i).cast::<u64>().read() }
        };
        if p(PRIV_MAGIC) != PRIV_MAGIC_VALUE {
            return None;
        }
        let (mask, table0, table_bytes) = (p(PRIV_MASK), p(PRIV_TABLE0), p(PRIV_TABLE_BYTES));
        let stack_mask = p(PRIV_STACK_MASK);
        let depths = p(PRIV_DEPTHS);
        let (kdepth, udepth) = ((depths & 0xffff) as u32, (depths >> 16 & 0xffff) as u32);
        let stacks = p(PRIV_CFG) & 0xff == u64::from(KEY_STACK);
        let max_depth = kdepth.max(udepth) as usize;
        if mask >= u64::from(MAX_SLOTS)
            || stack_mask >= u64::from(MAX_SLOTS)
            || max_depth > MAX_STACK_DEPTH
            || table0 % 8 != 0
            || table_bytes % 8 != 0
        {
            return None;
        }
        let (mask, stack_mask) = (mask as usize, stack_mask as usize);
        let stack_entry = if stacks {
            STACK_ENTRY_FIXED + 8 * max_depth.max(1)
        } else {
            0
        };
        let stack_slots = if stacks { stack_mask + 1 } else { 0 };
        // Bounded by the MAX_SLOTS/MAX_STACK_DEPTH checks: no overflow in usize.
        let stack_slots_off = TABLE_HEADER_SIZE + (mask + 1) * SLOT_SIZE;
        let need = stack_slots_off + stack_slots * stack_entry;
        let scratch_end = SCRATCH_OFFSET + if stacks { 8 * (max_depth + 1) } else { 0 };
        let tables_end = usize::try_from(table_bytes)
            .ok()
            .and_then(|t| t.checked_mul(2))
            .and_then(|t| t.checked_add(usize::try_from(table0).ok()?));
        let ctrl = usize::try_from(table0).ok()?.checked_sub(TABLES_OFFSET)?;
        if need as u64 > table_bytes || tables_end.map_or(true, |e| e > len) || scratch_end > ctrl {
            return None;
        }
        // INVARIANT: every region checked above against `len`.
        Some(Prod {
            base,
            ctrl,
            table0: table0 as usize,
            table_bytes: table_bytes as usize,
            mask,
            stack_mask,
            stack_entry,
            stack_slots_off,
            kdepth,
            udepth,
            probe: (p(PRIV_PROBE).min(mask as u64 + 1)) as usize,
        })
    }

    #[inline(always)]
    fn priv_get(&self, i: usize) -> u64 {
        // SAFETY: a private word inside the buffer (invariant), the producer's alone.
        unsafe {
            self.base
                .add(PRIV_OFFSET + 8 * (i % PRIV_WORDS))
                .cast::<u64>()
                .read()
        }
    }

    #[inline(always)]
    fn priv_set(&mut self, i: usize, v: u64) {
        // SAFETY: as for `priv_get`; `&mut self` is the producer.
        unsafe {
            self.base
                .add(PRIV_OFFSET + 8 * (i % PRIV_WORDS))
                .cast::<u64>()
                .write(v)
        }
    }

    /// The shared word at `off` (from the buffer's start).
    ///
    /// # Safety
    ///
    /// `off + 8` lies inside one of the regions of the invariant, 8-aligned.
    #[inline(always)]
    unsafe fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: in bounds and aligned (caller); every concurrent access is atomic.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast::<u64>()) }
    }

    /// Control-block or consumer word `w` (`C_*`, `U_*`).
    #[inline(always)]
    fn control(&self, w: usize) -> &AtomicU64 {
        // SAFETY: the control block and consumer line are the 128 bytes at `ctrl`,
        // before table 0 (invariant); `w % TABLES_OFFSET` keeps inside, aligned by the
        // callers' constants.
        unsafe { self.word(self.ctrl + ((w % TABLES_OFFSET) & !7)) }
    }

    /// Offset of the table holding interval `seq`.
    #[inline(always)]
    fn table(&self, seq: u64) -> usize {
        self.table0 + table_of(seq) * self.table_bytes
    }

    /// Header word `w` (`T_*`) of the table at `t` (from [`table`](Self::table)).
    #[inline(always)]
    fn th(&self, t: usize, w: usize) -> &AtomicU64 {
        // SAFETY: `t` is one of the two tables (invariant), the header is its first 128
        // bytes; the mask keeps `w` inside and aligned.
        unsafe { self.word(t + ((w % TABLE_HEADER_SIZE) & !7)) }
    }

    /// Adds `v` to a table-header counter (producer-only writer: load + store).
    #[inline(always)]
    fn th_add(&self, t: usize, w: usize, v: u64) -> u64 {
        let a = self.th(t, w);
        let n = a.load(Ordering::Relaxed).wrapping_add(v);
        a.store(n, Ordering::Relaxed);
        n
    }

    /// Word `w` (0..4) of slot `i` of the table at `t`.
    #[inline(always)]
    fn slot(&self, t: usize, i: usize, w: usize) -> &AtomicU64 {
        // SAFETY: `i & mask` indexes the table's `mask + 1` slots (invariant), `w & 3`
        // one of the slot's four words.
        unsafe { self.word(t + TABLE_HEADER_SIZE + (i & self.mask) * SLOT_SIZE + (w & 3) * 8) }
    }

    /// Word `w` of stack entry `i` of the table at `t`.
    #[inline(always)]
    fn stack_word(&self, t: usize, i: usize, w: usize) -> &AtomicU64 {
        let w = w % (self.stack_entry / 8).max(1);
        // SAFETY: `i & stack_mask` indexes the table's stack entries and `w` a word of
        // the entry (invariant); only called when the table has stacks
        // (`stack_entry > 0`).
        unsafe {
            self.word(t + self.stack_slots_off + (i & self.stack_mask) * self.stack_entry + w * 8)
        }
    }

    /// Closes the current interval at `now` with `reason` (`IV_FL_CLOSED_*`), publishes
    /// it and opens the next one in the other table — if the consumer has acknowledged
    /// the previously published interval. Returns whether it switched.
    pub(crate) fn try_switch(&mut self, now: u64, reason: u32) -> bool {
        let cur = self.priv_get(PRIV_CUR);
        // Our own store: relaxed.
        let published = self.control(C_PUBLISHED).load(Ordering::Relaxed);
        // Acquire: the consumer's reads of the other table (interval `published`)
        // happen before its release store of U_ACK, hence before our writes below.
        let ack = self.control(U_ACK).load(Ordering::Acquire);
        if ack != published {
            let w = self.control(C_SWITCH_WAITS);
            w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            return false;
        }
        let t = self.table(cur);
        self.th(t, T_END).store(now, Ordering::Relaxed);
        let flags = self.th(t, T_FLAGS).load(Ordering::Relaxed) | u64::from(reason);
        self.th(t, T_FLAGS).store(flags, Ordering::Relaxed);
        // Release: every write to table `cur` happens before the consumer's acquire
        // load that sees `published == cur`.
        self.control(C_PUBLISHED).store(cur, Ordering::Release);

        let next = cur.wrapping_add(1);
        let n = self.table(next);
        self.th(n, T_SEQ).store(next, Ordering::Relaxed);
        self.th(n, T_START).store(now, Ordering::Relaxed);
        self.th(n, T_END).store(now, Ordering::Relaxed);
        for w in (T_SAMPLES..TABLE_HEADER_SIZE).step_by(8) {
            self.th(n, w).store(0, Ordering::Relaxed);
        }
        self.priv_set(PRIV_CUR, next);
        self.priv_set(PRIV_GEN, u64::from(gen_of(next)));
        self.control(C_ACTIVE).store(next, Ordering::Relaxed);
        true
    }

    /// `restart`: switch now (the consumer asked), closing at the last sample's time.
    pub(crate) fn restart_switch(&mut self) -> bool {
        let cur = self.priv_get(PRIV_CUR);
        let now = match self.priv_get(PRIV_LAST_TIME) {
            NO_TIME => self.th(self.table(cur), T_START).load(Ordering::Relaxed),
            t => t,
        };
        let req = self.control(U_REQ).load(Ordering::Relaxed);
        let switched = self.try_switch(now, IV_FL_CLOSED_RESTART);
        if switched {
            self.priv_set(PRIV_SEEN_REQ, req);
        }
        switched
    }

    /// Finds or stores the stack in `scratch[..n]` in the table at `t`; returns its id.
    fn stack_id(&mut self, t: usize, gen: u32, n: usize, flags: u32) -> u32 {
        let scratch = |i: usize| {
            // SAFETY: `i <= max_depth` (callers), inside the scratch (invariant), which
            // is the producer's alone.
            unsafe { self.base.add(SCRATCH_OFFSET + 8 * i).cast::<u64>().read() }
        };
        let mut h = K1 ^ n as u64;
        for i in 0..n {
            h = (h ^ scratch(i)).wrapping_mul(K2).rotate_left(29);
        }
        let tag = u64::from(gen) | (n as u64) << 32 | u64::from(flags) << 48;
        let probe = self.probe.min(self.stack_mask + 1);
        let start = (h >> 20) as usize;
        for j in 0..probe {
            let i = start.wrapping_add(j) & self.stack_mask;
            let have = self.stack_word(t, i, 0).load(Ordering::Relaxed);
            if have as u32 != gen {
                for f in 0..n {
                    self.stack_word(t, i, 2 + f)
                        .store(scratch(f), Ordering::Relaxed);
                }
                self.stack_word(t, i, 1).store(h, Ordering::Relaxed);
                self.stack_word(t, i, 0).store(tag, Ordering::Relaxed);
                self.th_add(t, T_STACK_USED, 1);
                return i as u32 + 1;
            }
            if have == tag
                && self.stack_word(t, i, 1).load(Ordering::Relaxed) == h
                && (0..n)
                    .all(|f| self.stack_word(t, i, 2 + f).load(Ordering::Relaxed) == scratch(f))
            {
                return i as u32 + 1;
            }
        }
        self.th_add(t, T_STACK_MISSES, 1);
        STACK_ID_LOST
    }

    /// Captures the kernel (`kernel`) or user stack through `services` (up to the
    /// depth limit) and returns its id; [`STACK_ID_NONE`] if that kind is off, the
    /// stack is empty, or the service is absent (then flagged in the table's flags).
    fn capture(&mut self, t: usize, gen: u32, services: Option<&Services>, kernel: bool) -> u32 {
        let (depth, f, missing) = match (kernel, services) {
            (true, s) => (
                self.kdepth,
                s.and_then(|s| s.kernel_stack),
                IV_FL_NO_KSTACK_SERVICE,
            ),
            (false, s) => (
                self.udepth,
                s.and_then(|s| s.user_stack),
                IV_FL_NO_USTACK_SERVICE,
            ),
        };
        let ctx = services.map_or(core::ptr::null_mut(), |s| s.ctx);
        if depth == 0 {
            return STACK_ID_NONE;
        }
        let Some(f) = f else {
            let fl = self.th(t, T_FLAGS);
            fl.store(
                fl.load(Ordering::Relaxed) | u64::from(missing),
                Ordering::Relaxed,
            );
            return STACK_ID_NONE;
        };
        // SAFETY: the scratch holds `max_depth + 1 >= depth + 1` words (invariant), is
        // the producer's alone, and the service writes at most `max` frames there (the
        // Services contract); `ctx` is the core's.
        let got =
            unsafe { f(ctx, self.base.add(SCRATCH_OFFSET).cast::<u64>(), depth + 1) } as usize;
        let depth = depth as usize;
        let mut flags = if kernel { STACK_FL_KERNEL } else { 0 };
        let n = if got > depth {
            flags |= STACK_FL_TRUNCATED;
            self.th_add(t, T_STACK_TRUNC, 1);
            depth
        } else {
            got
        };
        if n == 0 {
            return STACK_ID_NONE;
        }
        self.stack_id(t, gen, n, flags)
    }

    /// The handler: counts `arg` into the active table, then switches if the table is
    /// full enough or the consumer asked. Returns `CTRL_*` bits.
    #[inline(always)]
    pub(crate) fn handle(&mut self, arg: &OverflowArg, services: Option<&Services>) -> u32 {
        let kind = fresh(&arg.kind);
        let mut ctrl = if kind == SAMPLE_OVERFLOW {
            CTRL_RESET
        } else {
            0
        };
        let cfg = self.priv_get(PRIV_CFG);
        let key = (cfg & 0xff) as u32;
        let counter = (cfg >> 8 & 0xff) as usize;
        let cur = self.priv_get(PRIV_CUR);
        let gen = self.priv_get(PRIV_GEN) as u32;
        let t = self.table(cur);
        let now = arg.time_ns;

        let nr = (fresh(&arg.nr_counters) as usize).min(MAX_COUNTERS);
        let delta = if counter < nr {
            let v = arg.values[counter % MAX_COUNTERS];
            let d = v.wrapping_sub(self.priv_get(PRIV_LAST));
            self.priv_set(PRIV_LAST, v);
            if fresh(&arg.multi_wrap) >> counter & 1 != 0 {
                self.th_add(t, T_MULTI_WRAPS, 1);
            }
            d
        } else {
            0
        };
        if self.priv_get(PRIV_LAST_TIME) == NO_TIME {
            // The first sample on this CPU opens the interval.
            self.th(t, T_START).store(now, Ordering::Relaxed);
        }
        self.priv_set(PRIV_LAST_TIME, now);

        let pid = fresh(&arg.pid);
        let (k0, pid) = match key {
            KEY_IP => (arg.ip, 0),
            KEY_PID_IP => (arg.ip, pid),
            _ => {
                let kid = self.capture(t, gen, services, true);
                let uid = self.capture(t, gen, services, false);
                (u64::from(kid) << 32 | u64::from(uid), pid)
            }
        };

        // Linear probing, bounded: an empty slot (older generation) ends the chain.
        let want = u64::from(gen) | u64::from(pid) << 32;
        let mut i = hash(k0, pid) as usize;
        let mut placed = false;
        for _ in 0..self.probe {
            let tag = self.slot(t, i, 1).load(Ordering::Relaxed);
            if tag as u32 != gen {
                self.slot(t, i, 0).store(k0, Ordering::Relaxed);
                self.slot(t, i, 1).store(want, Ordering::Relaxed);
                self.slot(t, i, 2).store(1, Ordering::Relaxed);
                self.slot(t, i, 3).store(delta, Ordering::Relaxed);
                self.th_add(t, T_USED, 1);
                placed = true;
                break;
            }
            if tag == want && self.slot(t, i, 0).load(Ordering::Relaxed) == k0 {
                let c = self.slot(t, i, 2);
                c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
                let s = self.slot(t, i, 3);
                s.store(
                    s.load(Ordering::Relaxed).wrapping_add(delta),
                    Ordering::Relaxed,
                );
                placed = true;
                break;
            }
            i = i.wrapping_add(1);
        }
        if !placed {
            self.th_add(t, T_OTHER_COUNT, 1);
            self.th_add(t, T_OTHER_SUM, delta);
            self.th_add(t, T_MISSES, 1);
        }
        self.th_add(t, T_SAMPLES, 1);
        self.th_add(t, T_SUM, delta);

        // Evaluated at every sample, not only when a slot is taken: a full table whose
        // switch was postponed switches as soon as the consumer has caught up.
        let used = self.th(t, T_USED).load(Ordering::Relaxed);
        let auto = used >= self.priv_get(PRIV_THRESHOLD)
            || (key == KEY_STACK
                && self.th(t, T_STACK_USED).load(Ordering::Relaxed)
                    >= self.priv_get(PRIV_STACK_THRESHOLD));
        let req = self.control(U_REQ).load(Ordering::Relaxed);
        let requested = req != self.priv_get(PRIV_SEEN_REQ);
        if auto || requested {
            let reason = if requested {
                IV_FL_CLOSED_REQUEST
            } else {
                IV_FL_CLOSED_AUTO
            };
            if self.try_switch(now, reason) {
                self.priv_set(PRIV_SEEN_REQ, req);
                ctrl |= CTRL_SWITCH | CTRL_NOTIFY;
            } else if auto && self.priv_get(PRIV_NOTIFIED) != cur {
                // Full enough but the consumer still holds the other table: wake it
                // once per interval; counting goes on in this table meanwhile.
                self.priv_set(PRIV_NOTIFIED, cur);
                ctrl |= CTRL_NOTIFY;
            }
        }
        ctrl
    }
}

/// Reads one scalar of the `OverflowArg` on its own (see the delta format: a load
/// merged across two of the core's fresh stores stalls store forwarding).
#[inline(always)]
fn fresh<T: Copy>(field: &T) -> T {
    // SAFETY: a reference is valid for reads and aligned.
    unsafe { core::ptr::read_volatile(field) }
}
