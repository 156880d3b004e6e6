//! Job specification support (`nomad_proto::admission`) as the servers enforce it: every table
//! entry through `Job.Register`, `Job.Plan` and the HTTP API.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use nomad_proto::Job;
use nomad_proto::admission::{Fate, Feature, TABLE, sample_job_using};
use serde_json::json;
use tower::ServiceExt;

use super::EndpointError;
use crate::consensus::Consensus;
use crate::fsm::Command;
use crate::scheduler::BuiltinScheduler;
use crate::sim::ready_node;
use crate::testing::{TestServer, job, node};

/// A server with a scheduler and a Consul that takes config entries (for the gateway samples).
fn server() -> TestServer {
    let mut ts = TestServer::new();
    let consul = crate::consul::ConsulHandles::from(Arc::new(crate::consul::fake::FakeConsul::new()));
    ts.endpoints = ts.endpoints.clone().with_scheduler(Arc::new(BuiltinScheduler)).with_consul(consul);
    ts
}

/// The sample of entry `i`, under an ID of its own, and the message a refusal must carry.
fn sample(i: usize, feature: Feature) -> (Job, Option<String>) {
    let mut job = sample_job_using(feature);
    job.id = format!("sample-{i}");
    let mut canonical = job.clone();
    canonical.canonicalize();
    (job, canonical.check_supported().err().map(|e| e.to_string()))
}

#[tokio::test]
async fn every_refused_entry_is_refused_at_register_and_plan_and_the_rest_are_admitted() {
    let ts = server();
    ts.register_node(node("n1")).await;
    for (i, e) in TABLE.iter().enumerate() {
        let (job, refusal) = sample(i, e.feature);
        match e.fate {
            Fate::Refused(_) => {
                let want = refusal.unwrap_or_else(|| panic!("{:?}: its sample is not refused", e.feature));
                assert!(want.contains("is not supported by nomad-rs yet"), "{want}");
                let got = ts.endpoints.job_register(job.clone(), Default::default()).await.unwrap_err();
                assert_eq!(got, EndpointError::BadRequest(want.clone()), "{:?} at register", e.feature);
                let got = ts.endpoints.job_plan(job.clone(), false).await.unwrap_err();
                assert_eq!(got, EndpointError::BadRequest(want), "{:?} at plan", e.feature);
                assert!(ts.store.snapshot().job("default", &job.id).is_none(), "{:?}: nothing stored", e.feature);
            }
            Fate::Honoured(_) | Fate::Constrained(_) => {
                assert_eq!(refusal, None, "{:?}", e.feature);
                ts.endpoints.job_plan(job.clone(), false).await.unwrap_or_else(|err| panic!("{:?} at plan: {err:?}", e.feature));
                ts.endpoints
                    .job_register(job, Default::default())
                    .await
                    .unwrap_or_else(|err| panic!("{:?} at register: {err:?}", e.feature));
            }
        }
    }
}

/// A constrained entry is admitted, and the placement that cannot happen says why.
#[tokio::test]
async fn a_host_volume_no_node_has_is_kept_from_placement_with_the_reason() {
    let ts = server();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    let Fate::Constrained(reason) = Feature::HostVolume.entry().fate else { panic!("host volumes are constrained") };
    let plan = ts.endpoints.job_plan(sample_job_using(Feature::HostVolume), false).await.unwrap();
    let failed = plan.failed_tg_allocs.expect("the group cannot be placed");
    assert_eq!(failed["cache"].constraint_filtered.get(reason), Some(&1), "{failed:?}");
}

/// A bridge or cni/<name> group is kept off a node that does not fingerprint that network mode,
/// with the scheduler's `missing network`.
#[tokio::test]
async fn a_network_mode_no_node_has_is_kept_from_placement_with_the_reason() {
    let ts = server();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    for feature in [Feature::NetworkModeBridge, Feature::NetworkModeCni] {
        let Fate::Constrained(reason) = feature.entry().fate else { panic!("{feature:?} is constrained") };
        assert_eq!(reason, "missing network");
        let plan = ts.endpoints.job_plan(sample_job_using(feature), false).await.unwrap();
        let failed = plan.failed_tg_allocs.expect("the group cannot be placed");
        assert_eq!(failed["cache"].constraint_filtered.get(reason), Some(&1), "{feature:?}: {failed:?}");
    }
}

/// A group with a Consul service gets Nomad's implied constraint at register: a node without
/// Consul is filtered out naming it; a node with Consul gets the alloc.
#[tokio::test]
async fn a_consul_service_group_is_kept_off_nodes_without_consul_naming_the_constraint() {
    let ts = server();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    let Fate::Constrained(reason) = Feature::ServiceConsul.entry().fate else { panic!("Consul services are constrained") };
    assert_eq!(reason, "${attr.consul.version} semver >= 1.7.0");
    let job = sample_job_using(Feature::ServiceCheck);
    let plan = ts.endpoints.job_plan(job.clone(), false).await.unwrap();
    let failed = plan.failed_tg_allocs.expect("the group cannot be placed");
    assert_eq!(failed["cache"].constraint_filtered.get(reason), Some(&1), "{failed:?}");
    ts.endpoints.job_register(job.clone(), Default::default()).await.unwrap();
    let stored = ts.store.snapshot().job("default", &job.id).cloned().unwrap();
    assert_eq!(stored.task_groups[0].constraints.iter().map(|c| c.to_string()).collect::<Vec<_>>(), [reason]);

    let mut with_consul = ready_node("n2");
    with_consul.attributes.insert("consul.version".into(), "1.16.1".into());
    ts.consensus.apply(Command::NodeRegister { node: with_consul, evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    let plan = ts.endpoints.job_plan(job, false).await.unwrap();
    assert!(plan.failed_tg_allocs.is_none_or(|f| f.is_empty()), "placed on the node with Consul");
}

/// A Connect sidecar is kept off nodes whose Consul is older than 1.8.0, the constraint the
/// servers put on the Envoy task they inject.
#[tokio::test]
async fn a_connect_sidecar_is_kept_off_nodes_with_an_old_consul_naming_the_constraint() {
    let ts = server();
    let mut old = ready_node("n1");
    old.attributes.insert("consul.version".into(), "1.7.5".into());
    old.drivers.insert("docker".into(), nomad_proto::DriverInfo { detected: true, healthy: true, ..Default::default() });
    old.node_resources.as_mut().unwrap().networks =
        vec![nomad_proto::NetworkResource { mode: "bridge".into(), ..nomad_proto::NetworkResource::default() }];
    ts.consensus.apply(Command::NodeRegister { node: old, evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
    for feature in [Feature::ConnectSidecarService, Feature::ConnectGateway] {
        let Fate::Constrained(reason) = feature.entry().fate else { panic!("{feature:?} is constrained") };
        let plan = ts.endpoints.job_plan(sample_job_using(feature), false).await.unwrap();
        let failed = plan.failed_tg_allocs.expect("the group cannot be placed");
        assert_eq!(failed["cache"].constraint_filtered.get(reason), Some(&1), "{feature:?}: {failed:?}");
    }
}

async fn put(ts: &TestServer, path: &str, body: serde_json::Value) -> (StatusCode, String) {
    let req = Request::builder().method(Method::PUT).uri(path).body(Body::from(body.to_string())).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn the_http_api_answers_400_with_the_message_for_every_refused_entry() {
    let ts = server();
    for (i, e) in TABLE.iter().enumerate() {
        let Fate::Refused(_) = e.fate else { continue };
        let (job, refusal) = sample(i, e.feature);
        let want = refusal.unwrap();
        let (status, text) = put(&ts, "/v1/jobs", json!({ "Job": job })).await;
        assert_eq!((status, text.trim_end()), (StatusCode::BAD_REQUEST, want.trim_end()), "{:?} at PUT /v1/jobs", e.feature);
        let (status, text) = put(&ts, &format!("/v1/job/{}/plan", job.id), json!({ "Job": job })).await;
        assert_eq!((status, text.trim_end()), (StatusCode::BAD_REQUEST, want.trim_end()), "{:?} at plan", e.feature);
    }
    let (status, text) = put(&ts, "/v1/jobs", json!({ "Job": job("plain", 1) })).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

/// What a Nomad user sends: a service with no provider (Nomad's default, Consul), a template
/// and a vault block, in Nomad's JSON: the service and template are admitted, vault is refused.
#[tokio::test]
async fn a_nomad_json_job_with_a_default_provider_service_and_vault_is_refused_for_vault() {
    let ts = server();
    let body = json!({ "Job": {
        "ID": "cache", "Datacenters": ["dc1"],
        "TaskGroups": [{ "Name": "cache",
            "Services": [{ "Name": "redis-cache", "PortLabel": "db" }],
            "Networks": [{ "DynamicPorts": [{ "Label": "db" }] }],
            "Tasks": [{ "Name": "redis", "Driver": "raw_exec", "Config": { "command": "/bin/sleep" },
                "Templates": [{ "EmbeddedTmpl": "x", "DestPath": "local/x" }],
                "Vault": { "Policies": ["read"] } }] }] } });
    let (status, text) = put(&ts, "/v1/jobs", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert_eq!(text.trim(), "group \"cache\" task \"redis\": the \"vault\" block is not supported by nomad-rs yet", "{text}");
}

/// Nomad's `/v1/validate/job`: 200 with the problems listed, the same messages as a refusal.
#[tokio::test]
async fn validate_job_lists_what_register_would_refuse() {
    let ts = server();
    let (status, text) = put(&ts, "/v1/validate/job", json!({ "Job": sample_job_using(Feature::Vault) })).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want = "group \"cache\" task \"redis\": the \"vault\" block is not supported by nomad-rs yet";
    assert_eq!(v["ValidationErrors"], json!([want]));
    assert_eq!(v["Error"], format!("1 error occurred:\n\t* {want}\n\n"));
    assert_eq!((v["DriverConfigValidated"].as_bool(), v["Warnings"].as_str()), (Some(true), Some("")));

    let mut invalid = job("bad", 1);
    invalid.priority = 500;
    let (status, text) = put(&ts, "/v1/validate/job", json!({ "Job": invalid })).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["ValidationErrors"][0].as_str().unwrap().contains("priority"), "{v}");

    let (status, text) = put(&ts, "/v1/validate/job", json!({ "Job": job("plain", 1) })).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["ValidationErrors"].clone(), v["Error"].clone()), (json!([]), json!("")));

    let (status, text) = put(&ts, "/v1/validate/job", json!({})).await;
    assert_eq!((status, text.trim_end()), (StatusCode::BAD_REQUEST, "Job must be specified"));
    assert!(ts.store.snapshot().jobs().next().is_none(), "validation writes nothing");
}

/// A job for another region would have been run here as if it were this one's.
#[tokio::test]
async fn a_job_for_another_region_is_refused_not_run_here() {
    let ts = server();
    let mut eu = job("eu", 1);
    eu.region = "eu".into();
    let want = "job region \"eu\" is not this cluster's region \"global\"; nomad-rs does not forward jobs to other regions yet";
    assert_eq!(ts.endpoints.job_register(eu.clone(), Default::default()).await.unwrap_err(), EndpointError::BadRequest(want.into()));
    assert_eq!(ts.endpoints.job_plan(eu.clone(), false).await.unwrap_err(), EndpointError::BadRequest(want.into()));
    assert_eq!(ts.endpoints.job_validate(eu).validation_errors, vec![want.to_string()]);
    let mut here = job("here", 1);
    here.region = "global".into();
    ts.endpoints.job_register(here, Default::default()).await.unwrap();
}
