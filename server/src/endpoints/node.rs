//! `Node.*` RPCs: register, heartbeat, client alloc updates, alloc watch;
//! and the heartbeat-expiry path.
//!
//! The reconnect protocol is enforced here, server-side, so clients can keep
//! making their calls concurrently and in any order:
//! - `Register` never changes a known node's status;
//! - `UpdateStatus` moves a `disconnected` node to `initializing`, and keeps
//!   an `initializing` node there until its alloc updates since its last
//!   missed heartbeat have landed (`LastAllocUpdateIndex > LastMissedHeartbeatIndex`);
//! - `UpdateAlloc` is refused while the node is `disconnected` or `down`.

use std::collections::BTreeSet;
use std::time::Duration;

use nomad_proto::eval::trigger;
use nomad_proto::node::event_subsystem;
use nomad_proto::rpc::{
    AclPolicyRules, AllocUpdateRequest, AllocsGetRequest, AllocsGetResponse, GenericResponse, NodeClientAllocsResponse,
    NodeRegisterRequest, NodeResolveTokenRequest, NodeResolveTokenResponse, NodeServerInfo, NodeSpecificRequest, NodeUpdateResponse,
    NodeUpdateStatusRequest,
};
use nomad_proto::{ClientStatus, DesiredStatus, EvalStatus, Evaluation, NamespacedId, Node, NodeEvent, NodeStatus, Timestamp};

use super::node_evals::{create_node_evals, should_create_node_eval, status_transition_requires_eval};
use super::{EndpointError, Endpoints};
use crate::fsm::Command;
use crate::heartbeat::HeartbeatExpiry;
use crate::state::{State, Table, Watch};

/// Compares two secrets in time that depends only on their lengths, not on where they first
/// differ, so a caller cannot guess a node's SecretID byte by byte from response times.
fn secrets_equal(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the compiler from turning the fold back into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

impl Endpoints {
    pub(super) fn authenticate_node<'s>(
        &self,
        state: &'s State,
        node_id: &str,
        secret: &str,
    ) -> Result<&'s std::sync::Arc<Node>, EndpointError> {
        if node_id.is_empty() {
            return Err(EndpointError::BadRequest("missing node ID".into()));
        }
        let node = state.node(node_id).ok_or_else(|| EndpointError::NotFound(format!("node {node_id} not found")))?;
        if secret.is_empty() || !secrets_equal(&node.secret_id, secret) {
            return Err(EndpointError::PermissionDenied("node secret ID does not match".into()));
        }
        Ok(node)
    }

    /// Checks a node RPC's NodeID and SecretID against this server's state (no write, so a
    /// follower answers it itself).
    pub fn authenticate_node_rpc(&self, node_id: &str, secret: &str) -> Result<(), EndpointError> {
        let snap = self.store.snapshot();
        self.authenticate_node(&snap, node_id, secret).map(drop)
    }

    fn servers(&self) -> Vec<NodeServerInfo> {
        self.consensus
            .peers()
            .into_iter()
            .map(|addr| NodeServerInfo { rpc_advertise_addr: addr, datacenter: self.config.datacenter.clone() })
            .collect()
    }

    fn heartbeat_ttl(&self, node_id: &str) -> Result<Duration, EndpointError> {
        self.heartbeats.reset(node_id).map_err(|e| EndpointError::Internal(e.to_string()))
    }

    /// `Node.Register`.
    pub async fn node_register(&self, req: NodeRegisterRequest) -> Result<NodeUpdateResponse, EndpointError> {
        let mut node = req.node;
        let missing = |what: &str| EndpointError::BadRequest(format!("missing {what} for client registration"));
        if node.id.is_empty() {
            return Err(missing("node ID"));
        }
        if node.datacenter.is_empty() {
            return Err(missing("datacenter"));
        }
        if node.name.is_empty() {
            return Err(missing("node name"));
        }
        if node.attributes.is_empty() {
            return Err(missing("attributes"));
        }
        if node.secret_id.is_empty() {
            return Err(missing("node secret ID"));
        }
        // Sizes, resource bounds and the fields that reach URLs, paths and logs (nomad_proto::validate).
        node.check_limits().map_err(|e| EndpointError::BadRequest(e.to_string()))?;
        node.validate_registration().map_err(EndpointError::BadRequest)?;
        if node.node_pool == nomad_proto::job::ALL_NODE_POOL {
            return Err(EndpointError::BadRequest("node is not allowed to register in node pool \"all\"".into()));
        }
        if node.node_pool.is_empty() {
            node.node_pool = nomad_proto::job::DEFAULT_NODE_POOL.to_string();
        }
        let now = self.now();
        node.status_updated_at = now.unix_secs();
        let snap = self.store.snapshot();
        let original = snap.node(&node.id).cloned();
        if let Some(orig) = &original {
            if !secrets_equal(&orig.secret_id, &node.secret_id) {
                return Err(EndpointError::PermissionDenied("node secret ID does not match. Not registering node.".into()));
            }
            // A known node's status is only ever changed by UpdateStatus and heartbeat expiry.
            node.status = orig.status;
        }
        node.compute_class();
        let evals = if should_create_node_eval(original.as_deref(), &node) {
            create_node_evals(&snap, &node, snap.index + 1, now)
        } else {
            Vec::new()
        };
        let eval_ids: Vec<String> = evals.iter().map(|e| e.id.clone()).collect();
        let status = node.status;
        let node_id = node.id.clone();
        let index = self.consensus.apply(Command::NodeRegister { node, evals, now }).await?;
        let ttl = if status != NodeStatus::Down { self.heartbeat_ttl(&node_id)? } else { Duration::ZERO };
        Ok(self.update_response(status, index, eval_ids, ttl))
    }

    /// `Node.UpdateStatus`: the heartbeat, with the reconnect gate.
    pub async fn node_update_status(&self, req: NodeUpdateStatusRequest) -> Result<NodeUpdateResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = self.authenticate_node(&snap, &req.node_id, &req.secret_id)?.clone();
        let mut status = req.status;
        match (node.status, status) {
            (NodeStatus::Initializing, NodeStatus::Ready) => {
                let mut live = snap.allocs_by_node(&node.id).filter(|a| !a.terminal()).peekable();
                let has_live_allocs = live.peek().is_some();
                // Nomad's gate: no alloc update has landed since the missed heartbeat.
                let stale = has_live_allocs && node.last_alloc_update_index <= node.last_missed_heartbeat_index;
                // And ours: an update that covered only some allocs opens Nomad's gate while
                // others are still `unknown`; the scheduler would then replace those on a
                // ready node whose client still runs them.
                let unreported = live.any(|a| a.client_status == ClientStatus::Unknown);
                if stale || unreported {
                    status = NodeStatus::Initializing;
                }
            }
            (NodeStatus::Disconnected, NodeStatus::Ready) => status = NodeStatus::Initializing,
            // A down node comes straight back (Nomad), unless the scheduler has not yet
            // turned its `unknown` allocs into lost ones: then it returns like a disconnected
            // node, through the gate above, instead of being ready while they look replaceable.
            (NodeStatus::Down, NodeStatus::Ready)
                if snap.allocs_by_node(&node.id).any(|a| !a.terminal() && a.client_status == ClientStatus::Unknown) =>
            {
                status = NodeStatus::Initializing
            }
            _ => {}
        }
        let mut event = req.node_event.clone();
        if node.status == NodeStatus::Down && status == NodeStatus::Ready && event.is_none() {
            event = Some(NodeEvent {
                message: "Node reregistered by heartbeat".into(),
                subsystem: event_subsystem::CLUSTER.into(),
                timestamp: self.now(),
                ..NodeEvent::default()
            });
        }
        self.write_node_status(&snap, &node, status, event, req.updated_at).await
    }

    /// Writes a status change (if there is one) with its evals, then keeps
    /// or drops the node's heartbeat timer.
    async fn write_node_status(
        &self,
        snap: &State,
        node: &Node,
        status: NodeStatus,
        event: Option<NodeEvent>,
        updated_at: i64,
    ) -> Result<NodeUpdateResponse, EndpointError> {
        let now = self.now();
        let mut index = 0;
        let mut eval_ids = Vec::new();
        if node.status != status || event.is_some() {
            let evals = if status == NodeStatus::Down || status_transition_requires_eval(status, node.status) {
                create_node_evals(snap, node, snap.index + 1, now)
            } else {
                Vec::new()
            };
            eval_ids = evals.iter().map(|e| e.id.clone()).collect();
            let updated_at = if updated_at == 0 { now.unix_secs() } else { updated_at };
            index = self.consensus.apply(Command::NodeUpdateStatus { node_id: node.id.clone(), status, event, updated_at, evals }).await?;
        }
        let ttl = if status == NodeStatus::Down {
            self.heartbeats.remove(&node.id);
            Duration::ZERO
        } else {
            self.heartbeat_ttl(&node.id)?
        };
        Ok(self.update_response(status, index, eval_ids, ttl))
    }

    /// The reply to `Register` and `UpdateStatus`: what the client needs to keep going.
    fn update_response(&self, status: NodeStatus, index: u64, eval_ids: Vec<String>, ttl: Duration) -> NodeUpdateResponse {
        NodeUpdateResponse {
            heartbeat_ttl: ttl.as_nanos() as i64,
            eval_create_index: if eval_ids.is_empty() { 0 } else { index },
            eval_ids,
            node_modify_index: index,
            leader_rpc_addr: self.consensus.leader_rpc_addr().unwrap_or_default(),
            leader_http_addr: self.config.http_addr.clone(),
            num_nodes: self.store.snapshot().node_count() as i64,
            servers: self.servers(),
            status,
            index,
        }
    }

    /// A node's heartbeat deadline passed: it becomes `disconnected` if it
    /// runs a desired-run, unexpired alloc whose group tolerates disconnects,
    /// otherwise `down`. An `initializing` node goes `down`.
    pub async fn node_heartbeat_missed(&self, node_id: &str) -> Result<NodeStatus, EndpointError> {
        if !self.consensus.is_leader() {
            return Err(EndpointError::Internal("failed to reset heartbeat since server is not leader".into()));
        }
        let snap = self.store.snapshot();
        let Some(node) = snap.node(node_id).cloned() else {
            return Err(EndpointError::NotFound(format!("node {node_id} not found")));
        };
        let now = self.now();
        let can_disconnect = !matches!(node.status, NodeStatus::Down | NodeStatus::Initializing)
            && snap
                .allocs_by_node(node_id)
                .any(|a| a.max_client_disconnect().is_some_and(|d| d > 0) && a.desired_status == DesiredStatus::Run && !a.expired(now));
        let status = if can_disconnect { NodeStatus::Disconnected } else { NodeStatus::Down };
        let event = NodeEvent {
            message: "Node heartbeat missed".into(),
            subsystem: event_subsystem::CLUSTER.into(),
            timestamp: now,
            ..NodeEvent::default()
        };
        self.write_node_status(&snap, &node, status, Some(event), now.unix_secs()).await?;
        Ok(status)
    }

    /// `Node.UpdateAlloc`: client-side alloc status, refused from
    /// unresponsive nodes. Creates `reconnect` evals for allocs that were
    /// `unknown` and `alloc-failure` evals for reschedulable failures.
    pub async fn node_update_alloc(&self, req: AllocUpdateRequest) -> Result<GenericResponse, EndpointError> {
        let first = req.alloc.first().ok_or_else(|| EndpointError::BadRequest("must update at least one allocation".into()))?;
        let snap = self.store.snapshot();
        let node_id = first.node_id.clone();
        if node_id.is_empty() {
            return Err(EndpointError::BadRequest("missing node ID".into()));
        }
        let node = self.authenticate_node(&snap, &node_id, &req.secret_id)?;
        if node.status.is_unresponsive() {
            return Err(EndpointError::BadRequest(format!(
                "node {node_id} is not allowed to update allocs while in status {}",
                node.status
            )));
        }
        if !req.evals.is_empty() {
            return Err(EndpointError::BadRequest("evals field must not be set".into()));
        }
        if let Some(other) = req.alloc.iter().find(|a| a.node_id != node_id) {
            return Err(EndpointError::PermissionDenied(format!("alloc {} does not belong to node {node_id}", other.id)));
        }
        let now = self.now();
        let mut evals: Vec<Evaluation> = Vec::new();
        let mut seen: BTreeSet<NamespacedId> = BTreeSet::new();
        for update in &req.alloc {
            let Some(stored) = snap.alloc(&update.id) else { continue };
            if stored.node_id != node_id {
                return Err(EndpointError::PermissionDenied(format!("alloc {} does not belong to node {node_id}", stored.id)));
            }
            if !update.client_status.is_terminal() && stored.client_status != ClientStatus::Unknown {
                continue;
            }
            let job = snap.job(&stored.namespace, &stored.job_id);
            let (priority, eval_type) = match (job, &stored.job) {
                (Some(j), _) | (None, Some(j)) => (j.priority, j.job_type),
                (None, None) => (nomad_proto::job::DEFAULT_JOB_PRIORITY, Default::default()),
            };
            let trigger = if job.is_none() {
                trigger::JOB_DEREGISTER
            } else if stored.client_status == ClientStatus::Unknown {
                trigger::RECONNECT
            } else if update.client_status == ClientStatus::Failed && stored.followup_eval_id.is_empty() && reschedule_eligible(stored, now)
            {
                trigger::RETRY_FAILED_ALLOC
            } else {
                continue;
            };
            if seen.insert(NamespacedId::new(&stored.namespace, &stored.job_id)) {
                evals.push(Evaluation {
                    id: nomad_proto::new_id(),
                    namespace: stored.namespace.clone(),
                    priority,
                    eval_type,
                    triggered_by: trigger.to_string(),
                    job_id: stored.job_id.clone(),
                    status: EvalStatus::Pending,
                    create_time: now.unix_nanos(),
                    modify_time: now.unix_nanos(),
                    ..Evaluation::default()
                });
            }
        }
        let allocs = req.alloc.into_iter().map(nomad_proto::Allocation::into_client_update).collect();
        let index = self.consensus.apply(Command::AllocClientUpdate { allocs, evals, now }).await?;
        Ok(GenericResponse { index })
    }

    /// `Node.GetClientAllocs`: alloc ID → AllocModifyIndex for the node's
    /// allocs, blocking until something newer than `min_query_index`.
    pub async fn node_get_client_allocs(&self, req: NodeSpecificRequest) -> Result<NodeClientAllocsResponse, EndpointError> {
        {
            let snap = self.store.snapshot();
            self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        }
        let wait = self.query_wait(req.max_query_time);
        let node_id = req.node_id.clone();
        let (allocs, index) = self
            .store
            // Only writes to this node's allocs wake it (not every client's).
            .blocking_query_on(&[Watch::NodeAllocs(node_id.clone())], req.min_query_index, wait, |s| {
                let mut max = s.alloc_removed_index(&node_id);
                let allocs = s
                    .allocs_by_node(&node_id)
                    .map(|a| {
                        max = max.max(a.modify_index);
                        (a.id.clone(), a.alloc_modify_index)
                    })
                    .collect();
                (allocs, if max == 0 { s.table_index(Table::Allocs) } else { max })
            })
            .await;
        Ok(NodeClientAllocsResponse { allocs, migrate_tokens: Default::default(), index })
    }

    /// `Alloc.GetAllocs` for a node: its own allocs only.
    pub async fn alloc_get_allocs(&self, req: AllocsGetRequest) -> Result<AllocsGetResponse, EndpointError> {
        {
            let snap = self.store.snapshot();
            self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        }
        let wait = self.query_wait(req.max_query_time);
        let (allocs, index) = self
            .store
            .blocking_query(&[Table::Allocs], req.min_query_index, wait, |s| {
                let allocs = req
                    .alloc_ids
                    .iter()
                    .filter_map(|id| s.alloc(id))
                    .filter(|a| a.node_id == req.node_id)
                    .map(|a| (**a).clone())
                    .collect::<Vec<_>>();
                (allocs, s.table_index(Table::Allocs))
            })
            .await;
        Ok(AllocsGetResponse { allocs, index })
    }

    pub(super) fn query_wait(&self, requested_ns: i64) -> Duration {
        let max = self.config.max_query_time;
        if requested_ns <= 0 { max } else { Duration::from_nanos(requested_ns as u64).min(max) }
    }
}

/// The group's reschedule policy allows another attempt now.
fn reschedule_eligible(alloc: &nomad_proto::Allocation, now: Timestamp) -> bool {
    let Some(policy) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)).and_then(|g| g.reschedule_policy.as_ref())
    else {
        return false;
    };
    if policy.unlimited {
        return true;
    }
    if policy.attempts <= 0 {
        return false;
    }
    let window_start = now.unix_nanos() - policy.interval;
    let used =
        alloc.reschedule_tracker.as_ref().map(|t| t.events.iter().filter(|e| e.reschedule_time >= window_start).count()).unwrap_or(0);
    (used as i64) < policy.attempts
}

impl HeartbeatExpiry for Endpoints {
    fn node_expired(&self, node_id: String) -> crate::consensus::BoxFuture<'_, ()> {
        Box::pin(async move {
            match self.node_heartbeat_missed(&node_id).await {
                Ok(status) => tracing::warn!(node_id, %status, "node missed its heartbeat"),
                Err(e) => tracing::error!(node_id, error = %e, "updating node after a missed heartbeat failed"),
            }
        })
    }
}

impl Endpoints {
    /// `Node.ResolveToken`: who the caller of a client agent's HTTP API is. The node must
    /// authenticate; the answer is the token's accessor, type and expiry and the rules of its
    /// policies (directly and through roles), or Nomad's refusal text, for the client to
    /// compile and cache. Answered from this server's state (as Nomad's stale reads).
    pub fn node_resolve_token(&self, req: NodeResolveTokenRequest) -> Result<NodeResolveTokenResponse, EndpointError> {
        self.authenticate_node_rpc(&req.node_id, &req.secret_id)?;
        if !self.acl_config().enabled {
            return Ok(NodeResolveTokenResponse { error: "ACL support disabled".into(), ..NodeResolveTokenResponse::default() });
        }
        let snap = self.store.snapshot();
        let id = match crate::acl::resolve(&snap, &self.keyring, &req.auth_token, Timestamp::now()) {
            Ok(id) => id,
            Err(e) => return Ok(NodeResolveTokenResponse { error: e.to_string(), ..NodeResolveTokenResponse::default() }),
        };
        let policies = crate::acl::policy_names(&snap, &id.token)
            .iter()
            .filter_map(|n| snap.acl_policy(n))
            .map(|p| AclPolicyRules { name: p.name.clone(), rules: p.rules.clone() })
            .collect();
        Ok(NodeResolveTokenResponse {
            accessor_id: id.token.accessor_id.clone(),
            token_type: id.token.token_type.clone(),
            expiration_time: id.token.expiration_time,
            policies,
            error: String::new(),
        })
    }
}

#[cfg(test)]
mod secret_tests {
    use super::secrets_equal;

    #[test]
    fn secrets_are_equal_only_when_every_byte_is() {
        let secret = "8f2b6c3e-1d4a-4e5f-9a0b-7c6d5e4f3a2b";
        assert!(secrets_equal(secret, secret));
        assert!(secrets_equal("", ""));
        // A difference in the first, a middle and the last byte is found wherever it is.
        for at in [0, secret.len() / 2, secret.len() - 1] {
            let mut other = secret.as_bytes().to_vec();
            other[at] ^= 0x01;
            assert!(!secrets_equal(secret, std::str::from_utf8(&other).unwrap()), "differs at {at}");
        }
        assert!(!secrets_equal(secret, &secret[..secret.len() - 1]), "a prefix is not the secret");
        assert!(!secrets_equal(&secret[..1], secret));
        assert!(!secrets_equal(secret, ""));
    }
}
