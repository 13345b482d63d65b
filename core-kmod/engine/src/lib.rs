//! hrperf's core logic, shared by `hrperf-core.ko` and the userspace sources.
//!
//! `#![no_std]`, no allocation, no floats, no panics on data from outside: the kernel
//! module compiles these files unchanged, and userspace runs the very same code behind
//! the `perf` and `sim` sources. Inside the crate, modules name each other through
//! `super::`, so the files also work when included as a module tree.
//!
//! The pieces, in the order a session uses them:
//!
//! - [`registry`]: formats register their [`FormatOps`](hrperf_abi::FormatOps) table;
//!   sessions look a format up and pin it ([`Registry::acquire`]).
//! - [`format`]: [`Format`], a safe handle over a validated table.
//! - [`session`]: [`Session`] runs validate → getsize, then [`Session::init_cpu`] gives one
//!   [`CpuSession`] per CPU, whose [`CpuSession::dispatch`] turns a raw [`Sample`] into an
//!   [`OverflowArg`](hrperf_abi::OverflowArg) and calls the format's handler.
//! - [`counter`]: 64-bit virtualisation of 32..64-bit hardware counters.
//! - [`ring`]: the per-CPU [`Buffer`], its record ring writer and reader.
//! - [`poll`]: drift-free poll deadlines.
//! - [`pmu`]: the PMU programming model that the kernel and the simulator implement.
//!
//! # A session, from the caller's side
//!
//! ```
//! use hrperf_abi::format::{SessionParams, MODE_POLL, SAMPLE_POLL};
//! use hrperf_abi::{Services, BufferHeader};
//! # use hrperf_abi::format::{FormatOps, FORMAT_ABI_VERSION, OverflowArg};
//! # use hrperf_abi::Uuid;
//! # unsafe extern "C" fn handler(_: *mut u8, _: usize, _: *const OverflowArg,
//! #     _: *const hrperf_abi::Services) -> u32 { 0 }
//! # static OPS: FormatOps = FormatOps {
//! #     size: core::mem::size_of::<FormatOps>() as u32, abi_version: FORMAT_ABI_VERSION,
//! #     name: *b"doc\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
//! #     uuid: Uuid([7; 16]), version: 0x1_0000, arg_size: 0, flags: 0, reserved: 0,
//! #     owner: core::ptr::null_mut(), validate: None, getsize: None, init: None,
//! #     handler: Some(handler), restart: None, exit: None, start: None, stop: None };
//! use hrperf_engine::{Buffer, CounterConfig, Registry, Sample, Selector, Session};
//!
//! let mut registry: Registry<8> = Registry::new();
//! registry.register_static(&OPS).unwrap();
//! let format = registry.acquire(Selector::Name(b"doc")).unwrap();
//!
//! let params = SessionParams {
//!     size: core::mem::size_of::<SessionParams>() as u32,
//!     mode: MODE_POLL,
//!     nr_counters: 1,
//!     cpu: u32::MAX,
//!     sample_period: 0,
//!     poll_interval_ns: 1_000_000,
//!     data_size_hint: 0,
//!     flags: 0,
//!     reserved: 0,
//! };
//! let counters = [CounterConfig { width: 48, max_rate_per_sec: 0 }];
//! let session = Session::new(format, &params, &[], &counters).unwrap();
//!
//! // One buffer per CPU, `buffer_size()` bytes, 8-byte aligned.
//! let mut words = vec![0u64; (session.buffer_size() as usize).div_ceil(8)];
//! let mut buf = Buffer::from_words(&mut words).unwrap();
//! let mut cpu0 = session.init_cpu(0, &mut buf, &[]).unwrap();
//! cpu0.start(&mut buf, &[0; 8], 0).unwrap();
//!
//! let mut sample = Sample { kind: SAMPLE_POLL, nr: 1, ovfl_counter: u32::MAX, ..Sample::default() };
//! sample.raw[0] = 1000;
//! sample.time_ns = 1_000_000;
//! let ctrl = cpu0.dispatch(&mut buf, &sample, &Services::NONE);
//! assert_eq!(ctrl, 0);
//! assert_eq!(buf.header().overflows, 1);
//!
//! cpu0.stop(&mut buf).unwrap();
//! cpu0.exit(&mut buf).unwrap();
//! registry.release(session.format()).unwrap();
//! ```

#![no_std]
#![warn(missing_docs)]

pub mod callback;
pub mod counter;
pub mod error;
pub mod format;
pub mod pmu;
pub mod poll;
pub mod registry;
pub mod ring;
pub mod session;

pub use counter::{Update, VirtualCounter};
pub use error::EngineError;
pub use format::Format;
pub use poll::{PollSchedule, Tick};
pub use registry::{Registry, Selector};
pub use ring::{Buffer, ReadStats, RingLayout, RingReader, RingWriter, WriteError};
pub use session::{CounterConfig, CpuSession, CpuState, Sample, Session};
