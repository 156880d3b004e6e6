//! The channel over real gRPC: a node's stream, calls and replies, refusals, deadlines, and a
//! call forwarded from one server to the server holding the stream.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use nomad_proto::rpc::{NodeClient, NodeServerRequestsRequest, ServerRequest, ServerRequestReply};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Channel;

use super::*;
use crate::consensus::{ApplyError, BoxFuture, Consensus};
use crate::fsm::Command;
use crate::rpc::{ClientRpc, Peers};
use crate::rpc_auth::{ClusterAuth, ClusterKey, RpcAuthLayer};
use crate::testing::{TestServer, node};

/// A server: its endpoints, registry and RPC address (node services and `ClientConn/Call`
/// behind the auth layer).
struct Served {
    ts: TestServer,
    conns: Arc<ClientConns>,
    addr: String,
}

async fn serve(auth: &Arc<ClusterAuth>, conns: Arc<ClientConns>) -> Served {
    let ts = TestServer::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rpc = ClientRpc::new(ts.endpoints.clone(), Peers::new(auth.clone())).with_conns(conns.clone());
    let (node_svc, _) = rpc.services();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RpcAuthLayer::new(auth.clone()))
            .add_service(node_svc)
            .add_service(ClientConnService::server(conns.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Served { ts, conns, addr }
}

fn auth() -> Arc<ClusterAuth> {
    ClusterAuth::new(ClusterKey::generate(), "global")
}

fn client(addr: &str) -> NodeClient<Channel> {
    NodeClient::new(Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy())
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Opens `n`'s stream and waits until the server holds it.
async fn open(s: &Served, n: &nomad_proto::Node) -> tonic::Streaming<ServerRequest> {
    let req = NodeServerRequestsRequest { node_id: n.id.clone(), secret_id: n.secret_id.clone() };
    let stream = client(&s.addr).server_requests(req).await.unwrap().into_inner();
    wait_until("the stream to register", || s.conns.has(&n.id)).await;
    stream
}

fn reply(n: &nomad_proto::Node, id: u64, result: serde_json::Value) -> ServerRequestReply {
    ServerRequestReply { node_id: n.id.clone(), secret_id: n.secret_id.clone(), id, result: Some(result), error: None }
}

#[tokio::test]
async fn a_call_reaches_the_nodes_client_and_its_answer_comes_back() {
    let s = serve(&auth(), ClientConns::new()).await;
    let n1 = s.ts.register_node(node("n1")).await;
    let mut stream = open(&s, &n1).await;
    let conns = s.conns.clone();
    let call = tokio::spawn(async move {
        conns.call("n1", "CSI.ControllerAttachVolume", serde_json::json!({"VolumeID": "v"}), Duration::from_secs(10)).await
    });
    let req = stream.next().await.unwrap().unwrap();
    assert_eq!((req.method.as_str(), &req.body), ("CSI.ControllerAttachVolume", &serde_json::json!({"VolumeID": "v"})));
    client(&s.addr).server_request_reply(reply(&n1, req.id, serde_json::json!({"PublishContext": {"a": "b"}}))).await.unwrap();
    assert_eq!(call.await.unwrap().unwrap(), serde_json::json!({"PublishContext": {"a": "b"}}));

    // The client's error comes back as the call's failure, word for word.
    let conns = s.conns.clone();
    let call = tokio::spawn(async move { conns.call("n1", "CSI.NodeDetachVolume", serde_json::json!({}), Duration::from_secs(10)).await });
    let req = stream.next().await.unwrap().unwrap();
    let failed = ServerRequestReply {
        error: Some("CSI.NodeDetachVolume: CSI client error (retryable): no plugin".into()),
        ..reply(&n1, req.id, serde_json::Value::Null)
    };
    client(&s.addr).server_request_reply(failed).await.unwrap();
    assert_eq!(
        call.await.unwrap().unwrap_err(),
        ClientCallError::Failed("CSI.NodeDetachVolume: CSI client error (retryable): no plugin".into())
    );
}

#[tokio::test]
async fn a_node_without_a_stream_has_no_path_and_a_closed_stream_fails_its_calls_at_once() {
    let s = serve(&auth(), ClientConns::new()).await;
    let n1 = s.ts.register_node(node("n1")).await;
    let e = s.conns.call("n1", "CSI.NodeDetachVolume", serde_json::json!({}), Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(&e, ClientCallError::NoPath { node_id, .. } if node_id == "n1"), "{e:?}");

    let mut stream = open(&s, &n1).await;
    let conns = s.conns.clone();
    let call = tokio::spawn(async move { conns.call("n1", "CSI.NodeDetachVolume", serde_json::json!({}), Duration::from_secs(60)).await });
    stream.next().await.unwrap().unwrap();
    drop(stream);
    let e = tokio::time::timeout(Duration::from_secs(10), call).await.expect("failed before its deadline").unwrap().unwrap_err();
    assert!(matches!(e, ClientCallError::NoPath { .. }), "{e:?}");
    wait_until("the registration to go", || !s.conns.has("n1")).await;
}

#[tokio::test]
async fn a_wrong_secret_is_refused_and_a_reply_is_taken_only_from_the_node_it_was_sent_to() {
    let s = serve(&auth(), ClientConns::new()).await;
    let n1 = s.ts.register_node(node("n1")).await;
    let n2 = s.ts.register_node(node("n2")).await;
    let bad = NodeServerRequestsRequest { node_id: "n1".into(), secret_id: n2.secret_id.clone() };
    let e = client(&s.addr).server_requests(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(!s.conns.has("n1"));

    let mut s1 = open(&s, &n1).await;
    let _s2 = open(&s, &n2).await;
    let conns = s.conns.clone();
    let call =
        tokio::spawn(async move { conns.call("n1", "CSI.ControllerDeleteVolume", serde_json::json!({}), Duration::from_secs(10)).await });
    let req = s1.next().await.unwrap().unwrap();
    // Another node answering n1's request: refused, and n1's call still waits.
    let e = client(&s.addr).server_request_reply(reply(&n2, req.id, serde_json::json!("forged"))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // n1's own ID with a wrong secret: refused.
    let forged = ServerRequestReply { secret_id: "nope".into(), ..reply(&n1, req.id, serde_json::json!("forged")) };
    assert_eq!(client(&s.addr).server_request_reply(forged).await.unwrap_err().code(), tonic::Code::PermissionDenied);
    // An ID never sent.
    let e = client(&s.addr).server_request_reply(reply(&n1, req.id + 1000, serde_json::json!(1))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(!call.is_finished());
    client(&s.addr).server_request_reply(reply(&n1, req.id, serde_json::json!("real"))).await.unwrap();
    assert_eq!(call.await.unwrap().unwrap(), serde_json::json!("real"));
    // Answered once: a second answer is refused.
    let e = client(&s.addr).server_request_reply(reply(&n1, req.id, serde_json::json!("again"))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn no_answer_within_the_deadline_is_a_timeout_and_calls_beyond_the_bound_wait_their_turn() {
    let s = serve(&auth(), Arc::new(ClientConns::with_max_in_flight(1))).await;
    let n1 = s.ts.register_node(node("n1")).await;
    let mut stream = open(&s, &n1).await;
    let conns = s.conns.clone();
    let first = tokio::spawn(async move { conns.call("n1", "CSI.A", serde_json::json!(1), Duration::from_secs(30)).await });
    let req = stream.next().await.unwrap().unwrap();
    // The one turn is taken: the second call times out without being sent.
    let e = s.conns.call("n1", "CSI.B", serde_json::json!(2), Duration::from_millis(200)).await.unwrap_err();
    assert_eq!(e, ClientCallError::Timeout { node_id: "n1".into(), seconds: 0 });
    client(&s.addr).server_request_reply(reply(&n1, req.id, serde_json::json!("one"))).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap(), serde_json::json!("one"));

    // Sent, never answered: a timeout, and a late answer finds no one waiting.
    let e = s.conns.call("n1", "CSI.C", serde_json::json!(3), Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(e, ClientCallError::Timeout { .. }), "{e:?}");
    let late = stream.next().await.unwrap().unwrap();
    assert_eq!(late.method, "CSI.C");
    let e = client(&s.addr).server_request_reply(reply(&n1, late.id, serde_json::json!("late"))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn an_oversized_request_is_refused_before_it_is_sent() {
    let conns = ClientConns::new();
    let _stream = conns.open("n1");
    let big = serde_json::Value::String("x".repeat(nomad_proto::rpc::MAX_SERVER_REQUEST_BYTES));
    let e = conns.call("n1", "CSI.ControllerCreateVolume", big, Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(&e, ClientCallError::Failed(m) if m.contains("more than the")), "{e:?}");
}

/// A consensus naming a fixed set of servers (the Raft membership, as far as these calls care).
struct Members(Vec<String>);

impl Consensus for Members {
    fn apply(&self, _: Command) -> BoxFuture<'_, Result<u64, ApplyError>> {
        Box::pin(async { Err(ApplyError::NoLeader) })
    }
    fn is_leader(&self) -> bool {
        true
    }
    fn leadership(&self) -> tokio::sync::watch::Receiver<bool> {
        tokio::sync::watch::channel(true).1
    }
    fn leader_rpc_addr(&self) -> Option<String> {
        self.0.first().cloned()
    }
    fn peers(&self) -> Vec<String> {
        self.0.clone()
    }
}

#[tokio::test]
async fn a_call_goes_once_to_the_server_holding_the_stream_with_the_server_proof() {
    let key = ClusterKey::generate();
    let auth = ClusterAuth::new(key.clone(), "global");
    let follower = serve(&auth, ClientConns::new()).await;
    let n1 = follower.ts.register_node(node("n1")).await;
    let mut stream = open(&follower, &n1).await;
    // A dead server is in the membership too: skipped.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let leader_addr = "127.0.0.1:1".to_string();
    let members: Arc<dyn Consensus> = Arc::new(Members(vec![leader_addr.clone(), dead, follower.addr.clone()]));
    let leader = ClientCalls::new(ClientConns::new(), members.clone(), Peers::new(auth.clone()), &leader_addr);
    let call = tokio::spawn({
        let leader = leader.clone();
        async move { leader.call("n1", "CSI.ControllerAttachVolume", serde_json::json!({"VolumeID": "v"}), Duration::from_secs(20)).await }
    });
    let req = stream.next().await.unwrap().unwrap();
    assert_eq!(req.method, "CSI.ControllerAttachVolume");
    client(&follower.addr).server_request_reply(reply(&n1, req.id, serde_json::json!({"PublishContext": {}}))).await.unwrap();
    assert_eq!(call.await.unwrap().unwrap(), serde_json::json!({"PublishContext": {}}));
    assert_eq!(lock(&leader.seen_on).get("n1"), Some(&follower.addr), "remembered for the next call");

    // A node no server holds: no path, naming why.
    let e = leader.call("ghost", "CSI.X", serde_json::json!({}), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(&e, ClientCallError::NoPath { reason, .. } if reason.contains("no server holds a connection")), "{e:?}");

    // A server with another cluster's key is refused by the one holding the stream.
    let stranger =
        ClientCalls::new(ClientConns::new(), members, Peers::new(ClusterAuth::new(ClusterKey::generate(), "global")), &leader_addr);
    let e = stranger.call("n1", "CSI.X", serde_json::json!({}), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(&e, ClientCallError::NoPath { reason, .. } if reason.contains("servers of this cluster only")), "{e:?}");
}
