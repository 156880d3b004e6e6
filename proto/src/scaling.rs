//! Horizontal scaling: a group's `scaling` block (Nomad's `ScalingPolicy`), the events
//! `PUT /v1/job/:id/scale` records (`ScalingEvent`), and the scale status a job reports
//! (`JobScaleStatus`). The servers store the policy in its group; it carries its target (the
//! job's namespace, ID and group) and an ID that lives as long as the group keeps a policy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job::{Job, TaskGroup};

/// The only type of a group's policy (Nomad's `ScalingPolicyTypeHorizontal`).
pub const POLICY_TYPE_HORIZONTAL: &str = "horizontal";

/// Keys of a policy's target.
pub mod target {
    /// The job's namespace.
    pub const NAMESPACE: &str = "Namespace";
    /// The job's ID.
    pub const JOB: &str = "Job";
    /// The group's name.
    pub const GROUP: &str = "Group";
    /// A task (vertical policies, Nomad Enterprise).
    pub const TASK: &str = "Task";
}

/// How many scaling events are kept per group, newest first (Nomad's `JobTrackedScalingEvents`).
pub const JOB_TRACKED_SCALING_EVENTS: usize = 20;

/// The largest `Message` or encoded `Meta` of a scaling event (ours: Nomad bounds neither; events
/// live in the servers' memory and in every snapshot).
pub const MAX_SCALING_EVENT_FIELD_BYTES: usize = 16 * 1024;

/// A group's scaling policy. `Min`, `Max` and `Enabled` are optional in a submitted job;
/// canonicalizing fills `Min` (the group's count), `Enabled` (true) and `Type` (horizontal).
/// A missing `Max` is an error at validation, as in Nomad.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ScalingPolicy {
    /// Set by the servers; kept across updates of the job while the group has a policy.
    #[serde(rename = "ID")]
    pub id: String,
    /// `horizontal`.
    #[serde(rename = "Type")]
    pub policy_type: String,
    /// `{Namespace, Job, Group}`, set by the servers.
    pub target: BTreeMap<String, String>,
    /// Opaque to Nomad: what the autoscaler reads.
    pub policy: Option<serde_json::Map<String, Value>>,
    /// Least count.
    pub min: Option<i64>,
    /// Greatest count.
    pub max: Option<i64>,
    /// Whether the autoscaler acts on it.
    pub enabled: Option<bool>,
    /// Raft index of its creation.
    pub create_index: u64,
    /// Raft index of its last change.
    pub modify_index: u64,
}

impl ScalingPolicy {
    /// Nomad's defaults (`api.ScalingPolicy.Canonicalize`, with the group's count) and the
    /// target of `group` in `job`.
    pub fn canonicalize(&mut self, namespace: &str, job_id: &str, group: &str, count: i64) {
        if self.enabled.is_none() {
            self.enabled = Some(true);
        }
        if self.min.is_none() {
            self.min = Some(count);
        }
        if self.policy_type.is_empty() {
            self.policy_type = POLICY_TYPE_HORIZONTAL.to_string();
        }
        self.target = BTreeMap::from([
            (target::NAMESPACE.to_string(), namespace.to_string()),
            (target::JOB.to_string(), job_id.to_string()),
            (target::GROUP.to_string(), group.to_string()),
        ]);
    }

    /// Nomad's `validateScalingPolicy` for a group's policy: each message as Nomad words it,
    /// prefixed "Scaling policy invalid: ".
    pub fn validate_for_group(&self, g: &TaskGroup) -> Vec<String> {
        let mut errs = Vec::new();
        if self.policy_type.is_empty() {
            errs.push("missing scaling policy type".to_string());
        } else if self.policy_type != POLICY_TYPE_HORIZONTAL {
            errs.push(format!("scaling policy type \"{}\" is not valid", crate::validate::escape_unsafe_chars(&self.policy_type, &[])));
        } else if !self.target.is_empty() {
            for (key, what) in [(target::NAMESPACE, "namespace"), (target::JOB, "job"), (target::GROUP, "group")] {
                if self.target.get(key).is_none_or(String::is_empty) {
                    errs.push(format!("missing target {what}"));
                }
            }
        }
        let (min, max) = (self.min.unwrap_or(0), self.max.unwrap_or(-1));
        if max < 0 {
            errs.push("maximum count must be specified and non-negative".to_string());
        } else if max < min {
            errs.push("maximum count must not be less than minimum count".to_string());
        }
        if min < 0 {
            errs.push("minimum count must be specified and non-negative".to_string());
        }
        let mut errs: Vec<String> = errs.into_iter().map(|e| format!("Scaling policy invalid: {e}")).collect();
        if max < g.count {
            errs.push("Scaling policy invalid: task group count must not be greater than maximum count in scaling policy".to_string());
        }
        if g.count < min {
            errs.push("Scaling policy invalid: task group count must not be less than minimum count in scaling policy".to_string());
        }
        errs
    }

    /// What `/v1/scaling/policies` lists of it.
    pub fn stub(&self) -> ScalingPolicyStub {
        ScalingPolicyStub {
            id: self.id.clone(),
            policy_type: self.policy_type.clone(),
            target: self.target.clone(),
            enabled: self.enabled.unwrap_or(true),
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }

    /// The same policy but for what the servers set (ID, target, indexes): whether a job's
    /// update changed it.
    pub fn spec_eq(&self, other: &ScalingPolicy) -> bool {
        let strip = |p: &ScalingPolicy| ScalingPolicy { id: String::new(), create_index: 0, modify_index: 0, ..p.clone() };
        strip(self) == strip(other)
    }
}

/// A policy in `/v1/scaling/policies` (Nomad's `ScalingPolicyListStub`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ScalingPolicyStub {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Type.
    #[serde(rename = "Type")]
    pub policy_type: String,
    /// Target.
    pub target: BTreeMap<String, String>,
    /// Enabled.
    pub enabled: bool,
    /// Raft index of its creation.
    pub create_index: u64,
    /// Raft index of its last change.
    pub modify_index: u64,
}

/// One scaling action or report on a group (Nomad's `ScalingEvent`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ScalingEvent {
    /// Unix nanoseconds.
    pub time: i64,
    /// The new count, when the action set one.
    pub count: Option<i64>,
    /// The group's count before.
    pub previous_count: i64,
    /// What the caller said.
    pub message: String,
    /// Whether it reports an error (then it sets no count).
    pub error: bool,
    /// The caller's metadata.
    pub meta: Option<serde_json::Map<String, Value>>,
    /// The eval the new count made.
    #[serde(rename = "EvalID")]
    pub eval_id: Option<String>,
    /// Raft index of the write.
    pub create_index: u64,
}

/// A job's scaling events, per group, newest first (Nomad's `JobScalingEvents`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobScalingEvents {
    /// The job's namespace.
    pub namespace: String,
    /// The job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Group → its events, newest first, at most [`JOB_TRACKED_SCALING_EVENTS`].
    pub scaling_events: BTreeMap<String, Vec<ScalingEvent>>,
    /// Raft index of the last event.
    pub modify_index: u64,
}

impl JobScalingEvents {
    /// Records `event` for `group`, dropping the oldest beyond the tracked number.
    pub fn record(&mut self, group: &str, event: ScalingEvent, index: u64) {
        let events = self.scaling_events.entry(group.to_string()).or_default();
        events.insert(0, ScalingEvent { create_index: index, ..event });
        events.truncate(JOB_TRACKED_SCALING_EVENTS);
        self.modify_index = index;
    }
}

/// A group's part of `GET /v1/job/:id/scale` (Nomad's `TaskGroupScaleStatus`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskGroupScaleStatus {
    /// The group's count.
    pub desired: i64,
    /// Non-terminal allocs, canaries left out.
    pub placed: i64,
    /// Of those, running.
    pub running: i64,
    /// Of those, healthy in their deployment.
    pub healthy: i64,
    /// Of those, unhealthy in their deployment.
    pub unhealthy: i64,
    /// Its scaling events, newest first.
    pub events: Vec<ScalingEvent>,
}

/// `GET /v1/job/:id/scale` (Nomad's `JobScaleStatus`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobScaleStatus {
    /// The job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Its namespace.
    pub namespace: String,
    /// Its create index.
    pub job_create_index: u64,
    /// Its job modify index.
    pub job_modify_index: u64,
    /// Whether it is stopped.
    pub job_stopped: bool,
    /// Per group.
    pub task_groups: BTreeMap<String, TaskGroupScaleStatus>,
}

impl Job {
    /// The groups' scaling policies.
    pub fn scaling_policies(&self) -> impl Iterator<Item = &ScalingPolicy> {
        self.task_groups.iter().filter_map(|g| g.scaling.as_ref())
    }
}
