//! Sessions: the format lifecycle and per-CPU overflow dispatch (perfmon2's
//! `pfm_setup_smpl_fmt` and `pfm_overflow_handler`).
//!
//! ```text
//! Session::new          validate → getsize            (once per session)
//!   caller allocates buffer_size() bytes per CPU
//! Session::init_cpu     header filled → init          → CpuSession (Initialized)
//! CpuSession::start     start; counters baselined     → Running
//! CpuSession::dispatch  virtualise → handler → CTRL_*  (per overflow / poll tick)
//! CpuSession::restart   restart; unmask               (after NOTIFY / MASK)
//! CpuSession::stop      stop                          → Stopped (start resumes)
//! CpuSession::exit      exit                          → Exited
//! ```
//!
//! A [`CpuSession`] does not own its buffer: every call takes the same CPU's [`Buffer`],
//! so the kernel can wrap its `vmalloc` area per call and userspace a `Vec<u64>`.
//! All state errors are returned, never panicked on.

use hrperf_abi::format::{
    OverflowArg, Services, SessionParams, CTRL_MASK, CTRL_NOTIFY, FMT_FL_RING, MODE_INSTRUCTED,
    MODE_OVERFLOW, MODE_POLL, OVFL_FL_KERNEL_IP,
};
use hrperf_abi::ioctl::CpuStats;
use hrperf_abi::{BufferHeader, MAX_COUNTERS, MAX_CPUS};

use super::counter::VirtualCounter;
use super::error::EngineError;
use super::format::{Format, MAX_ARG_SIZE};
use super::poll::{PollSchedule, Tick};
use super::ring::{
    Buffer, RingWriter, MIN_BUFFER_SIZE, OFF_MASKED, OFF_MULTI_WRAPS, OFF_NOTIFY_SEQ, OFF_OVERFLOWS,
};

/// One overflow, poll reading or instructed reading, as a source reports it (before
/// virtualisation). Userspace re-exports it as `RawSample`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// CPU it was taken on.
    pub cpu: u32,
    /// `hrperf_abi::format::SAMPLE_*`.
    pub kind: u32,
    /// Process id (tgid), 0 if unknown.
    pub pid: u32,
    /// Thread id, 0 if unknown.
    pub tid: u32,
    /// When, in the source's clock (ns).
    pub time_ns: u64,
    /// Interrupted IP (overflow samples), else 0.
    pub ip: u64,
    /// Whether `ip` is in the kernel.
    pub kernel_ip: bool,
    /// Data address if known, else 0.
    pub addr: u64,
    /// Index of the overflowed counter; `u32::MAX` for poll/instructed.
    pub ovfl_counter: u32,
    /// Valid entries in `raw`.
    pub nr: u32,
    /// Raw counter readings, each as wide as its counter's `CounterConfig::width`.
    pub raw: [u64; MAX_COUNTERS],
}

/// How one counter of a session behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterConfig {
    /// Width of the raw reading in bits, 32..=64.
    pub width: u32,
    /// Upper bound on events per second, for multi-wrap detection; 0 if unknown.
    pub max_rate_per_sec: u64,
}

/// A validated session: its format, parameters and per-CPU buffer size.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    format: Format,
    params: SessionParams,
    counters: [CounterConfig; MAX_COUNTERS],
    buf_size: u64,
}

impl Session {
    /// Checks `params` and `counters` (one per `params.nr_counters`), then calls the
    /// format's `validate` and `getsize` with `arg`, the format's argument bytes.
    ///
    /// `arg` may be longer than the format's `arg_size` only with a zero tail
    /// ([`EngineError::TooBig`] otherwise, and above 4096 bytes).
    pub fn new(
        format: Format,
        params: &SessionParams,
        arg: &[u8],
        counters: &[CounterConfig],
    ) -> Result<Session, EngineError> {
        let invalid = |what| Err(EngineError::Invalid { what });
        if (params.size as usize) < core::mem::size_of::<SessionParams>() {
            return invalid("session parameters are too short");
        }
        if params.flags != 0 || params.reserved != 0 {
            return invalid("session flags/reserved must be zero");
        }
        match params.mode {
            MODE_OVERFLOW if params.sample_period == 0 => {
                return invalid("overflow mode needs a sample period")
            }
            MODE_POLL if params.poll_interval_ns == 0 => {
                return invalid("poll mode needs a poll interval")
            }
            MODE_OVERFLOW | MODE_POLL | MODE_INSTRUCTED => {}
            _ => return invalid("unknown session mode"),
        }
        let nr = params.nr_counters as usize;
        if nr == 0 || nr > MAX_COUNTERS {
            return invalid("a session has 1..=8 counters");
        }
        if counters.len() != nr {
            return invalid("one counter config per counter is needed");
        }
        let mut cfg = [CounterConfig::default(); MAX_COUNTERS];
        for (c, given) in cfg.iter_mut().zip(counters) {
            VirtualCounter::new(given.width, given.max_rate_per_sec)?;
            *c = *given;
        }
        check_arg(format, arg)?;

        let mut p = *params;
        p.cpu = u32::MAX;
        format.validate(&p, arg)?;
        let size = format.getsize(&p, arg)?.max(MIN_BUFFER_SIZE as u64);
        Ok(Session {
            format,
            params: p,
            counters: cfg,
            buf_size: size,
        })
    }

    /// The format (give it back with `Registry::release` when the session ends).
    pub fn format(&self) -> Format {
        self.format
    }

    /// The parameters (`cpu` is `u32::MAX`).
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// The counters' configuration.
    pub fn counters(&self) -> &[CounterConfig] {
        self.counters
            .get(..self.params.nr_counters as usize)
            .unwrap_or(&[])
    }

    /// Bytes each CPU's buffer needs (from `getsize`, at least `MIN_BUFFER_SIZE`). The
    /// buffer must be 8-byte aligned; the kernel rounds it up to pages.
    pub fn buffer_size(&self) -> u64 {
        self.buf_size
    }

    /// Fills `buf`'s header for `cpu` and calls the format's `init` with `arg` (the bytes
    /// given to [`new`](Self::new)).
    pub fn init_cpu(
        &self,
        cpu: u32,
        buf: &mut Buffer<'_>,
        arg: &[u8],
    ) -> Result<CpuSession, EngineError> {
        if cpu as usize >= MAX_CPUS {
            return Err(EngineError::Invalid {
                what: "CPU number out of range",
            });
        }
        if (buf.len() as u64) < self.buf_size {
            return Err(EngineError::Invalid {
                what: "buffer is smaller than getsize",
            });
        }
        check_arg(self.format, arg)?;
        let mut counters = [VirtualCounter::new(64, 0)?; MAX_COUNTERS];
        for (c, cfg) in counters.iter_mut().zip(self.counters()) {
            *c = VirtualCounter::new(cfg.width, cfg.max_rate_per_sec)?;
        }

        buf.init_header(cpu, self.format.uuid());
        let mut p = self.params;
        p.cpu = cpu;
        self.format.init(buf, &p, arg)?;
        let h = buf.header();
        let end = h.data_offset.checked_add(h.data_size);
        let inside = h.data_offset >= BufferHeader::SIZE as u64
            && end.is_some_and(|e| e <= buf.len() as u64);
        if h.data_size != 0 && !inside {
            return Err(EngineError::Invalid {
                what: "format laid its data area outside the buffer",
            });
        }

        Ok(CpuSession {
            format: self.format,
            cpu,
            nr: self.params.nr_counters,
            poll_interval: self.params.poll_interval_ns,
            counters,
            last_reset: [0; MAX_COUNTERS],
            pending_multi_wrap: 0,
            state: CpuState::Initialized,
            started_once: false,
            masked: false,
            notify_seq: 0,
            last_time: 0,
            poll: PollSchedule::new(self.params.poll_interval_ns, 0),
        })
    }
}

/// The ABI's rules for the format argument: at most 4096 bytes, and nothing but zeros
/// beyond what the format declared it accepts.
fn check_arg(format: Format, arg: &[u8]) -> Result<(), EngineError> {
    let too_big = Err(EngineError::TooBig {
        what: "format argument",
    });
    if arg.len() > MAX_ARG_SIZE {
        return too_big;
    }
    let tail = arg.get(format.arg_size() as usize..).unwrap_or(&[]);
    if tail.iter().any(|&b| b != 0) {
        return too_big;
    }
    Ok(())
}

/// Where a CPU session is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuState {
    /// `init` ran; not started yet.
    Initialized,
    /// Counting and dispatching.
    Running,
    /// Stopped; `start` resumes.
    Stopped,
    /// `exit` ran; nothing more is allowed.
    Exited,
}

impl CpuState {
    /// Lower-case name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            CpuState::Initialized => "initialized",
            CpuState::Running => "running",
            CpuState::Stopped => "stopped",
            CpuState::Exited => "exited",
        }
    }
}

/// One CPU of a session: its virtual counters, mask state and poll schedule.
#[derive(Clone, Copy, Debug)]
pub struct CpuSession {
    format: Format,
    cpu: u32,
    nr: u32,
    poll_interval: u64,
    counters: [VirtualCounter; MAX_COUNTERS],
    last_reset: [u64; MAX_COUNTERS],
    pending_multi_wrap: u32,
    state: CpuState,
    started_once: bool,
    masked: bool,
    notify_seq: u64,
    /// Time of the last reading of the counters (start or dispatch).
    last_time: u64,
    poll: PollSchedule,
}

impl CpuSession {
    /// The CPU.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// The lifecycle state.
    pub fn state(&self) -> CpuState {
        self.state
    }

    /// Whether the format masked this CPU (samples are counted, not dispatched).
    pub fn is_masked(&self) -> bool {
        self.masked
    }

    /// The last `notify_seq` this CPU published (0 before the first NOTIFY).
    pub fn notify_seq(&self) -> u64 {
        self.notify_seq
    }

    /// Counter `idx`'s virtualisation state.
    pub fn counter(&self, idx: usize) -> Option<&VirtualCounter> {
        self.counters.get(..self.nr as usize)?.get(idx)
    }

    /// The 64-bit values of all counters (0 beyond the session's counters).
    pub fn values(&self) -> [u64; MAX_COUNTERS] {
        let mut v = [0; MAX_COUNTERS];
        for (out, c) in v
            .iter_mut()
            .zip(self.counters.iter().take(self.nr as usize))
        {
            *out = c.value();
        }
        v
    }

    /// The poll schedule (meaningful in poll mode once started).
    pub fn poll_schedule(&self) -> &PollSchedule {
        &self.poll
    }

    /// Whether a poll tick is due at `now_ns` (poll mode).
    pub fn poll_due(&mut self, now_ns: u64) -> Tick {
        self.poll.due(now_ns)
    }

    fn state_err(&self, op: &'static str) -> EngineError {
        EngineError::State {
            op,
            state: self.state.name(),
        }
    }

    /// Starts (or resumes after [`stop`](Self::stop)) with the counters' raw readings
    /// `raw` at `time_ns`. The first start sets every 64-bit value to 0; a resume keeps
    /// the values and re-baselines, so events while stopped are not counted.
    pub fn start(
        &mut self,
        buf: &mut Buffer<'_>,
        raw: &[u64; MAX_COUNTERS],
        time_ns: u64,
    ) -> Result<(), EngineError> {
        if !matches!(self.state, CpuState::Initialized | CpuState::Stopped) {
            return Err(self.state_err("start"));
        }
        self.format.start(buf)?;
        for (c, &r) in self
            .counters
            .iter_mut()
            .zip(raw.iter())
            .take(self.nr as usize)
        {
            if self.started_once {
                c.resume(r, time_ns);
            } else {
                c.start(r, time_ns);
            }
        }
        self.last_time = time_ns;
        if self.started_once {
            self.poll.restart_at(time_ns);
        } else {
            self.poll = PollSchedule::new(self.poll_interval, time_ns);
        }
        self.started_once = true;
        self.state = CpuState::Running;
        Ok(())
    }

    /// Stops dispatching. For ring formats, drops not yet reported get their LOST
    /// record now if it fits, so the stream ends with the gap marked.
    pub fn stop(&mut self, buf: &mut Buffer<'_>) -> Result<(), EngineError> {
        if self.state != CpuState::Running {
            return Err(self.state_err("stop"));
        }
        self.state = CpuState::Stopped;
        self.format.stop(buf)?;
        if self.format.flags() & FMT_FL_RING != 0 {
            if let Ok(mut w) = RingWriter::new(buf) {
                w.flush_lost();
            }
        }
        Ok(())
    }

    /// Calls the format's `restart` (after a NOTIFY or MASK was handled) and unmasks
    /// this CPU. Returns the `CTRL_*` bits `restart` asked for.
    pub fn restart(&mut self, buf: &mut Buffer<'_>) -> Result<u32, EngineError> {
        if self.state == CpuState::Exited {
            return Err(self.state_err("restart"));
        }
        let ctrl = self.format.restart(buf)?;
        self.masked = ctrl & CTRL_MASK != 0;
        Ok(ctrl)
    }

    /// Stops if running, then calls the format's `exit`. The session is exited even if
    /// a callback fails (the error is returned); nothing is allowed afterwards.
    pub fn exit(&mut self, buf: &mut Buffer<'_>) -> Result<(), EngineError> {
        if self.state == CpuState::Exited {
            return Err(self.state_err("exit"));
        }
        let stopped = if self.state == CpuState::Running {
            self.stop(buf)
        } else {
            Ok(())
        };
        self.state = CpuState::Exited;
        let exited = self.format.exit(buf);
        stopped.and(exited)
    }

    /// Counter `idx` was written with `raw` (the re-arm after `CTRL_RESET`): the next
    /// delta starts from it, and it is reported as `OverflowArg::last_reset`.
    pub fn set_raw(&mut self, idx: usize, raw: u64) {
        if let (Some(c), Some(l)) = (self.counters.get_mut(idx), self.last_reset.get_mut(idx)) {
            c.set_raw(raw);
            *l = raw;
        }
    }

    /// Handles one sample on this CPU; returns the handler's `CTRL_*` bits for the caller
    /// to act on (`CTRL_RESET`: re-arm the counter and call [`set_raw`](Self::set_raw);
    /// `CTRL_NOTIFY`: wake the reader, `notify_seq` was bumped; `CTRL_SWITCH`: switch
    /// buffers; `CTRL_MASK`: this CPU is now masked until [`restart`](Self::restart)).
    ///
    /// The counters `raw[..nr_counters]` are virtualised first, even while masked, so no
    /// wrap is missed. While masked, the sample is counted in `BufferHeader::masked` and
    /// `CTRL_MASK` is returned; multi-wrap bits are carried to the next dispatched sample.
    /// A sample while not running (before start, after stop) is counted in `masked` too
    /// and returns 0. `buf` must be this CPU's buffer.
    #[inline]
    pub fn dispatch(&mut self, buf: &mut Buffer<'_>, sample: &Sample, services: &Services) -> u32 {
        if self.state != CpuState::Running {
            buf.bump(OFF_MASKED);
            return 0;
        }
        // Built in place: copying a values array in after the counter loop would reload
        // just-stored words in wider units, which store forwarding cannot serve.
        let mut arg = OverflowArg {
            size: core::mem::size_of::<OverflowArg>() as u32,
            kind: sample.kind,
            cpu: self.cpu,
            pid: sample.pid,
            tid: sample.tid,
            ovfl_counter: sample.ovfl_counter,
            nr_counters: self.nr,
            multi_wrap: 0,
            time_ns: sample.time_ns,
            ip: sample.ip,
            addr: sample.addr,
            last_reset: self
                .last_reset
                .get(sample.ovfl_counter as usize)
                .copied()
                .unwrap_or(0),
            values: [0; MAX_COUNTERS],
            flags: if sample.kernel_ip {
                OVFL_FL_KERNEL_IP
            } else {
                0
            },
            reserved: 0,
        };
        let mut multi_wrap = self.pending_multi_wrap;
        // All counters are read at once: one elapsed time for all (a clock going
        // backwards counts as none).
        let elapsed = sample.time_ns.saturating_sub(self.last_time);
        self.last_time = sample.time_ns;
        // Index loop bounded by MAX_COUNTERS: no bounds checks, fewer instructions than
        // the iterator chain on this path.
        for i in 0..(self.nr as usize).min(MAX_COUNTERS) {
            // Running implies started (`start` starts every counter).
            let u = self.counters[i].update_after(sample.raw[i], elapsed);
            arg.values[i] = u.value;
            multi_wrap |= (u.multi_wrap as u32) << i;
        }
        if self.masked {
            self.pending_multi_wrap = multi_wrap;
            buf.bump(OFF_MASKED);
            return CTRL_MASK;
        }
        self.pending_multi_wrap = 0;
        arg.multi_wrap = multi_wrap;
        buf.bump(OFF_OVERFLOWS);
        if multi_wrap != 0 {
            buf.bump(OFF_MULTI_WRAPS);
        }
        let ctrl = self.format.handler(buf, &arg, services);
        if ctrl & CTRL_MASK != 0 {
            self.masked = true;
        }
        if ctrl & CTRL_NOTIFY != 0 {
            self.notify_seq = buf.bump(OFF_NOTIFY_SEQ);
        }
        ctrl
    }

    /// This CPU's statistics, as `HRPERF_IOC_STATS` reports them.
    pub fn stats(&self, buf: &Buffer<'_>) -> CpuStats {
        let h = buf.header();
        CpuStats {
            cpu: self.cpu,
            masked_now: self.masked as u32,
            records: h.records,
            drops: h.drops,
            overflows: h.overflows,
            masked: h.masked,
            multi_wraps: h.multi_wraps,
            poll_ticks: self.poll.ticks(),
            missed_ticks: self.poll.missed(),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::boxed::Box;
    use std::vec;

    use hrperf_abi::buffer::BUFFER_MAGIC;
    use hrperf_abi::errno;
    use hrperf_abi::format::{
        FormatOps, Uuid, CTRL_ALL, CTRL_RESET, CTRL_SWITCH, FORMAT_ABI_VERSION, SAMPLE_OVERFLOW,
        SAMPLE_POLL,
    };

    use super::*;
    use crate::ring::PRIVATE_OFFSET;
    use crate::{Registry, Selector};

    /// The echo format keeps the last OverflowArg at PRIVATE_OFFSET, then a word with
    /// the ctrl bits the handler returns, a word the restart callback returns as ctrl,
    /// and counts of start/stop/exit calls.
    const ARG_AT: usize = PRIVATE_OFFSET;
    const CTRL_AT: usize = ARG_AT + core::mem::size_of::<OverflowArg>();
    const RESTART_CTRL_AT: usize = CTRL_AT + 8;
    const CALLS_AT: usize = RESTART_CTRL_AT + 8;
    const SIZE: u64 = (CALLS_AT + 24) as u64;

    unsafe fn word(buf: *mut u8, off: usize) -> *mut u64 {
        // SAFETY: the engine passes a buffer of at least SIZE bytes, 8-aligned.
        unsafe { buf.add(off).cast::<u64>() }
    }

    unsafe extern "C" fn validate(p: *const SessionParams, arg: *const u8, len: usize) -> i32 {
        // SAFETY: the engine passes valid pointers.
        let (p, arg) = unsafe { (&*p, core::slice::from_raw_parts(arg, len)) };
        if p.cpu != u32::MAX || arg.first() == Some(&0xee) {
            return -errno::EINVAL;
        }
        0
    }

    unsafe extern "C" fn getsize(
        _: *const SessionParams,
        _: *const u8,
        _: usize,
        s: *mut u64,
    ) -> i32 {
        // SAFETY: the engine passes a writable size.
        unsafe { *s = SIZE };
        0
    }

    unsafe extern "C" fn init(
        buf: *mut u8,
        len: usize,
        p: *const SessionParams,
        _: *const u8,
        _: usize,
    ) -> i32 {
        // SAFETY: valid pointers from the engine.
        let p = unsafe { &*p };
        if len < SIZE as usize || p.cpu == u32::MAX {
            return -errno::ENOMEM;
        }
        if p.cpu == 99 {
            // Lay the data area outside the buffer: the engine must refuse.
            // SAFETY: inside the header.
            unsafe { *word(buf, 40) = 1 << 40 };
            // SAFETY: inside the header.
            unsafe { *word(buf, 48) = 64 };
        }
        0
    }

    unsafe extern "C" fn handler(
        buf: *mut u8,
        _: usize,
        arg: *const OverflowArg,
        _: *const Services,
    ) -> u32 {
        // SAFETY: valid pointers from the engine; SIZE bytes of buffer.
        unsafe {
            buf.add(ARG_AT).cast::<OverflowArg>().write(*arg);
            *word(buf, CTRL_AT) as u32
        }
    }

    unsafe extern "C" fn restart(buf: *mut u8, _: usize, ctrl: *mut u32) -> i32 {
        // SAFETY: valid pointers from the engine.
        unsafe { *ctrl = *word(buf, RESTART_CTRL_AT) as u32 };
        0
    }

    unsafe extern "C" fn start(buf: *mut u8, _: usize) -> i32 {
        // SAFETY: SIZE bytes of buffer.
        unsafe { *word(buf, CALLS_AT) += 1 };
        0
    }

    unsafe extern "C" fn stop(buf: *mut u8, _: usize) -> i32 {
        // SAFETY: SIZE bytes of buffer.
        unsafe { *word(buf, CALLS_AT + 8) += 1 };
        0
    }

    unsafe extern "C" fn exit(buf: *mut u8, _: usize) -> i32 {
        // SAFETY: SIZE bytes of buffer.
        unsafe { *word(buf, CALLS_AT + 16) += 1 };
        -errno::EIO
    }

    fn echo_ops() -> &'static FormatOps {
        Box::leak(Box::new(FormatOps {
            size: core::mem::size_of::<FormatOps>() as u32,
            abi_version: FORMAT_ABI_VERSION,
            name: hrperf_abi::fixed_name("echo").unwrap(),
            uuid: Uuid([0xec; 16]),
            version: 0x1_0000,
            arg_size: 8,
            flags: 0,
            reserved: 0,
            owner: core::ptr::null_mut(),
            validate: Some(validate),
            getsize: Some(getsize),
            init: Some(init),
            handler: Some(handler),
            restart: Some(restart),
            exit: Some(exit),
            start: Some(start),
            stop: Some(stop),
        }))
    }

    fn format() -> Format {
        let mut r: Registry<1> = Registry::new();
        r.register_static(echo_ops()).unwrap();
        r.acquire(Selector::Name(b"echo")).unwrap()
    }

    fn params(mode: u32, nr: u32) -> SessionParams {
        SessionParams {
            size: core::mem::size_of::<SessionParams>() as u32,
            mode,
            nr_counters: nr,
            cpu: 0,
            sample_period: 1000,
            poll_interval_ns: 1_000_000,
            data_size_hint: 0,
            flags: 0,
            reserved: 0,
        }
    }

    const C40: CounterConfig = CounterConfig {
        width: 40,
        max_rate_per_sec: 0,
    };

    fn last_arg(buf: &mut Buffer<'_>) -> OverflowArg {
        let w = buf.private_mut(ARG_AT, core::mem::size_of::<OverflowArg>() / 8).unwrap();
        // SAFETY: the bytes written by the handler as an OverflowArg.
        unsafe { w.as_ptr().cast::<OverflowArg>().read() }
    }

    fn set_word(buf: &mut Buffer<'_>, off: usize, v: u64) {
        buf.private_mut(off, 1).unwrap()[0] = v;
    }

    fn get_word(buf: &mut Buffer<'_>, off: usize) -> u64 {
        buf.private_mut(off, 1).unwrap()[0]
    }

    fn sample(kind: u32, t: u64, raw: &[u64]) -> Sample {
        let mut s = Sample {
            cpu: 1,
            kind,
            pid: 10,
            tid: 11,
            time_ns: t,
            ip: 0xffff_ffff_8100_0000,
            kernel_ip: true,
            addr: 0xa,
            ovfl_counter: if kind == SAMPLE_OVERFLOW { 0 } else { u32::MAX },
            nr: raw.len() as u32,
            raw: [0; MAX_COUNTERS],
        };
        s.raw[..raw.len()].copy_from_slice(raw);
        s
    }

    #[test]
    fn params_and_arg_rules() {
        let f = format();
        let c = [C40];
        let ok = Session::new(f, &params(MODE_POLL, 1), &[], &c).unwrap();
        assert_eq!(ok.buffer_size(), SIZE);
        assert_eq!(ok.params().cpu, u32::MAX);
        assert_eq!(ok.counters(), &c);
        let bad = |p: SessionParams, arg: &[u8], c: &[CounterConfig]| {
            Session::new(f, &p, arg, c).unwrap_err()
        };
        let mut p = params(MODE_POLL, 1);
        p.size = 40;
        assert_eq!(bad(p, &[], &c).errno(), errno::EINVAL);
        let mut p = params(MODE_POLL, 1);
        p.reserved = 1;
        assert_eq!(bad(p, &[], &c).errno(), errno::EINVAL);
        assert_eq!(bad(params(7, 1), &[], &c).errno(), errno::EINVAL);
        assert_eq!(bad(params(MODE_POLL, 0), &[], &[]).errno(), errno::EINVAL);
        assert_eq!(
            bad(params(MODE_POLL, 9), &[], &[C40; 9]).errno(),
            errno::EINVAL
        );
        assert_eq!(bad(params(MODE_POLL, 2), &[], &c).errno(), errno::EINVAL);
        let mut p = params(MODE_POLL, 1);
        p.poll_interval_ns = 0;
        assert_eq!(bad(p, &[], &c).errno(), errno::EINVAL);
        let mut p = params(MODE_OVERFLOW, 1);
        p.sample_period = 0;
        assert_eq!(bad(p, &[], &c).errno(), errno::EINVAL);
        let narrow = [CounterConfig {
            width: 16,
            max_rate_per_sec: 0,
        }];
        assert_eq!(
            bad(params(MODE_POLL, 1), &[], &narrow).errno(),
            errno::EINVAL
        );
        // Instructed mode needs neither period nor interval.
        let mut p = params(MODE_INSTRUCTED, 1);
        p.sample_period = 0;
        p.poll_interval_ns = 0;
        Session::new(f, &p, &[], &c).unwrap();
        // Argument: zero tail beyond arg_size is fine, non-zero is E2BIG, > 4096 too.
        let mut arg = [0u8; 16];
        Session::new(f, &params(MODE_POLL, 1), &arg, &c).unwrap();
        arg[12] = 1;
        assert_eq!(
            bad(params(MODE_POLL, 1), &arg, &c),
            EngineError::TooBig {
                what: "format argument"
            }
        );
        assert_eq!(
            bad(params(MODE_POLL, 1), &[0; 4097], &c).errno(),
            errno::E2BIG
        );
        // The format's own validate runs and its errno comes through.
        assert_eq!(
            bad(params(MODE_POLL, 1), &[0xee], &c),
            EngineError::Format {
                call: "validate",
                errno: errno::EINVAL
            }
        );
    }

    #[test]
    fn init_fills_the_header() {
        let f = format();
        let s = Session::new(f, &params(MODE_POLL, 1), &[], &[C40]).unwrap();
        let mut small = vec![0u64; SIZE as usize / 8 - 1];
        let mut buf = Buffer::from_words(&mut small).unwrap();
        assert_eq!(
            s.init_cpu(0, &mut buf, &[]).unwrap_err().errno(),
            errno::EINVAL
        );
        let mut w = vec![0xffu64; SIZE as usize / 8 + 2];
        let mut buf = Buffer::from_words(&mut w).unwrap();
        assert!(s.init_cpu(256, &mut buf, &[]).is_err());
        assert_eq!(
            s.init_cpu(99, &mut buf, &[]).unwrap_err().errno(),
            errno::EINVAL
        );
        let cpu = s.init_cpu(5, &mut buf, &[]).unwrap();
        assert_eq!(
            (cpu.cpu(), cpu.state(), cpu.is_masked()),
            (5, CpuState::Initialized, false)
        );
        let h = buf.header();
        assert_eq!(
            (h.magic, h.version, h.header_size, h.cpu),
            (BUFFER_MAGIC, 1, 128, 5)
        );
        assert_eq!(h.format_uuid, Uuid([0xec; 16]));
        assert_eq!(h.buf_size, SIZE + 16);
        assert_eq!(
            (
                h.head,
                h.tail,
                h.records,
                h.drops,
                h.overflows,
                h.notify_seq
            ),
            (0, 0, 0, 0, 0, 0)
        );
    }

    #[test]
    fn lifecycle_state_checks() {
        let f = format();
        let s = Session::new(f, &params(MODE_POLL, 1), &[], &[C40]).unwrap();
        let mut w = vec![0u64; SIZE as usize / 8];
        let mut buf = Buffer::from_words(&mut w).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, &[]).unwrap();
        let st = |op, state| EngineError::State { op, state };
        assert_eq!(cpu.stop(&mut buf), Err(st("stop", "initialized")));
        // Before start: not dispatched, counted in `masked`, ctrl 0.
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 1, &[5]), &Services::NONE),
            0
        );
        assert_eq!(buf.header().masked, 1);
        assert_eq!(buf.header().overflows, 0);
        cpu.start(&mut buf, &[0; 8], 0).unwrap();
        assert_eq!(cpu.start(&mut buf, &[0; 8], 0), Err(st("start", "running")));
        cpu.stop(&mut buf).unwrap();
        assert_eq!(cpu.state(), CpuState::Stopped);
        cpu.start(&mut buf, &[0; 8], 0).unwrap();
        assert_eq!(get_word(&mut buf, CALLS_AT), 2);
        // exit stops first, then calls exit; its error is returned but the CPU is exited.
        let e = cpu.exit(&mut buf).unwrap_err();
        assert_eq!(
            e,
            EngineError::Format {
                call: "exit",
                errno: errno::EIO
            }
        );
        assert_eq!(cpu.state(), CpuState::Exited);
        assert_eq!(
            (
                get_word(&mut buf, CALLS_AT + 8),
                get_word(&mut buf, CALLS_AT + 16)
            ),
            (2, 1)
        );
        assert_eq!(cpu.exit(&mut buf), Err(st("exit", "exited")));
        assert_eq!(cpu.start(&mut buf, &[0; 8], 0), Err(st("start", "exited")));
        assert_eq!(cpu.restart(&mut buf), Err(st("restart", "exited")));
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 1, &[5]), &Services::NONE),
            0
        );
        assert_eq!(buf.header().masked, 2);
    }

    #[test]
    fn dispatch_builds_the_overflow_arg() {
        let f = format();
        let cfg = [
            C40,
            CounterConfig {
                width: 48,
                max_rate_per_sec: 1_000_000_000,
            },
        ];
        let s = Session::new(f, &params(MODE_OVERFLOW, 2), &[], &cfg).unwrap();
        let mut w = vec![0u64; SIZE as usize / 8];
        let mut buf = Buffer::from_words(&mut w).unwrap();
        let mut cpu = s.init_cpu(1, &mut buf, &[]).unwrap();
        let top40 = 1u64 << 40;
        cpu.start(&mut buf, &[top40 - 10, 100, 0, 0, 0, 0, 0, 0], 1_000)
            .unwrap();
        set_word(&mut buf, CTRL_AT, CTRL_RESET as u64);
        let ctrl = cpu.dispatch(
            &mut buf,
            &sample(SAMPLE_OVERFLOW, 2_000, &[5, 300]),
            &Services::NONE,
        );
        assert_eq!(ctrl, CTRL_RESET);
        let a = last_arg(&mut buf);
        assert_eq!(a.flags, OVFL_FL_KERNEL_IP, "kernel_ip is passed on, not guessed");
        assert_eq!(a.size as usize, core::mem::size_of::<OverflowArg>());
        assert_eq!(
            (a.kind, a.cpu, a.pid, a.tid, a.ovfl_counter, a.nr_counters),
            (SAMPLE_OVERFLOW, 1, 10, 11, 0, 2)
        );
        assert_eq!(
            (a.time_ns, a.ip, a.addr, a.last_reset, a.multi_wrap),
            (2_000, 0xffff_ffff_8100_0000, 0xa, 0, 0)
        );
        assert_eq!(a.values, [15, 200, 0, 0, 0, 0, 0, 0]);
        // The source re-arms counter 0 and tells the engine.
        let arm = crate::pmu::arm_value(40, 1000);
        cpu.set_raw(0, arm);
        cpu.set_raw(42, 0);
        cpu.dispatch(
            &mut buf,
            &sample(SAMPLE_OVERFLOW, 3_000, &[3, 400]),
            &Services::NONE,
        );
        let a = last_arg(&mut buf);
        assert_eq!(a.last_reset, arm);
        assert_eq!(a.values, [15 + 1003, 300, 0, 0, 0, 0, 0, 0]);
        // 2^48 events take 281_475 s at 1e9/s: 300_000 s later counter 1 may have wrapped twice.
        let later = 3_000 + 300_000 * 1_000_000_000;
        cpu.dispatch(
            &mut buf,
            &sample(SAMPLE_POLL, later, &[3, 500]),
            &Services::NONE,
        );
        let a = last_arg(&mut buf);
        assert_eq!(
            (a.multi_wrap, a.ovfl_counter, a.last_reset),
            (0b10, u32::MAX, 0)
        );
        assert_eq!(cpu.values(), [1018, 400, 0, 0, 0, 0, 0, 0]);
        assert_eq!(cpu.counter(1).unwrap().width(), 48);
        assert!(cpu.counter(2).is_none());
        let h = buf.header();
        assert_eq!((h.overflows, h.multi_wraps, h.masked), (3, 1, 0));
    }

    #[test]
    fn mask_notify_and_restart() {
        let f = format();
        let s = Session::new(f, &params(MODE_POLL, 1), &[], &[C40]).unwrap();
        let mut w = vec![0u64; SIZE as usize / 8];
        let mut buf = Buffer::from_words(&mut w).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, &[]).unwrap();
        cpu.start(&mut buf, &[0; 8], 0).unwrap();
        let svc = Services::NONE;

        // Unknown bits are cleared; NOTIFY bumps notify_seq.
        set_word(
            &mut buf,
            CTRL_AT,
            (CTRL_NOTIFY | CTRL_SWITCH | 0x100) as u64,
        );
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 1, &[10]), &svc),
            CTRL_NOTIFY | CTRL_SWITCH
        );
        assert_eq!((cpu.notify_seq(), buf.header().notify_seq), (1, 1));
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 2, &[20]), &svc),
            CTRL_NOTIFY | CTRL_SWITCH
        );
        assert_eq!(cpu.notify_seq(), 2);

        // MASK: the next samples are counted, not dispatched, but still virtualised.
        set_word(&mut buf, CTRL_AT, CTRL_MASK as u64);
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 3, &[30]), &svc),
            CTRL_MASK
        );
        assert!(cpu.is_masked());
        set_word(&mut buf, CTRL_AT, 0);
        let top = 1u64 << 40;
        // Two masked samples, the counter wrapping in between.
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 4, &[top - 1]), &svc),
            CTRL_MASK
        );
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 5, &[7]), &svc),
            CTRL_MASK
        );
        assert_eq!(
            last_arg(&mut buf).values[0],
            30,
            "not dispatched while masked"
        );
        let h = buf.header();
        assert_eq!((h.overflows, h.masked), (3, 2));
        assert_eq!(cpu.values()[0], top + 7);

        // restart unmasks (and may ask for bits itself).
        set_word(&mut buf, RESTART_CTRL_AT, CTRL_NOTIFY as u64);
        assert_eq!(cpu.restart(&mut buf), Ok(CTRL_NOTIFY));
        assert!(!cpu.is_masked());
        assert_eq!(
            cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 6, &[8]), &svc),
            0
        );
        assert_eq!(last_arg(&mut buf).values[0], top + 8);
        // A restart asking for MASK keeps the CPU masked.
        set_word(&mut buf, RESTART_CTRL_AT, CTRL_MASK as u64);
        cpu.restart(&mut buf).unwrap();
        assert!(cpu.is_masked());
        let stats = cpu.stats(&buf);
        assert_eq!(
            (stats.cpu, stats.masked_now, stats.overflows, stats.masked),
            (0, 1, 4, 2)
        );
        assert_eq!(CTRL_ALL & 0x100, 0);
    }

    #[test]
    fn multi_wrap_carried_over_masked_samples() {
        let f = format();
        let rate = 4_000_000_000; // 32-bit wraps every ~1.07 s
        let s = Session::new(
            f,
            &params(MODE_POLL, 1),
            &[],
            &[CounterConfig {
                width: 32,
                max_rate_per_sec: rate,
            }],
        )
        .unwrap();
        let mut w = vec![0u64; SIZE as usize / 8];
        let mut buf = Buffer::from_words(&mut w).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, &[]).unwrap();
        cpu.start(&mut buf, &[0; 8], 0).unwrap();
        set_word(&mut buf, CTRL_AT, CTRL_MASK as u64);
        cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 1, &[1]), &Services::NONE);
        set_word(&mut buf, CTRL_AT, 0);
        // Masked and 3 s late: flagged, carried to the next dispatched sample.
        cpu.dispatch(
            &mut buf,
            &sample(SAMPLE_POLL, 3_000_000_001, &[2]),
            &Services::NONE,
        );
        cpu.restart(&mut buf).unwrap();
        cpu.dispatch(
            &mut buf,
            &sample(SAMPLE_POLL, 3_000_000_002, &[3]),
            &Services::NONE,
        );
        assert_eq!(last_arg(&mut buf).multi_wrap, 1);
        assert_eq!(buf.header().multi_wraps, 1);
        cpu.dispatch(
            &mut buf,
            &sample(SAMPLE_POLL, 3_000_000_003, &[4]),
            &Services::NONE,
        );
        assert_eq!(last_arg(&mut buf).multi_wrap, 0);
    }

    #[test]
    fn resume_does_not_count_the_pause_and_poll_schedule() {
        let f = format();
        let s = Session::new(f, &params(MODE_POLL, 1), &[], &[C40]).unwrap();
        let mut w = vec![0u64; SIZE as usize / 8];
        let mut buf = Buffer::from_words(&mut w).unwrap();
        let mut cpu = s.init_cpu(0, &mut buf, &[]).unwrap();
        cpu.start(&mut buf, &[100; 8], 5_000_000).unwrap();
        assert_eq!(cpu.poll_schedule().next_deadline(), 6_000_000);
        assert!(cpu.poll_due(6_000_000).due);
        assert_eq!(
            cpu.poll_due(9_500_000),
            Tick {
                due: true,
                missed: 2
            }
        );
        cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 1, &[150]), &Services::NONE);
        cpu.stop(&mut buf).unwrap();
        cpu.start(&mut buf, &[1_000; 8], 20_000_000).unwrap();
        cpu.dispatch(&mut buf, &sample(SAMPLE_POLL, 2, &[1_010]), &Services::NONE);
        assert_eq!(last_arg(&mut buf).values[0], 60);
        // The deadlines restart on resume; the tick counts go on.
        assert_eq!(cpu.poll_schedule().next_deadline(), 21_000_000);
        let st = cpu.stats(&buf);
        assert_eq!((st.poll_ticks, st.missed_ticks), (2, 2));
    }
}
