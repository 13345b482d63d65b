//! `hrperf report --format pebs`: the memory-access profile of a PEBS capture
//! ([`hrperf::pebs_report`]), printed as tables.

use std::io::{self, Write};
use std::process::ExitCode;

use hrperf::capture::Reader;
use hrperf::pebs_report::{profile, Bucket, PebsProfile, LAT_BUCKETS};

use crate::args::ReportArgs;
use crate::{CliError, CliResult};

/// Runs `hrperf report`.
pub fn run(a: ReportArgs) -> CliResult {
    if a.format != "pebs" {
        return Err(CliError(format!("no report for format '{}': the reports available are: pebs", a.format)));
    }
    let reader = Reader::open(&a.input)?;
    let p = profile(&reader, a.top.max(1))?;
    let mut out = io::BufWriter::new(io::stdout().lock());
    match print(&mut out, &reader, &p).and_then(|()| out.flush()) {
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
