// SPDX-License-Identifier: GPL-2.0
//! fmt-aggregate.ko: the aggregating (double-buffered hash table) format as a kernel
//! module.
//!
//! The format's logic is `hrperf-fmt-aggregate` (`formats/aggregate/src`), compiled
//! here unchanged through `#[path]` together with the ABI and the engine it uses. This file only registers its table, [`AGGREGATE_OPS`](aggregate::AGGREGATE_OPS) with
//! `owner` set to this module, with hrperf-core.ko at load and unregisters it at unload.
//! While a session uses the format, hrperf-core holds a reference on this module, so
//! `rmmod fmt_aggregate` fails with `EBUSY`.
//!
//! The table carries `FMT_FL_INTERVALS`: hrperf-core treats `CONSUME` with
//! `tail = seq` as the acknowledgement of published interval `seq` (userspace maps
//! the buffers read-only), `CTRL_SWITCH` from the handler wakes the reader, and
//! `RESTART` switches at once.
//!
//! ```text
//! insmod hrperf-core.ko && insmod fmt-aggregate.ko     # "aggregate" is listed by HRPERF_IOC_FORMATS
//! ```

use core::ffi::c_void;

use kernel::prelude::*;

#[path = "../../../core-kmod/abi/src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod abi;
pub use abi::*;
/// `hrperf_abi::` paths (engine, format) name this crate, whose root re-exports [`abi`].
extern crate self as hrperf_abi;

#[path = "../../../core-kmod/engine/src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod engine;
pub use engine::*;
/// The engine and the ABI both have a `format` module; the ABI's is meant at the root.
pub use abi::format;
/// `hrperf_engine::` paths (the format) name this crate, whose root re-exports [`engine`].
extern crate self as hrperf_engine;

#[path = "../src/lib.rs"]
#[expect(unused_attributes, reason = "the crate-level #![no_std] of a file used as a module")]
pub mod aggregate;



mod core_api {
    use super::FormatOps;

    extern "C" {
        /// hrperf-core's `EXPORT_SYMBOL_GPL` registration (`hrperf_shim.c`).
        pub(super) fn hrperf_register_format(ops: *const FormatOps) -> kernel::ffi::c_int;
        /// Its counterpart; `-EBUSY` while sessions use the format.
        pub(super) fn hrperf_unregister_format(ops: *const FormatOps) -> kernel::ffi::c_int;
    }
}

module! {
    type: FmtAggregate,
    name: "fmt_aggregate",
    author: "hrperf",
    description: "hrperf aggregating sampling format (per-key counts, double-buffered)",
    license: "GPL",
}

/// The registered table, kept alive (and at a fixed address) until unregistered.
struct FmtAggregate {
    ops: KBox<FormatOps>,
}

impl kernel::Module for FmtAggregate {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let ops = KBox::new(
            FormatOps { owner: module.as_ptr().cast::<c_void>(), ..aggregate::AGGREGATE_OPS },
            GFP_KERNEL,
        )?;
        // SAFETY: `ops` is a valid table with `owner` = this module; it stays valid and
        // unmodified until `drop` unregisters it (hrperf-core pins us while in use).
        kernel::error::to_result(unsafe { core_api::hrperf_register_format(&*ops) })?;
        pr_info!("registered format \"aggregate\"\n");
        Ok(FmtAggregate { ops })
    }
}

impl Drop for FmtAggregate {
    fn drop(&mut self) {
        // SAFETY: the table we registered; no session uses it (they pin this module).
        let ret = unsafe { core_api::hrperf_unregister_format(&*self.ops) };
        if ret != 0 {
            pr_err!("unregistering \"aggregate\" failed: {}\n", ret);
        }
    }
}
