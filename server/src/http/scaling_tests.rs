//! Scaling over HTTP: policies from the jobs' `scaling` blocks, `PUT /v1/job/:id/scale` with
//! Nomad's checks, the scale status with its events.

use axum::http::{Method, StatusCode};
use nomad_proto::scaling::{JOB_TRACKED_SCALING_EVENTS, ScalingPolicy};
use nomad_proto::{Deployment, DeploymentState, JobType, Timestamp};
use serde_json::{Value, json};

use super::lifecycle_tests::call;
use crate::consensus::Consensus;
use crate::fsm::{Command, PlanApply};
use crate::testing::{TestServer, job};

/// Job `web`, group `web` of `count` with a policy of min 1, max 5.
fn scalable(count: i64) -> nomad_proto::Job {
    let mut j = job("web", count);
    j.task_groups[0].scaling = Some(ScalingPolicy { max: Some(5), ..ScalingPolicy::default() });
    j.task_groups[0].tasks[0].config.insert("command".into(), json!("/bin/sleep"));
    j
}

async fn register(ts: &TestServer, j: nomad_proto::Job) {
    ts.endpoints.job_register(j, Default::default()).await.unwrap();
}

fn scale(count: Option<i64>, group: &str, message: &str) -> Value {
    json!({"Count": count, "Target": {"Group": group}, "Message": message})
}

#[tokio::test]
async fn a_groups_policy_gets_an_id_and_target_that_last_across_updates_and_goes_with_the_block() {
    let ts = TestServer::new();
    register(&ts, scalable(2)).await;
    let (status, list) = call(&ts, Method::GET, "/v1/scaling/policies", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list = list.as_array().unwrap().clone();
    assert_eq!(list.len(), 1);
    let id = list[0]["ID"].as_str().unwrap().to_string();
    assert_eq!(list[0]["Target"], json!({"Namespace": "default", "Job": "web", "Group": "web"}));
    assert_eq!((list[0]["Type"].as_str(), list[0]["Enabled"].as_bool()), (Some("horizontal"), Some(true)));
    let created = list[0]["CreateIndex"].as_u64().unwrap();

    let (status, p) = call(&ts, Method::GET, &format!("/v1/scaling/policy/{id}"), Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    // Min defaults to the group's count.
    assert_eq!((p["Min"].as_i64(), p["Max"].as_i64(), p["Namespace"].as_str()), (Some(2), Some(5), Some("default")));
    let (_, stored) = call(&ts, Method::GET, "/v1/job/web", Value::Null).await;
    assert_eq!(stored["TaskGroups"][0]["Scaling"]["ID"], json!(id), "the job shows the policy with its ID");

    // The same job again: same ID, no new version.
    register(&ts, scalable(2)).await;
    let j = ts.store.snapshot().job("default", "web").unwrap().clone();
    assert_eq!((j.version, j.task_groups[0].scaling.as_ref().unwrap().id.as_str()), (0, id.as_str()));
    // A changed policy keeps its ID; its modify index moves.
    let mut changed = scalable(2);
    changed.task_groups[0].scaling.as_mut().unwrap().max = Some(8);
    register(&ts, changed).await;
    let (_, p) = call(&ts, Method::GET, &format!("/v1/scaling/policy/{id}"), Value::Null).await;
    assert_eq!((p["Max"].as_i64(), p["CreateIndex"].as_u64()), (Some(8), Some(created)));
    assert!(p["ModifyIndex"].as_u64().unwrap() > created);
    let (_, by_job) = call(&ts, Method::GET, "/v1/scaling/policies?job=web&type=horizontal", Value::Null).await;
    assert_eq!(by_job.as_array().unwrap().len(), 1);
    let (_, other) = call(&ts, Method::GET, "/v1/scaling/policies?job=nope", Value::Null).await;
    assert_eq!(other, json!([]));

    // Without the block the policy is gone.
    let mut plain = scalable(2);
    plain.task_groups[0].scaling = None;
    register(&ts, plain).await;
    let (status, body) = call(&ts, Method::GET, &format!("/v1/scaling/policy/{id}"), Value::Null).await;
    assert_eq!((status, body), (StatusCode::NOT_FOUND, json!("policy not found")));
    let (_, list) = call(&ts, Method::GET, "/v1/scaling/policies", Value::Null).await;
    assert_eq!(list, json!([]));
}

#[tokio::test]
async fn a_count_outside_the_policy_is_refused_at_registration_with_nomads_message() {
    let ts = TestServer::new();
    let err = ts.endpoints.job_register(scalable(6), Default::default()).await.unwrap_err().to_string();
    assert!(err.contains("Scaling policy invalid: task group count must not be greater than maximum count in scaling policy"), "{err}");
    let mut no_max = scalable(1);
    no_max.task_groups[0].scaling.as_mut().unwrap().max = None;
    let err = ts.endpoints.job_register(no_max, Default::default()).await.unwrap_err().to_string();
    assert!(err.contains("Scaling policy invalid: maximum count must be specified and non-negative"), "{err}");
    let mut vertical = scalable(1);
    vertical.task_groups[0].scaling.as_mut().unwrap().policy_type = "vertical_cpu".into();
    let err = ts.endpoints.job_register(vertical, Default::default()).await.unwrap_err().to_string();
    assert!(err.contains("Scaling policy invalid: scaling policy type \"vertical_cpu\" is not valid"), "{err}");
}

#[tokio::test]
async fn scaling_sets_the_count_with_an_eval_and_records_events_newest_first() {
    let ts = TestServer::new();
    register(&ts, scalable(2)).await;
    let before = ts.store.snapshot().job("default", "web").unwrap().clone();

    let (status, resp) = call(&ts, Method::PUT, "/v1/job/web/scale", scale(Some(4), "web", "busier")).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let eval_id = resp["EvalID"].as_str().unwrap().to_string();
    let snap = ts.store.snapshot();
    let eval = snap.eval(&eval_id).expect("the eval was created");
    assert_eq!(eval.triggered_by, "job-scaling");
    let after = snap.job("default", "web").unwrap();
    assert_eq!((after.task_groups[0].count, after.version), (4, before.version + 1), "a new version with the new count");
    assert_eq!(resp["JobModifyIndex"].as_u64(), Some(after.job_modify_index));
    assert_eq!(eval.job_modify_index, after.job_modify_index);

    // An event without a count: recorded, nothing else changes.
    let (status, resp) = call(
        &ts,
        Method::POST,
        "/v1/job/web/scale",
        json!({"Target": {"Group": "web"}, "Message": "cooling down", "Error": true, "Meta": {"k": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(resp["EvalID"], json!(""));
    assert_eq!(ts.store.snapshot().job("default", "web").unwrap().version, after.version);

    let (status, s) = call(&ts, Method::GET, "/v1/job/web/scale", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((s["JobID"].as_str(), s["JobStopped"].as_bool()), (Some("web"), Some(false)));
    let g = &s["TaskGroups"]["web"];
    assert_eq!(g["Desired"], 4);
    let events = g["Events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0]["Message"].as_str(), events[0]["Error"].as_bool(), events[0]["Count"].clone()),
        (Some("cooling down"), Some(true), Value::Null)
    );
    assert_eq!(events[0]["Meta"], json!({"k": 1}));
    assert_eq!((events[1]["Count"].as_i64(), events[1]["PreviousCount"].as_i64()), (Some(4), Some(2)));
    assert_eq!(events[1]["EvalID"], json!(eval_id));

    // Only the newest are kept.
    for i in 0..JOB_TRACKED_SCALING_EVENTS {
        call(&ts, Method::PUT, "/v1/job/web/scale", scale(None, "web", &format!("note {i}"))).await;
    }
    let (_, s) = call(&ts, Method::GET, "/v1/job/web/scale", Value::Null).await;
    let events = s["TaskGroups"]["web"]["Events"].as_array().unwrap();
    assert_eq!(events.len(), JOB_TRACKED_SCALING_EVENTS);
    assert_eq!(events[0]["Message"], json!(format!("note {}", JOB_TRACKED_SCALING_EVENTS - 1)));

    // The events survive a snapshot, and the policy index is rebuilt.
    let restored = crate::state::State::from_bytes(&ts.store.snapshot().to_bytes().unwrap()).unwrap();
    assert_eq!(restored.scaling_events("default", "web").unwrap().scaling_events["web"].len(), JOB_TRACKED_SCALING_EVENTS);
    let id = after.task_groups[0].scaling.as_ref().unwrap().id.clone();
    assert_eq!(restored.scaling_policy(&id).map(|(ns, p)| (ns.to_string(), p.max)), Some(("default".to_string(), Some(5))));
}

#[tokio::test]
async fn bad_scale_requests_get_nomads_errors() {
    let ts = TestServer::new();
    register(&ts, scalable(2)).await;
    let mut sys = job("sys", 1);
    sys.job_type = JobType::System;
    sys.task_groups[0].tasks[0].config.insert("command".into(), json!("/bin/sleep"));
    register(&ts, sys).await;
    for (path, body, want) in [
        ("/v1/job/web/scale", json!({"Count": 3}), "missing task group name for scaling action"),
        ("/v1/job/web/scale", scale(Some(-1), "web", ""), "scaling action count can't be negative"),
        (
            "/v1/job/web/scale",
            json!({"Count": 3, "Error": true, "Target": {"Group": "web"}}),
            "scaling action should not contain count if error is true",
        ),
        ("/v1/job/web/scale", scale(Some(0), "web", ""), "group count was less than scaling policy minimum: 0 < 2"),
        ("/v1/job/web/scale", scale(Some(6), "web", ""), "group count was greater than scaling policy maximum: 6 > 5"),
        ("/v1/job/web/scale", scale(Some(3), "db", ""), "task group \"db\" specified for scaling does not exist in job"),
        (
            "/v1/job/web/scale",
            json!({"Count": 3, "Target": {"Group": "web", "Namespace": "other"}}),
            "namespace in payload did not match header",
        ),
        ("/v1/job/web/scale", json!({"Count": 3, "Target": {"Group": "web", "Job": "api"}}), "job ID in payload did not match URL"),
        ("/v1/job/sys/scale", scale(Some(1), "web", ""), "cannot scale jobs of type \"system\""),
        ("/v1/job/web/scale", scale(None, "web", &"x".repeat(20_000)), "scaling event message is 20000 bytes"),
    ] {
        let (status, resp) = call(&ts, Method::PUT, path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {resp}");
        assert!(resp.as_str().unwrap().contains(want), "{body}: {resp}");
    }
    let (status, _) = call(&ts, Method::PUT, "/v1/job/nope/scale", scale(Some(1), "web", "")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&ts, Method::GET, "/v1/job/nope/scale", Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&ts, Method::DELETE, "/v1/job/web/scale", Value::Null).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Nothing was recorded or changed by the refused requests.
    let snap = ts.store.snapshot();
    assert!(snap.scaling_events("default", "web").is_none());
    assert_eq!(snap.job("default", "web").unwrap().task_groups[0].count, 2);
}

#[tokio::test]
async fn an_active_deployment_of_the_job_blocks_a_new_count() {
    let ts = TestServer::new();
    register(&ts, scalable(2)).await;
    let j = ts.store.snapshot().job("default", "web").unwrap().clone();
    let mut d = Deployment::new("d1".into(), &j, 50);
    d.task_groups.insert("web".into(), DeploymentState { desired_total: 2, ..DeploymentState::default() });
    let plan = PlanApply { job: Some((*j).clone()), deployment: Some(Box::new(d)), now: Timestamp::now(), ..PlanApply::default() };
    ts.consensus.apply(Command::PlanApply(plan)).await.unwrap();
    let (status, resp) = call(&ts, Method::PUT, "/v1/job/web/scale", scale(Some(3), "web", "")).await;
    assert_eq!((status, resp), (StatusCode::BAD_REQUEST, json!("job scaling blocked due to active deployment")));
    // An event alone is still recorded.
    let (status, _) = call(&ts, Method::PUT, "/v1/job/web/scale", scale(None, "web", "noted")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_purged_job_takes_its_policy_and_events_with_it() {
    let ts = TestServer::new();
    register(&ts, scalable(2)).await;
    call(&ts, Method::PUT, "/v1/job/web/scale", scale(None, "web", "noted")).await;
    let (status, _) = call(&ts, Method::DELETE, "/v1/job/web?purge=true", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let snap = ts.store.snapshot();
    assert_eq!(snap.scaling_policies().count(), 0);
    assert!(snap.scaling_events("default", "web").is_none());
}

/// `method path` with `token`, through the router.
async fn call_as(ts: &TestServer, method: Method, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
    use tower::ServiceExt;
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let req =
        axum::http::Request::builder().method(method).uri(path).header("X-Nomad-Token", token).body(axum::body::Body::from(body)).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())))
}

#[tokio::test]
async fn scaling_needs_scale_job_and_policies_show_only_in_namespaces_the_token_reads() {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_acl(crate::acl::AclConfig { enabled: true, ..Default::default() });
    let (_, boot) = call(&ts, Method::POST, "/v1/acl/bootstrap", Value::Null).await;
    let mgmt = boot["SecretID"].as_str().unwrap().to_string();
    call_as(&ts, Method::PUT, "/v1/namespace/other", &mgmt, json!({"Name": "other"})).await;
    register(&ts, scalable(2)).await;
    let mut elsewhere = scalable(2);
    elsewhere.namespace = "other".into();
    register(&ts, elsewhere).await;
    let token_with = |rules: &'static str, name: &'static str| {
        let (ts, mgmt) = (&ts, mgmt.clone());
        async move {
            let (status, _) =
                call_as(ts, Method::PUT, &format!("/v1/acl/policy/{name}"), &mgmt, json!({"Name": name, "Rules": rules})).await;
            assert_eq!(status, StatusCode::OK);
            let (_, tok) =
                call_as(ts, Method::PUT, "/v1/acl/token", &mgmt, json!({"Name": name, "Type": "client", "Policies": [name]})).await;
            tok["SecretID"].as_str().unwrap().to_string()
        }
    };
    let scaler = token_with(r#"namespace "default" { capabilities = ["scale-job", "read-job-scaling"] }"#, "scaler").await;
    let reader = token_with(r#"namespace "default" { capabilities = ["read-job"] }"#, "reader").await;

    let (status, _) = call_as(&ts, Method::PUT, "/v1/job/web/scale", &reader, scale(Some(3), "web", "")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "read-job may not scale");
    let (status, resp) = call_as(&ts, Method::PUT, "/v1/job/web/scale", &scaler, scale(Some(3), "web", "")).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let (status, _) = call_as(&ts, Method::GET, "/v1/job/web/scale", &scaler, Value::Null).await;
    assert_eq!(status, StatusCode::OK, "read-job-scaling reads the scale status");
    let (status, _) = call_as(&ts, Method::GET, "/v1/job/web", &scaler, Value::Null).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "but not the job");
    let (status, _) = call_as(&ts, Method::PUT, "/v1/job/web/scale?namespace=other", &scaler, scale(Some(3), "web", "")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "nor in another namespace");

    // Every namespace's policies, filtered to those the token may read.
    let (status, list) = call_as(&ts, Method::GET, "/v1/scaling/policies?namespace=*", &reader, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let namespaces: Vec<&str> = list.as_array().unwrap().iter().map(|p| p["Namespace"].as_str().unwrap()).collect();
    assert_eq!(namespaces, ["default"]);
    let other_id = ts.store.snapshot().job("other", "web").unwrap().task_groups[0].scaling.as_ref().unwrap().id.clone();
    let (status, _) = call_as(&ts, Method::GET, &format!("/v1/scaling/policy/{other_id}"), &reader, Value::Null).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a policy of a namespace the token cannot read");
    let (status, _) = call_as(&ts, Method::GET, &format!("/v1/scaling/policy/{other_id}"), &mgmt, Value::Null).await;
    assert_eq!(status, StatusCode::OK);
}
