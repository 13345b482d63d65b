//! The zero-copy PEBS format: perfmon2's `"pebs"` sampling format for hrperf.
//!
//! The CPU's DS save area lives in the per-CPU buffer's header that userspace maps; the
//! CPU's PEBS microcode writes records straight into the mapped pages; the format's
//! handler only counts and notifies at the interrupt threshold, and restart resets one
//! index. Nothing copies a record in the kernel (see `mission-anchors.md` §2.4).
//!
//! - [`layout`]: every PEBS record layout (fmt0 Core 2 .. fmt4/5 adaptive), encoders and
//!   never-panicking decoders, and PEBS detection from CPUID / PERF_CAPABILITIES.
//! - [`ds`]: the DS save area, the MSRs, the programming sequence behind
//!   [`ds::PebsMsrs`], "large PEBS" threshold sizing.
//! - [`datasrc`]: data-source decoding (Intel encodings per microarchitecture, perf's
//!   `perf_mem_data_src`) into one [`datasrc::MemAccess`].
//! - [`format`]: [`PEBS_OPS`] (name `"pebs"`, [`PEBS_UUID`], `FMT_FL_PEBS`), its buffer
//!   layout and argument [`PebsArg`].
//! - [`assist`]: a simulated PEBS assist and the zero-copy reader / capture wrapper.
//! - [`coexist`]: taking a CPU's PMU for PEBS beside perf in the kernel (verdict, claim,
//!   ownership checks).
//! - [`record`]: the capture record that carries one hardware record.
//!
//! `#![no_std]`, no allocation, no floats; modules name each other through `super::`
//! so the files compile unchanged as a module tree inside `fmt-pebs.ko`. Nothing here
//! has run on a PEBS-capable PMU: see the README.

#![no_std]
#![warn(missing_docs)]

use hrperf_abi::bytes;

pub mod assist;
pub mod coexist;
pub mod datasrc;
pub mod ds;
pub mod format;
pub mod layout;
pub mod record;

pub use format::{PebsArg, PEBS_NAME, PEBS_OPS, PEBS_UUID, PEBS_VERSION};
pub use layout::{Layout, PebsFormat};

#[cfg(test)]
mod tests;
