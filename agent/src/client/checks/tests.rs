use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::any;
use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources};
use nomad_proto::service::ServiceCheck;
use nomad_proto::{Allocation, Job, Node, Service, Task, TaskGroup};
use tokio_util::sync::CancellationToken;

use super::runner::AllocChecks;
use super::*;
use crate::client::state::StateDb;

const S: i64 = 1_000_000_000;

fn http_check(path: &str) -> ServiceCheck {
    ServiceCheck {
        name: "web-health".into(),
        check_type: "http".into(),
        path: path.into(),
        interval: S,
        timeout: 2 * S,
        on_update: "require_healthy".into(),
        task_name: "web".into(),
        ..ServiceCheck::default()
    }
}

/// An alloc whose task `web` has a Nomad service on port label `http` = `port`, with `checks`;
/// and a group service with a tcp check.
fn alloc(port: u16, checks: Vec<ServiceCheck>) -> Allocation {
    let service = Service { name: "web".into(), port_label: "http".into(), provider: "nomad".into(), checks, ..Service::default() };
    let group_check = ServiceCheck { name: "alive".into(), check_type: "tcp".into(), interval: S, timeout: S, ..ServiceCheck::default() };
    let group_service = Service {
        name: "grp".into(),
        port_label: "http".into(),
        provider: "nomad".into(),
        checks: vec![group_check],
        ..Service::default()
    };
    let task = Task { name: "web".into(), driver: "raw_exec".into(), services: vec![service], ..Task::default() };
    let group = TaskGroup { name: "g".into(), tasks: vec![task], services: vec![group_service], ..TaskGroup::default() };
    let job = Job { id: "j".into(), task_groups: vec![group], ..Job::default() };
    let mut resources = AllocatedResources::default();
    resources.shared.ports =
        vec![AllocatedPortMapping { label: "http".into(), value: i64::from(port), to: 0, host_ip: "127.0.0.1".into() }];
    Allocation {
        id: "a1".into(),
        name: "j.g[0]".into(),
        task_group: "g".into(),
        job: Some(Arc::new(job)),
        allocated_resources: Some(resources),
        ..Allocation::default()
    }
}

fn node() -> Node {
    let mut n = Node::default();
    n.attributes.insert("unique.network.ip-address".into(), "127.0.0.1".into());
    n
}

/// What the test server saw of the last request.
#[derive(Default, Clone)]
struct Seen {
    method: String,
    headers: HeaderMap,
    body: String,
}

async fn server() -> (u16, Arc<Mutex<Option<Seen>>>) {
    let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
    let record = seen.clone();
    let app = Router::new()
        .route("/ok", any(|| async { "fine" }))
        .route("/moved", any(|| async { (StatusCode::NO_CONTENT, "") }))
        .route("/missing", any(|| async { (StatusCode::NOT_FOUND, "not here") }))
        .route("/big", any(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "x".repeat(10_000)) }))
        .route(
            "/echo",
            any(move |method: axum::http::Method, headers: HeaderMap, body: String| {
                let record = record.clone();
                async move {
                    *record.lock().unwrap() = Some(Seen { method: method.to_string(), headers, body });
                    "ok"
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(axum::serve(listener, app).into_future());
    (port, seen)
}

fn check_of(a: &Allocation, name: &str) -> NomadCheck {
    alloc_checks(a).into_values().find(|c| c.check.name == name).unwrap()
}

#[test]
fn results_have_nomads_shape() {
    let a = alloc(8080, vec![http_check("/ok")]);
    let checks = alloc_checks(&a);
    assert_eq!(checks.len(), 2, "the task service's and the group service's");
    let web = check_of(&a, "web-health");
    assert_eq!(web.id, web.check.nomad_check_id("a1", "g"));
    let stub = web.stub(1_690_000_000);
    let json = serde_json::to_value(&stub).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"ID": web.id, "Mode": "healthiness", "Status": "pending", "Output": "nomad: waiting to run",
            "Timestamp": 1_690_000_000, "Group": "j.g[0]", "Task": "web", "Service": "web", "Check": "web-health"}),
        "StatusCode is left out while zero"
    );
    let alive = check_of(&a, "alive");
    let mut ready = alive.check.clone();
    ready.on_update = "ignore".into();
    let r = NomadCheck { check: ready, ..alive }.result(CheckStatus::Success, 200, "nomad: http ok".into(), 5);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["Mode"], "readiness");
    assert_eq!(json["StatusCode"], 200);
    assert!(json.get("Task").is_none(), "a group service has no task: {json}");
}

#[test]
fn health_counts_success_and_readiness_failures_never_pending() {
    let a = alloc(8080, vec![http_check("/ok")]);
    let expected = alloc_checks(&a);
    let mut results: AllocResults =
        expected.values().map(|c| (c.id.clone(), c.result(CheckStatus::Success, 0, String::new(), 0))).collect();
    assert!(nomad_checks_pass(&expected, Some(&results)));
    assert!(!nomad_checks_pass(&expected, None), "no results yet");
    let web = check_of(&a, "web-health");
    results.insert(web.id.clone(), web.result(CheckStatus::Failure, 500, String::new(), 0));
    assert!(!nomad_checks_pass(&expected, Some(&results)), "a healthiness failure");
    let mut readiness = web.clone();
    readiness.check.on_update = "ignore".into();
    results.insert(web.id.clone(), readiness.result(CheckStatus::Failure, 500, String::new(), 0));
    assert!(nomad_checks_pass(&expected, Some(&results)), "a readiness failure passes");
    results.insert(web.id.clone(), readiness.stub(0));
    assert!(!nomad_checks_pass(&expected, Some(&results)), "pending never passes");
}

#[tokio::test]
async fn tcp_probes_dial() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let a = alloc(port, vec![]);
    let r = probe::run(&check_of(&a, "alive"), &a, &node()).await;
    assert_eq!((r.status, r.output.as_str(), r.status_code), (CheckStatus::Success, "nomad: tcp ok", 0));
    drop(listener);
    let r = probe::run(&check_of(&a, "alive"), &a, &node()).await;
    assert_eq!(r.status, CheckStatus::Failure);
    assert!(r.output.starts_with(&format!("dial tcp 127.0.0.1:{port}: ")), "{}", r.output);
}

#[tokio::test]
async fn http_probes_judge_the_status_code_and_keep_3_kib_of_the_body() {
    let (port, seen) = server().await;
    let node = node();
    let run = |path: &str| {
        let a = alloc(port, vec![http_check(path)]);
        let c = check_of(&a, "web-health");
        let node = node.clone();
        async move { probe::run(&c, &a, &node).await }
    };
    let r = run("/ok").await;
    assert_eq!((r.status, r.status_code, r.output.as_str()), (CheckStatus::Success, 200, "nomad: http ok"));
    let r = run("/moved").await;
    assert_eq!((r.status, r.status_code, r.output.as_str()), (CheckStatus::Success, 204, ""), "below 400 passes");
    let r = run("/missing").await;
    assert_eq!((r.status, r.status_code, r.output.as_str()), (CheckStatus::Failure, 404, "not here"));
    let r = run("/big").await;
    assert_eq!((r.status, r.status_code), (CheckStatus::Failure, 500));
    assert_eq!(r.output, "x".repeat(probe::OUTPUT_LIMIT), "the first 3 KiB of the body");

    // Method, headers (Host included), body and the default User-Agent.
    let mut c = http_check("/echo?x=1");
    c.method = "POST".into();
    c.body = "ping".into();
    c.header = BTreeMap::from([("Host".to_string(), vec!["web.example".to_string()]), ("X-A".to_string(), vec!["1".into(), "2".into()])]);
    let a = alloc(port, vec![c]);
    let r = probe::run(&check_of(&a, "web-health"), &a, &node).await;
    assert_eq!(r.status, CheckStatus::Success, "{}", r.output);
    let seen = seen.lock().unwrap().clone().expect("the request arrived");
    assert_eq!((seen.method.as_str(), seen.body.as_str()), ("POST", "ping"));
    assert_eq!(seen.headers["host"], "web.example");
    assert_eq!(seen.headers.get_all("x-a").iter().collect::<Vec<_>>(), ["1", "2"]);
    assert_eq!(seen.headers["user-agent"].to_str().unwrap(), probe::user_agent());
    assert!(probe::user_agent().starts_with("nomad-rs/"));

    // Nothing listening: a failure saying why.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let a = alloc(closed_port, vec![http_check("/ok")]);
    let r = probe::run(&check_of(&a, "web-health"), &a, &node).await;
    assert_eq!((r.status, r.status_code), (CheckStatus::Failure, 0));
    assert!(r.output.starts_with("nomad: GET \"http://127.0.0.1:"), "{}", r.output);
    // A port label that names nothing: a failure naming it.
    let mut c = http_check("/ok");
    c.port_label = "nope".into();
    let a = alloc(port, vec![c]);
    let r = probe::run(&check_of(&a, "web-health"), &a, &node).await;
    assert_eq!(r.status, CheckStatus::Failure);
    assert!(r.output.contains("\"nope\""), "{}", r.output);
}

#[tokio::test]
async fn an_http_probe_past_its_timeout_fails() {
    // A server that accepts and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let mut c = http_check("/ok");
    c.timeout = S;
    let a = alloc(port, vec![c]);
    let r = probe::run(&check_of(&a, "web-health"), &a, &node()).await;
    assert_eq!(r.status, CheckStatus::Failure);
    assert!(r.output.ends_with("context deadline exceeded"), "{}", r.output);
    held.abort();
}

#[test]
fn the_store_persists_status_changes_and_pending_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let a = alloc(8080, vec![http_check("/ok")]);
    let web = check_of(&a, "web-health");
    {
        let db = Arc::new(StateDb::open(dir.path()).unwrap());
        let store = CheckStore::restore(db.clone());
        assert_eq!(store.alloc_results("a1"), None);
        store.set("a1", web.stub(1));
        store.set("a1", web.result(CheckStatus::Success, 200, "nomad: http ok".into(), 2));
        // Same status, newer output: kept in memory, not written.
        store.set("a1", web.result(CheckStatus::Success, 200, "newer".into(), 3));
        assert_eq!(store.alloc_results("a1").unwrap()[&web.id].output, "newer");
        let stored = db.check_results::<CheckQueryResult>().unwrap();
        assert_eq!(stored["a1"][&web.id].output, "nomad: http ok", "written only when the status changed");
        // A stub after a result changes nothing.
        store.set("a1", web.stub(4));
        assert_eq!(store.alloc_results("a1").unwrap()[&web.id].status, CheckStatus::Success);
        assert_eq!(store.snapshot(), BTreeMap::from([(web.id.clone(), "success".to_string())]));
    }
    // Reopened (an agent restart): the result is back, and a stub does not hide it.
    let db = Arc::new(StateDb::open(dir.path()).unwrap());
    let store = CheckStore::restore(db.clone());
    assert_eq!(store.alloc_results("a1").unwrap()[&web.id].status, CheckStatus::Success);
    store.set("a1", web.stub(5));
    assert_eq!(store.alloc_results("a1").unwrap()[&web.id].output, "nomad: http ok");
    // Removed and purged: gone from memory and disk.
    store.set("a1", check_of(&a, "alive").stub(6));
    assert_eq!(store.difference("a1", std::slice::from_ref(&web.id)), [check_of(&a, "alive").id]);
    store.remove("a1", std::slice::from_ref(&web.id));
    assert_eq!(store.alloc_results("a1").unwrap().len(), 1);
    store.purge("a1");
    assert_eq!(store.alloc_results("a1"), None);
    assert!(db.check_results::<CheckQueryResult>().unwrap().is_empty());
}

#[tokio::test]
async fn observers_run_each_check_and_updates_diff_them_by_id() {
    let (port, _) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let store = CheckStore::restore(Arc::new(StateDb::open(dir.path()).unwrap()));
    let a = Arc::new(alloc(port, vec![http_check("/ok")]));
    let node = Arc::new(node());
    let checks = AllocChecks::new(a.clone(), store.clone(), Arc::new(move || node.clone()), Arc::new(|| None), CancellationToken::new());
    checks.sync(a.clone());
    assert_eq!(checks.len(), 2);
    let results = store.alloc_results("a1").unwrap();
    assert!(results.values().all(|r| r.status == CheckStatus::Pending && r.output == "nomad: waiting to run"), "{results:?}");
    // The first runs come at interval/2 (0.5 s).
    nomad_testkit::wait_until("both checks pass", || {
        store.alloc_results("a1").is_some_and(|r| r.values().all(|c| c.status == CheckStatus::Success))
    })
    .await;
    let results = store.alloc_results("a1").unwrap();
    assert_eq!(results[&check_of(&a, "web-health").id].output, "nomad: http ok");
    assert_eq!(results[&check_of(&a, "alive").id].output, "nomad: tcp ok");

    // An update without the task's check: its observer and result go; the other stays.
    let mut job = (**a.job.as_ref().unwrap()).clone();
    job.task_groups[0].tasks[0].services[0].checks.clear();
    let updated = Arc::new(Allocation { job: Some(Arc::new(job)), ..(*a).clone() });
    checks.sync(updated);
    assert_eq!(checks.len(), 1);
    assert_eq!(store.alloc_results("a1").unwrap().keys().collect::<Vec<_>>(), [&check_of(&a, "alive").id]);
    checks.stop();
    assert!(checks.is_empty());
}
