//! The CSI routes through the real router: register, read, list, deregister, plugins, and the
//! routes nomad-rs refuses for now.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use nomad_proto::csi::{
    CsiInfo, CsiNodeInfo, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability, CsiVolumeClaim, CsiVolumeClaimMode,
};
use nomad_proto::rpc::client_csi::CsiControllerQuery;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::consensus::Consensus;
use crate::fsm::{Command, PlanApply};
use crate::testing::{TestServer, job, node};

struct Reply {
    status: StatusCode,
    index: Option<u64>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn call(ts: &TestServer, method: Method, path: &str, body: impl Into<Body>) -> Reply {
    let req = Request::builder().method(method).uri(path).body(body.into()).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    let status = resp.status();
    let index = resp.headers().get("x-nomad-index").map(|v| v.to_str().unwrap().parse().unwrap());
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, index, body }
}

async fn get(ts: &TestServer, path: &str) -> Reply {
    call(ts, Method::GET, path, Body::empty()).await
}

/// A server with node n1 running a healthy node plugin `hostpath` (no controller).
async fn server() -> TestServer {
    server_calling(crate::testing::RecordingClientCsi::new()).await
}

/// [`server`], its calls to clients going to `calls`.
async fn server_calling(calls: std::sync::Arc<crate::testing::RecordingClientCsi>) -> TestServer {
    let ts = TestServer::new().with_client_csi(calls);
    let mut n = node("n1");
    n.csi_node_plugins.insert(
        "hostpath".into(),
        CsiInfo {
            plugin_id: "hostpath".into(),
            alloc_id: "plugin-alloc".into(),
            healthy: true,
            health_description: "healthy".into(),
            provider: "hostpath.csi.k8s.io".into(),
            provider_version: "1.11.0".into(),
            node_info: Some(CsiNodeInfo { id: "ext-n1".into(), max_volumes: 10, ..CsiNodeInfo::default() }),
            ..CsiInfo::default()
        },
    );
    ts.register_node(n).await;
    ts
}

fn volume_body(id: &str, plugin: &str) -> String {
    json!({ "Volumes": [{
        "ID": id,
        "Name": format!("{id} name"),
        "ExternalID": format!("ext-{id}"),
        "PluginID": plugin,
        "RequestedCapabilities": [{ "AccessMode": "single-node-writer", "AttachmentMode": "file-system" }],
        "Secrets": { "password": "hunter2" },
        "MountOptions": { "FSType": "ext4", "MountFlags": ["noatime"] },
        "Parameters": { "size": "1G" },
    }]})
    .to_string()
}

async fn put_alloc(ts: &TestServer, id: &str, namespace: &str) {
    let mut j = job("j", 1);
    j.namespace = namespace.into();
    j.task_groups[0].volumes.insert(
        "data".into(),
        nomad_proto::VolumeRequest { name: "data".into(), volume_type: "csi".into(), source: "vol".into(), ..Default::default() },
    );
    j.canonicalize();
    let alloc = Allocation {
        id: id.into(),
        namespace: namespace.into(),
        job_id: "j".into(),
        task_group: "web".into(),
        node_id: "n1".into(),
        name: "j.web[0]".into(),
        desired_status: DesiredStatus::Run,
        client_status: ClientStatus::Running,
        ..Allocation::default()
    };
    ts.consensus.apply(Command::PlanApply(PlanApply { job: Some(j), allocs_upserted: vec![alloc], ..PlanApply::default() })).await.unwrap();
}

async fn claim(ts: &TestServer, namespace: &str, volume: &str, alloc: &str) {
    let claim = CsiVolumeClaim {
        allocation_id: alloc.into(),
        node_id: "n1".into(),
        mode: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        ..CsiVolumeClaim::default()
    };
    ts.consensus.apply(Command::CsiVolumeClaim { namespace: namespace.into(), volume_id: volume.into(), claim }).await.unwrap();
}

#[tokio::test]
async fn register_read_list_and_deregister_a_volume() {
    let ts = server().await;
    let r = call(&ts, Method::PUT, "/v1/volume/csi/vol", volume_body("vol", "hostpath")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let index = r.index.unwrap();
    assert_eq!(r.json()["Index"], index);

    let r = get(&ts, "/v1/volume/csi/vol").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["ID"], "vol");
    assert_eq!(v["Namespace"], "default");
    assert_eq!(v["ExternalID"], "ext-vol");
    assert_eq!(v["PluginID"], "hostpath");
    assert_eq!(v["Provider"], "hostpath.csi.k8s.io");
    assert_eq!(v["ProviderVersion"], "1.11.0");
    assert_eq!(v["Schedulable"], true);
    assert_eq!(v["NodesHealthy"], 1);
    assert_eq!(v["ControllerRequired"], false);
    assert_eq!(v["AccessMode"], "", "set by the first claim");
    assert_eq!(v["RequestedCapabilities"][0]["AccessMode"], "single-node-writer");
    assert_eq!(v["Parameters"]["size"], "1G");
    assert_eq!(v["CreateIndex"], index);
    assert_eq!(r.index, Some(index));
    // Never shown: secrets, mount flags, claims.
    assert!(!r.text().contains("hunter2") && !r.text().contains("noatime"), "{}", r.text());
    assert_eq!(v["Secrets"], Value::Null);
    assert_eq!(v["MountOptions"]["MountFlags"], json!(["[REDACTED]"]));
    assert!(v.get("ReadClaims").is_none() && v.get("PastClaims").is_none());
    assert_eq!(v["ReadAllocs"], json!({}));
    assert_eq!(v["Allocations"], json!([]));
    assert_eq!(v["ResourceExhausted"], "0001-01-01T00:00:00Z");

    // The same register through /v1/volumes, as Nomad's route allows.
    let r = call(&ts, Method::POST, "/v1/volumes", volume_body("vol2", "hostpath")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    let list = get(&ts, "/v1/volumes?type=csi").await;
    assert_eq!(list.status, StatusCode::OK);
    let l = list.json();
    assert_eq!(l.as_array().unwrap().len(), 2);
    assert_eq!(l[0]["ID"], "vol");
    assert_eq!(l[0]["CurrentReaders"], 0);
    assert_eq!(l[0]["Schedulable"], true);
    assert_eq!(l[0]["Provider"], "hostpath.csi.k8s.io");
    assert!(l[0].get("Secrets").is_none());
    assert_eq!(get(&ts, "/v1/volumes?type=csi&prefix=vol2").await.json().as_array().unwrap().len(), 1);
    assert_eq!(get(&ts, "/v1/volumes?type=csi&plugin_id=other").await.json(), json!([]));
    assert_eq!(get(&ts, "/v1/volumes?type=csi&plugin_id=hostpath").await.json().as_array().unwrap().len(), 2);
    assert_eq!(get(&ts, "/v1/volumes?type=csi&filter=ID%20%3D%3D%20%22vol2%22").await.json()[0]["ID"], "vol2");
    let page = get(&ts, "/v1/volumes?type=csi&per_page=1").await;
    assert_eq!(page.json().as_array().unwrap().len(), 1);
    // Nomad's answers without `type` and for another type.
    assert_eq!(get(&ts, "/v1/volumes").await.json(), json!([]));
    assert_eq!(get(&ts, "/v1/volumes?type=host").await.json(), Value::Null);

    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol", Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = get(&ts, "/v1/volume/csi/vol").await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::NOT_FOUND, "volume not found"));
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol", Body::empty()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "volume not found: vol"));
}

#[tokio::test]
async fn register_refuses_bad_volumes_with_nomads_messages() {
    let ts = server().await;
    let cases = [
        (volume_body("v", "nope"), StatusCode::INTERNAL_SERVER_ERROR, "no CSI plugin named: nope could be found".to_string()),
        (json!({"Volumes": []}).to_string(), StatusCode::INTERNAL_SERVER_ERROR, "missing volume definition".into()),
        (
            json!({"Volumes": [{"PluginID": "hostpath"}]}).to_string(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "validation: missing volume id, must include at least one capability block".into(),
        ),
        (
            json!({"Volumes": [{"ID": "v", "PluginID": "hostpath", "RequestedCapabilities": [{"AccessMode": "single-node"}]}]}).to_string(),
            StatusCode::BAD_REQUEST,
            "single-node".into(),
        ),
        (
            json!({"Volumes": [{"ID": "v".repeat(2000), "PluginID": "hostpath"}]}).to_string(),
            StatusCode::BAD_REQUEST,
            "more than the limit".into(),
        ),
    ];
    for (body, code, msg) in cases {
        let r = call(&ts, Method::PUT, "/v1/volume/csi/v", body.clone()).await;
        assert_eq!(r.status, code, "{body}: {}", r.text());
        assert!(r.text().contains(&msg), "{body}: {}", r.text());
    }
    let many = json!({"Volumes": (0..101).map(|i| json!({"ID": format!("v{i}")})).collect::<Vec<_>>()}).to_string();
    let r = call(&ts, Method::PUT, "/v1/volume/csi/v", many).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert_eq!(get(&ts, "/v1/volumes?type=csi").await.json(), json!([]), "nothing was registered");

    // A plugin that needs a controller: validated through it, so not without a ready one.
    let mut n = node("n2");
    n.csi_controller_plugins.insert(
        "ctrl".into(),
        CsiInfo { healthy: true, requires_controller_plugin: true, controller_info: Some(Default::default()), ..CsiInfo::default() },
    );
    ts.register_node(n).await;
    let r = call(&ts, Method::PUT, "/v1/volume/csi/v", volume_body("v", "ctrl")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
    assert!(r.text().starts_with("controller validate volume: failed to find clients running controller plugin \"ctrl\""), "{}", r.text());
    assert!(get(&ts, "/v1/volume/csi/v").await.status == StatusCode::NOT_FOUND, "not registered");

    // An update may not change what identifies the volume.
    assert_eq!(call(&ts, Method::PUT, "/v1/volume/csi/v", volume_body("v", "hostpath")).await.status, StatusCode::OK);
    let renamed = volume_body("v", "hostpath").replace("v name", "other name");
    let r = call(&ts, Method::PUT, "/v1/volume/csi/v", renamed).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.text(), "1 error occurred:\n\t* volume name cannot be updated\n\n");
}

#[tokio::test]
async fn deregister_refuses_claimed_volumes_unless_forced_after_the_allocs_finished() {
    let ts = server().await;
    assert_eq!(call(&ts, Method::PUT, "/v1/volume/csi/vol", volume_body("vol", "hostpath")).await.status, StatusCode::OK);
    put_alloc(&ts, "a1", "default").await;
    claim(&ts, "default", "vol", "a1").await;

    let v = get(&ts, "/v1/volume/csi/vol").await.json();
    assert_eq!(v["WriteAllocs"], json!({"a1": null}));
    assert_eq!(v["Allocations"][0]["ID"], "a1");
    assert_eq!(v["AccessMode"], "single-node-writer");
    assert_eq!(get(&ts, "/v1/volumes?type=csi").await.json()[0]["CurrentWriters"], 1);
    // The volumes the allocs on a node ask for in their groups.
    assert_eq!(get(&ts, "/v1/volumes?type=csi&node_id=n1").await.json()[0]["ID"], "vol");
    assert_eq!(get(&ts, "/v1/volumes?type=csi&node_id=n2").await.json(), json!([]));

    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol?force=maybe", Body::empty()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::BAD_REQUEST, "invalid force value"));
    for path in ["/v1/volume/csi/vol", "/v1/volume/csi/vol?force=true"] {
        let r = call(&ts, Method::DELETE, path, Body::empty()).await;
        assert_eq!((r.status, r.text().as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "volume in use: vol"), "{path}");
    }
    let done = Allocation { id: "a1".into(), node_id: "n1".into(), client_status: ClientStatus::Failed, ..Allocation::default() };
    ts.consensus.apply(Command::AllocClientUpdate { allocs: vec![done], evals: vec![], now: nomad_proto::Timestamp::ZERO }).await.unwrap();
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol", Body::empty()).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "still claimed until released or forced");
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol?force=true", Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(get(&ts, "/v1/volume/csi/vol").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn volumes_with_the_same_id_in_two_namespaces_are_separate() {
    let ts = server().await;
    let r = call(&ts, Method::PUT, "/v1/namespace/other", json!({"Name": "other"}).to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    for ns in ["default", "other"] {
        let r = call(&ts, Method::PUT, &format!("/v1/volume/csi/shared?namespace={ns}"), volume_body("shared", "hostpath")).await;
        assert_eq!(r.status, StatusCode::OK, "{ns}: {}", r.text());
    }
    put_alloc(&ts, "a1", "default").await;
    claim(&ts, "default", "shared", "a1").await;

    let d = get(&ts, "/v1/volume/csi/shared").await.json();
    let o = get(&ts, "/v1/volume/csi/shared?namespace=other").await.json();
    assert_eq!((d["Namespace"].as_str(), o["Namespace"].as_str()), (Some("default"), Some("other")));
    assert_eq!(d["WriteAllocs"], json!({"a1": null}));
    assert_eq!(o["WriteAllocs"], json!({}));
    assert_eq!(o["Allocations"], json!([]));

    let all = get(&ts, "/v1/volumes?type=csi&namespace=*").await.json();
    let seen: Vec<(&str, i64)> =
        all.as_array().unwrap().iter().map(|v| (v["Namespace"].as_str().unwrap(), v["CurrentWriters"].as_i64().unwrap())).collect();
    assert_eq!(seen, [("default", 1), ("other", 0)]);
    assert_eq!(get(&ts, "/v1/volumes?type=csi&namespace=other").await.json().as_array().unwrap().len(), 1);
    assert_eq!(get(&ts, "/v1/volume/csi/shared?namespace=nowhere").await.status, StatusCode::NOT_FOUND);
    // The unclaimed one goes; the claimed one in default stays.
    assert_eq!(call(&ts, Method::DELETE, "/v1/volume/csi/shared?namespace=other", Body::empty()).await.status, StatusCode::OK);
    assert_eq!(get(&ts, "/v1/volume/csi/shared").await.status, StatusCode::OK);
    let r = call(&ts, Method::PUT, "/v1/volume/csi/x?namespace=nowhere", volume_body("x", "hostpath")).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "volume x is in nonexistent namespace nowhere"));
}

#[tokio::test]
async fn plugins_are_listed_and_read_from_node_fingerprints() {
    let ts = server().await;
    let l = get(&ts, "/v1/plugins?type=csi").await;
    assert_eq!(l.status, StatusCode::OK);
    let list = l.json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["ID"], "hostpath");
    assert_eq!(list[0]["Provider"], "hostpath.csi.k8s.io");
    assert_eq!(list[0]["NodesHealthy"], 1);
    assert_eq!(list[0]["ControllersHealthy"], 0);
    assert!(l.index.unwrap() > 0);
    assert_eq!(get(&ts, "/v1/plugins").await.json(), json!([]));
    assert_eq!(get(&ts, "/v1/plugins?type=csi&prefix=zzz").await.json(), json!([]));

    let p = get(&ts, "/v1/plugin/csi/hostpath").await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.text());
    let p = p.json();
    assert_eq!(p["Version"], "1.11.0");
    assert_eq!(p["Nodes"]["n1"]["NodeInfo"]["ID"], "ext-n1");
    assert_eq!(p["Nodes"]["n1"]["NodeInfo"]["MaxVolumes"], 10);
    assert_eq!(p["Nodes"]["n1"]["Healthy"], true);
    assert_eq!(p["Controllers"], json!({}));
    assert_eq!(p["Allocations"], json!([]), "the plugin alloc is not in the state");
    let r = get(&ts, "/v1/plugin/csi/nope").await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::NOT_FOUND, "plugin not found"));
    assert_eq!(call(&ts, Method::DELETE, "/v1/plugin/csi/hostpath", Body::empty()).await.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(call(&ts, Method::PUT, "/v1/plugins?type=csi", Body::empty()).await.status, StatusCode::METHOD_NOT_ALLOWED);

    // The node stops running it: the plugin is gone.
    ts.register_node(node("n1")).await;
    assert_eq!(get(&ts, "/v1/plugins?type=csi").await.json(), json!([]));
    assert_eq!(get(&ts, "/v1/plugin/csi/hostpath").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn create_delete_and_detach_answer_with_nomads_codes_and_create_nothing() {
    let ts = server().await;
    // The fixture's plugin has no controller to create or delete with.
    let r = call(&ts, Method::PUT, "/v1/volume/csi/vol/create", volume_body("vol", "hostpath")).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "plugin has no controller"));
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol/delete", Body::empty()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::NOT_FOUND, "volume not found: vol"));
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol/detach", Body::empty()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::BAD_REQUEST, "detach requires node ID"));
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol/detach?node=n1", Body::empty()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::NOT_FOUND, "no such volume"));
    for m in [Method::GET, Method::PUT, Method::POST] {
        assert_eq!(
            call(&ts, m.clone(), "/v1/volume/csi/vol/detach?node=n1", Body::empty()).await.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{m}"
        );
    }
    assert_eq!(get(&ts, "/v1/volume/csi/vol/create").await.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(call(&ts, Method::PUT, "/v1/volume/csi/vol/other", Body::empty()).await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&ts, "/v1/volume/csi/a/b/c").await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&ts, Method::POST, "/v1/volume/csi/vol", Body::empty()).await.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(call(&ts, Method::DELETE, "/v1/volumes?type=csi", Body::empty()).await.status, StatusCode::METHOD_NOT_ALLOWED);
    // Nothing was created by any of them.
    assert_eq!(get(&ts, "/v1/volumes?type=csi").await.json(), json!([]));
}

#[tokio::test]
async fn a_blocking_volume_read_answers_when_the_volume_changes() {
    let ts = server().await;
    let r = call(&ts, Method::PUT, "/v1/volume/csi/vol", volume_body("vol", "hostpath")).await;
    let index = r.index.unwrap();
    let router = ts.router();
    let waiter = tokio::spawn(async move {
        let req = Request::builder().uri(format!("/v1/volume/csi/vol?index={index}&wait=30s")).body(Body::empty()).unwrap();
        let resp = router.oneshot(req).await.unwrap();
        let idx: u64 = resp.headers()["x-nomad-index"].to_str().unwrap().parse().unwrap();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        (idx, serde_json::from_slice::<Value>(&body).unwrap())
    });
    nomad_testkit::wait_until("the read to park", || ts.store.blocking_registrations() > 0).await;
    put_alloc(&ts, "a1", "default").await;
    claim(&ts, "default", "vol", "a1").await;
    let (idx, v) = waiter.await.unwrap();
    assert!(idx > index);
    assert_eq!(v["WriteAllocs"], json!({"a1": null}));
}

#[tokio::test]
async fn detach_releases_through_the_walk_for_a_down_node_in_the_namespace_asked() {
    use crate::testing::{CsiCall, RecordingClientCsi};
    let calls = RecordingClientCsi::new();
    let ts = server_calling(calls.clone()).await;
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.update_node_status("n1", nomad_proto::NodeStatus::Ready, None, 0).map(|_| ())).unwrap();
    assert_eq!(call(&ts, Method::PUT, "/v1/namespace/other", json!({"Name": "other"}).to_string()).await.status, StatusCode::OK);
    for ns in ["default", "other"] {
        let r = call(&ts, Method::PUT, &format!("/v1/volume/csi/shared?namespace={ns}"), volume_body("shared", "hostpath")).await;
        assert_eq!(r.status, StatusCode::OK, "{ns}: {}", r.text());
    }
    put_alloc(&ts, "a1", "other").await;
    claim(&ts, "other", "shared", "a1").await;
    let done = Allocation { id: "a1".into(), node_id: "n1".into(), client_status: ClientStatus::Failed, ..Allocation::default() };
    ts.consensus.apply(Command::AllocClientUpdate { allocs: vec![done], evals: vec![], now: nomad_proto::Timestamp::ZERO }).await.unwrap();
    let default_index = ts.store.snapshot().csi_volume("default", "shared").unwrap().modify_index;

    // A live node is asked to unmount every past claim it holds.
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/shared/detach?node=n1&namespace=other", Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(calls.calls(), vec![CsiCall::NodeDetach { node_id: "n1".into(), alloc_id: "a1".into(), external_id: "ext-shared".into() }]);
    let other = ts.store.snapshot().csi_volume("other", "shared").unwrap().clone();
    assert!(r.index.unwrap() >= other.modify_index && other.modify_index > default_index, "the volume's index moved: the watcher wakes");
    assert_eq!(other.past_claims["a1"].state, nomad_proto::csi::CsiVolumeClaimState::Unpublishing, "the watcher frees it");
    assert_eq!(ts.store.snapshot().csi_volume("default", "shared").unwrap().modify_index, default_index, "other namespaces untouched");

    // Down, or already collected: no call to it, and no error.
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.update_node_status("n1", nomad_proto::NodeStatus::Down, None, 0).map(|_| ())).unwrap();
    for node in ["n1", "gone-node"] {
        let r = call(&ts, Method::DELETE, &format!("/v1/volume/csi/shared/detach?node={node}&namespace=other"), Body::empty()).await;
        assert_eq!(r.status, StatusCode::OK, "{node}: {}", r.text());
    }
    assert_eq!(calls.calls().len(), 1);

    // The watcher (the leader's) finishes: the claim is freed.
    let watcher =
        crate::leader::VolumeWatcher::new(std::sync::Arc::new(ts.endpoints.clone()), crate::leader::VolumeWatcherConfig::default());
    let task = tokio::spawn(watcher.run());
    crate::test_support::eventually(&ts, "claim freed", |s| {
        s.csi_volume("other", "shared").is_some_and(|v| !v.in_use() && v.past_claims.is_empty())
    })
    .await;
    assert_eq!(calls.calls().len(), 1, "the node is down: the watcher does not call it either");
    task.abort();
}

/// A node running a healthy controller (create/delete) and node instance of `hostpath`, ready.
async fn controller_server() -> TestServer {
    let ts = TestServer::new();
    let mut n = node("n1");
    let info = CsiInfo {
        plugin_id: "hostpath".into(),
        alloc_id: "plugin-alloc".into(),
        healthy: true,
        health_description: "healthy".into(),
        provider: "hostpath.csi.k8s.io".into(),
        provider_version: "1.11.0".into(),
        requires_controller_plugin: true,
        ..CsiInfo::default()
    };
    n.csi_node_plugins.insert(
        "hostpath".into(),
        CsiInfo { node_info: Some(CsiNodeInfo { id: "ext-n1".into(), max_volumes: 10, ..CsiNodeInfo::default() }), ..info.clone() },
    );
    let caps = nomad_proto::csi::CsiControllerInfo { supports_create_delete: true, ..Default::default() };
    n.csi_controller_plugins.insert("hostpath".into(), CsiInfo { controller_info: Some(caps), ..info });
    let n = ts.register_node(n).await;
    let hb = nomad_proto::rpc::NodeUpdateStatusRequest {
        node_id: n.id.clone(),
        secret_id: n.secret_id.clone(),
        status: nomad_proto::NodeStatus::Ready,
        ..Default::default()
    };
    ts.endpoints.node_update_status(hb).await.unwrap();
    ts
}

async fn call_with(router: &axum::Router, method: Method, path: &str, headers: &[(&str, &str)], body: impl Into<Body>) -> Reply {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = router.clone().oneshot(req.body(body.into()).unwrap()).await.unwrap();
    let status = resp.status();
    let index = resp.headers().get("x-nomad-index").map(|v| v.to_str().unwrap().parse().unwrap());
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, index, body }
}

#[tokio::test]
async fn create_asks_a_controller_then_registers_and_delete_asks_it_then_deregisters() {
    use crate::testing::{CsiRequest, RecordingClientCsi};
    let ts = controller_server().await;
    let fake = RecordingClientCsi::new();
    fake.set_created(nomad_proto::rpc::client_csi::ClientCsiControllerCreateResponse {
        external_volume_id: "hp-123".into(),
        capacity_bytes: 1 << 30,
        volume_context: [("path".to_string(), "/srv/hp-123".to_string())].into(),
        topologies: vec![],
    });
    let endpoints = ts.endpoints.clone().with_client_csi(fake.clone());
    let router = crate::http::router(crate::http::HttpState {
        endpoints,
        agent: std::sync::Arc::new(crate::http::AgentInfo { name: "test".into(), region: "global".into(), ..Default::default() }),
        forwarder: None,
    });
    let mut body: Value = serde_json::from_str(&volume_body("vol", "hostpath")).unwrap();
    body["Volumes"][0]["ExternalID"] = json!("");
    body["Volumes"][0]["RequestedCapacityMin"] = json!(1 << 20);
    let r = call_with(&router, Method::PUT, "/v1/volume/csi/vol/create", &[], body.to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let created = r.json();
    assert_eq!(created["Volumes"][0]["ExternalID"], "hp-123", "{created}");
    assert_eq!(created["Volumes"][0]["Secrets"], Value::Null, "no secrets in the reply: {created}");
    assert!(r.index.unwrap() > 0);
    let CsiRequest::ControllerCreate(asked) = &fake.requests()[0] else { panic!("{:?}", fake.requests()) };
    assert_eq!(asked.controller.controller_node_id, "n1");
    assert_eq!(asked.controller.plugin_id, "hostpath");
    assert_eq!(asked.name, "vol name");
    assert_eq!(asked.secrets["password"], "hunter2");
    assert_eq!(asked.parameters["size"], "1G");
    assert_eq!(asked.volume_capabilities.len(), 1);
    let vol = get(&ts, "/v1/volume/csi/vol").await.json();
    assert_eq!((vol["ExternalID"].as_str(), vol["Capacity"].as_i64()), (Some("hp-123"), Some(1 << 30)), "{vol}");
    assert_eq!(vol["Context"]["path"], "/srv/hp-123");

    // In use: refused before the controller is asked.
    put_alloc(&ts, "a1", "default").await;
    let taken = CsiVolumeClaim {
        allocation_id: "a1".into(),
        node_id: "n1".into(),
        mode: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        ..CsiVolumeClaim::default()
    };
    ts.consensus
        .apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim: taken.clone() })
        .await
        .unwrap();
    let r = call_with(&router, Method::DELETE, "/v1/volume/csi/vol/delete", &[], Body::empty()).await;
    assert_eq!((r.status, r.text().as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "volume in use: vol"));
    assert_eq!(fake.requests().len(), 1, "the controller was not asked");

    // Released: the controller deletes it (the request's secrets over the volume's), then it goes.
    let freed = CsiVolumeClaim { state: nomad_proto::csi::CsiVolumeClaimState::ReadyToFree, ..taken };
    ts.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim: freed }).await.unwrap();
    let secrets = [("X-Nomad-CSI-Secrets", "password=s3cret,token=t,junk")];
    let r = call_with(&router, Method::DELETE, "/v1/volume/csi/vol/delete", &secrets, Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let CsiRequest::ControllerDelete(asked) = &fake.requests()[1] else { panic!("{:?}", fake.requests()) };
    assert_eq!(asked.external_volume_id, "hp-123");
    assert_eq!(asked.controller.controller_node_id, "n1");
    assert_eq!(asked.secrets, [("password".to_string(), "s3cret".to_string()), ("token".to_string(), "t".to_string())].into());
    assert_eq!(get(&ts, "/v1/volume/csi/vol").await.status, StatusCode::NOT_FOUND);

    // A controller failure leaves the volume registered.
    let r = call_with(&router, Method::PUT, "/v1/volume/csi/vol/create", &[], body.to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    fake.fail_next(crate::csi::ClientCallError::Failed(
        "CSI.ControllerDeleteVolume: rpc error: code = Internal desc = disk on fire".into(),
    ));
    let r = call_with(&router, Method::DELETE, "/v1/volume/csi/vol/delete", &[], Body::empty()).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().starts_with("controller delete volume: CSI.ControllerDeleteVolume"), "{}", r.text());
    assert_eq!(get(&ts, "/v1/volume/csi/vol").await.status, StatusCode::OK);
}

#[tokio::test]
async fn register_with_a_controller_is_validated_by_it_and_a_refused_volume_is_not_registered() {
    use crate::testing::{CsiRequest, RecordingClientCsi};
    let ts = controller_server().await;
    let fake = RecordingClientCsi::new();
    let router = crate::http::router(crate::http::HttpState {
        endpoints: ts.endpoints.clone().with_client_csi(fake.clone()),
        agent: std::sync::Arc::new(crate::http::AgentInfo { name: "test".into(), region: "global".into(), ..Default::default() }),
        forwarder: None,
    });
    let mut body: Value = serde_json::from_str(&volume_body("vol", "hostpath")).unwrap();
    body["Volumes"][0]["Context"] = json!({"path": "/srv/ext-vol"});
    let r = call_with(&router, Method::PUT, "/v1/volume/csi/vol", &[], body.to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let requests = fake.requests();
    let [CsiRequest::ControllerValidate(asked)] = requests.as_slice() else { panic!("{requests:?}") };
    assert_eq!(asked.controller, CsiControllerQuery { controller_node_id: "n1".into(), plugin_id: "hostpath".into() });
    assert_eq!(asked.volume_id, "ext-vol", "the provider's ID");
    assert_eq!(
        asked.volume_capabilities,
        [CsiVolumeCapability { access_mode: CsiVolumeAccessMode::SingleNodeWriter, attachment_mode: CsiVolumeAttachmentMode::FileSystem }]
    );
    assert_eq!((asked.secrets["password"].as_str(), asked.parameters["size"].as_str()), ("hunter2", "1G"));
    assert_eq!(asked.context["path"], "/srv/ext-vol");
    assert_eq!(asked.mount_options, None, "Nomad sends none");
    assert_eq!(get(&ts, "/v1/volume/csi/vol").await.status, StatusCode::OK);

    // Refused by the plugin: Nomad's error, and nothing registered.
    fake.fail_next(crate::csi::ClientCallError::Failed(
        "CSI.ControllerValidateVolume: volume \"ext-other\" could not be found: rpc error: code = NotFound desc = no such volume".into(),
    ));
    let r = call_with(&router, Method::PUT, "/v1/volume/csi/other", &[], volume_body("other", "hostpath")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        r.text(),
        "controller validate volume: CSI.ControllerValidateVolume: volume \"ext-other\" could not be found: rpc error: code = NotFound desc = no such volume"
    );
    assert_eq!(get(&ts, "/v1/volume/csi/other").await.status, StatusCode::NOT_FOUND);
    assert_eq!(fake.requests().len(), 2);

    // A plugin without a controller is not asked.
    let plain = server_calling(fake.clone()).await;
    let r = call(&plain, Method::PUT, "/v1/volume/csi/nc", volume_body("nc", "hostpath")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(fake.requests().len(), 2, "no controller call");
}

/// Reads the NDJSON lines of an event stream until `n` batches (not heartbeats) arrived.
async fn read_event_lines(body: &mut Body, n: usize) -> Vec<String> {
    use http_body_util::BodyExt;
    let (mut buf, mut lines) = (Vec::new(), Vec::new());
    while lines.len() < n {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame()).await.expect("a frame in time");
        if let Ok(data) = frame.expect("stream still open").unwrap().into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line = String::from_utf8(buf.drain(..=pos).collect()).unwrap();
            if line.trim() != "{}" {
                lines.push(line);
            }
        }
    }
    lines
}

#[tokio::test]
async fn the_csi_volume_topic_streams_register_claim_and_deregister_in_order() {
    let ts = server().await;
    let req = Request::get("/v1/event/stream?topic=CSIVolume").body(Body::empty()).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = resp.into_body();

    let registered = call(&ts, Method::PUT, "/v1/volume/csi/vol", volume_body("vol", "hostpath")).await.index.unwrap();
    put_alloc(&ts, "a1", "default").await;
    claim(&ts, "default", "vol", "a1").await;
    let freed = CsiVolumeClaim {
        allocation_id: "a1".into(),
        mode: CsiVolumeClaimMode::Write,
        state: nomad_proto::csi::CsiVolumeClaimState::ReadyToFree,
        ..CsiVolumeClaim::default()
    };
    ts.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim: freed }).await.unwrap();
    let r = call(&ts, Method::DELETE, "/v1/volume/csi/vol", Body::empty()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // The node's plugin event and the alloc's events are on other topics: only the volume's come.
    let lines = read_event_lines(&mut stream, 4).await;
    let batches: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seen: Vec<(&str, &str, &str)> = batches
        .iter()
        .flat_map(|b| b["Events"].as_array().unwrap())
        .map(|e| (e["Topic"].as_str().unwrap(), e["Type"].as_str().unwrap(), e["Key"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("CSIVolume", "CSIVolumeRegistered", "vol"),
            ("CSIVolume", "CSIVolumeClaim", "vol"),
            ("CSIVolume", "CSIVolumeClaim", "vol"),
            ("CSIVolume", "CSIVolumeDeregistered", "vol"),
        ]
    );
    let indexes: Vec<u64> = batches.iter().map(|b| b["Index"].as_u64().unwrap()).collect();
    assert_eq!(indexes[0], registered);
    assert!(indexes.windows(2).all(|w| w[0] < w[1]), "in index order: {indexes:?}");
    let claimed = &batches[1]["Events"][0];
    assert_eq!(claimed["Namespace"], "default");
    assert_eq!(claimed["Payload"]["CSIVolume"]["WriteAllocs"], json!({"a1": null}));
    assert_eq!(claimed["Payload"]["CSIVolume"]["Allocations"][0]["ID"], "a1");
    assert!(lines.iter().all(|l| !l.contains("hunter2") && !l.contains("noatime")), "secrets or mount flags streamed: {lines:?}");
}
