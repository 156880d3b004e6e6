//! The contract between nomad-rs processes.
//!
//! Domain types are defined once, here, with serde in Nomad's JSON shape
//! (PascalCase keys, durations as integer nanoseconds, times as RFC 3339).
//! The state store holds them, the HTTP API returns them and the RPC carries
//! them. Request bodies are decoded with [`lenient`], which gives Go's
//! case-insensitive, null-tolerant manners.

#![warn(missing_docs)]

pub mod admission;
pub mod alloc;
pub mod canonicalize;
pub mod connect;
pub mod cron;
pub mod csi;
pub mod deployment;
pub mod eval;
pub mod job;
pub mod jobspec;
pub mod lenient;
pub mod limits;
pub mod namespace;
pub mod node;
pub mod plan;
pub mod resources;
pub mod rpc;
pub mod scaling;
pub mod service;
pub mod service_registration;
pub mod summary;
pub mod time;
pub mod validate;
pub mod variables;
pub mod version;
pub mod volume;

pub use alloc::{
    AllocListStub, AllocMetric, AllocState, AllocStubFields, Allocation, ClientStatus, DesiredStatus, DesiredTransition, TaskEvent,
    TaskState,
};
pub use deployment::{Deployment, DeploymentState, DeploymentStatusUpdate};
pub use eval::{EvalStatus, Evaluation};
pub use job::{
    Affinity, Constraint, Job, JobStatus, JobType, LogConfig, ReschedulePolicy, RestartPolicy, Spread, Task, TaskGroup, TaskLifecycle,
};
pub use limits::{JobLimits, LimitError};
pub use namespace::Namespace;
pub use node::{ApiNode, DriverInfo, Node, NodeEvent, NodeListStub, NodeStatus, NodeStubFields, SchedulingEligibility};
pub use plan::{Plan, PlanResult};
pub use resources::{AllocatedResources, NetworkResource, NodeResources, Port, Resources};
pub use service::Service;
pub use service_registration::ServiceRegistration;
pub use summary::{JobListStub, JobSummary, TaskGroupSummary};
pub use time::Timestamp;
pub use validate::ValidationErrors;
pub use volume::{VolumeMount, VolumeRequest};

use serde::{Deserialize, Serialize};

/// A fresh random ID in Nomad's UUID format.
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// An object's key: its namespace and its ID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NamespacedId {
    /// Namespace.
    pub namespace: String,
    /// ID.
    pub id: String,
}

impl NamespacedId {
    /// Builds a key.
    pub fn new(namespace: &str, id: &str) -> NamespacedId {
        NamespacedId { namespace: namespace.to_string(), id: id.to_string() }
    }
}

impl std::fmt::Display for NamespacedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}
