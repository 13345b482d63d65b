// SPDX-License-Identifier: GPL-2.0
//! One open `/dev/hrperf` = one session: the ioctls of `hrperf_abi::ioctl`, `mmap` and
//! `poll`.
//!
//! Every argument is read exactly once through `UserSlice` (the `size` word first, then
//! the rest of the struct, then any tail, each byte once), with the ABI's rules: `size`
//! below the struct → `EINVAL`, a non-zero tail beyond it → `E2BIG`, non-zero reserved
//! fields → `EINVAL`, bad pointers → `EFAULT`, unknown commands → `ENOTTY`.

use core::ffi::c_void;
use core::mem::size_of;
use core::pin::Pin;

use kernel::prelude::*;
use kernel::sync::Mutex;
use kernel::types::{AsBytes, ForeignOwnable, FromBytes};
use kernel::uaccess::UserSlice;
use kernel::{new_mutex, pin_init};

use crate::abi::event::EventDesc;
use crate::abi::format::{MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL};
use crate::abi::ioctl::*;
use crate::abi::CpuMask;
use crate::engine::format::MAX_ARG_SIZE;
use crate::engine::Selector;
use crate::session::{self, ActiveSession, CreateRequest, Notifier};
use crate::shim::{self, FileHandle, ModuleRef, Vma};
use crate::{engine_err, globals, MODULE_VERSION};

macro_rules! plain_data {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: hrperf-abi structs are `#[repr(C)]` integers and integer arrays with
        // explicit padding and compile-time size asserts (its rule 6): every byte
        // pattern is a valid value and no byte is uninitialised.
        unsafe impl FromBytes for $t {}
        // SAFETY: as above.
        unsafe impl AsBytes for $t {}
    )*};
}
plain_data!(
    ModuleInfo, FormatInfo, FormatList, SessionCreate, CpuArg, CpuStats, StatsArg,
    BufferSlot, BuffersArg, ConsumeArg,
);

/// Largest sized argument read (its tail must be zero).
const MAX_SIZED_ARG: usize = 4096;
/// Largest argument struct this module knows (`SessionCreate`).
const MAX_STRUCT: usize = 512;
const _: () = assert!(size_of::<SessionCreate>() <= MAX_STRUCT);

/// The bytes of a plain-data value.
fn bytes_of<T: AsBytes>(v: &T) -> &[u8] {
    // SAFETY: `T: AsBytes`: every byte is initialised; the slice covers exactly `v`.
    unsafe { core::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Reads a sized argument struct at `arg`, each user byte once.
fn read_sized<T: FromBytes + AsBytes>(arg: usize) -> Result<T> {
    let min = size_of::<T>();
    if min > MAX_STRUCT || min < 4 {
        return Err(EINVAL);
    }
    let mut r = UserSlice::new(arg, MAX_SIZED_ARG).reader();
    let size: u32 = r.read()?;
    let size_us = size as usize;
    if size_us < min {
        return Err(EINVAL);
    }
    if size_us > MAX_SIZED_ARG {
        return Err(E2BIG);
    }
    let mut raw = [0u64; MAX_STRUCT / 8];
    // SAFETY: a u64 array viewed as bytes: aligned, initialised, same extent.
    let bytes =
        unsafe { core::slice::from_raw_parts_mut(raw.as_mut_ptr().cast::<u8>(), MAX_STRUCT) };
    r.read_slice(bytes.get_mut(4..min).ok_or(EINVAL)?)?;
    bytes.get_mut(..4).ok_or(EINVAL)?.copy_from_slice(&size.to_ne_bytes());
    let mut tail = size_us - min;
    let mut chunk = [0u8; 64];
    while tail > 0 {
        let n = tail.min(chunk.len());
        let part = chunk.get_mut(..n).ok_or(EINVAL)?;
        r.read_slice(part)?;
        if part.iter().any(|&b| b != 0) {
            return Err(E2BIG);
        }
        tail -= n;
    }
    // SAFETY: `raw` holds `min == size_of::<T>() <= MAX_STRUCT` initialised bytes,
    // 8-aligned (every ABI struct's alignment is at most 8), and `T: FromBytes`.
    Ok(unsafe { raw.as_ptr().cast::<T>().read() })
}

/// Writes `v` back to `arg` (an `_IOWR` argument): at most the caller's `size` bytes,
/// with `size` set to the bytes written.
fn write_sized<T: AsBytes>(arg: usize, v: &T, user_size: u32) -> Result {
    let n = (user_size as usize).min(size_of::<T>());
    let mut bytes = [0u8; MAX_STRUCT];
    let out = bytes.get_mut(..n).ok_or(EINVAL)?;
    out.copy_from_slice(bytes_of(v).get(..n).ok_or(EINVAL)?);
    out.get_mut(..4).ok_or(EINVAL)?.copy_from_slice(&(n as u32).to_ne_bytes());
    UserSlice::new(arg, n).writer().write_slice(out)
}

/// Writes `n` entries produced by `entry(i)` to the user array at `ptr`.
fn write_array<E: AsBytes>(ptr: u64, n: usize, mut entry: impl FnMut(usize) -> Result<E>) -> Result {
    if n == 0 {
        return Ok(());
    }
    let len = n.checked_mul(size_of::<E>()).ok_or(EINVAL)?;
    let mut w = UserSlice::new(ptr as usize, len).writer();
    for i in 0..n {
        w.write(&entry(i)?)?;
    }
    Ok(())
}

/// Matches a command on type, direction and number; the size bits may grow.
fn same_cmd(cmd: u32, known: u32) -> bool {
    const SIZE_BITS: u32 = 0x3fff << 16;
    cmd & !SIZE_BITS == known & !SIZE_BITS
}

/// The Rust state of one open file.
#[pin_data]
pub(crate) struct FileCtx {
    notifier: Notifier,
    #[pin]
    session: Mutex<Option<KBox<ActiveSession>>>,
}

/// `open()`: a new file with no session; returns the pointer C keeps.
pub(crate) fn open(file: FileHandle) -> Result<*const c_void> {
    let ctx = KBox::pin_init(
        pin_init!(FileCtx {
            notifier: Notifier::new(file),
            session <- new_mutex!(None, "hrperf_session"),
        }),
        GFP_KERNEL,
    )?;
    Ok(ctx.into_foreign())
}

/// `release()`: destroys the session (if any) and frees the file's state.
///
/// # Safety
///
/// `p` came from [`open`] and is not used afterwards.
pub(crate) unsafe fn release(p: *mut c_void) {
    // SAFETY: the caller's contract.
    let ctx = unsafe { <Pin<KBox<FileCtx>> as ForeignOwnable>::from_foreign(p) };
    ctx.destroy();
    drop(ctx);
}

/// The file's state, for one file operation.
///
/// # Safety
///
/// `p` came from [`open`] and is not released before the borrow ends.
pub(crate) unsafe fn borrow<'a>(p: *mut c_void) -> Pin<&'a FileCtx> {
    // SAFETY: the caller's contract.
    unsafe { <Pin<KBox<FileCtx>> as ForeignOwnable>::borrow(p) }
}

impl FileCtx {
    /// Destroys the session, if any (DESTROY, close).
    fn destroy(&self) {
        let old = self.session.lock().take();
        if old.is_some() {
            if let Ok(g) = globals() {
                g.sessions.fetch_sub(1, core::sync::atomic::Ordering::Relaxed);
            }
        }
        drop(old); // stops and tears down (counters, thread, format exit, buffers)
    }

    /// Whether `poll()` reports readable.
    pub(crate) fn readable(&self) -> bool {
        self.notifier.pending()
    }

    /// `mmap()` of the session's buffers.
    pub(crate) fn mmap(&self, vma: &Vma<'_>, start: usize, len: usize, pgoff: usize) -> Result {
        let guard = self.session.lock();
        let s = guard.as_ref().ok_or(EINVAL)?;
        s.mmap(vma, start, len, pgoff)
    }

    /// `unlocked_ioctl()`.
    pub(crate) fn ioctl(&self, cmd: u32, arg: usize) -> Result<isize> {
        let with_session = |f: &dyn Fn(&mut ActiveSession) -> Result| -> Result<isize> {
            let mut guard = self.session.lock();
            let s = guard.as_mut().ok_or(EINVAL)?;
            f(s).map(|()| 0)
        };
        match cmd {
            c if same_cmd(c, HRPERF_IOC_INFO) => self.info(arg).map(|()| 0),
            c if same_cmd(c, HRPERF_IOC_FORMATS) => self.formats(arg).map(|()| 0),
            c if same_cmd(c, HRPERF_IOC_CREATE) => self.create(arg).map(|()| 0),
            c if same_cmd(c, HRPERF_IOC_START) => with_session(&|s| s.start()),
            c if same_cmd(c, HRPERF_IOC_STOP) => with_session(&|s| s.stop()),
            c if same_cmd(c, HRPERF_IOC_RESTART) => {
                let a: CpuArg = read_sized(arg)?;
                with_session(&|s| s.restart(a.cpu))
            }
            c if same_cmd(c, HRPERF_IOC_DESTROY) => {
                if self.session.lock().is_none() {
                    return Err(EINVAL);
                }
                self.destroy();
                Ok(0)
            }
            c if same_cmd(c, HRPERF_IOC_STATS) => self.stats(arg).map(|()| 0),
            c if same_cmd(c, HRPERF_IOC_BUFFERS) => self.buffers(arg).map(|()| 0),
            c if same_cmd(c, HRPERF_IOC_CONSUME) => {
                let a: ConsumeArg = read_sized(arg)?;
                with_session(&|s| s.consume(a.cpu, a.tail))
            }
            c if same_cmd(c, HRPERF_IOC_POLL) => with_session(&|s| s.instructed_poll()),
            c if same_cmd(c, HRPERF_IOC_LOG) => with_session(&|s| s.instructed_log()),
            c if same_cmd(c, HRPERF_IOC_POLL_LOG) => {
                with_session(&|s| s.instructed_poll().and_then(|()| s.instructed_log()))
            }
            _ => Err(ENOTTY),
        }
    }

    fn info(&self, arg: usize) -> Result {
        let a: ModuleInfo = read_sized(arg)?;
        let g = globals()?;
        let mut info = ModuleInfo {
            size: size_of::<ModuleInfo>() as u32,
            abi_version: IOCTL_ABI_VERSION,
            module_version: MODULE_VERSION,
            default_mode: g.default_mode,
            poll_us: g.poll_us,
            nr_formats: g.registry.lock().len() as u32,
            nr_sessions: g.sessions.load(core::sync::atomic::Ordering::Relaxed),
            nr_cpus: shim::num_online_cpus(),
            total_drops: g.total_drops.load(core::sync::atomic::Ordering::Relaxed),
            ..ModuleInfo::default()
        };
        g.pebs.fill_info(&mut info);
        write_sized(arg, &info, a.size)
    }

    fn formats(&self, arg: usize) -> Result {
        let mut a: FormatList = read_sized(arg)?;
        if a.reserved != 0 {
            return Err(EINVAL);
        }
        let mut list = KVec::<FormatInfo>::with_capacity(crate::MAX_FORMATS, GFP_KERNEL)?;
        {
            let reg = globals()?.registry.lock();
            for info in reg.iter() {
                list.push(info, GFP_KERNEL)?; // within capacity: no allocation
            }
        }
        let n = list.len().min(a.capacity as usize);
        write_array(a.entries, n, |i| list.get(i).copied().ok_or(EINVAL))?;
        a.count = list.len() as u32;
        write_sized(arg, &a, a.size)
    }

    fn create(&self, arg: usize) -> Result {
        let c: SessionCreate = read_sized(arg)?;
        if c.flags != 0 || c.reserved0 != 0 || c.reserved != [0; 4] {
            return Err(EINVAL);
        }
        let g = globals()?;
        let mode = if c.mode == MODE_DEFAULT { g.default_mode } else { c.mode };
        let nr = c.nr_events as usize;
        let events: &[EventDesc] = c.events.get(..nr).ok_or(EINVAL)?;
        if events.is_empty() {
            return Err(EINVAL);
        }
        for ev in events {
            session::check_event(ev)?;
        }
        let (sample_period, poll_interval_ns) = match mode {
            MODE_OVERFLOW if c.sample_period == 0 || c.sample_period >> 63 != 0 => {
                return Err(EINVAL)
            }
            MODE_OVERFLOW => (c.sample_period, 0),
            MODE_POLL => {
                let ns = match c.poll_interval_ns {
                    0 => g.poll_us as u64 * 1000,
                    ns => ns,
                };
                if !(session::MIN_POLL_NS..=session::MAX_POLL_NS).contains(&ns) {
                    return Err(EINVAL);
                }
                (0, ns)
            }
            MODE_INSTRUCTED => (0, 0),
            _ => return Err(EINVAL),
        };
        let cpus = if c.cpus == CpuMask::EMPTY {
            let mut all = CpuMask::EMPTY;
            for cpu in 0..shim::nr_cpu_ids() {
                if shim::cpu_online(cpu) {
                    all.insert(cpu);
                }
            }
            all
        } else {
            if c.cpus.iter().any(|cpu| !shim::cpu_online(cpu)) {
                return Err(EINVAL);
            }
            c.cpus
        };
        if cpus.count() == 0 {
            return Err(EINVAL);
        }
        let arg_len = c.fmt_arg_len as usize;
        if arg_len > MAX_ARG_SIZE {
            return Err(E2BIG);
        }
        let mut fmt_arg = KVec::new();
        if arg_len > 0 {
            UserSlice::new(c.fmt_arg as usize, arg_len).read_all(&mut fmt_arg, GFP_KERNEL)?;
        }

        let mut guard = self.session.lock();
        if guard.is_some() {
            return Err(EBUSY);
        }
        let sel = Selector::from_fields(&c.format_name, c.format_uuid);
        let format = g.registry.lock().acquire(sel).map_err(engine_err)?;
        // SAFETY: the format is registered (we hold a use count), so its module has not
        // finished unloading: `owner` is valid for this call.
        let Some(module) = (unsafe { ModuleRef::get(format.owner()) }) else {
            let _ = g.registry.lock().release(format);
            return Err(ENOENT);
        };
        let req = CreateRequest {
            format,
            mode,
            events,
            sample_period,
            poll_interval_ns,
            cpus,
            data_size: c.data_size,
            arg: &fmt_arg,
        };
        let s = ActiveSession::create(&req, module, &self.notifier)?;
        *guard = Some(s);
        g.sessions.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn stats(&self, arg: usize) -> Result {
        let mut a: StatsArg = read_sized(arg)?;
        let guard = self.session.lock();
        let s = guard.as_ref().ok_or(EINVAL)?;
        let n = s.nr_cpus().min(a.count as usize);
        write_array(a.entries, n, |i| s.stats(i))?;
        a.count = s.nr_cpus() as u32;
        write_sized(arg, &a, a.size)
    }

    fn buffers(&self, arg: usize) -> Result {
        let mut a: BuffersArg = read_sized(arg)?;
        let guard = self.session.lock();
        let s = guard.as_ref().ok_or(EINVAL)?;
        let n = s.nr_cpus().min(a.count as usize);
        write_array(a.entries, n, |i| s.buffer_slot(i))?;
        a.count = s.nr_cpus() as u32;
        a.buf_size = s.buf_size() as u64;
        write_sized(arg, &a, a.size)
    }
}
