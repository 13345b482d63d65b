//! `/dev/hrperf` ioctls: numbers defined once, argument structs sized (crate rules 1–5).
//!
//! One open file is one session (perfmon2's context). From userspace:
//!
//! ```text
//! fd = open("/dev/hrperf", O_RDWR);
//! ioctl(fd, HRPERF_IOC_INFO, &info);            // module version, mode, formats
//! ioctl(fd, HRPERF_IOC_CREATE, &create);        // format + events + mode + CPUs
//! ioctl(fd, HRPERF_IOC_BUFFERS, &bufs);         // where each CPU's buffer is mapped
//! base = mmap(NULL, n * buf_size, PROT_READ, MAP_SHARED, fd, 0);
//! ioctl(fd, HRPERF_IOC_START);
//! poll(fd) ... read records in place, ioctl(fd, HRPERF_IOC_CONSUME, &c) ...
//! ioctl(fd, HRPERF_IOC_STOP); close(fd);
//! ```
//!
//! The kernel matches on the command's type and number; the argument's own `size` field,
//! not the size bits of the command, decides how many bytes are read.

use crate::event::EventDesc;
use crate::format::Uuid;
use crate::{CpuMask, MAX_COUNTERS, NAME_LEN};

/// The ioctl type byte of `/dev/hrperf`.
pub const IOC_MAGIC: u8 = b'H';

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Linux `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (dir << IOC_DIRSHIFT)
        | ((ty as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}
/// Linux `_IO`.
pub const fn io(nr: u8) -> u32 {
    ioc(IOC_NONE, IOC_MAGIC, nr, 0)
}
/// Linux `_IOR`: the kernel writes the argument.
pub const fn ior<T>(nr: u8) -> u32 {
    ioc(IOC_READ, IOC_MAGIC, nr, core::mem::size_of::<T>())
}
/// Linux `_IOW`: the kernel reads the argument.
pub const fn iow<T>(nr: u8) -> u32 {
    ioc(IOC_WRITE, IOC_MAGIC, nr, core::mem::size_of::<T>())
}
/// Linux `_IOWR`.
pub const fn iowr<T>(nr: u8) -> u32 {
    ioc(IOC_READ | IOC_WRITE, IOC_MAGIC, nr, core::mem::size_of::<T>())
}
/// The `nr` field of a command.
pub const fn ioc_nr(cmd: u32) -> u8 {
    (cmd >> IOC_NRSHIFT) as u8
}
/// The type field of a command.
pub const fn ioc_type(cmd: u32) -> u8 {
    (cmd >> IOC_TYPESHIFT) as u8
}

/// Module and ABI description: [`ModuleInfo`].
pub const HRPERF_IOC_INFO: u32 = iowr::<ModuleInfo>(0x00);
/// Registered formats: [`FormatList`] pointing at [`FormatInfo`] entries.
pub const HRPERF_IOC_FORMATS: u32 = iowr::<FormatList>(0x01);
/// Create this file's session: [`SessionCreate`].
pub const HRPERF_IOC_CREATE: u32 = iow::<SessionCreate>(0x02);
/// Start (or resume) counting and sampling.
pub const HRPERF_IOC_START: u32 = io(0x03);
/// Stop/pause; buffers stay mapped and readable.
pub const HRPERF_IOC_STOP: u32 = io(0x04);
/// Restart a CPU after NOTIFY/MASK: [`CpuArg`].
pub const HRPERF_IOC_RESTART: u32 = iow::<CpuArg>(0x05);
/// Destroy the session (also done on close).
pub const HRPERF_IOC_DESTROY: u32 = io(0x06);
/// Per-CPU statistics: [`StatsArg`] pointing at [`CpuStats`] entries.
pub const HRPERF_IOC_STATS: u32 = iowr::<StatsArg>(0x07);
/// Where each CPU's buffer lies in the mmap: [`BuffersArg`] → [`BufferSlot`] entries.
pub const HRPERF_IOC_BUFFERS: u32 = iowr::<BuffersArg>(0x08);
/// Consumer progress on a ring buffer (the mapping is read-only): [`ConsumeArg`].
pub const HRPERF_IOC_CONSUME: u32 = iow::<ConsumeArg>(0x09);
/// Instructed mode: read all counters on every CPU of the session now.
pub const HRPERF_IOC_POLL: u32 = io(0x10);
/// Instructed mode: publish what was read so far (advance the readable head, NOTIFY).
pub const HRPERF_IOC_LOG: u32 = io(0x11);
/// Instructed mode: both, in one call.
pub const HRPERF_IOC_POLL_LOG: u32 = io(0x12);

/// [`ModuleInfo::abi_version`] of this crate.
pub const IOCTL_ABI_VERSION: u32 = 1;

abi_struct! {
    /// Answer of [`HRPERF_IOC_INFO`].
    #[derive(Default)]
    pub struct ModuleInfo {
        /// In: bytes the caller provides; out: bytes the kernel filled.
        pub size: u32,
        /// [`IOCTL_ABI_VERSION`] of the module.
        pub abi_version: u32,
        /// Module version, `major << 16 | minor << 8 | patch`.
        pub module_version: u32,
        /// Default mode (`MODE_*`, the `mode=` module parameter).
        pub default_mode: u32,
        /// Default poll interval in µs (`poll_us=`).
        pub poll_us: u32,
        /// Registered formats.
        pub nr_formats: u32,
        /// Open sessions.
        pub nr_sessions: u32,
        /// Online CPUs.
        pub nr_cpus: u32,
        /// Samples dropped over all sessions since load.
        pub total_drops: u64,
        /// What the module found about zero-copy PEBS ([`pebs_state`]; 0: a module
        /// that does not report it).
        pub pebs_state: u32,
        /// The detected `PebsFormat` word (`hrperf_fmt_pebs::PebsFormat`; 0: none).
        pub pebs_format: u32,
        /// Why the last PEBS session was refused or disturbed ([`pebs_state`]; 0: none).
        pub pebs_refusal: u32,
        /// The CPU that refusal names (`u32::MAX`: none, or not one CPU).
        pub pebs_refusal_cpu: u32,
        /// The MSR value behind it (IA32_PEBS_ENABLE found set, the enabled counters, the
        /// foreign event select), 0 if none.
        pub pebs_refusal_value: u64,
        /// TSC frequency in kHz (the kernel's `tsc_khz`; 0: unknown), to convert PEBS
        /// records' TSC into time.
        pub tsc_khz: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}
assert_layout!(ModuleInfo, size 72, align 8);

/// [`ModuleInfo::pebs_state`] and [`ModuleInfo::pebs_refusal`]: zero-copy PEBS as
/// hrperf-core found it. 1–2 usable; 10–19 never on this machine (`ENODEV`, or
/// `EOPNOTSUPP` for [`KPTI`](pebs_state::KPTI)); 20–22 busy now (`EBUSY`); 23 a request
/// the hardware path cannot do (`EINVAL`).
pub mod pebs_state {
    /// Not reported (an older module).
    pub const UNKNOWN: u32 = 0;
    /// Usable: the CPU's own PEBS, DS area in the mapped buffers.
    pub const HARDWARE: u32 = 1;
    /// Usable: the simulated PMU (`pebs_sim=` module parameter), the same kernel path
    /// with a modelled MSR file and PEBS assist.
    pub const SIMULATED: u32 = 2;
    /// perf has no hardware PMU (virtual machines usually have none).
    pub const NO_PMU: u32 = 10;
    /// Not an Intel CPU (AMD has IBS, not PEBS).
    pub const NOT_INTEL: u32 = 11;
    /// CPUID reports no debug store (DS).
    pub const NO_DEBUG_STORE: u32 = 12;
    /// Only the 32-bit DS layout (no DTES64).
    pub const NO_DTES64: u32 = 13;
    /// IA32_MISC_ENABLE says PEBS is unavailable.
    pub const PEBS_UNAVAILABLE: u32 = 14;
    /// A PEBS record format hrperf does not know.
    pub const UNKNOWN_FORMAT: u32 = 15;
    /// No architectural performance monitoring (CPUID leaf 0xA).
    pub const NO_ARCH_PERFMON: u32 = 16;
    /// A hybrid CPU (P- and E-cores with different PMUs): not supported yet.
    pub const HYBRID: u32 = 17;
    /// Kernel page-table isolation is on: the CPU writes PEBS records through the user
    /// page tables too, which map only perf's `cpu_entry_area` buffers.
    pub const KPTI: u32 = 18;
    /// A PMU MSR could not be read.
    pub const MSR_UNREADABLE: u32 = 19;
    /// perf has PEBS events on the CPU (IA32_PEBS_ENABLE is not zero).
    pub const PEBS_IN_USE: u32 = 20;
    /// Every PEBS-capable general-purpose counter of the CPU is in use.
    pub const NO_FREE_COUNTER: u32 = 21;
    /// perf took the counter, PEBS or DS area hrperf had programmed during the session
    /// (PEBS stopped on that CPU, perf's DS area restored).
    pub const CONFLICT: u32 = 22;
    /// The event cannot be a hardware PEBS event: one raw (`rNNNN`) or generic hardware
    /// event is needed.
    pub const BAD_EVENT: u32 = 23;

    /// What `state` means, in a few words.
    pub const fn text(state: u32) -> &'static str {
        match state {
            UNKNOWN => "not reported by this module",
            HARDWARE => "available: the CPU's PEBS, zero-copy",
            SIMULATED => "available: simulated PMU (pebs_sim=), zero-copy",
            NO_PMU => "no hardware PMU (virtual machines usually have none)",
            NOT_INTEL => "not an Intel CPU (PEBS is Intel's)",
            NO_DEBUG_STORE => "the CPU has no debug store (CPUID DS)",
            NO_DTES64 => "the CPU has only the 32-bit debug store (no DTES64)",
            PEBS_UNAVAILABLE => "IA32_MISC_ENABLE says PEBS is unavailable",
            UNKNOWN_FORMAT => "a PEBS record format hrperf does not know",
            NO_ARCH_PERFMON => "no architectural performance monitoring (CPUID leaf 0xA)",
            HYBRID => "hybrid CPUs (P- and E-cores) are not supported yet",
            KPTI => "kernel page-table isolation (KPTI) is on: the CPU would write PEBS records through user page tables that do not map hrperf's buffers (boot with pti=off, or use --source perf)",
            MSR_UNREADABLE => "a PMU MSR could not be read",
            PEBS_IN_USE => "perf is using PEBS on that CPU (IA32_PEBS_ENABLE is set)",
            NO_FREE_COUNTER => "every PEBS-capable counter of that CPU is in use by perf",
            CONFLICT => "perf took over the counter or DS area during the session; PEBS stopped on that CPU",
            BAD_EVENT => "hardware PEBS needs exactly one raw (rNNNN) or generic hardware event",
            _ => "unknown PEBS state",
        }
    }

    /// The errno a session refused for `state` gets.
    pub const fn errno(state: u32) -> i32 {
        use crate::errno::{EBUSY, EINVAL, ENODEV, EOPNOTSUPP};
        match state {
            KPTI => EOPNOTSUPP,
            PEBS_IN_USE | NO_FREE_COUNTER | CONFLICT => EBUSY,
            BAD_EVENT => EINVAL,
            _ => ENODEV,
        }
    }
}

abi_struct! {
    /// One registered format, as listed by [`HRPERF_IOC_FORMATS`].
    pub struct FormatInfo {
        /// Name, NUL-padded.
        pub name: [u8; NAME_LEN],
        /// UUID.
        pub uuid: Uuid,
        /// `major << 16 | minor`.
        pub version: u32,
        /// `FMT_FL_*`.
        pub flags: u32,
        /// Largest argument accepted.
        pub arg_size: u32,
        /// Sessions using it now.
        pub users: u32,
    }
}
assert_layout!(FormatInfo, size 64, align 4);

abi_struct! {
    /// Argument of [`HRPERF_IOC_FORMATS`].
    pub struct FormatList {
        /// Bytes filled by the caller.
        pub size: u32,
        /// In: entries `entries` has room for.
        pub capacity: u32,
        /// Out: formats registered (may exceed `capacity`; only `capacity` are written).
        pub count: u32,
        /// Reserved, zero.
        pub reserved: u32,
        /// User pointer to `capacity` [`FormatInfo`] entries.
        pub entries: u64,
    }
}
assert_layout!(FormatList, size 24, align 8);

abi_struct! {
    /// Argument of [`HRPERF_IOC_CREATE`].
    pub struct SessionCreate {
        /// Bytes filled by the caller.
        pub size: u32,
        /// Reserved flags, zero.
        pub flags: u32,
        /// Format by name (NUL-padded), or all zero to select by `format_uuid`.
        pub format_name: [u8; NAME_LEN],
        /// Format by UUID, or nil to select by name.
        pub format_uuid: Uuid,
        /// `MODE_*`; [`MODE_DEFAULT`] asks for the module's default.
        pub mode: u32,
        /// Valid entries in `events` (1..=8).
        pub nr_events: u32,
        /// The events, leader (sampling counter) first.
        pub events: [EventDesc; MAX_COUNTERS],
        /// Overflow period of the leader (overflow mode).
        pub sample_period: u64,
        /// Poll interval in ns (poll mode); 0 asks for the module's `poll_us`.
        pub poll_interval_ns: u64,
        /// CPUs to monitor; empty means all online CPUs.
        pub cpus: CpuMask,
        /// Per-CPU data area size hint in bytes (0: the format's default).
        pub data_size: u64,
        /// Length of the format argument at `fmt_arg`.
        pub fmt_arg_len: u32,
        /// Reserved, zero.
        pub reserved0: u32,
        /// User pointer to the format argument (`fmt_arg_len` bytes).
        pub fmt_arg: u64,
        /// Reserved, zero.
        pub reserved: [u64; 4],
    }
}
assert_layout!(SessionCreate, size 424, align 8);

/// [`SessionCreate::mode`] asking for the module's default mode.
pub const MODE_DEFAULT: u32 = u32::MAX;

abi_struct! {
    /// A CPU argument ([`HRPERF_IOC_RESTART`]).
    pub struct CpuArg {
        /// Bytes filled by the caller.
        pub size: u32,
        /// The CPU, or `u32::MAX` for all CPUs of the session.
        pub cpu: u32,
    }
}
assert_layout!(CpuArg, size 8, align 4);

abi_struct! {
    /// Counters of one CPU of a session.
    #[derive(Default)]
    pub struct CpuStats {
        /// The CPU.
        pub cpu: u32,
        /// Non-zero while the format has this CPU masked.
        pub masked_now: u32,
        /// Records written.
        pub records: u64,
        /// Records dropped (buffer full).
        pub drops: u64,
        /// Overflows or ticks dispatched.
        pub overflows: u64,
        /// Overflows that arrived while masked.
        pub masked: u64,
        /// Samples flagged as possibly hiding a second counter wrap.
        pub multi_wraps: u64,
        /// Poll ticks run on this CPU.
        pub poll_ticks: u64,
        /// Poll ticks missed because the previous one was still late.
        pub missed_ticks: u64,
    }
}
assert_layout!(CpuStats, size 64, align 8);

abi_struct! {
    /// Argument of [`HRPERF_IOC_STATS`].
    pub struct StatsArg {
        /// Bytes filled by the caller.
        pub size: u32,
        /// In: room in `entries`; out: CPUs in the session.
        pub count: u32,
        /// User pointer to [`CpuStats`] entries.
        pub entries: u64,
    }
}
assert_layout!(StatsArg, size 16, align 8);

abi_struct! {
    /// Where one CPU's buffer lies in the session's mapping.
    pub struct BufferSlot {
        /// The CPU.
        pub cpu: u32,
        /// Reserved, zero.
        pub reserved: u32,
        /// Offset of its [`crate::BufferHeader`] from the start of the mapping.
        pub offset: u64,
    }
}
assert_layout!(BufferSlot, size 16, align 8);

abi_struct! {
    /// Argument of [`HRPERF_IOC_BUFFERS`].
    pub struct BuffersArg {
        /// Bytes filled by the caller.
        pub size: u32,
        /// In: room in `entries`; out: buffers in the session.
        pub count: u32,
        /// Out: size of each buffer (page-aligned); the mapping is `count * buf_size`.
        pub buf_size: u64,
        /// User pointer to [`BufferSlot`] entries.
        pub entries: u64,
    }
}
assert_layout!(BuffersArg, size 24, align 8);

abi_struct! {
    /// Argument of [`HRPERF_IOC_CONSUME`]: the reader has consumed up to `tail`.
    pub struct ConsumeArg {
        /// Bytes filled by the caller.
        pub size: u32,
        /// The CPU whose ring was read.
        pub cpu: u32,
        /// New consumer position (monotonic bytes, ≤ the buffer's `head`).
        pub tail: u64,
    }
}
assert_layout!(ConsumeArg, size 16, align 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_linux_encoding() {
        // _IO('H', 3) = 0x4803; _IOW('H', 5, 8 bytes) = 0x40084805.
        assert_eq!(HRPERF_IOC_START, 0x4803);
        assert_eq!(HRPERF_IOC_RESTART, 0x4008_4805);
        assert_eq!(ioc_nr(HRPERF_IOC_CREATE), 2);
        assert_eq!(ioc_type(HRPERF_IOC_CREATE), b'H');
        assert_eq!(HRPERF_IOC_INFO >> 30, 3);
    }
}
