//! The `sim` source: a deterministic simulated PMU driven by a seeded workload model.
//!
//! Each simulated CPU has an Intel-like PMU — 3 fixed counters (instructions, cycles,
//! ref-cycles) and 8 general-purpose counters, each `width` bits wide (48 by default,
//! any of 32..=64) — counting events produced by a workload model in steps of
//! `tick_ns` of virtual time. A sampling counter armed at `2^width − period` overflows,
//! raises an interrupt at the end of the step (so samples show up to one step of skid,
//! as hardware does), and is re-armed only when the format's handler returns
//! `CTRL_RESET`; `CTRL_MASK` stops interrupts on that CPU until restart. In poll mode
//! every CPU reads all its counters each interval, each CPU at its own time (the
//! poller's deadline plus a modelled cross-CPU-call latency).
//!
//! With [`SimConfig::pebs`] the CPUs also have PEBS ([`pebs`]): each overflow of the
//! leader (PMC0) is a PEBS assist that writes a record into the CPU's DS-managed buffer
//! and reloads the counter from the DS area, and only the buffer's threshold interrupt
//! is delivered as a sample (large PEBS); `CTRL_MASK` disables PEBS on that CPU until
//! the reader restarts it.
//!
//! With stacks asked for (a stack format is recorded), every overflow sample carries
//! the call stacks of a simulated program and kernel ([`stacks`]), with their symbols.
//!
//! Everything is integer arithmetic on a seeded splitmix64 generator: the same
//! configuration gives the same samples, bit for bit, on any machine.

pub mod pebs;
pub mod stacks;

use std::time::Duration;

use hrperf_abi::capture::{CLOCK_SIM, SOURCE_SIM};
use hrperf_abi::event::EVENT_TYPE_SIM;
use hrperf_abi::format::{CTRL_MASK, CTRL_RESET, MODE_OVERFLOW, MODE_POLL, SAMPLE_OVERFLOW, SAMPLE_POLL};
use hrperf_abi::{EventDesc, MAX_COUNTERS};

use super::{EventSpec, Finish, Progress, RawSample, Source, SourceError, SourceInfo};
use pebs::{PebsConfig, PebsPmu};

/// The simulated events: name, number, and whether it lives on a fixed counter.
const EVENTS: [(&str, SimEvent); 9] = [
    ("instructions", SimEvent::Instructions),
    ("cycles", SimEvent::Cycles),
    ("ref-cycles", SimEvent::RefCycles),
    ("llc-references", SimEvent::LlcReferences),
    ("llc-misses", SimEvent::LlcMisses),
    ("branches", SimEvent::Branches),
    ("branch-misses", SimEvent::BranchMisses),
    ("loads", SimEvent::Loads),
    ("stores", SimEvent::Stores),
];

/// Number of general-purpose counters of the simulated PMU.
pub const GP_COUNTERS: usize = 8;
/// Fixed counters of the simulated PMU (instructions, cycles, ref-cycles).
pub const FIXED_COUNTERS: usize = 3;
/// Simulated core clock.
pub const CORE_MHZ: u64 = 3000;

/// An event of the simulated PMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum SimEvent {
    /// Instructions retired (fixed counter 0).
    Instructions = 0,
    /// Core cycles, unhalted (fixed counter 1).
    Cycles = 1,
    /// Reference cycles at the nominal frequency, unhalted (fixed counter 2).
    RefCycles = 2,
    /// Last-level cache references.
    LlcReferences = 3,
    /// Last-level cache misses.
    LlcMisses = 4,
    /// Branches retired.
    Branches = 5,
    /// Branch mispredictions.
    BranchMisses = 6,
    /// Loads retired.
    Loads = 7,
    /// Stores retired.
    Stores = 8,
}

impl SimEvent {
    fn from_config(config: u64) -> Option<SimEvent> {
        EVENTS.iter().map(|e| e.1).find(|e| *e as u64 == config)
    }

    /// The fixed counter this event is wired to, if any.
    pub fn fixed_slot(self) -> Option<usize> {
        match self {
            SimEvent::Instructions => Some(0),
            SimEvent::Cycles => Some(1),
            SimEvent::RefCycles => Some(2),
            _ => None,
        }
    }

    /// Upper bound on events per second (for multi-wrap detection).
    pub fn max_rate(self) -> u64 {
        let hz = CORE_MHZ * 1_000_000;
        match self {
            SimEvent::Cycles | SimEvent::RefCycles => hz,
            _ => 4 * hz,
        }
    }
}

/// Parses a comma-separated list of simulated event names.
pub fn parse_events(list: &str) -> Result<Vec<EventSpec>, SourceError> {
    let mut out: Vec<EventSpec> = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(SourceError::Config(format!("empty event name in '{list}'")));
        }
        let Some((_, ev)) = EVENTS.iter().find(|(n, _)| *n == name) else {
            return Err(SourceError::UnknownEvent {
                name: name.to_string(),
                source_name: "sim",
                known: known_events(),
            });
        };
        if out.iter().any(|e| e.name == name) {
            return Err(SourceError::Config(format!("event '{name}' is listed twice")));
        }
        out.push(EventSpec {
            name: name.to_string(),
            desc: EventDesc { kind: EVENT_TYPE_SIM, flags: 0, config: *ev as u64, config1: 0, config2: 0 },
        });
    }
    if out.len() > MAX_COUNTERS {
        return Err(SourceError::Config(format!(
            "{} events given; a session has at most {MAX_COUNTERS} counters",
            out.len()
        )));
    }
    Ok(out)
}

/// The simulator's event names, comma-separated.
pub fn known_events() -> String {
    EVENTS.iter().map(|e| e.0).collect::<Vec<_>>().join(", ")
}

/// The workload the simulated CPUs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Constant rates, no noise: IPC 2.0, 1 LLC miss and 4 references per 1000
    /// instructions, 1 branch per 5 instructions (1% mispredicted), 1 load per 3 and 1
    /// store per 8 instructions. Every count is exactly predictable (golden tests).
    Steady,
    /// A seeded mix of phases (compute, memory-bound, branchy, idle) with ±5% noise,
    /// several threads, and user and kernel IPs.
    Phases,
}

/// Configuration of the simulated run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Seed of the workload model.
    pub seed: u64,
    /// Number of simulated CPUs (numbered 0..cpus).
    pub cpus: u32,
    /// Virtual duration of the run.
    pub duration_ns: u64,
    /// Virtual time per simulation step (interrupt granularity).
    pub tick_ns: u64,
    /// Counter width in bits, 32..=64, for all counters.
    pub width: u8,
    /// Events, leader (sampling counter) first.
    pub events: Vec<EventSpec>,
    /// `MODE_OVERFLOW` or `MODE_POLL`.
    pub mode: u32,
    /// Leader's sampling period (overflow mode).
    pub period: u64,
    /// Poll interval (poll mode).
    pub poll_interval_ns: u64,
    /// The workload model.
    pub workload: Workload,
    /// Raw value every counter not armed for sampling starts at (masked to the width).
    /// Real counters start wherever the last user left them; a value just below 2^width
    /// makes the first wraps come within milliseconds.
    pub counter_start: u64,
    /// PEBS on the leader counter (overflow mode only): `None` for plain overflow
    /// interrupts.
    pub pebs: Option<PebsConfig>,
}

impl SimConfig {
    /// A 2-CPU, 100 ms, 48-bit, phases-workload configuration for `events`.
    pub fn new(events: Vec<EventSpec>) -> SimConfig {
        SimConfig {
            seed: 1,
            cpus: 2,
            duration_ns: 100_000_000,
            tick_ns: 100,
            width: 48,
            events,
            mode: MODE_POLL,
            period: 0,
            poll_interval_ns: 100_000,
            workload: Workload::Phases,
            counter_start: 0,
            pebs: None,
        }
    }

    /// The configuration as `key=value` lines (stored in the capture file).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "seed={}\ncpus={}\nduration_ns={}\ntick_ns={}\nwidth={}\nworkload={:?}\ncounter_start={:#x}\ncore_mhz={}\n",
            self.seed, self.cpus, self.duration_ns, self.tick_ns, self.width, self.workload, self.counter_start, CORE_MHZ
        );
        if let Some(p) = &self.pebs {
            s.push_str(&format!(
                "pebs_layout={:?}\npebs_format={:#x}\npebs_data_cfg={:#x}\npebs_ld_lat={}\n",
                p.layout,
                p.pebs_format().0,
                p.data_cfg,
                p.ld_lat_threshold
            ));
            for r in pebs::REGIONS {
                s.push_str(&format!("region={},{:#x},{:#x},{:#x}\n", r.name, r.base, r.size, r.page_size));
            }
        }
        s
    }

    fn check(&self) -> Result<(), SourceError> {
        let err = |m: String| Err(SourceError::Config(m));
        if self.events.is_empty() {
            return err("no events given".into());
        }
        if let Some(e) = self.events.iter().find(|e| e.desc.kind != EVENT_TYPE_SIM) {
            return err(format!("event '{}' is not a simulator event ({})", e.name, known_events()));
        }
        if self.events.len() > MAX_COUNTERS {
            return err(format!("at most {MAX_COUNTERS} counters"));
        }
        if !(32..=64).contains(&self.width) {
            return err(format!("counter width {} is not in 32..=64", self.width));
        }
        if self.cpus == 0 || self.cpus > 256 {
            return err(format!("{} simulated CPUs: give 1..=256", self.cpus));
        }
        if self.tick_ns == 0 || self.tick_ns > 1_000_000 {
            return err("the simulation step must be 1 ns..1 ms".into());
        }
        let fixed: Vec<_> = self.events.iter().filter_map(|e| sim_event(e).and_then(SimEvent::fixed_slot)).collect();
        let gp = self.events.len() - fixed.len();
        if gp > GP_COUNTERS {
            return err(format!("{gp} general-purpose events; the simulated PMU has {GP_COUNTERS}"));
        }
        match self.mode {
            MODE_OVERFLOW => {
                let leader = self.events.first().and_then(sim_event).unwrap_or(SimEvent::Cycles);
                // The leader must not overflow more than once per step, and the period
                // must fit the counter.
                let per_tick = leader.max_rate().saturating_mul(self.tick_ns) / 1_000_000_000 + 1;
                if self.period < per_tick.saturating_mul(2) {
                    return err(format!(
                        "period {} is too small for the simulator's {} ns step: use at least {} {} per sample",
                        self.period,
                        self.tick_ns,
                        per_tick * 2,
                        self.events[0].name
                    ));
                }
                if self.width < 64 && self.period >= 1u64 << self.width {
                    return err(format!("period {} does not fit a {}-bit counter", self.period, self.width));
                }
            }
            MODE_POLL => {
                if self.poll_interval_ns < self.tick_ns {
                    return err(format!(
                        "poll interval {} ns is shorter than the simulator's {} ns step",
                        self.poll_interval_ns, self.tick_ns
                    ));
                }
            }
            m => return err(format!("the sim source does not support mode {m}")),
        }
        if let Some(p) = &self.pebs {
            if self.mode != MODE_OVERFLOW {
                return err("PEBS samples on counter overflow: give a sampling period (-c PERIOD)".into());
            }
            p.check().map_err(SourceError::Config)?;
        }
        Ok(())
    }
}

fn sim_event(e: &EventSpec) -> Option<SimEvent> {
    SimEvent::from_config(e.desc.config)
}

/// splitmix64: small, fast, and identical everywhere.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Rates of one workload phase, per 1000 core cycles (so one unit is a milli-event per
/// cycle), and where its IPs lie.
#[derive(Clone, Copy, Debug)]
struct Phase {
    name: &'static str,
    /// Share of time the core is unhalted, per mille.
    busy_permille: u64,
    /// Per 1000 cycles: instructions, llc refs, llc misses, branches, branch misses, loads, stores.
    per_kcycle: [u64; 7],
    ip_base: u64,
    ip_span: u64,
    kernel: bool,
    /// Mean phase length.
    mean_ns: u64,
}

const STEADY: Phase = Phase {
    name: "steady",
    busy_permille: 1000,
    per_kcycle: [2000, 8, 2, 400, 4, 667, 250],
    ip_base: 0x40_1000,
    ip_span: 0x400,
    kernel: false,
    mean_ns: u64::MAX,
};

const PHASES: [Phase; 5] = [
    Phase { name: "compute", busy_permille: 1000, per_kcycle: [3200, 4, 1, 500, 3, 900, 300], ip_base: 0x40_1000, ip_span: 0x800, kernel: false, mean_ns: 3_000_000 },
    Phase { name: "memory", busy_permille: 1000, per_kcycle: [600, 60, 25, 80, 1, 300, 120], ip_base: 0x40_4000, ip_span: 0x400, kernel: false, mean_ns: 2_000_000 },
    Phase { name: "branchy", busy_permille: 1000, per_kcycle: [1500, 10, 2, 450, 40, 400, 150], ip_base: 0x40_8000, ip_span: 0x1000, kernel: false, mean_ns: 1_500_000 },
    Phase { name: "syscall", busy_permille: 1000, per_kcycle: [900, 30, 6, 200, 8, 350, 200], ip_base: 0xffff_ffff_8100_0000, ip_span: 0x2000, kernel: true, mean_ns: 500_000 },
    Phase { name: "idle", busy_permille: 0, per_kcycle: [0; 7], ip_base: 0xffff_ffff_8180_0000, ip_span: 0x40, kernel: true, mean_ns: 1_000_000 },
];

/// One simulated counter.
#[derive(Clone, Copy, Debug, Default)]
struct Counter {
    event: u64,
    raw: u64,
    /// Milli-events not yet whole.
    frac: u64,
    overflowed: bool,
}

/// One simulated CPU: its PMU state and its share of the workload.
#[derive(Clone, Debug)]
struct SimCpu {
    cpu: u32,
    rng: Rng,
    phase: usize,
    phase_left_ns: u64,
    thread: u32,
    counters: [Counter; MAX_COUNTERS],
    /// Interrupts masked by the format (CTRL_MASK) until restart.
    masked: bool,
    /// An overflow interrupt is waiting for the handler's CTRL_RESET.
    pending_reset: bool,
    /// Ground truth: every event counted, 64-bit.
    truth: [u64; MAX_COUNTERS],
    /// When this CPU's pending poll read happens.
    read_at: Option<u64>,
    /// The counter write of the last re-arm, not yet reported to the engine.
    written: Option<(usize, u64)>,
    /// Overflow samples given a stack so far (the steady schedule's position).
    stack_seq: u64,
    /// Draws the phases workload's paths (apart from `rng`, so that asking for stacks
    /// changes nothing else).
    stack_rng: Rng,
}

/// The simulated PMU and workload for every CPU.
#[derive(Debug)]
pub struct SimSource {
    cfg: SimConfig,
    info: SourceInfo,
    cpus: Vec<SimCpu>,
    now_ns: u64,
    next_poll_ns: u64,
    started: bool,
    interrupts: u64,
    pebs: Option<PebsPmu>,
    /// The call paths, once stacks are asked for.
    stacks: Option<stacks::StackTable>,
    /// Path of each sample the current `next` call appended (`None`: no stack).
    batch_paths: Vec<Option<u8>>,
}

impl SimSource {
    /// Checks `cfg` and builds the simulated machine.
    pub fn new(cfg: SimConfig) -> Result<SimSource, SourceError> {
        cfg.check()?;
        let mask = width_mask(cfg.width);
        let cpus = (0..cfg.cpus)
            .map(|cpu| {
                let mut rng = Rng(cfg.seed ^ (u64::from(cpu) + 1).wrapping_mul(0xd6e8_feb8_6659_fd93));
                let mut counters = [Counter::default(); MAX_COUNTERS];
                for (c, e) in counters.iter_mut().zip(&cfg.events) {
                    c.event = e.desc.config;
                    c.raw = cfg.counter_start & mask;
                }
                if cfg.mode == MODE_OVERFLOW {
                    counters[0].raw = arm_value(cfg.width, cfg.period) & mask;
                }
                let phase = if cfg.workload == Workload::Steady { 0 } else { rng.below(4) as usize };
                let left = phase_length(&mut rng, cfg.workload, phase);
                SimCpu {
                    cpu,
                    rng,
                    phase,
                    phase_left_ns: left,
                    thread: 0,
                    counters,
                    masked: false,
                    pending_reset: false,
                    truth: [0; MAX_COUNTERS],
                    read_at: None,
                    written: None,
                    stack_seq: 0,
                    stack_rng: Rng(cfg.seed ^ 0x57ac_5eed ^ u64::from(cpu) << 32),
                }
            })
            .collect();
        let n = cfg.events.len();
        let info = SourceInfo {
            source: SOURCE_SIM,
            clock: CLOCK_SIM,
            tsc_hz: CORE_MHZ * 1_000_000,
            mode: cfg.mode,
            sample_period: if cfg.mode == MODE_OVERFLOW { cfg.period } else { 0 },
            poll_interval_ns: if cfg.mode == MODE_POLL { cfg.poll_interval_ns } else { 0 },
            events: cfg.events.clone(),
            widths: vec![cfg.width; n],
            max_rates: cfg.events.iter().map(|e| sim_event(e).map_or(0, SimEvent::max_rate)).collect(),
            cpus: (0..cfg.cpus).collect(),
            cpu_model: format!("hrperf simulated PMU ({} fixed + {} general counters, {}-bit, {} MHz)", FIXED_COUNTERS, GP_COUNTERS, cfg.width, CORE_MHZ),
            start_time_ns: 0,
        };
        let pebs = cfg.pebs.map(|p| PebsPmu::new(p, cfg.cpus, cfg.width));
        Ok(SimSource {
            next_poll_ns: cfg.poll_interval_ns,
            cfg,
            info,
            cpus,
            now_ns: 0,
            started: false,
            interrupts: 0,
            pebs,
            stacks: None,
            batch_paths: Vec::new(),
        })
    }

    /// Ground truth: every event each CPU counted so far, 64-bit, in event order.
    pub fn truth(&self, cpu: u32) -> Option<&[u64]> {
        self.cpus.get(cpu as usize).map(|c| &c.truth[..self.cfg.events.len()])
    }

    /// The simulated PEBS hardware (with [`SimConfig::pebs`]): hand it to the recorder
    /// in `RecordOptions::pebs_pmu`.
    pub fn pebs_pmu(&self) -> Option<PebsPmu> {
        self.pebs.clone()
    }

    /// Overflow interrupts raised so far (threshold PMIs with PEBS).
    pub fn interrupts(&self) -> u64 {
        self.interrupts
    }

    /// Raw reading of counter `i` on `cpu`, as the hardware would show it.
    pub fn raw(&self, cpu: u32, i: usize) -> Option<u64> {
        self.cpus.get(cpu as usize).and_then(|c| c.counters.get(i)).map(|c| c.raw)
    }

    /// The name of the phase `cpu` is in (for demos and tests).
    pub fn phase_name(&self, cpu: u32) -> Option<&'static str> {
        let c = self.cpus.get(cpu as usize)?;
        Some(if self.cfg.workload == Workload::Steady { STEADY.name } else { PHASES[c.phase].name })
    }

    /// Advances every CPU by one step; returns true if any CPU raised an interrupt.
    fn step(&mut self, out: &mut Vec<RawSample>) -> bool {
        let tick = self.cfg.tick_ns;
        let width = self.cfg.width;
        let mask = width_mask(width);
        let workload = self.cfg.workload;
        let nr = self.cfg.events.len();
        let mut raised = false;
        self.now_ns += tick;
        for cpu in &mut self.cpus {
            let phase = if workload == Workload::Steady { STEADY } else { PHASES[cpu.phase] };
            let busy_cycles = CORE_MHZ * tick / 1000 * phase.busy_permille / 1000;
            // ±5% noise per step in the phases model, none in steady.
            let noise = if workload == Workload::Steady { 1000 } else { 950 + cpu.rng.below(101) };
            for (i, c) in cpu.counters.iter_mut().enumerate().take(nr) {
                let milli = match SimEvent::from_config(c.event) {
                    Some(SimEvent::Cycles) | Some(SimEvent::RefCycles) => busy_cycles * 1000,
                    Some(SimEvent::Instructions) => busy_cycles * phase.per_kcycle[0] * noise / 1000,
                    Some(SimEvent::LlcReferences) => busy_cycles * phase.per_kcycle[1] * noise / 1000,
                    Some(SimEvent::LlcMisses) => busy_cycles * phase.per_kcycle[2] * noise / 1000,
                    Some(SimEvent::Branches) => busy_cycles * phase.per_kcycle[3] * noise / 1000,
                    Some(SimEvent::BranchMisses) => busy_cycles * phase.per_kcycle[4] * noise / 1000,
                    Some(SimEvent::Loads) => busy_cycles * phase.per_kcycle[5] * noise / 1000,
                    Some(SimEvent::Stores) => busy_cycles * phase.per_kcycle[6] * noise / 1000,
                    None => 0,
                };
                let total = c.frac + milli;
                let inc = total / 1000;
                c.frac = total % 1000;
                cpu.truth[i] += inc;
                let next = c.raw.wrapping_add(inc);
                if width == 64 {
                    c.overflowed |= next < c.raw;
                    c.raw = next;
                } else {
                    c.overflowed |= next > mask;
                    c.raw = next & mask;
                }
            }
            if let (Some(pmu), true) = (&self.pebs, cpu.counters[0].overflowed) {
                // The PEBS assist: a record per overflow, the counter reloaded from the DS
                // area, and an interrupt only at the buffer's threshold.
                cpu.counters[0].overflowed = false;
                let ip = phase.ip_base + (cpu.rng.below(phase.ip_span) & !3);
                let prof = if workload == Workload::Steady { pebs::STEADY_PROFILE } else { pebs::PROFILES[cpu.phase] };
                let sample = pebs::make_sample(&mut cpu.rng, &prof, ip, phase.kernel, self.now_ns, pmu.ld_lat(), pmu.tlb_bits());
                let outcome = pmu.assist(cpu.cpu, self.now_ns, &sample);
                // Without an assist (masked, no buffer) the counter re-arms as the kernel
                // would program it: −period.
                let reload = outcome.map_or(arm_value(width, self.cfg.period), |o| o.reload);
                cpu.counters[0].raw = reload & mask;
                if outcome.is_some_and(|o| o.pmi) {
                    self.interrupts += 1;
                    raised = true;
                    let mut raw = raw_values(&cpu.counters);
                    // The PEBS counter as the kernel reports it for large PEBS: the
                    // free-running count (reloads × period + progress), so the engine's
                    // 64-bit value is the true count.
                    raw[0] = arm_value(width, self.cfg.period).wrapping_add(cpu.truth[0]) & mask;
                    self.batch_paths.push(None);
                    out.push(RawSample {
                        cpu: cpu.cpu,
                        kind: SAMPLE_OVERFLOW,
                        pid: 1000,
                        tid: 1000 + cpu.cpu * 4 + cpu.thread,
                        time_ns: self.now_ns,
                        ip,
                        kernel_ip: phase.kernel,
                        addr: sample.data_addr,
                        ovfl_counter: 0,
                        nr: nr as u32,
                        raw,
                    });
                }
            } else if self.cfg.mode == MODE_OVERFLOW && cpu.counters[0].overflowed && !cpu.masked && !cpu.pending_reset {
                cpu.counters[0].overflowed = false;
                cpu.pending_reset = true;
                self.interrupts += 1;
                raised = true;
                let tid = 1000 + cpu.cpu * 4 + cpu.thread;
                let mut ip = phase.ip_base + (cpu.rng.below(phase.ip_span) & !3);
                let mut kernel_ip = phase.kernel;
                let path = self.stacks.as_ref().map(|table| {
                    let path = if workload == Workload::Steady {
                        stacks::SCHEDULE[(cpu.stack_seq % stacks::SCHEDULE.len() as u64) as usize]
                    } else if phase.kernel && phase.busy_permille == 0 {
                        stacks::IDLE_PATHS[0]
                    } else if phase.kernel {
                        stacks::KERNEL_PATHS[cpu.stack_rng.below(stacks::KERNEL_PATHS.len() as u64) as usize]
                    } else {
                        stacks::USER_PATHS[cpu.stack_rng.below(stacks::USER_PATHS.len() as u64) as usize]
                    };
                    cpu.stack_seq += 1;
                    ip = table.ip(usize::from(path));
                    kernel_ip = table.is_kernel(usize::from(path));
                    path
                });
                self.batch_paths.push(path);
                out.push(RawSample {
                    cpu: cpu.cpu,
                    kind: SAMPLE_OVERFLOW,
                    pid: if phase.kernel && phase.busy_permille == 0 { 0 } else { 1000 },
                    tid: if phase.kernel && phase.busy_permille == 0 { 0 } else { tid },
                    time_ns: self.now_ns,
                    ip,
                    kernel_ip,
                    addr: 0,
                    ovfl_counter: 0,
                    nr: nr as u32,
                    raw: raw_values(&cpu.counters),
                });
            }
            if workload == Workload::Phases {
                cpu.phase_left_ns = cpu.phase_left_ns.saturating_sub(tick);
                if cpu.phase_left_ns == 0 {
                    cpu.phase = cpu.rng.below(PHASES.len() as u64) as usize;
                    cpu.thread = cpu.rng.below(4) as u32;
                    cpu.phase_left_ns = phase_length(&mut cpu.rng, workload, cpu.phase);
                }
            }
        }
        raised
    }

    /// Schedules this round's reads: each CPU reads at the poller's deadline plus a
    /// modelled cross-CPU-call latency (150 ns per hop plus up to 100 ns of jitter).
    fn schedule_polls(&mut self, deadline: u64) {
        let steady = self.cfg.workload == Workload::Steady;
        for (hop, cpu) in self.cpus.iter_mut().enumerate() {
            let jitter = if steady { 0 } else { cpu.rng.below(101) };
            cpu.read_at = Some(deadline + 150 * hop as u64 + jitter);
        }
    }

    /// Emits the reads whose time has come, stamped with the step they happened in.
    fn take_polls(&mut self, out: &mut Vec<RawSample>) {
        let nr = self.cfg.events.len() as u32;
        for cpu in &mut self.cpus {
            if cpu.read_at.is_some_and(|t| t <= self.now_ns) {
                cpu.read_at = None;
                out.push(RawSample {
                    cpu: cpu.cpu,
                    kind: SAMPLE_POLL,
                    time_ns: self.now_ns,
                    ovfl_counter: u32::MAX,
                    nr,
                    raw: raw_values(&cpu.counters),
                    ..RawSample::default()
                });
            }
        }
    }
}

fn raw_values(counters: &[Counter; MAX_COUNTERS]) -> [u64; MAX_COUNTERS] {
    let mut raw = [0; MAX_COUNTERS];
    for (r, c) in raw.iter_mut().zip(counters) {
        *r = c.raw;
    }
    raw
}

fn phase_length(rng: &mut Rng, workload: Workload, phase: usize) -> u64 {
    match workload {
        Workload::Steady => u64::MAX,
        Workload::Phases => {
            let mean = PHASES[phase].mean_ns;
            mean / 2 + rng.below(mean)
        }
    }
}

fn width_mask(width: u8) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// The raw value that overflows a `width`-bit counter after `period` events.
pub fn arm_value(width: u8, period: u64) -> u64 {
    width_mask(width).wrapping_sub(period).wrapping_add(1) & width_mask(width)
}

impl Source for SimSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn start(&mut self) -> Result<(), SourceError> {
        self.started = true;
        Ok(())
    }

    fn next(&mut self, out: &mut Vec<RawSample>, _timeout: Duration) -> Result<Progress, SourceError> {
        if !self.started {
            return Err(SourceError::Config("sim source used before start".into()));
        }
        self.batch_paths.clear();
        let base = out.len();
        // Return after each interrupt (so the handler's control bits are applied before
        // the next step, as on hardware), or after 1 ms of virtual time.
        let batch_end = (self.now_ns + 1_000_000).min(self.cfg.duration_ns);
        // Let the last poll round's reads land even if they fall just past the end.
        let drain_end = if self.cpus.iter().any(|c| c.read_at.is_some()) { self.now_ns + self.cfg.tick_ns } else { 0 };
        while self.now_ns < batch_end.max(drain_end) {
            let raised = self.step(out);
            if self.cfg.mode == MODE_POLL {
                if self.next_poll_ns <= self.now_ns && self.next_poll_ns <= self.cfg.duration_ns {
                    let deadline = self.next_poll_ns;
                    self.schedule_polls(deadline);
                    self.next_poll_ns += self.cfg.poll_interval_ns;
                }
                self.take_polls(out);
                // Poll samples carry no stack.
                self.batch_paths.resize(out.len() - base, None);
            }
            if raised {
                return Ok(Progress::Running);
            }
        }
        if self.now_ns >= self.cfg.duration_ns && self.cpus.iter().all(|c| c.read_at.is_none()) {
            Ok(Progress::Finished)
        } else {
            Ok(Progress::Running)
        }
    }

    fn control(&mut self, cpu: u32, ctrl: u32) {
        let Some(c) = self.cpus.get_mut(cpu as usize) else { return };
        if ctrl & CTRL_RESET != 0 && c.pending_reset {
            // Re-arm as the kernel does: the count since the overflow (skid) was already
            // read by the engine; the counter restarts at −period.
            c.counters[0].raw = arm_value(self.cfg.width, self.cfg.period);
            c.counters[0].overflowed = false;
            c.pending_reset = false;
            c.written = Some((0, c.counters[0].raw));
        }
        if ctrl & CTRL_MASK != 0 {
            match &self.pebs {
                // The mask disables PEBS; the reader's restart re-enables it.
                Some(pmu) => pmu.mask(cpu),
                None => c.masked = true,
            }
        }
    }

    fn has_stacks(&self) -> bool {
        true
    }

    fn want_stacks(&mut self, _kernel: bool, _user: bool) -> Result<(), SourceError> {
        // Both stacks are always simulated; the format drops what it was told to skip.
        self.stacks = Some(stacks::StackTable::new());
        Ok(())
    }

    fn stack(&self, index: usize) -> Option<crate::source::SampleStack<'_>> {
        let path = (*self.batch_paths.get(index)?)?;
        self.stacks.as_ref()?.stack(usize::from(path))
    }

    fn symbols(&self) -> Vec<crate::source::SymbolText> {
        // Stack formats and PEBS (its report names the functions of the sampled IPs).
        if self.stacks.is_some() || self.pebs.is_some() {
            stacks::symbols()
        } else {
            Vec::new()
        }
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        // The virtual run ends now: pending poll reads are abandoned, nothing is buffered.
        self.cfg.duration_ns = self.now_ns;
        for c in &mut self.cpus {
            c.read_at = None;
        }
        Ok(())
    }

    fn written(&mut self, cpu: u32) -> Option<(usize, u64)> {
        self.cpus.get_mut(cpu as usize).and_then(|c| c.written.take())
    }

    fn start_values(&self, cpu: u32) -> [u64; MAX_COUNTERS] {
        self.cpus.get(cpu as usize).map_or([0; MAX_COUNTERS], |c| raw_values(&c.counters))
    }

    fn finish(&mut self) -> Result<Finish, SourceError> {
        Ok(Finish { exit_status: 0, end_time_ns: self.now_ns, lost: Vec::new() })
    }
}

impl SimSource {
    /// Runs the simulation to its end on its own, re-arming after every overflow as a
    /// format returning `CTRL_RESET` would, and returns every sample: the reference a
    /// recording through the engine is checked against.
    pub fn run_standalone(&mut self) -> Result<Vec<RawSample>, SourceError> {
        self.start()?;
        let mut all = Vec::new();
        loop {
            let from = all.len();
            let progress = self.next(&mut all, Duration::ZERO)?;
            for s in &all[from..] {
                if s.kind == SAMPLE_OVERFLOW {
                    self.control(s.cpu, CTRL_RESET);
                }
            }
            if progress == Progress::Finished {
                return Ok(all);
            }
        }
    }

    /// Like [`run_standalone`](Self::run_standalone) with stacks asked for: every
    /// sample with the kernel and user stacks it carries (empty when it has none).
    #[allow(clippy::type_complexity)]
    pub fn run_standalone_stacks(&mut self) -> Result<Vec<(RawSample, Vec<u64>, Vec<u64>)>, SourceError> {
        self.want_stacks(true, true)?;
        self.start()?;
        let mut all = Vec::new();
        let mut batch = Vec::new();
        loop {
            batch.clear();
            let progress = self.next(&mut batch, Duration::ZERO)?;
            for (j, s) in batch.iter().enumerate() {
                let st = self.stack(j).unwrap_or_default();
                all.push((*s, st.kernel.to_vec(), st.user.to_vec()));
            }
            for s in &batch {
                if s.kind == SAMPLE_OVERFLOW {
                    self.control(s.cpu, CTRL_RESET);
                }
            }
            if progress == Progress::Finished {
                return Ok(all);
            }
        }
    }

    /// Lifts a CTRL_MASK on `cpu` (the format's restart).
    pub fn unmask(&mut self, cpu: u32) {
        if let Some(c) = self.cpus.get_mut(cpu as usize) {
            c.masked = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(events: &str) -> SimConfig {
        SimConfig::new(parse_events(events).unwrap())
    }

    fn run(src: &mut SimSource) -> Vec<RawSample> {
        src.run_standalone().unwrap()
    }

    #[test]
    fn steady_poll_counts_are_exact() {
        let mut c = cfg("cycles,instructions,llc-misses");
        c.workload = Workload::Steady;
        c.duration_ns = 1_000_000;
        c.poll_interval_ns = 100_000;
        let mut s = SimSource::new(c).unwrap();
        let samples = run(&mut s);
        assert_eq!(samples.len(), 2 * 10);
        // 100 µs at 3 GHz = 300 000 cycles per interval, IPC 2, 1 miss per 1000 cycles×2.
        let cpu0: Vec<_> = samples.iter().filter(|x| x.cpu == 0).collect();
        for (k, smp) in cpu0.iter().enumerate() {
            let k = k as u64 + 1;
            assert_eq!(smp.raw[0], 300_000 * k);
            assert_eq!(smp.raw[1], 600_000 * k);
            assert_eq!(smp.raw[2], 600 * k);
            assert_eq!(smp.time_ns, 100_000 * k);
        }
        // CPU 1 reads 150 ns after CPU 0, i.e. in the step ending 200 ns after the
        // deadline: its own timestamp, and the counts of that moment.
        let cpu1: Vec<_> = samples.iter().filter(|x| x.cpu == 1).collect();
        assert_eq!(cpu1[0].time_ns, 100_200);
        assert_eq!(cpu1[0].raw[0], 300_600);
    }

    #[test]
    fn overflow_period_and_reset() {
        let mut c = cfg("cycles,instructions");
        c.workload = Workload::Steady;
        c.mode = MODE_OVERFLOW;
        c.period = 30_000; // 10 µs at 3 GHz
        c.duration_ns = 1_000_000;
        c.cpus = 1;
        let mut s = SimSource::new(c).unwrap();
        let samples = run(&mut s);
        assert_eq!(samples.len(), 100);
        for (k, smp) in samples.iter().enumerate() {
            assert_eq!(smp.time_ns, 10_000 * (k as u64 + 1));
            assert!(smp.raw[0] < 300, "skid below one step: {}", smp.raw[0]);
        }
    }

    #[test]
    fn unreset_counter_stops_sampling_until_wrap() {
        let mut c = cfg("cycles");
        c.workload = Workload::Steady;
        c.mode = MODE_OVERFLOW;
        c.period = 30_000;
        c.duration_ns = 1_000_000;
        c.cpus = 1;
        let mut s = SimSource::new(c).unwrap();
        s.start().unwrap();
        let mut all = Vec::new();
        while s.next(&mut all, Duration::ZERO).unwrap() == Progress::Running {}
        // No CTRL_RESET was given: only the first overflow interrupts.
        assert_eq!(all.len(), 1);
    }

    #[test]
    fn same_seed_same_samples_and_other_seed_differs() {
        let mut a = cfg("cycles,instructions,branch-misses");
        a.duration_ns = 5_000_000;
        let x = run(&mut SimSource::new(a.clone()).unwrap());
        let y = run(&mut SimSource::new(a.clone()).unwrap());
        assert_eq!(x, y);
        a.seed = 2;
        let z = run(&mut SimSource::new(a).unwrap());
        assert_ne!(x, z);
    }

    #[test]
    fn narrow_counters_wrap() {
        let mut c = cfg("cycles");
        c.width = 32;
        c.workload = Workload::Steady;
        c.cpus = 1;
        c.duration_ns = 3_000_000_000; // 9e9 cycles: two wraps of 2^32
        c.poll_interval_ns = 1_000_000_000;
        c.tick_ns = 1_000_000;
        let s = run(&mut SimSource::new(c).unwrap());
        let raws: Vec<u64> = s.iter().map(|x| x.raw[0]).collect();
        assert_eq!(raws, [3_000_000_000, 6_000_000_000 - (1 << 32), 9_000_000_000 - 2 * (1 << 32)]);
    }

    #[test]
    fn config_errors_are_clear() {
        assert!(matches!(parse_events("cycles,bogus"), Err(SourceError::UnknownEvent { .. })));
        assert!(matches!(parse_events("cycles,cycles"), Err(SourceError::Config(_))));
        let mut c = cfg("cycles");
        c.mode = MODE_OVERFLOW;
        c.period = 10;
        let e = SimSource::new(c).unwrap_err().to_string();
        assert!(e.contains("too small"), "{e}");
        let mut c = cfg("cycles");
        c.width = 16;
        assert!(SimSource::new(c).unwrap_err().to_string().contains("width"));
    }

    #[test]
    fn arm_value_overflows_after_period() {
        assert_eq!(arm_value(48, 1000), (1 << 48) - 1000);
        assert_eq!(arm_value(64, 1000), u64::MAX - 999);
    }
}
