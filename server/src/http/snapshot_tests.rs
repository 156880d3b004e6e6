//! Operator snapshots through the real router: save, change, restore and the state is back; a
//! damaged or oversized archive is refused and changes nothing; only management may do either.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::acl::AclConfig;
use crate::consensus::Consensus as _;
use crate::fsm::{Command, PlanApply};
use crate::leader::{KeyringConfig, KeyringLoop, Leader, LeaderConfig, LeaderDeps};
use crate::snapshot::{SnapshotMeta, read_archive, write_archive};
use crate::state::State;
use crate::test_support::wait_until;
use crate::testing::{TestServer, job, node};

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn index(&self) -> u64 {
        self.headers.get("x-nomad-index").expect("X-Nomad-Index").to_str().unwrap().parse().unwrap()
    }
}

async fn send(ts: &TestServer, method: Method, path: &str, token: Option<&str>, body: impl Into<Body>) -> Reply {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        b = b.header("X-Nomad-Token", t);
    }
    let resp =
        tokio::time::timeout(Duration::from_secs(30), ts.router().oneshot(b.body(body.into()).unwrap())).await.expect("answers").unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    Reply { status, headers, body }
}

async fn call(ts: &TestServer, method: Method, path: &str, token: Option<&str>, body: Value) -> Reply {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    send(ts, method, path, token, body).await
}

/// A server with ACLs on, a root key, and its management secret.
async fn acl_server() -> (TestServer, String) {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
    KeyringLoop::new(ts.store.clone(), ts.consensus.clone(), ts.endpoints.keyring().clone(), KeyringConfig::default())
        .ensure_and_rekey(nomad_proto::Timestamp::now())
        .await
        .unwrap();
    let r = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let mgmt = r.json()["SecretID"].as_str().unwrap().to_string();
    (ts, mgmt)
}

/// Everything the state holds, without the indexes a restore re-stamps.
fn contents(state: &State) -> Value {
    let mut v: Value = serde_json::from_slice(&state.to_bytes().unwrap()).unwrap();
    let object = v.as_object_mut().unwrap();
    object.remove("index");
    object.remove("table_index");
    v
}

/// A job with an eval and a running alloc on a registered node.
async fn job_with_alloc(ts: &TestServer, mgmt: &str, job_id: &str) {
    let r = call(ts, Method::PUT, "/v1/jobs", Some(mgmt), json!({ "Job": job(job_id, 1) })).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let snap = ts.store.snapshot();
    let stored = snap.job("default", job_id).unwrap().clone();
    let eval = snap.evals_by_job("default", job_id).next().unwrap().as_ref().clone();
    let alloc = nomad_proto::Allocation {
        id: nomad_proto::new_id(),
        namespace: "default".into(),
        eval_id: eval.id.clone(),
        job_id: job_id.into(),
        task_group: stored.task_groups[0].name.clone(),
        name: format!("{job_id}.{}[0]", stored.task_groups[0].name),
        node_id: "n1".into(),
        client_status: nomad_proto::ClientStatus::Running,
        ..nomad_proto::Allocation::default()
    };
    let plan = PlanApply { job: Some((*stored).clone()), allocs_upserted: vec![alloc], eval: Some(eval), ..PlanApply::default() };
    ts.consensus.apply(Command::PlanApply(plan)).await.unwrap();
}

#[tokio::test]
async fn a_restore_brings_back_every_table_the_save_saw() {
    let (ts, mgmt) = acl_server().await;
    ts.register_node(node("n1")).await;
    job_with_alloc(&ts, &mgmt, "web").await;
    let r = call(
        &ts,
        Method::PUT,
        "/v1/acl/policy/readers",
        Some(&mgmt),
        json!({"Name": "readers", "Rules": "namespace \"default\" { policy = \"read\" }"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r =
        call(&ts, Method::POST, "/v1/acl/token", Some(&mgmt), json!({"Name": "reader", "Type": "client", "Policies": ["readers"]})).await;
    let (reader_secret, reader_accessor) =
        (r.json()["SecretID"].as_str().unwrap().to_string(), r.json()["AccessorID"].as_str().unwrap().to_string());
    let r = call(&ts, Method::PUT, "/v1/var/app/config", Some(&mgmt), json!({"Items": {"password": "hunter2"}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    let before = ts.store.snapshot();
    let saved = send(&ts, Method::GET, "/v1/operator/snapshot", Some(&mgmt), Body::empty()).await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.text());
    assert_eq!(saved.index(), before.index, "X-Nomad-Index is the index the state was saved at");
    assert_eq!(saved.headers["digest"].to_str().unwrap(), crate::snapshot::digest_header(&saved.body));
    let archive = read_archive(&saved.body).unwrap();
    assert_eq!(archive.meta.index, before.index);
    assert_eq!(archive.meta.size, archive.state.len() as u64);

    // Change every kind of object the save holds.
    assert_eq!(call(&ts, Method::DELETE, "/v1/job/web?purge=true", Some(&mgmt), Value::Null).await.status, StatusCode::OK);
    job_with_alloc(&ts, &mgmt, "other").await;
    assert_eq!(call(&ts, Method::DELETE, "/v1/var/app/config", Some(&mgmt), Value::Null).await.status, StatusCode::NO_CONTENT);
    let r = call(&ts, Method::DELETE, &format!("/v1/acl/token/{reader_accessor}"), Some(&mgmt), Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(call(&ts, Method::GET, "/v1/jobs", Some(&reader_secret), Value::Null).await.status, StatusCode::FORBIDDEN);
    let changed = ts.store.snapshot();
    assert_ne!(contents(&changed), contents(&before));

    let restored = send(&ts, Method::PUT, "/v1/operator/snapshot", Some(&mgmt), saved.body.clone()).await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.text());
    let after = ts.store.snapshot();
    assert_eq!(contents(&after), contents(&before), "jobs, evals, allocs, nodes, ACL objects and variables are as saved");
    assert_eq!(restored.index(), after.index);
    assert!(after.index > changed.index, "the restore is a newer write: blocking queries wake and clients pull again");
    assert!(after.job("default", "web").is_some() && after.job("default", "other").is_none());
    // The restored token works again, and the restored variable decrypts.
    let jobs = call(&ts, Method::GET, "/v1/jobs", Some(&reader_secret), Value::Null).await;
    assert_eq!(jobs.status, StatusCode::OK, "{}", jobs.text());
    assert_eq!(jobs.json()[0]["ID"], "web");
    let var = call(&ts, Method::GET, "/v1/var/app/config", Some(&mgmt), Value::Null).await;
    assert_eq!(var.json()["Items"]["password"], "hunter2", "{}", var.text());
}

#[tokio::test]
async fn a_damaged_or_oversized_archive_is_refused_and_changes_nothing() {
    let (ts, mgmt) = acl_server().await;
    job_with_alloc(&ts, &mgmt, "web").await;
    let saved = send(&ts, Method::GET, "/v1/operator/snapshot", Some(&mgmt), Body::empty()).await.body;
    let before = contents(&ts.store.snapshot());

    // The same meta and sums over a changed state: the checksum refuses it.
    let archive = read_archive(&saved).unwrap();
    let mut forged = archive.state.clone();
    let at = forged.iter().position(|b| *b == b'w').unwrap();
    forged[at] = b'x';
    let damaged = reseal(&archive.meta, &archive.state, &forged);
    let r = send(&ts, Method::PUT, "/v1/operator/snapshot", Some(&mgmt), damaged).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.text(),
        "failed to restore from snapshot: failed to read snapshot file: failed checking integrity of snapshot: hash check failed for \"state.bin\""
    );
    // A truncated download; a file that is not an archive; a well-formed archive of something
    // that is not a state.
    let r = send(&ts, Method::PUT, "/v1/operator/snapshot", Some(&mgmt), saved.slice(..saved.len() / 2)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let r = send(&ts, Method::PUT, "/v1/operator/snapshot", Some(&mgmt), "not a snapshot").await;
    assert_eq!(
        (r.status, r.text()),
        (StatusCode::BAD_REQUEST, "failed to restore from snapshot: failed to decompress snapshot: not a gzip stream".into())
    );
    let junk = br#"{"hello":"world"}"#;
    let r = send(
        &ts,
        Method::PUT,
        "/v1/operator/snapshot",
        Some(&mgmt),
        write_archive(&SnapshotMeta::new(1, 1, 0, junk.len() as u64), junk).unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().starts_with("failed to restore from snapshot: decoding state snapshot:"), "{}", r.text());
    // Over the body limit: refused from Content-Length, before anything is read.
    let big = Request::builder()
        .method(Method::PUT)
        .uri("/v1/operator/snapshot")
        .header("X-Nomad-Token", &mgmt)
        .header("content-length", (crate::snapshot::MAX_ARCHIVE_BYTES + 1).to_string())
        .body(Body::from(vec![0u8; crate::snapshot::MAX_ARCHIVE_BYTES + 1]))
        .unwrap();
    assert_eq!(ts.router().oneshot(big).await.unwrap().status(), StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(contents(&ts.store.snapshot()), before, "nothing was restored");
}

/// An archive with `meta` and the sums of `summed`, but `state` as its state.bin.
fn reseal(meta: &SnapshotMeta, summed: &[u8], state: &[u8]) -> Vec<u8> {
    let honest = write_archive(meta, summed).unwrap();
    let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(honest.as_slice()));
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
        entries.push((name, bytes));
    }
    let mut out = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (name, bytes) in entries {
        let bytes = if name == "state.bin" { state.to_vec() } else { bytes };
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o600);
        out.append_data(&mut header, name, bytes.as_slice()).unwrap();
    }
    out.into_inner().unwrap().finish().unwrap()
}

#[tokio::test]
async fn only_a_management_token_saves_or_restores() {
    let (ts, mgmt) = acl_server().await;
    let r = call(
        &ts,
        Method::PUT,
        "/v1/acl/policy/ops",
        Some(&mgmt),
        json!({"Name": "ops", "Rules": "operator { policy = \"write\" }\nnamespace \"*\" { policy = \"write\" }"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = call(&ts, Method::POST, "/v1/acl/token", Some(&mgmt), json!({"Name": "ops", "Type": "client", "Policies": ["ops"]})).await;
    let ops = r.json()["SecretID"].as_str().unwrap().to_string();
    let saved = send(&ts, Method::GET, "/v1/operator/snapshot", Some(&mgmt), Body::empty()).await.body;
    let index = ts.store.snapshot().index;
    for token in [None, Some(ops.as_str())] {
        let r = send(&ts, Method::GET, "/v1/operator/snapshot", token, Body::empty()).await;
        assert_eq!((r.status, r.text()), (StatusCode::FORBIDDEN, "Permission denied".to_string()));
        let r = send(&ts, Method::PUT, "/v1/operator/snapshot", token, saved.clone()).await;
        assert_eq!((r.status, r.text()), (StatusCode::FORBIDDEN, "Permission denied".to_string()));
    }
    assert_eq!(ts.store.snapshot().index, index, "a refused restore wrote nothing");
    let open = TestServer::new();
    let r = send(&open, Method::DELETE, "/v1/operator/snapshot", None, Body::empty()).await;
    assert_eq!((r.status, r.text()), (StatusCode::METHOD_NOT_ALLOWED, "Invalid method".to_string()));
}

/// The leader's subsystems start over on the restored state: a node that exists only in the
/// snapshot gets a heartbeat timer (else it could never be marked down).
#[tokio::test]
async fn the_leader_restarts_its_subsystems_on_the_restored_state() {
    let (ts, mgmt) = acl_server().await;
    ts.register_node(node("n1")).await;
    let saved = send(&ts, Method::GET, "/v1/operator/snapshot", Some(&mgmt), Body::empty()).await.body;
    ts.consensus.apply(Command::NodeDeregister { node_ids: vec!["n1".into()], evals: Vec::new() }).await.unwrap();
    let heartbeats = ts.endpoints.heartbeats().clone();
    heartbeats.remove("n1");

    let leader = Arc::new(Leader::new(
        LeaderDeps {
            store: ts.store.clone(),
            consensus: ts.consensus.clone(),
            heartbeats: heartbeats.clone(),
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
    wait_until("the leader's subsystems run", || broker.enabled()).await;
    assert!(heartbeats.deadline("n1").is_none(), "the deregistered node has no timer");

    let r = send(&ts, Method::PUT, "/v1/operator/snapshot", Some(&mgmt), saved).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    wait_until("the restored node has a heartbeat timer", || heartbeats.deadline("n1").is_some()).await;
    running.abort();
}
