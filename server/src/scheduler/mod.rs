//! Schedulers: turn an evaluation into a plan, without I/O.
//!
//! ```text
//!  (state snapshot, eval, now) ──▶ Scheduler::compute ──▶ ScheduleOutcome { plan, eval update, new evals }
//!
//!  BuiltinScheduler ─┬─ service, batch ──▶ GenericScheduler: reconcile ─▶ place (select) ─▶ plan
//!                    └─ system, sysbatch ─▶ SystemScheduler: diff per node ─▶ place ─▶ plan
//!
//!  select: shuffled nodes ─▶ feasible ─▶ fit ─▶ score ─▶ limit ─▶ best
//! ```
//!
//! **Architecture invariant:** a scheduler performs no I/O and reads the clock
//! only through the `now` it is given. The worker submits the plan to the
//! plan applier; if the applier refuses part of it (a node filled up or went
//! away since the snapshot), the worker runs `compute` again on a newer
//! snapshot.
//!
//! Randomness (node shuffling, dynamic ports) comes from a generator seeded
//! with the eval ID and the snapshot index, and so do new alloc and eval IDs
//! (`ids.rs`): a run on the same snapshot and eval makes the same outcome.
//!
//! **Bounded by what is placed.** A group's `count` is never turned into
//! that many of anything before placement: new names are handed out one at a
//! time (`FreshPlacements`), and once one placement of a group fails the rest
//! are counted as coalesced failures without being tried, so a stored count of
//! 2^31 on a small cluster costs what fits plus a constant. Resource sums are
//! formed in checked or saturating arithmetic: stored state is not
//! re-validated, and a value past the admission bounds must not wrap.
//!
//! **Blocked evals.** When placements fail, `new_evals` holds a `blocked`
//! eval and `eval_update.blocked_eval` names it. When the eval being
//! processed is itself a blocked eval that still cannot place everything,
//! no new eval is made: `eval_update` keeps status `blocked` (with fresh
//! `ClassEligibility`, `FailedTGAllocs` and `QueuedAllocations`) and the
//! worker should re-block it (Nomad's `ReblockEval`). The system scheduler
//! makes one blocked eval per node that had no room (with `NodeID`), as Nomad.
//!
//! **Plan shape.** `node_update` entries are stops carrying only what the
//! applier reads (ID, `DesiredDescription`, `ClientStatus` — `lost` when the
//! node is gone, otherwise the alloc's current one — and `FollowupEvalID`).
//! `node_allocation` holds new allocs (`Job: None`, they run the plan's job)
//! and rewrites of stored allocs (create index kept): in-place updates
//! (`Job: None`), `unknown` marks, reconnects and follow-up IDs (these keep
//! their own `Job`, which may be an older version).
//!
//! Glossary:
//! - *tainted node*: missing, down, draining or disconnected (not initializing).
//! - *disconnecting*: running on a disconnected node in a group with
//!   `max_client_disconnect`; marked `unknown`, replaced, kept running.
//! - *reconnecting*: `unknown` last AllocState but the node is back and the
//!   client reports again; the original or its replacement is kept.
//! - *computed class*: a hash of what feasibility reads; results are
//!   remembered per class unless a constraint reads `unique.*` values.
//!
//! Not modelled (and where Nomad differs): deployments and canaries
//! (`max_parallel` destructive updates per eval, the rest continue in a
//! `rolling-update` eval after `min_healthy_time`), preemption, device
//! instance assignment (devices are only checked for presence), network bandwidth, per-address port accounting (one address
//! per node), memory oversubscription and the `spread` scheduler algorithm.

mod alloc_sets;
mod annotate;
mod constraint;
mod csi;
mod fast_hash;
mod feasible;
mod fit;
mod generic;
mod ids;
mod metrics;
mod names;
mod nodes;
mod ports;
mod property_set;
mod proposed;
mod rank;
mod reconcile;
mod reschedule;
mod select;
mod spread;
mod system;
mod updates;
mod usage;
mod version;

use nomad_proto::plan::PlanAnnotations;
use nomad_proto::{EvalStatus, Evaluation, JobType, Plan, Timestamp};

pub use generic::GenericScheduler;
pub use system::SystemScheduler;

use crate::state::State;

/// Description of an alloc replaced because the job changed destructively.
pub const ALLOC_UPDATING_DESC: &str = "alloc is being updated due to job update";
/// Status description of a blocked eval made for failed placements.
pub const BLOCKED_EVAL_FAILED_PLACEMENTS_DESC: &str = "created to place remaining allocations";
/// Status description of a follow-up eval for a delayed reschedule.
pub const RESCHEDULING_FOLLOWUP_DESC: &str = "created for delayed rescheduling";
/// Status description of a follow-up eval for a disconnect timeout.
pub const DISCONNECT_TIMEOUT_FOLLOWUP_DESC: &str = "created for delayed disconnect timeout";
/// Status description of the eval continuing a rolling update.
pub const ROLLING_UPDATE_FOLLOWUP_DESC: &str = "created to continue a rolling update";

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

/// Runs the scheduler for the eval's type.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinScheduler;

impl Scheduler for BuiltinScheduler {
    fn compute(&self, state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome {
        match eval.eval_type {
            JobType::Service | JobType::Batch => GenericScheduler.compute(state, eval, now),
            JobType::System | JobType::Sysbatch => SystemScheduler.compute(state, eval, now),
            // Garbage collection is not a placement scheduler's business.
            JobType::Core => ScheduleOutcome { eval_update: finished(eval, EvalStatus::Complete, "", now), ..ScheduleOutcome::default() },
        }
    }
}

/// The eval with a final status.
fn finished(eval: &Evaluation, status: EvalStatus, description: &str, now: Timestamp) -> Evaluation {
    let mut e = eval.clone();
    e.status = status;
    e.status_description = description.to_string();
    e.modify_time = now.unix_nanos();
    e
}

/// An outcome that only fails the eval (a trigger the scheduler does not handle).
fn refused(state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome {
    let desc = format!("scheduler cannot handle '{}' evaluation reason", eval.triggered_by);
    let mut e = finished(eval, EvalStatus::Failed, &desc, now);
    e.snapshot_index = state.index;
    ScheduleOutcome { eval_update: e, ..ScheduleOutcome::default() }
}

#[cfg(test)]
mod tests;
