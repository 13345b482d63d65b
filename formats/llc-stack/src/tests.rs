//! End-to-end tests: registry → session → dispatch with stack services → ring → parsed
//! records; argument rules; parsing arbitrary bytes.

extern crate std;
use std::vec;
use std::vec::Vec;

use hrperf_abi::errno::{E2BIG, EINVAL};
use hrperf_abi::format::{CTRL_NOTIFY, CTRL_RESET, MODE_OVERFLOW, MODE_POLL, SAMPLE_OVERFLOW, SAMPLE_POLL};
use hrperf_abi::record::{MISC_KERNEL, MISC_OVERFLOW, MISC_TRUNCATED};
use hrperf_abi::{RecordType, Services, SessionParams, MAX_COUNTERS};
use hrperf_engine::{Buffer, CounterConfig, CpuSession, Registry, RingReader, Sample, Selector, Session};

use super::record::*;
use super::*;

fn params(mode: u32, hint: u64) -> SessionParams {
    SessionParams {
        size: core::mem::size_of::<SessionParams>() as u32,
        mode,
        nr_counters: 1,
        cpu: u32::MAX,
        sample_period: 5_000,
        poll_interval_ns: 0,
        data_size_hint: hint,
        flags: 0,
        reserved: 0,
    }
}

/// The stacks the fake services hand out (what a source or the kernel captured).
struct FakeStacks {
    kernel: Vec<u64>,
    user: Vec<u64>,
    comm: &'static [u8],
    calls: usize,
}

unsafe fn fill(src: &[u64], out: *mut u64, max: u32) -> u32 {
    let n = src.len().min(max as usize);
    for (i, v) in src.iter().take(n).enumerate() {
        // SAFETY: the Services contract: `out` has room for `max` frames.
        unsafe { out.add(i).write(*v) };
    }
    n as u32
}

unsafe extern "C" fn kstack(ctx: *mut core::ffi::c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: ctx is the FakeStacks of the test.
    let f = unsafe { &mut *ctx.cast::<FakeStacks>() };
    f.calls += 1;
    // SAFETY: forwarded.
    unsafe { fill(&f.kernel, out, max) }
}

unsafe extern "C" fn ustack(ctx: *mut core::ffi::c_void, out: *mut u64, max: u32) -> u32 {
    // SAFETY: ctx is the FakeStacks of the test.
    let f = unsafe { &mut *ctx.cast::<FakeStacks>() };
    f.calls += 1;
    // SAFETY: forwarded.
    unsafe { fill(&f.user, out, max) }
}

unsafe extern "C" fn comm(ctx: *mut core::ffi::c_void, out: *mut u8, len: u32) -> u32 {
    // SAFETY: ctx is the FakeStacks of the test.
    let f = unsafe { &*ctx.cast::<FakeStacks>() };
    let n = f.comm.len().min(len as usize);
    // SAFETY: `out` has room for `len` bytes (contract).
    unsafe { core::ptr::copy_nonoverlapping(f.comm.as_ptr(), out, n) };
    n as u32
}

fn services(f: &mut FakeStacks) -> Services {
    Services {
        size: core::mem::size_of::<Services>() as u32,
        reserved: 0,
        ctx: (f as *mut FakeStacks).cast(),
        kernel_stack: Some(kstack),
        user_stack: Some(ustack),
        comm: Some(comm),
    }
}

struct Rig {
    words: Vec<u64>,
    cpu: CpuSession,
}

impl Rig {
    fn new(hint: u64, arg: &[u8]) -> Rig {
        let mut reg: Registry<4> = Registry::new();
        reg.register_static(&LLC_STACK_OPS).unwrap();
        let fmt = reg.acquire(Selector::Name(b"llc-stack")).unwrap();
        let cfg = [CounterConfig { width: 64, max_rate_per_sec: 0 }];
        let s = Session::new(fmt, &params(MODE_OVERFLOW, hint), arg, &cfg).unwrap();
        let mut words = vec![0u64; s.buffer_size() as usize / 8];
        let mut buf = Buffer::from_words(&mut words).unwrap();
        let mut cpu = s.init_cpu(1, &mut buf, arg).unwrap();
        cpu.start(&mut buf, &[0; MAX_COUNTERS], 0).unwrap();
        Rig { words, cpu }
    }

    fn dispatch(&mut self, s: &Sample, svc: &Services) -> u32 {
        let mut buf = Buffer::from_words(&mut self.words).unwrap();
        self.cpu.dispatch(&mut buf, s, svc)
    }

    /// Drains the ring: stack records as owned (fixed, kernel, user), LOST as `Err(n)`.
    #[allow(clippy::type_complexity)]
    fn drain(&mut self) -> Vec<Result<(StackFixed, Vec<u64>, Vec<u64>), u64>> {
        let buf = Buffer::from_words(&mut self.words).unwrap();
        let mut out = Vec::new();
        RingReader::new(&buf)
            .unwrap()
            .drain(|rec| {
                let kind = u32::from_ne_bytes(rec[0..4].try_into().unwrap());
                if kind == RecordType::LOST.0 {
                    out.push(Err(u64::from_ne_bytes(rec[8..16].try_into().unwrap())));
                } else {
                    let r = StackRecord::parse(rec).unwrap();
                    out.push(Ok((r.fixed, r.kernel().collect(), r.user().collect())));
                }
            })
            .unwrap();
        out
    }
}

fn sample(n: u64, kernel: bool) -> Sample {
    let mut raw = [0u64; MAX_COUNTERS];
    raw[0] = n * 5_000;
    Sample {
        cpu: 1,
        kind: SAMPLE_OVERFLOW,
        pid: 42,
        tid: 43,
        time_ns: 1_000 + n,
        ip: if kernel { 0xffff_ffff_8100_0000 + n } else { 0x40_1000 + n },
        kernel_ip: kernel,
        addr: 0xdead_b000,
        ovfl_counter: 0,
        nr: 1,
        raw,
    }
}

#[test]
fn records_carry_both_stacks_comm_and_weight() {
    let mut rig = Rig::new(0, &[]);
    let mut f = FakeStacks {
        kernel: vec![0xffff_ffff_8100_0001, 0xffff_ffff_8100_0100, 0xffff_ffff_8100_0200],
        user: vec![0x40_1001, 0x40_2000, 0x40_3000, 0x40_4000],
        comm: b"stress-ng",
        calls: 0,
    };
    let svc = services(&mut f);
    for n in 1..=3 {
        assert_eq!(rig.dispatch(&sample(n, true), &svc), CTRL_RESET);
    }
    let recs = rig.drain();
    assert_eq!(recs.len(), 3);
    for (n, r) in recs.into_iter().enumerate() {
        let (fx, k, u) = r.unwrap();
        assert_eq!(fx.ip, 0xffff_ffff_8100_0001 + n as u64);
        assert_eq!(fx.pid, 42);
        assert_eq!(fx.tid, 43);
        assert_eq!(fx.cpu, 1);
        assert_eq!(fx.addr, 0xdead_b000);
        assert_eq!(fx.weight, 5_000, "weight is the sample period");
        assert_eq!(fx.comm(), b"stress-ng");
        assert_eq!(fx.misc, MISC_OVERFLOW | MISC_KERNEL);
        assert_eq!(fx.flags, STK_KERNEL_IP);
        assert_eq!(k, f.kernel);
        assert_eq!(u, f.user);
    }
    assert_eq!(f.calls, 6);
}

#[test]
fn deep_stacks_are_cut_at_the_limit_and_marked() {
    let arg = LlcStackArg { size: 24, max_kernel: 4, max_user: 2, ..Default::default() };
    let mut rig = Rig::new(0, &arg.to_bytes());
    let mut f = FakeStacks { kernel: (0..10).collect(), user: (100..102).collect(), comm: b"x", calls: 0 };
    let svc = services(&mut f);
    rig.dispatch(&sample(1, false), &svc);
    f.user = (100..103).collect();
    let svc = services(&mut f);
    rig.dispatch(&sample(2, false), &svc);
    let recs = rig.drain();
    let (a, ak, au) = recs[0].clone().unwrap();
    assert_eq!(ak, vec![0, 1, 2, 3]);
    assert_eq!(au, vec![100, 101], "exactly at the limit is not cut");
    assert_eq!(a.flags, STK_KERNEL_TRUNCATED);
    assert_eq!(a.misc & MISC_TRUNCATED, MISC_TRUNCATED);
    let (b, _, bu) = recs[1].clone().unwrap();
    assert_eq!(bu, vec![100, 101]);
    assert_eq!(b.flags, STK_KERNEL_TRUNCATED | STK_USER_TRUNCATED);
}

#[test]
fn without_services_the_record_says_so_and_keeps_the_ip() {
    let mut rig = Rig::new(0, &[]);
    rig.dispatch(&sample(7, false), &Services::NONE);
    let (fx, k, u) = rig.drain()[0].clone().unwrap();
    assert!(k.is_empty() && u.is_empty());
    assert_eq!(fx.flags, STK_NO_KERNEL_STACK | STK_NO_USER_STACK);
    assert_eq!(fx.ip, 0x40_1007);
    assert_eq!(fx.comm(), b"");
}

#[test]
fn argument_flags_skip_a_stack_without_calling_its_service() {
    let arg = LlcStackArg { size: 24, flags: ARG_NO_KERNEL_STACK, ..Default::default() };
    let mut rig = Rig::new(0, &arg.to_bytes());
    let mut f = FakeStacks { kernel: vec![1, 2], user: vec![3, 4], comm: b"a", calls: 0 };
    let svc = services(&mut f);
    rig.dispatch(&sample(1, true), &svc);
    let (fx, k, u) = rig.drain()[0].clone().unwrap();
    assert!(k.is_empty());
    assert_eq!(u, vec![3, 4]);
    assert_eq!(fx.flags & STK_NO_KERNEL_STACK, STK_NO_KERNEL_STACK);
    assert_eq!(f.calls, 1);
}

#[test]
fn a_full_ring_drops_counts_and_marks_the_gap() {
    let mut rig = Rig::new(MIN_DATA_SIZE, &[]);
    let mut f = FakeStacks { kernel: (0..64).collect(), user: (0..127).collect(), comm: b"a", calls: 0 };
    let svc = services(&mut f);
    let mut notified = false;
    let n = 200u64;
    for i in 0..n {
        notified |= rig.dispatch(&sample(i, false), &svc) & CTRL_NOTIFY != 0;
    }
    assert!(notified);
    let recs = rig.drain();
    let written = recs.iter().filter(|r| r.is_ok()).count() as u64;
    assert!(written < n && written > 10, "{written}");
    // Drained: the next record goes in, preceded by a LOST record for everything dropped.
    rig.dispatch(&sample(n, false), &svc);
    let after = rig.drain();
    assert_eq!(after.len(), 2);
    assert_eq!(after[0], Err(n - written));
    let buf = Buffer::from_words(&mut rig.words).unwrap();
    assert_eq!(rig.cpu.stats(&buf).drops, n - written);
}

#[test]
fn poll_sessions_and_bad_arguments_are_refused() {
    let mut reg: Registry<4> = Registry::new();
    reg.register_static(&LLC_STACK_OPS).unwrap();
    let fmt = reg.acquire(Selector::Name(b"llc-stack")).unwrap();
    let cfg = [CounterConfig { width: 64, max_rate_per_sec: 0 }];
    assert!(Session::new(fmt, &params(MODE_POLL, 0), &[], &cfg).is_err());
    assert_eq!(parse_arg(&[1, 2, 3]), Err(EINVAL));
    let mut big = LlcStackArg { size: 24, max_kernel: MAX_DEPTH + 1, ..Default::default() };
    assert_eq!(parse_arg(&big.to_bytes()), Err(EINVAL));
    big.max_kernel = 0;
    big.flags = 1 << 7;
    assert_eq!(parse_arg(&big.to_bytes()), Err(EINVAL));
    let mut tail = vec![0u8; 32];
    tail[..24].copy_from_slice(&LlcStackArg { size: 32, ..Default::default() }.to_bytes());
    assert!(parse_arg(&tail).is_ok());
    tail[30] = 1;
    assert_eq!(parse_arg(&tail), Err(E2BIG));
    let ok = LlcStackArg { size: 24, max_kernel: MAX_DEPTH, max_user: MAX_DEPTH, ..Default::default() };
    assert!(parse_arg(&ok.to_bytes()).is_ok());
}

#[test]
fn non_overflow_samples_write_nothing() {
    let mut rig = Rig::new(0, &[]);
    let mut s = sample(1, false);
    s.kind = SAMPLE_POLL;
    assert_eq!(rig.dispatch(&s, &Services::NONE), 0);
    assert!(rig.drain().is_empty());
}

#[test]
fn encode_and_parse_round_trip_and_parse_never_panics() {
    let fx = StackFixed {
        misc: MISC_OVERFLOW,
        time_ns: 9,
        ip: 0x1234,
        addr: 0,
        weight: 77,
        cpu: 3,
        pid: 5,
        tid: 6,
        flags: STK_IMPORTED,
        comm: *b"perf-import\0\0\0\0\0",
    };
    let mut v = Vec::new();
    assert!(encode(&mut v, &fx, &[1, 2], &[3]));
    assert_eq!(v.len(), record_size(3));
    let r = StackRecord::parse(&v).unwrap();
    assert_eq!(r.fixed, fx);
    assert_eq!(r.kernel().collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(r.user().collect::<Vec<_>>(), vec![3]);
    for cut in 0..v.len() {
        assert!(StackRecord::parse(&v[..cut]).is_err());
    }
    let mut bad = v.clone();
    bad[56] = 9;
    assert!(matches!(StackRecord::parse(&bad), Err(ParseError::BadSize { .. })));
    let mut bad = v.clone();
    bad[60] = 1;
    assert_eq!(StackRecord::parse(&bad), Err(ParseError::Reserved));
    // A cheap deterministic generator: bit flips and random bytes never panic.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = v.clone();
        let i = (x % b.len() as u64) as usize;
        b[i] ^= (x >> 32) as u8 | 1;
        let _ = StackRecord::parse(&b).map(|r| (r.kernel().count(), r.user().count()));
        let len = (x >> 40) as usize % 200;
        let junk: Vec<u8> = (0..len).map(|k| (x >> (k % 56)) as u8).collect();
        let _ = StackRecord::parse(&junk);
    }
    assert!(!encode(&mut Vec::new(), &fx, &vec![0; MAX_FRAMES], &[1]));
}
