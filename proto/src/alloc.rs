//! Allocations: a task group placed on a node (`structs.Allocation`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobType};
use crate::resources::AllocatedResources;
use crate::time::Timestamp;

/// What the servers want for an alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    /// Keep it running.
    #[default]
    #[serde(alias = "")]
    Run,
    /// Stop it.
    Stop,
    /// Stop it to make room (preemption).
    Evict,
}

impl DesiredStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredStatus::Run => "run",
            DesiredStatus::Stop => "stop",
            DesiredStatus::Evict => "evict",
        }
    }
}

/// What the client reports (or the servers infer) about an alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    /// Placed, not yet running.
    #[default]
    #[serde(alias = "")]
    Pending,
    /// Running.
    Running,
    /// Finished successfully.
    Complete,
    /// Failed.
    Failed,
    /// Its node went down or it was lost to a disconnect that lasted too long.
    Lost,
    /// Its node is disconnected; it may still be running.
    Unknown,
}

impl ClientStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientStatus::Pending => "pending",
            ClientStatus::Running => "running",
            ClientStatus::Complete => "complete",
            ClientStatus::Failed => "failed",
            ClientStatus::Lost => "lost",
            ClientStatus::Unknown => "unknown",
        }
    }

    /// Complete, failed or lost: the alloc will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost)
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<ClientStatus> {
        Some(match s {
            "pending" => ClientStatus::Pending,
            "running" => ClientStatus::Running,
            "complete" => ClientStatus::Complete,
            "failed" => ClientStatus::Failed,
            "lost" => ClientStatus::Lost,
            "unknown" => ClientStatus::Unknown,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ClientStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Description Nomad gives an alloc marked unknown.
pub const ALLOC_UNKNOWN_DESC: &str = "alloc is unknown since its node is disconnected";
/// Description Nomad gives an alloc lost with its node.
pub const ALLOC_LOST_DESC: &str = "alloc is lost since its node is down";
/// Description of a replacement stopped because the original reconnected.
pub const ALLOC_RECONNECTED_DESC: &str = "alloc not needed due to disconnected client reconnect";
/// Description of an alloc not needed after a job update.
pub const ALLOC_NOT_NEEDED_DESC: &str = "alloc not needed due to job update";
/// Description of an alloc rescheduled because it failed.
pub const ALLOC_RESCHEDULED_DESC: &str = "alloc was rescheduled because it failed";
/// Description of an alloc stopped because its job stopped.
pub const ALLOC_JOB_STOPPED_DESC: &str = "alloc not needed since job was stopped";
/// Description of an alloc stopped by the user.
pub const ALLOC_USER_STOP_DESC: &str = "alloc was stopped by the user";
/// Description of an alloc migrated off a draining node.
pub const ALLOC_MIGRATING_DESC: &str = "alloc is being migrated";
/// Description of an alloc stopped because its node no longer fits the job.
pub const ALLOC_NODE_TAINTED_DESC: &str = "alloc not needed as node is tainted";
/// Description of an alloc updated in place.
pub const ALLOC_IN_PLACE_DESC: &str = "alloc updating in-place";

/// A placed task group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Allocation {
    /// Alloc ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Eval that placed it.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// `<job>.<group>[<index>]`.
    pub name: String,
    /// Node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Node name.
    pub node_name: String,
    /// Job ID.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The job version it runs. Shared, since many allocs run the same version.
    pub job: Option<Arc<Job>>,
    /// Group.
    pub task_group: String,
    /// Resources held.
    pub allocated_resources: Option<AllocatedResources>,
    /// How it was placed.
    pub metrics: Option<AllocMetric>,
    /// What the servers want.
    pub desired_status: DesiredStatus,
    /// Why.
    pub desired_description: String,
    /// Transitions asked of the scheduler (migrate, reschedule).
    pub desired_transition: DesiredTransition,
    /// What the client reports.
    pub client_status: ClientStatus,
    /// Why.
    pub client_description: String,
    /// Per-task state, reported by the client.
    pub task_states: Option<BTreeMap<String, TaskState>>,
    /// Server-side history of client status changes (disconnects, reconnects).
    pub alloc_states: Vec<AllocState>,
    /// The alloc this one replaced.
    pub previous_allocation: String,
    /// The alloc that replaced this one.
    pub next_allocation: String,
    /// Deployment.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    /// Deployment health.
    pub deployment_status: Option<serde_json::Value>,
    /// Reschedule history.
    pub reschedule_tracker: Option<RescheduleTracker>,
    /// Network status reported by the client.
    pub network_status: Option<serde_json::Value>,
    /// Eval that will reschedule or time it out.
    #[serde(rename = "FollowupEvalID")]
    pub followup_eval_id: String,
    /// Allocs this one preempted.
    pub preempted_allocations: Vec<String>,
    /// Alloc that preempted this one.
    pub preempted_by_allocation: String,
    /// Raft index that created it.
    pub create_index: u64,
    /// Raft index of the last change (client or server).
    pub modify_index: u64,
    /// Raft index of the last server-side change; clients pull when it grows.
    pub alloc_modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: i64,
    /// Unix nanoseconds.
    pub modify_time: i64,
}

impl Default for Allocation {
    fn default() -> Self {
        Allocation {
            id: String::new(),
            namespace: String::new(),
            eval_id: String::new(),
            name: String::new(),
            node_id: String::new(),
            node_name: String::new(),
            job_id: String::new(),
            job: None,
            task_group: String::new(),
            allocated_resources: None,
            metrics: None,
            desired_status: DesiredStatus::Run,
            desired_description: String::new(),
            desired_transition: DesiredTransition::default(),
            client_status: ClientStatus::Pending,
            client_description: String::new(),
            task_states: None,
            alloc_states: Vec::new(),
            previous_allocation: String::new(),
            next_allocation: String::new(),
            deployment_id: String::new(),
            deployment_status: None,
            reschedule_tracker: None,
            network_status: None,
            followup_eval_id: String::new(),
            preempted_allocations: Vec::new(),
            preempted_by_allocation: String::new(),
            create_index: 0,
            modify_index: 0,
            alloc_modify_index: 0,
            create_time: 0,
            modify_time: 0,
        }
    }
}

/// Transitions the scheduler is asked to make.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DesiredTransition {
    /// Migrate off a draining node.
    pub migrate: Option<bool>,
    /// Reschedule.
    pub reschedule: Option<bool>,
    /// Reschedule even if the policy forbids it.
    pub force_reschedule: Option<bool>,
    /// Skip the group's shutdown delay.
    pub no_shutdown_delay: Option<bool>,
}

impl DesiredTransition {
    /// Migration asked.
    pub fn should_migrate(&self) -> bool {
        self.migrate == Some(true)
    }

    /// Rescheduling asked.
    pub fn should_reschedule(&self) -> bool {
        self.reschedule == Some(true)
    }

    /// Forced rescheduling asked.
    pub fn should_force_reschedule(&self) -> bool {
        self.force_reschedule == Some(true)
    }
}

/// The only kind of [`AllocState`] entry: a client status change.
pub const ALLOC_STATE_FIELD_CLIENT_STATUS: u8 = 0;

/// An entry of an alloc's server-side history. Timestamps are server time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocState {
    /// Always [`ALLOC_STATE_FIELD_CLIENT_STATUS`].
    pub field: u8,
    /// The client status recorded.
    pub value: String,
    /// When (server clock).
    pub time: Timestamp,
}

/// A task's state on the client.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskState {
    /// `pending`, `running` or `dead`.
    pub state: String,
    /// Dead because it failed.
    pub failed: bool,
    /// Restarts so far.
    pub restarts: u64,
    /// Last restart.
    pub last_restart: Timestamp,
    /// Last start.
    pub started_at: Timestamp,
    /// When it died.
    pub finished_at: Timestamp,
    /// Recent events.
    pub events: Vec<TaskEvent>,
    /// Opaque driver handle (kept client-side).
    pub task_handle: Option<serde_json::Value>,
}

/// Task states.
pub mod task_state {
    /// Not started yet.
    pub const PENDING: &str = "pending";
    /// Running.
    pub const RUNNING: &str = "running";
    /// Exited and will not be restarted.
    pub const DEAD: &str = "dead";
}

/// Something that happened to a task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskEvent {
    /// Event type (`Started`, `Terminated`, `Restarting`, `Reconnected`, ...).
    #[serde(rename = "Type")]
    pub event_type: String,
    /// Unix nanoseconds.
    pub time: i64,
    /// Message.
    pub message: String,
    /// Human-readable summary.
    pub display_message: String,
    /// Details.
    pub details: BTreeMap<String, String>,
    /// The event fails the task.
    pub fails_task: bool,
    /// Why it restarts.
    pub restart_reason: String,
    /// Driver error.
    pub driver_error: String,
    /// Why an artifact could not be fetched (`Failed Artifact Download`).
    pub download_error: String,
    /// Exit code.
    pub exit_code: i64,
    /// Signal.
    pub signal: i64,
    /// Kill timeout, ns.
    pub kill_timeout: i64,
    /// Kill reason.
    pub kill_reason: String,
    /// Restart delay, ns.
    pub start_delay: i64,
}

/// Task event types.
pub mod task_event {
    /// The alloc was received by the client.
    pub const RECEIVED: &str = "Received";
    /// Building the task dir.
    pub const TASK_SETUP: &str = "Task Setup";
    /// Started.
    pub const STARTED: &str = "Started";
    /// Exited.
    pub const TERMINATED: &str = "Terminated";
    /// Being killed.
    pub const KILLING: &str = "Killing";
    /// Killed.
    pub const KILLED: &str = "Killed";
    /// Restarting.
    pub const RESTARTING: &str = "Restarting";
    /// Not restarting: attempts used up.
    pub const NOT_RESTARTING: &str = "Not Restarting";
    /// The driver failed.
    pub const DRIVER_FAILURE: &str = "Driver Failure";
    /// Setup failed.
    pub const SETUP_FAILURE: &str = "Setup Failure";
    /// The client reconnected to the servers and kept the task.
    pub const CLIENT_RECONNECTED: &str = "Reconnected";
    /// Restart asked by a user.
    pub const RESTART_SIGNAL: &str = "Restart Signaled";
    /// A sibling task failed.
    pub const SIBLING_FAILED: &str = "Sibling Task Failed";
    /// The leader task exited.
    pub const LEADER_DEAD: &str = "Leader Task Dead";
    /// Driver message.
    pub const DRIVER_MESSAGE: &str = "Driver";
    /// The client is fetching the task's artifacts.
    pub const DOWNLOADING_ARTIFACTS: &str = "Downloading Artifacts";
    /// An artifact could not be fetched.
    pub const ARTIFACT_DOWNLOAD_FAILED: &str = "Failed Artifact Download";
}

/// History of reschedules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RescheduleTracker {
    /// Events, oldest first.
    pub events: Vec<RescheduleEvent>,
}

/// One reschedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RescheduleEvent {
    /// When, Unix nanoseconds.
    pub reschedule_time: i64,
    /// Previous alloc.
    #[serde(rename = "PrevAllocID")]
    pub prev_alloc_id: String,
    /// Previous node.
    #[serde(rename = "PrevNodeID")]
    pub prev_node_id: String,
    /// Delay applied, ns.
    pub delay: i64,
}

/// How a placement was decided, or why it failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocMetric {
    /// Nodes looked at.
    pub nodes_evaluated: i64,
    /// Nodes filtered out.
    pub nodes_filtered: i64,
    /// Nodes in the job's pool.
    pub nodes_in_pool: i64,
    /// Ready nodes per datacenter.
    pub nodes_available: BTreeMap<String, i64>,
    /// Filtered per class.
    pub class_filtered: BTreeMap<String, i64>,
    /// Filtered per constraint.
    pub constraint_filtered: BTreeMap<String, i64>,
    /// Nodes without room.
    pub nodes_exhausted: i64,
    /// Exhausted per class.
    pub class_exhausted: BTreeMap<String, i64>,
    /// Exhausted per dimension (`memory`, `cpu`, `network: port collision`, ...).
    pub dimension_exhausted: BTreeMap<String, i64>,
    /// Quotas hit.
    pub quota_exhausted: Vec<String>,
    /// Resources exhausted per task.
    pub resources_exhausted: BTreeMap<String, serde_json::Value>,
    /// Scores of the best nodes.
    pub score_meta_data: Vec<NodeScoreMeta>,
    /// Time spent, ns.
    pub allocation_time: i64,
    /// Identical failures folded into this one.
    pub coalesced_failures: i64,
}

impl AllocMetric {
    /// The highest normalized score among the recorded nodes, if any.
    pub fn max_norm_score(&self) -> Option<f64> {
        self.score_meta_data.iter().map(|s| s.norm_score).fold(None, |acc, v| Some(acc.map_or(v, |a: f64| a.max(v))))
    }
}

/// A node's scores for a placement.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeScoreMeta {
    /// Node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Per scorer.
    pub scores: BTreeMap<String, f64>,
    /// Final normalized score.
    pub norm_score: f64,
}

impl Allocation {
    /// Desired stop or evict.
    pub fn server_terminal(&self) -> bool {
        matches!(self.desired_status, DesiredStatus::Stop | DesiredStatus::Evict)
    }

    /// Complete, failed or lost.
    pub fn client_terminal(&self) -> bool {
        self.client_status.is_terminal()
    }

    /// Either side considers it finished.
    pub fn terminal(&self) -> bool {
        self.server_terminal() || self.client_terminal()
    }

    /// The job type of the job it runs (service when unknown).
    pub fn job_type(&self) -> JobType {
        self.job.as_ref().map(|j| j.job_type).unwrap_or_default()
    }

    /// The alloc's index within its group: `job.group[3]` gives 3.
    pub fn index(&self) -> u64 {
        alloc_name_index(&self.name)
    }

    /// Appends a client-status entry to the server-side history.
    pub fn append_state(&mut self, value: ClientStatus, now: Timestamp) {
        self.alloc_states.push(AllocState { field: ALLOC_STATE_FIELD_CLIENT_STATUS, value: value.as_str().into(), time: now });
    }

    /// The last client-status entry says `unknown`: the alloc still has to go
    /// through the reconnect path.
    pub fn needs_to_reconnect(&self) -> bool {
        self.alloc_states
            .iter()
            .rev()
            .find(|s| s.field == ALLOC_STATE_FIELD_CLIENT_STATUS)
            .is_some_and(|s| s.value == ClientStatus::Unknown.as_str())
    }

    /// When the alloc was last marked unknown.
    pub fn last_unknown(&self) -> Option<Timestamp> {
        self.alloc_states
            .iter()
            .filter(|s| s.field == ALLOC_STATE_FIELD_CLIENT_STATUS && s.value == ClientStatus::Unknown.as_str())
            .map(|s| s.time)
            .max()
    }

    /// The group's `max_client_disconnect`, if the alloc's job has one.
    pub fn max_client_disconnect(&self) -> Option<i64> {
        let job = self.job.as_ref()?;
        job.lookup_task_group(&self.task_group)?.max_client_disconnect
    }

    /// The client's reconnect decision (GH-15068) for this pulled server copy,
    /// given the `AllocModifyIndex` of the client's own copy: reconnect (keep
    /// the tasks and report their real state) only an `unknown` alloc that is
    /// newer than the client's copy and that the servers still want running.
    /// Anything else goes through the ordinary update, so a desired-stop
    /// `unknown` alloc is stopped, never resumed. Shared by the client and the
    /// servers' protocol tests.
    pub fn client_should_reconnect(&self, local_alloc_modify_index: u64) -> bool {
        self.client_status == ClientStatus::Unknown && self.alloc_modify_index > local_alloc_modify_index && !self.server_terminal()
    }

    /// Unknown for longer than the group's `max_client_disconnect`.
    pub fn expired(&self, now: Timestamp) -> bool {
        if self.client_status != ClientStatus::Unknown {
            return false;
        }
        let (Some(last), Some(max)) = (self.last_unknown(), self.max_client_disconnect()) else {
            return false;
        };
        !last.is_zero() && now.unix_nanos() >= last.unix_nanos().saturating_add(max)
    }

    /// `now + max_client_disconnect`, or `now` when the group has none.
    pub fn disconnect_timeout(&self, now: Timestamp) -> Timestamp {
        match self.max_client_disconnect() {
            Some(d) => now.add_nanos(d),
            None => now,
        }
    }

    /// Only the fields a client reports about its alloc (`Node.UpdateAlloc`);
    /// servers take nothing else from a client.
    pub fn into_client_update(self) -> Allocation {
        Allocation {
            id: self.id,
            node_id: self.node_id,
            client_status: self.client_status,
            client_description: self.client_description,
            task_states: self.task_states,
            deployment_status: self.deployment_status,
            network_status: self.network_status,
            ..Allocation::default()
        }
    }

    /// The stub `/v1/allocations` lists.
    pub fn stub(&self, fields: AllocStubFields) -> AllocListStub {
        let job = self.job.as_deref();
        AllocListStub {
            id: self.id.clone(),
            eval_id: self.eval_id.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            node_id: self.node_id.clone(),
            node_name: self.node_name.clone(),
            job_id: self.job_id.clone(),
            job_type: job.map(|j| j.job_type.as_str().to_string()).unwrap_or_default(),
            job_version: job.map(|j| j.version).unwrap_or_default(),
            task_group: self.task_group.clone(),
            allocated_resources: if fields.resources { self.allocated_resources.clone() } else { None },
            desired_status: self.desired_status,
            desired_description: self.desired_description.clone(),
            client_status: self.client_status,
            client_description: self.client_description.clone(),
            desired_transition: self.desired_transition.clone(),
            task_states: if fields.task_states { self.task_states.clone() } else { None },
            deployment_status: self.deployment_status.clone(),
            followup_eval_id: self.followup_eval_id.clone(),
            next_allocation: self.next_allocation.clone(),
            reschedule_tracker: self.reschedule_tracker.clone(),
            preempted_allocations: self.preempted_allocations.clone(),
            preempted_by_allocation: self.preempted_by_allocation.clone(),
            create_index: self.create_index,
            modify_index: self.modify_index,
            create_time: self.create_time,
            modify_time: self.modify_time,
        }
    }
}

/// Parses the index out of `job.group[3]`; 0 when there is none.
pub fn alloc_name_index(name: &str) -> u64 {
    let Some(open) = name.rfind('[') else { return 0 };
    name[open + 1..].trim_end_matches(']').parse().unwrap_or(0)
}

/// `job.group[index]`, the name Nomad gives an alloc.
pub fn alloc_name(job_id: &str, group: &str, index: u64) -> String {
    format!("{job_id}.{group}[{index}]")
}

/// Optional fields of the alloc list (`?resources=true`, `?task_states=false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocStubFields {
    /// Fill `AllocatedResources`.
    pub resources: bool,
    /// Fill `TaskStates` (default true).
    pub task_states: bool,
}

impl Default for AllocStubFields {
    fn default() -> Self {
        AllocStubFields { resources: false, task_states: true }
    }
}

/// An entry of `/v1/allocations`; field order follows Nomad's.
// `default`: clients decode these lists, and Go servers send `null` (or nothing) for empty fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocListStub {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Eval.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Node name.
    pub node_name: String,
    /// Job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Job type.
    pub job_type: String,
    /// Job version.
    pub job_version: u64,
    /// Group.
    pub task_group: String,
    /// Only with `resources=true`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub allocated_resources: Option<AllocatedResources>,
    /// Desired status.
    pub desired_status: DesiredStatus,
    /// Why.
    pub desired_description: String,
    /// Client status.
    pub client_status: ClientStatus,
    /// Why.
    pub client_description: String,
    /// Desired transition.
    pub desired_transition: DesiredTransition,
    /// Task states (`null` with `task_states=false`).
    pub task_states: Option<BTreeMap<String, TaskState>>,
    /// Deployment health.
    pub deployment_status: Option<serde_json::Value>,
    /// Follow-up eval.
    #[serde(rename = "FollowupEvalID")]
    pub followup_eval_id: String,
    /// Replacement.
    pub next_allocation: String,
    /// Reschedule history.
    pub reschedule_tracker: Option<RescheduleTracker>,
    /// Preempted allocs.
    pub preempted_allocations: Vec<String>,
    /// Preempting alloc.
    pub preempted_by_allocation: String,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
    /// Unix ns.
    pub create_time: i64,
    /// Unix ns.
    pub modify_time: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::TaskGroup;

    fn alloc_with_disconnect(max: Option<i64>) -> Allocation {
        let job = Job {
            id: "j".into(),
            task_groups: vec![TaskGroup { name: "g".into(), max_client_disconnect: max, ..TaskGroup::default() }],
            ..Job::default()
        };
        Allocation { name: "j.g[2]".into(), task_group: "g".into(), job: Some(Arc::new(job)), ..Allocation::default() }
    }

    #[test]
    fn reconnect_is_needed_only_while_the_last_status_entry_is_unknown() {
        let mut a = alloc_with_disconnect(Some(60_000_000_000));
        assert!(!a.needs_to_reconnect());
        a.append_state(ClientStatus::Unknown, Timestamp(1_000));
        assert!(a.needs_to_reconnect());
        a.append_state(ClientStatus::Running, Timestamp(2_000));
        assert!(!a.needs_to_reconnect());
    }

    #[test]
    fn expiry_counts_from_the_last_unknown_entry() {
        let mut a = alloc_with_disconnect(Some(10));
        a.client_status = ClientStatus::Unknown;
        a.append_state(ClientStatus::Unknown, Timestamp(100));
        assert!(!a.expired(Timestamp(109)));
        assert!(a.expired(Timestamp(110)));
        a.client_status = ClientStatus::Running;
        assert!(!a.expired(Timestamp(1_000)), "a running alloc never expires");
        let no_window = alloc_with_disconnect(None);
        assert!(!no_window.expired(Timestamp(1_000)));
        assert_eq!(no_window.disconnect_timeout(Timestamp(5)), Timestamp(5));
    }

    #[test]
    fn name_index_parses() {
        assert_eq!(alloc_name_index("web.g[12]"), 12);
        assert_eq!(alloc_name_index("web.g"), 0);
        assert_eq!(alloc_name("a", "b", 3), "a.b[3]");
        assert_eq!(alloc_with_disconnect(None).index(), 2);
    }

    #[test]
    fn task_states_false_gives_a_null_key() {
        let a = Allocation { task_states: Some(BTreeMap::new()), ..Allocation::default() };
        let v = serde_json::to_value(a.stub(AllocStubFields { resources: false, task_states: false })).unwrap();
        assert!(v.get("TaskStates").is_some_and(|t| t.is_null()));
        assert!(v.get("AllocatedResources").is_none());
    }
}
