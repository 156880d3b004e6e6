//! `eval delete` (Nomad's `Eval.Delete`) and the scheduler configuration it depends on
//! (`Operator.SchedulerSetConfiguration`). Deleting evals is refused unless the eval broker is
//! paused (`PauseEvalBroker`), so no worker holds an eval being deleted; an eval is deleted
//! only when Nomad's `isEvalDeleteSafe` says so (no alloc of it still running, or a failed one
//! whose rescheduling still needs it).

use nomad_proto::{ClientStatus, Evaluation, Job, JobStatus};

use super::{EndpointError, Endpoints};
use crate::fsm::Command;
use crate::state::{SchedulerConfigError, SchedulerConfiguration, State};

/// Nomad's `MaxUUIDsPerWriteRequest`: the most eval IDs one delete request may name.
pub const MAX_UUIDS_PER_WRITE_REQUEST: usize = 7281;

/// Evals deleted per Raft write when deleting by filter (Nomad's page: a tenth of the above).
const DELETE_BY_FILTER_BATCH: usize = MAX_UUIDS_PER_WRITE_REQUEST / 10;

/// Which evals a delete names.
pub enum EvalSelection {
    /// These IDs, every one of which must exist and be safe to delete.
    Ids(Vec<String>),
    /// Every eval safe to delete that the predicate (a `-filter` expression) accepts.
    Matching(Box<dyn Fn(&Evaluation) -> bool + Send + Sync>),
}

/// Nomad's `isEvalDeleteSafe`.
pub fn eval_is_user_delete_safe(state: &State, eval: &Evaluation) -> bool {
    let job: Option<&Job> = state.job(&eval.namespace, &eval.job_id).map(|j| &**j);
    let Some(job) = job.filter(|j| !j.stop && j.status != JobStatus::Dead) else {
        return true;
    };
    state.allocs_by_eval(eval).all(|alloc| {
        if matches!(alloc.client_status, ClientStatus::Running | ClientStatus::Unknown) {
            return false;
        }
        if alloc.client_status != ClientStatus::Failed {
            return true;
        }
        let policy = job.lookup_task_group(&alloc.task_group).and_then(|tg| tg.reschedule_policy.as_ref());
        let Some(policy) = policy.filter(|p| p.unlimited || p.attempts != 0) else {
            return true;
        };
        // The replacement must carry the reschedule history forward before the eval goes.
        !alloc.next_allocation.is_empty() && !policy.unlimited && alloc.reschedule_tracker.as_ref().is_some_and(|t| !t.events.is_empty())
    })
}

impl Endpoints {
    /// Writes the scheduler configuration; returns whether it was written (a `cas` that no
    /// longer matches writes nothing) and the index.
    pub async fn set_scheduler_config(&self, config: SchedulerConfiguration, cas: Option<u64>) -> Result<(bool, u64), EndpointError> {
        config.check().map_err(|e| match e {
            SchedulerConfigError::Invalid(m) => EndpointError::BadRequest(m),
            SchedulerConfigError::Unsupported(m) => EndpointError::Unsupported(m),
        })?;
        let index = self.consensus().apply(Command::SchedulerSetConfig { config, cas }).await?;
        let written = self.store().snapshot().scheduler_config().modify_index == index;
        Ok((written, index))
    }

    /// Deletes evals (the broker must be paused); returns how many and the last write's index.
    pub async fn delete_evals(&self, selection: EvalSelection) -> Result<(usize, u64), EndpointError> {
        let state = self.store().snapshot();
        if !state.scheduler_config().pause_eval_broker {
            return Err(EndpointError::Invalid("eval broker is enabled; eval broker must be paused to delete evals".into()));
        }
        let batches: Vec<Vec<String>> = match selection {
            EvalSelection::Ids(ids) => {
                if ids.len() > MAX_UUIDS_PER_WRITE_REQUEST {
                    return Err(EndpointError::BadRequest(format!(
                        "request includes {} evaluation IDs, must be {MAX_UUIDS_PER_WRITE_REQUEST} or fewer",
                        ids.len()
                    )));
                }
                for id in &ids {
                    let eval = state.eval(id).ok_or_else(|| EndpointError::NotFound("eval not found".into()))?;
                    if !eval_is_user_delete_safe(&state, eval) {
                        return Err(EndpointError::Invalid(format!("eval {id} is not safe to delete")));
                    }
                }
                vec![ids]
            }
            EvalSelection::Matching(accepts) => {
                let ids: Vec<String> =
                    state.evals().filter(|e| eval_is_user_delete_safe(&state, e) && accepts(e)).map(|e| e.id.clone()).collect();
                ids.chunks(DELETE_BY_FILTER_BATCH).map(<[String]>::to_vec).collect()
            }
        };
        let (mut count, mut index) = (0, state.index);
        for eval_ids in batches.into_iter().filter(|b| !b.is_empty()) {
            let n = eval_ids.len();
            index = self.consensus().apply(Command::EvalDelete { eval_ids, alloc_ids: Vec::new() }).await?;
            count += n;
        }
        Ok((count, index))
    }
}
