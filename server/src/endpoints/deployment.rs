//! `Deployment.*` writes: fail, pause and resume, promote, allocation health.

use nomad_proto::deployment::{description, status};
use nomad_proto::{Deployment, DeploymentStatusUpdate, Evaluation};
use serde::Serialize;

use super::{EndpointError, Endpoints};
use crate::fsm::Command;
use crate::leader::deployment_watcher;

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
    /// Set when a failure reverted the job (`auto_revert`).
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
        deployment_watcher::deployment_eval(&self.store.snapshot(), d, self.now())
    }

    /// Replies for a write that made `eval` (if any) at `index`.
    fn deployment_update_response(eval: Option<&Evaluation>, index: u64, reverted_job_version: Option<u64>) -> DeploymentUpdateResponse {
        DeploymentUpdateResponse {
            eval_id: eval.map(|e| e.id.clone()).unwrap_or_default(),
            eval_create_index: if eval.is_some() { index } else { 0 },
            deployment_modify_index: index,
            reverted_job_version,
            index,
        }
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
        let index = self.consensus.apply(Command::DeploymentStatusUpdate { update, eval: eval.clone(), revert_to: None }).await?;
        Ok(Self::deployment_update_response(eval.as_ref(), index, None))
    }

    /// `Deployment.Fail`: marks it failed ("Deployment marked as failed") and evaluates the job;
    /// if any group has `auto_revert`, the job goes back to its newest stable version.
    pub async fn deployment_fail(&self, id: &str) -> Result<DeploymentUpdateResponse, EndpointError> {
        let d = self.active_deployment(id, "fail")?;
        let rollback = d.task_groups.values().any(|g| g.auto_revert);
        let (cmd, reverted) = deployment_watcher::fail(&self.store.snapshot(), &d, description::FAILED_BY_USER, rollback, self.now());
        let eval = match &cmd {
            Command::DeploymentStatusUpdate { eval, .. } => eval.clone(),
            _ => None,
        };
        let index = self.consensus.apply(cmd).await?;
        Ok(Self::deployment_update_response(eval.as_ref(), index, reverted))
    }

    /// `Deployment.Pause`: pauses it (no eval), or resumes it with an eval.
    pub async fn deployment_pause(&self, id: &str, pause: bool) -> Result<DeploymentUpdateResponse, EndpointError> {
        let d = self.active_deployment(id, if pause { "pause" } else { "resume" })?;
        if pause {
            self.write_status(&d, status::PAUSED, description::PAUSED, false).await
        } else {
            let mut running = (*d).clone();
            running.status = status::RUNNING.into();
            self.write_status(&d, status::RUNNING, running.running_description(), true).await
        }
    }

    /// `Deployment.Promote`: promotes the canaries of every group (`all`) or of `groups`, each
    /// of which must have all its canaries healthy, and evaluates the job so the old allocs
    /// are replaced.
    pub async fn deployment_promote(&self, id: &str, all: bool, groups: Vec<String>) -> Result<DeploymentUpdateResponse, EndpointError> {
        let d = self.active_deployment(id, "promote")?;
        let eval = self.deployment_eval(&d);
        let cmd = Command::DeploymentPromotion { deployment_id: d.id.clone(), all, groups, eval: eval.clone(), now: self.now() };
        // Too few healthy canaries is the state's refusal (a 500 with its message, as Nomad's).
        let index = self.consensus.apply(cmd).await?;
        Ok(Self::deployment_update_response(eval.as_ref(), index, None))
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
        let index = self
            .consensus
            .apply(Command::DeploymentAllocHealth { deployment_id: d.id.clone(), healthy, unhealthy, eval: eval.clone(), now: self.now() })
            .await?;
        Ok(Self::deployment_update_response(eval.as_ref(), index, None))
    }
}
