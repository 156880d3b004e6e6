//! `Job.*` endpoints: register and deregister.

use nomad_proto::eval::trigger;
use nomad_proto::{Evaluation, Job};
use serde::Serialize;

use super::{EndpointConfig, EndpointError, Endpoints};
use crate::fsm::Command;

/// How long writing a job's Consul config entries may take (Nomad's 30 s context).
const CONFIG_ENTRIES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Options of a job registration (`JobRegisterRequest` minus the job).
#[derive(Debug, Clone, Default)]
pub struct JobRegisterOptions {
    /// Only register if the job's modify index equals `job_modify_index` (0: the job must not exist).
    pub enforce_index: bool,
    /// Expected `JobModifyIndex` with `enforce_index`.
    pub job_modify_index: u64,
    /// Keep the counts of groups that already exist.
    pub preserve_counts: bool,
    /// Priority of the eval (0: the job's).
    pub eval_priority: i64,
}

/// Reply to a registration, in Nomad's shape.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct JobRegisterResponse {
    /// Eval created (empty for periodic and parameterized jobs).
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Index of the eval.
    pub eval_create_index: u64,
    /// The job's modify index after the write.
    pub job_modify_index: u64,
    /// Warnings.
    pub warnings: String,
    /// Index of the write.
    pub index: u64,
    /// Query meta (Nomad embeds it).
    pub last_contact: u64,
    /// Query meta.
    pub known_leader: bool,
    /// Query meta.
    pub next_token: String,
}

/// Reply to a deregistration, in Nomad's shape.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct JobDeregisterResponse {
    /// Eval created.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Index of the eval.
    pub eval_create_index: u64,
    /// The job's modify index.
    pub job_modify_index: u64,
    /// Volume eval (unused).
    #[serde(rename = "VolumeEvalID")]
    pub volume_eval_id: String,
    /// Volume eval index (unused).
    pub volume_eval_index: u64,
    /// Index of the write.
    pub index: u64,
    /// Query meta.
    pub last_contact: u64,
    /// Query meta.
    pub known_leader: bool,
    /// Query meta.
    pub next_token: String,
}

/// What `Job.Register` and `Job.Plan` do to a submitted job before anything else, in the order
/// of Nomad's admission hooks: its counts and sizes against the server's limits (400, before
/// canonicalizing fills a default into every group and task), Nomad's defaults, the Connect
/// mutator (Envoy tasks, ports, gateway proxies: 500 on a Connect block it cannot complete, as
/// Nomad), the limits again and the encoded size (400, the injected tasks and ports count),
/// what nomad-rs does not run (`nomad_proto::admission`, 400, judged on the injected tasks
/// too), Nomad's implied constraints, then the Connect validation and Nomad's validation (500,
/// as Nomad). A job for another region is refused: nomad-rs does not forward between regions.
pub(super) fn admit_job(job: &mut Job, config: &EndpointConfig) -> Result<(), EndpointError> {
    job.check_limits(&config.job_limits).map_err(|e| EndpointError::BadRequest(e.to_string()))?;
    job.canonicalize();
    job.mutate_connect().map_err(|e| EndpointError::Invalid(e.to_string()))?;
    job.check_limits(&config.job_limits).map_err(|e| EndpointError::BadRequest(e.to_string()))?;
    job.check_encoded_size().map_err(|e| EndpointError::BadRequest(e.to_string()))?;
    job.check_supported().map_err(|e| EndpointError::BadRequest(e.to_string()))?;
    // Nomad's implied constraints (`jobImpliedConstraints`), before validation as in Nomad.
    job.add_implied_constraints();
    if !config.region.is_empty() && job.region != config.region {
        return Err(EndpointError::BadRequest(foreign_region(&job.region, &config.region)));
    }
    job.validate_connect().map_err(|e| EndpointError::Invalid(e.to_string()))?;
    job.validate()?;
    Ok(())
}

/// Reply to `PUT /v1/validate/job`, in Nomad's shape: a job that would be refused is still a
/// successful answer, listing why.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct JobValidateResponse {
    /// Nomad's servers report the driver config as checked; ours check it on the client.
    pub driver_config_validated: bool,
    /// One entry per problem.
    pub validation_errors: Vec<String>,
    /// The problems as one message (empty when there are none).
    pub error: String,
    /// Warnings.
    pub warnings: String,
}

/// What a registration may not change about a job (Nomad's `validateJobUpdate`).
fn validate_job_update(old: Option<&Job>, new: &Job) -> Result<(), String> {
    let Some(old) = old else {
        return if new.dispatched { Err("job can't be submitted with 'Dispatched' set".into()) } else { Ok(()) };
    };
    if old.job_type != new.job_type {
        return Err(format!("cannot update job from type {:?} to {:?}", old.job_type.as_str(), new.job_type.as_str()));
    }
    match (old.periodic.is_some(), new.periodic.is_some()) {
        (true, false) => return Err("cannot update periodic job to being non-periodic".into()),
        (false, true) => return Err("cannot update non-periodic job to being periodic".into()),
        _ => {}
    }
    match (old.is_parameterized(), new.is_parameterized()) {
        (true, false) => return Err("cannot update parameterized job to being non-parameterized".into()),
        (false, true) => return Err("cannot update non-parameterized job to being parameterized".into()),
        _ => {}
    }
    if old.dispatched != new.dispatched {
        return Err("field 'Dispatched' is read-only".into());
    }
    Ok(())
}

fn foreign_region(job: &str, ours: &str) -> String {
    format!(
        "job region {:?} is not this cluster's region {:?}; nomad-rs does not forward jobs to other regions yet",
        nomad_proto::validate::escape_unsafe_chars(job, &[]),
        ours
    )
}

impl Endpoints {
    /// `/v1/validate/job`: what [`admit_job`] would say about `job`, without writing anything.
    pub fn job_validate(&self, mut job: Job) -> JobValidateResponse {
        let errors = if let Err(e) = job.check_limits(&self.config.job_limits) {
            vec![e.to_string()]
        } else {
            job.canonicalize();
            let mutated = job.mutate_connect().map_err(|e| e.to_string()).and_then(|()| {
                job.check_limits(&self.config.job_limits).map_err(|e| e.to_string())?;
                job.check_encoded_size().map_err(|e| e.to_string())
            });
            match mutated {
                Err(e) => vec![e],
                Ok(()) => match (job.check_supported(), job.validate_connect(), job.validate()) {
                    (Err(unsupported), _, _) => unsupported.0,
                    (Ok(()), Err(e), _) => vec![e.to_string()],
                    (Ok(()), Ok(()), Err(invalid)) => invalid.0,
                    (Ok(()), Ok(()), Ok(())) => Vec::new(),
                },
            }
        };
        let errors = if errors.is_empty() && !self.config.region.is_empty() && job.region != self.config.region {
            vec![foreign_region(&job.region, &self.config.region)]
        } else {
            errors
        };
        let error = if errors.is_empty() { String::new() } else { nomad_proto::ValidationErrors(errors.clone()).to_string() };
        JobValidateResponse { driver_config_validated: true, validation_errors: errors, error, warnings: String::new() }
    }

    /// `Job.Register`: admit (limits, defaults, validation), then write the job and its eval in
    /// one command.
    pub async fn job_register(&self, mut job: Job, opts: JobRegisterOptions) -> Result<JobRegisterResponse, EndpointError> {
        admit_job(&mut job, &self.config)?;
        self.register_admitted(job, opts).await
    }

    /// Writes the Consul config entries of `job`'s terminating and ingress gateways (Nomad's
    /// `Job.Register`: synchronously, before the job is written, within 30 s; entries are never
    /// deleted). Any failure fails the registration, and nothing is written to Raft.
    async fn write_config_entries(&self, job: &Job) -> Result<(), EndpointError> {
        let entries = crate::consul::config_entries::job_config_entries(job).map_err(EndpointError::BadRequest)?;
        if entries.is_empty() {
            return Ok(());
        }
        let Some(consul) = self.consul.config_entries.clone() else {
            return Err(EndpointError::BadRequest(format!(
                "job {:?} has Consul gateways, whose config entries the servers cannot write without a consul {{}} block",
                job.id
            )));
        };
        let write_all = async {
            for e in &entries {
                consul.set_config_entry(e).await.map_err(|err| {
                    EndpointError::Internal(format!("writing the Consul {} config entry {:?}: {err}", e.kind(), e.name()))
                })?;
            }
            Ok(())
        };
        match tokio::time::timeout(CONFIG_ENTRIES_TIMEOUT, write_all).await {
            Ok(r) => r,
            Err(_) => Err(EndpointError::Internal(format!(
                "writing the Consul config entries of job {:?}: Consul did not answer within {}s",
                job.id,
                CONFIG_ENTRIES_TIMEOUT.as_secs()
            ))),
        }
    }

    /// `Job.Register` for a job [`admit_job`] accepted: index checks, the Consul config entries,
    /// then the job and its eval in one command.
    pub(crate) async fn register_admitted(&self, mut job: Job, opts: JobRegisterOptions) -> Result<JobRegisterResponse, EndpointError> {
        if opts.eval_priority != 0 && !(1..=nomad_proto::job::MAX_JOB_PRIORITY).contains(&opts.eval_priority) {
            return Err(EndpointError::BadRequest("eval priority must be between 1 and 100".into()));
        }
        let snap = self.store.snapshot();
        if snap.namespace(&job.namespace).is_none() {
            return Err(EndpointError::Invalid(format!("job {:?} is in nonexistent namespace {:?}", job.id, job.namespace)));
        }
        let existing = snap.job(&job.namespace, &job.id).cloned();
        validate_job_update(existing.as_deref(), &job).map_err(EndpointError::BadRequest)?;
        if opts.enforce_index {
            match (&existing, opts.job_modify_index) {
                (Some(_), 0) => {
                    return Err(EndpointError::BadRequest("Enforcing job modify index 0: job already exists".into()));
                }
                (Some(j), want) if j.job_modify_index != want => {
                    return Err(EndpointError::BadRequest(format!(
                        "Enforcing job modify index {want}: job exists with conflicting job modify index: {}",
                        j.job_modify_index
                    )));
                }
                (None, want) if want != 0 => {
                    return Err(EndpointError::BadRequest(format!("Enforcing job modify index {want}: job does not exist")));
                }
                _ => {}
            }
        }
        if opts.preserve_counts
            && let Some(old) = &existing
        {
            for g in &mut job.task_groups {
                if let Some(og) = old.lookup_task_group(&g.name) {
                    g.count = og.count;
                }
            }
        }
        self.write_config_entries(&job).await?;
        let now = self.now();
        let eval = (!job.is_periodic_or_parameterized()).then(|| {
            let mut e = Evaluation::for_job(&job, trigger::JOB_REGISTER, now);
            if opts.eval_priority > 0 {
                e.priority = opts.eval_priority;
            }
            e
        });
        let eval_id = eval.as_ref().map(|e| e.id.clone()).unwrap_or_default();
        let (ns, id) = (job.namespace.clone(), job.id.clone());
        let index = self.consensus.apply(Command::JobRegister { job, eval, now }).await?;
        let job_modify_index = self.store.snapshot().job(&ns, &id).map(|j| j.job_modify_index).unwrap_or(index);
        Ok(JobRegisterResponse {
            eval_create_index: if eval_id.is_empty() { 0 } else { index },
            eval_id,
            job_modify_index,
            index,
            known_leader: true,
            ..JobRegisterResponse::default()
        })
    }

    /// `Job.Deregister`: mark the job stopped (or purge it) and create an eval
    /// so the scheduler stops its allocs. An unknown job is not an error.
    pub async fn job_deregister(
        &self,
        namespace: &str,
        job_id: &str,
        purge: bool,
        eval_priority: i64,
    ) -> Result<JobDeregisterResponse, EndpointError> {
        if job_id.is_empty() {
            return Err(EndpointError::BadRequest("missing job ID for deregistering".into()));
        }
        if eval_priority != 0 && !(1..=nomad_proto::job::MAX_JOB_PRIORITY).contains(&eval_priority) {
            return Err(EndpointError::BadRequest("eval priority must be between 1 and 100".into()));
        }
        let snap = self.store.snapshot();
        let Some(job) = snap.job(namespace, job_id).cloned() else {
            return Ok(JobDeregisterResponse { known_leader: true, index: snap.index, ..Default::default() });
        };
        let now = self.now();
        let eval = (!job.is_periodic_or_parameterized()).then(|| {
            let mut e = Evaluation::for_job(&job, trigger::JOB_DEREGISTER, now);
            if eval_priority > 0 {
                e.priority = eval_priority;
            }
            e
        });
        let eval_id = eval.as_ref().map(|e| e.id.clone()).unwrap_or_default();
        let index = self
            .consensus
            .apply(Command::JobDeregister { namespace: namespace.to_string(), job_id: job_id.to_string(), purge, eval, now })
            .await?;
        let job_modify_index = self.store.snapshot().job(namespace, job_id).map(|j| j.job_modify_index).unwrap_or(index);
        Ok(JobDeregisterResponse {
            eval_create_index: if eval_id.is_empty() { 0 } else { index },
            eval_id,
            job_modify_index,
            index,
            known_leader: true,
            ..JobDeregisterResponse::default()
        })
    }

    /// `Job.Evaluate`: a new eval for a job as it is (after a node or driver change, say). With
    /// `force_reschedule`, its failed allocs that were not replaced are rescheduled now, even
    /// when their policy would wait, in groups whose reschedule policy is on.
    pub async fn job_evaluate(&self, namespace: &str, job_id: &str, force_reschedule: bool) -> Result<JobRegisterResponse, EndpointError> {
        let snap = self.store.snapshot();
        let Some(job) = snap.job(namespace, job_id).cloned() else {
            return Err(EndpointError::NotFound("job not found".into()));
        };
        if job.periodic.is_some() {
            return Err(EndpointError::BadRequest("can't evaluate periodic job".into()));
        }
        if job.is_parameterized() {
            return Err(EndpointError::BadRequest("can't evaluate parameterized job".into()));
        }
        let mut transitions = std::collections::BTreeMap::new();
        if force_reschedule {
            for a in snap.allocs_by_job(namespace, job_id) {
                let enabled = job.lookup_task_group(&a.task_group).and_then(|g| g.reschedule_policy.as_ref()).is_some_and(|p| p.enabled());
                if enabled
                    && a.next_allocation.is_empty()
                    && a.client_status == nomad_proto::ClientStatus::Failed
                    && !a.desired_transition.should_force_reschedule()
                {
                    let t = nomad_proto::DesiredTransition { force_reschedule: Some(true), ..nomad_proto::DesiredTransition::default() };
                    transitions.insert(a.id.clone(), t);
                }
            }
        }
        let eval = Evaluation::for_job(&job, trigger::JOB_REGISTER, self.now());
        let eval_id = eval.id.clone();
        let index = self.consensus.apply(Command::AllocDesiredTransition { transitions, evals: vec![eval] }).await?;
        Ok(JobRegisterResponse {
            eval_id,
            eval_create_index: index,
            job_modify_index: job.job_modify_index,
            index,
            known_leader: true,
            ..JobRegisterResponse::default()
        })
    }
}
