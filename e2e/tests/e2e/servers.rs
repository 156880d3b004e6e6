//! A three-server cluster: election, replication, forwarding, fail-over.

use std::time::Duration;

use nomad_e2e::{Cluster, ClusterOptions, wait_for};

use crate::cli::nomad;
use crate::job_json;

#[test]
fn three_servers_elect_replicate_forward_and_fail_over() {
    let mut c = Cluster::start(ClusterOptions { servers: 3, ..Default::default() }).unwrap();
    let leader = c.wait_for_leader(Duration::from_secs(60)).unwrap();
    let peers = c.servers[0].http().get_json("/v1/status/peers").unwrap();
    assert_eq!(peers.as_array().unwrap().len(), 3, "all three are voters: {peers}");

    // A write through a follower is forwarded and shows up on every server.
    let follower = c.other_server(leader);
    let r = follower.http().put_json("/v1/jobs", &job_json("via-follower")).unwrap();
    let index = r["Index"].as_u64().unwrap();
    for s in &c.servers {
        wait_for("the job to replicate", Duration::from_secs(20), || {
            s.http().get("/v1/job/via-follower").ok().filter(|r| r.index() >= index).map(|_| ())
        })
        .unwrap();
    }

    // Kill the leader: the others elect a new one and keep accepting writes.
    c.servers[leader].kill9().unwrap();
    let new_leader = c.wait_for_leader(Duration::from_secs(60)).unwrap();
    assert_ne!(new_leader, leader);
    let r = c.servers[new_leader].http().put_json("/v1/jobs", &job_json("after-failover")).unwrap();
    assert!(r["Index"].as_u64().unwrap() > index);
    let jobs = c.other_server(new_leader).http().get_json("/v1/jobs").unwrap();
    wait_for("the survivor to list both jobs", Duration::from_secs(20), || {
        let jobs = c.other_server(new_leader).http().get_json("/v1/jobs").ok()?;
        (jobs.as_array()?.len() == 2).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {jobs}"));

    // The killed server comes back, rejoins and catches up.
    c.servers[leader].restart().unwrap();
    wait_for("the restarted server to catch up", Duration::from_secs(60), || {
        let jobs = c.servers[leader].http().get_json("/v1/jobs").ok()?;
        (jobs.as_array()?.len() == 2).then_some(())
    })
    .unwrap();
}

#[test]
fn a_server_gone_for_good_is_removed_with_operator_raft_remove_peer() {
    let mut c = Cluster::start(ClusterOptions { servers: 3, ..Default::default() }).unwrap();
    let leader = c.wait_for_leader(Duration::from_secs(60)).unwrap();
    let (gone, follower) = ((leader + 1) % 3, (leader + 2) % 3);
    let gone_addr = c.servers[gone].rpc_addr.clone();
    c.servers[gone].kill9().unwrap();

    let listed = nomad(&c.servers[follower], &["operator", "raft", "list-peers"]).expect(0, "list-peers");
    assert_eq!(listed.stdout.lines().count(), 4, "a header and three servers:\n{}", listed.stdout);
    assert!(listed.stdout.contains(&gone_addr) && listed.stdout.contains("leader"), "{}", listed.stdout);

    let unknown = nomad(&c.servers[follower], &["operator", "raft", "remove-peer", "-peer-address", "10.9.9.9:4647"]);
    let unknown = unknown.expect(1, "an address not in the configuration");
    assert!(unknown.stderr.contains("was not found in the Raft configuration"), "{}", unknown.stderr);
    let missing = nomad(&c.servers[follower], &["operator", "raft", "remove-peer"]).expect(1, "no peer given");
    assert!(missing.stderr.contains("-peer-id or -peer-address"), "{}", missing.stderr);

    // Asked of a follower, carried out by the leader.
    let removed = nomad(&c.servers[follower], &["operator", "raft", "remove-peer", "-peer-address", &gone_addr]);
    assert!(removed.expect(0, "remove-peer").stdout.contains(&gone_addr));
    for i in [leader, follower] {
        wait_for("the survivors to list two voters", Duration::from_secs(20), || {
            let conf = c.servers[i].http().get_json("/v1/operator/raft/configuration").ok()?;
            let servers = conf["Servers"].as_array()?.clone();
            (servers.len() == 2 && servers.iter().all(|s| s["Voter"] == true && s["Address"] != gone_addr.as_str())).then_some(())
        })
        .unwrap();
    }
    let r = c.servers[follower].http().put_json("/v1/jobs", &job_json("after-removal")).unwrap();
    assert!(r["Index"].as_u64().unwrap() > 0, "the two remaining servers commit");
}

#[test]
fn a_server_without_the_cluster_key_neither_forms_a_cluster_nor_joins_one() {
    let c = Cluster::start(ClusterOptions { servers: 3, ..Default::default() }).unwrap();
    let leader = c.wait_for_leader(Duration::from_secs(60)).unwrap();
    let join: Vec<String> = c.servers.iter().map(|s| format!("{:?}", s.rpc_addr)).collect();
    let dir = tempfile::tempdir().unwrap();

    // Told to form or join a cluster with no key at all, the agent does not start, and says why.
    let config = dir.path().join("no-key.hcl");
    std::fs::write(&config, format!("server {{\n  enabled = true\n  bootstrap_expect = 3\n  retry_join = [{}]\n}}\n", join.join(", ")))
        .unwrap();
    let out = std::process::Command::new(nomad_e2e::binary())
        .args(["agent", "-bind", "127.0.0.1", "-http-port", "0", "-rpc-port", "0", "-config"])
        .arg(&config)
        .arg("-data-dir")
        .arg(dir.path().join("no-key"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("server.encrypt") && said.contains("operator keygen"), "{said}");

    // With another cluster's key it starts, but every server refuses its join.
    let other_key = nomad_e2e::cluster::cluster_key().unwrap();
    let config = format!(
        "server {{\n  enabled = true\n  encrypt = {other_key:?}\n  bootstrap_expect = 0\n  retry_join = [{}]\n}}\n",
        join.join(", ")
    );
    let stranger = nomad_e2e::Agent::start(
        "stranger",
        &dir.path().join("stranger"),
        nomad_e2e::AgentOptions { config: Some(config), ..Default::default() },
    )
    .unwrap();
    wait_for("the stranger's join to be refused", Duration::from_secs(30), || {
        stranger.logs().contains("servers of this cluster only").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", stranger.logs()));
    let peers = c.servers[leader].http().get_json("/v1/status/peers").unwrap();
    assert_eq!(peers.as_array().unwrap().len(), 3, "still three servers: {peers}");
    assert!(!peers.to_string().contains(&stranger.rpc_addr), "{peers}");
}
