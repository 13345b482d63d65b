//! `hrperf decode`, `hrperf info` and `hrperf formats`: reading captures through the
//! decoder plugins.

use std::io::{self, Write};
use std::process::ExitCode;

use hrperf::capture::Reader;
use hrperf::decode::{decode_capture, make_sink, write_info, DecodeCaptureError, OutputFormat};
use hrperf::plugin::{Plugin, PluginHost};

use crate::args::{DecodeArgs, InfoArgs, OutputKind};
use crate::{CliError, CliResult};

/// Finds the plugin for a capture: by `--format` name if given, else by the capture's
/// format UUID, else by its format name.
fn pick_plugin<'a>(plugins: &'a [Plugin], reader: &Reader, forced: Option<&str>) -> Result<&'a Plugin, CliError> {
    let meta = reader.meta();
    let found = match forced {
        Some(name) => PluginHost::find(plugins, name),
        None => PluginHost::find_uuid(plugins, meta.format_uuid).or_else(|| PluginHost::find(plugins, &meta.format_name)),
    };
    found.ok_or_else(|| {
        let wanted = forced.map_or_else(|| format!("'{}' ({})", meta.format_name, meta.format_uuid), |n| format!("'{n}'"));
        let have: Vec<&str> = plugins.iter().map(Plugin::name).collect();
        CliError(format!(
            "no decoder plugin for format {wanted}; found: {}; searched: {} (set HRPERF_PLUGIN_PATH to add a directory)",
            if have.is_empty() { "none".to_string() } else { have.join(", ") },
            search_dirs_text()
        ))
    })
}

fn search_dirs_text() -> String {
    PluginHost::search_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Runs `hrperf decode`.
pub fn run_decode(a: DecodeArgs) -> CliResult {
    let reader = Reader::open(&a.input)?;
    let (plugins, errors) = PluginHost::discover();
    let plugin = match pick_plugin(&plugins, &reader, a.format.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            for err in &errors {
                eprintln!("hrperf: plugin refused: {err}");
            }
            return Err(e);
        }
    };
    let stdout = io::stdout().lock();
    let mut sink = make_sink(
        match a.output {
            OutputKind::Jsonl => OutputFormat::Json,
            OutputKind::Csv => OutputFormat::Csv,
            OutputKind::Table => OutputFormat::Table,
        },
        io::BufWriter::with_capacity(1 << 16, stdout),
    );
    match decode_capture(&reader, plugin, sink.as_mut()) {
        Ok(summary) => {
            drop(sink);
            for w in &summary.warnings {
                eprintln!("hrperf: warning: {w}");
            }
            for n in &summary.notes {
                eprintln!("hrperf: note: {n}");
            }
            if summary.lost > 0 || summary.unknown > 0 || summary.malformed > 0 {
                eprintln!("hrperf: {summary}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(DecodeCaptureError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(DecodeCaptureError::Corrupt { error, partial }) => {
            drop(sink);
            Err(CliError(format!("{error} ({partial} before it were written)")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs `hrperf info`.
pub fn run_info(a: InfoArgs) -> CliResult {
    let reader = Reader::open(&a.input)?;
    let scan = reader.scan();
    let mut out = io::stdout().lock();
    match write_info(&reader, &scan, &mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Runs `hrperf formats`.
pub fn run_formats() -> CliResult {
    let (plugins, errors) = PluginHost::discover();
    let mut out = io::stdout().lock();
    let res = (|| -> io::Result<()> {
        writeln!(out, "{:<12} {:<36} {:<8} PATH", "NAME", "UUID", "VERSION")?;
        for p in &plugins {
            let v = p.format_version();
            writeln!(out, "{:<12} {:<36} {:<8} {}", p.name(), p.uuid(), format!("{}.{}", v >> 16, v & 0xffff), p.path().display())?;
        }
        out.flush()
    })();
    if let Err(e) = res {
        if e.kind() != io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    for e in &errors {
        eprintln!("hrperf: plugin refused: {e}");
    }
    if plugins.is_empty() {
        return Err(CliError(format!(
            "no decoder plugins found; searched: {} (set HRPERF_PLUGIN_PATH to add a directory)",
            search_dirs_text()
        )));
    }
    Ok(ExitCode::SUCCESS)
}
