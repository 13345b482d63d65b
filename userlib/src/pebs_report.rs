//! The memory-access profile of a PEBS capture (`hrperf report --format pebs`).
//!
//! Reads every PEBS capture record through [`hrperf_fmt_pebs::record::parse`], decodes
//! its data source with [`MemAccess::from_intel`] (the same code the decoder plugin
//! uses), and aggregates: accesses by memory level (count, mean and max latency), by
//! page size (4K / 2M / 1G where the capture says which address ranges are backed by
//! which pages — the simulator stores its regions in the capture's `sim_config`; for
//! other captures page sizes are unknown), the hottest cache lines and pages, the
//! hottest eventing IPs, and a log2 latency histogram. Integer arithmetic only; ratios
//! are left to the printer.

use std::collections::HashMap;

use hrperf_abi::capture::CHUNK_DATA;
use hrperf_fmt_pebs::datasrc::{MemAccess, MemLevel, Tlb};
use hrperf_fmt_pebs::record::{layout_of, parse};

use crate::capture::{CaptureError, Reader};

/// Cache line size.
pub const LINE: u64 = 64;
/// Latency histogram buckets: `[0,1)`, `[1,2)`, `[2,4)`, … `[2^(n-2), ∞)`.
pub const LAT_BUCKETS: usize = 16;

/// An address range with a known page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRegion {
    /// First byte.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// Page size.
    pub page_size: u64,
}

/// Parses the `region=name,base,size,page_size` lines of a capture's sim configuration.
pub fn regions_from_sim_config(text: &str) -> Vec<PageRegion> {
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|l| l.strip_prefix("region="))
        .filter_map(|v| {
            let f: Vec<&str> = v.split(',').collect();
            match f.as_slice() {
                [_, b, s, p] => Some(PageRegion { base: hex(b)?, size: hex(s)?, page_size: hex(p)? }),
                _ => None,
            }
        })
        .collect()
}

/// Totals for one key (level, page size, line, page, IP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Accesses.
    pub count: u64,
    /// Sum of latencies (core cycles).
    pub latency_sum: u64,
    /// Largest latency.
    pub latency_max: u64,
    /// Accesses that missed the STLB.
    pub tlb_misses: u64,
}

impl Bucket {
    fn merge(&mut self, o: &Bucket) {
        self.count += o.count;
        self.latency_sum += o.latency_sum;
        self.latency_max = self.latency_max.max(o.latency_max);
        self.tlb_misses += o.tlb_misses;
    }

    fn add(&mut self, lat: u64, tlb_miss: bool) {
        self.count += 1;
        self.latency_sum += lat;
        self.latency_max = self.latency_max.max(lat);
        self.tlb_misses += u64::from(tlb_miss);
    }

    /// Mean latency, rounded down.
    pub fn latency_mean(&self) -> u64 {
        self.latency_sum.checked_div(self.count).unwrap_or(0)
    }
}

/// The profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PebsProfile {
    /// PEBS records read.
    pub records: u64,
    /// Records with a data address (fmt1+, adaptive with meminfo).
    pub with_address: u64,
    /// Records that did not parse (counted, skipped).
    pub malformed: u64,
    /// By memory level (in [`MemLevel`] order of first appearance sorted by count).
    pub by_level: Vec<(MemLevel, Bucket)>,
    /// By page size: `Some(bytes)`, or `None` where the page size is unknown.
    pub by_page_size: Vec<(Option<u64>, Bucket)>,
    /// Hottest cache lines (address of the line), most accesses first.
    pub top_lines: Vec<(u64, Bucket)>,
    /// Hottest pages (base address, page size if known — else 4 KiB granules).
    pub top_pages: Vec<(u64, Option<u64>, Bucket)>,
    /// Hottest eventing IPs.
    pub top_ips: Vec<(u64, Bucket)>,
    /// Hottest functions (eventing IPs symbolized with the capture's symbols): name,
    /// object, totals. IPs no symbol covers count as `[unknown] <object>`.
    pub top_symbols: Vec<(String, String, Bucket)>,
    /// Latency histogram (log2 buckets, see [`LAT_BUCKETS`]).
    pub latency_hist: [u64; LAT_BUCKETS],
    /// Distinct cache lines touched.
    pub distinct_lines: u64,
    /// Distinct pages touched.
    pub distinct_pages: u64,
}

/// The bucket of a latency in [`PebsProfile::latency_hist`].
pub fn lat_bucket(lat: u64) -> usize {
    if lat == 0 {
        0
    } else {
        ((64 - lat.leading_zeros()) as usize).min(LAT_BUCKETS - 1)
    }
}

fn sorted<K: Clone + Ord>(m: HashMap<K, Bucket>, top: usize) -> Vec<(K, Bucket)> {
    let mut v: Vec<(K, Bucket)> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(&b.0)));
    v.truncate(top);
    v
}

/// Why a profile cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// Reading the capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The capture holds another format's records.
    #[error("{path} holds '{format}' records; the pebs report needs a capture recorded with --format pebs")]
    NotPebs {
        /// The capture.
        path: String,
        /// Its format.
        format: String,
    },
}

/// Builds the profile of `reader`'s PEBS records, keeping the `top` hottest lines,
/// pages and IPs.
pub fn profile(reader: &Reader, top: usize) -> Result<PebsProfile, ReportError> {
    let meta = reader.meta();
    if meta.format_uuid != hrperf_fmt_pebs::PEBS_UUID && meta.format_name != hrperf_fmt_pebs::PEBS_NAME {
        return Err(ReportError::NotPebs { path: reader.path().display().to_string(), format: meta.format_name.clone() });
    }
    let regions = regions_from_sim_config(&meta.sim_config);
    let page_size = |a: u64| regions.iter().find(|r| a.wrapping_sub(r.base) < r.size).map(|r| r.page_size);
    let mut p = PebsProfile::default();
    let mut levels: HashMap<MemLevel, Bucket> = HashMap::new();
    let mut sizes: HashMap<Option<u64>, Bucket> = HashMap::new();
    let mut lines: HashMap<u64, Bucket> = HashMap::new();
    let mut pages: HashMap<(u64, Option<u64>), Bucket> = HashMap::new();
    let mut ips: HashMap<u64, Bucket> = HashMap::new();
    // Per (IP, kernel mode) for the by-function view; PEBS records carry no pid, so
    // user IPs resolve through tables for every process (the simulator's) only.
    let mut modes: HashMap<(u64, bool), Bucket> = HashMap::new();
    let mut symbols = crate::stacks::symbols::SymbolData::default();
    for chunk in reader.chunks() {
        let chunk = chunk?;
        if let Some((kind, pid, text)) = chunk.symbols() {
            symbols.add(kind, pid, text);
        }
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        for rec in chunk.records() {
            let rec = rec?;
            if layout_of(rec.kind()).is_none() {
                continue;
            }
            let Ok(c) = parse(rec.bytes) else {
                p.malformed += 1;
                continue;
            };
            p.records += 1;
            let ip = c.pebs.eventing_ip.unwrap_or(c.pebs.ip);
            // A PEBS record does not say the privilege level; like ds.c's kernel_ip(),
            // the upper half of the address space is the kernel's (x86-64).
            let kernel = rec.header.misc & hrperf_abi::record::MISC_KERNEL != 0 || ip >= 0xffff_8000_0000_0000;
            let Some(m) = c.pebs.mem else {
                ips.entry(ip).or_default().add(0, false);
                modes.entry((ip, kernel)).or_default().add(0, false);
                continue;
            };
            p.with_address += 1;
            let a = MemAccess::from_intel(c.prefix.pebs_format, c.dsrc_kind, m.data_source);
            // Alder Lake+ adaptive records (and perf's WEIGHT_STRUCT) split the word:
            // cache latency in [47:32], instruction latency in [15:0] — as the decoder.
            let fmt = c.prefix.pebs_format;
            let split = fmt.has(hrperf_fmt_pebs::layout::PebsFormat::INSTR_LATENCY)
                && c.pebs.layout == hrperf_fmt_pebs::layout::Layout::Adaptive;
            let lat = if split { (m.latency >> 32) & 0xffff } else { m.latency & 0xffff_ffff };
            let miss = a.tlb == Tlb::Miss;
            levels.entry(a.level).or_default().add(lat, miss);
            let ps = page_size(m.address);
            sizes.entry(ps).or_default().add(lat, miss);
            lines.entry(m.address & !(LINE - 1)).or_default().add(lat, miss);
            let granule = ps.unwrap_or(4096);
            pages.entry((m.address & !(granule - 1), ps)).or_default().add(lat, miss);
            ips.entry(ip).or_default().add(lat, miss);
            modes.entry((ip, kernel)).or_default().add(lat, miss);
            p.latency_hist[lat_bucket(lat)] += 1;
        }
    }
    p.distinct_lines = lines.len() as u64;
    p.distinct_pages = pages.len() as u64;
    let mut lv: Vec<(MemLevel, Bucket)> = levels.into_iter().collect();
    lv.sort_by_key(|(l, _)| *l as u32);
    p.by_level = lv;
    let mut sz: Vec<(Option<u64>, Bucket)> = sizes.into_iter().collect();
    sz.sort_by_key(|(s, _)| s.unwrap_or(u64::MAX));
    p.by_page_size = sz;
    p.top_lines = sorted(lines, top);
    p.top_pages = sorted(pages, top).into_iter().map(|((a, s), b)| (a, s, b)).collect();
    p.top_ips = sorted(ips, top);
    let mut sym = crate::stacks::Symbolizer::new(symbols, crate::stacks::elf::DEFAULT_ELF_CACHE);
    let mut funcs: HashMap<(String, String), Bucket> = HashMap::new();
    for ((ip, kernel), b) in &modes {
        let s = sym.symbolize(*kernel, 0, *ip);
        let name = if s.resolved() { s.name.to_string() } else { format!("[unknown] {}", s.object) };
        funcs.entry((name, s.object.to_string())).or_default().merge(b);
    }
    p.top_symbols = sorted(funcs, top).into_iter().map(|((n, o), b)| (n, o, b)).collect();
    Ok(p)
}
