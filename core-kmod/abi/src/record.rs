//! Records: what formats write into per-CPU buffers and what capture-file chunks hold.
//!
//! Every record starts with a [`RecordHeader`]; `size` covers the header and is a
//! multiple of 8, so a reader always knows where the next record starts and skips types
//! it does not know (rule 7 of the crate docs).

abi_struct! {
    /// The header of every record, modelled on `struct perf_event_header`.
    pub struct RecordHeader {
        /// What the record is; see [`RecordType`].
        pub kind: RecordType,
        /// Per-record flag bits, `MISC_*`.
        pub misc: u16,
        /// Total size of the record in bytes, header included, a multiple of 8.
        pub size: u16,
    }
}
assert_layout!(RecordHeader, size 8, align 4);

abi_struct! {
    /// An open record-type tag: unknown values are valid and are skipped by readers.
    ///
    /// Core types are below `0x1000`; each format owns a range of 256 from its base.
    pub struct RecordType(pub u32);
}

impl RecordType {
    /// Filler at the end of a ring's data area; readers skip it.
    pub const PAD: RecordType = RecordType(0);
    /// Records were dropped before this point: payload is [`LostRecord`].
    pub const LOST: RecordType = RecordType(1);
    /// The counter-delta format's sample (formats/delta).
    pub const DELTA: RecordType = RecordType(0x1000);
    /// First type of the PEBS format's range.
    pub const PEBS_BASE: RecordType = RecordType(0x1100);
    /// First type of the call-stack format's range.
    pub const STACK_BASE: RecordType = RecordType(0x1200);
    /// First type of the aggregating format's range.
    pub const AGGREGATE_BASE: RecordType = RecordType(0x1300);
    /// First type free for third-party formats.
    pub const CUSTOM_BASE: RecordType = RecordType(0x1_0000);
}

/// The sample came from a counter overflow (the IP field is meaningful).
pub const MISC_OVERFLOW: u16 = 1 << 0;
/// The sample came from a poll tick (periodic read of all counters).
pub const MISC_POLL: u16 = 1 << 1;
/// The sample was asked for by userspace (instructed mode).
pub const MISC_INSTRUCTED: u16 = 1 << 2;
/// The IP is in kernel space.
pub const MISC_KERNEL: u16 = 1 << 3;
/// At least one counter may have wrapped more than once since its last read, so its
/// delta is a lower bound, not an exact count (see the engine's counter virtualisation).
pub const MISC_MULTI_WRAP: u16 = 1 << 4;
/// The format had to truncate variable-length data (e.g. a stack) to fit.
pub const MISC_TRUNCATED: u16 = 1 << 5;

abi_struct! {
    /// Payload of a [`RecordType::LOST`] record: how many records were dropped since the
    /// previous record that made it into the buffer.
    pub struct LostRecord {
        /// The header (`kind == LOST`, `size == 16`).
        pub header: RecordHeader,
        /// Records dropped.
        pub lost: u64,
    }
}
assert_layout!(LostRecord, size 16, align 8);
