//! [`Format`]: a safe handle over a registered, validated [`FormatOps`] table.
//!
//! Each method calls one callback with pointers the engine guarantees valid; an absent
//! optional callback means "success, nothing to do", and a negative return becomes
//! [`EngineError::Format`].

use core::ffi::c_void;
use core::ptr::NonNull;

use hrperf_abi::format::{FormatOps, OverflowArg, Services, SessionParams, Uuid, CTRL_ALL};
use hrperf_abi::BufferHeader;

use super::error::{check, EngineError};
use super::ring::Buffer;

/// A handle to a format table, obtained from [`Registry::acquire`].
///
/// It is `Copy` so that every CPU session can hold one; the registry counts sessions, not
/// handles. Using a handle after it was given back with [`Registry::release`] is a logic
/// error (the format may then be unregistered and, in the kernel, unloaded).
///
/// # Invariants
///
/// `ops` points to a [`FormatOps`] that passed [`validate_ops`], is never written, and
/// stays valid while the handle is in use (the contract of [`Registry::register`]).
///
/// [`Registry::acquire`]: super::Registry::acquire
/// [`Registry::release`]: super::Registry::release
/// [`Registry::register`]: super::Registry::register
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    ops: NonNull<FormatOps>,
}

// SAFETY: `FormatOps` is `Sync` (an immutable table); the handle only reads it.
unsafe impl Send for Format {}
// SAFETY: as above.
unsafe impl Sync for Format {}

/// The largest format argument the engine passes (perfmon2's `PAGE_SIZE` limit).
pub const MAX_ARG_SIZE: usize = 4096;

/// Checks a table before it is registered: the rules of `FormatOps`' invariants.
pub fn validate_ops(ops: &FormatOps) -> Result<(), EngineError> {
    let invalid = |what| Err(EngineError::Invalid { what });
    if (ops.size as usize) < core::mem::size_of::<FormatOps>() {
        return invalid("format table is smaller than this engine's FormatOps");
    }
    if ops.abi_version != hrperf_abi::format::FORMAT_ABI_VERSION {
        return invalid("format table has an unknown abi_version");
    }
    if ops.name[0] == 0 {
        return invalid("format name is empty");
    }
    if !ops.name.contains(&0) {
        return invalid("format name is not NUL-terminated");
    }
    if ops.uuid.is_nil() {
        return invalid("format UUID is nil");
    }
    if ops.handler.is_none() {
        return invalid("format has no handler");
    }
    if ops.arg_size as usize > MAX_ARG_SIZE {
        return invalid("format arg_size is above 4096");
    }
    if ops.reserved != 0 {
        return invalid("format table reserved field is not zero");
    }
    Ok(())
}

impl Format {
    /// Wraps a table.
    ///
    /// # Safety
    ///
    /// `ops` must point to a [`FormatOps`] that passed [`validate_ops`], whose callbacks
    /// honour the contracts documented on their types, and that stays valid and
    /// unmodified while the returned handle (or a copy) is in use.
    pub(crate) unsafe fn from_raw(ops: NonNull<FormatOps>) -> Format {
        // INVARIANT: the caller's contract.
        Format { ops }
    }

    /// The table.
    pub fn ops(&self) -> &FormatOps {
        // SAFETY: the type invariant: valid and unmodified while the handle is in use.
        unsafe { self.ops.as_ref() }
    }

    /// The table's address (identifies the format in the registry).
    pub fn as_ptr(&self) -> NonNull<FormatOps> {
        self.ops
    }

    /// Name bytes, without the NUL padding.
    pub fn name(&self) -> &[u8] {
        self.ops().name()
    }

    /// UUID.
    pub fn uuid(&self) -> Uuid {
        self.ops().uuid
    }

    /// Version, `major << 16 | minor`.
    pub fn version(&self) -> u32 {
        self.ops().version
    }

    /// `FMT_FL_*` flags.
    pub fn flags(&self) -> u32 {
        self.ops().flags
    }

    /// Largest argument the format accepts.
    pub fn arg_size(&self) -> u32 {
        self.ops().arg_size
    }

    /// The kernel module owning the table (null in userspace), for pinning.
    pub fn owner(&self) -> *mut c_void {
        self.ops().owner
    }

    /// Calls `validate`.
    pub fn validate(&self, params: &SessionParams, arg: &[u8]) -> Result<(), EngineError> {
        let Some(f) = self.ops().validate else { return Ok(()) };
        // SAFETY: `params` and `arg` are valid for reads for the call; the callback's
        // contract is the type invariant.
        check("validate", unsafe { f(params, arg.as_ptr(), arg.len()) })
    }

    /// Calls `getsize`; without it the buffer is just the [`BufferHeader`].
    pub fn getsize(&self, params: &SessionParams, arg: &[u8]) -> Result<u64, EngineError> {
        let Some(f) = self.ops().getsize else { return Ok(BufferHeader::SIZE as u64) };
        let mut size = 0u64;
        // SAFETY: pointers valid for the call, `size` is writable; the type invariant.
        check("getsize", unsafe { f(params, arg.as_ptr(), arg.len(), &mut size) })?;
        Ok(size)
    }

    /// Calls `init` on one CPU's buffer (its header is already filled).
    pub fn init(
        &self,
        buf: &mut Buffer<'_>,
        params: &SessionParams,
        arg: &[u8],
    ) -> Result<(), EngineError> {
        let Some(f) = self.ops().init else { return Ok(()) };
        // SAFETY: `buf` is valid for `len` bytes and exclusively ours (`&mut`), the rest
        // valid for reads; the type invariant.
        check("init", unsafe { f(buf.as_mut_ptr(), buf.len(), params, arg.as_ptr(), arg.len()) })
    }

    /// Calls `handler`; returns its `CTRL_*` bits with unknown bits cleared.
    #[inline]
    pub fn handler(&self, buf: &mut Buffer<'_>, arg: &OverflowArg, services: &Services) -> u32 {
        let Some(f) = self.ops().handler else { return 0 };
        // SAFETY: as for `init`; `arg` and `services` valid for reads during the call.
        let ctrl = unsafe { f(buf.as_mut_ptr(), buf.len(), arg, services) };
        ctrl & CTRL_ALL
    }

    /// Calls `restart`; returns the `CTRL_*` bits it asked for.
    pub fn restart(&self, buf: &mut Buffer<'_>) -> Result<u32, EngineError> {
        let Some(f) = self.ops().restart else { return Ok(0) };
        let mut ctrl = 0u32;
        // SAFETY: as for `init`; `ctrl` is writable.
        check("restart", unsafe { f(buf.as_mut_ptr(), buf.len(), &mut ctrl) })?;
        Ok(ctrl & CTRL_ALL)
    }

    /// Calls `exit`.
    pub fn exit(&self, buf: &mut Buffer<'_>) -> Result<(), EngineError> {
        self.buffer_call("exit", self.ops().exit, buf)
    }

    /// Calls `start`.
    pub fn start(&self, buf: &mut Buffer<'_>) -> Result<(), EngineError> {
        self.buffer_call("start", self.ops().start, buf)
    }

    /// Calls `stop`.
    pub fn stop(&self, buf: &mut Buffer<'_>) -> Result<(), EngineError> {
        self.buffer_call("stop", self.ops().stop, buf)
    }

    fn buffer_call(
        &self,
        call: &'static str,
        f: Option<hrperf_abi::format::BufferFn>,
        buf: &mut Buffer<'_>,
    ) -> Result<(), EngineError> {
        let Some(f) = f else { return Ok(()) };
        // SAFETY: as for `init`.
        check(call, unsafe { f(buf.as_mut_ptr(), buf.len()) })
    }
}
