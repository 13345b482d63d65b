//! Sessions that outlive one command: the control socket of an `hrperf start` daemon, and
//! how a program attaches to a session (the C API's `hrperf_open()`).
//!
//! A session lives as long as its `/dev/hrperf` file is open. `hrperf start` therefore
//! forks a small daemon ([`super::daemon`]) that creates the session, holds the file,
//! records the rings into a capture file, and listens on a UNIX socket:
//!
//! ```text
//! hrperf start -e cpu-clock,page-faults --instructed -o run.data
//!    └─ daemon: Session + Recorder + socket ($HRPERF_SOCKET, default below)
//! hrperf pause | start | poll | log | poll-log | status | stop   → one request each
//! program: hrperf_open() → "fd" request → the session's descriptor (SCM_RIGHTS)
//!          hrperf_poll_log() → ioctl on that descriptor: no daemon round trip
//! ```
//!
//! Passing the descriptor, not proxying the calls, is what makes region marking cheap and
//! exact: `hrperf_poll_log()` is one ioctl on the very file the daemon reads, at the
//! instant the program calls it. The daemon still sees every record (same rings) and is
//! woken by LOG like any reader. `hrperf stop` drains, finishes the file and destroys
//! the session, so a program still holding the descriptor gets `-EINVAL` afterwards.
//!
//! The protocol is one text line per connection: a request (`start`, `pause`, `poll`,
//! `log`, `poll-log`, `status`, `fd`, `stop`), then one reply line, `ok <text>` or
//! `err <errno> <text>`; the `fd` reply carries the descriptor as `SCM_RIGHTS`.
//!
//! Access: the socket lives in a directory only its owner can enter (`0700`, checked
//! before use: owned by us, no group/other bits), and the daemon also checks each peer's
//! `SO_PEERCRED` uid (its own or root).
//!
//! Socket path: `$HRPERF_SOCKET`, else `$XDG_RUNTIME_DIR/hrperf/ctl.sock`, else
//! `/tmp/hrperf-<uid>/ctl.sock`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ioctl_error, Ioctl, KmodError, KmodSys, ENV_FD};

/// Environment variable naming the control socket.
pub const ENV_SOCKET: &str = "HRPERF_SOCKET";

/// How long a request may take on either side.
const IO_TIMEOUT: Duration = Duration::from_millis(2000);
/// Longest request or reply line.
const MAX_LINE: usize = 4096;

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The control socket: `explicit` if given, else `$HRPERF_SOCKET`, else the default in
/// a per-user directory.
pub fn socket_path(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    if let Some(p) = std::env::var_os(ENV_SOCKET).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    default_socket_dir().join("ctl.sock")
}

/// The per-user directory of the default socket.
pub fn default_socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(d) => PathBuf::from(d).join("hrperf"),
        None => PathBuf::from(format!("/tmp/hrperf-{}", euid())),
    }
}

/// Creates the socket's directory if missing (mode 0700) and checks that nobody but us
/// can reach into it: owned by us, no group or other permissions.
pub fn prepare_dir(socket: &Path) -> Result<(), KmodError> {
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| KmodError::Control(format!("cannot create {}: {e}", dir.display())))?;
    }
    let meta = std::fs::metadata(dir)
        .map_err(|e| KmodError::Control(format!("cannot check {}: {e}", dir.display())))?;
    if meta.uid() != euid() || meta.permissions().mode() & 0o077 != 0 {
        return Err(KmodError::Control(format!(
            "{} must be a directory owned by uid {} with mode 0700 (it holds the session's control socket); fix it, or set {ENV_SOCKET} to a socket path in such a directory",
            dir.display(),
            euid()
        )));
    }
    Ok(())
}

/// A request to an `hrperf start` daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Start or resume the session (`HRPERF_IOC_START`).
    Start,
    /// Pause it (`HRPERF_IOC_STOP`).
    Pause,
    /// Instructed mode: read the counters now.
    Poll,
    /// Instructed mode: publish what was read.
    Log,
    /// Instructed mode: both.
    PollLog,
    /// Describe the session.
    Status,
    /// Send the session's descriptor (`SCM_RIGHTS`).
    Fd,
    /// Finish the capture, destroy the session, exit.
    Stop,
}

impl Request {
    /// The request's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Request::Start => "start",
            Request::Pause => "pause",
            Request::Poll => "poll",
            Request::Log => "log",
            Request::PollLog => "poll-log",
            Request::Status => "status",
            Request::Fd => "fd",
            Request::Stop => "stop",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Request> {
        [
            Request::Start,
            Request::Pause,
            Request::Poll,
            Request::Log,
            Request::PollLog,
            Request::Status,
            Request::Fd,
            Request::Stop,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// Why no daemon answered at `socket`.
fn unreachable(socket: &Path, e: &io::Error) -> KmodError {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ECONNREFUSED) => KmodError::Control(format!(
            "no hrperf session is running (no daemon at {}): start one with `hrperf start`",
            socket.display()
        )),
        _ => KmodError::Control(format!(
            "cannot reach the hrperf session at {}: {e}",
            socket.display()
        )),
    }
}

/// Whether a daemon answers at `socket`.
pub fn is_running(socket: &Path) -> bool {
    UnixStream::connect(socket).is_ok()
}

fn connect(socket: &Path) -> Result<UnixStream, KmodError> {
    let s = UnixStream::connect(socket).map_err(|e| unreachable(socket, &e))?;
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    Ok(s)
}

/// Parses a reply line: `Ok(text)` for `ok`, the daemon's error for `err`.
fn parse_reply(socket: &Path, line: &str) -> Result<String, KmodError> {
    let line = line.trim_end();
    if let Some(text) = line.strip_prefix("ok") {
        return Ok(text.trim_start().to_string());
    }
    if let Some(rest) = line.strip_prefix("err ") {
        let (errno, text) = rest.split_once(' ').unwrap_or((rest, ""));
        let errno: i32 = errno.parse().unwrap_or(libc::EIO);
        return Err(KmodError::Daemon { errno, message: text.to_string() });
    }
    Err(KmodError::Control(format!(
        "the daemon at {} answered '{line}'",
        socket.display()
    )))
}

/// Sends `req` to the daemon at `socket`; the reply's text on success.
pub fn call(socket: &Path, req: Request) -> Result<String, KmodError> {
    let mut s = connect(socket)?;
    let talk = |s: &mut UnixStream| -> io::Result<String> {
        writeln!(s, "{}", req.as_str())?;
        let mut line = String::new();
        BufReader::new(s.take(MAX_LINE as u64)).read_line(&mut line)?;
        Ok(line)
    };
    let line = talk(&mut s).map_err(|e| {
        KmodError::Control(format!(
            "talking to the hrperf session at {}: {e}",
            socket.display()
        ))
    })?;
    if line.is_empty() {
        return Err(KmodError::Control(format!(
            "the hrperf session at {} closed without answering",
            socket.display()
        )));
    }
    parse_reply(socket, &line)
}

/// Asks the daemon at `socket` for the session's descriptor.
pub fn fetch_fd(socket: &Path) -> Result<OwnedFd, KmodError> {
    let mut s = connect(socket)?;
    let io_err = |e: io::Error| {
        KmodError::Control(format!(
            "talking to the hrperf session at {}: {e}",
            socket.display()
        ))
    };
    writeln!(s, "{}", Request::Fd.as_str()).map_err(io_err)?;
    let mut buf = [0u8; MAX_LINE];
    let (n, fd) = recv_with_fd(s.as_raw_fd(), &mut buf).map_err(io_err)?;
    let line = String::from_utf8_lossy(&buf[..n]).into_owned();
    parse_reply(socket, &line)?;
    fd.ok_or_else(|| {
        KmodError::Control(format!(
            "the hrperf session at {} sent no descriptor",
            socket.display()
        ))
    })
}

/// Sends `bytes` with `fd` attached as `SCM_RIGHTS`.
pub fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // Room for one descriptor's control message, u64-aligned as cmsghdr needs.
    let mut cbuf = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    if space > size_of_val(&cbuf) {
        return Err(io::Error::other("control buffer too small"));
    }
    // SAFETY: an all-zero msghdr is a valid "empty" message header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `cbuf`, which has room for one cmsghdr plus one fd
    // (checked above), so CMSG_FIRSTHDR is non-null and CMSG_DATA is inside `cbuf`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        libc::CMSG_DATA(c).cast::<RawFd>().write_unaligned(fd);
    }
    loop {
        // SAFETY: `msg` and everything it points to are live for the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives up to `buf.len()` bytes and at most one `SCM_RIGHTS` descriptor (received
/// close-on-exec); more descriptors than one are closed.
pub fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: an all-zero msghdr is a valid "empty" message header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: `msg` points at live, writable buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut got: Option<OwnedFd> = None;
    // SAFETY: the kernel filled `msg_control` with `msg_controllen` bytes of cmsghdrs;
    // CMSG_FIRSTHDR/NXTHDR stay inside them, and each SCM_RIGHTS payload holds
    // `(cmsg_len - CMSG_LEN(0)) / 4` descriptors that are now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    if got.is_none() {
                        got = Some(fd);
                    } // else: dropped, i.e. closed
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, got))
}

/// The uid of the process at the other end of `stream` (`SO_PEERCRED`).
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    // SAFETY: an all-zero ucred is valid storage for getsockopt to fill.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live and describe `cred`'s size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// The daemon's listening socket; removes its path when dropped.
#[derive(Debug)]
pub struct Listener {
    inner: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Binds `path` (its directory checked with [`prepare_dir`]); a stale socket left by
    /// a dead daemon is replaced, a live one is an error.
    pub fn bind(path: &Path) -> Result<Listener, KmodError> {
        prepare_dir(path)?;
        if path.exists() {
            if is_running(path) {
                return Err(KmodError::Control(format!(
                    "an hrperf session is already running at {} (`hrperf stop` ends it)",
                    path.display()
                )));
            }
            let _ = std::fs::remove_file(path);
        }
        let inner = UnixListener::bind(path)
            .map_err(|e| KmodError::Control(format!("cannot listen on {}: {e}", path.display())))?;
        inner
            .set_nonblocking(true)
            .map_err(|e| KmodError::Control(format!("cannot listen on {}: {e}", path.display())))?;
        Ok(Listener {
            inner,
            path: path.to_owned(),
        })
    }

    /// The listening descriptor (for `poll`).
    pub fn fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket's path now (new clients find no session), keeping the
    /// connections already accepted.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Accepts one pending connection, if any.
    pub fn accept(&self) -> Option<Conn> {
        let (stream, _) = self.inner.accept().ok()?;
        stream.set_nonblocking(false).ok()?;
        let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
        let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
        Some(Conn { stream })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One client connection of the daemon.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
}

impl Conn {
    /// Whether the peer may control the session: our own uid, or root.
    pub fn authorized(&self) -> bool {
        peer_uid(&self.stream).is_ok_and(|u| u == euid() || u == 0)
    }

    /// Reads the request line: `Ok(Ok(request))`, or `Ok(Err(text))` for an unknown
    /// request; `Err` if the client went away or timed out.
    pub fn read_request(&mut self) -> io::Result<Result<Request, String>> {
        let mut line = String::new();
        BufReader::new((&self.stream).take(MAX_LINE as u64)).read_line(&mut line)?;
        let word = line.trim();
        Ok(Request::parse(word).ok_or_else(|| word.to_string()))
    }

    /// Replies `ok <text>`.
    pub fn ok(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.stream, "ok {}", one_line(text))
    }

    /// Replies `err <errno> <text>`.
    pub fn err(&mut self, errno: i32, text: &str) -> io::Result<()> {
        writeln!(self.stream, "err {errno} {}", one_line(text))
    }

    /// Replies `ok` with `fd` attached.
    pub fn ok_with_fd(&mut self, fd: RawFd) -> io::Result<()> {
        send_with_fd(self.stream.as_raw_fd(), b"ok\n", fd)
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// Where a program finds its session, and the descriptor it gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Attached {
    /// The descriptor `hrperf record` passed down (`HRPERF_FD`).
    Inherited(i32),
    /// A descriptor received from the `hrperf start` daemon.
    FromDaemon(i32),
}

impl Attached {
    /// The descriptor.
    pub fn fd(&self) -> i32 {
        match *self {
            Attached::Inherited(fd) | Attached::FromDaemon(fd) => fd,
        }
    }
}

/// Finds the session a program should use: the descriptor named by `env_fd` (the value
/// of `HRPERF_FD`, if set), else the descriptor of the daemon at `socket`. Checks with
/// `HRPERF_IOC_INFO` that it is an hrperf device.
pub fn attach(
    sys: &dyn KmodSys,
    env_fd: Option<&str>,
    socket: &Path,
) -> Result<Attached, KmodError> {
    let check = |fd: i32| -> Result<(), KmodError> {
        let mut info = hrperf_abi::ioctl::ModuleInfo {
            size: size_of::<hrperf_abi::ioctl::ModuleInfo>() as u32,
            ..Default::default()
        };
        sys.ioctl(fd, Ioctl::Info(&mut info))
            .map_err(|e| ioctl_error("HRPERF_IOC_INFO", e))
    };
    if let Some(v) = env_fd.map(str::trim).filter(|v| !v.is_empty()) {
        let fd: i32 = v
            .parse()
            .ok()
            .filter(|&fd| fd >= 0)
            .ok_or_else(|| KmodError::Syscall {
                call: format!("{ENV_FD}={v}"),
                source: io::Error::from_raw_os_error(libc::EBADF),
            })?;
        check(fd).map_err(|e| KmodError::Syscall {
            call: format!("{ENV_FD}={fd} is not an open /dev/hrperf ({e})"),
            source: io::Error::from_raw_os_error(libc::EBADF),
        })?;
        return Ok(Attached::Inherited(fd));
    }
    let owned = fetch_fd(socket).map_err(|e| match e {
        KmodError::Control(msg) => KmodError::Syscall {
            call: msg,
            source: io::Error::from_raw_os_error(libc::ENOENT),
        },
        other => other,
    })?;
    let fd = {
        use std::os::fd::IntoRawFd;
        owned.into_raw_fd()
    };
    if let Err(e) = check(fd) {
        sys.close(fd);
        return Err(e);
    }
    Ok(Attached::FromDaemon(fd))
}
