//! `/v1/agent/servers` on a client: the list it uses, replaced by an operator (Nomad's
//! `SetServers`: addresses resolved and pinged, Nomad's default port added), after which the
//! client talks to the new servers.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use nomad_server::http::agent_local::{AgentLocal, ClientServers, router};
use nomad_server::log_hub::LogHub;
use tower::ServiceExt;

use crate::support::{TestServer, start_client, wait_ready, wait_until};

async fn call(app: &axum::Router, method: Method, uri: &str) -> (StatusCode, String) {
    let resp = app.clone().oneshot(Request::builder().method(method).uri(uri).body(Body::empty()).unwrap()).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_moves_the_client_to_other_servers() {
    let first = TestServer::start().await;
    let second = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &first).await;
    wait_ready(&first, &client).await;
    let app = router(AgentLocal {
        client_servers: Some(Arc::new(client.clone()) as Arc<dyn ClientServers>),
        node_id: Some(client.node_id().to_string()),
        server_name: None,
        server_role: false,
        metrics: vec![client.metrics_source()],
        host: String::new(),
        prometheus: false,
        logs: Arc::new(LogHub::default()),
    });
    let (status, body) = call(&app, Method::GET, "/v1/agent/servers").await;
    assert_eq!((status, serde_json::from_str::<serde_json::Value>(&body).unwrap()), (StatusCode::OK, serde_json::json!([first.addr()])));

    // An address where no server answers is refused with Nomad's text, and nothing changes.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (status, body) = call(&app, Method::PUT, &format!("/v1/agent/servers?address={dead}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with(&format!("1 error occurred:\n\t* Server at address {dead} failed ping: ")), "{body}");
    assert_eq!(client.servers(), [first.addr()]);

    // A live server is taken (a dead one beside it dropped), and the client goes there: it
    // registers with the second server, which never heard of it.
    let (status, body) = call(&app, Method::PUT, &format!("/v1/agent/servers?address={}&address={dead}", second.addr())).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(client.servers(), [second.addr()]);
    let id = client.node_id().to_string();
    wait_until("the client registers with the new server", || second.store().snapshot().node(&id).is_some()).await;

    // The client's gauges, under Nomad's names and labels.
    let (_, body) = call(&app, Method::GET, "/v1/metrics").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let running = v["Gauges"].as_array().unwrap().iter().find(|g| g["Name"] == "nomad.client.allocations.running").expect("running gauge");
    assert_eq!(running["Value"], 0);
    assert_eq!(running["Labels"]["node_id"], id.as_str());
    assert_eq!(running["Labels"]["datacenter"], "dc1");
    client.shutdown().await;
}
