//! The engine's error type: small, `Copy`, and mapped to the errno the kernel returns.

use core::fmt;

use hrperf_abi::errno;

/// Why an engine operation failed. Each variant names what failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// An argument or table is malformed (`EINVAL`).
    Invalid {
        /// What was wrong, e.g. `"format name is not NUL-terminated"`.
        what: &'static str,
    },
    /// A sized struct carries non-zero bytes this build does not know (`E2BIG`).
    TooBig {
        /// Which struct or argument.
        what: &'static str,
    },
    /// A format with this name or UUID is already registered (`EEXIST`).
    Exists,
    /// No such format (`ENOENT`).
    NotFound,
    /// The format is in use by sessions and cannot be unregistered (`EBUSY`).
    Busy {
        /// Sessions using it.
        users: u32,
    },
    /// The registry has no free slot (`ENOSPC`).
    Full,
    /// The operation is not allowed in the current state (`EINVAL`).
    State {
        /// The operation, e.g. `"start"`.
        op: &'static str,
        /// The state it was attempted in, e.g. `"running"`.
        state: &'static str,
    },
    /// A format callback failed.
    Format {
        /// The callback, e.g. `"init"`.
        call: &'static str,
        /// The positive errno it returned (as `-errno`).
        errno: i32,
    },
}

impl EngineError {
    /// The positive Linux errno for this error (the kernel returns its negation).
    pub fn errno(&self) -> i32 {
        match *self {
            EngineError::Invalid { .. } | EngineError::State { .. } => errno::EINVAL,
            EngineError::TooBig { .. } => errno::E2BIG,
            EngineError::Exists => errno::EEXIST,
            EngineError::NotFound => errno::ENOENT,
            EngineError::Busy { .. } => errno::EBUSY,
            EngineError::Full => errno::ENOSPC,
            EngineError::Format { errno, .. } => errno,
        }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EngineError::Invalid { what } => write!(f, "invalid argument: {what}"),
            EngineError::TooBig { what } => {
                write!(f, "{what} has non-zero bytes this version does not know")
            }
            EngineError::Exists => f.write_str("a format with this name or UUID is registered"),
            EngineError::NotFound => f.write_str("no such format"),
            EngineError::Busy { users } => write!(f, "format is in use by {users} session(s)"),
            EngineError::Full => f.write_str("the format registry is full"),
            EngineError::State { op, state } => write!(f, "cannot {op} a CPU session that is {state}"),
            EngineError::Format { call, errno } => {
                write!(f, "the format's {call} callback failed with errno {errno}")
            }
        }
    }
}

/// Maps a callback's `0 / -errno` return to a result.
pub(crate) fn check(call: &'static str, ret: i32) -> Result<(), EngineError> {
    if ret >= 0 {
        Ok(())
    } else {
        // `-i32::MIN` overflows; such a value is not an errno anyway.
        let errno = ret.checked_neg().unwrap_or(errno::EINVAL);
        Err(EngineError::Format { call, errno })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn errno_mapping_and_display() {
        assert_eq!(EngineError::Exists.errno(), 17);
        assert_eq!(EngineError::Busy { users: 2 }.errno(), 16);
        assert_eq!(EngineError::TooBig { what: "x" }.errno(), 7);
        assert_eq!(EngineError::Full.errno(), 28);
        assert_eq!(EngineError::NotFound.errno(), 2);
        assert_eq!(EngineError::Format { call: "init", errno: 12 }.errno(), 12);
        assert_eq!(
            EngineError::State { op: "start", state: "exited" }.to_string(),
            "cannot start a CPU session that is exited"
        );
        assert_eq!(check("x", 0), Ok(()));
        assert_eq!(check("x", 3), Ok(()));
        assert_eq!(check("init", -12), Err(EngineError::Format { call: "init", errno: 12 }));
        assert_eq!(check("init", i32::MIN).unwrap_err().errno(), 22);
    }
}
