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
    /// Next launch of an active periodic job (Go's zero time otherwise).
    pub next_periodic_launch: Timestamp,
    /// Warnings.
    pub warnings: String,
    /// Index of the state the plan was made at.
    pub index: u64,
}

/// When the leader would launch `job` next, from `now` (Nomad's plan answers the same).
fn next_periodic_launch(job: &Job, now: Timestamp) -> Timestamp {
    let next = job
        .periodic
        .as_ref()
        .filter(|_| job.is_periodic_active())
        .and_then(|p| crate::leader::periodic::next_launch(p, now.unix_nanos()).ok().flatten());
    next.map_or(Timestamp::ZERO, Timestamp::from_unix_nanos)
}

impl Endpoints {
    /// `Job.Plan`. `diff` adds a field-level diff against the stored job.
    pub async fn job_plan(&self, mut job: Job, diff: bool) -> Result<JobPlanResponse, EndpointError> {
        super::job::admit_job(&mut job, &self.config)?;
        self.plan_admitted(job, diff).await
    }

    /// `Job.Plan` for a job [`super::job::admit_job`] accepted. A dry run: nothing is written,
    /// to Raft or to Consul (no gateway config entries).
    pub(crate) async fn plan_admitted(&self, job: Job, diff: bool) -> Result<JobPlanResponse, EndpointError> {
        let scheduler =
            self.scheduler.clone().ok_or_else(|| EndpointError::Internal("job plan is unavailable: no scheduler is configured".into()))?;
        let snap = self.store.snapshot();
        if snap.namespace(&job.namespace).is_none() {
            return Err(EndpointError::Invalid(format!("job {:?} is in nonexistent namespace {:?}", job.id, job.namespace)));
        }
        let old = snap.job(&job.namespace, &job.id).cloned();
        let index = old.as_ref().map_or(0, |j| j.job_modify_index);
        let now = self.now();

        // Substitute the job in a private copy of the state; the scheduler sees it as registered.
        let scratch = StateStore::new();
        scratch.restore(snap.clone());
        let scratch_index = snap.index + 1;
        let mut eval = Evaluation::for_job(&job, trigger::JOB_REGISTER, now);
        eval.status = EvalStatus::Pending;
        eval.annotate_plan = true;
        let planned_job = job.clone();
        // The diff is against the job as the state stores it: what the servers set (scaling
        // policy IDs) is then the same as in the stored version.
        let (eval, planned) = scratch
            .write(scratch_index, |tx| {
                let stored = tx.upsert_job(planned_job)?;
                eval.job_modify_index = stored.job_modify_index;
                tx.upsert_evals(vec![eval.clone()]);
                Ok((eval, stored))
            })
            .map_err(|e| EndpointError::Invalid(e.0))?;
        let state = scratch.snapshot();
        let outcome = tokio::task::spawn_blocking(move || scheduler.compute(&state, &eval, now))
            .await
            .map_err(|e| EndpointError::Internal(format!("scheduler failed: {e}")))?;

        let annotations = outcome.annotations.or(outcome.plan.annotations);
        let diff = diff.then(|| job_diff(old.as_deref(), &planned, annotations.as_ref()));
        let failed = outcome.eval_update.failed_tg_allocs;
        Ok(JobPlanResponse {
            annotations,
            failed_tg_allocs: (!failed.is_empty()).then_some(failed),
            job_modify_index: index,
            created_evals: (!outcome.new_evals.is_empty()).then_some(outcome.new_evals),
            diff,
            next_periodic_launch: next_periodic_launch(&job, now),
            warnings: String::new(),
            index,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::JobLimits;

    use super::*;
    use crate::consensus::Consensus;
    use crate::endpoints::{DrainRequest, DrainSpec, EndpointConfig};
    use crate::fsm::{Command, PlanApply};
    use crate::testing::{TestServer, job, node};

    /// Endpoints over `ts`'s state with `config`, the built-in scheduler and `clock`.
    fn endpoints(ts: &TestServer, config: EndpointConfig, clock: super::super::Clock) -> Endpoints {
        Endpoints::new(ts.store.clone(), ts.consensus.clone(), ts.endpoints.heartbeats().clone(), config)
            .with_scheduler(Arc::new(crate::scheduler::BuiltinScheduler))
            .with_clock(clock)
    }

    /// Issue 11: with `job_max_count` raised to 2^31, planning such a count on one node used to
    /// allocate per unit of count (48 GB) and abort the server; it now costs what fits.
    #[tokio::test]
    async fn planning_a_count_of_2_pow_31_on_one_node_answers_with_what_fits() {
        let ts = TestServer::new();
        ts.register_node(crate::sim::ready_node("n1")).await;
        let count = 1i64 << 31;
        let config = EndpointConfig { job_limits: JobLimits { max_count: count }, ..EndpointConfig::default() };
        let endpoints = endpoints(&ts, config, Arc::new(Timestamp::now));
        let plan = endpoints.job_plan(job("web", count), false).await.unwrap();
        let desired = &plan.annotations.as_ref().unwrap().desired_tg_updates["web"];
        assert_eq!(desired.place, count as u64);
        let failed = &plan.failed_tg_allocs.as_ref().unwrap()["web"];
        // The fixture node (4000 MHz, 8192 MiB) takes 27 allocs of 100 MHz / 300 MiB.
        assert_eq!(failed.coalesced_failures, count - 27 - 1);
        let created = plan.created_evals.as_ref().unwrap();
        assert_eq!((created.len(), created[0].status), (1, EvalStatus::Blocked));
        // Nothing was written, and the server answers the next request.
        assert!(ts.store.snapshot().job("default", "web").is_none());
        endpoints.job_plan(job("web", 1), false).await.unwrap();
    }

    /// Issue 20: drain, eligibility, alloc stop and plan read the endpoints' clock, not the
    /// system's.
    #[tokio::test]
    async fn drain_eligibility_alloc_stop_and_plan_read_the_injected_clock() {
        let ts = TestServer::new();
        ts.register_node(node("n1")).await;
        let at = Timestamp(1_234_567_890_000_000_000);
        let endpoints = endpoints(&ts, EndpointConfig::default(), Arc::new(move || at));

        let plan = endpoints.job_plan(job("web", 1000), false).await.unwrap();
        assert_eq!(plan.created_evals.unwrap()[0].create_time, at.unix_nanos(), "the scheduler ran at the injected time");

        endpoints.node_update_eligibility("n1", "ineligible").await.unwrap();
        assert_eq!(ts.store.snapshot().node("n1").unwrap().events.last().unwrap().timestamp, at);

        let drain = DrainRequest { drain_spec: Some(DrainSpec { deadline: -1, ..DrainSpec::default() }), ..DrainRequest::default() };
        endpoints.node_update_drain("n1", drain).await.unwrap();
        let strategy = ts.store.snapshot().node("n1").unwrap().drain_strategy.clone().unwrap();
        assert_eq!((strategy.started_at, strategy.force_deadline), (at, at));

        let alloc = nomad_proto::Allocation {
            id: "a1".into(),
            namespace: "default".into(),
            job_id: "web".into(),
            node_id: "n1".into(),
            task_group: "web".into(),
            ..nomad_proto::Allocation::default()
        };
        let apply = PlanApply {
            job: None,
            allocs_upserted: vec![alloc],
            allocs_stopped: vec![],
            eval: None,
            evals: vec![],
            now: at,
            ..PlanApply::default()
        };
        ts.consensus.apply(Command::PlanApply(apply)).await.unwrap();
        let stop = endpoints.alloc_stop("a1", false).await.unwrap();
        assert_eq!(ts.store.snapshot().eval(&stop.eval_id).unwrap().create_time, at.unix_nanos());
    }
}
