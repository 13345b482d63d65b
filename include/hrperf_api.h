/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hrperf_api.h - mark regions of a program on an hrperf-core.ko session, as hiresperf
 * users do. Link with -lhrperf (libhrperf.so or libhrperf.a, built from userlib/capi).
 *
 *   #include <hrperf_api.h>
 *
 *   hrperf_poll_log();        // counters read on every CPU: counts up to here ...
 *   work();
 *   hrperf_poll_log();        // ... and one record per CPU holding work()'s counts
 *
 * The library does not create sessions; it attaches to the one the program runs under,
 * found in this order:
 *
 *   1. HRPERF_FD: the descriptor `hrperf record --source kmod ... -- ./app` passes down
 *      (the session being recorded, in whatever mode it was created);
 *   2. the `hrperf start` daemon's control socket ($HRPERF_SOCKET, else
 *      $XDG_RUNTIME_DIR/hrperf/ctl.sock, else /tmp/hrperf-<uid>/ctl.sock), which hands
 *      the session's descriptor over (SCM_RIGHTS).
 *
 * After that every call is one ioctl on the session's descriptor: the region boundary is
 * the instant of the call, the recorder is woken by it, and there is no round trip to any
 * other process. The recorder (hrperf record, or the daemon) writes the records to its
 * capture file; `hrperf decode` shows them (trigger "instructed").
 *
 * Modes: hrperf_poll/hrperf_log/hrperf_poll_log need an instructed-mode session
 * (`hrperf record --instructed`, `hrperf start --instructed`). hrperf_start/hrperf_pause
 * work in every mode and pause the whole session (all CPUs, every holder of it): counts
 * while paused are not recorded.
 *
 * Every call returns 0 on success or a negative errno:
 *   -ENOENT   no session: no HRPERF_FD and no `hrperf start` daemon (start one)
 *   -EBADF    HRPERF_FD (or the fd given to hrperf_attach_fd) is not an open /dev/hrperf
 *   -EINVAL   the session does not allow it now: poll/log outside instructed mode or
 *             while paused; start while running; pause while paused; or the session
 *             was destroyed (`hrperf stop`)
 *   -ENODEV   hrperf-core.ko is being unloaded
 *   -EACCES   the daemon belongs to another user
 * Calls are thread-safe, except that hrperf_close() must not race with the others.
 * Cost: one ioctl; the first call also attaches (an environment lookup, or one socket
 * round trip to the daemon).
 */
#ifndef HRPERF_API_H
#define HRPERF_API_H

#ifdef __cplusplus
extern "C" {
#endif

/* Attach to the session now (otherwise the first call does it). 0 or -errno. */
int hrperf_open(void);

/* Use `fd`, an open /dev/hrperf descriptor with a session the caller created itself
 * (see include/hrperf.h); it stays the caller's to close. 0 or -errno. */
int hrperf_attach_fd(int fd);

/* The session descriptor in use (attaching first), e.g. to poll() it; or -errno. */
int hrperf_fd(void);

/* Detach. The session goes on: it belongs to `hrperf record` or `hrperf start`. */
void hrperf_close(void);

/* Start or resume the session (HRPERF_IOC_START). 0 or -errno (-EINVAL: running). */
int hrperf_start(void);

/* Pause the session (HRPERF_IOC_STOP). 0 or -errno (-EINVAL: not running). */
int hrperf_pause(void);

/* Instructed mode: every monitored CPU reads its counters now, each writing one record
 * (the counts since its previous record) into its ring (HRPERF_IOC_POLL). */
int hrperf_poll(void);

/* Instructed mode: wake the recorder to collect the records polled so far
 * (HRPERF_IOC_LOG); without it the recorder collects them within ~100 ms anyway. */
int hrperf_log(void);

/* Instructed mode: hrperf_poll() and hrperf_log() in one call (HRPERF_IOC_POLL_LOG). */
int hrperf_poll_log(void);

#ifdef __cplusplus
}
#endif

#endif /* HRPERF_API_H */
