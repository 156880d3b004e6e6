//! The stream loop against real in-process servers: a server's call reaches the client's
//! handler and the answer comes back; the stream moves to the next server when its server goes.

use std::sync::Arc;
use std::time::Duration;

use nomad_server::client_conn::{ClientConns, methods};
use nomad_server::rpc::{ClientRpc, Peers};
use nomad_server::rpc_auth::{ClusterAuth, ClusterKey};
use nomad_server::testing::{TestServer, node};
use tokio_stream::wrappers::TcpListenerStream;

use super::*;
use crate::client::csi::endpoint::{ControllerPlugins, NoVolumeManager};

struct NoControllers;

impl ControllerPlugins for NoControllers {
    fn controller(&self, plugin_id: &str) -> Result<Arc<dyn nomad_csi::CsiPluginClient>, String> {
        Err(format!("csi-controller plugin {plugin_id:?} is not running on this client"))
    }
}

/// A server with node `n1` registered; aborting the handle stops it.
async fn server() -> (String, Arc<ClientConns>, tokio::task::JoinHandle<()>) {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    let conns = ClientConns::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rpc =
        ClientRpc::new(ts.endpoints.clone(), Peers::new(ClusterAuth::new(ClusterKey::generate(), "global"))).with_conns(conns.clone());
    let (node_svc, _) = rpc.services();
    let task = tokio::spawn(async move {
        let _ts = ts;
        let _ = tonic::transport::Server::builder().add_service(node_svc).serve_with_incoming(TcpListenerStream::new(listener)).await;
    });
    (addr, conns, task)
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn start(servers: Arc<Servers>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    let handler = Arc::new(ServerRequestHandler::new(CsiEndpoint::new(Arc::new(NoControllers), Arc::new(NoVolumeManager))));
    let creds = NodeCredentials { node_id: "n1".into(), secret_id: "secret-n1".into() };
    let registered = watch::channel(1u64).1;
    let backoff = Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(200) };
    tokio::spawn(run(servers, creds, handler, registered, backoff, shutdown))
}

#[tokio::test]
async fn a_servers_call_reaches_the_handler_and_the_answer_comes_back() {
    let (addr, conns, _server) = server().await;
    let shutdown = CancellationToken::new();
    let client = start(Arc::new(Servers::new(vec![addr])), shutdown.clone());
    wait_until("the stream to open", || conns.has("n1")).await;
    let body = serde_json::json!({"PluginID": "hostpath", "NodeID": "n1", "VolumeID": "vol", "AllocID": "a1"});
    let e = conns.call("n1", methods::NODE_DETACH, body, Duration::from_secs(10)).await.unwrap_err();
    let nomad_server::csi::ClientCallError::Failed(m) = e else { panic!("{e:?}") };
    assert!(m.contains("has no CSI volume manager"), "{m}");
    let body = serde_json::json!({"PluginID": "hostpath", "VolumeID": "v", "ClientCSINodeID": "x"});
    let e = conns.call("n1", methods::CONTROLLER_ATTACH, body, Duration::from_secs(10)).await.unwrap_err();
    assert!(e.to_string().contains("CSI client error (retryable)"), "{e}");
    let e = conns.call("n1", "Alloc.Nope", serde_json::json!({}), Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(e.to_string(), "unknown client rpc \"Alloc.Nope\"");
    shutdown.cancel();
    client.await.unwrap();
    wait_until("the stream to close", || !conns.has("n1")).await;
}

#[tokio::test]
async fn a_stream_that_ends_is_opened_again_and_follows_a_failover() {
    use futures::StreamExt as _;
    let (a, a_conns, _a_task) = server().await;
    let (b, b_conns, _b_task) = server().await;
    let shutdown = CancellationToken::new();
    let servers = Arc::new(Servers::new(vec![a.clone(), b.clone()]));
    let _client = start(servers.clone(), shutdown.clone());
    wait_until("the stream on the first server", || a_conns.has("n1")).await;
    assert!(!b_conns.has("n1"));

    // The server ends the client's stream (here: a newer registration replaces it); the client
    // opens it again, which in turn ends the one that replaced it.
    let mut replaced = a_conns.open("n1");
    let ended = tokio::time::timeout(Duration::from_secs(20), replaced.next()).await.expect("the client opened its stream again");
    assert!(ended.is_none());
    assert!(a_conns.has("n1"));

    // The client fails over (as a failed heartbeat makes it): the stream follows.
    servers.failed(&a);
    assert_eq!(servers.current().as_deref(), Some(b.as_str()));
    wait_until("the stream on the second server", || b_conns.has("n1")).await;
    wait_until("the first server to let it go", || !a_conns.has("n1")).await;
    let e = b_conns.call("n1", "X.Y", serde_json::json!({}), Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(e.to_string(), "unknown client rpc \"X.Y\"", "calls reach it there");
    shutdown.cancel();
}

#[tokio::test]
async fn a_refused_stream_is_tried_again_with_backoff_until_the_node_is_known() {
    let ts = TestServer::new();
    let conns = ClientConns::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rpc =
        ClientRpc::new(ts.endpoints.clone(), Peers::new(ClusterAuth::new(ClusterKey::generate(), "global"))).with_conns(conns.clone());
    let (node_svc, _) = rpc.services();
    tokio::spawn(tonic::transport::Server::builder().add_service(node_svc).serve_with_incoming(TcpListenerStream::new(listener)));
    let shutdown = CancellationToken::new();
    let servers = Arc::new(Servers::new(vec![addr.clone()]));
    let _client = start(servers.clone(), shutdown.clone());
    // Not registered yet: refused ("not found"), and the server stays the one in use.
    tokio::task::yield_now().await;
    assert!(!conns.has("n1"));
    ts.register_node(node("n1")).await;
    wait_until("the stream once the node is known", || conns.has("n1")).await;
    assert_eq!(servers.current().as_deref(), Some(addr.as_str()));
    shutdown.cancel();
}
