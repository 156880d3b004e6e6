//! A three-server cluster: election, replication, forwarding, fail-over.

use std::time::Duration;

use nomad_e2e::{Cluster, ClusterOptions, wait_for};

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
