//! `var put|get|list|purge|init` and `operator root keyring list|rotate|remove` against an
//! in-process server whose leader made its first root key.

use nomad_server::leader::{KeyringConfig, KeyringLoop};
use nomad_server::testing::TestServer;
use serde_json::Value;

use crate::support::{Api, Run, nomad, nomad_with};

async fn api_with_keyring() -> Api {
    let ts = TestServer::new();
    let keyring = KeyringLoop::new(ts.store.clone(), ts.consensus.clone(), ts.endpoints.keyring().clone(), KeyringConfig::default());
    keyring.ensure_and_rekey(nomad_proto::Timestamp::now()).await.expect("first root key");
    Api::serving(ts).await
}

/// Runs `nomad-rs <args> -address <api>` with `stdin`.
async fn with_stdin(api: &Api, args: &[&str], stdin: &str) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-address", &api.addr]);
    nomad_with(&all, &[], stdin).await
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n--- stderr\n{}", run.stdout, run.stderr))
}

/// The index in `Created variable "<path>" with modify index N`.
fn created_index(run: &Run, path: &str) -> u64 {
    let prefix = format!("Created variable \"{path}\" with modify index ");
    let line = run.stdout.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {prefix:?} in\n{}", run.stdout));
    line.trim().parse().unwrap()
}

/// The rows of a table under its header, split on whitespace.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines().skip(1).map(|l| l.split_whitespace().map(String::from).collect()).collect()
}

#[tokio::test]
async fn put_get_list_purge_and_check_and_set_from_the_cli() {
    let api = api_with_keyring().await;
    let dir = tempfile::tempdir().unwrap();

    // Pairs.
    let put = api.nomad(&["var", "put", "-out", "none", "app/db", "user=admin", "password=s3cret"]).await;
    put.expect_code(0);
    let first = created_index(&put, "app/db");

    // A specification file, with a value from a file on top.
    let spec = dir.path().join("cache.nv.hcl");
    std::fs::write(&spec, "path = \"app/cache\"\nitems {\n  host = \"10.0.0.1\"\n  port = 6379\n}\n").unwrap();
    let cert = dir.path().join("cert.pem");
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
    let spec_arg = format!("@{}", spec.display());
    let cert_arg = format!("tls=@{}", cert.display());
    let put = api.nomad(&["var", "put", "-out", "json", &spec_arg, &cert_arg]).await;
    put.expect_code(0);
    let v = json(&put);
    assert_eq!(v["Path"], "app/cache");
    assert_eq!(v["Namespace"], "default");
    assert_eq!(v["Items"]["host"], "10.0.0.1");
    assert_eq!(v["Items"]["port"], "6379", "numbers in HCL items become strings");
    assert_eq!(v["Items"]["tls"], "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");

    // A JSON specification on stdin, and a value from stdin.
    let put = with_stdin(&api, &["var", "put", "-out", "none", "-"], r#"{"Path":"app/stdin","Items":{"a":"1"}}"#).await;
    put.expect_code(0);
    created_index(&put, "app/stdin");
    let put = with_stdin(&api, &["var", "put", "-in", "hcl", "-out", "none", "app/token", "-"], "items { token = \"t0k\" }\n").await;
    put.expect_code(0);
    created_index(&put, "app/token");
    with_stdin(&api, &["var", "put", "-out", "none", "app/piped", "secret=-"], "line one\nline two\n").await.expect_code(0);
    let got = api.nomad(&["var", "get", "-item", "secret", "app/piped"]).await;
    assert_eq!(got.expect_code(0).stdout, "line one\nline two\n", "the item as stored, no newline added");

    // An existing path without -force or -check-index conflicts: Nomad's message, exit 1.
    let conflict = api.nomad(&["var", "put", "app/db", "user=other"]).await;
    conflict
        .expect_code(1)
        .stderr_has("Check-and-Set conflict")
        .stderr_has(&format!("Your provided check-index (0) does not match the server-side index ({first})"));
    let unwrapped = conflict.stderr.replace("\n    ", " ");
    assert!(unwrapped.contains("The server-side item was last updated on "), "{}", conflict.stderr);
    assert!(unwrapped.contains(&format!("add the -force or -check-index={first} flag")), "{}", conflict.stderr);
    assert!(conflict.stdout.is_empty(), "{}", conflict.stdout);
    let got = api.nomad(&["var", "get", "-item", "user", "app/db"]).await;
    assert_eq!(got.expect_code(0).stdout, "admin", "the conflicting write changed nothing");

    // The right -check-index goes through (the items are the ones given: a put replaces them).
    let index = first.to_string();
    let put = api.nomad(&["var", "put", "-out", "none", "-check-index", &index, "app/db", "user=root", "password=s3cret"]).await;
    put.expect_code(0);
    let second = created_index(&put, "app/db");
    assert!(second > first);

    // `k=` removes an item; a key that is no identifier warns.
    let put = api.nomad(&["var", "put", "-force", "-out", "json", "app/db", "password=", "db.name=main", "user=root"]).await;
    put.expect_code(0)
        .stderr_has("Variable Warnings:\n1 warning:\n\n* \"db.name\" contains characters [\".\"] that require the 'index' function");
    let v = json(&put);
    assert_eq!(v["Items"], serde_json::json!({ "db.name": "main", "user": "root" }));

    // get: -out json (the default when stdout is not a terminal), -out table.
    let got = api.nomad(&["var", "get", "app/db"]).await;
    let v = json(got.expect_code(0));
    assert_eq!((v["Namespace"].as_str(), v["Path"].as_str()), (Some("default"), Some("app/db")));
    assert_eq!(v["Items"]["user"], "root");
    let third = v["ModifyIndex"].as_u64().unwrap();
    assert!(third > second);
    let table = api.nomad(&["var", "get", "-out", "table", "app/db"]).await;
    table
        .expect_code(0)
        .stdout_has("Namespace   = default\nPath        = app/db\n")
        .stdout_has(&format!("Check Index = {third}\n\nItems\ndb.name = main\nuser    = root"));
    api.nomad(&["var", "get", "app/missing"]).await.expect_code(1).stderr_has("Variable not found");
    api.nomad(&["var", "get", "-item", "nope", "app/db"]).await.expect_code(1).stderr_has("Variable does not contain \"nope\" item");

    // list: a prefix, Nomad's table, JSON, nothing found, pages.
    let list = api.nomad(&["var", "list", "-out", "table", "app/"]).await;
    list.expect_code(0);
    let header: Vec<&str> = list.stdout.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["Namespace", "Path", "Last", "Updated"]);
    let paths: Vec<String> = rows(&list.stdout).iter().map(|r| format!("{} {}", r[0], r[1])).collect();
    assert_eq!(paths, ["default app/cache", "default app/db", "default app/piped", "default app/stdin", "default app/token"]);
    let list = api.nomad(&["var", "list", "app/c"]).await;
    let v = json(list.expect_code(0));
    assert_eq!(v.as_array().map(Vec::len), Some(1));
    assert_eq!(v[0]["Path"], "app/cache");
    assert!(v[0].get("Items").is_none(), "lists carry no items");
    api.nomad(&["var", "list", "-out", "table", "nothing/"]).await.expect_code(0).stdout_has("No matching variables found");
    let page = api.nomad(&["var", "list", "-out", "terse", "-per-page", "2", "app/"]).await;
    page.expect_code(0).stderr_has("Next page token: ");
    assert_eq!(page.stdout, "app/cache\napp/db\n");

    let filtered = api.nomad(&["var", "list", "-out", "terse", "-filter", "Path contains \"ok\"", "app/"]).await;
    filtered.expect_code(0).stderr_has("Filter queries require a full scan of the data; use prefix searching where possible");
    assert_eq!(filtered.stdout, "app/token\n");
    let all = api.nomad(&["var", "list", "-namespace", "*", "-out", "terse", "app/s"]).await;
    assert_eq!(all.expect_code(0).stdout, "default  app/stdin\n", "every namespace: each path with its namespace");
    let paged = api.nomad(&["var", "list", "-out", "json", "-per-page", "1", "app/"]).await;
    let v = json(paged.expect_code(0));
    assert_eq!(v["Data"][0]["Path"], "app/cache");
    assert!(v["QueryMeta"]["NextToken"].as_str().is_some_and(|t| !t.is_empty()), "{v}");

    // purge, with and without a check index.
    let wrong = api.nomad(&["var", "purge", "-check-index", "1", "app/cache"]).await;
    wrong.expect_code(1).stderr_has("Check-and-Set conflict").stderr_has("Your provided check-index (1) does not match");
    api.nomad(&["var", "purge", "app/cache"]).await.expect_code(0).stdout_has("Successfully purged variable \"app/cache\"!");
    api.nomad(&["var", "get", "app/cache"]).await.expect_code(1).stderr_has("Variable not found");
    let index = third.to_string();
    api.nomad(&["var", "purge", "-check-index", &index, "app/db"]).await.expect_code(0);
    api.nomad(&["var", "get", "app/db"]).await.expect_code(1);

    // Usage errors say what is wrong.
    api.nomad(&["var", "put", "app/x"]).await.expect_code(1).stderr_has("Must supply data");
    api.nomad(&["var", "put", "-namespace", "*", "app/x", "a=1"]).await.expect_code(1).stderr_has("The wildcard namespace (\"*\")");
    api.nomad(&["var", "put", "app/x", "novalue"])
        .await
        .expect_code(1)
        .stderr_has("Failed to parse K=V data: invalid key/value pair \"novalue\"");
    api.nomad(&["var", "get", "-out", "yaml", "app/x"]).await.expect_code(1).stderr_has("Invalid value for \"-out\"");
}

#[tokio::test]
async fn var_init_writes_a_spec_that_var_put_reads() {
    let api = api_with_keyring().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("spec.nv.hcl").display().to_string();
    nomad(&["var", "init", &file]).await.expect_code(0).stdout_has(&format!("Example variable specification written to {file}"));
    nomad(&["var", "init", &file]).await.expect_code(1).stderr_has("already exists");
    let put = api.nomad(&["var", "put", "-out", "json", "from/init", &format!("@{file}")]).await;
    let v = json(put.expect_code(0));
    assert_eq!(v["Items"], serde_json::json!({ "key1": "value 1", "key2": "value 2" }));
}

#[tokio::test]
async fn keyring_list_rotate_and_remove_from_the_cli() {
    let api = api_with_keyring().await;
    let list = api.nomad(&["operator", "root", "keyring", "list"]).await;
    list.expect_code(0);
    assert_eq!(list.stdout.lines().next().unwrap().split_whitespace().collect::<Vec<_>>(), ["Key", "State", "Create", "Time"]);
    let keys = rows(&list.stdout);
    assert_eq!(keys.len(), 1);
    assert_eq!((keys[0][0].len(), keys[0][1].as_str()), (8, "active"));
    let first = keys[0][0].clone();

    // A rotation makes a new active key; the old one stays, inactive.
    let rotated = api.nomad(&["operator", "root", "keyring", "rotate", "-verbose"]).await;
    let new = rows(&rotated.expect_code(0).stdout);
    assert_eq!(new.len(), 1);
    assert_eq!((new[0][0].len(), new[0][1].as_str()), (36, "active"));
    let second = new[0][0].clone();
    let third = rows(&api.nomad(&["operator", "root", "keyring", "rotate", "-full"]).await.expect_code(0).stdout)[0][0].clone();
    assert_eq!(third.len(), 8);

    let list = api.nomad(&["operator", "root", "keyring", "list", "-verbose"]).await;
    let mut states: Vec<(String, String)> = rows(&list.expect_code(0).stdout).into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    states.sort();
    assert_eq!(states.len(), 3);
    assert!(states.iter().any(|(id, s)| id.starts_with(&first) && s == "inactive"), "{states:?}");
    assert!(states.iter().any(|(id, s)| *id == second && s == "inactive"), "{states:?}");
    let (active, _) = states.iter().find(|(_, s)| s == "active").cloned().unwrap();
    assert!(active.starts_with(&third));
    let listed = api.nomad(&["operator", "root", "keyring", "list", "-json"]).await;
    assert_eq!(json(listed.expect_code(0)).as_array().map(Vec::len), Some(3));

    // The second key encrypts nothing: it goes. The active one may not.
    api.nomad(&["operator", "root", "keyring", "remove", &second])
        .await
        .expect_code(0)
        .stdout_has(&format!("Removed encryption key {second}"));
    api.nomad(&["operator", "root", "keyring", "remove", &active])
        .await
        .expect_code(1)
        .stderr_has("error: Unexpected response code: 400 (active root key cannot be deleted - call rotate first)");
    let list = api.nomad(&["operator", "root", "keyring", "list", "-verbose"]).await;
    assert!(!list.expect_code(0).stdout.contains(&second), "{}", list.stdout);
}

/// `job init -list-templates` and `-template`: job templates kept in `nomad/job-templates/*`
/// variables, as Nomad's UI saves them, with Nomad's messages for none, a missing one and one
/// without a `template` item.
#[tokio::test]
async fn job_init_lists_and_writes_job_templates_kept_in_variables() {
    let api = api_with_keyring().await;
    let dir = tempfile::tempdir().unwrap();
    let none = api.nomad(&["job", "init", "-list-templates"]).await;
    none.expect_code(1);
    assert!(none.stderr.contains("No variables in nomad/job-templates"), "{}", none.stderr);

    let tiny = "job \"tiny\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n";
    api.nomad(&["var", "put", "-out", "none", "nomad/job-templates/tiny", &format!("template={tiny}")]).await.expect_code(0);
    api.nomad(&["var", "put", "-out", "none", "nomad/job-templates/broken", "k=v"]).await.expect_code(0);
    let list = api.nomad(&["job", "init", "-list-templates"]).await;
    list.expect_code(0);
    assert_eq!(list.stdout, "Use nomad job init -template=<template> with any of the following:\n  broken\n  tiny\n");

    let file = dir.path().join("tiny.nomad.hcl");
    let file_arg = file.display().to_string();
    let init = api.nomad(&["job", "init", "-template", "tiny", &file_arg]).await;
    init.expect_code(0);
    assert_eq!(init.stdout, format!("Initializing a job template from tiny\nExample job file written to {file_arg}\n"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), tiny);
    let again = api.nomad(&["job", "init", "-template", "tiny", &file_arg]).await;
    again.expect_code(1);
    assert!(again.stderr.contains(&format!("Job '{file_arg}' already exists")), "{}", again.stderr);

    let other = dir.path().join("other.hcl").display().to_string();
    let broken = api.nomad(&["job", "init", "-template", "broken", &other]).await;
    broken.expect_code(1);
    assert!(broken.stderr.contains("Job template \"broken\" is malformed and is missing a template field"), "{}", broken.stderr);
    let missing = api.nomad(&["job", "init", "-template", "nope", &other]).await;
    missing.expect_code(1);
    assert!(missing.stderr.contains("Variable not found"), "{}", missing.stderr);
    assert!(!std::path::Path::new(&other).exists(), "nothing written on a failure");
}
