// SPDX-License-Identifier: GPL-2.0
//! A created session: per-CPU buffers, perf counters and engine state, and the three
//! sources of samples (perfmon2's context + `pfm_overflow_handler`, plus polling).
//!
//! - overflow mode: the leader counter's perf overflow callback (NMI/IRQ context, on
//!   the counter's CPU) reads that CPU's counters and dispatches; no allocation, no
//!   sleeping locks.
//! - poll mode: ONE kthread keeps the drift-free schedule and, per tick, cross-calls
//!   every monitored CPU; each CPU reads its own counters and takes its own
//!   `local_clock()` timestamp (hiresperf's lesson: no sleeping thread per core).
//! - instructed mode: no thread; `HRPERF_IOC_POLL` does the same cross call once.
//!
//! # Concurrency
//!
//! A CPU's engine state and buffer (its [`CpuSlot`]) are only touched on that CPU, by
//! the overflow callback or by a cross call (IRQs off), under the slot's `busy` flag.
//! The flag is a try-lock: an NMI (or an IRQ over a software event's handler) that
//! finds it taken counts the sample in `busy_skips` (reported as `masked`); a cross
//! call that finds it taken returns and is retried from process context.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kernel::page::PAGE_SIZE;
use kernel::prelude::*;

use crate::abi::event::{
    EventDesc, EVENT_FL_KERNEL_ONLY, EVENT_FL_PRECISE, EVENT_FL_USER_ONLY, EVENT_TYPE_HARDWARE,
    EVENT_TYPE_HW_CACHE, EVENT_TYPE_RAW, EVENT_TYPE_SOFTWARE,
};
use crate::abi::format::{
    Services, SessionParams, CTRL_NOTIFY, CTRL_SWITCH, FMT_FL_INTERVALS, FMT_FL_PEBS, FMT_FL_STACKS,
    MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL, SAMPLE_INSTRUCTED, SAMPLE_OVERFLOW, SAMPLE_POLL,
};
use crate::abi::ioctl::{BufferSlot, CpuStats};
use crate::abi::{CpuMask, MAX_COUNTERS, MAX_CPUS};
use crate::engine::{Buffer, CounterConfig, CpuSession, Format, RingReader, Sample, Session};
use crate::aggregate::consumer::{Access, AggView, ViewError};
use crate::engine_err;
use crate::pebs_pmu::{self, PebsCpu, Pmi, SessionPebs};
use crate::shim::{self, FileHandle, ModuleRef, PerfCounter, Thread, ThreadBody, Vma, VmBuffer};

/// Shortest poll interval accepted (10 µs).
pub(crate) const MIN_POLL_NS: u64 = 10_000;
/// Longest poll interval accepted (10 s).
pub(crate) const MAX_POLL_NS: u64 = 10_000_000_000;
/// Largest per-CPU buffer (the delta format's 1 GiB ring plus its header pages).
const MAX_BUF_SIZE: u64 = (1 << 30) + (1 << 20);
/// Largest total of all CPUs' buffers of one session.
const MAX_TOTAL_SIZE: u64 = 1 << 30;
/// Cross calls retried this often while an overflow handler holds a CPU's slot.
const BUSY_RETRIES: u32 = 10_000;
/// Control bits that wake the reader: NOTIFY, and SWITCH (an interval was published).
const CTRL_WAKE: u32 = CTRL_NOTIFY | CTRL_SWITCH;

/// A refused interval acknowledgement as an errno: not an interval buffer, or not the
/// published interval → `EINVAL`.
fn view_err(_e: ViewError) -> Error {
    EINVAL
}

/// Wakes a file's `poll()` waiters and remembers whether that was acknowledged.
pub(crate) struct Notifier {
    file: FileHandle,
    seq: AtomicU64,
    acked: AtomicU64,
}

impl Notifier {
    /// A notifier for the file `file`.
    pub(crate) fn new(file: FileHandle) -> Notifier {
        Notifier { file, seq: AtomicU64::new(0), acked: AtomicU64::new(0) }
    }

    /// NOTIFY: mark readable and wake waiters (any context, NMI included).
    pub(crate) fn notify(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        self.file.notify();
    }

    /// Whether a notification is not yet acknowledged.
    pub(crate) fn pending(&self) -> bool {
        self.seq.load(Ordering::Acquire) != self.acked.load(Ordering::Relaxed)
    }

    /// The reader consumed: acknowledge notifications so far.
    pub(crate) fn ack(&self) {
        self.acked.store(self.seq.load(Ordering::Acquire), Ordering::Relaxed);
    }
}

/// One monitored CPU of a session.
///
/// # Invariants
///
/// `state`, `pebs` and the producer side of `buf` are only accessed on CPU `cpu` while `busy`
/// is held, or from process context once no counter, thread or cross call can run (at
/// creation and teardown, with `&mut self`). `notifier` outlives the slot.
pub(crate) struct CpuSlot {
    cpu: u32,
    busy: AtomicBool,
    state: UnsafeCell<CpuSession>,
    /// A `FMT_FL_PEBS` format: this CPU's PMU state (guarded like `state`).
    pebs: UnsafeCell<Option<PebsCpu>>,
    buf: VmBuffer,
    counters: KVec<PerfCounter>,
    notifier: NonNull<Notifier>,
    /// The format has `FMT_FL_STACKS`: overflows get the stack services.
    stacks: bool,
    /// The format has `FMT_FL_PEBS` (on the simulated PMU, overflows run the assist).
    pebs_format: bool,
    ticks: AtomicU64,
    busy_skips: AtomicU64,
}

// SAFETY: `state` and `pebs` are guarded by `busy` (type invariant); everything else is atomic,
// immutable after creation, or Sync itself.
unsafe impl Sync for CpuSlot {}
// SAFETY: as above; nothing in a slot is tied to the creating thread.
unsafe impl Send for CpuSlot {}

impl CpuSlot {
    /// Runs `f` with this CPU's engine state and buffer, unless another context holds
    /// them (then `None`). Must run on CPU `self.cpu` (overflow callback, cross call).
    fn try_with<R>(
        &self,
        f: impl FnOnce(&mut CpuSession, &mut Buffer<'_>, &mut Option<PebsCpu>) -> R,
    ) -> Option<R> {
        if self.busy.swap(true, Ordering::Acquire) {
            return None;
        }
        // SAFETY: the buffer is a live vmalloc area of `len` bytes owned by the slot;
        // as producer we hold `busy`, the only consumer is CONSUME (header atomics).
        let buf = unsafe { Buffer::from_raw(self.buf.ptr(), self.buf.len()) };
        let r = match buf {
            Ok(mut buf) => {
                // SAFETY: `busy` is held: exclusive access (type invariant).
                let (state, pebs) = unsafe { (&mut *self.state.get(), &mut *self.pebs.get()) };
                Some(f(state, &mut buf, pebs))
            }
            Err(_) => None,
        };
        self.busy.store(false, Ordering::Release);
        r
    }

    /// [`try_with`](Self::try_with) on CPU `self.cpu` from process context, retried
    /// while an overflow handler holds the slot.
    fn run_on<R: Send>(
        &self,
        f: impl Fn(&mut CpuSession, &mut Buffer<'_>, &mut Option<PebsCpu>) -> R + Sync,
    ) -> Result<R> {
        for _ in 0..BUSY_RETRIES {
            let mut out = None;
            shim::on_cpu(self.cpu, &mut || out = self.try_with(&f))?;
            if let Some(r) = out {
                return Ok(r);
            }
        }
        Err(EBUSY)
    }

    /// STOP on this CPU: PEBS off and perf's DS area back (withdrawn from the NMI path
    /// first), then the engine stops (flushing its LOST record).
    fn stop_cpu(
        &self,
        cs: &mut CpuSession,
        buf: &mut Buffer<'_>,
        pebs: &mut Option<PebsCpu>,
    ) -> core::result::Result<(), crate::engine::EngineError> {
        if let Some(pc) = pebs.as_mut() {
            // SAFETY: on this CPU with IRQs off (cross call).
            unsafe { pebs_pmu::publish(self.cpu, None) };
            pc.disarm(self.cpu);
        }
        cs.stop(buf)
    }

    /// Reads this CPU's counters (on this CPU).
    fn read_raw(&self) -> [u64; MAX_COUNTERS] {
        let mut raw = [0u64; MAX_COUNTERS];
        for (r, c) in raw.iter_mut().zip(self.counters.iter()) {
            *r = c.read_local();
        }
        raw
    }

    fn notifier(&self) -> &Notifier {
        // SAFETY: the notifier outlives the slot (type invariant).
        unsafe { self.notifier.as_ref() }
    }

    /// Acts on the control bits of a dispatch: NOTIFY and SWITCH wake the reader.
    fn act(&self, ctrl: Option<u32>) {
        match ctrl {
            // CTRL_RESET needs nothing: perf re-arms its own sampling period, and its
            // counts are 64-bit, so the engine's raw values never jump.
            // CTRL_SWITCH (an interval was published) wakes the reader like NOTIFY.
            Some(ctrl) if ctrl & CTRL_WAKE != 0 => self.notifier().notify(),
            Some(_) => {}
            None => {
                self.busy_skips.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands one sample to the format; acts on NOTIFY. Runs on this CPU.
    fn dispatch(&self, sample: &Sample, services: &Services) {
        self.act(self.try_with(|cs, buf, _| cs.dispatch(buf, sample, services)));
    }

    /// The sample of an overflow (or PEBS PMI) on this CPU.
    fn overflow_sample(&self, o: &shim::OverflowInfo) -> Sample {
        Sample {
            cpu: self.cpu,
            kind: SAMPLE_OVERFLOW,
            pid: o.pid,
            tid: o.tid,
            time_ns: o.time_ns,
            ip: o.ip,
            kernel_ip: o.kernel != 0,
            addr: 0,
            ovfl_counter: 0,
            nr: self.counters.len() as u32,
            raw: self.read_raw(),
        }
    }

    /// The overflow callback of this CPU's leader counter (NMI/IRQ context). On the
    /// simulated PEBS PMU it is the PEBS counter's overflow: the assist, and the PMI
    /// when the threshold is reached.
    pub(crate) fn on_overflow(&self, o: &shim::OverflowInfo) {
        let sample = self.overflow_sample(o);
        if self.pebs_format {
            let r = self.try_with(|cs, buf, pebs| {
                let masked = cs.is_masked();
                let pc = pebs.as_mut()?;
                pc.sim_overflow(o, self.cpu, buf, masked, |b| cs.dispatch(b, &sample, &Services::NONE))
            });
            self.act_pmi(r);
            return;
        }
        // The table points into `o`, which lives until this call returns.
        let services = if self.stacks { o.services() } else { Services::NONE };
        self.dispatch(&sample, &services);
    }

    /// Acts on what a PEBS PMI was; returns whether it was this CPU's.
    fn act_pmi(&self, r: Option<Option<Pmi>>) -> bool {
        match r {
            Some(Some(Pmi::Handled(ctrl))) => {
                self.act(Some(ctrl));
                true
            }
            // PEBS stopped on this CPU: the reader learns it from INFO; wake it.
            Some(Some(Pmi::Conflict)) => {
                self.notifier().notify();
                true
            }
            Some(Some(Pmi::NotOurs)) | Some(None) => false,
            None => {
                self.busy_skips.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// An NMI on this CPU while its PEBS is armed (hardware sessions): the threshold
    /// PMI, if its status bits or DS index say so. A context holding the slot (a cross
    /// call this NMI interrupted) leaves it for the next NMI or the RESTART.
    pub(crate) fn on_pebs_pmi(&self, o: &shim::OverflowInfo) -> bool {
        let sample = self.overflow_sample(o);
        let r = self.try_with(|cs, buf, pebs| {
            let masked = cs.is_masked();
            let pc = pebs.as_mut()?;
            Some(pc.pmi(self.cpu, buf, masked, |b| cs.dispatch(b, &sample, &Services::NONE)))
        });
        self.act_pmi(r)
    }

    /// A poll or instructed read on this CPU: its own counters, its own clock.
    fn tick(&self, kind: u32) {
        let time_ns = shim::clock_ns();
        let sample = Sample {
            cpu: self.cpu,
            kind,
            time_ns,
            ovfl_counter: u32::MAX,
            nr: self.counters.len() as u32,
            raw: self.read_raw(),
            ..Sample::default()
        };
        self.dispatch(&sample, &Services::NONE);
        self.ticks.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the poll thread and the cross calls share with process context: immutable
/// after creation except through atomics and the slots' `busy` protocol.
pub(crate) struct Shared {
    /// Never pushed to beyond its capacity: slots do not move (counters point at them).
    slots: KVec<CpuSlot>,
    /// Slot index of each CPU, `u16::MAX` if not monitored.
    index: [u16; MAX_CPUS],
    mask: CpuMask,
    interval_ns: u64,
    missed: AtomicU64,
    thread_ticks: AtomicU64,
}

impl Shared {
    fn slot(&self, cpu: u32) -> Option<&CpuSlot> {
        let i = *self.index.get(cpu as usize)?;
        self.slots.get(i as usize)
    }

    /// One read on every monitored CPU, each on itself (cross call, waits).
    fn tick_all(&self, kind: u32) {
        shim::on_cpus(&self.mask, &|| {
            if let Some(slot) = self.slot(shim::this_cpu()) {
                slot.tick(kind);
            }
        });
    }
}

impl ThreadBody for Shared {
    /// The poll thread: drift-free deadlines on `local_clock()`, one cross call per tick.
    fn run(&self) {
        let mut sched = crate::engine::PollSchedule::new(self.interval_ns, shim::clock_ns());
        while !shim::should_stop() {
            let now = shim::clock_ns();
            let wait = sched.ns_until(now);
            if wait > 0 {
                shim::sleep_ns(wait);
                continue;
            }
            let t = sched.due(now);
            self.missed.fetch_add(t.missed, Ordering::Relaxed);
            self.thread_ticks.fetch_add(1, Ordering::Relaxed);
            self.tick_all(SAMPLE_POLL);
        }
    }
}

/// The validated `HRPERF_IOC_CREATE` request.
pub(crate) struct CreateRequest<'a> {
    /// The format, pinned by the caller.
    pub(crate) format: Format,
    /// `MODE_*`, resolved.
    pub(crate) mode: u32,
    /// The events, leader first (1..=8, checked with [`check_event`]).
    pub(crate) events: &'a [EventDesc],
    /// Overflow period (overflow mode), else 0.
    pub(crate) sample_period: u64,
    /// Poll interval (poll mode), else 0.
    pub(crate) poll_interval_ns: u64,
    /// Monitored CPUs (online, non-empty).
    pub(crate) cpus: CpuMask,
    /// Data-size hint for the format.
    pub(crate) data_size: u64,
    /// The format's argument bytes.
    pub(crate) arg: &'a [u8],
}

/// Checks one event description against what perf kernel counters can do.
pub(crate) fn check_event(ev: &EventDesc) -> Result {
    let known_type = matches!(
        ev.kind,
        EVENT_TYPE_HARDWARE | EVENT_TYPE_SOFTWARE | EVENT_TYPE_HW_CACHE | EVENT_TYPE_RAW
    );
    let known_flags = EVENT_FL_USER_ONLY | EVENT_FL_KERNEL_ONLY | EVENT_FL_PRECISE | (3 << 8);
    let both = EVENT_FL_USER_ONLY | EVENT_FL_KERNEL_ONLY;
    if !known_type || ev.flags & !known_flags != 0 || ev.flags & both == both {
        return Err(EINVAL);
    }
    Ok(())
}

/// A format pinned for a session: registry use count and module reference, both given
/// back on drop (the module reference last).
struct FormatPin {
    format: Format,
    _module: ModuleRef,
}

impl Drop for FormatPin {
    fn drop(&mut self) {
        if let Ok(g) = crate::globals() {
            let _ = g.registry.lock().release(self.format);
        }
    }
}

/// A created session.
///
/// # Invariants
///
/// While `thread` is `Some`, the poll thread reads `shared`; while counters exist they
/// may call into `shared.slots`; both are stopped before `shared` changes or is freed.
pub(crate) struct ActiveSession {
    thread: Option<Thread>,
    /// A `FMT_FL_PEBS` format: how each CPU's PEBS is programmed.
    pebs: Option<SessionPebs>,
    /// Hardware PEBS: a disabled perf hardware counter, so perf keeps the PMU reserved
    /// (its DS area pointers stay as saved) and its NMI handler active (it unmasks the
    /// APIC's PMI vector). Dropped after the slots are disarmed.
    _pmu_hold: Option<PerfCounter>,
    shared: KBox<Shared>,
    session: Session,
    mode: u32,
    running: bool,
    buf_size: usize,
    pin: FormatPin,
}

impl ActiveSession {
    /// Creates the session: buffers (format `init` per CPU), then disabled counters.
    /// Takes over `req.format` (acquired from the registry) and `module` (its owner, pinned).
    pub(crate) fn create(
        req: &CreateRequest<'_>,
        module: ModuleRef,
        notifier: &Notifier,
    ) -> Result<KBox<ActiveSession>> {
        let pin = FormatPin { format: req.format, _module: module };
        let mut arg = KVec::with_capacity(req.arg.len(), GFP_KERNEL)?;
        arg.extend_from_slice(req.arg, GFP_KERNEL)?;
        // Before `validate`: the PMU fields come from the kernel, not the user.
        let pebs = if req.format.flags() & FMT_FL_PEBS != 0 {
            Some(crate::globals()?.pebs.prepare(req.events, req.sample_period, &mut arg)?)
        } else {
            None
        };
        let hardware_pebs = pebs.is_some_and(|p| p.hardware());
        let arg: &[u8] = &arg;
        let nr = req.events.len();
        let params = SessionParams {
            size: core::mem::size_of::<SessionParams>() as u32,
            mode: req.mode,
            nr_counters: nr as u32,
            cpu: u32::MAX,
            sample_period: req.sample_period,
            poll_interval_ns: req.poll_interval_ns,
            data_size_hint: req.data_size,
            flags: 0,
            reserved: 0,
        };
        // perf kernel counters are 64-bit: nothing to virtualise, no wrap to detect.
        let counters = [CounterConfig { width: 64, max_rate_per_sec: 0 }; MAX_COUNTERS];
        let counters = counters.get(..nr).ok_or(EINVAL)?;
        let session = Session::new(req.format, &params, arg, counters).map_err(engine_err)?;
        let size = session.buffer_size();
        if size > MAX_BUF_SIZE {
            return Err(ENOMEM);
        }
        let buf_size = (size as usize).next_multiple_of(PAGE_SIZE);
        let total = (buf_size as u64).checked_mul(req.cpus.count() as u64).ok_or(ENOMEM)?;
        if total > MAX_TOTAL_SIZE {
            return Err(ENOMEM);
        }

        let shared = KBox::new(
            Shared {
                slots: KVec::with_capacity(req.cpus.count() as usize, GFP_KERNEL)?,
                index: [u16::MAX; MAX_CPUS],
                mask: req.cpus,
                interval_ns: req.poll_interval_ns,
                missed: AtomicU64::new(0),
                thread_ticks: AtomicU64::new(0),
            },
            GFP_KERNEL,
        )?;
        let mut s = KBox::new(
            ActiveSession {
                thread: None,
                pebs,
                _pmu_hold: None,
                shared,
                session,
                mode: req.mode,
                running: false,
                buf_size,
                pin,
            },
            GFP_KERNEL,
        )?;
        // From here on, `s`'s drop undoes whatever was set up.
        for cpu in req.cpus.iter() {
            let buf = VmBuffer::new(buf_size)?;
            // SAFETY: a fresh buffer of `len` bytes, not shared with anyone yet.
            let mut b = unsafe { Buffer::from_raw(buf.ptr(), buf.len()) }.map_err(engine_err)?;
            let cs = s.session.init_cpu(cpu, &mut b, arg).map_err(engine_err)?;
            let slot = CpuSlot {
                cpu,
                busy: AtomicBool::new(false),
                state: UnsafeCell::new(cs),
                pebs: UnsafeCell::new(pebs.map(|p| p.cpu_state(cpu))),
                pebs_format: pebs.is_some(),
                buf,
                counters: KVec::new(),
                notifier: NonNull::from(notifier),
                stacks: req.format.flags() & FMT_FL_STACKS != 0,
                ticks: AtomicU64::new(0),
                busy_skips: AtomicU64::new(0),
            };
            let idx = s.shared.slots.len() as u16;
            // Capacity was reserved for every CPU: this push does not allocate (so it
            // cannot fail), and the slots never move afterwards.
            s.shared.slots.push(slot, GFP_KERNEL)?;
            if let Some(i) = s.shared.index.get_mut(cpu as usize) {
                *i = idx;
            }
        }
        if hardware_pebs {
            // The CPU's PEBS counter is programmed directly; perf only holds the PMU.
            let cycles = EventDesc { kind: EVENT_TYPE_HARDWARE, flags: 0, config: 0, config1: 0, config2: 0 };
            let first = s.shared.slots.first().map_or(0, |slot| slot.cpu);
            // SAFETY: a counting-only counter (no period): no overflow calls, no context.
            s._pmu_hold = Some(unsafe { PerfCounter::create(first, &cycles, 0, core::ptr::null()) }?);
        } else {
            for slot in s.shared.slots.iter_mut() {
                slot.counters.reserve(nr, GFP_KERNEL)?;
                let ctx: *const CpuSlot = &*slot;
                for (i, ev) in req.events.iter().enumerate() {
                    let period = if i == 0 && req.mode == MODE_OVERFLOW { req.sample_period } else { 0 };
                    // SAFETY: the slot is boxed (stable address) and outlives its counters:
                    // teardown releases them before the slots are freed.
                    let c = unsafe { PerfCounter::create(slot.cpu, ev, period, ctx.cast::<c_void>()) }?;
                    slot.counters.push(c, GFP_KERNEL)?;
                }
            }
        }
        if let Some(p) = pebs {
            // Each CPU: a counter perf leaves free, or the reason it cannot have one.
            for slot in s.shared.slots.iter() {
                let claimed = slot.run_on(|_, buf, pc| match pc.as_mut() {
                    Some(pc) => p.claim(pc, buf),
                    None => Ok(()),
                })?;
                if let Err(r) = claimed {
                    return Err(crate::globals()?.pebs.refuse(r, slot.cpu));
                }
            }
        }
        Ok(s)
    }

    /// START: baseline each CPU's counters, enable them, start the poll thread.
    pub(crate) fn start(&mut self) -> Result {
        if self.running {
            return Err(EINVAL);
        }
        // Hardware PEBS interrupts come as NMIs, routed to the slot armed on the CPU.
        let nmi = self.pebs.is_some_and(|p| p.hardware());
        for (n, slot) in self.shared.slots.iter().enumerate() {
            let r = slot.run_on(|cs, buf, pebs| {
                cs.start(buf, &slot.read_raw(), shim::clock_ns()).map_err(engine_err)?;
                let Some(pc) = pebs.as_mut() else { return Ok(()) };
                if let Err(r) = pc.arm(slot.cpu) {
                    let _ = cs.stop(buf);
                    return Err(Error::from_errno(-r.errno()));
                }
                if cs.is_masked() {
                    pc.mask();
                }
                if nmi {
                    // SAFETY: on this CPU with IRQs off; withdrawn in `stop` (and before
                    // the slot is freed: a dropped running session is stopped first).
                    unsafe { pebs_pmu::publish(slot.cpu, Some(slot)) };
                }
                Ok(())
            });
            if let Err(e) = r.and_then(|r| r) {
                for s in self.shared.slots.iter().take(n) {
                    let _ = s.run_on(|cs, buf, pebs| s.stop_cpu(cs, buf, pebs));
                }
                return Err(e);
            }
        }
        for slot in self.shared.slots.iter() {
            for c in slot.counters.iter() {
                c.enable();
            }
        }
        self.running = true;
        if self.mode == MODE_POLL {
            // SAFETY: `shared` is boxed and outlives the thread (stopped in `stop`
            // and in `drop` before `shared` is freed); `run` returns only on stop.
            match unsafe { Thread::start(&*self.shared) } {
                Ok(t) => self.thread = Some(t),
                Err(e) => {
                    let _ = self.stop();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// STOP: stop the thread, disable the counters, stop each CPU (flushing its LOST
    /// record), and wake the reader.
    pub(crate) fn stop(&mut self) -> Result {
        if !self.running {
            return Err(EINVAL);
        }
        self.thread = None;
        for slot in self.shared.slots.iter() {
            for c in slot.counters.iter() {
                c.disable();
            }
        }
        let mut res = Ok(());
        for slot in self.shared.slots.iter() {
            if let Err(e) =
                slot.run_on(|cs, buf, pebs| slot.stop_cpu(cs, buf, pebs)).and_then(|r| r.map_err(engine_err))
            {
                res = Err(e);
            }
        }
        self.running = false;
        if let Some(slot) = self.shared.slots.first() {
            slot.notifier().notify();
        }
        res
    }

    fn slots_for(&self, cpu: u32) -> Result<impl Iterator<Item = &CpuSlot>> {
        if cpu != u32::MAX && self.shared.slot(cpu).is_none() {
            return Err(EINVAL);
        }
        Ok(self.shared.slots.iter().filter(move |s| cpu == u32::MAX || s.cpu == cpu))
    }

    /// RESTART after NOTIFY/MASK on `cpu` (`u32::MAX`: all). For a `FMT_FL_INTERVALS`
    /// format this switches intervals (the format's `restart`; `EBUSY` while the
    /// published interval is not acknowledged).
    pub(crate) fn restart(&mut self, cpu: u32) -> Result {
        let pebs = self.pebs.is_some();
        for slot in self.slots_for(cpu)? {
            let ctrl = slot
                .run_on(|cs, buf, pc| {
                    // A PEBS CPU still counting has records being written: resetting its
                    // index would lose them. Restart follows the threshold's MASK.
                    if pebs && !cs.is_masked() {
                        return Err(EINVAL);
                    }
                    let ctrl = cs.restart(buf).map_err(engine_err)?;
                    if let Some(pc) = pc.as_mut() {
                        slot.act_pmi(Some(Some(pc.restart(slot.cpu))));
                    }
                    Ok(ctrl)
                })
                .and_then(|r| r)?;
            if ctrl & CTRL_WAKE != 0 {
                slot.notifier().notify();
            } else if pebs {
                // For PEBS the reader's answer to NOTIFY is RESTART (nothing to CONSUME).
                // A notification of another CPU in between is lost only until the
                // reader's next timed drain; that CPU stays masked, nothing is lost.
                slot.notifier().ack();
            }
        }
        Ok(())
    }

    /// Instructed mode: read every CPU now (POLL).
    pub(crate) fn instructed_poll(&self) -> Result {
        if self.mode != MODE_INSTRUCTED || !self.running {
            return Err(EINVAL);
        }
        self.shared.tick_all(SAMPLE_INSTRUCTED);
        Ok(())
    }

    /// Instructed mode: publish to the reader (LOG): records are already visible in the
    /// rings, so this is a NOTIFY.
    pub(crate) fn instructed_log(&self) -> Result {
        if self.mode != MODE_INSTRUCTED || !self.running {
            return Err(EINVAL);
        }
        if let Some(slot) = self.shared.slots.first() {
            slot.notifier().notify();
        }
        Ok(())
    }

    /// Number of CPUs (buffers).
    pub(crate) fn nr_cpus(&self) -> usize {
        self.shared.slots.len()
    }

    /// Bytes of each CPU's buffer (page multiple).
    pub(crate) fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Statistics of the `i`-th CPU (read on that CPU).
    pub(crate) fn stats(&self, i: usize) -> Result<CpuStats> {
        let slot = self.shared.slots.get(i).ok_or(EINVAL)?;
        let mut st = slot.run_on(|cs, buf, _| cs.stats(buf))?;
        st.masked = st.masked.wrapping_add(slot.busy_skips.load(Ordering::Relaxed));
        if self.mode != MODE_OVERFLOW {
            st.poll_ticks = slot.ticks.load(Ordering::Relaxed);
            st.missed_ticks = self.shared.missed.load(Ordering::Relaxed);
        }
        Ok(st)
    }

    /// Where the `i`-th CPU's buffer lies in the mapping.
    pub(crate) fn buffer_slot(&self, i: usize) -> Result<BufferSlot> {
        let slot = self.shared.slots.get(i).ok_or(EINVAL)?;
        Ok(BufferSlot { cpu: slot.cpu, reserved: 0, offset: (i * self.buf_size) as u64 })
    }

    /// CONSUME: the reader read `cpu`'s ring up to `tail`; for a `FMT_FL_INTERVALS`
    /// format, the reader finished reading interval `tail` (its sequence number).
    pub(crate) fn consume(&self, cpu: u32, tail: u64) -> Result {
        let slot = self.shared.slot(cpu).ok_or(EINVAL)?;
        if self.pin.format.flags() & FMT_FL_INTERVALS != 0 {
            // SAFETY: the slot's live buffer of `len` bytes (8-aligned vmalloc memory);
            // the only concurrent writer is its producer (the format's handler/restart),
            // and the view only stores the consumer line (`U_ACK`), atomically.
            let view =
                unsafe { AggView::from_raw(slot.buf.ptr(), slot.buf.len(), Access::ReadWrite) }
                    .map_err(view_err)?;
            view.ack_seq(tail).map_err(view_err)?;
            slot.notifier().ack();
            return Ok(());
        }
        // SAFETY: the slot's live buffer; used as the (single, ioctl-serialised)
        // consumer only: header atomics through `RingReader`.
        let b = unsafe { Buffer::from_raw(slot.buf.ptr(), slot.buf.len()) }.map_err(engine_err)?;
        RingReader::new(&b).and_then(|r| r.consume(tail)).map_err(engine_err)?;
        slot.notifier().ack();
        Ok(())
    }

    /// Maps `[pgoff * PAGE_SIZE, + len)` of the buffers (laid end to end) at `start`.
    pub(crate) fn mmap(&self, vma: &Vma<'_>, start: usize, len: usize, pgoff: usize) -> Result {
        let total = self.buf_size.checked_mul(self.nr_cpus()).ok_or(EINVAL)?;
        let off = pgoff.checked_mul(PAGE_SIZE).ok_or(EINVAL)?;
        let end = off.checked_add(len).ok_or(EINVAL)?;
        if len == 0 || end > total {
            return Err(EINVAL);
        }
        let mut pos = off;
        while pos < end {
            let i = pos / self.buf_size;
            let in_buf = pos % self.buf_size;
            let n = (self.buf_size - in_buf).min(end - pos);
            let slot = self.shared.slots.get(i).ok_or(EINVAL)?;
            vma.map(start + (pos - off), &slot.buf, in_buf, n)?;
            pos += n;
        }
        Ok(())
    }

    /// Drops counted over all CPUs (for the module-wide total).
    fn drops(&self) -> u64 {
        self.shared
            .slots
            .iter()
            .map(|s| {
                // SAFETY: the live buffer; header atomics only (consumer-side read).
                let b = unsafe { Buffer::from_raw(s.buf.ptr(), s.buf.len()) };
                b.map(|b| b.header().drops).unwrap_or(0)
            })
            .fold(0u64, u64::wrapping_add)
    }
}

impl Drop for ActiveSession {
    fn drop(&mut self) {
        if self.running {
            let _ = self.stop();
        }
        // INVARIANT: no thread (stopped) and no counters (released here) use `shared`.
        self.thread = None;
        for slot in self.shared.slots.iter_mut() {
            drop(core::mem::replace(&mut slot.counters, KVec::new()));
        }
        if let Ok(g) = crate::globals() {
            g.total_drops.fetch_add(self.drops(), Ordering::Relaxed);
        }
        for slot in self.shared.slots.iter_mut() {
            // SAFETY: the live buffer, ours alone now (nothing else runs, see above).
            if let Ok(mut b) = unsafe { Buffer::from_raw(slot.buf.ptr(), slot.buf.len()) } {
                let _ = slot.state.get_mut().exit(&mut b);
            }
            if let Some(pc) = slot.pebs.get_mut() {
                pc.disarm(slot.cpu);
            }
        }
        // Fields drop next: buffers (`shared`), then `pin` (registry, then module put).
    }
}
