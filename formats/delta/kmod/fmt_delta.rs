// SPDX-License-Identifier: GPL-2.0
//! fmt-delta.ko: the counter-delta sampling format as a kernel module.
//!
//! The format's logic is `hrperf-fmt-delta` (`formats/delta/src`), compiled here
//! unchanged through `#[path]` together with the ABI and the engine it uses (the ring
//! writer). This file only registers its table, [`DELTA_OPS`](delta::DELTA_OPS) with
//! `owner` set to this module, with hrperf-core.ko at load and unregisters it at unload.
//! While a session uses the format, hrperf-core holds a reference on this module, so
//! `rmmod fmt_delta` fails with `EBUSY`.
//!
//! ```text
//! insmod hrperf-core.ko && insmod fmt-delta.ko     # "delta" is listed by HRPERF_IOC_FORMATS
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
pub mod delta;

#[path = "../../../core-kmod/kmod/format_glue.rs"]
mod glue;

module! {
    type: FmtDelta,
    name: "fmt_delta",
    author: "hrperf",
    description: "hrperf counter-delta sampling format",
    license: "GPL",
}

/// Keeps the format registered while the module is loaded.
struct FmtDelta {
    _registration: glue::Registration,
}

impl kernel::Module for FmtDelta {
    fn init(module: &'static ThisModule) -> Result<Self> {
        Ok(FmtDelta { _registration: glue::Registration::new(module, &delta::DELTA_OPS)? })
    }
}
