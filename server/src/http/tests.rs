//! Every route with good and bad input, through the real router.

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::testing::{TestServer, job, node};

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn index(&self) -> u64 {
        self.headers.get("x-nomad-index").expect("X-Nomad-Index").to_str().unwrap().parse().unwrap()
    }
}

async fn call(ts: &TestServer, method: Method, path: &str, body: impl Into<Body>) -> Reply {
    let req = Request::builder().method(method).uri(path).body(body.into()).unwrap();
    let resp = ts.router().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, headers, body }
}

async fn get(ts: &TestServer, path: &str) -> Reply {
    call(ts, Method::GET, path, Body::empty()).await
}

fn job_body(id: &str) -> String {
    json!({ "Job": serde_json::to_value(job(id, 2)).unwrap() }).to_string()
}

#[tokio::test]
async fn register_list_read_and_stop_a_job() {
    let ts = TestServer::new();
    let r = call(&ts, Method::PUT, "/v1/jobs", job_body("web")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let eval_id = v["EvalID"].as_str().unwrap().to_string();
    assert!(!eval_id.is_empty());
    assert!(r.index() > 0);
    assert_eq!(v["JobModifyIndex"], r.index());

    let list = get(&ts, "/v1/jobs").await;
    assert_eq!(list.status, StatusCode::OK);
    let arr = list.json();
    assert_eq!(arr[0]["ID"], "web");
    assert_eq!(arr[0]["Status"], "pending");
    assert_eq!(arr[0]["JobSummary"]["Summary"]["web"]["Queued"], 0);
    assert_eq!(list.headers["x-nomad-knownleader"], "true");

    let one = get(&ts, "/v1/job/web").await.json();
    assert_eq!(one["Name"], "web");
    assert_eq!(one["TaskGroups"][0]["Tasks"][0]["Resources"]["CPU"], 100);

    let evals = get(&ts, "/v1/job/web/evaluations").await.json();
    assert_eq!(evals[0]["ID"], eval_id.as_str());
    assert_eq!(evals[0]["TriggeredBy"], "job-register");
    let eval = get(&ts, &format!("/v1/evaluation/{eval_id}")).await.json();
    assert_eq!(eval["JobID"], "web");
    assert_eq!(get(&ts, "/v1/job/web/summary").await.json()["JobID"], "web");
    assert_eq!(get(&ts, "/v1/job/web/allocations").await.json(), json!([]));

    let stop = call(&ts, Method::DELETE, "/v1/job/web", Body::empty()).await;
    assert_eq!(stop.status, StatusCode::OK);
    assert!(!stop.json()["EvalID"].as_str().unwrap().is_empty());
    assert_eq!(get(&ts, "/v1/job/web").await.json()["Stop"], true);

    let purge = call(&ts, Method::DELETE, "/v1/job/web?purge=true", Body::empty()).await;
    assert_eq!(purge.status, StatusCode::OK);
    assert_eq!(get(&ts, "/v1/job/web").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn register_accepts_any_key_case_and_nulls() {
    let ts = TestServer::new();
    let body = r#"{"job":{"id":"lower","type":null,"datacenters":null,"taskgroups":[{"name":"g","COUNT":1,
        "tasks":[{"name":"t","driver":"raw_exec","config":{"command":"/bin/true"},"resources":null}]}]}}"#;
    let r = call(&ts, Method::POST, "/v1/job/lower", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let j = get(&ts, "/v1/job/lower").await.json();
    assert_eq!(j["Type"], "service");
    assert_eq!(j["Datacenters"], json!(["*"]));
    assert_eq!(j["TaskGroups"][0]["Tasks"][0]["Config"]["command"], "/bin/true");
}

#[tokio::test]
async fn bad_job_input_gets_nomads_codes_and_changes_nothing() {
    let ts = TestServer::new();
    let cases: Vec<(Method, &str, String, StatusCode, &str)> = vec![
        (Method::PUT, "/v1/jobs", String::new(), StatusCode::BAD_REQUEST, "Request body is empty"),
        (Method::PUT, "/v1/jobs", "{not json".into(), StatusCode::BAD_REQUEST, "invalid JSON"),
        (Method::PUT, "/v1/jobs", "{}".into(), StatusCode::BAD_REQUEST, "Job must be specified"),
        (Method::PUT, "/v1/jobs", r#"{"Job":{"Name":"x"}}"#.into(), StatusCode::BAD_REQUEST, "Job ID hasn't been provided"),
        (Method::PUT, "/v1/job/other", job_body("web"), StatusCode::BAD_REQUEST, "Job ID does not match name"),
        (Method::PUT, "/v1/jobs", r#"{"Job":{"ID":"x"}}"#.into(), StatusCode::INTERNAL_SERVER_ERROR, "Missing job task groups"),
        (
            Method::PUT,
            "/v1/jobs",
            r#"{"Job":{"ID":"x","TaskGroups":[{"Name":"g","Count":-1,"Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}}"#.into(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "Task group count can't be negative",
        ),
        (
            Method::PUT,
            "/v1/jobs",
            r#"{"Job":{"ID":"x","TaskGroups":[{"Name":"g","Count":"two"}]}}"#.into(),
            StatusCode::BAD_REQUEST,
            "Job.TaskGroups[0].Count",
        ),
        (Method::PATCH, "/v1/jobs", String::new(), StatusCode::METHOD_NOT_ALLOWED, "Invalid method"),
        (Method::DELETE, "/v1/job/x?purge=maybe", String::new(), StatusCode::BAD_REQUEST, "Failed to parse value of \"purge\""),
        (Method::GET, "/v1/jobs?wait=forever&index=1", String::new(), StatusCode::BAD_REQUEST, "Invalid wait time"),
        (Method::GET, "/v1/jobs?index=abc", String::new(), StatusCode::BAD_REQUEST, "Invalid index"),
        (Method::GET, "/v1/job/missing", String::new(), StatusCode::NOT_FOUND, "job not found"),
        (Method::GET, "/v1/job/missing/summary", String::new(), StatusCode::NOT_FOUND, "job not found"),
        (Method::POST, "/v1/job/missing/summary", String::new(), StatusCode::METHOD_NOT_ALLOWED, "Invalid method"),
    ];
    for (method, path, body, code, needle) in cases {
        let r = call(&ts, method.clone(), path, body).await;
        assert_eq!(r.status, code, "{method} {path}: {}", r.text());
        assert!(r.text().contains(needle), "{method} {path}: {:?} lacks {needle:?}", r.text());
        if code != StatusCode::OK {
            assert!(r.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
        }
    }
    assert_eq!(ts.store.snapshot().jobs().count(), 0, "nothing was written");
    assert_eq!(ts.store.snapshot().evals().count(), 0);
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let ts = TestServer::new();
    let huge = vec![b' '; super::util::MAX_BODY_BYTES + 1];
    let r = call(&ts, Method::PUT, "/v1/jobs", huge).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.text().contains("too large"));
}

#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_before_it_is_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ts = TestServer::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(super::listener::serve(listener, ts.router(), super::listener::HttpLimits::default()));
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("PUT /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n", super::util::MAX_BODY_BYTES + 1);
    tcp.write_all(head.as_bytes()).await.unwrap();
    // Not one byte of the body is sent: the answer comes from the declared length alone.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let answered = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&got).contains("the limit is 32 MiB") {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without an answer: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    assert!(answered.is_ok(), "no answer while the body was not sent: {text}");
    assert!(text.starts_with("HTTP/1.1 413 Payload Too Large"), "{text}");
    assert!(text.contains("Request body too large: the limit is 32 MiB"), "{text}");
}

#[tokio::test]
async fn unknown_paths_are_404s_that_say_so() {
    let ts = TestServer::new();
    for path in ["/v1/nope", "/nope", "/v1/agent/nope/deeper"] {
        let r = get(&ts, path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(String::from_utf8_lossy(&r.body), "404 page not found\n", "{path}");
    }
}

#[tokio::test]
async fn namespaces_scope_job_lists() {
    let ts = TestServer::new();
    ts.store
        .write(100, |tx| {
            tx.upsert_namespace(nomad_proto::Namespace { name: "prod".into(), ..Default::default() });
            Ok(())
        })
        .unwrap();
    for (ns, id) in [("default", "a"), ("prod", "a"), ("prod", "b")] {
        let r = call(&ts, Method::PUT, &format!("/v1/jobs?namespace={ns}"), job_body(id)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    assert_eq!(get(&ts, "/v1/jobs").await.json().as_array().unwrap().len(), 1);
    assert_eq!(get(&ts, "/v1/jobs?namespace=prod").await.json().as_array().unwrap().len(), 2);
    assert_eq!(get(&ts, "/v1/jobs?namespace=*").await.json().as_array().unwrap().len(), 3);
    assert_eq!(get(&ts, "/v1/jobs?namespace=*&prefix=b").await.json()[0]["Namespace"], "prod");
    let r = call(&ts, Method::PUT, "/v1/jobs?namespace=ghost", job_body("c")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().contains("nonexistent namespace"));
    let nss = get(&ts, "/v1/namespaces").await.json();
    assert_eq!(nss.as_array().unwrap().len(), 2);
    // Namespace writes: create, refuse bad names and deleting a non-empty one.
    let made = call(&ts, Method::PUT, "/v1/namespace/dev", r#"{"Description":"for devs"}"#).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.text());
    assert_eq!(get(&ts, "/v1/namespace/dev").await.json()["Description"], "for devs");
    assert_eq!(call(&ts, Method::PUT, "/v1/namespace/bad%20name", "{}").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(call(&ts, Method::PUT, "/v1/namespace/x", r#"{"Name":"y"}"#).await.status, StatusCode::BAD_REQUEST);
    let busy = call(&ts, Method::DELETE, "/v1/namespace/prod", "").await;
    assert_eq!(busy.status, StatusCode::BAD_REQUEST);
    assert!(busy.text().contains("non-terminal jobs"));
    assert_eq!(call(&ts, Method::DELETE, "/v1/namespace/default", "").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(call(&ts, Method::DELETE, "/v1/namespace/dev", "").await.status, StatusCode::OK);
    assert_eq!(get(&ts, "/v1/namespace/dev").await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&ts, Method::DELETE, "/v1/namespace/dev", "").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&ts, "/v1/namespace/prod").await.json()["Name"], "prod");
    assert_eq!(get(&ts, "/v1/namespace/ghost").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn job_list_pages_with_next_token() {
    let ts = TestServer::new();
    for id in ["a", "b", "c"] {
        call(&ts, Method::PUT, "/v1/jobs", job_body(id)).await;
    }
    let p1 = get(&ts, "/v1/jobs?per_page=2").await;
    assert_eq!(p1.json().as_array().unwrap().len(), 2);
    let token = p1.headers["x-nomad-nexttoken"].to_str().unwrap().to_string();
    let p2 = get(&ts, &format!("/v1/jobs?per_page=2&next_token={token}")).await;
    assert_eq!(p2.json()[0]["ID"], "c");
    assert!(p2.headers.get("x-nomad-nexttoken").is_none());
}

#[tokio::test]
async fn blocking_job_list_returns_when_a_job_arrives() {
    let ts = TestServer::new();
    let first = call(&ts, Method::PUT, "/v1/jobs", job_body("a")).await.index();
    let router = ts.router();
    let waiter = tokio::spawn(async move {
        let req = Request::get(format!("/v1/jobs?index={first}&wait=30s")).body(Body::empty()).unwrap();
        let resp = router.oneshot(req).await.unwrap();
        let idx: u64 = resp.headers()["x-nomad-index"].to_str().unwrap().parse().unwrap();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        (idx, serde_json::from_slice::<Value>(&body).unwrap())
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    call(&ts, Method::PUT, "/v1/jobs", job_body("b")).await;
    let (idx, list) = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert!(idx > first);
    assert_eq!(list.as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn nodes_routes_never_show_the_secret() {
    let ts = TestServer::new();
    let n = ts.register_node(node("n1")).await;
    let list = get(&ts, "/v1/nodes").await;
    assert_eq!(list.status, StatusCode::OK);
    let stub = &list.json()[0];
    assert_eq!(stub["ID"], "n1");
    assert_eq!(stub["Address"], "127.0.0.1");
    assert!(stub.get("NodeResources").is_none());
    let with_res = get(&ts, "/v1/nodes?resources=true&os=true").await.json();
    assert_eq!(with_res[0]["NodeResources"]["Memory"]["MemoryMB"], 8192);
    let full = get(&ts, "/v1/node/n1").await;
    let v = full.json();
    assert_eq!(v["SecretID"], "");
    assert_eq!(v["Drain"], false);
    assert_eq!(v["Status"], "initializing");
    for r in [list, full, get(&ts, "/v1/nodes?resources=true").await, get(&ts, "/v1/node/n1/allocations").await] {
        assert!(!r.text().contains(&n.secret_id), "secret leaked: {}", r.text());
    }
    assert_eq!(get(&ts, "/v1/node/ghost").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&ts, "/v1/nodes?prefix=zz").await.json(), json!([]));
}

#[tokio::test]
async fn node_eligibility_round_trip_and_bad_input() {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    let r = call(&ts, Method::POST, "/v1/node/n1/eligibility", r#"{"Eligibility":"ineligible"}"#).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(get(&ts, "/v1/node/n1").await.json()["SchedulingEligibility"], "ineligible");
    let bad = call(&ts, Method::POST, "/v1/node/n1/eligibility", r#"{"Eligibility":"maybe"}"#).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text().contains("invalid scheduling eligibility"));
    let empty = call(&ts, Method::POST, "/v1/node/n1/eligibility", "").await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    let ghost = call(&ts, Method::POST, "/v1/node/ghost/eligibility", r#"{"Eligibility":"eligible"}"#).await;
    assert_eq!(ghost.status, StatusCode::NOT_FOUND);
    let wrong = call(&ts, Method::GET, "/v1/node/n1/eligibility", "").await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn alloc_routes_with_options_and_bad_ids() {
    let ts = TestServer::new();
    let mut j = job("web", 1);
    j.canonicalize();
    ts.store.write(49, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
    let stored = ts.store.snapshot().job("default", "web").unwrap().clone();
    let alloc = nomad_proto::Allocation {
        id: "a1".into(),
        namespace: "default".into(),
        job_id: "web".into(),
        job: Some(stored),
        task_group: "web".into(),
        node_id: "n1".into(),
        eval_id: "e1".into(),
        allocated_resources: Some(Default::default()),
        task_states: Some(Default::default()),
        ..Default::default()
    };
    ts.store
        .write(50, |tx| {
            tx.upsert_allocs_from_plan(vec![alloc.clone()]);
            Ok(())
        })
        .unwrap();
    let plain = get(&ts, "/v1/allocations").await.json();
    assert!(plain[0].get("AllocatedResources").is_none());
    assert!(plain[0]["TaskStates"].is_object());
    let opts = get(&ts, "/v1/allocations?resources=true&task_states=false").await.json();
    assert!(opts[0]["AllocatedResources"].is_object());
    assert!(opts[0]["TaskStates"].is_null());
    assert_eq!(get(&ts, "/v1/allocation/a1").await.json()["Job"]["ID"], "web");
    assert_eq!(get(&ts, "/v1/allocation/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&ts, "/v1/allocation/a1/x/y").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&ts, "/v1/job/web/allocations").await.json()[0]["ID"], "a1");
    let stop = call(&ts, Method::POST, "/v1/allocation/a1/stop", "").await;
    assert_eq!(stop.status, StatusCode::OK, "{}", stop.text());
    let eval_id = stop.json()["EvalID"].as_str().unwrap().to_string();
    assert_eq!(ts.store.snapshot().eval(&eval_id).unwrap().triggered_by, "alloc-stop");
    assert_eq!(ts.store.snapshot().alloc("a1").unwrap().desired_transition.migrate, Some(true));
    assert_eq!(call(&ts, Method::POST, "/v1/allocation/nope/stop", "").await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&ts, Method::DELETE, "/v1/allocation/a1", "").await.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(get(&ts, "/v1/allocations?task_states=nah").await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn eval_routes_and_filters() {
    let ts = TestServer::new();
    call(&ts, Method::PUT, "/v1/jobs", job_body("a")).await;
    call(&ts, Method::PUT, "/v1/jobs", job_body("b")).await;
    assert_eq!(get(&ts, "/v1/evaluations").await.json().as_array().unwrap().len(), 2);
    assert_eq!(get(&ts, "/v1/evaluations?job=a").await.json().as_array().unwrap().len(), 1);
    assert_eq!(get(&ts, "/v1/evaluations?status=complete").await.json(), json!([]));
    assert_eq!(get(&ts, "/v1/evaluation/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(get(&ts, "/v1/evaluation/nope/allocations").await.json(), json!([]));
    assert_eq!(call(&ts, Method::DELETE, "/v1/evaluation/x", "").await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn status_and_agent_routes() {
    let ts = TestServer::new();
    assert_eq!(get(&ts, "/v1/status/leader").await.json(), json!("127.0.0.1:4647"));
    assert_eq!(get(&ts, "/v1/status/peers").await.json(), json!(["127.0.0.1:4647"]));
    assert_eq!(get(&ts, "/v1/regions").await.json(), json!(["global"]));
    let me = get(&ts, "/v1/agent/self").await.json();
    assert!(me.get("config").is_some() && me.get("member").is_some() && me.get("stats").is_some());
    assert_eq!(me["member"]["Name"], "test");
    assert_eq!(get(&ts, "/v1/agent/members").await.json()["ServerRegion"], "global");
    assert_eq!(call(&ts, Method::POST, "/v1/status/leader", "").await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn jobs_parse_uses_the_hcl2_parser() {
    let ts = TestServer::new();
    let hcl = "job \"hello\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/echo\"\n      }\n    }\n  }\n}\n";
    let r = call(&ts, Method::POST, "/v1/jobs/parse", json!({"JobHCL": hcl, "Canonicalize": true}).to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["ID"], "hello");
    assert_eq!(v["TaskGroups"][0]["Tasks"][0]["Config"]["command"], "/bin/echo");
    assert_eq!(v["Namespace"], "default", "canonicalized");
    let bad = call(&ts, Method::POST, "/v1/jobs/parse", json!({"JobHCL": "job \"x\" {\n  cout = 1\n}\n"}).to_string()).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text().starts_with("Failed to parse job: input.hcl:2:3"), "{}", bad.text());
    let empty = call(&ts, Method::POST, "/v1/jobs/parse", json!({"JobHCL": " "}).to_string()).await;
    assert_eq!((empty.status, empty.text().as_str()), (StatusCode::BAD_REQUEST, "Job spec is empty"));
    assert_eq!(call(&ts, Method::GET, "/v1/jobs/parse", "").await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn jobs_parse_never_lets_a_job_file_read_the_servers_files() {
    // As Nomad's parse endpoint (AllowFS: false): file() and the other filesystem functions refuse.
    let ts = TestServer::new();
    let hcl = "job \"x\" {\n  meta { m = file(\"/etc/hostname\") }\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n";
    let r = call(&ts, Method::POST, "/v1/jobs/parse", json!({"JobHCL": hcl}).to_string()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("file(): filesystem function disabled"), "{}", r.text());
    // Functions that touch no files still run.
    let ok = hcl.replace("file(\"/etc/hostname\")", "upper(\"x\")");
    let r = call(&ts, Method::POST, "/v1/jobs/parse", json!({"JobHCL": ok}).to_string()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["Meta"]["m"], "X");
}

mod event_stream {
    use http_body_util::BodyExt;

    use super::*;

    /// Reads NDJSON lines from a streaming body until `n` non-heartbeat batches arrived.
    async fn read_batches(body: &mut Body, n: usize) -> (usize, Vec<Value>) {
        let mut buf = Vec::new();
        let mut heartbeats = 0;
        let mut batches = Vec::new();
        while batches.len() < n {
            let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame()).await.expect("a frame in time");
            let frame = frame.expect("stream still open").unwrap();
            if let Ok(data) = frame.into_data() {
                buf.extend_from_slice(&data);
            }
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let v: Value = serde_json::from_slice(&line).unwrap();
                if v == json!({}) {
                    heartbeats += 1;
                } else {
                    batches.push(v);
                }
            }
        }
        (heartbeats, batches)
    }

    async fn open(ts: &TestServer, query: &str) -> Body {
        let req = Request::get(format!("/v1/event/stream{query}")).body(Body::empty()).unwrap();
        let resp = ts.router().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "application/json");
        resp.into_body()
    }

    #[tokio::test]
    async fn heartbeat_first_then_batches_in_index_order_exactly_once() {
        let ts = TestServer::new();
        let mut body = open(&ts, "").await;
        // The heartbeat comes at once, before anything happens.
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame()).await.unwrap().unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "{}\n");
        let mut indexes = Vec::new();
        for id in ["a", "b", "c"] {
            let r = call(&ts, Method::PUT, "/v1/jobs", job_body(id)).await;
            indexes.push(r.index());
        }
        call(&ts, Method::DELETE, "/v1/job/a", Body::empty()).await;
        let (_, batches) = read_batches(&mut body, 4).await;
        let got: Vec<u64> = batches.iter().map(|b| b["Index"].as_u64().unwrap()).collect();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "strictly increasing: {got:?}");
        assert_eq!(&got[..3], &indexes[..]);
        let first = &batches[0]["Events"];
        let kinds: Vec<(String, String)> = first
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["Topic"].as_str().unwrap().to_string(), e["Type"].as_str().unwrap().to_string()))
            .collect();
        assert!(kinds.contains(&("Job".into(), "JobRegistered".into())), "{kinds:?}");
        assert!(kinds.contains(&("Evaluation".into(), "JobRegistered".into())), "{kinds:?}");
        assert!(first.as_array().unwrap().iter().all(|e| e["Index"] == batches[0]["Index"]));
        assert_eq!(batches[3]["Events"][0]["Type"], "JobDeregistered");
    }

    #[tokio::test]
    async fn topic_key_and_namespace_filters() {
        let ts = TestServer::new();
        ts.store
            .write(100, |tx| {
                tx.upsert_namespace(nomad_proto::Namespace { name: "prod".into(), ..Default::default() });
                Ok(())
            })
            .unwrap();
        let mut evals_of_b = open(&ts, "?topic=Evaluation:b").await;
        let mut prod_jobs = open(&ts, "?topic=Job&namespace=prod").await;
        let mut everything = open(&ts, "?topic=*&namespace=*").await;
        call(&ts, Method::PUT, "/v1/jobs", job_body("a")).await;
        call(&ts, Method::PUT, "/v1/jobs", job_body("b")).await;
        call(&ts, Method::PUT, "/v1/jobs?namespace=prod", job_body("c")).await;
        let (_, b) = read_batches(&mut evals_of_b, 1).await;
        let ev = &b[0]["Events"];
        assert_eq!(ev.as_array().unwrap().len(), 1);
        assert_eq!((ev[0]["Topic"].as_str(), ev[0]["Payload"]["Evaluation"]["JobID"].as_str()), (Some("Evaluation"), Some("b")));
        let (_, p) = read_batches(&mut prod_jobs, 1).await;
        assert_eq!(p[0]["Events"][0]["Payload"]["Job"]["ID"], "c");
        assert_eq!(p[0]["Events"].as_array().unwrap().len(), 1);
        let (_, all) = read_batches(&mut everything, 3).await;
        assert_eq!(all.len(), 3);
    }

    #[tokio::test]
    async fn resuming_from_an_index_skips_what_was_seen() {
        let ts = TestServer::new();
        let mut idx = Vec::new();
        for id in ["a", "b", "c"] {
            idx.push(call(&ts, Method::PUT, "/v1/jobs", job_body(id)).await.index());
        }
        let mut from_second = open(&ts, &format!("?index={}", idx[1])).await;
        let (_, b) = read_batches(&mut from_second, 2).await;
        assert_eq!(b[0]["Index"], idx[1]);
        assert_eq!(b[1]["Index"], idx[2]);
    }

    #[tokio::test]
    async fn node_events_never_carry_the_secret() {
        let ts = TestServer::new();
        let mut body = open(&ts, "?topic=Node").await;
        let n = ts.register_node(node("n1")).await;
        ts.endpoints
            .node_update_status(nomad_proto::rpc::NodeUpdateStatusRequest {
                node_id: "n1".into(),
                status: nomad_proto::NodeStatus::Ready,
                secret_id: n.secret_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        let (_, batches) = read_batches(&mut body, 2).await;
        let text = serde_json::to_string(&batches).unwrap();
        assert!(!text.contains(&n.secret_id), "secret leaked into events");
        assert_eq!(batches[0]["Events"][0]["Type"], "NodeRegistration");
        assert_eq!(batches[1]["Events"][0]["Type"], "NodeStreamEvent");
        assert_eq!(batches[0]["Events"][0]["Payload"]["Node"]["SecretID"], "");
        assert_eq!(batches[0]["Events"][0]["Namespace"], "");
    }

    #[tokio::test]
    async fn bad_stream_queries_are_400s() {
        let ts = TestServer::new();
        let r = get(&ts, "/v1/event/stream?topic=Job:a:b").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(r.text().starts_with("Invalid topic query"), "{}", r.text());
        assert_eq!(get(&ts, "/v1/event/stream?index=x").await.status, StatusCode::BAD_REQUEST);
        assert_eq!(call(&ts, Method::POST, "/v1/event/stream", "").await.status, StatusCode::METHOD_NOT_ALLOWED);
    }
}

#[tokio::test]
async fn drain_sets_and_cancels_with_events_and_eligibility() {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    let r = call(
        &ts,
        Method::PUT,
        "/v1/node/n1/drain",
        r#"{"DrainSpec":{"Deadline":3600000000000,"IgnoreSystemJobs":true},"Meta":{"why":"kernel"}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let n = get(&ts, "/v1/node/n1").await.json();
    assert_eq!(n["Drain"], true);
    assert_eq!(n["SchedulingEligibility"], "ineligible");
    assert_eq!(n["DrainStrategy"]["IgnoreSystemJobs"], true);
    assert_eq!(n["LastDrain"]["Status"], "draining");
    assert_eq!(n["Events"].as_array().unwrap().last().unwrap()["Message"], "Node drain strategy set");
    let stub = &get(&ts, "/v1/nodes").await.json()[0];
    assert_eq!(stub["Drain"], true);
    // Cancel and mark eligible.
    let r = call(&ts, Method::PUT, "/v1/node/n1/drain", r#"{"DrainSpec":null,"MarkEligible":true}"#).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let n = get(&ts, "/v1/node/n1").await.json();
    assert_eq!((n["Drain"].as_bool(), n["SchedulingEligibility"].as_str()), (Some(false), Some("eligible")));
    assert_eq!(n["LastDrain"]["Status"], "canceled");
    assert_eq!(n["Events"].as_array().unwrap().last().unwrap()["Message"], "Node drain disabled");
    // Nothing to change writes nothing.
    let before = ts.store.snapshot().index;
    call(&ts, Method::PUT, "/v1/node/n1/drain", r#"{"DrainSpec":null}"#).await;
    assert_eq!(ts.store.snapshot().index, before);
    // Bad input.
    assert_eq!(call(&ts, Method::PUT, "/v1/node/n1/drain", "").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(call(&ts, Method::PUT, "/v1/node/ghost/drain", r#"{"DrainSpec":null}"#).await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&ts, Method::PUT, "/v1/node/n1/drain", r#"{"NodeID":"other"}"#).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(call(&ts, Method::PUT, "/v1/node/n1/drain", r#"{"DrainSpec":{"Deadline":"soon"}}"#).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn purge_removes_a_node_and_evaluate_makes_node_evals() {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    let r = call(&ts, Method::POST, "/v1/node/n1/evaluate", "").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["EvalIDs"], json!([]), "no jobs, no evals");
    let r = call(&ts, Method::POST, "/v1/node/n1/purge", "").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(get(&ts, "/v1/node/n1").await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&ts, Method::POST, "/v1/node/n1/purge", "").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn service_routes_list_and_read_registrations() {
    let ts = TestServer::new();
    let reg = |id: &str, ns: &str, name: &str, tag: &str| nomad_proto::ServiceRegistration {
        id: id.into(),
        service_name: name.into(),
        namespace: ns.into(),
        node_id: "n1".into(),
        alloc_id: "a1".into(),
        job_id: "web".into(),
        tags: vec![tag.into()],
        port: 1,
        ..Default::default()
    };
    ts.store
        .write(10, |tx| {
            tx.upsert_service_registrations(&[
                reg("s1", "default", "web", "a"),
                reg("s2", "default", "web", "b"),
                reg("s3", "prod", "db", "c"),
            ]);
            Ok(())
        })
        .unwrap();
    let list = get(&ts, "/v1/services").await.json();
    assert_eq!(list, json!([{"Namespace": "default", "Services": [{"ServiceName": "web", "Tags": ["a", "b"]}]}]));
    assert_eq!(get(&ts, "/v1/services?namespace=*").await.json().as_array().unwrap().len(), 2);
    let web = get(&ts, "/v1/service/web").await;
    assert_eq!(web.json().as_array().unwrap().len(), 2);
    assert_eq!(web.index(), 10);
    assert_eq!(get(&ts, "/v1/service/nope").await.json(), json!([]));
    assert_eq!(get(&ts, "/v1/service/a/b/c").await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&ts, Method::PUT, "/v1/services", "").await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn filter_expressions_apply_to_lists() {
    let ts = TestServer::new();
    for id in ["web", "api", "db"] {
        call(&ts, Method::PUT, "/v1/jobs", job_body(id)).await;
    }
    call(&ts, Method::DELETE, "/v1/job/db", Body::empty()).await;
    let enc = |f: &str| f.replace(' ', "%20").replace('"', "%22").replace('=', "%3D");
    let ids = |v: Value| v.as_array().unwrap().iter().map(|j| j["ID"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let r = get(&ts, &format!("/v1/jobs?filter={}", enc(r#"Stop == true"#))).await;
    assert_eq!(ids(r.json()), vec!["db"]);
    let r = get(&ts, &format!("/v1/jobs?filter={}", enc(r#"ID matches "^(web|api)$" and not Stop == true"#))).await;
    assert_eq!(ids(r.json()), vec!["api", "web"]);
    // Filtering happens before paging.
    let r = get(&ts, &format!("/v1/jobs?per_page=1&filter={}", enc("Stop == false"))).await;
    assert_eq!(ids(r.json()), vec!["api"]);
    assert_eq!(r.headers["x-nomad-nexttoken"], "default.web");
    let r = get(&ts, &format!("/v1/evaluations?filter={}", enc(r#"JobID == "web""#))).await;
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    let bad = get(&ts, &format!("/v1/jobs?filter={}", enc("Stop =="))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text().starts_with("failed to create result paginator: "), "{}", bad.text());
    let mixed = get(&ts, &format!("/v1/evaluations?status=pending&filter={}", enc("JobID == web"))).await;
    assert_eq!(mixed.status, StatusCode::BAD_REQUEST);
    assert_eq!(mixed.text(), "Filter expression cannot be used with other filter parameters");
}

#[tokio::test]
async fn deep_and_long_filters_are_refused_before_parsing() {
    // Before the limits, 3,000 nested parentheses overflowed the handler's stack and aborted the
    // process, on any route (the filter is parsed with the common query options).
    let ts = TestServer::new();
    call(&ts, Method::PUT, "/v1/jobs", job_body("web")).await;
    let deep = format!("{}ID%20%3D%3D%20web{}", "(".repeat(10_000), ")".repeat(10_000));
    for route in ["/v1/status/leader", "/v1/jobs", "/v1/nodes"] {
        let r = get(&ts, &format!("{route}?filter={deep}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{route}: {}", r.text());
        assert!(r.text().contains("filter expression is 20009 bytes; the limit is 4096"), "{route}: {}", r.text());
    }
    // Within the length limit, nesting is limited too.
    let nested = format!("{}ID%20%3D%3D%20web{}", "(".repeat(33), ")".repeat(33));
    let r = get(&ts, &format!("/v1/jobs?filter={nested}")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains("nests deeper than 32 levels"), "{}", r.text());
    let nots = format!("{}ID%20%3D%3D%20web", "not%20".repeat(1_000));
    let r = get(&ts, &format!("/v1/jobs?filter={nots}")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains("nests deeper than 32 levels"), "{}", r.text());
    // The server still answers, and the deepest accepted filter works.
    assert_eq!(get(&ts, "/v1/status/leader").await.status, StatusCode::OK);
    let ok = format!("{}ID%20%3D%3D%20web{}", "(".repeat(32), ")".repeat(32));
    let r = get(&ts, &format!("/v1/jobs?filter={ok}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()[0]["ID"], "web");
}

#[tokio::test]
async fn operator_raft_routes_answer_bad_input_with_clear_errors() {
    // The in-process server runs no Raft: an empty configuration, and nothing to remove.
    let ts = TestServer::new();
    let conf = get(&ts, "/v1/operator/raft/configuration").await;
    assert_eq!(conf.status, StatusCode::OK, "{}", conf.text());
    assert_eq!(conf.json()["Servers"], json!([]));
    let cases = [
        ("/v1/operator/raft/peer", StatusCode::BAD_REQUEST, "Must specify either ?id"),
        ("/v1/operator/raft/peer?id=1&address=127.0.0.1:4647", StatusCode::BAD_REQUEST, "only one of ?id or ?address"),
        ("/v1/operator/raft/peer?id=abc", StatusCode::BAD_REQUEST, "invalid server ID \"abc\""),
        ("/v1/operator/raft/peer?id=7", StatusCode::NOT_FOUND, "id 7 was not found in the Raft configuration"),
        ("/v1/operator/raft/peer?address=10.0.0.9:4647", StatusCode::NOT_FOUND, "address \"10.0.0.9:4647\" was not found"),
    ];
    for (path, status, message) in cases {
        let r = call(&ts, Method::DELETE, path, Body::empty()).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
        assert!(r.text().contains(message), "{path}: {}", r.text());
    }
    assert_eq!(get(&ts, "/v1/operator/raft/peer?id=1").await.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(call(&ts, Method::PUT, "/v1/operator/raft/configuration", Body::empty()).await.status, StatusCode::METHOD_NOT_ALLOWED);
}
