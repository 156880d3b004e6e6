//! The docker driver through real `nomad-rs` dev agents on the real Docker Engine, driven by the
//! CLI and the HTTP API: a web server on its mapped port, `alloc logs -f`, exit codes and OOM
//! kills in task events, kill_signal/kill_timeout, ten `kill -9`s of the agent, a container
//! removed behind the agent's back, dangling-container reaping, image GC after `image_delay`,
//! docker and exec tasks sharing /alloc, and the Engine made unreachable through a proxy in front
//! of its socket (the real Engine is never stopped).
//!
//! No registry: each test imports its own image from the busybox rootfs
//! (`scripts/make-busybox-rootfs` + `docker import`) under a name unique to the test process and
//! the test, and removes it at the end, with every container its agent made.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nomad_e2e::{Agent, AgentOptions, FaultProxy, HttpClient, Mode, wait_for};
use nomad_testkit::Prereq;
use serde_json::Value;

use crate::SETTLE;
use crate::cli::{alloc_with_status, allocs, busybox_rootfs, http_get, isolated_tasks_possible, logs_contain, nomad, port, stop_and_purge};

/// Root, an Engine and busybox (for the image); skipped loudly otherwise, failed under CI.
pub(crate) fn docker_possible() -> bool {
    nomad_testkit::prereq::met(&[Prereq::Root, Prereq::Docker, Prereq::Busybox])
}

/// The docker CLI (test setup and observation only: the driver speaks the Engine API).
fn docker(args: &[&str]) -> Option<String> {
    let out = Command::new("docker").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// An image imported from the busybox rootfs, named for this test process and test; removed
/// (with any tag) when dropped.
pub(crate) struct TestImage {
    pub(crate) name: String,
}

impl TestImage {
    pub(crate) fn import(dir: &Path) -> TestImage {
        let rootfs = busybox_rootfs(dir);
        let name = format!("nomad-rs-e2e/busybox:{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
        let mut tar = Command::new("tar").arg("-C").arg(&rootfs).args(["-c", "."]).stdout(Stdio::piped()).spawn().unwrap();
        let out = Command::new("docker").args(["import", "-", &name]).stdin(tar.stdout.take().unwrap()).output().unwrap();
        assert!(tar.wait().unwrap().success(), "tar of the rootfs");
        assert!(out.status.success(), "docker import: {}", String::from_utf8_lossy(&out.stderr));
        TestImage { name }
    }

    fn present(&self) -> bool {
        docker(&["image", "inspect", &self.name]).is_some()
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = docker(&["rmi", "-f", &self.name]);
    }
}

/// A dev agent whose docker plugin has `plugin_config`, and every container it made removed
/// when the test ends (a killed agent leaves its containers running by design).
pub(crate) struct DockerAgent {
    agent: Agent,
    alloc_root: String,
}

impl Drop for DockerAgent {
    fn drop(&mut self) {
        let filter = format!("label=io.nomad-rs.alloc_root={}", self.alloc_root);
        if let Some(ids) = docker(&["ps", "-aq", "--filter", &filter]) {
            for id in ids.split_whitespace() {
                let _ = docker(&["rm", "-f", "-v", id]);
            }
        }
    }
}

impl std::ops::Deref for DockerAgent {
    type Target = Agent;
    fn deref(&self) -> &Agent {
        &self.agent
    }
}

impl std::ops::DerefMut for DockerAgent {
    fn deref_mut(&mut self) -> &mut Agent {
        &mut self.agent
    }
}

/// No dangling reaper unless a test asks for it (it has its own test).
pub(crate) const NO_REAPER: &str = "gc {\n      dangling_containers {\n        enabled = false\n      }\n    }";

pub(crate) fn docker_agent(dir: &Path, plugin_config: &str) -> DockerAgent {
    let config = format!("plugin \"docker\" {{\n  config {{\n    {plugin_config}\n  }}\n}}\n");
    let opts = AgentOptions { args: vec!["-dev".into()], config: Some(config), ..Default::default() };
    let agent = Agent::start("dev", dir, opts).expect("start dev agent");
    let alloc_root = agent.data_dir().join("alloc").display().to_string();
    let agent = DockerAgent { agent, alloc_root };
    agent.wait_for_leader(SETTLE).unwrap();
    wait_for_node(&agent.http(), "the dev node to be ready with the docker driver", SETTLE, |n| {
        n["Status"] == "ready" && n["Drivers"]["docker"]["Healthy"] == true
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    agent
}

/// The agent's one node (full), once `pred` holds for it.
fn wait_for_node(
    http: &HttpClient,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value, nomad_testkit::wait::TimedOut> {
    wait_for(what, timeout, || {
        let id = http.get_json("/v1/nodes").ok()?.as_array()?.first()?["ID"].as_str()?.to_string();
        let node = http.get_json(&format!("/v1/node/{id}")).ok()?;
        pred(&node).then_some(node)
    })
}

fn run_job(agent: &Agent, dir: &Path, name: &str, hcl: &str) {
    let file = dir.join(format!("{name}.nomad.hcl"));
    std::fs::write(&file, hcl).unwrap();
    nomad(agent, &["job", "run", "-detach", file.to_str().unwrap()]).expect(0, &format!("job run {name}"));
}

/// The container the driver made for the alloc, by Nomad's label (full ID), running or not.
fn containers_of(alloc_id: &str) -> Vec<String> {
    let filter = format!("label=com.hashicorp.nomad.alloc_id={alloc_id}");
    docker(&["ps", "-aq", "--no-trunc", "--filter", &filter]).unwrap_or_default().split_whitespace().map(str::to_string).collect()
}

fn the_container_of(alloc_id: &str) -> String {
    let ids = containers_of(alloc_id);
    assert_eq!(ids.len(), 1, "one container for alloc {alloc_id}: {ids:?}");
    ids[0].clone()
}

/// `docker inspect -f <format>` of a container.
fn inspect(id: &str, format: &str) -> Option<String> {
    docker(&["inspect", "-f", format, id])
}

fn alloc(http: &HttpClient, alloc_id: &str) -> Value {
    http.get_json(&format!("/v1/allocation/{alloc_id}")).unwrap()
}

fn events<'a>(alloc: &'a Value, task: &str, kind: &str) -> Vec<&'a Value> {
    alloc["TaskStates"][task]["Events"].as_array().map(|e| e.iter().filter(|e| e["Type"] == kind).collect()).unwrap_or_default()
}

/// Waits for the task of the alloc to be dead; the alloc then.
fn wait_task_dead(agent: &Agent, alloc_id: &str, task: &str, timeout: Duration) -> Value {
    let http = agent.http();
    wait_for(&format!("task {task} of {alloc_id} to be dead"), timeout, || {
        let a = http.get_json(&format!("/v1/allocation/{alloc_id}")).ok()?;
        (a["TaskStates"][task]["State"] == "dead").then_some(a)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()))
}

/// A file of the alloc dir through the agent (`alloc fs cat`'s endpoint).
fn alloc_file(http: &HttpClient, alloc_id: &str, path: &str) -> Option<String> {
    let reply = http.get(&format!("/v1/client/fs/cat/{alloc_id}?path={path}")).ok()?;
    (reply.status == 200).then(|| reply.text())
}

fn ticks(text: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.strip_prefix("tick-")?.trim().parse().ok()).collect()
}

/// The task's stdout through `alloc logs`.
fn stdout_of(agent: &Agent, alloc_id: &str, task: &str) -> String {
    nomad(agent, &["alloc", "logs", "-task", task, alloc_id]).expect(0, "alloc logs").stdout
}

/// Every tick once, in order, from 0.
fn assert_ticks_contiguous(text: &str, what: &str) -> u64 {
    let all = ticks(text);
    let expected: Vec<u64> = (0..all.len() as u64).collect();
    assert_eq!(all, expected, "{what}: every line once, in order");
    all.len() as u64
}

/// A job with one docker task running `script` under `sh -c`.
fn one_task_job(name: &str, image: &str, task: &str, script: &str, group_extra: &str) -> String {
    format!(
        r#"job "{name}" {{
  datacenters = ["*"]
  group "g" {{
    {group_extra}
    task "{task}" {{
      driver = "docker"
      config {{
        image   = "{image}"
        command = "sh"
        args    = ["-c", {script:?}]
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#
    )
}

const TICKER: &str = "i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.2; done";

#[test]
fn a_docker_web_server_answers_on_its_mapped_port_and_alloc_logs_follows_it() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let agent = docker_agent(&dir.path().join("agent"), NO_REAPER);
    let script = format!("echo ok > /local/index.html; httpd -p 8080 -h /local; {TICKER}");
    let job = format!(
        r#"job "dockerweb" {{
  datacenters = ["*"]
  group "web" {{
    network {{
      port "http" {{
        to = 8080
      }}
    }}
    task "httpd" {{
      driver = "docker"
      config {{
        image   = "{}"
        command = "sh"
        args    = ["-c", {script:?}]
        ports   = ["http"]
      }}
      resources {{
        cpu    = 100
        memory = 32
      }}
    }}
  }}
}}
"#,
        image.name
    );
    run_job(&agent, dir.path(), "dockerweb", &job);
    let a = alloc_with_status(&agent, "dockerweb", "running");
    let alloc_id = a["ID"].as_str().unwrap().to_string();
    let a = alloc(&agent.http(), &alloc_id);
    let host_port = port(&a, "http");
    let reply =
        wait_for("the docker task's mapped port to answer", SETTLE, || http_get(host_port, "/index.html").filter(|r| r.contains("ok")))
            .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert!(reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200"), "{reply}");
    let id = the_container_of(&alloc_id);
    assert_eq!(inspect(&id, "{{.Name}}").unwrap(), format!("/httpd-{alloc_id}"), "Nomad's container name");
    let binding = inspect(&id, "{{json .HostConfig.PortBindings}}").unwrap();
    assert!(binding.contains("\"8080/tcp\"") && binding.contains(&format!("\"HostPort\":\"{host_port}\"")), "{binding}");

    // `alloc logs -f` keeps printing what the task writes after it started following.
    let before = ticks(&logs_contain(&agent, &alloc_id, &[], "tick-1\n")).last().copied().unwrap();
    let mut follow = Command::new(nomad_e2e::binary())
        .args(["alloc", "logs", "-f", &alloc_id])
        .env("NOMAD_ADDR", format!("http://{}", agent.http_addr))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut followed = String::new();
    let deadline = Instant::now() + SETTLE;
    while ticks(&followed).last().is_none_or(|n| *n < before + 5) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => followed.push_str(&format!("{line}\n")),
            Err(_) => panic!("`alloc logs -f` stopped following: it printed {followed:?} (tick {before} was already written)"),
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert_ticks_contiguous(&followed, "alloc logs -f");

    stop_and_purge(&agent, "dockerweb");
    wait_for("the container to be removed", SETTLE, || containers_of(&alloc_id).is_empty().then_some(())).unwrap();
}

#[test]
fn exit_codes_and_an_oom_kill_are_reported_in_task_events() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let agent = docker_agent(&dir.path().join("agent"), NO_REAPER);
    let once =
        "restart {\n      attempts = 0\n      mode = \"fail\"\n    }\n    reschedule {\n      attempts = 0\n      unlimited = false\n    }";
    let job = |name: &str, script: &str, memory: u32| {
        one_task_job(name, &image.name, "t", script, once)
            .replace("memory = 32", &format!("memory = {memory}"))
            .replace(&format!("job \"{name}\" {{\n"), &format!("job \"{name}\" {{\n  type = \"batch\"\n"))
    };
    run_job(&agent, dir.path(), "exits", &job("exits", "echo bye; exit 3", 32));
    run_job(&agent, dir.path(), "hog", &job("hog", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done", 10));

    let exits = alloc_with_status(&agent, "exits", "failed");
    let a = alloc(&agent.http(), exits["ID"].as_str().unwrap());
    let terminated = events(&a, "t", "Terminated");
    assert_eq!(terminated.len(), 1, "{a}");
    assert_eq!(terminated[0]["ExitCode"], 3, "{}", terminated[0]);
    assert_eq!(terminated[0]["Details"]["exit_code"], "3");
    assert_eq!(terminated[0]["Details"]["oom_killed"], "false");
    assert_eq!(a["TaskStates"]["t"]["Failed"], true, "{a}");
    assert!(events(&a, "t", "Not Restarting").len() == 1, "{a}");

    let hog = alloc_with_status(&agent, "hog", "failed");
    let a = alloc(&agent.http(), hog["ID"].as_str().unwrap());
    let terminated = events(&a, "t", "Terminated");
    assert_eq!(terminated.len(), 1, "{a}");
    assert_eq!(terminated[0]["Details"]["oom_killed"], "true", "{}", terminated[0]);
    assert_eq!(terminated[0]["ExitCode"], 137, "{}", terminated[0]);
    assert!(terminated[0]["DisplayMessage"].as_str().unwrap().contains("OOM Killed"), "{}", terminated[0]);
    // Its container is gone with the task (gc.container defaults to true).
    assert_eq!(containers_of(hog["ID"].as_str().unwrap()), Vec::<String>::new());
    // `alloc status` says so too.
    let status = nomad(&agent, &["alloc", "status", hog["ID"].as_str().unwrap()]).expect(0, "alloc status");
    assert!(status.stdout.contains("OOM Killed"), "{}", status.stdout);
}

#[test]
fn stop_sends_the_kill_signal_and_kills_after_the_kill_timeout() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let agent = docker_agent(&dir.path().join("agent"), NO_REAPER);
    let polite = "trap 'echo USR1 > /alloc/polite; exit 0' USR1; trap 'echo TERM > /alloc/polite; exit 0' TERM; echo ready; while true; do sleep 0.1; done";
    let stubborn = "trap 'echo TERM > /alloc/stubborn' TERM; echo ready; while true; do sleep 0.1; done";
    let task = |name: &str, script: &str, kill: &str| {
        format!(
            r#"    task "{name}" {{
      driver = "docker"
      {kill}
      config {{
        image   = "{}"
        command = "sh"
        args    = ["-c", {script:?}]
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
"#,
            image.name
        )
    };
    let job = format!(
        "job \"signals\" {{\n  datacenters = [\"*\"]\n  group \"g\" {{\n{}{}  }}\n}}\n",
        task("polite", polite, "kill_signal = \"SIGUSR1\"\n      kill_timeout = \"20s\""),
        task("stubborn", stubborn, "kill_timeout = \"3s\""),
    );
    run_job(&agent, dir.path(), "signals", &job);
    let a = alloc_with_status(&agent, "signals", "running");
    let alloc_id = a["ID"].as_str().unwrap().to_string();
    logs_contain(&agent, &alloc_id, &["-task", "polite"], "ready");
    logs_contain(&agent, &alloc_id, &["-task", "stubborn"], "ready");

    nomad(&agent, &["job", "stop", "-detach", "signals"]).expect(0, "job stop");
    wait_task_dead(&agent, &alloc_id, "polite", SETTLE);
    let a = wait_task_dead(&agent, &alloc_id, "stubborn", SETTLE);
    let http = agent.http();
    assert_eq!(alloc_file(&http, &alloc_id, "alloc/polite").as_deref(), Some("USR1\n"), "the trap saw kill_signal");
    assert_eq!(
        alloc_file(&http, &alloc_id, "alloc/stubborn").as_deref(),
        Some("TERM\n"),
        "SIGTERM by default: {}",
        a["TaskStates"]["stubborn"]
    );

    let time = |e: &Value| e["Time"].as_i64().unwrap();
    let killing = events(&a, "polite", "Killing");
    assert_eq!(killing.len(), 1, "{a}");
    assert_eq!(killing[0]["DisplayMessage"], "Sent SIGUSR1. Waiting 20s before force killing");
    let terminated = events(&a, "polite", "Terminated");
    assert_eq!(terminated[0]["ExitCode"], 0, "it exited by its trap: {}", terminated[0]);
    let waited = Duration::from_nanos((time(terminated[0]) - time(killing[0])) as u64);
    assert!(waited < Duration::from_secs(15), "it was not made to wait for the kill_timeout: {waited:?}");

    let killing = events(&a, "stubborn", "Killing");
    assert_eq!(killing[0]["DisplayMessage"], "Sent SIGTERM. Waiting 3s before force killing");
    let terminated = events(&a, "stubborn", "Terminated");
    assert_eq!(terminated[0]["ExitCode"], 137, "SIGKILLed: {}", terminated[0]);
    let waited = Duration::from_nanos((time(terminated[0]) - time(killing[0])) as u64);
    assert!(waited >= Duration::from_secs(3), "SIGKILL only after the kill_timeout: {waited:?}");
    assert!(waited < Duration::from_secs(15), "and soon after it: {waited:?}");
}

#[test]
fn a_docker_task_survives_ten_kill_9s_of_its_agent_in_the_same_container_with_its_logs_whole() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let mut agent = docker_agent(&dir.path().join("agent"), NO_REAPER);
    run_job(&agent, dir.path(), "long", &one_task_job("long", &image.name, "ticker", TICKER, ""));
    let a = alloc_with_status(&agent, "long", "running");
    let alloc_id = a["ID"].as_str().unwrap().to_string();
    let id = the_container_of(&alloc_id);
    let started_at = inspect(&id, "{{.State.StartedAt}}").unwrap();
    let alive = || inspect(&id, "{{.State.Running}} {{.RestartCount}}").as_deref() == Some("true 0");

    for round in 1..=10 {
        let seen = ticks(&logs_contain(&agent, &alloc_id, &[], "tick-")).last().copied().unwrap();
        agent.kill9().unwrap();
        assert!(alive(), "round {round}: the container died with its agent");
        agent.restart().unwrap();
        agent.wait_for_leader(SETTLE).unwrap();
        let http = agent.http();
        // The restored runner holds the task's handle again: the agent reports its usage.
        wait_for(&format!("round {round}: the agent to reattach to the container"), SETTLE, || {
            let stats = http.get_json(&format!("/v1/client/allocation/{alloc_id}/stats")).ok()?;
            stats["Tasks"].get("ticker").map(drop)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        let a = alloc(&http, &alloc_id);
        let state = &a["TaskStates"]["ticker"];
        assert_eq!((&state["State"], &state["Restarts"]), (&Value::from("running"), &Value::from(0)), "round {round}: {state}");
        assert_eq!(events(&a, "ticker", "Started").len(), 1, "round {round}: started once: {state}");
        assert_eq!(a["ClientStatus"], "running", "round {round}");
        assert_eq!(containers_of(&alloc_id), vec![id.clone()], "round {round}: one container, the same one");
        assert_eq!(inspect(&id, "{{.State.StartedAt}}").unwrap(), started_at, "round {round}: never restarted");
        assert!(alive(), "round {round}");
        // Its logs flow again after each restart.
        wait_for(&format!("round {round}: logs past tick {seen}"), SETTLE, || {
            ticks(&stdout_of(&agent, &alloc_id, "ticker")).last().is_some_and(|n| *n > seen + 2).then_some(())
        })
        .unwrap();
    }
    assert_ticks_contiguous(&stdout_of(&agent, &alloc_id, "ticker"), "across ten kill -9s");

    // Still the agent's task: stopping the job stops and removes that very container.
    nomad(&agent, &["job", "stop", "-detach", "long"]).expect(0, "job stop");
    let a = wait_task_dead(&agent, &alloc_id, "ticker", SETTLE);
    assert_eq!(a["TaskStates"]["ticker"]["Restarts"], 0);
    wait_for("the container to be removed", SETTLE, || containers_of(&alloc_id).is_empty().then_some(())).unwrap();
}

/// The allocs of `job` that run, by ID, once there are `n` and `pred` holds for the set.
fn wait_allocs(agent: &Agent, job: &str, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let http = agent.http();
    wait_for(what, Duration::from_secs(60), || {
        let list = allocs(&http, job);
        pred(&list).then_some(list)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", allocs(&http, job), agent.logs()))
}

fn running_other_than<'a>(list: &'a [Value], gone: &[String]) -> Option<&'a Value> {
    list.iter().find(|a| a["ClientStatus"] == "running" && !gone.iter().any(|g| a["ID"] == g.as_str()))
}

#[test]
fn a_container_removed_behind_the_agents_back_is_reported_failed_and_rescheduled() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let mut agent = docker_agent(&dir.path().join("agent"), NO_REAPER);
    let policy = "restart {\n      attempts = 0\n      mode = \"fail\"\n    }\n    reschedule {\n      delay = \"5s\"\n      delay_function = \"constant\"\n      unlimited = true\n    }";
    run_job(&agent, dir.path(), "victim", &one_task_job("victim", &image.name, "t", "sleep 3600", policy));
    let first = alloc_with_status(&agent, "victim", "running")["ID"].as_str().unwrap().to_string();
    let c1 = the_container_of(&first);

    // Removed while the agent watches it.
    docker(&["rm", "-f", &c1]).expect("docker rm -f");
    let list = wait_allocs(&agent, "victim", "the alloc to fail and be replaced", |l| {
        l.iter().any(|a| a["ID"] == first.as_str() && a["ClientStatus"] == "failed")
            && running_other_than(l, std::slice::from_ref(&first)).is_some()
    });
    let a = alloc(&agent.http(), &first);
    let terminated = events(&a, "t", "Terminated");
    assert!(
        terminated.last().is_some_and(|e| e["DisplayMessage"].as_str().unwrap().contains("removed outside Nomad")),
        "the removal is what the task events say: {a}"
    );
    let second = running_other_than(&list, std::slice::from_ref(&first)).unwrap()["ID"].as_str().unwrap().to_string();
    let second_alloc = alloc(&agent.http(), &second);
    assert_eq!(second_alloc["PreviousAllocation"], first.as_str(), "a reschedule of the failed alloc");
    let c2 = the_container_of(&second);
    assert_ne!(c1, c2);
    assert_eq!(inspect(&c2, "{{.State.Running}}").as_deref(), Some("true"));

    // Removed while the agent is down: the restarted agent reports it instead of reattaching.
    agent.kill9().unwrap();
    docker(&["rm", "-f", &c2]).expect("docker rm -f");
    agent.restart().unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    wait_allocs(&agent, "victim", "the second alloc to fail and be replaced", |l| {
        l.iter().any(|a| a["ID"] == second.as_str() && a["ClientStatus"] == "failed")
            && running_other_than(l, &[first.clone(), second.clone()]).is_some()
    });
    let a = alloc(&agent.http(), &second);
    let terminated = events(&a, "t", "Terminated");
    assert!(
        terminated.last().is_some_and(|e| e["DisplayMessage"].as_str().unwrap().contains("removed outside Nomad")),
        "after a restart too: {a}"
    );
}

#[test]
fn a_dangling_container_of_this_agent_is_reaped_after_its_grace_and_no_other() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let reaper = "gc {\n      dangling_containers {\n        enabled = true\n        period = \"1s\"\n        creation_grace = \"1m\"\n      }\n    }";
    let agent = docker_agent(&dir.path().join("agent"), reaper);
    run_job(&agent, dir.path(), "tracked", &one_task_job("tracked", &image.name, "t", "sleep 3600", ""));
    let tracked = the_container_of(alloc_with_status(&agent, "tracked", "running")["ID"].as_str().unwrap());

    // What an agent that died between creating a container and recording it leaves behind: a
    // running container with Nomad's labels and this agent's alloc root, that no task knows.
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let create = |name: &str, root: &str| {
        let alloc_label = format!("com.hashicorp.nomad.alloc_id={}", uuid::Uuid::new_v4());
        let root_label = format!("io.nomad-rs.alloc_root={root}");
        docker(&["run", "-d", "--name", name, "--label", &alloc_label, "--label", &root_label, &image.name, "sleep", "3600"])
            .unwrap_or_else(|| panic!("docker run {name}"))
    };
    let created = Instant::now();
    let dangling = create(&format!("dangling-{unique}"), &agent.alloc_root);
    let other_root = format!("/nonexistent/other-agent-{unique}");
    let others = create(&format!("other-agent-{unique}"), &other_root);
    let _others_cleanup = RemoveOnDrop(others.clone());

    wait_for("the dangling container to be reaped", Duration::from_secs(150), || (inspect(&dangling, "{{.Id}}").is_none()).then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    // The Engine dates containers to the second: the grace can end up to 1 s early.
    assert!(created.elapsed() >= Duration::from_secs(59), "reaped only after creation_grace: {:?}", created.elapsed());
    assert_eq!(inspect(&tracked, "{{.State.Running}}").as_deref(), Some("true"), "a task's container is kept");
    assert_eq!(inspect(&others, "{{.State.Running}}").as_deref(), Some("true"), "another agent's container is kept");
}

struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

#[test]
fn an_image_is_removed_image_delay_after_its_last_task_and_kept_when_taken_again() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let delay = Duration::from_secs(8);
    let config = "gc {\n      image_delay = \"8s\"\n      dangling_containers {\n        enabled = false\n      }\n    }";
    let agent = docker_agent(&dir.path().join("agent"), config);
    run_job(&agent, dir.path(), "first", &one_task_job("first", &image.name, "t", "sleep 3600", ""));
    let first = alloc_with_status(&agent, "first", "running")["ID"].as_str().unwrap().to_string();
    // Absence over time is what is checked here: there is nothing to wait on but the time.
    std::thread::sleep(delay + Duration::from_secs(1));
    assert!(image.present(), "kept while a task uses it");

    // The last user stops (its container removed: the reference is released), and another task
    // takes the image within the delay: the pending removal is cancelled.
    nomad(&agent, &["job", "stop", "-detach", "first"]).expect(0, "job stop first");
    wait_for("the first container to be removed", SETTLE, || containers_of(&first).is_empty().then_some(())).unwrap();
    let released = Instant::now();
    run_job(&agent, dir.path(), "second", &one_task_job("second", &image.name, "t", "sleep 3600", ""));
    alloc_with_status(&agent, "second", "running");
    std::thread::sleep((delay + Duration::from_secs(2)).saturating_sub(released.elapsed()));
    assert!(image.present(), "a new user cancels the pending removal");

    let stopped = Instant::now();
    nomad(&agent, &["job", "stop", "-detach", "second"]).expect(0, "job stop second");
    wait_for("the image to be removed", SETTLE, || (!image.present()).then_some(())).unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert!(stopped.elapsed() >= delay, "removed only after image_delay: {:?}", stopped.elapsed());
}

#[test]
fn docker_and_exec_tasks_of_one_group_share_the_alloc_dir() {
    if !docker_possible() || !isolated_tasks_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let agent = docker_agent(&dir.path().join("agent"), NO_REAPER);
    // Each side writes a temp file and renames it: the other never sees it created but empty.
    let from_docker = "while [ ! -e /alloc/from-exec ]; do sleep 0.1; done; echo from-docker > /alloc/from-docker.tmp; mv /alloc/from-docker.tmp /alloc/from-docker; echo \"docker read: $(cat /alloc/from-exec) in $NOMAD_ALLOC_DIR\"; exec sleep 3600";
    let from_exec = "echo from-exec > /alloc/from-exec.tmp; mv /alloc/from-exec.tmp /alloc/from-exec; while [ ! -e /alloc/from-docker ]; do sleep 0.1; done; echo \"exec read: $(cat /alloc/from-docker)\"; exec sleep 3600";
    let job = format!(
        r#"job "mixed" {{
  datacenters = ["*"]
  group "g" {{
    task "d" {{
      driver = "docker"
      config {{
        image   = "{}"
        command = "sh"
        args    = ["-c", {from_docker:?}]
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
    task "e" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", {from_exec:?}]
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#,
        image.name
    );
    run_job(&agent, dir.path(), "mixed", &job);
    let a = alloc_with_status(&agent, "mixed", "running");
    let alloc_id = a["ID"].as_str().unwrap();
    logs_contain(&agent, alloc_id, &["-task", "d"], "docker read: from-exec in /alloc");
    logs_contain(&agent, alloc_id, &["-task", "e"], "exec read: from-docker");
    // One directory on the host, seen by the agent's API too.
    let http = agent.http();
    assert_eq!(alloc_file(&http, alloc_id, "alloc/from-docker").as_deref(), Some("from-docker\n"));
    assert_eq!(alloc_file(&http, alloc_id, "alloc/from-exec").as_deref(), Some("from-exec\n"));
    stop_and_purge(&agent, "mixed");
}

#[test]
fn an_unreachable_engine_makes_the_driver_unhealthy_and_back_and_running_containers_are_kept() {
    if !docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = TestImage::import(dir.path());
    let proxy = FaultProxy::start_unix(&dir.path().join("engine.sock"), &nomad_testkit::prereq::docker_socket()).unwrap();
    let config = format!("endpoint = \"unix://{}\"\n    {NO_REAPER}", proxy.addr());
    let agent = docker_agent(&dir.path().join("agent"), &config);
    run_job(&agent, dir.path(), "steady", &one_task_job("steady", &image.name, "ticker", TICKER, ""));
    let alloc_id = alloc_with_status(&agent, "steady", "running")["ID"].as_str().unwrap().to_string();
    let id = the_container_of(&alloc_id);
    let started_at = inspect(&id, "{{.State.StartedAt}}").unwrap();
    let http = agent.http();
    // A fingerprint every 30 s, and a hung Engine must not hold one for long.
    let fingerprints = Duration::from_secs(75);

    for (outage, mode) in [("the Engine went away", Mode::Refuse), ("the Engine hangs", Mode::Pause)] {
        let seen = ticks(&logs_contain(&agent, &alloc_id, &[], "tick-")).last().copied().unwrap();
        if mode == Mode::Refuse {
            proxy.down();
        } else {
            proxy.set_mode(mode);
        }
        let node = wait_for_node(&http, &format!("{outage}: the docker driver to be unhealthy"), fingerprints, |n| {
            n["Drivers"]["docker"]["Healthy"] == false
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        let driver = &node["Drivers"]["docker"];
        assert_eq!(driver["Detected"], true, "{outage}: detected, not healthy: {driver}");
        assert!(driver["HealthDescription"].as_str().unwrap().starts_with("Failed to connect to docker daemon"), "{outage}: {driver}");
        assert_eq!(node["Status"], "ready", "{outage}: the node itself is fine");
        let a = alloc(&http, &alloc_id);
        assert_eq!(a["ClientStatus"], "running", "{outage}: the alloc keeps running: {a}");

        proxy.heal();
        wait_for_node(&http, &format!("after {outage}: the docker driver to be healthy again"), fingerprints, |n| {
            n["Drivers"]["docker"]["Healthy"] == true
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        assert_eq!(containers_of(&alloc_id), vec![id.clone()], "after {outage}: the same container");
        assert_eq!(inspect(&id, "{{.State.Running}} {{.RestartCount}}").as_deref(), Some("true 0"), "after {outage}");
        assert_eq!(inspect(&id, "{{.State.StartedAt}}").unwrap(), started_at, "after {outage}: never restarted");
        let a = alloc(&http, &alloc_id);
        let state = &a["TaskStates"]["ticker"];
        assert_eq!((&state["State"], &state["Restarts"]), (&Value::from("running"), &Value::from(0)), "after {outage}: {state}");
        assert!(events(&a, "ticker", "Terminated").is_empty(), "after {outage}: {state}");
        // The log follower comes back and collects what was written meanwhile.
        wait_for(&format!("after {outage}: logs past tick {seen}"), SETTLE, || {
            ticks(&stdout_of(&agent, &alloc_id, "ticker")).last().is_some_and(|n| *n > seen + 10).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        assert_ticks_contiguous(&stdout_of(&agent, &alloc_id, "ticker"), &format!("after {outage}"));
    }

    // Still managed: stopping the job removes the container through the proxy.
    stop_and_purge(&agent, "steady");
    wait_for("the container to be removed", SETTLE, || containers_of(&alloc_id).is_empty().then_some(())).unwrap();
}
