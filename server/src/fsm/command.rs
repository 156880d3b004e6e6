//! The commands written to the Raft log.
//!
//! A command carries everything its application needs, including timestamps
//! and generated IDs, so applying it reads no clock and no randomness and
//! every server (and every replay after a restart) reaches the same state.
//! Commands are part of the on-disk format: add variants and optional fields,
//! never change the meaning of existing ones.

use std::collections::BTreeMap;

use nomad_proto::node::DrainStrategy;
use nomad_proto::{Allocation, DesiredTransition, Evaluation, Job, Node, NodeEvent, NodeStatus, SchedulingEligibility, Timestamp};
use serde::{Deserialize, Serialize};

/// One state change, applied by the FSM at a Raft index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Upsert a node (`Node.Register`) and create the evals the endpoint decided on.
    NodeRegister {
        /// The node as registered; the FSM keeps stored status, eligibility, drain and events.
        node: Node,
        /// Evals to create in the same transaction.
        evals: Vec<Evaluation>,
        /// Server time of the call.
        now: Timestamp,
    },
    /// Change a node's status (`Node.UpdateStatus`, heartbeat expiry).
    NodeUpdateStatus {
        /// Node.
        node_id: String,
        /// New status.
        status: NodeStatus,
        /// Event to record.
        event: Option<NodeEvent>,
        /// Unix seconds of the change.
        updated_at: i64,
        /// Evals to create in the same transaction.
        evals: Vec<Evaluation>,
    },
    /// Remove nodes.
    NodeDeregister {
        /// Nodes.
        node_ids: Vec<String>,
        /// Evals to create.
        evals: Vec<Evaluation>,
    },
    /// Change a node's scheduling eligibility.
    NodeUpdateEligibility {
        /// Node.
        node_id: String,
        /// New eligibility.
        eligibility: SchedulingEligibility,
        /// Event to record.
        event: Option<NodeEvent>,
        /// Evals to create.
        evals: Vec<Evaluation>,
        /// Server time.
        now: Timestamp,
    },
    /// Set or clear a node's drain.
    NodeUpdateDrain {
        /// Node.
        node_id: String,
        /// The drain (None: stop draining).
        drain: Option<DrainStrategy>,
        /// Mark the node eligible when clearing the drain.
        mark_eligible: bool,
        /// Event to record.
        event: Option<NodeEvent>,
        /// Evals to create.
        evals: Vec<Evaluation>,
        /// Server time.
        now: Timestamp,
    },
    /// Register or update a job, with its eval.
    JobRegister {
        /// Canonicalized, validated job.
        job: Job,
        /// Eval to create (none for periodic or parameterized jobs).
        eval: Option<Evaluation>,
        /// Submission time.
        now: Timestamp,
    },
    /// Stop (and maybe purge) a job, with its eval.
    JobDeregister {
        /// Namespace.
        namespace: String,
        /// Job.
        job_id: String,
        /// Remove it from state instead of marking it stopped.
        purge: bool,
        /// Eval to create.
        eval: Option<Evaluation>,
        /// Server time.
        now: Timestamp,
    },
    /// Upsert evals (scheduler status updates, follow-ups, blocked evals).
    EvalUpsert {
        /// Evals.
        evals: Vec<Evaluation>,
    },
    /// Delete evals and allocs (garbage collection).
    EvalDelete {
        /// Evals.
        eval_ids: Vec<String>,
        /// Allocs.
        alloc_ids: Vec<String>,
    },
    /// Client-side alloc status (`Node.UpdateAlloc`), with the evals it triggers.
    AllocClientUpdate {
        /// Stripped allocs from the client.
        allocs: Vec<Allocation>,
        /// Evals to create.
        evals: Vec<Evaluation>,
        /// Server time.
        now: Timestamp,
    },
    /// Ask the scheduler to migrate or reschedule allocs (alloc stop, drain).
    AllocDesiredTransition {
        /// Transitions per alloc ID.
        transitions: BTreeMap<String, DesiredTransition>,
        /// Evals to create.
        evals: Vec<Evaluation>,
    },
    /// Commit the accepted part of a plan.
    PlanApply(PlanApply),
    /// Register Nomad-native service instances.
    ServiceRegistrationUpsert {
        /// Registrations.
        services: Vec<nomad_proto::ServiceRegistration>,
    },
    /// Remove the service registrations of allocs.
    ServiceRegistrationDeleteByAlloc {
        /// Allocs.
        alloc_ids: Vec<String>,
    },
    /// Remove one service registration.
    ServiceRegistrationDeleteById {
        /// Namespace of the registration.
        namespace: String,
        /// Registration ID.
        id: String,
    },
    /// Create or update namespaces.
    NamespaceUpsert {
        /// Namespaces.
        namespaces: Vec<nomad_proto::Namespace>,
    },
    /// Delete namespaces (refused if one holds jobs).
    NamespaceDelete {
        /// Names.
        names: Vec<String>,
    },
    /// Commit the accepted parts of several plans in one log entry, in order.
    /// The plan applier batches plans that queued while the previous entry
    /// was being written, so one fsync covers many plans.
    PlanApplyBatch(Vec<PlanApply>),
    /// End the drains of nodes with nothing left to move (the drainer): the
    /// strategy is cleared, the node stays ineligible, `LastDrain` becomes
    /// `complete`. A node that is gone or no longer draining is skipped.
    NodeDrainComplete {
        /// The nodes, each with its "Node drain complete" event.
        nodes: Vec<DrainComplete>,
        /// Server time.
        now: Timestamp,
    },
    /// Register or update CSI volumes (`CSIVolume.Register`), validated and merged with the
    /// stored ones by the endpoint; the namespace, identity and in-use checks are the FSM's.
    CsiVolumeRegister {
        /// Volumes, each with its namespace.
        volumes: Vec<nomad_proto::csi::CsiVolume>,
    },
    /// Remove CSI volumes (`CSIVolume.Deregister`).
    CsiVolumeDeregister {
        /// Namespace.
        namespace: String,
        /// Volume IDs.
        volume_ids: Vec<String>,
        /// Remove a claimed volume whose claiming allocs are all terminal.
        force: bool,
    },
    /// Take a claim on a CSI volume, or checkpoint its release (`CSIVolume.Claim`, and every
    /// step of `CSIVolume.Unpublish`).
    CsiVolumeClaim {
        /// Namespace.
        namespace: String,
        /// Volume.
        volume_id: String,
        /// The claim, with its state.
        claim: nomad_proto::csi::CsiVolumeClaim,
    },
    /// Store the accessors of Consul SI tokens just created (`Node.DeriveSIToken`; Nomad's
    /// `ServiceIdentityAccessorRegisterRequestType`).
    SiTokenAccessorsRegister {
        /// The accessors (their `create_index` is set by the FSM).
        accessors: Vec<crate::state::SiTokenAccessor>,
    },
    /// Forget accessors whose tokens Consul has revoked (Nomad's
    /// `ServiceIdentityAccessorDeregisterRequestType`).
    SiTokenAccessorsDeregister {
        /// AccessorIDs.
        accessor_ids: Vec<String>,
    },
    /// Set the cluster's ID, unless one is set (Nomad's `ClusterMetadataRequestType`).
    ClusterMetadata {
        /// The metadata a leader generated.
        metadata: crate::state::ClusterMetadata,
    },
    /// Create or replace ACL policies (`ACL.UpsertPolicies`), validated by the endpoint.
    AclPolicyUpsert {
        /// Policies.
        policies: Vec<crate::acl::AclPolicy>,
    },
    /// Delete ACL policies by name.
    AclPolicyDelete {
        /// Names.
        names: Vec<String>,
    },
    /// Create or update ACL tokens (IDs, secrets and times made by the endpoint).
    AclTokenUpsert {
        /// Tokens.
        tokens: Vec<crate::acl::AclToken>,
    },
    /// Delete ACL tokens by AccessorID.
    AclTokenDelete {
        /// AccessorIDs.
        accessor_ids: Vec<String>,
    },
    /// The one-time bootstrap: store the management token, refused once done unless
    /// `reset_index` is the current bootstrap index.
    AclTokenBootstrap {
        /// The bootstrap token.
        token: crate::acl::AclToken,
        /// The reset index from `<data_dir>/server/acl-bootstrap-reset` (0: none).
        reset_index: u64,
    },
    /// Create or update ACL roles.
    AclRoleUpsert {
        /// Roles.
        roles: Vec<crate::acl::AclRole>,
    },
    /// Delete ACL roles by ID.
    AclRoleDelete {
        /// IDs.
        ids: Vec<String>,
    },
    /// Write or delete a Nomad Variable (items encrypted by the endpoint); a check-and-set that
    /// no longer holds is refused with `state::CAS_CONFLICT`.
    VariableApply {
        /// What to do.
        op: crate::state::VarOp,
        /// The variable (for deletes only its namespace and path count).
        variable: crate::keyring::EncryptedVariable,
        /// Server time of the write.
        now: Timestamp,
    },
    /// Store a root key (generated and wrapped by the leader); an active one demotes the
    /// active key.
    RootKeyUpsert {
        /// The key.
        key: crate::keyring::StoredRootKey,
    },
    /// Change an inactive root key's state (`rekeying` → `inactive` once re-encrypted).
    RootKeySetState {
        /// KeyID.
        key_id: String,
        /// New state.
        state: String,
    },
    /// Delete a root key that is inactive and encrypts nothing.
    RootKeyDelete {
        /// KeyID.
        key_id: String,
    },
    /// `Job.Scale`: a scaling event for a group and, with a count, the group's new count (set
    /// in the stored job if its job modify index is still the one the endpoint checked) and
    /// the eval that follows, in one write.
    JobScale {
        /// Namespace.
        namespace: String,
        /// Job.
        job_id: String,
        /// The group.
        group: String,
        /// The new count and the job modify index it was decided against.
        count: Option<(i64, u64)>,
        /// The event (its `EvalID` is the eval's).
        event: nomad_proto::scaling::ScalingEvent,
        /// The eval of the new count.
        eval: Option<Evaluation>,
        /// Server time.
        now: Timestamp,
    },
    /// Recompute every job's summary from its allocs (`System.ReconcileJobSummaries`).
    ReconcileJobSummaries,
    /// Mark one tracked version of a job stable or not.
    JobStability {
        /// Namespace.
        namespace: String,
        /// Job.
        job_id: String,
        /// The version.
        version: u64,
        /// Stable or not.
        stable: bool,
    },
    /// A deployment's status changes (failed, paused, resumed), with the eval that follows.
    DeploymentStatusUpdate {
        /// The change.
        update: nomad_proto::DeploymentStatusUpdate,
        /// Eval to create.
        eval: Option<Evaluation>,
        /// A failed deployment's auto-revert: this earlier version registered again (as a new
        /// version), before the eval.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revert_to: Option<Box<Job>>,
    },
    /// A deployment's canaries promoted (`Deployment.Promote`, auto_promote).
    DeploymentPromotion {
        /// The deployment.
        deployment_id: String,
        /// Every group, or only `groups`.
        all: bool,
        /// The groups to promote.
        groups: Vec<String>,
        /// Eval to create.
        eval: Option<Evaluation>,
        /// Server time (the groups' progress deadlines restart from it).
        now: Timestamp,
    },
    /// Delete finished deployments (garbage collection).
    DeploymentDelete {
        /// The deployments.
        deployment_ids: Vec<String>,
    },
    /// Health of a deployment's allocs set by hand (`/v1/deployment/allocation-health`).
    DeploymentAllocHealth {
        /// The deployment.
        deployment_id: String,
        /// Allocs now healthy.
        healthy: Vec<String>,
        /// Allocs now unhealthy.
        unhealthy: Vec<String>,
        /// Eval to create.
        eval: Option<Evaluation>,
        /// Server time.
        now: Timestamp,
    },
    /// A periodic job's launch: its child and the child's eval, recorded as the parent's last
    /// launch. A child that already exists (a new leader launching the same time again) is
    /// left alone, so a launch is never doubled.
    PeriodicLaunch {
        /// The periodic job's namespace.
        namespace: String,
        /// The periodic job.
        job_id: String,
        /// The launch time (Unix nanoseconds).
        launch: i64,
        /// The child job.
        child: Job,
        /// The child's eval.
        eval: Evaluation,
        /// Server time.
        now: Timestamp,
    },
    /// Write the scheduler configuration (`PUT /v1/operator/scheduler/configuration`); with
    /// `cas`, only over the stored one whose `ModifyIndex` it is.
    SchedulerSetConfig {
        /// The configuration, checked by the endpoint.
        config: crate::state::SchedulerConfiguration,
        /// Check-and-set index.
        cas: Option<u64>,
    },
    /// Replace the whole state with an operator's snapshot (`PUT /v1/operator/snapshot`). It
    /// travels through the log like any write, so every server (and every replay) restores the
    /// same state at the same index.
    SnapshotRestore {
        /// The state, as [`crate::state::State::to_bytes`] wrote it.
        state: StateImage,
    },
}

/// A whole state in its persisted form, carried by [`Command::SnapshotRestore`]. A JSON string
/// (the persisted form is JSON text), so the log entry stays text; shown by its length, never
/// printed whole.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StateImage(pub String);

impl std::fmt::Debug for StateImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateImage({} bytes)", self.0.len())
    }
}

/// One node whose drain is done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainComplete {
    /// Node.
    pub node_id: String,
    /// The event to record.
    pub event: NodeEvent,
}

/// The part of a plan the applier accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanApply {
    /// Job the plan was computed for (allocs reference it).
    pub job: Option<Job>,
    /// New or rewritten allocs (placements, unknown/reconnect markers, in-place updates).
    pub allocs_upserted: Vec<Allocation>,
    /// Allocs stopped: ID plus the fields the scheduler set.
    pub allocs_stopped: Vec<AllocStop>,
    /// The eval that produced the plan, updated.
    pub eval: Option<Evaluation>,
    /// Evals created by the scheduler (follow-ups, blocked).
    pub evals: Vec<Evaluation>,
    /// Server time.
    pub now: Timestamp,
    /// A deployment the plan creates (boxed: most plans have none).
    #[serde(default)]
    pub deployment: Option<Box<nomad_proto::Deployment>>,
    /// Deployment status changes (cancelled, successful).
    #[serde(default)]
    pub deployment_updates: Vec<nomad_proto::DeploymentStatusUpdate>,
}

/// A stop decided by the scheduler.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocStop {
    /// Alloc.
    pub alloc_id: String,
    /// Why.
    pub desired_description: String,
    /// Client status to set (`lost`, ...), empty to keep the client's.
    pub client_status: Option<nomad_proto::ClientStatus>,
    /// Follow-up eval.
    pub followup_eval_id: String,
}

/// What applying a command produced. An error is a deterministic refusal
/// (every server refuses the same command the same way).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyResult {
    /// Why the command was refused, if it was.
    pub error: Option<String>,
}

impl ApplyResult {
    /// Success.
    pub fn ok() -> ApplyResult {
        ApplyResult { error: None }
    }

    /// A refusal.
    pub fn err(msg: impl Into<String>) -> ApplyResult {
        ApplyResult { error: Some(msg.into()) }
    }
}
