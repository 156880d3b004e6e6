//! `Deployment.*` writes: fail, pause and resume, promote, allocation health.

use nomad_proto::deployment::{description, status};
use nomad_proto::eval::trigger;
use nomad_proto::{Deployment, DeploymentStatusUpdate, Evaluation};
use serde::Serialize;

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

/// Reply to a deployment write, in Nomad's shape (`DeploymentUpdateResponse`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeploymentUpdateResponse {
    /// The eval created.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Its index.
    pub eval_create_index: u64,
    /// The deployment's index after the write.
    pub deployment_modify_index: u64,
    /// Set when a failure reverted the job (never: auto_revert is refused at admission).
    pub reverted_job_version: Option<u64>,
    /// Index of the write.
    pub index: u64,
}

impl Endpoints {
    fn active_deployment(&self, id: &str, verb: &str) -> Result<std::sync::Arc<Deployment>, EndpointError> {
        if id.is_empty() {
            return Err(EndpointError::BadRequest("missing deployment ID".into()));
        }
        let snap = self.store.snapshot();
        let Some(d) = snap.deployment(id).cloned() else {
            return Err(EndpointError::NotFound("deployment not found".into()));
        };
        if !d.active() {
            return Err(EndpointError::BadRequest(format!("can't {verb} terminal deployment")));
        }
        Ok(d)
    }

    /// The eval that follows a deployment change (Nomad's trigger `deployment-watcher`).
    fn deployment_eval(&self, d: &Deployment) -> Option<Evaluation> {
        let snap = self.store.snapshot();
        let job = snap.job(&d.namespace, &d.job_id)?;
        let mut e = Evaluation::for_job(job, trigger::DEPLOYMENT_WATCHER, self.now());
        e.deployment_id = d.id.clone();
        if d.eval_priority > 0 {
            e.priority = d.eval_priority;
        }
        Some(e)
    }

    async fn write_status(
        &self,
        d: &Deployment,
        new_status: &str,
        desc: &str,
        eval: bool,
    ) -> Result<DeploymentUpdateResponse, EndpointError> {
        let update = DeploymentStatusUpdate { deployment_id: d.id.clone(), status: new_status.into(), status_description: desc.into() };
        let eval = if eval { self.deployment_eval(d) } else { None };
        let eval_id = eval.as_ref().map(|e| e.id.clone()).unwrap_or_default();
        let index = self.consensus.apply(Command::DeploymentStatusUpdate { update, eval }).await?;
        Ok(DeploymentUpdateResponse {
            eval_create_index: if eval_id.is_empty() { 0 } else { index },
            eval_id,
            deployment_modify_index: index,
            reverted_job_version: None,
            index,
        })
    }

    /// `Deployment.Fail`: marks it failed ("Deployment marked as failed") and evaluates the job.
    pub async fn deployment_fail(&self, id: &str) -> Result<DeploymentUpdateResponse, EndpointError> {
        let d = self.active_deployment(id, "fail")?;
        self.write_status(&d, status::FAILED, description::FAILED_BY_USER, true).await
    }

    /// `Deployment.Pause`: pauses it (no eval), or resumes it with an eval.
    pub async fn deployment_pause(&self, id: &str, pause: bool) -> Result<DeploymentUpdateResponse, EndpointError> {
        let d = self.active_deployment(id, if pause { "pause" } else { "resume" })?;
        if pause {
            self.write_status(&d, status::PAUSED, description::PAUSED, false).await
        } else {
            let desc = if d.requires_promotion() { description::RUNNING_NEEDS_PROMOTION } else { description::RUNNING };
            self.write_status(&d, status::RUNNING, desc, true).await
        }
    }

    /// `Deployment.Promote`: nomad-rs places no canaries (admission refuses `canary`), so there
    /// is never one to promote.
    pub async fn deployment_promote(&self, id: &str) -> Result<DeploymentUpdateResponse, EndpointError> {
        let d = self.active_deployment(id, "promote")?;
        if d.task_groups.values().all(|g| g.desired_canaries == 0) {
            return Err(EndpointError::BadRequest("no canaries to promote".into()));
        }
        Err(EndpointError::BadRequest("canary promotion is not supported by nomad-rs yet".into()))
    }

    /// `Deployment.SetAllocHealth`: health set by hand (for `health_check = "manual"`), then an
    /// eval so the rollout goes on.
    pub async fn deployment_alloc_health(
        &self,
        id: &str,
        healthy: Vec<String>,
        unhealthy: Vec<String>,
    ) -> Result<DeploymentUpdateResponse, EndpointError> {
        if id.is_empty() {
            return Err(EndpointError::BadRequest("missing deployment ID".into()));
        }
        if healthy.is_empty() && unhealthy.is_empty() {
            return Err(EndpointError::BadRequest("must specify at least one healthy/unhealthy allocation ID".into()));
        }
        let snap = self.store.snapshot();
        let Some(d) = snap.deployment(id).cloned() else {
            return Err(EndpointError::NotFound("deployment not found".into()));
        };
        if !d.active() {
            return Err(EndpointError::BadRequest("can't set health of allocations for a terminal deployment".into()));
        }
        for a in healthy.iter().chain(&unhealthy) {
            if snap.alloc(a).is_none_or(|x| x.deployment_id != d.id) {
                return Err(EndpointError::BadRequest(format!("alloc {a:?} is not part of deployment {:?}", d.id)));
            }
        }
        let eval = self.deployment_eval(&d);
        let eval_id = eval.as_ref().map(|e| e.id.clone()).unwrap_or_default();
        let index = self
            .consensus
            .apply(Command::DeploymentAllocHealth { deployment_id: d.id.clone(), healthy, unhealthy, eval, now: self.now() })
            .await?;
        Ok(DeploymentUpdateResponse {
            eval_create_index: if eval_id.is_empty() { 0 } else { index },
            eval_id,
            deployment_modify_index: index,
            reverted_job_version: None,
            index,
        })
    }
}
