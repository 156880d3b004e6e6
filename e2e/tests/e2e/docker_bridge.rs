//! A bridge-mode group with a docker task and an exec task on the real Engine and CNI plugins:
//! the docker driver makes the alloc's namespace as an infra container (`nomad_init_<alloc>`,
//! the plugin's `infra_image`), CNI configures it, the docker task joins it
//! (`container:<infra>`) and the exec task enters it. The docker web server answers on its
//! mapped host port; the exec task reaches it on localhost; an agent `kill -9` and restart keeps
//! the same infra and task containers (no second one, no second ADD); stopping the job leaves no
//! container, namespace, veth, lease or rule.
//!
//! The bridge and subnet are the test's own (the `bridge_network_*` client knobs), apart from
//! `bridge.rs`'s, which may run at the same time in this process. Images are imported locally
//! (`nomad_testkit::docker`): no registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use nomad_e2e::{Agent, AgentOptions, wait_for};
use nomad_testkit::Prereq;
use serde_json::json;

use crate::SETTLE;
use crate::bridge::{Cleanup, bridge_ports, http_get, inode, leases_of, rules_with, task_pid};

/// `docker` CLI output (trimmed), or empty when it fails.
pub(crate) fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// IDs of the containers (running or not) labelled with the alloc ID.
pub(crate) fn containers_of(alloc_id: &str) -> Vec<String> {
    let filter = format!("label=com.hashicorp.nomad.alloc_id={alloc_id}");
    docker(&["ps", "-aq", "--no-trunc", "--filter", &filter]).lines().map(str::to_string).collect()
}

/// Removes the alloc's containers whatever happened (the network cleanup is `bridge.rs`'s).
pub(crate) struct Containers(pub(crate) Option<String>);
impl Drop for Containers {
    fn drop(&mut self) {
        if let Some(id) = &self.0 {
            for c in containers_of(id) {
                let _ = Command::new("docker").args(["rm", "-f", &c]).output();
            }
        }
    }
}

#[test]
fn a_bridge_group_with_a_docker_and_an_exec_task_shares_the_infra_containers_namespace_and_leaves_nothing_behind() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Docker, Prereq::Busybox);
    let (busybox, pause) = (nomad_testkit::docker::busybox_image(), nomad_testkit::docker::pause_image());
    let pid = std::process::id();
    let bridge = format!("nrsdb{}", pid % 100_000);
    let subnet = format!("10.{}.{}.0/24", 150 + (pid / 256) % 50, pid % 256);
    let mut cleanup = Cleanup { bridge: bridge.clone(), subnet: subnet.clone(), alloc_id: None, address: None };
    let mut containers = Containers(None);

    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "client {{\n  bridge_network_name = \"{bridge}\"\n  bridge_network_subnet = \"{subnet}\"\n}}\n\
         plugin \"docker\" {{\n  config {{\n    infra_image = \"{pause}\"\n  }}\n}}\n"
    );
    let mut agent = Agent::start(
        "dev",
        dir.path(),
        AgentOptions { args: vec!["-dev".into(), "-log-level".into(), "INFO".into()], config: Some(config), ..Default::default() },
    )
    .unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    wait_for("the dev node to be ready with docker", SETTLE, || {
        let nodes = http.get_json("/v1/nodes").ok()?;
        let id = nodes.as_array()?.iter().find(|n| n["Status"] == "ready")?["ID"].as_str()?.to_string();
        let node = http.get_json(&format!("/v1/node/{id}")).ok()?;
        (node["Drivers"]["docker"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));

    let serve = "echo docker-web-$NOMAD_ALLOC_ID > /local/index.html && exec httpd -f -p 8080 -h /local";
    let probe = "until /bin/busybox wget -q -O /alloc/fetched http://127.0.0.1:8080/index.html; do sleep 0.2; done; exec sleep 600";
    let job = json!({"Job": {
        "ID": "docker-bridged", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Networks": [{"Mode": "bridge", "DynamicPorts": [{"Label": "http", "To": 8080}]}],
            "Tasks": [
                {"Name": "web", "Driver": "docker",
                 "Config": {"image": busybox, "command": "sh", "args": ["-c", serve], "ports": ["http"]},
                 "Resources": {"CPU": 50, "MemoryMB": 64}},
                {"Name": "probe", "Driver": "exec",
                 "Config": {"command": "/bin/sh", "args": ["-c", probe]},
                 "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}});
    http.put_json("/v1/jobs", &job).unwrap();
    let alloc = wait_for("the alloc to run", SETTLE, || {
        let allocs = http.get_json("/v1/job/docker-bridged/allocations").ok()?;
        let id = allocs.as_array()?.first()?["ID"].as_str()?.to_string();
        let alloc = http.get_json(&format!("/v1/allocation/{id}")).ok()?;
        let both = ["web", "probe"].iter().all(|t| alloc["TaskStates"][t]["State"] == "running");
        (both || alloc["ClientStatus"] == "failed").then_some(alloc)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let alloc_id = alloc["ID"].as_str().unwrap().to_string();
    cleanup.alloc_id = Some(alloc_id.clone());
    containers.0 = Some(alloc_id.clone());
    assert_eq!(alloc["ClientStatus"], "running", "{}\n{}", alloc["TaskStates"], agent.logs());
    let address = alloc["NetworkStatus"]["Address"].as_str().unwrap_or_default().to_string();
    cleanup.address = Some(address.clone());
    assert!(address.starts_with(subnet.trim_end_matches("0/24")), "{address} in {subnet}");
    let host_port = alloc["AllocatedResources"]["Shared"]["Ports"][0]["Value"].as_i64().unwrap();

    // One infra container, and the web container joins it.
    let infra_name = format!("nomad_init_{alloc_id}");
    let infra_id = docker(&["inspect", "-f", "{{.Id}}", &infra_name]);
    assert!(!infra_id.is_empty(), "{}", agent.logs());
    let web_id = docker(&["inspect", "-f", "{{.Id}}", &format!("web-{alloc_id}")]);
    assert_eq!(docker(&["inspect", "-f", "{{.HostConfig.NetworkMode}}", &web_id]), format!("container:{infra_id}"));
    let mut both = containers_of(&alloc_id);
    both.sort();
    let mut expected = vec![infra_id.clone(), web_id.clone()];
    expected.sort();
    assert_eq!(both, expected, "the infra container and the web container, nothing else");

    // The namespace: the infra container's, mounted at /var/run/netns/<alloc>, the exec task's.
    let netns = Path::new("/var/run/netns").join(&alloc_id);
    let infra_pid = docker(&["inspect", "-f", "{{.State.Pid}}", &infra_id]);
    let probe_pid = wait_for("the probe process", SETTLE, || task_pid(&alloc_id, "sleep")).unwrap();
    let ns_of = |pid: &str| inode(&PathBuf::from(format!("/proc/{pid}/ns/net")));
    assert!(inode(&netns).is_some());
    assert_eq!(ns_of(&infra_pid), inode(&netns), "the alloc's namespace is the infra container's");
    assert_eq!(ns_of(&probe_pid.to_string()), inode(&netns), "the exec task is in it");
    assert_ne!(inode(Path::new("/proc/self/ns/net")), inode(&netns));

    // The docker web server answers on the mapped host port, and the exec task got its page
    // over the namespace's loopback.
    let page = format!("docker-web-{alloc_id}");
    wait_for("the web server to answer on the host port", SETTLE, || {
        http_get(&format!("127.0.0.1:{host_port}")).filter(|b| b.contains(&page))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let fetched = wait_for("the exec task to fetch the page on localhost", SETTLE, || {
        let r = http.request("GET", &format!("/v1/client/fs/cat/{alloc_id}?path=alloc/fetched"), None).ok()?;
        (r.status == 200 && !r.body.is_empty()).then_some(r.body)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert_eq!(String::from_utf8_lossy(&fetched).trim(), page);

    assert_eq!(bridge_ports(&bridge).len(), 1, "one veth on the bridge");
    assert_eq!(leases_of(&alloc_id).len(), 1, "one IPAM lease");
    assert!(!rules_with(&alloc_id).is_empty(), "portmap and ipMasq rules name the alloc");
    let adds =
        |logs: &str| logs.lines().filter(|l| l.contains("configured the alloc's network namespace") && l.contains(&alloc_id)).count();
    assert_eq!(adds(&agent.logs()), 1);

    // kill -9 and restart: the same containers, no second infra container, no second ADD.
    agent.kill9().unwrap();
    agent.restart().unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    wait_for("the restored agent to reattach", SETTLE, || {
        let stats = http.get_json(&format!("/v1/client/allocation/{alloc_id}/stats")).ok()?;
        (stats["Tasks"].get("web").is_some() && stats["Tasks"].get("probe").is_some()).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let mut after = containers_of(&alloc_id);
    after.sort();
    assert_eq!(after, expected, "the same two containers");
    assert_eq!(docker(&["inspect", "-f", "{{.RestartCount}} {{.State.Running}}", &web_id]), "0 true");
    assert_eq!(adds(&agent.logs()), 1, "no second ADD");
    assert_eq!(task_pid(&alloc_id, "sleep"), Some(probe_pid), "the same exec task process");
    assert!(http_get(&format!("127.0.0.1:{host_port}")).is_some_and(|b| b.contains(&page)));
    assert_eq!(bridge_ports(&bridge).len(), 1);

    // Stop: no container, namespace, veth, lease or rule of the alloc is left.
    http.delete_json("/v1/job/docker-bridged").unwrap();
    wait_for("the namespace and the containers to be removed", SETTLE, || {
        (!netns.exists() && containers_of(&alloc_id).is_empty()).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert!(task_pid(&alloc_id, "sleep").is_none());
    assert_eq!(bridge_ports(&bridge), Vec::<String>::new(), "no veth left");
    assert_eq!(leases_of(&alloc_id), Vec::<PathBuf>::new(), "no lease left");
    assert_eq!(rules_with(&alloc_id), Vec::<String>::new(), "no rule naming the alloc left");
    assert_eq!(rules_with(&format!("{address}/32")), Vec::<String>::new(), "no rule naming its address left");
    assert!(!agent.logs().contains("resources may have leaked"), "{}", agent.logs());
    let status = agent.stop_with(nix::sys::signal::Signal::SIGINT, SETTLE).unwrap();
    assert!(status.success(), "{status}");
}
