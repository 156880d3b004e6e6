//! SI tokens (`Node.DeriveSIToken`, the revoker, leadership changes) and gateway config entries
//! at register, against the recording [`FakeConsul`].

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::rpc::{AllocUpdateRequest, DeriveSiTokenRequest, NodeUpdateStatusRequest};
use nomad_proto::service::{ConsulConnect, ConsulGateway, ConsulLinkedService, ConsulSidecarService, ConsulTerminatingConfigEntry};
use nomad_proto::{Allocation, ClientStatus, Job, NodeStatus, Service, Task};

use super::config_entries::ConfigEntry;
use super::fake::FakeConsul;
use super::revoker::{ConsensusPurger, Revoker, RevokerConfig};
use super::*;
use crate::endpoints::{EndpointError, JobRegisterOptions};
use crate::leader::{Leader, LeaderConfig, LeaderDeps};
use crate::test_support::eventually;
use crate::testing::{TestServer, job, node};

fn with_consul(fake: &Arc<FakeConsul>) -> TestServer {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_consul(ConsulHandles::from(fake.clone()));
    ts
}

fn task(name: &str, kind: &str) -> Task {
    Task { name: name.into(), driver: "raw_exec".into(), kind: kind.into(), ..Task::default() }
}

/// A group with a Connect service `web`: its sidecar (`connect-proxy:web`), a native task
/// (`connect-native:api`) and a plain task.
fn connect_job(id: &str) -> Job {
    let mut j = job(id, 1);
    j.task_groups[0].tasks = vec![task("app", ""), task("connect-proxy-web", "connect-proxy:web"), task("native", "connect-native:api")];
    j.task_groups[0].services = vec![Service {
        name: "web".into(),
        port_label: "9090".into(),
        connect: Some(ConsulConnect { sidecar_service: Some(ConsulSidecarService::default()), ..ConsulConnect::default() }),
        ..Service::default()
    }];
    j.canonicalize();
    j
}

/// Puts an alloc of `j` on the node, as the plan applier would.
fn place(ts: &TestServer, j: &Job, node_id: &str) -> Allocation {
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
    let stored = ts.store.snapshot().job("default", &j.id).unwrap().clone();
    let a = Allocation {
        id: nomad_proto::new_id(),
        namespace: "default".into(),
        job_id: j.id.clone(),
        job: Some(stored),
        task_group: "web".into(),
        name: format!("{}.web[0]", j.id),
        node_id: node_id.into(),
        client_status: ClientStatus::Running,
        ..Allocation::default()
    };
    ts.store.write(idx + 1, |tx| Ok(tx.upsert_allocs_from_plan(vec![a.clone()]))).unwrap();
    a
}

fn derive(n: &nomad_proto::Node, alloc: &Allocation, tasks: &[&str]) -> DeriveSiTokenRequest {
    DeriveSiTokenRequest {
        node_id: n.id.clone(),
        secret_id: n.secret_id.clone(),
        alloc_id: alloc.id.clone(),
        tasks: tasks.iter().map(|t| t.to_string()).collect(),
        region: "global".into(),
    }
}

fn error_of(r: &nomad_proto::rpc::DeriveSiTokenResponse) -> String {
    r.error.as_ref().map(|e| e.err.clone()).unwrap_or_default()
}

#[tokio::test]
async fn one_token_per_connect_task_with_nomads_description_identity_and_stored_accessor() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let n = ts.register_node(node("n1")).await;
    let a = place(&ts, &connect_job("shop"), "n1");

    let r = ts.endpoints.node_derive_si_token(derive(&n, &a, &["connect-proxy-web", "native"])).await.unwrap();
    assert_eq!(r.error, None);
    assert_eq!(r.tokens.len(), 2, "{:?}", r.tokens);
    let snap = ts.store.snapshot();
    let cluster = snap.cluster_metadata().expect("the cluster ID was set on first use").cluster_id.clone();
    assert_eq!(cluster.len(), 36, "a UUID: {cluster}");

    let tokens = fake.tokens();
    assert_eq!(tokens.len(), 2);
    for (task, service) in [("connect-proxy-web", "web"), ("native", "api")] {
        let (accessor, t) = tokens.iter().find(|(_, t)| t.request.description.ends_with(&format!("[{task}]"))).expect(task);
        assert_eq!(t.request.description, format!("_nomad_si [{cluster}] [{}] [{task}]", a.id));
        assert_eq!(t.request.service_identities, vec![AclServiceIdentity { service_name: service.into() }], "the service, not the sidecar");
        assert!(t.request.local);
        assert_eq!(r.tokens[task], t.secret_id, "the client gets the secret");
        let stored = snap.si_token_accessor(accessor).expect("the accessor is in raft");
        assert_eq!((stored.alloc_id.as_str(), stored.node_id.as_str(), stored.task_name.as_str()), (a.id.as_str(), "n1", task));
        assert!(stored.create_index > 0);
    }
    assert!(snap.si_token_accessors().all(|s| !s.accessor_id.is_empty()));

    // The Consul payload as it goes on the wire: Nomad's fields, empty namespace left out.
    let body = serde_json::to_value(&tokens.values().next().unwrap().request).unwrap();
    assert_eq!(body.as_object().unwrap().keys().collect::<Vec<_>>(), ["Description", "Local", "ServiceIdentities"]);

    // A second derive (a task restart on another agent run) keeps the same cluster ID.
    ts.endpoints.node_derive_si_token(derive(&n, &a, &["native"])).await.unwrap();
    assert_eq!(ts.store.snapshot().cluster_metadata().unwrap().cluster_id, cluster);
    assert_eq!(ts.store.snapshot().si_token_accessors().count(), 3);
}

#[tokio::test]
async fn refusals_say_what_nomad_says_and_create_no_token() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let n1 = ts.register_node(node("n1")).await;
    let n2 = ts.register_node(node("n2")).await;
    let a = place(&ts, &connect_job("shop"), "n1");

    let mut wrong = derive(&n1, &a, &["connect-proxy-web"]);
    wrong.secret_id = "not-the-secret".into();
    let e = ts.endpoints.node_derive_si_token(wrong).await.unwrap_err();
    assert!(matches!(e, EndpointError::PermissionDenied(_)), "{e:?}");

    let r = ts.endpoints.node_derive_si_token(derive(&n1, &a, &["app", "connect-proxy-web"])).await.unwrap();
    assert_eq!(error_of(&r), "Requested Consul Service Identity tokens for tasks that are not Connect enabled: app");
    assert!(r.tokens.is_empty() && !r.error.as_ref().unwrap().recoverable);
    let r = ts.endpoints.node_derive_si_token(derive(&n1, &a, &["ghost"])).await.unwrap();
    assert_eq!(error_of(&r), "Requested Consul Service Identity tokens for tasks that are not Connect enabled: ghost");

    let r = ts.endpoints.node_derive_si_token(derive(&n2, &a, &["connect-proxy-web"])).await.unwrap();
    assert_eq!(error_of(&r), format!("Allocation {:?} not running on node \"n2\"", a.id));

    let mut missing = a.clone();
    missing.id = "0000-missing".into();
    let r = ts.endpoints.node_derive_si_token(derive(&n1, &missing, &["connect-proxy-web"])).await.unwrap();
    assert_eq!(error_of(&r), "Allocation \"0000-missing\" does not exist");

    let r = ts.endpoints.node_derive_si_token(derive(&n1, &a, &[])).await.unwrap();
    assert_eq!(error_of(&r), "no tasks specified");

    let mut plain_job = job("plain", 1);
    plain_job.canonicalize();
    let plain = place(&ts, &plain_job, "n1");
    let r = ts.endpoints.node_derive_si_token(derive(&n1, &plain, &["server"])).await.unwrap();
    assert_eq!(error_of(&r), "TaskGroup \"web\" does not use Connect");

    let idx = ts.store.snapshot().index + 1;
    let mut done = a.clone();
    done.client_status = ClientStatus::Complete;
    ts.store.write(idx, |tx| Ok(tx.update_allocs_from_client(&[done], 1))).unwrap();
    let r = ts.endpoints.node_derive_si_token(derive(&n1, &a, &["connect-proxy-web"])).await.unwrap();
    assert_eq!(error_of(&r), "Cannot request SI token for terminal allocation");

    assert!(fake.tokens().is_empty(), "nothing was created in Consul");
    assert_eq!(ts.store.snapshot().si_token_accessors().count(), 0);
}

#[tokio::test]
async fn consul_down_or_missing_fails_the_derive_and_stores_nothing() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let n = ts.register_node(node("n1")).await;
    let a = place(&ts, &connect_job("shop"), "n1");
    fake.set_down(true);
    let r = ts.endpoints.node_derive_si_token(derive(&n, &a, &["connect-proxy-web", "native"])).await.unwrap();
    assert!(error_of(&r).contains("connection refused"), "{r:?}");
    assert!(r.tokens.is_empty());
    assert_eq!(ts.store.snapshot().si_token_accessors().count(), 0);

    let without = TestServer::new();
    let n = without.register_node(node("n1")).await;
    let a = place(&without, &connect_job("shop"), "n1");
    let r = without.endpoints.node_derive_si_token(derive(&n, &a, &["native"])).await.unwrap();
    assert!(error_of(&r).contains("no consul {} block"), "{r:?}");
}

fn fast() -> RevokerConfig {
    RevokerConfig { min_interval: Duration::from_millis(5), backoff_base: Duration::from_millis(20), ..RevokerConfig::default() }
}

fn start_leader(ts: &TestServer, fake: &Arc<FakeConsul>) -> tokio::task::JoinHandle<()> {
    let deps = LeaderDeps {
        store: ts.store.clone(),
        consensus: ts.consensus.clone(),
        heartbeats: ts.endpoints.heartbeats().clone(),
        heartbeat_expiry: Arc::new(ts.endpoints.clone()),
        scheduler: Arc::new(crate::sim::FirstReadyNode),
        volume_watch: Arc::new(ts.endpoints.clone()),
        claim_gc: Arc::new(ts.endpoints.clone()),
        keyring: ts.endpoints.keyring().clone(),
    };
    let config = LeaderConfig { num_schedulers: 1, evals_in_flight: 1, si_revoker: fast(), ..LeaderConfig::default() };
    let acl: Arc<dyn ConsulAcl> = fake.clone();
    let leader = Arc::new(Leader::new(deps, config).with_consul_acl(Some(acl)));
    tokio::spawn(leader.run())
}

fn client_update(n: &nomad_proto::Node, a: &Allocation, status: ClientStatus) -> AllocUpdateRequest {
    let mut u = a.clone();
    u.job = None;
    u.client_status = status;
    AllocUpdateRequest { alloc: vec![u], evals: vec![], secret_id: n.secret_id.clone() }
}

async fn ready(ts: &TestServer, id: &str) -> nomad_proto::Node {
    let n = ts.register_node(node(id)).await;
    let hb =
        NodeUpdateStatusRequest { node_id: id.into(), status: NodeStatus::Ready, secret_id: n.secret_id.clone(), ..Default::default() };
    ts.endpoints.node_update_status(hb).await.unwrap();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_revoked_when_the_alloc_stops_and_when_the_node_goes_down() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let leader = start_leader(&ts, &fake);
    let n1 = ready(&ts, "n1").await;
    let n2 = ready(&ts, "n2").await;
    let stopping = place(&ts, &connect_job("stops"), "n1");
    let kept = place(&ts, &connect_job("kept"), "n1");
    let on_n2 = place(&ts, &connect_job("downed"), "n2");
    for (n, a) in [(&n1, &stopping), (&n1, &kept), (&n2, &on_n2)] {
        let r = ts.endpoints.node_derive_si_token(derive(n, a, &["connect-proxy-web"])).await.unwrap();
        assert_eq!(r.error, None);
    }
    assert_eq!(fake.tokens().len(), 3);

    // The client reports the alloc finished: its token goes, the others stay.
    ts.endpoints.node_update_alloc(client_update(&n1, &stopping, ClientStatus::Complete)).await.unwrap();
    let s = eventually(&ts, "the stopped alloc's accessor is purged", |s| s.si_token_accessors_by_alloc(&stopping.id).count() == 0).await;
    assert_eq!(s.si_token_accessors().count(), 2);
    let live: Vec<String> = fake.tokens().values().map(|t| t.request.description.clone()).collect();
    assert!(live.iter().all(|d| !d.contains(&stopping.id)), "revoked in Consul: {live:?}");

    // n2 misses its heartbeats: down, its alloc's token goes (the alloc itself is not terminal).
    ts.endpoints.node_heartbeat_missed("n2").await.unwrap();
    assert_eq!(ts.store.snapshot().node("n2").unwrap().status, NodeStatus::Down);
    let s = eventually(&ts, "the down node's accessors are purged", |s| s.si_token_accessors_by_node("n2").count() == 0).await;
    assert_eq!(s.si_token_accessors().count(), 1, "the live alloc keeps its token");
    assert_eq!(fake.tokens().len(), 1);
    assert!(fake.tokens().values().next().unwrap().request.description.contains(&kept.id));
    leader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_is_retried_with_backoff_while_consul_is_down() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let leader = start_leader(&ts, &fake);
    let n = ready(&ts, "n1").await;
    let a = place(&ts, &connect_job("shop"), "n1");
    ts.endpoints.node_derive_si_token(derive(&n, &a, &["connect-proxy-web", "native"])).await.unwrap();
    fake.set_down(true);
    ts.endpoints.node_update_alloc(client_update(&n, &a, ClientStatus::Failed)).await.unwrap();
    nomad_testkit::wait_until("several failed attempts per accessor", || fake.revoke_attempts().len() >= 6).await;
    assert_eq!(ts.store.snapshot().si_token_accessors().count(), 2, "kept while Consul cannot revoke them");
    assert_eq!(fake.tokens().len(), 2);
    fake.set_down(false);
    eventually(&ts, "purged once Consul is back", |s| s.si_token_accessors().count() == 0).await;
    assert!(fake.tokens().is_empty());
    leader.abort();
}

#[tokio::test]
async fn backoff_doubles_per_accessor_and_a_token_consul_lost_counts_as_revoked() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let n = ready(&ts, "n1").await;
    let a = place(&ts, &connect_job("shop"), "n1");
    ts.endpoints.node_derive_si_token(derive(&n, &a, &["connect-proxy-web"])).await.unwrap();
    let idx = ts.store.snapshot().index + 1;
    let mut done = a.clone();
    done.client_status = ClientStatus::Complete;
    ts.store.write(idx, |tx| Ok(tx.update_allocs_from_client(&[done], 1))).unwrap();

    let config = RevokerConfig { backoff_base: Duration::from_secs(60), ..RevokerConfig::default() };
    let mut r = Revoker::new(ts.store.clone(), fake.clone(), Arc::new(ConsensusPurger(ts.consensus.clone())), config);
    fake.set_down(true);
    let first = r.pass(&ts.store.snapshot()).await;
    assert_eq!((first.revoked.len(), first.failed.len()), (0, 1));
    let again = r.pass(&ts.store.snapshot()).await;
    assert_eq!(again, Default::default(), "not due again before its backoff");
    assert_eq!(fake.revoke_attempts().len(), 1);

    // Consul lost the token meanwhile (or an earlier revoke landed): "Cannot find token to
    // delete" is a success. A fresh revoker (a new term) tries at once.
    fake.set_down(false);
    let accessor = ts.store.snapshot().si_token_accessors().next().unwrap().accessor_id.clone();
    fake.revoke_token("", &accessor).await.unwrap();
    let mut fresh = Revoker::new(ts.store.clone(), fake.clone(), Arc::new(ConsensusPurger(ts.consensus.clone())), fast());
    let done = fresh.pass(&ts.store.snapshot()).await;
    assert_eq!(done.revoked, vec![accessor]);
    assert_eq!(ts.store.snapshot().si_token_accessors().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_revokes_the_tokens_of_allocs_that_died_while_no_leader_watched() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let old_leader = start_leader(&ts, &fake);
    let n1 = ready(&ts, "n1").await;
    let n2 = ready(&ts, "n2").await;
    let dies = place(&ts, &connect_job("dies"), "n1");
    let lives = place(&ts, &connect_job("lives"), "n1");
    let on_n2 = place(&ts, &connect_job("n2job"), "n2");
    for (n, a) in [(&n1, &dies), (&n1, &lives), (&n2, &on_n2)] {
        ts.endpoints.node_derive_si_token(derive(n, a, &["connect-proxy-web"])).await.unwrap();
    }
    // The leader goes away, with all its leader-only loops.
    old_leader.abort();
    let _ = old_leader.await;
    // Meanwhile (replicated from another server's term) one alloc finished, n2 went down and its
    // node record was then removed: nobody revoked anything.
    let idx = ts.store.snapshot().index + 1;
    let mut done = dies.clone();
    done.client_status = ClientStatus::Complete;
    ts.store.write(idx, |tx| Ok(tx.update_allocs_from_client(&[done], 1))).unwrap();
    ts.store.write(idx + 1, |tx| tx.delete_node("n2")).unwrap();
    assert!(fake.revoke_attempts().is_empty());
    assert_eq!(ts.store.snapshot().si_token_accessors().count(), 3);

    let new_leader = start_leader(&ts, &fake);
    let s = eventually(&ts, "the new leader revoked the dead allocs' tokens", |s| s.si_token_accessors().count() == 1).await;
    assert_eq!(s.si_token_accessors().next().unwrap().alloc_id, lives.id);
    assert_eq!(fake.tokens().len(), 1);
    let mut revoked = fake.revoke_attempts();
    revoked.sort();
    assert_eq!(revoked.len(), 2, "exactly the two dead tokens: {revoked:?}");
    new_leader.abort();
}

#[test]
fn accessors_and_the_cluster_id_survive_a_snapshot() {
    let store = crate::state::StateStore::new();
    let acc = crate::state::SiTokenAccessor {
        consul_namespace: "ns1".into(),
        node_id: "n1".into(),
        alloc_id: "a1".into(),
        accessor_id: "acc-1".into(),
        task_name: "t".into(),
        create_index: 0,
    };
    store
        .write(5, |tx| {
            tx.upsert_si_token_accessors(std::slice::from_ref(&acc));
            Ok(())
        })
        .unwrap();
    let meta = crate::state::ClusterMetadata { cluster_id: "c-1".into(), create_time: 7 };
    store
        .write(6, |tx| {
            tx.set_cluster_metadata(&meta);
            Ok(())
        })
        .unwrap();
    // A second ID never replaces the first.
    let other = crate::state::ClusterMetadata { cluster_id: "c-2".into(), create_time: 8 };
    store
        .write(7, |tx| {
            tx.set_cluster_metadata(&other);
            Ok(())
        })
        .unwrap();
    let bytes = store.snapshot().to_bytes().unwrap();
    let back = crate::state::State::from_bytes(&bytes).unwrap();
    assert_eq!(**back.si_token_accessor("acc-1").unwrap(), crate::state::SiTokenAccessor { create_index: 5, ..acc });
    assert_eq!(back.cluster_metadata(), Some(&meta));
    assert_eq!(back.table_index(crate::state::Table::SiTokenAccessors), 5);
    store
        .write(8, |tx| {
            tx.delete_si_token_accessors(&["acc-1".into(), "unknown".into()]);
            Ok(())
        })
        .unwrap();
    assert_eq!(store.snapshot().si_token_accessors().count(), 0);
}

fn gateway_job() -> Job {
    let mut j = job("gw", 1);
    let term = ConsulGateway {
        terminating: Some(ConsulTerminatingConfigEntry {
            services: vec![
                ConsulLinkedService {
                    name: "billing".into(),
                    ca_file: "/etc/ca.pem".into(),
                    sni: "billing.internal".into(),
                    ..Default::default()
                },
                ConsulLinkedService { name: "db".into(), ..Default::default() },
            ],
        }),
        ..ConsulGateway::default()
    };
    let ingress = ConsulGateway {
        ingress: Some(serde_json::json!({
            "TLS": {"Enabled": true, "TLSMinVersion": "TLSv1_2", "TLSMaxVersion": "", "CipherSuites": []},
            "Listeners": [{"Port": 8080, "Protocol": "http", "Services": [{"Name": "web", "Hosts": ["web.example"]}]}]
        })),
        ..ConsulGateway::default()
    };
    j.task_groups[0].tasks = vec![task("connect-terminating-term-gw", "connect-terminating:term-gw")];
    j.task_groups[0].services = vec![
        Service {
            name: "term-gw".into(),
            connect: Some(ConsulConnect { gateway: Some(term), ..ConsulConnect::default() }),
            ..Service::default()
        },
        Service {
            name: "ingress-gw".into(),
            connect: Some(ConsulConnect { gateway: Some(ingress), ..ConsulConnect::default() }),
            ..Service::default()
        },
    ];
    j.canonicalize();
    j
}

#[tokio::test]
async fn register_writes_the_gateways_config_entries_in_consuls_shape_before_the_job() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    let r = ts.endpoints.register_admitted(gateway_job(), JobRegisterOptions::default()).await.unwrap();
    assert!(r.index > 0);
    let entries = fake.config_entries();
    let keys: Vec<_> = entries.keys().cloned().collect();
    assert_eq!(
        keys,
        [("".into(), "ingress-gateway".into(), "ingress-gw".into()), ("".into(), "terminating-gateway".into(), "term-gw".into())]
    );
    let term = serde_json::to_value(&entries[&keys[1]]).unwrap();
    assert_eq!(
        term,
        serde_json::json!({"Kind": "terminating-gateway", "Name": "term-gw", "Services": [
            {"Name": "billing", "CAFile": "/etc/ca.pem", "SNI": "billing.internal"},
            {"Name": "db"}
        ]})
    );
    let ingress = serde_json::to_value(&entries[&keys[0]]).unwrap();
    assert_eq!(
        ingress,
        serde_json::json!({"Kind": "ingress-gateway", "Name": "ingress-gw",
            "TLS": {"Enabled": true, "TLSMinVersion": "TLSv1_2"},
            "Listeners": [{"Port": 8080, "Protocol": "http", "Services": [{"Name": "web", "Hosts": ["web.example"]}]}]})
    );
    assert!(matches!(entries[&keys[1]], ConfigEntry::Terminating(_)));
    assert!(ts.store.snapshot().job("default", "gw").is_some());

    // Every register writes them again (an update may change them).
    let mut update = gateway_job();
    update.task_groups[0].services[0].connect.as_mut().unwrap().gateway.as_mut().unwrap().terminating.as_mut().unwrap().services.pop();
    ts.endpoints.register_admitted(update, JobRegisterOptions::default()).await.unwrap();
    let term = serde_json::to_value(&fake.config_entries()[&keys[1]]).unwrap();
    assert_eq!(term["Services"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn register_fails_with_a_clear_error_when_consul_is_down_and_writes_nothing() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    fake.set_down(true);
    let before = ts.store.snapshot().index;
    let e = ts.endpoints.register_admitted(gateway_job(), JobRegisterOptions::default()).await.unwrap_err();
    assert_eq!(
        e,
        EndpointError::Internal(
            "writing the Consul ingress-gateway config entry \"ingress-gw\": cannot reach Consul: connection refused".into()
        )
    );
    assert!(ts.store.snapshot().job("default", "gw").is_none());
    assert_eq!(ts.store.snapshot().index, before, "no raft write");

    let without = TestServer::new();
    let e = without.endpoints.register_admitted(gateway_job(), JobRegisterOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("without a consul {} block"), "{e}");
    // A job without gateways never needs Consul.
    without.endpoints.register_admitted(connect_job("no-gateways"), JobRegisterOptions::default()).await.unwrap();
}

#[tokio::test]
async fn a_plan_writes_no_config_entry_and_register_writes_the_entry_of_the_mutated_gateway() {
    let fake = Arc::new(FakeConsul::new());
    let ts = with_consul(&fake);
    ts.endpoints.plan_admitted(gateway_job(), true).await.unwrap();
    assert!(fake.config_entries().is_empty(), "a plan is a dry run");

    // Through admission: the Connect mutator interpolates the gateway's name and adds its task
    // and port; the entry carries the name Consul will see.
    let mut j = job("edge", 1);
    let g = &mut j.task_groups[0];
    g.tasks.clear();
    g.networks = vec![nomad_proto::NetworkResource { mode: "bridge".into(), ..Default::default() }];
    let linked = ConsulLinkedService { name: "billing".into(), ..Default::default() };
    let gateway = ConsulGateway { terminating: Some(ConsulTerminatingConfigEntry { services: vec![linked] }), ..ConsulGateway::default() };
    let ingress = ConsulGateway {
        ingress: Some(serde_json::json!({"Listeners": [{"Port": 8080, "Services": [{"Name": "api"}]}]})),
        ..ConsulGateway::default()
    };
    g.services = vec![
        Service {
            name: "${NOMAD_JOB_ID}-out".into(),
            connect: Some(ConsulConnect { gateway: Some(gateway), ..ConsulConnect::default() }),
            ..Service::default()
        },
        Service {
            name: "${NOMAD_GROUP_NAME}-in".into(),
            port_label: "8080".into(),
            connect: Some(ConsulConnect { gateway: Some(ingress), ..ConsulConnect::default() }),
            ..Service::default()
        },
    ];
    ts.endpoints.job_plan(j.clone(), true).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(fake.config_entries().is_empty(), "a plan is a dry run");
    ts.endpoints.job_register(j, JobRegisterOptions::default()).await.unwrap_or_else(|e| panic!("{e}"));
    let entries = fake.config_entries();
    let keys: Vec<_> = entries.keys().cloned().collect();
    assert_eq!(
        keys,
        [("".into(), "ingress-gateway".into(), "web-in".into()), ("".into(), "terminating-gateway".into(), "edge-out".into())]
    );
    let ingress = serde_json::to_value(&entries[&keys[0]]).unwrap();
    assert_eq!(ingress["Listeners"], serde_json::json!([{"Port": 8080, "Protocol": "tcp", "Services": [{"Name": "api", "Hosts": null}]}]));
    let stored = ts.store.snapshot().job("default", "edge").cloned().unwrap();
    let g = &stored.task_groups[0];
    let tasks: Vec<(&str, &str)> = g.tasks.iter().map(|t| (t.name.as_str(), t.kind.as_str())).collect();
    assert_eq!(
        tasks,
        [("connect-terminating-edge-out", "connect-terminating:edge-out"), ("connect-ingress-web-in", "connect-ingress:web-in")]
    );
    assert_eq!(g.services[0].port_label, "connect-terminating-edge-out");
}
