// SPDX-License-Identifier: GPL-2.0
//! hrperf-core.ko: `/dev/hrperf`, the format registry, and the three sample sources
//! (counter overflow, poll thread, instructed ioctls) in front of the hrperf engine.
//!
//! The ABI is `hrperf-abi` (`core-kmod/abi`, mirrored for C in `include/hrperf.h`); the
//! logic is `hrperf-engine` (`core-kmod/engine`). Both are compiled here unchanged
//! through `#[path]`; the crate root re-exports the ABI and is aliased as `hrperf_abi`,
//! so the engine's `hrperf_abi::` paths resolve to it. This crate is thin glue:
//!
//! - [`shim`]: the one module with FFI (the C shim `hrperf_shim.c` and its entry points);
//! - [`file`]: one open file = one session: ioctls, `mmap`, `poll`;
//! - [`session`]: per-CPU buffers, perf counters and engine state; overflow, poll and
//!   instructed sampling.
//! - [`pebs_pmu`]: zero-copy PEBS, the PMU side (detection, taking a counter beside
//!   perf, DS area and MSR programming, the NMI), on the CPU or a simulated PMU.
//!
//! From userspace (see `include/hrperf.h` and `core-kmod/abi/src/ioctl.rs`):
//!
//! ```text
//! insmod hrperf-core.ko [mode=overflow|poll|instructed] [poll_us=1000]
//!        [dev_mode=0600] [dev_gid=0] [pebs_sim=fmt0|fmt1|fmt2|fmt3|adaptive]
//!        [pebs_sim_busy=<cpu mask>]
//! insmod fmt-delta.ko                       # calls hrperf_register_format()
//! fd = open("/dev/hrperf", O_RDWR); ioctl(fd, HRPERF_IOC_CREATE, &create); ...
//! ```

use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use kernel::prelude::*;
use kernel::sync::Mutex;
use kernel::{new_mutex, pin_init};

#[path = "../abi/src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod abi;
pub use abi::*;
/// The engine's `hrperf_abi::` paths name this crate, whose root re-exports [`abi`].
extern crate self as hrperf_abi;

#[path = "../engine/src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod engine;
/// The aggregate and PEBS formats' `hrperf_engine::{Buffer, callback, pmu, ring}` name
/// the engine's, re-exported here.
pub use engine::{callback, pmu, ring, Buffer};
/// `hrperf_engine::` paths (the aggregate format) name this crate.
extern crate self as hrperf_engine;

/// The aggregating format's crate, for its consumer side only: `CONSUME` on a session
/// of a `FMT_FL_INTERVALS` format acknowledges an interval through
/// [`aggregate::consumer::AggView::ack_seq`] (the user mapping is read-only). The format
/// itself (its handler) is registered by fmt-aggregate.ko, not by this module.
#[path = "../../formats/aggregate/src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod aggregate;

/// The PEBS format's crate, for the PMU side of zero-copy PEBS ([`pebs_pmu`]): the DS
/// area and MSR sequences (`ds`), sharing the PMU with perf (`coexist`), the buffer
/// layout (`format`) and the simulated assist (`assist`). The format itself is
/// registered by fmt-pebs.ko, not by this module.
#[path = "../../formats/pebs/src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod pebs;

mod file;
mod pebs_pmu;
mod session;
mod shim;

use abi::format::{MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL};
use engine::{EngineError, Registry, Selector};

module! {
    type: HrperfCore,
    name: "hrperf_core",
    author: "hrperf",
    description: "hrperf: pluggable sampling-format framework for perf counters",
    license: "GPL",
}

/// Most formats registered at once.
const MAX_FORMATS: usize = 16;

/// hrperf-core's version, `major << 16 | minor << 8 | patch`.
const MODULE_VERSION: u32 = 0x00_01_00;

/// Module-wide state, created at load.
#[pin_data]
struct Globals {
    #[pin]
    registry: Mutex<Registry<MAX_FORMATS>>,
    sessions: AtomicU32,
    total_drops: AtomicU64,
    default_mode: u32,
    poll_us: u32,
    /// Zero-copy PEBS: which PMU, or why none.
    pebs: pebs_pmu::Support,
}

/// Set while the module is live (between init and exit); see [`globals`].
static GLOBALS: AtomicPtr<Globals> = AtomicPtr::new(core::ptr::null_mut());

/// The module-wide state. Every caller runs while the module is live: file operations
/// (the cdev pins the module), format registration (the caller depends on our symbols),
/// sessions (created by file operations).
fn globals() -> Result<&'static Globals> {
    let p = GLOBALS.load(Ordering::Acquire);
    // SAFETY: non-null only while `HrperfCore` owns the pinned box it points to, and
    // no caller can outlive the module (see above).
    unsafe { p.as_ref() }.ok_or(ENODEV)
}

/// An engine error as the errno the ioctl returns.
fn engine_err(e: EngineError) -> Error {
    Error::from_errno(-e.errno())
}

/// Parses `mode=`.
fn parse_mode(s: &[u8]) -> Option<u32> {
    match s {
        b"" | b"overflow" => Some(MODE_OVERFLOW),
        b"poll" => Some(MODE_POLL),
        b"instructed" => Some(MODE_INSTRUCTED),
        _ => None,
    }
}

/// Registers a format table (see [`shim::hrperf_register_format`]).
///
/// # Safety
///
/// `ops` is valid and unmodified until unregistered; its `owner` is its module.
unsafe fn register_format(ops: NonNull<FormatOps>) -> Result {
    // SAFETY: valid for reads (the caller's contract).
    if unsafe { ops.as_ref() }.owner.is_null() {
        return Err(EINVAL); // a kernel format must name its module, to be pinned
    }
    let g = globals()?;
    let mut reg = g.registry.lock();
    // SAFETY: the caller's contract; sessions pin `owner` while they use the table.
    unsafe { reg.register(ops) }.map_err(engine_err)?;
    pr_info!("format registered: {}\n", BStrName(ops));
    Ok(())
}

/// Unregisters the table `ops` (only that table, not another with its UUID).
fn unregister_format(ops: &FormatOps) -> Result {
    let g = globals()?;
    let mut reg = g.registry.lock();
    let f = reg.acquire(Selector::Uuid(ops.uuid)).map_err(engine_err)?;
    let same = core::ptr::eq(f.as_ptr().as_ptr(), ops);
    reg.release(f).map_err(engine_err)?;
    if !same {
        return Err(EINVAL);
    }
    reg.unregister(&ops.uuid).map_err(engine_err)
}

/// Displays a format table's name.
struct BStrName(NonNull<FormatOps>);

impl core::fmt::Display for BStrName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: only built in `register_format`, whose caller guarantees validity.
        let name = unsafe { self.0.as_ref() }.name();
        for &b in name {
            let c = if b.is_ascii_graphic() { b as char } else { '?' };
            core::fmt::Write::write_char(f, c)?;
        }
        Ok(())
    }
}

struct HrperfCore {
    _device: shim::Device,
    _globals: Pin<KBox<Globals>>,
}

impl kernel::Module for HrperfCore {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let Some(default_mode) = parse_mode(shim::param_mode()) else {
            pr_err!("mode= must be overflow, poll or instructed\n");
            return Err(EINVAL);
        };
        let poll_us = shim::param_poll_us();
        if !(session::MIN_POLL_NS / 1000..=session::MAX_POLL_NS / 1000).contains(&(poll_us as u64)) {
            pr_err!("poll_us= must be 10..=10000000\n");
            return Err(EINVAL);
        }
        let pebs = pebs_pmu::Support::detect()?;
        let globals = KBox::pin_init(
            pin_init!(Globals {
                registry <- new_mutex!(Registry::new(), "hrperf_registry"),
                sessions: AtomicU32::new(0),
                total_drops: AtomicU64::new(0),
                default_mode,
                poll_us,
                pebs,
            }),
            GFP_KERNEL,
        )?;
        let p: *const Globals = &*globals;
        GLOBALS.store(p.cast_mut(), Ordering::Release);
        let device = match shim::Device::register() {
            Ok(d) => d,
            Err(e) => {
                GLOBALS.store(core::ptr::null_mut(), Ordering::Release);
                return Err(e);
            }
        };
        pr_info!("loaded: /dev/hrperf, default mode {}, poll_us {}\n", default_mode, poll_us);
        Ok(HrperfCore { _device: device, _globals: globals })
    }
}

impl Drop for HrperfCore {
    fn drop(&mut self) {
        // `_device` is dropped after this body: no file is open (each pins the module),
        // and no format is registered (each depends on our symbols), so nothing uses
        // the globals any more.
        GLOBALS.store(core::ptr::null_mut(), Ordering::Release);
        pr_info!("unloaded\n");
    }
}
