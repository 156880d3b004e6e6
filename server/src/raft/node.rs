//! [`RaftNode`]: starting Raft on a data dir, and the calls the rest of the server makes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError as OpenraftError};
use openraft::{BasicNode, ChangeMembers, Config, Raft, RaftMetrics, SnapshotPolicy};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::log_store::{LogStore, StorageFault};
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

/// How long a server may take to answer [`RaftNode::members`]' `Info` before it counts as failed.
const MEMBER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A server of the Raft configuration and whether it answers now (`/v1/agent/members`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftMember {
    /// Raft id.
    pub id: NodeId,
    /// Advertised RPC address.
    pub addr: String,
    /// Its member name (`<name>.<region>`) as it last told it; its address while never heard from.
    pub name: String,
    /// Votes (a learner does not).
    pub voter: bool,
    /// It answered just now (this server: its Raft runs).
    pub alive: bool,
}

/// State shared by the handle, the gRPC service and the background tasks.
pub(crate) struct Shared {
    pub(crate) id: NodeId,
    pub(crate) addr: String,
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) pool: Arc<PeerPool>,
    pub(crate) apply_timeout: Duration,
    /// Tests make the log store's writes fail through it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) storage_fault: Arc<StorageFault>,
    /// This server's member name (`<name>.<region>`).
    name: Mutex<String>,
    /// Peers' member names, as they last answered `Info`, so a server that has stopped is
    /// still reported under its name.
    peer_names: Mutex<BTreeMap<NodeId, String>>,
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
    pub(crate) fn name(&self) -> String {
        self.name.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Asks `addr` who it is: its member name if it is server `id` and answers in time.
    async fn probe(&self, id: NodeId, addr: &str) -> Option<String> {
        let mut client = self.pool.client(addr).ok()?;
        let reply = tokio::time::timeout(MEMBER_PROBE_TIMEOUT, client.info(super::rpc::InfoRequest {})).await.ok()?.ok()?.into_inner();
        if reply.node_id != id {
            return None;
        }
        if !reply.name.is_empty() {
            self.peer_names.lock().unwrap_or_else(|e| e.into_inner()).insert(id, reply.name.clone());
        }
        Some(reply.name)
    }

    /// The current leader's id and address, as this server knows it.
    pub(crate) fn leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let id = leader_in(&metrics)?;
        let node = metrics.membership_config.membership().get_node(&id)?;
        Some((id, node.addr.clone()))
    }

    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state.is_leader() && leader_in(&metrics) == Some(self.id)
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

/// The leader as these metrics tell it; none once Raft has stopped, whatever it last knew: a
/// server whose Raft stopped (a storage failure) must not keep calling itself or anyone leader.
fn leader_in(metrics: &RaftMetrics<NodeId, BasicNode>) -> Option<NodeId> {
    if metrics.running_state.is_err() || metrics.state == openraft::ServerState::Shutdown {
        return None;
    }
    metrics.current_leader
}

/// The server's handle on Raft. Cheap to clone.
#[derive(Clone)]
pub struct RaftNode {
    pub(super) shared: Arc<Shared>,
    leader: watch::Receiver<Option<NodeId>>,
    fatal: watch::Receiver<Option<String>>,
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
        let storage_fault = log_store.fault();
        let state_machine = StateMachine::open(raft_dir.join("snapshots"), fsm, log_store.unapplied())?;
        let pool = Arc::new(PeerPool::new(cfg.auth.clone()));
        let network = Network::new(id, pool.clone());
        let raft = Raft::new(id, openraft_config(&cfg)?, network, log_store, state_machine)
            .await
            .map_err(|e| RaftError::Storage(format!("starting raft: {e}")))?;
        let shared = Arc::new(Shared {
            id,
            addr: cfg.advertise_rpc.clone(),
            raft,
            pool,
            apply_timeout: cfg.apply_timeout(),
            storage_fault,
            name: Mutex::new(cfg.name.clone()),
            peer_names: Mutex::default(),
        });
        let initialized = shared.raft.is_initialized().await.map_err(|e| RaftError::Raft(e.to_string()))?;
        tracing::info!(node_id = id, addr = %shared.addr, initialized, "raft started");

        let (leader, fatal, leader_task) = watch_metrics(&shared.raft, raft_dir.clone());
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
        Ok(RaftNode { shared, leader, fatal, tasks: Arc::new(Mutex::new(tasks)) })
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

    /// Set (once) when Raft stopped on an error it cannot recover from, such as a log write that
    /// failed (a full or broken disk): the message names the data dir and the error. This server
    /// then no longer leads nor follows, and the process should exit so a supervisor restarts
    /// it once the disk is usable again.
    pub fn fatal(&self) -> watch::Receiver<Option<String>> {
        self.fatal.clone()
    }

    /// Makes every later write of the log store fail as a full disk would.
    #[cfg(test)]
    pub(crate) fn fail_storage_writes(&self) {
        self.shared.storage_fault.fail_writes();
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

    /// Sets this server's member name (`<name>.<region>`), told to peers that ask.
    pub fn set_name(&self, name: &str) {
        *self.shared.name.lock().unwrap_or_else(|e| e.into_inner()) = name.to_string();
    }

    /// Every server of the configuration and whether it is alive: this one while its Raft runs,
    /// each other one if it answers `Info` with its id within a second (asked in parallel). What
    /// is reported is measured now, not assumed: a stopped, hung or unreachable server is failed.
    pub async fn members(&self) -> Vec<RaftMember> {
        let probes = self.configuration().into_iter().map(|peer| async move {
            let (alive, name) = if peer.id == self.shared.id {
                (self.fatal.borrow().is_none() && self.shared.raft.metrics().borrow().running_state.is_ok(), Some(self.shared.name()))
            } else {
                match self.shared.probe(peer.id, &peer.addr).await {
                    Some(name) => (true, Some(name)),
                    None => (false, self.shared.peer_names.lock().unwrap_or_else(|e| e.into_inner()).get(&peer.id).cloned()),
                }
            };
            let name = name.filter(|n| !n.is_empty()).unwrap_or_else(|| peer.addr.clone());
            RaftMember { id: peer.id, addr: peer.addr, name, voter: peer.voter, alive }
        });
        futures::future::join_all(probes).await
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

    /// `PUT /v1/agent/join`: joins this server and each of `addrs` into one cluster where the
    /// membership path allows it (see `bootstrap::join_via`); how many are joined, and why the
    /// others are not.
    pub async fn join_addresses(&self, addrs: &[String]) -> (usize, Vec<String>) {
        let outcomes = futures::future::join_all(addrs.iter().map(|addr| super::bootstrap::join_via(&self.shared, addr))).await;
        let joined = outcomes.iter().filter(|o| o.is_ok()).count();
        (joined, outcomes.into_iter().filter_map(Result::err).collect())
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

/// Mirrors openraft's metrics into a channel that changes only when the leader does, and one
/// that is set when Raft stops on a fatal error (not on a shutdown asked for).
fn watch_metrics(
    raft: &Raft<TypeConfig>,
    raft_dir: std::path::PathBuf,
) -> (watch::Receiver<Option<NodeId>>, watch::Receiver<Option<String>>, JoinHandle<()>) {
    let mut metrics = raft.metrics();
    let (leader_tx, leader_rx) = watch::channel(leader_in(&metrics.borrow()));
    let (fatal_tx, fatal_rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        loop {
            let (leader, fatal) = {
                let m = metrics.borrow_and_update();
                (leader_in(&m), m.running_state.as_ref().err().filter(|e| !matches!(e, openraft::error::Fatal::Stopped)).cloned())
            };
            leader_tx.send_if_modified(|current| std::mem::replace(current, leader) != leader);
            if let Some(error) = fatal {
                let message = fatal_message(&raft_dir, &error);
                tracing::error!("{message}");
                fatal_tx.send_replace(Some(message));
                break;
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
        leader_tx.send_replace(None);
    });
    (leader_rx, fatal_rx, task)
}

/// What an operator needs to read when Raft stopped on `error`.
fn fatal_message(raft_dir: &std::path::Path, error: &openraft::error::Fatal<NodeId>) -> String {
    let kind = match error {
        openraft::error::Fatal::StorageError(_) => "a storage error",
        _ => "an unrecoverable error",
    };
    format!(
        "raft stopped on {kind} in {}: {error}; this server no longer leads or takes part in the cluster. \
         Free space or repair the disk, then restart the agent (its acknowledged writes are on disk)",
        raft_dir.display()
    )
}
