//! Raft: the replicated log every cluster write goes through.
//!
//! openraft 0.9 (storage v2) does the consensus; this module gives it
//! - `log_store`: the log, vote and log pointers in redb (`<data_dir>/raft/raft.redb`),
//! - `state_machine` + `snapshot_store`: the adapter that feeds committed commands to the [`Fsm`] and keeps its
//!   snapshot on disk (`<data_dir>/raft/snapshots/`),
//! - `rpc`, `network`, `service`: the server-to-server `Raft` gRPC service (client and server halves;
//!   every call carries the server proof of `crate::rpc_auth`),
//! - `bootstrap`: the persisted node id and cluster formation (`bootstrap_expect`, `join`),
//! - `node`: [`RaftNode`], the handle the rest of the server uses.

mod bootstrap;
mod log_store;
mod network;
mod node;
pub mod rpc;
mod service;
mod snapshot_store;
mod state_machine;
#[cfg(test)]
mod tests;

use std::io::Cursor;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) use network::never_sent;
pub use node::{RaftMember, RaftNode};
pub use openraft::BasicNode;
pub use service::RaftService;

#[cfg(doc)]
use crate::fsm::Fsm;
use crate::fsm::{ApplyResult, Command};

/// A server's Raft id.
pub type NodeId = u64;

/// A server in the Raft configuration (`/v1/operator/raft/configuration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftPeer {
    /// Raft id.
    pub id: NodeId,
    /// Advertised RPC address.
    pub addr: String,
    /// Votes (a learner does not).
    pub voter: bool,
    /// Is the leader as this server knows it.
    pub leader: bool,
}

openraft::declare_raft_types!(
    /// openraft's type configuration: the log carries [`Command`]s, applying one yields an [`ApplyResult`].
    /// Shared (`Arc`, serialized as the command itself) so that a write retried after a leader
    /// change does not copy a plan of a hundred allocs for every attempt.
    pub TypeConfig:
        D = std::sync::Arc<Command>,
        R = ApplyResult,
        NodeId = NodeId,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// How a server takes part in Raft.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// This server's Raft id. `None`: the id stored in `<data_dir>/raft/node-id`, generated on first start.
    pub node_id: Option<NodeId>,
    /// The server's data directory; Raft keeps its files under `raft/` in it.
    pub data_dir: PathBuf,
    /// The address other servers reach this server's RPC listener on (`host:port`).
    pub advertise_rpc: String,
    /// Servers expected to form the cluster: 1 initializes alone; N > 1 waits until N uninitialized servers
    /// see each other through `join`; 0 never initializes and only joins an existing cluster.
    pub bootstrap_expect: usize,
    /// RPC addresses of other servers, used to form or join the cluster.
    pub join: Vec<String>,
    /// How often the leader sends heartbeats; also the timeout of one AppendEntries call.
    pub heartbeat_interval_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout.
    pub election_timeout_max_ms: u64,
    /// Take a snapshot (and allow purging the log) after this many entries since the last one.
    pub snapshot_logs: u64,
    /// Longest [`RaftNode::apply`] waits for a leader and for its write to commit.
    pub apply_timeout_ms: u64,
    /// How this server proves itself to its peers (and checks theirs).
    pub auth: std::sync::Arc<crate::rpc_auth::ClusterAuth>,
    /// The server's member name (`<name>.<region>`), told to peers that ask (`Info`).
    pub name: String,
}

impl RaftConfig {
    /// A single-server configuration with the default timings.
    pub fn new(
        data_dir: impl Into<PathBuf>,
        advertise_rpc: impl Into<String>,
        auth: std::sync::Arc<crate::rpc_auth::ClusterAuth>,
    ) -> RaftConfig {
        RaftConfig {
            node_id: None,
            data_dir: data_dir.into(),
            advertise_rpc: advertise_rpc.into(),
            bootstrap_expect: 1,
            join: Vec::new(),
            heartbeat_interval_ms: 250,
            election_timeout_min_ms: 1000,
            election_timeout_max_ms: 2000,
            snapshot_logs: 8192,
            // Nomad holds an RPC up to 5s while there is no leader.
            apply_timeout_ms: 5000,
            auth,
            name: String::new(),
        }
    }

    fn apply_timeout(&self) -> Duration {
        Duration::from_millis(self.apply_timeout_ms)
    }
}

/// Errors of the Raft layer.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// A file or directory under the data dir could not be used.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("invalid raft configuration: {0}")]
    Config(String),
    /// The log store is unreadable or corrupt, or Raft failed to start from it.
    #[error("raft log store: {0}")]
    Storage(String),
    /// The snapshot on disk is unreadable or corrupt, or the FSM refused it.
    #[error("raft snapshot: {0}")]
    Snapshot(String),
    /// No leader was known, or it refused the write as not leader, for the whole apply timeout.
    #[error("no cluster leader")]
    NoLeader,
    /// Another server leads: leader-only calls ([`RaftNode::apply`], [`RaftNode::barrier`],
    /// [`RaftNode::remove_peer`]) are not carried out here.
    #[error("not the cluster leader")]
    NotLeader,
    /// The write was submitted but not confirmed within the apply timeout; it may still commit.
    #[error("timed out after {0:?} waiting for the write to commit")]
    CommitTimeout(Duration),
    /// Raft refused or failed the request.
    #[error("raft: {0}")]
    Raft(String),
    /// Raft has been shut down.
    #[error("raft is shut down")]
    Shutdown,
}
