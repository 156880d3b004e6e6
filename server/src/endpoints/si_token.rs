//! `Node.DeriveSIToken`: Consul Service Identity tokens for an alloc's Connect tasks (Nomad's
//! `nomad/node_endpoint.go` `DeriveSIToken`).
//!
//! Every check is made against one snapshot before Consul is asked for anything: the node's
//! secret (a wrong one is refused as every node RPC refuses it), the alloc exists, runs on that
//! node and is not terminal, its group uses Connect, and every task named is a Connect task.
//! Then one token per task is created (at most 16 calls at once), and the accessors are stored
//! through Raft before the secrets are handed back; if any step fails, the tokens already made
//! are revoked at once. Refusals are in the reply's `Error` (Nomad's `RecoverableError`), as
//! Nomad answers them; the leader's revoker removes the tokens once the alloc is dead.

use futures::StreamExt;
use nomad_proto::rpc::{DeriveSiTokenRequest, DeriveSiTokenResponse, RecoverableError};

use super::{EndpointError, Endpoints};
use crate::consul::{AclServiceIdentity, AclTokenCreate, ConsulAcl, CreatedToken, si_token_description};
use crate::fsm::Command;
use crate::state::{ClusterMetadata, SiTokenAccessor};

/// `maxParallelRequestsPerDerive`.
const MAX_PARALLEL_CREATES: usize = 16;

fn refused(message: impl Into<String>, recoverable: bool) -> DeriveSiTokenResponse {
    DeriveSiTokenResponse { error: Some(RecoverableError { err: message.into(), recoverable }), ..DeriveSiTokenResponse::default() }
}

/// Go's `%q` for the names Nomad quotes in its messages.
fn q(s: &str) -> String {
    format!("{s:?}")
}

impl Endpoints {
    /// The cluster's ID: the stored one, else (on the leader) a new one written through Raft
    /// (Nomad's `Server.ClusterID`). Concurrent first callers may each propose one; the FSM
    /// keeps the first, and every caller reads back the stored one.
    pub async fn cluster_id(&self) -> Result<String, EndpointError> {
        if let Some(m) = self.store.snapshot().cluster_metadata()
            && !m.cluster_id.is_empty()
        {
            return Ok(m.cluster_id.clone());
        }
        if !self.consensus.is_leader() {
            return Err(EndpointError::Internal("cluster ID not ready yet".into()));
        }
        let metadata = ClusterMetadata { cluster_id: nomad_proto::new_id(), create_time: self.now().unix_nanos() };
        self.consensus.apply(Command::ClusterMetadata { metadata }).await?;
        self.store
            .snapshot()
            .cluster_metadata()
            .map(|m| m.cluster_id.clone())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| EndpointError::Internal("cluster ID not ready yet".into()))
    }

    /// `Node.DeriveSIToken`.
    pub async fn node_derive_si_token(&self, req: DeriveSiTokenRequest) -> Result<DeriveSiTokenResponse, EndpointError> {
        let snap = self.store.snapshot();
        self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        // `DeriveSITokenRequest.Validate`.
        if req.alloc_id.is_empty() {
            return Ok(refused("missing allocation ID", false));
        }
        if req.tasks.is_empty() {
            return Ok(refused("no tasks specified", false));
        }
        if req.tasks.len() > nomad_proto::limits::MAX_TASKS_PER_GROUP {
            return Ok(refused(format!("at most {} tasks per request", nomad_proto::limits::MAX_TASKS_PER_GROUP), false));
        }
        let Some(acl) = self.consul.acl.clone() else {
            return Ok(refused("the servers have no consul {} block, so they cannot create Consul Service Identity tokens", false));
        };
        let Some(alloc) = snap.alloc(&req.alloc_id).cloned() else {
            return Ok(refused(format!("Allocation {} does not exist", q(&req.alloc_id)), false));
        };
        if alloc.node_id != req.node_id {
            return Ok(refused(format!("Allocation {} not running on node {}", q(&req.alloc_id), q(&req.node_id)), false));
        }
        if alloc.terminal() {
            return Ok(refused("Cannot request SI token for terminal allocation", false));
        }
        let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else {
            return Ok(refused(format!("Allocation {} does not contain TaskGroup {}", q(&req.alloc_id), q(&alloc.task_group)), false));
        };
        if !group.uses_connect() {
            return Ok(refused(format!("TaskGroup {} does not use Connect", q(&group.name)), false));
        }
        // `connectTasks`. Nomad 1.6 records this error and still derives tokens for the Connect
        // tasks named beside; nomad-rs refuses the request whole, so no token is made that its
        // client would never be handed (the reply carries the error either way).
        let not_connect: Vec<&str> =
            req.tasks.iter().filter(|t| group.lookup_task(t).is_none_or(|task| !task.uses_connect())).map(String::as_str).collect();
        if !not_connect.is_empty() {
            return Ok(refused(
                format!("Requested Consul Service Identity tokens for tasks that are not Connect enabled: {}", not_connect.join(", ")),
                false,
            ));
        }
        let cluster_id = match self.cluster_id().await {
            Ok(id) => id,
            Err(e) => return Ok(refused(e.to_string(), matches!(e, EndpointError::NoLeader))),
        };
        let namespace = crate::consul::config_entries::group_namespace(group);
        let mut tasks: Vec<(String, String)> =
            req.tasks.iter().filter_map(|t| group.lookup_task(t)).map(|t| (t.name.clone(), t.kind_value().to_string())).collect();
        tasks.dedup();
        let created: Vec<(String, Result<CreatedToken, crate::consul::ConsulCallError>)> = futures::stream::iter(tasks)
            .map(|(task, service)| {
                let acl = acl.clone();
                let token = AclTokenCreate {
                    description: si_token_description(&cluster_id, &alloc.id, &task),
                    service_identities: vec![AclServiceIdentity { service_name: service }],
                    namespace: namespace.clone(),
                    local: true,
                };
                async move { (task, acl.create_token(token).await) }
            })
            .buffer_unordered(MAX_PARALLEL_CREATES)
            .collect()
            .await;
        let mut made = Vec::new();
        let mut first_error = None;
        for (task, r) in created {
            match r {
                Ok(t) => made.push((task, t)),
                Err(e) => {
                    tracing::error!(alloc_id = %alloc.id, task = %task, error = %e, "Consul Service Identity token creation for alloc failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            revoke_uncommitted(acl.as_ref(), &made).await;
            return Ok(refused(e.message, false));
        }
        let accessors: Vec<SiTokenAccessor> = made
            .iter()
            .map(|(task, t)| SiTokenAccessor {
                consul_namespace: if t.namespace.is_empty() { namespace.clone() } else { t.namespace.clone() },
                node_id: alloc.node_id.clone(),
                alloc_id: alloc.id.clone(),
                accessor_id: t.accessor_id.clone(),
                task_name: task.clone(),
                create_index: 0,
            })
            .collect();
        let index = match self.consensus.apply(Command::SiTokenAccessorsRegister { accessors }).await {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(alloc_id = %alloc.id, error = %e, "registering Service Identity token accessors for alloc failed");
                revoke_uncommitted(acl.as_ref(), &made).await;
                let recoverable = matches!(e, crate::consensus::ApplyError::NoLeader);
                return Ok(refused(EndpointError::from(e).to_string(), recoverable));
            }
        };
        Ok(DeriveSiTokenResponse { tokens: made.into_iter().map(|(task, t)| (task, t.secret_id)).collect(), error: None, index })
    }
}

/// Best effort for tokens that were never stored (Nomad's `RevokeTokens(..., false)`): a
/// failure is logged; such a token is lost track of, as in Nomad.
async fn revoke_uncommitted(acl: &dyn ConsulAcl, made: &[(String, CreatedToken)]) {
    for (task, t) in made {
        if let Err(e) = acl.revoke_token(&t.namespace, &t.accessor_id).await {
            tracing::warn!(task = %task, error = %e, "failed to revoke an SI token that was never stored");
        }
    }
}
