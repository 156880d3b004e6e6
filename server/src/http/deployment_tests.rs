//! The deployment routes over HTTP, against a deployment a plan created.

use axum::http::{Method, StatusCode};
use nomad_proto::{Allocation, ClientStatus, Deployment, DeploymentState, Timestamp};
use serde_json::{Value, json};

use super::lifecycle_tests::call;
use crate::consensus::Consensus;
use crate::fsm::{Command, PlanApply};
use crate::testing::{TestServer, job, node};

/// `web` registered, and a plan that created deployment `d1` with two allocs in it.
async fn deployed() -> TestServer {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    ts.endpoints.job_register(job("web", 2), Default::default()).await.unwrap();
    let j = ts.store.snapshot().job("default", "web").unwrap().clone();
    let mut d = Deployment::new("d1".into(), &j, 50);
    d.task_groups
        .insert("web".into(), DeploymentState { desired_total: 2, progress_deadline: 600_000_000_000, ..DeploymentState::default() });
    let allocs = (0..2)
        .map(|i| Allocation {
            id: format!("a{i}"),
            namespace: "default".into(),
            name: format!("web.web[{i}]"),
            node_id: "n1".into(),
            job_id: "web".into(),
            task_group: "web".into(),
            deployment_id: "d1".into(),
            ..Allocation::default()
        })
        .collect();
    let plan = PlanApply {
        job: Some((*j).clone()),
        allocs_upserted: allocs,
        deployment: Some(Box::new(d)),
        now: Timestamp::now(),
        ..PlanApply::default()
    };
    ts.consensus.apply(Command::PlanApply(plan)).await.unwrap();
    ts
}

#[tokio::test]
async fn deployments_are_listed_read_and_counted_as_their_allocs_report_health() {
    let ts = deployed().await;
    let (status, v) = call(&ts, Method::GET, "/v1/deployments", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v.as_array().unwrap().len(), 1);
    let (_, d) = call(&ts, Method::GET, "/v1/deployment/d1", Value::Null).await;
    assert_eq!((d["Status"].as_str(), d["JobID"].as_str()), (Some("running"), Some("web")));
    assert_eq!(d["TaskGroups"]["web"]["PlacedAllocs"], 2, "the allocs were counted as placed");
    assert!(d["TaskGroups"]["web"]["RequireProgressBy"].as_str().is_some_and(|t| !t.starts_with("0001")), "{d}");
    let (status, v) = call(&ts, Method::GET, "/v1/deployment/nope", Value::Null).await;
    assert_eq!((status, v), (StatusCode::NOT_FOUND, json!("deployment not found")));
    let (_, allocs) = call(&ts, Method::GET, "/v1/deployment/allocations/d1", Value::Null).await;
    assert_eq!(allocs.as_array().unwrap().len(), 2);
    assert_eq!(allocs[0]["JobID"], "web");
    let (_, list) = call(&ts, Method::GET, "/v1/job/web/deployments", Value::Null).await;
    assert_eq!(list[0]["ID"], "d1");
    let (_, found) = call(&ts, Method::PUT, "/v1/search", json!({"Prefix": "d", "Context": "deployment"})).await;
    assert_eq!(found["Matches"]["deployment"], json!(["d1"]), "search finds deployments by ID prefix");
    let (_, latest) = call(&ts, Method::GET, "/v1/job/web/deployment", Value::Null).await;
    assert_eq!(latest["ID"], "d1");
    let (_, none) = call(&ts, Method::GET, "/v1/job/other/deployment", Value::Null).await;
    assert_eq!(none, Value::Null);

    // A client reports one healthy, the other unhealthy; then it changes its mind.
    let report = |id: &str, healthy: bool| Allocation {
        id: id.into(),
        node_id: "n1".into(),
        client_status: ClientStatus::Running,
        deployment_status: Some(json!({"Healthy": healthy, "Timestamp": Timestamp::now()})),
        ..Allocation::default()
    };
    let update = Command::AllocClientUpdate { allocs: vec![report("a0", true), report("a1", false)], evals: vec![], now: Timestamp::now() };
    ts.consensus.apply(update).await.unwrap();
    let g = ts.store.snapshot().deployment("d1").unwrap().task_groups["web"].clone();
    assert_eq!((g.healthy_allocs, g.unhealthy_allocs), (1, 1));
    let update = Command::AllocClientUpdate { allocs: vec![report("a1", true)], evals: vec![], now: Timestamp::now() };
    ts.consensus.apply(update).await.unwrap();
    let g = ts.store.snapshot().deployment("d1").unwrap().task_groups["web"].clone();
    assert_eq!((g.healthy_allocs, g.unhealthy_allocs), (2, 0));
}

#[tokio::test]
async fn deployment_writes_pause_resume_set_health_and_fail_then_refuse_a_terminal_deployment() {
    let ts = deployed().await;
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/pause/d1", json!({"DeploymentID": "d1", "Pause": true})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["EvalID"], "", "a pause is not evaluated");
    assert_eq!(ts.store.snapshot().deployment("d1").unwrap().status_description, "Deployment is paused");
    let (_, v) = call(&ts, Method::PUT, "/v1/deployment/pause/d1", json!({"DeploymentID": "d1", "Pause": false})).await;
    let eval = ts.store.snapshot().eval(v["EvalID"].as_str().unwrap()).unwrap().clone();
    assert_eq!((eval.triggered_by.as_str(), eval.deployment_id.as_str()), ("deployment-watcher", "d1"));
    assert_eq!(ts.store.snapshot().deployment("d1").unwrap().status, "running");

    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/pause/d1", json!({"Pause": true})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("DeploymentID must be specified")));
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/pause/d1", json!({"DeploymentID": "d2", "Pause": true})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("Deployment ID does not match")));
    let body = json!({"DeploymentID": "d1"});
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/allocation-health/d1", body).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("must specify at least one healthy/unhealthy allocation ID")));
    let body = json!({"DeploymentID": "d1", "HealthyAllocationIDs": ["a0"], "UnhealthyAllocationIDs": ["a1"]});
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/allocation-health/d1", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let snap = ts.store.snapshot();
    assert_eq!(nomad_proto::deployment::alloc_health(snap.alloc("a0").unwrap()), Some(true));
    assert_eq!(snap.deployment("d1").unwrap().task_groups["web"].unhealthy_allocs, 1);
    // Without canaries a promotion has nothing to wait for (Nomad promotes the groups as is).
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/promote/d1", json!({"DeploymentID": "d1", "All": true})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(ts.store.snapshot().deployment("d1").unwrap().task_groups["web"].promoted);

    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/fail/d1", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let d = ts.store.snapshot().deployment("d1").unwrap().clone();
    assert_eq!((d.status.as_str(), d.status_description.as_str()), ("failed", "Deployment marked as failed"));
    for (path, body, msg) in [
        ("fail", json!({}), "can't fail terminal deployment"),
        ("pause", json!({"DeploymentID": "d1", "Pause": false}), "can't resume terminal deployment"),
        ("pause", json!({"DeploymentID": "d1", "Pause": true}), "can't pause terminal deployment"),
        ("promote", json!({"DeploymentID": "d1", "All": true}), "can't promote terminal deployment"),
        (
            "allocation-health",
            json!({"DeploymentID": "d1", "UnhealthyAllocationIDs": ["a0"]}),
            "can't set health of allocations for a terminal deployment",
        ),
    ] {
        let (status, v) = call(&ts, Method::PUT, &format!("/v1/deployment/{path}/d1"), body).await;
        assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!(msg)), "{path}");
    }
    // A write in another namespace does not find it.
    let (status, _) = call(&ts, Method::PUT, "/v1/deployment/fail/d1?namespace=other", Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// `web` v0 (stable) and v1 registered, and a plan that placed v1's canary `c0` beside v0's
/// `a0` and `a1` in deployment `d1`, whose group has `auto_revert`.
async fn canarying() -> TestServer {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    ts.endpoints.job_register(job("web", 2), Default::default()).await.unwrap();
    ts.consensus
        .apply(Command::JobStability { namespace: "default".into(), job_id: "web".into(), version: 0, stable: true })
        .await
        .unwrap();
    let mut v1 = job("web", 2);
    v1.meta.insert("version".into(), "1".into());
    ts.endpoints.job_register(v1, Default::default()).await.unwrap();
    let j = ts.store.snapshot().job("default", "web").unwrap().clone();
    assert_eq!(j.version, 1);
    let mut d = Deployment::new("d1".into(), &j, 50);
    d.status_description = "Deployment is running but requires manual promotion".into();
    d.task_groups.insert(
        "web".into(),
        DeploymentState {
            desired_total: 2,
            desired_canaries: 1,
            auto_revert: true,
            progress_deadline: 600_000_000_000,
            ..DeploymentState::default()
        },
    );
    let canary = Allocation {
        id: "c0".into(),
        namespace: "default".into(),
        name: "web.web[0]".into(),
        node_id: "n1".into(),
        job_id: "web".into(),
        task_group: "web".into(),
        deployment_id: "d1".into(),
        deployment_status: Some(json!({"Healthy": null, "Canary": true})),
        ..Allocation::default()
    };
    let plan = PlanApply {
        job: Some((*j).clone()),
        allocs_upserted: vec![canary],
        deployment: Some(Box::new(d)),
        now: Timestamp::now(),
        ..PlanApply::default()
    };
    ts.consensus.apply(Command::PlanApply(plan)).await.unwrap();
    ts
}

#[tokio::test]
async fn a_canary_is_promoted_once_healthy_and_stays_a_canary_whatever_its_client_reports() {
    let ts = canarying().await;
    assert_eq!(ts.store.snapshot().deployment("d1").unwrap().task_groups["web"].placed_canaries, vec!["c0".to_string()]);
    let promote = json!({"DeploymentID": "d1", "All": true});
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/promote/d1", promote.clone()).await;
    assert_eq!((status, v), (StatusCode::INTERNAL_SERVER_ERROR, json!("Task group \"web\" has 0/1 healthy allocations")));

    // The client says healthy (and, as clients do, not a canary: that is the servers' to say).
    let report = Allocation {
        id: "c0".into(),
        node_id: "n1".into(),
        client_status: ClientStatus::Running,
        deployment_status: Some(json!({"Healthy": true, "Timestamp": Timestamp::now(), "Canary": false})),
        ..Allocation::default()
    };
    ts.consensus.apply(Command::AllocClientUpdate { allocs: vec![report], evals: vec![], now: Timestamp::now() }).await.unwrap();
    let snap = ts.store.snapshot();
    assert!(nomad_proto::deployment::alloc_is_canary(snap.alloc("c0").unwrap()));
    assert_eq!(snap.deployment("d1").unwrap().task_groups["web"].healthy_allocs, 1);

    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/promote/d1", promote).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let snap = ts.store.snapshot();
    let d = snap.deployment("d1").unwrap();
    assert!(d.task_groups["web"].promoted);
    assert_eq!(d.status_description, "Deployment is running");
    assert!(!nomad_proto::deployment::alloc_is_canary(snap.alloc("c0").unwrap()), "promotion clears the canary flag");
    let eval = snap.eval(v["EvalID"].as_str().unwrap()).unwrap();
    assert_eq!((eval.triggered_by.as_str(), eval.deployment_id.as_str()), ("deployment-watcher", "d1"));
}

#[tokio::test]
async fn failing_a_deployment_with_auto_revert_registers_the_stable_version_again() {
    let ts = canarying().await;
    let (status, v) = call(&ts, Method::PUT, "/v1/deployment/fail/d1", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["RevertedJobVersion"], 0);
    let snap = ts.store.snapshot();
    let d = snap.deployment("d1").unwrap();
    assert_eq!(
        (d.status.as_str(), d.status_description.as_str()),
        ("failed", "Deployment marked as failed - rolling back to job version 0")
    );
    let job = snap.job("default", "web").unwrap();
    assert_eq!(job.version, 2, "the revert is a new version");
    assert!(!job.meta.contains_key("version"), "with the stable version's spec");
    let eval = snap.eval(v["EvalID"].as_str().unwrap()).unwrap();
    assert_eq!(eval.job_modify_index, job.job_modify_index, "the eval is for the reverted job");
}
