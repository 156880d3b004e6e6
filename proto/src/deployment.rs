//! Deployments: how a service job's update rolls out, in Nomad's shapes (`structs.Deployment`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Allocation, Job, Timestamp};

/// Deployment statuses (Nomad's `DeploymentStatus*`).
pub mod status {
    /// Rolling out.
    pub const RUNNING: &str = "running";
    /// Held by an operator.
    pub const PAUSED: &str = "paused";
    /// Gave up.
    pub const FAILED: &str = "failed";
    /// Every group is healthy at its count.
    pub const SUCCESSFUL: &str = "successful";
    /// Replaced or stopped.
    pub const CANCELLED: &str = "cancelled";
}

/// Status descriptions (Nomad's `DeploymentStatusDescription*`).
pub mod description {
    /// A new deployment.
    pub const RUNNING: &str = "Deployment is running";
    /// Waiting for an operator to promote its canaries.
    pub const RUNNING_NEEDS_PROMOTION: &str = "Deployment is running but requires manual promotion";
    /// Waiting for its canaries to be healthy, then promoted by the leader.
    pub const RUNNING_AUTO_PROMOTION: &str = "Deployment is running pending automatic promotion";
    /// Paused.
    pub const PAUSED: &str = "Deployment is paused";
    /// Done.
    pub const SUCCESSFUL: &str = "Deployment completed successfully";
    /// The job was stopped.
    pub const STOPPED_JOB: &str = "Cancelled because job is stopped";
    /// A newer version replaced it.
    pub const NEWER_JOB: &str = "Cancelled due to newer version of job";
    /// An alloc was unhealthy and nothing is left to try.
    pub const FAILED_ALLOCATIONS: &str = "Failed due to unhealthy allocations";
    /// No progress in time.
    pub const PROGRESS_DEADLINE: &str = "Failed due to progress deadline";
    /// An operator failed it.
    pub const FAILED_BY_USER: &str = "Deployment marked as failed";

    /// A failure that reverts the job (Nomad's `DeploymentStatusDescriptionRollback`).
    pub fn rollback(desc: &str, version: u64) -> String {
        format!("{desc} - rolling back to job version {version}")
    }

    /// A failure whose revert target has the failed job's spec (`...RollbackNoop`).
    pub fn rollback_noop(desc: &str, version: u64) -> String {
        format!("{desc} - not rolling back to stable job version {version} as current job has same specification")
    }

    /// A failure with no stable version to revert to (`...NoRollbackTarget`).
    pub fn no_rollback_target(desc: &str) -> String {
        format!("{desc} - no stable job version to auto revert to")
    }
}

/// One group's progress in a deployment (`structs.DeploymentState`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DeploymentState {
    /// Revert to the last stable version on failure.
    pub auto_revert: bool,
    /// Promote canaries once they are healthy.
    pub auto_promote: bool,
    /// The group's `progress_deadline`, ns.
    pub progress_deadline: i64,
    /// When the deployment fails without more healthy allocs (zero: not yet set).
    pub require_progress_by: Timestamp,
    /// Canaries promoted.
    pub promoted: bool,
    /// Canary alloc IDs.
    pub placed_canaries: Vec<String>,
    /// Canaries asked for.
    pub desired_canaries: i64,
    /// Allocs the deployment will have placed or updated.
    pub desired_total: i64,
    /// Allocs placed in it.
    pub placed_allocs: i64,
    /// Allocs reported healthy.
    pub healthy_allocs: i64,
    /// Allocs reported unhealthy.
    pub unhealthy_allocs: i64,
}

/// A deployment (`structs.Deployment`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Deployment {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// The job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The job version it rolls out.
    pub job_version: u64,
    /// The job's `ModifyIndex` when it was made.
    pub job_modify_index: u64,
    /// The job's `JobModifyIndex` (its spec's).
    pub job_spec_modify_index: u64,
    /// The job's `CreateIndex`.
    pub job_create_index: u64,
    /// Multiregion (never here).
    pub is_multiregion: bool,
    /// Per group.
    pub task_groups: BTreeMap<String, DeploymentState>,
    /// `running`, `paused`, `failed`, `successful` or `cancelled`.
    pub status: String,
    /// Why.
    pub status_description: String,
    /// Priority of the evals it makes.
    pub eval_priority: i64,
    /// Raft index of its creation.
    pub create_index: u64,
    /// Raft index of its last change.
    pub modify_index: u64,
}

impl Deployment {
    /// A running deployment of `job` (Nomad's `NewDeployment`), with the ID given.
    pub fn new(id: String, job: &Job, eval_priority: i64) -> Deployment {
        Deployment {
            id,
            namespace: job.namespace.clone(),
            job_id: job.id.clone(),
            job_version: job.version,
            job_modify_index: job.modify_index,
            job_spec_modify_index: job.job_modify_index,
            job_create_index: job.create_index,
            status: status::RUNNING.to_string(),
            status_description: description::RUNNING.to_string(),
            eval_priority,
            ..Deployment::default()
        }
    }

    /// Still rolling out (or paused): not failed, successful or cancelled.
    pub fn active(&self) -> bool {
        !matches!(self.status.as_str(), status::FAILED | status::SUCCESSFUL | status::CANCELLED)
    }

    /// Canaries wait for promotion.
    pub fn requires_promotion(&self) -> bool {
        self.status == status::RUNNING && self.task_groups.values().any(|g| g.desired_canaries > 0 && !g.promoted)
    }

    /// Every group that has canaries promotes them automatically (`HasAutoPromote`).
    pub fn has_auto_promote(&self) -> bool {
        let mut canary_groups = self.task_groups.values().filter(|g| g.desired_canaries > 0).peekable();
        canary_groups.peek().is_some() && canary_groups.all(|g| g.auto_promote)
    }

    /// The description of a running deployment: it waits for a promotion, by hand or not.
    pub fn running_description(&self) -> &'static str {
        match (self.requires_promotion(), self.has_auto_promote()) {
            (true, true) => description::RUNNING_AUTO_PROMOTION,
            (true, false) => description::RUNNING_NEEDS_PROMOTION,
            (false, _) => description::RUNNING,
        }
    }

    /// For `job` as it is now (same version of the same job).
    pub fn is_for(&self, job: &Job) -> bool {
        self.job_version == job.version && self.job_create_index == job.create_index
    }
}

/// A status change the scheduler, the watcher or an operator makes (`DeploymentStatusUpdate`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DeploymentStatusUpdate {
    /// The deployment.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    /// New status.
    pub status: String,
    /// Why.
    pub status_description: String,
}

/// An alloc's health in its deployment, as clients report it: `Some(true)` healthy,
/// `Some(false)` unhealthy, `None` not decided yet.
pub fn alloc_health(a: &Allocation) -> Option<bool> {
    a.deployment_status.as_ref().and_then(|d| d.get("Healthy")).and_then(serde_json::Value::as_bool)
}

/// The alloc is a canary its deployment has not promoted yet.
pub fn alloc_is_canary(a: &Allocation) -> bool {
    a.deployment_status.as_ref().and_then(|d| d.get("Canary")).and_then(serde_json::Value::as_bool).unwrap_or(false)
}

/// When the alloc's health was decided (zero: not reported).
pub fn alloc_health_time(a: &Allocation) -> Timestamp {
    a.deployment_status
        .as_ref()
        .and_then(|d| d.get("Timestamp"))
        .and_then(|t| serde_json::from_value::<Timestamp>(t.clone()).ok())
        .unwrap_or(Timestamp::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_is_active_until_it_ends_and_is_for_one_job_version() {
        let job = Job { id: "web".into(), version: 3, create_index: 7, job_modify_index: 9, ..Job::default() };
        let mut d = Deployment::new("d1".into(), &job, 50);
        assert_eq!((d.status.as_str(), d.status_description.as_str()), ("running", "Deployment is running"));
        assert!(d.active() && d.is_for(&job));
        d.status = status::PAUSED.into();
        assert!(d.active());
        for s in [status::FAILED, status::SUCCESSFUL, status::CANCELLED] {
            d.status = s.into();
            assert!(!d.active(), "{s}");
        }
        let newer = Job { version: 4, ..job.clone() };
        assert!(!d.is_for(&newer));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!((json["ID"].as_str(), json["JobID"].as_str(), json["JobSpecModifyIndex"].as_u64()), (Some("d1"), Some("web"), Some(9)));
    }

    #[test]
    fn alloc_health_reads_what_clients_report() {
        let mut a = Allocation::default();
        assert_eq!(alloc_health(&a), None);
        a.deployment_status = Some(serde_json::json!({"Healthy": null}));
        assert_eq!(alloc_health(&a), None);
        a.deployment_status = Some(serde_json::json!({"Healthy": true, "Timestamp": "2026-12-06T00:00:00Z"}));
        assert_eq!(alloc_health(&a), Some(true));
        assert_eq!(alloc_health_time(&a).unix_nanos(), 1_796_515_200_000_000_000);
    }
}
