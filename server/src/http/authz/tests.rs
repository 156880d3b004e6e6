//! The authorization table against the real router, with every kind of caller.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::any;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::{AllocFacts, Need, NsFrom, ROWS, decide, path_matches, row_for};
use crate::acl::{AclConfig, AclToken, CLIENT};
use crate::fsm::Command;
use crate::testing::{TestServer, job, node};

struct Reply {
    status: StatusCode,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// The agent's client routes (`agent/src/client/http/mod.rs`) as axum spells them, but for its
/// catch-all (404 to anyone). Here each answers 200 behind the same middleware, so a walk sees
/// exactly what the table decides.
const CLIENT_ROUTE_PATHS: &[&str] = &[
    "/v1/client/fs/logs/{alloc_id}",
    "/v1/client/allocation/{alloc_id}/restart",
    "/v1/client/allocation/{alloc_id}/stats",
    "/v1/client/allocation/{alloc_id}/checks",
    "/v1/client/allocation/{alloc_id}/signal",
    "/v1/client/allocation/{alloc_id}/exec",
    "/v1/client/allocation/{alloc_id}/gc",
    "/v1/client/gc",
    "/v1/client/stats",
    "/v1/client/fs/ls/{alloc_id}",
    "/v1/client/fs/stat/{alloc_id}",
    "/v1/client/fs/cat/{alloc_id}",
    "/v1/client/fs/readat/{alloc_id}",
    "/v1/client/fs/stream/{alloc_id}",
];

/// The agent-wide routes (`http/agent_local.rs`) the server's router does not serve.
fn local_only() -> impl Iterator<Item = &'static str> {
    crate::http::agent_local::LOCAL_ROUTE_PATHS.iter().copied().filter(|p| !crate::http::ROUTE_PATHS.contains(p))
}

fn local_served(path: &str) -> bool {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    local_only().any(|p| p == path)
}

/// The client routes and the agent-wide ones, each answering 200 behind the middleware.
fn client_router(ts: &TestServer) -> Router {
    let mut r = Router::new();
    for p in CLIENT_ROUTE_PATHS.iter().copied().chain(local_only()) {
        r = r.route(p, any(|| async { "ok" }));
    }
    r.route_layer(axum::middleware::from_fn_with_state(ts.endpoints.clone(), super::authorize))
}

fn client_served(path: &str) -> bool {
    CLIENT_ROUTE_PATHS.iter().any(|p| path_matches(&p.replace("{alloc_id}", ":id"), path))
}

/// Allocs in namespaces `default` and `a` (an isolated driver: exec needs `alloc-exec` only),
/// and one of `a` running raw_exec (exec needs `alloc-node-exec` too).
fn seed_allocs(ts: &TestServer) {
    let mut isolated = job("x", 1);
    isolated.task_groups[0].tasks[0].driver = "docker".into();
    for (id, ns, j) in [("alloc-default", "default", &isolated), ("alloc-a", "a", &isolated), ("alloc-raw-a", "a", &job("x", 1))] {
        let alloc = nomad_proto::Allocation {
            id: id.into(),
            namespace: ns.into(),
            node_id: "n1".into(),
            job_id: "x".into(),
            job: Some(std::sync::Arc::new(j.clone())),
            task_group: "web".into(),
            ..Default::default()
        };
        ts.store
            .write(ts.store.snapshot().index + 1, |txn| {
                txn.upsert_allocs_from_plan(vec![alloc]);
                Ok(())
            })
            .unwrap();
    }
}

/// Sends a request; the body is read only when `read_body` (a stream never ends).
async fn send(ts: &TestServer, method: Method, path: &str, token: Option<&str>, body: String, read_body: bool) -> Reply {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        b = b.header("X-Nomad-Token", t);
    }
    // A guard, not a synchronisation: a handler that never answers fails the test instead of hanging it.
    let router = if path.starts_with("/v1/client/") || local_served(path) { client_router(ts) } else { ts.router() };
    let resp = tokio::time::timeout(std::time::Duration::from_secs(30), router.oneshot(b.body(Body::from(body)).unwrap()))
        .await
        .expect("the router answers")
        .unwrap();
    let status = resp.status();
    let body = if read_body || status == StatusCode::FORBIDDEN {
        String::from_utf8_lossy(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).into_owned()
    } else {
        String::new()
    };
    Reply { status, body }
}

async fn call(ts: &TestServer, method: Method, path: &str, token: Option<&str>, body: Value) -> Reply {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    send(ts, method, path, token, body, true).await
}

fn acl_server() -> TestServer {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
    ts
}

async fn bootstrap(ts: &TestServer) -> AclToken {
    let r = call(ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

async fn policy(ts: &TestServer, mgmt: &str, name: &str, rules: &str) {
    let r = call(ts, Method::PUT, &format!("/v1/acl/policy/{name}"), Some(mgmt), json!({"Name": name, "Rules": rules})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

async fn token(ts: &TestServer, mgmt: &str, policies: &[&str], ttl: Option<&str>) -> Reply {
    let mut body = json!({"Name": "t", "Type": "client", "Policies": policies});
    if let Some(ttl) = ttl {
        body["ExpirationTTL"] = json!(ttl);
    }
    call(ts, Method::POST, "/v1/acl/token", Some(mgmt), body).await
}

async fn client_token(ts: &TestServer, mgmt: &str, policies: &[&str]) -> String {
    let r = token(ts, mgmt, policies, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.json()["SecretID"].as_str().unwrap().to_string()
}

/// A token that expired a minute ago, written straight through the FSM (the API refuses such TTLs).
async fn expired_token(ts: &TestServer) -> String {
    let now = nomad_proto::Timestamp::now();
    let t = AclToken {
        accessor_id: uuid::Uuid::new_v4().to_string(),
        secret_id: uuid::Uuid::new_v4().to_string(),
        token_type: CLIENT.into(),
        policies: vec!["read".into()],
        create_time: now.add_nanos(-120_000_000_000),
        expiration_time: Some(now.add_nanos(-60_000_000_000)),
        ..AclToken::default()
    };
    ts.endpoints.consensus().apply(Command::AclTokenUpsert { tokens: vec![t.clone()] }).await.unwrap();
    t.secret_id
}

const READ_RULES: &str = r#"
namespace "default" { policy = "read" }
node { policy = "read" }
agent { policy = "read" }
plugin { policy = "read" }
"#;
const WRITE_A_RULES: &str = r#"namespace "a" { policy = "write" }"#;

/// `policy = "read"` and `policy = "write"` as the reference's table expands them.
fn read_cap(c: &str) -> bool {
    crate::acl::NAMESPACE_READ.contains(&c)
}

fn write_cap(c: &str) -> bool {
    read_cap(c) || crate::acl::NAMESPACE_WRITE_EXTRA.contains(&c)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Anonymous,
    Read,
    WriteA,
    Management,
    Expired,
}

/// What the reference says each caller may do, written out per caller (not derived from `Acl`).
/// `exact`: the path names a known alloc of namespace `ns` (else an unknown alloc, which passes
/// if any namespace allows).
fn expect_allowed(who: Who, need: Need, method: &Method, pattern: &str, ns: &str, exact: bool) -> bool {
    let open = matches!(need, Need::Public | Need::Handler);
    match who {
        Who::Management => true,
        Who::Expired => open,
        // Reading a token by accessor: management or the token itself (the sample is management's).
        _ if *method == Method::GET && pattern == "/v1/acl/token/:accessor" => false,
        // The namespace list is open to any token; it shows only the namespaces the token may use.
        // Variable lists answer 200 with what the token may list (nothing here); a single
        // variable needs a `variables` rule, which no policy of the walk has.
        _ if need == Need::Variable => pattern == "/v1/vars" && who != Who::Expired,
        // Search answers whoever can read something of what it searches (here: every context):
        // `read` (its namespace and nodes), `write-a` in its namespace only.
        _ if need == Need::Search => who == Who::Read || (who == Who::WriteA && ns == "a"),
        Who::Anonymous => open || need == Need::AnyToken || pattern == "/v1/namespaces",
        Who::Read => match need {
            Need::Public | Need::Handler | Need::AnyToken => true,
            Need::Node(w) | Need::Agent(w) => !w,
            Need::NodeAllocs => true,
            Need::PluginList | Need::PluginRead => true,
            Need::NsAny => pattern == "/v1/namespaces",
            Need::Ns(caps, from) => {
                let ns = if matches!(from, NsFrom::Alloc(_) | NsFrom::Response) && !exact { "default" } else { ns };
                ns == "default" && caps.iter().any(|c| read_cap(c))
            }
            Need::AllocExec => ns == "default" && read_cap("alloc-exec"),
            // The walk asks for every topic (`*`): management only.
            Need::EventStream | Need::Operator(_) | Need::Management | Need::Variable | Need::Search => false,
        },
        Who::WriteA => match need {
            Need::Public | Need::Handler | Need::AnyToken => true,
            Need::NsAny => pattern == "/v1/namespaces",
            Need::Ns(caps, from) => {
                let ns = if matches!(from, NsFrom::Alloc(_) | NsFrom::Response) && !exact { "a" } else { ns };
                ns == "a" && caps.iter().any(|c| write_cap(c))
            }
            // The walk's allocs use an isolated driver: `alloc-node-exec` is not needed.
            Need::AllocExec => ns == "a" && write_cap("alloc-exec"),
            _ => false,
        },
    }
}

fn sample_path(pattern: &str, mgmt_accessor: &str, method: &Method) -> String {
    pattern
        .split('/')
        .map(|seg| match seg {
            ":name" => "anonymous".to_string(),
            ":op" => "ls".to_string(),
            ":accessor" if *method == Method::GET => mgmt_accessor.to_string(),
            s if s.starts_with(':') || s == "*" => "x".to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn methods_of(m: super::M) -> Vec<Method> {
    match m {
        super::M::Any => vec![Method::GET, Method::PUT, Method::DELETE],
        super::M::Get => vec![Method::GET],
        super::M::Write => vec![Method::PUT, Method::POST],
        super::M::Delete => vec![Method::DELETE],
    }
}

/// A route pattern as axum spells it, with its catch-all filled in.
fn served(path: &str) -> bool {
    crate::http::ROUTE_PATHS.iter().any(|p| match p.strip_suffix("{*rest}") {
        Some(prefix) => path.starts_with(prefix) && path.len() > prefix.len(),
        None => *p == path,
    })
}

#[test]
fn every_router_route_has_a_row() {
    for p in crate::http::ROUTE_PATHS {
        // The ACL routes are one catch-all; `policies` stands for them (each has its own row below).
        let sample = match *p {
            "/v1/acl/{*rest}" => "/v1/acl/policies".to_string(),
            "/v1/operator/keyring/{*rest}" => "/v1/operator/keyring/keys".to_string(),
            _ => p.replace("{*rest}", "x"),
        };
        let covered = [Method::GET, Method::PUT, Method::POST, Method::DELETE].iter().any(|m| row_for(m, &sample).is_some());
        assert!(covered, "route {p} has no row in authz::ROWS");
    }
    // The sub-routes the catch-all handlers serve, each with the method it takes.
    for (m, path) in [
        (Method::GET, "/v1/job/web/allocations"),
        (Method::GET, "/v1/job/web/evaluations"),
        (Method::GET, "/v1/job/web/summary"),
        (Method::PUT, "/v1/job/web/plan"),
        (Method::DELETE, "/v1/job/web"),
        (Method::PUT, "/v1/allocation/abc/stop"),
        (Method::PUT, "/v1/node/n1/eligibility"),
        (Method::PUT, "/v1/node/n1/drain"),
        (Method::PUT, "/v1/node/n1/purge"),
        (Method::GET, "/v1/node/n1/allocations"),
        (Method::PUT, "/v1/volume/csi/v1/create"),
        (Method::DELETE, "/v1/plugin/csi/p1"),
        (Method::GET, "/v1/acl/role/name/ops"),
        (Method::PUT, "/v1/acl/bootstrap"),
        (Method::GET, "/v1/acl/token/self"),
        (Method::POST, "/v1/acl/token"),
        (Method::DELETE, "/v1/acl/policy/p"),
        (Method::GET, "/v1/client/fs/logs/abc"),
        (Method::PUT, "/v1/client/allocation/abc/restart"),
        (Method::GET, "/v1/client/fs/cat/abc"),
        (Method::GET, "/v1/client/allocation/abc/exec"),
    ] {
        assert!(row_for(&m, path).is_some(), "{m} {path} has no row");
    }
    // Every client and agent-wide route the agent serves has a row, with the method its handler takes.
    for p in CLIENT_ROUTE_PATHS.iter().chain(crate::http::agent_local::LOCAL_ROUTE_PATHS) {
        let sample = p.replace("{alloc_id}", "abc");
        let covered = [Method::GET, Method::PUT, Method::POST, Method::DELETE].iter().any(|m| row_for(m, &sample).is_some());
        assert!(covered, "client route {p} has no row in authz::ROWS");
    }
    // Every row's pattern is served by some route (or is the agent's health route).
    for r in ROWS {
        let sample = r.pattern.replace(":name", "x").replace(":accessor", "x").replace(":id", "x").replace(":op", "ls").replace('*', "x");
        assert!(
            served(&sample) || client_served(&sample) || local_served(&sample) || sample == "/v1/agent/health",
            "row {} serves nothing",
            r.pattern
        );
    }
    // Default deny: a method no row lists.
    assert!(row_for(&Method::PATCH, "/v1/jobs").is_none());
}

#[tokio::test]
async fn table_walk_with_every_kind_of_caller() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    policy(&ts, &mgmt.secret_id, "read", READ_RULES).await;
    policy(&ts, &mgmt.secret_id, "write-a", WRITE_A_RULES).await;
    let read = client_token(&ts, &mgmt.secret_id, &["read"]).await;
    let write_a = client_token(&ts, &mgmt.secret_id, &["write-a"]).await;
    let expired = expired_token(&ts).await;
    seed_allocs(&ts);
    let callers: [(Who, Option<&str>); 5] = [
        (Who::Anonymous, None),
        (Who::Read, Some(&read)),
        (Who::WriteA, Some(&write_a)),
        (Who::Management, Some(&mgmt.secret_id)),
        (Who::Expired, Some(&expired)),
    ];
    let mut checked = 0;
    for row in ROWS {
        for method in methods_of(row.method) {
            let path = sample_path(row.pattern, &mgmt.accessor_id, &method);
            let client = client_served(&path);
            if !served(&path) && !client && !local_served(&path) {
                continue;
            }
            for ns in ["default", "a"] {
                // A client route names the alloc of this namespace (the only `x` left in it).
                let exact = client && row.pattern.contains(":id");
                let path = if exact { path.replacen("/x", &format!("/alloc-{ns}"), 1) } else { path.clone() };
                let mut j = serde_json::to_value(job("x", 1)).unwrap();
                j["Namespace"] = json!(ns);
                let body = if method == Method::GET || method == Method::DELETE { String::new() } else { json!({"Job": j}).to_string() };
                let sep = if path.contains('?') { '&' } else { '?' };
                let uri = format!("{path}{sep}namespace={ns}");
                for (who, tok) in callers {
                    let r = send(&ts, method.clone(), &uri, tok, body.clone(), false).await;
                    let want = expect_allowed(who, row.need, &method, row.pattern, ns, exact);
                    if want {
                        assert_ne!(r.status, StatusCode::FORBIDDEN, "{who:?} {method} {uri}: {}", r.body);
                    } else {
                        assert_eq!(r.status, StatusCode::FORBIDDEN, "{who:?} {method} {uri} should be refused");
                        let text = if who == Who::Expired { "ACL token expired" } else { "Permission denied" };
                        assert_eq!(r.body, text, "{who:?} {method} {uri}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 400, "walked {checked} requests");
}

#[tokio::test]
async fn secrets_that_are_not_tokens_are_refused() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    let n = ts.register_node(node("n1")).await;
    let r = call(&ts, Method::GET, "/v1/nodes", Some(&n.secret_id), Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::FORBIDDEN, "Permission denied"), "a node SecretID is no HTTP token");
    let r = call(&ts, Method::GET, "/v1/nodes", Some(&uuid::Uuid::new_v4().to_string()), Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::FORBIDDEN, "ACL token not found"));
    // `Authorization: Bearer` carries a token too.
    let req =
        Request::builder().uri("/v1/nodes").header("Authorization", format!("bearer {}", mgmt.secret_id)).body(Body::empty()).unwrap();
    assert_eq!(ts.router().oneshot(req).await.unwrap().status(), StatusCode::OK);
    // Anonymous gets what the `anonymous` policy grants, once an operator writes one.
    assert_eq!(call(&ts, Method::GET, "/v1/nodes", None, Value::Null).await.status, StatusCode::FORBIDDEN);
    policy(&ts, &mgmt.secret_id, "anonymous", r#"node { policy = "read" }"#).await;
    assert_eq!(call(&ts, Method::GET, "/v1/nodes", None, Value::Null).await.status, StatusCode::OK);
    let r = call(&ts, Method::GET, "/v1/acl/policy/anonymous", None, Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "anyone may read the anonymous policy");
}

#[tokio::test]
async fn all_namespaces_lists_keep_only_readable_objects() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    let r = call(&ts, Method::PUT, "/v1/namespace/a", Some(&mgmt.secret_id), json!({"Name": "a"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    for ns in ["default", "a"] {
        let mut j = serde_json::to_value(job(&format!("job-{ns}"), 1)).unwrap();
        j["Namespace"] = json!(ns);
        let r = call(&ts, Method::PUT, "/v1/jobs", Some(&mgmt.secret_id), json!({"Job": j})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    policy(&ts, &mgmt.secret_id, "write-a", WRITE_A_RULES).await;
    let tok = client_token(&ts, &mgmt.secret_id, &["write-a"]).await;
    // A node reader sees a node's allocs only in namespaces it may read jobs in.
    let n = ts.register_node(node("n1")).await;
    for (id, ns) in [("a1", "default"), ("a2", "a")] {
        let alloc = nomad_proto::Allocation {
            id: id.into(),
            namespace: ns.into(),
            node_id: n.id.clone(),
            job_id: format!("job-{ns}"),
            task_group: "web".into(),
            ..Default::default()
        };
        ts.store
            .write(ts.store.snapshot().index + 1, |txn| {
                txn.upsert_allocs_from_plan(vec![alloc]);
                Ok(())
            })
            .unwrap();
    }
    policy(&ts, &mgmt.secret_id, "node-a", "node { policy = \"read\" }\nnamespace \"a\" { policy = \"read\" }").await;
    let node_reader = client_token(&ts, &mgmt.secret_id, &["node-a"]).await;
    let allocs = call(&ts, Method::GET, "/v1/node/n1/allocations", Some(&node_reader), Value::Null).await;
    assert_eq!(allocs.status, StatusCode::OK, "{}", allocs.body);
    let ids: Vec<String> = allocs.json().as_array().unwrap().iter().map(|a| a["ID"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, ["a2"]);

    let list = call(&ts, Method::GET, "/v1/jobs?namespace=*", Some(&tok), Value::Null).await;
    assert_eq!(list.status, StatusCode::OK);
    let ids: Vec<String> = list.json().as_array().unwrap().iter().map(|j| j["ID"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, ["job-a"]);
    let all = call(&ts, Method::GET, "/v1/jobs?namespace=*", Some(&mgmt.secret_id), Value::Null).await;
    assert_eq!(all.json().as_array().unwrap().len(), 2);
    let nss = call(&ts, Method::GET, "/v1/namespaces", Some(&tok), Value::Null).await;
    let names: Vec<String> = nss.json().as_array().unwrap().iter().map(|n| n["Name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["a"]);
    // Writes in a namespace the token cannot write.
    let mut j = serde_json::to_value(job("sneaky", 1)).unwrap();
    j["Namespace"] = json!("default");
    let r = call(&ts, Method::PUT, "/v1/jobs", Some(&tok), json!({"Job": j})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Checked in one namespace, written in another: the query and the request's own
    // `Namespace` take precedence over the job's in the handler, so each is checked.
    j["Namespace"] = json!("a");
    for (path, body) in [
        ("/v1/jobs?namespace=default", json!({"Job": j})),
        ("/v1/jobs", json!({"Job": j, "Namespace": "default"})),
        ("/v1/job/sneaky?namespace=default", json!({"Job": j})),
        ("/v1/job/sneaky/plan?namespace=default", json!({"Job": j})),
        ("/v1/jobs?namespace=*", json!({"Job": j})),
        // CVE-2024-10975: a volume is written in its own namespace, not the request's.
        ("/v1/volume/csi/v?namespace=a", json!({"Volumes": [{"ID": "v", "Namespace": "default"}]})),
        ("/v1/volume/csi/v/create?namespace=a", json!({"Volumes": [{"ID": "v", "Namespace": "a"}, {"ID": "w", "Namespace": "default"}]})),
    ] {
        let r = call(&ts, Method::PUT, path, Some(&tok), body.clone()).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path} {body}: {}", r.body);
    }
    let r = call(&ts, Method::DELETE, "/v1/job/job-default?namespace=*", Some(&tok), Value::Null).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert!(ts.store.snapshot().job("default", "sneaky").is_none());
    // A volume naming no namespace is written in the request's: allowed in `a` (the handler then
    // refuses it for want of a plugin, which is not the authorization's business).
    let r = call(&ts, Method::PUT, "/v1/volume/csi/v?namespace=a", Some(&tok), json!({"Volumes": [{"ID": "v"}]})).await;
    assert_ne!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = call(&ts, Method::PUT, "/v1/volume/csi/v", Some(&tok), json!({"Volumes": [{"ID": "v"}]})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "a volume naming no namespace goes to the default one");
    // Named consistently, the write in its own namespace passes.
    let r = call(&ts, Method::PUT, "/v1/jobs?namespace=a", Some(&tok), json!({"Job": j, "Namespace": "a"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn acls_off_change_nothing_and_acl_routes_say_so() {
    let ts = TestServer::new();
    assert_eq!(call(&ts, Method::GET, "/v1/jobs", None, Value::Null).await.status, StatusCode::OK);
    let r = call(&ts, Method::GET, "/v1/acl/policies", None, Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::BAD_REQUEST, "ACL support disabled"));
    let r = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::BAD_REQUEST, "ACL support disabled"));
}

#[tokio::test]
async fn bootstrap_once_then_reset_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let reset = dir.path().join("acl-bootstrap-reset");
    let mut ts = TestServer::new();
    ts.endpoints =
        ts.endpoints.clone().with_acl(AclConfig { enabled: true, bootstrap_reset_file: Some(reset.clone()), ..AclConfig::default() });
    let first = bootstrap(&ts).await;
    assert_eq!((first.name.as_str(), first.token_type.as_str(), first.global), ("Bootstrap Token", "management", true));
    let n = ts.store.snapshot().acl_bootstrap_index();
    assert_eq!(first.create_index, n);
    let again = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!((again.status, again.body), (StatusCode::BAD_REQUEST, format!("ACL bootstrap already done (reset index: {n})")));
    std::fs::write(&reset, format!("{}\n", n + 7)).unwrap();
    let wrong = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    assert_eq!(wrong.body, format!("Invalid bootstrap reset index (specified {}, reset index: {n})", n + 7));
    std::fs::write(&reset, n.to_string()).unwrap();
    let secret = uuid::Uuid::new_v4().to_string();
    let r = call(&ts, Method::POST, "/v1/acl/bootstrap", None, json!({"BootstrapSecret": secret})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["SecretID"], secret.as_str());
    // The file is single-use: the index moved on.
    let r = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await;
    assert!(r.body.starts_with("Invalid bootstrap reset index"), "{}", r.body);
    let r = call(&ts, Method::POST, "/v1/acl/bootstrap", None, json!({"BootstrapSecret": "nope"})).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::BAD_REQUEST, "invalid acl token"));
}

#[tokio::test]
async fn tokens_policies_and_roles_round_trip() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    let m = Some(mgmt.secret_id.as_str());
    // Policies: bad rules, name mismatch, read back.
    let r = call(&ts, Method::PUT, "/v1/acl/policy/p", m, json!({"Name": "p", "Rules": "namespace { policy = \"read\" }"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.starts_with("Failed to parse ACL Policy: "), "{}", r.body);
    let r = call(&ts, Method::PUT, "/v1/acl/policy/p", m, json!({"Name": "q", "Rules": READ_RULES})).await;
    assert_eq!(r.body, "ACL policy name does not match request path");
    policy(&ts, &mgmt.secret_id, "p", READ_RULES).await;
    let p = call(&ts, Method::GET, "/v1/acl/policy/p", m, Value::Null).await.json();
    assert_eq!(p["Rules"], READ_RULES);
    assert!(!p["Hash"].as_str().unwrap().is_empty());
    let r = call(&ts, Method::GET, "/v1/acl/policy/nope", m, Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::NOT_FOUND, "ACL policy not found"));
    // Tokens: validation, TTL bounds, expiry, self, update, delete.
    let r = call(&ts, Method::POST, "/v1/acl/token", m, json!({"Type": "root"})).await;
    assert_eq!(r.body, "token type must be client or management");
    assert_eq!(token(&ts, &mgmt.secret_id, &["p"], Some("10s")).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(token(&ts, &mgmt.secret_id, &["p"], Some("48h")).await.status, StatusCode::BAD_REQUEST);
    let t = token(&ts, &mgmt.secret_id, &["p"], Some("1h")).await.json();
    assert!(t["ExpirationTime"].is_string());
    assert_eq!(t["ExpirationTTL"], "1h0m0s");
    let secret = t["SecretID"].as_str().unwrap();
    let accessor = t["AccessorID"].as_str().unwrap();
    let me = call(&ts, Method::GET, "/v1/acl/token/self", Some(secret), Value::Null).await;
    assert_eq!(me.json()["AccessorID"], accessor);
    assert_eq!(call(&ts, Method::GET, &format!("/v1/acl/token/{accessor}"), Some(secret), Value::Null).await.status, StatusCode::OK);
    let listed = call(&ts, Method::GET, "/v1/acl/tokens", m, Value::Null).await.json();
    assert!(listed.as_array().unwrap().iter().all(|t| t.get("SecretID").is_none()));
    let mine = call(&ts, Method::GET, "/v1/acl/policies", Some(secret), Value::Null).await.json();
    assert_eq!(mine.as_array().unwrap().len(), 1, "a client token lists its own policies");
    // Roles: a role links policies; a token links the role by name.
    let r = call(&ts, Method::POST, "/v1/acl/role", m, json!({"Name": "ops", "Policies": [{"Name": "missing"}]})).await;
    assert_eq!(r.body, "cannot find policy missing");
    let role = call(&ts, Method::POST, "/v1/acl/role", m, json!({"Name": "ops", "Policies": [{"Name": "p"}]})).await.json();
    let role_id = role["ID"].as_str().unwrap();
    assert_eq!(call(&ts, Method::GET, "/v1/acl/role/name/ops", m, Value::Null).await.json()["ID"], role_id);
    let r = call(&ts, Method::POST, "/v1/acl/token", m, json!({"Type": "client", "Roles": [{"Name": "nope"}]})).await;
    assert_eq!(r.body, "cannot find role nope");
    let rt = call(&ts, Method::POST, "/v1/acl/token", m, json!({"Type": "client", "Roles": [{"Name": "ops"}]})).await.json();
    assert_eq!(rt["Roles"][0]["ID"], role_id);
    let rs = rt["SecretID"].as_str().unwrap();
    assert_eq!(call(&ts, Method::GET, "/v1/nodes", Some(rs), Value::Null).await.status, StatusCode::OK, "role policies apply");
    // Update keeps the secret; expiry is immutable.
    let u = call(
        &ts,
        Method::POST,
        &format!("/v1/acl/token/{accessor}"),
        m,
        json!({"Name": "renamed", "Type": "client", "Policies": ["p"], "ExpirationTTL": "2h"}),
    )
    .await;
    assert_eq!(u.body, "cannot update expiration time");
    let u =
        call(&ts, Method::POST, &format!("/v1/acl/token/{accessor}"), m, json!({"Name": "renamed", "Type": "client", "Policies": ["p"]}))
            .await;
    assert_eq!(u.status, StatusCode::OK, "{}", u.body);
    assert_eq!(u.json()["SecretID"], secret);
    assert_eq!(call(&ts, Method::DELETE, &format!("/v1/acl/token/{accessor}"), m, Value::Null).await.status, StatusCode::OK);
    let r = call(&ts, Method::GET, "/v1/nodes", Some(secret), Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::FORBIDDEN, "ACL token not found"));
    assert_eq!(call(&ts, Method::DELETE, &format!("/v1/acl/role/{role_id}"), m, Value::Null).await.status, StatusCode::OK);
    assert_eq!(call(&ts, Method::GET, "/v1/nodes", Some(rs), Value::Null).await.status, StatusCode::FORBIDDEN, "role gone");
}

#[test]
fn acl_tables_survive_a_snapshot() {
    let store = crate::state::StateStore::new();
    let mut p = crate::acl::AclPolicy { name: "p".into(), rules: READ_RULES.into(), ..Default::default() };
    p.set_hash();
    let t = AclToken {
        accessor_id: "a".into(),
        secret_id: "s".into(),
        token_type: CLIENT.into(),
        policies: vec!["p".into()],
        ..Default::default()
    };
    let role = crate::acl::AclRole {
        id: "r".into(),
        name: "ops".into(),
        policies: vec![crate::acl::PolicyLink { name: "p".into() }],
        ..Default::default()
    };
    store
        .write(3, |txn| {
            txn.bootstrap_acl_token(
                &AclToken { accessor_id: "b".into(), secret_id: "bs".into(), token_type: "management".into(), ..Default::default() },
                0,
            )
        })
        .unwrap();
    store
        .write(4, |txn| {
            txn.upsert_acl_policies(std::slice::from_ref(&p));
            txn.upsert_acl_tokens(std::slice::from_ref(&t));
            txn.upsert_acl_roles(std::slice::from_ref(&role))
        })
        .unwrap();
    let back = crate::state::State::from_bytes(&store.snapshot().to_bytes().unwrap()).unwrap();
    assert_eq!(back.acl_bootstrap_index(), 3);
    assert_eq!(back.acl_policy("p").unwrap().rules, READ_RULES);
    assert_eq!(back.acl_token_by_secret("s").unwrap().accessor_id, "a");
    assert_eq!(back.acl_role_by_name("ops").unwrap().id, "r");
    assert_eq!(back.table_index(crate::state::Table::AclTokens), 4);
}

/// An open event stream: reads NDJSON lines as they come.
struct Stream {
    body: axum::body::BodyDataStream,
    pending: String,
}

impl Stream {
    async fn open(ts: &TestServer, uri: &str, token: &str) -> Result<Stream, Reply> {
        let req = Request::builder().uri(uri).header("X-Nomad-Token", token).body(Body::empty()).unwrap();
        let resp = ts.router().oneshot(req).await.unwrap();
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let body = String::from_utf8_lossy(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).into_owned();
            return Err(Reply { status, body });
        }
        Ok(Stream { body: resp.into_body().into_data_stream(), pending: String::new() })
    }

    /// The next non-heartbeat line, or `None` when the stream ends; a test that waits longer
    /// than its guard fails instead of hanging.
    async fn next_line(&mut self) -> Option<Value> {
        use futures::StreamExt;
        loop {
            if let Some(i) = self.pending.find('\n') {
                let line: String = self.pending.drain(..=i).collect();
                if line.trim() == "{}" {
                    continue;
                }
                return Some(serde_json::from_str(line.trim()).unwrap());
            }
            let chunk =
                tokio::time::timeout(std::time::Duration::from_secs(20), self.body.next()).await.expect("a line or the end in time");
            match chunk {
                Some(Ok(b)) => self.pending.push_str(&String::from_utf8_lossy(&b)),
                _ => return None,
            }
        }
    }
}

async fn register_in(ts: &TestServer, mgmt: &str, id: &str, ns: &str) {
    let mut j = serde_json::to_value(job(id, 1)).unwrap();
    j["Namespace"] = json!(ns);
    let r = call(ts, Method::PUT, "/v1/jobs", Some(mgmt), json!({"Job": j})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn the_event_stream_carries_only_the_namespaces_a_token_may_read() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    for ns in ["a", "b"] {
        let r = call(&ts, Method::PUT, &format!("/v1/namespace/{ns}"), Some(&mgmt.secret_id), json!({"Name": ns})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    policy(&ts, &mgmt.secret_id, "read-a", r#"namespace "a" { policy = "read" }"#).await;
    let tok = client_token(&ts, &mgmt.secret_id, &["read-a"]).await;

    // Topics the token may not read are refused at subscription.
    for uri in [
        "/v1/event/stream",
        "/v1/event/stream?topic=*&namespace=a",
        "/v1/event/stream?topic=Node",
        "/v1/event/stream?topic=Job&namespace=b",
    ] {
        let Err(r) = Stream::open(&ts, uri, &tok).await else { panic!("{uri} was served") };
        assert_eq!((r.status, r.body.as_str()), (StatusCode::FORBIDDEN, "Permission denied"), "{uri}");
    }
    let Err(r) = Stream::open(&ts, "/v1/event/stream?topic=Job&namespace=a", "").await else { panic!("anonymous was served") };
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // `namespace=*` passes (namespace a is readable) and then carries only a's events.
    let mut stream = Stream::open(&ts, "/v1/event/stream?topic=Job&namespace=*", &tok).await.unwrap_or_else(|r| panic!("{}", r.body));
    let mut all =
        Stream::open(&ts, "/v1/event/stream?topic=Job&namespace=*", &mgmt.secret_id).await.unwrap_or_else(|r| panic!("{}", r.body));
    register_in(&ts, &mgmt.secret_id, "in-b", "b").await;
    register_in(&ts, &mgmt.secret_id, "in-default", "default").await;
    register_in(&ts, &mgmt.secret_id, "in-a", "a").await;
    let batch = stream.next_line().await.expect("a batch");
    let events = batch["Events"].as_array().unwrap();
    assert!(events.iter().all(|e| e["Namespace"] == "a"), "another namespace leaked: {batch}");
    assert_eq!(events[0]["Key"], "in-a");
    // The management stream saw all three, in order.
    let mut keys = Vec::new();
    while keys.len() < 3 {
        let b = all.next_line().await.expect("a batch");
        keys.extend(b["Events"].as_array().unwrap().iter().map(|e| e["Key"].as_str().unwrap().to_string()));
    }
    assert_eq!(keys, ["in-b", "in-default", "in-a"]);
}

#[tokio::test]
async fn a_stream_closes_when_its_token_is_deleted_expires_or_loses_its_policy() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    policy(&ts, &mgmt.secret_id, "read", READ_RULES).await;

    // Deleted.
    let r = token(&ts, &mgmt.secret_id, &["read"], None).await;
    let (secret, accessor) = (r.json()["SecretID"].as_str().unwrap().to_string(), r.json()["AccessorID"].as_str().unwrap().to_string());
    let mut stream = Stream::open(&ts, "/v1/event/stream?topic=Job", &secret).await.unwrap_or_else(|r| panic!("{}", r.body));
    let r = call(&ts, Method::DELETE, &format!("/v1/acl/token/{accessor}"), Some(&mgmt.secret_id), Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(stream.next_line().await, Some(json!({"Error": "ACL token not found"})));
    assert_eq!(stream.next_line().await, None, "the stream ended");

    // Its policy no longer grants the topic.
    let other = client_token(&ts, &mgmt.secret_id, &["read"]).await;
    let mut stream = Stream::open(&ts, "/v1/event/stream?topic=Job", &other).await.unwrap_or_else(|r| panic!("{}", r.body));
    policy(&ts, &mgmt.secret_id, "read", "node { policy = \"read\" }").await;
    assert_eq!(stream.next_line().await, Some(json!({"Error": "Permission denied"})));
    assert_eq!(stream.next_line().await, None);

    // Expired while open, with no ACL change to wake it: the expiry itself closes it.
    policy(&ts, &mgmt.secret_id, "read", READ_RULES).await;
    let now = nomad_proto::Timestamp::now();
    let t = AclToken {
        accessor_id: uuid::Uuid::new_v4().to_string(),
        secret_id: uuid::Uuid::new_v4().to_string(),
        token_type: CLIENT.into(),
        policies: vec!["read".into()],
        create_time: now,
        expiration_time: Some(now.add_nanos(1_500_000_000)),
        ..AclToken::default()
    };
    ts.endpoints.consensus().apply(Command::AclTokenUpsert { tokens: vec![t.clone()] }).await.unwrap();
    let mut stream = Stream::open(&ts, "/v1/event/stream?topic=Job", &t.secret_id).await.unwrap_or_else(|r| panic!("{}", r.body));
    assert_eq!(stream.next_line().await, Some(json!({"Error": "ACL token expired"})));
    assert!(nomad_proto::Timestamp::now().unix_nanos() > t.expiration_time.unwrap().unix_nanos(), "closed before it expired");
    assert_eq!(stream.next_line().await, None);
}

#[tokio::test]
async fn client_routes_check_the_allocs_namespace_and_raw_exec() {
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    seed_allocs(&ts);
    let logs_rules = r#"namespace "a" { capabilities = ["read-logs"] }"#;
    policy(&ts, &mgmt.secret_id, "logs-a", logs_rules).await;
    policy(&ts, &mgmt.secret_id, "write-a", WRITE_A_RULES).await;
    policy(&ts, &mgmt.secret_id, "node-exec-a", "namespace \"a\" {\n policy = \"write\"\n capabilities = [\"alloc-node-exec\"]\n}").await;
    let logs = client_token(&ts, &mgmt.secret_id, &["logs-a"]).await;
    let write = client_token(&ts, &mgmt.secret_id, &["write-a"]).await;
    let node_exec = client_token(&ts, &mgmt.secret_id, &["node-exec-a"]).await;
    let status = |path: &'static str, tok: String| {
        let ts = &ts;
        async move { call(ts, Method::GET, path, Some(&tok), Value::Null).await.status }
    };
    // read-logs reads logs, nothing else, and only in its namespace.
    assert_eq!(status("/v1/client/fs/logs/alloc-a?task=server&type=stdout", logs.clone()).await, StatusCode::OK);
    assert_eq!(status("/v1/client/fs/logs/alloc-default?task=server", logs.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(status("/v1/client/fs/cat/alloc-a?path=alloc/logs", logs.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(status("/v1/client/allocation/alloc-a/exec?task=server", logs.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(status("/v1/client/allocation/alloc-a/stats", logs.clone()).await, StatusCode::FORBIDDEN);
    // An ID prefix names the alloc too.
    assert_eq!(status("/v1/client/fs/logs/alloc-d?task=server", logs.clone()).await, StatusCode::FORBIDDEN);
    // raw_exec shares the host's filesystem: exec needs alloc-node-exec as well.
    assert_eq!(status("/v1/client/allocation/alloc-a/exec?task=server", write.clone()).await, StatusCode::OK);
    assert_eq!(status("/v1/client/allocation/alloc-raw-a/exec?task=server", write.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(status("/v1/client/allocation/alloc-raw-a/exec", write.clone()).await, StatusCode::FORBIDDEN);
    assert_eq!(status("/v1/client/allocation/alloc-raw-a/exec?task=server", node_exec.clone()).await, StatusCode::OK);
    assert_eq!(status("/v1/client/allocation/alloc-raw-a/exec?task=server", mgmt.secret_id.clone()).await, StatusCode::OK);
    // Alloc GC is submit-job; node GC is node write.
    let r = call(&ts, Method::PUT, "/v1/client/allocation/alloc-a/gc", Some(&write), Value::Null).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(&ts, Method::PUT, "/v1/client/gc", Some(&write), Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::FORBIDDEN, "Permission denied"));
}

#[test]
fn decide_applies_the_client_rows_with_the_agents_own_alloc_facts() {
    let acl =
        crate::acl::Acl::compile(&[crate::acl::Policy::parse(r#"namespace "a" { capabilities = ["read-logs", "alloc-exec"] }"#).unwrap()]);
    let facts = |id: &str| match id {
        "in-a" => Some(AllocFacts { namespace: "a".into(), node_exec: false }),
        "raw-a" => Some(AllocFacts { namespace: "a".into(), node_exec: true }),
        "in-default" => Some(AllocFacts { namespace: "default".into(), node_exec: false }),
        _ => None,
    };
    let check = |m: Method, path: &str| decide(row_for(&m, path).expect("a row").need, &acl, path, facts);
    assert!(check(Method::GET, "/v1/client/fs/logs/in-a"));
    assert!(!check(Method::GET, "/v1/client/fs/logs/in-default"));
    assert!(!check(Method::GET, "/v1/client/fs/ls/in-a"));
    assert!(check(Method::GET, "/v1/client/allocation/in-a/exec"));
    assert!(!check(Method::GET, "/v1/client/allocation/raw-a/exec"));
    assert!(!check(Method::PUT, "/v1/client/allocation/in-a/restart"));
    assert!(!check(Method::GET, "/v1/client/stats"));
    // Unknown here: passes if any namespace allows (the server the request goes on to checks again).
    assert!(check(Method::GET, "/v1/client/fs/logs/elsewhere"));
}

#[tokio::test]
async fn node_resolve_token_answers_a_nodes_question_with_the_policy_rules() {
    use nomad_proto::rpc::NodeResolveTokenRequest;
    let ts = acl_server();
    let mgmt = bootstrap(&ts).await;
    policy(&ts, &mgmt.secret_id, "write-a", WRITE_A_RULES).await;
    let tok = client_token(&ts, &mgmt.secret_id, &["write-a"]).await;
    let expired = expired_token(&ts).await;
    let n = ts.register_node(node("n1")).await;
    let ask = |secret: &str, auth: &str| {
        ts.endpoints.node_resolve_token(NodeResolveTokenRequest {
            node_id: n.id.clone(),
            secret_id: secret.into(),
            auth_token: auth.into(),
            region: String::new(),
        })
    };
    let r = ask(&n.secret_id, &tok).unwrap();
    assert_eq!((r.token_type.as_str(), r.error.as_str()), ("client", ""));
    assert_eq!(r.policies.iter().map(|p| (p.name.as_str(), p.rules.as_str())).collect::<Vec<_>>(), [("write-a", WRITE_A_RULES)]);
    assert_eq!(ask(&n.secret_id, &mgmt.secret_id).unwrap().token_type, "management");
    assert_eq!(ask(&n.secret_id, &expired).unwrap().error, "ACL token expired");
    assert_eq!(ask(&n.secret_id, "00000000-0000-0000-0000-000000000000").unwrap().error, "ACL token not found");
    // A node's own secret is no caller; and only a node that proves itself may ask.
    assert_eq!(ask(&n.secret_id, &n.secret_id).unwrap().error, "Permission denied");
    assert!(ask("not-the-secret", &tok).is_err());
}
