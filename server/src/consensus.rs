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
}

/// A single always-leading "cluster" that applies commands directly to the FSM.
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
        let start = store.snapshot().index;
        LocalConsensus {
            fsm: ServerFsm::new(store),
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
            let res = self.fsm.apply(index, &cmd);
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
        if self.is_leader() {
            Some(self.addr.clone())
        } else {
            self.remote_leader.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
    }

    fn peers(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }
}
