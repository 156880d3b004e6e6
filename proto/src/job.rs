//! Jobs, task groups and tasks in Nomad's JSON shape (`structs.Job`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resources::{NetworkResource, Resources};
use crate::service::Service;
use crate::volume::{VolumeMount, VolumeRequest};

/// The namespace every object lives in unless told otherwise.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The region a single cluster uses unless configured.
pub const DEFAULT_REGION: &str = "global";
/// The node pool nodes and jobs use unless told otherwise.
pub const DEFAULT_NODE_POOL: &str = "default";
/// The node pool name that matches every node; not allowed on a node.
pub const ALL_NODE_POOL: &str = "all";
/// Default job priority.
pub const DEFAULT_JOB_PRIORITY: i64 = 50;
/// Highest job priority a server accepts by default.
pub const MAX_JOB_PRIORITY: i64 = 100;

/// Which scheduler places a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    /// Long-running services (the default).
    #[default]
    #[serde(alias = "")]
    Service,
    /// Run-to-completion work.
    Batch,
    /// One alloc on every feasible node.
    System,
    /// Run-to-completion on every feasible node.
    Sysbatch,
    /// Internal garbage-collection jobs.
    #[serde(rename = "_core")]
    Core,
}

impl JobType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Service => "service",
            JobType::Batch => "batch",
            JobType::System => "system",
            JobType::Sysbatch => "sysbatch",
            JobType::Core => "_core",
        }
    }
}

impl std::fmt::Display for JobType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's overall status, derived from its allocs and evals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Nothing placed yet.
    #[default]
    #[serde(alias = "")]
    Pending,
    /// At least one alloc is not terminal.
    Running,
    /// Stopped, or finished.
    Dead,
}

impl JobStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Dead => "dead",
        }
    }
}

/// A job: the unit users submit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Job {
    /// Marked for stopping; the scheduler stops every alloc.
    pub stop: bool,
    /// Region.
    pub region: String,
    /// Namespace.
    pub namespace: String,
    /// Unique ID within the namespace.
    #[serde(rename = "ID")]
    pub id: String,
    /// Parent job of a dispatched or periodic child.
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    /// Display name (defaults to the ID).
    pub name: String,
    /// Scheduler type.
    #[serde(rename = "Type")]
    pub job_type: JobType,
    /// Priority 1..=100.
    pub priority: i64,
    /// Place all or nothing.
    pub all_at_once: bool,
    /// Datacenters, glob patterns allowed.
    pub datacenters: Vec<String>,
    /// Node pool.
    pub node_pool: String,
    /// Constraints on every group.
    pub constraints: Vec<Constraint>,
    /// Affinities on every group.
    pub affinities: Vec<Affinity>,
    /// Spreads on every group.
    pub spreads: Vec<Spread>,
    /// Task groups.
    pub task_groups: Vec<TaskGroup>,
    /// Job-level update strategy (set for every job once canonicalized).
    pub update: Option<UpdateStrategy>,
    /// Multi-region settings (kept for shape).
    pub multiregion: Option<serde_json::Value>,
    /// Periodic launch settings.
    pub periodic: Option<PeriodicConfig>,
    /// Parameterized (dispatch) settings.
    pub parameterized_job: Option<ParameterizedJobConfig>,
    /// Whether this is a dispatched child.
    pub dispatched: bool,
    /// Idempotency token of a dispatch.
    pub dispatch_idempotency_token: String,
    /// Dispatch payload (base64 in JSON).
    pub payload: Option<String>,
    /// User metadata.
    pub meta: BTreeMap<String, String>,
    /// Consul token used at submission (never returned).
    pub consul_token: String,
    /// Consul namespace.
    pub consul_namespace: String,
    /// Vault token used at submission (never returned).
    pub vault_token: String,
    /// Vault namespace.
    pub vault_namespace: String,
    /// Token that submitted the job.
    #[serde(rename = "NomadTokenID")]
    pub nomad_token_id: String,
    /// Derived status.
    pub status: JobStatus,
    /// Why the status is what it is.
    pub status_description: String,
    /// This version is marked stable.
    pub stable: bool,
    /// Version, bumped when the spec changes.
    pub version: u64,
    /// Submission time, Unix nanoseconds.
    pub submit_time: i64,
    /// Raft index that created the job.
    pub create_index: u64,
    /// Raft index of the last change, including status.
    pub modify_index: u64,
    /// Raft index of the last spec change.
    pub job_modify_index: u64,
}

impl Default for Job {
    fn default() -> Self {
        Job {
            stop: false,
            region: String::new(),
            namespace: String::new(),
            id: String::new(),
            parent_id: String::new(),
            name: String::new(),
            job_type: JobType::Service,
            priority: DEFAULT_JOB_PRIORITY,
            all_at_once: false,
            datacenters: Vec::new(),
            node_pool: String::new(),
            constraints: Vec::new(),
            affinities: Vec::new(),
            spreads: Vec::new(),
            task_groups: Vec::new(),
            update: None,
            multiregion: None,
            periodic: None,
            parameterized_job: None,
            dispatched: false,
            dispatch_idempotency_token: String::new(),
            payload: None,
            meta: BTreeMap::new(),
            consul_token: String::new(),
            consul_namespace: String::new(),
            vault_token: String::new(),
            vault_namespace: String::new(),
            nomad_token_id: String::new(),
            status: JobStatus::Pending,
            status_description: String::new(),
            stable: false,
            version: 0,
            submit_time: 0,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
        }
    }
}

impl Job {
    /// The group with this name.
    pub fn lookup_task_group(&self, name: &str) -> Option<&TaskGroup> {
        self.task_groups.iter().find(|g| g.name == name)
    }

    /// Periodic or parameterized jobs are templates: registering them creates no eval (a
    /// disabled periodic job too, as Nomad's `IsPeriodic`).
    pub fn is_periodic_or_parameterized(&self) -> bool {
        self.periodic.is_some() || self.is_parameterized()
    }

    /// A parameterized job, not one of its dispatched children (which keep the block).
    pub fn is_parameterized(&self) -> bool {
        self.parameterized_job.is_some() && !self.dispatched
    }

    /// A periodic job the leader launches: enabled, not stopped, not parameterized (Nomad's
    /// `IsPeriodicActive`).
    pub fn is_periodic_active(&self) -> bool {
        self.periodic.as_ref().is_some_and(|p| p.enabled) && !self.stop && !self.is_parameterized()
    }

    /// `(namespace, id)`, the key jobs are stored under.
    pub fn namespaced_id(&self) -> crate::NamespacedId {
        crate::NamespacedId::new(&self.namespace, &self.id)
    }

    /// True when two versions differ in what users specified (ignoring indexes,
    /// status and bookkeeping), which is when the version is bumped.
    pub fn spec_changed(&self, other: &Job) -> bool {
        let strip = |j: &Job| {
            let mut j = j.clone();
            j.status = JobStatus::Pending;
            j.status_description.clear();
            j.stable = false;
            j.version = 0;
            j.submit_time = 0;
            j.create_index = 0;
            j.modify_index = 0;
            j.job_modify_index = 0;
            j
        };
        strip(self) != strip(other)
    }
}

/// A group of tasks placed together on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskGroup {
    /// Name, unique in the job.
    pub name: String,
    /// How many allocs to run (0 allowed).
    pub count: i64,
    /// Update strategy (inherits the job's).
    pub update: Option<UpdateStrategy>,
    /// Migration strategy for drains.
    pub migrate: Option<MigrateStrategy>,
    /// Constraints.
    pub constraints: Vec<Constraint>,
    /// Horizontal scaling policy (what `job scale` and the autoscaler keep to).
    pub scaling: Option<crate::scaling::ScalingPolicy>,
    /// Restart policy for the group's tasks (default depends on the job type).
    pub restart_policy: Option<RestartPolicy>,
    /// Tasks.
    pub tasks: Vec<Task>,
    /// Ephemeral disk.
    pub ephemeral_disk: EphemeralDisk,
    /// User metadata.
    pub meta: BTreeMap<String, String>,
    /// Reschedule policy (default depends on the job type).
    pub reschedule_policy: Option<ReschedulePolicy>,
    /// Affinities.
    pub affinities: Vec<Affinity>,
    /// Spreads.
    pub spreads: Vec<Spread>,
    /// Group networks.
    pub networks: Vec<NetworkResource>,
    /// Consul settings (kept for shape).
    pub consul: Option<serde_json::Value>,
    /// Group services.
    pub services: Vec<Service>,
    /// Volumes, keyed by name.
    pub volumes: BTreeMap<String, VolumeRequest>,
    /// Time between deregistering services and killing tasks, ns.
    pub shutdown_delay: Option<i64>,
    /// Stop allocs this long after their client stops heartbeating, ns.
    pub stop_after_client_disconnect: Option<i64>,
    /// Keep allocs `unknown` (not lost) this long while their client is disconnected, ns.
    pub max_client_disconnect: Option<i64>,
}

impl Default for TaskGroup {
    fn default() -> Self {
        TaskGroup {
            name: String::new(),
            count: 1,
            update: None,
            migrate: None,
            constraints: Vec::new(),
            scaling: None,
            restart_policy: None,
            tasks: Vec::new(),
            ephemeral_disk: EphemeralDisk::default(),
            meta: BTreeMap::new(),
            reschedule_policy: None,
            affinities: Vec::new(),
            spreads: Vec::new(),
            networks: Vec::new(),
            consul: None,
            services: Vec::new(),
            volumes: BTreeMap::new(),
            shutdown_delay: None,
            stop_after_client_disconnect: None,
            max_client_disconnect: None,
        }
    }
}

impl TaskGroup {
    /// The task with this name.
    pub fn lookup_task(&self, name: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.name == name)
    }

    /// The group keeps allocs `unknown` while their node is disconnected.
    pub fn supports_disconnected_clients(&self) -> bool {
        self.max_client_disconnect.is_some()
    }

    /// A group service uses Consul Connect: native, a sidecar or a gateway (Nomad's
    /// `TaskGroup.UsesConnect`).
    pub fn uses_connect(&self) -> bool {
        self.services.iter().filter_map(|s| s.connect.as_ref()).any(|c| c.native || c.sidecar_service.is_some() || c.gateway.is_some())
    }
}

/// One task: a process, container or VM run by a driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Task {
    /// Name, unique in the group.
    pub name: String,
    /// Driver (`raw_exec`, `exec`, `oci`, ...).
    pub driver: String,
    /// User to run as.
    pub user: String,
    /// Driver configuration, free-form.
    pub config: BTreeMap<String, serde_json::Value>,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// Task services.
    pub services: Vec<Service>,
    /// Vault settings (kept for shape).
    pub vault: Option<serde_json::Value>,
    /// Templates.
    pub templates: Vec<Template>,
    /// Constraints.
    pub constraints: Vec<Constraint>,
    /// Affinities.
    pub affinities: Vec<Affinity>,
    /// Resources.
    pub resources: Resources,
    /// Restart policy (copied from the group at canonicalization).
    pub restart_policy: Option<RestartPolicy>,
    /// Dispatch payload file.
    pub dispatch_payload: Option<serde_json::Value>,
    /// Lifecycle hook.
    pub lifecycle: Option<TaskLifecycle>,
    /// User metadata.
    pub meta: BTreeMap<String, String>,
    /// Time between the kill signal and SIGKILL, ns.
    pub kill_timeout: i64,
    /// Log rotation.
    pub log_config: LogConfig,
    /// Artifacts to fetch.
    pub artifacts: Vec<TaskArtifact>,
    /// The group stops when a leader task exits.
    pub leader: bool,
    /// Delay before killing, ns.
    pub shutdown_delay: i64,
    /// Volume mounts.
    pub volume_mounts: Vec<VolumeMount>,
    /// Scaling policies (kept for shape).
    pub scaling_policies: Vec<serde_json::Value>,
    /// Signal sent to stop the task (default SIGINT for Nomad; we follow it).
    pub kill_signal: String,
    /// Task kind, e.g. `connect-proxy:<service>`.
    pub kind: String,
    /// CSI plugin configuration.
    #[serde(rename = "CSIPluginConfig")]
    pub csi_plugin_config: Option<CsiPluginConfig>,
    /// Workload identity (kept for shape).
    pub identity: Option<serde_json::Value>,
}

/// Default time between the kill signal and SIGKILL: 5 s.
pub const DEFAULT_KILL_TIMEOUT_NS: i64 = 5_000_000_000;

/// Nomad's `TaskKind` prefixes of Connect tasks.
pub mod task_kind {
    /// An Envoy sidecar: `connect-proxy:<service>`.
    pub const CONNECT_PROXY: &str = "connect-proxy";
    /// A task speaking Connect itself: `connect-native:<service>`.
    pub const CONNECT_NATIVE: &str = "connect-native";
    /// An ingress gateway: `connect-ingress:<service>`.
    pub const CONNECT_INGRESS: &str = "connect-ingress";
    /// A terminating gateway: `connect-terminating:<service>`.
    pub const CONNECT_TERMINATING: &str = "connect-terminating";
    /// A mesh gateway: `connect-mesh:<service>`.
    pub const CONNECT_MESH: &str = "connect-mesh";
}

impl Task {
    /// The part of `kind` before the first `:` (`TaskKind.Name`).
    pub fn kind_name(&self) -> &str {
        self.kind.split_once(':').map_or("", |(n, _)| n)
    }

    /// The part of `kind` after the first `:` (`TaskKind.Value`): the Connect service.
    pub fn kind_value(&self) -> &str {
        self.kind.split_once(':').map_or("", |(_, v)| v)
    }

    /// `kind` is `<prefix>:<something>` (Nomad's `hasPrefix` checks).
    fn kind_is(&self, prefix: &str) -> bool {
        self.kind.strip_prefix(prefix).and_then(|r| r.strip_prefix(':')).is_some_and(|v| !v.is_empty())
    }

    /// A Connect native task (`TaskKind.IsConnectNative`).
    pub fn is_connect_native(&self) -> bool {
        self.kind_is(task_kind::CONNECT_NATIVE)
    }

    /// An Envoy sidecar or gateway task (`Task.UsesConnectSidecar`).
    pub fn uses_connect_sidecar(&self) -> bool {
        [task_kind::CONNECT_PROXY, task_kind::CONNECT_INGRESS, task_kind::CONNECT_TERMINATING, task_kind::CONNECT_MESH]
            .iter()
            .any(|p| self.kind_is(p))
    }

    /// A Connect task of any kind (`Task.UsesConnect`): the ones that get SI tokens.
    pub fn uses_connect(&self) -> bool {
        self.is_connect_native() || self.uses_connect_sidecar()
    }
}

impl Default for Task {
    fn default() -> Self {
        Task {
            name: String::new(),
            driver: String::new(),
            user: String::new(),
            config: BTreeMap::new(),
            env: BTreeMap::new(),
            services: Vec::new(),
            vault: None,
            templates: Vec::new(),
            constraints: Vec::new(),
            affinities: Vec::new(),
            resources: Resources::default(),
            restart_policy: None,
            dispatch_payload: None,
            lifecycle: None,
            meta: BTreeMap::new(),
            kill_timeout: DEFAULT_KILL_TIMEOUT_NS,
            log_config: LogConfig::default(),
            artifacts: Vec::new(),
            leader: false,
            shutdown_delay: 0,
            volume_mounts: Vec::new(),
            scaling_policies: Vec::new(),
            kill_signal: String::new(),
            kind: String::new(),
            csi_plugin_config: None,
            identity: None,
        }
    }
}

/// A placement rule: `LTarget Operand RTarget`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Constraint {
    /// Left side, usually `${attr.*}`, `${node.*}` or `${meta.*}`.
    pub l_target: String,
    /// Right side.
    pub r_target: String,
    /// Operator (`=`, `!=`, `<`, `regexp`, `version`, `distinct_hosts`, ...).
    pub operand: String,
}

impl std::fmt::Display for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.l_target, self.operand, self.r_target)
    }
}

/// A placement preference with a weight in -100..=100.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Affinity {
    /// Left side.
    pub l_target: String,
    /// Right side.
    pub r_target: String,
    /// Operator.
    pub operand: String,
    /// Weight, -100..=100, non-zero.
    pub weight: i64,
}

/// Spread allocs over the values of an attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Spread {
    /// Attribute to spread over, e.g. `${node.datacenter}`.
    pub attribute: String,
    /// Weight, 0..=100.
    pub weight: i64,
    /// Desired percentages per value.
    pub spread_target: Vec<SpreadTarget>,
}

/// Weight of an affinity or spread that sets none (Nomad's API defaults it to 50).
pub const DEFAULT_PLACEMENT_WEIGHT: i64 = 50;

impl Default for Affinity {
    fn default() -> Self {
        Affinity { l_target: String::new(), r_target: String::new(), operand: String::new(), weight: DEFAULT_PLACEMENT_WEIGHT }
    }
}

impl Default for Spread {
    fn default() -> Self {
        Spread { attribute: String::new(), weight: DEFAULT_PLACEMENT_WEIGHT, spread_target: Vec::new() }
    }
}

/// One target share of a spread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SpreadTarget {
    /// Attribute value.
    pub value: String,
    /// Percent of allocs.
    pub percent: i64,
}

/// What happens when a task exits (`restart {}`).
///
/// Decoded from JSON through [`RestartPolicyWire`]: keys a partial policy leaves out are
/// remembered and filled at canonicalization from the job type's default (a group's policy) or
/// the group's policy (a task's), as Nomad's `api.RestartPolicy.Merge` does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase", from = "RestartPolicyWire")]
pub struct RestartPolicy {
    /// Restarts allowed within `Interval`.
    pub attempts: i64,
    /// Window for counting attempts, ns.
    pub interval: i64,
    /// Wait before a restart, ns.
    pub delay: i64,
    /// `fail` or `delay` once attempts are used up.
    pub mode: String,
    /// Re-render templates on restart.
    pub render_templates: bool,
    /// Keys the decoded JSON left out (none once canonicalized, none when built in code).
    #[serde(skip)]
    #[doc(hidden)]
    pub unset: UnsetKeys,
}

/// Which keys of a decoded policy were absent, as bits. Never part of a policy's value: two
/// policies with the same fields are equal whatever was left out when one was decoded.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnsetKeys(u8);

impl PartialEq for UnsetKeys {
    fn eq(&self, _: &UnsetKeys) -> bool {
        true
    }
}

/// The JSON form of [`RestartPolicy`]: every key optional.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct RestartPolicyWire {
    attempts: Option<i64>,
    interval: Option<i64>,
    delay: Option<i64>,
    mode: Option<String>,
    render_templates: Option<bool>,
}

impl From<RestartPolicyWire> for RestartPolicy {
    fn from(w: RestartPolicyWire) -> RestartPolicy {
        let mut unset = 0u8;
        let mut take = |bit: u8, present: bool| {
            if !present {
                unset |= bit;
            }
        };
        take(1, w.attempts.is_some());
        take(2, w.interval.is_some());
        take(4, w.delay.is_some());
        take(8, w.mode.is_some());
        take(16, w.render_templates.is_some());
        RestartPolicy {
            attempts: w.attempts.unwrap_or_default(),
            interval: w.interval.unwrap_or_default(),
            delay: w.delay.unwrap_or_default(),
            mode: w.mode.unwrap_or_default(),
            render_templates: w.render_templates.unwrap_or_default(),
            unset: UnsetKeys(unset),
        }
    }
}

/// Restart mode: give up and fail the task.
pub const RESTART_MODE_FAIL: &str = "fail";
/// Restart mode: wait out the interval and try again.
pub const RESTART_MODE_DELAY: &str = "delay";

impl RestartPolicy {
    /// Nomad's default for service and system jobs: 2 attempts in 30 min, 15 s delay, fail.
    pub fn default_service() -> RestartPolicy {
        RestartPolicy {
            attempts: 2,
            interval: 30 * 60 * NS,
            delay: 15 * NS,
            mode: RESTART_MODE_FAIL.into(),
            render_templates: false,
            unset: UnsetKeys(0),
        }
    }

    /// Nomad's default for batch jobs: 3 attempts in 24 h, 15 s delay, fail.
    pub fn default_batch() -> RestartPolicy {
        RestartPolicy {
            attempts: 3,
            interval: 24 * 3600 * NS,
            delay: 15 * NS,
            mode: RESTART_MODE_FAIL.into(),
            render_templates: false,
            unset: UnsetKeys(0),
        }
    }

    /// Fills the keys the decoded JSON left out from `base` (Nomad's `Merge` of this policy onto
    /// `base`); afterwards nothing is left out.
    pub fn fill_unset_from(&mut self, base: &RestartPolicy) {
        let unset = std::mem::take(&mut self.unset).0;
        if unset & 1 != 0 {
            self.attempts = base.attempts;
        }
        if unset & 2 != 0 {
            self.interval = base.interval;
        }
        if unset & 4 != 0 {
            self.delay = base.delay;
        }
        if unset & 8 != 0 {
            self.mode = base.mode.clone();
        }
        if unset & 16 != 0 {
            self.render_templates = base.render_templates;
        }
    }
}

const NS: i64 = 1_000_000_000;

/// Where and how failed allocs are replaced (`reschedule {}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ReschedulePolicy {
    /// Reschedules allowed within `Interval`.
    pub attempts: i64,
    /// Window, ns.
    pub interval: i64,
    /// Base delay, ns.
    pub delay: i64,
    /// `constant`, `exponential` or `fibonacci`.
    pub delay_function: String,
    /// Cap on the delay, ns.
    pub max_delay: i64,
    /// Reschedule forever.
    pub unlimited: bool,
}

impl ReschedulePolicy {
    /// Nomad's default for service jobs: unlimited, 30 s exponential up to 1 h.
    pub fn default_service() -> ReschedulePolicy {
        ReschedulePolicy {
            attempts: 0,
            interval: 0,
            delay: 30 * NS,
            delay_function: "exponential".into(),
            max_delay: 3600 * NS,
            unlimited: true,
        }
    }

    /// Nomad's default for batch jobs: once in 24 h after 5 s.
    pub fn default_batch() -> ReschedulePolicy {
        ReschedulePolicy {
            attempts: 1,
            interval: 24 * 3600 * NS,
            delay: 5 * NS,
            delay_function: "constant".into(),
            max_delay: 0,
            unlimited: false,
        }
    }

    /// True when the policy allows any rescheduling at all.
    pub fn enabled(&self) -> bool {
        self.unlimited || (self.attempts > 0 && self.interval > 0)
    }
}

/// An `update` field a JSON submission left out: canonicalization gives it Nomad's default.
/// Zero is a value of its own (`max_parallel = 0`, `min_healthy_time = 0`,
/// `progress_deadline = 0`), so it cannot mark a field as missing.
pub const UPDATE_UNSET: i64 = i64::MIN;

/// How allocs are replaced on a job update (`update {}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default = "UpdateStrategy::unset", rename_all = "PascalCase")]
pub struct UpdateStrategy {
    /// Deprecated stagger, ns.
    pub stagger: i64,
    /// Allocs updated at once (0: no rolling updates).
    pub max_parallel: i64,
    /// `checks`, `task_states` or `manual`.
    pub health_check: String,
    /// Healthy for this long to count, ns.
    pub min_healthy_time: i64,
    /// Must be healthy by this, ns.
    pub healthy_deadline: i64,
    /// Deployment fails without progress for this long, ns.
    pub progress_deadline: i64,
    /// Revert to the last stable version on failure.
    pub auto_revert: bool,
    /// Promote canaries automatically.
    pub auto_promote: bool,
    /// Canaries to place.
    pub canary: i64,
}

impl UpdateStrategy {
    /// What a JSON `Update` object starts from: the numbers Nomad's API defaults are unset.
    pub fn unset() -> UpdateStrategy {
        UpdateStrategy {
            stagger: UPDATE_UNSET,
            max_parallel: UPDATE_UNSET,
            min_healthy_time: UPDATE_UNSET,
            healthy_deadline: UPDATE_UNSET,
            progress_deadline: UPDATE_UNSET,
            ..UpdateStrategy::default()
        }
    }

    /// Nomad's default for service jobs.
    pub fn default_service() -> UpdateStrategy {
        UpdateStrategy {
            stagger: 30 * NS,
            max_parallel: 1,
            health_check: "checks".into(),
            min_healthy_time: 10 * NS,
            healthy_deadline: 5 * 60 * NS,
            progress_deadline: 10 * 60 * NS,
            auto_revert: false,
            auto_promote: false,
            canary: 0,
        }
    }
}

/// How allocs leave a draining node (`migrate {}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct MigrateStrategy {
    /// Allocs migrated at once.
    pub max_parallel: i64,
    /// `checks` or `task_states`.
    pub health_check: String,
    /// Healthy for this long, ns.
    pub min_healthy_time: i64,
    /// Must be healthy by this, ns.
    pub healthy_deadline: i64,
}

impl Default for MigrateStrategy {
    fn default() -> Self {
        MigrateStrategy { max_parallel: 1, health_check: "checks".into(), min_healthy_time: 10 * NS, healthy_deadline: 5 * 60 * NS }
    }
}

/// Scratch disk for a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct EphemeralDisk {
    /// Keep on the same node across updates.
    pub sticky: bool,
    /// Size in MiB (default 300).
    #[serde(rename = "SizeMB")]
    pub size_mb: i64,
    /// Move with the alloc.
    pub migrate: bool,
}

impl Default for EphemeralDisk {
    fn default() -> Self {
        EphemeralDisk { sticky: false, size_mb: 300, migrate: false }
    }
}

/// Log rotation for a task (`logs {}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct LogConfig {
    /// Files kept per stream.
    pub max_files: i64,
    /// Size of each file in MiB.
    #[serde(rename = "MaxFileSizeMB")]
    pub max_file_size_mb: i64,
    /// Do not collect logs.
    pub disabled: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { max_files: 10, max_file_size_mb: 10, disabled: false }
    }
}

/// Lifecycle hook of a task (`lifecycle { hook sidecar }`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskLifecycle {
    /// `prestart`, `poststart` or `poststop`.
    pub hook: String,
    /// Keep running alongside the main tasks.
    pub sidecar: bool,
}

/// Lifecycle hook names.
pub mod lifecycle_hook {
    /// Runs before the main tasks.
    pub const PRESTART: &str = "prestart";
    /// Runs after the main tasks started.
    pub const POSTSTART: &str = "poststart";
    /// Runs after the main tasks stopped.
    pub const POSTSTOP: &str = "poststop";
}

/// Periodic launches (`periodic {}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PeriodicConfig {
    /// Enabled.
    pub enabled: bool,
    /// Cron spec.
    pub spec: String,
    /// Cron specs.
    pub specs: Vec<String>,
    /// Spec type (`cron`).
    pub spec_type: String,
    /// Skip a launch while the previous runs.
    pub prohibit_overlap: bool,
    /// Time zone.
    pub time_zone: String,
}

/// Dispatch settings (`parameterized {}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ParameterizedJobConfig {
    /// `optional`, `required` or `forbidden`.
    pub payload: String,
    /// Required meta keys.
    pub meta_required: Vec<String>,
    /// Optional meta keys.
    pub meta_optional: Vec<String>,
}

/// A template rendered into the task dir. Fields missing from a JSON job take Nomad's API
/// defaults (`api/tasks.go` `Template.Canonicalize`), as the HCL decoder's do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Template {
    /// Source path.
    pub source_path: String,
    /// Destination path.
    pub dest_path: String,
    /// Inline template.
    pub embedded_tmpl: String,
    /// What to do on change: `restart`, `signal`, `script` or `noop`.
    pub change_mode: String,
    /// Signal for the `signal` change mode.
    pub change_signal: String,
    /// The script of the `script` change mode.
    pub change_script: Option<ChangeScript>,
    /// Splay, ns.
    pub splay: i64,
    /// File mode.
    pub perms: String,
    /// File owner; `None` (or negative) is the agent's user.
    pub uid: Option<i64>,
    /// File group; `None` (or negative) is the agent's group.
    pub gid: Option<i64>,
    /// Export as environment.
    pub envvars: bool,
    /// The delimiter that opens an action (`{{` unless the job file sets `left_delimiter`).
    pub left_delim: String,
    /// The delimiter that closes an action (`}}` unless the job file sets `right_delimiter`).
    pub right_delim: String,
    /// A missing map key is an error instead of `<no value>`.
    #[serde(rename = "ErrMissingKey")]
    pub err_missing_key: bool,
    /// Quiescence bounds for re-renders.
    pub wait: Option<WaitConfig>,
    /// Vault lease grace (Vault is refused at admission; kept for the job's round trip).
    pub vault_grace: i64,
}

impl Default for Template {
    fn default() -> Self {
        Template {
            source_path: String::new(),
            dest_path: String::new(),
            embedded_tmpl: String::new(),
            change_mode: template_change_mode::RESTART.to_string(),
            change_signal: String::new(),
            change_script: None,
            splay: 5 * 1_000_000_000,
            perms: "0644".to_string(),
            uid: None,
            gid: None,
            envvars: false,
            left_delim: "{{".to_string(),
            right_delim: "}}".to_string(),
            err_missing_key: false,
            wait: None,
            vault_grace: 0,
        }
    }
}

/// `change_mode` values of a template.
pub mod template_change_mode {
    /// Do nothing.
    pub const NOOP: &str = "noop";
    /// Restart the task.
    pub const RESTART: &str = "restart";
    /// Send `change_signal`.
    pub const SIGNAL: &str = "signal";
    /// Run `change_script` in the task.
    pub const SCRIPT: &str = "script";
}

/// A template's `change_script {}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ChangeScript {
    /// The command, run in the task's context.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// How long it may run, ns (5s).
    pub timeout: i64,
    /// A failing script kills the task.
    pub fail_on_error: bool,
}

impl Default for ChangeScript {
    fn default() -> Self {
        ChangeScript { command: String::new(), args: Vec::new(), timeout: 5 * 1_000_000_000, fail_on_error: false }
    }
}

/// A template's `wait {}`: re-render only after the data was stable for `min`, or at `max`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct WaitConfig {
    /// ns.
    pub min: Option<i64>,
    /// ns.
    pub max: Option<i64>,
}

/// An artifact fetched into the task dir.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskArtifact {
    /// Source URL.
    pub getter_source: String,
    /// Getter options.
    pub getter_options: BTreeMap<String, String>,
    /// Headers.
    pub getter_headers: BTreeMap<String, String>,
    /// `any`, `file` or `dir`.
    pub getter_mode: String,
    /// Destination relative to the task dir.
    pub relative_dest: String,
}

/// `getter_mode` values.
pub mod getter_mode {
    /// A file or an archive unpacked into a directory (Nomad's default).
    pub const ANY: &str = "any";
    /// One file (an archive must hold exactly one).
    pub const FILE: &str = "file";
    /// A directory (over http: an archive).
    pub const DIR: &str = "dir";
}

impl TaskArtifact {
    /// Nomad's default destination: `local/`, or `local/<file name of the URL path>` in
    /// `file` mode.
    pub fn default_destination(mode: &str, source: &str) -> String {
        if mode == getter_mode::FILE {
            let path = source.split(['?', '#']).next().unwrap_or_default();
            format!("local/{}", path.rsplit('/').next().unwrap_or_default())
        } else {
            "local/".to_string()
        }
    }
}

/// The URL an `http::`/`https::` forced getter prefix (go-getter's `<getter>::<url>`) wraps, or
/// the source itself; `None` when another getter is forced (`git::`, `s3::`, ...).
pub fn artifact_unforced_source(source: &str) -> Option<&str> {
    match source.split_once("::") {
        Some((getter, rest)) if !getter.is_empty() && getter.bytes().all(|b| b.is_ascii_alphanumeric()) => {
            (getter.eq_ignore_ascii_case("http") || getter.eq_ignore_ascii_case("https")).then_some(rest)
        }
        _ => Some(source),
    }
}

/// Whether `url` has an `http://` or `https://` scheme (case-insensitive, as URL schemes are).
pub fn is_http_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
}

/// A task that serves as a CSI plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiPluginConfig {
    /// Plugin ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// `controller`, `node` or `monolith`.
    #[serde(rename = "Type")]
    pub plugin_type: String,
    /// Where the plugin's socket is mounted in the task.
    pub mount_dir: String,
    /// Base dir for staging and publishing inside the plugin.
    pub stage_publish_base_dir: String,
    /// Health check timeout, ns.
    pub health_timeout: i64,
}

#[cfg(test)]
mod task_kind_tests {
    use super::{Task, TaskGroup};
    use crate::service::{ConsulConnect, Service};

    fn kind(k: &str) -> Task {
        Task { kind: k.into(), ..Task::default() }
    }

    #[test]
    fn connect_kinds_follow_nomads_prefix_rules() {
        for (k, native, sidecar, value) in [
            ("connect-proxy:web", false, true, "web"),
            ("connect-native:api", true, false, "api"),
            ("connect-ingress:gw", false, true, "gw"),
            ("connect-terminating:gw", false, true, "gw"),
            ("connect-mesh:m", false, true, "m"),
            ("connect-proxy:a:b", false, true, "a:b"),
            ("connect-proxy:", false, false, ""),
            ("connect-proxy", false, false, ""),
            ("connect-proxyx:web", false, false, "web"),
            ("", false, false, ""),
            ("custom:thing", false, false, "thing"),
        ] {
            let t = kind(k);
            assert_eq!((t.is_connect_native(), t.uses_connect_sidecar(), t.kind_value()), (native, sidecar, value), "{k:?}");
            assert_eq!(t.uses_connect(), native || sidecar, "{k:?}");
        }
        assert_eq!(kind("connect-proxy:web").kind_name(), "connect-proxy");
    }

    #[test]
    fn a_group_uses_connect_only_with_a_native_sidecar_or_gateway_service() {
        let with =
            |c: ConsulConnect| TaskGroup { services: vec![Service { connect: Some(c), ..Service::default() }], ..TaskGroup::default() };
        assert!(!TaskGroup::default().uses_connect());
        assert!(!with(ConsulConnect::default()).uses_connect(), "an empty connect block");
        assert!(with(ConsulConnect { native: true, ..ConsulConnect::default() }).uses_connect());
        assert!(with(ConsulConnect { sidecar_service: Some(Default::default()), ..ConsulConnect::default() }).uses_connect());
        assert!(with(ConsulConnect { gateway: Some(Default::default()), ..ConsulConnect::default() }).uses_connect());
        assert!(!with(ConsulConnect { sidecar_task: Some(Default::default()), ..ConsulConnect::default() }).uses_connect());
    }
}
