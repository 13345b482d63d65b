// SPDX-License-Identifier: GPL-2.0
//! Throwaway module proving the out-of-tree Rust module toolchain end to end.

use kernel::prelude::*;

module! {
    type: HelloSelftest,
    name: "hello_selftest",
    author: "hrperf",
    description: "hrperf VM toolchain self-test",
    license: "GPL",
}

struct HelloSelftest;

impl kernel::Module for HelloSelftest {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        pr_info!("hrperf selftest: init\n");
        Ok(HelloSelftest)
    }
}

impl Drop for HelloSelftest {
    fn drop(&mut self) {
        pr_info!("hrperf selftest: exit\n");
    }
}
