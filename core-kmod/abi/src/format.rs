//! The C-ABI table a format registers with the core, modelled on perfmon2's
//! `struct pfm_smpl_fmt` (`include/linux/perfmon_fmt.h`).
//!
//! A format is a table of callbacks. The core calls them in this order for a session:
//! `validate` → `getsize` → (the core allocates and fills the [`BufferHeader`] of each
//! CPU's buffer) → `init` per CPU → `start` … `handler` per overflow or poll tick …
//! `stop` → `restart` (after a NOTIFY/MASK, when userspace has consumed) → `exit` per CPU.
//!
//! It is C-ABI (`extern "C"` function pointers in a `#[repr(C)]` table) because
//! out-of-tree kernel modules can only share symbols through `EXPORT_SYMBOL_GPL`; the
//! same table is registered directly with the engine in userspace, so the format code
//! is identical in both places.
//!
//! [`BufferHeader`]: crate::BufferHeader

use core::ffi::c_void;

use crate::{MAX_COUNTERS, NAME_LEN};

/// Version of the format-ops ABI ([`FormatOps::abi_version`]).
pub const FORMAT_ABI_VERSION: u32 = 1;

abi_struct! {
    /// A 16-byte format identifier; formats are looked up by UUID or by name.
    #[derive(Hash, PartialOrd, Ord, Default)]
    pub struct Uuid(pub [u8; 16]);
}

impl Uuid {
    /// The nil UUID ("no format").
    pub const NIL: Uuid = Uuid([0; 16]);

    /// Whether this is the nil UUID.
    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl core::fmt::Display for Uuid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Handler control bit: reset the overflowed counter to `-period` (re-arm sampling).
pub const CTRL_RESET: u32 = 1 << 0;
/// Handler control bit: wake the reader (`poll()` on `/dev/hrperf`, the source's drain).
pub const CTRL_NOTIFY: u32 = 1 << 1;
/// Handler control bit: stop dispatching on this CPU until `restart` (buffer full).
pub const CTRL_MASK: u32 = 1 << 2;
/// Handler control bit: switch buffers (double-buffering formats).
pub const CTRL_SWITCH: u32 = 1 << 3;
/// All defined control bits.
pub const CTRL_ALL: u32 = CTRL_RESET | CTRL_NOTIFY | CTRL_MASK | CTRL_SWITCH;

/// Session mode: a sample on each overflow of the sampling counter.
pub const MODE_OVERFLOW: u32 = 0;
/// Session mode: read all counters every `poll_interval_ns` on each CPU.
pub const MODE_POLL: u32 = 1;
/// Session mode: read counters only when userspace asks.
pub const MODE_INSTRUCTED: u32 = 2;

abi_struct! {
    /// What a format is told about the session when validating, sizing and initialising.
    pub struct SessionParams {
        /// Bytes filled by the caller.
        pub size: u32,
        /// `MODE_*`.
        pub mode: u32,
        /// Counters programmed (1..=[`MAX_COUNTERS`]).
        pub nr_counters: u32,
        /// CPU being initialised (`init` only; `u32::MAX` for validate/getsize).
        pub cpu: u32,
        /// Overflow period of the sampling counter (overflow mode), else 0.
        pub sample_period: u64,
        /// Poll interval in ns (poll mode), else 0.
        pub poll_interval_ns: u64,
        /// Bytes of per-CPU data area the user asked for (0: the format's default).
        pub data_size_hint: u64,
        /// Session flags, reserved, zero.
        pub flags: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}
assert_layout!(SessionParams, size 48, align 8);

/// [`OverflowArg::kind`]: a counter overflowed.
pub const SAMPLE_OVERFLOW: u32 = 0;
/// [`OverflowArg::kind`]: a poll tick.
pub const SAMPLE_POLL: u32 = 1;
/// [`OverflowArg::kind`]: userspace asked for a read (instructed mode).
pub const SAMPLE_INSTRUCTED: u32 = 2;

abi_struct! {
    /// What the core hands a format's `handler` for each overflow or poll tick
    /// (perfmon2's `pfm_ovfl_arg`). Counter values are already 64-bit virtualised.
    pub struct OverflowArg {
        /// Bytes valid in this struct.
        pub size: u32,
        /// `SAMPLE_*`.
        pub kind: u32,
        /// CPU the sample was taken on.
        pub cpu: u32,
        /// Process id (tgid) interrupted, 0 if none or unknown.
        pub pid: u32,
        /// Thread id interrupted.
        pub tid: u32,
        /// Index of the counter that overflowed; `u32::MAX` for poll/instructed.
        pub ovfl_counter: u32,
        /// Number of valid entries in `values`.
        pub nr_counters: u32,
        /// Bit i set: counter i may have wrapped more than once since its last read.
        pub multi_wrap: u32,
        /// Timestamp in ns of the source's clock (see the capture header's clock).
        pub time_ns: u64,
        /// Interrupted instruction pointer (overflow mode), else 0.
        pub ip: u64,
        /// Data address if the source provides one (PEBS, perf `SAMPLE_ADDR`), else 0.
        pub addr: u64,
        /// Value the overflowed counter was last reset to (perfmon2's `pmd_last_reset`).
        pub last_reset: u64,
        /// 64-bit virtualised counter values, `nr_counters` of them.
        pub values: [u64; MAX_COUNTERS],
        /// `OVFL_FL_*` bits.
        pub flags: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}
assert_layout!(OverflowArg, size 136, align 8);

/// [`OverflowArg::flags`]: `ip` is a kernel address (the interrupted context was the
/// kernel), as the source knows it — never guessed from the address.
pub const OVFL_FL_KERNEL_IP: u32 = 1 << 0;

/// Services table the core offers to formats (`Services::ctx` is the core's).
pub type KernelStackFn = unsafe extern "C" fn(ctx: *mut c_void, out: *mut u64, max: u32) -> u32;
/// Captures the interrupted task's user stack into `out`; returns frames written.
pub type UserStackFn = unsafe extern "C" fn(ctx: *mut c_void, out: *mut u64, max: u32) -> u32;
/// Copies the interrupted task's command name (NUL-padded) into `out[..len]`; returns
/// the bytes of the name (without NUL).
pub type CommFn = unsafe extern "C" fn(ctx: *mut c_void, out: *mut u8, len: u32) -> u32;

/// Helpers the core offers a format during `handler`: things a format cannot do itself
/// in a portable way (stack capture needs the interrupted registers).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Services {
    /// Bytes valid in this struct.
    pub size: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Opaque context passed back to every service.
    pub ctx: *mut c_void,
    /// Kernel stack of the interrupted context, innermost first; `None` if unavailable.
    pub kernel_stack: Option<KernelStackFn>,
    /// User stack of the interrupted task, innermost first; `None` if unavailable.
    pub user_stack: Option<UserStackFn>,
    /// Command name of the interrupted task; `None` if unavailable. Appended in format
    /// ABI 1.1: read it through [`Services::comm_fn`], which checks `size`.
    pub comm: Option<CommFn>,
}
assert_layout!(Services, size 40, align 8);

impl Services {
    /// A table offering no services.
    pub const NONE: Services = Services {
        size: core::mem::size_of::<Services>() as u32,
        reserved: 0,
        ctx: core::ptr::null_mut(),
        kernel_stack: None,
        user_stack: None,
        comm: None,
    };

    /// Bytes of a table that ends with `kernel_stack` and `user_stack` (format ABI 1.0).
    pub const V1_SIZE: u32 = 32;

    /// The comm service, if the table is new enough to have it and offers it.
    pub fn comm_fn(&self) -> Option<CommFn> {
        if self.size as usize >= core::mem::size_of::<Services>() {
            self.comm
        } else {
            None
        }
    }
}

/// Checks the session and the format's argument bytes; 0 or `-errno`.
pub type ValidateFn =
    unsafe extern "C" fn(params: *const SessionParams, arg: *const u8, arg_len: usize) -> i32;
/// Writes the per-CPU buffer size needed (header included) to `*size`; 0 or `-errno`.
pub type GetSizeFn = unsafe extern "C" fn(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
    size: *mut u64,
) -> i32;
/// Lays out one CPU's buffer (its header is already filled by the core); 0 or `-errno`.
pub type InitFn = unsafe extern "C" fn(
    buf: *mut u8,
    buf_len: usize,
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> i32;
/// Handles one overflow or poll tick on the CPU owning `buf`; returns `CTRL_*` bits.
///
/// Runs in interrupt context in the kernel: no allocation, no sleeping, no locks.
pub type HandlerFn = unsafe extern "C" fn(
    buf: *mut u8,
    buf_len: usize,
    arg: *const OverflowArg,
    services: *const Services,
) -> u32;
/// Called when userspace restarts a CPU after NOTIFY/MASK; may set `CTRL_*` in `*ctrl`.
pub type RestartFn = unsafe extern "C" fn(buf: *mut u8, buf_len: usize, ctrl: *mut u32) -> i32;
/// Tears down one CPU's buffer; 0 or `-errno`.
pub type BufferFn = unsafe extern "C" fn(buf: *mut u8, buf_len: usize) -> i32;

/// Format flag: the format reads PEBS/DS hardware state (needs a PEBS-capable PMU).
pub const FMT_FL_PEBS: u32 = 1 << 0;
/// Format flag: the format's data area is a ring of records (the core can drain it).
pub const FMT_FL_RING: u32 = 1 << 1;
/// Format flag: the format wants kernel/user stacks through [`Services`].
pub const FMT_FL_STACKS: u32 = 1 << 2;
/// Format flag: the data area is published in intervals (double buffering): `CTRL_SWITCH`
/// publishes one, the reader acknowledges interval `seq` with `CONSUME` and
/// `tail = seq` (the mapping is read-only), `restart` switches.
pub const FMT_FL_INTERVALS: u32 = 1 << 3;

/// The table a format registers: `hrperf_register_format(&OPS)` in the kernel,
/// `Registry::register(&OPS)` in userspace.
///
/// # Invariants
///
/// `name` is NUL-terminated inside its field, `handler` is `Some`, and every callback
/// is safe to call with the pointers the core passes (documented on each type).
#[repr(C)]
#[derive(Debug)]
pub struct FormatOps {
    /// `size_of::<FormatOps>()` as compiled into the format.
    pub size: u32,
    /// [`FORMAT_ABI_VERSION`] the format was built against.
    pub abi_version: u32,
    /// Format name, NUL-padded (e.g. `"delta"`).
    pub name: [u8; NAME_LEN],
    /// Format UUID.
    pub uuid: Uuid,
    /// The format's own version, `major << 16 | minor`.
    pub version: u32,
    /// Largest argument the format accepts, in bytes (≤ 4096).
    pub arg_size: u32,
    /// `FMT_FL_*`.
    pub flags: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// `struct module *` of the format's module in the kernel (pinned while in use);
    /// null in userspace.
    pub owner: *mut c_void,
    /// See [`ValidateFn`].
    pub validate: Option<ValidateFn>,
    /// See [`GetSizeFn`].
    pub getsize: Option<GetSizeFn>,
    /// See [`InitFn`].
    pub init: Option<InitFn>,
    /// See [`HandlerFn`]; required.
    pub handler: Option<HandlerFn>,
    /// See [`RestartFn`].
    pub restart: Option<RestartFn>,
    /// See [`BufferFn`].
    pub exit: Option<BufferFn>,
    /// Called on each CPU buffer when the session starts; see [`BufferFn`].
    pub start: Option<BufferFn>,
    /// Called on each CPU buffer when the session stops; see [`BufferFn`].
    pub stop: Option<BufferFn>,
}
assert_layout!(FormatOps, size 144, align 8);

// SAFETY: the table is immutable after construction; `owner` is an opaque token the
// core only passes to `try_module_get`/`module_put`, never dereferenced from Rust.
unsafe impl Sync for FormatOps {}
// SAFETY: as above; the table holds no thread-affine state.
unsafe impl Send for FormatOps {}

impl FormatOps {
    /// The format's name as bytes (up to the first NUL).
    pub fn name(&self) -> &[u8] {
        crate::name_bytes(&self.name)
    }
}
