//! `decode_capture` into JSON lines, CSV and the table, through the real delta plugin.

mod common;

use common::*;
use hrperf::capture::{Reader, Warning, Writer};
use hrperf::decode::{
    decode_capture, make_sink, write_info, CsvSink, DecodeCaptureError, JsonSink, OutputFormat,
    Schema, TableSink,
};
use hrperf::plugin::{KindSchema, Plugin};
use serde_json::{json, Value as J};

fn delta() -> Plugin {
    Plugin::load(&delta_plugin_path()).unwrap_or_else(|e| panic!("{e}"))
}

fn reader(bytes: Vec<u8>) -> Reader {
    Reader::from_bytes("test.data", bytes).unwrap()
}

fn json_lines(
    bytes: Vec<u8>,
    plugin: &Plugin,
) -> (
    Vec<J>,
    Result<hrperf::decode::DecodeSummary, DecodeCaptureError>,
) {
    let r = reader(bytes);
    let mut out = Vec::new();
    let res = decode_capture(&r, plugin, &mut JsonSink::new(&mut out));
    let lines = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (lines, res)
}

#[test]
fn json_lines_have_stable_fields() {
    let p = delta();
    let (lines, res) = json_lines(small_capture(), &p);
    let s = res.unwrap();
    assert_eq!(
        (s.records, s.lost_records, s.lost, s.unknown, s.malformed),
        (10, 1, 5, 1, 0)
    );
    assert_eq!(s.unknown_types.get(&0x1_2345), Some(&1));
    assert!(s.warnings.is_empty() && s.end.is_some());
    assert_eq!(lines.len(), 11);
    assert_eq!(
        lines[0],
        json!({
            "kind": "delta", "cpu": 0, "time_ns": 1000, "pid": 100, "tid": 200,
            "trigger": "overflow", "ip": "0x401000", "ovfl_counter": 0, "multi_wrap": 0,
            "counters": {"cpu-clock": 1_000_000, "page-faults": 0, "sim-instructions": 3_000_000}
        })
    );
    assert_eq!(lines[1]["trigger"], "poll");
    assert_eq!(lines[1]["ip"], J::Null);
    assert_eq!(lines[1]["ovfl_counter"], J::Null);
    assert_eq!(lines[2]["trigger"], "instructed");
    // CPU 1's chunk: three samples, then the LOST record inline, then the fourth.
    assert_eq!(lines[4]["cpu"], 1);
    assert_eq!(lines[7], json!({"kind": "lost", "cpu": 1, "lost": 5}));
    assert_eq!(lines[8]["time_ns"], 4000);
    assert_eq!(lines[10]["counters"]["sim-instructions"], 3_000_035);
}

#[test]
fn json_key_order_is_stable() {
    let p = delta();
    let r = reader(small_capture());
    let mut out = Vec::new();
    decode_capture(&r, &p, &mut JsonSink::new(&mut out)).unwrap();
    let text = String::from_utf8(out).unwrap();
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        r#"{"kind":"delta","cpu":0,"time_ns":1000,"pid":100,"tid":200,"trigger":"overflow","ip":"0x401000","ovfl_counter":0,"multi_wrap":0,"counters":{"cpu-clock":1000000,"page-faults":0,"sim-instructions":3000000}}"#
    );
}

#[test]
fn csv_has_one_column_per_counter() {
    let p = delta();
    let r = reader(small_capture());
    let mut out = Vec::new();
    decode_capture(&r, &p, &mut CsvSink::new(&mut out)).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "kind,cpu,time_ns,pid,tid,trigger,ip,ovfl_counter,multi_wrap,cpu-clock,page-faults,sim-instructions,lost"
    );
    assert_eq!(lines.len(), 12);
    assert_eq!(
        lines[1],
        "delta,0,1000,100,200,overflow,0x401000,0,0,1000000,0,3000000,"
    );
    assert_eq!(lines[2], "delta,0,2000,100,200,poll,,,0,1000001,1,3000007,");
    assert_eq!(lines[8], "lost,1,,,,,,,,,,,5");
    for l in &lines {
        assert_eq!(l.split(',').count(), 13, "{l}");
    }
}

#[test]
fn odd_event_names_are_quoted_and_escaped() {
    let mut m = meta();
    m.events[1].name = "cpu/event=0x3c,umask=0/".into();
    m.events[2].name = "say \"hi\"".into();
    let mut w = Writer::new(Vec::new(), &m).unwrap();
    let (a, n) = samples(0, 0, 1);
    w.write_chunk(0, &a, n).unwrap();
    let bytes = w.finish(end_info(1, 0)).unwrap();
    let p = delta();
    let (lines, _) = json_lines(bytes.clone(), &p);
    assert_eq!(lines[0]["counters"]["cpu/event=0x3c,umask=0/"], 0);
    assert_eq!(lines[0]["counters"]["say \"hi\""], 3_000_000);
    let mut out = Vec::new();
    decode_capture(&reader(bytes), &p, &mut CsvSink::new(&mut out)).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with(
        "kind,cpu,time_ns,pid,tid,trigger,ip,ovfl_counter,multi_wrap,cpu-clock,\"cpu/event=0x3c,umask=0/\",\"say \"\"hi\"\"\",lost\n"
    ), "{text}");
}

#[test]
fn table_is_aligned() {
    let p = delta();
    let r = reader(small_capture());
    let mut out = Vec::new();
    decode_capture(&r, &p, &mut TableSink::new(&mut out)).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("kind       cpu"), "{text}");
    assert!(lines[0].ends_with("sim-instructions"), "{text}");
    assert!(lines.contains(&"-- cpu 1: 5 records lost --"), "{text}");
    // Every sample line is as wide as the header (right-aligned last column).
    for l in lines.iter().filter(|l| l.starts_with("delta")) {
        assert_eq!(l.len(), lines[0].len(), "{l}\n{}", lines[0]);
    }
    assert!(lines[1].contains("0.000001000"), "{}", lines[1]);
}

#[test]
fn corrupt_chunk_stops_after_everything_before_it() {
    let bytes = small_capture();
    let chunks = chunk_offsets(&bytes);
    // Damage the payload of the third chunk (CPU 0, samples 4, 5 and the foreign one).
    let mut b = bytes.clone();
    b[chunks[2] as usize + 40 + 9] ^= 0x55;
    let p = delta();
    let (lines, res) = json_lines(b, &p);
    match res {
        Err(DecodeCaptureError::Corrupt { error, partial }) => {
            assert_eq!(error.offset(), Some(chunks[2]));
            assert!(error.to_string().contains("CRC-32"), "{error}");
            assert_eq!((partial.records, partial.lost_records), (8, 1));
        }
        other => panic!("{other:?}"),
    }
    // 4 + 4 samples and the LOST line were written before the error.
    assert_eq!(lines.len(), 9);
}

#[test]
fn unfinished_recording_is_decoded_with_a_warning() {
    let bytes = small_capture();
    let chunks = chunk_offsets(&bytes);
    let cut = bytes[..chunks[3] as usize].to_vec(); // before STATS and END
    let p = delta();
    let (lines, res) = json_lines(cut, &p);
    let s = res.unwrap();
    assert_eq!(lines.len(), 11);
    assert_eq!(s.warnings, [Warning::NoEndChunk]);
    assert!(s.end.is_none());
}

#[test]
fn wrong_plugin_is_refused() {
    let mut m = meta();
    m.format_uuid = hrperf_abi::Uuid([7; 16]);
    m.format_name = "pebs".into();
    let bytes = Writer::new(Vec::new(), &m)
        .unwrap()
        .finish(end_info(0, 0))
        .unwrap();
    let p = delta();
    let e = decode_capture(&reader(bytes), &p, &mut JsonSink::new(Vec::new())).unwrap_err();
    assert!(matches!(e, DecodeCaptureError::WrongPlugin { .. }), "{e}");
    assert!(e.to_string().contains("pebs"), "{e}");

    let mut m = meta();
    m.format_version = 2 << 16;
    let bytes = Writer::new(Vec::new(), &m)
        .unwrap()
        .finish(end_info(0, 0))
        .unwrap();
    let e = decode_capture(&reader(bytes), &p, &mut JsonSink::new(Vec::new())).unwrap_err();
    assert!(matches!(e, DecodeCaptureError::FormatTooNew { .. }), "{e}");
    assert!(e.to_string().contains("2.0"), "{e}");

    let mut m = meta();
    m.format_version = (1 << 16) | 3;
    let bytes = Writer::new(Vec::new(), &m)
        .unwrap()
        .finish(end_info(0, 0))
        .unwrap();
    let s = decode_capture(&reader(bytes), &p, &mut JsonSink::new(Vec::new())).unwrap();
    assert_eq!(s.notes.len(), 1);
}

#[test]
fn malformed_records_are_skipped_and_counted() {
    // A delta-typed record the plugin cannot decode (nr = 0) inside an intact chunk.
    let mut bad = delta_bytes(&sample(0, 0));
    bad[20] = 0;
    let mut payload = delta_bytes(&sample(0, 1));
    payload.extend(&bad);
    let mut w = Writer::new(Vec::new(), &meta()).unwrap();
    w.write_chunk(0, &payload, 2).unwrap();
    let bytes = w.finish(end_info(2, 0)).unwrap();
    let p = delta();
    let (lines, res) = json_lines(bytes, &p);
    let s = res.unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(s.malformed, 1);
    let (off, e) = s.first_malformed.unwrap();
    assert_eq!(e, hrperf::plugin::DecodeError::Malformed);
    assert!(off > 0);
    assert!(s.to_string().contains("1 malformed"), "{s}");
}

#[test]
fn schema_names_repeated_events_uniquely() {
    let p = delta();
    let kinds: Vec<KindSchema> = p.kinds().to_vec();
    let s = Schema::new(&["cycles".into(), "cycles".into(), "pid".into()], &kinds);
    assert_eq!(s.events, ["cycles", "cycles#2", "pid"]);
    // An event named like a field gets the field's prefix in CSV.
    assert!(
        s.columns.contains(&"counters.pid".to_owned()),
        "{:?}",
        s.columns
    );
    assert_eq!(s.kinds.last().unwrap().name, "lost");
}

#[test]
fn make_sink_and_info() {
    let p = delta();
    let r = reader(small_capture());
    for f in [OutputFormat::Json, OutputFormat::Csv, OutputFormat::Table] {
        let mut out = Vec::new();
        {
            let mut sink = make_sink(f, &mut out);
            decode_capture(&r, &p, sink.as_mut()).unwrap();
        }
        assert!(!out.is_empty());
    }
    let mut info = Vec::new();
    write_info(&r, &r.scan(), &mut info).unwrap();
    let info = String::from_utf8(info).unwrap();
    for want in [
        "format:        delta 1.0",
        "source:        sim",
        "cpu-clock (software 0x0)",
        "sim-instructions (sim 0x1)",
        "command:       ./app --iterations 3",
        "dropped:       6",
        "finished:      at 99000 ns",
    ] {
        assert!(info.contains(want), "missing {want:?} in\n{info}");
    }
}
