//! `Alloc.*` endpoints: stop.

use std::collections::BTreeMap;

use nomad_proto::eval::trigger;
use nomad_proto::{DesiredTransition, EvalStatus, Evaluation};
use serde::Serialize;

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

/// Reply to an alloc stop.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocStopResponse {
    /// Eval created.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Index of the write.
    pub index: u64,
}

impl Endpoints {
    /// `Alloc.Stop`: ask the scheduler to migrate the alloc (stop it and
    /// place a replacement), as Nomad does.
    pub async fn alloc_stop(&self, alloc_id: &str, no_shutdown_delay: bool) -> Result<AllocStopResponse, EndpointError> {
        let snap = self.store.snapshot();
        let alloc = snap.alloc(alloc_id).ok_or_else(|| EndpointError::NotFound("allocation not found".into()))?;
        let now = self.now();
        let (priority, eval_type) = alloc.job.as_ref().map(|j| (j.priority, j.job_type)).unwrap_or_default();
        let eval = Evaluation {
            id: nomad_proto::new_id(),
            namespace: alloc.namespace.clone(),
            priority: if priority == 0 { nomad_proto::job::DEFAULT_JOB_PRIORITY } else { priority },
            eval_type,
            triggered_by: trigger::ALLOC_STOP.to_string(),
            job_id: alloc.job_id.clone(),
            status: EvalStatus::Pending,
            create_time: now.unix_nanos(),
            modify_time: now.unix_nanos(),
            ..Evaluation::default()
        };
        let eval_id = eval.id.clone();
        let transition =
            DesiredTransition { migrate: Some(true), no_shutdown_delay: no_shutdown_delay.then_some(true), ..DesiredTransition::default() };
        let index = self
            .consensus
            .apply(Command::AllocDesiredTransition { transitions: BTreeMap::from([(alloc_id.to_string(), transition)]), evals: vec![eval] })
            .await?;
        Ok(AllocStopResponse { eval_id, index })
    }
}
