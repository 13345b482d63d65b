// SPDX-License-Identifier: GPL-2.0
//! The FFI boundary of hrperf-core.ko: every call into `hrperf_shim.c`, and every entry
//! point C calls in Rust, behind small safe wrappers with `Drop` teardown.
//!
//! Reference: `hrperf_shim.c` next to this file. Nothing outside this module touches a
//! raw pointer that came from C.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr::NonNull;

use kernel::error::{code::*, Error, Result};
use kernel::page::PAGE_SIZE;
use kernel::ffi::{c_char, c_int, c_long, c_uint, c_ulong};
use kernel::str::CStr;

use crate::abi::event::{EventDesc, EVENT_FL_KERNEL_ONLY, EVENT_FL_PRECISE, EVENT_FL_USER_ONLY};
use crate::abi::format::{FormatOps, Services};
use crate::abi::CpuMask;
use crate::pebs::coexist::PmuFacts;
use crate::pebs::ds::{cap, PebsMsrs};
use crate::pebs::layout::CpuInfo;

/// What the overflow trampoline reports about the interrupted context (`struct hrperf_ovf`).
#[repr(C)]
pub(crate) struct OverflowInfo {
    /// Interrupted instruction pointer.
    pub(crate) ip: u64,
    /// `local_clock()` on the overflowing CPU.
    pub(crate) time_ns: u64,
    /// `current->tgid`.
    pub(crate) pid: u32,
    /// `current->pid`.
    pub(crate) tid: u32,
    /// Non-zero if the IP is in the kernel.
    pub(crate) kernel: u32,
    reserved: u32,
    /// `struct pt_regs *` of the interrupted context (null if perf gave none); valid
    /// for the duration of the overflow call only.
    regs: *mut c_void,
}

/// `struct hrperf_counter_attr`: the part of `perf_event_attr` hrperf sets.
#[repr(C)]
struct CounterAttr {
    kind: u32,
    exclude_user: u32,
    exclude_kernel: u32,
    precise_ip: u32,
    config: u64,
    config1: u64,
    config2: u64,
    sample_period: u64,
}

/// `struct hrperf_cpu_facts`: what the shim reads about the CPU for PEBS.
#[repr(C)]
#[derive(Default)]
struct CpuFactsC {
    intel: u32,
    family: u32,
    model: u32,
    ds: u32,
    dtes64: u32,
    pdcm: u32,
    hybrid: u32,
    pti: u32,
    misc_enable_ok: u32,
    perf_caps_ok: u32,
    misc_enable: u64,
    perf_caps: u64,
    cpuid_0a_eax: u32,
    tsc_khz: u32,
}

type CallFn = unsafe extern "C" fn(info: *mut c_void);

mod ffi {
    use super::*;

    extern "C" {
        pub(super) fn hrperf_shim_param_mode() -> *const c_char;
        pub(super) fn hrperf_shim_param_poll_us() -> u32;
        pub(super) fn hrperf_shim_dev_register() -> c_int;
        pub(super) fn hrperf_shim_dev_unregister();
        pub(super) fn hrperf_shim_notify(hf: *mut c_void);
        pub(super) fn hrperf_shim_map(
            vma: *mut c_void,
            uaddr: c_ulong,
            kaddr: *mut c_void,
            len: c_ulong,
        ) -> c_int;
        pub(super) fn hrperf_shim_counter_create(
            cpu: u32,
            attr: *const CounterAttr,
            ctx: *mut c_void,
            out: *mut *mut c_void,
        ) -> c_int;
        pub(super) fn hrperf_shim_counter_release(ev: *mut c_void);
        pub(super) fn hrperf_shim_counter_enable(ev: *mut c_void);
        pub(super) fn hrperf_shim_counter_disable(ev: *mut c_void);
        pub(super) fn hrperf_shim_hw_pmu_present() -> c_int;
        pub(super) fn hrperf_shim_counter_read_local(ev: *mut c_void) -> u64;
        pub(super) fn hrperf_shim_this_cpu() -> u32;
        pub(super) fn hrperf_shim_nr_cpu_ids() -> u32;
        pub(super) fn hrperf_shim_num_online_cpus() -> u32;
        pub(super) fn hrperf_shim_cpu_online(cpu: u32) -> c_int;
        pub(super) fn hrperf_shim_clock_ns() -> u64;
        pub(super) fn hrperf_shim_on_cpu(cpu: u32, f: CallFn, info: *mut c_void) -> c_int;
        pub(super) fn hrperf_shim_on_cpus(bits: *const u64, f: CallFn, info: *mut c_void);
        pub(super) fn hrperf_shim_thread_start(
            f: unsafe extern "C" fn(data: *mut c_void) -> c_int,
            data: *mut c_void,
        ) -> *mut c_void;
        pub(super) fn hrperf_shim_thread_stop(t: *mut c_void);
        pub(super) fn hrperf_shim_thread_should_stop() -> c_int;
        pub(super) fn hrperf_shim_sleep_ns(ns: u64);
        pub(super) fn hrperf_shim_vzalloc(size: c_ulong) -> *mut c_void;
        pub(super) fn hrperf_shim_vfree(p: *mut c_void);
        pub(super) fn hrperf_shim_module_get(m: *mut c_void) -> c_int;
        pub(super) fn hrperf_shim_module_put(m: *mut c_void);
        pub(super) fn hrperf_shim_kernel_stack(regs: *mut c_void, out: *mut u64, max: u32) -> u32;
        pub(super) fn hrperf_shim_user_regs(regs: *mut c_void, ip: *mut u64, bp: *mut u64)
            -> c_int;
        pub(super) fn hrperf_shim_comm(out: *mut c_char, len: u32) -> u32;
        pub(super) fn hrperf_shim_param_pebs_sim() -> *const c_char;
        pub(super) fn hrperf_shim_param_pebs_sim_busy() -> u64;
        pub(super) fn hrperf_shim_cpu_facts(f: *mut CpuFactsC);
        pub(super) fn hrperf_shim_rdmsr(msr: u32, val: *mut u64) -> c_int;
        pub(super) fn hrperf_shim_wrmsr(msr: u32, val: u64) -> c_int;
        pub(super) fn hrperf_shim_hw_event_config(id: u32) -> u64;
        pub(super) fn hrperf_shim_pebs_nmi_register() -> c_int;
        pub(super) fn hrperf_shim_pebs_nmi_unregister();
        pub(super) fn hrperf_shim_gprs(regs: *mut c_void, out: *mut u64);
    }
}

fn to_result(ret: c_int) -> Result {
    if ret < 0 {
        Err(Error::from_errno(ret))
    } else {
        Ok(())
    }
}

// ---- parameters, device ------------------------------------------------------------

/// The `mode=` module parameter's bytes.
pub(crate) fn param_mode() -> &'static [u8] {
    // SAFETY: the shim returns the charp parameter (or ""), a NUL-terminated string that
    // lives as long as the module; parameters are read-only (0444) after load.
    unsafe { CStr::from_char_ptr(ffi::hrperf_shim_param_mode()) }.as_bytes()
}

/// The `poll_us=` module parameter.
pub(crate) fn param_poll_us() -> u32 {
    // SAFETY: reads a module parameter; no preconditions.
    unsafe { ffi::hrperf_shim_param_poll_us() }
}

/// The `pebs_sim=` module parameter's bytes (empty: the CPU's own PEBS).
pub(crate) fn param_pebs_sim() -> &'static [u8] {
    // SAFETY: as for `param_mode`: a NUL-terminated, read-only parameter string.
    unsafe { CStr::from_char_ptr(ffi::hrperf_shim_param_pebs_sim()) }.as_bytes()
}

/// The `pebs_sim_busy=` module parameter (CPUs where the simulated perf uses PEBS).
pub(crate) fn param_pebs_sim_busy() -> u64 {
    // SAFETY: reads a module parameter; no preconditions.
    unsafe { ffi::hrperf_shim_param_pebs_sim_busy() }
}

/// `/dev/hrperf`; unregistered on drop.
pub(crate) struct Device(());

impl Device {
    /// Creates the char device and its devtmpfs node (`dev_mode=`, `dev_gid=`).
    pub(crate) fn register() -> Result<Device> {
        // SAFETY: called once from module init; paired with the unregister in `drop`.
        to_result(unsafe { ffi::hrperf_shim_dev_register() })?;
        Ok(Device(()))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: registered in `register` (type invariant: a `Device` exists only then).
        unsafe { ffi::hrperf_shim_dev_unregister() };
    }
}

// ---- files ------------------------------------------------------------------------------

/// The C side of one open file (`struct hrperf_file`): its waitqueue and irq_work.
///
/// # Invariants
///
/// Points to a live `struct hrperf_file`; it outlives every Rust object of the file
/// (the shim frees it after `hrperf_rs_release` returned).
pub(crate) struct FileHandle(NonNull<c_void>);

// SAFETY: the C object is usable from any CPU and context (irq_work_queue is NMI-safe).
unsafe impl Send for FileHandle {}
// SAFETY: as above; `notify` takes `&self`.
unsafe impl Sync for FileHandle {}

impl FileHandle {
    /// Wakes the file's `poll()` waiters; safe in any context, NMI included.
    pub(crate) fn notify(&self) {
        // SAFETY: the type invariant.
        unsafe { ffi::hrperf_shim_notify(self.0.as_ptr()) };
    }
}

/// A user mapping being set up by `mmap()`.
///
/// # Invariants
///
/// Points to the `vm_area_struct` of an `mmap` call in progress (mmap lock held).
pub(crate) struct Vma<'a>(NonNull<c_void>, PhantomData<&'a ()>);

impl Vma<'_> {
    /// Inserts `len` bytes of `buf` from `offset` at user address `uaddr` (all page
    /// multiples, inside the mapping and the buffer: checked here).
    pub(crate) fn map(&self, uaddr: usize, buf: &VmBuffer, offset: usize, len: usize) -> Result {
        let page = kernel::page::PAGE_SIZE;
        let end = offset.checked_add(len).ok_or(EINVAL)?;
        if offset % page != 0 || len % page != 0 || uaddr % page != 0 || end > buf.len() {
            return Err(EINVAL);
        }
        // SAFETY: the type invariants of `Vma` and `VmBuffer`; the range lies inside the
        // vmalloc area (checked). The shim checks the mapping's bounds (vm_insert_page).
        let kaddr = unsafe { buf.ptr.as_ptr().add(offset) };
        // SAFETY: as above.
        to_result(unsafe {
            ffi::hrperf_shim_map(self.0.as_ptr(), uaddr as c_ulong, kaddr.cast(), len as c_ulong)
        })
    }
}

// ---- memory -------------------------------------------------------------------------------

/// Zeroed, page-aligned `vmalloc` memory, freed on drop. Pages stay alive while mapped
/// (`vm_insert_page` holds a reference), so dropping under a mapping is safe.
///
/// # Invariants
///
/// `ptr` is a live vmalloc area of `len` bytes (a page multiple) owned by this value.
pub(crate) struct VmBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory; access is coordinated by the owner (session.rs).
unsafe impl Send for VmBuffer {}
// SAFETY: as above.
unsafe impl Sync for VmBuffer {}

impl VmBuffer {
    /// Allocates `len` bytes (a non-zero page multiple), zeroed; `ENOMEM` quietly.
    pub(crate) fn new(len: usize) -> Result<VmBuffer> {
        if len == 0 || len % kernel::page::PAGE_SIZE != 0 {
            return Err(EINVAL);
        }
        // SAFETY: allocation; no preconditions.
        let p = unsafe { ffi::hrperf_shim_vzalloc(len as c_ulong) };
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(ENOMEM)?;
        // INVARIANT: a fresh vmalloc area of `len` bytes.
        Ok(VmBuffer { ptr, len })
    }

    /// Start of the memory.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for VmBuffer {
    fn drop(&mut self) {
        // SAFETY: the type invariant: ours, freed once.
        unsafe { ffi::hrperf_shim_vfree(self.ptr.as_ptr().cast()) };
    }
}

// ---- modules --------------------------------------------------------------------------------

/// A reference on a format's module (`try_module_get(ops.owner)`), put on drop.
///
/// # Invariants
///
/// `0` is null (no module: nothing to put) or a module we hold a reference on.
pub(crate) struct ModuleRef(*mut c_void);

// SAFETY: module references may be dropped on any CPU.
unsafe impl Send for ModuleRef {}
// SAFETY: no `&self` method touches the module.
unsafe impl Sync for ModuleRef {}

impl ModuleRef {
    /// Pins `owner` (a format table's `owner`); `None` if the module is going away.
    ///
    /// # Safety
    ///
    /// `owner` is null or a `struct module *` that stays valid for the call (the format
    /// is registered, and its module unregisters it before it goes away).
    pub(crate) unsafe fn get(owner: *mut c_void) -> Option<ModuleRef> {
        if owner.is_null() {
            return Some(ModuleRef(owner));
        }
        // SAFETY: the caller's contract.
        if unsafe { ffi::hrperf_shim_module_get(owner) } != 0 {
            // INVARIANT: the reference was taken.
            Some(ModuleRef(owner))
        } else {
            None
        }
    }
}

impl Drop for ModuleRef {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the type invariant: we hold a reference, given back once.
            unsafe { ffi::hrperf_shim_module_put(self.0) };
        }
    }
}

// ---- stacks -------------------------------------------------------------------------------------

impl OverflowInfo {
    /// The services of this overflow for a `FMT_FL_STACKS` format: stacks from its regs,
    /// the current task's comm. The table points at `self`: use it only while `self` lives
    /// (during the overflow call).
    pub(crate) fn services(&self) -> Services {
        Services {
            ctx: (self as *const OverflowInfo).cast_mut().cast::<c_void>(),
            kernel_stack: Some(svc_kernel_stack),
            user_stack: Some(svc_user_stack),
            comm: Some(svc_comm),
            ..Services::NONE
        }
    }
}

impl OverflowInfo {
    /// The interrupted context's registers in the PEBS GPR group's order (flags, ip, ax,
    /// cx, dx, bx, sp, bp, si, di, r8–r15), if perf gave regs.
    pub(crate) fn gprs(&self) -> Option<[u64; 18]> {
        if self.regs.is_null() {
            return None;
        }
        let mut out = [0u64; 18];
        // SAFETY: `regs` is the live `struct pt_regs *` of this overflow (valid during the
        // call, the type's contract); `out` has room for the 18 words written.
        unsafe { ffi::hrperf_shim_gprs(self.regs, out.as_mut_ptr()) };
        Some(out)
    }
}

/// `Services::kernel_stack`: the unwinder from the overflow's regs (kernel mode only).
///
/// # Safety
///
/// `ctx` is the live `OverflowInfo` of [`OverflowInfo::services`]; `out` is null or
/// valid for `max` u64 writes.
unsafe extern "C" fn svc_kernel_stack(ctx: *mut c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: null or the live `OverflowInfo` (the caller's contract).
    let Some(o) = (unsafe { ctx.cast::<OverflowInfo>().as_ref() }) else { return 0 };
    if out.is_null() || o.regs.is_null() {
        return 0;
    }
    // SAFETY: `regs` is perf's, valid during the overflow call we are in; the shim
    // writes at most `max` frames to `out` (valid for that many).
    unsafe { ffi::hrperf_shim_kernel_stack(o.regs, out, max) }.min(max)
}

/// One user frame record at `fp`: `[next fp, return address]`, or `None` if it cannot
/// be read without faulting.
fn read_user_frame(fp: u64) -> Option<[u64; 2]> {
    let mut f = [0u64; 2];
    // SAFETY: `f` is 16 writable bytes. copy_from_user_nofault checks that the range is
    // user memory and never faults or sleeps (IRQ/NMI safe).
    let r = unsafe {
        kernel::bindings::copy_from_user_nofault(f.as_mut_ptr().cast(), fp as *const c_void, 16)
    };
    (r == 0).then_some(f)
}

/// Where x86-64 user space ends at most (5-level paging): a "return address" at or above
/// it, or in the first page, is not user code but a non-frame-pointer stack's data.
const USER_END: u64 = 1 << 56;

/// Frame-pointer walk: `out[0] = ip`, then each frame's return address, while the frame
/// pointer is non-zero, 8-aligned, increasing and readable and the return address is a
/// user address. Returns the frames written.
fn user_walk(ip: u64, fp: u64, out: &mut [u64], read: impl Fn(u64) -> Option<[u64; 2]>) -> usize {
    let mut fp = fp;
    let Some(first) = out.first_mut() else { return 0 };
    *first = ip;
    let mut n = 1;
    while let Some(slot) = out.get_mut(n) {
        if fp == 0 || fp % 8 != 0 {
            break;
        }
        let Some([next, ret]) = read(fp) else { break };
        if ret < PAGE_SIZE as u64 || ret >= USER_END {
            break;
        }
        *slot = ret;
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// `Services::user_stack`: the interrupted task's user stack by frame pointers.
///
/// # Safety
///
/// As for [`svc_kernel_stack`].
unsafe extern "C" fn svc_user_stack(ctx: *mut c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: null or the live `OverflowInfo` (the caller's contract).
    let Some(o) = (unsafe { ctx.cast::<OverflowInfo>().as_ref() }) else { return 0 };
    if out.is_null() || max == 0 || o.regs.is_null() {
        return 0;
    }
    let (mut ip, mut bp) = (0u64, 0u64);
    // SAFETY: `regs` is valid during the overflow call; `ip`, `bp` are writable.
    if unsafe { ffi::hrperf_shim_user_regs(o.regs, &mut ip, &mut bp) } == 0 {
        return 0;
    }
    // SAFETY: `out` is valid for `max` u64 writes (the caller's contract), not aliased
    // during the call.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max as usize) };
    user_walk(ip, bp, out, read_user_frame) as u32
}

/// `Services::comm`: the current task's name, NUL-padded to `len` bytes.
///
/// # Safety
///
/// `out` is null or valid for `len` byte writes.
unsafe extern "C" fn svc_comm(_ctx: *mut c_void, out: *mut u8, len: u32) -> u32 {
    if out.is_null() {
        return 0;
    }
    // SAFETY: `out` is valid for `len` writes (the caller's contract); the shim writes
    // at most that many.
    unsafe { ffi::hrperf_shim_comm(out.cast(), len) }.min(len)
}

// ---- perf counters ------------------------------------------------------------------------------

/// A pinned per-CPU perf kernel counter, released on drop.
///
/// # Invariants
///
/// `0` is a live `struct perf_event *` from `perf_event_create_kernel_counter`.
pub(crate) struct PerfCounter(NonNull<c_void>);

// SAFETY: perf kernel counters may be used and released from any CPU.
unsafe impl Send for PerfCounter {}
// SAFETY: `read_local` is IRQ/NMI-safe and only reads.
unsafe impl Sync for PerfCounter {}

impl PerfCounter {
    /// Creates a disabled counter for `ev` on `cpu`. With `sample_period > 0`, each
    /// overflow calls [`hrperf_rs_overflow`] on `cpu` with `ctx`.
    ///
    /// # Safety
    ///
    /// If `sample_period > 0`, `ctx` must stay a valid `CpuSlot` (see
    /// `hrperf_rs_overflow`) until the counter is dropped.
    pub(crate) unsafe fn create(
        cpu: u32,
        ev: &EventDesc,
        sample_period: u64,
        ctx: *const c_void,
    ) -> Result<PerfCounter> {
        let attr = CounterAttr {
            kind: ev.kind,
            exclude_user: (ev.flags & EVENT_FL_KERNEL_ONLY != 0) as u32,
            exclude_kernel: (ev.flags & EVENT_FL_USER_ONLY != 0) as u32,
            precise_ip: if ev.flags & EVENT_FL_PRECISE != 0 { (ev.flags >> 8) & 3 } else { 0 },
            config: ev.config,
            config1: ev.config1,
            config2: ev.config2,
            sample_period,
        };
        let mut out: *mut c_void = core::ptr::null_mut();
        // SAFETY: `attr` and `out` are valid for the call; `ctx`'s lifetime is the
        // caller's contract. Process context (sleeps).
        to_result(unsafe {
            ffi::hrperf_shim_counter_create(cpu, &attr, ctx.cast_mut(), &mut out)
        })?;
        // INVARIANT: the shim returned 0, so `out` is a live event.
        NonNull::new(out).map(PerfCounter).ok_or(EINVAL)
    }

    /// Starts counting (process context).
    pub(crate) fn enable(&self) {
        // SAFETY: the type invariant.
        unsafe { ffi::hrperf_shim_counter_enable(self.0.as_ptr()) };
    }

    /// Stops counting (process context; synchronous with the counter's CPU).
    pub(crate) fn disable(&self) {
        // SAFETY: the type invariant.
        unsafe { ffi::hrperf_shim_counter_disable(self.0.as_ptr()) };
    }

    /// The 64-bit count. Must run on the counter's CPU (IPI, overflow handler).
    pub(crate) fn read_local(&self) -> u64 {
        // SAFETY: the type invariant; the shim disables IRQs and only calls the PMU's
        // read when the event is active on this CPU.
        unsafe { ffi::hrperf_shim_counter_read_local(self.0.as_ptr()) }
    }
}

impl Drop for PerfCounter {
    fn drop(&mut self) {
        // SAFETY: the type invariant; released once. After this no overflow calls run.
        unsafe { ffi::hrperf_shim_counter_release(self.0.as_ptr()) };
    }
}

/// Whether a hardware PMU is registered (a `PERF_TYPE_HARDWARE` cycles counter can be
/// created on this CPU). Process context (sleeps).
pub(crate) fn hw_pmu_present() -> bool {
    // SAFETY: process context; creates and releases a disabled counter, nothing kept.
    unsafe { ffi::hrperf_shim_hw_pmu_present() != 0 }
}

// ---- PEBS: CPU facts, MSRs, the PMI ---------------------------------------------------------------

/// What the kernel knows about the CPU and its PMU, for `coexist::verdict`, and the TSC
/// frequency in kHz. Process context (sleeps: [`hw_pmu_present`]).
pub(crate) fn cpu_facts() -> (PmuFacts, u32) {
    let mut f = CpuFactsC::default();
    // SAFETY: `f` is valid for the write; the shim reads boot_cpu_data, CPUID and two
    // MSRs with the fault-tolerant accessor.
    unsafe { ffi::hrperf_shim_cpu_facts(&mut f) };
    let pebs_unavailable =
        f.misc_enable & crate::pebs::ds::msr::MISC_ENABLE_PEBS_UNAVAIL != 0;
    let facts = PmuFacts {
        cpu: CpuInfo {
            intel: f.intel != 0,
            family: f.family,
            model: f.model,
            ds: f.ds != 0,
            dtes64: f.dtes64 != 0,
            pdcm: f.pdcm != 0,
            pebs_unavailable,
            atom_core: false,
        },
        hw_pmu: hw_pmu_present(),
        pmu_version: f.cpuid_0a_eax & 0xff,
        gp_counters: (f.cpuid_0a_eax >> 8) & 0xff,
        gp_width: (f.cpuid_0a_eax >> 16) & 0xff,
        hybrid: f.hybrid != 0,
        pti: f.pti != 0,
        misc_enable_read: f.misc_enable_ok != 0,
        perf_capabilities: (f.perf_caps_ok != 0).then_some(f.perf_caps),
        full_width: f.perf_caps_ok != 0 && f.perf_caps & cap::FULL_WIDTH_WRITE != 0,
    };
    (facts, f.tsc_khz)
}

/// The current CPU's MSRs through `rdmsrl_safe`/`wrmsrl_safe`: a missing MSR is a
/// counted fault (reads give 0), never an oops. Use with IRQs off on one CPU.
#[derive(Default)]
pub(crate) struct KernelMsrs {
    /// Accesses that faulted.
    pub(crate) faults: u32,
}

impl PebsMsrs for KernelMsrs {
    fn rdmsr(&mut self, msr: u32) -> u64 {
        let mut v = 0u64;
        // SAFETY: `v` is valid for the write; the safe accessor catches #GP.
        if unsafe { ffi::hrperf_shim_rdmsr(msr, &mut v) } != 0 {
            self.faults = self.faults.saturating_add(1);
            return 0;
        }
        v
    }

    fn wrmsr(&mut self, msr: u32, value: u64) {
        // SAFETY: the safe accessor catches #GP; which MSRs are written is the caller's
        // (the PEBS programming sequence of `hrperf_fmt_pebs::ds`).
        if unsafe { ffi::hrperf_shim_wrmsr(msr, value) } != 0 {
            self.faults = self.faults.saturating_add(1);
        }
    }
}

/// perf's raw encoding of generic hardware event `id` (`PERF_COUNT_HW_*`), if it has one.
pub(crate) fn hw_event_config(id: u64) -> Option<u64> {
    let id = u32::try_from(id).ok()?;
    // SAFETY: a table lookup in perf (bounds-checked there); no preconditions.
    let c = unsafe { ffi::hrperf_shim_hw_event_config(id) };
    (c != 0).then_some(c)
}

/// The PEBS PMI handler (an `NMI_LOCAL` handler calling [`hrperf_rs_pebs_pmi`]),
/// registered while this lives.
pub(crate) struct PebsNmi(());

impl PebsNmi {
    /// Registers the handler (first in line, before perf's). Process context.
    pub(crate) fn register() -> Result<PebsNmi> {
        // SAFETY: process context; the handler is a static function of the shim.
        to_result(unsafe { ffi::hrperf_shim_pebs_nmi_register() })?;
        Ok(PebsNmi(()))
    }
}

impl Drop for PebsNmi {
    fn drop(&mut self) {
        // SAFETY: registered in `register`; returns after every running handler ended.
        unsafe { ffi::hrperf_shim_pebs_nmi_unregister() };
    }
}

// ---- CPUs, time, cross calls ----------------------------------------------------------------------

/// The CPU this code runs on (meaningful with preemption or IRQs off, e.g. in an IPI).
pub(crate) fn this_cpu() -> u32 {
    // SAFETY: no preconditions.
    unsafe { ffi::hrperf_shim_this_cpu() }
}

/// `nr_cpu_ids`.
pub(crate) fn nr_cpu_ids() -> u32 {
    // SAFETY: no preconditions.
    unsafe { ffi::hrperf_shim_nr_cpu_ids() }
}

/// CPUs online now.
pub(crate) fn num_online_cpus() -> u32 {
    // SAFETY: no preconditions.
    unsafe { ffi::hrperf_shim_num_online_cpus() }
}

/// Whether `cpu` exists and is online.
pub(crate) fn cpu_online(cpu: u32) -> bool {
    // SAFETY: the shim bounds-checks `cpu`.
    unsafe { ffi::hrperf_shim_cpu_online(cpu) != 0 }
}

/// `local_clock()`: this CPU's ns clock (sched_clock based).
pub(crate) fn clock_ns() -> u64 {
    // SAFETY: no preconditions; IRQ/NMI safe.
    unsafe { ffi::hrperf_shim_clock_ns() }
}

unsafe extern "C" fn call_mut<F: FnMut()>(info: *mut c_void) {
    // SAFETY: `info` is the `&mut F` that `on_cpu` passed; it waits for this single call.
    let f = unsafe { &mut *info.cast::<F>() };
    f();
}

unsafe extern "C" fn call_shared<F: Fn() + Sync>(info: *mut c_void) {
    // SAFETY: `info` is the `&F` that `on_cpus` passed; it waits for all calls, and `F`
    // is `Sync`, so concurrent calls on several CPUs are fine.
    let f = unsafe { &*info.cast::<F>() };
    f();
}

/// Runs `f` once on `cpu`, with IRQs off, and waits. `ENXIO` if `cpu` is offline.
pub(crate) fn on_cpu<F: FnMut() + Send>(cpu: u32, f: &mut F) -> Result {
    let info = (f as *mut F).cast::<c_void>();
    // SAFETY: `info` outlives the call (waited for); `call_mut::<F>` matches its type.
    to_result(unsafe { ffi::hrperf_shim_on_cpu(cpu, call_mut::<F>, info) })
}

/// Runs `f` on every online CPU of `mask` (the caller's included), IRQs off, and waits.
/// Process or kthread context only.
pub(crate) fn on_cpus<F: Fn() + Sync>(mask: &CpuMask, f: &F) {
    let info = (f as *const F).cast_mut().cast::<c_void>();
    // SAFETY: `bits` holds 256 bits as the shim expects; `info` outlives the call
    // (waited for) and is only used as `&F`.
    unsafe { ffi::hrperf_shim_on_cpus(mask.bits.as_ptr(), call_shared::<F>, info) };
}

// ---- the poll thread ------------------------------------------------------------------------------

/// A kernel thread running `T`'s loop; stopped (and waited for) on drop.
///
/// # Invariants
///
/// `0` is a running kthread whose function only returns after `kthread_stop`.
pub(crate) struct Thread(NonNull<c_void>);

// SAFETY: a task pointer; kthread_stop may be called from any process context.
unsafe impl Send for Thread {}
// SAFETY: no `&self` methods.
unsafe impl Sync for Thread {}

/// The body of a [`Thread`].
pub(crate) trait ThreadBody: Sync {
    /// Runs until [`should_stop`] says so, then returns.
    fn run(&self);
}

unsafe extern "C" fn thread_fn<T: ThreadBody>(data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `&T` given to `Thread::start`, valid until the thread is
    // stopped (its contract), and `run` returns only once stopping was asked.
    let body = unsafe { &*data.cast::<T>() };
    body.run();
    0
}

impl Thread {
    /// Starts `body.run()` in a kthread named `hrperf-poll`.
    ///
    /// # Safety
    ///
    /// `body` must stay valid until the returned `Thread` is dropped, and `run` must only
    /// return when [`should_stop`] is true.
    pub(crate) unsafe fn start<T: ThreadBody>(body: &T) -> Result<Thread> {
        let data = (body as *const T).cast_mut().cast::<c_void>();
        // SAFETY: the caller's contract covers `data`; `thread_fn::<T>` matches it.
        let t = unsafe { ffi::hrperf_shim_thread_start(thread_fn::<T>, data) };
        // INVARIANT: a running kthread of `thread_fn`, which returns only when stopped.
        NonNull::new(t).map(Thread).ok_or(ENOMEM)
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        // SAFETY: the type invariant: the thread is alive until this stop returns.
        unsafe { ffi::hrperf_shim_thread_stop(self.0.as_ptr()) };
    }
}

/// In a [`Thread`]: whether the owner asked the thread to stop.
pub(crate) fn should_stop() -> bool {
    // SAFETY: called from a kthread body only (ThreadBody::run).
    unsafe { ffi::hrperf_shim_thread_should_stop() != 0 }
}

/// In a [`Thread`]: sleeps about `ns` (hrtimer); a stop request wakes it early.
pub(crate) fn sleep_ns(ns: u64) {
    // SAFETY: process context (a kthread).
    unsafe { ffi::hrperf_shim_sleep_ns(ns) };
}

// ---- entry points from C ------------------------------------------------------------------------------

/// `open()`: creates the file's Rust state; 0 or `-errno`.
///
/// # Safety
///
/// `hf` is the file's live `struct hrperf_file`; `rs` is writable.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_open(hf: *mut c_void, rs: *mut *mut c_void) -> c_int {
    let (Some(hf), false) = (NonNull::new(hf), rs.is_null()) else { return EINVAL.to_errno() };
    // INVARIANT: the shim frees `hf` only after `hrperf_rs_release`.
    match crate::file::open(FileHandle(hf)) {
        Ok(p) => {
            // SAFETY: `rs` is writable (checked non-null; the caller's contract).
            unsafe { rs.write(p.cast_mut()) };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// `release()`: tears the file's session down and frees its Rust state.
///
/// # Safety
///
/// `rs` came from `hrperf_rs_open` and is not used afterwards.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_release(rs: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { crate::file::release(rs) };
}

/// `unlocked_ioctl()`.
///
/// # Safety
///
/// `rs` came from `hrperf_rs_open` and is not yet released.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_ioctl(rs: *mut c_void, cmd: c_uint, arg: c_ulong) -> c_long {
    // SAFETY: the caller's contract.
    let f = unsafe { crate::file::borrow(rs) };
    match f.ioctl(cmd, arg as usize) {
        Ok(v) => v as c_long,
        Err(e) => e.to_errno() as c_long,
    }
}

/// `poll()` readiness: 1 if a NOTIFY, LOG or stop is not yet acknowledged by CONSUME.
///
/// # Safety
///
/// As for [`hrperf_rs_ioctl`].
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_poll(rs: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    let f = unsafe { crate::file::borrow(rs) };
    f.readable() as c_int
}

/// `mmap()` (read-only already enforced by the shim): maps the session's buffers.
///
/// # Safety
///
/// As for [`hrperf_rs_ioctl`]; `vma` is the mapping being set up, `start`/`len` its
/// bounds, with the mmap lock held.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_mmap(
    rs: *mut c_void,
    vma: *mut c_void,
    start: c_ulong,
    len: c_ulong,
    pgoff: c_ulong,
) -> c_int {
    let Some(vma) = NonNull::new(vma) else { return EINVAL.to_errno() };
    // SAFETY: the caller's contract.
    let f = unsafe { crate::file::borrow(rs) };
    // INVARIANT: the mapping being set up, for the duration of this call.
    let vma = Vma(vma, PhantomData);
    match f.mmap(&vma, start as usize, len as usize, pgoff as usize) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// The overflow handler: NMI or IRQ context on the counter's CPU.
///
/// # Safety
///
/// `ctx` is the `CpuSlot` given to [`PerfCounter::create`] (alive until the counter is
/// released), `o` is valid for reads.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_overflow(ctx: *mut c_void, o: *const OverflowInfo) {
    // SAFETY: `ctx` is a live `CpuSlot` or null (the caller's contract).
    let slot = unsafe { ctx.cast::<crate::session::CpuSlot>().as_ref() };
    // SAFETY: `o` is valid for reads or null (the caller's contract).
    let o = unsafe { o.as_ref() };
    let (Some(slot), Some(o)) = (slot, o) else { return };
    slot.on_overflow(o);
}

/// The PEBS NMI handler: every NMI on this CPU while [`PebsNmi`] is registered. Returns
/// non-zero if it was this CPU's PEBS threshold interrupt.
///
/// # Safety
///
/// `o` is valid for reads (its `regs` during the call), NMI context on the current CPU.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_rs_pebs_pmi(o: *const OverflowInfo) -> c_int {
    // SAFETY: valid for reads or null (the caller's contract).
    match unsafe { o.as_ref() } {
        Some(o) => crate::pebs_pmu::on_nmi(o) as c_int,
        None => 0,
    }
}

/// Registers a format module's table (perfmon2's `pfm_fmt_register`); 0 or `-errno`.
/// Exported to format modules by the shim (`EXPORT_SYMBOL_GPL`).
///
/// # Safety
///
/// `ops` points to a `FormatOps` with a non-null `owner` (the calling module) that
/// stays valid and unmodified until [`hrperf_unregister_format`] succeeds for it.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_register_format(ops: *const FormatOps) -> c_int {
    let Some(ops) = NonNull::new(ops.cast_mut()) else { return EINVAL.to_errno() };
    // SAFETY: the caller's contract.
    match unsafe { crate::register_format(ops) } {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// Unregisters a table registered by [`hrperf_register_format`]; `-EBUSY` while
/// sessions use it (they also pin its module, so a module exit never sees that).
///
/// # Safety
///
/// `ops` is null or valid for reads.
#[no_mangle]
pub(crate) unsafe extern "C" fn hrperf_unregister_format(ops: *const FormatOps) -> c_int {
    // SAFETY: the caller's contract.
    let Some(ops) = (unsafe { ops.as_ref() }) else { return EINVAL.to_errno() };
    match crate::unregister_format(ops) {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}
