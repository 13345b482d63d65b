//! The per-CPU sampling buffer: a core-owned header, then the format's area.
//!
//! The core allocates `getsize()` bytes per CPU, fills the [`BufferHeader`] and calls the
//! format's `init`; userspace maps the buffers read-only. Formats that log records use the
//! engine's ring writer over `[data_offset, data_offset + data_size)`, with `head`/`tail`
//! below; formats with their own layout (PEBS DS area, hash tables) describe it there too.
//!
//! ```text
//! +----------------+---------------------+--------------------------------+
//! | BufferHeader   | format private area | data area (ring, tables, PEBS) |
//! | (128 B, core)  | (format-defined)    | data_offset .. +data_size      |
//! +----------------+---------------------+--------------------------------+
//! ```

use crate::format::Uuid;

/// `BufferHeader::magic`: "HRPB".
pub const BUFFER_MAGIC: u32 = 0x4250_5248;
/// Current `BufferHeader::version`.
pub const BUFFER_VERSION: u32 = 1;

abi_struct! {
    /// Start of every per-CPU buffer. The counters are only ever incremented by the
    /// producer (kernel or source); `tail` is the consumer's.
    ///
    /// Nothing is dropped silently: every record that did not fit is counted in `drops`,
    /// and every overflow that could not be dispatched in `masked`.
    pub struct BufferHeader {
        /// [`BUFFER_MAGIC`].
        pub magic: u32,
        /// [`BUFFER_VERSION`].
        pub version: u32,
        /// `size_of::<BufferHeader>()` as written; readers skip unknown header bytes.
        pub header_size: u32,
        /// CPU this buffer belongs to.
        pub cpu: u32,
        /// UUID of the format that owns the data area.
        pub format_uuid: Uuid,
        /// Total size of the buffer, header included.
        pub buf_size: u64,
        /// Offset of the data area from the start of the buffer.
        pub data_offset: u64,
        /// Size of the data area; a power of two for ring formats.
        pub data_size: u64,
        /// Producer position in bytes, monotonic (ring offset is `head % data_size`).
        pub head: u64,
        /// Consumer position in bytes, monotonic; written only by the reader.
        pub tail: u64,
        /// Records written.
        pub records: u64,
        /// Records dropped because the buffer was full.
        pub drops: u64,
        /// Overflow interrupts (or poll ticks) delivered to the format.
        pub overflows: u64,
        /// Overflows that arrived while the format had masked this CPU.
        pub masked: u64,
        /// Samples whose counter deltas may hide more than one wrap (flagged in the record).
        pub multi_wraps: u64,
        /// Incremented each time the format asks to NOTIFY; readers wait on a change.
        pub notify_seq: u64,
        /// Reserved, zero.
        pub reserved: [u64; 1],
    }
}
assert_layout!(BufferHeader, size 128, align 8);
const _: () = assert!(core::mem::offset_of!(BufferHeader, head) == 56);

impl BufferHeader {
    /// Size of the header as this crate defines it.
    pub const SIZE: usize = core::mem::size_of::<BufferHeader>();
}
