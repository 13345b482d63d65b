//! `hrperf report` on an llc-stack capture: the call-stack profile of
//! [`hrperf::stacks`] as a table of the top functions (inclusive and self weight), the
//! callers or callees of one function, folded stacks, an SVG flame graph, or JSON.

use std::io::{self, Write};
use std::process::ExitCode;

use hrperf::agg_report::RankBy;
use hrperf::capture::Reader;
use hrperf::stacks::{Edge, FrameFilter, FunctionStats, Profile, ProfileOptions, SortBy, WeightBy};
use serde_json::{json, Value};

use crate::args::{ReportArgs, ReportBy, StackSort};
use crate::{CliError, CliResult};

/// Rows of the function table unless `--top` says otherwise.
const DEFAULT_TOP: usize = 20;

/// The options checked and turned into library configuration before any work.
fn options(a: &ReportArgs, aggregate: bool) -> Result<(ProfileOptions, SortBy), CliError> {
    if aggregate && a.time_series {
        return Err(CliError(
            "--time-series prints the table of intervals: leave out the stack options (--folded, --flamegraph, ...)".into(),
        ));
    }
    if aggregate && a.samples {
        return Err(CliError(
            "--samples does not apply to aggregates: a key's weight is its sample count already (or its counter sum with --by sum)".into(),
        ));
    }
    if !aggregate && (a.by.is_some() || a.time_series) {
        return Err(CliError(
            "--by and --time-series apply to --format aggregate reports, not to llc-stack".into(),
        ));
    }
    if a.folded && (a.callers.is_some() || a.callees.is_some() || a.json) {
        return Err(CliError(
            "--folded prints only the folded stacks: leave out --callers, --callees and --json".into(),
        ));
    }
    if a.folded_comm && !a.folded && a.flamegraph.is_none() {
        return Err(CliError("--folded-comm needs --folded or --flamegraph".into()));
    }
    let frames = match (a.kernel_only, a.user_only) {
        (true, true) => return Err(CliError("--kernel-only and --user-only cannot be combined".into())),
        (true, false) => FrameFilter::KernelOnly,
        (false, true) => FrameFilter::UserOnly,
        (false, false) => FrameFilter::All,
    };
    let weight = if a.samples { WeightBy::Samples } else { WeightBy::Weight };
    let sort = match a.sort.unwrap_or(StackSort::Inclusive) {
        StackSort::Inclusive => SortBy::Inclusive,
        StackSort::SelfWeight => SortBy::SelfWeight,
    };
    Ok((
        ProfileOptions {
            weight,
            frames,
            ..ProfileOptions::default()
        },
        sort,
    ))
}

/// Runs the llc-stack report.
pub fn run(a: &ReportArgs, reader: &Reader) -> CliResult {
    let (opts, sort) = options(a, false)?;
    let profile = Profile::from_reader(reader, &opts)?;
    emit(a, reader, &profile, sort)
}

/// The stack views of a stack-keyed aggregate capture (`--agg-key stack`): each key's
/// stacks weighted by its sample count (or counter sum with `--by sum`), then the same
/// table, callers/callees, folded stacks and flame graph as for llc-stack captures.
pub fn run_aggregate(a: &ReportArgs, reader: &Reader) -> CliResult {
    let (opts, sort) = options(a, true)?;
    let by = match a.by.unwrap_or(ReportBy::Count) {
        ReportBy::Count => RankBy::Count,
        ReportBy::Sum => RankBy::Sum,
    };
    let (profile, left_out) = hrperf::agg_report::stack_profile(reader, by, &opts)?;
    if left_out > 0 {
        eprintln!(
            "[hrperf] note: {left_out} {} of keys whose stacks the kernel's stack table did not keep are left out",
            if by == RankBy::Count { "samples" } else { "counter events" }
        );
    }
    emit(a, reader, &profile, sort)
}

/// Prints what `a` asks for of `profile`.
fn emit(a: &ReportArgs, reader: &Reader, profile: &Profile, sort: SortBy) -> CliResult {
    // A function asked for must exist before anything is printed or written.
    for name in [&a.callers, &a.callees].into_iter().flatten() {
        if profile.function(name).is_none() {
            return Err(CliError(unknown_function(profile, name, reader)));
        }
    }
    if let Some(path) = &a.flamegraph {
        let title = format!("hrperf: {}", reader.path().display());
        profile.flamegraph(path, &title, a.folded_comm)?;
        eprintln!("[hrperf] flame graph: {}", path.display());
    }
    let mut out = io::BufWriter::new(io::stdout().lock());
    let top = a.top.unwrap_or(DEFAULT_TOP).max(1);
    let printed = if a.folded {
        match profile.folded(&mut out, a.folded_comm) {
            Err(hrperf::stacks::StackError::Io { source, .. }) => Err(source),
            r => r.map_err(|e| io::Error::other(e.to_string())),
        }
    } else if a.json {
        let v = to_json(profile, reader, sort, top, a);
        writeln!(out, "{v}")
    } else if a.callers.is_some() || a.callees.is_some() {
        print_edges(&mut out, profile, a)
    } else {
        print_table(&mut out, profile, reader, sort, top)
    };
    match printed.and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(CliError(format!("writing the report: {e}"))),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// The error for a function no stack holds, with a few names that contain what was asked.
fn unknown_function(p: &Profile, name: &str, reader: &Reader) -> String {
    let near: Vec<String> = p
        .functions(SortBy::Inclusive)
        .into_iter()
        .filter(|f| f.name.contains(name))
        .take(3)
        .map(|f| format!("'{}'", f.name))
        .collect();
    let hint = if near.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", near.join(", "))
    };
    format!("function '{name}' is in no stack of {}{hint}", reader.path().display())
}

fn weight_unit(p: &Profile) -> &'static str {
    match p.options().weight {
        WeightBy::Weight => "events",
        WeightBy::Samples => "samples",
    }
}

fn kind(f: &FunctionStats) -> &'static str {
    if f.kernel {
        "[k]"
    } else {
        "[.]"
    }
}

fn print_summary(w: &mut dyn Write, p: &Profile, reader: &Reader) -> io::Result<()> {
    let s = p.stats();
    writeln!(w, "Call-stack profile of {}", reader.path().display())?;
    let filter = match p.options().frames {
        FrameFilter::All => "",
        FrameFilter::KernelOnly => "; kernel frames only",
        FrameFilter::UserOnly => "; user frames only",
    };
    writeln!(
        w,
        "  {} samples, total weight {} {}; {} distinct stacks, {} distinct frames ({} unresolved){filter}",
        p.total_samples(),
        p.total_weight(),
        weight_unit(p),
        s.distinct_stacks,
        s.distinct_frames,
        s.unresolved_frames
    )?;
    if s.kernel_truncated + s.user_truncated > 0 {
        writeln!(
            w,
            "  truncated at the depth limit: {} kernel stacks, {} user stacks (their outermost frames are missing)",
            s.kernel_truncated, s.user_truncated
        )?;
    }
    if s.lost + s.malformed > 0 {
        writeln!(
            w,
            "  WARNING: {} records lost while recording, {} malformed records skipped",
            s.lost, s.malformed
        )?;
    }
    Ok(())
}

fn print_table(w: &mut dyn Write, p: &Profile, reader: &Reader, sort: SortBy, top: usize) -> io::Result<()> {
    print_summary(w, p, reader)?;
    let funcs = p.functions(sort);
    let by = match sort {
        SortBy::Inclusive => "inclusive",
        SortBy::SelfWeight => "self",
    };
    writeln!(
        w,
        "\nTop {} of {} functions by {by} weight",
        top.min(funcs.len()),
        funcs.len()
    )?;
    writeln!(
        w,
        "  {:>7} {:>7} {:>16} {:>16} {:>9}  {:<44} object",
        "incl", "self", "incl.weight", "self.weight", "samples", "function"
    )?;
    for f in funcs.iter().take(top) {
        writeln!(
            w,
            "  {:>6.2}% {:>6.2}% {:>16} {:>16} {:>9}  {} {:<40} {}",
            p.pct(f.inclusive),
            p.pct(f.self_weight),
            f.inclusive,
            f.self_weight,
            f.inclusive_samples,
            kind(f),
            f.name,
            f.object
        )?;
    }
    Ok(())
}

fn print_edges(w: &mut dyn Write, p: &Profile, a: &ReportArgs) -> io::Result<()> {
    for (name, callers) in [(&a.callers, true), (&a.callees, false)] {
        let Some(name) = name else { continue };
        let (Some(f), Some(edges)) = (
            p.function(name),
            if callers { p.callers(name) } else { p.callees(name) },
        ) else {
            continue;
        };
        writeln!(
            w,
            "{} of {} {}: inclusive {:.2}% ({} {}), self {:.2}% ({})",
            if callers { "Callers" } else { "Callees" },
            kind(f),
            f.name,
            p.pct(f.inclusive),
            f.inclusive,
            weight_unit(p),
            p.pct(f.self_weight),
            f.self_weight
        )?;
        writeln!(
            w,
            "  {:>7} {:>7} {:>16} {:>9}  {:<40} object",
            "total", "of func", "weight", "samples", "function"
        )?;
        for e in &edges {
            let of_f = if f.inclusive == 0 {
                0.0
            } else {
                100.0 * e.weight as f64 / f.inclusive as f64
            };
            writeln!(
                w,
                "  {:>6.2}% {:>6.2}% {:>16} {:>9}  {:<40} {}",
                p.pct(e.weight),
                of_f,
                e.weight,
                e.samples,
                e.name,
                e.object
            )?;
        }
        if edges.is_empty() {
            writeln!(
                w,
                "  (none: {} is always the {} frame)",
                f.name,
                if callers { "outermost" } else { "leaf" }
            )?;
        }
        writeln!(w)?;
    }
    Ok(())
}

fn func_json(p: &Profile, f: &FunctionStats) -> Value {
    json!({
        "name": &*f.name,
        "object": &*f.object,
        "kernel": f.kernel,
        "inclusive": f.inclusive,
        "self": f.self_weight,
        "inclusive_pct": p.pct(f.inclusive),
        "self_pct": p.pct(f.self_weight),
        "inclusive_samples": f.inclusive_samples,
        "self_samples": f.self_samples,
    })
}

fn edges_json(p: &Profile, edges: Option<Vec<Edge>>) -> Value {
    edges
        .unwrap_or_default()
        .iter()
        .map(|e| {
            json!({"name": &*e.name, "object": &*e.object, "weight": e.weight, "pct": p.pct(e.weight), "samples": e.samples})
        })
        .collect()
}

fn to_json(p: &Profile, reader: &Reader, sort: SortBy, top: usize, a: &ReportArgs) -> Value {
    let s = p.stats();
    let mut v = json!({
        "capture": reader.path().display().to_string(),
        "weight_by": weight_unit(p),
        "total_weight": p.total_weight(),
        "total_samples": p.total_samples(),
        "stats": {
            "records": s.records, "malformed": s.malformed, "lost": s.lost,
            "kernel_truncated": s.kernel_truncated, "user_truncated": s.user_truncated,
            "distinct_stacks": s.distinct_stacks, "distinct_frames": s.distinct_frames,
            "unresolved_frames": s.unresolved_frames,
        },
        "functions": p.functions(sort).into_iter().take(top).map(|f| func_json(p, f)).collect::<Vec<_>>(),
    });
    if let Some(name) = &a.callers {
        v["callers"] = json!({"function": name, "edges": edges_json(p, p.callers(name))});
    }
    if let Some(name) = &a.callees {
        v["callees"] = json!({"function": name, "edges": edges_json(p, p.callees(name))});
    }
    v
}
