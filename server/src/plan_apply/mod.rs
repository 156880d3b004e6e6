//! The plan applier: the one writer of placements, on the leader.
//!
//! ```text
//!  workers ──submit──▶ queue ──▶ [evaluate batch N+1 vs state + entry N] ──▶ one PlanApply(Batch) entry
//!                                        ▲                                         │
//!                                        └──────── entry N being written ◀─────────┘
//! ```
//!
//! Plans are judged one at a time, in order, each against the newest state
//! plus everything accepted before it, so two plans racing for one node
//! cannot both fill it. Plans that queue while an entry is being written go
//! into the next entry together (one fsync for many plans), and they are
//! judged while the previous entry is still being written, assuming it will
//! commit; if it does not, they are sent back to be planned again.

mod evaluate;
mod fit;

use std::sync::Arc;

use nomad_proto::{Allocation, ClientStatus, Evaluation, Plan, PlanResult, Timestamp};
use tokio::sync::{mpsc, oneshot};

pub use evaluate::{Overlay, accepted_nodes, evaluate_node_plan, evaluate_plan, refresh_index, take_accepted};
pub use fit::{Held, Usage, alloc_usage, allocs_fit, fits, node_capacity};

use crate::broker::{BrokerError, EvalBroker};
use crate::consensus::{ApplyError, Consensus};
use crate::fsm::{AllocStop, Command, PlanApply};
use crate::state::StateStore;

/// What a worker submits: the plan and the eval writes that go with it.
#[derive(Debug, Clone, Default)]
pub struct PlanSubmission {
    /// The plan, with `eval_id`, `eval_token` and `snapshot_index` set.
    pub plan: Plan,
    /// The eval as it should be stored, written only if the whole plan commits.
    pub eval_update: Option<Evaluation>,
    /// Evals to create with it (blocked, follow-ups), likewise.
    pub new_evals: Vec<Evaluation>,
}

/// Why a plan was not judged or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The submitter no longer holds the eval (its delivery timed out or the leader changed).
    #[error("{0}")]
    Token(#[from] BrokerError),
    /// The write failed; nothing of the plan was committed.
    #[error("{0}")]
    Apply(#[from] ApplyError),
    /// The applier stopped (leadership lost).
    #[error("plan applier stopped")]
    Stopped,
}

/// Checks that a plan comes from the current delivery of its eval.
pub trait EvalTokens: Send + Sync + 'static {
    /// Verifies the token and stops its nack timer while the plan is queued.
    fn pause(&self, eval_id: &str, token: &str) -> Result<(), BrokerError>;
    /// Restarts the nack timer.
    fn resume(&self, eval_id: &str, token: &str);
    /// Verifies the token.
    fn check(&self, eval_id: &str, token: &str) -> Result<(), BrokerError>;
}

impl EvalTokens for EvalBroker {
    fn pause(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        self.pause_nack_timeout(eval_id, token)
    }

    fn resume(&self, eval_id: &str, token: &str) {
        let _ = self.resume_nack_timeout(eval_id, token);
    }

    fn check(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        match self.outstanding(eval_id) {
            None => Err(BrokerError::NotOutstanding),
            Some(t) if t != token => Err(BrokerError::TokenMismatch),
            Some(_) => Ok(()),
        }
    }
}

/// Plan applier settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanApplierConfig {
    /// Most plans written in one entry (1: no batching).
    pub max_plans_per_entry: usize,
    /// Judge the next plans while an entry is being written.
    pub pipeline: bool,
}

impl Default for PlanApplierConfig {
    fn default() -> Self {
        PlanApplierConfig { max_plans_per_entry: 64, pipeline: true }
    }
}

type Reply = oneshot::Sender<Result<PlanResult, PlanError>>;

struct Queued {
    sub: PlanSubmission,
    reply: Reply,
}

/// The submitting side of the applier. Cheap to clone.
#[derive(Clone)]
pub struct PlanQueue {
    tx: mpsc::UnboundedSender<Queued>,
    tokens: Arc<dyn EvalTokens>,
}

impl PlanQueue {
    /// Queues a plan and waits for its result.
    pub async fn submit(&self, sub: PlanSubmission) -> Result<PlanResult, PlanError> {
        let (eval_id, token) = (sub.plan.eval_id.clone(), sub.plan.eval_token.clone());
        self.tokens.pause(&eval_id, &token)?;
        let (reply, rx) = oneshot::channel();
        let result = match self.tx.send(Queued { sub, reply }) {
            Ok(()) => rx.await.unwrap_or(Err(PlanError::Stopped)),
            Err(_) => Err(PlanError::Stopped),
        };
        self.tokens.resume(&eval_id, &token);
        result
    }
}

/// Starts the applier; it runs until every [`PlanQueue`] is dropped.
pub fn spawn_plan_applier(
    store: Arc<StateStore>,
    consensus: Arc<dyn Consensus>,
    tokens: Arc<dyn EvalTokens>,
    config: PlanApplierConfig,
) -> (PlanQueue, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let applier = Applier { store, consensus, tokens: tokens.clone(), config, rx };
    (PlanQueue { tx, tokens }, tokio::spawn(applier.run()))
}

/// A judged plan waiting to be written and answered.
struct Judged {
    queued: Queued,
    result: PlanResult,
    entry: Option<PlanApply>,
}

/// An entry being written.
struct InFlight {
    overlay: Overlay,
    /// The entry's index once written, `None` if the write failed.
    done: oneshot::Receiver<Option<u64>>,
}

struct Applier {
    store: Arc<StateStore>,
    consensus: Arc<dyn Consensus>,
    tokens: Arc<dyn EvalTokens>,
    config: PlanApplierConfig,
    rx: mpsc::UnboundedReceiver<Queued>,
}

impl Applier {
    async fn run(mut self) {
        let mut in_flight: Option<InFlight> = None;
        // Highest index written so far: refusals point workers at least there.
        let mut last_index = 0u64;
        while let Some(first) = self.rx.recv().await {
            let mut queued = vec![first];
            self.drain_into(&mut queued);

            // Judge against state plus the entry being written (optimistic).
            let mut overlay = Overlay::default();
            let mut batch = Vec::new();
            {
                let state = self.store.snapshot();
                let behind: Vec<&Overlay> = in_flight.iter().map(|f| &f.overlay).collect();
                for q in queued.drain(..) {
                    batch.extend(self.judge(&state, &behind, &mut overlay, q));
                }
            }

            // One entry in flight at a time: wait for it before writing the next.
            if let Some(prev) = in_flight.take() {
                match prev.done.await {
                    Ok(Some(index)) => last_index = last_index.max(index),
                    // It did not commit: what was judged assuming it did cannot be trusted.
                    _ => batch = self.send_back(batch, &mut overlay),
                }
                // Plans that arrived meanwhile join this entry.
                let mut more = Vec::new();
                self.drain_into_limit(&mut more, batch.len());
                if !more.is_empty() {
                    let state = self.store.snapshot();
                    for q in more {
                        batch.extend(self.judge(&state, &[], &mut overlay, q));
                    }
                }
            }

            let (to_write, answer_now): (Vec<Judged>, Vec<Judged>) = batch.into_iter().partition(|j| j.entry.is_some());
            for j in answer_now {
                answer(j, last_index, false);
            }
            if to_write.is_empty() {
                continue;
            }
            let (done_tx, done_rx) = oneshot::channel();
            let consensus = self.consensus.clone();
            let write = async move {
                let index = write_entry(consensus, to_write).await;
                let _ = done_tx.send(index);
            };
            if self.config.pipeline {
                tokio::spawn(write);
                in_flight = Some(InFlight { overlay, done: done_rx });
            } else {
                write.await;
                if let Ok(Some(index)) = done_rx.await {
                    last_index = last_index.max(index);
                }
            }
        }
        if let Some(prev) = in_flight {
            let _ = prev.done.await;
        }
    }

    fn drain_into(&mut self, queued: &mut Vec<Queued>) {
        self.drain_into_limit(queued, 0);
    }

    /// Takes queued plans until the entry holds `max_plans_per_entry` (counting `already`).
    fn drain_into_limit(&mut self, queued: &mut Vec<Queued>, already: usize) {
        while already + queued.len() < self.config.max_plans_per_entry.max(1) {
            match self.rx.try_recv() {
                Ok(q) => queued.push(q),
                Err(_) => break,
            }
        }
    }

    /// Judges one plan; `None` when it was answered at once (stale token).
    fn judge(&self, state: &crate::state::State, behind: &[&Overlay], overlay: &mut Overlay, q: Queued) -> Option<Judged> {
        let Queued { mut sub, reply } = q;
        if let Err(e) = self.tokens.check(&sub.plan.eval_id, &sub.plan.eval_token) {
            let _ = reply.send(Err(e.into()));
            return None;
        }
        let layers: Vec<&Overlay> = behind.iter().copied().chain(std::iter::once(&*overlay)).collect();
        let (accepted, refused) = accepted_nodes(state, &layers, &sub.plan);
        // The accepted allocs move into the result; the plan is not needed again.
        let result = take_accepted(state, &mut sub.plan, &accepted, refused);
        overlay.add(&result);
        let entry = entry_for(&sub, &result, Timestamp::now());
        Some(Judged { queued: Queued { sub, reply }, result, entry })
    }

    /// The entry a batch was judged against did not commit: nothing of the
    /// batch is written, and every plan is sent back to be made again on newer state.
    fn send_back(&self, batch: Vec<Judged>, overlay: &mut Overlay) -> Vec<Judged> {
        *overlay = Overlay::default();
        let refresh = refresh_index(&self.store.snapshot()).max(1);
        batch
            .into_iter()
            .map(|j| Judged { queued: j.queued, result: PlanResult { refresh_index: refresh, ..PlanResult::default() }, entry: None })
            .collect()
    }
}

/// Writes one entry for the judged plans and answers them; returns its index.
async fn write_entry(consensus: Arc<dyn Consensus>, mut judged: Vec<Judged>) -> Option<u64> {
    let mut entries: Vec<PlanApply> = judged.iter_mut().filter_map(|j| j.entry.take()).collect();
    let cmd = if entries.len() == 1 { Command::PlanApply(entries.pop().expect("one entry")) } else { Command::PlanApplyBatch(entries) };
    match consensus.apply(cmd).await {
        Ok(index) => {
            for j in judged {
                answer(j, index, true);
            }
            Some(index)
        }
        Err(e) => {
            tracing::error!(error = %e, "failed to apply plans");
            for j in judged {
                let _ = j.queued.reply.send(Err(PlanError::Apply(e.clone())));
            }
            None
        }
    }
}

/// Answers a plan whose part was written at `index` (`written`), or that
/// needed no write (`index` is then the newest entry written).
fn answer(j: Judged, index: u64, written: bool) {
    let mut result = j.result;
    if written {
        result.alloc_index = index;
    }
    // The worker must at least see what this entry (and the ones before it) placed.
    if result.refresh_index != 0 {
        result.refresh_index = result.refresh_index.max(index);
    }
    let _ = j.queued.reply.send(Ok(result));
}

/// The entry for a judged plan: what was accepted, plus the eval writes if
/// everything was, stamped `now`. `None` when there is nothing to write.
pub fn entry_for(sub: &PlanSubmission, result: &PlanResult, now: Timestamp) -> Option<PlanApply> {
    let complete = result.refresh_index == 0;
    let plan = &sub.plan;
    let job = plan.job.as_ref();
    let allocs_upserted: Vec<Allocation> = result
        .node_allocation
        .values()
        .flatten()
        .map(|a| {
            let mut a = a.clone();
            // The entry carries the job once; the FSM gives it back to each alloc.
            if let (Some(aj), Some(pj)) = (&a.job, job)
                && (Arc::ptr_eq(aj, pj) || (aj.version == pj.version && aj.job_modify_index == pj.job_modify_index && aj.id == pj.id))
            {
                a.job = None;
            }
            a
        })
        .collect();
    let allocs_stopped: Vec<AllocStop> =
        result.node_update.values().chain(result.node_preemptions.values()).flatten().map(stop_of).collect();
    let (eval, evals) = if complete { (sub.eval_update.clone(), sub.new_evals.clone()) } else { (None, Vec::new()) };
    let (deployment, deployment_updates) = (plan.deployment.clone().map(Box::new), plan.deployment_updates.clone());
    if allocs_upserted.is_empty()
        && allocs_stopped.is_empty()
        && eval.is_none()
        && evals.is_empty()
        && deployment.is_none()
        && deployment_updates.is_empty()
    {
        return None;
    }
    Some(PlanApply {
        job: (!allocs_upserted.is_empty()).then(|| job.map(|j| (**j).clone())).flatten(),
        allocs_upserted,
        allocs_stopped,
        eval,
        evals,
        now,
        deployment,
        deployment_updates,
    })
}

/// A stop as the log carries it. Only the scheduler's `lost`/`unknown`
/// override the client's status; otherwise the client's report stands.
fn stop_of(a: &Allocation) -> AllocStop {
    AllocStop {
        alloc_id: a.id.clone(),
        desired_description: a.desired_description.clone(),
        client_status: matches!(a.client_status, ClientStatus::Lost | ClientStatus::Unknown).then_some(a.client_status),
        followup_eval_id: a.followup_eval_id.clone(),
    }
}

#[cfg(test)]
mod tests;
