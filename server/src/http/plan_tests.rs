//! `PUT /v1/job/<id>/plan` with good and bad input.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::consensus::Consensus;
use crate::fsm::Command;
use crate::sim::{FirstReadyNode, ready_node};
use crate::testing::{TestServer, job};

fn server_with_scheduler() -> TestServer {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_scheduler(Arc::new(FirstReadyNode));
    ts
}

async fn call(ts: &TestServer, method: Method, path: &str, body: String) -> (StatusCode, String) {
    let req = Request::builder().method(method).uri(path).body(Body::from(body)).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn plan(ts: &TestServer, id: &str, body: Value) -> Value {
    let (status, text) = call(ts, Method::PUT, &format!("/v1/job/{id}/plan"), body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn plan_reports_what_the_scheduler_would_do_and_writes_nothing() {
    let ts = server_with_scheduler();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    let before = ts.store.snapshot().index;

    let v = plan(&ts, "web", json!({ "Job": job("web", 2), "Diff": true })).await;
    assert_eq!(v["Annotations"]["DesiredTGUpdates"]["web"]["Place"], 2);
    assert_eq!(v["FailedTGAllocs"], Value::Null);
    assert_eq!(v["CreatedEvals"], Value::Null);
    assert_eq!(v["JobModifyIndex"], 0);
    assert_eq!(v["Diff"]["Type"], "Added");
    assert_eq!(v["Diff"]["TaskGroups"][0]["Updates"]["create"], 2);
    assert_eq!(v["NextPeriodicLaunch"], "0001-01-01T00:00:00Z");
    assert_eq!(v["Warnings"], "");
    let after = ts.store.snapshot();
    assert_eq!(after.index, before, "a plan is a dry run");
    assert!(after.job("default", "web").is_none() && after.evals().next().is_none());

    // Against a registered job: an edit, with the job's modify index; no diff unless asked.
    let reg = ts.endpoints.job_register(job("web", 2), Default::default()).await.unwrap();
    let v = plan(&ts, "web", json!({ "Job": job("web", 3), "Diff": true })).await;
    assert_eq!(v["JobModifyIndex"], reg.job_modify_index);
    assert_eq!(v["Index"], reg.job_modify_index);
    assert_eq!(v["Diff"]["Type"], "Edited");
    let count = v["Diff"]["TaskGroups"][0]["Fields"].as_array().unwrap().iter().find(|f| f["Name"] == "Count").cloned().unwrap();
    assert_eq!((count["Old"].as_str(), count["New"].as_str()), (Some("2"), Some("3")));
    let v = plan(&ts, "web", json!({ "Job": job("web", 3) })).await;
    assert_eq!(v["Diff"], Value::Null);
}

#[tokio::test]
async fn an_unchanged_scaling_policy_is_no_diff_and_a_changed_one_is_an_edit() {
    let ts = server_with_scheduler();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    let scalable = |max: i64| {
        let mut j = job("web", 2);
        j.task_groups[0].scaling = Some(nomad_proto::scaling::ScalingPolicy { max: Some(max), ..Default::default() });
        j
    };
    ts.endpoints.job_register(scalable(4), Default::default()).await.unwrap();
    // The submitted job carries no policy ID; the stored one does. That is no change.
    let v = plan(&ts, "web", json!({ "Job": scalable(4), "Diff": true })).await;
    assert_eq!(v["Diff"]["Type"], "None", "{}", v["Diff"]);
    let v = plan(&ts, "web", json!({ "Job": scalable(6), "Diff": true })).await;
    assert_eq!(v["Diff"]["Type"], "Edited");
    let text = v["Diff"].to_string();
    assert!(text.contains("\"Name\":\"Max\"") && !text.contains("\"Name\":\"ID\""), "{text}");
}

#[tokio::test]
async fn plan_shows_failed_placements_and_the_blocked_eval_it_would_create() {
    let ts = server_with_scheduler();
    let v = plan(&ts, "web", json!({ "job": job("web", 2) })).await;
    assert!(v["FailedTGAllocs"]["web"].is_object(), "{v}");
    assert_eq!(v["CreatedEvals"][0]["Status"], "blocked");
    assert!(ts.store.snapshot().evals().next().is_none());
}

#[tokio::test]
async fn bad_plan_requests_get_nomads_answers() {
    let ts = server_with_scheduler();
    let no_groups = json!({"Job": {"ID": "web"}}).to_string();
    let cases: Vec<(Method, &str, String, StatusCode, &str)> = vec![
        (Method::PUT, "/v1/job/web/plan", "{}".into(), StatusCode::BAD_REQUEST, "Job must be specified"),
        (Method::PUT, "/v1/job/web/plan", json!({"Job": {"Name": "web"}}).to_string(), StatusCode::BAD_REQUEST, "Job must have a valid ID"),
        (Method::POST, "/v1/job/other/plan", json!({"Job": job("web", 1)}).to_string(), StatusCode::BAD_REQUEST, "Job ID does not match"),
        (Method::PUT, "/v1/job/web/plan", no_groups, StatusCode::INTERNAL_SERVER_ERROR, "Missing job task groups"),
        (Method::PUT, "/v1/job/web/plan", "{not json".into(), StatusCode::BAD_REQUEST, ""),
        (Method::GET, "/v1/job/web/plan", String::new(), StatusCode::METHOD_NOT_ALLOWED, "Invalid method"),
    ];
    for (method, path, body, code, text) in cases {
        let (status, got) = call(&ts, method.clone(), path, body.clone()).await;
        assert_eq!(status, code, "{method} {path} {body}: {got}");
        assert!(got.contains(text), "{method} {path} {body}: {got}");
    }
}
