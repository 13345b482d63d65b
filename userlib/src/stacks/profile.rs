//! Aggregation of stack records into distinct stacks, their symbolization, and the
//! per-function views.
//!
//! Memory is bounded by the distinct (process, comm, stack) triples, not the samples:
//! records are folded into a hash map of raw stacks as they stream by, and each
//! distinct frame is symbolized once, after the last record.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use hrperf_abi::RecordType;
use hrperf_fmt_llc_stack::record::{
    StackRecord, COMM_LEN, STACK_SAMPLE, STK_KERNEL_IP, STK_KERNEL_TRUNCATED, STK_USER_TRUNCATED,
};

use super::elf::DEFAULT_ELF_CACHE;
use super::symbols::SymbolData;
use super::{StackError, Symbolizer};
use crate::capture::Reader;

/// What a stack counts for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightBy {
    /// The record's `weight` (events it stands for); percentages match perf's
    /// period-weighted ones.
    #[default]
    Weight,
    /// One per record.
    Samples,
}

/// Which frames of each stack are kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrameFilter {
    /// Kernel and user frames.
    #[default]
    All,
    /// Kernel frames only; a stack without any counts as [`NO_KERNEL_FRAMES`].
    KernelOnly,
    /// User frames only; a stack without any counts as [`NO_USER_FRAMES`].
    UserOnly,
}

/// The function a stack left without frames by [`FrameFilter::KernelOnly`] counts as.
pub const NO_KERNEL_FRAMES: &str = "[no kernel frames]";
/// The function a stack left without frames by [`FrameFilter::UserOnly`] counts as.
pub const NO_USER_FRAMES: &str = "[no user frames]";

/// How [`Profile::functions`] orders functions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortBy {
    /// By inclusive weight (the function or anything it called was running).
    #[default]
    Inclusive,
    /// By self weight (the function was the leaf).
    SelfWeight,
}

/// How a profile is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileOptions {
    /// What a stack counts for.
    pub weight: WeightBy,
    /// Which frames are kept.
    pub frames: FrameFilter,
    /// Parsed ELF files kept in memory at once.
    pub elf_cache: usize,
    /// Where mapped files are looked up instead of `/`, if set.
    pub root: Option<PathBuf>,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            weight: WeightBy::Weight,
            frames: FrameFilter::All,
            elf_cache: DEFAULT_ELF_CACHE,
            root: None,
        }
    }
}

/// Counts of what went into a profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileStats {
    /// Stack records read.
    pub records: u64,
    /// Records that did not parse as stack records (skipped).
    pub malformed: u64,
    /// Records other than stack samples and LOST (skipped).
    pub other_records: u64,
    /// Records the recorder says were dropped (LOST records).
    pub lost: u64,
    /// Records whose kernel stack was cut at the depth limit.
    pub kernel_truncated: u64,
    /// Records whose user stack was cut at the depth limit.
    pub user_truncated: u64,
    /// Distinct (process, comm, stack) triples.
    pub distinct_stacks: u64,
    /// Distinct (space, address) frames symbolized.
    pub distinct_frames: u64,
    /// Of those, frames no symbol was found for.
    pub unresolved_frames: u64,
    /// ELF files parsed.
    pub elf_loads: u64,
}

/// One function's weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionStats {
    /// The function (see the module docs for identity).
    pub name: Arc<str>,
    /// Its object; `[multiple]` when the name was found in several.
    pub object: Arc<str>,
    /// Whether it is a kernel function.
    pub kernel: bool,
    /// Weight of the stacks containing it (once per stack, whatever the recursion).
    pub inclusive: u64,
    /// Weight of the stacks it is the leaf of.
    pub self_weight: u64,
    /// Records whose stack contains it.
    pub inclusive_samples: u64,
    /// Records it is the leaf of.
    pub self_samples: u64,
}

/// A caller or callee of a function, with the weight of the stacks where the two are
/// adjacent (once per stack).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    /// The other function.
    pub name: Arc<str>,
    /// Its object.
    pub object: Arc<str>,
    /// Weight of the stacks with that call.
    pub weight: u64,
    /// Records with that call.
    pub samples: u64,
}

/// A symbolized distinct stack.
#[derive(Clone, Debug)]
pub(super) struct SymStack {
    pub(super) pid: u32,
    pub(super) comm: u32,
    /// Function ids, leaf first.
    pub(super) funcs: Box<[u32]>,
    pub(super) weight: u64,
    pub(super) samples: u64,
}

/// An aggregated, symbolized call-stack profile; see the module docs.
#[derive(Debug)]
pub struct Profile {
    pub(super) funcs: Vec<FunctionStats>,
    by_name: HashMap<Arc<str>, u32>,
    pub(super) stacks: Vec<SymStack>,
    pub(super) comms: Vec<Box<str>>,
    total_weight: u64,
    total_samples: u64,
    stats: ProfileStats,
    options: ProfileOptions,
}

// PERF_CONTEXT_* markers (at or above -4095) are not addresses: skipped if an importer left one.
const PERF_CONTEXT_MAX: u64 = 4095u64.wrapping_neg();

/// Streams records and symbol chunks into a [`Profile`]; [`Profile::from_reader`] is
/// this over a capture.
#[derive(Debug)]
pub struct ProfileBuilder {
    options: ProfileOptions,
    // Key: [pid | comm << 32, nr_kernel | empty marker << 32, frames...].
    stacks: HashMap<Box<[u64]>, (u64, u64)>,
    comm_ids: HashMap<[u8; COMM_LEN], u32>,
    comms: Vec<Box<str>>,
    symbols: SymbolData,
    stats: ProfileStats,
    buf: Vec<u64>,
}

const EMPTY_KERNEL: u64 = 1;
const EMPTY_USER: u64 = 2;

impl ProfileBuilder {
    /// An empty builder.
    pub fn new(options: &ProfileOptions) -> Self {
        ProfileBuilder {
            options: options.clone(),
            stacks: HashMap::new(),
            comm_ids: HashMap::new(),
            comms: vec!["".into()],
            symbols: SymbolData::default(),
            stats: ProfileStats::default(),
            buf: Vec::with_capacity(256),
        }
    }

    /// Takes one SYMBOLS chunk's `(kind, pid, text)`.
    pub fn add_symbols(&mut self, kind: u32, pid: u32, text: &[u8]) {
        self.symbols.add(kind, pid, text);
    }

    /// Takes one record's bytes (header included); a record that does not parse is
    /// counted in [`ProfileStats::malformed`].
    pub fn add_record_bytes(&mut self, bytes: &[u8]) {
        match StackRecord::parse(bytes) {
            Ok(r) => self.add_record(&r),
            Err(_) => self.stats.malformed += 1,
        }
    }

    /// Takes one stack record.
    pub fn add_record(&mut self, r: &StackRecord<'_>) {
        let f = &r.fixed;
        self.stats.records += 1;
        self.stats.kernel_truncated += u64::from(f.flags & STK_KERNEL_TRUNCATED != 0);
        self.stats.user_truncated += u64::from(f.flags & STK_USER_TRUNCATED != 0);
        let comm = self.comm_id(&f.comm);
        let buf = &mut self.buf;
        buf.clear();
        buf.push(u64::from(f.pid) | u64::from(comm) << 32);
        buf.push(0);
        let keep_kernel = self.options.frames != FrameFilter::UserOnly;
        let keep_user = self.options.frames != FrameFilter::KernelOnly;
        let mut nk = 0u64;
        if r.nr_kernel() == 0 && r.nr_user() == 0 {
            // No stack: the record stands for its IP alone.
            let kernel = f.flags & STK_KERNEL_IP != 0;
            if (kernel && keep_kernel) || (!kernel && keep_user) {
                buf.push(f.ip);
                nk = u64::from(kernel);
            }
        } else {
            if keep_kernel {
                buf.extend(r.kernel().filter(|&a| a < PERF_CONTEXT_MAX));
                nk = (buf.len() - 2) as u64;
            }
            if keep_user {
                buf.extend(r.user().filter(|&a| a < PERF_CONTEXT_MAX));
            }
        }
        let empty = match self.options.frames {
            _ if buf.len() > 2 => 0,
            FrameFilter::KernelOnly => EMPTY_KERNEL,
            FrameFilter::UserOnly => EMPTY_USER,
            // Every frame was a context marker: the record stands for its IP.
            FrameFilter::All => {
                buf.push(f.ip);
                nk = u64::from(f.flags & STK_KERNEL_IP != 0);
                0
            }
        };
        buf[1] = nk | empty << 32;
        let w = match self.options.weight {
            WeightBy::Weight => f.weight,
            WeightBy::Samples => 1,
        };
        if let Some(e) = self.stacks.get_mut(buf.as_slice()) {
            e.0 = e.0.saturating_add(w);
            e.1 += 1;
        } else {
            self.stacks.insert(buf.as_slice().into(), (w, 1));
        }
    }

    fn comm_id(&mut self, comm: &[u8; COMM_LEN]) -> u32 {
        if comm[0] == 0 {
            return 0;
        }
        if let Some(&id) = self.comm_ids.get(comm) {
            return id;
        }
        let id = self.comms.len() as u32;
        let name = String::from_utf8_lossy(hrperf_abi::name_bytes(comm));
        self.comms.push(name.as_ref().into());
        self.comm_ids.insert(*comm, id);
        id
    }

    /// Counts records that are neither stack samples nor LOST.
    pub fn add_other_record(&mut self) {
        self.stats.other_records += 1;
    }

    /// Counts records the recorder says were dropped.
    pub fn add_lost(&mut self, n: u64) {
        self.stats.lost = self.stats.lost.saturating_add(n);
    }

    /// Symbolizes every distinct frame once and computes the function views.
    pub fn finish(self) -> Profile {
        let ProfileBuilder {
            options,
            stacks,
            comms,
            symbols,
            mut stats,
            ..
        } = self;
        let mut sym = Symbolizer::new(symbols, options.elf_cache).with_root(options.root.clone());
        let mut p = Profile {
            funcs: Vec::new(),
            by_name: HashMap::new(),
            stacks: Vec::with_capacity(stacks.len()),
            comms,
            total_weight: 0,
            total_samples: 0,
            stats: ProfileStats::default(),
            options,
        };
        // Frame -> function id, so each distinct frame is resolved once.
        let mut frame_ids: HashMap<(bool, u32, u64), u32> = HashMap::new();
        let multiple: Arc<str> = "[multiple]".into();
        for (key, (weight, samples)) in stacks {
            let pid = key[0] as u32;
            let comm = (key[0] >> 32) as u32;
            let nk = (key[1] & 0xffff_ffff) as usize;
            let funcs: Box<[u32]> = match key[1] >> 32 {
                EMPTY_KERNEL => Box::new([p.intern(NO_KERNEL_FRAMES.into(), "".into(), true, &multiple)]),
                EMPTY_USER => Box::new([p.intern(NO_USER_FRAMES.into(), "".into(), false, &multiple)]),
                _ => key[2..]
                    .iter()
                    .enumerate()
                    .map(|(i, &addr)| {
                        let kernel = i < nk;
                        let fkey = (kernel, if kernel { 0 } else { pid }, addr);
                        if let Some(&id) = frame_ids.get(&fkey) {
                            return id;
                        }
                        let s = sym.symbolize(kernel, pid, addr);
                        stats.distinct_frames += 1;
                        stats.unresolved_frames += u64::from(!s.resolved());
                        let id = p.intern(s.name, s.object, kernel, &multiple);
                        frame_ids.insert(fkey, id);
                        id
                    })
                    .collect(),
            };
            p.stacks.push(SymStack {
                pid,
                comm,
                funcs,
                weight,
                samples,
            });
        }
        stats.distinct_stacks = p.stacks.len() as u64;
        stats.elf_loads = sym.elf_loads();
        // Comm of stacks whose records had none: the captured SYM_COMM, if any.
        let mut comm_of_pid: HashMap<u32, u32> = HashMap::new();
        for st in &mut p.stacks {
            if st.comm == 0 {
                if let Some(c) = sym.data().comms.get(&st.pid) {
                    st.comm = *comm_of_pid.entry(st.pid).or_insert_with(|| {
                        p.comms.push(c.clone());
                        (p.comms.len() - 1) as u32
                    });
                }
            }
        }
        p.stats = stats;
        p.compute();
        p
    }
}

impl Profile {
    /// Reads a whole `llc-stack` capture: its records and symbol chunks.
    pub fn from_reader(reader: &Reader, options: &ProfileOptions) -> Result<Profile, StackError> {
        let meta = reader.meta();
        if meta.format_uuid != hrperf_fmt_llc_stack::LLC_STACK_UUID
            && meta.format_name != hrperf_fmt_llc_stack::LLC_STACK_NAME
        {
            return Err(StackError::NotLlcStack {
                path: reader.path().display().to_string(),
                format: meta.format_name.clone(),
            });
        }
        let mut b = ProfileBuilder::new(options);
        for chunk in reader.chunks() {
            let chunk = chunk?;
            if let Some((kind, pid, text)) = chunk.symbols() {
                b.add_symbols(kind, pid, text);
                continue;
            }
            for rec in chunk.records() {
                let rec = rec?;
                match rec.kind() {
                    STACK_SAMPLE => b.add_record_bytes(rec.bytes),
                    RecordType::LOST => match rec.lost() {
                        Ok(n) => b.add_lost(n.unwrap_or(0)),
                        Err(_) => b.stats.malformed += 1,
                    },
                    _ => b.add_other_record(),
                }
            }
        }
        Ok(b.finish())
    }

    fn intern(&mut self, name: Arc<str>, object: Arc<str>, kernel: bool, multiple: &Arc<str>) -> u32 {
        if let Some(&id) = self.by_name.get(&name) {
            let f = &mut self.funcs[id as usize];
            if f.object != object && !Arc::ptr_eq(&f.object, multiple) {
                f.object = multiple.clone();
            }
            return id;
        }
        let id = self.funcs.len() as u32;
        self.by_name.insert(name.clone(), id);
        self.funcs.push(FunctionStats {
            name,
            object,
            kernel,
            inclusive: 0,
            self_weight: 0,
            inclusive_samples: 0,
            self_samples: 0,
        });
        id
    }

    fn compute(&mut self) {
        // seen[f] == stack index + 1 once f is counted for that stack (recursion once).
        let mut seen = vec![0usize; self.funcs.len()];
        for (i, st) in self.stacks.iter().enumerate() {
            self.total_weight = self.total_weight.saturating_add(st.weight);
            self.total_samples += st.samples;
            if let Some(&leaf) = st.funcs.first() {
                let f = &mut self.funcs[leaf as usize];
                f.self_weight = f.self_weight.saturating_add(st.weight);
                f.self_samples += st.samples;
            }
            for &id in st.funcs.iter() {
                if seen[id as usize] != i + 1 {
                    seen[id as usize] = i + 1;
                    let f = &mut self.funcs[id as usize];
                    f.inclusive = f.inclusive.saturating_add(st.weight);
                    f.inclusive_samples += st.samples;
                }
            }
        }
    }

    /// Sum of every stack's weight (the records' `weight`s, or the record count with
    /// [`WeightBy::Samples`]).
    pub fn total_weight(&self) -> u64 {
        self.total_weight
    }

    /// Number of stack records.
    pub fn total_samples(&self) -> u64 {
        self.total_samples
    }

    /// `w` as a percentage of [`Profile::total_weight`].
    pub fn pct(&self, w: u64) -> f64 {
        if self.total_weight == 0 {
            0.0
        } else {
            100.0 * w as f64 / self.total_weight as f64
        }
    }

    /// Counts of what went in.
    pub fn stats(&self) -> &ProfileStats {
        &self.stats
    }

    /// The options the profile was made with.
    pub fn options(&self) -> &ProfileOptions {
        &self.options
    }

    /// Every function, heaviest first by `sort` (ties: the other weight, then name).
    pub fn functions(&self, sort: SortBy) -> Vec<&FunctionStats> {
        let mut v: Vec<&FunctionStats> = self.funcs.iter().collect();
        let key = |f: &FunctionStats| match sort {
            SortBy::Inclusive => (f.inclusive, f.self_weight),
            SortBy::SelfWeight => (f.self_weight, f.inclusive),
        };
        v.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
        v
    }

    /// The function named `name`.
    pub fn function(&self, name: &str) -> Option<&FunctionStats> {
        self.by_name.get(name).map(|&id| &self.funcs[id as usize])
    }

    /// The functions directly above `name` in its stacks (its callers), heaviest first;
    /// `None` if no stack holds `name`.
    pub fn callers(&self, name: &str) -> Option<Vec<Edge>> {
        self.edges(name, true)
    }

    /// The functions directly below `name` in its stacks (its callees), heaviest first;
    /// `None` if no stack holds `name`.
    pub fn callees(&self, name: &str) -> Option<Vec<Edge>> {
        self.edges(name, false)
    }

    fn edges(&self, name: &str, callers: bool) -> Option<Vec<Edge>> {
        let &id = self.by_name.get(name)?;
        let mut acc: HashMap<u32, (u64, u64)> = HashMap::new();
        let mut this_stack: Vec<u32> = Vec::new();
        for st in &self.stacks {
            this_stack.clear();
            for (i, &f) in st.funcs.iter().enumerate() {
                if f != id {
                    continue;
                }
                // Leaf first: the caller is one further from the leaf.
                let other = if callers {
                    st.funcs.get(i + 1)
                } else {
                    i.checked_sub(1).and_then(|j| st.funcs.get(j))
                };
                if let Some(&o) = other {
                    if !this_stack.contains(&o) {
                        this_stack.push(o);
                        let e = acc.entry(o).or_default();
                        e.0 = e.0.saturating_add(st.weight);
                        e.1 += st.samples;
                    }
                }
            }
        }
        let mut v: Vec<Edge> = acc
            .into_iter()
            .map(|(o, (weight, samples))| {
                let f = &self.funcs[o as usize];
                Edge {
                    name: f.name.clone(),
                    object: f.object.clone(),
                    weight,
                    samples,
                }
            })
            .collect();
        v.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.name.cmp(&b.name)));
        Some(v)
    }

    /// The command name of a stack (`[unknown]` when neither its records nor the
    /// capture's SYM_COMM chunks gave one).
    pub(super) fn comm_name(&self, id: u32) -> &str {
        match self.comms.get(id as usize) {
            Some(c) if !c.is_empty() => c,
            _ => "[unknown]",
        }
    }
}
