//! Nomad's disconnected-clients table with real processes:
//! {netsplit, agent stopped} × {with, without `max_client_disconnect`}.
//!
//! One server and three clients with ~1 s heartbeats; a count=2
//! `distinct_hosts` job runs on two of them. The node of the first alloc is
//! cut off: through the fault proxy between it and the server, through its
//! network namespace's link (root only), or by stopping the agent process
//! (SIGSTOP; its tasks keep running, as with a stopped agent). Statuses are
//! checked before and after the node returns, as in Nomad's e2e table
//! (disconnected / unchanged / replacement):
//!
//! | | while away | after the node returns |
//! |---|---|---|
//! | no `max_client_disconnect` | lost / running / running | complete / running / running |
//! | `max_client_disconnect` | unknown / running / running | running / running / complete |
//!
//! and the node must be `ready` again soon after the heal: through its heartbeats (about two of
//! them), never after a register retry (15-30 s).
//! Everything waits on conditions with deadlines; nothing sleeps to sync.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nomad_e2e::netns::{self, Host, Network};
use nomad_e2e::{Agent, AgentOptions, Cluster, ClusterOptions, HttpClient, wait_for};
use serde_json::{Value, json};

/// Server heartbeat settings: TTLs of 1-2 s, 1 s of grace.
const SERVER_CONFIG: &str = "  heartbeat_grace = \"1s\"\n  min_heartbeat_ttl = \"1s\"";
/// How long the node may take to be ready after the heal, waited for as a condition. The
/// heartbeat path takes about 6 s (two heartbeats of TTL 1-2 s, plus the 1-2 s retry of the one
/// that failed while cut off); the deadline leaves a loaded machine more than twice that, yet
/// stays below the 15 s register retry, so a client that fell back to registering again, or
/// to the 15-30 s no-leader retry, still fails here.
const READY_DEADLINE: Duration = Duration::from_secs(14);
/// Generous bound for everything else on this shared 2-core machine.
const LONG: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    /// The fault proxy between the client and the server drops everything.
    Proxy,
    /// The client's network namespace loses its link.
    Netns,
    /// The client agent is stopped (SIGSTOP), then continued.
    Stop,
}

/// The job: two allocs on distinct hosts, tasks that outlive the test by little.
fn job(id: &str, max_disconnect: bool) -> Value {
    let mut group = json!({
        "Name": "g",
        "Count": 2,
        "Constraints": [{ "Operand": "distinct_hosts", "RTarget": "true" }],
        "Tasks": [{
            "Name": "t",
            "Driver": "raw_exec",
            "Config": { "command": "/bin/sleep", "args": ["600"] },
            "Resources": { "CPU": 50, "MemoryMB": 32 }
        }]
    });
    if max_disconnect {
        group["MaxClientDisconnect"] = json!(3_600_000_000_000i64);
    }
    json!({ "Job": { "ID": id, "Datacenters": ["dc1"], "TaskGroups": [group] } })
}

/// The agents of one scenario and how to cut and heal the client under test.
struct Setup {
    server: HttpClient,
    clients: Vec<Agent>,
    cluster: Option<Cluster>,
    net: Option<(Network, Vec<Host>, Agent)>,
    _dir: Option<tempfile::TempDir>,
}

impl Setup {
    fn start(cut: Cut) -> Setup {
        match cut {
            Cut::Proxy | Cut::Stop => {
                let c = Cluster::start(ClusterOptions {
                    servers: 1,
                    clients: 3,
                    proxied_clients: cut == Cut::Proxy,
                    server_config: SERVER_CONFIG.into(),
                    client_config: String::new(),
                    agent_config: String::new(),
                })
                .expect("start cluster");
                let server = c.servers[0].http();
                Setup { server, clients: Vec::new(), cluster: Some(c), net: None, _dir: None }
            }
            Cut::Netns => {
                let dir = tempfile::Builder::new().prefix("nomad-rs-e2e-").tempdir().unwrap();
                let mut net = Network::new().expect("bridge");
                let hosts: Vec<Host> = (0..4).map(|_| net.host().expect("host")).collect();
                let config = format!("server {{\n  enabled = true\n  bootstrap_expect = 1\n{SERVER_CONFIG}\n}}\n");
                let server = start_in(&dir.path().join("server1"), "server1", &hosts[0], config);
                server.wait_for_leader(LONG).expect("leader");
                let mut clients = Vec::new();
                for (i, h) in hosts[1..].iter().enumerate() {
                    let config = format!(
                        "client {{\n  enabled = true\n  servers = [{:?}]\n}}\nplugin \"raw_exec\" {{\n  config {{\n    enabled = true\n  }}\n}}\n",
                        server.rpc_addr
                    );
                    let name = format!("client{}", i + 1);
                    clients.push(start_in(&dir.path().join(&name), &name, h, config));
                }
                let http = server.http();
                Setup { server: http, clients, cluster: None, net: Some((net, hosts, server)), _dir: Some(dir) }
            }
        }
    }

    fn clients(&self) -> &[Agent] {
        match &self.cluster {
            Some(c) => &c.clients,
            None => &self.clients,
        }
    }

    fn cut(&self, client: usize, how: Cut) {
        match how {
            Cut::Proxy => self.cluster.as_ref().unwrap().proxies[client].iter().for_each(|p| p.cut()),
            Cut::Netns => self.net.as_ref().unwrap().1[client + 1].cut().expect("cut link"),
            Cut::Stop => self.clients()[client].signal(Signal::SIGSTOP).expect("SIGSTOP"),
        }
    }

    fn heal(&self, client: usize, how: Cut) {
        match how {
            Cut::Proxy => {
                for p in &self.cluster.as_ref().unwrap().proxies[client] {
                    p.heal();
                    // The proxy dropped bytes mid-stream: those connections are broken for
                    // good (a real link would retransmit); close them so the client redials.
                    p.reset();
                }
            }
            Cut::Netns => self.net.as_ref().unwrap().1[client + 1].heal().expect("heal link"),
            Cut::Stop => self.clients()[client].signal(Signal::SIGCONT).expect("SIGCONT"),
        }
    }

    fn logs(&self) -> String {
        let mut out: Vec<String> = self.clients().iter().map(Agent::logs).collect();
        if let Some(c) = &self.cluster {
            out.extend(c.servers.iter().map(Agent::logs));
        }
        if let Some((_, _, s)) = &self.net {
            out.push(s.logs());
        }
        out.join("\n")
    }
}

fn start_in(dir: &Path, name: &str, host: &Host, config: String) -> Agent {
    Agent::start(name, dir, AgentOptions { config: Some(config), host: Some(host.clone()), ..Default::default() }).expect("start agent")
}

/// An alloc as the API lists it.
#[derive(Debug, Clone)]
struct Alloc {
    id: String,
    node: String,
    client: String,
    desired: String,
    description: String,
    previous: String,
}

fn allocs(http: &HttpClient, job: &str) -> Vec<Alloc> {
    let list = http.get_json(&format!("/v1/job/{job}/allocations")).unwrap_or(Value::Null);
    let ids: Vec<String> = list.as_array().into_iter().flatten().filter_map(|a| a["ID"].as_str().map(str::to_string)).collect();
    ids.iter()
        .filter_map(|id| http.get_json(&format!("/v1/allocation/{id}")).ok())
        .map(|a| Alloc {
            id: a["ID"].as_str().unwrap_or_default().to_string(),
            node: a["NodeID"].as_str().unwrap_or_default().to_string(),
            client: a["ClientStatus"].as_str().unwrap_or_default().to_string(),
            desired: a["DesiredStatus"].as_str().unwrap_or_default().to_string(),
            description: a["DesiredDescription"].as_str().unwrap_or_default().to_string(),
            previous: a["PreviousAllocation"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

fn node_status(http: &HttpClient, id: &str) -> String {
    http.get_json(&format!("/v1/node/{id}")).ok().and_then(|n| n["Status"].as_str().map(str::to_string)).unwrap_or_default()
}

fn ready_nodes(http: &HttpClient) -> Vec<String> {
    let nodes = http.get_json("/v1/nodes").unwrap_or(Value::Null);
    nodes.as_array().into_iter().flatten().filter(|n| n["Status"] == "ready").filter_map(|n| n["ID"].as_str().map(str::to_string)).collect()
}

/// The node ID of the client agent at `i` (its name is `client<i+1>`).
fn node_id(http: &HttpClient, name: &str) -> String {
    let nodes = http.get_json("/v1/nodes").unwrap_or(Value::Null);
    nodes.as_array().into_iter().flatten().find(|n| n["Name"] == name).and_then(|n| n["ID"].as_str()).unwrap_or_default().to_string()
}

/// One row of the table: (disconnected, unchanged, replacement) client statuses.
type Row = (String, String, String);

fn row(all: &[Alloc], a: &str, b: &str, r: &str) -> Row {
    let status = |id: &str| all.iter().find(|x| x.id == id).map(|x| x.client.clone()).unwrap_or_else(|| "-".into());
    (status(a), status(b), status(r))
}

fn scenario(how: Cut, max_disconnect: bool) {
    if how == Cut::Netns && !nomad_testkit::prereq::met(&netns::PREREQS) {
        return;
    }
    let start = Instant::now();
    let s = Setup::start(how);
    let http = s.server.clone();
    let fail = |what: String| -> ! { panic!("{what}\n{}", s.logs()) };

    wait_for("three ready clients", LONG, || (ready_nodes(&http).len() == 3).then_some(())).unwrap_or_else(|e| fail(e.to_string()));
    let id = if max_disconnect { "with-max" } else { "without-max" };
    http.put_json("/v1/jobs", &job(id, max_disconnect)).unwrap_or_else(|e| fail(e.to_string()));
    let placed = wait_for("two running allocs", LONG, || {
        let all = allocs(&http, id);
        (all.len() == 2 && all.iter().all(|a| a.client == "running")).then_some(all)
    })
    .unwrap_or_else(|e| fail(e.to_string()));

    // The client running the first alloc goes away; the other alloc is the unchanged one.
    let (a, b) = (placed[0].clone(), placed[1].clone());
    let names: Vec<String> = (1..=3).map(|i| format!("client{i}")).collect();
    let victim = names.iter().position(|n| node_id(&http, n) == a.node).unwrap_or_else(|| fail(format!("no client runs {}", a.id)));
    let cut_at = Instant::now();
    s.cut(victim, how);

    let (node_want, a_want, a_desired) = if max_disconnect { ("disconnected", "unknown", "run") } else { ("down", "lost", "stop") };
    let away = wait_for("the node to be marked away and the alloc replaced", LONG, || {
        if node_status(&http, &a.node) != node_want {
            return None;
        }
        let all = allocs(&http, id);
        let orig = all.iter().find(|x| x.id == a.id)?;
        let repl = all.iter().find(|x| x.previous == a.id && x.client == "running")?;
        (orig.client == a_want && orig.desired == a_desired).then(|| (all.clone(), repl.id.clone()))
    })
    .unwrap_or_else(|e| fail(format!("{e}: {:?}", allocs(&http, id))));
    let marked_after = cut_at.elapsed();
    let (all, r) = away;
    let before = row(&all, &a.id, &b.id, &r);
    assert_eq!(before, (a_want.to_string(), "running".to_string(), "running".to_string()), "statuses while away");

    let healed_at = Instant::now();
    s.heal(victim, how);
    wait_for("the node to be ready again", READY_DEADLINE, || (node_status(&http, &a.node) == "ready").then_some(()))
        .unwrap_or_else(|e| fail(e.to_string()));
    let ready_after = healed_at.elapsed();

    let (a_final, r_final, a_desired_final, r_desired_final) =
        if max_disconnect { ("running", "complete", "run", "stop") } else { ("complete", "running", "stop", "run") };
    let end = wait_for("the final statuses", LONG, || {
        let all = allocs(&http, id);
        let get = |x: &str| all.iter().find(|y| y.id == x).cloned();
        let (o, u, re) = (get(&a.id)?, get(&b.id)?, get(&r)?);
        let done = o.client == a_final
            && o.desired == a_desired_final
            && re.client == r_final
            && re.desired == r_desired_final
            && u.client == "running"
            && all.len() == 3;
        done.then_some(all)
    })
    .unwrap_or_else(|e| fail(format!("{e}: {:?}", allocs(&http, id))));
    let after = row(&end, &a.id, &b.id, &r);
    let running = end.iter().filter(|x| x.client == "running" && x.desired == "run").count();
    assert_eq!(running, 2, "exactly count running at the end: {end:?}");
    if max_disconnect {
        let re = end.iter().find(|x| x.id == r).unwrap();
        assert_eq!(re.description, "alloc not needed due to disconnected client reconnect");
    }
    eprintln!(
        "{how:?} max_client_disconnect={max_disconnect}: away {before:?} (marked {:.1?} after the cut) → back {after:?}; \
         node ready {:.1?} after the heal; scenario {:.1?}",
        marked_after,
        ready_after,
        start.elapsed()
    );
    // Stop the job so its tasks do not outlive the test.
    let _ = http.delete_json(&format!("/v1/job/{id}"));
    let stopping = Instant::now();
    let stopped =
        wait_for("the tasks to stop", Duration::from_secs(20), || allocs(&http, id).iter().all(|x| x.client != "running").then_some(()));
    eprintln!("cleanup: {:?} in {:.1?}; total {:.1?}", stopped.is_ok(), stopping.elapsed(), start.elapsed());
}

#[test]
fn netsplit_through_the_proxy_with_max_client_disconnect() {
    scenario(Cut::Proxy, true);
}

#[test]
fn netsplit_through_the_proxy_without_max_client_disconnect() {
    scenario(Cut::Proxy, false);
}

#[test]
fn netsplit_of_a_network_namespace_with_max_client_disconnect() {
    scenario(Cut::Netns, true);
}

#[test]
fn netsplit_of_a_network_namespace_without_max_client_disconnect() {
    scenario(Cut::Netns, false);
}

#[test]
fn stopped_agent_with_max_client_disconnect() {
    scenario(Cut::Stop, true);
}

#[test]
fn stopped_agent_without_max_client_disconnect() {
    scenario(Cut::Stop, false);
}
