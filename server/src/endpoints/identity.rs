//! `Node.SignIdentities`: workload identities for the tasks of a client's own alloc that ask for
//! one (`identity { env, file }`). A JWT signed by the keyring's active key (EdDSA, `kid` = its
//! KeyID) with Nomad 1.6's claims: `nomad_namespace`, `nomad_job_id` (the parent of a
//! dispatched or periodic child), `nomad_allocation_id`, `nomad_task`, and `iat`/`nbf`. There is
//! no expiry, as in Nomad 1.6: a token is refused once its alloc has finished on its client
//! (`acl::resolve_workload`).
//!
//! Nomad signs every task's identity in the plan applier; signing at the client's request instead
//! keeps signatures off the scheduling path and limits them to the tasks that use one.

use nomad_proto::rpc::{RecoverableError, SignIdentitiesRequest, SignIdentitiesResponse};

use super::{EndpointError, Endpoints};

fn refused(message: impl Into<String>, recoverable: bool) -> SignIdentitiesResponse {
    SignIdentitiesResponse { error: Some(RecoverableError { err: message.into(), recoverable }), ..SignIdentitiesResponse::default() }
}

impl Endpoints {
    /// `Node.SignIdentities`.
    pub fn node_sign_identities(&self, req: SignIdentitiesRequest) -> Result<SignIdentitiesResponse, EndpointError> {
        let snap = self.store.snapshot();
        self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        if req.tasks.is_empty() || req.tasks.len() > nomad_proto::limits::MAX_TASKS_PER_GROUP {
            return Ok(refused(format!("between 1 and {} tasks per request", nomad_proto::limits::MAX_TASKS_PER_GROUP), false));
        }
        let Some(alloc) = snap.alloc(&req.alloc_id) else {
            return Ok(refused(format!("Allocation {:?} does not exist", req.alloc_id), false));
        };
        if alloc.node_id != req.node_id {
            return Ok(refused(format!("Allocation {:?} not running on node {:?}", req.alloc_id, req.node_id), false));
        }
        if alloc.terminal() {
            return Ok(refused("Cannot sign identities for a terminal allocation", false));
        }
        let Some(job) = alloc.job.as_ref() else { return Ok(refused("allocation has no job", false)) };
        let Some(group) = job.lookup_task_group(&alloc.task_group) else {
            return Ok(refused(format!("Allocation {:?} does not contain TaskGroup {:?}", req.alloc_id, alloc.task_group), false));
        };
        let job_id = if job.parent_id.is_empty() { &job.id } else { &job.parent_id };
        let now = nomad_proto::Timestamp::now().unix_nanos() / 1_000_000_000;
        let mut out = SignIdentitiesResponse::default();
        for task in &req.tasks {
            // An `identity` block asks for it; templates read Nomad data with it (Nomad signs
            // one for every task; we sign only for tasks that use it).
            if group.lookup_task(task).is_none_or(|t| t.identity.is_none() && t.templates.is_empty()) {
                return Ok(refused(format!("task {task:?} asks for no workload identity"), false));
            }
            let claims = serde_json::json!({
                "nomad_namespace": alloc.namespace,
                "nomad_job_id": job_id,
                "nomad_allocation_id": alloc.id,
                "nomad_task": task,
                "iat": now,
                "nbf": now,
                "jti": uuid::Uuid::new_v4().to_string(),
            });
            match self.keyring.sign(&snap, &claims) {
                Ok(jwt) => out.identities.insert(task.clone(), jwt),
                // The leader makes the first key as it takes office: worth a retry.
                Err(e) => return Ok(refused(e.to_string(), true)),
            };
        }
        Ok(out)
    }
}
