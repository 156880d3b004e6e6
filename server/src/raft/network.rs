//! The client half of the `Raft` service: openraft's `RaftNetwork` over tonic,
//! and the per-peer channel pool it shares with joining and bootstrap. Every call
//! carries this server's proof (`crate::rpc_auth`).

use std::collections::HashMap;
use std::error::Error;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nomad_proto::rpc::codec::MAX_MESSAGE_BYTES;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesResponse, InstallSnapshotResponse, VoteResponse};
use openraft::{BasicNode, RPCTypes};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{ConnectError, Status};

use super::rpc::{AppendEntriesArgs, InstallSnapshotArgs, RaftClient, VoteArgs};
use super::{NodeId, TypeConfig};
use crate::rpc_auth::{ClusterAuth, Stamp};

/// A `Raft` client whose calls carry this server's proof.
pub(crate) type PeerClient = RaftClient<InterceptedService<Channel, Stamp>>;

/// How long establishing a connection to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Lazily connected channels, one per peer address, reused by every call.
pub(crate) struct PeerPool {
    channels: Mutex<HashMap<String, Channel>>,
    auth: Arc<ClusterAuth>,
}

impl PeerPool {
    /// A pool whose calls prove they come from a server with `auth`.
    pub(crate) fn new(auth: Arc<ClusterAuth>) -> PeerPool {
        PeerPool { channels: Mutex::default(), auth }
    }

    /// A client for the server at `addr` (`host:port`); connects on first use and reconnects after failures.
    pub(crate) fn client(&self, addr: &str) -> Result<PeerClient, tonic::transport::Error> {
        let mut channels = self.channels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let channel = match channels.get(addr) {
            Some(channel) => channel.clone(),
            None => {
                let channel =
                    crate::rpc_tls::connect_lazy(Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(CONNECT_TIMEOUT));
                channels.insert(addr.to_string(), channel.clone());
                channel
            }
        };
        Ok(RaftClient::with_interceptor(channel, self.auth.interceptor())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }
}

/// Whether a failed call never reached the peer (no connection), so retrying it cannot apply it twice.
pub(crate) fn never_sent(status: &Status) -> bool {
    let mut source: Option<&(dyn Error + 'static)> = status.source();
    while let Some(e) = source {
        if e.is::<ConnectError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Creates a [`PeerConnection`] per replication target.
pub(crate) struct Network {
    local_id: NodeId,
    pool: Arc<PeerPool>,
}

impl Network {
    pub(crate) fn new(local_id: NodeId, pool: Arc<PeerPool>) -> Network {
        Network { local_id, pool }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConnection {
        PeerConnection { local_id: self.local_id, target, node: node.clone(), pool: self.pool.clone() }
    }
}

/// openraft's view of one peer.
pub(crate) struct PeerConnection {
    local_id: NodeId,
    target: NodeId,
    node: BasicNode,
    pool: Arc<PeerPool>,
}

impl PeerConnection {
    /// Runs one call within `option`'s deadline and splits its outcome into openraft's error kinds.
    async fn call<T, E, Fut>(
        &self,
        action: RPCTypes,
        option: &RPCOption,
        call: impl FnOnce(PeerClient) -> Fut,
    ) -> Result<T, RPCError<NodeId, BasicNode, E>>
    where
        E: Error,
        Fut: Future<Output = Result<tonic::Response<Result<T, E>>, Status>>,
    {
        let client = self.pool.client(&self.node.addr).map_err(|e| Unreachable::new(&e))?;
        let timeout = option.hard_ttl();
        match tokio::time::timeout(timeout, call(client)).await {
            Err(_) => Err(Timeout { action, id: self.local_id, target: self.target, timeout }.into()),
            // Any transport failure means "try again later": Unreachable makes openraft back off
            // rather than retry at once in a tight loop.
            Ok(Err(status)) => Err(Unreachable::new(&status).into()),
            Ok(Ok(reply)) => reply.into_inner().map_err(|e| RemoteError::new_with_node(self.target, self.node.clone(), e).into()),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesArgs,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(RPCTypes::AppendEntries, &option, |mut client| async move { client.append_entries(rpc).await }).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotArgs,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>> {
        self.call(RPCTypes::InstallSnapshot, &option, |mut client| async move { client.install_snapshot(rpc).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteArgs,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(RPCTypes::Vote, &option, |mut client| async move { client.vote(rpc).await }).await
    }
}
