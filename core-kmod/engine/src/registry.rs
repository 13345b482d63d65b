//! The table of registered formats (perfmon2's `pfm_fmt_register` and friends).
//!
//! Fixed capacity, no allocation: the kernel keeps one `Registry` behind a mutex; the
//! userspace recorder keeps one with the formats it links in. Registration validates the
//! table and refuses a duplicate name or UUID; a format cannot be unregistered while
//! sessions use it ([`Registry::acquire`] / [`Registry::release`] count them).

use core::ptr::NonNull;

use hrperf_abi::format::{FormatOps, Uuid};
use hrperf_abi::ioctl::FormatInfo;

use super::error::EngineError;
use super::format::{validate_ops, Format};

/// How a session names its format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selector<'a> {
    /// By name; bytes after a NUL are ignored, so a NUL-padded field can be passed as is.
    Name(&'a [u8]),
    /// By UUID.
    Uuid(Uuid),
}

impl<'a> Selector<'a> {
    /// The selector of a `SessionCreate`-style pair: the name if it is not empty, else
    /// the UUID.
    pub fn from_fields(name: &'a [u8], uuid: Uuid) -> Selector<'a> {
        let name = hrperf_abi::name_bytes(name);
        if name.is_empty() {
            Selector::Uuid(uuid)
        } else {
            Selector::Name(name)
        }
    }

    fn matches(&self, ops: &FormatOps) -> bool {
        match self {
            Selector::Name(n) => {
                let n = hrperf_abi::name_bytes(n);
                !n.is_empty() && ops.name() == n
            }
            Selector::Uuid(u) => !u.is_nil() && ops.uuid == *u,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    format: Format,
    users: u32,
}

/// Up to `N` registered formats.
#[derive(Debug)]
pub struct Registry<const N: usize> {
    slots: [Option<Entry>; N],
}

impl<const N: usize> Default for Registry<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Registry<N> {
    /// An empty registry.
    pub const fn new() -> Self {
        Registry { slots: [None; N] }
    }

    /// Registers the table at `ops` after validating it.
    ///
    /// Errors: [`EngineError::Invalid`] for a malformed table, [`EngineError::Exists`]
    /// if its name or UUID is taken, [`EngineError::Full`] without a free slot.
    ///
    /// # Safety
    ///
    /// `ops` must point to a [`FormatOps`] whose callbacks honour the contracts on their
    /// types, and which stays valid and unmodified until it is unregistered, and after
    /// that for as long as any [`Format`] handle obtained for it is still used (in the
    /// kernel: the module is pinned through `owner` while sessions use it).
    pub unsafe fn register(&mut self, ops: NonNull<FormatOps>) -> Result<(), EngineError> {
        // SAFETY: the caller guarantees `ops` is valid for reads.
        let table = unsafe { ops.as_ref() };
        validate_ops(table)?;
        let mut free = None;
        for (i, slot) in self.slots.iter().enumerate() {
            match slot {
                Some(e) => {
                    let o = e.format.ops();
                    if o.name() == table.name() || o.uuid == table.uuid {
                        return Err(EngineError::Exists);
                    }
                }
                None if free.is_none() => free = Some(i),
                None => {}
            }
        }
        let slot = free.and_then(|i| self.slots.get_mut(i)).ok_or(EngineError::Full)?;
        // SAFETY: validated above; validity and lifetime are the caller's contract.
        let format = unsafe { Format::from_raw(ops) };
        *slot = Some(Entry { format, users: 0 });
        Ok(())
    }

    /// Registers a table that lives forever (formats linked into userspace).
    pub fn register_static(&mut self, ops: &'static FormatOps) -> Result<(), EngineError> {
        // SAFETY: a `&'static FormatOps` is valid and immutable forever (it is not
        // interior-mutable); its callbacks' contracts are the table's invariants.
        unsafe { self.register(NonNull::from(ops)) }
    }

    /// Removes the format with this UUID. Refused with [`EngineError::Busy`] while
    /// sessions use it, [`EngineError::NotFound`] if it is not registered.
    pub fn unregister(&mut self, uuid: &Uuid) -> Result<(), EngineError> {
        let sel = Selector::Uuid(*uuid);
        let slot = self
            .slots
            .iter_mut()
            .find(|s| s.is_some_and(|e| sel.matches(e.format.ops())))
            .ok_or(EngineError::NotFound)?;
        if let Some(e) = slot {
            if e.users > 0 {
                return Err(EngineError::Busy { users: e.users });
            }
        }
        *slot = None;
        Ok(())
    }

    /// Describes the format `sel` names, without pinning it.
    pub fn find(&self, sel: Selector<'_>) -> Option<FormatInfo> {
        self.entries().find(|e| sel.matches(e.format.ops())).map(info)
    }

    /// Pins the format `sel` names for a session: [`EngineError::NotFound`] if none.
    /// Pair with [`release`](Self::release).
    pub fn acquire(&mut self, sel: Selector<'_>) -> Result<Format, EngineError> {
        let e = self
            .slots
            .iter_mut()
            .flatten()
            .find(|e| sel.matches(e.format.ops()))
            .ok_or(EngineError::NotFound)?;
        e.users = e.users.checked_add(1).ok_or(EngineError::Busy { users: u32::MAX })?;
        Ok(e.format)
    }

    /// Unpins a format a session got from [`acquire`](Self::acquire).
    /// [`EngineError::NotFound`] if it is not registered or not pinned.
    pub fn release(&mut self, format: Format) -> Result<(), EngineError> {
        let e = self
            .slots
            .iter_mut()
            .flatten()
            .find(|e| e.format == format)
            .ok_or(EngineError::NotFound)?;
        e.users = e.users.checked_sub(1).ok_or(EngineError::NotFound)?;
        Ok(())
    }

    /// Sessions using the format with this UUID (None if not registered).
    pub fn users(&self, uuid: &Uuid) -> Option<u32> {
        let sel = Selector::Uuid(*uuid);
        self.entries().find(|e| sel.matches(e.format.ops())).map(|e| e.users)
    }

    /// The registered formats, in slot order, as listed by `HRPERF_IOC_FORMATS`.
    pub fn iter(&self) -> impl Iterator<Item = FormatInfo> + '_ {
        self.entries().map(info)
    }

    /// Number of registered formats.
    pub fn len(&self) -> usize {
        self.entries().count()
    }

    /// Whether no format is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.slots.iter().flatten()
    }
}

fn info(e: &Entry) -> FormatInfo {
    let o = e.format.ops();
    FormatInfo {
        name: o.name,
        uuid: o.uuid,
        version: o.version,
        flags: o.flags,
        arg_size: o.arg_size,
        users: e.users,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::boxed::Box;
    use std::vec::Vec;

    use hrperf_abi::format::{OverflowArg, Services, FORMAT_ABI_VERSION};
    use hrperf_abi::{fixed_name, NAME_LEN};

    use super::*;

    unsafe extern "C" fn handler(
        _: *mut u8,
        _: usize,
        _: *const OverflowArg,
        _: *const Services,
    ) -> u32 {
        0
    }

    fn ops(name: &str, uuid: u8) -> FormatOps {
        FormatOps {
            size: core::mem::size_of::<FormatOps>() as u32,
            abi_version: FORMAT_ABI_VERSION,
            name: fixed_name(name).unwrap(),
            uuid: Uuid([uuid; 16]),
            version: 0x0001_0002,
            arg_size: 16,
            flags: 3,
            reserved: 0,
            owner: core::ptr::null_mut(),
            validate: None,
            getsize: None,
            init: None,
            handler: Some(handler),
            restart: None,
            exit: None,
            start: None,
            stop: None,
        }
    }

    fn leak(o: FormatOps) -> &'static FormatOps {
        Box::leak(Box::new(o))
    }

    #[test]
    fn register_lookup_list() {
        let mut r: Registry<4> = Registry::new();
        assert!(r.is_empty());
        r.register_static(leak(ops("delta", 1))).unwrap();
        r.register_static(leak(ops("pebs", 2))).unwrap();
        assert_eq!(r.len(), 2);
        let i = r.find(Selector::Name(b"pebs")).unwrap();
        assert_eq!(i.uuid, Uuid([2; 16]));
        assert_eq!((i.version, i.flags, i.arg_size, i.users), (0x0001_0002, 3, 16, 0));
        assert_eq!(r.find(Selector::Uuid(Uuid([1; 16]))).unwrap().name, fixed_name("delta").unwrap());
        // A NUL-padded field selects by name; an empty one by UUID.
        let padded = fixed_name("delta").unwrap();
        assert!(r.find(Selector::Name(&padded)).is_some());
        assert_eq!(Selector::from_fields(&[0; NAME_LEN], Uuid([2; 16])), Selector::Uuid(Uuid([2; 16])));
        assert_eq!(Selector::from_fields(&padded, Uuid::NIL), Selector::Name(b"delta"));
        assert!(r.find(Selector::Name(b"delt")).is_none());
        assert!(r.find(Selector::Name(b"")).is_none());
        assert!(r.find(Selector::Uuid(Uuid::NIL)).is_none());
        let names: Vec<_> = r.iter().map(|i| i.uuid.0[0]).collect();
        assert_eq!(names, [1, 2]);
    }

    #[test]
    fn duplicates_and_capacity() {
        let mut r: Registry<2> = Registry::new();
        r.register_static(leak(ops("a", 1))).unwrap();
        assert_eq!(r.register_static(leak(ops("a", 9))), Err(EngineError::Exists));
        assert_eq!(r.register_static(leak(ops("b", 1))), Err(EngineError::Exists));
        assert_eq!(EngineError::Exists.errno(), hrperf_abi::errno::EEXIST);
        r.register_static(leak(ops("b", 2))).unwrap();
        assert_eq!(r.register_static(leak(ops("c", 3))), Err(EngineError::Full));
        r.unregister(&Uuid([1; 16])).unwrap();
        r.register_static(leak(ops("c", 3))).unwrap();
        assert_eq!(r.unregister(&Uuid([1; 16])), Err(EngineError::NotFound));
    }

    #[test]
    fn validation() {
        let mut r: Registry<8> = Registry::new();
        let mut bad = std::vec![];
        let mut o = ops("x", 1);
        o.size -= 8;
        bad.push(o);
        let mut o = ops("x", 1);
        o.abi_version = 2;
        bad.push(o);
        bad.push(ops("", 1));
        let mut o = ops("x", 1);
        o.name = [b'x'; NAME_LEN];
        bad.push(o);
        let mut o = ops("x", 1);
        o.handler = None;
        bad.push(o);
        let mut o = ops("x", 1);
        o.arg_size = 4097;
        bad.push(o);
        bad.push(ops("x", 0));
        let mut o = ops("x", 1);
        o.reserved = 1;
        bad.push(o);
        for o in bad {
            let e = r.register_static(leak(o)).unwrap_err();
            assert!(matches!(e, EngineError::Invalid { .. }), "{e:?}");
            assert_eq!(e.errno(), 22);
        }
        assert!(r.is_empty());
        // Larger (newer) tables and the maximum argument size are fine.
        let mut o = ops("x", 1);
        o.size += 64;
        o.arg_size = 4096;
        r.register_static(leak(o)).unwrap();
    }

    #[test]
    fn users_pin_the_format() {
        let mut r: Registry<2> = Registry::new();
        let uuid = Uuid([5; 16]);
        // Raw registration, as the kernel does it.
        let table = leak(ops("k", 5));
        // SAFETY: leaked, so valid forever.
        unsafe { r.register(NonNull::from(table)) }.unwrap();
        let a = r.acquire(Selector::Name(b"k")).unwrap();
        let b = r.acquire(Selector::Uuid(uuid)).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.name(), b"k");
        assert_eq!(r.users(&uuid), Some(2));
        assert_eq!(r.iter().next().unwrap().users, 2);
        assert_eq!(r.unregister(&uuid), Err(EngineError::Busy { users: 2 }));
        r.release(a).unwrap();
        assert_eq!(r.unregister(&uuid), Err(EngineError::Busy { users: 1 }));
        r.release(b).unwrap();
        assert_eq!(r.release(b), Err(EngineError::NotFound));
        assert_eq!(r.acquire(Selector::Name(b"nope")), Err(EngineError::NotFound));
        r.unregister(&uuid).unwrap();
        assert_eq!(r.users(&uuid), None);
        assert_eq!(r.release(a), Err(EngineError::NotFound));
    }
}
