//! Seeded random interleavings beyond the exhaustive grid: plans computed on
//! one state and applied on a later one (the scheduler racing the client),
//! alloc batches taken by the syncer before a heartbeat and delivered after,
//! repeated calls, the other clients acting late, heartbeat expiries while
//! the client comes back, and clients that return before the scheduler
//! marked their allocs. Each seed picks a scenario and a step sequence that
//! contains the four calls at least once; the service and the system tests
//! draw from their own part of the grid (a seed replays in its own test).
//!
//! `RECONNECT_SEED=<n>` replays one seed (printing its trace);
//! `RECONNECT_SAMPLES=<n>` changes how many seeds run (default below).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::run;
use crate::world::{Kind, Pending, Scenario, Step, codes, grid};

/// Seeds per test run by default.
const SAMPLES: u64 = 3000;
/// First seed (fixed, so every run covers the same sequences).
const BASE_SEED: u64 = 0x5eed_0000;

/// The scenario (of the job kind given) and steps of one seed.
pub fn generate(seed: u64, with_expiry: bool, kind: Kind) -> (Scenario, Vec<Step>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let scenarios: Vec<Scenario> = grid().into_iter().filter(|s| s.kind == kind).collect();
    let mut sc = scenarios[rng.random_range(0..scenarios.len())];
    // Sometimes the client is back before the scheduler saw it go.
    if sc.max_disconnect && sc.event != crate::world::Event::Expired && rng.random_bool(0.25) {
        sc.marked = false;
        sc.pending = if rng.random_bool(0.5) { Pending::All } else { Pending::Changed };
    }
    let mut calls = vec![Step::Register, Step::Heartbeat, Step::UpdateAlloc, Step::Pull];
    calls.shuffle(&mut rng);
    let mut steps = Vec::new();
    let extra = rng.random_range(2..10);
    let mut noise: Vec<Step> = Vec::new();
    for _ in 0..extra {
        let s = match rng.random_range(0..100) {
            0..20 => Step::Compute,
            20..38 => Step::Apply,
            38..48 => Step::Schedule,
            48..56 => Step::Others,
            56..68 => Step::Heartbeat,
            68..76 => Step::Pull,
            76..86 => Step::UpdateAlloc,
            86..93 => Step::Register,
            93..97 => Step::SyncBegin,
            _ if with_expiry => Step::Expire,
            _ => Step::Compute,
        };
        noise.push(s);
        if s == Step::SyncBegin {
            // The batch lands later (the syncer's call is in flight meanwhile).
            noise.push(Step::SyncEnd);
        }
    }
    // Interleave the calls (in their shuffled order) with the noise.
    let total = calls.len() + noise.len();
    let mut calls = calls.into_iter().peekable();
    let mut noise = noise.into_iter().peekable();
    for i in 0..total {
        let left_calls = calls.len();
        let take_call = left_calls > 0 && (noise.peek().is_none() || rng.random_range(0..(total - i)) < left_calls);
        steps.push(if take_call { calls.next().unwrap() } else { noise.next().unwrap() });
    }
    (sc, steps)
}

fn sweep(with_expiry: bool, salt: u64, kind: Kind, samples: u64) {
    let (seeds, verbose): (Vec<u64>, bool) = match std::env::var("RECONNECT_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => (vec![seed], true),
        None => {
            let n = std::env::var("RECONNECT_SAMPLES").ok().and_then(|s| s.parse().ok()).unwrap_or(samples);
            ((0..n).map(|i| BASE_SEED + salt + i).collect(), false)
        }
    };
    let start = std::time::Instant::now();
    let mut failures = Vec::new();
    let mut stale_plans = 0;
    let mut refusals = 0;
    for &seed in &seeds {
        let (sc, steps) = generate(seed, with_expiry, kind);
        match run(sc, &steps) {
            Ok(w) => {
                stale_plans += steps.iter().filter(|s| **s == Step::Compute).count();
                refusals += w.sim.refusals;
                if verbose {
                    eprintln!("seed {seed}: scenario {sc}\n  steps {}\n  trace:\n    {}", codes(&steps), w.trace());
                }
            }
            Err(e) => {
                failures.push(format!("seed {seed} (replay: RECONNECT_SEED={seed})\n  scenario {sc}\n  {e}"));
                if failures.len() >= 3 {
                    break;
                }
            }
        }
    }
    eprintln!(
        "sampled ({kind:?} job, expiries: {with_expiry}): {} seeds in {:.1?}; {stale_plans} plans computed ahead of their apply, {refusals} partial refusals by the applier",
        seeds.len(),
        start.elapsed()
    );
    assert!(failures.is_empty(), "{} failing seed(s) (first ones shown):\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn random_interleavings_with_stale_plans() {
    sweep(false, 0, Kind::Service, SAMPLES);
}

#[test]
fn random_interleavings_with_heartbeat_expiries() {
    sweep(true, 1_000_000, Kind::Service, SAMPLES);
}

#[test]
fn system_job_random_interleavings_with_stale_plans() {
    sweep(false, 2_000_000, Kind::System, SAMPLES);
}

#[test]
fn system_job_random_interleavings_with_heartbeat_expiries() {
    sweep(true, 3_000_000, Kind::System, SAMPLES);
}
