//! How an event is named to the kernel and in the capture file.

abi_struct! {
    /// One event's encoding, perf_event_attr style, so the same description drives
    /// `perf_event_open`, `perf_event_create_kernel_counter` and the simulated PMU.
    pub struct EventDesc {
        /// `PERF_TYPE_*` (0 hardware, 1 software, 3 hw-cache, 4 raw) or [`EVENT_TYPE_SIM`].
        pub kind: u32,
        /// `EVENT_FL_*` bits.
        pub flags: u32,
        /// `perf_event_attr.config`.
        pub config: u64,
        /// `perf_event_attr.config1` (e.g. offcore response, load-latency threshold).
        pub config1: u64,
        /// `perf_event_attr.config2`.
        pub config2: u64,
    }
}
assert_layout!(EventDesc, size 32, align 8);

/// `PERF_TYPE_HARDWARE`.
pub const EVENT_TYPE_HARDWARE: u32 = 0;
/// `PERF_TYPE_SOFTWARE`.
pub const EVENT_TYPE_SOFTWARE: u32 = 1;
/// `PERF_TYPE_HW_CACHE`.
pub const EVENT_TYPE_HW_CACHE: u32 = 3;
/// `PERF_TYPE_RAW`.
pub const EVENT_TYPE_RAW: u32 = 4;
/// An event of the simulated PMU; `config` is the simulator's event number.
pub const EVENT_TYPE_SIM: u32 = 0x4853_494d; // "HSIM"

/// Count user-space events only.
pub const EVENT_FL_USER_ONLY: u32 = 1 << 0;
/// Count kernel-space events only.
pub const EVENT_FL_KERNEL_ONLY: u32 = 1 << 1;
/// Ask for a precise (PEBS) event; `precise_ip` in bits 8..10.
pub const EVENT_FL_PRECISE: u32 = 1 << 2;
