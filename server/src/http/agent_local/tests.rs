use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use serde_json::Value;
use tower::ServiceExt as _;

use super::*;

const DEADLINE: Duration = Duration::from_secs(20);

#[derive(Default)]
struct FakeServers {
    list: Mutex<Vec<String>>,
}

impl ClientServers for FakeServers {
    fn servers(&self) -> Vec<String> {
        self.list.lock().unwrap().clone()
    }

    fn set_servers(&self, addrs: Vec<String>) -> BoxFuture<'_, Result<usize, String>> {
        Box::pin(async move {
            if addrs.iter().all(|a| a == "down:4647") {
                return Err("1 error occurred:\n\t* Server at address down:4647 failed ping: unreachable\n\n".into());
            }
            let n = addrs.len();
            *self.list.lock().unwrap() = addrs;
            Ok(n)
        })
    }
}

fn local(client: Option<Arc<FakeServers>>, hub: Arc<LogHub>) -> AgentLocal {
    let gauge: MetricsSource = Arc::new(|m: &mut MetricsSnapshot| m.gauge("nomad.client.allocations.running", 3.0, &[("node_id", "n1")]));
    AgentLocal {
        client_servers: client.map(|c| c as Arc<dyn ClientServers>),
        node_id: Some("n1".into()),
        server_name: None,
        server_role: false,
        metrics: vec![gauge],
        host: "h1".into(),
        prometheus: false,
        logs: hub,
    }
}

async fn call(router: &Router, method: Method, uri: &str) -> (StatusCode, String) {
    let resp = router.clone().oneshot(Request::builder().method(method).uri(uri).body(Body::empty()).unwrap()).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn agent_servers_lists_and_replaces_the_clients_servers() {
    let fake = Arc::new(FakeServers::default());
    *fake.list.lock().unwrap() = vec!["10.0.0.2:4647".into(), "10.0.0.1:4647".into()];
    let router = router(local(Some(fake.clone()), Arc::new(LogHub::default())));
    let (status, body) = call(&router, Method::GET, "/v1/agent/servers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), serde_json::json!(["10.0.0.1:4647", "10.0.0.2:4647"]), "sorted");

    let (status, body) = call(&router, Method::PUT, "/v1/agent/servers?address=10.0.0.3:4647&address=10.0.0.4:4647").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    assert_eq!(*fake.list.lock().unwrap(), ["10.0.0.3:4647", "10.0.0.4:4647"], "every address, in order");

    let (status, body) = call(&router, Method::POST, "/v1/agent/servers").await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_REQUEST, "missing server address"));
    let (status, body) = call(&router, Method::PUT, "/v1/agent/servers?address=down:4647").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("failed ping"), "{body}");
    assert_eq!(*fake.list.lock().unwrap(), ["10.0.0.3:4647", "10.0.0.4:4647"], "a refused update changes nothing");
    let many: String = (0..=MAX_SERVER_ADDRESSES).map(|i| format!("address=s{i}&")).collect();
    let (status, body) = call(&router, Method::PUT, &format!("/v1/agent/servers?{many}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Three-byte characters: cutting the echo at a byte count would split one.
    let long = "%E2%82%AC".repeat(MAX_ADDRESS_BYTES);
    let (status, body) = call(&router, Method::PUT, &format!("/v1/agent/servers?address={long}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("is longer than"), "{body}");
    let (status, _) = call(&router, Method::DELETE, "/v1/agent/servers").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn roles_the_agent_lacks_answer_501() {
    let router = router(local(None, Arc::new(LogHub::default())));
    for (method, path) in [
        (Method::GET, "/v1/agent/servers"),
        (Method::PUT, "/v1/agent/servers?address=a:1"),
        (Method::PUT, "/v1/agent/join?address=a:1"),
        (Method::POST, "/v1/agent/force-leave?node=x"),
    ] {
        let (status, body) = call(&router, method.clone(), path).await;
        assert_eq!((status, body.as_str()), (StatusCode::NOT_IMPLEMENTED, "Invalid method"), "{method} {path}");
    }
}

#[tokio::test]
async fn metrics_in_go_metrics_json_and_prometheus_only_when_enabled() {
    let mut l = local(None, Arc::new(LogHub::default()));
    let router_off = router(l.clone());
    let (status, body) = call(&router_off, Method::GET, "/v1/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    for key in ["Timestamp", "Gauges", "Points", "Counters", "Samples"] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    assert!(v["Timestamp"].as_str().unwrap().ends_with(" +0000 UTC"), "{v}");
    assert_eq!(
        v["Gauges"][0],
        serde_json::json!({"Name": "nomad.client.allocations.running", "Value": 3, "Labels": {"host": "h1", "node_id": "n1"}})
    );
    let (status, body) = call(&router_off, Method::GET, "/v1/metrics?format=prometheus").await;
    assert_eq!((status, body.as_str()), (StatusCode::UNSUPPORTED_MEDIA_TYPE, "Prometheus is not enabled"));

    l.prometheus = true;
    let resp = router(l).oneshot(Request::get("/v1/metrics?format=prometheus").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    assert!(
        String::from_utf8_lossy(&body).contains("nomad_client_allocations_running{host=\"h1\",node_id=\"n1\"} 3\n"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, _) = call(&router_off, Method::PUT, "/v1/metrics").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

/// Waits until a monitor is attached to `hub` at `level` or more.
async fn attached(hub: &LogHub, level: tracing::Level) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !hub.wants(level) {
        assert!(tokio::time::Instant::now() < deadline, "no monitor attached");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn next_data(body: &mut Body) -> Bytes {
    let frame = tokio::time::timeout(DEADLINE, body.frame()).await.expect("a frame in time").expect("the stream goes on").unwrap();
    frame.into_data().unwrap()
}

#[tokio::test]
async fn monitor_streams_log_lines_in_frames_at_the_level_asked() {
    let hub = Arc::new(LogHub::default());
    let router = router(local(None, hub.clone()));
    let resp = router.clone().oneshot(Request::get("/v1/agent/monitor?log_level=debug").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let mut body = resp.into_body();
    attached(&hub, tracing::Level::DEBUG).await;
    assert!(!hub.wants(tracing::Level::TRACE), "only what was asked for is built");
    hub.publish(tracing::Level::DEBUG, &|json| if json { "json".into() } else { "[DEBUG] agent: hello".into() });
    let mut seen = String::new();
    while !seen.contains("[DEBUG] agent: hello\n") {
        let data = next_data(&mut body).await;
        let frame: Value = serde_json::from_slice(&data).unwrap();
        if frame == serde_json::json!({}) {
            continue; // a heartbeat
        }
        assert_eq!(frame["FileEvent"], "log");
        let bytes = base64::engine::general_purpose::STANDARD.decode(frame["Data"].as_str().unwrap()).unwrap();
        seen.push_str(&String::from_utf8(bytes).unwrap());
    }
    drop(body);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while hub.max_level().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "a closed monitor stays attached");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn monitor_in_plain_text_and_json_lines() {
    let hub = Arc::new(LogHub::default());
    let router = router(local(None, hub.clone()));
    let resp =
        router.clone().oneshot(Request::get("/v1/agent/monitor?plain=true&log_json=true").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/plain");
    let mut body = resp.into_body();
    attached(&hub, tracing::Level::INFO).await;
    hub.publish(tracing::Level::INFO, &|json| if json { "{\"@message\":\"hi\"}".into() } else { "text".into() });
    assert_eq!(next_data(&mut body).await, "{\"@message\":\"hi\"}\n");
}

#[tokio::test]
async fn monitor_refuses_bad_options_with_nomads_texts() {
    let router = router(local(None, Arc::new(LogHub::default())));
    for (uri, want) in [
        ("/v1/agent/monitor?log_level=loud", "Unknown log level: loud"),
        ("/v1/agent/monitor?log_json=maybe", "Unknown option for log json: strconv.ParseBool: parsing \"maybe\": invalid syntax"),
        ("/v1/agent/monitor?plain=2", "Unknown option for plain: strconv.ParseBool: parsing \"2\": invalid syntax"),
        ("/v1/agent/monitor?node_id=n1&server_id=s1", "Cannot target node and server simultaneously"),
    ] {
        assert_eq!(call(&router, Method::GET, uri).await, (StatusCode::BAD_REQUEST, want.to_string()), "{uri}");
    }
    let (status, body) = call(&router, Method::GET, "/v1/agent/monitor?node_id=other").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("not supported"), "{body}");
}
