//! `Job.GetJobVersions`, `Job.Revert` and `Job.Stable`: a job's history and going back in it.

use std::sync::Arc;

use nomad_proto::Job;
use serde::Serialize;

use super::job::{JobRegisterOptions, JobRegisterResponse};
use super::job_diff::{JobDiff, job_diff};
use super::{EndpointError, Endpoints};
use crate::fsm::Command;

/// A job's tracked versions, newest first, with the diff of each from the one before it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct JobVersionsResponse {
    /// The versions, newest first.
    pub versions: Vec<Arc<Job>>,
    /// With `diffs`: `Diffs[i]` goes from `Versions[i+1]` to `Versions[i]`; otherwise null.
    pub diffs: Option<Vec<JobDiff>>,
}

/// What `/v1/job/<id>/revert` asks.
#[derive(Debug, Clone, Default)]
pub struct JobRevertRequest {
    /// The version to go back to.
    pub job_version: u64,
    /// Only revert if the job is at this version now.
    pub enforce_prior_version: Option<u64>,
}

impl JobVersionsResponse {
    /// The versions of `namespace/id` in `state`, or `None` when the job has none.
    pub fn from_state(state: &crate::state::State, namespace: &str, id: &str, diffs: bool) -> Option<JobVersionsResponse> {
        let versions = state.job_versions(namespace, id);
        if versions.is_empty() {
            return None;
        }
        let diffs = diffs.then(|| versions.windows(2).map(|w| job_diff(Some(&w[1]), &w[0], None)).collect());
        Some(JobVersionsResponse { versions: versions.to_vec(), diffs })
    }
}

impl Endpoints {
    /// `Job.Revert`: registers a copy of an earlier version (a new version), through the same
    /// admission as any registration. With `enforce_prior_version`, only if the job is at that
    /// version now, and only if it has not changed since this request looked.
    pub async fn job_revert(&self, namespace: &str, job_id: &str, req: JobRevertRequest) -> Result<JobRegisterResponse, EndpointError> {
        if job_id.is_empty() {
            return Err(EndpointError::BadRequest("missing job ID for revert".into()));
        }
        let snap = self.store.snapshot();
        let Some(cur) = snap.job(namespace, job_id).cloned() else {
            return Err(EndpointError::NotFound(format!("job {job_id:?} not found")));
        };
        if req.job_version == cur.version {
            return Err(EndpointError::BadRequest("can't revert to current version".into()));
        }
        let Some(old) = snap.job_version(namespace, job_id, req.job_version) else {
            return Err(EndpointError::NotFound(format!(
                "job {job_id:?} in namespace {namespace:?} at version {} not found",
                req.job_version
            )));
        };
        let mut opts = JobRegisterOptions::default();
        if let Some(want) = req.enforce_prior_version {
            if cur.version != want {
                return Err(EndpointError::BadRequest(format!("Current job has version {}; enforcing version {want}", cur.version)));
            }
            opts.enforce_index = true;
            opts.job_modify_index = cur.job_modify_index;
        }
        let job: Job = (**old).clone();
        self.job_register(job, opts).await
    }

    /// `Job.Stable`: marks one tracked version of a job stable (or not).
    pub async fn job_stable(&self, namespace: &str, job_id: &str, version: u64, stable: bool) -> Result<u64, EndpointError> {
        if job_id.is_empty() {
            return Err(EndpointError::BadRequest("missing job ID for marking job as stable".into()));
        }
        if self.store.snapshot().job_version(namespace, job_id, version).is_none() {
            return Err(EndpointError::NotFound(format!("job {job_id:?} in namespace {namespace:?} at version {version} not found")));
        }
        let index = self
            .consensus
            .apply(Command::JobStability { namespace: namespace.to_string(), job_id: job_id.to_string(), version, stable })
            .await?;
        Ok(index)
    }
}
