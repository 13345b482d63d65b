//! The `hrperf start` daemon's loop: holds a session, records its rings into a capture
//! file and answers the control socket ([`super::control`] has the design and protocol).
//!
//! The CLI forks ([`super::sys::daemonize`]), creates the [`Recorder`] and the
//! [`Listener`] in the child, reports readiness, and calls [`serve`]; tests call [`serve`]
//! in a thread with the fake device.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::control::{Conn, Listener, Request};
use super::record::Recorder;
use super::{format_name, mode_name, KmodError, KmodSys};
use crate::record::RecordSummary;

/// How often the daemon drains when nothing wakes it (ms).
const TICK_MS: i32 = 100;

/// One line describing the session (the `status` reply).
fn status_line<W: Write>(rec: &Recorder<W>, output: &Path, paused: bool) -> String {
    let s = rec.session();
    let live = rec.live().ok();
    let events: Vec<&str> = s.events().iter().map(|e| e.name.as_str()).collect();
    let cpus: Vec<String> = s.cpus().iter().map(u32::to_string).collect();
    format!(
        "pid={} state={} mode={} format={} events={} cpus={} records={} drops={} bytes={} file={}",
        std::process::id(),
        if paused { "paused" } else { "running" },
        mode_name(s.mode()),
        format_name(s.format()),
        events.join(","),
        cpus.join(","),
        live.map_or(0, |l| l.records),
        live.map_or(0, |l| l.drops),
        live.map_or(0, |l| l.bytes),
        output.display()
    )
}

/// Serves `listener` and records `rec` until a `stop` request (or `stop` is set, e.g. by
/// SIGTERM); then finishes the capture and returns its summary.
///
/// `paused` is the session's state as the daemon last set it; programs attached to the
/// same file may start and pause it too, which the `status` line cannot see.
pub fn serve<W: Write>(
    sys: &dyn KmodSys,
    mut rec: Recorder<W>,
    listener: &Listener,
    output: &Path,
    stop: &AtomicBool,
) -> Result<RecordSummary, KmodError> {
    let mut paused = !rec.session().is_running();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: rec.session().fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        sys.poll(&mut fds, TICK_MS)
            .map_err(|source| KmodError::Syscall {
                call: "poll(/dev/hrperf, control socket)".into(),
                source,
            })?;
        rec.drain()?;
        if stop.load(Ordering::Relaxed) {
            listener.unlink();
            return rec.finish(0);
        }
        if fds[1].revents == 0 {
            continue;
        }
        while let Some(mut conn) = listener.accept() {
            if handle(&mut rec, &mut conn, output, &mut paused)? {
                listener.unlink(); // from now on, clients hear "no session"
                let summary = rec.finish(0);
                let _ = match &summary {
                    Ok(s) => conn.ok(&format!(
                        "wrote {}: {} records from {} CPUs, {} drops",
                        output.display(),
                        s.records,
                        s.per_cpu.len(),
                        s.drops
                    )),
                    Err(e) => conn.err(e.errno().unwrap_or(libc::EIO), &e.to_string()),
                };
                return summary;
            }
        }
    }
}

/// Answers one request; `Ok(true)` for `stop` (answered by the caller once finished).
fn handle<W: Write>(
    rec: &mut Recorder<W>,
    conn: &mut Conn,
    output: &Path,
    paused: &mut bool,
) -> Result<bool, KmodError> {
    if !conn.authorized() {
        let _ = conn.err(
            libc::EACCES,
            "not allowed: the session belongs to another user",
        );
        return Ok(false);
    }
    let req = match conn.read_request() {
        Ok(Ok(r)) => r,
        Ok(Err(word)) => {
            let _ = conn.err(libc::EINVAL, &format!("unknown request '{word}'"));
            return Ok(false);
        }
        Err(_) => return Ok(false), // the client went away or timed out
    };
    let done = |r: Result<(), KmodError>, conn: &mut Conn, what: &str| {
        let _ = match r {
            Ok(()) => conn.ok(what),
            Err(e) => conn.err(e.errno().unwrap_or(libc::EIO), &e.to_string()),
        };
    };
    match req {
        Request::Start => {
            let r = rec.start();
            if r.is_ok() {
                *paused = false;
            }
            done(r, conn, "started");
        }
        Request::Pause => {
            let r = rec.pause();
            if r.is_ok() {
                *paused = true;
            }
            done(r, conn, "paused");
        }
        Request::Poll => done(rec.session().poll(), conn, "polled"),
        Request::Log => done(rec.session().log(), conn, "logged"),
        Request::PollLog => done(rec.session().poll_log(), conn, "polled and logged"),
        Request::Status => {
            let _ = conn.ok(&status_line(rec, output, *paused));
        }
        Request::Fd => {
            let _ = conn.ok_with_fd(rec.session().fd());
        }
        Request::Stop => return Ok(true),
    }
    Ok(false)
}
