//! `hrperf-burn`: a small, predictable workload for demos and tests — spins the CPU for
//! a given time and optionally touches fresh memory (page faults), then prints the CPU
//! time it used so recordings can be checked against it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let mut ms = 200u64;
    let mut touch_mb = 0usize;
    let mut threads = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let val = args.next();
        let parsed = val.as_deref().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), parsed) {
            ("--ms", Some(v)) => ms = v,
            ("--touch-mb", Some(v)) => touch_mb = v as usize,
            ("--threads", Some(v)) if v > 0 => threads = v as usize,
            _ => {
                eprintln!("usage: hrperf-burn [--ms N] [--touch-mb N] [--threads N]\n  spins N ms of CPU per thread, touching N MiB of fresh memory first");
                return ExitCode::from(2);
            }
        }
    }
    let mut mem = vec![0u8; touch_mb << 20];
    for i in (0..mem.len()).step_by(4096) {
        mem[i] = i as u8;
    }
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let end = Instant::now() + Duration::from_millis(ms);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                while Instant::now() < end {
                    for _ in 0..10_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                    }
                }
                x
            })
        })
        .collect();
    let mut acc = mem.iter().step_by(4096).map(|&b| b as u64).sum::<u64>();
    for w in workers {
        acc ^= w.join().unwrap_or(0);
    }
    // SAFETY: getrusage writes a plain struct we own.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let cpu_us = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) as u64 * 1_000_000
        + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) as u64;
    eprintln!("hrperf-burn: {threads} thread(s), {ms} ms each, cpu_time_us={cpu_us} (checksum {acc:x})");
    ExitCode::SUCCESS
}
