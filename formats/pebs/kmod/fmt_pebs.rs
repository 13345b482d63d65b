// SPDX-License-Identifier: GPL-2.0
//! fmt-pebs.ko: the zero-copy PEBS sampling format as a kernel module.
//!
//! The format's logic is `hrperf-fmt-pebs` (`formats/pebs/src`), compiled here
//! unchanged through `#[path]` together with the ABI and the engine it uses. This file only registers its table, [`PEBS_OPS`](pebs::PEBS_OPS) with
//! `owner` set to this module, with hrperf-core.ko at load and unregisters it at unload.
//! While a session uses the format, hrperf-core holds a reference on this module, so
//! `rmmod fmt_pebs` fails with `EBUSY`.
//!
//! The table carries `FMT_FL_PEBS`: hrperf-core overwrites the argument's PMU fields
//! (`ARG_FL_PMU_PRESENT`, `pebs_format`) with what the kernel detected before
//! `validate`, and refuses the session with `ENODEV` when no PEBS-capable PMU was
//! detected (see `pebs_detect` in `core-kmod/kmod/session.rs`). This module does not
//! program the DS area or the PEBS MSRs yet.
//!
//! ```text
//! insmod hrperf-core.ko && insmod fmt-pebs.ko     # "pebs" is listed by HRPERF_IOC_FORMATS
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
pub mod pebs;

#[path = "../../../core-kmod/kmod/format_glue.rs"]
mod glue;

module! {
    type: FmtPebs,
    name: "fmt_pebs",
    author: "hrperf",
    description: "hrperf zero-copy PEBS sampling format",
    license: "GPL",
}

/// Keeps the format registered while the module is loaded.
struct FmtPebs {
    _registration: glue::Registration,
}

impl kernel::Module for FmtPebs {
    fn init(module: &'static ThisModule) -> Result<Self> {
        Ok(FmtPebs { _registration: glue::Registration::new(module, &pebs::PEBS_OPS)? })
    }
}
