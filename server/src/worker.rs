//! Scheduler workers: dequeue an eval, plan on a snapshot, submit the plan.
//!
//! ```text
//!  broker ──dequeue──▶ wait for state ≥ eval index ──▶ compute (blocking pool) ──▶ plan applier
//!     ▲                        ▲                                                    │
//!     └──ack / nack────────────┴──────── refused in part: plan again at refresh index
//! ```
//!
//! `compute` is CPU work with no I/O, so it runs on tokio's blocking pool and
//! never stalls the tasks that move evals and plans. After a partial refusal
//! the worker plans again on a state at least at the refresh index; after
//! too many attempts without progress the eval fails and a blocked eval
//! (`max-plan-attempts`) is left to retry it later.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::eval::trigger;
use nomad_proto::{EvalStatus, Evaluation, JobType, Timestamp};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Instrument;

use crate::broker::{BrokerError, Delivery, EvalBroker};
use crate::plan_apply::{PlanError, PlanQueue, PlanSubmission};
use crate::scheduler::{ScheduleOutcome, Scheduler};
use crate::state::{State, StateStore, Table};

/// Worker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// Longest wait for the local state to reach an eval's index before nacking it.
    pub index_wait: Duration,
    /// Plans refused without progress before a service or system eval fails.
    pub max_plan_attempts: u32,
    /// The same for batch and sysbatch evals.
    pub max_batch_plan_attempts: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        // Nomad: raftSyncLimit 5s; 5 service/system attempts, 2 batch.
        WorkerConfig { index_wait: Duration::from_secs(5), max_plan_attempts: 5, max_batch_plan_attempts: 2 }
    }
}

/// Status description of an eval that ran out of plan attempts.
pub fn max_attempts_description(attempts: u32) -> String {
    format!("maximum attempts reached ({attempts})")
}

/// One scheduler worker.
pub struct Worker {
    broker: Arc<EvalBroker>,
    store: Arc<StateStore>,
    scheduler: Arc<dyn Scheduler>,
    plans: PlanQueue,
    config: WorkerConfig,
    compute_slots: Arc<Semaphore>,
}

impl Worker {
    /// A worker taking evals from `broker` and submitting plans to `plans`.
    /// `compute_slots` bounds how many workers run the scheduler at once (the
    /// cores to use); the others meanwhile wait for their plans' results.
    pub fn new(
        broker: Arc<EvalBroker>,
        store: Arc<StateStore>,
        scheduler: Arc<dyn Scheduler>,
        plans: PlanQueue,
        config: WorkerConfig,
        compute_slots: Arc<Semaphore>,
    ) -> Worker {
        Worker { broker, store, scheduler, plans, config, compute_slots }
    }

    /// Processes evals until the broker is disabled.
    pub async fn run(self) {
        loop {
            match self.broker.dequeue(Duration::from_secs(60)).await {
                Err(BrokerError::Disabled) | Err(_) => return,
                Ok(None) => continue,
                Ok(Some(d)) => {
                    let span = tracing::debug_span!("eval", eval_id = %d.eval.id, job_id = %d.eval.job_id);
                    self.process(d).instrument(span).await
                }
            }
        }
    }

    async fn process(&self, d: Delivery) {
        let eval = d.eval.clone();
        let max_attempts = match eval.eval_type {
            JobType::Batch | JobType::Sysbatch => self.config.max_batch_plan_attempts,
            _ => self.config.max_plan_attempts,
        };
        let mut min_index = eval.modify_index;
        let mut attempts = 0;
        loop {
            let Some(snap) = self.snapshot_at_least(min_index).await else {
                tracing::warn!(min_index, "state did not reach the eval's index in time");
                let _ = self.broker.nack(&eval.id, &d.token);
                return;
            };
            let snapshot_index = snap.index;
            let Some(outcome) = self.compute(snap, eval.clone()).await else {
                let _ = self.broker.nack(&eval.id, &d.token);
                return;
            };
            let last_blocked = outcome.new_evals.iter().find(|e| e.status == EvalStatus::Blocked).cloned();
            let sub = submission(&eval, &d.token, snapshot_index, outcome);
            let result = match self.plans.submit(sub).await {
                Ok(r) => r,
                // Someone else holds the eval now; their delivery will finish it.
                Err(PlanError::Token(_)) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "plan submission failed");
                    let _ = self.broker.nack(&eval.id, &d.token);
                    return;
                }
            };
            if result.refresh_index == 0 {
                let _ = self.broker.ack(&eval.id, &d.token);
                return;
            }
            let progress = !result.node_allocation.is_empty() || !result.node_update.is_empty();
            attempts = if progress { 0 } else { attempts + 1 };
            if attempts >= max_attempts {
                self.give_up(&eval, &d.token, snapshot_index, attempts, last_blocked).await;
                return;
            }
            min_index = result.refresh_index;
        }
    }

    /// The state at `min_index` or later, waiting up to the index wait.
    async fn snapshot_at_least(&self, min_index: u64) -> Option<State> {
        let deadline = Instant::now() + self.config.index_wait;
        loop {
            let snap = self.store.snapshot();
            if snap.index >= min_index {
                return Some(snap);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            self.store.wait_for_change(&Table::ALL, snap.index, deadline - now).await;
        }
    }

    async fn compute(&self, snap: State, eval: Arc<Evaluation>) -> Option<ScheduleOutcome> {
        let scheduler = self.scheduler.clone();
        let _slot = self.compute_slots.acquire().await.ok()?;
        match tokio::task::spawn_blocking(move || scheduler.compute(&snap, &eval, Timestamp::now())).await {
            Ok(outcome) => Some(outcome),
            Err(e) => {
                tracing::error!(error = %e, "scheduler failed");
                None
            }
        }
    }

    /// Too many refused plans: the eval fails, and a blocked eval retries the job later.
    async fn give_up(&self, eval: &Evaluation, token: &str, snapshot_index: u64, attempts: u32, last_blocked: Option<Evaluation>) {
        let sub = give_up_submission(eval, token, snapshot_index, attempts, last_blocked);
        match self.plans.submit(sub).await {
            Ok(_) => {
                let _ = self.broker.ack(&eval.id, token);
            }
            Err(PlanError::Token(_)) => {}
            Err(_) => {
                let _ = self.broker.nack(&eval.id, token);
            }
        }
    }
}

/// What a worker submits when an eval ran out of plan attempts: the eval
/// `failed`, and a `blocked` eval (`max-plan-attempts`, keeping what the
/// last blocked eval learned) that retries the job later.
pub fn give_up_submission(
    eval: &Evaluation,
    token: &str,
    snapshot_index: u64,
    attempts: u32,
    last_blocked: Option<Evaluation>,
) -> PlanSubmission {
    let now = Timestamp::now().unix_nanos();
    let mut blocked = Evaluation {
        id: nomad_proto::new_id(),
        namespace: eval.namespace.clone(),
        priority: eval.priority,
        eval_type: eval.eval_type,
        triggered_by: trigger::MAX_PLANS.to_string(),
        job_id: eval.job_id.clone(),
        job_modify_index: eval.job_modify_index,
        status: EvalStatus::Blocked,
        status_description: "created due to placement conflicts".to_string(),
        previous_eval: eval.id.clone(),
        escaped_computed_class: true,
        snapshot_index,
        create_time: now,
        modify_time: now,
        ..Evaluation::default()
    };
    if let Some(b) = last_blocked {
        blocked.class_eligibility = b.class_eligibility;
        blocked.escaped_computed_class = b.escaped_computed_class;
        blocked.failed_tg_allocs = b.failed_tg_allocs;
    }
    let mut failed = eval.clone();
    failed.status = EvalStatus::Failed;
    failed.status_description = max_attempts_description(attempts);
    failed.blocked_eval = blocked.id.clone();
    failed.snapshot_index = snapshot_index;
    failed.modify_time = now;
    let mut plan = nomad_proto::Plan { eval_id: eval.id.clone(), eval_token: token.to_string(), snapshot_index, ..Default::default() };
    plan.priority = eval.priority;
    PlanSubmission { plan, eval_update: Some(failed), new_evals: vec![blocked] }
}

/// The plan and eval writes of one scheduler run, stamped for the applier.
pub fn submission(eval: &Evaluation, token: &str, snapshot_index: u64, outcome: ScheduleOutcome) -> PlanSubmission {
    let now = Timestamp::now().unix_nanos();
    let mut plan = outcome.plan;
    plan.eval_id = eval.id.clone();
    plan.eval_token = token.to_string();
    plan.snapshot_index = snapshot_index;
    if plan.priority == 0 {
        plan.priority = eval.priority;
    }
    let mut update = outcome.eval_update;
    if update.id.is_empty() {
        update = eval.clone();
        update.status = EvalStatus::Complete;
    }
    update.id = eval.id.clone();
    update.snapshot_index = snapshot_index;
    update.modify_time = now.max(update.create_time + 1);
    let new_evals = outcome
        .new_evals
        .into_iter()
        .map(|mut e| {
            if e.snapshot_index == 0 {
                e.snapshot_index = snapshot_index;
            }
            if e.create_time == 0 {
                e.create_time = now;
            }
            if e.modify_time == 0 {
                e.modify_time = now;
            }
            e
        })
        .collect();
    PlanSubmission { plan, eval_update: Some(update), new_evals }
}
