//! End-to-end tests against real `nomad-rs` processes (one test binary).

mod bridge;
mod cli;
mod client_acl;
mod client_agent;
mod client_restore;
mod connect_mesh;
mod connect_xds;
mod consul_checks;
mod consul_standin;
mod csi_claims;
mod csi_controller;
mod csi_plugin;
mod csi_volume;
mod disconnect;
mod docker;
mod docker_bridge;
mod drain;
mod events;
mod exec_forward;
mod lifecycle;
mod limits;
mod nomad_checks;
mod python_nomad;
mod server_restart;
mod servers;
mod services;
mod templates;
mod tls;
mod workload_identity;

use std::time::Duration;

use nomad_e2e::{Agent, AgentOptions};

/// Generous bound for a cluster to settle on this 2-core machine.
pub const SETTLE: Duration = Duration::from_secs(30);

/// A single server (no client role) in its own temp dir.
pub fn single_server(dir: &std::path::Path) -> Agent {
    let a = Agent::start("server1", dir, AgentOptions { args: vec!["-server".into()], ..Default::default() }).expect("start server");
    a.wait_for_leader(SETTLE).expect("leader");
    a
}

/// A service job in Nomad's JSON shape.
pub fn job_json(id: &str) -> serde_json::Value {
    serde_json::json!({
        "Job": {
            "ID": id,
            "Datacenters": ["dc1"],
            "TaskGroups": [{
                "Name": "web",
                "Count": 1,
                "Tasks": [{ "Name": "server", "Driver": "raw_exec", "Config": { "command": "/bin/sleep", "args": ["300"] } }]
            }]
        }
    })
}
