// SPDX-License-Identifier: GPL-2.0
//! What every `fmt-*.ko` does with hrperf-core.ko: register its format table at load and
//! unregister it at unload. Each format module includes this file through `#[path]`, so
//! hrperf-core's exported functions are declared in one place.

use core::ffi::c_void;

use kernel::prelude::*;

use crate::FormatOps;

extern "C" {
    /// hrperf-core's `EXPORT_SYMBOL_GPL` registration (`hrperf_shim.c`).
    fn hrperf_register_format(ops: *const FormatOps) -> kernel::ffi::c_int;
    /// Its counterpart; refused while sessions use the format.
    fn hrperf_unregister_format(ops: *const FormatOps) -> kernel::ffi::c_int;
}

/// A format table registered with hrperf-core for as long as this value lives. The table
/// is a copy at a fixed address with `owner` set to the format's module, so hrperf-core
/// can pin the module while a session uses the format.
pub(crate) struct Registration {
    ops: KBox<FormatOps>,
}

impl Registration {
    /// Registers a copy of `ops` owned by `module`.
    pub(crate) fn new(module: &'static ThisModule, ops: &FormatOps) -> Result<Self> {
        let ops = KBox::new(FormatOps { owner: module.as_ptr().cast::<c_void>(), ..*ops }, GFP_KERNEL)?;
        // SAFETY: `ops` is a valid table with `owner` = this module; it stays valid and
        // unmodified until `drop` unregisters it (hrperf-core pins the module while in use).
        kernel::error::to_result(unsafe { hrperf_register_format(&*ops) })?;
        pr_info!("registered format \"{}\"\n", name(&ops));
        Ok(Registration { ops })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: the table registered in `new`; no session uses it (they pin the module).
        let ret = unsafe { hrperf_unregister_format(&*self.ops) };
        if ret != 0 {
            pr_err!("unregistering \"{}\" failed: {}\n", name(&self.ops), ret);
        }
    }
}

fn name(ops: &FormatOps) -> &str {
    core::str::from_utf8(ops.name()).unwrap_or("?")
}
