//! Prefix and fuzzy search through the real router.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::acl::AclConfig;
use crate::testing::{TestServer, job};

async fn call(ts: &TestServer, path: &str, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    let mut b = Request::builder().method(Method::PUT).uri(path);
    if let Some(t) = token {
        b = b.header("X-Nomad-Token", t);
    }
    let resp = tokio::time::timeout(Duration::from_secs(30), ts.router().oneshot(b.body(Body::from(body.to_string())).unwrap()))
        .await
        .expect("answers")
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())))
}

async fn register(ts: &TestServer, id: &str, image: &str) {
    let mut j = job(id, 1);
    j.task_groups[0].tasks[0].config = serde_json::from_value(json!({"command": "/bin/sleep", "image": image})).unwrap();
    ts.endpoints.job_register(j, Default::default()).await.unwrap();
}

#[tokio::test]
async fn prefix_search_lists_matches_per_context_and_truncates_at_twenty() {
    let ts = TestServer::new();
    for i in 0..22 {
        register(&ts, &format!("example-{i:02}"), "redis:7").await;
    }
    register(&ts, "other", "redis:7").await;
    let (status, v) = call(&ts, "/v1/search", None, json!({"Prefix": "example", "Context": "jobs"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let jobs = v["Matches"]["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 20);
    assert_eq!((jobs[0].clone(), jobs[19].clone()), (json!("example-00"), json!("example-19")));
    assert_eq!(v["Truncations"]["jobs"], true);
    assert!(v["Matches"].get("nodes").is_none(), "one context asked, one answered: {v}");

    // All contexts: every one is present; evals of the jobs are found by their ID's prefix,
    // and an odd-length UUID prefix is read as the even one below it.
    let eval = ts.store.snapshot().evals().next().unwrap().id.clone();
    let (_, v) = call(&ts, "/v1/search", None, json!({"Prefix": &eval[..5], "Context": "all"})).await;
    for ctx in ["jobs", "evals", "allocs", "nodes", "deployment", "plugins", "volumes", "vars", "namespaces"] {
        assert!(v["Matches"][ctx].is_array(), "{ctx} missing: {v}");
    }
    assert!(v["Matches"]["evals"].as_array().unwrap().iter().any(|e| e == &json!(eval)), "{v}");
    let (_, v) = call(&ts, "/v1/search", None, json!({"Prefix": "def", "Context": "namespaces"})).await;
    assert_eq!(v["Matches"]["namespaces"], json!(["default"]));

    // A group's scaling policy is found by its ID's prefix.
    let mut scaled = job("scaled", 1);
    scaled.task_groups[0].scaling = Some(nomad_proto::scaling::ScalingPolicy { max: Some(3), ..Default::default() });
    scaled.task_groups[0].tasks[0].config = serde_json::from_value(json!({"command": "/bin/sleep"})).unwrap();
    ts.endpoints.job_register(scaled, Default::default()).await.unwrap();
    let policy = ts.store.snapshot().scaling_policies().next().unwrap().1.id.clone();
    let (_, v) = call(&ts, "/v1/search", None, json!({"Prefix": &policy[..6], "Context": "scaling_policy"})).await;
    assert_eq!(v["Matches"]["scaling_policy"], json!([policy]), "{v}");

    let (status, v) = call(&ts, "/v1/search", None, json!({"Prefix": "x", "Context": "job"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v.as_str().unwrap().starts_with("context must be one of [jobs evals allocs"), "{v}");
    assert!(v.as_str().unwrap().ends_with("or 'all' for all contexts; got \"job\""), "{v}");
}

#[tokio::test]
async fn fuzzy_search_finds_substrings_in_jobs_groups_tasks_and_images_with_their_scope() {
    let ts = TestServer::new();
    register(&ts, "my-example", "redis:7").await;
    register(&ts, "example", "nginx").await;
    let (status, v) = call(&ts, "/v1/search/fuzzy", None, json!({"Text": "EXAM", "Context": "jobs"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // The earlier match first.
    assert_eq!(v["Matches"]["jobs"], json!([{"ID": "example", "Scope": ["default"]}, {"ID": "my-example", "Scope": ["default"]}]));
    let (_, v) = call(&ts, "/v1/search/fuzzy", None, json!({"Text": "redis", "Context": "jobs"})).await;
    assert_eq!(v["Matches"]["images"], json!([{"ID": "redis:7", "Scope": ["default", "my-example", "web", "server"]}]));
    let (_, v) = call(&ts, "/v1/search/fuzzy", None, json!({"Text": "serv", "Context": "all"})).await;
    assert_eq!(v["Matches"]["tasks"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["Matches"]["tasks"][0]["Scope"], json!(["default", "example", "web"]));
    for ctx in ["evals", "deployment", "volumes"] {
        assert!(v["Matches"][ctx].is_array(), "`all` adds the prefix contexts under Nomad's names: {v}");
    }

    let (status, v) = call(&ts, "/v1/search/fuzzy", None, json!({"Text": "e", "Context": "jobs"})).await;
    assert_eq!((status, v), (StatusCode::BAD_REQUEST, json!("fuzzy search query must be at least 2 characters, got 1")));
}

#[tokio::test]
async fn search_shows_only_what_the_token_may_read() {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
    let mgmt_token = {
        let resp = ts
            .router()
            .oneshot(Request::builder().method(Method::POST).uri("/v1/acl/bootstrap").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
        v["SecretID"].as_str().unwrap().to_string()
    };
    register(&ts, "example", "redis").await;
    let (status, v) = call(&ts, "/v1/search", Some(&mgmt_token), json!({"Prefix": "ex", "Context": "jobs"})).await;
    assert_eq!((status, v["Matches"]["jobs"].clone()), (StatusCode::OK, json!(["example"])));
    // The anonymous token may read nothing: refused, as Nomad refuses a search that cannot
    // find anything.
    let (status, _) = call(&ts, "/v1/search", None, json!({"Prefix": "ex", "Context": "all"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A token that reads nodes only: nodes answer, jobs are refused, `all` shows no jobs.
    let rules = r#"node { policy = "read" }"#;
    let policy = json!({"Name": "nodes", "Rules": rules});
    let put = |path: &str, body: Value| {
        let req = Request::builder()
            .method(Method::PUT)
            .uri(path)
            .header("X-Nomad-Token", &mgmt_token)
            .body(Body::from(body.to_string()))
            .unwrap();
        ts.router().oneshot(req)
    };
    assert_eq!(put("/v1/acl/policy/nodes", policy).await.unwrap().status(), StatusCode::OK);
    let resp = put("/v1/acl/token", json!({"Name": "n", "Type": "client", "Policies": ["nodes"]})).await.unwrap();
    let tok: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
    let tok = tok["SecretID"].as_str().unwrap();
    assert_eq!(call(&ts, "/v1/search", Some(tok), json!({"Prefix": "ex", "Context": "jobs"})).await.0, StatusCode::FORBIDDEN);
    let (status, v) = call(&ts, "/v1/search", Some(tok), json!({"Prefix": "ex", "Context": "all"})).await;
    assert_eq!((status, v["Matches"]["jobs"].clone()), (StatusCode::OK, json!([])));
    assert_eq!(call(&ts, "/v1/search", Some(tok), json!({"Prefix": "", "Context": "nodes"})).await.0, StatusCode::OK);
    // A fuzzy search over every namespace is filtered object by object, never refused.
    let (status, v) = call(&ts, "/v1/search/fuzzy?namespace=*", Some(tok), json!({"Text": "exa", "Context": "all"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["Matches"].get("jobs").is_none(), "{v}");
    assert_eq!(v["Truncations"]["jobs"], false, "every context searched has a truncation entry: {v}");
}
