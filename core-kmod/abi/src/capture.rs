//! The capture file (`hrperf.data`): self-describing, so a decoder never needs build flags.
//!
//! ```text
//! FileHeader (header_size bytes)
//! metadata: Section{kind,size} + payload (padded to 8), ... (metadata_size bytes in all)
//! chunks:   ChunkHeader + payload (records, or stats), ... until EOF
//!           the last chunks of a finished recording are STATS then END
//! ```
//!
//! All integers are in the writer's byte order, which [`FileHeader::byte_order`] shows.
//! Checksums are CRC-32 (IEEE, as zlib's `crc32`): [`FileHeader::header_crc32`] covers the
//! header (with that field zeroed) and the metadata; each [`ChunkHeader::crc32`] covers
//! its chunk header (with that field zeroed) and payload. Corruption anywhere is detected
//! and reported by offset; chunks before a damaged one still decode.

use crate::format::Uuid;
use crate::NAME_LEN;

/// [`FileHeader::magic`].
pub const FILE_MAGIC: [u8; 8] = *b"HRPERFDT";
/// [`FileHeader::byte_order`] as written; read back swapped on a host of the other
/// byte order.
pub const BYTE_ORDER_MARK: u32 = 0x0102_0304;
/// Current [`FileHeader::version`] (bumped only for incompatible changes).
pub const FILE_VERSION: u32 = 1;

/// [`FileHeader::source`]: the simulated PMU.
pub const SOURCE_SIM: u32 = 1;
/// [`FileHeader::source`]: `perf_event_open` in userspace.
pub const SOURCE_PERF: u32 = 2;
/// [`FileHeader::source`]: `/dev/hrperf` (hrperf-core.ko).
pub const SOURCE_KMOD: u32 = 3;

/// [`FileHeader::clock`]: ns of `CLOCK_MONOTONIC`.
pub const CLOCK_MONOTONIC: u32 = 1;
/// [`FileHeader::clock`]: ns of the simulator's virtual clock.
pub const CLOCK_SIM: u32 = 2;
/// [`FileHeader::clock`]: ns of the kernel's `local_clock()`/`perf_clock`.
pub const CLOCK_PERF: u32 = 3;
/// [`FileHeader::clock`]: raw TSC ticks (`tsc_hz` converts).
pub const CLOCK_TSC: u32 = 4;

abi_struct! {
    /// The fixed start of a capture file.
    pub struct FileHeader {
        /// [`FILE_MAGIC`].
        pub magic: [u8; 8],
        /// [`BYTE_ORDER_MARK`] in the writer's byte order.
        pub byte_order: u32,
        /// Size of this header as written; metadata starts here.
        pub header_size: u32,
        /// [`FILE_VERSION`].
        pub version: u32,
        /// Reserved flags, zero.
        pub flags: u32,
        /// UUID of the format that wrote the records.
        pub format_uuid: Uuid,
        /// Its name, NUL-padded.
        pub format_name: [u8; NAME_LEN],
        /// Its version, `major << 16 | minor`.
        pub format_version: u32,
        /// `SOURCE_*`.
        pub source: u32,
        /// `CLOCK_*` of every timestamp in the file.
        pub clock: u32,
        /// `MODE_*` of the session.
        pub mode: u32,
        /// Number of [`SECTION_EVENT`] sections (counters, leader first).
        pub nr_events: u32,
        /// Number of CPUs in the [`SECTION_CPUS`] list.
        pub nr_cpus: u32,
        /// TSC frequency in Hz if known, else 0.
        pub tsc_hz: u64,
        /// Clock value when recording started.
        pub start_time_ns: u64,
        /// Wall-clock (`CLOCK_REALTIME`) ns when recording started.
        pub start_wall_ns: u64,
        /// Sampling period (overflow mode), else 0.
        pub sample_period: u64,
        /// Poll interval in ns (poll mode), else 0.
        pub poll_interval_ns: u64,
        /// Bytes of metadata sections after the header.
        pub metadata_size: u64,
        /// CRC-32 of the `header_size` header bytes (this field zeroed) and the metadata.
        pub header_crc32: u32,
        /// Reserved, zero.
        pub reserved0: u32,
        /// Reserved, zero.
        pub reserved: [u64; 5],
    }
}
assert_layout!(FileHeader, size 192, align 8);

abi_struct! {
    /// A metadata section; `size` bytes of payload follow, padded to 8.
    pub struct Section {
        /// `SECTION_*`; unknown kinds are skipped.
        pub kind: u32,
        /// Payload bytes (unpadded).
        pub size: u32,
    }
}
assert_layout!(Section, size 8, align 4);

/// One counter: an [`crate::EventDesc`] then the event's name in UTF-8.
pub const SECTION_EVENT: u32 = 1;
/// The recorded CPUs: `u32` each.
pub const SECTION_CPUS: u32 = 2;
/// CPU model string (`/proc/cpuinfo` "model name", or the simulator's model).
pub const SECTION_CPU_MODEL: u32 = 3;
/// The command recorded: arguments, each NUL-terminated.
pub const SECTION_COMMAND: u32 = 4;
/// Host name, UTF-8.
pub const SECTION_HOSTNAME: u32 = 5;
/// The format argument bytes given to the session.
pub const SECTION_FORMAT_ARG: u32 = 6;
/// Kernel release (`uname -r`), UTF-8.
pub const SECTION_KERNEL: u32 = 7;
/// The simulator's seed and model parameters (sim source only), UTF-8 `key=value` lines.
pub const SECTION_SIM_CONFIG: u32 = 8;

/// [`ChunkHeader::magic`]: "HRPC".
pub const CHUNK_MAGIC: u32 = 0x4350_5248;
/// Chunk of records from one CPU's buffer.
pub const CHUNK_DATA: u32 = 1;
/// Per-CPU statistics: [`crate::ioctl::CpuStats`] entries.
pub const CHUNK_STATS: u32 = 2;
/// The recording finished: one [`EndInfo`].
pub const CHUNK_END: u32 = 3;
/// What symbolizing the stacks later needs, captured at record time: a [`SymbolsHeader`]
/// then `len` bytes of UTF-8 text (padded to 8).
pub const CHUNK_SYMBOLS: u32 = 4;

/// [`SymbolsHeader::kind`]: the text of `/proc/kallsyms` (`addr type name [module]`).
pub const SYM_KALLSYMS: u32 = 1;
/// [`SymbolsHeader::kind`]: the text of `/proc/<pid>/maps` of process `pid`.
pub const SYM_MAPS: u32 = 2;
/// [`SymbolsHeader::kind`]: the command name of process `pid`.
pub const SYM_COMM: u32 = 3;
/// [`SymbolsHeader::kind`]: a symbol table for addresses whose object is not on disk
/// (the simulator's program, imported stap stacks): lines `start size name [object]`
/// (hex start and size; the object name in brackets is optional), absolute addresses of
/// process `pid` (0: of every process).
pub const SYM_TABLE: u32 = 4;

abi_struct! {
    /// Start of a [`CHUNK_SYMBOLS`] payload.
    pub struct SymbolsHeader {
        /// `SYM_*`; unknown kinds are skipped.
        pub kind: u32,
        /// Process the text belongs to (0 if none).
        pub pid: u32,
        /// Bytes of text that follow (unpadded).
        pub len: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}
assert_layout!(SymbolsHeader, size 16, align 4);

abi_struct! {
    /// Start of every chunk; `size` bytes of payload follow.
    pub struct ChunkHeader {
        /// [`CHUNK_MAGIC`].
        pub magic: u32,
        /// `CHUNK_*`.
        pub kind: u32,
        /// CPU whose buffer the records came from (`u32::MAX` if none).
        pub cpu: u32,
        /// Reserved flags, zero.
        pub flags: u32,
        /// Payload bytes, a multiple of 8.
        pub size: u64,
        /// Records in the payload (data chunks).
        pub records: u64,
        /// CRC-32 (IEEE) of this header (with `crc32` zeroed) followed by the payload.
        pub crc32: u32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}
assert_layout!(ChunkHeader, size 40, align 8);

abi_struct! {
    /// Payload of the [`CHUNK_END`] chunk.
    pub struct EndInfo {
        /// Clock value when recording stopped.
        pub end_time_ns: u64,
        /// Records written over all CPUs.
        pub total_records: u64,
        /// Records dropped over all CPUs (also per CPU in the stats chunk).
        pub total_drops: u64,
        /// Exit status of the recorded command (`-signal` if killed), 0 if none.
        pub exit_status: i32,
        /// Reserved, zero.
        pub reserved: u32,
    }
}
assert_layout!(EndInfo, size 32, align 8);
