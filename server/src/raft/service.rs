//! The server half of the `Raft` service.
//!
//! Peer-only (the RPC listener lets only callers with the server proof reach
//! it, `crate::rpc_auth`): replication calls go straight to openraft; `Join`
//! acts only on the leader (a follower passes it on once); `Info` answers
//! bootstrap discovery. Failures travel inside the reply, so a tonic `Status`
//! here always means the transport or a stopped Raft.

use std::sync::Arc;

use nomad_proto::rpc::codec::MAX_MESSAGE_BYTES;
use tonic::{Request, Response, Status};

use super::node::Shared;
use super::rpc::{
    AppendEntriesArgs, AppendEntriesReply, InfoReply, InfoRequest, InstallSnapshotArgs, InstallSnapshotReply, JoinReply, JoinRequest,
    RaftRpc, RaftServer, VoteArgs, VoteReply,
};

/// Serves one server's Raft to its peers.
pub struct RaftService {
    shared: Arc<Shared>,
}

impl RaftService {
    pub(crate) fn server(shared: Arc<Shared>) -> RaftServer<RaftService> {
        RaftServer::new(RaftService { shared }).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(&self, request: Request<AppendEntriesArgs>) -> Result<Response<AppendEntriesReply>, Status> {
        Ok(Response::new(self.shared.raft.append_entries(request.into_inner()).await))
    }

    async fn vote(&self, request: Request<VoteArgs>) -> Result<Response<VoteReply>, Status> {
        Ok(Response::new(self.shared.raft.vote(request.into_inner()).await))
    }

    async fn install_snapshot(&self, request: Request<InstallSnapshotArgs>) -> Result<Response<InstallSnapshotReply>, Status> {
        Ok(Response::new(self.shared.raft.install_snapshot(request.into_inner()).await))
    }

    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinReply>, Status> {
        Ok(Response::new(self.shared.join(request.into_inner()).await))
    }

    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoReply>, Status> {
        let initialized = self.shared.raft.is_initialized().await.map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(InfoReply { node_id: self.shared.id, addr: self.shared.addr.clone(), initialized, name: self.shared.name() }))
    }
}
