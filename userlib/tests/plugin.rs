//! The plugin host against the real delta plugin (`libhrperf_decode_delta.so`) and
//! against deliberately broken plugins compiled from C at test time.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use hrperf::decode::decode_ctx;
use hrperf::plugin::{
    DecodeError, DecodeScratch, FieldKind, Plugin, PluginHost, PluginLoadError, Value,
};
use hrperf_abi::plugin::PLUGIN_ABI_VERSION;
use hrperf_abi::RecordType;

fn delta() -> Plugin {
    let path = delta_plugin_path();
    Plugin::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn loads_the_delta_plugin() {
    let p = delta();
    assert_eq!(p.name(), "delta");
    assert_eq!(p.uuid(), hrperf_fmt_delta::DELTA_UUID);
    assert_eq!(p.format_version(), 1 << 16);
    assert!(!p.description().is_empty());
    assert_eq!(p.kinds().len(), 1);
    let k = &p.kinds()[0];
    assert_eq!(
        (k.name.as_str(), k.record_type),
        ("delta", RecordType::DELTA)
    );
    let fields: Vec<(&str, FieldKind)> =
        k.fields.iter().map(|f| (f.name.as_str(), f.kind)).collect();
    assert_eq!(
        fields,
        [
            ("cpu", FieldKind::U64),
            ("time_ns", FieldKind::Time),
            ("pid", FieldKind::U64),
            ("tid", FieldKind::U64),
            ("trigger", FieldKind::Str),
            ("ip", FieldKind::Hex),
            ("ovfl_counter", FieldKind::U64),
            ("multi_wrap", FieldKind::U64),
            ("counters", FieldKind::Counters),
        ]
    );
    assert!(p.kind_of(RecordType::DELTA).is_some());
    assert!(p.kind_of(RecordType::LOST).is_none());
}

#[test]
fn decodes_through_the_shared_object() {
    let p = delta();
    let ctx = decode_ctx(&meta(), 1);
    let mut scratch = DecodeScratch::new();
    // Overflow sample.
    let rec = delta_bytes(&sample(1, 6));
    let d = p.decode(&ctx, &rec, &mut scratch).unwrap();
    assert_eq!(d.kind().name, "delta");
    let v: Vec<Value> = d.fields().map(|(_, v)| v).collect();
    assert_eq!(v[0], Value::U64(1));
    assert_eq!(v[1], Value::Time(7_000));
    assert_eq!(v[2], Value::U64(101));
    assert_eq!(v[3], Value::U64(201));
    assert_eq!(v[4], Value::Str("overflow"));
    assert_eq!(v[5], Value::Hex(0x40_1006));
    assert_eq!(v[6], Value::U64(0));
    assert_eq!(v[7], Value::U64(1));
    match v[8] {
        Value::Counters(c) => assert_eq!(c.iter().collect::<Vec<_>>(), [1_000_006, 1, 3_000_042]),
        other => panic!("{other:?}"),
    }
    // Poll sample: no IP, no overflowed counter.
    let rec = delta_bytes(&sample(1, 4));
    let d = p.decode(&ctx, &rec, &mut scratch).unwrap();
    assert_eq!(d.value(4), Value::Str("poll"));
    assert_eq!(d.value(5), Value::Absent);
    assert_eq!(d.value(6), Value::Absent);
    assert_eq!(d.value(99), Value::Absent);
    // Instructed.
    let rec = delta_bytes(&sample(1, 5));
    assert_eq!(
        p.decode(&ctx, &rec, &mut scratch).unwrap().value(4),
        Value::Str("instructed")
    );
}

#[test]
fn garbage_gives_errors_through_the_shared_object() {
    let p = delta();
    let ctx = decode_ctx(&meta(), 0);
    let mut scratch = DecodeScratch::new();
    let rec = delta_bytes(&sample(0, 0));
    for n in 0..rec.len() {
        assert_eq!(
            p.decode(&ctx, &rec[..n], &mut scratch).unwrap_err(),
            DecodeError::Truncated,
            "length {n}"
        );
    }
    assert_eq!(
        p.decode(&ctx, &lost_bytes(1), &mut scratch).unwrap_err(),
        DecodeError::Unknown
    );
    let mut bad = rec.clone();
    bad[20] = 200;
    assert_eq!(
        p.decode(&ctx, &bad, &mut scratch).unwrap_err(),
        DecodeError::Malformed
    );
    // Noise: any result but a panic or a bad value.
    let mut x = 0x1234_5678_9abc_def0u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = rec.clone();
        let at = (x % b.len() as u64) as usize;
        b[at] = (x >> 32) as u8;
        let len = ((x >> 40) as usize) % (b.len() + 1);
        let _ = p.decode(&ctx, &b[..len], &mut scratch);
    }
}

#[test]
fn discovery_and_lookup() {
    let so = delta_plugin_path();
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(&so, dir.path().join("libhrperf_decode_delta.so")).unwrap();
    std::fs::copy(&so, other.path().join("libhrperf_decode_delta.so")).unwrap();
    std::fs::write(dir.path().join("README"), "not a plugin").unwrap();
    let missing = dir.path().join("does-not-exist");
    let (plugins, errors) =
        PluginHost::discover_in(&[missing, dir.path().to_owned(), other.path().to_owned()]);
    assert_eq!(plugins.len(), 1);
    assert_eq!(
        plugins[0].path(),
        dir.path().join("libhrperf_decode_delta.so")
    );
    // The second copy is reported as shadowed, not loaded.
    assert!(
        matches!(&errors[..], [PluginLoadError::Duplicate { .. }]),
        "{errors:?}"
    );
    assert!(PluginHost::find(&plugins, "delta").is_some());
    let uuid = hrperf_fmt_delta::DELTA_UUID.to_string();
    assert!(PluginHost::find(&plugins, &uuid).is_some());
    assert!(PluginHost::find(&plugins, &uuid.to_uppercase().replace('-', "")).is_some());
    assert!(PluginHost::find(&plugins, "pebs").is_none());
    assert!(PluginHost::find_uuid(&plugins, hrperf_fmt_delta::DELTA_UUID).is_some());
}

#[test]
fn search_dirs_follow_the_documented_order() {
    let dirs = PluginHost::search_dirs();
    let exe_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    assert_eq!(dirs[0], exe_dir);
    assert!(dirs.contains(&exe_dir.join("../lib/hrperf/plugins")));
    assert_eq!(
        dirs.last().unwrap(),
        Path::new(hrperf::plugin::SYSTEM_PLUGIN_DIR)
    );
}

/// Compiles `src` into `dir/name` as a shared object.
fn compile(dir: &Path, name: &str, src: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let so = dir.join(name);
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .expect("running cc (a C compiler is needed for the broken-plugin tests)");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

/// A C plugin whose declaration's fields are given as C initialisers.
fn c_plugin(abi: u32, size: &str, name: &str, field_kind: u32, decode: &str) -> String {
    format!(
        r#"
#include <stdint.h>
#include <stddef.h>
struct field_desc {{ const char *name; uint32_t kind; uint32_t flags; }};
struct kind_desc {{ uint32_t record_type; uint32_t nr_fields; const char *name; const struct field_desc *fields; }};
struct decl {{
    uint32_t abi_version; uint32_t size; const char *name; const char *description;
    uint8_t uuid[16]; uint32_t format_version; uint32_t nr_kinds;
    const struct kind_desc *kinds; void *decode;
}};
static int32_t my_decode(const void *ctx, const uint8_t *rec, size_t len, void *out, uint32_t cap) {{
    (void)ctx; (void)rec; (void)len; (void)out; (void)cap; return -3;
}}
static const struct field_desc fields[1] = {{ {{ "value", {field_kind}, 0 }} }};
static const struct kind_desc kinds[1] = {{ {{ 0x10000, 1, "thing", fields }} }};
static const struct decl d = {{
    {abi}, {size}, {name}, "a test plugin", {{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}},
    0x10000, 1, kinds, {decode}
}};
const struct decl *hrperf_decoder_plugin(void) {{ return &d; }}
"#
    )
}

#[test]
fn wrong_abi_version_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let so = compile(
        dir.path(),
        "libhrperf_decode_future.so",
        &c_plugin(
            99,
            "sizeof(struct decl)",
            "\"future\"",
            1,
            "(void *)my_decode",
        ),
    );
    let e = Plugin::load(&so).unwrap_err();
    assert!(
        matches!(
            e,
            PluginLoadError::AbiVersion {
                found: 99,
                supported: PLUGIN_ABI_VERSION,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains(&so.display().to_string()), "{msg}");
    assert!(
        msg.contains("version 99") && msg.contains(&format!("version {PLUGIN_ABI_VERSION}")),
        "{msg}"
    );
    // Discovery reports it and loads nothing from it.
    let (plugins, errors) = PluginHost::discover_in(&[dir.path().to_owned()]);
    assert!(plugins.is_empty());
    assert!(
        matches!(&errors[..], [PluginLoadError::AbiVersion { .. }]),
        "{errors:?}"
    );
}

#[test]
fn broken_declarations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    type Check = fn(&PluginLoadError) -> bool;
    let cases: [(&str, String, Check); 5] = [
        (
            "small",
            c_plugin(1, "8", "\"small\"", 1, "(void *)my_decode"),
            |e| matches!(e, PluginLoadError::DeclSize { found: 8, .. }),
        ),
        (
            "nullname",
            c_plugin(1, "sizeof(struct decl)", "NULL", 1, "(void *)my_decode"),
            |e| matches!(e, PluginLoadError::Invalid { problem, .. } if problem.contains("name")),
        ),
        (
            "badkind",
            c_plugin(
                1,
                "sizeof(struct decl)",
                "\"badkind\"",
                42,
                "(void *)my_decode",
            ),
            |e| matches!(e, PluginLoadError::Invalid { problem, .. } if problem.contains("kind 42")),
        ),
        (
            "nodecode",
            c_plugin(1, "sizeof(struct decl)", "\"nodecode\"", 1, "NULL"),
            |e| matches!(e, PluginLoadError::Invalid { problem, .. } if problem.contains("decode")),
        ),
        (
            "noentry",
            "int not_a_plugin(void) { return 0; }".to_owned(),
            |e| matches!(e, PluginLoadError::NoEntry { .. }),
        ),
    ];
    for (name, src, want) in cases {
        let so = compile(dir.path(), &format!("libhrperf_decode_{name}.so"), &src);
        let e = Plugin::load(&so).unwrap_err();
        assert!(want(&e), "{name}: {e}");
    }
    // A valid C plugin loads, and its decode's error code comes back typed.
    let so = compile(
        dir.path(),
        "libhrperf_decode_ok.so",
        &c_plugin(1, "sizeof(struct decl)", "\"ok\"", 1, "(void *)my_decode"),
    );
    let p = Plugin::load(&so).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.kinds()[0].record_type, RecordType(0x10000));
    let ctx = decode_ctx(&meta(), 0);
    assert_eq!(
        p.decode(&ctx, &[0u8; 8], &mut DecodeScratch::new())
            .unwrap_err(),
        DecodeError::Malformed
    );
    // And a file that is no shared object at all.
    let junk = dir.path().join("libhrperf_decode_junk.so");
    std::fs::write(&junk, b"not an ELF file").unwrap();
    assert!(matches!(
        Plugin::load(&junk).unwrap_err(),
        PluginLoadError::Load { .. }
    ));
}

#[test]
fn static_declaration_matches_the_shared_object() {
    // SAFETY: DECL is the delta plugin's own static declaration, linked in.
    let builtin = unsafe { Plugin::from_static(&hrperf_decode_delta::DECL, "<built-in>") }.unwrap();
    let loaded = delta();
    assert_eq!(builtin.kinds(), loaded.kinds());
    assert_eq!(builtin.uuid(), loaded.uuid());
}

/// A C plugin that misbehaves in `decode` in the way the record's first byte selects:
/// the host must turn each into a `DecodeError`, never hand out a bad value.
#[test]
fn misbehaving_decode_values_are_caught() {
    let src = r#"
#include <stdint.h>
#include <stddef.h>
struct field_desc { const char *name; uint32_t kind; uint32_t flags; };
struct kind_desc { uint32_t record_type; uint32_t nr_fields; const char *name; const struct field_desc *fields; };
struct field_value { uint32_t kind; uint32_t flags; uint64_t value; const uint8_t *ptr; uint64_t len; };
struct decl {
    uint32_t abi_version; uint32_t size; const char *name; const char *description;
    uint8_t uuid[16]; uint32_t format_version; uint32_t nr_kinds;
    const struct kind_desc *kinds; void *decode;
};
static const uint8_t bad_utf8[2] = { 0xff, 0xfe };
static int32_t my_decode(const void *ctx, const uint8_t *rec, size_t len, struct field_value *out, uint32_t cap) {
    (void)ctx;
    if (len < 1 || cap < 2) return -4;
    out[0].kind = 4; out[0].flags = 0; out[0].ptr = (const uint8_t *)"hi"; out[0].len = 2;
    out[1].kind = 5; out[1].flags = 0; out[1].ptr = rec; out[1].len = len / 8;
    switch (rec[0]) {
    case 0: return 0;
    case 1: out[0].kind = 1; return 0;
    case 2: out[0].ptr = NULL; out[0].len = 5; return 0;
    case 3: out[0].ptr = bad_utf8; out[0].len = 2; return 0;
    case 4: return 7;
    case 5: return -99;
    case 6: out[1].len = 1000; return 0;
    case 7: out[0].flags = 1; out[0].ptr = NULL; out[0].len = 99; return 0;
    }
    return -3;
}
static const struct field_desc fields[2] = { { "text", 4, 0 }, { "counters", 5, 0 } };
static const struct kind_desc kinds[1] = { { 0x10000, 2, "thing", fields } };
static const struct decl d = {
    1, sizeof(struct decl), "misbehave", "", {9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9},
    0x10000, 1, kinds, (void *)my_decode
};
const struct decl *hrperf_decoder_plugin(void) { return &d; }
"#;
    let dir = tempfile::tempdir().unwrap();
    let so = compile(dir.path(), "libhrperf_decode_misbehave.so", src);
    let p = Plugin::load(&so).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.description(), "", "an empty description is allowed");
    let ctx = decode_ctx(&meta(), 0);
    let mut scratch = DecodeScratch::new();
    let mut rec = [0u8; 16];
    let d = p.decode(&ctx, &rec, &mut scratch).unwrap();
    assert_eq!(d.value(0), Value::Str("hi"));
    assert!(matches!(d.value(1), Value::Counters(c) if c.len() == 2));
    for (mode, want) in [
        (
            1u8,
            DecodeError::Value {
                field: 0,
                problem: "its kind differs from the schema",
            },
        ),
        (
            2,
            DecodeError::Value {
                field: 0,
                problem: "it has a length but a null pointer",
            },
        ),
        (
            3,
            DecodeError::Value {
                field: 0,
                problem: "its string is not UTF-8",
            },
        ),
        (
            4,
            DecodeError::KindIndex {
                index: 7,
                nr_kinds: 1,
            },
        ),
        (5, DecodeError::Code(-99)),
        (
            6,
            DecodeError::Value {
                field: 1,
                problem: "its length is out of range",
            },
        ),
    ] {
        rec[0] = mode;
        assert_eq!(
            p.decode(&ctx, &rec, &mut scratch).unwrap_err(),
            want,
            "mode {mode}"
        );
    }
    // An absent value's pointer is never looked at.
    rec[0] = 7;
    assert_eq!(
        p.decode(&ctx, &rec, &mut scratch).unwrap().value(0),
        Value::Absent
    );
}
