//! Schedulers: turn an evaluation into a plan, without I/O.
//!
//! ```text
//!  (state snapshot, eval, now) ──▶ Scheduler::compute ──▶ ScheduleOutcome { plan, eval update, new evals }
//! ```
//!
//! **Architecture invariant:** a scheduler performs no I/O and reads the clock
//! only through the `now` it is given. The worker submits the plan to the
//! plan applier; if the applier refuses part of it (a node filled up or went
//! away since the snapshot), the worker runs `compute` again on a newer
//! snapshot.

use nomad_proto::plan::PlanAnnotations;
use nomad_proto::{Evaluation, Plan, Timestamp};

use crate::state::State;

/// What one scheduler run decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScheduleOutcome {
    /// Placements, stops and in-place updates (may be a no-op).
    pub plan: Plan,
    /// The eval as it should be stored once the plan is committed: status
    /// `complete` (or `failed`), `FailedTGAllocs`, `QueuedAllocations`,
    /// `BlockedEval`/`NextEval` set when `new_evals` holds them.
    pub eval_update: Evaluation,
    /// Evals to create with the plan: a blocked eval for placements that did
    /// not fit, follow-ups with `WaitUntil` (reschedule delays,
    /// `max-disconnect-timeout`).
    pub new_evals: Vec<Evaluation>,
    /// What `job plan` shows (filled when the eval has `AnnotatePlan`).
    pub annotations: Option<PlanAnnotations>,
}

/// A scheduler for one or more job types.
pub trait Scheduler: Send + Sync + 'static {
    /// Decides what to change for `eval` given the cluster at `state`.
    fn compute(&self, state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome;
}
