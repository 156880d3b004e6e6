//! `Job.Plan`: what the scheduler would do with a job, without writing anything.
//!
//! The job (canonicalized, validated) and an annotated eval are put into a
//! private copy of the state snapshot, the scheduler runs on it, and its
//! outcome is reported. Nothing goes through Raft.

use std::collections::BTreeMap;

use nomad_proto::eval::trigger;
use nomad_proto::plan::PlanAnnotations;
use nomad_proto::{AllocMetric, EvalStatus, Evaluation, Job, Timestamp};
use serde::Serialize;

use super::job_diff::{JobDiff, job_diff};
use super::{EndpointError, Endpoints};
use crate::state::StateStore;

/// Reply to `Job.Plan`, in Nomad's shape.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct JobPlanResponse {
    /// What would happen per group.
    pub annotations: Option<PlanAnnotations>,
    /// Groups that could not be placed (null when all fit).
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, AllocMetric>>,
    /// The current job's modify index (0 for a new job), for `job run -check-index`.
    pub job_modify_index: u64,
    /// Evals the scheduler would create (blocked, follow-ups), null when none.
    pub created_evals: Option<Vec<Evaluation>>,
    /// The field-level diff, when asked for.
    pub diff: Option<JobDiff>,
    /// Next launch of a periodic job (not computed yet: always unset).
    pub next_periodic_launch: Timestamp,
    /// Warnings.
    pub warnings: String,
    /// Index of the state the plan was made at.
    pub index: u64,
}

impl Endpoints {
    /// `Job.Plan`. `diff` adds a field-level diff against the stored job.
    pub async fn job_plan(&self, mut job: Job, diff: bool) -> Result<JobPlanResponse, EndpointError> {
        let scheduler =
            self.scheduler.clone().ok_or_else(|| EndpointError::Internal("job plan is unavailable: no scheduler is configured".into()))?;
        super::job::admit_job(&mut job, &self.config)?;
        let snap = self.store.snapshot();
        if snap.namespace(&job.namespace).is_none() {
            return Err(EndpointError::Invalid(format!("job {:?} is in nonexistent namespace {:?}", job.id, job.namespace)));
        }
        let old = snap.job(&job.namespace, &job.id).cloned();
        let index = old.as_ref().map_or(0, |j| j.job_modify_index);
        let now = Timestamp::now();

        // Substitute the job in a private copy of the state; the scheduler sees it as registered.
        let scratch = StateStore::new();
        scratch.restore(snap.clone());
        let scratch_index = snap.index + 1;
        let mut eval = Evaluation::for_job(&job, trigger::JOB_REGISTER, now);
        eval.status = EvalStatus::Pending;
        eval.annotate_plan = true;
        let planned_job = job.clone();
        let eval = scratch
            .write(scratch_index, |tx| {
                let stored = tx.upsert_job(planned_job)?;
                eval.job_modify_index = stored.job_modify_index;
                tx.upsert_evals(vec![eval.clone()]);
                Ok(eval)
            })
            .map_err(|e| EndpointError::Invalid(e.0))?;
        let state = scratch.snapshot();
        let outcome = tokio::task::spawn_blocking(move || scheduler.compute(&state, &eval, now))
            .await
            .map_err(|e| EndpointError::Internal(format!("scheduler failed: {e}")))?;

        let annotations = outcome.annotations.or(outcome.plan.annotations);
        let diff = diff.then(|| job_diff(old.as_deref(), &job, annotations.as_ref()));
        let failed = outcome.eval_update.failed_tg_allocs;
        Ok(JobPlanResponse {
            annotations,
            failed_tg_allocs: (!failed.is_empty()).then_some(failed),
            job_modify_index: index,
            created_evals: (!outcome.new_evals.is_empty()).then_some(outcome.new_evals),
            diff,
            next_periodic_launch: Timestamp::ZERO,
            warnings: String::new(),
            index,
        })
    }
}
