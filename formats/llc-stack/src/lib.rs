//! The call-stack-on-LLC-miss format ("llc-stack"): on every overflow of the trigger
//! event (LLC misses by default; any event works, tests use software events), one
//! variable-length record with the task's pid/tid/comm, CPU, time, interrupted IP, data
//! address (when the source has one), and its **kernel and user call stacks** — the
//! perfmon2 idea of using a PMU overflow to record something that is not PMU data.
//!
//! Record layout: [`record`]. The buffer is a [`RingLayout`] ring; the stacks are
//! captured by the core's [`Services`] (in the kernel: `stack_trace_save_regs` and a
//! frame-pointer walk with non-faulting user copies; in userspace: the stacks the
//! source delivered with the sample) **straight into the ring record**: the handler
//! reserves room for the deepest stacks allowed ([`RingWriter::write_upto`]) and
//! publishes only what was captured, so there is no copy and no stack-sized buffer on
//! the interrupt stack. A stack deeper than its limit is cut and marked
//! ([`record::STK_KERNEL_TRUNCATED`], `MISC_TRUNCATED`); a missing service is marked too
//! ([`record::STK_NO_KERNEL_STACK`]). A full ring drops the record (counted, reported by
//! a LOST record), never blocks.
//!
//! Argument ([`LlcStackArg`], optional): `{ size: 24, flags: ARG_*, data_size,
//! max_kernel, max_user }`: ring size (1 MiB by default), depth limits (64 kernel and
//! 127 user frames by default, at most [`MAX_DEPTH`] each), and whether to skip either
//! stack. Sessions must be in overflow mode (a stack belongs to an interrupted task).
//!
//! Handler control bits: `CTRL_RESET` (re-arm), `CTRL_NOTIFY` while the ring is more
//! than half full.

#![no_std]
#![warn(missing_docs)]

pub mod record;

use core::ptr::NonNull;

use hrperf_abi::bytes::{ne16, ne32, ne64};
use hrperf_abi::errno::{E2BIG, EFAULT, EINVAL};
use hrperf_abi::format::{
    FormatOps, OverflowArg, Services, SessionParams, Uuid, CTRL_NOTIFY, CTRL_RESET, FMT_FL_RING,
    FMT_FL_STACKS, FORMAT_ABI_VERSION, MODE_OVERFLOW, OVFL_FL_KERNEL_IP, SAMPLE_OVERFLOW,
};
use hrperf_abi::record::{MISC_KERNEL, MISC_OVERFLOW, MISC_TRUNCATED};
use hrperf_engine::ring::PRIVATE_OFFSET;
use hrperf_engine::{Buffer, RingLayout, RingWriter};

use record::{StackFixed, FIXED_SIZE, STACK_SAMPLE};

/// The format's UUID.
pub const LLC_STACK_UUID: Uuid = Uuid([
    0x8c, 0x31, 0x5e, 0x07, 0x42, 0xd6, 0x4b, 0x19, 0x9a, 0x6f, 0x23, 0xe1, 0x0b, 0x7c, 0x55, 0xa2,
]);
/// The format's name.
pub const LLC_STACK_NAME: &str = "llc-stack";
/// The format's version, `major << 16 | minor` (1.0).
pub const LLC_STACK_VERSION: u32 = 0x0001_0000;

/// Ring size when neither the argument nor the session asks for one.
pub const DEFAULT_DATA_SIZE: u64 = 1 << 20;
/// Smallest ring (it must hold the largest record, [`MAX_DEPTH`] frames of each kind).
pub const MIN_DATA_SIZE: u64 = 64 << 10;
/// Largest ring.
pub const MAX_DATA_SIZE: u64 = 1 << 30;
/// Default kernel stack depth limit.
pub const DEFAULT_MAX_KERNEL: u16 = 64;
/// Default user stack depth limit (perf's `kernel.perf_event_max_stack` default).
pub const DEFAULT_MAX_USER: u16 = 127;
/// Largest depth limit of either stack.
pub const MAX_DEPTH: u16 = 1024;

/// Argument flag: do not capture kernel stacks.
pub const ARG_NO_KERNEL_STACK: u32 = 1 << 0;
/// Argument flag: do not capture user stacks.
pub const ARG_NO_USER_STACK: u32 = 1 << 1;
const ARG_FLAGS: u32 = ARG_NO_KERNEL_STACK | ARG_NO_USER_STACK;

/// The format's optional argument (ABI rules of `hrperf_abi`: sized, append-only, zero
/// means default, unknown non-zero tail → `E2BIG`, unknown flags → `EINVAL`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlcStackArg {
    /// Bytes filled by the caller: [`LLC_STACK_ARG_SIZE`] or more.
    pub size: u32,
    /// `ARG_*`.
    pub flags: u32,
    /// Ring size in bytes (0: the session's hint, else the default).
    pub data_size: u64,
    /// Kernel frames kept per record (0: [`DEFAULT_MAX_KERNEL`]).
    pub max_kernel: u16,
    /// User frames kept per record (0: [`DEFAULT_MAX_USER`]).
    pub max_user: u16,
    /// Reserved, zero.
    pub reserved: u32,
}
/// Size of [`LlcStackArg`] in this version.
pub const LLC_STACK_ARG_SIZE: usize = core::mem::size_of::<LlcStackArg>();
const _: () = assert!(LLC_STACK_ARG_SIZE == 24);

impl LlcStackArg {
    /// The argument as bytes (native endian), to pass as the format argument.
    pub fn to_bytes(&self) -> [u8; LLC_STACK_ARG_SIZE] {
        let mut b = [0u8; LLC_STACK_ARG_SIZE];
        b[0..4].copy_from_slice(&self.size.to_ne_bytes());
        b[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        b[8..16].copy_from_slice(&self.data_size.to_ne_bytes());
        b[16..18].copy_from_slice(&self.max_kernel.to_ne_bytes());
        b[18..20].copy_from_slice(&self.max_user.to_ne_bytes());
        b[20..24].copy_from_slice(&self.reserved.to_ne_bytes());
        b
    }

    /// Kernel depth limit in effect.
    pub fn kernel_depth(&self) -> u16 {
        if self.max_kernel == 0 { DEFAULT_MAX_KERNEL } else { self.max_kernel }
    }

    /// User depth limit in effect.
    pub fn user_depth(&self) -> u16 {
        if self.max_user == 0 { DEFAULT_MAX_USER } else { self.max_user }
    }
}

/// Private-area words: the weight of a record (the sample period), the packed
/// configuration (`max_kernel | max_user << 16 | ARG_* << 32`).
const WEIGHT: usize = 0;
const CONFIG: usize = 1;
const PRIVATE_WORDS: usize = 2;

/// The table to register: `hrperf_register_format(&LLC_STACK_OPS)` in the kernel,
/// `Registry::register_static(&LLC_STACK_OPS)` in userspace.
pub static LLC_STACK_OPS: FormatOps = FormatOps {
    size: core::mem::size_of::<FormatOps>() as u32,
    abi_version: FORMAT_ABI_VERSION,
    name: match hrperf_abi::fixed_name(LLC_STACK_NAME) {
        Some(n) => n,
        None => [0; hrperf_abi::NAME_LEN],
    },
    uuid: LLC_STACK_UUID,
    version: LLC_STACK_VERSION,
    arg_size: LLC_STACK_ARG_SIZE as u32,
    flags: FMT_FL_RING | FMT_FL_STACKS,
    reserved: 0,
    owner: core::ptr::null_mut(),
    validate: Some(llc_stack_validate),
    getsize: Some(llc_stack_getsize),
    init: Some(llc_stack_init),
    handler: Some(llc_stack_handler),
    // Nothing to reset or free (the ring never masks; the core owns the buffer).
    restart: None,
    exit: None,
    start: None,
    stop: None,
};

/// Parses the format argument; `Err` holds the positive errno.
pub fn parse_arg(arg: &[u8]) -> Result<LlcStackArg, i32> {
    if arg.is_empty() {
        return Ok(LlcStackArg::default());
    }
    let (Some(size), Some(flags), Some(data_size), Some(max_kernel), Some(max_user), Some(reserved)) = (
        ne32(arg, 0),
        ne32(arg, 4),
        ne64(arg, 8),
        ne16(arg, 16),
        ne16(arg, 18),
        ne32(arg, 20),
    ) else {
        return Err(EINVAL);
    };
    if size as usize != arg.len() {
        return Err(EINVAL);
    }
    if arg.get(LLC_STACK_ARG_SIZE..).unwrap_or(&[]).iter().any(|&b| b != 0) {
        return Err(E2BIG);
    }
    if flags & !ARG_FLAGS != 0 || reserved != 0 || max_kernel > MAX_DEPTH || max_user > MAX_DEPTH {
        return Err(EINVAL);
    }
    Ok(LlcStackArg { size, flags, data_size, max_kernel, max_user, reserved })
}

/// Checks the session for this format; `Err` holds the positive errno.
pub fn check_params(p: &SessionParams) -> Result<(), i32> {
    let nr_ok = (1..=hrperf_abi::MAX_COUNTERS as u32).contains(&p.nr_counters);
    if (p.size as usize) < core::mem::size_of::<SessionParams>() || p.mode != MODE_OVERFLOW || !nr_ok {
        return Err(EINVAL);
    }
    Ok(())
}

/// The buffer layout for `params` and `arg`; `Err` holds the positive errno.
pub fn layout(params: &SessionParams, arg: &LlcStackArg) -> Result<RingLayout, i32> {
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
) -> Result<(&'a SessionParams, LlcStackArg), i32> {
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
pub unsafe extern "C" fn llc_stack_validate(params: *const SessionParams, arg: *const u8, arg_len: usize) -> i32 {
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
pub unsafe extern "C" fn llc_stack_getsize(
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

/// `init` callback: lays out the ring and stores the weight and depth limits.
///
/// # Safety
///
/// The `InitFn` contract: `buf` is this CPU's buffer of `buf_len` bytes (8-aligned,
/// header filled), exclusively the format's during the call; the rest as `validate`.
pub unsafe extern "C" fn llc_stack_init(
    buf: *mut u8,
    buf_len: usize,
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32 {
    // SAFETY: forwarded contract.
    let (params, a) = match unsafe { c_args(params, arg, arg_len) } {
        Ok(x) => x,
        Err(e) => return neg(e),
    };
    let l = match layout(params, &a) {
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
        Some(p) => {
            p[WEIGHT] = params.sample_period.max(1);
            p[CONFIG] =
                u64::from(a.kernel_depth()) | u64::from(a.user_depth()) << 16 | u64::from(a.flags) << 32;
        }
        None => return neg(EINVAL),
    }
    0
}

/// `handler` callback; see [`handle`].
///
/// # Safety
///
/// The `HandlerFn` contract: `buf` as for `init` (after `init`), `arg` valid for reads,
/// `services` null or valid for reads (its functions callable with its `ctx`).
pub unsafe extern "C" fn llc_stack_handler(
    buf: *mut u8,
    buf_len: usize,
    arg: *const OverflowArg,
    services: *const Services,
) -> u32 {
    // SAFETY: valid for reads, the caller's contract.
    let (Some(ptr), Some(arg)) = (NonNull::new(buf), unsafe { arg.as_ref() }) else {
        return 0;
    };
    // SAFETY: null or valid for reads, the caller's contract.
    let services = unsafe { services.as_ref() }.filter(|s| s.size >= Services::V1_SIZE);
    // SAFETY: the core's buffer, valid and ours for the call (contract).
    match unsafe { Buffer::from_raw(ptr, buf_len) } {
        Ok(mut b) => handle(&mut b, arg, services),
        Err(_) => 0,
    }
}



/// Captures one stack with `f` into `slots` frames at `out`; returns the frames kept
/// (at most `max`) and whether the stack was cut.
///
/// # Safety
///
/// `out` is valid for writes of `slots` u64s and 8-aligned; `f` and `ctx` come from one
/// [`Services`] table (its contract: `f` writes at most `max` frames).
unsafe fn capture(
    f: unsafe extern "C" fn(*mut core::ffi::c_void, *mut u64, u32) -> u32,
    ctx: *mut core::ffi::c_void,
    out: *mut u64,
    slots: usize,
    max: usize,
) -> (usize, bool) {
    // SAFETY: the caller's contract.
    let got = unsafe { f(ctx, out, slots as u32) } as usize;
    let got = got.min(slots);
    if got > max {
        (max, true)
    } else {
        (got, false)
    }
}

/// The handler's logic on a wrapped buffer: writes one stack record, the stacks
/// captured by `services` straight into it. Returns `CTRL_RESET`, `| CTRL_NOTIFY` while
/// the ring is more than half full. Non-overflow samples are ignored.
pub fn handle(buf: &mut Buffer<'_>, arg: &OverflowArg, services: Option<&Services>) -> u32 {
    if arg.kind != SAMPLE_OVERFLOW {
        return 0;
    }
    let mut ctrl = CTRL_RESET;
    let Ok(mut ring) = RingWriter::new(buf) else {
        return ctrl;
    };
    let Some(private) = ring.private_mut::<PRIVATE_WORDS>(PRIVATE_OFFSET) else {
        return ctrl;
    };
    let weight = private[WEIGHT];
    let config = private[CONFIG];
    let max_k = ((config & 0xffff) as usize).min(usize::from(MAX_DEPTH));
    let max_u = ((config >> 16 & 0xffff) as usize).min(usize::from(MAX_DEPTH));
    let arg_flags = (config >> 32) as u32;

    let ctx = services.map_or(core::ptr::null_mut(), |s| s.ctx);
    let kfn = services.and_then(|s| s.kernel_stack).filter(|_| arg_flags & ARG_NO_KERNEL_STACK == 0);
    let ufn = services.and_then(|s| s.user_stack).filter(|_| arg_flags & ARG_NO_USER_STACK == 0);
    let comm_fn = services.and_then(Services::comm_fn);
    // One slot more than kept, so that a stack cut at the limit is seen as cut.
    let kslots = if kfn.is_some() { max_k + 1 } else { 0 };
    let uslots = if ufn.is_some() { max_u + 1 } else { 0 };

    let kernel_ip = arg.flags & OVFL_FL_KERNEL_IP != 0;
    let mut fixed = StackFixed {
        misc: MISC_OVERFLOW | if kernel_ip { MISC_KERNEL } else { 0 },
        time_ns: arg.time_ns,
        ip: arg.ip,
        addr: arg.addr,
        weight,
        cpu: arg.cpu,
        pid: arg.pid,
        tid: arg.tid,
        flags: if kernel_ip { record::STK_KERNEL_IP } else { 0 },
        comm: [0; record::COMM_LEN],
    };
    if let Some(c) = comm_fn {
        // SAFETY: the Services contract: writes at most `len` bytes of the 16 given.
        unsafe { c(ctx, fixed.comm.as_mut_ptr(), record::COMM_LEN as u32) };
    }
    let max_size = record::record_size(kslots + uslots);
    let _ = ring.write_upto(STACK_SAMPLE, max_size, |body| {
        let frames = body.get_mut(FIXED_SIZE - 8..).unwrap_or(&mut []);
        let out = frames.as_mut_ptr().cast::<u64>();
        // Records sit 8-aligned in the ring, so frames (at record offset 80) are too;
        // checked anyway before a service writes u64s there.
        let aligned = out as usize % 8 == 0 && frames.len() >= 8 * (kslots + uslots);
        let (mut nk, mut nu) = (0, 0);
        match kfn.filter(|_| aligned) {
            Some(f) => {
                // SAFETY: `out` is aligned with room for `kslots` frames (checked above).
                let (n, cut) = unsafe { capture(f, ctx, out, kslots, max_k) };
                nk = n;
                if cut {
                    fixed.flags |= record::STK_KERNEL_TRUNCATED;
                }
            }
            None => fixed.flags |= record::STK_NO_KERNEL_STACK,
        }
        match ufn.filter(|_| aligned) {
            Some(f) => {
                // SAFETY: `out + nk` is aligned with room for `uslots` frames, since
                // nk <= kslots and the record has kslots + uslots (checked above).
                let (n, cut) = unsafe { capture(f, ctx, out.add(nk), uslots, max_u) };
                nu = n;
                if cut {
                    fixed.flags |= record::STK_USER_TRUNCATED;
                }
            }
            None => fixed.flags |= record::STK_NO_USER_STACK,
        }
        if fixed.flags & (record::STK_KERNEL_TRUNCATED | record::STK_USER_TRUNCATED) != 0 {
            fixed.misc |= MISC_TRUNCATED;
        }
        record::write_body(body, &fixed, nk, nu);
        (record::record_size(nk + nu), fixed.misc)
    });
    if ring.used() > ring.data_size() / 2 {
        ctrl |= CTRL_NOTIFY;
    }
    ctrl
}

#[cfg(test)]
mod tests;
