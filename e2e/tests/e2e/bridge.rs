//! Bridge networking on the real CNI plugins: a `mode = "bridge"` group gets its own network
//! namespace, set up by loopback, bridge (host-local IPAM), firewall and portmap; its raw_exec
//! task serves on its `to` port inside the namespace and answers on the host port; the alloc
//! reports its address; an agent `kill -9` and restart keeps the namespace and runs no second
//! ADD; stopping the job removes the namespace, the veth, the IPAM lease and the netfilter
//! rules.
//!
//! Each test run uses a bridge and subnet of its own (the `bridge_network_*` client knobs), so
//! nothing it counts is shared with anything else on the machine. The host port is reached
//! from the host itself: the DNAT happens in `OUTPUT` and the traffic never crosses `FORWARD`,
//! whose policy Docker (on this machine) sets to DROP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nomad_e2e::{Agent, AgentOptions, wait_for};
use nomad_testkit::Prereq;
use serde_json::{Value, json};

use crate::SETTLE;

pub(crate) fn iptables_save() -> String {
    let out = Command::new("iptables-save").output().expect("iptables-save runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Rule lines (not chain declarations) that mention `needle`.
pub(crate) fn rules_with(needle: &str) -> Vec<String> {
    iptables_save().lines().filter(|l| l.starts_with("-A ") && l.contains(needle)).map(str::to_string).collect()
}

/// The veths enslaved to `bridge`.
pub(crate) fn bridge_ports(bridge: &str) -> Vec<String> {
    let out = Command::new("ip").args(["-o", "link", "show", "master", bridge]).output().expect("ip runs");
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split(':').nth(1)).map(|n| n.trim().to_string()).collect()
}

/// host-local's lease files (one per address, holding the container ID) for the alloc.
pub(crate) fn leases_of(alloc_id: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/var/lib/cni/networks/nomad")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|c| c.lines().next() == Some(alloc_id)))
        .collect()
}

pub(crate) fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The PID of the process whose command is `comm` and whose environment holds the alloc ID.
pub(crate) fn task_pid(alloc_id: &str, comm: &str) -> Option<i32> {
    let needle = format!("NOMAD_ALLOC_ID={alloc_id}");
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        if name.trim() != comm {
            return None;
        }
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        environ.split(|b| *b == 0).any(|var| var == needle.as_bytes()).then_some(pid)
    })
}

/// One HTTP GET over a plain TCP connection; the whole response.
pub(crate) fn http_get(addr: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /index.html HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// What a failed run would leave behind, removed whatever happens: the alloc's namespace and
/// leases, its netfilter rules, the test's bridge and its NOMAD-ADMIN rule.
pub(crate) struct Cleanup {
    pub(crate) bridge: String,
    pub(crate) subnet: String,
    pub(crate) alloc_id: Option<String>,
    pub(crate) address: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(id) = &self.alloc_id {
            cleanup_alloc_network(id, self.address.as_deref());
        }
        cleanup_bridge(&self.bridge, &self.subnet);
    }
}

/// Removes what a failed run would leave of an alloc's network: its namespace and leases, and
/// the netfilter rules naming it or its address (given, or the one its lease names; with the
/// per-alloc chains they jump to).
pub(crate) fn cleanup_alloc_network(id: &str, address: Option<&str>) {
    let ns = Path::new("/var/run/netns").join(id);
    let _ = nix::mount::umount2(&ns, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_file(&ns);
    let mut addresses: Vec<String> = address.iter().map(|a| format!("{a}/32")).collect();
    for lease in leases_of(id) {
        addresses.extend(lease.file_name().map(|ip| format!("{}/32", ip.to_string_lossy())));
        let _ = std::fs::remove_file(lease);
    }
    // iptables-save quotes its comments for a shell: each rule is deleted through one.
    for table in ["nat", "filter"] {
        let save = Command::new("iptables-save").args(["-t", table]).output().map(|o| o.stdout).unwrap_or_default();
        let save = String::from_utf8_lossy(&save).into_owned();
        let mine = |l: &&str| l.starts_with("-A ") && (l.contains(id) || addresses.iter().any(|a| l.contains(a.as_str())));
        let mut chains = Vec::new();
        for rule in save.lines().filter(mine) {
            if let Some(chain) = rule
                .split_whitespace()
                .skip_while(|w| *w != "-j")
                .nth(1)
                .filter(|c| c.starts_with("CNI-DN-") || (c.starts_with("CNI-") && c.len() > 20))
            {
                chains.push(chain.to_string());
            }
            let _ = Command::new("sh").arg("-c").arg(format!("iptables -w -t {table} -D {}", &rule[3..])).output();
        }
        for chain in chains {
            let _ = Command::new("iptables").args(["-w", "-t", table, "-F", &chain]).output();
            let _ = Command::new("iptables").args(["-w", "-t", table, "-X", &chain]).output();
        }
    }
}

/// Removes a test's bridge and its NOMAD-ADMIN rule.
pub(crate) fn cleanup_bridge(bridge: &str, subnet: &str) {
    let _ = Command::new("iptables").args(["-w", "-t", "filter", "-D", "NOMAD-ADMIN", "-o", bridge, "-d", subnet, "-j", "ACCEPT"]).output();
    let _ = Command::new("ip").args(["link", "del", bridge]).output();
}

#[test]
fn a_bridge_mode_task_answers_on_its_host_port_survives_an_agent_kill_and_leaves_nothing_behind() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins);
    if !Path::new("/usr/bin/python3").is_file() {
        panic!("python3 (scripts/install-deps installs it) serves the task's port");
    }
    let pid = std::process::id();
    let bridge = format!("nrsbr{}", pid % 100_000);
    let subnet = format!("10.{}.{}.0/24", 200 + (pid / 256) % 50, pid % 256);
    let mut cleanup = Cleanup { bridge: bridge.clone(), subnet: subnet.clone(), alloc_id: None, address: None };

    let dir = tempfile::tempdir().unwrap();
    let config = format!("client {{\n  bridge_network_name = \"{bridge}\"\n  bridge_network_subnet = \"{subnet}\"\n}}\n");
    let mut agent = Agent::start(
        "dev",
        dir.path(),
        AgentOptions { args: vec!["-dev".into(), "-log-level".into(), "INFO".into()], config: Some(config), ..Default::default() },
    )
    .unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    let node = wait_for("the dev node to be ready", SETTLE, || {
        let nodes = http.get_json("/v1/nodes").ok()?;
        let id = nodes.as_array()?.iter().find(|n| n["Status"] == "ready")?["ID"].as_str()?.to_string();
        http.get_json(&format!("/v1/node/{id}")).ok()
    })
    .unwrap();
    assert_eq!(node["Attributes"]["nomad.bridge.hairpin_mode"], "false", "the bridge module is fingerprinted");
    assert_eq!(node["Attributes"]["plugins.cni.version.bridge"], "1.0.0", "Debian's plugins print only the protocol versions");
    let modes: Vec<&str> = node["NodeResources"]["Networks"].as_array().unwrap().iter().filter_map(|n| n["Mode"].as_str()).collect();
    assert!(modes.contains(&"bridge"), "{modes:?}");

    let serve = "echo bridged-$NOMAD_ALLOC_ID > index.html && exec python3 -m http.server 8080 --bind 0.0.0.0";
    let job = json!({"Job": {
        "ID": "bridged", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Networks": [{"Mode": "bridge", "DynamicPorts": [{"Label": "http", "To": 8080}]}],
            "Tasks": [{"Name": "web", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", serve]},
                "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}});
    http.put_json("/v1/jobs", &job).unwrap();
    let alloc = wait_for("the alloc to run", SETTLE, || {
        let allocs = http.get_json("/v1/job/bridged/allocations").ok()?;
        let id = allocs.as_array()?.first()?["ID"].as_str()?.to_string();
        let alloc = http.get_json(&format!("/v1/allocation/{id}")).ok()?;
        (alloc["ClientStatus"] == "running" || alloc["ClientStatus"] == "failed").then_some(alloc)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let alloc_id = alloc["ID"].as_str().unwrap().to_string();
    cleanup.alloc_id = Some(alloc_id.clone());
    assert_eq!(alloc["ClientStatus"], "running", "{}\n{}", alloc["TaskStates"], agent.logs());

    // The reported status: eth0 with an address in the test's subnet.
    let status = &alloc["NetworkStatus"];
    assert_eq!(status["InterfaceName"], "eth0", "{status}");
    let address = status["Address"].as_str().unwrap_or_default().to_string();
    cleanup.address = Some(address.clone());
    let prefix = subnet.trim_end_matches("0/24");
    assert!(address.starts_with(prefix), "{address} in {subnet}");
    let port: &Value = &alloc["AllocatedResources"]["Shared"]["Ports"][0];
    assert_eq!(port["To"], 8080);
    let host_port = port["Value"].as_i64().unwrap();

    // The task runs in the alloc's namespace.
    let netns = Path::new("/var/run/netns").join(&alloc_id);
    let pid = wait_for("the task process", SETTLE, || task_pid(&alloc_id, "python3")).unwrap();
    assert_eq!(inode(&PathBuf::from(format!("/proc/{pid}/ns/net"))), inode(&netns), "the task is in /var/run/netns/<alloc>");
    assert_ne!(inode(Path::new("/proc/self/ns/net")), inode(&netns));

    // The host port reaches the task's `to` port through portmap's DNAT.
    let body = wait_for("the task to answer on the host port", SETTLE, || {
        http_get(&format!("127.0.0.1:{host_port}")).filter(|b| b.contains(&format!("bridged-{alloc_id}")))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", iptables_save()));
    assert!(body.starts_with("HTTP/1.0 200"), "{body}");
    // And not on the host's own port 8080: the server is inside the namespace.
    assert!(http_get("127.0.0.1:8080").is_none_or(|b| !b.contains(&alloc_id)));

    // What the setup made, counted before the stop.
    assert_eq!(bridge_ports(&bridge).len(), 1, "one veth on the bridge");
    assert_eq!(leases_of(&alloc_id).len(), 1, "one IPAM lease");
    assert!(leases_of(&alloc_id)[0].ends_with(&address));
    assert!(!rules_with(&alloc_id).is_empty(), "portmap and ipMasq rules name the alloc");
    assert!(!rules_with(&format!("{address}/32")).is_empty(), "the firewall plugin's rules name the address");
    let adds =
        |logs: &str| logs.lines().filter(|l| l.contains("configured the alloc's network namespace") && l.contains(&alloc_id)).count();
    assert_eq!(adds(&agent.logs()), 1);

    // kill -9 and restart: the namespace, the task and its address stay; no second ADD.
    agent.kill9().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "the task outlives its agent");
    agent.restart().unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    wait_for("the restored agent to reattach", SETTLE, || {
        let stats = http.get_json(&format!("/v1/client/allocation/{alloc_id}/stats")).ok()?;
        stats["Tasks"].get("web").map(drop)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let alloc = http.get_json(&format!("/v1/allocation/{alloc_id}")).unwrap();
    assert_eq!(alloc["ClientStatus"], "running");
    assert_eq!(alloc["NetworkStatus"]["Address"], address.as_str(), "the status is restored");
    assert_eq!(adds(&agent.logs()), 1, "no second ADD");
    assert_eq!(task_pid(&alloc_id, "python3"), Some(pid), "the same task process");
    assert_eq!(inode(&PathBuf::from(format!("/proc/{pid}/ns/net"))), inode(&netns));
    assert_eq!(bridge_ports(&bridge).len(), 1);
    assert_eq!(leases_of(&alloc_id).len(), 1);
    assert!(http_get(&format!("127.0.0.1:{host_port}")).is_some_and(|b| b.contains(&alloc_id)));

    // Stop: every trace of the alloc's network goes.
    http.delete_json("/v1/job/bridged").unwrap();
    wait_for("the namespace to be removed", SETTLE, || (!netns.exists()).then_some(())).unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert!(task_pid(&alloc_id, "python3").is_none());
    assert_eq!(bridge_ports(&bridge), Vec::<String>::new(), "no veth left");
    assert_eq!(leases_of(&alloc_id), Vec::<PathBuf>::new(), "no lease left");
    assert_eq!(rules_with(&alloc_id), Vec::<String>::new(), "no rule naming the alloc left");
    assert_eq!(rules_with(&format!("{address}/32")), Vec::<String>::new(), "no rule naming its address left");
    assert!(!agent.logs().contains("resources may have leaked"), "{}", agent.logs());
    let status = agent.stop_with(nix::sys::signal::Signal::SIGINT, SETTLE).unwrap();
    assert!(status.success(), "{status}");
}
