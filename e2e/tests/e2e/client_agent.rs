//! `NOMAD_ADDR` may point at a client agent: it answers its own agent info
//! and forwards the rest of the API to a server.

use std::time::Duration;

use nomad_e2e::{Cluster, ClusterOptions, wait_for};

use crate::job_json;

#[test]
fn a_client_agent_forwards_the_api_and_knows_its_own_node() {
    let c = Cluster::start(ClusterOptions { servers: 1, clients: 1, ..Default::default() }).unwrap();
    let client = c.clients[0].http();
    // Until the client has reached a server it cannot forward; wait for its node to be ready.
    let node_id = wait_for("the client's node to be ready through the client agent", Duration::from_secs(30), || {
        let me = client.get_json("/v1/agent/self").ok()?;
        let id = me["stats"]["client"]["node_id"].as_str()?.to_string();
        let node = client.get_json(&format!("/v1/node/{id}")).ok()?;
        (node["Status"] == "ready").then_some(id)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.clients[0].logs()));
    let r = client.put_json("/v1/jobs", &job_json("via-client")).unwrap();
    assert!(!r["EvalID"].as_str().unwrap().is_empty());
    let on_server = c.servers[0].http().get_json("/v1/job/via-client").unwrap();
    assert_eq!(on_server["ID"], "via-client");
    assert_eq!(client.request("GET", "/v1/job/missing", None).unwrap().status, 404);
    // The CLI's `node status -self` reads the node ID from the agent it talks to.
    let out = std::process::Command::new(nomad_e2e::binary())
        .args(["node", "status", "-self", "-address", &format!("http://{}", c.clients[0].http_addr)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&node_id[..8]), "{stdout}");
}

/// The routes about the agent itself are answered by the agent asked, never forwarded: a client
/// agent's servers, figures and logs; a server-only agent has no client servers (501), a client
/// agent no join or force-leave (501).
#[test]
fn each_agent_answers_for_itself_servers_metrics_and_monitor() {
    let c = Cluster::start(ClusterOptions { servers: 1, clients: 1, ..Default::default() }).unwrap();
    let (server, client) = (c.servers[0].http(), c.clients[0].http());
    let server_rpc = c.servers[0].rpc_addr.clone();
    let servers = wait_for("the client to know its server", Duration::from_secs(30), || {
        let list = client.get_json("/v1/agent/servers").ok()?;
        list.as_array().is_some_and(|l| !l.is_empty()).then_some(list)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.clients[0].logs()));
    assert_eq!(servers, serde_json::json!([server_rpc]));
    for (agent, method, path) in [
        (&server, "GET", "/v1/agent/servers"),
        (&client, "PUT", "/v1/agent/join?address=127.0.0.1:1"),
        (&client, "PUT", "/v1/agent/force-leave?node=x"),
    ] {
        let r = agent.request(method, path, None).unwrap();
        assert_eq!((r.status, r.text().as_str()), (501, "Invalid method"), "{method} {path}");
    }

    // Each agent's own gauges: the client's allocs, the server's Raft.
    let gauges = |agent: &nomad_e2e::http::HttpClient| -> Vec<String> {
        let m = agent.get_json("/v1/metrics").unwrap();
        m["Gauges"].as_array().unwrap().iter().map(|g| g["Name"].as_str().unwrap().to_string()).collect()
    };
    let (client_gauges, server_gauges) = (gauges(&client), gauges(&server));
    assert!(client_gauges.iter().any(|g| g == "nomad.client.allocations.running"), "{client_gauges:?}");
    assert!(!client_gauges.iter().any(|g| g.starts_with("nomad.raft.")), "a client is not a server: {client_gauges:?}");
    assert!(server_gauges.iter().any(|g| g == "nomad.raft.appliedIndex"), "{server_gauges:?}");

    // The client's log lines as they happen: setting its servers (the same one) logs at info.
    let mut lines = client.stream_lines("/v1/agent/monitor?plain=true", Duration::from_secs(30)).unwrap();
    let set = format!("/v1/agent/servers?address={server_rpc}");
    wait_for("the monitor to show the client's server list replaced", Duration::from_secs(30), || {
        let r = client.request("PUT", &set, None).ok()?;
        assert_eq!(r.status, 200, "{}", r.text());
        let line = lines.next_line().ok()?;
        (line.contains("[INFO]") && line.contains("client's server list replaced")).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.clients[0].logs()));
}
