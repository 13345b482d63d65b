//! A fake `/dev/hrperf` for tests of code built on the kmod client (this crate's, the
//! CLI's, the C API's): no kernel module, no root, deterministic.
//!
//! It behaves as `core-kmod/kmod/file.rs` does, and runs the *real* engine and format
//! code (`hrperf_engine` + the built-in formats) on ordinary memory that it hands out as
//! the "mapping", so what a test reads from the rings is exactly what the kernel module
//! would have written for the same samples:
//!
//! - time is virtual ([`KmodSys::now_ns`]); [`KmodSys::poll`] with nothing ready
//!   advances it by the timeout, generating the samples due meanwhile;
//! - every CPU's counter `i` counts `rate(i)` events per µs while the session runs
//!   (counter 0: 1000 per µs, i.e. ns, like cpu-clock); overflow mode samples every
//!   `period` of counter 0, poll mode every interval, instructed mode on POLL;
//! - NOTIFY or SWITCH from the format, LOG and STOP make the file readable until
//!   CONSUME; the format argument of CREATE is passed to the format;
//! - interval formats (`FMT_FL_INTERVALS`, aggregate: [`FakeKmod::register`] it):
//!   RESTART switches intervals, CONSUME with `tail` = an interval's sequence number
//!   acknowledges it ([`FakeKmod::acks`] lists them), as `core-kmod/kmod/session.rs`;
//! - zero-copy PEBS formats (`FMT_FL_PEBS`: [`FakeKmod::register`] `PEBS_OPS`, then
//!   [`FakeKmod::set_pebs`]): CREATE fills the argument's PMU fields as hrperf-core does
//!   (or refuses with the state's errno and reason in INFO, or with the reason given to
//!   [`FakeKmod::refuse_pebs`]); each overflow is a PEBS assist (`assist::assist`, GP0)
//!   into the mapped DS area unless the CPU is masked; reaching the threshold is the
//!   PMI dispatched to the format; RESTART is refused on an unmasked CPU and
//!   acknowledges the notification;
//! - children are scripted ([`FakeChild`]): they run for a virtual time, may issue
//!   ioctls on the descriptor they inherited, and exit with a given status;
//! - failures are injected per ioctl ([`FakeKmod::fail`]) or for `open`.
//!
//! Descriptors are numbers from 1 000 000 up, so they never collide with real ones;
//! [`KmodSys::poll`] passes any real descriptors in its set on to `poll(2)`.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use hrperf_abi::format::{
    FormatOps, SessionParams, CTRL_NOTIFY, CTRL_SWITCH, FMT_FL_INTERVALS, FMT_FL_PEBS, MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL,
    SAMPLE_INSTRUCTED, SAMPLE_OVERFLOW, SAMPLE_POLL,
};
use hrperf_abi::ioctl::{
    pebs_state, BufferSlot, CpuStats, FormatInfo, ModuleInfo, IOCTL_ABI_VERSION, MODE_DEFAULT,
};
use hrperf_fmt_pebs::ds::Counter;
use hrperf_fmt_pebs::format::{parse_arg, PebsArg, ARG_FL_PMU_PRESENT};
use hrperf_fmt_pebs::layout::PebsSample;
use hrperf_abi::{CpuMask, Services, MAX_COUNTERS};
use hrperf_engine::{
    Buffer, CounterConfig, CpuSession, Format, Registry, RingReader, Sample, Selector, Session,
};
use hrperf_fmt_aggregate::consumer::{Access, AggView};

use super::sys::{ChildExit, HeldChild, Ioctl, KmodSys};

/// First descriptor number the fake hands out.
pub const FIRST_FD: i32 = 1_000_000;
const PAGE: usize = 4096;

/// Events per µs of counter `i` in the fake (counter 0 counts ns).
pub fn rate(i: usize) -> u64 {
    match i {
        0 => 1000,
        i => i as u64,
    }
}

/// What a scripted child does with the descriptor it inherited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeAction {
    /// `HRPERF_IOC_START`.
    Start,
    /// `HRPERF_IOC_STOP`.
    Stop,
    /// `HRPERF_IOC_POLL`.
    Poll,
    /// `HRPERF_IOC_LOG`.
    Log,
    /// `HRPERF_IOC_POLL_LOG`.
    PollLog,
}

/// A scripted child for the next [`KmodSys::spawn_held`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeChild {
    /// Virtual ns it runs after exec.
    pub run_ns: u64,
    /// Its exit status.
    pub exit_status: i32,
    /// Ioctls it makes on its inherited descriptor: (ns after exec, action).
    pub actions: Vec<(u64, FakeAction)>,
    /// errno of a failed exec, 0 for success.
    pub exec_errno: i32,
}

impl Default for FakeChild {
    fn default() -> Self {
        FakeChild {
            run_ns: 100_000_000,
            exit_status: 0,
            actions: Vec::new(),
            exec_errno: 0,
        }
    }
}

/// What the fake saw of a spawned child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spawned {
    /// argv.
    pub argv: Vec<String>,
    /// The environment given.
    pub env: Vec<String>,
    /// The descriptor kept across exec.
    pub keep_fd: Option<i32>,
}

struct Mem {
    ptr: NonNull<u64>,
    words: usize,
}

impl Mem {
    fn new(bytes: usize) -> Mem {
        let b: Box<[u64]> = vec![0u64; bytes / 8].into_boxed_slice();
        let words = b.len();
        let ptr = NonNull::from(Box::leak(b)).cast::<u64>();
        Mem { ptr, words }
    }

    fn at(&self, offset: usize) -> NonNull<u8> {
        // SAFETY: callers pass offsets inside the allocation (buffer starts).
        unsafe { NonNull::new_unchecked(self.ptr.as_ptr().cast::<u8>().add(offset)) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.words);
        // SAFETY: the allocation came from `Box::leak` in `new` and is freed once.
        drop(unsafe { Box::from_raw(slice) });
    }
}

struct FakeSession {
    format: Format,
    mode: u32,
    period: u64,
    interval: u64,
    nr: usize,
    cpus: Vec<u32>,
    cpu: Vec<CpuSession>,
    raw: Vec<[u64; MAX_COUNTERS]>,
    ticks: Vec<u64>,
    mem: u64,
    buf_size: usize,
    running: bool,
    last_ns: u64,
    next_due: u64,
    /// A zero-copy PEBS format: overflows are PEBS assists.
    pebs: bool,
}

#[derive(Default)]
struct File {
    session: Option<FakeSession>,
    notified: bool,
}

struct Child {
    spec: FakeChild,
    released_at: Option<u64>,
    exited: Option<i32>,
    fd: Option<i32>,
    reaped: bool,
}

struct State {
    device: PathBuf,
    open_errno: Option<i32>,
    module: ModuleInfo,
    registry: Registry<16>,
    online: Vec<u32>,
    now: u64,
    next_fd: i32,
    files: BTreeMap<i32, File>,
    pidfds: BTreeMap<i32, i32>,
    mems: BTreeMap<u64, (Mem, bool, bool)>, // id → (memory, mapped, owned by a session)
    next_mem: u64,
    children: BTreeMap<i32, Child>,
    next_pid: i32,
    scripts: Vec<FakeChild>,
    spawned: Vec<Spawned>,
    calls: Vec<String>,
    fail: BTreeMap<&'static str, i32>,
    /// Distinct instruction pointers overflow samples cycle through (≥ 1).
    ips: u64,
    /// Interval acknowledgements that advanced a CPU's `U_ACK`: (cpu, seq).
    acks: Vec<(u32, u64)>,
    /// RESTARTs that switched an interval format's CPU: cpu.
    switches: Vec<u32>,
    /// The next PEBS CREATE is refused: (pebs_state, cpu, value).
    pebs_refusal: Option<(u32, u32, u64)>,
}

// SAFETY: the raw pointers inside (format tables, fake memory) point to `'static`
// tables and to allocations owned by the state, only touched with the mutex held.
unsafe impl Send for State {}

/// The fake device. See the [module docs](self).
pub struct FakeKmod {
    state: Mutex<State>,
}

impl std::fmt::Debug for FakeKmod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKmod").finish_non_exhaustive()
    }
}

impl Default for FakeKmod {
    fn default() -> Self {
        Self::new(2)
    }
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl FakeKmod {
    /// A loaded module (default mode overflow, `poll_us` 1000) with the formats whose
    /// kernel modules exist registered (fmt-delta.ko; fmt-pebs.ko is not written yet)
    /// and `cpus` online CPUs.
    pub fn new(cpus: u32) -> FakeKmod {
        let mut registry = hrperf_engine::Registry::new();
        // A static, valid table: cannot fail (the record module's tests register it too).
        let _ = registry.register_static(&hrperf_fmt_delta::DELTA_OPS);
        FakeKmod {
            state: Mutex::new(State {
                device: PathBuf::from(super::DEFAULT_DEVICE),
                open_errno: None,
                module: ModuleInfo {
                    size: size_of::<ModuleInfo>() as u32,
                    abi_version: IOCTL_ABI_VERSION,
                    module_version: 0x00_01_00,
                    default_mode: MODE_OVERFLOW,
                    poll_us: 1000,
                    nr_formats: 0,
                    nr_sessions: 0,
                    nr_cpus: cpus,
                    ..ModuleInfo::default()
                },
                registry,
                online: (0..cpus).collect(),
                now: 1_000_000_000,
                next_fd: FIRST_FD,
                files: BTreeMap::new(),
                pidfds: BTreeMap::new(),
                mems: BTreeMap::new(),
                next_mem: 1,
                children: BTreeMap::new(),
                next_pid: 4242,
                scripts: Vec::new(),
                spawned: Vec::new(),
                calls: Vec::new(),
                fail: BTreeMap::new(),
                ips: 1,
                acks: Vec::new(),
                switches: Vec::new(),
                pebs_refusal: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; go on with the data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `open` fails with `errno` (e.g. `ENOENT`: module not loaded; `EACCES`).
    pub fn set_open_errno(&self, e: Option<i32>) {
        self.lock().open_errno = e;
    }

    /// The module's `mode=` (a `MODE_*`).
    pub fn set_default_mode(&self, mode: u32) {
        self.lock().module.default_mode = mode;
    }

    /// The module's ioctl ABI version.
    pub fn set_abi_version(&self, v: u32) {
        self.lock().module.abi_version = v;
    }

    /// Registers another format (as if its fmt-*.ko were loaded), e.g.
    /// PEBS as the module would report it in INFO: `pebs_state` and the format word
    /// (the TSC of the simulated PMU is ns: 1 GHz).
    pub fn set_pebs(&self, state: u32, format: u32) {
        let mut st = self.lock();
        st.module.pebs_state = state;
        st.module.pebs_format = format;
        st.module.tsc_khz = 1_000_000;
    }

    /// The next PEBS CREATE is refused as hrperf-core refuses: `state`'s errno, and the
    /// reason, CPU and MSR value in INFO.
    pub fn refuse_pebs(&self, state: u32, cpu: u32, value: u64) {
        self.lock().pebs_refusal = Some((state, cpu, value));
    }

    /// `hrperf_fmt_aggregate::AGGREGATE_OPS`.
    pub fn register(&self, ops: &'static FormatOps) {
        let _ = self.lock().registry.register_static(ops);
    }

    /// Overflow samples cycle through `n` instruction pointers (`0x4000_0000 + 0x40·k`)
    /// instead of one.
    pub fn set_ips(&self, n: u64) {
        self.lock().ips = n.max(1);
    }

    /// Interval acknowledgements that advanced a CPU's consumer line, in order:
    /// (cpu, interval seq).
    pub fn acks(&self) -> Vec<(u32, u64)> {
        self.lock().acks.clone()
    }

    /// RESTARTs that switched an interval format's CPU, in order: the CPU of each.
    pub fn switches(&self) -> Vec<u32> {
        self.lock().switches.clone()
    }

    /// Unregisters every format (as if no fmt-*.ko were loaded).
    pub fn unregister_all(&self) {
        let mut s = self.lock();
        let uuids: Vec<_> = s.registry.iter().map(|f| f.uuid).collect();
        for u in uuids {
            let _ = s.registry.unregister(&u);
        }
    }

    /// Makes every later ioctl `name` (e.g. `"HRPERF_IOC_CREATE"`) fail with `errno`.
    pub fn fail(&self, name: &'static str, e: i32) {
        self.lock().fail.insert(name, e);
    }

    /// The script of the next spawned child.
    pub fn push_child(&self, c: FakeChild) {
        self.lock().scripts.push(c);
    }

    /// Children spawned so far.
    pub fn spawned(&self) -> Vec<Spawned> {
        self.lock().spawned.clone()
    }

    /// Every ioctl made, by name, in order.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Descriptors open now (device files and pidfds).
    pub fn open_fds(&self) -> usize {
        let s = self.lock();
        s.files.len() + s.pidfds.len()
    }

    /// Buffer memory still allocated (mapped or owned by a session).
    pub fn live_buffers(&self) -> usize {
        self.lock().mems.len()
    }

    /// Sessions that exist now.
    pub fn sessions(&self) -> usize {
        self.lock()
            .files
            .values()
            .filter(|f| f.session.is_some())
            .count()
    }

    /// Whether the session on `fd` runs.
    pub fn running(&self, fd: i32) -> bool {
        self.lock()
            .files
            .get(&fd)
            .and_then(|f| f.session.as_ref())
            .is_some_and(|s| s.running)
    }

    /// Registered formats' use counts (name, users).
    pub fn format_users(&self) -> Vec<(String, u32)> {
        let s = self.lock();
        s.registry
            .iter()
            .map(|f| {
                (
                    super::format_name(&f),
                    s.registry.users(&f.uuid).unwrap_or(0),
                )
            })
            .collect()
    }

    /// Advances virtual time by `ns`, producing the samples due.
    pub fn advance(&self, ns: u64) {
        let mut s = self.lock();
        let t = s.now + ns;
        s.advance_to(t);
    }
}

impl State {
    fn alloc_fd(&mut self) -> i32 {
        let fd = self.next_fd;
        self.next_fd += 1;
        fd
    }

    fn buffer(&self, sess: &FakeSession, i: usize) -> Option<Buffer<'static>> {
        let (mem, _, _) = self.mems.get(&sess.mem)?;
        // SAFETY: the allocation holds `cpus * buf_size` bytes and outlives every use
        // made under the lock; buffers are 8-aligned (u64 words, page multiples).
        unsafe { Buffer::from_raw(mem.at(i * sess.buf_size), sess.buf_size) }.ok()
    }

    /// Runs `f` with the session on `fd` and the state (for its buffers).
    fn with_session<R>(
        &mut self,
        fd: i32,
        f: impl FnOnce(&mut State, &mut FakeSession) -> io::Result<R>,
    ) -> io::Result<R> {
        let mut file = self.files.remove(&fd).ok_or_else(|| errno(libc::EBADF))?;
        let r = match file.session.as_mut() {
            Some(sess) => f(self, sess),
            None => Err(errno(libc::EINVAL)),
        };
        self.files.insert(fd, file);
        r
    }

    /// One sample of `kind` on every CPU of `sess` at `self.now`; true if the format
    /// asked to NOTIFY.
    fn tick(&mut self, sess: &mut FakeSession, kind: u32) -> bool {
        let mut notify = false;
        for i in 0..sess.cpus.len() {
            let Some(mut buf) = self.buffer(sess, i) else {
                continue;
            };
            let sample = Sample {
                cpu: sess.cpus[i],
                kind,
                pid: 77,
                tid: 77,
                time_ns: self.now + i as u64, // each CPU stamps its own read
                ip: if kind == SAMPLE_OVERFLOW {
                    0x4000_0000 + sess.ticks[i] % self.ips * 0x40
                } else {
                    0
                },
                kernel_ip: false,
                addr: 0,
                ovfl_counter: if kind == SAMPLE_OVERFLOW { 0 } else { u32::MAX },
                nr: sess.nr as u32,
                raw: sess.raw[i],
            };
            sess.ticks[i] += 1;
            if sess.pebs && kind == SAMPLE_OVERFLOW {
                // The PEBS counter overflowed: the assist writes a record; only the
                // threshold raises the PMI. A masked CPU's counter does not count.
                if sess.cpu[i].is_masked() {
                    continue;
                }
                let rec = PebsSample {
                    eventing_ip: sample.ip,
                    data_addr: 0x7ff0_0000_0000 + sess.ticks[i] * 64,
                    data_source: 1,
                    latency: 5,
                    tsc: sample.time_ns,
                    ..PebsSample::default()
                };
                match hrperf_fmt_pebs::assist::assist(&mut buf, Counter::Gp(0), &rec) {
                    Ok(out) if out.pmi => {}
                    _ => continue,
                }
            }
            let ctrl = sess.cpu[i].dispatch(&mut buf, &sample, &Services::NONE);
            notify |= ctrl & (CTRL_NOTIFY | CTRL_SWITCH) != 0;
        }
        notify
    }

    /// Counts `dt` ns into every CPU's counters.
    fn count(sess: &mut FakeSession, dt: u64) {
        for raw in sess.raw.iter_mut() {
            for (i, r) in raw.iter_mut().enumerate().take(sess.nr) {
                *r += dt * rate(i) / 1000;
            }
        }
    }

    /// The time of the next event (a sample due, a child's action or exit), at most
    /// `target`.
    fn next_event(&self, target: u64) -> u64 {
        let mut next = target;
        for f in self.files.values() {
            if let Some(s) = f
                .session
                .as_ref()
                .filter(|s| s.running && s.mode != MODE_INSTRUCTED)
            {
                next = next.min(s.next_due);
            }
        }
        for c in self.children.values() {
            if let (Some(at), None) = (c.released_at, c.exited) {
                next = next.min(at + c.spec.run_ns);
                if let Some((t, _)) = c.spec.actions.first() {
                    next = next.min(at + t);
                }
            }
        }
        next.max(self.now)
    }

    /// Moves virtual time to `target`: sessions count and sample, children act and exit.
    fn advance_to(&mut self, target: u64) {
        while self.step(target) < target {}
    }

    /// Moves virtual time to the next event (at most `target`) and handles it; returns
    /// the new time.
    fn step(&mut self, target: u64) -> u64 {
        {
            let next = self.next_event(target);
            // Count up to `next` on every running session.
            let fds: Vec<i32> = self.files.keys().copied().collect();
            for &fd in &fds {
                let now = next;
                let _ = self.with_session(fd, |_, sess| {
                    if sess.running {
                        Self::count(sess, now - sess.last_ns);
                        sess.last_ns = now;
                    }
                    Ok(())
                });
            }
            self.now = next;
            // Samples due now.
            for &fd in &fds {
                let notify = self
                    .with_session(fd, |st, sess| {
                        let mut n = false;
                        if sess.running && sess.mode != MODE_INSTRUCTED && sess.next_due <= st.now {
                            let kind = if sess.mode == MODE_OVERFLOW {
                                SAMPLE_OVERFLOW
                            } else {
                                SAMPLE_POLL
                            };
                            n = st.tick(sess, kind);
                            sess.next_due += if sess.mode == MODE_OVERFLOW {
                                sess.period
                            } else {
                                sess.interval
                            };
                        }
                        Ok(n)
                    })
                    .unwrap_or(false);
                if notify {
                    if let Some(f) = self.files.get_mut(&fd) {
                        f.notified = true;
                    }
                }
            }
            // Children.
            let pids: Vec<i32> = self.children.keys().copied().collect();
            for pid in pids {
                let mut todo = Vec::new();
                if let Some(c) = self.children.get_mut(&pid) {
                    if let (Some(at), None) = (c.released_at, c.exited) {
                        while c.spec.actions.first().is_some_and(|(t, _)| at + t <= next) {
                            todo.push(c.spec.actions.remove(0).1);
                        }
                        if at + c.spec.run_ns <= next {
                            c.exited = Some(c.spec.exit_status);
                        }
                    }
                }
                let fd = self.children.get(&pid).and_then(|c| c.fd);
                for a in todo {
                    if let Some(fd) = fd {
                        let _ = self.simple(fd, a);
                    }
                }
            }
            next
        }
    }

    fn simple(&mut self, fd: i32, a: FakeAction) -> io::Result<()> {
        let notify = self.with_session(fd, |st, sess| match a {
            FakeAction::Start => {
                if sess.running {
                    return Err(errno(libc::EINVAL));
                }
                for i in 0..sess.cpus.len() {
                    let mut buf = st.buffer(sess, i).ok_or_else(|| errno(libc::EFAULT))?;
                    sess.cpu[i]
                        .start(&mut buf, &sess.raw[i], st.now)
                        .map_err(|_| errno(libc::EINVAL))?;
                }
                sess.running = true;
                sess.last_ns = st.now;
                sess.next_due = st.now
                    + if sess.mode == MODE_OVERFLOW {
                        sess.period
                    } else {
                        sess.interval
                    };
                Ok(false)
            }
            FakeAction::Stop => {
                if !sess.running {
                    return Err(errno(libc::EINVAL));
                }
                sess.running = false;
                for i in 0..sess.cpus.len() {
                    let mut buf = st.buffer(sess, i).ok_or_else(|| errno(libc::EFAULT))?;
                    sess.cpu[i]
                        .stop(&mut buf)
                        .map_err(|_| errno(libc::EINVAL))?;
                }
                Ok(true)
            }
            FakeAction::Poll | FakeAction::Log | FakeAction::PollLog => {
                if sess.mode != MODE_INSTRUCTED || !sess.running {
                    return Err(errno(libc::EINVAL));
                }
                if a != FakeAction::Log {
                    st.tick(sess, SAMPLE_INSTRUCTED);
                }
                Ok(a != FakeAction::Poll)
            }
        })?;
        if notify {
            if let Some(f) = self.files.get_mut(&fd) {
                f.notified = true;
            }
        }
        Ok(())
    }

    fn create(&mut self, fd: i32, c: &hrperf_abi::ioctl::SessionCreate) -> io::Result<()> {
        let file = self.files.get(&fd).ok_or_else(|| errno(libc::EBADF))?;
        if c.flags != 0 || c.reserved0 != 0 || c.reserved != [0; 4] {
            return Err(errno(libc::EINVAL));
        }
        if file.session.is_some() {
            return Err(errno(libc::EBUSY));
        }
        let mode = if c.mode == MODE_DEFAULT {
            self.module.default_mode
        } else {
            c.mode
        };
        let nr = c.nr_events as usize;
        if nr == 0 || nr > MAX_COUNTERS {
            return Err(errno(libc::EINVAL));
        }
        let (period, interval) = match mode {
            MODE_OVERFLOW if c.sample_period == 0 => return Err(errno(libc::EINVAL)),
            MODE_OVERFLOW => (c.sample_period, 0),
            MODE_POLL => (
                0,
                if c.poll_interval_ns == 0 {
                    u64::from(self.module.poll_us) * 1000
                } else {
                    c.poll_interval_ns
                },
            ),
            MODE_INSTRUCTED => (0, 0),
            _ => return Err(errno(libc::EINVAL)),
        };
        if mode == MODE_POLL && !(10_000..=10_000_000_000).contains(&interval) {
            return Err(errno(libc::EINVAL));
        }
        let cpus: Vec<u32> = if c.cpus == CpuMask::EMPTY {
            self.online.clone()
        } else {
            if c.cpus.iter().any(|cpu| !self.online.contains(&cpu)) {
                return Err(errno(libc::EINVAL));
            }
            c.cpus.iter().collect()
        };
        let format = self
            .registry
            .acquire(Selector::from_fields(&c.format_name, c.format_uuid))
            .map_err(|_| errno(libc::ENOENT))?;
        let pebs = format.flags() & FMT_FL_PEBS != 0;
        let params = SessionParams {
            size: size_of::<SessionParams>() as u32,
            mode,
            nr_counters: nr as u32,
            cpu: u32::MAX,
            sample_period: period,
            poll_interval_ns: interval,
            data_size_hint: c.data_size,
            flags: 0,
            reserved: 0,
        };
        let counters = vec![
            CounterConfig {
                width: 64,
                max_rate_per_sec: 0
            };
            nr
        ];
        let arg_len = c.fmt_arg_len as usize;
        if arg_len > 4096 {
            return Err(errno(libc::E2BIG));
        }
        let arg: &[u8] = if arg_len == 0 || c.fmt_arg == 0 {
            &[]
        } else {
            // SAFETY: the fake runs in the caller's process, and `fmt_arg` points at
            // `fmt_arg_len` bytes the caller keeps alive for the ioctl
            // (`build_create` points it at `KmodConfig::format_arg`).
            unsafe { std::slice::from_raw_parts(c.fmt_arg as *const u8, arg_len) }
        };
        let pebs_arg;
        let arg = if pebs {
            match self.pebs_create(arg, nr) {
                Ok(a) => {
                    pebs_arg = a;
                    &pebs_arg[..]
                }
                Err(e) => {
                    let _ = self.registry.release(format);
                    return Err(e);
                }
            }
        } else {
            arg
        };
        let session = match Session::new(format, &params, arg, &counters) {
            Ok(s) => s,
            Err(e) => {
                let _ = self.registry.release(format);
                return Err(errno(-e.errno()));
            }
        };
        let buf_size = (session.buffer_size() as usize).next_multiple_of(PAGE);
        let id = self.next_mem;
        self.next_mem += 1;
        self.mems
            .insert(id, (Mem::new(buf_size * cpus.len()), false, true));
        let mut sess = FakeSession {
            format,
            mode,
            period,
            interval,
            nr,
            cpus: cpus.clone(),
            cpu: Vec::new(),
            raw: vec![[0; MAX_COUNTERS]; cpus.len()],
            ticks: vec![0; cpus.len()],
            mem: id,
            buf_size,
            running: false,
            last_ns: self.now,
            next_due: u64::MAX,
            pebs,
        };
        for (i, &cpu) in cpus.iter().enumerate() {
            let Some(mut buf) = self.buffer(&sess, i) else {
                return Err(errno(libc::ENOMEM));
            };
            let cs = session
                .init_cpu(cpu, &mut buf, arg)
                .map_err(|e| errno(-e.errno()))?;
            sess.cpu.push(cs);
        }
        if let Some(f) = self.files.get_mut(&fd) {
            f.session = Some(sess);
        }
        Ok(())
    }

    /// A PEBS CREATE: refused (INFO then says why), or the argument with the PMU fields
    /// the module detected.
    fn pebs_create(&mut self, arg: &[u8], nr: usize) -> io::Result<[u8; hrperf_fmt_pebs::format::PEBS_ARG_SIZE]> {
        let refusal = match (self.pebs_refusal.take(), self.module.pebs_state) {
            (Some(r), _) => Some(r),
            (None, pebs_state::HARDWARE | pebs_state::SIMULATED) if nr != 1 => Some((pebs_state::BAD_EVENT, u32::MAX, 0)),
            (None, pebs_state::HARDWARE | pebs_state::SIMULATED) => None,
            (None, state) => Some((state, u32::MAX, 0)),
        };
        if let Some((state, cpu, value)) = refusal {
            self.module.pebs_refusal = state;
            self.module.pebs_refusal_cpu = cpu;
            self.module.pebs_refusal_value = value;
            return Err(errno(pebs_state::errno(state)));
        }
        let mut a = if arg.is_empty() { PebsArg::new() } else { parse_arg(arg).map_err(errno)? };
        a.flags |= ARG_FL_PMU_PRESENT;
        a.pebs_format = self.module.pebs_format;
        a.counter_width = 48;
        Ok(a.to_bytes())
    }

    /// DESTROY (and close): stop, exit each CPU, give the format back; the memory
    /// stays while mapped.
    fn destroy(&mut self, fd: i32) -> io::Result<()> {
        let mut sess = self
            .files
            .get_mut(&fd)
            .and_then(|f| f.session.take())
            .ok_or_else(|| errno(libc::EINVAL))?;
        for i in 0..sess.cpus.len() {
            if let Some(mut buf) = self.buffer(&sess, i) {
                let _ = sess.cpu[i].exit(&mut buf);
                self.module.total_drops += buf.header().drops;
            }
        }
        let _ = self.registry.release(sess.format);
        if let Some(m) = self.mems.get_mut(&sess.mem) {
            m.2 = false;
            if !m.1 {
                self.mems.remove(&sess.mem);
            }
        }
        Ok(())
    }

    fn ioctl(&mut self, fd: i32, req: Ioctl<'_>) -> io::Result<()> {
        if !self.files.contains_key(&fd) {
            return Err(errno(libc::EBADF));
        }
        match req {
            Ioctl::Info(a) => {
                let mut m = self.module;
                m.nr_formats = self.registry.len() as u32;
                m.nr_sessions = self.files.values().filter(|f| f.session.is_some()).count() as u32;
                *a = m;
                Ok(())
            }
            Ioctl::Formats(a, entries) => {
                let list: Vec<FormatInfo> = self
                    .registry
                    .iter()
                    .map(|mut f| {
                        f.users = self.registry.users(&f.uuid).unwrap_or(0);
                        f
                    })
                    .collect();
                for (e, f) in entries.iter_mut().zip(&list) {
                    *e = *f;
                }
                a.count = list.len() as u32;
                Ok(())
            }
            Ioctl::Create(c) => self.create(fd, c),
            Ioctl::Start => self.simple(fd, FakeAction::Start),
            Ioctl::Stop => self.simple(fd, FakeAction::Stop),
            Ioctl::Poll => self.simple(fd, FakeAction::Poll),
            Ioctl::Log => self.simple(fd, FakeAction::Log),
            Ioctl::PollLog => self.simple(fd, FakeAction::PollLog),
            Ioctl::Restart(a) => {
                let switched = self.with_session(fd, |st, sess| {
                    if a.cpu != u32::MAX && !sess.cpus.contains(&a.cpu) {
                        return Err(errno(libc::EINVAL));
                    }
                    let mut switched = Vec::new();
                    for i in 0..sess.cpus.len() {
                        if a.cpu != u32::MAX && sess.cpus[i] != a.cpu {
                            continue;
                        }
                        if sess.pebs && !sess.cpu[i].is_masked() {
                            // Its PMU still writes records: a reset would lose them.
                            return Err(errno(libc::EINVAL));
                        }
                        let mut buf = st.buffer(sess, i).ok_or_else(|| errno(libc::EFAULT))?;
                        let ctrl = sess.cpu[i]
                            .restart(&mut buf)
                            .map_err(|e| errno(e.errno().abs()))?;
                        if ctrl & CTRL_SWITCH != 0 {
                            switched.push(sess.cpus[i]);
                        }
                    }
                    Ok((switched, sess.pebs))
                })?;
                let (switched, pebs) = switched;
                if let Some(f) = self.files.get_mut(&fd) {
                    if !switched.is_empty() {
                        f.notified = true;
                    } else if pebs {
                        // RESTART is the PEBS reader's answer to NOTIFY.
                        f.notified = false;
                    }
                }
                self.switches.extend(switched);
                Ok(())
            }
            Ioctl::Destroy => self.destroy(fd),
            Ioctl::Stats(a, entries) => self.with_session(fd, |st, sess| {
                for (i, e) in entries.iter_mut().enumerate().take(sess.cpus.len()) {
                    let buf = st.buffer(sess, i).ok_or_else(|| errno(libc::EFAULT))?;
                    let mut s: CpuStats = sess.cpu[i].stats(&buf);
                    if sess.mode != MODE_OVERFLOW {
                        s.poll_ticks = sess.ticks[i];
                    }
                    *e = s;
                }
                a.count = sess.cpus.len() as u32;
                Ok(())
            }),
            Ioctl::Buffers(a, entries) => self.with_session(fd, |_, sess| {
                for (i, e) in entries.iter_mut().enumerate().take(sess.cpus.len()) {
                    *e = BufferSlot {
                        cpu: sess.cpus[i],
                        reserved: 0,
                        offset: (i * sess.buf_size) as u64,
                    };
                }
                a.count = sess.cpus.len() as u32;
                a.buf_size = sess.buf_size as u64;
                Ok(())
            }),
            Ioctl::Consume(c) => {
                self.with_session(fd, |st, sess| {
                    let i = sess
                        .cpus
                        .iter()
                        .position(|&x| x == c.cpu)
                        .ok_or_else(|| errno(libc::EINVAL))?;
                    let buf = st.buffer(sess, i).ok_or_else(|| errno(libc::EFAULT))?;
                    if sess.format.flags() & FMT_FL_INTERVALS != 0 {
                        let (mem, _, _) = st.mems.get(&sess.mem).ok_or_else(|| errno(libc::EFAULT))?;
                        // SAFETY: the CPU's buffer inside the fake's allocation (alive
                        // under the lock); the view only stores the consumer line,
                        // atomically, as the kernel's CONSUME does.
                        let view = unsafe {
                            AggView::from_raw(mem.at(i * sess.buf_size), sess.buf_size, Access::ReadWrite)
                        }
                        .map_err(|_| errno(libc::EINVAL))?;
                        let before = view.acked();
                        view.ack_seq(c.tail).map_err(|_| errno(libc::EINVAL))?;
                        if c.tail != before {
                            st.acks.push((c.cpu, c.tail));
                        }
                        return Ok(());
                    }
                    RingReader::new(&buf)
                        .and_then(|r| r.consume(c.tail))
                        .map_err(|_| errno(libc::EINVAL))
                })?;
                if let Some(f) = self.files.get_mut(&fd) {
                    f.notified = false;
                }
                Ok(())
            }
        }
    }
}

// SAFETY: `mmap_read` returns a pointer into an allocation the fake keeps until the
// matching `munmap` (or its own drop), 8-aligned (u64 words); the fake writes it only
// through the engine's ring writer, under its lock, while callers read it.
unsafe impl KmodSys for FakeKmod {
    fn open(&self, path: &Path) -> io::Result<i32> {
        let mut s = self.lock();
        if let Some(e) = s.open_errno {
            return Err(errno(e));
        }
        if path != s.device {
            return Err(errno(libc::ENOENT));
        }
        let fd = s.alloc_fd();
        s.files.insert(fd, File::default());
        Ok(fd)
    }

    fn close(&self, fd: i32) {
        let mut s = self.lock();
        if s.pidfds.remove(&fd).is_some() {
            return;
        }
        // A child holding the same file keeps it open (as the kernel would).
        let held = s
            .children
            .values()
            .any(|c| c.fd == Some(fd) && c.exited.is_none() && c.released_at.is_some());
        if !held && s.files.get(&fd).is_some_and(|f| f.session.is_some()) {
            let _ = s.destroy(fd);
        }
        if !held {
            s.files.remove(&fd);
        }
    }

    fn ioctl(&self, fd: i32, req: Ioctl<'_>) -> io::Result<()> {
        let mut s = self.lock();
        let name = req.name();
        s.calls.push(name.to_string());
        if let Some(&e) = s.fail.get(name) {
            return Err(errno(e));
        }
        s.ioctl(fd, req)
    }

    fn mmap_read(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>> {
        let mut s = self.lock();
        let (id, size) = {
            let sess = s
                .files
                .get(&fd)
                .and_then(|f| f.session.as_ref())
                .ok_or_else(|| errno(libc::EINVAL))?;
            (sess.mem, sess.buf_size * sess.cpus.len())
        };
        if len == 0 || len > size {
            return Err(errno(libc::EINVAL));
        }
        let m = s.mems.get_mut(&id).ok_or_else(|| errno(libc::EINVAL))?;
        m.1 = true;
        Ok(m.0.at(0))
    }

    unsafe fn munmap(&self, ptr: NonNull<u8>, _len: usize) {
        let mut s = self.lock();
        let id = s
            .mems
            .iter()
            .find(|(_, m)| m.0.at(0) == ptr)
            .map(|(&id, _)| id);
        if let Some(id) = id {
            let gone = s.mems.get_mut(&id).is_some_and(|m| {
                m.1 = false;
                !m.2
            });
            if gone {
                s.mems.remove(&id);
            }
        }
    }

    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
        let ready = |s: &State, fds: &mut [libc::pollfd]| -> usize {
            let mut n = 0;
            for p in fds.iter_mut().filter(|p| p.fd >= FIRST_FD) {
                let r = match (s.files.get(&p.fd), s.pidfds.get(&p.fd)) {
                    (Some(f), _) => f.notified,
                    (None, Some(pid)) => s.children.get(pid).is_some_and(|c| c.exited.is_some()),
                    _ => false,
                };
                p.revents = if r { libc::POLLIN } else { 0 };
                n += usize::from(r);
            }
            n
        };
        let mut n = {
            let mut s = self.lock();
            let mut n = ready(&s, fds);
            let target = s.now + timeout_ms.max(0) as u64 * 1_000_000;
            while n == 0 && s.now < target {
                s.step(target);
                n = ready(&s, fds);
            }
            n
        };
        // Real descriptors (sockets in daemon tests): really wait, for as long as the
        // virtual time just advanced, unless something fake is ready.
        let mut real: Vec<libc::pollfd> = fds
            .iter()
            .filter(|p| p.fd >= 0 && p.fd < FIRST_FD)
            .copied()
            .collect();
        if !real.is_empty() {
            let wait = if n > 0 { 0 } else { timeout_ms };
            // SAFETY: `real` is a valid array of pollfds for the call.
            let r = unsafe { libc::poll(real.as_mut_ptr(), real.len() as libc::nfds_t, wait) };
            if r > 0 {
                for p in fds.iter_mut() {
                    if let Some(q) = real.iter().find(|q| q.fd == p.fd) {
                        p.revents = q.revents;
                    }
                }
                n += r as usize;
            }
        }
        Ok(n)
    }

    fn now_ns(&self) -> u64 {
        self.lock().now
    }

    fn find_program(&self, name: &str) -> io::Result<CString> {
        if name == "no-such-program" {
            return Err(errno(libc::ENOENT));
        }
        CString::new(format!("/fake/bin/{name}")).map_err(|_| errno(libc::EINVAL))
    }

    fn spawn_held(
        &self,
        _path: &CStr,
        argv: &[CString],
        envp: &[CString],
        keep_fd: Option<i32>,
    ) -> io::Result<HeldChild> {
        let mut s = self.lock();
        let spec = if s.scripts.is_empty() {
            FakeChild::default()
        } else {
            s.scripts.remove(0)
        };
        let pid = s.next_pid;
        s.next_pid += 1;
        let text = |v: &[CString]| {
            v.iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        s.spawned.push(Spawned {
            argv: text(argv),
            env: text(envp),
            keep_fd,
        });
        s.children.insert(
            pid,
            Child {
                spec,
                released_at: None,
                exited: None,
                fd: keep_fd,
                reaped: false,
            },
        );
        Ok(HeldChild {
            pid,
            go_fd: -1,
            err_fd: -1,
        })
    }

    fn release_child(&self, child: &HeldChild) -> io::Result<()> {
        let mut s = self.lock();
        let now = s.now;
        let c = s
            .children
            .get_mut(&child.pid)
            .ok_or_else(|| errno(libc::ESRCH))?;
        if c.spec.exec_errno != 0 {
            c.exited = Some(127);
            return Err(errno(c.spec.exec_errno));
        }
        c.released_at = Some(now);
        Ok(())
    }

    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>> {
        let mut s = self.lock();
        let c = s.children.get(&pid).ok_or_else(|| errno(libc::ECHILD))?;
        if c.reaped {
            return Err(errno(libc::ECHILD));
        }
        if c.exited.is_none() && !nohang {
            let now = s.now;
            let t = c.released_at.unwrap_or(now) + c.spec.run_ns;
            s.advance_to(t.max(now));
            if let Some(c) = s.children.get_mut(&pid) {
                c.exited.get_or_insert(c.spec.exit_status);
            }
        }
        let c = s
            .children
            .get_mut(&pid)
            .ok_or_else(|| errno(libc::ECHILD))?;
        Ok(c.exited.map(|status| {
            c.reaped = true;
            ChildExit { status }
        }))
    }

    fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        let mut s = self.lock();
        let c = s.children.get_mut(&pid).ok_or_else(|| errno(libc::ESRCH))?;
        if c.exited.is_none() {
            c.exited = Some(-signal);
        }
        Ok(())
    }

    fn pidfd_open(&self, pid: i32) -> io::Result<i32> {
        let mut s = self.lock();
        if !s.children.contains_key(&pid) {
            return Err(errno(libc::ESRCH));
        }
        let fd = s.alloc_fd();
        s.pidfds.insert(fd, pid);
        Ok(fd)
    }
}
