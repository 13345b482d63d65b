//! Every system call of the perf source, behind one trait ([`Sys`]) with a real
//! implementation ([`LinuxSys`]) and a test fake (`fake.rs`), after aya's `sys/mod.rs`.
//!
//! Reference: `include/uapi/linux/perf_event.h` (Linux 6.18) for [`PerfEventAttr`], the
//! ioctl numbers and the `perf_event_mmap_page` offsets; perf_event_open(2).

use std::ffi::{CStr, CString};
use std::io;
use std::ptr::NonNull;

use crate::source::child::{self, cvt, cvt_retry};

/// `PERF_ATTR_SIZE_VER8`: the size of [`PerfEventAttr`] we pass.
pub const PERF_ATTR_SIZE: u32 = 136;

/// `struct perf_event_attr` as of `PERF_ATTR_SIZE_VER8` (Linux 6.3+; older kernels accept
/// it as long as the tail they do not know is zero).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfEventAttr {
    /// `PERF_TYPE_*`.
    pub kind: u32,
    /// [`PERF_ATTR_SIZE`].
    pub size: u32,
    /// Event selector within `kind`.
    pub config: u64,
    /// `sample_period`, or `sample_freq` when [`ATTR_FREQ`] is set.
    pub sample_period_or_freq: u64,
    /// `PERF_SAMPLE_*`.
    pub sample_type: u64,
    /// `PERF_FORMAT_*`.
    pub read_format: u64,
    /// The bitfield word: `ATTR_*` bits, `precise_ip` in bits 15..17.
    pub flags: u64,
    /// `wakeup_events`, or `wakeup_watermark` (bytes) when [`ATTR_WATERMARK`] is set.
    pub wakeup: u32,
    /// `bp_type`.
    pub bp_type: u32,
    /// `config1` (`bp_addr`).
    pub config1: u64,
    /// `config2` (`bp_len`).
    pub config2: u64,
    /// `branch_sample_type`.
    pub branch_sample_type: u64,
    /// `sample_regs_user`.
    pub sample_regs_user: u64,
    /// `sample_stack_user`.
    pub sample_stack_user: u32,
    /// `clockid` (with [`ATTR_USE_CLOCKID`]).
    pub clockid: i32,
    /// `sample_regs_intr`.
    pub sample_regs_intr: u64,
    /// `aux_watermark`.
    pub aux_watermark: u32,
    /// `sample_max_stack`.
    pub sample_max_stack: u16,
    /// Reserved, zero.
    pub reserved_2: u16,
    /// `aux_sample_size`.
    pub aux_sample_size: u32,
    /// `aux_action` (6.13+), zero.
    pub aux_action: u32,
    /// `sig_data`.
    pub sig_data: u64,
    /// `config3`.
    pub config3: u64,
}
const _: () = assert!(core::mem::size_of::<PerfEventAttr>() == PERF_ATTR_SIZE as usize);

/// `disabled`: start disabled.
pub const ATTR_DISABLED: u64 = 1 << 0;
/// `inherit`: children inherit the counter.
pub const ATTR_INHERIT: u64 = 1 << 1;
/// `exclude_user`.
pub const ATTR_EXCLUDE_USER: u64 = 1 << 4;
/// `exclude_kernel`.
pub const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
/// `exclude_hv`.
pub const ATTR_EXCLUDE_HV: u64 = 1 << 6;
/// `comm`: `PERF_RECORD_COMM` records when a task's command name changes (exec,
/// `prctl(PR_SET_NAME)`).
pub const ATTR_COMM: u64 = 1 << 9;
/// `freq`: `sample_freq` instead of `sample_period`.
pub const ATTR_FREQ: u64 = 1 << 10;
/// `enable_on_exec`.
pub const ATTR_ENABLE_ON_EXEC: u64 = 1 << 12;
/// `watermark`: wake up by bytes, not events.
pub const ATTR_WATERMARK: u64 = 1 << 14;
/// Shift of the two-bit `precise_ip` field.
pub const ATTR_PRECISE_IP_SHIFT: u32 = 15;
/// `exclude_callchain_kernel`: no kernel frames in `PERF_SAMPLE_CALLCHAIN`.
pub const ATTR_EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
/// `exclude_callchain_user`: no user frames in `PERF_SAMPLE_CALLCHAIN`.
pub const ATTR_EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;
/// `comm_exec`: `PERF_RECORD_COMM` of an exec carries `PERF_RECORD_MISC_COMM_EXEC`.
pub const ATTR_COMM_EXEC: u64 = 1 << 24;
/// `use_clockid`.
pub const ATTR_USE_CLOCKID: u64 = 1 << 25;

/// `PERF_SAMPLE_IP`.
pub const PERF_SAMPLE_IP: u64 = 1 << 0;
/// `PERF_SAMPLE_TID`.
pub const PERF_SAMPLE_TID: u64 = 1 << 1;
/// `PERF_SAMPLE_TIME`.
pub const PERF_SAMPLE_TIME: u64 = 1 << 2;
/// `PERF_SAMPLE_ADDR`.
pub const PERF_SAMPLE_ADDR: u64 = 1 << 3;
/// `PERF_SAMPLE_READ`.
pub const PERF_SAMPLE_READ: u64 = 1 << 4;
/// `PERF_SAMPLE_CALLCHAIN`: `u64 nr; u64 ips[nr]` after the `READ` values.
pub const PERF_SAMPLE_CALLCHAIN: u64 = 1 << 5;
/// `PERF_SAMPLE_CPU`.
pub const PERF_SAMPLE_CPU: u64 = 1 << 7;
/// `PERF_SAMPLE_PERIOD`.
pub const PERF_SAMPLE_PERIOD: u64 = 1 << 8;

/// `PERF_FORMAT_ID`.
pub const PERF_FORMAT_ID: u64 = 1 << 2;
/// `PERF_FORMAT_GROUP`.
pub const PERF_FORMAT_GROUP: u64 = 1 << 3;

/// `PERF_FLAG_FD_CLOEXEC`.
pub const PERF_FLAG_FD_CLOEXEC: u64 = 1 << 3;

/// `PERF_EVENT_IOC_ENABLE` = `_IO('$', 0)`.
pub const IOC_ENABLE: u64 = 0x2400;
/// `PERF_EVENT_IOC_DISABLE` = `_IO('$', 1)`.
pub const IOC_DISABLE: u64 = 0x2401;
/// `PERF_EVENT_IOC_ID` = `_IOR('$', 7, __u64 *)`.
pub const IOC_ID: u64 = 0x8008_2407;
/// `PERF_IOC_FLAG_GROUP`: apply an enable/disable to the whole group.
pub const IOC_FLAG_GROUP: u64 = 1;

/// Offset of `data_head` in `struct perf_event_mmap_page`.
pub const MMAP_DATA_HEAD: usize = 1024;
/// Offset of `data_tail`.
pub const MMAP_DATA_TAIL: usize = 1032;
/// Offset of `data_offset` (Linux 4.1+; zero before).
pub const MMAP_DATA_OFFSET: usize = 1040;
/// Offset of `data_size` (Linux 4.1+; zero before).
pub const MMAP_DATA_SIZE: usize = 1048;

/// How a waited-for child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildExit {
    /// Exit code, or `-signal` if killed by one.
    pub status: i32,
    /// User + system CPU time of the child and its reaped descendants (ns).
    pub cpu_time_ns: u64,
}

pub use crate::source::child::HeldChild;

/// The system calls of the perf source.
///
/// File descriptors are plain `i32`s so that the fake can hand out numbers that are not
/// real descriptors; [`Sys::close`] is the only way they are closed.
pub trait Sys: Send + Sync {
    /// `perf_event_open(attr, pid, cpu, group_fd, flags)`.
    fn perf_event_open(
        &self,
        attr: &PerfEventAttr,
        pid: i32,
        cpu: i32,
        group_fd: i32,
        flags: u64,
    ) -> io::Result<i32>;
    /// `ioctl(fd, request, arg)` for requests taking an integer argument.
    fn ioctl(&self, fd: i32, request: u64, arg: u64) -> io::Result<()>;
    /// `ioctl(fd, PERF_EVENT_IOC_ID, &id)`.
    fn event_id(&self, fd: i32) -> io::Result<u64>;
    /// `mmap(NULL, len, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0)`; page aligned.
    fn mmap(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>>;
    /// `munmap(ptr, len)`.
    ///
    /// # Safety
    ///
    /// `ptr` and `len` come from one earlier [`Sys::mmap`] of this object, and nothing
    /// uses the mapping afterwards.
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize);
    /// `read(fd, buf)`.
    fn read(&self, fd: i32, buf: &mut [u8]) -> io::Result<usize>;
    /// `poll(fds, timeout_ms)`; returns the number of ready entries.
    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize>;
    /// `close(fd)`.
    fn close(&self, fd: i32);
    /// `clock_gettime(CLOCK_MONOTONIC)` in ns.
    fn now_ns(&self) -> u64;
    /// `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, deadline)`.
    fn sleep_until_ns(&self, deadline_ns: u64);
    /// Finds a program like `execvp` would: a name with a `/` as is, else along `$PATH`.
    fn find_program(&self, name: &str) -> io::Result<CString>;
    /// Forks a child that waits on a pipe and then `execve(path, argv, envp)`s.
    fn spawn_held(&self, path: &CStr, argv: &[CString], envp: &[CString]) -> io::Result<HeldChild>;
    /// Lets a held child exec and waits until it has (or failed to).
    fn release_child(&self, child: &HeldChild) -> io::Result<()>;
    /// `wait4(pid, WNOHANG or 0)`; `None` while it runs (only with `nohang`).
    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>>;
    /// `kill(pid, signal)`.
    fn kill(&self, pid: i32, signal: i32) -> io::Result<()>;
    /// `pidfd_open(pid, 0)` (Linux 5.3+).
    fn pidfd_open(&self, pid: i32) -> io::Result<i32>;
    /// Reads a whole text file (`/proc`, `/sys`).
    fn read_file(&self, path: &str) -> io::Result<String>;
    /// Names of the entries of a directory, sorted.
    fn list_dir(&self, path: &str) -> io::Result<Vec<String>>;
    /// `sysconf(_SC_PAGESIZE)`.
    fn page_size(&self) -> usize;
}

/// The real system calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSys;

impl Sys for LinuxSys {
    fn perf_event_open(
        &self,
        attr: &PerfEventAttr,
        pid: i32,
        cpu: i32,
        group_fd: i32,
        flags: u64,
    ) -> io::Result<i32> {
        let ret = cvt_retry(|| {
            // SAFETY: `attr` points to a fully initialised perf_event_attr of `attr.size`
            // bytes that outlives the call; the other arguments are plain integers.
            unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    attr as *const PerfEventAttr,
                    pid,
                    cpu,
                    group_fd,
                    flags as libc::c_ulong,
                )
            }
        })?;
        Ok(ret as i32)
    }

    fn ioctl(&self, fd: i32, request: u64, arg: u64) -> io::Result<()> {
        cvt_retry(|| {
            // SAFETY: perf ioctls with an integer argument do not dereference it.
            unsafe { libc::ioctl(fd, request as _, arg as libc::c_ulong) }.into()
        })?;
        Ok(())
    }

    fn event_id(&self, fd: i32) -> io::Result<u64> {
        let mut id = 0u64;
        cvt_retry(|| {
            // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer, which points to
            // a live local.
            unsafe { libc::ioctl(fd, IOC_ID as _, &mut id as *mut u64) }.into()
        })?;
        Ok(id)
    }

    fn mmap(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh shared mapping chosen by the kernel; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
    }

    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) {
        // SAFETY: the caller guarantees `ptr`/`len` are one mapping that is no longer used.
        unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    }

    fn read(&self, fd: i32, buf: &mut [u8]) -> io::Result<usize> {
        let n = cvt_retry(|| {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
            unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) as libc::c_long }
        })?;
        Ok(n as usize)
    }

    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
        // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        match cvt(n.into()) {
            Ok(n) => Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn close(&self, fd: i32) {
        // SAFETY: the fd is owned by the caller, which never uses it again.
        unsafe { libc::close(fd) };
    }

    fn now_ns(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to fill; CLOCK_MONOTONIC always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn sleep_until_ns(&self, deadline_ns: u64) {
        let ts = libc::timespec {
            tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
        };
        loop {
            // SAFETY: `ts` is a valid timespec; the remainder pointer may be NULL with
            // TIMER_ABSTIME.
            let r = unsafe {
                libc::clock_nanosleep(
                    libc::CLOCK_MONOTONIC,
                    libc::TIMER_ABSTIME,
                    &ts,
                    std::ptr::null_mut(),
                )
            };
            if r != libc::EINTR {
                return;
            }
        }
    }

    fn find_program(&self, name: &str) -> io::Result<CString> {
        child::find_program(name)
    }

    fn spawn_held(&self, path: &CStr, argv: &[CString], envp: &[CString]) -> io::Result<HeldChild> {
        child::spawn_held(path, argv, envp, None)
    }

    fn release_child(&self, child: &HeldChild) -> io::Result<()> {
        child::send_go(child.go_fd)?;
        child::exec_result(child.err_fd)
    }

    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>> {
        let exit = child::wait_child(pid, nohang)?;
        Ok(exit.map(|(status, cpu_time_ns)| ChildExit {
            status,
            cpu_time_ns,
        }))
    }

    fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        child::kill(pid, signal)
    }

    fn pidfd_open(&self, pid: i32) -> io::Result<i32> {
        child::pidfd_open(pid)
    }

    fn read_file(&self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn list_dir(&self, path: &str) -> io::Result<Vec<String>> {
        let mut names = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    fn page_size(&self) -> usize {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 {
            n as usize
        } else {
            4096
        }
    }
}
