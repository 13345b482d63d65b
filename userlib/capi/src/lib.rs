//! `libhrperf.so` / `libhrperf.a`: mark regions of a program on an hrperf-core.ko session,
//! as hiresperf users do. The C declarations, with the contract of each call, are
//! `include/hrperf_api.h`; the Python helper `userlib/python/hrperf.py` wraps them.
//!
//! ```c
//! #include <hrperf_api.h>
//! hrperf_poll_log();          /* counts up to here ... */
//! work();
//! hrperf_poll_log();          /* ... and the record for work() */
//! ```
//!
//! The library does not create sessions: it attaches to the one the program runs under
//! (`hrperf_open()`, called by the first call that needs it): the descriptor
//! `hrperf record --source kmod -- ./app` passes down in `HRPERF_FD`, else the one the
//! `hrperf start` daemon hands out over its control socket (`$HRPERF_SOCKET`, or the
//! default path; see `hrperf::source::kmod::control`). Every call is then one ioctl on
//! that descriptor, so a region boundary is the instant of the call and costs one system
//! call, with no round trip to the recorder. Calls are thread-safe; `hrperf_close()` must
//! not race with the others.

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use libhrperf::source::kmod::control::{self, Attached};
use libhrperf::source::kmod::record::instruct;
use libhrperf::source::kmod::{Ioctl, KmodError, KmodSys, LinuxKmodSys, ENV_FD};

/// The session descriptor in use, and how it was found.
#[derive(Debug)]
struct Api {
    /// The descriptor, or -1 before `open` (read on every call, without the lock).
    fd: AtomicI32,
    /// Serialises open/attach/close; true if the descriptor is ours to close.
    owned: Mutex<bool>,
}

impl Api {
    const fn new() -> Api {
        Api {
            fd: AtomicI32::new(-1),
            owned: Mutex::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        // Nothing panics while holding it; a poisoned lock still guards valid data.
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches (if not yet) and returns the descriptor, or `-errno`.
    fn open(&self, sys: &dyn KmodSys, env_fd: Option<&str>, socket: &Path) -> c_int {
        let mut owned = self.lock();
        let fd = self.fd.load(Ordering::Acquire);
        if fd >= 0 {
            return fd;
        }
        match control::attach(sys, env_fd, socket) {
            Ok(a) => {
                // A received descriptor is ours to close; an inherited one stays open
                // (HRPERF_FD keeps naming it, so a later call can attach again).
                *owned = matches!(a, Attached::FromDaemon(_));
                self.fd.store(a.fd(), Ordering::Release);
                a.fd()
            }
            Err(e) => neg_errno(&e),
        }
    }

    /// Uses `fd` (checked to be an hrperf device), not closed by `close`.
    fn attach_fd(&self, sys: &dyn KmodSys, fd: c_int) -> c_int {
        let mut owned = self.lock();
        match control::attach(sys, Some(&fd.to_string()), Path::new("")) {
            Ok(_) => {
                let old = self.fd.swap(fd, Ordering::AcqRel);
                if old >= 0 && *owned && old != fd {
                    sys.close(old);
                }
                *owned = false;
                0
            }
            Err(e) => neg_errno(&e),
        }
    }

    fn close(&self, sys: &dyn KmodSys) {
        let mut owned = self.lock();
        let fd = self.fd.swap(-1, Ordering::AcqRel);
        if fd >= 0 && *owned {
            sys.close(fd);
        }
        *owned = false;
    }

    /// One ioctl on the session, attaching first if needed.
    fn call(
        &self,
        sys: &dyn KmodSys,
        env_fd: Option<&str>,
        socket: &Path,
        req: Ioctl<'static>,
    ) -> c_int {
        let mut fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            fd = self.open(sys, env_fd, socket);
            if fd < 0 {
                return fd;
            }
        }
        match instruct(sys, fd, req) {
            Ok(()) => 0,
            Err(e) => neg_errno(&e),
        }
    }
}

fn neg_errno(e: &KmodError) -> c_int {
    -e.errno().unwrap_or(libc::EIO)
}

static API: Api = Api::new();

fn env_fd() -> Option<String> {
    std::env::var(ENV_FD).ok()
}

fn real_call(req: Ioctl<'static>) -> c_int {
    let env = env_fd();
    API.call(
        &LinuxKmodSys,
        env.as_deref(),
        &control::socket_path(None),
        req,
    )
}

/// Attaches to the session (see `hrperf_api.h`); 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_open() -> c_int {
    let env = env_fd();
    let fd = API.open(&LinuxKmodSys, env.as_deref(), &control::socket_path(None));
    if fd < 0 {
        fd
    } else {
        0
    }
}

/// Uses the caller's `/dev/hrperf` descriptor; 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_attach_fd(fd: c_int) -> c_int {
    API.attach_fd(&LinuxKmodSys, fd)
}

/// The session descriptor in use (attaching first), or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_fd() -> c_int {
    let env = env_fd();
    API.open(&LinuxKmodSys, env.as_deref(), &control::socket_path(None))
}

/// Detaches; the session goes on (it belongs to `hrperf record` or `hrperf start`).
#[no_mangle]
pub extern "C" fn hrperf_close() {
    API.close(&LinuxKmodSys);
}

/// Starts or resumes the session (`HRPERF_IOC_START`); 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_start() -> c_int {
    real_call(Ioctl::Start)
}

/// Pauses the session (`HRPERF_IOC_STOP`); 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_pause() -> c_int {
    real_call(Ioctl::Stop)
}

/// Instructed mode: every CPU reads its counters now (one record each); 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_poll() -> c_int {
    real_call(Ioctl::Poll)
}

/// Instructed mode: wake the recorder to collect what was polled; 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_log() -> c_int {
    real_call(Ioctl::Log)
}

/// Instructed mode: poll and log in one call; 0 or `-errno`.
#[no_mangle]
pub extern "C" fn hrperf_poll_log() -> c_int {
    real_call(Ioctl::PollLog)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use libhrperf::source::kmod::fake::FakeKmod;
    use libhrperf::source::kmod::{KmodConfig, Mode, Session};
    use libhrperf::source::perf::parse_events;

    use super::*;

    fn session(sys: &Arc<FakeKmod>, mode: Mode) -> Session {
        let cfg = KmodConfig {
            events: parse_events("cpu-clock").unwrap(),
            mode,
            ..KmodConfig::default()
        };
        Session::create(sys.clone(), &cfg).unwrap()
    }

    #[test]
    fn calls_attach_to_the_inherited_descriptor() {
        let sys = Arc::new(FakeKmod::new(2));
        let s = session(&sys, Mode::Instructed);
        let api = Api::new();
        let env = s.fd().to_string();
        let nowhere = Path::new("/nonexistent/hrperf.sock");
        let call = |req| api.call(sys.as_ref(), Some(&env), nowhere, req);
        assert_eq!(call(Ioctl::Poll), -libc::EINVAL, "not started yet");
        assert_eq!(call(Ioctl::Start), 0);
        assert_eq!(call(Ioctl::Start), -libc::EINVAL, "already running");
        assert_eq!(call(Ioctl::PollLog), 0);
        assert_eq!(call(Ioctl::Poll), 0);
        assert_eq!(call(Ioctl::Log), 0);
        assert_eq!(call(Ioctl::Stop), 0);
        assert_eq!(call(Ioctl::PollLog), -libc::EINVAL, "paused");
        let st = s.stats().unwrap();
        assert!(st.iter().all(|c| c.records == 2));
        assert_eq!(api.fd.load(Ordering::Relaxed), s.fd());
    }

    #[test]
    fn without_a_session_calls_return_enoent_and_retry_later() {
        let sys = Arc::new(FakeKmod::new(1));
        let api = Api::new();
        let nowhere = Path::new("/nonexistent/hrperf.sock");
        assert_eq!(
            api.call(sys.as_ref(), None, nowhere, Ioctl::PollLog),
            -libc::ENOENT
        );
        assert_eq!(
            api.open(sys.as_ref(), Some("not-a-number"), nowhere),
            -libc::EBADF
        );
        assert_eq!(api.fd.load(Ordering::Relaxed), -1, "nothing was attached");
        let s = session(&sys, Mode::Instructed);
        assert_eq!(
            api.open(sys.as_ref(), Some(&s.fd().to_string()), nowhere),
            s.fd()
        );
    }

    #[test]
    fn attach_fd_checks_and_close_detaches() {
        let sys = Arc::new(FakeKmod::new(1));
        let s = session(&sys, Mode::Instructed);
        let api = Api::new();
        assert_eq!(api.attach_fd(sys.as_ref(), 12345), -libc::EBADF);
        assert_eq!(api.attach_fd(sys.as_ref(), s.fd()), 0);
        api.close(sys.as_ref());
        assert_eq!(api.fd.load(Ordering::Relaxed), -1);
        // not ours: the session's file is still open
        assert_eq!(sys.sessions(), 1);
    }
}
