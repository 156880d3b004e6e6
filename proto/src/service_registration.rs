//! Nomad-native service registrations (`provider = "nomad"`, `structs.ServiceRegistration`).

use serde::{Deserialize, Serialize};

/// One instance of a service, registered by the client running its alloc.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistration {
    /// Unique ID: `_nomad-task-<alloc>-<task or group>-<service>-<port>`.
    #[serde(rename = "ID")]
    pub id: String,
    /// Service name.
    pub service_name: String,
    /// Namespace of the job.
    pub namespace: String,
    /// Node running the alloc.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Datacenter of the node.
    pub datacenter: String,
    /// Job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Alloc.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Address clients connect to.
    pub address: String,
    /// Port.
    pub port: i64,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}

/// An entry of `/v1/services`: the services of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationListStub {
    /// Namespace.
    pub namespace: String,
    /// Services in it.
    pub services: Vec<ServiceRegistrationStub>,
}

/// A service name and the union of its instances' tags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationStub {
    /// Service name.
    pub service_name: String,
    /// Tags.
    pub tags: Vec<String>,
}
