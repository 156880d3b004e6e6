//! SecretID audit: a cluster goes through every node change that has an
//! event type (registration, re-registration, heartbeat, eligibility, drain,
//! drain complete, heartbeat expiry, purge) with allocs placed by the real
//! schedulers, while the whole event stream is recorded; then every route
//! that can return a node (or anything else) is read with every option. No
//! response body and no event may contain a node's SecretID.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use nomad_proto::rpc::{AllocUpdateRequest, NodeRegisterRequest, NodeUpdateStatusRequest};
use nomad_proto::{ClientStatus, JobType, Node, NodeStatus};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::endpoints::JobRegisterOptions;
use crate::leader::LeaderConfig;
use crate::sim::start_leader;
use crate::test_support::eventually;
use crate::testing::{TestServer, job, node};

/// Every route and query this audit reads, with what it returned.
struct Audit {
    ts: TestServer,
    secrets: Vec<String>,
    seen: Vec<(String, String)>,
}

impl Audit {
    async fn call(&mut self, method: Method, path: &str, body: &str) -> Value {
        let req = Request::builder().method(method.clone()).uri(path).body(Body::from(body.to_string())).unwrap();
        let resp = self.ts.router().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert_eq!(status, StatusCode::OK, "{method} {path}: {text}");
        self.seen.push((format!("{method} {path}"), text.clone()));
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn get(&mut self, path: &str) -> Value {
        self.call(Method::GET, path, "").await
    }

    fn check(&self) {
        assert!(self.seen.len() > 40, "the walk read {} routes", self.seen.len());
        for (route, body) in &self.seen {
            for s in &self.secrets {
                assert!(!body.contains(s.as_str()), "{route} leaks a node SecretID: {body}");
            }
        }
    }
}

fn with_secret(id: &str) -> Node {
    Node { secret_id: nomad_proto::new_id(), ..node(id) }
}

/// Reports every live alloc on `n` as `status`, through the client RPC.
async fn report(ts: &TestServer, n: &Node, status: ClientStatus, only_stopped: bool) {
    let snap = ts.store.snapshot();
    let allocs: Vec<_> = snap
        .allocs_by_node(&n.id)
        .filter(|a| !a.client_terminal() && (!only_stopped || a.desired_status != nomad_proto::DesiredStatus::Run))
        .map(|a| nomad_proto::Allocation {
            id: a.id.clone(),
            node_id: n.id.clone(),
            client_status: status,
            deployment_status: Some(json!({ "Healthy": true })),
            ..Default::default()
        })
        .collect();
    if !allocs.is_empty() {
        ts.endpoints.node_update_alloc(AllocUpdateRequest { alloc: allocs, evals: vec![], secret_id: n.secret_id.clone() }).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_and_no_event_ever_carries_a_node_secret() {
    let ts = TestServer::new();
    // Record the whole stream from before the first write.
    let req = Request::get("/v1/event/stream?topic=*&namespace=*").body(Body::empty()).unwrap();
    let mut body = ts.router().oneshot(req).await.unwrap().into_body();
    let stream = tokio::spawn(async move {
        let mut buf = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                buf.extend_from_slice(&data);
                if buf.ends_with(b"\n") && String::from_utf8_lossy(&buf).contains("__audit_done__") {
                    break;
                }
            }
        }
        buf
    });
    let config = LeaderConfig { num_schedulers: 1, evals_in_flight: 2, ..LeaderConfig::default() };
    let (_leader, leader_task) = start_leader(&ts, Arc::new(crate::scheduler::BuiltinScheduler), config);

    // Two nodes join; a service and a system job run on them.
    let (mut n1, n2) = (with_secret("n1"), with_secret("n2"));
    for n in [&n1, &n2] {
        ts.endpoints.node_register(NodeRegisterRequest { node: n.clone(), region: String::new() }).await.unwrap();
        let hb = NodeUpdateStatusRequest {
            node_id: n.id.clone(),
            status: NodeStatus::Ready,
            secret_id: n.secret_id.clone(),
            ..Default::default()
        };
        ts.endpoints.node_update_status(hb).await.unwrap();
    }
    ts.endpoints.job_register(job("web", 2), JobRegisterOptions::default()).await.unwrap();
    let mut sys = job("logs", 1);
    sys.job_type = JobType::System;
    ts.endpoints.job_register(sys, JobRegisterOptions::default()).await.unwrap();
    eventually(&ts, "4 allocs placed", |s| s.allocs().filter(|a| !a.terminal()).count() == 4).await;
    for n in [&n1, &n2] {
        report(&ts, n, ClientStatus::Running, false).await;
    }
    // A re-registration with a change, an eligibility round trip.
    n1.meta.insert("rack".into(), "r1".into());
    ts.endpoints.node_register(NodeRegisterRequest { node: n1.clone(), region: String::new() }).await.unwrap();
    let mut audit = Audit { ts, secrets: vec![n1.secret_id.clone(), n2.secret_id.clone()], seen: Vec::new() };
    audit.call(Method::PUT, "/v1/node/n2/eligibility", r#"{"Eligibility":"ineligible"}"#).await;
    audit.call(Method::PUT, "/v1/node/n2/eligibility", r#"{"Eligibility":"eligible"}"#).await;

    // Drain n1 with a deadline already past: the drainer moves everything, then completes it.
    audit.call(Method::PUT, "/v1/node/n1/drain", r#"{"DrainSpec":{"Deadline":-1},"Meta":{"why":"audit"}}"#).await;
    eventually(&audit.ts, "n1's allocs stopped", |s| s.allocs_by_node("n1").all(|a| a.terminal())).await;
    report(&audit.ts, &n1, ClientStatus::Complete, true).await;
    eventually(&audit.ts, "the drain complete", |s| s.node("n1").unwrap().drain_strategy.is_none()).await;
    report(&audit.ts, &n2, ClientStatus::Running, false).await;

    // Every read, with every option.
    let stub = audit.get("/v1/nodes").await;
    assert!(stub[0].get("SecretID").is_none(), "stubs have no SecretID field");
    let mut token = String::new();
    for q in [
        "",
        "?prefix=n",
        "?prefix=n1",
        "?resources=true",
        "?os=true",
        "?resources=true&os=true",
        "?resources=1&os=T&pretty=true",
        "?per_page=1",
        "?namespace=*",
        "?index=1&wait=1ms",
    ] {
        let v = audit.get(&format!("/v1/nodes{q}")).await;
        assert!(v.as_array().is_some_and(|a| !a.is_empty()), "{q}: {v}");
    }
    let page = audit.ts.router().oneshot(Request::get("/v1/nodes?per_page=1").body(Body::empty()).unwrap()).await.unwrap();
    if let Some(t) = page.headers().get("x-nomad-nexttoken") {
        token = t.to_str().unwrap().to_string();
    }
    assert!(!token.is_empty(), "two nodes, one per page");
    audit.get(&format!("/v1/nodes?per_page=1&next_token={token}")).await;
    for id in ["n1", "n2"] {
        let full = audit.get(&format!("/v1/node/{id}")).await;
        assert_eq!(full["SecretID"], "", "the key is there but blank, as Nomad's");
        audit.get(&format!("/v1/node/{id}?pretty=true")).await;
        audit.get(&format!("/v1/node/{id}?index=1&wait=1ms")).await;
        audit.get(&format!("/v1/node/{id}/allocations")).await;
        audit.call(Method::POST, &format!("/v1/node/{id}/evaluate"), "").await;
    }
    for path in [
        "/v1/agent/self",
        "/v1/agent/members",
        "/v1/status/leader",
        "/v1/status/peers",
        "/v1/regions",
        "/v1/jobs",
        "/v1/jobs?namespace=*",
        "/v1/job/web",
        "/v1/job/web/summary",
        "/v1/job/web/evaluations",
        "/v1/job/web/allocations",
        "/v1/job/logs/allocations",
        "/v1/allocations",
        "/v1/allocations?resources=true",
        "/v1/allocations?task_states=false",
        "/v1/allocations?resources=true&task_states=true&namespace=*",
        "/v1/evaluations",
        "/v1/services",
        "/v1/namespaces",
    ] {
        audit.get(path).await;
    }
    let snap = audit.ts.store.snapshot();
    for a in snap.allocs().map(|a| a.id.clone()).collect::<Vec<_>>() {
        audit.get(&format!("/v1/allocation/{a}")).await;
    }
    for e in snap.evals().map(|e| e.id.clone()).collect::<Vec<_>>() {
        audit.get(&format!("/v1/evaluation/{e}")).await;
        audit.get(&format!("/v1/evaluation/{e}/allocations")).await;
    }
    let mut changed = job("web", 3);
    changed.canonicalize();
    audit.call(Method::PUT, "/v1/job/web/plan", &json!({ "Job": changed, "Diff": true }).to_string()).await;
    audit.call(Method::PUT, "/v1/node/n1/drain", r#"{"DrainSpec":null,"MarkEligible":true}"#).await;

    // The last node changes: heartbeat expiry and purge.
    audit.ts.endpoints.node_heartbeat_missed("n2").await.unwrap();
    audit.call(Method::POST, "/v1/node/n2/purge", "").await;
    audit.get("/v1/nodes?resources=true&os=true").await;

    // A marker write ends the recorded stream.
    audit.ts.endpoints.job_register(job("__audit_done__", 1), JobRegisterOptions::default()).await.unwrap();
    let raw = tokio::time::timeout(Duration::from_secs(20), stream).await.expect("the stream reached the marker").unwrap();
    let text = String::from_utf8(raw).unwrap();
    let mut types = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| *l != "{}") {
        let batch: Value = serde_json::from_str(line).unwrap();
        for e in batch["Events"].as_array().unwrap() {
            if e["Topic"] == "Node" {
                types.insert(e["Type"].as_str().unwrap().to_string());
                assert_eq!(e["Payload"]["Node"]["SecretID"], "", "{e}");
            }
        }
    }
    for ty in ["NodeRegistration", "NodeStreamEvent", "NodeDrain", "NodeDeregistration"] {
        assert!(types.contains(ty), "the walk produced no {ty} event: {types:?}");
    }
    assert!(text.contains("Node drain complete"), "the drainer's completion is in the stream");
    audit.seen.push(("GET /v1/event/stream?topic=*&namespace=*".into(), text));
    audit.check();
    leader_task.abort();
}
