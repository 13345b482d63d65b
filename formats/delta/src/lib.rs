//! The counter-delta format: one record per overflow or poll tick holding, for every
//! counter, the 64-bit increment since this CPU's previous *written* record.
//!
//! Record layout: [`record`]. The format registers [`DELTA_OPS`] (name `"delta"`, UUID
//! [`DELTA_UUID`], version 1.0) with the core; its buffer is a [`RingLayout`] ring with a
//! small private area holding the value each counter had at the last written record.
//!
//! Nothing is lost across a drop: `last` advances only when a record is written, so the
//! next record that fits carries the dropped records' events in its deltas, and the sum
//! of the written deltas always equals the true total. The engine's LOST record before it
//! says how many records were merged that way; multi-wrap bits of a dropped sample are
//! carried into the next written record too.
//!
//! Handler control bits: `CTRL_RESET` for overflow samples (re-arm the counter), plus
//! `CTRL_NOTIFY` while the ring is more than half full. The format never masks: a full
//! ring counts drops instead.
//!
//! The virtual counters start at 0 when a CPU session starts, so `last` starts at 0 and
//! the first record's deltas are the events since the start.
//!
//! Argument ([`DeltaArg`], optional): `{ size: 16, flags: 0, data_size }`; `data_size`
//! (or the session's `data_size_hint`) is the ring size, rounded up to a power of two,
//! 256 KiB by default, 4 KiB at least, 1 GiB at most.

#![no_std]
#![warn(missing_docs)]

pub mod record;

use core::ptr::NonNull;

use hrperf_abi::errno::{E2BIG, EFAULT, EINVAL};
use hrperf_abi::format::{
    FormatOps, OverflowArg, Services, SessionParams, Uuid, CTRL_NOTIFY, CTRL_RESET, FMT_FL_RING,
    FORMAT_ABI_VERSION, MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL, OVFL_FL_KERNEL_IP,
    SAMPLE_INSTRUCTED, SAMPLE_OVERFLOW, SAMPLE_POLL,
};
use hrperf_abi::record::{MISC_INSTRUCTED, MISC_KERNEL, MISC_MULTI_WRAP, MISC_OVERFLOW, MISC_POLL};
use hrperf_abi::{RecordType, MAX_COUNTERS};
use hrperf_engine::ring::PRIVATE_OFFSET;
use hrperf_engine::{Buffer, RingLayout, RingWriter};

use record::{DeltaSample, NO_OVERFLOW_COUNTER};

/// The delta format's UUID.
pub const DELTA_UUID: Uuid = Uuid([
    0x5a, 0x4e, 0xf3, 0x2d, 0xa1, 0x59, 0x26, 0xa8, 0xbd, 0x1a, 0xe9, 0xad, 0x0c, 0xfd, 0x4d, 0xdb,
]);
/// The delta format's name.
pub const DELTA_NAME: &str = "delta";
/// The delta format's version, `major << 16 | minor` (1.0).
pub const DELTA_VERSION: u32 = 0x0001_0000;

/// Ring size when neither the argument nor the session asks for one.
pub const DEFAULT_DATA_SIZE: u64 = 256 << 10;
/// Smallest ring.
pub const MIN_DATA_SIZE: u64 = 4 << 10;
/// Largest ring.
pub const MAX_DATA_SIZE: u64 = 1 << 30;

/// The format's optional argument (ABI rules of `hrperf_abi`: sized, append-only, zero
/// means default, unknown non-zero tail → `E2BIG`, reserved/unknown flags → `EINVAL`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeltaArg {
    /// Bytes filled by the caller: [`DELTA_ARG_SIZE`] or more.
    pub size: u32,
    /// No flags are defined: must be 0.
    pub flags: u32,
    /// Ring size in bytes (0: the session's hint, else the default).
    pub data_size: u64,
}
/// Size of [`DeltaArg`] in this version.
pub const DELTA_ARG_SIZE: usize = core::mem::size_of::<DeltaArg>();
const _: () = assert!(DELTA_ARG_SIZE == 16);

impl DeltaArg {
    /// The argument as bytes (native endian), to pass as the format argument.
    pub fn to_bytes(&self) -> [u8; DELTA_ARG_SIZE] {
        let mut b = [0u8; DELTA_ARG_SIZE];
        b[0..4].copy_from_slice(&self.size.to_ne_bytes());
        b[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        b[8..16].copy_from_slice(&self.data_size.to_ne_bytes());
        b
    }
}

/// Private-area words: `last[0..8]`, then the multi-wrap bits of dropped samples.
const LAST: usize = 0;
const PENDING_MULTI_WRAP: usize = MAX_COUNTERS;
const PRIVATE_WORDS: usize = MAX_COUNTERS + 1;

/// The table to register: `hrperf_register_format(&DELTA_OPS)` in the kernel,
/// `Registry::register_static(&DELTA_OPS)` in userspace.
pub static DELTA_OPS: FormatOps = FormatOps {
    size: core::mem::size_of::<FormatOps>() as u32,
    abi_version: FORMAT_ABI_VERSION,
    name: match hrperf_abi::fixed_name(DELTA_NAME) {
        Some(n) => n,
        None => [0; hrperf_abi::NAME_LEN],
    },
    uuid: DELTA_UUID,
    version: DELTA_VERSION,
    arg_size: DELTA_ARG_SIZE as u32,
    flags: FMT_FL_RING,
    reserved: 0,
    owner: core::ptr::null_mut(),
    validate: Some(delta_validate),
    getsize: Some(delta_getsize),
    init: Some(delta_init),
    handler: Some(delta_handler),
    // Nothing to reset or free (the ring never masks; the core owns the buffer).
    restart: None,
    exit: None,
    start: None,
    stop: None,
};

/// Parses the format argument; `Err` holds the positive errno.
pub fn parse_arg(arg: &[u8]) -> Result<DeltaArg, i32> {
    if arg.is_empty() {
        return Ok(DeltaArg::default());
    }
    let (Some(size), Some(flags), Some(data_size)) = (
        arg.get(0..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes),
        arg.get(4..8)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes),
        arg.get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes),
    ) else {
        return Err(EINVAL);
    };
    if size as usize != arg.len() {
        return Err(EINVAL);
    }
    if arg
        .get(DELTA_ARG_SIZE..)
        .unwrap_or(&[])
        .iter()
        .any(|&b| b != 0)
    {
        return Err(E2BIG);
    }
    if flags != 0 {
        return Err(EINVAL);
    }
    Ok(DeltaArg {
        size,
        flags,
        data_size,
    })
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

/// The buffer layout for `params` and `arg`; `Err` holds the positive errno.
pub fn layout(params: &SessionParams, arg: &DeltaArg) -> Result<RingLayout, i32> {
    let asked = match (arg.data_size, params.data_size_hint) {
        (0, 0) => DEFAULT_DATA_SIZE,
        (0, hint) => hint,
        (size, _) => size,
    };
    if asked > MAX_DATA_SIZE {
        return Err(EINVAL);
    }
    let data_size = asked.next_power_of_two().max(MIN_DATA_SIZE);
    RingLayout::new((PRIVATE_WORDS * 8) as u64, data_size).map_err(|e| e.errno())
}

/// Reads the C arguments every callback gets; `Err` holds the positive errno.
///
/// # Safety
///
/// `params` is null or valid for reads; `arg` is valid for `arg_len` bytes of reads if
/// `arg_len > 0`, for the returned lifetime.
unsafe fn c_args<'a>(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> Result<(&'a SessionParams, DeltaArg), i32> {
    // SAFETY: forwarded contract.
    let (params, arg) = unsafe { hrperf_engine::callback::session_args(params, arg, arg_len) }?;
    check_params(params)?;
    Ok((params, parse_arg(arg)?))
}

fn neg(errno: i32) -> i32 {
    -errno
}

/// `validate` callback.
///
/// # Safety
///
/// The `ValidateFn` contract: `params` valid for reads, `arg` for `arg_len` bytes.
pub unsafe extern "C" fn delta_validate(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    match unsafe { c_args(params, arg, arg_len) }.and_then(|(p, a)| layout(p, &a)) {
        Ok(_) => 0,
        Err(e) => neg(e),
    }
}

/// `getsize` callback: header + ring control + private area + ring.
///
/// # Safety
///
/// The `GetSizeFn` contract: as `validate`, and `size` valid for a write.
pub unsafe extern "C" fn delta_getsize(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
    size: *mut u64,
) -> i32 {
    // SAFETY: forwarded contract.
    let l = match unsafe { c_args(params, arg, arg_len) }.and_then(|(p, a)| layout(p, &a)) {
        Ok(l) => l,
        Err(e) => return neg(e),
    };
    // SAFETY: forwarded contract.
    unsafe { hrperf_engine::callback::write_size(size, l.buf_size) }
}

/// `init` callback: lays out the ring and zeroes `last` (virtual counters start at 0).
///
/// # Safety
///
/// The `InitFn` contract: `buf` is this CPU's buffer of `buf_len` bytes (8-aligned,
/// header filled), exclusively the format's during the call; the rest as `validate`.
pub unsafe extern "C" fn delta_init(
    buf: *mut u8,
    buf_len: usize,
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    let l = match unsafe { c_args(params, arg, arg_len) }.and_then(|(p, a)| layout(p, &a)) {
        Ok(l) => l,
        Err(e) => return neg(e),
    };
    let Some(ptr) = NonNull::new(buf) else {
        return neg(EFAULT);
    };
    // SAFETY: the core's buffer, valid and ours for the call (contract).
    let mut b = match unsafe { Buffer::from_raw(ptr, buf_len) } {
        Ok(b) => b,
        Err(e) => return neg(e.errno()),
    };
    if let Err(e) = l.init(&mut b) {
        return neg(e.errno());
    }
    match b.private_mut(PRIVATE_OFFSET, PRIVATE_WORDS) {
        Some(p) => p.fill(0),
        None => return neg(EINVAL),
    }
    0
}

/// `handler` callback; see [`handle`].
///
/// # Safety
///
/// The `HandlerFn` contract: `buf` as for `init` (after `init`), `arg` valid for reads.
pub unsafe extern "C" fn delta_handler(
    buf: *mut u8,
    buf_len: usize,
    arg: *const OverflowArg,
    _services: *const Services,
) -> u32 {
    // SAFETY: valid for reads, the caller's contract.
    let (Some(ptr), Some(arg)) = (NonNull::new(buf), unsafe { arg.as_ref() }) else {
        return 0;
    };
    // SAFETY: the core's buffer, valid and ours for the call (contract).
    match unsafe { Buffer::from_raw(ptr, buf_len) } {
        Ok(mut b) => handle(&mut b, arg),
        Err(_) => 0,
    }
}



/// Reads one scalar of the `OverflowArg` on its own.
///
/// The core has just stored the fields one by one; a load the compiler merges across
/// two of those stores (e.g. `cpu` and `pid` as one u64) cannot be forwarded from the
/// store buffer and stalls for ~15 cycles, a third of the handler's budget.
#[inline(always)]
fn fresh<T: Copy>(field: &T) -> T {
    // SAFETY: a reference is valid for reads and aligned.
    unsafe { core::ptr::read_volatile(field) }
}

/// The handler's logic on a wrapped buffer: writes one delta record, advancing `last`
/// only if it was written. Returns `CTRL_RESET` for overflow samples, `| CTRL_NOTIFY`
/// while the ring is more than half full.
#[inline]
pub fn handle(buf: &mut Buffer<'_>, arg: &OverflowArg) -> u32 {
    let kind = fresh(&arg.kind);
    let nr = (fresh(&arg.nr_counters) as usize).min(MAX_COUNTERS);
    let overflow = kind == SAMPLE_OVERFLOW;
    let mut ctrl = if overflow { CTRL_RESET } else { 0 };
    if nr == 0 {
        return ctrl;
    }
    let Ok(mut ring) = RingWriter::new(buf) else {
        return ctrl;
    };
    let Some(private) = ring.private_mut::<PRIVATE_WORDS>(PRIVATE_OFFSET) else {
        return ctrl;
    };
    let nr_mask = (1u32 << nr) - 1;
    let multi_wrap = (fresh(&arg.multi_wrap) | private[PENDING_MULTI_WRAP] as u32) & nr_mask;
    let mut last = [0u64; MAX_COUNTERS];
    last.copy_from_slice(&private[LAST..LAST + MAX_COUNTERS]);
    let mut s = DeltaSample {
        misc: 0,
        cpu: fresh(&arg.cpu),
        pid: fresh(&arg.pid),
        tid: fresh(&arg.tid),
        ovfl_counter: NO_OVERFLOW_COUNTER,
        multi_wrap: multi_wrap as u8,
        time_ns: arg.time_ns,
        ip: 0,
        nr: nr as u8,
        deltas: [0; MAX_COUNTERS], // written straight into the ring below
    };
    s.misc = match kind {
        SAMPLE_OVERFLOW => MISC_OVERFLOW,
        SAMPLE_POLL => MISC_POLL,
        SAMPLE_INSTRUCTED => MISC_INSTRUCTED,
        _ => 0,
    };
    if overflow {
        s.ip = arg.ip;
        let ovfl = fresh(&arg.ovfl_counter);
        if ovfl < nr as u32 {
            s.ovfl_counter = ovfl as u8;
        }
        if fresh(&arg.flags) & OVFL_FL_KERNEL_IP != 0 {
            s.misc |= MISC_KERNEL;
        }
    }
    if multi_wrap != 0 {
        s.misc |= MISC_MULTI_WRAP;
    }

    let size = record::record_size(nr);
    let written = ring
        .write_with(RecordType::DELTA, s.misc, size, |body| {
            record::write_fixed(&s, body);
            for (i, l) in last.iter().enumerate().take(nr) {
                record::put_delta(body, i, arg.values[i].wrapping_sub(*l));
            }
        })
        .is_ok();
    if ring.used() > ring.data_size() / 2 {
        ctrl |= CTRL_NOTIFY;
    }
    if let Some(private) = ring.private_mut::<PRIVATE_WORDS>(PRIVATE_OFFSET) {
        if written {
            // All 8 words: a fixed-size copy is a few vector moves, a copy of `nr` words a
            // memcpy call. Words past `nr` are never used.
            private[LAST..LAST + MAX_COUNTERS].copy_from_slice(&arg.values);
            private[PENDING_MULTI_WRAP] = 0;
        } else {
            private[PENDING_MULTI_WRAP] = multi_wrap as u64;
        }
    }
    ctrl
}

#[cfg(test)]
mod tests;
