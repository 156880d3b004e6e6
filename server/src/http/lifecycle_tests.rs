//! Job versions, revert, stable, dispatch and periodic force over HTTP.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use base64::Engine;
use nomad_proto::job::{ParameterizedJobConfig, PeriodicConfig};
use nomad_proto::{Job, JobType};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::testing::{TestServer, job};

/// One request; the answer's status and body (JSON, or the text as a JSON string).
pub(super) async fn call(ts: &TestServer, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let req = Request::builder().method(method).uri(path).body(Body::from(body)).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn register(ts: &TestServer, job: Job) {
    ts.endpoints.job_register(job, Default::default()).await.unwrap();
}

fn versions_of(v: &Value) -> Vec<u64> {
    v["Versions"].as_array().unwrap().iter().map(|j| j["Version"].as_u64().unwrap()).collect()
}

#[tokio::test]
async fn versions_are_tracked_newest_first_with_diffs_and_pruned_to_six_keeping_the_stable_one() {
    let ts = TestServer::new();
    let (status, v) = call(&ts, Method::GET, "/v1/job/web/versions", Value::Null).await;
    assert_eq!((status, v), (StatusCode::NOT_FOUND, json!("job versions not found")));

    register(&ts, job("web", 2)).await;
    register(&ts, job("web", 2)).await; // unchanged: no new version
    register(&ts, job("web", 3)).await;
    let (status, v) = call(&ts, Method::GET, "/v1/job/web/versions?diffs=true", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(versions_of(&v), [1, 0]);
    let diffs = v["Diffs"].as_array().unwrap();
    assert_eq!(diffs.len(), 1);
    let count = diffs[0]["TaskGroups"][0]["Fields"].as_array().unwrap().iter().find(|f| f["Name"] == "Count").unwrap();
    assert_eq!((count["Old"].as_str(), count["New"].as_str()), (Some("2"), Some("3")));
    let (_, v) = call(&ts, Method::GET, "/v1/job/web/versions", Value::Null).await;
    assert_eq!(v["Diffs"], Value::Null, "diffs only when asked");

    // Version 1 stable, then seven more versions: six are kept, and version 1 is one of them.
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/stable", json!({"JobID": "web", "JobVersion": 1, "Stable": true})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["Index"].as_u64().unwrap() > 0);
    assert!(ts.store.snapshot().job("default", "web").unwrap().stable, "the current job is that version");
    for count in 4..11 {
        register(&ts, job("web", count)).await;
    }
    let (_, v) = call(&ts, Method::GET, "/v1/job/web/versions", Value::Null).await;
    assert_eq!(versions_of(&v), [8, 7, 6, 5, 4, 1]);
    assert_eq!(v["Versions"][5]["Stable"], true);
    assert_eq!(v["Versions"][0]["Stable"], false, "a new version is not stable");

    // The versions survive a snapshot and restore.
    let restored = crate::state::State::from_bytes(&ts.store.snapshot().to_bytes().unwrap()).unwrap();
    let kept: Vec<u64> = restored.job_versions("default", "web").iter().map(|j| j.version).collect();
    assert_eq!(kept, [8, 7, 6, 5, 4, 1]);

    // A purge forgets them.
    ts.endpoints.job_deregister("default", "web", true, 0).await.unwrap();
    let (status, _) = call(&ts, Method::GET, "/v1/job/web/versions", Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn revert_registers_a_copy_of_an_earlier_version_and_refuses_what_nomad_refuses() {
    let ts = TestServer::new();
    register(&ts, job("web", 2)).await;
    register(&ts, job("web", 5)).await;

    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/revert", json!({"JobID": "web", "JobVersion": 1})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("can't revert to current version")));
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/revert", json!({"JobID": "web", "JobVersion": 9})).await;
    assert_eq!((status, v), (StatusCode::NOT_FOUND, json!("job \"web\" in namespace \"default\" at version 9 not found")));
    let body = json!({"JobID": "web", "JobVersion": 0, "EnforcePriorVersion": 0});
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/revert", body).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Current job has version 1; enforcing version 0")));
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/revert", json!({"JobID": "other", "JobVersion": 0})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Job ID does not match")));

    let body = json!({"JobID": "web", "JobVersion": 0, "EnforcePriorVersion": 1});
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/revert", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let eval_id = v["EvalID"].as_str().unwrap().to_string();
    let snap = ts.store.snapshot();
    let current = snap.job("default", "web").unwrap();
    assert_eq!((current.version, current.task_groups[0].count), (2, 2), "version 2 is version 0 again");
    assert!(snap.eval(&eval_id).is_some(), "the revert is evaluated");
}

#[tokio::test]
async fn a_job_cannot_become_or_stop_being_periodic_or_parameterized() {
    let ts = TestServer::new();
    register(&ts, job("web", 1)).await;
    let mut periodic = job("web", 1);
    periodic.job_type = JobType::Batch;
    let err = ts.endpoints.job_register(periodic.clone(), Default::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "cannot update job from type \"service\" to \"batch\"");

    let mut batch = job("b", 1);
    batch.job_type = JobType::Batch;
    register(&ts, batch.clone()).await;
    batch.periodic = Some(PeriodicConfig { enabled: true, spec: "@daily".into(), spec_type: "cron".into(), ..PeriodicConfig::default() });
    let err = ts.endpoints.job_register(batch.clone(), Default::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "cannot update non-periodic job to being periodic");
    batch.periodic = None;
    batch.parameterized_job = Some(ParameterizedJobConfig::default());
    let err = ts.endpoints.job_register(batch, Default::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "cannot update non-parameterized job to being parameterized");
}

fn parameterized(id: &str) -> Job {
    let mut j = job(id, 1);
    j.job_type = JobType::Batch;
    j.meta.insert("base".into(), "1".into());
    j.parameterized_job =
        Some(ParameterizedJobConfig { payload: "required".into(), meta_required: vec!["time".into()], meta_optional: vec!["x".into()] });
    j
}

#[tokio::test]
async fn dispatch_makes_a_child_with_the_payload_and_meta_once_per_idempotency_token() {
    let ts = TestServer::new();
    register(&ts, parameterized("batch")).await;
    assert!(ts.store.snapshot().evals().next().is_none(), "a parameterized job is not evaluated");

    let payload = base64::engine::general_purpose::STANDARD.encode(b"hello payload");
    let (status, v) = call(&ts, Method::PUT, "/v1/job/batch/dispatch", json!({"Meta": {"time": "5"}})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Payload is not provided but required by parameterized job")));
    let (status, v) = call(&ts, Method::PUT, "/v1/job/batch/dispatch", json!({"Payload": payload, "Meta": {"nope": "1"}})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Dispatch request included unpermitted metadata keys: [nope]")));
    let big = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; 16 * 1024 + 1]);
    let (status, v) = call(&ts, Method::PUT, "/v1/job/batch/dispatch", json!({"Payload": big, "Meta": {"time": "5"}})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Payload exceeds maximum size; 16385 > 16384")));

    let body = json!({"Payload": payload, "Meta": {"time": "5"}, "IdPrefixTemplate": "run1"});
    let (status, v) = call(&ts, Method::PUT, "/v1/job/batch/dispatch?idempotency_token=tok", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let child_id = v["DispatchedJobID"].as_str().unwrap().to_string();
    assert!(child_id.starts_with("batch/dispatch-run1-"), "{child_id}");
    let eval_id = v["EvalID"].as_str().unwrap().to_string();
    let snap = ts.store.snapshot();
    let child = snap.job("default", &child_id).unwrap();
    assert!(child.dispatched && child.parent_id == "batch" && !child.is_parameterized());
    assert_eq!(child.meta.get("time").map(String::as_str), Some("5"));
    assert_eq!(child.meta.get("base").map(String::as_str), Some("1"), "the job's meta stays under the dispatch's");
    assert_eq!(child.dispatch_idempotency_token, "tok");
    let stored = base64::engine::general_purpose::STANDARD.decode(child.payload.as_ref().unwrap()).unwrap();
    assert_eq!(snap::raw::Decoder::new().decompress_vec(&stored).unwrap(), b"hello payload", "stored snappy-compressed");
    assert_eq!(snap.eval(&eval_id).unwrap().job_id, child_id);

    // The same token again: the same child, no new one.
    let (status, v) = call(&ts, Method::PUT, "/v1/job/batch/dispatch?idempotency_token=tok", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["DispatchedJobID"], child_id.as_str());
    assert_eq!(v["EvalID"], "");
    assert_eq!(ts.store.snapshot().jobs_by_prefix(None, "batch/").count(), 1);

    let (status, v) =
        call(&ts, Method::PUT, "/v1/job/batch/dispatch", json!({"Payload": payload, "Meta": {"time": "5"}, "IdPrefixTemplate": "a/b"}))
            .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    register(&ts, job("web", 1)).await;
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/dispatch", json!({})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Specified job \"web\" is not a parameterized job")));
    let (status, _) = call(&ts, Method::PUT, &format!("/v1/job/{child_id}/dispatch"), json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a dispatched child is not parameterized itself");
}

fn periodic(id: &str, spec: &str) -> Job {
    let mut j = job(id, 1);
    j.job_type = JobType::Batch;
    j.periodic = Some(PeriodicConfig { enabled: true, spec: spec.into(), spec_type: "cron".into(), ..PeriodicConfig::default() });
    j
}

#[tokio::test]
async fn periodic_force_launches_a_child_now_and_records_the_launch() {
    let ts = TestServer::new();
    register(&ts, periodic("report", "0 0 1 1 * 2099")).await;
    let snap = ts.store.snapshot();
    assert!(snap.evals().next().is_none(), "a periodic job is not evaluated");
    let registered = snap.periodic_launch("default", "report").unwrap().launch;

    let (status, v) = call(&ts, Method::PUT, "/v1/job/report/periodic/force", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let eval_id = v["EvalID"].as_str().unwrap();
    let snap = ts.store.snapshot();
    let eval = snap.eval(eval_id).unwrap();
    assert_eq!(eval.triggered_by, "periodic-job");
    let child = snap.job("default", &eval.job_id).unwrap();
    assert!(child.id.starts_with("report/periodic-") && child.parent_id == "report" && child.periodic.is_none(), "{child:?}");
    let launch = snap.periodic_launch("default", "report").unwrap().launch;
    assert!(launch >= registered);
    assert_eq!(child.id, format!("report/periodic-{}", launch / 1_000_000_000));

    register(&ts, job("web", 1)).await;
    let (status, v) = call(&ts, Method::PUT, "/v1/job/web/periodic/force", Value::Null).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("can't force launch non-periodic job")));
    let (status, _) = call(&ts, Method::PUT, "/v1/job/nope/periodic/force", Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
