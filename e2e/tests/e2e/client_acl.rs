//! ACLs on the client routes of a client-only agent: it resolves the caller's token through its
//! server (`Node.ResolveToken`) and applies the servers' table with its own allocs' namespaces;
//! what it sends on to its server carries the caller's token, and is checked there and on the
//! alloc's node again. What it answers itself (`/v1/agent/self`) passes the same table.

use std::process::Command;

use nomad_e2e::{Cluster, ClusterOptions, wait_for};
use serde_json::json;

use crate::SETTLE;

/// `nomad-rs alloc exec` as `token` through `addr`: exit code, stdout, stderr.
fn exec_as(addr: &str, token: &str, alloc_id: &str) -> (i32, String, String) {
    let out = Command::new(nomad_e2e::binary())
        .args(["alloc", "exec", "-address", &format!("http://{addr}"), "-t=false", "-task", "t", alloc_id, "cat", "marker"])
        .env("NOMAD_TOKEN", token)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_client_agent_authorizes_its_routes_with_the_callers_token() {
    let c = Cluster::start(ClusterOptions {
        servers: 1,
        clients: 2,
        agent_config: "acl {\n  enabled = true\n}\n".into(),
        ..Default::default()
    })
    .unwrap();
    let anon = c.servers[0].http();
    let boot = anon.put_json("/v1/acl/bootstrap", &json!({})).unwrap();
    let mgmt = boot["SecretID"].as_str().unwrap().to_string();
    let server = anon.with_token(&mgmt);
    server.put_json("/v1/namespace/a", &json!({"Name": "a"})).unwrap();
    let rules = "namespace \"a\" {\n  capabilities = [\"read-logs\"]\n}\n";
    server.put_json("/v1/acl/policy/logs-a", &json!({"Name": "logs-a", "Rules": rules})).unwrap();
    let tok = server.put_json("/v1/acl/token", &json!({"Name": "logs", "Type": "client", "Policies": ["logs-a"]})).unwrap();
    let logs_token = tok["SecretID"].as_str().unwrap().to_string();

    let mut alloc_in = std::collections::BTreeMap::new();
    for ns in ["a", "default"] {
        let job = json!({"Job": {
            "ID": format!("logs-{ns}"), "Namespace": ns, "Type": "service", "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "g", "Count": 1,
                "Tasks": [{"Name": "t", "Driver": "raw_exec",
                    "Config": {"command": "/bin/sh", "args": ["-c", format!("echo hello-from-{ns}; echo in-{ns} > marker; exec sleep 300")]},
                    "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}});
        server.put_json(&format!("/v1/jobs?namespace={ns}"), &job).unwrap();
        let id = wait_for("the alloc to run", SETTLE, || {
            let allocs = server.get_json(&format!("/v1/job/logs-{ns}/allocations?namespace={ns}")).ok()?;
            let a = allocs.as_array()?.first()?;
            (a["ClientStatus"] == "running").then(|| a["ID"].as_str().unwrap().to_string())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", c.servers[0].logs(), c.clients[0].logs()));
        alloc_in.insert(ns, id);
    }

    // Through each client-only agent: one runs the alloc, the other sends the request on
    // through the server to it, with the caller's token, and every hop authorizes it.
    for agent in &c.clients {
        // Through the client-only agent: read-logs in `a` reads the logs of the alloc in `a`...
        let client = agent.http().with_token(&logs_token);
        let logs = |ns: &str| format!("/v1/client/fs/logs/{}?task=t&type=stdout&plain=true", alloc_in[ns]);
        wait_for("the task's stdout through the client agent", SETTLE, || {
            let r = client.request("GET", &logs("a"), None).ok()?;
            assert_ne!(r.status, 403, "{}", r.text());
            (r.status == 200 && r.text().contains("hello-from-a")).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        // The agent's own info needs agent read, as on a server: not anonymous, not read-logs.
        let r = agent.http().request("GET", "/v1/agent/self", None).unwrap();
        assert_eq!((r.status, r.text()), (403, "Permission denied".to_string()));
        assert_eq!(client.request("GET", "/v1/agent/self", None).unwrap().status, 403);
        let me = agent.http().with_token(&mgmt).get_json("/v1/agent/self").unwrap();
        assert!(me["stats"]["client"]["node_id"].is_string(), "{me}");
        assert_eq!(me["config"]["ACL"]["Enabled"], true, "the agent reports its ACLs as on");
        // ... and nothing in `default`, nor anything but logs.
        let r = client.request("GET", &logs("default"), None).unwrap();
        assert_eq!((r.status, r.text()), (403, "Permission denied".to_string()));
        let r = client.request("GET", &format!("/v1/client/fs/cat/{}?path=marker", alloc_in["a"]), None).unwrap();
        assert_eq!(r.status, 403, "{}", r.text());
        let r = agent.http().with_token("00000000-0000-0000-0000-000000000000").request("GET", &logs("a"), None).unwrap();
        assert_eq!((r.status, r.text()), (403, "ACL token not found".to_string()));
        let client_addr = &agent.http_addr;
        let (code, out, err) = exec_as(client_addr, &logs_token, &alloc_in["a"]);
        assert_ne!(code, 0, "{out}{err}");
        assert!(err.contains("403") || err.contains("Permission denied"), "{err}");
        // A management token may exec (raw_exec: alloc-node-exec too), through the client agent.
        let (code, out, err) = exec_as(client_addr, &mgmt, &alloc_in["a"]);
        assert_eq!((code, out.trim()), (0, "in-a"), "{err}");
    }
}
