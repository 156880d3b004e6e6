//! `alloc exec` for an alloc that runs on another node: the CLI pointed at a server (which
//! relays the websocket to the alloc's node) and at another client-only agent (which goes
//! through its server, as Nomad's client agents do) runs the command there, with stdin, stdout,
//! stderr and the exit code; `alloc fs` takes the same way.

use std::io::Write;
use std::process::{Command, Stdio};

use nomad_e2e::{Cluster, ClusterOptions, wait_for};
use serde_json::json;

use crate::SETTLE;

/// `nomad-rs alloc exec -address <addr> -task t <alloc> <command...>` with `stdin`: stdout,
/// stderr, exit code.
fn exec_via(addr: &str, alloc_id: &str, command: &[&str], stdin: &str) -> (String, String, i32) {
    let mut child = Command::new(nomad_e2e::binary())
        .args(["alloc", "exec", "-address", &format!("http://{addr}"), "-t=false", "-task", "t", alloc_id])
        .args(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), out.status.code().unwrap_or(-1))
}

#[test]
fn alloc_exec_and_fs_reach_an_alloc_on_another_node_through_a_server_and_a_client_agent() {
    let c = Cluster::start(ClusterOptions { servers: 1, clients: 2, ..Default::default() }).unwrap();
    let node_of = |i: usize| {
        let http = c.clients[i].http();
        wait_for("the client's node to be ready", SETTLE, || {
            let me = http.get_json("/v1/agent/self").ok()?;
            let id = me["stats"]["client"]["node_id"].as_str()?.to_string();
            let node = http.get_json(&format!("/v1/node/{id}")).ok()?;
            (node["Status"] == "ready").then_some(id)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", c.clients[i].logs()))
    };
    let (_first, second) = (node_of(0), node_of(1));
    let server = c.servers[0].http();
    let job = json!({"Job": {
        "ID": "far", "Type": "service", "Datacenters": ["dc1"],
        "Constraints": [{"LTarget": "${node.unique.id}", "RTarget": second, "Operand": "="}],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Tasks": [{"Name": "t", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", "echo far-away > marker; exec sleep 300"]},
                "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}});
    server.put_json("/v1/jobs", &job).unwrap();
    let alloc_id = wait_for("the alloc to run on the second client", SETTLE, || {
        let allocs = server.get_json("/v1/job/far/allocations").ok()?;
        let a = allocs.as_array()?.first()?;
        (a["ClientStatus"] == "running" && a["NodeID"] == second.as_str()).then(|| a["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.clients[1].logs()));

    let script = ["/bin/sh", "-c", "read x; echo got-$x in $(cat marker); echo oops >&2; exit 3"];
    for (via, addr) in [("the server", &c.servers[0].http_addr), ("the first client", &c.clients[0].http_addr)] {
        let (out, err, code) = exec_via(addr, &alloc_id, &script, "hello\n");
        assert_eq!((out.as_str(), code), ("got-hello in far-away\n", 3), "via {via}: {err}\n{}", c.clients[0].logs());
        assert!(err.contains("oops"), "via {via}: {err}");
        let cat = c.clients[0].http().request("GET", &format!("/v1/client/fs/cat/{alloc_id}?path=t/marker"), None).unwrap();
        assert_eq!((cat.status, cat.text().as_str()), (200, "far-away\n"), "alloc fs via the first client");
    }
    // An alloc no node runs is refused as Nomad's agent refuses it.
    let missing = c.clients[0].http().request("GET", "/v1/client/fs/cat/00000000-0000-4000-8000-000000000000?path=x", None).unwrap();
    assert_eq!(missing.status, 404, "{}", missing.text());
}
