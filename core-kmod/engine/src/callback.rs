//! What every format's `extern "C"` callbacks do with the core's raw pointers before
//! their own logic: borrow the session parameters and the argument bytes, and write
//! the buffer size back. One copy here instead of one per format.

use hrperf_abi::errno::EFAULT;
use hrperf_abi::format::SessionParams;

/// Borrows the arguments of `validate`/`getsize`/`init`: the session parameters and the
/// format argument bytes (empty when `arg_len` is 0). `Err(EFAULT)` for a null pointer.
///
/// # Safety
///
/// `params` is null or valid for reads; `arg` is valid for `arg_len` bytes of reads if
/// `arg_len > 0`; both for `'a`.
pub unsafe fn session_args<'a>(
    params: *const SessionParams,
    arg: *const u8,
    arg_len: usize,
) -> Result<(&'a SessionParams, &'a [u8]), i32> {
    // SAFETY: null or valid, the caller's contract.
    let params = unsafe { params.as_ref() }.ok_or(EFAULT)?;
    let arg = if arg_len == 0 {
        &[][..]
    } else if arg.is_null() {
        return Err(EFAULT);
    } else {
        // SAFETY: non-null and valid for `arg_len` bytes, the caller's contract.
        unsafe { core::slice::from_raw_parts(arg, arg_len) }
    };
    Ok((params, arg))
}

/// Writes `getsize`'s result: 0, or `-EFAULT` if `size` is null.
///
/// # Safety
///
/// `size` is null or valid for a write.
pub unsafe fn write_size(size: *mut u64, value: u64) -> i32 {
    if size.is_null() {
        return -EFAULT;
    }
    // SAFETY: non-null and writable, the caller's contract.
    unsafe { size.write(value) };
    0
}
