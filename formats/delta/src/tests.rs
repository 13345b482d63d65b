//! End-to-end tests: registry → session → dispatch → ring → parsed records.

extern crate std;
use std::vec;
use std::vec::Vec;

use hrperf_abi::errno::{E2BIG, EINVAL};
use hrperf_abi::format::{
    CTRL_NOTIFY, CTRL_RESET, MODE_INSTRUCTED, MODE_OVERFLOW, MODE_POLL, SAMPLE_INSTRUCTED,
    SAMPLE_OVERFLOW, SAMPLE_POLL,
};
use hrperf_abi::record::{
    LostRecord, MISC_INSTRUCTED, MISC_KERNEL, MISC_MULTI_WRAP, MISC_OVERFLOW, MISC_POLL,
};
use hrperf_abi::{RecordType, Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{
    Buffer, CounterConfig, CpuSession, EngineError, Registry, RingReader, Sample, Selector, Session,
};

use super::record::{self, DeltaSample, NO_OVERFLOW_COUNTER};
use super::*;

fn params(mode: u32, nr: u32, hint: u64) -> SessionParams {
    SessionParams {
        size: core::mem::size_of::<SessionParams>() as u32,
        mode,
        nr_counters: nr,
        cpu: u32::MAX,
        sample_period: 10_000,
        poll_interval_ns: 1_000_000,
        data_size_hint: hint,
        flags: 0,
        reserved: 0,
    }
}

/// A registered delta session on one CPU with its buffer memory.
struct Rig {
    words: Vec<u64>,
    cpu: CpuSession,
}

impl Rig {
    fn new(mode: u32, cfg: &[CounterConfig], hint: u64, arg: &[u8], start_raw: &[u64]) -> Rig {
        let mut reg: Registry<4> = Registry::new();
        reg.register_static(&DELTA_OPS).unwrap();
        let fmt = reg.acquire(Selector::Uuid(DELTA_UUID)).unwrap();
        let s = Session::new(fmt, &params(mode, cfg.len() as u32, hint), arg, cfg).unwrap();
        let mut words = vec![0u64; s.buffer_size() as usize / 8];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(2, &mut buf, arg).unwrap();
        let mut raw = [0u64; MAX_COUNTERS];
        raw[..start_raw.len()].copy_from_slice(start_raw);
        cpu.start(&mut buf, &raw, 0).unwrap();
        Rig { words, cpu }
    }

    fn buf(&mut self) -> Buffer<'_> {
        Buffer::from_words(&mut self.words).unwrap()
    }

    fn dispatch(&mut self, s: &Sample) -> u32 {
        let mut buf = Buffer::from_words(&mut self.words).unwrap();
        self.cpu.dispatch(&mut buf, s, &Services::NONE)
    }

    /// Drains the ring: delta records, and the LOST counts in order as `Err(n)`.
    fn drain(&mut self) -> Vec<Result<DeltaSample, u64>> {
        let buf = self.buf();
        let mut out = Vec::new();
        RingReader::new(&buf)
            .unwrap()
            .drain(|rec| {
                let h = record::header(rec).unwrap();
                if h.kind == RecordType::LOST {
                    assert_eq!(rec.len(), core::mem::size_of::<LostRecord>());
                    out.push(Err(u64::from_ne_bytes(rec[8..16].try_into().unwrap())));
                } else {
                    out.push(Ok(record::parse(rec).unwrap()));
                }
            })
            .unwrap();
        out
    }
}

fn poll(t: u64, raw: &[u64]) -> Sample {
    let mut s = Sample {
        cpu: 2,
        kind: SAMPLE_POLL,
        pid: 100,
        tid: 101,
        time_ns: t,
        ovfl_counter: u32::MAX,
        nr: raw.len() as u32,
        ..Sample::default()
    };
    s.raw[..raw.len()].copy_from_slice(raw);
    s
}

const W40: CounterConfig = CounterConfig {
    width: 40,
    max_rate_per_sec: 0,
};

#[test]
fn deltas_exact_across_40_bit_wraps() {
    let top = 1u64 << 40;
    let cfg = [
        W40,
        W40,
        CounterConfig {
            width: 48,
            max_rate_per_sec: 0,
        },
    ];
    let mut rig = Rig::new(MODE_POLL, &cfg, 0, &[], &[top - 100, 5, 0]);
    // Counter 0 wraps between the first two readings, counter 1 steps, counter 2 jumps.
    let readings: [[u64; 3]; 4] = [
        [top - 40, 5, 1 << 44],
        [20, 1_005, 1 << 45],
        [20, 1_006, 0],
        [top - 1, 1_007, 1],
    ];
    for (i, r) in readings.iter().enumerate() {
        assert_eq!(rig.dispatch(&poll(1_000 * (i as u64 + 1), r)), 0);
    }
    let recs: Vec<_> = rig.drain().into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 4);
    let want: [[u64; 3]; 4] = [
        [60, 0, 1 << 44],
        [60, 1_000, 1 << 44],
        [0, 1, (1 << 48) - (1 << 45)],
        [top - 21, 1, 1],
    ];
    for (i, (r, w)) in recs.iter().zip(want).enumerate() {
        assert_eq!(&r.deltas[..3], &w, "record {i}");
        assert_eq!(r.deltas[3..], [0; 5]);
        assert_eq!((r.cpu, r.pid, r.tid, r.nr), (2, 100, 101, 3));
        assert_eq!(
            (r.misc, r.ovfl_counter, r.multi_wrap, r.ip),
            (MISC_POLL, NO_OVERFLOW_COUNTER, 0, 0)
        );
        assert_eq!(r.time_ns, 1_000 * (i as u64 + 1));
    }
    let h = rig.buf().header();
    assert_eq!(
        (h.records, h.drops, h.overflows, h.format_uuid),
        (4, 0, 4, DELTA_UUID)
    );
}

#[test]
fn overflow_samples_and_misc_bits() {
    let mut rig = Rig::new(MODE_OVERFLOW, &[W40, W40], 0, &[], &[0, 0]);
    let mut s = poll(10, &[10_000, 7]);
    s.kind = SAMPLE_OVERFLOW;
    s.ovfl_counter = 0;
    s.ip = 0xffff_ffff_8123_4567;
    s.kernel_ip = true;
    assert_eq!(rig.dispatch(&s), CTRL_RESET);
    s.ip = 0x0000_5555_0000_1000;
    s.kernel_ip = false;
    s.ovfl_counter = 1;
    s.raw = [20_000, 9, 0, 0, 0, 0, 0, 0];
    assert_eq!(rig.dispatch(&s), CTRL_RESET);
    // Instructed readings in an overflow session still go through.
    let mut i = poll(30, &[20_005, 10]);
    i.kind = SAMPLE_INSTRUCTED;
    i.ip = 0xffff_ffff_8000_0000;
    assert_eq!(rig.dispatch(&i), 0);
    let recs: Vec<_> = rig.drain().into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        (recs[0].misc, recs[0].ovfl_counter, recs[0].ip),
        (MISC_OVERFLOW | MISC_KERNEL, 0, 0xffff_ffff_8123_4567)
    );
    assert_eq!(&recs[0].deltas[..2], &[10_000, 7]);
    assert_eq!(
        (recs[1].misc, recs[1].ovfl_counter, recs[1].ip),
        (MISC_OVERFLOW, 1, 0x0000_5555_0000_1000)
    );
    assert_eq!(&recs[1].deltas[..2], &[10_000, 2]);
    // No IP and no overflow counter outside overflow samples.
    assert_eq!(
        (recs[2].misc, recs[2].ovfl_counter, recs[2].ip),
        (MISC_INSTRUCTED, NO_OVERFLOW_COUNTER, 0)
    );
    assert_eq!(&recs[2].deltas[..2], &[5, 1]);
}

#[test]
fn instructed_session() {
    let mut rig = Rig::new(MODE_INSTRUCTED, &[W40], 0, &[], &[50]);
    let mut s = poll(5, &[80]);
    s.kind = SAMPLE_INSTRUCTED;
    assert_eq!(rig.dispatch(&s), 0);
    let r = rig.drain()[0].unwrap();
    assert_eq!((r.misc, r.deltas[0]), (MISC_INSTRUCTED, 30));
}

/// A 4 KiB ring (the minimum) with 8 counters, never drained while 1000 samples arrive:
/// drops are exact, a LOST record marks the gap, and no event is lost from the sums.
#[test]
fn tiny_ring_drops_exact_and_sums_preserved() {
    let cfg = [W40; 8];
    let mut rig = Rig::new(MODE_POLL, &cfg, 1, &[], &[0; 8]);
    assert_eq!(rig.buf().header().data_size, MIN_DATA_SIZE);
    let rec = record::record_size(8) as u64; // 104
    let mask = (1u64 << 40) - 1;
    let mut truth = [0u64; 8];
    let mut notified_at = None;
    let n = 1_000u64;
    for t in 1..=n {
        let mut raw = [0u64; 8];
        for (i, (tr, r)) in truth.iter_mut().zip(raw.iter_mut()).enumerate() {
            *tr += 1_000_003 * (i as u64 + 1) + t; // uneven steps
            *r = *tr & mask;
        }
        let ctrl = rig.dispatch(&poll(t, &raw));
        if ctrl & CTRL_NOTIFY != 0 && notified_at.is_none() {
            notified_at = Some(t);
        }
    }
    // 4096 / 104 = 39 records fit (4056 bytes, the 40th would need 4160).
    let fit = MIN_DATA_SIZE / rec;
    let h = rig.buf().header();
    assert_eq!(h.records, fit);
    assert_eq!(h.drops, n - fit, "every drop counted");
    assert_eq!(h.overflows, n);
    // NOTIFY once more than half (2048 bytes) is used: after record 20 (2080 bytes).
    assert_eq!(notified_at, Some(2048 / rec + 1));
    assert_eq!(h.notify_seq, n - 2048 / rec);

    let first = rig.drain();
    assert_eq!(first.len() as u64, fit);
    // One more sample after draining: LOST(961) then a record holding all the events
    // since record 39.
    let mut raw = [0u64; 8];
    for (i, (tr, r)) in truth.iter_mut().zip(raw.iter_mut()).enumerate() {
        *tr += 5 + i as u64;
        *r = *tr & mask;
    }
    rig.dispatch(&poll(n + 1, &raw));
    let second = rig.drain();
    assert_eq!(second.len(), 2);
    assert_eq!(second[0], Err(n - fit));
    let mut sums = [0u64; 8];
    for r in first.iter().chain(&second).filter_map(|r| r.ok()) {
        for (s, d) in sums.iter_mut().zip(r.deltas) {
            *s += d;
        }
    }
    assert_eq!(sums, truth, "sum of written deltas == true totals");
}

#[test]
fn multi_wrap_flag_survives_a_drop() {
    // 32-bit counters at <= 4e9/s: a 2 s gap may hide a wrap.
    let cfg = [CounterConfig {
        width: 32,
        max_rate_per_sec: 4_000_000_000,
    }];
    let mut rig = Rig::new(MODE_POLL, &cfg, 4096, &[], &[0]);
    let rec = record::record_size(1) as u64;
    let fit = MIN_DATA_SIZE / rec;
    for t in 1..=fit {
        rig.dispatch(&poll(t, &[t]));
    }
    // Full: this flagged sample is dropped...
    rig.dispatch(&poll(2_000_000_000 + fit, &[fit + 1]));
    assert_eq!(rig.buf().header().multi_wraps, 1);
    rig.drain();
    // ...and its flag lands on the next written record, with the merged delta.
    rig.dispatch(&poll(2_000_000_001 + fit, &[fit + 2]));
    rig.dispatch(&poll(2_000_000_002 + fit, &[fit + 3]));
    let recs = rig.drain();
    assert_eq!(recs[0], Err(1));
    let r = recs[1].unwrap();
    assert_eq!(
        (r.misc, r.multi_wrap, r.deltas[0]),
        (MISC_POLL | MISC_MULTI_WRAP, 1, 2)
    );
    let r = recs[2].unwrap();
    assert_eq!((r.misc, r.multi_wrap, r.deltas[0]), (MISC_POLL, 0, 1));
}

#[test]
fn stop_marks_trailing_drops() {
    let mut rig = Rig::new(MODE_POLL, &[W40], 4096, &[], &[0]);
    let fit = MIN_DATA_SIZE / record::record_size(1) as u64;
    for t in 1..=fit + 3 {
        rig.dispatch(&poll(t, &[t]));
    }
    rig.drain();
    rig.cpu
        .stop(&mut Buffer::from_words(&mut rig.words).unwrap())
        .unwrap();
    assert_eq!(rig.drain(), [Err(3)]);
}

fn validate(p: &SessionParams, arg: &[u8]) -> i32 {
    let f = DELTA_OPS.validate.unwrap();
    // SAFETY: valid pointers for the call.
    unsafe { f(p, arg.as_ptr(), arg.len()) }
}

fn getsize(p: &SessionParams, arg: &[u8]) -> Result<u64, i32> {
    let f = DELTA_OPS.getsize.unwrap();
    let mut size = 0;
    // SAFETY: valid pointers for the call.
    match unsafe { f(p, arg.as_ptr(), arg.len(), &mut size) } {
        0 => Ok(size),
        e => Err(e),
    }
}

fn arg(size: u32, flags: u32, data_size: u64) -> [u8; 16] {
    DeltaArg {
        size,
        flags,
        data_size,
    }
    .to_bytes()
}

#[test]
fn validate_and_arg_rules() {
    let p = params(MODE_POLL, 3, 0);
    assert_eq!(validate(&p, &[]), 0);
    assert_eq!(validate(&p, &arg(16, 0, 0)), 0);
    assert_eq!(validate(&p, &arg(16, 0, 1 << 20)), 0);
    // Too short to hold the sized struct; size field disagreeing with the length.
    assert_eq!(validate(&p, &arg(8, 0, 0)[..8]), -EINVAL);
    assert_eq!(validate(&p, &arg(24, 0, 0)), -EINVAL);
    // Longer (newer) argument: zero tail is fine, a non-zero tail is E2BIG.
    let mut long = [0u8; 24];
    long[..16].copy_from_slice(&arg(24, 0, 0));
    assert_eq!(validate(&p, &long), 0);
    long[20] = 1;
    assert_eq!(validate(&p, &long), -E2BIG);
    // Unknown flags; a ring above 1 GiB.
    assert_eq!(validate(&p, &arg(16, 1, 0)), -EINVAL);
    assert_eq!(validate(&p, &arg(16, 0, MAX_DATA_SIZE + 1)), -EINVAL);
    assert_eq!(validate(&p, &arg(16, 0, MAX_DATA_SIZE)), 0);
    // Session parameters.
    assert_eq!(validate(&params(MODE_POLL, 0, 0), &[]), -EINVAL);
    assert_eq!(validate(&params(MODE_POLL, 9, 0), &[]), -EINVAL);
    assert_eq!(validate(&params(9, 1, 0), &[]), -EINVAL);
    let mut short = p;
    short.size = 8;
    assert_eq!(validate(&short, &[]), -EINVAL);
    let f = DELTA_OPS.validate.unwrap();
    // SAFETY: null params are refused, not dereferenced.
    assert!(unsafe { f(core::ptr::null(), [].as_ptr(), 0) } < 0);
    // A non-zero length with a null argument pointer is refused.
    // SAFETY: as above.
    assert!(unsafe { f(&p, core::ptr::null(), 16) } < 0);

    // Through the engine: its own tail check says E2BIG before the format is asked.
    let mut reg: Registry<1> = Registry::new();
    reg.register_static(&DELTA_OPS).unwrap();
    let fmt = reg.acquire(Selector::Name(b"delta")).unwrap();
    let e = Session::new(fmt, &p, &long, &[W40; 3]).unwrap_err();
    assert_eq!(
        e,
        EngineError::TooBig {
            what: "format argument"
        }
    );
    let e = Session::new(fmt, &p, &arg(16, 1, 0), &[W40; 3]).unwrap_err();
    assert_eq!(
        e,
        EngineError::Format {
            call: "validate",
            errno: EINVAL
        }
    );
}

#[test]
fn getsize_rounds_the_ring() {
    let p = |hint| params(MODE_POLL, 2, hint);
    // Header 128 + ring control 64 + private 72 → data at 320.
    assert_eq!(getsize(&p(0), &[]), Ok(320 + DEFAULT_DATA_SIZE));
    assert_eq!(getsize(&p(5_000), &[]), Ok(320 + 8192));
    assert_eq!(getsize(&p(1), &[]), Ok(320 + MIN_DATA_SIZE));
    assert_eq!(getsize(&p(1 << 20), &[]), Ok(320 + (1 << 20)));
    // The argument wins over the hint.
    assert_eq!(
        getsize(&p(1 << 20), &arg(16, 0, 70_000)),
        Ok(320 + (128 << 10))
    );
    assert_eq!(getsize(&p(0), &arg(16, 0, 0)), Ok(320 + DEFAULT_DATA_SIZE));
    assert_eq!(getsize(&p(MAX_DATA_SIZE + 1), &[]), Err(-EINVAL));
    let l = layout(&p(0), &DeltaArg::default()).unwrap();
    assert_eq!(
        (l.private_offset, l.data_offset, l.data_size),
        (192, 320, DEFAULT_DATA_SIZE)
    );
}

#[test]
fn ops_table_registers_and_lists() {
    let mut reg: Registry<2> = Registry::new();
    reg.register_static(&DELTA_OPS).unwrap();
    let info = reg.iter().next().unwrap();
    assert_eq!(hrperf_abi::name_bytes(&info.name), b"delta");
    assert_eq!(
        (info.uuid, info.version, info.arg_size, info.flags),
        (DELTA_UUID, 0x0001_0000, 16, FMT_FL_RING)
    );
    // No restart/exit callbacks: the engine treats them as "nothing to do".
    assert!(DELTA_OPS.restart.is_none() && DELTA_OPS.exit.is_none());
}

#[test]
fn record_write_matches_parse() {
    let s = DeltaSample {
        misc: MISC_OVERFLOW,
        cpu: 1,
        pid: 2,
        tid: 3,
        ovfl_counter: 0,
        multi_wrap: 0b101,
        time_ns: 4,
        ip: 5,
        nr: 3,
        deltas: [6, 7, 8, 0, 0, 0, 0, 0],
    };
    let mut out = [0u8; 64];
    assert_eq!(record::write(&s, &mut out), Some(64));
    assert_eq!(record::parse(&out), Ok(s));
    assert_eq!(record::write(&s, &mut out[..63]), None);
    assert_eq!(record::write_body(&s, &mut out[..55]), None);
    let bad = DeltaSample { nr: 9, ..s };
    assert_eq!(record::write(&bad, &mut out), None);
}
