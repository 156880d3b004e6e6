//! `Job.Scale` and `Job.ScaleStatus`: a group's count set by hand or by an autoscaler, kept
//! within its scaling policy, each action recorded as a scaling event.

use nomad_proto::eval::trigger;
use nomad_proto::scaling::{JobScaleStatus, MAX_SCALING_EVENT_FIELD_BYTES, ScalingEvent, TaskGroupScaleStatus, target};
use nomad_proto::{ClientStatus, Evaluation, JobType};

use super::{EndpointError, Endpoints, JobRegisterResponse};
use crate::fsm::Command;
use crate::state::State;

/// What `PUT /v1/job/<id>/scale` asks (Nomad's `JobScaleRequest`).
#[derive(Debug, Clone, Default)]
pub struct JobScaleRequest {
    /// The new count (none: only an event is recorded).
    pub count: Option<i64>,
    /// `{Namespace, Job, Group}`: the group is required; the others must match the request's.
    pub target: std::collections::BTreeMap<String, String>,
    /// What the caller says about it.
    pub message: String,
    /// Reports an error (then no count).
    pub error: bool,
    /// The caller's metadata.
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Nomad's `JobScaleRequest.Validate`, plus our bounds on what an event stores.
fn validate_scale(req: &JobScaleRequest, namespace: &str, job_id: &str) -> Result<(), EndpointError> {
    if req.target.get(target::NAMESPACE).is_some_and(|ns| !ns.is_empty() && ns != namespace) {
        return Err(EndpointError::BadRequest("namespace in payload did not match header".into()));
    }
    if req.target.get(target::JOB).is_some_and(|j| !j.is_empty() && j != job_id) {
        return Err(EndpointError::BadRequest("job ID in payload did not match URL".into()));
    }
    if req.target.get(target::GROUP).is_none_or(String::is_empty) {
        return Err(EndpointError::BadRequest("missing task group name for scaling action".into()));
    }
    if let Some(count) = req.count {
        if count < 0 {
            return Err(EndpointError::BadRequest("scaling action count can't be negative".into()));
        }
        if req.error {
            return Err(EndpointError::BadRequest("scaling action should not contain count if error is true".into()));
        }
    }
    if req.message.len() > MAX_SCALING_EVENT_FIELD_BYTES {
        return Err(EndpointError::BadRequest(format!(
            "scaling event message is {} bytes; at most {MAX_SCALING_EVENT_FIELD_BYTES} are allowed",
            req.message.len()
        )));
    }
    if let Some(meta) = &req.meta {
        let size = serde_json::to_vec(meta).map_or(usize::MAX, |b| b.len());
        if size > MAX_SCALING_EVENT_FIELD_BYTES {
            return Err(EndpointError::BadRequest(format!(
                "scaling event meta is {size} bytes encoded; at most {MAX_SCALING_EVENT_FIELD_BYTES} are allowed"
            )));
        }
    }
    Ok(())
}

impl Endpoints {
    /// `Job.Scale`: checks the request against the job and its group's policy, then writes the
    /// event and, with a count, the job's new count and an eval, in one command.
    pub async fn job_scale(&self, namespace: &str, job_id: &str, req: JobScaleRequest) -> Result<JobRegisterResponse, EndpointError> {
        validate_scale(&req, namespace, job_id)?;
        let group = req.target[target::GROUP].clone();
        let snap = self.store.snapshot();
        let Some(job) = snap.job(namespace, job_id).cloned() else {
            return Err(EndpointError::NotFound(format!("job {job_id:?} not found")));
        };
        if matches!(job.job_type, JobType::System | JobType::Sysbatch) {
            return Err(EndpointError::BadRequest(format!("cannot scale jobs of type {:?}", job.job_type.as_str())));
        }
        let Some(g) = job.lookup_task_group(&group) else {
            return Err(EndpointError::BadRequest(format!(
                "task group {:?} specified for scaling does not exist in job",
                nomad_proto::validate::escape_unsafe_chars(&group, &[])
            )));
        };
        let now = self.now();
        let mut event = ScalingEvent {
            time: now.unix_nanos(),
            count: req.count,
            previous_count: g.count,
            message: req.message.clone(),
            error: req.error,
            meta: req.meta.clone(),
            ..ScalingEvent::default()
        };
        let mut eval = None;
        let count = match req.count {
            None => None,
            Some(count) => {
                if let Some(p) = &g.scaling {
                    let (min, max) = (p.min.unwrap_or(0), p.max.unwrap_or(i64::MAX));
                    if count < min {
                        return Err(EndpointError::BadRequest(format!(
                            "group count was less than scaling policy minimum: {count} < {min}"
                        )));
                    }
                    if max < count {
                        return Err(EndpointError::BadRequest(format!(
                            "group count was greater than scaling policy maximum: {count} > {max}"
                        )));
                    }
                }
                let mut scaled = (*job).clone();
                if let Some(sg) = scaled.task_groups.iter_mut().find(|sg| sg.name == group) {
                    sg.count = count;
                }
                scaled.check_limits(&self.config.job_limits).map_err(|e| EndpointError::BadRequest(e.to_string()))?;
                if snap.latest_deployment(namespace, job_id).is_some_and(|d| d.active() && d.job_create_index == job.create_index) {
                    return Err(EndpointError::BadRequest("job scaling blocked due to active deployment".into()));
                }
                if !job.is_periodic_or_parameterized() {
                    let e = Evaluation::for_job(&job, trigger::SCALING, now);
                    event.eval_id = Some(e.id.clone());
                    eval = Some(e);
                }
                Some((count, job.job_modify_index))
            }
        };
        let eval_id = eval.as_ref().map(|e| e.id.clone()).unwrap_or_default();
        let index = self
            .consensus
            .apply(Command::JobScale { namespace: namespace.into(), job_id: job_id.into(), group, count, event, eval, now })
            .await?;
        let job_modify_index = self.store.snapshot().job(namespace, job_id).map_or(job.job_modify_index, |j| j.job_modify_index);
        Ok(JobRegisterResponse {
            eval_create_index: if eval_id.is_empty() { 0 } else { index },
            eval_id,
            job_modify_index,
            index,
            known_leader: true,
            ..JobRegisterResponse::default()
        })
    }
}

/// `Job.ScaleStatus` from a state: the job's groups with their counts and events (`None`: no
/// such job). The index is the highest of the job's, its events' and its allocs'.
pub fn job_scale_status(state: &State, namespace: &str, job_id: &str) -> (Option<JobScaleStatus>, u64) {
    let Some(job) = state.job(namespace, job_id) else {
        return (None, state.table_index(crate::state::Table::Jobs));
    };
    let events = state.scaling_events(namespace, job_id);
    let mut status = JobScaleStatus {
        job_id: job.id.clone(),
        namespace: job.namespace.clone(),
        job_create_index: job.create_index,
        job_modify_index: job.job_modify_index,
        job_stopped: job.stop,
        task_groups: job
            .task_groups
            .iter()
            .map(|g| {
                let events = events.and_then(|e| e.scaling_events.get(&g.name)).cloned().unwrap_or_default();
                (g.name.clone(), TaskGroupScaleStatus { desired: g.count, events, ..TaskGroupScaleStatus::default() })
            })
            .collect(),
    };
    let mut index = job.modify_index.max(events.map_or(0, |e| e.modify_index));
    for a in state.allocs_by_job(namespace, job_id) {
        // Canaries are left out, as Nomad does.
        let canary = a.deployment_status.as_ref().and_then(|d| d.get("Canary")).and_then(serde_json::Value::as_bool).unwrap_or(false);
        if canary || a.terminal() {
            continue;
        }
        let Some(g) = status.task_groups.get_mut(&a.task_group) else { continue };
        g.placed += 1;
        if a.client_status == ClientStatus::Running {
            g.running += 1;
        }
        match nomad_proto::deployment::alloc_health(a) {
            Some(true) => g.healthy += 1,
            Some(false) => g.unhealthy += 1,
            None => {}
        }
        index = index.max(a.modify_index);
    }
    (Some(status), index)
}
