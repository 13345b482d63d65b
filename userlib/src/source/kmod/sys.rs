//! Every system call of the kmod client, behind one trait ([`KmodSys`]) with a real
//! implementation ([`LinuxKmodSys`]) and a test fake ([`super::fake::FakeKmod`]), after
//! aya's `sys/mod.rs` + `sys/fake.rs`.
//!
//! Reference: `core-kmod/abi/src/ioctl.rs` (the `/dev/hrperf` ioctls, mirrored for C in
//! `include/hrperf.h`); mmap(2), poll(2), pidfd_open(2), execve(2).
//!
//! The ioctls are typed ([`Ioctl`]): the real implementation points the argument struct's
//! `entries` at the slice given with it and calls `ioctl(2)`; the fake reads the same
//! typed values, so tests never build raw pointers.
//!
//! Not behind the trait (they work unprivileged on any Linux, so tests use them for real):
//! the UNIX-socket calls of [`super::control`] and [`daemonize`].

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use hrperf_abi::ioctl::{
    BufferSlot, BuffersArg, ConsumeArg, CpuArg, CpuStats, FormatInfo, FormatList, ModuleInfo,
    SessionCreate, StatsArg, HRPERF_IOC_BUFFERS, HRPERF_IOC_CONSUME, HRPERF_IOC_CREATE,
    HRPERF_IOC_DESTROY, HRPERF_IOC_FORMATS, HRPERF_IOC_INFO, HRPERF_IOC_LOG, HRPERF_IOC_POLL,
    HRPERF_IOC_POLL_LOG, HRPERF_IOC_RESTART, HRPERF_IOC_START, HRPERF_IOC_STATS, HRPERF_IOC_STOP,
};

use crate::source::child::{self, cvt, cvt_retry, pipe_cloexec};

/// One `/dev/hrperf` ioctl with its typed argument.
///
/// For the list commands the slice is where the kernel writes the entries; the real
/// implementation sets the argument's `entries` pointer and capacity/count from it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Ioctl<'a> {
    /// `HRPERF_IOC_INFO`.
    Info(&'a mut ModuleInfo),
    /// `HRPERF_IOC_FORMATS`.
    Formats(&'a mut FormatList, &'a mut [FormatInfo]),
    /// `HRPERF_IOC_CREATE`.
    Create(&'a SessionCreate),
    /// `HRPERF_IOC_START`.
    Start,
    /// `HRPERF_IOC_STOP`.
    Stop,
    /// `HRPERF_IOC_RESTART`.
    Restart(&'a CpuArg),
    /// `HRPERF_IOC_DESTROY`.
    Destroy,
    /// `HRPERF_IOC_STATS`.
    Stats(&'a mut StatsArg, &'a mut [CpuStats]),
    /// `HRPERF_IOC_BUFFERS`.
    Buffers(&'a mut BuffersArg, &'a mut [BufferSlot]),
    /// `HRPERF_IOC_CONSUME`.
    Consume(&'a ConsumeArg),
    /// `HRPERF_IOC_POLL`.
    Poll,
    /// `HRPERF_IOC_LOG`.
    Log,
    /// `HRPERF_IOC_POLL_LOG`.
    PollLog,
}

impl Ioctl<'_> {
    /// The command's name, for error messages (`HRPERF_IOC_CREATE`).
    pub fn name(&self) -> &'static str {
        match self {
            Ioctl::Info(_) => "HRPERF_IOC_INFO",
            Ioctl::Formats(..) => "HRPERF_IOC_FORMATS",
            Ioctl::Create(_) => "HRPERF_IOC_CREATE",
            Ioctl::Start => "HRPERF_IOC_START",
            Ioctl::Stop => "HRPERF_IOC_STOP",
            Ioctl::Restart(_) => "HRPERF_IOC_RESTART",
            Ioctl::Destroy => "HRPERF_IOC_DESTROY",
            Ioctl::Stats(..) => "HRPERF_IOC_STATS",
            Ioctl::Buffers(..) => "HRPERF_IOC_BUFFERS",
            Ioctl::Consume(_) => "HRPERF_IOC_CONSUME",
            Ioctl::Poll => "HRPERF_IOC_POLL",
            Ioctl::Log => "HRPERF_IOC_LOG",
            Ioctl::PollLog => "HRPERF_IOC_POLL_LOG",
        }
    }
}

/// How a waited-for child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildExit {
    /// Exit code, or `-signal` if a signal killed it.
    pub status: i32,
}

pub use crate::source::child::HeldChild;

/// The system calls of the kmod client.
///
/// File descriptors are plain `i32`s so that the fake can hand out numbers that are not
/// real descriptors; [`KmodSys::close`] is the only way they are closed.
///
/// # Safety
///
/// Implementors guarantee that a successful [`mmap_read`](Self::mmap_read) returns memory
/// that is 8-byte aligned and valid for reads of `len` bytes until the matching
/// [`munmap`](Self::munmap), written only with the producer/consumer protocol of
/// `hrperf_engine::ring` (the buffer header's counters atomically, records before `head`).
pub unsafe trait KmodSys: Send + Sync + std::fmt::Debug {
    /// `open(path, O_RDWR | O_CLOEXEC)`.
    fn open(&self, path: &Path) -> io::Result<i32>;
    /// `close(fd)`.
    fn close(&self, fd: i32);
    /// `ioctl(fd, HRPERF_IOC_*, arg)`.
    fn ioctl(&self, fd: i32, req: Ioctl<'_>) -> io::Result<()>;
    /// `mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0)`.
    fn mmap_read(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>>;
    /// `munmap(ptr, len)`.
    ///
    /// # Safety
    ///
    /// `ptr` and `len` come from one earlier [`mmap_read`](Self::mmap_read) of this
    /// object, and nothing uses the mapping afterwards.
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize);
    /// `poll(fds, timeout_ms)`; `EINTR` is reported as nothing ready.
    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize>;
    /// `clock_gettime(CLOCK_MONOTONIC)` in ns.
    fn now_ns(&self) -> u64;
    /// Finds a program like `execvp` would: a name with a `/` as is, else along `$PATH`.
    fn find_program(&self, name: &str) -> io::Result<CString>;
    /// Forks a child that waits on a pipe and then `execve(path, argv, envp)`s, with
    /// `keep_fd` (if any) inherited across the exec (its close-on-exec flag cleared in
    /// the child only).
    fn spawn_held(
        &self,
        path: &CStr,
        argv: &[CString],
        envp: &[CString],
        keep_fd: Option<i32>,
    ) -> io::Result<HeldChild>;
    /// Lets a held child exec and waits until it has (or failed to).
    fn release_child(&self, child: &HeldChild) -> io::Result<()>;
    /// `wait4(pid, WNOHANG or 0)`; `None` while it runs (only with `nohang`).
    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>>;
    /// `kill(pid, signal)`.
    fn kill(&self, pid: i32, signal: i32) -> io::Result<()>;
    /// `pidfd_open(pid, 0)`: readable when the child exits (Linux 5.3+).
    fn pidfd_open(&self, pid: i32) -> io::Result<i32>;
}

/// The real system calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxKmodSys;

/// `ioctl(fd, cmd, arg)` with a pointer argument, retried on `EINTR`.
///
/// # Safety
///
/// `arg` points to the argument struct `cmd` expects, valid for the reads and writes the
/// command does, and every user pointer inside it is valid for what it describes.
unsafe fn ioctl_ptr<T>(fd: i32, cmd: u32, arg: *mut T) -> io::Result<()> {
    cvt_retry(|| {
        // SAFETY: the caller's contract.
        unsafe { libc::ioctl(fd, cmd as _, arg) }.into()
    })?;
    Ok(())
}

// SAFETY: `mmap_read` returns the kernel's page-aligned mapping of the session's
// buffers, valid until `munmap`; hrperf-core writes them with the ring protocol.
unsafe impl KmodSys for LinuxKmodSys {
    fn open(&self, path: &Path) -> io::Result<i32> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let fd = cvt_retry(|| {
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }.into()
        })?;
        Ok(fd as i32)
    }

    fn close(&self, fd: i32) {
        // SAFETY: the fd is owned by the caller, which never uses it again.
        unsafe { libc::close(fd) };
    }

    fn ioctl(&self, fd: i32, req: Ioctl<'_>) -> io::Result<()> {
        // Each argument is the struct its command expects, borrowed for the call; the
        // list commands point `entries` at a slice with the room they say.
        match req {
            Ioctl::Info(a) => {
                // SAFETY: INFO reads and writes at most `size_of::<ModuleInfo>()` bytes.
                unsafe { ioctl_ptr(fd, HRPERF_IOC_INFO, a as *mut ModuleInfo) }
            }
            Ioctl::Formats(a, entries) => {
                a.entries = entries.as_mut_ptr() as u64;
                a.capacity = entries.len() as u32;
                // SAFETY: `entries` holds `capacity` writable FormatInfo entries.
                unsafe { ioctl_ptr(fd, HRPERF_IOC_FORMATS, a as *mut FormatList) }
            }
            Ioctl::Create(a) => {
                // SAFETY: CREATE only reads the struct (and `fmt_arg_len` bytes at
                // `fmt_arg`, which the caller set from a live slice or left zero).
                unsafe {
                    ioctl_ptr(
                        fd,
                        HRPERF_IOC_CREATE,
                        (a as *const SessionCreate).cast_mut(),
                    )
                }
            }
            Ioctl::Stats(a, entries) => {
                a.entries = entries.as_mut_ptr() as u64;
                a.count = entries.len() as u32;
                // SAFETY: `entries` holds `count` writable CpuStats entries.
                unsafe { ioctl_ptr(fd, HRPERF_IOC_STATS, a as *mut StatsArg) }
            }
            Ioctl::Buffers(a, entries) => {
                a.entries = entries.as_mut_ptr() as u64;
                a.count = entries.len() as u32;
                // SAFETY: `entries` holds `count` writable BufferSlot entries.
                unsafe { ioctl_ptr(fd, HRPERF_IOC_BUFFERS, a as *mut BuffersArg) }
            }
            Ioctl::Consume(a) => {
                // SAFETY: CONSUME only reads the struct.
                unsafe { ioctl_ptr(fd, HRPERF_IOC_CONSUME, (a as *const ConsumeArg).cast_mut()) }
            }
            Ioctl::Restart(a) => {
                // SAFETY: RESTART only reads the struct.
                unsafe { ioctl_ptr(fd, HRPERF_IOC_RESTART, (a as *const CpuArg).cast_mut()) }
            }
            simple => {
                let cmd = match simple {
                    Ioctl::Start => HRPERF_IOC_START,
                    Ioctl::Stop => HRPERF_IOC_STOP,
                    Ioctl::Destroy => HRPERF_IOC_DESTROY,
                    Ioctl::Poll => HRPERF_IOC_POLL,
                    Ioctl::Log => HRPERF_IOC_LOG,
                    _ => HRPERF_IOC_POLL_LOG,
                };
                // SAFETY: `_IO` commands take no argument; a null pointer is never read.
                unsafe { ioctl_ptr(fd, cmd, std::ptr::null_mut::<u8>()) }
            }
        }
    }

    fn mmap_read(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh read-only shared mapping chosen by the kernel; no existing
        // memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
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
        // SAFETY: the caller guarantees `ptr`/`len` are one mapping no longer used.
        unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
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

    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn find_program(&self, name: &str) -> io::Result<CString> {
        child::find_program(name)
    }

    fn spawn_held(
        &self,
        path: &CStr,
        argv: &[CString],
        envp: &[CString],
        keep_fd: Option<i32>,
    ) -> io::Result<HeldChild> {
        child::spawn_held(path, argv, envp, keep_fd)
    }

    fn release_child(&self, child: &HeldChild) -> io::Result<()> {
        let wrote = child::send_go(child.go_fd);
        self.close(child.go_fd);
        if let Err(e) = wrote {
            self.close(child.err_fd);
            return Err(e);
        }
        let exec = child::exec_result(child.err_fd);
        self.close(child.err_fd);
        exec
    }

    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>> {
        Ok(child::wait_child(pid, nohang)?.map(|(status, _cpu_time_ns)| ChildExit { status }))
    }

    fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        child::kill(pid, signal)
    }

    fn pidfd_open(&self, pid: i32) -> io::Result<i32> {
        child::pidfd_open(pid)
    }
}

/// `clock_gettime(CLOCK_MONOTONIC)` in ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME` in ns since the epoch.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What [`daemonize`] returned in one of the two processes.
#[derive(Debug)]
pub enum Forked {
    /// The caller's process: the daemon's pid and the read end of its ready pipe.
    Parent {
        /// The daemon's pid.
        pid: i32,
        /// Read end of the pipe the daemon reports readiness (or its error) on.
        ready: std::fs::File,
    },
    /// The new daemon: session leader, stdin on `/dev/null`; the write end of the ready
    /// pipe (close it, or drop it, once ready).
    Daemon {
        /// Write end of the ready pipe.
        ready: std::fs::File,
    },
}

/// Forks a daemon: the child calls `setsid` and puts stdin on `/dev/null`; stdout and
/// stderr are left for the caller to redirect once it has reported readiness.
///
/// Not behind [`KmodSys`]: tests run the daemon's loop in a thread instead of forking.
/// The caller must be single-threaded (as the CLI is at that point): only the calling
/// thread survives in the child.
pub fn daemonize() -> io::Result<Forked> {
    use std::os::fd::FromRawFd;
    let [rd, wr] = pipe_cloexec()?;
    // SAFETY: fork has no memory-safety preconditions; the caller is single-threaded,
    // so the child may go on running ordinary Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        LinuxKmodSys.close(rd);
        LinuxKmodSys.close(wr);
        return Err(e);
    }
    if pid > 0 {
        LinuxKmodSys.close(wr);
        // SAFETY: `rd` is a fresh descriptor owned by nothing else.
        let ready = unsafe { std::fs::File::from_raw_fd(rd) };
        return Ok(Forked::Parent { pid, ready });
    }
    LinuxKmodSys.close(rd);
    // SAFETY: setsid has no preconditions; in a fresh child it cannot fail (we are not
    // a process-group leader).
    unsafe { libc::setsid() };
    redirect(0, Path::new("/dev/null"), false)?;
    // SAFETY: `wr` is a fresh descriptor owned by nothing else.
    let ready = unsafe { std::fs::File::from_raw_fd(wr) };
    Ok(Forked::Daemon { ready })
}

/// Points `target_fd` (0, 1 or 2) at `path`, opened for writing (appending) if `write`.
pub fn redirect(target_fd: i32, path: &Path, write: bool) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let flags = if write {
        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND
    } else {
        libc::O_RDONLY
    };
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600) }.into())? as i32;
    // SAFETY: dup2 onto a standard descriptor; both are valid (fd just opened).
    let r = cvt(unsafe { libc::dup2(fd, target_fd) }.into());
    LinuxKmodSys.close(fd);
    r.map(|_| ())
}
