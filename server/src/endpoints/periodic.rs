//! `Periodic.Force`: launch a periodic job now.

use super::job::JobRegisterResponse;
use super::{EndpointError, Endpoints};
use crate::fsm::Command;
use crate::leader::periodic::periodic_child;

impl Endpoints {
    /// `Periodic.Force`: a child of the periodic job, launched now whatever `prohibit_overlap`
    /// says, and recorded as its last launch. Answers with the child's eval.
    pub async fn periodic_force(&self, namespace: &str, job_id: &str) -> Result<JobRegisterResponse, EndpointError> {
        if job_id.is_empty() {
            return Err(EndpointError::BadRequest("missing job ID for periodic force".into()));
        }
        let snap = self.store.snapshot();
        let Some(job) = snap.job(namespace, job_id).cloned() else {
            return Err(EndpointError::NotFound("job not found".into()));
        };
        if job.periodic.is_none() {
            return Err(EndpointError::BadRequest("can't force launch non-periodic job".into()));
        }
        if !job.is_periodic_active() {
            return Err(EndpointError::BadRequest(format!(
                "can't force run non-tracked job {job_id:?} (namespace: {namespace:?}): it is stopped, disabled or parameterized"
            )));
        }
        let now = self.now();
        let (child, eval) = periodic_child(&job, now.unix_nanos(), now);
        let eval_id = eval.id.clone();
        let cmd = Command::PeriodicLaunch {
            namespace: namespace.to_string(),
            job_id: job_id.to_string(),
            launch: now.unix_nanos(),
            child,
            eval,
            now,
        };
        let index = self.consensus.apply(cmd).await?;
        Ok(JobRegisterResponse { eval_id, eval_create_index: index, index, known_leader: true, ..JobRegisterResponse::default() })
    }
}
