//! The real system calls for running a recorded command, shared by the perf and kmod
//! sources' real sys layers ([`super::perf`]'s `LinuxSys`, [`super::kmod::LinuxKmodSys`]):
//! finding the program, forking a child held before `execve`, releasing it, waiting for,
//! killing and watching it.
//!
//! Each source keeps its own trait in front of these, so tests inject fakes there; only
//! the real implementations call this module.
//!
//! Reference: execve(2), pipe2(2), wait4(2), kill(2), pidfd_open(2).

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A forked child held before `execve` until its source's `release_child`.
#[derive(Debug)]
pub struct HeldChild {
    /// Its pid.
    pub pid: i32,
    /// Write end of the go pipe: one byte lets the child exec, EOF makes it `_exit(127)`.
    pub go_fd: i32,
    /// Read end of the error pipe (close-on-exec in the child): EOF means the exec
    /// succeeded; four bytes are the exec's `errno`.
    pub err_fd: i32,
}

/// A negative return is the calling thread's `errno`.
pub(crate) fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// [`cvt`], calling `f` again on `EINTR`.
pub(crate) fn cvt_retry(mut f: impl FnMut() -> libc::c_long) -> io::Result<libc::c_long> {
    loop {
        match cvt(f()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// `pipe2(O_CLOEXEC)`: `[read end, write end]`.
pub(crate) fn pipe_cloexec() -> io::Result<[i32; 2]> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two c_ints for pipe2 to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }.into())?;
    Ok(fds)
}

fn close(fd: i32) {
    // SAFETY: the fd is owned by the caller, which never uses it again.
    unsafe { libc::close(fd) };
}

/// Finds a program like `execvp` would: a name with a `/` as is, else along `$PATH`.
pub(crate) fn find_program(name: &str) -> io::Result<CString> {
    use std::os::unix::fs::PermissionsExt;
    let to_c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    if name.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if name.contains('/') {
        std::fs::metadata(name)?;
        return to_c(Path::new(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut not_executable = false;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return to_c(&candidate);
            }
            not_executable = true;
        }
    }
    Err(io::Error::from_raw_os_error(if not_executable {
        libc::EACCES
    } else {
        libc::ENOENT
    }))
}

/// The child side of [`spawn_held`]: only async-signal-safe calls.
///
/// Like `std::process::Command`, it gives the program an empty signal mask and the
/// default `SIGPIPE` (Rust programs ignore `SIGPIPE`; an ignored signal survives exec).
/// `keep_fd` (if `>= 0`) loses its close-on-exec flag so the program inherits it.
///
/// # Safety
///
/// Must be called in a freshly forked child; the pointers are NUL-terminated arrays of
/// NUL-terminated strings that the parent built before `fork`.
unsafe fn child_after_fork(
    [go_rd, go_wr]: [i32; 2],
    [err_rd, err_wr]: [i32; 2],
    keep_fd: i32,
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    empty_mask: &libc::sigset_t,
) -> ! {
    // Our copies of the parent's ends: without this, closing the go pipe in the parent
    // would never reach us as EOF.
    // SAFETY: close(2) is async-signal-safe; these fds are ours and unused here.
    unsafe {
        libc::close(go_wr);
        libc::close(err_rd);
    }
    // SAFETY: sigprocmask, signal and fcntl are async-signal-safe; `empty_mask` was
    // initialised by sigemptyset before fork; `keep_fd` is the caller's open fd.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, empty_mask, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if keep_fd >= 0 {
            // Only this process's descriptor table: the parent keeps FD_CLOEXEC.
            libc::fcntl(keep_fd, libc::F_SETFD, 0);
        }
    }
    let mut byte = 0u8;
    loop {
        // SAFETY: reading one byte into a local; read(2) is async-signal-safe.
        let n = unsafe { libc::read(go_rd, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
        // SAFETY: __errno_location is async-signal-safe and returns this thread's errno.
        if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
            continue;
        }
        // EOF: the parent gave up on us before start.
        // SAFETY: _exit is async-signal-safe and never returns.
        unsafe { libc::_exit(127) };
    }
    // SAFETY: the caller guarantees the pointers are valid NUL-terminated arrays.
    unsafe { libc::execve(path, argv, envp) };
    // SAFETY: as above; errno is this thread's.
    let bytes = unsafe { *libc::__errno_location() }.to_ne_bytes();
    // SAFETY: writing four bytes from a local array to the error pipe, then _exit.
    unsafe {
        libc::write(err_wr, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

/// Forks a child that waits on a pipe and then `execve(path, argv, envp)`s, with
/// `keep_fd` (if any) inherited across the exec (its close-on-exec flag cleared in the
/// child only).
pub(crate) fn spawn_held(
    path: &CStr,
    argv: &[CString],
    envp: &[CString],
    keep_fd: Option<i32>,
) -> io::Result<HeldChild> {
    // Everything the child touches is built before fork: no allocation after it.
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    let [go_rd, go_wr] = pipe_cloexec()?;
    let [err_rd, err_wr] = match pipe_cloexec() {
        Ok(p) => p,
        Err(e) => {
            close(go_rd);
            close(go_wr);
            return Err(e);
        }
    };
    // SAFETY: an all-zero sigset_t is valid storage for sigemptyset to initialise.
    let mut empty_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `empty_mask` is a valid sigset_t to write.
    unsafe { libc::sigemptyset(&mut empty_mask) };
    // SAFETY: fork has no memory-safety preconditions; the child only runs
    // `child_after_fork`, which uses async-signal-safe calls on data built above.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: we are the freshly forked child and the pointer arrays are
        // NUL-terminated and alive (the parent's copies are ours after fork).
        unsafe {
            child_after_fork(
                [go_rd, go_wr],
                [err_rd, err_wr],
                keep_fd.unwrap_or(-1),
                path.as_ptr(),
                argv_ptrs.as_ptr(),
                envp_ptrs.as_ptr(),
                &empty_mask,
            )
        }
    }
    let fork_err = (pid < 0).then(io::Error::last_os_error);
    close(go_rd);
    close(err_wr);
    if let Some(e) = fork_err {
        close(go_wr);
        close(err_rd);
        return Err(e);
    }
    Ok(HeldChild {
        pid,
        go_fd: go_wr,
        err_fd: err_rd,
    })
}

/// Writes the one byte on a held child's go pipe that lets it exec. Closes nothing.
pub(crate) fn send_go(go_fd: i32) -> io::Result<()> {
    let go = [1u8];
    cvt_retry(|| {
        // SAFETY: writing one byte from a live local array.
        unsafe { libc::write(go_fd, go.as_ptr().cast(), 1) as libc::c_long }
    })?;
    Ok(())
}

/// Waits on a released child's error pipe until it has exec'd (EOF: `Ok`) or failed to
/// (its four-byte `errno`). Closes nothing.
pub(crate) fn exec_result(err_fd: i32) -> io::Result<()> {
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        let rest = &mut errno[got..];
        let n = cvt_retry(|| {
            // SAFETY: `rest` is valid for writes of `rest.len()` bytes.
            unsafe { libc::read(err_fd, rest.as_mut_ptr().cast(), rest.len()) as libc::c_long }
        })?;
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    match got {
        0 => Ok(()),
        4 => Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno))),
        _ => Err(io::Error::other("short read from the exec error pipe")),
    }
}

/// `wait4(pid, WNOHANG or 0)`; `None` while it runs (only with `nohang`), else the exit
/// code (`-signal` if a signal killed it) and the user + system CPU time (ns) of the
/// child and its reaped descendants.
pub(crate) fn wait_child(pid: i32, nohang: bool) -> io::Result<Option<(i32, u64)>> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if nohang { libc::WNOHANG } else { 0 };
    let r = cvt_retry(|| {
        // SAFETY: `status` and `ru` are valid locals for wait4 to fill.
        unsafe { libc::wait4(pid, &mut status, flags, &mut ru) }.into()
    })?;
    if r == 0 {
        return Ok(None);
    }
    let status = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        -libc::WTERMSIG(status)
    } else {
        0
    };
    let tv_ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    Ok(Some((status, tv_ns(ru.ru_utime) + tv_ns(ru.ru_stime))))
}

/// `kill(pid, signal)`.
pub(crate) fn kill(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    cvt(unsafe { libc::kill(pid, signal) }.into())?;
    Ok(())
}

/// `pidfd_open(pid, 0)`: readable when the child exits (Linux 5.3+). The pidfd is
/// close-on-exec by default (PIDFD_NONBLOCK not asked).
pub(crate) fn pidfd_open(pid: i32) -> io::Result<i32> {
    // SAFETY: pidfd_open takes two integers.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    Ok(fd as i32)
}
