//! The event stream: every committed change, once, in index order.
//!
//! ```text
//!  FSM apply(index, cmd) ─▶ changes of the transaction ─▶ EventBatch{index, events} ─▶ EventBroker
//!                                                                                        │ ring buffer (event_buffer_size)
//!                                                     /v1/event/stream subscribers ◀────┘ + live broadcast
//! ```
//!
//! Events are built from what the transaction wrote, after it committed, so
//! a refused command emits nothing and a committed one emits exactly one
//! batch. Every server has a broker fed by its own FSM; a restarted server
//! re-emits the batches of the log entries it replays.

mod broker;
mod build;
#[cfg(test)]
mod csi_tests;

pub use broker::{EventBroker, SubscribeError, Subscription, TopicFilter};
pub use build::batch_for;

use serde::Serialize;

/// Event topics (`structs.Topic`).
pub mod topic {
    /// Jobs.
    pub const JOB: &str = "Job";
    /// Evaluations.
    pub const EVALUATION: &str = "Evaluation";
    /// Allocations.
    pub const ALLOCATION: &str = "Allocation";
    /// Nodes.
    pub const NODE: &str = "Node";
    /// Service registrations.
    pub const SERVICE: &str = "Service";
    /// Deployments.
    pub const DEPLOYMENT: &str = "Deployment";
    /// CSI volumes (namespaced; registered, claimed and released, deregistered).
    pub const CSI_VOLUME: &str = "CSIVolume";
    /// CSI plugins (global; their instances and health, from node fingerprints).
    pub const CSI_PLUGIN: &str = "CSIPlugin";
    /// Nomad Variables (metadata only; subscribing takes a management token).
    pub const VARIABLES: &str = "Variables";
    /// Every topic.
    pub const ALL: &str = "*";
}

/// One change, in Nomad's event shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Event {
    /// Topic.
    pub topic: String,
    /// Type, shared by the whole batch (`JobRegistered`, `PlanResult`, ...).
    #[serde(rename = "Type")]
    pub event_type: String,
    /// The object's ID.
    pub key: String,
    /// Namespace (empty for nodes).
    pub namespace: String,
    /// Extra keys the event matches (`JobID`, `DeploymentID`, ...).
    pub filter_keys: Vec<String>,
    /// Raft index.
    pub index: u64,
    /// `{"<Topic>": object}`.
    pub payload: serde_json::Value,
}

/// The events of one Raft index.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct EventBatch {
    /// Raft index.
    pub index: u64,
    /// Events.
    pub events: Vec<Event>,
}
