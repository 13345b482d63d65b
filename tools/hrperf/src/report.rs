//! `hrperf report`: for `--format pebs`, the memory-access profile of a PEBS capture
//! ([`hrperf::pebs_report`]); for `--format aggregate`, the top keys and the
//! per-interval time series of an aggregating-format capture ([`hrperf::agg_report`]);
//! for `--format llc-stack`, the call-stack profile ([`crate::stack_report`]).
//! Printed as tables.

use std::io::{self, Write};
use std::process::ExitCode;

use hrperf::agg_report::{self, AggReport, Key, RankBy, StackKey};
use hrperf::capture::Reader;
use hrperf::pebs_report::{profile, Bucket, PebsProfile, LAT_BUCKETS};

use crate::args::{ReportArgs, ReportBy};
use crate::{CliError, CliResult};

/// Runs `hrperf report`.
pub fn run(mut a: ReportArgs) -> CliResult {
    if let Some(f) = a.format.as_deref().filter(|f| !matches!(*f, "pebs" | "aggregate" | "llc-stack")) {
        return Err(CliError(format!("no report for format '{f}': the reports available are: pebs, aggregate, llc-stack")));
    }
    if let Some(c) = a.capture.take() {
        a.input = c;
    }
    let reader = Reader::open(&a.input)?;
    if a.format.as_deref().unwrap_or(&reader.meta().format_name) == "llc-stack" {
        return crate::stack_report::run(&a, &reader);
    }
    if a.stack_option().is_some() && a.format.as_deref().unwrap_or(&reader.meta().format_name) == "aggregate" {
        return crate::stack_report::run_aggregate(&a, &reader);
    }
    if let Some(opt) = a.stack_option() {
        let f = a.format.as_deref().unwrap_or(&reader.meta().format_name);
        return Err(CliError(format!("{opt} applies to llc-stack reports (call stacks), not to '{f}' captures")));
    }
    let format = a.format.clone().unwrap_or_else(|| reader.meta().format_name.clone());
    let mut out = io::BufWriter::new(io::stdout().lock());
    let printed = match format.as_str() {
        "aggregate" => {
            let by = match a.by.unwrap_or(ReportBy::Count) {
                ReportBy::Count => RankBy::Count,
                ReportBy::Sum => RankBy::Sum,
            };
            let r = agg_report::report(&reader, a.top.unwrap_or(10).max(1), by)?;
            print_aggregate(&mut out, &reader, &r, by, a.time_series)
        }
        "pebs" => {
            if a.by.is_some() || a.time_series {
                return Err(CliError("--by and --time-series apply to --format aggregate reports".into()));
            }
            let p = profile(&reader, a.top.unwrap_or(10).max(1))?;
            print(&mut out, &reader, &p)
        }
        f => {
            return Err(CliError(format!(
                "{} holds '{f}' records; hrperf report needs a capture recorded with --format pebs or --format aggregate, or with --format llc-stack",
                a.input.display()
            )))
        }
    };
    match printed.and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(CliError(format!("writing the report: {e}"))),
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn pct(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * n as f64 / total as f64
    }
}

fn size_name(s: Option<u64>) -> String {
    match s {
        None => "unknown".into(),
        Some(s) if s >= 1 << 30 => format!("{}G", s >> 30),
        Some(s) if s >= 1 << 20 => format!("{}M", s >> 20),
        Some(s) => format!("{}K", s >> 10),
    }
}

fn row(w: &mut dyn Write, key: &str, b: &Bucket, total: u64) -> io::Result<()> {
    writeln!(
        w,
        "  {key:<24} {:>9} {:>6.1}%  {:>8} {:>8}  {:>6.1}%",
        b.count,
        pct(b.count, total),
        b.latency_mean(),
        b.latency_max,
        pct(b.tlb_misses, b.count)
    )
}

fn header(w: &mut dyn Write, title: &str, key: &str) -> io::Result<()> {
    writeln!(w, "\n{title}")?;
    writeln!(w, "  {key:<24} {:>9} {:>7}  {:>8} {:>8}  {:>7}", "accesses", "share", "lat.avg", "lat.max", "STLB-miss")
}

fn print(w: &mut dyn Write, reader: &Reader, p: &PebsProfile) -> io::Result<()> {
    let n = p.with_address;
    writeln!(w, "PEBS memory-access profile of {} ({})", reader.path().display(), reader.meta().cpu_model)?;
    writeln!(
        w,
        "  {} records, {} with a data address; {} distinct cache lines, {} distinct pages{}",
        p.records,
        n,
        p.distinct_lines,
        p.distinct_pages,
        if p.malformed > 0 { format!("; {} malformed records skipped", p.malformed) } else { String::new() }
    )?;
    if n == 0 {
        writeln!(w, "  (no data addresses: this record layout has none — fmt0, or adaptive without the meminfo group)")?;
    }
    writeln!(w, "  latencies in core cycles")?;
    header(w, "By memory level", "level")?;
    for (l, b) in &p.by_level {
        row(w, l.name(), b, n)?;
    }
    header(w, "By page size", "page size")?;
    for (s, b) in &p.by_page_size {
        row(w, &size_name(*s), b, n)?;
    }
    header(w, "Hottest cache lines", "line")?;
    for (a, b) in &p.top_lines {
        row(w, &format!("{a:#x}"), b, n)?;
    }
    header(w, "Hottest pages", "page")?;
    for (a, s, b) in &p.top_pages {
        row(w, &format!("{a:#x} {}", size_name(*s)), b, n)?;
    }
    header(w, "Hottest IPs", "ip")?;
    for (ip, b) in &p.top_ips {
        row(w, &format!("{ip:#x}"), b, p.records)?;
    }
    if !p.top_symbols.is_empty() {
        header(w, "Hottest functions", "function [object]")?;
        for (name, object, b) in &p.top_symbols {
            row(w, &format!("{name} [{object}]"), b, p.records)?;
        }
    }
    writeln!(w, "\nLatency histogram (core cycles)")?;
    let max = p.latency_hist.iter().copied().max().unwrap_or(0).max(1);
    for (i, &c) in p.latency_hist.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let lo = if i == 0 { 0 } else { 1u64 << (i - 1) };
        let range = if i == LAT_BUCKETS - 1 { format!("{lo}+") } else { format!("{lo}-{}", (1u64 << i) - 1) };
        let bar = "#".repeat(((c * 40).div_ceil(max)) as usize);
        writeln!(w, "  {range:>12} {c:>9} {:>6.1}%  {bar}", pct(c, n))?;
    }
    Ok(())
}

fn stack_name(s: &StackKey) -> String {
    match s {
        StackKey::None => "-".into(),
        StackKey::Lost => "lost".into(),
        StackKey::Unknown(id) => format!("?{id}"),
        StackKey::Frames(f) => f.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>().join(";"),
    }
}

fn key_name(kind: u32, k: &Key) -> String {
    use hrperf_fmt_aggregate::record::{KEY_IP, KEY_PID_IP};
    match kind {
        KEY_IP => format!("{:#x}", k.ip),
        KEY_PID_IP => format!("pid {} {:#x}", k.pid, k.ip),
        _ => format!("pid {} kstack {} ustack {}", k.pid, stack_name(&k.kstack), stack_name(&k.ustack)),
    }
}

fn secs(ns: u64, base: u64) -> String {
    format!("{:.6}", ns.saturating_sub(base) as f64 / 1e9)
}

fn print_aggregate(w: &mut dyn Write, reader: &Reader, r: &AggReport, by: RankBy, series: bool) -> io::Result<()> {
    use hrperf_fmt_aggregate::record::key_name as kind_name;
    let meta = reader.meta();
    let counter = meta.events.get(r.counter as usize).map_or_else(|| format!("counter {}", r.counter), |e| e.name.clone());
    let cpus: std::collections::BTreeSet<u32> = r.intervals.iter().map(|i| i.iv.cpu).collect();
    writeln!(w, "Aggregate profile of {}: key {}, summed counter {counter}", reader.path().display(), kind_name(r.key_kind))?;
    writeln!(
        w,
        "  {} samples in {} intervals on {} CPU{}; {} distinct keys; other {} ({:.1}%), of which {} table misses; {counter} sum {}",
        r.samples,
        r.intervals.len(),
        cpus.len(),
        if cpus.len() == 1 { "" } else { "s" },
        r.distinct_keys,
        r.other_count,
        pct(r.other_count, r.samples),
        r.misses,
        r.sum_total
    )?;
    if r.inconsistent > 0 || r.malformed > 0 {
        writeln!(w, "  WARNING: {} inconsistent intervals, {} malformed records", r.inconsistent, r.malformed)?;
    }
    let rank = match by {
        RankBy::Count => "samples",
        RankBy::Sum => &counter,
    };
    writeln!(w, "\nTop {} keys by {rank}", r.top.len())?;
    writeln!(w, "  {:>4}  {:<32} {:>10} {:>7} {:>16} {:>7} {:>9}", "rank", "key", "samples", "share", "sum", "share", "intervals")?;
    for (i, k) in r.top.iter().enumerate() {
        writeln!(
            w,
            "  {:>4}  {:<32} {:>10} {:>6.1}% {:>16} {:>6.1}% {:>9}",
            i + 1,
            key_name(r.key_kind, &k.key),
            k.count,
            pct(k.count, r.samples),
            k.sum,
            pct(k.sum, r.sum_total),
            k.intervals
        )?;
    }
    if r.other_count > 0 {
        writeln!(
            w,
            "  {:>4}  {:<32} {:>10} {:>6.1}% {:>16} {:>6.1}%",
            "",
            "(other: no table slot)",
            r.other_count,
            pct(r.other_count, r.samples),
            r.other_sum,
            pct(r.other_sum, r.sum_total)
        )?;
    }
    if series {
        let base = meta.start_time_ns;
        writeln!(w, "\nTime series (one row per interval per CPU; seconds from the start)")?;
        writeln!(
            w,
            "  {:>4} {:>6} {:>12} {:>12} {:>9} {:>6} {:>8} {:>8} {:>16}",
            "cpu", "seq", "start", "end", "samples", "keys", "other", "misses", "sum"
        )?;
        for row in &r.intervals {
            let iv = &row.iv;
            let (start, end) = if iv.samples == 0 { ("-".into(), "-".into()) } else { (secs(iv.start_ns, base), secs(iv.end_ns, base)) };
            writeln!(
                w,
                "  {:>4} {:>6} {:>12} {:>12} {:>9} {:>6} {:>8} {:>8} {:>16}",
                iv.cpu, iv.seq, start, end, iv.samples, row.keys, iv.other_count, iv.misses, iv.sum_total
            )?;
        }
    }
    Ok(())
}
