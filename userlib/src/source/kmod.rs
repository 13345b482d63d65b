//! The kmod source: a client of `/dev/hrperf` (hrperf-core.ko), where the kernel runs the
//! engine and the format and userspace only reads the finished records.
//!
//! Reference: `core-kmod/abi/src/ioctl.rs` (ioctls, argument structs), `buffer.rs` (the
//! per-CPU buffer header), `include/hrperf.h` (the same for C), and
//! `tools/vm/guest/hrperf_test.c` (the kernel side's own test, driving the device in C).
//!
//! Unlike `perf` and `sim`, this source does not implement [`super::Source`]: its samples
//! never pass through the userspace engine. The kernel's overflow handler, poll thread or
//! instructed ioctl dispatches them to the format module, which writes records into
//! per-CPU rings that userspace maps read-only. So the kmod path is its own recorder,
//! producing the same capture file as [`crate::record`]:
//!
//! ```text
//! open /dev/hrperf ─ INFO ─ FORMATS ─ CREATE ─ BUFFERS ─ mmap(PROT_READ) ─ START
//!   loop: poll(fd, POLLIN, 100 ms) → per CPU: RingReader::read in place → capture chunk
//!         → HRPERF_IOC_CONSUME(new tail)
//! STOP ─ last drain ─ STATS → stats chunk ─ END ─ DESTROY ─ close
//! ```
//!
//! Interval formats (`FMT_FL_INTERVALS`, aggregate) are read the same way, per published
//! interval instead of per ring ([`Session::drain_intervals`]: `AggView` over the
//! read-only mapping, CONSUME with tail = the interval's seq), and closed with
//! `HRPERF_IOC_RESTART` ([`Session::restart_cpu`]).
//!
//! The pieces (all of the kmod path lives under this module):
//!
//! - [`sys`]: every system call, behind [`KmodSys`], with [`fake::FakeKmod`] for tests;
//! - this file: [`Device`] (an open `/dev/hrperf`: module info, formats) and [`Session`]
//!   (a created session: mapping, start/stop, instructed poll/log, ring draining, stats);
//! - [`record`]: the recorder (`hrperf record --source kmod`);
//! - [`control`] and [`daemon`]: a session that outlives one command (`hrperf start`,
//!   `pause`, `poll`, `log`, `poll-log`, `stop`, and the C API's attach by fd).
//!
//! ```no_run
//! use std::sync::Arc;
//! use hrperf::source::kmod::{KmodConfig, LinuxKmodSys, Mode, Session};
//! use hrperf::source::perf::parse_events;
//!
//! let cfg = KmodConfig {
//!     events: parse_events("cpu-clock,page-faults")?,
//!     mode: Mode::Instructed,
//!     ..KmodConfig::default()
//! };
//! let mut s = Session::create(Arc::new(LinuxKmodSys), &cfg)?;
//! s.start()?;
//! s.poll_log()?; // one record per CPU
//! s.stop()?;
//! let mut chunk = Vec::new();
//! for i in 0..s.cpus().len() {
//!     let (cpu, n) = s.drain_cpu(i, &mut chunk)?;
//!     println!("CPU {cpu}: {n} records, {} bytes", chunk.len());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use hrperf_abi::buffer::{BUFFER_MAGIC, BUFFER_VERSION};
use hrperf_abi::format::{
    FMT_FL_INTERVALS, FMT_FL_PEBS, FMT_FL_RING, MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL,
};
use hrperf_abi::ioctl::{
    BufferSlot, BuffersArg, ConsumeArg, CpuArg, CpuStats, FormatInfo, FormatList, ModuleInfo,
    SessionCreate, StatsArg, IOCTL_ABI_VERSION, MODE_DEFAULT,
};
use hrperf_abi::{
    fixed_name, name_bytes, BufferHeader, CpuMask, EventDesc, MAX_COUNTERS, MAX_CPUS,
};
use hrperf_abi::ioctl::pebs_state;
use hrperf_engine::{Buffer, RingReader};
use hrperf_fmt_pebs::assist::TscClock;
use hrperf_fmt_pebs::format::PebsHeader;
use hrperf_fmt_aggregate::consumer::{Access, AggView};

use super::EventSpec;
use crate::capture::CaptureError;
use crate::record::AggCpuSummary;

pub mod control;
pub mod daemon;
pub mod fake;
pub mod record;
pub mod sys;
#[cfg(test)]
mod tests;

pub use sys::{Ioctl, KmodSys, LinuxKmodSys};

/// Where hrperf-core.ko puts its device.
pub const DEFAULT_DEVICE: &str = "/dev/hrperf";

/// Environment variable through which `hrperf record` hands the session's descriptor to
/// the recorded command (the C API attaches to it, see `include/hrperf_api.h`).
pub const ENV_FD: &str = "HRPERF_FD";

/// Errors of the kmod client: each is one line naming what failed and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KmodError {
    /// The device node does not exist.
    #[error("no {}: the hrperf kernel module is not loaded (insmod hrperf-core.ko, then insmod fmt-<format>.ko, e.g. fmt-delta.ko)", path.display())]
    NotLoaded {
        /// The device path.
        path: PathBuf,
    },
    /// Not allowed to open the device.
    #[error("permission denied opening {} (hrperf-core.ko makes it root-only, mode 0600, by default): run as root, or load the module with dev_mode=0660 dev_gid=<group> and use an account in that group", path.display())]
    Permission {
        /// The device path.
        path: PathBuf,
    },
    /// The module speaks another ioctl ABI.
    #[error("hrperf-core.ko speaks ioctl ABI {found}, this hrperf speaks {IOCTL_ABI_VERSION}: load the module built from the same hrperf release")]
    Abi {
        /// The module's ABI version.
        found: u32,
    },
    /// The format asked for is not registered with the core.
    #[error("format '{name}' is not registered with hrperf-core: insmod fmt-{name}.ko (registered formats: {registered})")]
    FormatNotRegistered {
        /// The format asked for.
        name: String,
        /// The registered formats, comma-separated, or "none".
        registered: String,
    },
    /// An ioctl failed; `hint` says what it means for that command.
    #[error("{call} failed: {source}{hint}")]
    Ioctl {
        /// The command, e.g. `HRPERF_IOC_CREATE`.
        call: &'static str,
        /// The OS error.
        source: io::Error,
        /// What it means, starting with ": ", or empty.
        hint: String,
    },
    /// Another system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// The call, e.g. `mmap(/dev/hrperf, 524288 bytes)`.
        call: String,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel's buffer does not look as the ABI says.
    #[error("CPU {cpu}'s buffer: {what}")]
    Buffer {
        /// The CPU.
        cpu: u32,
        /// What was wrong.
        what: String,
    },
    /// The configuration cannot be honoured.
    #[error("{0}")]
    Config(String),
    /// The kernel refused a zero-copy PEBS session, and said why.
    #[error("{message}")]
    Pebs {
        /// The errno of the refused CREATE.
        errno: i32,
        /// The kernel's reason, in a sentence.
        message: String,
    },
    /// The command to record could not be started.
    #[error("cannot run '{cmd}': {source}")]
    Command {
        /// The command.
        cmd: String,
        /// The OS error.
        source: io::Error,
    },
    /// Writing the capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// Talking to an `hrperf start` session failed.
    #[error("{0}")]
    Control(String),
    /// The `hrperf start` session refused a request (its message names the call).
    #[error("{message}")]
    Daemon {
        /// The errno of the failed call.
        errno: i32,
        /// The daemon's one-line message.
        message: String,
    },
}

impl KmodError {
    /// The errno behind the error, if a system call failed (`-errno` is what the C API
    /// returns).
    pub fn errno(&self) -> Option<i32> {
        match self {
            KmodError::NotLoaded { .. } => Some(libc::ENOENT),
            KmodError::Permission { .. } => Some(libc::EACCES),
            KmodError::FormatNotRegistered { .. } => Some(libc::ENOENT),
            KmodError::Daemon { errno, .. } | KmodError::Pebs { errno, .. } => Some(*errno),
            KmodError::Ioctl { source, .. }
            | KmodError::Syscall { source, .. }
            | KmodError::Command { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Most intervals one [`Session::drain_intervals`] reads from one CPU.
const MAX_INTERVALS_PER_DRAIN: usize = 64;

/// The CREATE of a `FMT_FL_PEBS` format refused: the kernel's reason from
/// `HRPERF_IOC_INFO` (`pebs_refusal`, the CPU and MSR value it names), else the errno's.
fn pebs_refused(e: io::Error, info: Option<ModuleInfo>) -> KmodError {
    let Some(mi) = info.filter(|mi| mi.pebs_refusal != pebs_state::UNKNOWN) else {
        return ioctl_error(PEBS_CREATE, e);
    };
    let what = pebs_state::text(mi.pebs_refusal);
    let where_ = if mi.pebs_refusal_cpu == u32::MAX {
        String::new()
    } else {
        format!(" on CPU {} ({:#x})", mi.pebs_refusal_cpu, mi.pebs_refusal_value)
    };
    let advice = match mi.pebs_refusal {
        pebs_state::PEBS_IN_USE | pebs_state::NO_FREE_COUNTER => {
            ": stop the perf session using the PMU there, or monitor other CPUs (-C)"
        }
        pebs_state::BAD_EVENT => ": e.g. -e cycles, or -e r01cd for load latency",
        pebs_state::KPTI => "",
        _ => ": use --source sim for a simulated PEBS PMU, or load hrperf-core.ko with pebs_sim=adaptive",
    };
    KmodError::Pebs {
        errno: e.raw_os_error().unwrap_or(0),
        message: format!("hrperf-core.ko refused zero-copy PEBS: {what}{where_}{advice}"),
    }
}

/// The CREATE of a `FMT_FL_PEBS` format, named in errors.
const PEBS_CREATE: &str = "HRPERF_IOC_CREATE (format pebs)";

/// What a failed ioctl means, per command and errno (the kernel's contract in
/// `core-kmod/kmod/file.rs`).
fn ioctl_hint(call: &'static str, errno: Option<i32>) -> String {
    let e = errno.unwrap_or(0);
    let hint = match (call, e) {
        (PEBS_CREATE, libc::ENODEV) => {
            "no PEBS-capable PMU was detected by the kernel (hrperf-core.ko checks the hardware PMU itself; virtual machines usually have none): use a software or hardware event with another format, e.g. --format delta"
        }
        (_, libc::ENODEV) => "the module is unloading (reload hrperf-core.ko)",
        (_, libc::ENOTTY) => "not an hrperf device, or hrperf-core.ko is older than this hrperf",
        (_, libc::EFAULT) => "the module could not access the argument (a bug in hrperf: please report it)",
        (_, libc::E2BIG) => "hrperf-core.ko is older than this hrperf and does not know a field it was given",
        ("HRPERF_IOC_CREATE", libc::EINVAL) => {
            "the module refused the session: check the events (software, hardware, hw-cache or raw), the period (-c, > 0), the poll interval (10 µs to 10 s) and the CPU list (online CPUs)"
        }
        ("HRPERF_IOC_CREATE", libc::ENOENT | libc::EOPNOTSUPP) => {
            "an event is not available on this machine (hardware events need a PMU; software events such as cpu-clock, task-clock, page-faults, context-switches work everywhere)"
        }
        ("HRPERF_IOC_CREATE", libc::ENOMEM) => "the buffers do not fit: use a smaller --buffer-size (at most 1 GiB over all CPUs)",
        ("HRPERF_IOC_CREATE", libc::EBUSY) => "this file already has a session",
        ("HRPERF_IOC_START", libc::EINVAL) => "the session is already running",
        ("HRPERF_IOC_STOP", libc::EINVAL) => "the session is not running (already paused)",
        ("HRPERF_IOC_POLL" | "HRPERF_IOC_LOG" | "HRPERF_IOC_POLL_LOG", libc::EINVAL) => {
            "the session is not in instructed mode, or it is paused"
        }
        (_, libc::EINVAL) => "no session on this file, or an argument the module refused",
        (_, libc::EBUSY) => "a CPU stayed busy in an overflow handler; try again",
        _ => return String::new(),
    };
    format!(": {hint}")
}

/// Builds [`KmodError::Ioctl`] for `call` from an OS error.
pub(crate) fn ioctl_error(call: &'static str, source: io::Error) -> KmodError {
    let hint = ioctl_hint(call, source.raw_os_error());
    KmodError::Ioctl { call, source, hint }
}

/// How the session samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The module's default (`mode=` parameter); overflow then uses
    /// [`DEFAULT_PERIOD`].
    #[default]
    Default,
    /// A sample every `period` events of the leader counter (overflow interrupt).
    Overflow {
        /// Sampling period.
        period: u64,
    },
    /// Every CPU reads its counters every `interval_ns` (0: the module's `poll_us`).
    Poll {
        /// Poll interval in ns, 0 for the module's.
        interval_ns: u64,
    },
    /// Counters are read only when asked: `HRPERF_IOC_POLL`/`LOG`/`POLL_LOG`.
    Instructed,
}

/// Period used when the module's default mode is overflow and none was given (1 ms of
/// cpu-clock, or a million events of another leader).
pub const DEFAULT_PERIOD: u64 = 1_000_000;

/// The name of a `MODE_*` value (one definition, in [`crate::decode`]).
pub use crate::decode::mode_name;

/// What session to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KmodConfig {
    /// The device ([`DEFAULT_DEVICE`]).
    pub device: PathBuf,
    /// Format name (a registered `fmt-<name>.ko`).
    pub format: String,
    /// Counters, leader first (1..=8).
    pub events: Vec<EventSpec>,
    /// Sampling mode.
    pub mode: Mode,
    /// CPUs to monitor; `None` for all online CPUs.
    pub cpus: Option<Vec<u32>>,
    /// Per-CPU data area hint in bytes, 0 for the format's default.
    pub data_size: u64,
    /// Format argument bytes (empty: none).
    pub format_arg: Vec<u8>,
}

impl Default for KmodConfig {
    fn default() -> Self {
        KmodConfig {
            device: PathBuf::from(DEFAULT_DEVICE),
            format: "delta".into(),
            events: Vec::new(),
            mode: Mode::Default,
            cpus: None,
            data_size: 0,
            format_arg: Vec::new(),
        }
    }
}

/// An open `/dev/hrperf` (no session yet): module information and formats.
#[derive(Debug)]
pub struct Device {
    sys: Arc<dyn KmodSys>,
    fd: i32,
    path: PathBuf,
}

impl Device {
    /// Opens the device, with clear errors for a missing module or missing permission.
    pub fn open(sys: Arc<dyn KmodSys>, path: &Path) -> Result<Device, KmodError> {
        let fd = sys
            .open(path)
            .map_err(|source| match source.raw_os_error() {
                Some(libc::ENOENT) => KmodError::NotLoaded {
                    path: path.to_owned(),
                },
                Some(libc::EACCES | libc::EPERM) => KmodError::Permission {
                    path: path.to_owned(),
                },
                Some(libc::ENXIO | libc::ENODEV) => KmodError::NotLoaded {
                    path: path.to_owned(),
                },
                _ => KmodError::Syscall {
                    call: format!("open({})", path.display()),
                    source,
                },
            })?;
        Ok(Device {
            sys,
            fd,
            path: path.to_owned(),
        })
    }

    /// The descriptor.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// `HRPERF_IOC_INFO`, checking the ABI version.
    pub fn info(&self) -> Result<ModuleInfo, KmodError> {
        let mut info = ModuleInfo {
            size: core::mem::size_of::<ModuleInfo>() as u32,
            ..Default::default()
        };
        self.sys
            .ioctl(self.fd, Ioctl::Info(&mut info))
            .map_err(|e| ioctl_error("HRPERF_IOC_INFO", e))?;
        if info.abi_version != IOCTL_ABI_VERSION {
            return Err(KmodError::Abi {
                found: info.abi_version,
            });
        }
        Ok(info)
    }

    /// `HRPERF_IOC_FORMATS`: every registered format.
    pub fn formats(&self) -> Result<Vec<FormatInfo>, KmodError> {
        let empty = FormatInfo {
            name: [0; 32],
            uuid: hrperf_abi::Uuid::NIL,
            version: 0,
            flags: 0,
            arg_size: 0,
            users: 0,
        };
        let mut room = 16usize;
        loop {
            let mut entries = vec![empty; room];
            let mut list = FormatList {
                size: core::mem::size_of::<FormatList>() as u32,
                capacity: 0,
                count: 0,
                reserved: 0,
                entries: 0,
            };
            self.sys
                .ioctl(self.fd, Ioctl::Formats(&mut list, &mut entries))
                .map_err(|e| ioctl_error("HRPERF_IOC_FORMATS", e))?;
            let n = list.count as usize;
            if n <= room {
                entries.truncate(n);
                return Ok(entries);
            }
            room = n; // registered meanwhile: ask again with room for all
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.fd >= 0 {
            self.sys.close(self.fd);
        }
    }
}

/// A format's name as text.
pub fn format_name(f: &FormatInfo) -> String {
    String::from_utf8_lossy(name_bytes(&f.name)).into_owned()
}

/// Comma-separated names of `formats`, or "none".
pub fn format_names(formats: &[FormatInfo]) -> String {
    if formats.is_empty() {
        return "none".into();
    }
    formats
        .iter()
        .map(format_name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A session created on an open `/dev/hrperf`, its buffers mapped read-only.
///
/// The session lives as long as its file is open (and not destroyed): dropping the
/// `Session` unmaps and closes; the kernel then stops and frees it unless another
/// process holds the same file (the C API's attach, see [`control`]).
///
/// # Invariants
///
/// `map` is a live read-only mapping of `map_len` bytes from [`KmodSys::mmap_read`] of
/// `fd`, 8-aligned; every slot's `offset + buf_size <= map_len` and `offset % 8 == 0`.
#[derive(Debug)]
pub struct Session {
    sys: Arc<dyn KmodSys>,
    dev: Device,
    module: ModuleInfo,
    format: FormatInfo,
    mode: u32,
    sample_period: u64,
    poll_interval_ns: u64,
    events: Vec<EventSpec>,
    format_arg: Vec<u8>,
    map: NonNull<u8>,
    map_len: usize,
    buf_size: usize,
    slots: Vec<BufferSlot>,
    running: bool,
}

// SAFETY: the mapping is only read, through the ring protocol's atomics and published
// bytes; nothing in a `Session` is tied to the creating thread.
unsafe impl Send for Session {}

impl Session {
    /// Opens the device and creates, maps and checks a session (not started).
    pub fn create(sys: Arc<dyn KmodSys>, cfg: &KmodConfig) -> Result<Session, KmodError> {
        let dev = Device::open(sys.clone(), &cfg.device)?;
        let module = dev.info()?;
        let formats = dev.formats()?;
        let format = formats
            .iter()
            .find(|f| name_bytes(&f.name) == cfg.format.as_bytes())
            .copied()
            .ok_or_else(|| KmodError::FormatNotRegistered {
                name: cfg.format.clone(),
                registered: format_names(&formats),
            })?;
        let create = build_create(cfg, &module)?;
        if format.flags & (FMT_FL_RING | FMT_FL_INTERVALS | FMT_FL_PEBS) == 0 {
            return Err(KmodError::Config(format!(
                "format '{}' neither logs into a record ring, publishes intervals nor holds PEBS records; the kmod recorder reads only those",
                cfg.format
            )));
        }
        if let Err(e) = sys.ioctl(dev.fd, Ioctl::Create(&create)) {
            if format.flags & FMT_FL_PEBS != 0 {
                // The kernel decides whether PEBS is usable: it says why in INFO.
                return Err(pebs_refused(e, dev.info().ok()));
            }
            return Err(ioctl_error("HRPERF_IOC_CREATE", e));
        }
        let mode = if create.mode == MODE_DEFAULT {
            module.default_mode
        } else {
            create.mode
        };
        let poll_interval_ns = match (mode, create.poll_interval_ns) {
            (MODE_POLL, 0) => u64::from(module.poll_us) * 1000,
            (MODE_POLL, ns) => ns,
            _ => 0,
        };
        let sample_period = if mode == MODE_OVERFLOW {
            create.sample_period
        } else {
            0
        };

        let empty = BufferSlot {
            cpu: 0,
            reserved: 0,
            offset: 0,
        };
        let mut slots = vec![empty; MAX_CPUS];
        let mut b = BuffersArg {
            size: core::mem::size_of::<BuffersArg>() as u32,
            count: 0,
            buf_size: 0,
            entries: 0,
        };
        sys.ioctl(dev.fd, Ioctl::Buffers(&mut b, &mut slots))
            .map_err(|e| ioctl_error("HRPERF_IOC_BUFFERS", e))?;
        let count = (b.count as usize).min(MAX_CPUS);
        slots.truncate(count);
        let buf_size = usize::try_from(b.buf_size).unwrap_or(usize::MAX);
        let map_len = buf_size
            .checked_mul(count)
            .filter(|&n| count > 0 && buf_size >= BufferHeader::SIZE && buf_size % 8 == 0 && n > 0)
            .ok_or_else(|| {
                KmodError::Config(format!(
                    "the module reported {count} buffers of {buf_size} bytes"
                ))
            })?;
        for s in &slots {
            let end = usize::try_from(s.offset)
                .ok()
                .and_then(|o| o.checked_add(buf_size));
            if s.offset % 8 != 0 || !matches!(end, Some(e) if e <= map_len) {
                return Err(KmodError::Buffer {
                    cpu: s.cpu,
                    what: format!("offset {} outside the {map_len}-byte mapping", s.offset),
                });
            }
        }
        let map = sys
            .mmap_read(dev.fd, map_len)
            .map_err(|source| KmodError::Syscall {
                call: format!("mmap({}, {map_len} bytes, PROT_READ)", cfg.device.display()),
                source,
            })?;
        if map.as_ptr() as usize % 8 != 0 {
            // SAFETY: the mapping just made, unused.
            unsafe { sys.munmap(map, map_len) };
            return Err(KmodError::Config(
                "the buffer mapping is not 8-byte aligned".into(),
            ));
        }
        // INVARIANT: a live mapping, aligned, every slot checked to lie inside it.
        let s = Session {
            sys,
            dev,
            module,
            format,
            mode,
            sample_period,
            poll_interval_ns,
            events: cfg.events.clone(),
            format_arg: cfg.format_arg.clone(),
            map,
            map_len,
            buf_size,
            slots,
            running: false,
        };
        for i in 0..s.slots.len() {
            s.check_buffer(i)?;
        }
        Ok(s)
    }

    /// The session's descriptor (for `poll`, or to hand to another process).
    pub fn fd(&self) -> i32 {
        self.dev.fd
    }

    /// The device path.
    pub fn device(&self) -> &Path {
        &self.dev.path
    }

    /// What `HRPERF_IOC_INFO` said at creation.
    pub fn module_info(&self) -> &ModuleInfo {
        &self.module
    }

    /// The format, as `HRPERF_IOC_FORMATS` listed it.
    pub fn format(&self) -> &FormatInfo {
        &self.format
    }

    /// `MODE_*` of the session (the module's default resolved).
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Sampling period (overflow mode), else 0.
    pub fn sample_period(&self) -> u64 {
        self.sample_period
    }

    /// Poll interval in ns (poll mode, the module's `poll_us` resolved), else 0.
    pub fn poll_interval_ns(&self) -> u64 {
        self.poll_interval_ns
    }

    /// The counters, leader first.
    pub fn events(&self) -> &[EventSpec] {
        &self.events
    }

    /// The format argument given at creation.
    pub fn format_arg(&self) -> &[u8] {
        &self.format_arg
    }

    /// Whether the format publishes intervals (`FMT_FL_INTERVALS`, e.g. aggregate)
    /// instead of logging into a ring: read with [`drain_intervals`](Self::drain_intervals).
    pub fn has_intervals(&self) -> bool {
        self.format.flags & FMT_FL_INTERVALS != 0
    }

    /// Whether the format is zero-copy PEBS (`FMT_FL_PEBS`): the buffers hold the DS area
    /// and the records the PMU writes.
    pub fn has_pebs(&self) -> bool {
        self.format.flags & FMT_FL_PEBS != 0
    }

    /// The monitored CPUs, in buffer order.
    pub fn cpus(&self) -> Vec<u32> {
        self.slots.iter().map(|s| s.cpu).collect()
    }

    /// Whether this process started the session and has not stopped it (another process
    /// holding the same file may have changed that).
    pub fn is_running(&self) -> bool {
        self.running
    }

    fn simple(&self, req: Ioctl<'static>) -> Result<(), KmodError> {
        let name = req.name();
        self.sys
            .ioctl(self.dev.fd, req)
            .map_err(|e| ioctl_error(name, e))
    }

    /// `HRPERF_IOC_START`: start or resume counting.
    pub fn start(&mut self) -> Result<(), KmodError> {
        self.simple(Ioctl::Start)?;
        self.running = true;
        Ok(())
    }

    /// `HRPERF_IOC_STOP`: pause; the buffers stay readable.
    pub fn stop(&mut self) -> Result<(), KmodError> {
        self.simple(Ioctl::Stop)?;
        self.running = false;
        Ok(())
    }

    /// `HRPERF_IOC_POLL` (instructed mode): every CPU reads its counters now.
    pub fn poll(&self) -> Result<(), KmodError> {
        self.simple(Ioctl::Poll)
    }

    /// `HRPERF_IOC_LOG` (instructed mode): publish and wake the reader.
    pub fn log(&self) -> Result<(), KmodError> {
        self.simple(Ioctl::Log)
    }

    /// `HRPERF_IOC_POLL_LOG` (instructed mode): both in one call.
    pub fn poll_log(&self) -> Result<(), KmodError> {
        self.simple(Ioctl::PollLog)
    }

    /// `HRPERF_IOC_DESTROY`: ends the session for every holder of the file; the mapping
    /// stays readable until dropped.
    pub fn destroy(&mut self) -> Result<(), KmodError> {
        self.simple(Ioctl::Destroy)?;
        self.running = false;
        Ok(())
    }

    /// Waits up to `timeout_ms` for the session to become readable (a format NOTIFY,
    /// LOG or STOP); `Ok(true)` if it is.
    pub fn wait(&self, timeout_ms: i32) -> Result<bool, KmodError> {
        let mut fds = [libc::pollfd {
            fd: self.dev.fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        let n = self
            .sys
            .poll(&mut fds, timeout_ms)
            .map_err(|source| KmodError::Syscall {
                call: "poll(/dev/hrperf)".into(),
                source,
            })?;
        Ok(n > 0 && fds[0].revents & libc::POLLIN != 0)
    }

    /// `HRPERF_IOC_STATS`: per-CPU statistics, in buffer order.
    pub fn stats(&self) -> Result<Vec<CpuStats>, KmodError> {
        let zero = CpuStats::default();
        let mut entries = vec![zero; self.slots.len()];
        let mut a = StatsArg {
            size: core::mem::size_of::<StatsArg>() as u32,
            count: 0,
            entries: 0,
        };
        self.sys
            .ioctl(self.dev.fd, Ioctl::Stats(&mut a, &mut entries))
            .map_err(|e| ioctl_error("HRPERF_IOC_STATS", e))?;
        entries.truncate(a.count as usize);
        Ok(entries)
    }

    /// The `i`-th CPU's buffer over the mapping.
    fn buffer(&self, i: usize) -> Result<(u32, Buffer<'_>), KmodError> {
        let slot = self
            .slots
            .get(i)
            .ok_or_else(|| KmodError::Config(format!("no buffer {i}")))?;
        // SAFETY: `offset + buf_size <= map_len` (type invariant), so the pointer stays
        // inside the mapping; it is non-null as an offset into a non-null mapping.
        let ptr = unsafe { NonNull::new_unchecked(self.map.as_ptr().add(slot.offset as usize)) };
        // SAFETY: the mapping is readable for `buf_size` bytes from `ptr` while `self`
        // lives (type invariant), 8-aligned; only the header and `RingReader` are used
        // on it (read-only), and the kernel writes it with the ring protocol.
        let buf =
            unsafe { Buffer::from_raw(ptr, self.buf_size) }.map_err(|e| KmodError::Buffer {
                cpu: slot.cpu,
                what: e.to_string(),
            })?;
        Ok((slot.cpu, buf))
    }

    /// Checks the `i`-th buffer's header against the ABI and the session.
    fn check_buffer(&self, i: usize) -> Result<(), KmodError> {
        let (cpu, buf) = self.buffer(i)?;
        let h = buf.header();
        let bad = |what: String| Err(KmodError::Buffer { cpu, what });
        if h.magic != BUFFER_MAGIC || h.version != BUFFER_VERSION {
            return bad(format!(
                "magic {:#x} version {}: not an hrperf buffer of version {BUFFER_VERSION}",
                h.magic, h.version
            ));
        }
        if (h.header_size as usize) < BufferHeader::SIZE || h.cpu != cpu {
            return bad(format!("header size {} for CPU {}", h.header_size, h.cpu));
        }
        if h.format_uuid != self.format.uuid {
            return bad(format!(
                "owned by format {}, not {}",
                h.format_uuid,
                format_name(&self.format)
            ));
        }
        if self.has_intervals() {
            self.agg_view(i)?;
            return Ok(());
        }
        if self.has_pebs() {
            return match hrperf_fmt_pebs::format::read_header(&buf) {
                Some(_) => Ok(()),
                None => bad("no consistent PEBS header (format pebs of another version?)".into()),
            };
        }
        RingReader::new(&buf).map_err(|e| KmodError::Buffer {
            cpu,
            what: e.to_string(),
        })?;
        Ok(())
    }

    /// A read-only view of the `i`-th CPU's interval tables (`FMT_FL_INTERVALS`).
    fn agg_view(&self, i: usize) -> Result<(u32, AggView<'_>), KmodError> {
        let slot = self
            .slots
            .get(i)
            .ok_or_else(|| KmodError::Config(format!("no buffer {i}")))?;
        // SAFETY: `offset + buf_size <= map_len` (type invariant), so the pointer stays
        // inside the mapping; it is non-null as an offset into a non-null mapping.
        let ptr = unsafe { NonNull::new_unchecked(self.map.as_ptr().add(slot.offset as usize)) };
        // SAFETY: the mapping is readable for `buf_size` bytes from `ptr` while `self`
        // lives (type invariant; the view borrows `self`), 8-aligned; the view is
        // read-only (only atomic loads), and the only writers are the kernel's producer
        // (the format's handler and restart) and its CONSUME storing the consumer line.
        let view = unsafe { AggView::from_raw(ptr, self.buf_size, Access::ReadOnly) }.map_err(
            |e| KmodError::Buffer {
                cpu: slot.cpu,
                what: e.to_string(),
            },
        )?;
        Ok((slot.cpu, view))
    }

    /// `HRPERF_IOC_CONSUME` of `cpu` up to `tail` (a ring position, or for an interval
    /// format the sequence number of the interval read).
    fn consume(&self, cpu: u32, tail: u64) -> Result<(), KmodError> {
        let c = ConsumeArg {
            size: core::mem::size_of::<ConsumeArg>() as u32,
            cpu,
            tail,
        };
        self.sys
            .ioctl(self.dev.fd, Ioctl::Consume(&c))
            .map_err(|e| ioctl_error("HRPERF_IOC_CONSUME", e))
    }

    /// Interval formats (`FMT_FL_INTERVALS`): reads every interval published in the
    /// `i`-th CPU's buffer in place, appends its INTERVAL, STACK and ENTRY records to
    /// `chunk` (cleared first) and acknowledges it (`HRPERF_IOC_CONSUME` with the
    /// interval's sequence number; the producer may then reuse its table). With nothing
    /// pending, the last interval is acknowledged again, which acknowledges the readable
    /// state. Adds the intervals to `agg`; returns the CPU and the number of records.
    pub fn drain_intervals(
        &self,
        i: usize,
        chunk: &mut Vec<u8>,
        agg: &mut AggCpuSummary,
    ) -> Result<(u32, u64), KmodError> {
        chunk.clear();
        let (cpu, view) = self.agg_view(i)?;
        let mut n = 0u64;
        let mut acked = false;
        // One pending interval at a time (the producer publishes the next only after
        // our acknowledgement); bounded so that a fast producer cannot keep us here.
        for _ in 0..MAX_INTERVALS_PER_DRAIN {
            let Some(iv) = view.pending() else {
                break;
            };
            let s = iv.emit_records(|rec| {
                chunk.extend_from_slice(rec);
                n += 1;
            });
            agg.add_interval(&s);
            self.consume(cpu, iv.finish())?;
            acked = true;
        }
        agg.switch_waits = view.switch_waits();
        let last = view.published();
        if !acked && last != 0 {
            match self.consume(cpu, last) {
                // EINVAL: the producer published meanwhile; the next drain reads it.
                Err(e) if e.errno() != Some(libc::EINVAL) => return Err(e),
                _ => {}
            }
        }
        Ok((cpu, n))
    }

    /// `HRPERF_IOC_RESTART` of the `i`-th CPU; for an interval format this closes the
    /// active interval (publishes it), `EBUSY` while the published one is not
    /// acknowledged.
    pub fn restart_cpu(&self, i: usize) -> Result<(), KmodError> {
        let cpu = self
            .slots
            .get(i)
            .ok_or_else(|| KmodError::Config(format!("no buffer {i}")))?
            .cpu;
        let a = CpuArg {
            size: core::mem::size_of::<CpuArg>() as u32,
            cpu,
        };
        self.sys
            .ioctl(self.dev.fd, Ioctl::Restart(&a))
            .map_err(|e| ioctl_error("HRPERF_IOC_RESTART", e))
    }

    /// PEBS formats: the format's header of the `i`-th CPU's buffer (threshold hits,
    /// restarts, records copied...).
    pub fn pebs_header(&self, i: usize) -> Result<PebsHeader, KmodError> {
        let (cpu, buf) = self.buffer(i)?;
        hrperf_fmt_pebs::format::read_header(&buf).ok_or_else(|| KmodError::Buffer {
            cpu,
            what: "the PEBS header became inconsistent".into(),
        })
    }

    /// PEBS formats: whether the `i`-th CPU reached its threshold and waits, masked, for
    /// its records to be read and RESTART (threshold interrupts > restarts).
    pub fn pebs_waiting(&self, i: usize) -> Result<bool, KmodError> {
        let h = self.pebs_header(i)?;
        Ok(h.threshold_hits > h.restarts)
    }

    /// PEBS formats: wraps every record between the DS area's base and index of the
    /// `i`-th CPU's buffer, read in place, into a capture record appended to `chunk`
    /// (cleared first). Call it only for a CPU that is not counting (masked at the
    /// threshold, or the session stopped), and RESTART it afterwards if it was masked.
    /// Returns the CPU and the number of records.
    pub fn drain_pebs(&self, i: usize, chunk: &mut Vec<u8>, flags: u32) -> Result<(u32, u64), KmodError> {
        chunk.clear();
        let (cpu, buf) = self.buffer(i)?;
        let khz = u64::from(self.module.tsc_khz);
        let clock = (khz != 0).then_some(TscClock {
            tsc_hz: khz * 1000,
            tsc_base: 0,
            time_base: 0,
        });
        let st = hrperf_fmt_pebs::assist::drain(&buf, cpu, flags, clock, |rec| chunk.extend_from_slice(rec))
            .map_err(|e| KmodError::Buffer {
                cpu,
                what: format!("PEBS record area: {e:?}"),
            })?;
        if st.undecodable > 0 {
            return Err(KmodError::Buffer {
                cpu,
                what: format!("{} bytes of the PEBS record area do not decode", st.undecodable),
            });
        }
        Ok((cpu, st.records))
    }

    /// PEBS formats: if the kernel stopped PEBS on a CPU during the session because perf
    /// took the counter or DS area back (INFO's last refusal became a conflict), says so.
    pub fn pebs_conflict_note(&self) -> Option<String> {
        let now = self.dev.info().ok()?;
        let before = &self.module;
        let changed = (now.pebs_refusal, now.pebs_refusal_cpu, now.pebs_refusal_value)
            != (before.pebs_refusal, before.pebs_refusal_cpu, before.pebs_refusal_value);
        (changed && now.pebs_refusal == pebs_state::CONFLICT).then(|| {
            format!(
                "PEBS stopped on CPU {} during the recording: {} ({:#x}); its records up to then are kept",
                now.pebs_refusal_cpu,
                pebs_state::text(pebs_state::CONFLICT),
                now.pebs_refusal_value
            )
        })
    }

    /// A snapshot of every buffer's header (records, drops, overflows, ...).
    pub fn headers(&self) -> Result<Vec<BufferHeader>, KmodError> {
        (0..self.slots.len())
            .map(|i| self.buffer(i).map(|(_, b)| b.header()))
            .collect()
    }

    /// Copies every record published in the `i`-th CPU's ring (PAD skipped) into `chunk`
    /// (cleared first), reading them in place, then tells the kernel the new tail
    /// (`HRPERF_IOC_CONSUME`, which also acknowledges the readable state). Returns the CPU
    /// and the number of records copied.
    pub fn drain_cpu(&self, i: usize, chunk: &mut Vec<u8>) -> Result<(u32, u64), KmodError> {
        chunk.clear();
        let (cpu, buf) = self.buffer(i)?;
        let reader = RingReader::new(&buf).map_err(|e| KmodError::Buffer {
            cpu,
            what: e.to_string(),
        })?;
        let st = reader
            .read(|rec| chunk.extend_from_slice(rec))
            .map_err(|e| KmodError::Buffer {
                cpu,
                what: e.to_string(),
            })?;
        self.consume(cpu, st.tail)?;
        Ok((cpu, st.records))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the mapping from `create`, not used after this (type invariant).
        unsafe { self.sys.munmap(self.map, self.map_len) };
        // `dev` closes the file next: the kernel stops and frees the session unless
        // another process holds the file.
    }
}

/// The `HRPERF_IOC_CREATE` argument for `cfg`.
fn build_create(cfg: &KmodConfig, module: &ModuleInfo) -> Result<SessionCreate, KmodError> {
    let n = cfg.events.len();
    if n == 0 || n > MAX_COUNTERS {
        return Err(KmodError::Config(format!(
            "a session takes 1 to {MAX_COUNTERS} events, not {n}"
        )));
    }
    let name = fixed_name(&cfg.format)
        .ok_or_else(|| KmodError::Config(format!("format name '{}' is too long", cfg.format)))?;
    let zero = EventDesc {
        kind: 0,
        flags: 0,
        config: 0,
        config1: 0,
        config2: 0,
    };
    let mut events = [zero; MAX_COUNTERS];
    for (e, spec) in events.iter_mut().zip(&cfg.events) {
        *e = spec.desc;
    }
    let (mode, sample_period, poll_interval_ns) = match cfg.mode {
        Mode::Default if module.default_mode == MODE_OVERFLOW => (MODE_OVERFLOW, DEFAULT_PERIOD, 0),
        Mode::Default => (MODE_DEFAULT, 0, 0),
        Mode::Overflow { period: 0 } => {
            return Err(KmodError::Config(
                "the sampling period must be positive".into(),
            ))
        }
        Mode::Overflow { period } => (MODE_OVERFLOW, period, 0),
        Mode::Poll { interval_ns } => (MODE_POLL, 0, interval_ns),
        Mode::Instructed => (MODE_INSTRUCTED, 0, 0),
    };
    let mut cpus = CpuMask::EMPTY;
    if let Some(list) = &cfg.cpus {
        if list.is_empty() {
            return Err(KmodError::Config("empty CPU list".into()));
        }
        for &c in list {
            if !cpus.insert(c) {
                return Err(KmodError::Config(format!(
                    "CPU {c} is beyond the {MAX_CPUS} hrperf supports"
                )));
            }
        }
    }
    Ok(SessionCreate {
        size: core::mem::size_of::<SessionCreate>() as u32,
        flags: 0,
        format_name: name,
        format_uuid: hrperf_abi::Uuid::NIL,
        mode,
        nr_events: n as u32,
        events,
        sample_period,
        poll_interval_ns,
        cpus,
        data_size: cfg.data_size,
        fmt_arg_len: cfg.format_arg.len() as u32,
        reserved0: 0,
        fmt_arg: if cfg.format_arg.is_empty() {
            0
        } else {
            cfg.format_arg.as_ptr() as u64
        },
        reserved: [0; 4],
    })
}
