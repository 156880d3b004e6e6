//! The deployment watcher (Nomad's `nomad/deploymentwatcher/`): while this server leads, it
//! follows every active deployment and
//! - evaluates the job again when its allocs' health changes, so the next batch goes;
//! - fails it ("Failed due to unhealthy allocations") when an alloc turns unhealthy in a group
//!   whose `progress_deadline` is 0;
//! - fails it ("Failed due to progress deadline") when a group that is not done has made no
//!   progress by its `RequireProgressBy`;
//! - reverts the job to its newest stable version when a failing group has `auto_revert`;
//! - promotes its canaries once every canary group has `auto_promote` and all its canaries are
//!   placed and healthy.
//!
//! Health changes reach it as writes to the deployments table (the state counts each alloc's
//! health into its deployment), so it wakes on those, and on the earliest deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::deployment::{alloc_health, description, status};
use nomad_proto::eval::trigger;
use nomad_proto::{Deployment, DeploymentStatusUpdate, Evaluation, Job, Timestamp};

use crate::consensus::Consensus;
use crate::fsm::Command;
use crate::state::{State, StateStore, Table};

/// How long it sleeps with no deadline ahead before looking again.
const IDLE_WAIT: Duration = Duration::from_secs(300);

/// The least time between two looks: every alloc placed in a deployment changes it, and a busy
/// scheduler must not pay for a look per plan (Nomad batches its watchers' evals likewise).
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(100);

/// Per group: (healthy, unhealthy) counts last seen.
pub type Seen = Vec<(String, i64, i64)>;

/// What the watcher saw of one deployment: its modify index then, and its counts.
pub type SeenDeployment = (u64, Seen);

/// What the watcher decided about one deployment.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Health changed: evaluate the job.
    Evaluate,
    /// Fail it with this description (and evaluate the job); revert the job if a failing
    /// group has `auto_revert`.
    Fail {
        /// Why.
        desc: &'static str,
        /// Revert to the newest stable version.
        rollback: bool,
    },
    /// Promote every group's canaries.
    Promote,
}

/// The watcher's decision for `d` at `now`, given the counts it saw last (`None`: first look).
pub fn decide(d: &Deployment, seen: Option<&Seen>, now: Timestamp) -> Option<Action> {
    let counts = counts(d);
    let changed = match seen {
        Some(s) => s != &counts,
        None => counts.iter().any(|(_, h, u)| h + u > 0),
    };
    if d.status != status::RUNNING {
        // Paused: nothing fails it or moves it on until it is resumed.
        return None;
    }
    let unhealthy_grew = counts.iter().any(|(g, _, u)| {
        let before = seen.and_then(|s| s.iter().find(|(sg, _, _)| sg == g)).map_or(0, |(_, _, su)| *su);
        *u > before
    });
    let failing: Vec<&nomad_proto::DeploymentState> =
        d.task_groups.values().filter(|g| g.unhealthy_allocs > 0 && g.progress_deadline == 0).collect();
    if unhealthy_grew && !failing.is_empty() {
        return Some(Action::Fail { desc: description::FAILED_ALLOCATIONS, rollback: failing.iter().any(|g| g.auto_revert) });
    }
    let late: Vec<&nomad_proto::DeploymentState> = d.task_groups.values().filter(|g| past_group_deadline(g, now)).collect();
    if !late.is_empty() {
        return Some(Action::Fail { desc: description::PROGRESS_DEADLINE, rollback: late.iter().any(|g| g.auto_revert) });
    }
    changed.then_some(Action::Evaluate)
}

/// A group short of healthy allocs is past its `RequireProgressBy`.
fn past_deadline(d: &Deployment, now: Timestamp) -> bool {
    d.task_groups.values().any(|g| past_group_deadline(g, now))
}

fn past_group_deadline(g: &nomad_proto::DeploymentState, now: Timestamp) -> bool {
    let done = g.healthy_allocs >= g.desired_total.max(g.desired_canaries);
    !done && !g.require_progress_by.is_zero() && g.require_progress_by <= now
}

/// Every canary group promotes automatically and has all its canaries placed and healthy
/// (Nomad's `autoPromoteDeployment`).
pub fn ready_for_auto_promotion(state: &State, d: &Deployment) -> bool {
    if !d.requires_promotion() || !d.has_auto_promote() {
        return false;
    }
    d.task_groups.values().filter(|g| g.desired_canaries > 0).all(|g| {
        let healthy = g.placed_canaries.iter().filter_map(|id| state.alloc(id)).filter(|a| alloc_health(a) == Some(true)).count();
        g.placed_canaries.len() as i64 >= g.desired_canaries && healthy as i64 == g.desired_canaries
    })
}

/// The eval that follows a deployment change (trigger `deployment-watcher`, at the
/// deployment's priority); none once the job is gone.
pub fn deployment_eval(state: &State, d: &Deployment, now: Timestamp) -> Option<Evaluation> {
    let job = state.job(&d.namespace, &d.job_id)?;
    let mut e = Evaluation::for_job(job, trigger::DEPLOYMENT_WATCHER, now);
    e.deployment_id = d.id.clone();
    if d.eval_priority > 0 {
        e.priority = d.eval_priority;
    }
    Some(e)
}

/// The write that fails `d` with `desc`, and the job version it reverts to. With `rollback`
/// the job goes back to its newest stable version, registered again as a new version, unless
/// that version has the failed job's spec (reverting would fail the same way); the
/// description says which (Nomad's `FailDeployment` and `handleRollbackValidity`).
pub fn fail(state: &State, d: &Deployment, desc: &str, rollback: bool, now: Timestamp) -> (Command, Option<u64>) {
    let mut description = desc.to_string();
    let mut revert_to: Option<Box<Job>> = None;
    if rollback {
        let current = state.job(&d.namespace, &d.job_id);
        match state.job_versions(&d.namespace, &d.job_id).iter().find(|j| j.stable) {
            Some(stable) if current.is_some_and(|c| c.spec_changed(stable)) => {
                description = description::rollback(desc, stable.version);
                let mut job = (**stable).clone();
                job.submit_time = now.unix_nanos();
                revert_to = Some(Box::new(job));
            }
            Some(stable) => description = description::rollback_noop(desc, stable.version),
            None => description = description::no_rollback_target(desc),
        }
    }
    let reverted = revert_to.as_ref().map(|j| j.version);
    let update =
        DeploymentStatusUpdate { deployment_id: d.id.clone(), status: status::FAILED.to_string(), status_description: description };
    (Command::DeploymentStatusUpdate { update, eval: deployment_eval(state, d, now), revert_to }, reverted)
}

fn counts(d: &Deployment) -> Seen {
    d.task_groups.iter().map(|(g, s)| (g.clone(), s.healthy_allocs, s.unhealthy_allocs)).collect()
}

/// The next deadline among the running deployments' unfinished groups.
fn next_deadline(state: &State) -> Option<Timestamp> {
    state
        .deployments()
        .filter(|d| d.status == status::RUNNING)
        .flat_map(|d| d.task_groups.values())
        .filter(|g| g.healthy_allocs < g.desired_total.max(g.desired_canaries) && !g.require_progress_by.is_zero())
        .map(|g| g.require_progress_by)
        .min()
}

/// The watcher of one term of leadership.
pub struct DeploymentWatcher {
    store: Arc<StateStore>,
    consensus: Arc<dyn Consensus>,
    seen: HashMap<String, SeenDeployment>,
}

impl DeploymentWatcher {
    /// A watcher over the store, writing through consensus.
    pub fn new(store: Arc<StateStore>, consensus: Arc<dyn Consensus>) -> DeploymentWatcher {
        DeploymentWatcher { store, consensus, seen: HashMap::new() }
    }

    /// Runs until dropped (leadership lost).
    pub async fn run(mut self) {
        loop {
            let started = tokio::time::Instant::now();
            let snap = self.store.snapshot();
            let index = snap.table_index(Table::Deployments);
            self.pass(&snap, Timestamp::now()).await;
            let wait = next_deadline(&snap).map_or(IDLE_WAIT, |t| {
                let ahead = t.unix_nanos().saturating_sub(Timestamp::now().unix_nanos()).max(0);
                Duration::from_nanos(ahead as u64).min(IDLE_WAIT)
            });
            // Wake a moment after the deadline so it has passed when looked at.
            let wait = wait + Duration::from_millis(5);
            self.store.blocking_query(&[Table::Deployments], index.max(1), wait, |s| ((), s.table_index(Table::Deployments))).await;
            tokio::time::sleep_until(started + MIN_PASS_INTERVAL).await;
        }
    }

    /// One look at every active deployment.
    pub async fn pass(&mut self, state: &State, now: Timestamp) {
        for (id, cmd) in writes(state, &mut self.seen, now) {
            if let Err(e) = self.consensus.apply(cmd).await {
                tracing::warn!(deployment = %id, error = %e, "deployment watcher write failed");
                // Look again next pass.
                self.seen.remove(&id);
            }
        }
    }
}

/// What one look at every active deployment writes (by deployment ID), given the counts seen
/// before (updated here). Pure, so simulations run the watcher's decisions too.
pub fn writes(state: &State, seen: &mut HashMap<String, SeenDeployment>, now: Timestamp) -> Vec<(String, Command)> {
    seen.retain(|id, _| state.deployment(id).is_some_and(|d| d.active()));
    let mut out = Vec::new();
    for d in state.deployments().filter(|d| d.active()) {
        let before = seen.get(&d.id);
        // Unchanged since the last look: only a deadline can have come.
        let unchanged = before.is_some_and(|(index, _)| *index == d.modify_index);
        if unchanged && !past_deadline(d, now) {
            continue;
        }
        let action = match decide(d, before.map(|(_, counts)| counts), now) {
            fail @ Some(Action::Fail { .. }) => fail,
            _ if d.status == status::RUNNING && ready_for_auto_promotion(state, d) => Some(Action::Promote),
            other => other,
        };
        seen.insert(d.id.clone(), (d.modify_index, counts(d)));
        let Some(action) = action else { continue };
        let cmd = match action {
            Action::Evaluate => match deployment_eval(state, d, now) {
                Some(e) => Command::EvalUpsert { evals: vec![e] },
                None => continue,
            },
            Action::Fail { desc, rollback } => {
                let (cmd, reverted) = fail(state, d, desc, rollback, now);
                tracing::info!(deployment = %d.id, job = %d.job_id, reason = desc, reverted_to = ?reverted, "deployment failed");
                cmd
            }
            Action::Promote => {
                tracing::info!(deployment = %d.id, job = %d.job_id, "deployment auto-promoted");
                Command::DeploymentPromotion {
                    deployment_id: d.id.clone(),
                    all: true,
                    groups: Vec::new(),
                    eval: deployment_eval(state, d, now),
                    now,
                }
            }
        };
        out.push((d.id.clone(), cmd));
    }
    out
}

#[cfg(test)]
mod tests {
    use nomad_proto::{DeploymentState, Job};

    use super::*;

    const S: i64 = 1_000_000_000;

    fn deployment(healthy: i64, unhealthy: i64, progress_deadline: i64, require_by: i64) -> Deployment {
        let mut d = Deployment::new("d1".into(), &Job::default(), 50);
        d.task_groups.insert(
            "web".into(),
            DeploymentState {
                desired_total: 2,
                healthy_allocs: healthy,
                unhealthy_allocs: unhealthy,
                progress_deadline,
                require_progress_by: Timestamp::from_unix_nanos(require_by),
                ..DeploymentState::default()
            },
        );
        d
    }

    #[test]
    fn health_changes_evaluate_and_unhealthy_allocs_or_deadlines_fail() {
        let now = Timestamp::from_unix_nanos(100 * S);
        // First look: nothing decided yet is nothing to do; something decided is evaluated.
        assert_eq!(decide(&deployment(0, 0, 600 * S, 700 * S), None, now), None);
        assert_eq!(decide(&deployment(1, 0, 600 * S, 700 * S), None, now), Some(Action::Evaluate));
        let seen = counts(&deployment(1, 0, 600 * S, 700 * S));
        assert_eq!(decide(&deployment(1, 0, 600 * S, 700 * S), Some(&seen), now), None, "no change");
        assert_eq!(decide(&deployment(2, 0, 600 * S, 700 * S), Some(&seen), now), Some(Action::Evaluate));
        // Unhealthy with a progress deadline: evaluate (the reconciler holds the rollout).
        assert_eq!(decide(&deployment(1, 1, 600 * S, 700 * S), Some(&seen), now), Some(Action::Evaluate));
        // Without one: fail at once.
        assert_eq!(
            decide(&deployment(1, 1, 0, 0), Some(&seen), now),
            Some(Action::Fail { desc: "Failed due to unhealthy allocations", rollback: false })
        );
        // The deadline passed with a group short of healthy allocs.
        assert_eq!(
            decide(&deployment(1, 0, 600 * S, 100 * S), Some(&seen), now),
            Some(Action::Fail { desc: "Failed due to progress deadline", rollback: false })
        );
        // A failing group with auto_revert asks for the revert.
        let mut reverting = deployment(1, 0, 600 * S, 100 * S);
        reverting.task_groups.get_mut("web").unwrap().auto_revert = true;
        assert_eq!(decide(&reverting, Some(&seen), now), Some(Action::Fail { desc: "Failed due to progress deadline", rollback: true }));
        // Done groups are past their deadline harmlessly.
        assert_eq!(decide(&deployment(2, 0, 600 * S, 50 * S), Some(&counts(&deployment(2, 0, 0, 0))), now), None);
        // Paused: nothing.
        let mut paused = deployment(1, 0, 600 * S, 100 * S);
        paused.status = status::PAUSED.into();
        assert_eq!(decide(&paused, Some(&seen), now), None);
    }
}
