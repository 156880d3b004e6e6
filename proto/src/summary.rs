//! Job summaries: alloc counts per group (`structs.JobSummary`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::alloc::ClientStatus;

/// Counts of a job's allocs per group, by client status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobSummary {
    /// Job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Namespace.
    pub namespace: String,
    /// Per group.
    pub summary: BTreeMap<String, TaskGroupSummary>,
    /// Children of periodic/parameterized jobs.
    pub children: JobChildrenSummary,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}

/// Alloc counts of one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskGroupSummary {
    /// Waiting for placement.
    pub queued: i64,
    /// Finished.
    pub complete: i64,
    /// Failed.
    pub failed: i64,
    /// Running.
    pub running: i64,
    /// Placed, not running yet.
    pub starting: i64,
    /// Lost.
    pub lost: i64,
    /// Unknown (node disconnected).
    pub unknown: i64,
}

impl TaskGroupSummary {
    /// The counter for a client status.
    pub fn counter(&mut self, status: ClientStatus) -> &mut i64 {
        match status {
            ClientStatus::Pending => &mut self.starting,
            ClientStatus::Running => &mut self.running,
            ClientStatus::Complete => &mut self.complete,
            ClientStatus::Failed => &mut self.failed,
            ClientStatus::Lost => &mut self.lost,
            ClientStatus::Unknown => &mut self.unknown,
        }
    }
}

/// Children of a periodic or parameterized job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobChildrenSummary {
    /// Pending.
    pub pending: i64,
    /// Running.
    pub running: i64,
    /// Dead.
    pub dead: i64,
}

/// An entry of `/v1/jobs` (`structs.JobListStub`).
// `default`: clients decode these lists, and Go servers send `null` (or nothing) for empty fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobListStub {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Parent.
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Datacenters.
    pub datacenters: Vec<String>,
    /// Node pool.
    pub node_pool: String,
    /// Multi-region.
    pub multiregion: Option<serde_json::Value>,
    /// Type.
    #[serde(rename = "Type")]
    pub job_type: crate::JobType,
    /// Priority.
    pub priority: i64,
    /// Periodic.
    pub periodic: bool,
    /// Parameterized.
    pub parameterized_job: bool,
    /// Stopped.
    pub stop: bool,
    /// Status.
    pub status: crate::JobStatus,
    /// Why.
    pub status_description: String,
    /// Summary.
    pub job_summary: Option<JobSummary>,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
    /// Job modify index.
    pub job_modify_index: u64,
    /// Submit time, Unix ns.
    pub submit_time: i64,
    /// Meta, only with `meta=true`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub meta: Option<BTreeMap<String, String>>,
}

impl crate::Job {
    /// The `/v1/jobs` entry for this job.
    pub fn stub(&self, summary: Option<JobSummary>, with_meta: bool) -> JobListStub {
        JobListStub {
            id: self.id.clone(),
            parent_id: self.parent_id.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            datacenters: self.datacenters.clone(),
            node_pool: self.node_pool.clone(),
            multiregion: self.multiregion.clone(),
            job_type: self.job_type,
            priority: self.priority,
            periodic: self.periodic.as_ref().is_some_and(|p| p.enabled),
            parameterized_job: self.parameterized_job.is_some(),
            stop: self.stop,
            status: self.status,
            status_description: self.status_description.clone(),
            job_summary: summary,
            create_index: self.create_index,
            modify_index: self.modify_index,
            job_modify_index: self.job_modify_index,
            submit_time: self.submit_time,
            meta: with_meta.then(|| self.meta.clone()),
        }
    }
}
