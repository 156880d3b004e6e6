//! The client's HTTP API: logs and restarts.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nomad_agent::client::Client;
use nomad_agent::client::http::{ClientHttp, router};
use nomad_proto::job::JobType;

use crate::support::{
    TestServer, event_types, job, log_file, pid_alive, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready, wait_until,
};

/// Serves the client routes on a kernel-chosen port.
async fn serve(client: &Client) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = router(ClientHttp { client: Some(client.clone()), locator: None, own_addr: addr.clone() });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn http() -> HttpClient<HttpConnector, Full<Bytes>> {
    HttpClient::builder(TokioExecutor::new()).build_http()
}

async fn request(method: &str, url: &str, body: &str) -> (u16, String) {
    let req = hyper::Request::builder().method(method).uri(url).body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = http().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_logs_api_returns_plain_framed_and_followed_output() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let addr = serve(&client).await;

    // Prints a line, then another each time a file appears in its task dir.
    let script = "echo first-line; echo oops >&2; i=0; while [ $i -lt 300 ]; do if [ -e more ]; then rm more; echo more-$i; fi; i=$((i+1)); sleep 0.1; done";
    let id = server.place(&job("logs", JobType::Service, vec![sh_task("t", script)], restart_policy(0, 0)), client.node_id()).await;
    wait_until("the task wrote its first line", || log_file(root.path(), &id, "t", "stdout").contains("first-line")).await;
    // stderr is copied by its own pump: written second, it may land after stdout's line.
    wait_until("the task wrote to stderr", || log_file(root.path(), &id, "t", "stderr").contains("oops")).await;

    let (code, body) = request("GET", &format!("http://{addr}/v1/client/fs/logs/{id}?task=t&type=stdout&plain=true"), "").await;
    assert_eq!((code, body.as_str()), (200, "first-line\n"));
    let (code, body) = request("GET", &format!("http://{addr}/v1/client/fs/logs/{id}?task=t&type=stderr&plain=true"), "").await;
    assert_eq!((code, body.as_str()), (200, "oops\n"));
    let (_, body) =
        request("GET", &format!("http://{addr}/v1/client/fs/logs/{id}?task=t&type=stdout&plain=true&origin=end&offset=5"), "").await;
    assert_eq!(body, "line\n", "the last 5 bytes");

    // Framed: one JSON frame with the data in base64 and the offset after it.
    let (code, body) = request("GET", &format!("http://{addr}/v1/client/fs/logs/{id}?task=t&type=stdout"), "").await;
    assert_eq!(code, 200);
    let frame: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(frame["Data"], "Zmlyc3QtbGluZQo=");
    assert_eq!(frame["Offset"], 11);
    assert_eq!(frame["File"], "alloc/logs/t.stdout.0");

    // Follow: the stream stays open and carries what the task writes next.
    let req = hyper::Request::get(format!("http://{addr}/v1/client/fs/logs/{id}?task=t&type=stdout&plain=true&follow=true"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut body = http().request(req).await.unwrap().into_body();
    let mut seen = String::new();
    let task_dir = root.path().join("alloc").join(&id).join("t");
    std::fs::write(task_dir.join("more"), "").unwrap();
    let read = tokio::time::timeout(crate::support::DEADLINE, async {
        while !seen.contains("more-") {
            let frame = body.frame().await.expect("the stream stays open").unwrap();
            if let Some(data) = frame.data_ref() {
                seen.push_str(&String::from_utf8_lossy(data));
            }
        }
    })
    .await;
    assert!(read.is_ok(), "followed output arrived: {seen:?}");
    assert!(seen.starts_with("first-line\n"));
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_logs_api_refuses_unknown_allocs_tasks_and_types() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let addr = serve(&client).await;
    let id = server.place(&job("errs", JobType::Service, vec![sh_task("t", "sleep 30")], restart_policy(0, 0)), client.node_id()).await;
    wait_for("the task runs", || task_pid(&client, &id, "t")).await;

    let base = format!("http://{addr}/v1/client/fs/logs");
    let get = |q: String| {
        let url = format!("{base}/{q}");
        async move { request("GET", &url, "").await }
    };
    assert_eq!(get("nope?task=t&type=stdout".into()).await, (404, "Unknown allocation \"nope\"".into()));
    let (code, body) = get(format!("{id}?task=ghost&type=stdout")).await;
    assert_eq!(code, 400);
    assert!(body.contains("unknown task name \"ghost\""), "{body}");
    assert_eq!(get(format!("{id}?task=t&type=stdin")).await, (400, "must provide log type (stdout/stderr)".into()));
    assert_eq!(get(format!("{id}?type=stdout")).await, (400, "must provide task name".into()));
    let (code, _) = request("POST", &format!("http://{addr}/v1/client/fs/logs/{id}?task=t&type=stdout"), "").await;
    assert_eq!(code, 405);
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_endpoint_restarts_the_task_without_counting_against_its_policy() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let addr = serve(&client).await;

    // No restarts allowed by policy: only a user restart can bring it back.
    let id =
        server.place(&job("restartme", JobType::Service, vec![sh_task("t", "sleep 60")], restart_policy(0, 0)), client.node_id()).await;
    let first = wait_for("the task runs", || task_pid(&client, &id, "t")).await;

    let (code, body) = request("PUT", &format!("http://{addr}/v1/client/allocation/{id}/restart"), r#"{"TaskName": "t"}"#).await;
    assert_eq!((code, body.as_str()), (200, r#"{"Index":0}"#));
    let second = wait_for("a new process runs", || task_pid(&client, &id, "t").filter(|p| *p != first)).await;
    assert!(!pid_alive(first));
    assert!(pid_alive(second));
    let state =
        wait_for("the server sees the restart", || server.task_state(&id, "t").filter(|s| s.restarts == 1 && s.state == "running")).await;
    let types = event_types(&state);
    let signaled = types.iter().position(|t| t == "Restart Signaled").expect("Restart Signaled");
    let restarting = types.iter().rposition(|t| t == "Restarting").expect("Restarting");
    assert!(signaled < restarting && types.last().map(String::as_str) == Some("Started"), "{types:?}");
    assert!(!state.failed);

    // python-nomad POSTs with no body: every running task restarts.
    let (code, _) = request("POST", &format!("http://{addr}/v1/client/allocation/{id}/restart"), "").await;
    assert_eq!(code, 200);
    wait_for("a third process runs", || task_pid(&client, &id, "t").filter(|p| *p != second)).await;

    assert_eq!(request("PUT", &format!("http://{addr}/v1/client/allocation/{id}/restart"), r#"{"TaskName": "x"}"#).await.0, 400);
    assert_eq!(request("PUT", &format!("http://{addr}/v1/client/allocation/nope/restart"), "").await.0, 404);
    let (code, body) = request("GET", &format!("http://{addr}/v1/client/allocation/{id}/stats"), "").await;
    assert_eq!(code, 200);
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(stats["Tasks"]["t"]["ResourceUsage"]["MemoryStats"]["RSS"].as_u64().unwrap() > 0, "{stats}");
    client.shutdown_destroying_allocs().await;
}

/// Finds allocs through the test server's state, like a server agent does.
struct Locator(std::sync::Arc<nomad_server::state::StateStore>, String);

impl nomad_agent::client::http::AllocLocator for Locator {
    fn node_http_addr(&self, alloc_id: &str) -> Option<String> {
        let snap = self.0.snapshot();
        snap.alloc(alloc_id)?;
        Some(self.1.clone())
    }
}

async fn serve_router(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_the_alloc_forwards_to_its_client_or_says_where_to_go() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let client_addr = serve(&client).await;
    let id = server
        .place(&job("fwd", JobType::Service, vec![sh_task("t", "echo via-forward; sleep 30")], restart_policy(0, 0)), client.node_id())
        .await;
    wait_until("the task wrote", || log_file(root.path(), &id, "t", "stdout").contains("via-forward")).await;

    // A server-only agent that can find the alloc's node forwards there.
    let locator = std::sync::Arc::new(Locator(server.store(), client_addr.clone()));
    let server_agent = serve_router(router(ClientHttp { client: None, locator: Some(locator), own_addr: "127.0.0.1:1".into() })).await;
    let (code, body) = request("GET", &format!("http://{server_agent}/v1/client/fs/logs/{id}?task=t&type=stdout&plain=true"), "").await;
    assert_eq!((code, body.as_str()), (200, "via-forward\n"));
    let (code, body) = request("GET", &format!("http://{server_agent}/v1/client/fs/logs/nope?task=t&type=stdout"), "").await;
    assert_eq!((code, body.as_str()), (404, "Unknown allocation \"nope\""));

    // One that cannot find it explains where the request must go.
    let bare = serve_router(router(ClientHttp { client: None, locator: None, own_addr: String::new() })).await;
    let (code, body) = request("GET", &format!("http://{bare}/v1/client/fs/logs/{id}?task=t&type=stdout"), "").await;
    assert_eq!(code, 400);
    assert!(body.contains("HTTPAddr"), "{body}");
    client.shutdown_destroying_allocs().await;
}

/// Accepts connections on `listener`, counting them; answers each request `ok` and keeps its
/// head (request line and headers).
fn record_requests(listener: tokio::net::TcpListener) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
            });
        }
    });
    heads
}

/// Two listeners on one port: on 127.0.0.2 (the host a node names) and on 127.0.0.1 (where the
/// node really is).
async fn same_port_on_two_loopback_addresses() -> (tokio::net::TcpListener, tokio::net::TcpListener) {
    for _ in 0..50 {
        let named = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = named.local_addr().unwrap().port();
        if let Ok(real) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            return (named, real);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_names_another_host_as_its_http_address_never_gets_a_request_sent_there() {
    use nomad_proto::rpc::{NodeClient, NodeRegisterRequest};
    let server = TestServer::start().await;
    let (named, real) = same_port_on_two_loopback_addresses().await;
    let port = real.local_addr().unwrap().port();
    let named_host = record_requests(named);
    let node_itself = record_requests(real);

    // The node registers over its own connection (from 127.0.0.1), naming another host.
    let mut forger = nomad_server::testing::node("forger");
    forger.http_addr = format!("127.0.0.2:{port}");
    forger.rpc_peer_ip = "10.66.66.66".into();
    let mut rpc = NodeClient::connect(format!("http://{}", server.addr())).await.unwrap();
    rpc.register(NodeRegisterRequest { node: forger, ..Default::default() }).await.unwrap();
    let stored = server.store().snapshot().node("forger").map(|n| n.rpc_peer_ip.clone());
    assert_eq!(stored.as_deref(), Some("127.0.0.1"), "the servers record where the connection came from, not what the node says");
    let id = server.place(&job("fwd", JobType::Service, vec![sh_task("t", "sleep 30")], restart_policy(0, 0)), "forger").await;

    // A server agent forwards a client request for the node's alloc, with the caller's token.
    let locator = std::sync::Arc::new(nomad_agent::client::http::StateLocator(server.store()));
    let server_agent = serve_router(router(ClientHttp { client: None, locator: Some(locator), own_addr: "127.0.0.1:1".into() })).await;
    let req = hyper::Request::builder()
        .uri(format!("http://{server_agent}/v1/client/fs/logs/{id}?task=t&type=stdout&plain=true"))
        .header("X-Nomad-Token", "operator-secret-token")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = http().request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    assert!(named_host.lock().unwrap().is_empty(), "the named host got nothing: {:?}", named_host.lock().unwrap());
    let heads = node_itself.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "the node itself got the request: {heads:?}");
    assert!(heads[0].starts_with(&format!("GET /v1/client/fs/logs/{id}")), "{}", heads[0]);
    // The caller's token goes along: the node's agent authorizes the same caller.
    assert!(heads[0].to_ascii_lowercase().contains("x-nomad-token: operator-secret-token"), "the caller's token travels: {}", heads[0]);
}
