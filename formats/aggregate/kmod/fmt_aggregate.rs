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

#[path = "../../../core-kmod/kmod/format_glue.rs"]
mod glue;

module! {
    type: FmtAggregate,
    name: "fmt_aggregate",
    author: "hrperf",
    description: "hrperf aggregating sampling format (per-key counts, double-buffered)",
    license: "GPL",
}

/// Keeps the format registered while the module is loaded.
struct FmtAggregate {
    _registration: glue::Registration,
}

impl kernel::Module for FmtAggregate {
    fn init(module: &'static ThisModule) -> Result<Self> {
        Ok(FmtAggregate { _registration: glue::Registration::new(module, &aggregate::AGGREGATE_OPS)? })
    }
}
