//! Node RPC behaviour: authentication, status rules, heartbeat expiry and
//! the reconnect gate, driven in-process.

use std::sync::Arc;

use nomad_proto::rpc::{AllocUpdateRequest, AllocsGetRequest, NodeRegisterRequest, NodeSpecificRequest, NodeUpdateStatusRequest};
use nomad_proto::{Allocation, ClientStatus, EvalStatus, NodeStatus};

use super::EndpointError;
use crate::testing::{TestServer, job, node};

fn heartbeat(node_id: &str, secret: &str) -> NodeUpdateStatusRequest {
    NodeUpdateStatusRequest { node_id: node_id.into(), status: NodeStatus::Ready, secret_id: secret.into(), ..Default::default() }
}

async fn ready_node(ts: &TestServer, id: &str) -> nomad_proto::Node {
    let n = ts.register_node(node(id)).await;
    ts.endpoints.node_update_status(heartbeat(id, &n.secret_id)).await.unwrap();
    n
}

/// Puts an alloc of a job with `max_client_disconnect` on the node, as the plan applier would.
async fn place_alloc(ts: &TestServer, node_id: &str, max_disconnect: Option<i64>, status: ClientStatus) -> Allocation {
    let mut j = job("web", 1);
    j.task_groups[0].max_client_disconnect = max_disconnect;
    j.canonicalize();
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
    let stored = ts.store.snapshot().job("default", "web").unwrap().clone();
    let a = Allocation {
        id: nomad_proto::new_id(),
        namespace: "default".into(),
        job_id: "web".into(),
        job: Some(stored),
        task_group: "web".into(),
        name: "web.web[0]".into(),
        node_id: node_id.into(),
        client_status: status,
        ..Allocation::default()
    };
    ts.store.write(idx + 1, |tx| Ok(tx.upsert_allocs_from_plan(vec![a.clone()]))).unwrap();
    a
}

#[tokio::test]
async fn register_validates_and_authenticates() {
    let ts = TestServer::new();
    let mut bad = node("n1");
    bad.attributes.clear();
    let e = ts.endpoints.node_register(NodeRegisterRequest { node: bad, ..Default::default() }).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest("missing attributes for client registration".into()));
    let mut all = node("n1");
    all.node_pool = "all".into();
    assert!(ts.endpoints.node_register(NodeRegisterRequest { node: all, ..Default::default() }).await.is_err());

    let n = ts.register_node(node("n1")).await;
    let before = ts.store.snapshot().index;
    let mut imposter = n.clone();
    imposter.secret_id = "wrong".into();
    imposter.datacenter = "evil".into();
    let e = ts.endpoints.node_register(NodeRegisterRequest { node: imposter, ..Default::default() }).await.unwrap_err();
    assert!(matches!(e, EndpointError::PermissionDenied(_)), "{e:?}");
    assert_eq!(ts.store.snapshot().index, before, "a wrong secret changes nothing");
    assert_eq!(ts.store.snapshot().node("n1").unwrap().datacenter, "dc1");
}

#[tokio::test]
async fn every_node_rpc_refuses_a_wrong_secret_and_changes_nothing() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    let a = place_alloc(&ts, "n1", None, ClientStatus::Pending).await;
    let before = ts.store.snapshot();
    let denied = |r: Result<(), EndpointError>| assert!(matches!(r, Err(EndpointError::PermissionDenied(_))), "{r:?}");
    denied(ts.endpoints.node_update_status(heartbeat("n1", "wrong")).await.map(|_| ()));
    let mut up = a.clone();
    up.client_status = ClientStatus::Running;
    denied(
        ts.endpoints
            .node_update_alloc(AllocUpdateRequest { alloc: vec![up], secret_id: "wrong".into(), ..Default::default() })
            .await
            .map(|_| ()),
    );
    denied(
        ts.endpoints
            .node_get_client_allocs(NodeSpecificRequest { node_id: "n1".into(), secret_id: "wrong".into(), ..Default::default() })
            .await
            .map(|_| ()),
    );
    denied(
        ts.endpoints
            .alloc_get_allocs(AllocsGetRequest {
                alloc_ids: vec![a.id.clone()],
                node_id: "n1".into(),
                secret_id: String::new(),
                ..Default::default()
            })
            .await
            .map(|_| ()),
    );
    let after = ts.store.snapshot();
    assert_eq!(after.index, before.index);
    assert_eq!(after.alloc(&a.id).unwrap().client_status, ClientStatus::Pending);
    // The right secret works.
    let got = ts
        .endpoints
        .alloc_get_allocs(AllocsGetRequest {
            alloc_ids: vec![a.id.clone()],
            node_id: "n1".into(),
            secret_id: n.secret_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(got.allocs.len(), 1);
}

#[tokio::test]
async fn a_plain_heartbeat_writes_nothing() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    let before = ts.store.snapshot().index;
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.index, 0);
    assert!(r.heartbeat_ttl > 0);
    assert_eq!(ts.store.snapshot().index, before);
}

#[tokio::test]
async fn first_ready_heartbeat_readies_a_new_node() {
    let ts = TestServer::new();
    let n = ts.register_node(node("n1")).await;
    assert_eq!(ts.store.snapshot().node("n1").unwrap().status, NodeStatus::Initializing);
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.status, NodeStatus::Ready);
    assert_eq!(ts.store.snapshot().node("n1").unwrap().status, NodeStatus::Ready);
}

#[tokio::test]
async fn expiry_marks_a_node_down_and_creates_evals_for_its_jobs() {
    let ts = TestServer::new();
    ready_node(&ts, "n1").await;
    place_alloc(&ts, "n1", None, ClientStatus::Running).await;
    let status = ts.endpoints.node_heartbeat_missed("n1").await.unwrap();
    assert_eq!(status, NodeStatus::Down);
    let s = ts.store.snapshot();
    let n = s.node("n1").unwrap();
    assert_eq!(n.status, NodeStatus::Down);
    assert_eq!(n.events.last().unwrap().message, "Node heartbeat missed");
    assert_eq!(n.last_missed_heartbeat_index, n.modify_index);
    let evals: Vec<_> = s.evals().filter(|e| e.triggered_by == "node-update").collect();
    assert_eq!(evals.len(), 1);
    assert_eq!((evals[0].job_id.as_str(), evals[0].node_id.as_str(), evals[0].status), ("web", "n1", EvalStatus::Pending));
    assert!(ts.endpoints.heartbeats().deadline("n1").is_none(), "a down node has no timer");
}

#[tokio::test]
async fn expiry_with_max_client_disconnect_disconnects_and_keeps_rechecking() {
    let ts = TestServer::new();
    ready_node(&ts, "n1").await;
    place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Running).await;
    assert_eq!(ts.endpoints.node_heartbeat_missed("n1").await.unwrap(), NodeStatus::Disconnected);
    assert!(ts.endpoints.heartbeats().deadline("n1").is_some(), "a disconnected node is re-checked every TTL");
    let missed_at = ts.store.snapshot().node("n1").unwrap().last_missed_heartbeat_index;
    assert_eq!(ts.endpoints.node_heartbeat_missed("n1").await.unwrap(), NodeStatus::Disconnected);
    assert_eq!(ts.store.snapshot().node("n1").unwrap().last_missed_heartbeat_index, missed_at, "unchanged while unresponsive");
}

#[tokio::test]
async fn an_initializing_node_that_misses_its_ttl_goes_down() {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Running).await;
    assert_eq!(ts.endpoints.node_heartbeat_missed("n1").await.unwrap(), NodeStatus::Down);
}

#[tokio::test]
async fn reconnect_gate_holds_the_node_in_initializing_until_its_allocs_land() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    let a = place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Running).await;
    ts.endpoints.node_heartbeat_missed("n1").await.unwrap();

    // Alloc updates from a disconnected node are refused and change nothing.
    let mut up = a.clone();
    up.client_status = ClientStatus::Running;
    let req = || AllocUpdateRequest { alloc: vec![up.clone()], secret_id: n.secret_id.clone(), ..Default::default() };
    let before = ts.store.snapshot().index;
    let e = ts.endpoints.node_update_alloc(req()).await.unwrap_err();
    assert_eq!(e.to_string(), "node n1 is not allowed to update allocs while in status disconnected");
    assert_eq!(ts.store.snapshot().index, before);

    // Register never changes the status; heartbeats move it to initializing, never ready.
    ts.register_node(n.clone()).await;
    assert_eq!(ts.store.snapshot().node("n1").unwrap().status, NodeStatus::Disconnected);
    for _ in 0..3 {
        let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
        assert_eq!(r.status, NodeStatus::Initializing);
    }
    ts.register_node(n.clone()).await;
    assert_eq!(ts.store.snapshot().node("n1").unwrap().status, NodeStatus::Initializing);

    // Once the alloc update lands, the next heartbeat makes it ready.
    ts.endpoints.node_update_alloc(req()).await.unwrap();
    let s = ts.store.snapshot();
    let node = s.node("n1").unwrap();
    assert!(node.last_alloc_update_index > node.last_missed_heartbeat_index);
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.status, NodeStatus::Ready);
    assert_eq!(ts.store.snapshot().node("n1").unwrap().last_missed_heartbeat_index, 0);
}

#[tokio::test]
async fn the_gate_stays_shut_while_any_live_alloc_is_still_unknown() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    let a = place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Running).await;
    ts.endpoints.node_heartbeat_missed("n1").await.unwrap();
    // The scheduler marked a second alloc unknown while the node was away.
    let mut b = a.clone();
    b.id = nomad_proto::new_id();
    b.name = "web.web[1]".into();
    b.client_status = ClientStatus::Unknown;
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| Ok(tx.upsert_allocs_from_plan(vec![b.clone()]))).unwrap();
    ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    // An update that covers only the first alloc opens Nomad's index gate, not ours.
    let mut up = a.clone();
    up.client_status = ClientStatus::Failed;
    let req = |u: &Allocation| AllocUpdateRequest { alloc: vec![u.clone()], secret_id: n.secret_id.clone(), ..Default::default() };
    ts.endpoints.node_update_alloc(req(&up)).await.unwrap();
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.status, NodeStatus::Initializing, "b is still unknown");
    let mut upb = b.clone();
    upb.client_status = ClientStatus::Running;
    ts.endpoints.node_update_alloc(req(&upb)).await.unwrap();
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.status, NodeStatus::Ready);
}

#[tokio::test]
async fn a_down_node_with_unknown_allocs_comes_back_through_initializing() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Unknown).await;
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.update_node_status("n1", NodeStatus::Down, None, 0).map(|_| ())).unwrap();
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.status, NodeStatus::Initializing);
    // Without unknown allocs a down node comes straight back, as in Nomad.
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    place_alloc(&ts, "n1", None, ClientStatus::Running).await;
    ts.endpoints.node_heartbeat_missed("n1").await.unwrap();
    let r = ts.endpoints.node_update_status(heartbeat("n1", &n.secret_id)).await.unwrap();
    assert_eq!(r.status, NodeStatus::Ready);
}

#[tokio::test]
async fn update_alloc_of_an_unknown_alloc_creates_a_reconnect_eval() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    let a = place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Unknown).await;
    let mut up = a.clone();
    up.client_status = ClientStatus::Running;
    ts.endpoints
        .node_update_alloc(AllocUpdateRequest { alloc: vec![up], secret_id: n.secret_id.clone(), ..Default::default() })
        .await
        .unwrap();
    let s = ts.store.snapshot();
    assert!(s.evals().any(|e| e.triggered_by == "reconnect" && e.job_id == "web"));
    assert_eq!(s.alloc(&a.id).unwrap().client_status, ClientStatus::Running);
}

#[tokio::test]
async fn update_alloc_rejects_empty_and_foreign_batches() {
    let ts = TestServer::new();
    let n = ready_node(&ts, "n1").await;
    ready_node(&ts, "n2").await;
    let e = ts.endpoints.node_update_alloc(AllocUpdateRequest { secret_id: n.secret_id.clone(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.to_string(), "must update at least one allocation");
    let foreign = place_alloc(&ts, "n2", None, ClientStatus::Pending).await;
    let mut claim = foreign.clone();
    claim.node_id = "n1".into();
    claim.client_status = ClientStatus::Failed;
    let e = ts
        .endpoints
        .node_update_alloc(AllocUpdateRequest { alloc: vec![claim], secret_id: n.secret_id.clone(), ..Default::default() })
        .await
        .unwrap_err();
    assert!(matches!(e, EndpointError::PermissionDenied(_)), "a node cannot report another node's alloc: {e:?}");
    assert_eq!(ts.store.snapshot().alloc(&foreign.id).unwrap().client_status, ClientStatus::Pending);
}

#[tokio::test]
async fn get_client_allocs_blocks_until_the_nodes_allocs_change() {
    let ts = Arc::new(TestServer::new());
    let n = ready_node(&ts, "n1").await;
    let first = ts
        .endpoints
        .node_get_client_allocs(NodeSpecificRequest { node_id: "n1".into(), secret_id: n.secret_id.clone(), ..Default::default() })
        .await
        .unwrap();
    assert!(first.allocs.is_empty());
    assert!(first.index > 0);
    let waiter = {
        let ts = ts.clone();
        let secret = n.secret_id.clone();
        let min = first.index;
        tokio::spawn(async move {
            ts.endpoints
                .node_get_client_allocs(NodeSpecificRequest {
                    node_id: "n1".into(),
                    secret_id: secret,
                    min_query_index: min,
                    max_query_time: 30_000_000_000,
                })
                .await
        })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    let a = place_alloc(&ts, "n1", None, ClientStatus::Pending).await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await.unwrap().unwrap().unwrap();
    assert_eq!(got.allocs.get(&a.id), Some(&ts.store.snapshot().alloc(&a.id).unwrap().alloc_modify_index));
    assert!(got.index > first.index);
}

mod services {
    use nomad_proto::ServiceRegistration;
    use nomad_proto::rpc::{ServiceRegistrationDeleteByIdRequest, ServiceRegistrationDeleteRequest, ServiceRegistrationUpsertRequest};

    use super::*;

    fn reg(a: &Allocation, name: &str) -> ServiceRegistration {
        ServiceRegistration {
            id: format!("_nomad-task-{}-{name}", a.id),
            service_name: name.into(),
            namespace: a.namespace.clone(),
            node_id: a.node_id.clone(),
            datacenter: "dc1".into(),
            job_id: a.job_id.clone(),
            alloc_id: a.id.clone(),
            tags: vec!["v1".into()],
            address: "127.0.0.1".into(),
            port: 8080,
            ..Default::default()
        }
    }

    async fn register(ts: &TestServer, n: &nomad_proto::Node, regs: Vec<ServiceRegistration>) -> Result<u64, EndpointError> {
        ts.endpoints
            .service_upsert(ServiceRegistrationUpsertRequest { services: regs, node_id: n.id.clone(), secret_id: n.secret_id.clone() })
            .await
            .map(|r| r.index)
    }

    #[tokio::test]
    async fn a_node_registers_only_its_own_allocs_services() {
        let ts = TestServer::new();
        let n1 = ready_node(&ts, "n1").await;
        let n2 = ready_node(&ts, "n2").await;
        let a = place_alloc(&ts, "n1", None, ClientStatus::Running).await;
        register(&ts, &n1, vec![reg(&a, "web")]).await.unwrap();
        assert_eq!(ts.store.snapshot().service_registrations_by_name(Some("default"), "web").count(), 1);
        let e = register(&ts, &n2, vec![reg(&a, "web")]).await.unwrap_err();
        assert!(matches!(e, EndpointError::PermissionDenied(_)), "{e:?}");
        let mut wrong_secret = n1.clone();
        wrong_secret.secret_id = "x".into();
        assert!(matches!(register(&ts, &wrong_secret, vec![reg(&a, "api")]).await, Err(EndpointError::PermissionDenied(_))));
        assert!(matches!(register(&ts, &n1, vec![]).await, Err(EndpointError::BadRequest(_))));
        ts.endpoints
            .service_delete_by_alloc(ServiceRegistrationDeleteRequest {
                alloc_ids: vec![a.id.clone()],
                node_id: "n1".into(),
                secret_id: n1.secret_id.clone(),
            })
            .await
            .unwrap();
        assert_eq!(ts.store.snapshot().service_registrations().count(), 0);
    }

    #[tokio::test]
    async fn registrations_go_when_the_node_goes_down_but_not_when_disconnected() {
        let ts = TestServer::new();
        let n1 = ready_node(&ts, "n1").await;
        let a = place_alloc(&ts, "n1", Some(3_600_000_000_000), ClientStatus::Running).await;
        register(&ts, &n1, vec![reg(&a, "web")]).await.unwrap();
        assert_eq!(ts.endpoints.node_heartbeat_missed("n1").await.unwrap(), NodeStatus::Disconnected);
        assert_eq!(ts.store.snapshot().service_registrations().count(), 1, "kept while disconnected");
        // Expire the window so the next check finds nothing that qualifies.
        let idx = ts.store.snapshot().index + 1;
        ts.store
            .write(idx, |tx| {
                let mut stopped = (**tx.state().alloc(&a.id).unwrap()).clone();
                stopped.desired_status = nomad_proto::DesiredStatus::Stop;
                tx.upsert_allocs_from_plan(vec![stopped]);
                Ok(())
            })
            .unwrap();
        assert_eq!(ts.endpoints.node_heartbeat_missed("n1").await.unwrap(), NodeStatus::Down);
        assert_eq!(ts.store.snapshot().service_registrations().count(), 0, "removed when down");
    }

    #[tokio::test]
    async fn a_finished_alloc_loses_its_registrations() {
        let ts = TestServer::new();
        let n1 = ready_node(&ts, "n1").await;
        let a = place_alloc(&ts, "n1", None, ClientStatus::Running).await;
        register(&ts, &n1, vec![reg(&a, "web")]).await.unwrap();
        let mut done = a.clone();
        done.client_status = ClientStatus::Complete;
        ts.endpoints
            .node_update_alloc(AllocUpdateRequest { alloc: vec![done], secret_id: n1.secret_id.clone(), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(ts.store.snapshot().service_registrations().count(), 0);
    }

    fn by_id(n: &nomad_proto::Node, namespace: &str, id: &str) -> ServiceRegistrationDeleteByIdRequest {
        ServiceRegistrationDeleteByIdRequest {
            id: id.into(),
            namespace: namespace.into(),
            node_id: n.id.clone(),
            secret_id: n.secret_id.clone(),
        }
    }

    #[tokio::test]
    async fn delete_by_id_removes_one_registration_of_the_calling_node_only() {
        let ts = TestServer::new();
        let n1 = ready_node(&ts, "n1").await;
        let n2 = ready_node(&ts, "n2").await;
        let a = place_alloc(&ts, "n1", None, ClientStatus::Running).await;
        let b = place_alloc(&ts, "n2", None, ClientStatus::Running).await;
        let (web, api) = (reg(&a, "web"), reg(&a, "api"));
        register(&ts, &n1, vec![web.clone(), api.clone()]).await.unwrap();
        let other = reg(&b, "web");
        register(&ts, &n2, vec![other.clone()]).await.unwrap();
        let before = ts.store.snapshot().index;
        let mut events = ts.events.subscribe(before + 1);
        let count = || ts.store.snapshot().service_registrations().count();

        let mut wrong_secret = n1.clone();
        wrong_secret.secret_id = "x".into();
        let e = ts.endpoints.service_delete_by_id(by_id(&wrong_secret, "default", &web.id)).await.unwrap_err();
        assert!(matches!(e, EndpointError::PermissionDenied(_)), "{e:?}");
        let e = ts.endpoints.service_delete_by_id(by_id(&n1, "default", &other.id)).await.unwrap_err();
        assert!(matches!(&e, EndpointError::PermissionDenied(m) if m.contains("not on node n1")), "{e:?}");
        let e = ts.endpoints.service_delete_by_id(by_id(&n1, "default", "_nomad-task-nope")).await.unwrap_err();
        assert!(matches!(&e, EndpointError::NotFound(m) if m.contains("_nomad-task-nope")), "{e:?}");
        let e = ts.endpoints.service_delete_by_id(by_id(&n1, "other", &web.id)).await.unwrap_err();
        assert!(matches!(e, EndpointError::NotFound(_)), "the ID is looked up in the request's namespace: {e:?}");
        let e = ts.endpoints.service_delete_by_id(by_id(&n1, "default", "")).await.unwrap_err();
        assert!(matches!(e, EndpointError::BadRequest(_)), "{e:?}");
        assert_eq!(count(), 3, "a refused delete changes nothing");

        ts.endpoints.service_delete_by_id(by_id(&n1, "default", &web.id)).await.unwrap();
        let snap = ts.store.snapshot();
        let left: Vec<&str> = snap.service_registrations().map(|r| r.id.as_str()).collect();
        assert_eq!(left.len(), 2);
        assert!(!left.contains(&web.id.as_str()) && left.contains(&api.id.as_str()) && left.contains(&other.id.as_str()));

        // Exactly one event, a deregistration of that service.
        let next = async {
            loop {
                let b = events.next().await.unwrap();
                if b.index > before {
                    return b;
                }
            }
        };
        let batch = tokio::time::timeout(std::time::Duration::from_secs(10), next).await.unwrap();
        assert_eq!(batch.index, ts.store.snapshot().index, "the delete is the only write since");
        assert_eq!(batch.events.len(), 1);
        assert_eq!((batch.events[0].topic.as_str(), batch.events[0].event_type.as_str()), ("Service", "ServiceDeregistration"));
        assert_eq!(batch.events[0].key, web.id);
    }
}
