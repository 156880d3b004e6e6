//! Workload identity: a task with `identity { env = true, file = true }` gets a JWT the servers
//! signed, as `NOMAD_TOKEN` and in `secrets/nomad_token`; with it the task reads and lists its
//! own job's variables (`nomad/jobs/<job>`) and its namespace's services, nothing else, and only
//! while its alloc runs, over the HTTP API and over the task API socket `secrets/api.sock`.

use nomad_e2e::wait_for;
use serde_json::json;

use crate::SETTLE;

/// A dev agent with ACLs on, bootstrapped: the agent and a client with the management token.
pub fn acl_dev_agent(dir: &std::path::Path) -> (nomad_e2e::Agent, nomad_e2e::HttpClient) {
    let opts = nomad_e2e::AgentOptions { args: vec!["-dev".into(), "-acl-enabled".into()], ..Default::default() };
    let agent = nomad_e2e::Agent::start("dev", &dir.join("agent"), opts).expect("start dev agent");
    agent.wait_for_leader(SETTLE).unwrap();
    let anon = agent.http();
    let boot = anon.put_json("/v1/acl/bootstrap", &json!({})).unwrap();
    let mgmt = anon.with_token(boot["SecretID"].as_str().unwrap());
    (agent, mgmt)
}

#[test]
fn a_tasks_identity_reads_its_own_variables_and_nothing_else_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, mgmt) = acl_dev_agent(dir.path());
    let anon = agent.http();
    for (path, v) in [("nomad/jobs/wi", "mine"), ("nomad/jobs/wi/g/t", "task-level"), ("nomad/jobs/other", "theirs"), ("app/secret", "no")]
    {
        wait_for("the variable write (the keyring's first key)", SETTLE, || {
            mgmt.put_json(&format!("/v1/var/{path}"), &json!({"Items": {"v": v}})).ok()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    }
    let job = json!({"Job": {
        "ID": "wi", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Tasks": [{"Name": "t", "Driver": "raw_exec", "Identity": {"Env": true, "File": true},
                "Config": {"command": "/bin/sh", "args": ["-c", "cp secrets/nomad_token local/file_token; printf %s \"$NOMAD_TOKEN\" > local/env_token; exec sleep 300"]},
                "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}});
    mgmt.put_json("/v1/jobs", &job).unwrap();
    let alloc = wait_for("the alloc to run", SETTLE, || {
        let allocs = mgmt.get_json("/v1/job/wi/allocations").ok()?;
        let a = allocs.as_array()?.first()?;
        (a["ClientStatus"] == "running").then(|| a["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let cat = |file: &str| {
        let r = mgmt.request("GET", &format!("/v1/client/fs/cat/{alloc}?path=t/local/{file}"), None).ok()?;
        (r.status == 200 && !r.text().is_empty()).then(|| r.text())
    };
    let token = wait_for("the task to write its token", SETTLE, || cat("env_token")).unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert_eq!(cat("file_token").as_deref(), Some(token.as_str()), "secrets/nomad_token and NOMAD_TOKEN carry the same identity");
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    let wi = anon.with_token(&token);
    let status = |path: &str| wi.request("GET", path, None).unwrap();
    let r = status("/v1/var/nomad/jobs/wi");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().unwrap()["Items"]["v"], "mine");
    assert_eq!(status("/v1/var/nomad/jobs/wi/g/t").json().unwrap()["Items"]["v"], "task-level");
    for denied in ["/v1/var/nomad/jobs/other", "/v1/var/app/secret", "/v1/jobs", "/v1/acl/tokens"] {
        let r = status(denied);
        assert_eq!((r.status, r.text()), (403, "Permission denied".to_string()), "{denied}");
    }
    let listed = status("/v1/vars?prefix=nomad").json().unwrap();
    let paths: Vec<&str> = listed.as_array().unwrap().iter().map(|v| v["Path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["nomad/jobs/wi", "nomad/jobs/wi/g/t"]);
    assert_eq!(status("/v1/services").status, 200);
    // No write, even to its own path.
    let r = wi.request("PUT", "/v1/var/nomad/jobs/wi", Some(json!({"Items": {"v": "x"}}).to_string().as_bytes())).unwrap();
    assert_eq!(r.status, 403);
    // A forged token (claims changed, signature kept) is not a token.
    let mut parts: Vec<&str> = token.split('.').collect();
    let forged_claims = base64_url(
        &json!({"nomad_namespace": "default", "nomad_job_id": "other", "nomad_allocation_id": alloc, "nomad_task": "t"}).to_string(),
    );
    parts[1] = &forged_claims;
    let r = anon.with_token(&parts.join(".")).request("GET", "/v1/var/nomad/jobs/other", None).unwrap();
    assert_eq!((r.status, r.text()), (403, "ACL token not found".to_string()));

    // The task API: the same answers on `secrets/api.sock`, and nothing without the identity.
    let sock = agent.data_dir().join("alloc").join(&alloc).join("t/secrets/api.sock");
    let over_socket = |path: &str, token: Option<&str>| {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap_or_else(|e| panic!("{}: {e}", sock.display()));
        let auth = token.map(|t| format!("X-Nomad-Token: {t}\r\n")).unwrap_or_default();
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let mine = over_socket("/v1/var/nomad/jobs/wi", Some(&token));
    assert!(mine.starts_with("HTTP/1.1 200") && mine.contains("\"mine\""), "{mine}");
    assert!(over_socket("/v1/var/nomad/jobs/other", Some(&token)).starts_with("HTTP/1.1 403"));
    let anonymous = over_socket("/v1/var/nomad/jobs/wi", None);
    assert!(anonymous.starts_with("HTTP/1.1 403") && anonymous.contains("workload identity"), "{anonymous}");

    // Valid only while the alloc runs.
    mgmt.request("DELETE", "/v1/job/wi", None).unwrap();
    wait_for("the token to stop working once the alloc finished", SETTLE, || (status("/v1/var/nomad/jobs/wi").status == 403).then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    wait_for("the task API socket to go with the task", SETTLE, || (!sock.exists()).then_some(())).unwrap();
}

fn base64_url(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

/// Every file under `dir`, recursively, that contains `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn a_variable_is_never_on_disk_in_clear_and_reads_back_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = crate::single_server(dir.path());
    let http = server.http();
    let secret = "correct-horse-battery-staple-4721";
    wait_for("the variable write (the keyring's first key)", SETTLE, || {
        http.put_json("/v1/var/app/db", &json!({"Items": {"password": secret}})).ok()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", server.logs()));
    let r = http.put_json("/v1/operator/keyring/rotate?full=true", &json!({})).unwrap();
    assert_eq!(r["Key"]["State"], "active");
    server.restart().unwrap();
    server.wait_for_leader(SETTLE).unwrap();
    let read = wait_for("the variable after a kill -9", SETTLE, || http.get_json("/v1/var/app/db").ok()).unwrap();
    assert_eq!(read["Items"]["password"], secret);
    // The Raft log, its snapshots and every other file the server wrote: ciphertext only.
    let leaked = files_containing(dir.path(), secret.as_bytes());
    assert!(leaked.is_empty(), "the value is in clear in {leaked:?}");
    // The scan does see the log: the path (metadata, in clear as in Nomad) is there.
    assert!(!files_containing(dir.path(), b"app/db").is_empty(), "the scan found no Raft log");
}
