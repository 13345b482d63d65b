//! Decoding a capture through its plugin into JSON lines, CSV or an aligned table, and
//! the summaries `hrperf info` prints.
//!
//! [`decode_capture`] streams every chunk and record of a [`Reader`]: records of the
//! plugin's kinds go through [`Plugin::decode`], `LOST` records are decoded by the host
//! (kind `lost`, field `lost`) and reported inline, records of other types are skipped
//! and counted. On a damaged chunk it stops with the error after everything before it has
//! been written.
//!
//! Output shapes (field names are the plugin's, and stable):
//!
//! ```text
//! JSON: {"kind":"delta","cpu":0,"time_ns":1000,...,"counters":{"cpu-clock":1000123,"page-faults":3}}
//!       {"kind":"lost","cpu":0,"lost":5}
//! CSV:  kind,cpu,time_ns,pid,tid,trigger,ip,ovfl_counter,multi_wrap,cpu-clock,page-faults,lost
//!       delta,0,1000,7,7,overflow,0x401000,0,0,1000123,3,
//! ```
//!
//! Absent values are `null` in JSON and empty in CSV; `HEX` values are `"0x…"` strings;
//! `TIME` values are integer ns (seconds in the table). The CSV is plain RFC 4180 (quoted
//! only when needed), which DuckDB's `read_csv_auto` reads as is.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, BufWriter, Write};

use hrperf_abi::capture::{
    EndInfo, CHUNK_DATA, CLOCK_MONOTONIC, CLOCK_PERF, CLOCK_SIM, CLOCK_TSC, SOURCE_KMOD,
    SOURCE_PERF, SOURCE_SIM,
};
use hrperf_abi::format::{MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL};
use hrperf_abi::plugin::DecodeCtx;
use hrperf_abi::{EventDesc, RecordType};

use crate::capture::{CaptureError, CaptureMeta, Reader, Scan, Warning};
use crate::plugin::{
    DecodeError, DecodeScratch, Decoded, FieldKind, FieldSchema, KindSchema, Plugin, Value,
    LOST_KIND,
};

/// The [`DecodeCtx`] for records of `cpu` in a capture described by `meta`.
pub fn decode_ctx(meta: &CaptureMeta, cpu: u32) -> DecodeCtx {
    DecodeCtx {
        size: size_of::<DecodeCtx>() as u32,
        nr_counters: meta.events.len() as u32,
        cpu,
        clock: meta.clock,
        format_version: meta.format_version,
        reserved: 0,
    }
}

/// What [`decode_capture`] did.
#[derive(Debug, Default)]
pub struct DecodeSummary {
    /// Intact chunks read (all kinds).
    pub chunks: u64,
    /// Records decoded by the plugin and written.
    pub records: u64,
    /// `LOST` records written.
    pub lost_records: u64,
    /// Sum of their counts.
    pub lost: u64,
    /// Records of types the plugin does not declare, skipped.
    pub unknown: u64,
    /// Those per record type.
    pub unknown_types: BTreeMap<u32, u64>,
    /// Records the plugin refused (truncated, malformed), skipped.
    pub malformed: u64,
    /// The first of those: file offset and why.
    pub first_malformed: Option<(u64, DecodeError)>,
    /// The END chunk's information, if reached.
    pub end: Option<EndInfo>,
    /// Header, metadata and chunk warnings (e.g. no END chunk).
    pub warnings: Vec<Warning>,
    /// Remarks about the plugin/capture pairing (e.g. a newer minor format version).
    pub notes: Vec<String>,
}

impl fmt::Display for DecodeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} records decoded from {} chunks",
            self.records, self.chunks
        )?;
        if self.lost_records > 0 {
            write!(
                f,
                "; {} records lost (in {} LOST records)",
                self.lost, self.lost_records
            )?;
        }
        if self.unknown > 0 {
            write!(
                f,
                "; {} records of types the plugin does not decode skipped (",
                self.unknown
            )?;
            for (i, (t, n)) in self.unknown_types.iter().enumerate() {
                write!(f, "{}type {t:#x}: {n}", if i > 0 { ", " } else { "" })?;
            }
            f.write_str(")")?;
        }
        if self.malformed > 0 {
            write!(f, "; {} malformed records skipped", self.malformed)?;
            if let Some((off, e)) = self.first_malformed {
                write!(f, " (first at offset {off}: {e})")?;
            }
        }
        Ok(())
    }
}

/// Why [`decode_capture`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeCaptureError {
    /// A chunk or record is damaged; everything before it was written.
    #[error("{error}")]
    Corrupt {
        /// What is damaged, and where.
        error: CaptureError,
        /// What was decoded before it.
        partial: Box<DecodeSummary>,
    },
    /// Writing the output failed (a broken pipe included: callers treat it as success).
    #[error("writing the decoded output failed: {0}")]
    Output(#[from] io::Error),
    /// The plugin decodes another format.
    #[error("plugin '{plugin}' ({plugin_uuid}) does not decode this capture's format '{format}' ({format_uuid})")]
    WrongPlugin {
        /// The plugin's name.
        plugin: String,
        /// Its UUID.
        plugin_uuid: hrperf_abi::Uuid,
        /// The capture's format name.
        format: String,
        /// Its UUID.
        format_uuid: hrperf_abi::Uuid,
    },
    /// The capture's format version has a newer major version than the plugin knows.
    #[error("the capture's '{format}' format version {} is newer than plugin {} understands ({}); install a newer decoder plugin", version_string(*capture), plugin.display(), version_string(*supported))]
    FormatTooNew {
        /// The format.
        format: String,
        /// The capture's format version.
        capture: u32,
        /// The newest the plugin understands.
        supported: u32,
        /// The plugin's path.
        plugin: std::path::PathBuf,
    },
}

/// `major << 16 | minor` as `major.minor`.
pub fn version_string(v: u32) -> String {
    format!("{}.{}", v >> 16, v & 0xffff)
}

/// Name of a `SOURCE_*` value.
pub fn source_name(source: u32) -> &'static str {
    match source {
        SOURCE_SIM => "sim",
        SOURCE_PERF => "perf",
        SOURCE_KMOD => "kmod",
        _ => "unknown",
    }
}

/// Name of a `CLOCK_*` value.
pub fn clock_name(clock: u32) -> &'static str {
    match clock {
        CLOCK_MONOTONIC => "monotonic",
        CLOCK_SIM => "sim",
        CLOCK_PERF => "perf",
        CLOCK_TSC => "tsc",
        _ => "unknown",
    }
}

/// Name of a `MODE_*` value.
pub fn mode_name(mode: u32) -> &'static str {
    match mode {
        MODE_OVERFLOW => "overflow",
        MODE_POLL => "poll",
        MODE_INSTRUCTED => "instructed",
        _ => "unknown",
    }
}

/// What fills one output column for one record kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Empty,
    Kind,
    HostCpu,
    Field(usize),
    Counter(usize, usize),
}

/// The output's shape: counter names, record kinds (the plugin's, then `lost`) and the
/// flat columns of CSV and table output.
#[derive(Debug, Clone)]
pub struct Schema {
    /// Counter names, in counter order (made unique: a repeated event gets `#2`, …).
    pub events: Vec<String>,
    /// The plugin's kinds, then the host's `lost` kind (the last entry).
    pub kinds: Vec<KindSchema>,
    /// Flat column names: `kind`, `cpu`, each field, one per counter (named after the
    /// event), `lost`.
    pub columns: Vec<String>,
    /// Per kind, per column.
    cells: Vec<Vec<Cell>>,
    /// Per kind: whether the host writes `cpu` (the kind has no `cpu` field of its own).
    host_cpu: Vec<bool>,
}

impl Schema {
    /// The schema for `plugin`'s kinds over a capture with `events`.
    pub fn new(events: &[String], plugin_kinds: &[KindSchema]) -> Schema {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let events: Vec<String> = events
            .iter()
            .map(|e| {
                let n = seen.entry(e.as_str()).or_insert(0);
                *n += 1;
                if *n == 1 {
                    e.clone()
                } else {
                    format!("{e}#{n}")
                }
            })
            .collect();
        let mut kinds = plugin_kinds.to_vec();
        kinds.push(KindSchema {
            name: LOST_KIND.into(),
            record_type: RecordType::LOST,
            fields: vec![FieldSchema {
                name: "lost".into(),
                kind: FieldKind::U64,
            }],
        });

        let mut columns: Vec<String> = vec!["kind".into(), "cpu".into()];
        let mut by_name: HashMap<String, usize> = HashMap::new();
        by_name.insert("kind".into(), 0);
        by_name.insert("cpu".into(), 1);
        // Plain fields by name; counters by (field name, counter index).
        let mut counter_cols: HashMap<(String, usize), usize> = HashMap::new();
        let mut per_kind: Vec<Vec<(usize, Cell)>> = Vec::new();
        for kind in &kinds {
            let mut placed = vec![(0, Cell::Kind)];
            for (i, f) in kind.fields.iter().enumerate() {
                if f.kind == FieldKind::Counters {
                    for (j, ev) in events.iter().enumerate() {
                        let key = (f.name.clone(), j);
                        let col = match counter_cols.get(&key) {
                            Some(&c) => c,
                            None => {
                                let mut name = if f.name == "counters" {
                                    ev.clone()
                                } else {
                                    format!("{}.{ev}", f.name)
                                };
                                if by_name.contains_key(&name) {
                                    name = format!("{}.{ev}", f.name);
                                }
                                while by_name.contains_key(&name) {
                                    name.push('_');
                                }
                                columns.push(name.clone());
                                by_name.insert(name, columns.len() - 1);
                                counter_cols.insert(key, columns.len() - 1);
                                columns.len() - 1
                            }
                        };
                        placed.push((col, Cell::Counter(i, j)));
                    }
                } else {
                    let col = *by_name.entry(f.name.clone()).or_insert_with(|| {
                        columns.push(f.name.clone());
                        columns.len() - 1
                    });
                    placed.push((col, Cell::Field(i)));
                }
            }
            if !kind.fields.iter().any(|f| f.name == "cpu") {
                placed.push((1, Cell::HostCpu));
            }
            per_kind.push(placed);
        }
        let cells = per_kind
            .into_iter()
            .map(|placed| {
                let mut row = vec![Cell::Empty; columns.len()];
                for (col, cell) in placed {
                    row[col] = cell;
                }
                row
            })
            .collect();
        let host_cpu = kinds
            .iter()
            .map(|k| !k.fields.iter().any(|f| f.name == "cpu"))
            .collect();
        Schema {
            events,
            kinds,
            columns,
            cells,
            host_cpu,
        }
    }

    /// Index of the host's `lost` kind in [`Schema::kinds`].
    pub fn lost_kind(&self) -> usize {
        self.kinds.len() - 1
    }

    /// Name of counter `j` (`counter<j>` past the capture's events).
    fn event_name(&self, j: usize) -> std::borrow::Cow<'_, str> {
        match self.events.get(j) {
            Some(e) => e.as_str().into(),
            None => format!("counter{j}").into(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum RowData<'a> {
    Decoded(&'a Decoded<'a>),
    Lost(u64),
}

/// One record to output: its kind (an index into [`Schema::kinds`]), where it came from,
/// and its values.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    /// Index into [`Schema::kinds`].
    pub kind: usize,
    /// CPU of the chunk it came from.
    pub cpu: u32,
    /// File offset of the record.
    pub offset: u64,
    data: RowData<'a>,
}

impl<'a> Row<'a> {
    /// A record the plugin decoded (`kind` is [`Decoded::kind_index`]).
    pub fn decoded(cpu: u32, offset: u64, d: &'a Decoded<'a>) -> Self {
        Row {
            kind: d.kind_index(),
            cpu,
            offset,
            data: RowData::Decoded(d),
        }
    }

    /// A `LOST` record of `schema`.
    pub fn lost(schema: &Schema, cpu: u32, offset: u64, lost: u64) -> Self {
        Row {
            kind: schema.lost_kind(),
            cpu,
            offset,
            data: RowData::Lost(lost),
        }
    }

    /// Value of field `i` of the row's kind.
    #[inline]
    pub fn value(&self, i: usize) -> Value<'a> {
        match self.data {
            RowData::Decoded(d) => d.value(i),
            RowData::Lost(n) if i == 0 => Value::U64(n),
            RowData::Lost(_) => Value::Absent,
        }
    }
}

/// Where decoded records go.
pub trait Sink {
    /// Called once, before any record.
    fn begin(&mut self, schema: &Schema) -> io::Result<()>;
    /// One record.
    fn record(&mut self, schema: &Schema, row: &Row<'_>) -> io::Result<()>;
    /// Called once at the end (also after a damaged chunk): flush.
    fn finish(&mut self) -> io::Result<()>;
}

/// An output format for [`make_sink`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// One JSON object per line.
    Json,
    /// CSV with a header row.
    Csv,
    /// An aligned table for people.
    Table,
}

/// A sink of `format` writing to `out` (buffered inside).
pub fn make_sink<'w, W: Write + 'w>(format: OutputFormat, out: W) -> Box<dyn Sink + 'w> {
    match format {
        OutputFormat::Json => Box::new(JsonSink::new(out)),
        OutputFormat::Csv => Box::new(CsvSink::new(out)),
        OutputFormat::Table => Box::new(TableSink::new(out)),
    }
}

const OUT_BUF: usize = 256 * 1024;

/// JSON lines: one object per record.
///
/// Keys are escaped once (by serde_json) when the schema is known; each record then
/// writes the pre-escaped keys and its values, strings escaped by serde_json.
#[derive(Debug)]
pub struct JsonSink<W: Write> {
    out: BufWriter<W>,
    /// Per kind: `{"kind":"<name>"` and, per field, `,"<name>":`.
    kinds: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    /// Per counter: `"<event>":`.
    events: Vec<Vec<u8>>,
    host_cpu: Vec<bool>,
}

impl<W: Write> JsonSink<W> {
    /// Writes JSON lines to `out`.
    pub fn new(out: W) -> Self {
        JsonSink {
            out: BufWriter::with_capacity(OUT_BUF, out),
            kinds: Vec::new(),
            events: Vec::new(),
            host_cpu: Vec::new(),
        }
    }
}

/// `s` as a JSON string.
fn json_str(out: &mut impl Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(out, s).map_err(io::Error::from)
}

fn json_key(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 3);
    let _ = json_str(&mut k, name);
    k.push(b':');
    k
}

impl<W: Write> Sink for JsonSink<W> {
    fn begin(&mut self, schema: &Schema) -> io::Result<()> {
        self.kinds = schema
            .kinds
            .iter()
            .map(|k| {
                let mut prefix = b"{\"kind\":".to_vec();
                let _ = json_str(&mut prefix, &k.name);
                let fields = k
                    .fields
                    .iter()
                    .map(|f| {
                        let mut key = vec![b','];
                        key.extend(json_key(&f.name));
                        key
                    })
                    .collect();
                (prefix, fields)
            })
            .collect();
        self.events = schema.events.iter().map(|e| json_key(e)).collect();
        self.host_cpu = schema.host_cpu.clone();
        Ok(())
    }

    fn record(&mut self, schema: &Schema, row: &Row<'_>) -> io::Result<()> {
        let (Some((prefix, keys)), Some(&host_cpu)) =
            (self.kinds.get(row.kind), self.host_cpu.get(row.kind))
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "row of a kind not in the schema",
            ));
        };
        let out = &mut self.out;
        out.write_all(prefix)?;
        if host_cpu {
            out.write_all(b",\"cpu\":")?;
            write_u64(out, row.cpu.into())?;
        }
        for (i, key) in keys.iter().enumerate() {
            out.write_all(key)?;
            match row.value(i) {
                Value::Absent => out.write_all(b"null")?,
                Value::U64(v) | Value::Time(v) => write_u64(out, v)?,
                Value::I64(v) => out.write_all(itoa::Buffer::new().format(v).as_bytes())?,
                Value::Hex(v) => write!(out, "\"{v:#x}\"")?,
                Value::Str(v) => json_str(out, v)?,
                Value::Counters(l) => {
                    out.write_all(b"{")?;
                    for (j, v) in l.iter().enumerate() {
                        if j > 0 {
                            out.write_all(b",")?;
                        }
                        match self.events.get(j) {
                            Some(k) => out.write_all(k)?,
                            None => write!(out, "\"{}\":", schema.event_name(j))?,
                        }
                        write_u64(out, v)?;
                    }
                    out.write_all(b"}")?;
                }
                Value::HexList(l) => {
                    out.write_all(b"[")?;
                    for (j, v) in l.iter().enumerate() {
                        if j > 0 {
                            out.write_all(b",")?;
                        }
                        write!(out, "\"{v:#x}\"")?;
                    }
                    out.write_all(b"]")?;
                }
            }
        }
        out.write_all(b"}\n")
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes `v` as a CSV field (quoted only when needed).
fn csv_str(out: &mut impl Write, v: &str) -> io::Result<()> {
    let needs = v.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
        || v.starts_with(' ')
        || v.ends_with(' ');
    if !needs {
        return out.write_all(v.as_bytes());
    }
    out.write_all(b"\"")?;
    for (i, part) in v.split('"').enumerate() {
        if i > 0 {
            out.write_all(b"\"\"")?;
        }
        out.write_all(part.as_bytes())?;
    }
    out.write_all(b"\"")
}

fn write_u64(out: &mut impl Write, v: u64) -> io::Result<()> {
    let mut b = itoa::Buffer::new();
    out.write_all(b.format(v).as_bytes())
}

fn write_hex(out: &mut impl Write, v: u64) -> io::Result<()> {
    write!(out, "{v:#x}")
}

/// CSV: a header row, then one row per record; one column per counter.
#[derive(Debug)]
pub struct CsvSink<W: Write> {
    out: BufWriter<W>,
}

impl<W: Write> CsvSink<W> {
    /// Writes CSV to `out`.
    pub fn new(out: W) -> Self {
        CsvSink {
            out: BufWriter::with_capacity(OUT_BUF, out),
        }
    }
}

/// Writes one value as CSV/table text (no quoting, no padding).
fn plain_value(out: &mut impl Write, v: Value<'_>) -> io::Result<()> {
    match v {
        Value::Absent => Ok(()),
        Value::U64(v) | Value::Time(v) => write_u64(out, v),
        Value::I64(v) => {
            let mut b = itoa::Buffer::new();
            out.write_all(b.format(v).as_bytes())
        }
        Value::Hex(v) => write_hex(out, v),
        Value::Str(s) => out.write_all(s.as_bytes()),
        Value::Counters(l) => {
            for (i, v) in l.iter().enumerate() {
                if i > 0 {
                    out.write_all(b";")?;
                }
                write_u64(out, v)?;
            }
            Ok(())
        }
        Value::HexList(l) => {
            for (i, v) in l.iter().enumerate() {
                if i > 0 {
                    out.write_all(b";")?;
                }
                write_hex(out, v)?;
            }
            Ok(())
        }
    }
}

impl<W: Write> Sink for CsvSink<W> {
    fn begin(&mut self, schema: &Schema) -> io::Result<()> {
        for (i, c) in schema.columns.iter().enumerate() {
            if i > 0 {
                self.out.write_all(b",")?;
            }
            csv_str(&mut self.out, c)?;
        }
        self.out.write_all(b"\n")
    }

    fn record(&mut self, schema: &Schema, row: &Row<'_>) -> io::Result<()> {
        let out = &mut self.out;
        for (col, cell) in schema.cells[row.kind].iter().enumerate() {
            if col > 0 {
                out.write_all(b",")?;
            }
            match *cell {
                Cell::Empty => {}
                Cell::Kind => csv_str(out, &schema.kinds[row.kind].name)?,
                Cell::HostCpu => write_u64(out, row.cpu.into())?,
                Cell::Counter(i, j) => {
                    if let Value::Counters(l) = row.value(i) {
                        if let Some(v) = l.get(j) {
                            write_u64(out, v)?;
                        }
                    }
                }
                Cell::Field(i) => match row.value(i) {
                    Value::Str(s) => csv_str(out, s)?,
                    v => plain_value(out, v)?,
                },
            }
        }
        out.write_all(b"\n")
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// An aligned table for people: a header line, one line per record; LOST records as
/// `-- cpu N: M records lost --` lines.
#[derive(Debug)]
pub struct TableSink<W: Write> {
    out: BufWriter<W>,
    widths: Vec<usize>,
    right: Vec<bool>,
    buf: Vec<u8>,
}

impl<W: Write> TableSink<W> {
    /// Writes a table to `out`.
    pub fn new(out: W) -> Self {
        TableSink {
            out: BufWriter::with_capacity(OUT_BUF, out),
            widths: Vec::new(),
            right: Vec::new(),
            buf: Vec::new(),
        }
    }
}

impl<W: Write> Sink for TableSink<W> {
    fn begin(&mut self, schema: &Schema) -> io::Result<()> {
        let lost = schema.lost_kind();
        self.widths.clear();
        self.right.clear();
        let mut header = Vec::new();
        for (col, name) in schema.columns.iter().enumerate() {
            // The kind that defines the column decides its type (the lost kind's `lost`
            // column is not shown: LOST records get a line of their own).
            let cell = schema.cells[..lost]
                .iter()
                .map(|c| c[col])
                .find(|c| *c != Cell::Empty);
            let kind = match cell {
                Some(Cell::Field(i)) => {
                    let k = schema.cells[..lost]
                        .iter()
                        .position(|c| c[col] == Cell::Field(i));
                    k.map(|k| schema.kinds[k].fields[i].kind)
                }
                Some(Cell::Counter(..)) => Some(FieldKind::Counters),
                Some(Cell::HostCpu) => Some(FieldKind::U64),
                Some(Cell::Kind) => Some(FieldKind::Str),
                _ => None,
            };
            let (min, right) = match kind {
                None => (0, false),
                _ if col == 1 => (3, true),
                Some(FieldKind::Str) => (10, false),
                Some(FieldKind::Time) => (16, true),
                Some(FieldKind::Hex) => (18, true),
                Some(FieldKind::Counters) => (12, true),
                Some(FieldKind::HexList) => (0, false),
                Some(FieldKind::U64 | FieldKind::I64) => (7, true),
            };
            // Times are shown in seconds here, so say so in the heading.
            let label = match (kind, name.strip_suffix("_ns")) {
                (Some(FieldKind::Time), Some(stem)) => format!("{stem}_s"),
                _ => name.to_string(),
            };
            let width = if kind.is_none() {
                0
            } else {
                label.len().max(min)
            };
            self.widths.push(width);
            self.right.push(right);
            if width > 0 {
                if !header.is_empty() {
                    header.push(b' ');
                }
                pad(&mut header, label.as_bytes(), width, right);
            }
        }
        trim_end(&mut header);
        header.push(b'\n');
        self.out.write_all(&header)
    }

    fn record(&mut self, schema: &Schema, row: &Row<'_>) -> io::Result<()> {
        if row.kind == schema.lost_kind() {
            let n = match row.value(0) {
                Value::U64(n) => n,
                _ => 0,
            };
            return writeln!(self.out, "-- cpu {}: {n} records lost --", row.cpu);
        }
        let mut line = std::mem::take(&mut self.buf);
        line.clear();
        let mut first = true;
        let mut cell_buf: Vec<u8> = Vec::with_capacity(32);
        for (col, cell) in schema.cells[row.kind].iter().enumerate() {
            let width = self.widths.get(col).copied().unwrap_or(0);
            if width == 0 {
                continue;
            }
            cell_buf.clear();
            match *cell {
                Cell::Empty => {}
                Cell::Kind => cell_buf.extend_from_slice(schema.kinds[row.kind].name.as_bytes()),
                Cell::HostCpu => write_u64(&mut cell_buf, row.cpu.into())?,
                Cell::Counter(i, j) => {
                    if let Value::Counters(l) = row.value(i) {
                        if let Some(v) = l.get(j) {
                            write_u64(&mut cell_buf, v)?;
                        }
                    }
                }
                Cell::Field(i) => match row.value(i) {
                    Value::Time(t) => {
                        write!(cell_buf, "{}.{:09}", t / 1_000_000_000, t % 1_000_000_000)?
                    }
                    Value::Absent => cell_buf.push(b'-'),
                    v => plain_value(&mut cell_buf, v)?,
                },
            }
            if !first {
                line.push(b' ');
            }
            first = false;
            pad(&mut line, &cell_buf, width, self.right[col]);
        }
        trim_end(&mut line);
        line.push(b'\n');
        let r = self.out.write_all(&line);
        self.buf = line;
        r
    }

    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn pad(line: &mut Vec<u8>, v: &[u8], width: usize, right: bool) {
    let fill = width.saturating_sub(v.len());
    if right {
        line.resize(line.len() + fill, b' ');
        line.extend_from_slice(v);
    } else {
        line.extend_from_slice(v);
        line.resize(line.len() + fill, b' ');
    }
}

fn trim_end(line: &mut Vec<u8>) {
    while line.last() == Some(&b' ') {
        line.pop();
    }
}

/// Decodes every record of `reader` through `plugin` into `sink`; see the module docs.
pub fn decode_capture<S: Sink + ?Sized>(
    reader: &Reader,
    plugin: &Plugin,
    sink: &mut S,
) -> Result<DecodeSummary, DecodeCaptureError> {
    let meta = reader.meta();
    if plugin.uuid() != meta.format_uuid {
        return Err(DecodeCaptureError::WrongPlugin {
            plugin: plugin.name().to_owned(),
            plugin_uuid: plugin.uuid(),
            format: meta.format_name.clone(),
            format_uuid: meta.format_uuid,
        });
    }
    let mut summary = DecodeSummary::default();
    if meta.format_version >> 16 > plugin.format_version() >> 16 {
        return Err(DecodeCaptureError::FormatTooNew {
            format: meta.format_name.clone(),
            capture: meta.format_version,
            supported: plugin.format_version(),
            plugin: plugin.path().to_owned(),
        });
    }
    if meta.format_version > plugin.format_version() {
        summary.notes.push(format!(
            "the capture's format version {} is newer than the plugin's {}; fields added since are not shown",
            version_string(meta.format_version),
            version_string(plugin.format_version())
        ));
    }
    let events: Vec<String> = meta.events.iter().map(|e| e.name.clone()).collect();
    let schema = Schema::new(&events, plugin.kinds());
    sink.begin(&schema)?;
    summary.warnings.extend_from_slice(reader.warnings());

    let mut scratch = DecodeScratch::new();
    let mut chunks = reader.chunks();
    let mut failure = None;
    'chunks: for chunk in &mut chunks {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        summary.chunks += 1;
        if chunk.kind != CHUNK_DATA {
            continue;
        }
        let ctx = decode_ctx(meta, chunk.cpu);
        for rec in chunk.records() {
            let rec = match rec {
                Ok(r) => r,
                Err(e) => {
                    failure = Some(e);
                    break 'chunks;
                }
            };
            let kind = rec.header.kind;
            if kind == RecordType::LOST {
                match rec.lost() {
                    Ok(n) => {
                        let n = n.unwrap_or(0);
                        summary.lost_records += 1;
                        summary.lost += n;
                        sink.record(&schema, &Row::lost(&schema, chunk.cpu, rec.offset, n))?;
                    }
                    Err(problem) => {
                        failure = Some(CaptureError::BadRecord {
                            path: reader.path().to_owned(),
                            offset: rec.offset,
                            chunk: chunk.offset,
                            problem,
                        });
                        break 'chunks;
                    }
                }
            } else if plugin.kind_of(kind).is_some() {
                match plugin.decode(&ctx, rec.bytes, &mut scratch) {
                    Ok(d) => {
                        summary.records += 1;
                        sink.record(&schema, &Row::decoded(chunk.cpu, rec.offset, &d))?;
                    }
                    Err(e) => {
                        summary.malformed += 1;
                        summary.first_malformed.get_or_insert((rec.offset, e));
                    }
                }
            } else {
                summary.unknown += 1;
                *summary.unknown_types.entry(kind.0).or_default() += 1;
            }
        }
    }
    summary.end = chunks.end().copied();
    summary.warnings.extend_from_slice(chunks.warnings());
    sink.finish()?;
    match failure {
        Some(error) => Err(DecodeCaptureError::Corrupt {
            error,
            partial: Box::new(summary),
        }),
        None => Ok(summary),
    }
}

/// Describes an event encoding briefly, e.g. `software 0x0`.
pub fn describe_event(d: &EventDesc) -> String {
    use hrperf_abi::event::*;
    let kind = match d.kind {
        EVENT_TYPE_HARDWARE => "hardware".to_owned(),
        EVENT_TYPE_SOFTWARE => "software".to_owned(),
        EVENT_TYPE_HW_CACHE => "hw-cache".to_owned(),
        EVENT_TYPE_RAW => "raw".to_owned(),
        EVENT_TYPE_SIM => "sim".to_owned(),
        k => format!("type {k}"),
    };
    let mut s = format!("{kind} {:#x}", d.config);
    if d.config1 != 0 || d.config2 != 0 {
        s += &format!(" config1={:#x} config2={:#x}", d.config1, d.config2);
    }
    if d.flags & EVENT_FL_USER_ONLY != 0 {
        s += " user";
    }
    if d.flags & EVENT_FL_KERNEL_ONLY != 0 {
        s += " kernel";
    }
    if d.flags & EVENT_FL_PRECISE != 0 {
        s += " precise";
    }
    s
}

/// Writes what `hrperf info` shows: header and metadata, record counts per CPU, drops,
/// whether the recording finished, and any damage found by `scan`.
pub fn write_info(reader: &Reader, scan: &Scan, out: &mut dyn Write) -> io::Result<()> {
    let m = reader.meta();
    let h = reader.header();
    writeln!(
        out,
        "file:          {} ({} bytes, capture version {})",
        reader.path().display(),
        reader.file_size(),
        h.version
    )?;
    writeln!(
        out,
        "format:        {} {} ({})",
        m.format_name,
        version_string(m.format_version),
        m.format_uuid
    )?;
    writeln!(out, "source:        {}", source_name(m.source))?;
    let mut clock = clock_name(m.clock).to_owned();
    if m.tsc_hz != 0 {
        clock += &format!(" (TSC {} Hz)", m.tsc_hz);
    }
    writeln!(out, "clock:         {clock}")?;
    let mode = match m.mode {
        MODE_OVERFLOW => format!("overflow, period {}", m.sample_period),
        MODE_POLL => format!("poll, every {} ns", m.poll_interval_ns),
        other => mode_name(other).to_owned(),
    };
    writeln!(out, "mode:          {mode}")?;
    writeln!(
        out,
        "start:         {} ns (wall clock {} ns)",
        m.start_time_ns, m.start_wall_ns
    )?;
    writeln!(out, "events:")?;
    for (i, e) in m.events.iter().enumerate() {
        writeln!(out, "  {i}: {} ({})", e.name, describe_event(&e.desc))?;
    }
    let cpus: Vec<String> = m.cpus.iter().map(u32::to_string).collect();
    writeln!(out, "cpus:          {}", cpus.join(","))?;
    if !m.cpu_model.is_empty() {
        writeln!(out, "cpu model:     {}", m.cpu_model)?;
    }
    if !m.hostname.is_empty() || !m.kernel_release.is_empty() {
        writeln!(
            out,
            "host:          {} (kernel {})",
            m.hostname, m.kernel_release
        )?;
    }
    if !m.command.is_empty() {
        writeln!(out, "command:       {}", m.command.join(" "))?;
    }
    if !m.format_arg.is_empty() {
        writeln!(out, "format arg:    {} bytes", m.format_arg.len())?;
    }
    if !m.sim_config.is_empty() {
        writeln!(out, "sim config:")?;
        for line in m.sim_config.lines() {
            writeln!(out, "  {line}")?;
        }
    }
    let t = scan.totals();
    write!(
        out,
        "records:       {} in {} chunks ({} data bytes)",
        t.records, scan.chunks, scan.data_bytes
    )?;
    let mut first = true;
    for (&ty, &n) in &scan.record_types {
        let name = match RecordType(ty) {
            RecordType::LOST => "lost".to_owned(),
            RecordType::DELTA => "delta".to_owned(),
            RecordType::STACK_BASE => "stack".to_owned(),
            _ => format!("{ty:#x}"),
        };
        write!(
            out,
            "{}{name}: {n}",
            if first { "; by type: " } else { ", " }
        )?;
        first = false;
    }
    writeln!(out)?;
    if !scan.symbols.is_empty() {
        let mut parts = Vec::new();
        for (&kind, &(chunks, bytes, pids)) in &scan.symbols {
            parts.push(match kind {
                hrperf_abi::capture::SYM_KALLSYMS => format!("kallsyms ({bytes} bytes)"),
                hrperf_abi::capture::SYM_MAPS => format!("maps of {pids} processes ({chunks} snapshots)"),
                hrperf_abi::capture::SYM_COMM => format!("{chunks} command names"),
                hrperf_abi::capture::SYM_TABLE => format!("{chunks} symbol tables"),
                k => format!("{chunks} of unknown kind {k}"),
            });
        }
        writeln!(out, "symbols:       {}", parts.join(", "))?;
    }
    writeln!(
        out,
        "dropped:       {} (LOST records: {}, lost in them: {})",
        t.drops(),
        t.lost_records,
        t.lost
    )?;
    match &scan.end {
        Some(e) => writeln!(
            out,
            "finished:      at {} ns, {} records, {} drops, exit status {}",
            e.end_time_ns, e.total_records, e.total_drops, e.exit_status
        )?,
        None => writeln!(out, "finished:      no")?,
    }
    writeln!(out, "per CPU:")?;
    writeln!(
        out,
        "  {:>4} {:>7} {:>12} {:>10} {:>12} {:>10} {:>11}",
        "cpu", "chunks", "records", "drops", "overflows", "masked", "multi_wraps"
    )?;
    for c in &scan.cpus {
        writeln!(
            out,
            "  {:>4} {:>7} {:>12} {:>10} {:>12} {:>10} {:>11}",
            c.cpu,
            c.chunks,
            c.records,
            c.drops(),
            c.overflows(),
            c.masked(),
            c.multi_wraps()
        )?;
    }
    for w in &scan.warnings {
        writeln!(out, "warning: {w}")?;
    }
    if let Some(e) = &scan.error {
        writeln!(out, "error: {e}")?;
        writeln!(
            out,
            "       (everything above counts only the intact chunks before it)"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(v: &str) -> String {
        let mut out = Vec::new();
        csv_str(&mut out, v).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv("cpu-clock"), "cpu-clock");
        assert_eq!(csv(""), "");
        assert_eq!(csv("a,b"), "\"a,b\"");
        assert_eq!(csv("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv("two\nlines"), "\"two\nlines\"");
        assert_eq!(csv(" padded"), "\" padded\"");
    }

    fn field(name: &str, kind: FieldKind) -> FieldSchema {
        FieldSchema {
            name: name.into(),
            kind,
        }
    }

    #[test]
    fn columns_are_shared_by_name_across_kinds() {
        let kinds = vec![
            KindSchema {
                name: "a".into(),
                record_type: RecordType(0x2000),
                fields: vec![
                    field("time_ns", FieldKind::Time),
                    field("counters", FieldKind::Counters),
                ],
            },
            KindSchema {
                name: "b".into(),
                record_type: RecordType(0x2001),
                fields: vec![
                    field("cpu", FieldKind::U64),
                    field("time_ns", FieldKind::Time),
                    field("start", FieldKind::Counters),
                ],
            },
        ];
        let s = Schema::new(&["x".into(), "y".into()], &kinds);
        assert_eq!(
            s.columns,
            ["kind", "cpu", "time_ns", "x", "y", "start.x", "start.y", "lost"]
        );
        // Kind `a` has no cpu field: the host fills the column; kind `b` fills it itself.
        assert_eq!(s.cells[0][1], Cell::HostCpu);
        assert_eq!(s.cells[1][1], Cell::Field(0));
        assert_eq!(s.cells[1][5], Cell::Counter(2, 0));
        assert_eq!(s.cells[0][5], Cell::Empty);
        assert_eq!(s.cells[2][7], Cell::Field(0));
        assert!(s.host_cpu[0] && !s.host_cpu[1] && s.host_cpu[2]);
    }

    #[test]
    fn names() {
        assert_eq!(version_string(0x0001_0002), "1.2");
        assert_eq!(source_name(SOURCE_SIM), "sim");
        assert_eq!(clock_name(99), "unknown");
        assert_eq!(mode_name(MODE_POLL), "poll");
    }
}
