//! Evaluations: requests to reconcile a job with the cluster (`structs.Evaluation`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::alloc::AllocMetric;
use crate::job::JobType;
use crate::time::Timestamp;

/// Where an eval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EvalStatus {
    /// Waiting for capacity.
    Blocked,
    /// Queued or being processed.
    #[default]
    #[serde(alias = "")]
    Pending,
    /// Processed.
    Complete,
    /// Gave up after too many attempts.
    Failed,
    /// Superseded.
    Canceled,
}

impl EvalStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EvalStatus::Blocked => "blocked",
            EvalStatus::Pending => "pending",
            EvalStatus::Complete => "complete",
            EvalStatus::Failed => "failed",
            EvalStatus::Canceled => "canceled",
        }
    }

    /// Complete, failed or canceled.
    pub fn is_terminal(self) -> bool {
        matches!(self, EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled)
    }
}

/// Why evals are created (`TriggeredBy`).
pub mod trigger {
    /// A job was registered or updated.
    pub const JOB_REGISTER: &str = "job-register";
    /// A job was stopped.
    pub const JOB_DEREGISTER: &str = "job-deregister";
    /// A periodic job launched.
    pub const PERIODIC_JOB: &str = "periodic-job";
    /// A node is draining.
    pub const NODE_DRAIN: &str = "node-drain";
    /// A node changed.
    pub const NODE_UPDATE: &str = "node-update";
    /// A user stopped an alloc.
    pub const ALLOC_STOP: &str = "alloc-stop";
    /// Scheduled (core jobs).
    pub const SCHEDULED: &str = "scheduled";
    /// A rolling update continues.
    pub const ROLLING_UPDATE: &str = "rolling-update";
    /// The deployment watcher asked.
    pub const DEPLOYMENT_WATCHER: &str = "deployment-watcher";
    /// A failed eval is retried.
    pub const FAILED_FOLLOW_UP: &str = "failed-follow-up";
    /// A plan was refused too often.
    pub const MAX_PLANS: &str = "max-plan-attempts";
    /// An alloc failed and may be rescheduled.
    pub const RETRY_FAILED_ALLOC: &str = "alloc-failure";
    /// Blocked placements may now fit.
    pub const QUEUED_ALLOCS: &str = "queued-allocs";
    /// Preemption.
    pub const PREEMPTION: &str = "preemption";
    /// A job was scaled.
    pub const SCALING: &str = "job-scaling";
    /// A disconnected alloc's window is over.
    pub const MAX_DISCONNECT_TIMEOUT: &str = "max-disconnect-timeout";
    /// An unknown alloc reconnected.
    pub const RECONNECT: &str = "reconnect";
}

/// An evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Evaluation {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Priority (the job's).
    pub priority: i64,
    /// Scheduler to run.
    #[serde(rename = "Type")]
    pub eval_type: JobType,
    /// Why it exists.
    pub triggered_by: String,
    /// Job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Job modify index when created.
    pub job_modify_index: u64,
    /// Node that triggered it.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Node modify index when created.
    pub node_modify_index: u64,
    /// Deployment.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    /// Status.
    pub status: EvalStatus,
    /// Why.
    pub status_description: String,
    /// Delay before processing, ns.
    pub wait: i64,
    /// Do not process before this time.
    pub wait_until: Timestamp,
    /// Follow-up eval.
    pub next_eval: String,
    /// Eval this follows.
    pub previous_eval: String,
    /// Blocked eval created for failed placements.
    pub blocked_eval: String,
    /// Related evals (filled on request).
    pub related_evals: Option<Vec<serde_json::Value>>,
    /// Failed placements per group.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: BTreeMap<String, AllocMetric>,
    /// Node classes that were (in)eligible.
    pub class_eligibility: BTreeMap<String, bool>,
    /// Quota hit.
    pub quota_limit_reached: String,
    /// A constraint escaped computed-class caching.
    pub escaped_computed_class: bool,
    /// Annotate the plan (job plan).
    pub annotate_plan: bool,
    /// Allocs still queued per group.
    pub queued_allocations: BTreeMap<String, i64>,
    /// Leader ACL token.
    #[serde(rename = "LeaderACL")]
    pub leader_acl: String,
    /// State index the scheduler used.
    pub snapshot_index: u64,
    /// Raft index created.
    pub create_index: u64,
    /// Raft index modified.
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    /// Unix nanoseconds.
    pub modify_time: i64,
}

impl Default for Evaluation {
    fn default() -> Self {
        Evaluation {
            id: String::new(),
            namespace: String::new(),
            priority: crate::job::DEFAULT_JOB_PRIORITY,
            eval_type: JobType::Service,
            triggered_by: String::new(),
            job_id: String::new(),
            job_modify_index: 0,
            node_id: String::new(),
            node_modify_index: 0,
            deployment_id: String::new(),
            status: EvalStatus::Pending,
            status_description: String::new(),
            wait: 0,
            wait_until: Timestamp::ZERO,
            next_eval: String::new(),
            previous_eval: String::new(),
            blocked_eval: String::new(),
            related_evals: None,
            failed_tg_allocs: BTreeMap::new(),
            class_eligibility: BTreeMap::new(),
            quota_limit_reached: String::new(),
            escaped_computed_class: false,
            annotate_plan: false,
            queued_allocations: BTreeMap::new(),
            leader_acl: String::new(),
            snapshot_index: 0,
            create_index: 0,
            modify_index: 0,
            create_time: 0,
            modify_time: 0,
        }
    }
}

impl Evaluation {
    /// A pending eval for a job, stamped with `now`.
    pub fn for_job(job: &crate::Job, triggered_by: &str, now: Timestamp) -> Evaluation {
        Evaluation {
            id: crate::new_id(),
            namespace: job.namespace.clone(),
            priority: job.priority,
            eval_type: job.job_type,
            triggered_by: triggered_by.to_string(),
            job_id: job.id.clone(),
            job_modify_index: job.job_modify_index,
            status: EvalStatus::Pending,
            create_time: now.unix_nanos(),
            modify_time: now.unix_nanos(),
            ..Evaluation::default()
        }
    }

    /// `(namespace, job id)`.
    pub fn namespaced_job_id(&self) -> crate::NamespacedId {
        crate::NamespacedId::new(&self.namespace, &self.job_id)
    }
}
