//! perf's event names and their encodings (`tools/perf/util/parse-events.c`'s generic
//! hardware and software tables; `PERF_COUNT_HW_*`/`PERF_COUNT_SW_*` in `perf_event.h`).

use hrperf_abi::event::{
    EVENT_FL_KERNEL_ONLY, EVENT_FL_PRECISE, EVENT_FL_USER_ONLY, EVENT_TYPE_HARDWARE,
    EVENT_TYPE_RAW, EVENT_TYPE_SOFTWARE,
};
use hrperf_abi::{EventDesc, MAX_COUNTERS};

use super::super::{EventSpec, SourceError};

/// One row of the name table: names (first is canonical), `PERF_TYPE_*`, config.
struct Named {
    names: &'static [&'static str],
    kind: u32,
    config: u64,
}

const fn sw(names: &'static [&'static str], config: u64) -> Named {
    Named {
        names,
        kind: EVENT_TYPE_SOFTWARE,
        config,
    }
}

const fn hw(names: &'static [&'static str], config: u64) -> Named {
    Named {
        names,
        kind: EVENT_TYPE_HARDWARE,
        config,
    }
}

/// perf's generic event names.
const TABLE: &[Named] = &[
    // PERF_COUNT_SW_*
    sw(&["cpu-clock"], 0),
    sw(&["task-clock"], 1),
    sw(&["page-faults", "faults"], 2),
    sw(&["context-switches", "cs"], 3),
    sw(&["cpu-migrations", "migrations"], 4),
    sw(&["minor-faults"], 5),
    sw(&["major-faults"], 6),
    sw(&["alignment-faults"], 7),
    sw(&["emulation-faults"], 8),
    sw(&["dummy"], 9),
    sw(&["cgroup-switches"], 11),
    // PERF_COUNT_HW_*
    hw(&["cycles", "cpu-cycles"], 0),
    hw(&["instructions"], 1),
    hw(&["cache-references"], 2),
    hw(&["cache-misses"], 3),
    hw(&["branches", "branch-instructions"], 4),
    hw(&["branch-misses"], 5),
    hw(&["bus-cycles"], 6),
    hw(&["stalled-cycles-frontend", "idle-cycles-frontend"], 7),
    hw(&["stalled-cycles-backend", "idle-cycles-backend"], 8),
    hw(&["ref-cycles"], 9),
];

/// Every event name this source knows, comma-separated, for error messages and `--help`.
pub fn known_events() -> String {
    let mut s = String::new();
    for row in TABLE {
        for name in row.names {
            if !s.is_empty() {
                s.push_str(", ");
            }
            s.push_str(name);
        }
    }
    s.push_str(", rNNNN (raw hex); modifiers :u :k :p :pp :ppp");
    s
}

/// Whether an event needs the CPU's hardware PMU (hardware, hw-cache or raw).
pub fn needs_pmu(desc: &EventDesc) -> bool {
    desc.kind != EVENT_TYPE_SOFTWARE
}

/// Parses one event name with optional `:ukp` modifiers.
pub fn parse_event(spec: &str) -> Result<EventSpec, SourceError> {
    let name = spec.trim();
    if name.is_empty() {
        return Err(SourceError::Config(
            "empty event name in the event list".into(),
        ));
    }
    let (base, modifiers) = match name.split_once(':') {
        Some((b, m)) => (b, m),
        None => (name, ""),
    };
    let unknown = || SourceError::UnknownEvent {
        name: name.to_string(),
        source_name: "perf",
        known: known_events(),
    };
    let (kind, config) = if let Some(row) = TABLE.iter().find(|r| r.names.contains(&base)) {
        (row.kind, row.config)
    } else if let Some(hex) = base.strip_prefix('r') {
        if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(unknown());
        }
        let config = u64::from_str_radix(hex, 16).map_err(|_| unknown())?;
        (EVENT_TYPE_RAW, config)
    } else {
        return Err(unknown());
    };
    let mut flags = 0;
    let (mut user, mut kernel, mut precise) = (false, false, 0u32);
    for m in modifiers.chars() {
        match m {
            'u' => user = true,
            'k' => kernel = true,
            'p' if precise < 3 => precise += 1,
            _ => {
                return Err(SourceError::Config(format!(
                    "event '{name}': unknown or repeated modifier '{m}' (known: u, k, p, pp, ppp)"
                )))
            }
        }
    }
    match (user, kernel) {
        (true, false) => flags |= EVENT_FL_USER_ONLY,
        (false, true) => flags |= EVENT_FL_KERNEL_ONLY,
        _ => {}
    }
    if precise > 0 {
        flags |= EVENT_FL_PRECISE | (precise << 8);
    }
    Ok(EventSpec {
        name: name.to_string(),
        desc: EventDesc {
            kind,
            flags,
            config,
            config1: 0,
            config2: 0,
        },
    })
}

/// Parses a comma-separated event list such as `cpu-clock,task-clock,page-faults`.
///
/// The first event is the group leader (the one that samples in overflow mode). Empty
/// names, duplicates and more than [`MAX_COUNTERS`] events are [`SourceError::Config`];
/// unknown names are [`SourceError::UnknownEvent`] with the list of known names. Whether a
/// hardware event can be counted is decided when the source opens it
/// ([`SourceError::NoPmu`]).
pub fn parse_events(list: &str) -> Result<Vec<EventSpec>, SourceError> {
    if list.trim().is_empty() {
        return Err(SourceError::Config(
            "empty event list (try -e cpu-clock)".into(),
        ));
    }
    let mut out: Vec<EventSpec> = Vec::new();
    for part in list.split(',') {
        let ev = parse_event(part)?;
        if let Some(prev) = out.iter().find(|e| e.desc == ev.desc) {
            return Err(SourceError::Config(format!(
                "event '{}' is given twice (as '{}' and '{}')",
                ev.name, prev.name, ev.name
            )));
        }
        out.push(ev);
        if out.len() > MAX_COUNTERS {
            return Err(SourceError::Config(format!(
                "too many events: at most {MAX_COUNTERS} counters per group, got {} in '{list}'",
                list.split(',').count()
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        let evs = parse_events("cpu-clock,faults,cs,cpu-cycles,branch-instructions,r1a2b").unwrap();
        let got: Vec<(u32, u64)> = evs.iter().map(|e| (e.desc.kind, e.desc.config)).collect();
        assert_eq!(got, [(1, 0), (1, 2), (1, 3), (0, 0), (0, 4), (4, 0x1a2b)]);
        assert_eq!(evs[1].name, "faults");
    }

    #[test]
    fn modifiers() {
        let e = parse_event("cycles:upp").unwrap();
        assert_eq!(
            e.desc.flags,
            EVENT_FL_USER_ONLY | EVENT_FL_PRECISE | (2 << 8)
        );
        assert_eq!(
            parse_event("task-clock:k").unwrap().desc.flags,
            EVENT_FL_KERNEL_ONLY
        );
        assert_eq!(parse_event("task-clock:uk").unwrap().desc.flags, 0);
        assert!(matches!(
            parse_event("cycles:x"),
            Err(SourceError::Config(_))
        ));
        assert!(matches!(
            parse_event("cycles:pppp"),
            Err(SourceError::Config(_))
        ));
    }

    #[test]
    fn errors() {
        assert!(matches!(parse_events(""), Err(SourceError::Config(_))));
        assert!(matches!(
            parse_events("cpu-clock,,task-clock"),
            Err(SourceError::Config(_))
        ));
        let dup = parse_events("page-faults,faults").unwrap_err().to_string();
        assert!(dup.contains("twice"), "{dup}");
        let many = parse_events(
            "cpu-clock,task-clock,page-faults,cs,migrations,minor-faults,major-faults,alignment-faults,emulation-faults",
        )
        .unwrap_err()
        .to_string();
        assert!(many.contains("at most 8"), "{many}");
        match parse_events("cpu-clock,bogus") {
            Err(SourceError::UnknownEvent { name, known, .. }) => {
                assert_eq!(name, "bogus");
                assert!(known.contains("task-clock") && known.contains("cycles"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_event("rxyz"),
            Err(SourceError::UnknownEvent { .. })
        ));
        assert!(matches!(
            parse_event("r"),
            Err(SourceError::UnknownEvent { .. })
        ));
        assert!(matches!(
            parse_event("r11112222333344445"),
            Err(SourceError::UnknownEvent { .. })
        ));
    }
}
