//! The narrow handle endpoints and leader-only subsystems use to write.
//!
//! Production servers implement [`Consensus`] with Raft; [`LocalConsensus`]
//! applies commands to the FSM directly, in order, for in-process tests that
//! need full control over interleavings (the reconnect protocol tests).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

use crate::fsm::{Command, Fsm, ServerFsm};
use crate::state::StateStore;

/// A boxed future, so the trait stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a write did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// No leader is known (election in progress or quorum lost).
    #[error("No cluster leader")]
    NoLeader,
    /// The FSM refused the command; nothing changed.
    #[error("{0}")]
    Refused(String),
    /// Raft failed (storage, network, shutdown).
    #[error("raft: {0}")]
    Raft(String),
}

/// Writes commands through consensus and tells who leads.
pub trait Consensus: Send + Sync + 'static {
    /// Commits and applies a command; returns its Raft index.
    fn apply(&self, cmd: Command) -> BoxFuture<'_, Result<u64, ApplyError>>;
    /// This server leads the cluster.
    fn is_leader(&self) -> bool;
    /// True while this server leads; changes when leadership moves.
    fn leadership(&self) -> watch::Receiver<bool>;
    /// RPC address of the leader, when known.
    fn leader_rpc_addr(&self) -> Option<String>;
    /// RPC addresses of the voting servers.
    fn peers(&self) -> Vec<String>;
    /// The current Raft term (0 where no Raft runs), recorded in operator snapshots.
    fn raft_term(&self) -> u64 {
        0
    }
    /// Every server of the Raft configuration; empty where no Raft runs.
    fn raft_configuration(&self) -> Vec<crate::raft::RaftPeer> {
        Vec::new()
    }
    /// Takes a server out of the Raft configuration (an operator's `remove-peer`).
    fn remove_raft_peer(&self, id: crate::raft::NodeId) -> BoxFuture<'_, Result<(), ApplyError>> {
        Box::pin(async move { Err(ApplyError::Refused(format!("cannot remove server {id}: this server does not run Raft"))) })
    }
    /// `PUT /v1/agent/join`: how many of `addrs` this server is now in one cluster with, and
    /// why not with the others.
    fn join_servers(&self, addrs: Vec<String>) -> BoxFuture<'_, (usize, Vec<String>)> {
        Box::pin(async move { (0, addrs.iter().map(|a| format!("Failed to join {a}: this server does not run Raft")).collect()) })
    }
    /// Every server of the Raft configuration with whether it answers now; `None` where no
    /// Raft runs.
    fn members(&self) -> BoxFuture<'_, Option<Vec<crate::raft::RaftMember>>> {
        Box::pin(async { None })
    }
}

/// A single always-leading "cluster" that applies commands directly to the FSM.
/// Not leading (`set_leader(false)`), it refuses every write, as a Raft follower does.
pub struct LocalConsensus {
    fsm: ServerFsm,
    next_index: tokio::sync::Mutex<u64>,
    leader: watch::Sender<bool>,
    addr: String,
    remote_leader: std::sync::Mutex<Option<String>>,
}

impl LocalConsensus {
    /// Applies to `store`, starting after its current index.
    pub fn new(store: Arc<StateStore>) -> LocalConsensus {
        Self::from_fsm(ServerFsm::new(store))
    }

    /// Applies to `store` and publishes events to `broker`.
    pub fn with_events(store: Arc<StateStore>, broker: Arc<crate::events::EventBroker>) -> LocalConsensus {
        Self::from_fsm(ServerFsm::with_events(store, broker))
    }

    fn from_fsm(fsm: ServerFsm) -> LocalConsensus {
        let start = fsm.store().snapshot().index;
        LocalConsensus {
            fsm,
            next_index: tokio::sync::Mutex::new(start + 1),
            leader: watch::channel(true).0,
            addr: "127.0.0.1:4647".to_string(),
            remote_leader: std::sync::Mutex::new(None),
        }
    }

    /// Flips leadership, to exercise leader-only subsystems.
    pub fn set_leader(&self, leader: bool) {
        self.leader.send_replace(leader);
    }

    /// While not leading, report this address as the leader's (to exercise forwarding).
    pub fn set_remote_leader(&self, addr: Option<String>) {
        *self.remote_leader.lock().unwrap_or_else(|e| e.into_inner()) = addr;
    }
}

impl Consensus for LocalConsensus {
    fn apply(&self, cmd: Command) -> BoxFuture<'_, Result<u64, ApplyError>> {
        Box::pin(async move {
            if !*self.leader.borrow() {
                return Err(ApplyError::NoLeader);
            }
            let mut next = self.next_index.lock().await;
            // Tests may also write to the store directly; never reuse an index.
            let index = (*next).max(self.fsm.store().snapshot().index + 1);
            *next = index + 1;
            let res = self.fsm.apply(index, cmd);
            match res.error {
                None => Ok(index),
                Some(e) => Err(ApplyError::Refused(e)),
            }
        })
    }

    fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    fn leadership(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    fn leader_rpc_addr(&self) -> Option<String> {
        if self.is_leader() { Some(self.addr.clone()) } else { self.remote_leader.lock().unwrap_or_else(|e| e.into_inner()).clone() }
    }

    fn peers(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }
}

/// [`Consensus`] over the Raft layer.
///
/// Leadership is reported only after a barrier: a server that just won an
/// election first applies everything committed before, so leader-only
/// subsystems never start from stale state.
pub struct RaftConsensus {
    raft: crate::raft::RaftNode,
    leader: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RaftConsensus {
    /// Wraps a started Raft node.
    pub fn new(raft: crate::raft::RaftNode) -> Arc<RaftConsensus> {
        let (leader, _) = watch::channel(false);
        let tx = leader.clone();
        let node = raft.clone();
        let task = tokio::spawn(async move {
            let mut changes = node.leader_changes();
            loop {
                let leads = *changes.borrow_and_update() == Some(node.node_id());
                if leads {
                    // Retry the barrier until it holds or leadership moves on.
                    loop {
                        match node.barrier().await {
                            Ok(index) => {
                                tracing::info!(index, "cluster leadership acquired");
                                tx.send_replace(true);
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "leadership barrier failed");
                                if *changes.borrow() != Some(node.node_id()) {
                                    break;
                                }
                                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            }
                        }
                    }
                } else if *tx.borrow() {
                    tracing::info!("cluster leadership lost");
                    tx.send_replace(false);
                }
                if changes.changed().await.is_err() {
                    tx.send_replace(false);
                    return;
                }
            }
        });
        Arc::new(RaftConsensus { raft, leader, task })
    }

    /// The Raft node.
    pub fn raft(&self) -> &crate::raft::RaftNode {
        &self.raft
    }
}

impl Drop for RaftConsensus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Consensus for RaftConsensus {
    fn apply(&self, cmd: Command) -> BoxFuture<'_, Result<u64, ApplyError>> {
        Box::pin(async move {
            match self.raft.apply(cmd).await {
                Ok((index, res)) => match res.error {
                    None => Ok(index),
                    Some(e) => Err(ApplyError::Refused(e)),
                },
                // Another server leads since the caller checked: nothing was written.
                Err(crate::raft::RaftError::NoLeader | crate::raft::RaftError::NotLeader) => Err(ApplyError::NoLeader),
                Err(e) => Err(ApplyError::Raft(e.to_string())),
            }
        })
    }

    fn is_leader(&self) -> bool {
        *self.leader.borrow() && self.raft.is_leader()
    }

    fn leadership(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    fn leader_rpc_addr(&self) -> Option<String> {
        self.raft.leader_addr()
    }

    fn peers(&self) -> Vec<String> {
        self.raft.peers()
    }

    fn raft_configuration(&self) -> Vec<crate::raft::RaftPeer> {
        self.raft.configuration()
    }

    fn raft_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    fn members(&self) -> BoxFuture<'_, Option<Vec<crate::raft::RaftMember>>> {
        Box::pin(async { Some(self.raft.members().await) })
    }

    fn join_servers(&self, addrs: Vec<String>) -> BoxFuture<'_, (usize, Vec<String>)> {
        Box::pin(async move { self.raft.join_addresses(&addrs).await })
    }

    fn remove_raft_peer(&self, id: crate::raft::NodeId) -> BoxFuture<'_, Result<(), ApplyError>> {
        Box::pin(async move {
            match self.raft.remove_peer(id).await {
                Ok(()) => Ok(()),
                Err(crate::raft::RaftError::NoLeader | crate::raft::RaftError::NotLeader) => Err(ApplyError::NoLeader),
                Err(e) => Err(ApplyError::Refused(e.to_string())),
            }
        })
    }
}
