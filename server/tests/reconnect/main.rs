//! Deterministic in-process tests of the reconnect protocol.
//!
//! A client that was cut off comes back and makes its four calls (Register,
//! UpdateStatus, UpdateAlloc, GetClientAllocs + GetAllocs with its reconnect
//! decision) in any order, while the scheduler and the plan applier run at
//! any point in between. The server is the real one (endpoints, built-in
//! scheduler, plan-applier evaluation, FSM, the leader's blocked-eval logic)
//! over a `LocalConsensus` with a virtual clock; nothing runs in the
//! background, so every run is a replayable sequence of steps.
//!
//! - `exhaustive`: every permutation of the four calls × every subset of the
//!   five gaps in which the scheduler runs, for every scenario of the grid.
//! - `sampled`: seeded random interleavings with stale plans (computed on one
//!   state, applied on a later one), repeated calls, heartbeat expiries while
//!   coming back, and the client returning before the scheduler marked its
//!   allocs. A failure prints the seed; `RECONNECT_SEED=<seed>` replays it.
//!
//! After every step the invariants of `world.rs` are checked; after the
//! calls the client keeps heartbeating, pulling and syncing until nothing
//! moves, and the end state is checked against the reconnect rules.

mod client;
mod exhaustive;
mod regressions;
mod sampled;
mod sim;
mod world;

use world::{Scenario, Step, World, codes};

/// Runs `steps` after the scenario's prefix, then settles and checks the end.
pub fn run(sc: Scenario, steps: &[Step]) -> Result<World, String> {
    let w = World::prefix(sc).map_err(|e| format!("setting up: {e}"))?;
    run_from(w, steps)
}

/// Runs `steps` on a world already at the client's return.
pub fn run_from(mut w: World, steps: &[Step]) -> Result<World, String> {
    let fail = |w: &World, e: String| format!("{e}\n  steps: {}\n  trace:\n    {}", codes(steps), w.trace());
    for &s in steps {
        if let Err(e) = w.step(s) {
            return Err(fail(&w, e));
        }
    }
    w.note("-- settle --".into());
    if let Err(e) = w.settle().and_then(|_| w.check_end()) {
        return Err(fail(&w, e));
    }
    Ok(w)
}
