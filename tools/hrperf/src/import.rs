//! `hrperf import`: perf.data files and stap stack-count text to llc-stack captures
//! (the library side is [`hrperf::import`]).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hrperf::import::{
    import_perf_data, import_stap, perf_data::skipped_text, ImportSummary, PerfDataOptions,
    StapOptions,
};

use crate::args::ImportArgs;
use crate::{CliError, CliResult};

/// Runs `hrperf import`.
pub fn run(a: ImportArgs) -> CliResult {
    let (input, kind) = match (&a.stap, &a.perf_data) {
        (Some(s), _) => (s.clone(), "stap"),
        (None, Some(p)) => (p.clone(), "perf.data"),
        (None, None) => ("perf.data".into(), "perf.data"),
    };
    if same_file(&input, &a.output) {
        return Err(CliError(format!(
            "the output {} is the input: give another file with -o",
            a.output.display()
        )));
    }
    let mut meter = Meter::new(!a.quiet && std::io::stderr().is_terminal());
    let mut progress = |done: u64, total: u64| meter.show(done, total);
    let summary = if a.stap.is_some() {
        let opts = StapOptions {
            root_first: a.root_first,
            skip_bad: a.skip_bad,
        };
        import_stap(&input, &a.output, &opts, &mut progress)?
    } else {
        let opts = PerfDataOptions {
            kallsyms: if a.no_kallsyms {
                None
            } else {
                Some(
                    a.kallsyms
                        .clone()
                        .unwrap_or_else(|| "/proc/kallsyms".into()),
                )
            },
        };
        import_perf_data(&input, &a.output, &opts, &mut progress)?
    };
    meter.clear();
    report(&summary, kind, &input, &a.output);
    if let Some(damage) = summary.damage {
        return Err(CliError(format!(
            "{damage}; the {} records before it were imported into {}",
            summary.records,
            a.output.display()
        )));
    }
    if summary.records == 0 {
        eprintln!(
            "hrperf: warning: {} held no samples; {} has no stack records",
            input.display(),
            a.output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn report(s: &ImportSummary, kind: &str, input: &Path, output: &Path) {
    let what = if kind == "stap" {
        "stack lines"
    } else {
        "samples"
    };
    eprintln!(
        "hrperf: imported {kind} {} -> {}: {} {what} ({} with call stacks), {} records, {} frames, weight {}",
        input.display(),
        output.display(),
        s.samples,
        s.stacks,
        s.records,
        s.frames,
        s.weight
    );
    if s.lost > 0 {
        eprintln!(
            "hrperf: the perf.data says {} samples were lost while recording",
            s.lost
        );
    }
    if s.truncated > 0 {
        eprintln!(
            "hrperf: {} stacks were cut to the frames one record holds",
            s.truncated
        );
    }
    if !s.skipped.is_empty() {
        eprintln!("hrperf: skipped records: {}", skipped_text(&s.skipped));
    }
    for n in &s.notes {
        eprintln!("hrperf: note: {n}");
    }
}

/// Whether two paths name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The progress line on stderr (a terminal only), at most 5 times a second.
struct Meter {
    on: bool,
    start: Instant,
    last: Option<Instant>,
    shown: bool,
}

impl Meter {
    fn new(on: bool) -> Meter {
        Meter {
            on,
            start: Instant::now(),
            last: None,
            shown: false,
        }
    }

    fn show(&mut self, done: u64, total: u64) {
        if !self.on || self.start.elapsed() < Duration::from_millis(500) {
            return;
        }
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.last = Some(Instant::now());
        let pct = if total > 0 {
            done as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        eprint!(
            "\r\x1b[K[hrperf] import {:.0}%  {} of {} MiB  {:.1} s",
            pct.min(100.0),
            done >> 20,
            total >> 20,
            self.start.elapsed().as_secs_f64()
        );
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
            self.shown = false;
        }
    }
}
