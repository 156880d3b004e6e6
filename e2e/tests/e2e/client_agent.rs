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
