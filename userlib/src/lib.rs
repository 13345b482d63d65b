//! libhrperf: hrperf's userspace library.
//!
//! - [`source`]: where overflow and poll samples come from — `sim` (a simulated PMU),
//!   `perf` (`perf_event_open`), `kmod` (`/dev/hrperf`).
//! - [`capture`]: the self-describing capture file (`hrperf.data`), writer and reader.
//! - [`plugin`]: the decoder-plugin host (libloading).
//! - [`pebs_report`]: the memory-access profile of a PEBS capture.
//! - [`stacks`]: call-stack profiles of llc-stack captures (symbols, flame graphs).

pub mod agg_report;
pub mod capture;
pub mod decode;
pub mod import;
pub mod pebs_report;
pub mod plugin;
pub mod record;
pub mod source;
pub mod stacks;
pub mod symsnap;
