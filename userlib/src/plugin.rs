//! The decoder-plugin host: finds `libhrperf_decode_*.so`, checks each declaration, and
//! decodes records through it into typed values.
//!
//! The ABI is [`hrperf_abi::plugin`]: a plugin exports one `extern "C"` entry,
//! `hrperf_decoder_plugin`, returning a `'static` [`PluginDecl`]. The host reads the
//! declaration's first two fields (`abi_version`, `size`) and checks them before it reads
//! anything else or calls anything else; a plugin built for another ABI version is refused
//! with a message naming both versions. The rest of the declaration (names, record kinds,
//! field schemas) is then validated and copied, and the [`libloading::Library`] is kept
//! alive inside the [`Plugin`] for as long as it is used.
//!
//! ```no_run
//! use hrperf::plugin::{DecodeScratch, PluginHost};
//!
//! let (plugins, errors) = PluginHost::discover();
//! for e in &errors {
//!     eprintln!("warning: {e}");
//! }
//! let delta = PluginHost::find(&plugins, "delta").expect("no delta decoder installed");
//! let mut scratch = DecodeScratch::new();
//! # let (ctx, record): (hrperf_abi::plugin::DecodeCtx, &[u8]) = todo!();
//! let decoded = delta.decode(&ctx, record, &mut scratch)?;
//! for (field, value) in decoded.fields() {
//!     println!("{} = {value:?}", field.name);
//! }
//! # Ok::<(), hrperf::plugin::DecodeError>(())
//! ```
//!
//! Search order ([`PluginHost::search_dirs`]): the running executable's directory, each
//! directory of `$HRPERF_PLUGIN_PATH` (colon-separated), `<exe dir>/../lib/hrperf/plugins`,
//! `/usr/local/lib/hrperf/plugins`. The first plugin for a format wins.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use hrperf_abi::format::Uuid;
use hrperf_abi::plugin::{
    DecodeCtx, DecodeFn, FieldValue, PluginDecl, PluginEntryFn, DECODE_EFAULT, DECODE_EMALFORMED,
    DECODE_ESPACE, DECODE_ETRUNCATED, DECODE_EUNKNOWN, FIELD_COUNTERS, FIELD_FL_ABSENT, FIELD_HEX,
    FIELD_HEX_LIST, FIELD_I64, FIELD_STR, FIELD_TIME, FIELD_U64, PLUGIN_ABI_VERSION,
    PLUGIN_ENTRY_SYMBOL,
};
use hrperf_abi::RecordType;
use libloading::Library;

/// Environment variable naming extra plugin directories, colon-separated.
pub const PLUGIN_PATH_ENV: &str = "HRPERF_PLUGIN_PATH";
/// File names the host loads: `libhrperf_decode_<format>.so`.
pub const PLUGIN_PREFIX: &str = "libhrperf_decode_";
/// See [`PLUGIN_PREFIX`].
pub const PLUGIN_SUFFIX: &str = ".so";
/// The system-wide install directory.
pub const SYSTEM_PLUGIN_DIR: &str = "/usr/local/lib/hrperf/plugins";

/// Most record kinds one plugin may declare.
pub const MAX_KINDS: u32 = 256;
/// Most fields one record kind may declare.
pub const MAX_FIELDS: u32 = 64;
/// Longest name or description accepted, in bytes.
const MAX_NAME: usize = 256;
/// Most elements in a `COUNTERS` value.
const MAX_COUNTER_VALUES: u64 = 64;
/// Most elements in a `HEX_LIST` value, or bytes in a `STR` value.
const MAX_LIST: u64 = 1 << 16;

/// Why a plugin was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginLoadError {
    /// The shared object could not be loaded.
    #[error("{}: cannot load decoder plugin: {source}", path.display())]
    Load {
        /// The file.
        path: PathBuf,
        /// The dynamic loader's error.
        source: libloading::Error,
    },
    /// It does not export the entry symbol.
    #[error("{}: not an hrperf decoder plugin (no `hrperf_decoder_plugin` symbol): {source}", path.display())]
    NoEntry {
        /// The file.
        path: PathBuf,
        /// The dynamic loader's error.
        source: libloading::Error,
    },
    /// The entry returned a null or misaligned pointer.
    #[error("{}: `hrperf_decoder_plugin` returned an invalid declaration pointer ({ptr:#x})", path.display())]
    BadPointer {
        /// The file.
        path: PathBuf,
        /// The pointer.
        ptr: usize,
    },
    /// Built against another plugin ABI version.
    #[error("{}: refused: the plugin was built for decoder-plugin ABI version {found}, but this hrperf speaks version {supported}; rebuild the plugin against this hrperf", path.display())]
    AbiVersion {
        /// The file.
        path: PathBuf,
        /// The plugin's `abi_version`.
        found: u32,
        /// [`PLUGIN_ABI_VERSION`].
        supported: u32,
    },
    /// The declaration is smaller than this ABI version's.
    #[error("{}: refused: its declaration is {found} bytes, smaller than the {min} bytes of ABI version {PLUGIN_ABI_VERSION}", path.display())]
    DeclSize {
        /// The file.
        path: PathBuf,
        /// The plugin's `size`.
        found: u32,
        /// `size_of::<PluginDecl>()`.
        min: u32,
    },
    /// The declaration's schema is inconsistent.
    #[error("{}: refused: invalid declaration: {problem}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Another plugin for the same format was found first.
    #[error("{}: ignored: format '{name}' ({uuid}) is already provided by {}", path.display(), first.display())]
    Duplicate {
        /// The file ignored.
        path: PathBuf,
        /// The format's name.
        name: String,
        /// The format's UUID.
        uuid: Uuid,
        /// The plugin that was kept.
        first: PathBuf,
    },
    /// A plugin directory exists but could not be listed.
    #[error("{}: cannot list plugin directory: {source}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl PluginLoadError {
    /// The file or directory concerned.
    pub fn path(&self) -> &Path {
        match self {
            PluginLoadError::Load { path, .. }
            | PluginLoadError::NoEntry { path, .. }
            | PluginLoadError::BadPointer { path, .. }
            | PluginLoadError::AbiVersion { path, .. }
            | PluginLoadError::DeclSize { path, .. }
            | PluginLoadError::Invalid { path, .. }
            | PluginLoadError::Duplicate { path, .. }
            | PluginLoadError::Dir { path, .. } => path,
        }
    }
}

/// Why one record could not be decoded. Small and `Copy`: decoding is per record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The record is shorter than its header or its kind needs.
    #[error("record truncated")]
    Truncated,
    /// The record's type is not one the plugin declares.
    #[error("record type not decoded by this plugin")]
    Unknown,
    /// The record's contents are inconsistent.
    #[error("record malformed")]
    Malformed,
    /// The plugin wanted more output slots than its schema declares.
    #[error("plugin needs more output slots than its schema declares")]
    Space,
    /// The plugin saw a null pointer.
    #[error("plugin reported a null pointer")]
    Fault,
    /// The plugin returned an error code the ABI does not define.
    #[error("plugin returned undefined error code {0}")]
    Code(i32),
    /// The plugin returned a kind index it does not declare.
    #[error("plugin returned kind index {index}, but declares {nr_kinds} kinds")]
    KindIndex {
        /// The index returned.
        index: i32,
        /// Kinds declared.
        nr_kinds: u32,
    },
    /// The plugin wrote a value that disagrees with its schema.
    #[error("plugin wrote an invalid value for field {field}: {problem}")]
    Value {
        /// Index of the field in the kind's schema.
        field: u32,
        /// What is wrong.
        problem: &'static str,
    },
}

impl DecodeError {
    fn from_code(code: i32) -> Self {
        match code {
            DECODE_ETRUNCATED => DecodeError::Truncated,
            DECODE_EUNKNOWN => DecodeError::Unknown,
            DECODE_EMALFORMED => DecodeError::Malformed,
            DECODE_ESPACE => DecodeError::Space,
            DECODE_EFAULT => DecodeError::Fault,
            c => DecodeError::Code(c),
        }
    }
}

/// The type of a field, from its `FIELD_*` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// [`FIELD_U64`].
    U64,
    /// [`FIELD_I64`].
    I64,
    /// [`FIELD_HEX`].
    Hex,
    /// [`FIELD_STR`].
    Str,
    /// [`FIELD_COUNTERS`]: one value per event of the capture.
    Counters,
    /// [`FIELD_HEX_LIST`].
    HexList,
    /// [`FIELD_TIME`]: ns in the capture's clock.
    Time,
}

impl FieldKind {
    /// The kind of a `FIELD_*` code.
    pub fn from_abi(code: u32) -> Option<Self> {
        Some(match code {
            FIELD_U64 => FieldKind::U64,
            FIELD_I64 => FieldKind::I64,
            FIELD_HEX => FieldKind::Hex,
            FIELD_STR => FieldKind::Str,
            FIELD_COUNTERS => FieldKind::Counters,
            FIELD_HEX_LIST => FieldKind::HexList,
            FIELD_TIME => FieldKind::Time,
            _ => return None,
        })
    }

    /// The `FIELD_*` code.
    pub fn to_abi(self) -> u32 {
        match self {
            FieldKind::U64 => FIELD_U64,
            FieldKind::I64 => FIELD_I64,
            FieldKind::Hex => FIELD_HEX,
            FieldKind::Str => FIELD_STR,
            FieldKind::Counters => FIELD_COUNTERS,
            FieldKind::HexList => FIELD_HEX_LIST,
            FieldKind::Time => FIELD_TIME,
        }
    }

    /// Lower-case name, as `hrperf plugins` shows it.
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::U64 => "u64",
            FieldKind::I64 => "i64",
            FieldKind::Hex => "hex",
            FieldKind::Str => "str",
            FieldKind::Counters => "counters",
            FieldKind::HexList => "hex_list",
            FieldKind::Time => "time",
        }
    }
}

impl fmt::Display for FieldKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One field of a record kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldSchema {
    /// Stable name (JSON key, CSV column).
    pub name: String,
    /// Its type.
    pub kind: FieldKind,
}

/// One record kind a plugin decodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindSchema {
    /// Kind name, e.g. `delta`.
    pub name: String,
    /// The record type it decodes.
    pub record_type: RecordType,
    /// Fields, in the order [`Decoded::fields`] yields them.
    pub fields: Vec<FieldSchema>,
}

/// A loaded, checked decoder plugin.
///
/// Holds its [`Library`] open. Not `Sync`: the ABI lets a plugin keep `STR` values in its
/// own storage until the next `decode` call, so one plugin decodes on one thread at a time.
pub struct Plugin {
    name: String,
    description: String,
    uuid: Uuid,
    format_version: u32,
    path: PathBuf,
    kinds: Vec<KindSchema>,
    max_fields: usize,
    /// Per kind, what `decode` checks.
    checks: Vec<KindCheck>,
    decode: DecodeFn,
    not_sync: PhantomData<Cell<()>>,
    // Last, so it is dropped after everything that came from it.
    _lib: Option<Library>,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("uuid", &format_args!("{}", self.uuid))
            .field(
                "format_version",
                &format_args!("{:#x}", self.format_version),
            )
            .field("path", &self.path)
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// Loads and checks the plugin at `path`.
    pub fn load(path: &Path) -> Result<Plugin, PluginLoadError> {
        // SAFETY: loading a shared object runs its initialisers. Plugins are code the user
        // installed into hrperf's plugin directories (or named explicitly), trusted as
        // much as hrperf itself; nothing else is called before the checks below.
        let lib = unsafe { Library::new(path) }.map_err(|source| PluginLoadError::Load {
            path: path.to_owned(),
            source,
        })?;
        // SAFETY: the plugin ABI fixes the entry's type as `PluginEntryFn`; the copied
        // function pointer is only used while `lib` is alive (it moves into the Plugin).
        let entry: PluginEntryFn = unsafe { lib.get::<PluginEntryFn>(PLUGIN_ENTRY_SYMBOL) }
            .map(|sym| *sym)
            .map_err(|source| PluginLoadError::NoEntry {
                path: path.to_owned(),
                source,
            })?;
        // SAFETY: the entry takes no arguments and, per the ABI, only returns a pointer to
        // static data; this is the one call made before the declaration is checked.
        let decl = unsafe { entry() };
        // SAFETY: `decl` came from the entry of `lib`, which stays loaded in the Plugin.
        unsafe { Self::check(decl, path.to_owned(), Some(lib)) }
    }

    /// Wraps a declaration linked into this program (a built-in decoder).
    ///
    /// # Safety
    ///
    /// `decl` must be a declaration as the plugin ABI describes it: if its `abi_version`
    /// and `size` match this ABI, every pointer in it is null or points to valid static
    /// data of the declared type and count, strings are NUL-terminated, and `decode`
    /// honours its contract (reads only `rec[..len]`, writes only `out[..out_cap]`, and
    /// `STR`/list values point to memory valid until the next call).
    pub unsafe fn from_static(
        decl: &'static PluginDecl,
        origin: impl Into<PathBuf>,
    ) -> Result<Plugin, PluginLoadError> {
        // SAFETY: forwarded from this function's contract; no library to keep alive.
        unsafe { Self::check(decl, origin.into(), None) }
    }

    /// Checks `decl` (ABI version and size first), validates and copies its schema.
    ///
    /// # Safety
    ///
    /// `decl` must be what a plugin entry returned, and `lib` (if any) the library it
    /// came from; see [`Plugin::from_static`] for what a valid declaration is.
    unsafe fn check(
        decl: *const PluginDecl,
        path: PathBuf,
        lib: Option<Library>,
    ) -> Result<Plugin, PluginLoadError> {
        if decl.is_null() || !decl.is_aligned() {
            return Err(PluginLoadError::BadPointer {
                path,
                ptr: decl as usize,
            });
        }
        // SAFETY: every ABI version's declaration starts with `abi_version: u32, size:
        // u32`; these 8 bytes (aligned, checked above) are all that is read before the
        // version and size are known to match this host.
        let [abi_version, size] = unsafe { decl.cast::<[u32; 2]>().read() };
        if abi_version != PLUGIN_ABI_VERSION {
            return Err(PluginLoadError::AbiVersion {
                path,
                found: abi_version,
                supported: PLUGIN_ABI_VERSION,
            });
        }
        let min = size_of::<PluginDecl>() as u32;
        if size < min {
            return Err(PluginLoadError::DeclSize {
                path,
                found: size,
                min,
            });
        }
        // SAFETY: the plugin declares this ABI version and a size covering the whole
        // struct, so the static object behind `decl` is a complete `PluginDecl`.
        let d = unsafe { &*decl };
        let invalid = |problem: String| PluginLoadError::Invalid {
            path: path.clone(),
            problem,
        };

        // SAFETY: a valid declaration's strings are null or NUL-terminated static data.
        let name = unsafe { c_string(d.name) }.map_err(|p| invalid(format!("name {p}")))?;
        // SAFETY: as above.
        let description = match unsafe { c_string(d.description) } {
            Ok(s) => s,
            Err(CStrProblem::Null | CStrProblem::Empty) => String::new(),
            Err(p) => return Err(invalid(format!("description {p}"))),
        };
        let Some(decode) = d.decode else {
            return Err(invalid("no decode function".into()));
        };
        if d.nr_kinds == 0 || d.nr_kinds > MAX_KINDS || d.kinds.is_null() {
            return Err(invalid(format!(
                "nr_kinds {} with kinds {:p} (need 1..={MAX_KINDS} and a table)",
                d.nr_kinds, d.kinds
            )));
        }
        // SAFETY: a valid declaration's `kinds` points to `nr_kinds` static entries
        // (non-null and bounded, checked above).
        let raw_kinds = unsafe { std::slice::from_raw_parts(d.kinds, d.nr_kinds as usize) };
        let mut kinds = Vec::with_capacity(raw_kinds.len());
        for (i, k) in raw_kinds.iter().enumerate() {
            // SAFETY: as for the plugin's name.
            let kname =
                unsafe { c_string(k.name) }.map_err(|p| invalid(format!("kind {i} name {p}")))?;
            if k.record_type < RecordType::DELTA.0 {
                return Err(invalid(format!(
                    "kind '{kname}' claims record type {:#x}, a core type (below 0x1000) the host decodes itself",
                    k.record_type
                )));
            }
            if k.nr_fields > MAX_FIELDS || (k.nr_fields > 0 && k.fields.is_null()) {
                return Err(invalid(format!(
                    "kind '{kname}': nr_fields {} with fields {:p} (need 0..={MAX_FIELDS} and a table)",
                    k.nr_fields, k.fields
                )));
            }
            let raw_fields = if k.nr_fields == 0 {
                &[][..]
            } else {
                // SAFETY: `fields` points to `nr_fields` static entries (checked non-null
                // and bounded above).
                unsafe { std::slice::from_raw_parts(k.fields, k.nr_fields as usize) }
            };
            let mut fields = Vec::with_capacity(raw_fields.len());
            for (j, f) in raw_fields.iter().enumerate() {
                // SAFETY: as for the plugin's name.
                let fname = unsafe { c_string(f.name) }
                    .map_err(|p| invalid(format!("kind '{kname}' field {j} name {p}")))?;
                let Some(kind) = FieldKind::from_abi(f.kind) else {
                    return Err(invalid(format!(
                        "kind '{kname}' field '{fname}': unknown FIELD_* kind {}",
                        f.kind
                    )));
                };
                if f.flags != 0 {
                    return Err(invalid(format!(
                        "kind '{kname}' field '{fname}': reserved flags {:#x}",
                        f.flags
                    )));
                }
                if fields.iter().any(|g: &FieldSchema| g.name == fname) || fname == "kind" {
                    return Err(invalid(format!(
                        "kind '{kname}': field name '{fname}' repeats or is reserved"
                    )));
                }
                fields.push(FieldSchema { name: fname, kind });
            }
            if kinds
                .iter()
                .any(|o: &KindSchema| o.name == kname || o.record_type.0 == k.record_type)
            {
                return Err(invalid(format!(
                    "kind '{kname}' ({:#x}) is declared twice",
                    k.record_type
                )));
            }
            if kname == LOST_KIND {
                return Err(invalid(format!(
                    "kind name '{LOST_KIND}' is reserved for the host"
                )));
            }
            kinds.push(KindSchema {
                name: kname,
                record_type: RecordType(k.record_type),
                fields,
            });
        }
        let max_fields = kinds
            .iter()
            .map(|k| k.fields.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let checks = kinds
            .iter()
            .map(|k| KindCheck {
                abi_kinds: k.fields.iter().map(|f| f.kind.to_abi()).collect(),
                pointer_fields: (k.fields.iter().enumerate())
                    .filter(|(_, f)| {
                        matches!(
                            f.kind,
                            FieldKind::Str | FieldKind::Counters | FieldKind::HexList
                        )
                    })
                    .map(|(i, _)| i)
                    .collect(),
            })
            .collect();
        Ok(Plugin {
            name,
            description,
            uuid: d.uuid,
            format_version: d.format_version,
            path,
            kinds,
            max_fields,
            checks,
            decode,
            not_sync: PhantomData,
            _lib: lib,
        })
    }

    /// Format name, e.g. `delta`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One-line description.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// UUID of the format it decodes.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Newest format version it understands, `major << 16 | minor`.
    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record kinds it decodes.
    pub fn kinds(&self) -> &[KindSchema] {
        &self.kinds
    }

    /// The kind decoding `record_type`, with its index.
    #[inline]
    pub fn kind_of(&self, record_type: RecordType) -> Option<(usize, &KindSchema)> {
        self.kinds
            .iter()
            .enumerate()
            .find(|(_, k)| k.record_type == record_type)
    }

    /// Decodes one record (`rec`, header included) through the plugin.
    ///
    /// The values borrow `scratch`, `rec` and the plugin, so they stay valid exactly as
    /// long as the ABI promises. Every value the plugin wrote is checked against the
    /// schema (type, pointer, length) before it is handed out.
    pub fn decode<'a>(
        &'a self,
        ctx: &DecodeCtx,
        rec: &'a [u8],
        scratch: &'a mut DecodeScratch,
    ) -> Result<Decoded<'a>, DecodeError> {
        let cap = self.max_fields;
        if scratch.values.len() < cap {
            scratch.values.resize(cap, FieldValue::EMPTY);
        }
        let out = &mut scratch.values[..cap];
        out.fill(FieldValue::EMPTY);
        // SAFETY: `ctx` is a valid DecodeCtx, `rec` is valid for `rec.len()` bytes and
        // `out` for `cap` values, all for the duration of the call; the plugin's library
        // is alive (owned by `self`), and its declaration passed `check`.
        let rc =
            unsafe { (self.decode)(ctx, rec.as_ptr(), rec.len(), out.as_mut_ptr(), cap as u32) };
        if rc < 0 {
            return Err(DecodeError::from_code(rc));
        }
        let Some(kind) = self.kinds.get(rc as usize) else {
            return Err(DecodeError::KindIndex {
                index: rc,
                nr_kinds: self.kinds.len() as u32,
            });
        };
        let values = &scratch.values[..kind.fields.len()];
        let check = &self.checks[rc as usize];
        // Every present value's kind must match the schema (one branch-free pass), and
        // the pointer-carrying values must be in bounds (looked at one by one).
        let mut mismatch = false;
        for (v, &want) in values.iter().zip(&check.abi_kinds) {
            mismatch |= v.flags & FIELD_FL_ABSENT == 0 && v.kind != want;
        }
        if mismatch {
            return Err(first_bad_value(kind, values));
        }
        for &i in &check.pointer_fields {
            if let Err(problem) = check_value(kind.fields[i].kind, &values[i]) {
                return Err(DecodeError::Value {
                    field: i as u32,
                    problem,
                });
            }
        }
        Ok(Decoded {
            kind_index: rc as usize,
            kind,
            values,
            _rec: PhantomData,
        })
    }
}

/// What [`Plugin::decode`] checks for one record kind, precomputed.
struct KindCheck {
    /// `FIELD_*` of each field.
    abi_kinds: Vec<u32>,
    /// Indices of the fields whose values carry a pointer.
    pointer_fields: Vec<usize>,
}

/// Name of the record kind the host decodes itself for `LOST` records.
pub const LOST_KIND: &str = "lost";

/// Reads a static C string of a declaration.
///
/// # Safety
///
/// `p` is null or points to a NUL-terminated string that stays valid for the call.
unsafe fn c_string(p: *const c_char) -> Result<String, CStrProblem> {
    if p.is_null() {
        return Err(CStrProblem::Null);
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    let s = unsafe { CStr::from_ptr(p) };
    let s = s.to_str().map_err(|_| CStrProblem::NotUtf8)?;
    if s.is_empty() {
        return Err(CStrProblem::Empty);
    }
    if s.len() > MAX_NAME {
        return Err(CStrProblem::TooLong);
    }
    Ok(s.to_owned())
}

/// What is wrong with a declaration's string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
enum CStrProblem {
    #[error("is null")]
    Null,
    #[error("is not UTF-8")]
    NotUtf8,
    #[error("is empty")]
    Empty,
    #[error("is longer than {MAX_NAME} bytes")]
    TooLong,
}

/// The first value that fails [`check_value`] (some value's kind is known to be wrong).
#[cold]
fn first_bad_value(kind: &KindSchema, values: &[FieldValue]) -> DecodeError {
    for (i, (f, v)) in kind.fields.iter().zip(values).enumerate() {
        if let Err(problem) = check_value(f.kind, v) {
            return DecodeError::Value {
                field: i as u32,
                problem,
            };
        }
    }
    DecodeError::Value {
        field: 0,
        problem: "its kind differs from the schema",
    }
}

/// Checks one value the plugin wrote against its schema type.
fn check_value(kind: FieldKind, v: &FieldValue) -> Result<(), &'static str> {
    if v.flags & FIELD_FL_ABSENT != 0 {
        return Ok(());
    }
    if v.kind != kind.to_abi() {
        return Err("its kind differs from the schema");
    }
    let (max, elem) = match kind {
        FieldKind::Str => (MAX_LIST, 1),
        FieldKind::Counters => (MAX_COUNTER_VALUES, 8),
        FieldKind::HexList => (MAX_LIST, 8),
        _ => return Ok(()),
    };
    if v.len > max {
        return Err("its length is out of range");
    }
    if v.len > 0 && v.ptr.is_null() {
        return Err("it has a length but a null pointer");
    }
    if kind == FieldKind::Str {
        // SAFETY: a non-absent STR value points to `len` bytes valid until the next
        // decode call (plugin contract); `len` is bounded and the pointer non-null.
        let bytes = unsafe { raw_bytes(v.ptr, v.len as usize * elem) };
        if !bytes.is_ascii() {
            std::str::from_utf8(bytes).map_err(|_| "its string is not UTF-8")?;
        }
    }
    Ok(())
}

/// # Safety
///
/// `ptr` is valid for reads of `len` bytes for `'a` (or `len` is 0).
unsafe fn raw_bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// Reusable output space for [`Plugin::decode`] (no allocation per record).
#[derive(Debug, Default)]
pub struct DecodeScratch {
    values: Vec<FieldValue>,
}

impl DecodeScratch {
    /// Empty scratch space; it grows to the plugin's widest record kind on first use.
    pub fn new() -> Self {
        Self::default()
    }
}

/// One decoded record: its kind and values, valid until the scratch is reused.
#[derive(Debug)]
pub struct Decoded<'a> {
    kind_index: usize,
    kind: &'a KindSchema,
    values: &'a [FieldValue],
    _rec: PhantomData<&'a [u8]>,
}

impl<'a> Decoded<'a> {
    /// Index of the kind in [`Plugin::kinds`].
    pub fn kind_index(&self) -> usize {
        self.kind_index
    }

    /// The kind's schema.
    pub fn kind(&self) -> &'a KindSchema {
        self.kind
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the kind has no fields.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value of field `i` (in schema order); `Absent` past the end.
    #[inline]
    pub fn value(&self, i: usize) -> Value<'a> {
        let (Some(f), Some(v)) = (self.kind.fields.get(i), self.values.get(i)) else {
            return Value::Absent;
        };
        if v.flags & FIELD_FL_ABSENT != 0 {
            return Value::Absent;
        }
        match f.kind {
            FieldKind::U64 => Value::U64(v.value),
            FieldKind::I64 => Value::I64(v.value as i64),
            FieldKind::Hex => Value::Hex(v.value),
            FieldKind::Time => Value::Time(v.value),
            FieldKind::Str => {
                // SAFETY: checked in `decode`: non-null (or empty), `len` bounded, and the
                // bytes valid for `'a` (the record, the plugin or its storage until the
                // next decode, which the borrow of the scratch excludes).
                let b = unsafe { raw_bytes(v.ptr, v.len as usize) };
                Value::Str(std::str::from_utf8(b).unwrap_or(""))
            }
            FieldKind::Counters | FieldKind::HexList => {
                // SAFETY: as for `Str`, with `len` u64s (bounded, so no overflow).
                let b = unsafe { raw_bytes(v.ptr, v.len as usize * 8) };
                let list = U64s(b);
                if f.kind == FieldKind::Counters {
                    Value::Counters(list)
                } else {
                    Value::HexList(list)
                }
            }
        }
    }

    /// The fields with their values, in schema order.
    pub fn fields(&self) -> impl Iterator<Item = (&'a FieldSchema, Value<'a>)> + '_ {
        self.kind
            .fields
            .iter()
            .enumerate()
            .map(move |(i, f)| (f, self.value(i)))
    }
}

/// A typed field value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// Absent in this record (`FIELD_FL_ABSENT`): null in JSON, empty in CSV.
    Absent,
    /// Unsigned integer.
    U64(u64),
    /// Signed integer.
    I64(i64),
    /// Unsigned integer shown in hex.
    Hex(u64),
    /// Nanoseconds in the capture's clock.
    Time(u64),
    /// Text.
    Str(&'a str),
    /// Counter values, one per event.
    Counters(U64s<'a>),
    /// Addresses.
    HexList(U64s<'a>),
}

/// A list of `u64`s in possibly unaligned memory (native byte order).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct U64s<'a>(&'a [u8]);

impl<'a> U64s<'a> {
    /// Views `bytes` (a multiple of 8 long; a partial tail is ignored) as `u64`s.
    pub fn from_bytes(bytes: &'a [u8]) -> Self {
        U64s(&bytes[..bytes.len() / 8 * 8])
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.0.len() / 8
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Value `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<u64> {
        let b = self.0.get(i * 8..i * 8 + 8)?;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }

    /// The values in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.0.chunks_exact(8).map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_ne_bytes(a)
        })
    }
}

impl fmt::Debug for U64s<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Finds and loads decoder plugins.
#[derive(Debug)]
pub struct PluginHost;

impl PluginHost {
    /// The directories searched, in order: the executable's directory,
    /// `$HRPERF_PLUGIN_PATH`, `<exe dir>/../lib/hrperf/plugins`,
    /// `/usr/local/lib/hrperf/plugins`. Duplicates are removed.
    pub fn search_dirs() -> Vec<PathBuf> {
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_owned));
        let env = std::env::var_os(PLUGIN_PATH_ENV);
        let mut dirs = Vec::new();
        dirs.extend(exe_dir.clone());
        if let Some(env) = &env {
            dirs.extend(std::env::split_paths(env).filter(|p| !p.as_os_str().is_empty()));
        }
        if let Some(exe_dir) = exe_dir {
            dirs.push(exe_dir.join("../lib/hrperf/plugins"));
        }
        dirs.push(PathBuf::from(SYSTEM_PLUGIN_DIR));
        let mut seen = HashSet::new();
        dirs.retain(|d| seen.insert(d.canonicalize().unwrap_or_else(|_| d.clone())));
        dirs
    }

    /// Loads every plugin in [`PluginHost::search_dirs`]; returns those that passed the
    /// checks and why the others did not. Missing directories are not errors.
    pub fn discover() -> (Vec<Plugin>, Vec<PluginLoadError>) {
        Self::discover_in(&Self::search_dirs())
    }

    /// As [`PluginHost::discover`], over `dirs` in order.
    pub fn discover_in(dirs: &[PathBuf]) -> (Vec<Plugin>, Vec<PluginLoadError>) {
        let mut plugins: Vec<Plugin> = Vec::new();
        let mut errors = Vec::new();
        let mut files_seen = HashSet::new();
        for dir in dirs {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => continue,
                Err(source) => {
                    errors.push(PluginLoadError::Dir {
                        path: dir.clone(),
                        source,
                    });
                    continue;
                }
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with(PLUGIN_PREFIX) && name.ends_with(PLUGIN_SUFFIX)
                })
                .map(|e| e.path())
                .collect();
            files.sort();
            for file in files {
                if !files_seen.insert(file.canonicalize().unwrap_or_else(|_| file.clone())) {
                    continue;
                }
                match Plugin::load(&file) {
                    Ok(p) => {
                        if let Some(first) = plugins
                            .iter()
                            .find(|q| q.uuid == p.uuid || q.name == p.name)
                        {
                            errors.push(PluginLoadError::Duplicate {
                                path: file,
                                name: p.name.clone(),
                                uuid: p.uuid,
                                first: first.path.clone(),
                            });
                        } else {
                            plugins.push(p);
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        (plugins, errors)
    }

    /// The plugin named `key`, or whose UUID is `key` (hyphenated or plain hex, any case).
    pub fn find<'a>(plugins: &'a [Plugin], key: &str) -> Option<&'a Plugin> {
        let uuid = parse_uuid(key);
        plugins
            .iter()
            .find(|p| p.name == key || Some(p.uuid) == uuid)
    }

    /// The plugin for the format `uuid`.
    pub fn find_uuid(plugins: &[Plugin], uuid: Uuid) -> Option<&Plugin> {
        plugins.iter().find(|p| p.uuid == uuid)
    }
}

/// Parses a UUID written as 32 hex digits, hyphens anywhere ignored.
pub fn parse_uuid(s: &str) -> Option<Uuid> {
    let mut out = [0u8; 16];
    let mut n = 0;
    for c in s.chars().filter(|&c| c != '-') {
        let d = c.to_digit(16)? as u8;
        if n >= 32 {
            return None;
        }
        out[n / 2] |= if n % 2 == 0 { d << 4 } else { d };
        n += 1;
    }
    (n == 32).then_some(Uuid(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_parsing() {
        let u = Uuid([
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ]);
        assert_eq!(parse_uuid(&u.to_string()), Some(u));
        assert_eq!(parse_uuid("123456789ABCDEF00102030405060708"), Some(u));
        assert_eq!(parse_uuid("1234"), None);
        assert_eq!(parse_uuid("123456789abcdef0010203040506070899"), None);
        assert_eq!(parse_uuid("g23456789abcdef00102030405060708"), None);
    }

    #[test]
    fn field_kinds_round_trip() {
        for code in 0..10 {
            if let Some(k) = FieldKind::from_abi(code) {
                assert_eq!(k.to_abi(), code);
            }
        }
        assert_eq!(FieldKind::from_abi(0), None);
        assert_eq!(FieldKind::from_abi(8), None);
    }

    #[test]
    fn u64s_unaligned() {
        let mut b = [0u8; 17];
        b[1..9].copy_from_slice(&7u64.to_ne_bytes());
        b[9..17].copy_from_slice(&9u64.to_ne_bytes());
        let l = U64s::from_bytes(&b[1..]);
        assert_eq!(l.len(), 2);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![7, 9]);
        assert_eq!(l.get(1), Some(9));
        assert_eq!(l.get(2), None);
    }
}
