//! Plans: what a scheduler run wants to change (`structs.Plan`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::alloc::Allocation;
use crate::job::Job;

/// The outcome of one scheduler run, submitted to the plan applier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Plan {
    /// Eval that produced it.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Token proving the worker still holds the eval.
    pub eval_token: String,
    /// Priority.
    pub priority: i64,
    /// All placements or none.
    pub all_at_once: bool,
    /// Job version planned against (absent when the job is purged).
    pub job: Option<Arc<Job>>,
    /// Allocs to stop or update in place, per node.
    pub node_update: BTreeMap<String, Vec<Allocation>>,
    /// Allocs to place (or rewrite whole, e.g. marked unknown), per node.
    pub node_allocation: BTreeMap<String, Vec<Allocation>>,
    /// Annotations for `job plan`.
    pub annotations: Option<PlanAnnotations>,
    /// Allocs to preempt, per node.
    pub node_preemptions: BTreeMap<String, Vec<Allocation>>,
    /// State index the plan was computed at.
    pub snapshot_index: u64,
    /// A deployment the plan creates.
    pub deployment: Option<crate::Deployment>,
    /// Status changes of deployments (cancelled, successful).
    pub deployment_updates: Vec<crate::DeploymentStatusUpdate>,
}

impl Plan {
    /// Nothing to change.
    pub fn is_no_op(&self) -> bool {
        self.node_update.values().all(Vec::is_empty)
            && self.node_allocation.values().all(Vec::is_empty)
            && self.node_preemptions.values().all(Vec::is_empty)
            && self.deployment.is_none()
            && self.deployment_updates.is_empty()
    }
}

/// What `job plan` shows per group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PlanAnnotations {
    /// Per group.
    #[serde(rename = "DesiredTGUpdates")]
    pub desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    /// Allocs that would be preempted.
    pub preempted_allocs: Vec<serde_json::Value>,
}

/// Counts of what would happen to a group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DesiredUpdates {
    /// Left alone.
    pub ignore: u64,
    /// Placed.
    pub place: u64,
    /// Migrated.
    pub migrate: u64,
    /// Stopped.
    pub stop: u64,
    /// Updated in place.
    pub in_place_update: u64,
    /// Replaced.
    pub destructive_update: u64,
    /// Canaries.
    pub canary: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Reconnected.
    pub reconnect_updates: u64,
    /// Marked unknown.
    pub disconnect_updates: u64,
}

/// The result of applying a plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PlanResult {
    /// Stops and updates committed.
    pub node_update: BTreeMap<String, Vec<Allocation>>,
    /// Placements committed.
    pub node_allocation: BTreeMap<String, Vec<Allocation>>,
    /// Preemptions committed.
    pub node_preemptions: BTreeMap<String, Vec<Allocation>>,
    /// Newer state index the worker must catch up to before re-planning (0: all committed).
    pub refresh_index: u64,
    /// Raft index of the commit.
    pub alloc_index: u64,
}

impl PlanResult {
    /// True when everything the plan asked for was committed.
    pub fn fully_committed(&self, plan: &Plan) -> bool {
        let count = |m: &BTreeMap<String, Vec<Allocation>>| m.values().map(Vec::len).sum::<usize>();
        count(&self.node_update) == count(&plan.node_update) && count(&self.node_allocation) == count(&plan.node_allocation)
    }
}
