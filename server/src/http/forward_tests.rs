//! Forwarding to the leader across a real three-server cluster (Raft and RPC over loopback).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tower::ServiceExt;

use super::forward::ForwardedRequest;
use super::forward::generated::forward_client::ForwardClient;
use crate::http::AgentInfo;
use crate::rpc_auth::{ClusterAuth, ClusterKey};
use crate::server::{Server, ServerConfig};
use crate::testing::job;

const DEADLINE: Duration = Duration::from_secs(60);

struct Cluster {
    servers: Vec<Server>,
    routers: Vec<axum::Router>,
    key: ClusterKey,
    _dirs: Vec<tempfile::TempDir>,
}

async fn start_cluster() -> Cluster {
    let key = ClusterKey::generate();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    let (mut servers, mut routers, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
    for (i, listener) in listeners.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig::new(dir.path(), addrs[i].clone());
        cfg.bootstrap_expect = 3;
        cfg.join = addrs.clone();
        cfg.encrypt = Some(key.encode());
        let server = Server::start(cfg, listener).await.unwrap();
        routers.push(server.http_router(AgentInfo { name: format!("server{i}"), region: "global".into(), ..AgentInfo::default() }));
        servers.push(server);
        dirs.push(dir);
    }
    Cluster { servers, routers, key, _dirs: dirs }
}

impl Cluster {
    async fn leader(&self) -> usize {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let leaders: Vec<usize> = (0..3).filter(|&i| self.servers[i].consensus().is_leader()).collect();
            let known = self.servers.iter().all(|s| s.consensus().leader_rpc_addr().is_some());
            if leaders.len() == 1 && known {
                return leaders[0];
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader all servers know of");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(self) {
        for server in self.servers {
            server.shutdown().await;
        }
    }
}

async fn call(router: &axum::Router, method: Method, path: &str, body: String, token: &str) -> (StatusCode, Value) {
    let request = Request::builder().method(method).uri(path).header("X-Nomad-Token", token).body(Body::from(body)).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let value = serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_hands_writes_to_the_leader_as_the_caller_sent_them() {
    let cluster = start_cluster().await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;

    // A job registered through a follower: the leader checks and writes it.
    let body = json!({ "Job": serde_json::to_value(job("web", 1)).unwrap() }).to_string();
    let (status, reply) = call(&cluster.routers[follower], Method::PUT, "/v1/jobs", body, "caller-token").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(!reply["EvalID"].as_str().unwrap().is_empty(), "{reply}");
    assert!(cluster.servers[leader].store().snapshot().job("default", "web").is_some(), "written by the leader");

    // A refusal comes back as the leader gave it: same status, same text.
    let mut bad = job("bad", 1);
    bad.task_groups[0].tasks.clear();
    let bad = json!({ "Job": serde_json::to_value(&bad).unwrap() }).to_string();
    let through_follower = call(&cluster.routers[follower], Method::PUT, "/v1/jobs", bad.clone(), "t").await;
    let at_leader = call(&cluster.routers[leader], Method::PUT, "/v1/jobs", bad, "t").await;
    assert_eq!(through_follower, at_leader);
    assert_ne!(through_follower.0, StatusCode::OK);

    // A plan is made on the leader's state, a stop through the other follower reaches it too.
    let plan = json!({ "Job": serde_json::to_value(job("web", 3)).unwrap(), "Diff": true }).to_string();
    let (status, reply) = call(&cluster.routers[follower], Method::PUT, "/v1/job/web/plan", plan, "t").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["Diff"]["Type"], "Edited", "planned against the job the leader holds: {reply}");
    let other = (leader + 2) % 3;
    let (status, reply) = call(&cluster.routers[other], Method::DELETE, "/v1/job/web?purge=true", String::new(), "t").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(cluster.servers[leader].store().snapshot().job("default", "web").is_none());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_travels_one_hop_and_only_from_a_server() {
    let cluster = start_cluster().await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let addr = cluster.servers[follower].rpc_addr().to_string();
    let request = ForwardedRequest {
        method: "PUT".into(),
        path_and_query: "/v1/jobs".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            json!({ "Job": serde_json::to_value(job("hop", 1)).unwrap() }).to_string(),
        ),
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();

    // Without the cluster's key the call is refused before anything runs.
    let mut stranger = ForwardClient::new(channel.clone());
    let refused = stranger.http(request.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    // A server's forward that lands on a follower is answered there, not passed on again.
    let auth = ClusterAuth::new(cluster.key.clone(), "global");
    let mut server = ForwardClient::with_interceptor(channel, auth.interceptor());
    let answer = server.http(request).await.unwrap().into_inner();
    assert_eq!(answer.status, 500);
    let body = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &answer.body).unwrap();
    assert_eq!(String::from_utf8(body).unwrap(), "No cluster leader");
    assert!(cluster.servers[leader].store().snapshot().job("default", "hop").is_none(), "nothing written");
    cluster.shutdown().await;
}

async fn raw(router: &axum::Router, method: Method, path: &str, body: bytes::Bytes) -> (StatusCode, bytes::Bytes) {
    let request = Request::builder().method(method).uri(path).body(Body::from(body)).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    (status, axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap())
}

/// A snapshot saved and restored through followers: the save is the leader's (a stale one is
/// the follower's own), and the restore is a Raft write every server applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restore_through_a_follower_reaches_every_server() {
    let cluster = start_cluster().await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let register = |id: &str| json!({ "Job": serde_json::to_value(job(id, 1)).unwrap() }).to_string();
    assert_eq!(call(&cluster.routers[leader], Method::PUT, "/v1/jobs", register("kept"), "t").await.0, StatusCode::OK);

    let (status, saved) = raw(&cluster.routers[follower], Method::GET, "/v1/operator/snapshot", bytes::Bytes::new()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&saved));
    let meta = crate::snapshot::read_archive(&saved).unwrap().meta;
    assert!(meta.term > 0, "saved by the leader, in its term: {meta:?}");
    let (status, stale) = raw(&cluster.routers[follower], Method::GET, "/v1/operator/snapshot?stale", bytes::Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(crate::snapshot::read_archive(&stale).is_ok());

    assert_eq!(call(&cluster.routers[leader], Method::PUT, "/v1/jobs", register("dropped"), "t").await.0, StatusCode::OK);
    let (status, body) = raw(&cluster.routers[other], Method::PUT, "/v1/operator/snapshot", saved).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let restored = cluster.servers.iter().all(|s| {
            let snap = s.store().snapshot();
            snap.job("default", "kept").is_some() && snap.job("default", "dropped").is_none()
        });
        if restored {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "every server holds the restored state");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}
