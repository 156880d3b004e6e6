//! Node drain on a real cluster: one server and two clients (processes),
//! raw_exec `sleep` tasks, the real `nomad-rs node drain` command. The
//! server's event stream (with a buffer large enough to replay the whole
//! test) is the record the ordering checks read, index by index.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use nomad_e2e::{Cluster, ClusterOptions, HttpClient, binary, wait_for};
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);

/// A one-server, two-client cluster with a replayable event stream; returns it and its nodes' IDs by name.
fn cluster() -> (Cluster, String, String) {
    let c = Cluster::start(ClusterOptions {
        servers: 1,
        clients: 2,
        server_config: "  event_buffer_size = 100000".into(),
        ..Default::default()
    })
    .unwrap();
    c.wait_for_leader(SETTLE).unwrap();
    let api = c.servers[0].http();
    let ids = wait_for("both clients ready", SETTLE, || {
        let nodes = api.get_json("/v1/nodes").ok()?;
        let id = |name: &str| {
            nodes.as_array()?.iter().find(|n| n["Name"] == name && n["Status"] == "ready").and_then(|n| n["ID"].as_str()).map(String::from)
        };
        Some((id("client1")?, id("client2")?))
    })
    .unwrap();
    (c, ids.0, ids.1)
}

fn task(name: &str) -> Value {
    json!({ "Name": name, "Driver": "raw_exec", "Config": { "command": "/bin/sleep", "args": ["3600"] },
            "Resources": { "CPU": 50, "MemoryMB": 32 }, "KillTimeout": 2_000_000_000i64,
            // Logs must fit the group's 10 MB disk (Nomad refuses log storage >= disk).
            "LogConfig": { "MaxFiles": 1, "MaxFileSizeMB": 1 } })
}

fn job(id: &str, job_type: &str, count: i64, migrate: Option<Value>) -> Value {
    let mut group = json!({ "Name": "g", "Count": count, "Tasks": [task("t")], "EphemeralDisk": { "SizeMB": 10 } });
    if let Some(m) = migrate {
        group["Migrate"] = m;
    }
    json!({ "Job": { "ID": id, "Type": job_type, "Datacenters": ["dc1"], "TaskGroups": [group] } })
}

/// `migrate {}` in JSON: `max_parallel`, and how long a replacement must run to count as healthy.
fn migrate(max_parallel: i64, min_healthy: Duration) -> Value {
    json!({ "MaxParallel": max_parallel, "HealthCheck": "task_states", "MinHealthyTime": min_healthy.as_nanos() as i64,
            "HealthyDeadline": (min_healthy * 2 + Duration::from_secs(60)).as_nanos() as i64 })
}

fn allocs(api: &HttpClient, job: &str) -> Vec<Value> {
    api.get_json(&format!("/v1/job/{job}/allocations")).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
}

fn set_eligibility(api: &HttpClient, node: &str, e: &str) {
    api.put_json(&format!("/v1/node/{node}/eligibility"), &json!({ "Eligibility": e })).unwrap();
}

/// Stops every job on drop (also when a test fails), so no `sleep` task outlives the test by long.
struct StopJobs(HttpClient, Vec<&'static str>);

impl Drop for StopJobs {
    fn drop(&mut self) {
        for j in &self.1 {
            let _ = self.0.delete_json(&format!("/v1/job/{j}"));
        }
        let _ = wait_for("every task stopped", Duration::from_secs(30), || {
            self.1
                .iter()
                .all(|j| allocs(&self.0, j).iter().all(|a| a["ClientStatus"] != "running" && a["ClientStatus"] != "pending"))
                .then_some(())
        });
    }
}

/// `nomad-rs node drain <args>` against the server; returns (exit code, stdout, stderr).
fn drain_cli(server_http: &str, args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(binary())
        .args(["node", "drain"])
        .args(args)
        .env("NOMAD_ADDR", format!("http://{server_http}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for("the drain command to finish", Duration::from_secs(180), || child.try_wait().ok().flatten());
    if status.is_err() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    let status = status.unwrap_or_else(|e| panic!("{e}\nstdout:\n{stdout}\nstderr:\n{stderr}"));
    (status.code().unwrap_or(-1), stdout, stderr)
}

/// One batch of the stream: its index and the objects it wrote.
struct Batch {
    index: u64,
    allocs: Vec<Value>,
    nodes: Vec<(String, Value)>,
}

/// Replays the Allocation and Node topics from `from` until a batch at or past `to`.
fn history(api: &HttpClient, from: u64, to: u64) -> Vec<Batch> {
    let mut s = api.stream_lines(&format!("/v1/event/stream?topic=Allocation&topic=Node&index={from}"), Duration::from_secs(60)).unwrap();
    let mut out = Vec::new();
    loop {
        let b = s.next_batch().unwrap();
        let index = b["Index"].as_u64().unwrap();
        let mut batch = Batch { index, allocs: Vec::new(), nodes: Vec::new() };
        for e in b["Events"].as_array().unwrap() {
            match e["Topic"].as_str() {
                Some("Allocation") => batch.allocs.push(e["Payload"]["Allocation"].clone()),
                Some("Node") => {
                    assert_eq!(e["Payload"]["Node"]["SecretID"], "", "a node event carries a SecretID: {e}");
                    batch.nodes.push((e["Type"].as_str().unwrap().to_string(), e["Payload"]["Node"].clone()));
                }
                _ => {}
            }
        }
        if index >= from {
            out.push(batch);
        }
        if index >= to {
            return out;
        }
    }
}

/// The cluster's newest write index (allocs or nodes).
fn latest_index(api: &HttpClient) -> u64 {
    let a = api.get("/v1/allocations").unwrap().index();
    let n = api.get("/v1/nodes").unwrap().index();
    a.max(n)
}

fn healthy(a: &Value) -> bool {
    a["DeploymentStatus"]["Healthy"] == true
}

fn terminal(a: &Value) -> bool {
    a["DesiredStatus"] != "run" || ["complete", "failed", "lost"].contains(&a["ClientStatus"].as_str().unwrap_or(""))
}

fn client_terminal(a: &Value) -> bool {
    ["complete", "failed", "lost"].contains(&a["ClientStatus"].as_str().unwrap_or(""))
}

fn migrating(a: &Value) -> bool {
    a["DesiredTransition"]["Migrate"] == true
}

/// Every `Alloc "<id>" marked for migration` line the drain CLI printed names an alloc of `node`
/// that was marked. How many such lines appear is not asserted: the CLI reports what changed
/// after its first look at the node, and an alloc the drainer marked and the scheduler stopped
/// before that look is not news (Nomad's monitor reports nothing for it either), so the count
/// depends on how fast the CLI started. What was migrated, and in which order, is checked on
/// the server's state and event stream instead.
fn assert_marked_lines_are_true(api: &HttpClient, node: &str, stdout: &str) {
    let all = api.get_json("/v1/allocations").unwrap();
    let all = all.as_array().unwrap();
    for line in stdout.lines().filter(|l| l.ends_with("marked for migration")) {
        let short = line.split('"').nth(1).unwrap_or_else(|| panic!("no alloc ID in {line:?}"));
        let a = all.iter().find(|a| id(a).starts_with(short)).unwrap_or_else(|| panic!("{line:?} names no alloc"));
        let full = api.get_json(&format!("/v1/allocation/{}", id(a))).unwrap();
        assert!(full["NodeID"] == node && migrating(&full), "{line:?}, but the alloc is {full}");
    }
}

fn id(a: &Value) -> String {
    a["ID"].as_str().unwrap().to_string()
}

#[test]
fn a_drain_replaces_service_allocs_elsewhere_first_one_at_a_time_and_system_allocs_last() {
    let (c, n1, n2) = cluster();
    let api = c.servers[0].http();
    let _stop = StopJobs(api.clone(), vec!["web", "sys"]);

    // A system job on both nodes; the service job only on client1.
    api.put_json("/v1/jobs", &job("sys", "system", 1, None)).unwrap();
    wait_for("a system alloc running on each node", SETTLE, || {
        (allocs(&api, "sys").iter().filter(|a| a["ClientStatus"] == "running").count() == 2).then_some(())
    })
    .unwrap();
    set_eligibility(&api, &n2, "ineligible");
    api.put_json("/v1/jobs", &job("web", "service", 2, Some(migrate(1, Duration::from_secs(1))))).unwrap();
    let originals: Vec<String> = wait_for("both web allocs running and judged healthy on client1", SETTLE, || {
        let live: Vec<Value> = allocs(&api, "web").into_iter().filter(|a| a["ClientStatus"] == "running" && healthy(a)).collect();
        (live.len() == 2).then(|| live.iter().map(id).collect())
    })
    .unwrap();
    assert!(allocs(&api, "web").iter().all(|a| a["NodeID"] == n1.as_str()));
    set_eligibility(&api, &n2, "eligible");
    let sys_on = |node: &str| allocs(&api, "sys").into_iter().find(|a| a["NodeID"] == node).map(|a| id(&a)).unwrap();
    let (sys1, sys2) = (sys_on(&n1), sys_on(&n2));
    // Every alloc as of `start`; the stream replays each later change on top.
    let before = api.get("/v1/allocations").unwrap();
    let start = before.index();
    let mut cur: BTreeMap<String, Value> = before.json().unwrap().as_array().unwrap().iter().map(|a| (id(a), a.clone())).collect();

    let (code, stdout, stderr) = drain_cli(&c.servers[0].http_addr, &["-enable", "-yes", &n1]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("drain strategy set"), "{stdout}");
    assert!(stdout.contains(&format!("Node \"{n1}\" has marked all allocations for migration")), "{stdout}");
    assert!(stdout.contains(&format!("All allocations on node \"{n1}\" have stopped")), "{stdout}");
    assert_marked_lines_are_true(&api, &n1, &stdout);

    // The CLI returned: the drain is complete.
    let node = api.get_json(&format!("/v1/node/{n1}")).unwrap();
    assert_eq!(node["Drain"], false);
    assert!(node["DrainStrategy"].is_null(), "{node}");
    assert_eq!(node["SchedulingEligibility"], "ineligible", "a drained node stays ineligible");
    assert_eq!(node["LastDrain"]["Status"], "complete");
    let last = node["Events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["Message"].as_str(), last["Subsystem"].as_str()), (Some("Node drain complete"), Some("Drain")));
    assert!(last["Details"].get("deadline_reached").is_none(), "finished before the deadline: {last}");
    assert_eq!(node["SecretID"], "");

    // Replay the drain, index by index.
    let batches = history(&api, start + 1, latest_index(&api));
    let (mut stopped_at, mut running_at, mut gone_at, mut sys1_marked_at) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new(), 0);
    for b in &batches {
        for a in &b.allocs {
            cur.insert(id(a), a.clone());
        }
        for o in &originals {
            if cur[o]["DesiredStatus"] != "run" {
                stopped_at.entry(o.clone()).or_insert(b.index);
            }
            if client_terminal(&cur[o]) {
                gone_at.entry(o.clone()).or_insert(b.index);
            }
        }
        for a in cur.values().filter(|a| a["JobID"] == "web" && a["ClientStatus"] == "running") {
            running_at.entry(id(a)).or_insert(b.index);
        }
        if sys1_marked_at == 0 && migrating(&cur[&sys1]) {
            sys1_marked_at = b.index;
        }
        // migrate.max_parallel = 1 of count 2: a healthy web alloc that is staying, at every index.
        let serving = cur.values().filter(|a| a["JobID"] == "web" && !terminal(a) && healthy(a) && !migrating(a)).count();
        assert!(serving >= 1, "index {}: no web alloc serving", b.index);
    }
    let web_gone_at = gone_at.values().copied().max().expect("the web allocs left client1");
    let replacement = |o: &String| {
        // Stubs have no PreviousAllocation; the stream carried the full allocs.
        cur.values().find(|a| a["PreviousAllocation"] == o.as_str()).cloned().unwrap_or_else(|| panic!("no replacement for {o}"))
    };
    let mut order: Vec<&String> = originals.iter().collect();
    order.sort_by_key(|o| stopped_at[*o]);
    for (i, o) in order.iter().enumerate() {
        let r = replacement(o);
        assert_eq!(r["NodeID"], n2.as_str(), "replaced on the other node");
        assert_eq!(r["ClientStatus"], "running");
        let placed = r["CreateIndex"].as_u64().unwrap();
        assert!(placed <= stopped_at[*o], "{o} was stopped (index {}) before its replacement was placed ({placed})", stopped_at[*o]);
        if i > 0 {
            // The replacement of the previous one runs before this one is stopped.
            let prev = replacement(order[i - 1]);
            let prev_running = running_at[&id(&prev)];
            assert!(
                prev_running < stopped_at[*o],
                "{o} stopped at {} before the previous replacement ran at {prev_running}",
                stopped_at[*o]
            );
        }
    }
    assert!(sys1_marked_at > web_gone_at, "the system alloc (marked at {sys1_marked_at}) left only after the web allocs ({web_gone_at})");
    let sys_final = allocs(&api, "sys");
    let s1 = sys_final.iter().find(|a| id(a) == sys1).unwrap();
    assert_eq!((s1["DesiredStatus"].as_str(), s1["ClientStatus"].as_str()), (Some("stop"), Some("complete")));
    let s2 = sys_final.iter().find(|a| id(a) == sys2).unwrap();
    assert_eq!(
        (s2["DesiredStatus"].as_str(), s2["ClientStatus"].as_str()),
        (Some("run"), Some("running")),
        "client2's system alloc untouched"
    );
    let drain_events: Vec<&str> =
        batches.iter().flat_map(|b| b.nodes.iter()).filter(|(_, n)| n["ID"] == n1.as_str()).map(|(t, _)| t.as_str()).collect();
    assert!(drain_events.contains(&"NodeDrain"), "{drain_events:?}");
}

#[test]
fn ignore_system_keeps_system_allocs_and_the_deadline_forces_the_rest() {
    let (c, n1, n2) = cluster();
    let api = c.servers[0].http();
    let _stop = StopJobs(api.clone(), vec!["sys", "report", "slow"]);
    api.put_json("/v1/jobs", &job("sys", "system", 1, None)).unwrap();
    wait_for("a system alloc running on each node", SETTLE, || {
        (allocs(&api, "sys").iter().filter(|a| a["ClientStatus"] == "running").count() == 2).then_some(())
    })
    .unwrap();
    set_eligibility(&api, &n2, "ineligible");
    // A batch alloc that would run for an hour, and a service alloc that cannot become healthy
    // before the deadline: neither leaves on its own.
    api.put_json("/v1/jobs", &job("report", "batch", 1, None)).unwrap();
    api.put_json("/v1/jobs", &job("slow", "service", 1, Some(migrate(1, Duration::from_secs(3600))))).unwrap();
    wait_for("the batch and service allocs running on client1", SETTLE, || {
        let running = |j| allocs(&api, j).iter().any(|a| a["ClientStatus"] == "running" && a["NodeID"] == n1.as_str());
        (running("report") && running("slow")).then_some(())
    })
    .unwrap();
    set_eligibility(&api, &n2, "eligible");
    let originals: Vec<String> = ["report", "slow"].iter().map(|j| id(&allocs(&api, j)[0])).collect();
    let sys1 = allocs(&api, "sys").into_iter().find(|a| a["NodeID"] == n1.as_str()).map(|a| id(&a)).unwrap();

    let (code, stdout, stderr) = drain_cli(&c.servers[0].http_addr, &["-enable", "-yes", "-ignore-system", "-deadline", "3s", &n1]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains(&format!("All allocations on node \"{n1}\" have stopped")), "{stdout}");
    assert_marked_lines_are_true(&api, &n1, &stdout);

    let node = api.get_json(&format!("/v1/node/{n1}")).unwrap();
    assert!(node["DrainStrategy"].is_null(), "{node}");
    assert_eq!(node["LastDrain"]["Status"], "complete");
    let last = node["Events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["Message"], "Node drain complete");
    assert_eq!(last["Details"]["deadline_reached"], "true", "the deadline ended it: {last}");

    // The deadline moved both; the system alloc stayed.
    for (j, o) in ["report", "slow"].iter().zip(&originals) {
        let a = allocs(&api, j).into_iter().find(|a| id(a) == *o).unwrap();
        assert!(migrating(&a) && a["DesiredStatus"] == "stop" && client_terminal(&a), "{j}: {a}");
    }
    let slow_live: Vec<Value> = allocs(&api, "slow").into_iter().filter(|a| !terminal(a)).collect();
    assert_eq!(slow_live.len(), 1);
    assert_eq!(slow_live[0]["NodeID"], n2.as_str(), "the forced service alloc was replaced on client2");
    let s1 = allocs(&api, "sys").into_iter().find(|a| id(a) == sys1).unwrap();
    assert!(!migrating(&s1), "{s1}");
    assert_eq!((s1["DesiredStatus"].as_str(), s1["ClientStatus"].as_str()), (Some("run"), Some("running")), "-ignore-system keeps it");
}
