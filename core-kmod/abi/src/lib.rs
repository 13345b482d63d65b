//! hrperf's ABI: the plain-data types shared by `hrperf-core.ko`, the format modules,
//! the userspace library, the capture file and the decoder plugins.
//!
//! `#![no_std]`, no dependencies (zerocopy impls only behind the `user` feature), so the
//! kernel modules compile this file unchanged through `#[path]`.
//!
//! # ABI evolution rules
//!
//! These hold for every struct in this crate that crosses a boundary (ioctl argument,
//! mmap'd buffer, capture file, format-ops table, plugin declaration):
//!
//! 1. **Sized.** Every argument struct starts with `size: u32`, the number of bytes the
//!    caller filled. The receiver accepts any size from the first published size up.
//! 2. **Append-only.** New fields are only ever added at the end; nothing is reordered,
//!    retyped or removed.
//! 3. **Zero means the old behaviour.** A new field whose value is zero asks for exactly
//!    what an older receiver would have done, so old callers (which send zeros, or a
//!    shorter struct that is zero-extended) keep their meaning.
//! 4. **Unknown non-zero tails are rejected** with `E2BIG`: a newer caller asking an older
//!    receiver for something it cannot do gets an error, never a silent no.
//! 5. **Reserved fields must be zero** on input (`EINVAL` otherwise), so they can be given
//!    a meaning later.
//! 6. **Flags are `u32`, never `bool`**, and every struct is `#[repr(C)]` with explicit
//!    padding, so no byte is undefined. Each struct's size is asserted at compile time.
//! 7. **Records are self-sized.** Every record in a buffer or capture file starts with a
//!    [`RecordHeader`] `{type, misc, size}`; [`RecordType`] is an open newtype, so a
//!    reader skips a type it does not know instead of failing.
//! 8. **Headers carry `header_size`**, so an old reader skips header bytes a newer writer
//!    appended, and a `version` that is bumped only for incompatible changes.

#![no_std]
#![warn(missing_docs)]

/// Declares a plain-data ABI struct: `#[repr(C)]`, `Copy`, and with the `user` feature
/// the zerocopy traits, so readers cast checked bytes instead of parsing by hand.
macro_rules! abi_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[cfg_attr(
            feature = "user",
            derive(
                zerocopy::FromBytes,
                zerocopy::IntoBytes,
                zerocopy::Immutable,
                zerocopy::KnownLayout
            )
        )]
        pub struct $name { $($body)* }
    };
    ($(#[$meta:meta])* pub struct $name:ident ( $($body:tt)* );) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[cfg_attr(
            feature = "user",
            derive(
                zerocopy::FromBytes,
                zerocopy::IntoBytes,
                zerocopy::Immutable,
                zerocopy::KnownLayout
            )
        )]
        pub struct $name ( $($body)* );
    };
}

/// Asserts a struct's size and alignment at compile time, so a layout change is a build
/// error on every side of the ABI (kernel, userspace, C header).
macro_rules! assert_layout {
    ($t:ty, size $size:expr, align $align:expr) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        const _: () = assert!(core::mem::align_of::<$t>() == $align);
    };
}

pub mod buffer;
pub mod bytes;
pub mod capture;
pub mod event;
pub mod format;
pub mod ioctl;
pub mod plugin;
pub mod record;

pub use buffer::BufferHeader;
pub use event::EventDesc;
pub use format::{FormatOps, OverflowArg, Services, SessionParams, Uuid};
pub use record::{RecordHeader, RecordType};

/// Most counters one session programs (fixed + general purpose).
pub const MAX_COUNTERS: usize = 8;
/// Most CPUs a session can name (size of [`CpuMask`]).
pub const MAX_CPUS: usize = 256;
/// Length of a NUL-padded format name.
pub const NAME_LEN: usize = 32;

abi_struct! {
    /// A set of CPUs, one bit each, CPU 0 in bit 0 of word 0.
    pub struct CpuMask {
        /// The bits.
        pub bits: [u64; MAX_CPUS / 64],
    }
}
assert_layout!(CpuMask, size 32, align 8);

impl CpuMask {
    /// The empty set.
    pub const EMPTY: CpuMask = CpuMask { bits: [0; MAX_CPUS / 64] };

    /// Adds `cpu`; returns `false` (and changes nothing) if it is out of range.
    pub fn insert(&mut self, cpu: u32) -> bool {
        let cpu = cpu as usize;
        if cpu >= MAX_CPUS {
            return false;
        }
        self.bits[cpu / 64] |= 1 << (cpu % 64);
        true
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        let cpu = cpu as usize;
        cpu < MAX_CPUS && self.bits[cpu / 64] & (1 << (cpu % 64)) != 0
    }

    /// Number of CPUs in the set.
    pub fn count(&self) -> u32 {
        self.bits.iter().map(|w| w.count_ones()).sum()
    }

    /// The CPUs in the set, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..MAX_CPUS as u32).filter(move |&c| self.contains(c))
    }
}

/// Copies `name` into a NUL-padded fixed-size field; `None` if it does not fit with a NUL.
pub const fn fixed_name(name: &str) -> Option<[u8; NAME_LEN]> {
    let bytes = name.as_bytes();
    if bytes.len() >= NAME_LEN {
        return None;
    }
    let mut out = [0u8; NAME_LEN];
    let mut i = 0;
    while i < bytes.len() {
        out[i] = bytes[i];
        i += 1;
    }
    Some(out)
}

/// The bytes of a NUL-padded fixed-size name, up to the first NUL.
pub fn name_bytes(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Rounds `n` up to a multiple of 8 (every record and section is 8-byte aligned).
pub const fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Linux errno values used across the ABI (format callbacks return `-errno`).
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such entry.
    pub const ENOENT: i32 = 2;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Argument list too long: an unknown non-zero tail in a sized struct.
    pub const E2BIG: i32 = 7;
    /// Out of memory.
    pub const ENOMEM: i32 = 12;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// Device or resource busy.
    pub const EBUSY: i32 = 16;
    /// Already exists.
    pub const EEXIST: i32 = 17;
    /// No such device (e.g. no PEBS-capable PMU).
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Too many (registry or CPU list full).
    pub const ENOSPC: i32 = 28;
    /// Unknown ioctl.
    pub const ENOTTY: i32 = 25;
    /// Not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// No buffer space (format buffer full).
    pub const ENOBUFS: i32 = 105;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_mask_roundtrip() {
        let mut m = CpuMask::EMPTY;
        assert!(m.insert(0));
        assert!(m.insert(65));
        assert!(m.insert(255));
        assert!(!m.insert(256));
        assert_eq!(m.count(), 3);
        assert!(m.contains(65) && !m.contains(64));
        let v: [u32; 3] = {
            let mut it = m.iter();
            [it.next().unwrap(), it.next().unwrap(), it.next().unwrap()]
        };
        assert_eq!(v, [0, 65, 255]);
    }

    #[test]
    fn names() {
        let n = fixed_name("delta").unwrap();
        assert_eq!(name_bytes(&n), b"delta");
        assert!(fixed_name("0123456789012345678901234567890123").is_none());
        assert_eq!(align8(0), 0);
        assert_eq!(align8(9), 16);
    }
}
