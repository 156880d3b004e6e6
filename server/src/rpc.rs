//! The client-facing gRPC services (`Node.*`, `Alloc.*`, `ServiceRegistration.*`, `CSIVolume.*`).
//!
//! Node RPCs reset leader-held heartbeat timers and write through Raft, so a
//! follower forwards them to the leader once (a forwarded call that lands on
//! a non-leader is refused instead of bouncing around). The node's own call,
//! its SecretID included, is what travels; the follower adds its server proof
//! and the address the node's connection came from, which the leader records
//! as the node's `RPCPeerIP` (`crate::rpc_auth`). `tonic::Status` mapping
//! happens only here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nomad_proto::rpc::codec::MAX_MESSAGE_BYTES;
use nomad_proto::rpc::{
    AllocClient, AllocRpc, AllocServer, AllocUpdateRequest, AllocsGetRequest, AllocsGetResponse, CsiVolumeClaimRequest,
    CsiVolumeClaimResponse, CsiVolumeClient, CsiVolumeRpc, CsiVolumeServer, CsiVolumeUnpublishRequest, DeriveSiTokenRequest,
    DeriveSiTokenResponse, GenericResponse, NodeClient, NodeClientAllocsResponse, NodeRegisterRequest, NodeResolveTokenRequest,
    NodeResolveTokenResponse, NodeRpc, NodeServer, NodeServerRequestsRequest, NodeSpecificRequest, NodeUpdateResponse,
    NodeUpdateStatusRequest, ServerRequestReply, ServiceRegistrationClient, ServiceRegistrationDeleteByIdRequest,
    ServiceRegistrationDeleteRequest, ServiceRegistrationRpc, ServiceRegistrationServer, ServiceRegistrationUpsertRequest,
    SignIdentitiesRequest, SignIdentitiesResponse,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::client_conn::{ClientConns, RequestStream};
use crate::endpoints::Endpoints;
use crate::rpc_auth::{AuthenticatedServer, ClusterAuth, NODE_PEER_HEADER, Stamp};

/// Largest request a node may send. Anyone who reaches the RPC port may call these services
/// (a new node registers without a secret), so a request is bounded well below what servers send
/// each other; the largest real one, a client's batch of alloc updates, is far smaller.
pub const MAX_NODE_REQUEST_BYTES: usize = 32 * 1024 * 1024;

/// Metadata key marking a call that was already forwarded once.
const FORWARDED: &str = "x-nomad-forwarded";

/// Cached channels to other servers, and the proof calls to them carry.
#[derive(Clone)]
pub struct Peers {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    auth: Arc<ClusterAuth>,
}

impl Peers {
    /// Channels whose calls prove they come from a server with `auth`.
    pub fn new(auth: Arc<ClusterAuth>) -> Peers {
        Peers { channels: Arc::default(), auth }
    }

    /// The interceptor stamping calls with this server's proof.
    pub fn stamp(&self) -> Stamp {
        self.auth.interceptor()
    }

    /// A lazily connecting channel to `addr` (`host:port`).
    pub fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let ch = crate::rpc_tls::connect_lazy(
            Channel::from_shared(format!("http://{addr}"))
                .map_err(|e| Status::internal(format!("bad server address {addr:?}: {e}")))?
                .connect_timeout(std::time::Duration::from_secs(5)),
        );
        map.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}

/// The `Node` and `Alloc` services of one server.
#[derive(Clone)]
pub struct ClientRpc {
    endpoints: Endpoints,
    peers: Peers,
    /// The nodes' request streams to this server (`Node.ServerRequests`).
    conns: Arc<ClientConns>,
}

impl ClientRpc {
    /// Services over `endpoints`.
    pub fn new(endpoints: Endpoints, peers: Peers) -> ClientRpc {
        ClientRpc { endpoints, peers, conns: ClientConns::new() }
    }

    /// These services, keeping the nodes' request streams in `conns`.
    pub fn with_conns(mut self, conns: Arc<ClientConns>) -> ClientRpc {
        self.conns = conns;
        self
    }

    /// The tonic services, ready to add to a server.
    pub fn services(&self) -> (NodeServer<ClientRpc>, AllocServer<ClientRpc>) {
        (
            NodeServer::new(self.clone()).max_decoding_message_size(MAX_NODE_REQUEST_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES),
            AllocServer::new(self.clone()).max_decoding_message_size(MAX_NODE_REQUEST_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    /// The `ServiceRegistration` service.
    pub fn service_registration(&self) -> ServiceRegistrationServer<ClientRpc> {
        ServiceRegistrationServer::new(self.clone()).max_decoding_message_size(MAX_NODE_REQUEST_BYTES)
    }

    /// The `CSIVolume` service (claims and their release).
    pub fn csi_volume(&self) -> CsiVolumeServer<ClientRpc> {
        CsiVolumeServer::new(self.clone()).max_decoding_message_size(MAX_NODE_REQUEST_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Where to forward: `None` when this server should answer itself.
    fn forward_target<T>(&self, req: &Request<T>) -> Result<Option<Channel>, Status> {
        if self.endpoints.consensus().is_leader() {
            return Ok(None);
        }
        if req.metadata().contains_key(FORWARDED) {
            return Err(Status::unavailable("No cluster leader"));
        }
        let leader = self.endpoints.consensus().leader_rpc_addr().ok_or_else(|| Status::unavailable("No cluster leader"))?;
        self.peers.channel(&leader).map(Some)
    }

    /// The node's call as it goes on to the leader: marked as forwarded, with this server's
    /// proof and the address the node's connection came from.
    fn forwarded<T>(&self, req: Request<T>) -> Request<T> {
        let peer = peer_ip(&req);
        let mut r = Request::new(req.into_inner());
        r.metadata_mut().insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
        if let Some(ip) = peer.and_then(|ip| ip.to_string().parse().ok()) {
            r.metadata_mut().insert(NODE_PEER_HEADER, ip);
        }
        self.peers.auth.stamp(r.metadata_mut());
        r
    }
}

/// Where the node's own connection came from: the TCP peer, or, on a call a server forwarded
/// (and proved it is one), the peer that server saw.
fn peer_ip<T>(req: &Request<T>) -> Option<std::net::IpAddr> {
    if req.extensions().get::<AuthenticatedServer>().is_some()
        && let Some(ip) = req.metadata().get(NODE_PEER_HEADER).and_then(|v| v.to_str().ok()?.parse().ok())
    {
        return Some(ip);
    }
    req.remote_addr().map(|a| a.ip())
}

fn node_client(ch: Channel) -> NodeClient<Channel> {
    NodeClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
}

#[tonic::async_trait]
impl NodeRpc for ClientRpc {
    type ServerRequestsStream = RequestStream;

    /// Never forwarded: the stream stays on the server the node dialed, which is the server
    /// that can reach it (`crate::client_conn`).
    async fn server_requests(&self, req: Request<NodeServerRequestsRequest>) -> Result<Response<RequestStream>, Status> {
        let r = req.into_inner();
        self.endpoints.authenticate_node_rpc(&r.node_id, &r.secret_id)?;
        Ok(Response::new(self.conns.open(&r.node_id)))
    }

    /// Never forwarded: the answer belongs to the server that sent the request, over the
    /// stream the node holds to it.
    async fn server_request_reply(&self, req: Request<ServerRequestReply>) -> Result<Response<GenericResponse>, Status> {
        let r = req.into_inner();
        self.endpoints.authenticate_node_rpc(&r.node_id, &r.secret_id)?;
        let answer = match (r.result, r.error) {
            (_, Some(error)) => Err(error),
            (Some(result), None) => Ok(result),
            (None, None) => Ok(serde_json::Value::Null),
        };
        self.conns.reply(&r.node_id, r.id, answer)?;
        Ok(Response::new(GenericResponse::default()))
    }

    async fn register(&self, req: Request<NodeRegisterRequest>) -> Result<Response<NodeUpdateResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return node_client(ch).register(self.forwarded(req)).await;
        }
        let peer = peer_ip(&req);
        let mut register = req.into_inner();
        // Recorded by the servers, never taken from the node: what the servers forward to the
        // node's HTTP API goes to where its connection came from, not to an address it names.
        register.node.rpc_peer_ip = peer.map(|ip| ip.to_string()).unwrap_or_default();
        Ok(Response::new(self.endpoints.node_register(register).await?))
    }

    async fn update_status(&self, req: Request<NodeUpdateStatusRequest>) -> Result<Response<NodeUpdateResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return node_client(ch).update_status(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.node_update_status(req.into_inner()).await?))
    }

    async fn update_alloc(&self, req: Request<AllocUpdateRequest>) -> Result<Response<GenericResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return node_client(ch).update_alloc(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.node_update_alloc(req.into_inner()).await?))
    }

    async fn get_client_allocs(&self, req: Request<NodeSpecificRequest>) -> Result<Response<NodeClientAllocsResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return node_client(ch).get_client_allocs(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.node_get_client_allocs(req.into_inner()).await?))
    }

    async fn derive_si_token(&self, req: Request<DeriveSiTokenRequest>) -> Result<Response<DeriveSiTokenResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return node_client(ch).derive_si_token(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.node_derive_si_token(req.into_inner()).await?))
    }

    async fn sign_identities(&self, req: Request<SignIdentitiesRequest>) -> Result<Response<SignIdentitiesResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return node_client(ch).sign_identities(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.node_sign_identities(req.into_inner())?))
    }

    /// Never forwarded: any server's state answers (Nomad resolves tokens with stale reads).
    async fn resolve_token(&self, req: Request<NodeResolveTokenRequest>) -> Result<Response<NodeResolveTokenResponse>, Status> {
        Ok(Response::new(self.endpoints.node_resolve_token(req.into_inner())?))
    }
}

#[tonic::async_trait]
impl AllocRpc for ClientRpc {
    async fn get_allocs(&self, req: Request<AllocsGetRequest>) -> Result<Response<AllocsGetResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            let client = AllocClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES);
            return client.clone().get_allocs(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.alloc_get_allocs(req.into_inner()).await?))
    }
}

#[tonic::async_trait]
impl ServiceRegistrationRpc for ClientRpc {
    async fn upsert(&self, req: Request<ServiceRegistrationUpsertRequest>) -> Result<Response<GenericResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return ServiceRegistrationClient::new(ch).upsert(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.service_upsert(req.into_inner()).await?))
    }

    async fn delete_by_alloc(&self, req: Request<ServiceRegistrationDeleteRequest>) -> Result<Response<GenericResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return ServiceRegistrationClient::new(ch).delete_by_alloc(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.service_delete_by_alloc(req.into_inner()).await?))
    }

    async fn delete_by_id(&self, req: Request<ServiceRegistrationDeleteByIdRequest>) -> Result<Response<GenericResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return ServiceRegistrationClient::new(ch).delete_by_id(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.service_delete_by_id(req.into_inner()).await?))
    }
}

fn csi_volume_client(ch: Channel) -> CsiVolumeClient<Channel> {
    CsiVolumeClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
}

#[tonic::async_trait]
impl CsiVolumeRpc for ClientRpc {
    async fn claim(&self, req: Request<CsiVolumeClaimRequest>) -> Result<Response<CsiVolumeClaimResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return csi_volume_client(ch).claim(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.csi_volume_claim(req.into_inner()).await?))
    }

    async fn unpublish(&self, req: Request<CsiVolumeUnpublishRequest>) -> Result<Response<GenericResponse>, Status> {
        if let Some(ch) = self.forward_target(&req)? {
            return csi_volume_client(ch).unpublish(self.forwarded(req)).await;
        }
        Ok(Response::new(self.endpoints.csi_volume_unpublish(req.into_inner()).await?))
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;
    use crate::testing::{TestServer, node};

    fn test_peers() -> Peers {
        Peers::new(ClusterAuth::new(crate::rpc_auth::ClusterKey::generate(), "global"))
    }

    async fn serve(ts: &TestServer) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let rpc = ClientRpc::new(ts.endpoints.clone(), test_peers());
        let (node_svc, alloc_svc) = rpc.services();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(node_svc)
                .add_service(alloc_svc)
                .add_service(rpc.csi_volume())
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        addr
    }

    #[tokio::test]
    async fn node_rpcs_over_real_grpc_map_errors_to_statuses() {
        let ts = TestServer::new();
        let addr = serve(&ts).await;
        let mut client = node_client(test_peers().channel(&addr).unwrap());
        let n = node("n1");
        let r = client.register(NodeRegisterRequest { node: n.clone(), ..Default::default() }).await.unwrap().into_inner();
        assert!(r.heartbeat_ttl > 0);
        assert_eq!(r.status, nomad_proto::NodeStatus::Initializing);
        let bad = client
            .update_status(NodeUpdateStatusRequest { node_id: "n1".into(), secret_id: "nope".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::PermissionDenied);
        let missing = client
            .update_status(NodeUpdateStatusRequest { node_id: "ghost".into(), secret_id: "x".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(missing.code(), tonic::Code::NotFound);
        assert!(missing.message().contains("not found"));
    }

    #[tokio::test]
    async fn csi_volume_rpcs_are_node_methods_checked_by_the_nodes_secret() {
        for method in ["/nomad.CSIVolume/Claim", "/nomad.CSIVolume/Unpublish"] {
            assert_eq!(crate::rpc_auth::requirement(method), Some(crate::rpc_auth::Requires::Node), "{method}");
        }
        let ts = TestServer::new();
        let addr = serve(&ts).await;
        let n = ts.register_node(node("n1")).await;
        let mut client = csi_volume_client(test_peers().channel(&addr).unwrap());
        let claim = CsiVolumeClaimRequest { volume_id: "v".into(), node_id: n.id.clone(), secret_id: "wrong".into(), ..Default::default() };
        assert_eq!(client.claim(claim).await.unwrap_err().code(), tonic::Code::PermissionDenied);
        let release = CsiVolumeUnpublishRequest {
            volume_id: "v".into(),
            node_id: n.id.clone(),
            secret_id: n.secret_id.clone(),
            ..Default::default()
        };
        let err = client.unpublish(release).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (tonic::Code::InvalidArgument, "missing volume claim"));
    }

    #[tokio::test]
    async fn derive_si_token_is_a_node_method_over_real_grpc_with_refusals_in_the_reply() {
        assert_eq!(crate::rpc_auth::requirement("/nomad.Node/DeriveSIToken"), Some(crate::rpc_auth::Requires::Node));
        let ts = TestServer::new();
        let addr = serve(&ts).await;
        let n = ts.register_node(node("n1")).await;
        let mut client = node_client(test_peers().channel(&addr).unwrap());
        let req = |secret: &str| DeriveSiTokenRequest {
            node_id: n.id.clone(),
            secret_id: secret.into(),
            alloc_id: "a1".into(),
            tasks: vec!["sidecar".into()],
            region: "global".into(),
        };
        let err = client.derive_si_token(req("wrong")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        // Without Consul the servers say so in Nomad's reply shape, as a non-recoverable error.
        let r = client.derive_si_token(req(&n.secret_id)).await.unwrap().into_inner();
        let e = r.error.expect("refused in the reply");
        assert!(!e.recoverable && e.err.contains("consul {} block"), "{e:?}");
        assert!(r.tokens.is_empty());
    }

    #[tokio::test]
    async fn a_request_over_the_node_limit_is_refused_before_it_is_decoded() {
        let ts = TestServer::new();
        let addr = serve(&ts).await;
        let mut client = node_client(test_peers().channel(&addr).unwrap());
        let mut huge = node("n1");
        huge.meta.insert("padding".into(), "x".repeat(MAX_NODE_REQUEST_BYTES + 1));
        let err = client.register(NodeRegisterRequest { node: huge, ..Default::default() }).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
        assert!(ts.store.snapshot().node("n1").is_none());
        let ok = client.register(NodeRegisterRequest { node: node("n1"), ..Default::default() }).await;
        assert!(ok.is_ok(), "the server goes on serving: {ok:?}");
    }

    #[tokio::test]
    async fn a_follower_forwards_to_the_leader_and_never_twice() {
        let leader = TestServer::new();
        let leader_addr = serve(&leader).await;
        // A "follower" whose consensus is not leader and points at the leader.
        let follower = TestServer::new();
        follower.consensus.set_leader(false);
        let follower_rpc = ClientRpc::new(follower.endpoints.clone(), test_peers());
        // LocalConsensus reports no leader address when it is not leader, so the
        // follower has nowhere to forward to: a clear unavailable error.
        let req = Request::new(NodeRegisterRequest { node: node("n1"), ..Default::default() });
        let err = follower_rpc.register(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        // A call already forwarded once is refused by a non-leader instead of bouncing.
        let once = follower_rpc.forwarded(Request::new(NodeRegisterRequest { node: node("n1"), ..Default::default() }));
        let err = follower_rpc.register(once).await.unwrap_err();
        assert_eq!(err.message(), "No cluster leader");
        // Once the leader is known, the follower forwards and the leader writes.
        follower.consensus.set_remote_leader(Some(leader_addr));
        let r = follower_rpc.register(Request::new(NodeRegisterRequest { node: node("n1"), ..Default::default() })).await.unwrap();
        assert!(r.into_inner().heartbeat_ttl > 0, "the leader armed the timer");
        assert!(leader.store.snapshot().node("n1").is_some());
        assert!(follower.store.snapshot().node("n1").is_none());
    }
}
