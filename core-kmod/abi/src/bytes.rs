//! Bounds-checked little/native-endian word access for record parsers and writers:
//! every read is an `Option` and every write says whether it fit, so no decoder path can
//! index out of bounds. Shared by the formats (their records and the PEBS hardware
//! layouts, which are little-endian).

/// The little-endian `u64` at `off` (hardware PEBS records are little-endian).
#[inline]
pub fn le64(b: &[u8], off: usize) -> Option<u64> {
    let s = b.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

/// Writes `v` little-endian at `off`; false if it does not fit.
#[inline]
pub fn put_le64(b: &mut [u8], off: usize, v: u64) -> bool {
    match off.checked_add(8).and_then(|end| b.get_mut(off..end)) {
        Some(s) => {
            s.copy_from_slice(&v.to_le_bytes());
            true
        }
        None => false,
    }
}

/// The native-endian `u64` at `off` (hrperf's own record prefix).
#[inline]
pub fn ne64(b: &[u8], off: usize) -> Option<u64> {
    let s = b.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_ne_bytes(a))
}

/// The native-endian `u32` at `off`.
#[inline]
pub fn ne32(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Some(u32::from_ne_bytes(a))
}

/// The native-endian `u16` at `off`.
#[inline]
pub fn ne16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_ne_bytes([*s.first()?, *s.get(1)?]))
}

/// Copies `src` into `b` at `off`; false if it does not fit.
#[inline]
pub fn put(b: &mut [u8], off: usize, src: &[u8]) -> bool {
    match off.checked_add(src.len()).and_then(|end| b.get_mut(off..end)) {
        Some(s) => {
            s.copy_from_slice(src);
            true
        }
        None => false,
    }
}
