//! `DELETE /v1/evaluations` and `/v1/operator/scheduler/configuration` through the real router:
//! the pause the delete requires, Nomad's refusals and limits, what a delete may touch, ACLs,
//! and the leader pausing and resuming its eval broker.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::acl::AclConfig;
use crate::consensus::Consensus as _;
use crate::fsm::{Command, PlanApply};
use crate::leader::{Leader, LeaderConfig, LeaderDeps};
use crate::test_support::wait_until;
use crate::testing::{TestServer, job, node};

async fn call(ts: &TestServer, method: Method, path: &str, token: Option<&str>, body: Value) -> (StatusCode, String) {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        b = b.header("X-Nomad-Token", t);
    }
    let body = if body.is_null() { Body::empty() } else { Body::from(body.to_string()) };
    let resp = tokio::time::timeout(Duration::from_secs(30), ts.router().oneshot(b.body(body).unwrap())).await.expect("answers").unwrap();
    let status = resp.status();
    (status, String::from_utf8_lossy(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).into_owned())
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

async fn register(ts: &TestServer, id: &str) -> String {
    let (status, body) = call(ts, Method::PUT, "/v1/jobs", None, json!({ "Job": job(id, 1) })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    json_of(&body)["EvalID"].as_str().unwrap().to_string()
}

async fn pause(ts: &TestServer, paused: bool) {
    let (status, body) = call(ts, Method::PUT, "/v1/operator/scheduler/configuration", None, json!({ "PauseEvalBroker": paused })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["Updated"], true);
}

#[tokio::test]
async fn the_scheduler_configuration_reads_writes_with_cas_and_refuses_what_is_not_done() {
    let ts = TestServer::new();
    let (status, body) = call(&ts, Method::GET, "/v1/operator/scheduler/configuration", None, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let config = &json_of(&body)["SchedulerConfig"];
    assert_eq!(config["SchedulerAlgorithm"], "binpack");
    assert_eq!(config["PauseEvalBroker"], false);
    assert_eq!(config["PreemptionConfig"]["SystemSchedulerEnabled"], false, "nomad-rs preempts nothing, and says so");

    let (status, body) =
        call(&ts, Method::PUT, "/v1/operator/scheduler/configuration?cas=0", None, json!({ "PauseEvalBroker": true })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let written = json_of(&body)["Index"].as_u64().unwrap();
    let (_, body) = call(&ts, Method::GET, "/v1/operator/scheduler/configuration", None, Value::Null).await;
    let reply = json_of(&body);
    assert_eq!(reply["SchedulerConfig"]["PauseEvalBroker"], true);
    assert_eq!((reply["Index"].as_u64(), reply["SchedulerConfig"]["ModifyIndex"].as_u64()), (Some(written), Some(written)));
    // A stale check-and-set writes nothing.
    let (status, body) =
        call(&ts, Method::PUT, "/v1/operator/scheduler/configuration?cas=0", None, json!({ "PauseEvalBroker": false })).await;
    assert_eq!((status, json_of(&body)["Updated"].clone()), (StatusCode::OK, json!(false)));
    assert!(ts.store.snapshot().scheduler_config().pause_eval_broker);

    let refused = [
        (json!({ "SchedulerAlgorithm": "bogus" }), StatusCode::BAD_REQUEST, "invalid scheduler algorithm: bogus"),
        (
            json!({ "SchedulerAlgorithm": "spread" }),
            StatusCode::NOT_IMPLEMENTED,
            "the spread scheduler algorithm is not supported by nomad-rs",
        ),
        (
            json!({ "PreemptionConfig": { "ServiceSchedulerEnabled": true } }),
            StatusCode::NOT_IMPLEMENTED,
            "preemption is not supported by nomad-rs",
        ),
        (json!({ "RejectJobRegistration": true }), StatusCode::NOT_IMPLEMENTED, "rejecting job registrations is not supported by nomad-rs"),
    ];
    for (config, code, message) in refused {
        let (status, body) = call(&ts, Method::PUT, "/v1/operator/scheduler/configuration", None, config.clone()).await;
        assert_eq!((status, body.as_str()), (code, message), "{config}");
    }
    let (status, body) = call(&ts, Method::PUT, "/v1/operator/scheduler/configuration?cas=x", None, json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.starts_with("Error parsing cas value: "), "{body}");
    assert!(ts.store.snapshot().scheduler_config().pause_eval_broker, "nothing refused was written");
}

#[tokio::test]
async fn evals_are_deleted_only_while_the_broker_is_paused_and_only_when_safe() {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    let pending = register(&ts, "idle").await;
    let running_eval = register(&ts, "busy").await;
    // `busy` has a running alloc placed by its eval.
    let snap = ts.store.snapshot();
    let busy = snap.job("default", "busy").unwrap().as_ref().clone();
    let alloc = nomad_proto::Allocation {
        id: nomad_proto::new_id(),
        namespace: "default".into(),
        eval_id: running_eval.clone(),
        job_id: "busy".into(),
        task_group: busy.task_groups[0].name.clone(),
        node_id: "n1".into(),
        client_status: nomad_proto::ClientStatus::Running,
        ..nomad_proto::Allocation::default()
    };
    ts.consensus
        .apply(Command::PlanApply(PlanApply { job: Some(busy), allocs_upserted: vec![alloc], ..PlanApply::default() }))
        .await
        .unwrap();

    let delete = |body: Value| call(&ts, Method::DELETE, "/v1/evaluations", None, body);
    let (status, body) = delete(json!({ "EvalIDs": [pending] })).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "eval broker is enabled; eval broker must be paused to delete evals")
    );
    assert!(ts.store.snapshot().eval(&pending).is_some());

    pause(&ts, true).await;
    let (status, body) = delete(json!({ "EvalIDs": [pending], "Filter": "JobID == \"idle\"" })).await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_REQUEST, "evals cannot be deleted by both ID and filter"));
    let (status, body) = delete(json!({})).await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_REQUEST, "evals must be deleted by either ID or filter"));
    let too_many: Vec<String> = (0..7282).map(|i| format!("{i:08}-0000-0000-0000-000000000000")).collect();
    let (status, body) = delete(json!({ "EvalIDs": too_many })).await;
    assert_eq!((status, body.as_str()), (StatusCode::BAD_REQUEST, "request includes 7282 evaluation IDs, must be 7281 or fewer"));
    let (status, body) = delete(json!({ "EvalIDs": ["00000000-0000-0000-0000-000000000000"] })).await;
    assert_eq!((status, body.as_str()), (StatusCode::NOT_FOUND, "eval not found"));
    let (status, body) = delete(json!({ "EvalIDs": [pending, running_eval] })).await;
    assert_eq!((status, body), (StatusCode::INTERNAL_SERVER_ERROR, format!("eval {running_eval} is not safe to delete")));
    assert!(ts.store.snapshot().eval(&pending).is_some(), "one unsafe eval refuses the whole request");

    let (status, body) = delete(json!({ "EvalIDs": [pending] })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["Count"], 1);
    assert!(ts.store.snapshot().eval(&pending).is_none());

    // By filter: only the safe evals it matches; the running alloc's eval stays.
    let other = register(&ts, "other").await;
    let (status, body) = delete(json!({ "Filter": "JobID != \"nothing\"" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["Count"], 1, "{body}");
    let snap = ts.store.snapshot();
    assert!(snap.eval(&other).is_none() && snap.eval(&running_eval).is_some());
    let (status, body) = delete(json!({ "Filter": "JobID ==" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn only_management_deletes_evals_and_operator_write_sets_the_configuration() {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
    let (_, boot) = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    let mgmt = json_of(&boot)["SecretID"].as_str().unwrap().to_string();
    let rules = "operator { policy = \"read\" }\nnamespace \"*\" { policy = \"write\" }";
    let (status, _) = call(&ts, Method::PUT, "/v1/acl/policy/ops", Some(&mgmt), json!({"Name": "ops", "Rules": rules})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, tok) =
        call(&ts, Method::POST, "/v1/acl/token", Some(&mgmt), json!({"Name": "ops", "Type": "client", "Policies": ["ops"]})).await;
    let ops = json_of(&tok)["SecretID"].as_str().unwrap().to_string();

    let config = "/v1/operator/scheduler/configuration";
    assert_eq!(call(&ts, Method::GET, config, Some(&ops), Value::Null).await.0, StatusCode::OK);
    assert_eq!(call(&ts, Method::GET, config, None, Value::Null).await.0, StatusCode::FORBIDDEN);
    assert_eq!(call(&ts, Method::PUT, config, Some(&ops), json!({ "PauseEvalBroker": true })).await.0, StatusCode::FORBIDDEN);
    assert_eq!(call(&ts, Method::PUT, config, Some(&mgmt), json!({ "PauseEvalBroker": true })).await.0, StatusCode::OK);
    let (status, body) = call(&ts, Method::DELETE, "/v1/evaluations", Some(&ops), json!({ "Filter": "ID != \"\"" })).await;
    assert_eq!((status, body.as_str()), (StatusCode::FORBIDDEN, "Permission denied"));
    let (status, body) = call(&ts, Method::DELETE, "/v1/evaluations", Some(&mgmt), json!({ "Filter": "ID != \"\"" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A paused broker schedules nothing; resumed, it takes the evals that waited in the state.
#[tokio::test]
async fn the_leader_pauses_and_resumes_its_eval_broker() {
    let ts = TestServer::new();
    pause(&ts, true).await;
    let leader = Arc::new(Leader::new(
        LeaderDeps {
            store: ts.store.clone(),
            consensus: ts.consensus.clone(),
            heartbeats: ts.endpoints.heartbeats().clone(),
            heartbeat_expiry: Arc::new(ts.endpoints.clone()),
            scheduler: Arc::new(crate::scheduler::BuiltinScheduler),
            volume_watch: Arc::new(ts.endpoints.clone()),
            claim_gc: Arc::new(ts.endpoints.clone()),
            keyring: ts.endpoints.keyring().clone(),
        },
        LeaderConfig::default(),
    ));
    let broker = leader.broker().clone();
    let running = tokio::spawn(leader.run());
    let eval = register(&ts, "web").await;
    // The keyring loop makes the first root key once the term's subsystems run.
    wait_until("the leader's term runs", || ts.store.snapshot().active_root_key().is_some()).await;
    assert!(!broker.enabled(), "paused: no broker");

    pause(&ts, false).await;
    wait_until("the eval that waited is scheduled once the broker resumes", || {
        ts.store.snapshot().eval(&eval).is_some_and(|e| e.status != nomad_proto::EvalStatus::Pending)
    })
    .await;
    assert!(broker.enabled());
    pause(&ts, true).await;
    wait_until("paused again", || !broker.enabled()).await;
    running.abort();
}
