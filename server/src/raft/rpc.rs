//! Messages of the server-to-server `Raft` gRPC service and the generated
//! client and server (every call carries the server proof: `crate::rpc_auth`). Replication messages are openraft's own serde types;
//! the error half of each reply is carried in the message, so a remote Raft
//! error is told apart from a transport failure.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use super::{NodeId, TypeConfig};

#[allow(missing_docs, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/nomad.raft.Raft.rs"));
}

pub use generated::raft_client::RaftClient;
pub use generated::raft_server::{Raft as RaftRpc, RaftServer};

/// `AppendEntries` request.
pub type AppendEntriesArgs = AppendEntriesRequest<TypeConfig>;
/// `AppendEntries` reply.
pub type AppendEntriesReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
/// `Vote` request.
pub type VoteArgs = VoteRequest<NodeId>;
/// `Vote` reply.
pub type VoteReply = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
/// `InstallSnapshot` request: one chunk of a snapshot.
pub type InstallSnapshotArgs = InstallSnapshotRequest<TypeConfig>;
/// `InstallSnapshot` reply.
pub type InstallSnapshotReply = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// `Join`: a server asks to become a voter.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The joining server's Raft id.
    pub node_id: NodeId,
    /// Its advertised RPC address.
    pub addr: String,
    /// Set by a follower passing the request on, so it travels at most one hop.
    pub forwarded: bool,
}

/// `Join` reply.
pub type JoinReply = Result<(), Refusal>;

/// `Info` request (no fields).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InfoRequest {}

/// `Info` reply: who a server is, used for bootstrapping.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InfoReply {
    /// Raft id.
    pub node_id: NodeId,
    /// Advertised RPC address.
    pub addr: String,
    /// Whether it has Raft state (it is, or was, part of a cluster).
    pub initialized: bool,
    /// Its member name (`<name>.<region>`); empty from a server that predates it.
    #[serde(default)]
    pub name: String,
}

/// Why a server did not carry out a `Join`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The server is not the leader; nothing was written, so the caller may retry elsewhere.
    #[error("not the cluster leader")]
    NotLeader,
    /// The request failed on the server.
    #[error("{0}")]
    Failed(String),
}
