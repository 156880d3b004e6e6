//! Nomad Variables and the keyring through the real router.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use nomad_proto::variables::root_key_state;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::acl::AclConfig;
use crate::consensus::Consensus as _;
use crate::leader::{KeyringConfig, KeyringLoop};
use crate::testing::TestServer;

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn index(&self) -> u64 {
        self.headers.get("x-nomad-index").expect("X-Nomad-Index").to_str().unwrap().parse().unwrap()
    }
}

async fn call(ts: &TestServer, method: Method, path: &str, token: Option<&str>, body: Value) -> Reply {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        b = b.header("X-Nomad-Token", t);
    }
    let body = if body.is_null() { Body::empty() } else { Body::from(body.to_string()) };
    let resp = tokio::time::timeout(Duration::from_secs(30), ts.router().oneshot(b.body(body).unwrap())).await.expect("answers").unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = String::from_utf8_lossy(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).into_owned();
    Reply { status, headers, body }
}

fn keyring_loop(ts: &TestServer, config: KeyringConfig) -> KeyringLoop {
    KeyringLoop::new(ts.store.clone(), ts.consensus.clone(), ts.endpoints.keyring().clone(), config)
}

/// A server whose leader made its first root key.
async fn server() -> TestServer {
    let ts = TestServer::new();
    keyring_loop(&ts, KeyringConfig::default()).ensure_and_rekey(nomad_proto::Timestamp::now()).await.unwrap();
    assert!(ts.store.snapshot().active_root_key().is_some());
    ts
}

fn items(pairs: &[(&str, &str)]) -> Value {
    json!({ "Items": pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>() })
}

#[tokio::test]
async fn write_read_list_and_delete_in_nomads_shapes() {
    let ts = server().await;
    let r = call(&ts, Method::PUT, "/v1/var/app/db", None, items(&[("user", "admin"), ("password", "s3cret")])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["Namespace"].as_str(), v["Path"].as_str(), v["Items"]["password"].as_str()),
        (Some("default"), Some("app/db"), Some("s3cret"))
    );
    let created = v["CreateIndex"].as_u64().unwrap();
    assert!(created > 0 && v["ModifyIndex"] == created && v["CreateTime"].as_i64().unwrap() > 1_600_000_000_000_000_000, "{v}");

    let r = call(&ts, Method::GET, "/v1/var/app/db", None, Value::Null).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["Items"], json!({"user": "admin", "password": "s3cret"}));
    assert_eq!(r.index(), created);

    let r = call(&ts, Method::GET, "/v1/var/app/missing", None, Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::NOT_FOUND, "variable not found"));
    assert!(r.index() >= created);

    call(&ts, Method::PUT, "/v1/var/app/cache", None, items(&[("k", "v")])).await;
    call(&ts, Method::PUT, "/v1/var/other", None, items(&[("k", "v")])).await;
    let list = call(&ts, Method::GET, "/v1/vars?prefix=app", None, Value::Null).await.json();
    let paths: Vec<&str> = list.as_array().unwrap().iter().map(|m| m["Path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["app/cache", "app/db"]);
    assert!(list.as_array().unwrap().iter().all(|m| m.get("Items").is_none()), "lists never carry items: {list}");
    let empty = call(&ts, Method::GET, "/v1/vars?prefix=zzz", None, Value::Null).await;
    assert_eq!(empty.body, "[]");

    let r = call(&ts, Method::DELETE, "/v1/var/app/db", None, Value::Null).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::NO_CONTENT, ""));
    assert_eq!(call(&ts, Method::GET, "/v1/var/app/db", None, Value::Null).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn check_and_set_conflicts_answer_409_with_the_current_variable() {
    let ts = server().await;
    let first = call(&ts, Method::PUT, "/v1/var/a?cas=0", None, items(&[("k", "1")])).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let index = first.json()["ModifyIndex"].as_u64().unwrap();
    // cas=0 means "only if absent".
    let r = call(&ts, Method::PUT, "/v1/var/a?cas=0", None, items(&[("k", "2")])).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!((r.json()["Items"]["k"].as_str(), r.json()["ModifyIndex"].as_u64()), (Some("1"), Some(index)));
    let r = call(&ts, Method::PUT, &format!("/v1/var/a?cas={index}"), None, items(&[("k", "2")])).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.json()["CreateIndex"].as_u64(), Some(index), "create index kept");
    // A cas against a variable that does not exist answers a zero value.
    let r = call(&ts, Method::PUT, "/v1/var/none?cas=7", None, items(&[("k", "1")])).await;
    assert_eq!((r.status, r.json()["Path"].as_str()), (StatusCode::CONFLICT, Some("")));
    let r = call(&ts, Method::DELETE, &format!("/v1/var/a?cas={index}"), None, Value::Null).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(call(&ts, Method::GET, "/v1/var/a", None, Value::Null).await.json()["Items"]["k"], "2");
    let r = call(&ts, Method::PUT, "/v1/var/a?cas=x", None, items(&[("k", "1")])).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn bad_writes_are_refused_with_nomads_messages() {
    let ts = server().await;
    let cases: [(&str, Value, &str); 6] = [
        ("/v1/var/a", json!({"Items": {}}), "variable missing required Items object"),
        ("/v1/var/nomad/other", items(&[("k", "v")]), "only paths at \"nomad/jobs\""),
        ("/v1/var/a.b", items(&[("k", "v")]), "invalid path \"a.b\""),
        ("/v1/var/a", json!({"Items": {"k": "x".repeat(65536)}}), "variables are limited to 64KiB in total size"),
        ("/v1/var/a?namespace=nope", items(&[("k", "v")]), "namespace \"nope\" does not exist"),
        ("/v1/var/a?namespace=*", items(&[("k", "v")]), "wildcard"),
    ];
    for (path, body, want) in cases {
        let r = call(&ts, Method::PUT, path, None, body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert!(r.body.contains(want), "{path}: {}", r.body);
    }
    assert_eq!(ts.store.snapshot().variables_with_prefix("*", "").count(), 0);
    // The body's namespace wins over the query's.
    ts.consensus
        .apply(crate::fsm::Command::NamespaceUpsert {
            namespaces: vec![nomad_proto::Namespace { name: "prod".into(), ..Default::default() }],
        })
        .await
        .unwrap();
    let r = call(&ts, Method::PUT, "/v1/var/a?namespace=default", None, json!({"Namespace": "prod", "Items": {"k": "v"}})).await;
    assert_eq!(r.json()["Namespace"], "prod");
    assert!(ts.store.snapshot().variable("prod", "a").is_some());
    // A namespace that holds variables is not deleted.
    let err = ts.consensus.apply(crate::fsm::Command::NamespaceDelete { names: vec!["prod".into()] }).await.unwrap_err();
    assert!(err.to_string().contains("contains at least one variable"), "{err}");
}

#[tokio::test]
async fn rotate_full_re_encrypts_every_variable_and_the_old_key_goes() {
    let ts = server().await;
    let first = ts.store.snapshot().active_root_key().unwrap().meta.key_id.clone();
    for i in 0..70 {
        call(&ts, Method::PUT, &format!("/v1/var/app/{i}"), None, items(&[("n", &i.to_string())])).await;
    }
    let r = call(&ts, Method::PUT, "/v1/operator/keyring/rotate?full=true", None, Value::Null).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let second = r.json()["Key"]["KeyID"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    assert_eq!(r.json()["Key"]["State"], root_key_state::ACTIVE);
    let keys = call(&ts, Method::GET, "/v1/operator/keyring/keys", None, Value::Null).await.json();
    let state_of = |id: &str| keys.as_array().unwrap().iter().find(|k| k["KeyID"] == id).unwrap()["State"].clone();
    assert_eq!(state_of(&first), root_key_state::REKEYING);
    assert!(keys.to_string().find("wrapped").is_none(), "no key material in the API: {keys}");

    let lp = keyring_loop(&ts, KeyringConfig { gc_threshold: Duration::ZERO, ..KeyringConfig::default() });
    let mut passes = 0;
    while lp.ensure_and_rekey(nomad_proto::Timestamp::now()).await.unwrap() {
        passes += 1;
        assert!(passes < 10, "rekeying does not end");
    }
    let snap = ts.store.snapshot();
    assert_eq!(snap.variables_using_key(&first), 0);
    assert_eq!(snap.variables_using_key(&second), 70);
    assert_eq!(snap.root_key(&first).unwrap().meta.state, root_key_state::INACTIVE);
    assert_eq!(call(&ts, Method::GET, "/v1/var/app/42", None, Value::Null).await.json()["Items"]["n"], "42");
    // The old key encrypts nothing and signed no live alloc's identity: the GC deletes it.
    assert_eq!(lp.collect(nomad_proto::Timestamp::now().add_nanos(1)).await.unwrap(), 1);
    assert!(ts.store.snapshot().root_key(&first).is_none());
    let r = call(&ts, Method::DELETE, &format!("/v1/operator/keyring/key/{second}"), None, Value::Null).await;
    assert!(r.body.contains("active root key cannot be deleted"), "{}", r.body);
}

#[tokio::test]
async fn an_active_key_past_its_threshold_is_replaced() {
    let ts = server().await;
    let first = ts.store.snapshot().active_root_key().unwrap().meta.key_id.clone();
    let lp = keyring_loop(&ts, KeyringConfig { rotation_threshold: Duration::from_secs(3600), ..KeyringConfig::default() });
    lp.ensure_and_rekey(nomad_proto::Timestamp::now()).await.unwrap();
    assert_eq!(ts.store.snapshot().active_root_key().unwrap().meta.key_id, first, "not due yet");
    lp.ensure_and_rekey(nomad_proto::Timestamp::now().add_nanos(3601 * 1_000_000_000)).await.unwrap();
    assert_ne!(ts.store.snapshot().active_root_key().unwrap().meta.key_id, first);
}

#[tokio::test]
async fn acl_path_rules_decide_each_operation() {
    let mut ts = server().await;
    ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
    let mgmt = call(&ts, Method::POST, "/v1/acl/bootstrap", None, Value::Null).await.json()["SecretID"].as_str().unwrap().to_string();
    let rules = r#"namespace "default" {
      policy = "write"
      variables {
        path "app/*" { capabilities = ["read"] }
        path "drop/*" { capabilities = ["write"] }
      }
    }"#;
    let r = call(&ts, Method::PUT, "/v1/acl/policy/vars", Some(&mgmt), json!({"Name": "vars", "Rules": rules})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let tok = call(&ts, Method::POST, "/v1/acl/token", Some(&mgmt), json!({"Name": "t", "Type": "client", "Policies": ["vars"]})).await;
    let tok = tok.json()["SecretID"].as_str().unwrap().to_string();
    for p in ["app/db", "secret/x", "drop/box"] {
        assert_eq!(call(&ts, Method::PUT, &format!("/v1/var/{p}"), Some(&mgmt), items(&[("k", "v")])).await.status, StatusCode::OK);
    }
    let status = |r: Reply| r.status;
    assert_eq!(status(call(&ts, Method::GET, "/v1/var/app/db", Some(&tok), Value::Null).await), StatusCode::OK);
    assert_eq!(status(call(&ts, Method::GET, "/v1/var/secret/x", Some(&tok), Value::Null).await), StatusCode::FORBIDDEN);
    assert_eq!(status(call(&ts, Method::GET, "/v1/var/app/db", None, Value::Null).await), StatusCode::FORBIDDEN);
    assert_eq!(status(call(&ts, Method::PUT, "/v1/var/app/db", Some(&tok), items(&[("k", "w")])).await), StatusCode::FORBIDDEN);
    assert_eq!(status(call(&ts, Method::DELETE, "/v1/var/app/db", Some(&tok), Value::Null).await), StatusCode::FORBIDDEN);
    // `read` implies `list`; a namespace `policy` grants nothing on variables.
    let list = call(&ts, Method::GET, "/v1/vars", Some(&tok), Value::Null).await.json();
    let paths: Vec<&str> = list.as_array().unwrap().iter().map(|m| m["Path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["app/db"]);
    // Write without read: a conflict shows the current metadata but not its items.
    let r = call(&ts, Method::PUT, "/v1/var/drop/box?cas=0", Some(&tok), items(&[("k", "mine")])).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(r.json()["Path"], "drop/box");
    assert_eq!(r.json()["Items"], json!({}), "no items without read: {}", r.body);
    // The keyring is management's.
    assert_eq!(status(call(&ts, Method::GET, "/v1/operator/keyring/keys", Some(&tok), Value::Null).await), StatusCode::FORBIDDEN);
    assert_eq!(status(call(&ts, Method::GET, "/v1/operator/keyring/keys", Some(&mgmt), Value::Null).await), StatusCode::OK);
}

#[tokio::test]
async fn variable_events_carry_metadata_and_never_items() {
    let ts = server().await;
    let keyring = ts.endpoints.keyring().clone();
    let snap = ts.store.snapshot();
    let meta = nomad_proto::variables::VariableMetadata { namespace: "default".into(), path: "app/db".into(), ..Default::default() };
    let items = [("password".to_string(), "hunter2-in-an-event".to_string())].into_iter().collect();
    let variable = keyring.encrypt(&snap, meta, &items).unwrap();
    let now = nomad_proto::Timestamp::now();
    for (op, ty) in [(crate::state::VarOp::Set, "VariableUpserted"), (crate::state::VarOp::Delete, "VariableDeleted")] {
        let cmd = crate::fsm::Command::VariableApply { op, variable: variable.clone(), now };
        let (_, changes) = ts.store.write_with_changes(snap.index + 10, |txn| crate::fsm::apply_command(txn, &cmd)).unwrap();
        let batch = crate::events::batch_for(7, &cmd, &changes).expect("a batch");
        let e = &batch.events[0];
        assert_eq!((e.topic.as_str(), e.event_type.as_str(), e.key.as_str(), e.namespace.as_str()), ("Variables", ty, "app/db", "default"));
        assert_eq!(e.payload["Variable"]["Path"], "app/db");
        let text = e.payload.to_string();
        assert!(!text.contains("hunter2") && !text.contains(&variable.data) && !text.contains("Items"), "{text}");
    }
}
