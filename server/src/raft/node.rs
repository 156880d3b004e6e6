//! [`RaftNode`]: starting Raft on a data dir, and the calls the rest of the server makes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError as OpenraftError};
use openraft::{BasicNode, ChangeMembers, Config, Raft, RaftMetrics, SnapshotPolicy};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::log_store::LogStore;
use super::network::{Network, PeerClient, PeerPool};
use super::rpc::{JoinRequest, Refusal};
use super::service::RaftService;
use super::state_machine::StateMachine;
use super::{NodeId, RaftConfig, RaftError, RaftPeer, TypeConfig, bootstrap};
use crate::fsm::{ApplyResult, Command, Fsm};

/// A write committed and applied by this server as leader.
struct Applied {
    index: u64,
    result: ApplyResult,
}

/// How often `apply` re-checks for a leader while waiting for one.
const LEADER_RECHECK: Duration = Duration::from_millis(100);

/// State shared by the handle, the gRPC service and the background tasks.
pub(crate) struct Shared {
    pub(crate) id: NodeId,
    pub(crate) addr: String,
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) pool: Arc<PeerPool>,
    pub(crate) apply_timeout: Duration,
}

/// What one attempt at a write came to.
enum Attempt {
    Done(Applied),
    /// Nothing was written; try again once the leader may have changed. The error is what to
    /// report if time runs out.
    Retry(RaftError),
    Failed(RaftError),
}

impl Shared {
    /// The current leader's id and address, as this server knows it.
    pub(crate) fn leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let id = metrics.current_leader?;
        let node = metrics.membership_config.membership().get_node(&id)?;
        Some((id, node.addr.clone()))
    }

    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state.is_leader() && metrics.current_leader == Some(self.id)
    }

    /// Writes through the local Raft, which must be the leader.
    async fn write_local(&self, command: Arc<Command>) -> Result<Applied, Refusal> {
        match self.raft.client_write(command).await {
            Ok(response) => Ok(Applied { index: response.log_id.index, result: response.data }),
            Err(e) => Err(refusal(e)),
        }
    }

    async fn write_here(&self, command: Arc<Command>, timeout: Duration) -> Attempt {
        match tokio::time::timeout(timeout, self.write_local(command)).await {
            Err(_) => Attempt::Failed(RaftError::CommitTimeout(self.apply_timeout)),
            Ok(Ok(applied)) => Attempt::Done(applied),
            Ok(Err(Refusal::NotLeader)) => Attempt::Retry(RaftError::NoLeader),
            Ok(Err(Refusal::Failed(message))) => Attempt::Failed(RaftError::Raft(message)),
        }
    }

    /// Handles `Join`: on the leader adds the server as a voter, elsewhere passes the request to the leader once.
    pub(crate) async fn join(&self, request: JoinRequest) -> Result<(), Refusal> {
        match self.add_voter(request.node_id, &request.addr).await {
            Err(Refusal::NotLeader) if !request.forwarded => {}
            outcome => return outcome,
        }
        let forwarded = JoinRequest { forwarded: true, ..request };
        self.to_leader("join", |mut client| async move { client.join(forwarded).await }).await
    }

    /// Passes a request this server could not carry out (it is not the leader) to the leader,
    /// once; `what` names it in errors.
    async fn to_leader<F, Fut>(&self, what: &str, call: F) -> Result<(), Refusal>
    where
        F: FnOnce(PeerClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Result<(), Refusal>>, tonic::Status>>,
    {
        let (_, leader) = self.leader().ok_or(Refusal::NotLeader)?;
        let client = self.pool.client(&leader).map_err(|e| Refusal::Failed(e.to_string()))?;
        match tokio::time::timeout(self.apply_timeout, call(client)).await {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) => Err(Refusal::Failed(format!("forwarding {what} to leader {leader}: {}", status.message()))),
            Err(_) => Err(Refusal::Failed(format!("forwarding {what} to leader {leader}: timed out"))),
        }
    }

    /// Whether `addr` is server `id` (its `Info` says so).
    async fn check_identity(&self, id: NodeId, addr: &str) -> Result<(), Refusal> {
        if id == self.id && addr == self.addr {
            return Ok(());
        }
        let mut client = self.pool.client(addr).map_err(|e| Refusal::Failed(format!("reaching {addr}: {e}")))?;
        match tokio::time::timeout(self.apply_timeout, client.info(super::rpc::InfoRequest {})).await {
            Ok(Ok(reply)) if reply.get_ref().node_id == id => Ok(()),
            Ok(Ok(reply)) => Err(Refusal::Failed(format!("{addr} is server {}, not server {id}", reply.get_ref().node_id))),
            Ok(Err(status)) => Err(Refusal::Failed(format!("reaching {addr}: {}", status.message()))),
            Err(_) => Err(Refusal::Failed(format!("reaching {addr}: timed out"))),
        }
    }

    /// Removes a server (voter or learner) from the configuration; only the leader can.
    async fn remove_voter(&self, id: NodeId) -> Result<(), Refusal> {
        if !self.is_leader() {
            return Err(Refusal::NotLeader);
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        if membership.get_node(&id).is_none() {
            return Err(Refusal::Failed(format!("no server with id {id} in the raft configuration")));
        }
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        if voters.len() == 1 && voters.contains(&id) {
            return Err(Refusal::Failed("refusing to remove the only voting server".into()));
        }
        let change = if voters.contains(&id) { ChangeMembers::RemoveVoters([id].into()) } else { ChangeMembers::RemoveNodes([id].into()) };
        // Not retained as a learner: the server is gone for good.
        self.raft.change_membership(change, false).await.map_err(refusal)?;
        tracing::info!(node_id = id, "removed server from the raft cluster");
        Ok(())
    }

    /// Adds a server as a learner, then promotes it to voter; a no-op for a voter. A member that
    /// asks from a new address (it moved) has its address updated, once the new address answers
    /// with its id: recording another server's address for it could split the cluster.
    async fn add_voter(&self, id: NodeId, addr: &str) -> Result<(), Refusal> {
        if !self.is_leader() {
            return Err(Refusal::NotLeader);
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        if let Some(old) = membership.membership().get_node(&id).map(|n| n.addr.clone())
            && old != addr
        {
            self.check_identity(id, addr).await?;
            let nodes = BTreeMap::from([(id, BasicNode::new(addr))]);
            self.raft.change_membership(ChangeMembers::SetNodes(nodes), false).await.map_err(refusal)?;
            tracing::info!(node_id = id, old = %old, addr, "server moved: recorded its new address");
        }
        if membership.voter_ids().any(|voter| voter == id) {
            return Ok(());
        }
        if membership.membership().get_node(&id).is_none() {
            // Not blocking: committing the joint configuration needs a majority of the old voters and
            // of the new set, which the old voters give on their own; the learner catches up meanwhile.
            self.raft.add_learner(id, BasicNode::new(addr), false).await.map_err(refusal)?;
        }
        self.raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false).await.map_err(refusal)?;
        tracing::info!(node_id = id, addr, "added server to the raft cluster");
        Ok(())
    }
}

fn refusal(e: OpenraftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> Refusal {
    match e {
        OpenraftError::APIError(ClientWriteError::ForwardToLeader(_)) => Refusal::NotLeader,
        e => Refusal::Failed(e.to_string()),
    }
}

/// The server's handle on Raft. Cheap to clone.
#[derive(Clone)]
pub struct RaftNode {
    pub(super) shared: Arc<Shared>,
    leader: watch::Receiver<Option<NodeId>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl RaftNode {
    /// Opens the Raft state under `<data_dir>/raft` (restoring the FSM from the latest snapshot and
    /// re-applying committed entries), starts Raft and, if needed, cluster formation in the background.
    /// Binds no port: serve [`RaftNode::service`] on the server's RPC listener.
    pub async fn start(cfg: RaftConfig, fsm: Arc<dyn Fsm>) -> Result<RaftNode, RaftError> {
        let raft_dir = cfg.data_dir.join("raft");
        std::fs::create_dir_all(&raft_dir)
            .map_err(|source| RaftError::Io { context: format!("creating {}", raft_dir.display()), source })?;
        let id = bootstrap::node_id(&raft_dir, cfg.node_id)?;
        let log_store = LogStore::open(&raft_dir.join("raft.redb"))?;
        let state_machine = StateMachine::open(raft_dir.join("snapshots"), fsm, log_store.unapplied())?;
        let pool = Arc::new(PeerPool::new(cfg.auth.clone()));
        let network = Network::new(id, pool.clone());
        let raft = Raft::new(id, openraft_config(&cfg)?, network, log_store, state_machine)
            .await
            .map_err(|e| RaftError::Storage(format!("starting raft: {e}")))?;
        let shared = Arc::new(Shared { id, addr: cfg.advertise_rpc.clone(), raft, pool, apply_timeout: cfg.apply_timeout() });
        let initialized = shared.raft.is_initialized().await.map_err(|e| RaftError::Raft(e.to_string()))?;
        tracing::info!(node_id = id, addr = %shared.addr, initialized, "raft started");

        let (leader, leader_task) = watch_leader(&shared.raft);
        let mut tasks = vec![leader_task];
        if !initialized {
            if cfg.bootstrap_expect == 1 {
                let members = BTreeMap::from([(id, BasicNode::new(&shared.addr))]);
                shared.raft.initialize(members).await.map_err(|e| RaftError::Raft(format!("initializing: {e}")))?;
                tracing::info!(node_id = id, "initialized a single-server raft cluster");
            } else {
                tasks.push(tokio::spawn(bootstrap::form_cluster(shared.clone(), cfg.bootstrap_expect, cfg.join)));
            }
        } else {
            tasks.push(tokio::spawn(bootstrap::record_moved_address(shared.clone())));
        }
        Ok(RaftNode { shared, leader, tasks: Arc::new(Mutex::new(tasks)) })
    }

    /// The `Raft` gRPC service, to mount beside the client-facing services.
    pub fn service(&self) -> super::rpc::RaftServer<RaftService> {
        RaftService::server(self.shared.clone())
    }

    /// Commits `cmd` and returns its Raft index and the FSM's result. Only the leader writes: a
    /// command never travels to another server (a follower forwards the API request that makes
    /// it instead, see `crate::http::forward`), so on a follower this fails with
    /// [`RaftError::NotLeader`]. While no leader is known it waits, at most the apply timeout,
    /// for one; with none in that time it fails with [`RaftError::NoLeader`].
    pub async fn apply(&self, cmd: Command) -> Result<(u64, ApplyResult), RaftError> {
        let cmd = Arc::new(cmd);
        let deadline = Instant::now() + self.shared.apply_timeout;
        let mut leader_changed = self.leader.clone();
        let mut last_error = RaftError::NoLeader;
        loop {
            leader_changed.borrow_and_update();
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(last_error);
            }
            let attempt = match self.shared.leader() {
                None => Attempt::Retry(RaftError::NoLeader),
                Some((id, _)) if id == self.shared.id => self.shared.write_here(cmd.clone(), remaining).await,
                Some(_) => Attempt::Failed(RaftError::NotLeader),
            };
            last_error = match attempt {
                Attempt::Done(applied) => return Ok((applied.index, applied.result)),
                Attempt::Failed(e) => return Err(e),
                Attempt::Retry(e) => e,
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            // Wake on a leader change, and re-check now and then: a known leader may come back.
            if let Ok(Err(_)) = tokio::time::timeout(remaining.min(LEADER_RECHECK), leader_changed.changed()).await {
                return Err(RaftError::Shutdown);
            }
        }
    }

    /// This server's Raft id.
    pub fn node_id(&self) -> NodeId {
        self.shared.id
    }

    /// Whether this server is the leader now.
    pub fn is_leader(&self) -> bool {
        self.shared.is_leader()
    }

    /// The leader's id as it changes (`None` while there is none); compare with [`RaftNode::node_id`]
    /// to start and stop leader-only subsystems.
    pub fn leader_changes(&self) -> watch::Receiver<Option<NodeId>> {
        self.leader.clone()
    }

    /// The leader's RPC address, if one is known.
    pub fn leader_addr(&self) -> Option<String> {
        self.shared.leader().map(|(_, addr)| addr)
    }

    /// Every server in the configuration (voters and learners), by Raft id.
    pub fn configuration(&self) -> Vec<RaftPeer> {
        let metrics = self.shared.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| RaftPeer {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
                leader: metrics.current_leader == Some(*id),
            })
            .collect()
    }

    /// Takes a server out of the cluster; only the leader can (the operator API forwards the
    /// request to it). See [`RaftPeer`].
    pub async fn remove_peer(&self, id: NodeId) -> Result<(), RaftError> {
        match self.shared.remove_voter(id).await {
            Ok(()) => Ok(()),
            Err(Refusal::NotLeader) => Err(RaftError::NotLeader),
            Err(Refusal::Failed(message)) => Err(RaftError::Raft(message)),
        }
    }

    /// RPC addresses of the voting servers.
    pub fn peers(&self) -> Vec<String> {
        let membership = self.shared.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        membership.voter_ids().filter_map(|id| membership.get_node(&id).map(|node| node.addr.clone())).collect()
    }

    /// Raft's metrics (state, term, log indexes, membership), for status endpoints.
    pub fn metrics(&self) -> watch::Receiver<RaftMetrics<NodeId, BasicNode>> {
        self.shared.raft.metrics()
    }

    /// On the leader: confirms leadership with a quorum and waits until the local FSM has applied
    /// everything committed before; returns that index. Run it after winning an election, before
    /// leader-only subsystems read state.
    pub async fn barrier(&self) -> Result<u64, RaftError> {
        match tokio::time::timeout(self.shared.apply_timeout, self.shared.raft.ensure_linearizable()).await {
            Err(_) => Err(RaftError::CommitTimeout(self.shared.apply_timeout)),
            Ok(Ok(log_id)) => Ok(log_id.map_or(0, |id| id.index)),
            Ok(Err(e)) if e.forward_to_leader::<BasicNode>().is_some() => Err(RaftError::NotLeader),
            Ok(Err(e)) => Err(RaftError::Raft(e.to_string())),
        }
    }

    /// Stops background tasks and Raft. Writes acknowledged before are durable.
    pub async fn shutdown(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        for task in tasks {
            task.abort();
        }
        if let Err(e) = self.shared.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

fn openraft_config(cfg: &RaftConfig) -> Result<Arc<Config>, RaftError> {
    let config = Config {
        cluster_name: "nomad-rs".to_string(),
        heartbeat_interval: cfg.heartbeat_interval_ms,
        election_timeout_min: cfg.election_timeout_min_ms,
        election_timeout_max: cfg.election_timeout_max_ms,
        // Per snapshot chunk. The JSON codec sends bytes as numbers (~3.5x), so keep chunks moderate.
        install_snapshot_timeout: cfg.election_timeout_max_ms.max(2000),
        snapshot_max_chunk_size: 1 << 20,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_logs),
        // Keep some log behind the snapshot so a briefly lagging follower catches up without one.
        max_in_snapshot_log_to_keep: cfg.snapshot_logs.min(1000),
        ..Config::default()
    };
    config.validate().map(Arc::new).map_err(|e| RaftError::Config(e.to_string()))
}

/// Mirrors openraft's metrics into a channel that changes only when the leader does.
fn watch_leader(raft: &Raft<TypeConfig>) -> (watch::Receiver<Option<NodeId>>, JoinHandle<()>) {
    let mut metrics = raft.metrics();
    let (leader_tx, leader_rx) = watch::channel(metrics.borrow().current_leader);
    let task = tokio::spawn(async move {
        loop {
            let leader = metrics.borrow_and_update().current_leader;
            leader_tx.send_if_modified(|current| std::mem::replace(current, leader) != leader);
            if metrics.changed().await.is_err() {
                break;
            }
        }
        leader_tx.send_replace(None);
    });
    (leader_rx, task)
}
