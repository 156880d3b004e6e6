//! Consul Connect at admission (`nomad_proto::connect`): what `Job.Register`, `Job.Plan` and
//! `/v1/validate/job` do to a Connect job.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use nomad_proto::resources::{NetworkResource, Port};
use nomad_proto::service::{ConsulConnect, ConsulSidecarService};
use nomad_proto::{DriverInfo, Job, Node, Service};
use serde_json::json;
use tower::ServiceExt;

use super::EndpointError;
use crate::consensus::Consensus;
use crate::fsm::Command;
use crate::scheduler::BuiltinScheduler;
use crate::sim::ready_node;
use crate::testing::{TestServer, job};

fn server() -> TestServer {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_scheduler(Arc::new(BuiltinScheduler));
    ts
}

/// `countdash`: a bridge group `api` with a raw_exec task and the Connect service `count-api`.
fn countdash() -> Job {
    let mut j = job("countdash", 1);
    let g = &mut j.task_groups[0];
    g.name = "api".into();
    g.networks = vec![NetworkResource { mode: "bridge".into(), ..NetworkResource::default() }];
    g.services = vec![Service {
        name: "count-api".into(),
        port_label: "9001".into(),
        connect: Some(ConsulConnect { sidecar_service: Some(ConsulSidecarService::default()), ..ConsulConnect::default() }),
        ..Service::default()
    }];
    j
}

/// A node that can run the sidecar: docker, bridge networking and a Consul with gRPC.
fn connect_node(id: &str, consul_version: &str) -> Node {
    let mut n = ready_node(id);
    n.attributes.insert("consul.version".into(), consul_version.into());
    n.attributes.insert("consul.grpc".into(), "8502".into());
    n.drivers.insert("docker".into(), DriverInfo { detected: true, healthy: true, ..DriverInfo::default() });
    let resources = n.node_resources.as_mut().unwrap();
    resources.networks = ["host", "bridge"].map(|mode| NetworkResource { mode: mode.into(), ..NetworkResource::default() }).to_vec();
    n.compute_class();
    n
}

async fn add_node(ts: &TestServer, node: Node) {
    ts.consensus.apply(Command::NodeRegister { node, evals: vec![], now: nomad_proto::Timestamp::now() }).await.unwrap();
}

#[tokio::test]
async fn a_registered_connect_job_is_stored_with_its_sidecar_task_and_port() {
    let ts = server();
    ts.endpoints.job_register(countdash(), Default::default()).await.unwrap();
    let stored = ts.store.snapshot().job("default", "countdash").cloned().unwrap();
    let g = &stored.task_groups[0];
    let names: Vec<&str> = g.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["server", "connect-proxy-count-api"]);
    let envoy = &g.tasks[1];
    assert_eq!((envoy.kind.as_str(), envoy.driver.as_str()), ("connect-proxy:count-api", "docker"));
    assert_eq!(envoy.config["image"], json!("${meta.connect.sidecar_image}"));
    let constraints: Vec<String> = envoy.constraints.iter().map(|c| c.to_string()).collect();
    assert_eq!(constraints, ["${attr.consul.version} semver >= 1.8.0", "${attr.consul.grpc} > 0"]);
    assert_eq!(g.networks[0].dynamic_ports, [Port { label: "connect-proxy-count-api".into(), to: -1, ..Port::default() }]);
    assert_eq!(stored.version, 0);

    // Registering it again, as submitted or as read back, changes nothing: no new version.
    ts.endpoints.job_register(countdash(), Default::default()).await.unwrap();
    let mut read_back = (*ts.store.snapshot().job("default", "countdash").cloned().unwrap()).clone();
    read_back.version = 0;
    ts.endpoints.job_register(read_back, Default::default()).await.unwrap();
    let again = ts.store.snapshot().job("default", "countdash").cloned().unwrap();
    assert_eq!(again.version, 0, "the same job");
    assert_eq!(again.task_groups, stored.task_groups);
}

#[tokio::test]
async fn a_plan_shows_the_sidecar_task_and_places_it_only_where_consul_is_new_enough() {
    let ts = server();
    add_node(&ts, connect_node("old-consul", "1.7.5")).await;
    let plan = ts.endpoints.job_plan(countdash(), true).await.unwrap();
    let diff = plan.diff.expect("asked for");
    let tasks: Vec<(&str, &str)> = diff.task_groups[0].tasks.iter().map(|t| (t.name.as_str(), t.diff_type)).collect();
    assert_eq!(tasks, [("connect-proxy-count-api", "Added"), ("server", "Added")]);
    let failed = plan.failed_tg_allocs.expect("no node runs Connect sidecars");
    assert_eq!(failed["api"].constraint_filtered.get("${attr.consul.version} semver >= 1.8.0"), Some(&1), "{failed:?}");
    assert!(ts.store.snapshot().job("default", "countdash").is_none(), "a plan is a dry run");

    add_node(&ts, connect_node("new-consul", "1.16.1")).await;
    let plan = ts.endpoints.job_plan(countdash(), false).await.unwrap();
    assert!(plan.failed_tg_allocs.is_none(), "{:?}", plan.failed_tg_allocs);
    assert_eq!(plan.annotations.unwrap().desired_tg_updates["api"].place, 1);
}

#[tokio::test]
async fn connect_problems_are_refused_with_nomads_messages() {
    let ts = server();
    let mut host = countdash();
    host.task_groups[0].networks[0].mode = "host".into();
    let want = EndpointError::Invalid("Consul Connect sidecar requires bridge network, found \"host\" in group \"api\"".into());
    assert_eq!(ts.endpoints.job_register(host.clone(), Default::default()).await.unwrap_err(), want);
    assert_eq!(ts.endpoints.job_plan(host.clone(), false).await.unwrap_err(), want);
    assert_eq!(ts.endpoints.job_validate(host).validation_errors, [want.to_string()]);

    let mut native = countdash();
    native.task_groups[0].services[0].connect = Some(ConsulConnect { native: true, ..ConsulConnect::default() });
    let mut second = native.task_groups[0].tasks[0].clone();
    second.name = "second".into();
    native.task_groups[0].tasks.push(second);
    let want = EndpointError::Invalid("task for Consul Connect Native service api->count-api is ambiguous and must be set".into());
    assert_eq!(ts.endpoints.job_register(native.clone(), Default::default()).await.unwrap_err(), want);
    assert_eq!(ts.endpoints.job_validate(native).validation_errors, [want.to_string()]);
    assert!(ts.store.snapshot().jobs().next().is_none(), "nothing stored");
}

#[tokio::test]
async fn the_http_api_registers_a_nomad_json_connect_job_and_validates_it() {
    let ts = server();
    let body = json!({ "Job": {
        "ID": "countdash", "Datacenters": ["dc1"],
        "TaskGroups": [{ "Name": "api",
            "Networks": [{ "Mode": "bridge" }],
            "Services": [{ "Name": "count-api", "PortLabel": "9001",
                "Connect": { "SidecarService": { "Proxy": { "Upstreams": [{ "DestinationName": "db", "LocalBindPort": 5432 }] } } } }],
            "Tasks": [{ "Name": "web", "Driver": "raw_exec", "Config": { "command": "/bin/sleep" } }] }] } });
    for path in ["/v1/validate/job", "/v1/jobs"] {
        let req = Request::builder().method(Method::PUT).uri(path).body(Body::from(body.to_string())).unwrap();
        let resp = ts.router().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&bytes));
        if path == "/v1/validate/job" {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["ValidationErrors"], json!([]), "{v}");
        }
    }
    let stored = ts.store.snapshot().job("default", "countdash").cloned().unwrap();
    assert_eq!(stored.task_groups[0].tasks[1].name, "connect-proxy-count-api");
}

/// The limits are checked again on the mutated job: the tasks and ports the servers add count.
#[tokio::test]
async fn the_injected_sidecar_counts_toward_the_tasks_limit() {
    let ts = server();
    let mut full = countdash();
    let template = full.task_groups[0].tasks[0].clone();
    full.task_groups[0].tasks =
        (0..nomad_proto::limits::MAX_TASKS_PER_GROUP).map(|i| nomad_proto::Task { name: format!("t{i}"), ..template.clone() }).collect();
    let err = ts.endpoints.job_register(full, Default::default()).await.unwrap_err();
    assert_eq!(err, EndpointError::BadRequest("task group \"api\" has 101 tasks, more than the limit of 100".into()));
}
