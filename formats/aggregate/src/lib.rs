//! The aggregating format: per-CPU hash tables of sample counts and counter sums per
//! key, double-buffered, read by userspace in place — OProfile-on-perfmon2's in-kernel
//! aggregation (`oprofile_fmt`) and BCC `profile`'s `BPF_HASH` + `BPF_STACK_TRACE`, as
//! an hrperf format. Only distinct keys and their counts cross to userspace.
//!
//! The format registers [`AGGREGATE_OPS`] (name `"aggregate"`, UUID [`AGGREGATE_UUID`],
//! version 1.0). Its buffer layout is in [`layout`], the handler in `producer`, the
//! reader in [`consumer`], the capture records in [`record`].
//!
//! # Keys, counts and sums
//!
//! Each sample is counted under one key ([`AggregateArg::key`]): the IP
//! ([`KEY_IP`]), `(pid, IP)` ([`KEY_PID_IP`]), or
//! `(pid, kernel stack id, user stack id)` ([`KEY_STACK`]), with the
//! stacks, captured through [`Services`], stored once each in a stack table beside the
//! key table. Without a stack service the id is [`STACK_ID_NONE`](record::STACK_ID_NONE)
//! and the interval's `IV_FL_NO_*STACK_SERVICE` flag records why; a stack the stack
//! table has no slot for gets [`STACK_ID_LOST`](record::STACK_ID_LOST) and is counted in
//! `stack_misses`; a stack cut at the depth limit is flagged and counted in
//! `stack_truncated`.
//!
//! Each key carries `count` (samples) and `sum`: the sum of one counter's
//! ([`AggregateArg::counter`]) 64-bit deltas, each sample's delta being the counter's
//! value minus its value at this CPU's previous sample (the first sample's delta counts
//! from the session start, where virtual counters are 0), exactly as the delta format
//! computes them. A delta whose counter may have wrapped more than once is a lower bound
//! and counted in `multi_wraps`.
//!
//! # Nothing is lost: the conservation invariant
//!
//! Keys live in a fixed table of `slots` (a power of two) with linear probing bounded by
//! `probe` slots. Every sample of an interval lands in **exactly one** place: a table
//! slot, or the interval's `other` bucket. Hence, per interval and exactly:
//!
//! ```text
//! samples   == Σ slot.count + other_count
//! sum_total == Σ slot.sum   + other_sum
//! misses    == the samples that went to `other` because no slot was found within the
//!              probe bound (in this version that is the only way into `other`, so
//!              misses == other_count; they are separate fields so that a later version
//!              may route other samples there — the issue's "counts + other + misses")
//! ```
//!
//! and over a CPU's whole session, every dispatched sample (`BufferHeader::overflows`) is
//! in exactly one interval, and the sums of all intervals add up to the counter's value
//! at the last sample. Stack-table overflow does not lose samples either: the sample is
//! counted under `STACK_ID_LOST`, and `stack_misses` says how many stacks were not kept.
//!
//! # Double buffering
//!
//! Each buffer holds two tables. The handler counts into the **active** one; a
//! **switch** closes it (end time, flags), publishes it, and opens the other table as the
//! next interval. Switches happen in producer context only:
//!
//! - in the handler, when the active table reaches the fill threshold
//!   ([`AggregateArg::switch_permille`] of the slots, or of the stack slots), returning
//!   `CTRL_SWITCH | CTRL_NOTIFY`;
//! - in the handler, at the next sample after the consumer asked (its request counter
//!   `U_REQ` changed; [`consumer::AggView::request_switch`]);
//! - in `restart` (the RESTART ioctl / `CpuSession::restart`), which switches at once —
//!   the way to close an interval on a CPU that has no samples, and at the end.
//!
//! Userspace reads the published table **in place** (zero-copy) while the handler keeps
//! counting into the other: there is no blind spot, the intervals tile the session. A
//! switch needs the previously published table to have been acknowledged by the
//! consumer; until then the handler keeps counting into the active table (the interval
//! simply gets longer, and its overflow goes to `other`), returns `CTRL_NOTIFY` once to
//! wake the reader, and counts the postponed switches in `C_SWITCH_WAITS`. `restart`
//! returns `-EBUSY` then.
//!
//! Each table's header carries the interval's sequence number, start and end time,
//! samples, sums and the counters above, so a capture keeps every interval and reports
//! can show aggregates over time. Interval `seq` (1, 2, …) lives in table `seq & 1`. An
//! interval starts at the switch that opened it (the first one at its first sample) and
//! ends at the switch that closed it: the time of the sample that triggered it, or for
//! `restart` the time of the last sample counted.
//!
//! # Handoff: the lock-free protocol
//!
//! One producer per buffer (the handler, on the buffer's CPU, and `restart`, which the
//! core never runs concurrently with it) and one consumer (any CPU). Shared words:
//!
//! | word | written by | meaning |
//! |---|---|---|
//! | `C_PUBLISHED` | producer (release) | the last closed interval; the consumer may read its table |
//! | `U_ACK` | consumer (release) | the last interval the consumer has finished reading |
//! | `U_REQ` | consumer (relaxed) | switch requests made so far |
//!
//! ```text
//! producer (switch, producer context)          consumer (any thread / CPU)
//!   ack = U_ACK.load(Acquire)                    p = C_PUBLISHED.load(Acquire)
//!   if ack != C_PUBLISHED: postpone              if p == U_ACK: nothing pending
//!   write T[cur].end, flags                      read T[p & 1] in place (relaxed loads)
//!   C_PUBLISHED.store(cur, Release)   ───────►   ...
//!   reset header of T[(cur+1) & 1]   ◄───────    U_ACK.store(p, Release)
//!   cur += 1 (new generation)                    U_REQ += 1          (optional)
//! ```
//!
//! - The release store of `C_PUBLISHED` and the consumer's acquire load make every
//!   write to the closed table visible before the consumer reads it.
//! - The consumer's release store of `U_ACK` and the producer's acquire load make every
//!   read of that table happen before the producer writes it again (it becomes the
//!   active table only at the switch after the ack).
//! - So the producer writes only the table the consumer is not reading, and the
//!   consumer reads only a table the producer has published and not reused: no torn
//!   reads, no locks, no fences on the handler's path (its per-sample cost is one
//!   relaxed load of `U_REQ`, which the consumer writes rarely, on its own cache line).
//! - Tables are emptied by bumping a generation tag ([`layout::gen_of`]) that every
//!   slot and stack entry carries, not by clearing memory: a switch is O(1) in the
//!   interrupt handler. The consumer reads only slots of the interval's generation.
//! - All shared words are accessed atomically (relaxed where no ordering is needed),
//!   so even a misbehaving consumer cannot make the producer read or write out of
//!   bounds; a bogus `U_ACK` only stalls switching (counting goes on).
//!
//! Over `/dev/hrperf` the mapping is read-only: the reader hands the sequence number to
//! the kernel, which stores `U_ACK` ([`consumer::AggView::ack_seq`]), then restarts.
//!
//! # Control bits
//!
//! `CTRL_RESET` for overflow samples (re-arm the counter); `CTRL_SWITCH | CTRL_NOTIFY`
//! when the handler switched; `CTRL_NOTIFY` once per interval when the threshold is
//! reached but the consumer has not acknowledged yet. The format never masks.
//!
//! # Argument
//!
//! [`AggregateArg`], optional, ABI rules of `hrperf_abi` (sized, append-only, zero means
//! the default, unknown non-zero tail → `E2BIG`, reserved and unknown flags → `EINVAL`).

#![no_std]
#![warn(missing_docs)]

pub mod consumer;
pub mod layout;
mod producer;
pub mod record;

use core::mem::offset_of;
use core::sync::atomic::{AtomicU64, Ordering};

use hrperf_abi::errno::{E2BIG, EBUSY, EFAULT, EINVAL};
use hrperf_abi::format::{
    FormatOps, OverflowArg, Services, SessionParams, Uuid, CTRL_NOTIFY, CTRL_SWITCH,
    FMT_FL_INTERVALS, FMT_FL_STACKS, FORMAT_ABI_VERSION, MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL,
};
use hrperf_abi::{BufferHeader, MAX_COUNTERS};
use hrperf_engine::Buffer;

use layout::*;
use producer::Prod;
use record::{KEY_IP, KEY_PID_IP, KEY_STACK, MAX_STACK_DEPTH};

/// The aggregating format's UUID.
pub const AGGREGATE_UUID: Uuid = Uuid([
    0x3f, 0x1c, 0x8a, 0x52, 0x6e, 0x07, 0x4b, 0x9d, 0xa4, 0x2e, 0x71, 0xc5, 0x0b, 0xd8, 0x93, 0x66,
]);
/// The aggregating format's name.
pub const AGGREGATE_NAME: &str = "aggregate";
/// The aggregating format's version, `major << 16 | minor` (1.0).
pub const AGGREGATE_VERSION: u32 = 0x0001_0000;

/// [`AggregateArg::flags`]: never switch at the fill threshold, only on the consumer's
/// request or `restart`.
pub const AGG_ARG_FL_NO_AUTO_SWITCH: u32 = 1 << 0;
/// [`AggregateArg::flags`]: `KEY_STACK` without kernel stacks (their ids are
/// `STACK_ID_NONE`; the service is not called).
pub const AGG_ARG_FL_NO_KSTACK: u32 = 1 << 1;
/// [`AggregateArg::flags`]: `KEY_STACK` without user stacks.
pub const AGG_ARG_FL_NO_USTACK: u32 = 1 << 2;
/// All defined [`AggregateArg::flags`].
pub const AGG_ARG_FLAGS: u32 =
    AGG_ARG_FL_NO_AUTO_SWITCH | AGG_ARG_FL_NO_KSTACK | AGG_ARG_FL_NO_USTACK;

/// The format's optional argument. Every field's zero is its default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggregateArg {
    /// Bytes filled by the caller: [`AGGREGATE_ARG_SIZE`] or more.
    pub size: u32,
    /// `AGG_ARG_FL_*`.
    pub flags: u32,
    /// `KEY_*` of [`record`] (0: `KEY_IP`).
    pub key: u32,
    /// Table slots, a power of two in `16..=2^20` (0: 4096).
    pub slots: u32,
    /// Slots probed before a sample goes to "other", `1..=slots` (0: 16).
    pub probe: u32,
    /// Index of the counter whose deltas are summed (0: the first counter).
    pub counter: u32,
    /// Switch when this many per mille of the slots are used, `1..=1000` (0: 750).
    pub switch_permille: u32,
    /// Stack-table slots for `KEY_STACK`, a power of two in `16..=2^20` (0: 1024).
    pub stack_slots: u32,
    /// Kernel stack depth limit for `KEY_STACK`, ≤ 128 (0: 32).
    pub kstack_depth: u32,
    /// User stack depth limit for `KEY_STACK`, ≤ 128 (0: 32).
    pub ustack_depth: u32,
    /// Reserved, zero.
    pub reserved: [u32; 2],
}
/// Size of [`AggregateArg`] in this version.
pub const AGGREGATE_ARG_SIZE: usize = core::mem::size_of::<AggregateArg>();
const _: () = assert!(AGGREGATE_ARG_SIZE == 48);

impl AggregateArg {
    /// The argument as bytes (native endian), to pass as the format argument;
    /// `size` is set to [`AGGREGATE_ARG_SIZE`] if it is 0.
    pub fn to_bytes(&self) -> [u8; AGGREGATE_ARG_SIZE] {
        let size = if self.size == 0 {
            AGGREGATE_ARG_SIZE as u32
        } else {
            self.size
        };
        let words = [
            size,
            self.flags,
            self.key,
            self.slots,
            self.probe,
            self.counter,
            self.switch_permille,
            self.stack_slots,
            self.kstack_depth,
            self.ustack_depth,
            self.reserved[0],
            self.reserved[1],
        ];
        let mut b = [0u8; AGGREGATE_ARG_SIZE];
        for (c, w) in b.chunks_exact_mut(4).zip(words) {
            c.copy_from_slice(&w.to_ne_bytes());
        }
        b
    }
}

/// Parses the format argument; `Err` holds the positive errno.
pub fn parse_arg(arg: &[u8]) -> Result<AggregateArg, i32> {
    if arg.is_empty() {
        return Ok(AggregateArg::default());
    }
    let word = |i: usize| {
        arg.get(4 * i..4 * i + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    let mut w = [0u32; AGGREGATE_ARG_SIZE / 4];
    for (i, v) in w.iter_mut().enumerate() {
        *v = word(i).ok_or(EINVAL)?;
    }
    if w[0] as usize != arg.len() {
        return Err(EINVAL);
    }
    if arg
        .get(AGGREGATE_ARG_SIZE..)
        .unwrap_or(&[])
        .iter()
        .any(|&b| b != 0)
    {
        return Err(E2BIG);
    }
    let a = AggregateArg {
        size: w[0],
        flags: w[1],
        key: w[2],
        slots: w[3],
        probe: w[4],
        counter: w[5],
        switch_permille: w[6],
        stack_slots: w[7],
        kstack_depth: w[8],
        ustack_depth: w[9],
        reserved: [w[10], w[11]],
    };
    if a.flags & !AGG_ARG_FLAGS != 0 || a.reserved != [0, 0] {
        return Err(EINVAL);
    }
    Ok(a)
}

/// Checks the session for this format; `Err` holds the positive errno.
pub fn check_params(p: &SessionParams) -> Result<(), i32> {
    let known_mode = matches!(p.mode, MODE_OVERFLOW | MODE_POLL | MODE_INSTRUCTED);
    let nr_ok = (1..=MAX_COUNTERS as u32).contains(&p.nr_counters);
    if (p.size as usize) < core::mem::size_of::<SessionParams>() || !known_mode || !nr_ok {
        return Err(EINVAL);
    }
    Ok(())
}

/// The validated configuration for `params` and `arg` (defaults applied); `Err` holds
/// the positive errno.
pub fn config(params: &SessionParams, arg: &AggregateArg) -> Result<Config, i32> {
    check_params(params)?;
    let or = |v: u32, d: u32| if v == 0 { d } else { v };
    let key = or(arg.key, KEY_IP);
    let slots = or(arg.slots, DEFAULT_SLOTS);
    let probe = or(arg.probe, DEFAULT_PROBE).min(slots);
    let permille = or(arg.switch_permille, DEFAULT_SWITCH_PERMILLE);
    let stacks = key == KEY_STACK;
    let pow2 = |n: u32| n.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&n);
    if !matches!(key, KEY_IP | KEY_PID_IP | KEY_STACK)
        || !pow2(slots)
        || arg.probe > slots
        || permille > 1000
        || arg.counter >= params.nr_counters
    {
        return Err(EINVAL);
    }
    // Stack settings only make sense with stack keys.
    let stack_flags = AGG_ARG_FL_NO_KSTACK | AGG_ARG_FL_NO_USTACK;
    if !stacks
        && ((arg.stack_slots | arg.kstack_depth | arg.ustack_depth) != 0
            || arg.flags & stack_flags != 0)
    {
        return Err(EINVAL);
    }
    let stack_slots = if stacks {
        or(arg.stack_slots, DEFAULT_STACK_SLOTS)
    } else {
        0
    };
    let depth = |d: u32, off: u32| match stacks && arg.flags & off == 0 {
        true => or(d, DEFAULT_STACK_DEPTH),
        false => 0,
    };
    let (kdepth, udepth) = (
        depth(arg.kstack_depth, AGG_ARG_FL_NO_KSTACK),
        depth(arg.ustack_depth, AGG_ARG_FL_NO_USTACK),
    );
    if (stacks && !pow2(stack_slots))
        || kdepth as usize > MAX_STACK_DEPTH
        || udepth as usize > MAX_STACK_DEPTH
    {
        return Err(EINVAL);
    }
    let at = |n: u32| (u64::from(n) * u64::from(permille)).div_ceil(1000).max(1);
    let auto = arg.flags & AGG_ARG_FL_NO_AUTO_SWITCH == 0;
    let cfg = Config {
        key,
        counter: arg.counter,
        slots,
        probe,
        threshold: if auto { at(slots) } else { u64::MAX },
        stack_slots,
        kdepth,
        udepth,
        stack_threshold: if auto && stacks {
            at(stack_slots)
        } else {
            u64::MAX
        },
    };
    cfg.layout().ok_or(EINVAL)?;
    Ok(cfg)
}

/// The table to register: `hrperf_register_format(&AGGREGATE_OPS)` in the kernel,
/// `Registry::register_static(&AGGREGATE_OPS)` in userspace.
pub static AGGREGATE_OPS: FormatOps = FormatOps {
    size: core::mem::size_of::<FormatOps>() as u32,
    abi_version: FORMAT_ABI_VERSION,
    name: match hrperf_abi::fixed_name(AGGREGATE_NAME) {
        Some(n) => n,
        None => [0; hrperf_abi::NAME_LEN],
    },
    uuid: AGGREGATE_UUID,
    version: AGGREGATE_VERSION,
    arg_size: AGGREGATE_ARG_SIZE as u32,
    flags: FMT_FL_STACKS | FMT_FL_INTERVALS,
    reserved: 0,
    owner: core::ptr::null_mut(),
    validate: Some(aggregate_validate),
    getsize: Some(aggregate_getsize),
    init: Some(aggregate_init),
    handler: Some(aggregate_handler),
    restart: Some(aggregate_restart),
    exit: Some(aggregate_exit),
    start: None,
    stop: None,
};

/// Reads the C arguments of validate/getsize/init; `Err` holds the positive errno.
///
/// # Safety
///
/// `params` is null or valid for reads; `arg` is valid for `arg_len` bytes of reads if
/// `arg_len > 0`.
unsafe fn c_config(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> Result<Config, i32> {
    // SAFETY: forwarded contract.
    let (params, arg) = unsafe { hrperf_engine::callback::session_args(params, arg, arg_len) }?;
    config(params, &parse_arg(arg)?)
}

/// `validate` callback.
///
/// # Safety
///
/// The `ValidateFn` contract: `params` valid for reads, `arg` for `arg_len` bytes.
pub unsafe extern "C" fn aggregate_validate(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { c_config(params, arg, arg_len) } {
        Ok(_) => 0,
        Err(e) => -e,
    }
}

/// `getsize` callback: header, private words and scratch, control, two tables.
///
/// # Safety
///
/// The `GetSizeFn` contract: as `validate`, and `size` valid for a write.
pub unsafe extern "C" fn aggregate_getsize(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
    size: *mut u64,
) -> i32 {
    // SAFETY: forwarded contract.
    let l = match unsafe { c_config(params, arg, arg_len) }.map(|c| c.layout()) {
        Ok(Some(l)) => l,
        Ok(None) => return -EINVAL,
        Err(e) => return -e,
    };
    // SAFETY: forwarded contract.
    unsafe { hrperf_engine::callback::write_size(size, l.buf_size) }
}

/// Lays out a buffer for `cfg` (what `init` does): zeroes the format's area, writes the
/// private words, the control block and the first interval's table header, and sets
/// the header's `data_offset`/`data_size`.
pub fn init_buffer(buf: &mut Buffer<'_>, cfg: &Config) -> Result<(), i32> {
    let l = cfg.layout().ok_or(EINVAL)?;
    if (buf.len() as u64) < l.buf_size {
        return Err(EINVAL);
    }
    let base = buf.as_mut_ptr();
    let store = |off: u64, v: u64| {
        // SAFETY: `off` is 8-aligned and `off + 8 <= buf_size <= len` (callers below);
        // the buffer is not shared during init, atomics keep later readers race-free.
        unsafe { AtomicU64::from_ptr(base.add(off as usize).cast::<u64>()) }
            .store(v, Ordering::Relaxed)
    };
    for off in (PRIV_OFFSET as u64..l.buf_size).step_by(8) {
        store(off, 0);
    }
    let p = |i: usize, v: u64| store((PRIV_OFFSET + 8 * i) as u64, v);
    p(PRIV_CUR, 1);
    p(PRIV_GEN, u64::from(gen_of(1)));
    p(PRIV_LAST, 0);
    p(PRIV_LAST_TIME, NO_TIME);
    p(PRIV_SEEN_REQ, 0);
    p(PRIV_NOTIFIED, 0);
    p(PRIV_CFG, u64::from(cfg.key) | u64::from(cfg.counter) << 8);
    p(PRIV_MASK, u64::from(cfg.slots) - 1);
    p(PRIV_PROBE, u64::from(cfg.probe));
    p(PRIV_THRESHOLD, cfg.threshold);
    p(PRIV_TABLE0, l.table0);
    p(PRIV_TABLE_BYTES, l.table_bytes);
    p(
        PRIV_STACK_MASK,
        u64::from(cfg.stack_slots.saturating_sub(1)),
    );
    p(
        PRIV_DEPTHS,
        u64::from(cfg.kdepth) | u64::from(cfg.udepth) << 16,
    );
    p(PRIV_STACK_THRESHOLD, cfg.stack_threshold);
    let c = |w: usize, v: u64| store(l.data_offset + w as u64, v);
    c(C_KEY, u64::from(cfg.key) | u64::from(cfg.counter) << 32);
    c(C_SLOTS, u64::from(cfg.slots) | u64::from(cfg.probe) << 32);
    c(
        C_STACKS,
        u64::from(cfg.stack_slots) | u64::from(cfg.kdepth) << 32 | u64::from(cfg.udepth) << 48,
    );
    c(C_TABLE_BYTES, l.table_bytes);
    c(C_ACTIVE, 1);
    let first = l.table0 + table_of(1) as u64 * l.table_bytes;
    store(first + T_SEQ as u64, 1);
    c(C_MAGIC, CONTROL_MAGIC);
    store(offset_of!(BufferHeader, data_offset) as u64, l.data_offset);
    store(offset_of!(BufferHeader, data_size) as u64, l.data_size);
    // Last: the handler checks it before anything else.
    p(PRIV_MAGIC, PRIV_MAGIC_VALUE);
    Ok(())
}

/// `init` callback; see [`init_buffer`].
///
/// # Safety
///
/// The `InitFn` contract: `buf` is this CPU's buffer of `buf_len` bytes (8-aligned,
/// header filled), exclusively the format's during the call; the rest as `validate`.
pub unsafe extern "C" fn aggregate_init(
    buf: *mut u8,
    buf_len: usize,
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    let cfg = match unsafe { c_config(params, arg, arg_len) } {
        Ok(c) => c,
        Err(e) => return -e,
    };
    let Some(ptr) = core::ptr::NonNull::new(buf) else {
        return -EFAULT;
    };
    // SAFETY: the core's buffer, valid and ours for the call (contract).
    let mut b = match unsafe { Buffer::from_raw(ptr, buf_len) } {
        Ok(b) => b,
        Err(e) => return -e.errno(),
    };
    match init_buffer(&mut b, &cfg) {
        Ok(()) => 0,
        Err(e) => -e,
    }
}

/// `handler` callback; see [`handle`].
///
/// # Safety
///
/// The `HandlerFn` contract: `buf` as for `init` (after `init`), `arg` valid for reads,
/// `services` null or valid for reads (its `size` says which fields are).
pub unsafe extern "C" fn aggregate_handler(
    buf: *mut u8,
    buf_len: usize,
    arg: *const OverflowArg,
    services: *const Services,
) -> u32 {
    // SAFETY: null or valid for reads, the caller's contract.
    let Some(arg) = (unsafe { arg.as_ref() }) else {
        return 0;
    };
    // SAFETY: as above.
    let services = unsafe { services.as_ref() }
        .filter(|s| s.size >= Services::V1_SIZE);
    // SAFETY: the core's buffer, valid for `buf_len` bytes, and we are its producer
    // (the HandlerFn contract).
    match unsafe { Prod::new(buf, buf_len) } {
        Some(mut p) => p.handle(arg, services),
        None => 0,
    }
}

/// The handler's logic on a wrapped buffer (for userspace callers and benchmarks):
/// counts `arg` under its key in the active table, switching when due. Returns
/// `CTRL_*` bits (see the crate docs); 0 if `buf` was not initialised by this format.
#[inline]
pub fn handle(buf: &mut Buffer<'_>, arg: &OverflowArg, services: Option<&Services>) -> u32 {
    let len = buf.len();
    // SAFETY: `&mut Buffer` is the producer's handle on valid memory of `len` bytes.
    match unsafe { Prod::new(buf.as_mut_ptr(), len) } {
        Some(mut p) => p.handle(arg, services),
        None => 0,
    }
}

/// Switches now (what `restart` does): publishes the active interval and opens the
/// next. `Err(EBUSY)` if the consumer has not acknowledged the previous interval,
/// `Err(EINVAL)` if `buf` is not this format's.
pub fn switch(buf: &mut Buffer<'_>) -> Result<(), i32> {
    let len = buf.len();
    // SAFETY: as in `handle`.
    let mut p = unsafe { Prod::new(buf.as_mut_ptr(), len) }.ok_or(EINVAL)?;
    if p.restart_switch() {
        Ok(())
    } else {
        Err(EBUSY)
    }
}

/// `restart` callback: switches now ([`switch`]); `*ctrl` gets `CTRL_SWITCH |
/// CTRL_NOTIFY`. Returns `-EBUSY` (and no bits) until the consumer has acknowledged
/// the previously published interval.
///
/// # Safety
///
/// The `RestartFn` contract: `buf` as for `init` (never concurrent with the handler),
/// `ctrl` null or valid for a write.
pub unsafe extern "C" fn aggregate_restart(buf: *mut u8, buf_len: usize, ctrl: *mut u32) -> i32 {
    // SAFETY: the core's buffer, valid for `buf_len` bytes, and restart is producer
    // context (never concurrent with the handler).
    let res = match unsafe { Prod::new(buf, buf_len) } {
        Some(mut p) => match p.restart_switch() {
            true => Ok(CTRL_SWITCH | CTRL_NOTIFY),
            false => Err(EBUSY),
        },
        None => Err(EINVAL),
    };
    let bits = res.unwrap_or(0);
    if !ctrl.is_null() {
        // SAFETY: non-null and writable, the caller's contract.
        unsafe { ctrl.write(bits) };
    }
    match res {
        Ok(_) => 0,
        Err(e) => -e,
    }
}

/// `exit` callback: nothing to free (the core owns the buffer).
///
/// # Safety
///
/// The `BufferFn` contract (nothing is dereferenced).
pub unsafe extern "C" fn aggregate_exit(_buf: *mut u8, _buf_len: usize) -> i32 {
    0
}

#[cfg(test)]
mod tests;
