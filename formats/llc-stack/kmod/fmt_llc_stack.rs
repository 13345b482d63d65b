// SPDX-License-Identifier: GPL-2.0
//! fmt-llc-stack.ko: the call-stack-on-LLC-miss sampling format as a kernel module.
//!
//! The format's logic is `hrperf-fmt-llc-stack` (`formats/llc-stack/src`), compiled here
//! unchanged through `#[path]` together with the ABI and the engine it uses (the ring
//! writer). This file only registers [`LLC_STACK_OPS`](llc_stack::LLC_STACK_OPS) with
//! hrperf-core.ko; the stacks come from hrperf-core's `Services` (the kernel unwinder,
//! a non-faulting user frame-pointer walk, the task's comm). While a session uses the
//! format, hrperf-core holds a reference on this module, so `rmmod fmt_llc_stack` fails
//! with `EBUSY`.
//!
//! ```text
//! insmod hrperf-core.ko && insmod fmt-llc-stack.ko   # "llc-stack" is listed by HRPERF_IOC_FORMATS
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
pub mod llc_stack;

#[path = "../../../core-kmod/kmod/format_glue.rs"]
mod glue;

module! {
    type: FmtLlcStack,
    name: "fmt_llc_stack",
    author: "hrperf",
    description: "hrperf call-stack-on-LLC-miss sampling format",
    license: "GPL",
}

/// Keeps the format registered while the module is loaded.
struct FmtLlcStack {
    _registration: glue::Registration,
}

impl kernel::Module for FmtLlcStack {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let ops = &llc_stack::LLC_STACK_OPS;
        Ok(FmtLlcStack { _registration: glue::Registration::new(module, ops)? })
    }
}
