"""hrperf.py - mark regions of a Python program on an hrperf-core.ko session.

A thin ctypes wrapper over libhrperf.so (the C API, include/hrperf_api.h), standard
library only:

    import hrperf

    with hrperf.region():          # poll_log() on entry and on exit:
        work()                     # the exit record holds work()'s counts, per CPU

    hrperf.poll_log()              # or mark points by hand
    hrperf.pause(); ...; hrperf.start()

Run the program under a recorder that owns the session:

    hrperf record --source kmod --instructed -e cpu-clock,page-faults -- python3 app.py
    # or: hrperf start --instructed -o app.data; python3 app.py; hrperf stop

libhrperf.so is found through $HRPERF_LIB (a path), else the dynamic loader's search
(LD_LIBRARY_PATH, ld.so.cache), else next to this file. Every call raises HrperfError
(an OSError with the errno the C call returned) on failure.
"""

import contextlib
import ctypes
import errno as _errno
import os

__all__ = [
    "HrperfError", "open", "close", "fd", "start", "pause", "poll", "log", "poll_log",
    "region", "paused", "library",
]

_lib = None


class HrperfError(OSError):
    """A libhrperf call failed; .errno is the error (ENOENT: no session, EINVAL: not
    allowed in the session's mode or state)."""


_HINTS = {
    _errno.ENOENT: "no hrperf session: run under `hrperf record --source kmod` or start one with `hrperf start`",
    _errno.EINVAL: "not allowed now: poll/log need a running instructed-mode session",
    _errno.EBADF: "HRPERF_FD is not an open /dev/hrperf",
}


def library():
    """The loaded libhrperf.so (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("HRPERF_LIB"), "libhrperf.so", os.path.join(here, "libhrperf.so")]
    errors = []
    for c in candidates:
        if not c:
            continue
        try:
            lib = ctypes.CDLL(c, use_errno=False)
        except OSError as e:
            errors.append(str(e))
            continue
        for name in ("hrperf_open", "hrperf_fd", "hrperf_start", "hrperf_pause", "hrperf_poll",
                     "hrperf_log", "hrperf_poll_log"):
            f = getattr(lib, name)
            f.restype = ctypes.c_int
            f.argtypes = []
        lib.hrperf_close.restype = None
        lib.hrperf_close.argtypes = []
        _lib = lib
        return lib
    raise HrperfError(_errno.ENOENT, "cannot load libhrperf.so (set HRPERF_LIB): " + "; ".join(errors))


def _check(ret, what):
    if ret < 0:
        e = -ret
        raise HrperfError(e, "%s: %s (%s)" % (what, os.strerror(e), _HINTS.get(e, "see hrperf_api.h")))
    return ret


def open():  # noqa: A001 - mirrors hrperf_open()
    """Attach to the session now (the first call does it otherwise)."""
    _check(library().hrperf_open(), "hrperf_open")


def close():
    """Detach; the session goes on."""
    library().hrperf_close()


def fd():
    """The session's descriptor."""
    return _check(library().hrperf_fd(), "hrperf_fd")


def start():
    """Start or resume the session."""
    _check(library().hrperf_start(), "hrperf_start")


def pause():
    """Pause the session (every CPU; counts while paused are not recorded)."""
    _check(library().hrperf_pause(), "hrperf_pause")


def poll():
    """Instructed mode: every CPU reads its counters now."""
    _check(library().hrperf_poll(), "hrperf_poll")


def log():
    """Instructed mode: wake the recorder to collect what was polled."""
    _check(library().hrperf_log(), "hrperf_log")


def poll_log():
    """Instructed mode: poll() and log() in one call."""
    _check(library().hrperf_poll_log(), "hrperf_poll_log")


@contextlib.contextmanager
def region():
    """poll_log() on entry and on exit (also when the body raises): the exit record of
    each CPU holds the counts of the body."""
    poll_log()
    try:
        yield
    finally:
        poll_log()


@contextlib.contextmanager
def paused():
    """Pause the session for the body, resume after it."""
    pause()
    try:
        yield
    finally:
        start()
