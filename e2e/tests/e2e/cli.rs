//! The `nomad-rs` CLI against a real dev agent: every job file in `examples/` runs to running
//! (a batch job to complete), `alloc logs` shows what its task printed, `job stop -purge` removes
//! it, a bad job file fails naming the line; and a dev agent stopped with Ctrl-C leaves no task,
//! cgroup or container behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::Signal;
use nomad_e2e::{Agent, AgentOptions, HttpClient, wait_for};
use nomad_testkit::Prereq;
use serde_json::Value;

use crate::SETTLE;

/// What a run of the CLI produced.
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    pub(crate) fn expect(self, code: i32, what: &str) -> Run {
        assert_eq!(self.code, code, "{what}: exit code\n--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr);
        self
    }
}

/// Runs the CLI with `NOMAD_ADDR` pointing at `agent` and no other `NOMAD_*` settings.
pub(crate) fn nomad(agent: &Agent, args: &[&str]) -> Run {
    let mut cmd = Command::new(nomad_e2e::binary());
    cmd.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NOMAD_")) {
        cmd.env_remove(k);
    }
    let out = cmd.env("NOMAD_ADDR", format!("http://{}", agent.http_addr)).output().expect("run nomad-rs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name).display().to_string()
}

/// Where the dev agent in `dir` keeps runc's state: each test's own, so the containers of tests
/// running at the same time never meet (and one test's leftovers are its own).
fn runc_root(dir: &Path) -> PathBuf {
    dir.join("runc")
}

/// A dev agent (server and client in one process) in `dir`, with its node ready.
pub(crate) fn dev_agent(dir: &Path) -> Agent {
    let config = format!("plugin \"oci\" {{\n  config {{\n    runtime_root = {:?}\n  }}\n}}\n", runc_root(dir).display().to_string());
    let opts = AgentOptions { args: vec!["-dev".into()], config: Some(config), ..Default::default() };
    let agent = Agent::start("dev", dir, opts).expect("start dev agent");
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    wait_for("the dev node to be ready", SETTLE, || {
        http.get_json("/v1/nodes").ok()?.as_array()?.iter().any(|n| n["Status"] == "ready").then_some(())
    })
    .unwrap();
    agent
}

/// Whether exec and oci tasks can run here (root, runc, busybox-static): when not, the part of
/// the test that needs them is skipped loudly, or the test fails under CI.
pub(crate) fn isolated_tasks_possible() -> bool {
    nomad_testkit::prereq::met(&[Prereq::Root, Prereq::Runc, Prereq::Busybox])
}

/// `scripts/make-busybox-rootfs <dir>/rootfs`.
pub(crate) fn busybox_rootfs(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-busybox-rootfs");
    let out = Command::new(script).arg(&rootfs).output().expect("run make-busybox-rootfs");
    assert!(out.status.success(), "make-busybox-rootfs: {}", String::from_utf8_lossy(&out.stderr));
    rootfs
}

/// The job's allocations.
pub(crate) fn allocs(http: &HttpClient, job: &str) -> Vec<Value> {
    http.get_json(&format!("/v1/job/{job}/allocations")).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
}

/// The one allocation of `job`, once it has `status`.
pub(crate) fn alloc_with_status(agent: &Agent, job: &str, status: &str) -> Value {
    let http = agent.http();
    wait_for(&format!("the alloc of {job} to be {status}"), SETTLE, || {
        let list = allocs(&http, job);
        (list.len() == 1 && list[0]["ClientStatus"] == status).then(|| list[0].clone())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", allocs(&http, job), agent.logs()))
}

/// `alloc logs [flags] <alloc>` until its output contains `text` (a task may not have flushed yet).
pub(crate) fn logs_contain(agent: &Agent, alloc_id: &str, flags: &[&str], text: &str) -> String {
    let mut last = String::new();
    wait_for(&format!("`alloc logs {flags:?}` to show {text:?}"), SETTLE, || {
        let mut args = vec!["alloc", "logs"];
        args.extend_from_slice(flags);
        args.push(alloc_id);
        let run = nomad(agent, &args);
        last = format!("exit {}\n--- stdout\n{}\n--- stderr\n{}", run.code, run.stdout, run.stderr);
        (run.code == 0 && run.stdout.contains(text)).then_some(run.stdout)
    })
    .unwrap_or_else(|e| panic!("{e}; last run: {last}"))
}

/// `job stop -purge`, then the job is gone.
pub(crate) fn stop_and_purge(agent: &Agent, job: &str) {
    nomad(agent, &["job", "stop", "-purge", job]).expect(0, &format!("job stop -purge {job}"));
    let http = agent.http();
    wait_for(&format!("{job} to be purged"), SETTLE, || {
        (http.request("GET", &format!("/v1/job/{job}"), None).ok()?.status == 404).then_some(())
    })
    .unwrap();
    let status = nomad(agent, &["job", "status", job]);
    assert_ne!(status.code, 0, "job status of a purged job: {}", status.stdout);
}

/// An assigned host port of the alloc.
pub(crate) fn port(alloc: &Value, label: &str) -> u16 {
    let ports = alloc["AllocatedResources"]["Shared"]["Ports"].as_array().cloned().unwrap_or_default();
    let p = ports.iter().find(|p| p["Label"] == label).unwrap_or_else(|| panic!("no port {label} in {alloc}"));
    p["Value"].as_u64().unwrap() as u16
}

pub(crate) fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    Some(reply)
}

#[test]
fn every_example_runs_through_the_cli_shows_its_logs_and_is_purged() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(&dir.path().join("agent"));
    let http = agent.http();

    // hello: a raw_exec service that greets with its alloc ID.
    nomad(&agent, &["job", "run", &example("hello.nomad.hcl")]).expect(0, "job run hello");
    let hello = alloc_with_status(&agent, "hello", "running");
    let id = hello["ID"].as_str().unwrap();
    logs_contain(&agent, id, &[], &format!("hello from {id}"));
    // An ID prefix works as Nomad's does.
    logs_contain(&agent, &id[..8], &["-task", "hello"], "hello from");
    stop_and_purge(&agent, "hello");

    // node-ticker: a system job, one alloc on the one node.
    nomad(&agent, &["job", "run", &example("system.nomad.hcl")]).expect(0, "job run system");
    let ticker = alloc_with_status(&agent, "node-ticker", "running");
    logs_contain(&agent, ticker["ID"].as_str().unwrap(), &[], "tick from dev");
    stop_and_purge(&agent, "node-ticker");

    if isolated_tasks_possible() {
        // web: an exec task serving HTTP on a dynamic port; its access log goes to stderr.
        nomad(&agent, &["job", "run", &example("web.nomad.hcl")]).expect(0, "job run web");
        let web = alloc_with_status(&agent, "web", "running");
        let full = http.get_json(&format!("/v1/allocation/{}", web["ID"].as_str().unwrap())).unwrap();
        let port = port(&full, "http");
        let reply = wait_for("the web server to answer", SETTLE, || http_get(port, "/").filter(|r| r.starts_with("HTTP/1.0 200")))
            .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        assert!(reply.contains("Directory listing"), "{reply}");
        logs_contain(&agent, web["ID"].as_str().unwrap(), &["-stderr"], "\"GET / HTTP/1.0\" 200");
        stop_and_purge(&agent, "web");

        // oci-batch: busybox in a container, from a rootfs made by the project's script.
        let rootfs = busybox_rootfs(dir.path());
        let var = format!("rootfs={}", rootfs.display());
        let run = nomad(&agent, &["job", "run", "-var", &var, &example("oci-batch.nomad.hcl")]).expect(0, "job run oci-batch");
        assert!(run.stdout.contains("completed successfully"), "{}", run.stdout);
        let batch = alloc_with_status(&agent, "oci-batch", "complete");
        let out = logs_contain(&agent, batch["ID"].as_str().unwrap(), &[], "hello from busybox on busybox");
        assert!(out.contains("Linux"), "uname -sr: {out}");
        stop_and_purge(&agent, "oci-batch");
    }
}

#[test]
fn a_bad_job_file_exits_non_zero_naming_the_line_of_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(&dir.path().join("agent"));

    let syntax = dir.path().join("syntax.nomad.hcl");
    std::fs::write(
        &syntax,
        "job \"bad\" {\n  datacenters = [\"dc1\"]\n  group \"g\" {\n    task \"t\" {\n      driver = \n    }\n  }\n}\n",
    )
    .unwrap();
    let run = nomad(&agent, &["job", "run", syntax.to_str().unwrap()]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(run.stderr.contains("syntax.nomad.hcl:5:"), "the error names line 5: {}", run.stderr);

    let shape = dir.path().join("shape.nomad.hcl");
    std::fs::write(&shape, "job \"bad\" {\n  datacenters = [\"dc1\"]\n  group \"g\" {\n    count = \"three\"\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n").unwrap();
    let run = nomad(&agent, &["job", "run", shape.to_str().unwrap()]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(run.stderr.contains("shape.nomad.hcl:4:"), "the error names line 4: {}", run.stderr);
    assert!(run.stderr.contains("count"), "{}", run.stderr);

    // Nothing reached the server.
    let jobs = agent.http().get_json("/v1/jobs").unwrap();
    assert_eq!(jobs.as_array().map(Vec::len), Some(0), "{jobs}");
}

/// Every cgroup directory named `<alloc>.<task>` under any controller (v1) or the v2 root.
fn leftover_cgroups(alloc_id: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut parents = vec![root.join("nomad-rs")];
    if let Ok(controllers) = std::fs::read_dir(root) {
        parents.extend(controllers.filter_map(Result::ok).map(|c| c.path().join("nomad-rs")));
    }
    parents
        .iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|d| d.filter_map(Result::ok).map(|e| e.path()))
        .filter(|p| p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(alloc_id)))
        .collect()
}

#[test]
fn a_dev_agent_stopped_with_ctrl_c_leaves_no_task_cgroup_or_container_behind() {
    if !isolated_tasks_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut agent = dev_agent(&dir.path().join("agent"));
    let rootfs = busybox_rootfs(dir.path());

    // A running exec task and a finished oci batch alloc, as in the report.
    nomad(&agent, &["job", "run", &example("web.nomad.hcl")]).expect(0, "job run web");
    let web = alloc_with_status(&agent, "web", "running");
    let var = format!("rootfs={}", rootfs.display());
    nomad(&agent, &["job", "run", "-var", &var, &example("oci-batch.nomad.hcl")]).expect(0, "job run oci-batch");
    let batch = alloc_with_status(&agent, "oci-batch", "complete");
    let (web_id, batch_id) = (web["ID"].as_str().unwrap().to_string(), batch["ID"].as_str().unwrap().to_string());
    assert!(!leftover_cgroups(&web_id).is_empty(), "the running exec task has cgroups");

    let status = agent.stop_with(Signal::SIGINT, SETTLE).unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(leftover_cgroups(&web_id), Vec::<PathBuf>::new(), "cgroups of the exec task killed at shutdown");
    assert_eq!(leftover_cgroups(&batch_id), Vec::<PathBuf>::new(), "cgroups of the finished container");
    let runc = Command::new("runc").arg("--root").arg(runc_root(&dir.path().join("agent"))).args(["list", "-q"]).output().unwrap();
    let containers = String::from_utf8_lossy(&runc.stdout);
    assert!(!containers.lines().any(|c| c.starts_with(&batch_id)), "runc still has the container: {containers}");
    let tasks = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|p| std::fs::read(p.path().join("environ")).is_ok_and(|env| env.windows(web_id.len()).any(|w| w == web_id.as_bytes())))
        .count();
    assert_eq!(tasks, 0, "a process of the web alloc outlived the dev agent");
}

/// A process killed (and waited for) when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_dev_agent_moved_by_bind_and_a_ports_block_answers_there_healthy_and_logs_without_colors() {
    let dir = tempfile::tempdir().unwrap();
    let ports = nomad_e2e::cluster::reserve_ports(2).unwrap();
    let (http_port, rpc_port) = (ports[0], ports[1]);
    let config = dir.path().join("ports.hcl");
    std::fs::write(&config, format!("ports {{\n  http = {http_port}\n  rpc  = {rpc_port}\n}}\n")).unwrap();
    let stderr = dir.path().join("agent.stderr.log");
    let stdout = dir.path().join("agent.stdout.log");
    // Nomad's flags only: -bind and a config file's ports {}; stderr goes to a file, not a terminal.
    let child = Command::new(nomad_e2e::binary())
        .args(["agent", "-dev", "-bind", "127.0.0.1", "-data-dir"])
        .arg(dir.path().join("data"))
        .arg("-config")
        .arg(&config)
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut agent = KillOnDrop(child);
    let logs =
        || format!("{}\n{}", std::fs::read_to_string(&stdout).unwrap_or_default(), std::fs::read_to_string(&stderr).unwrap_or_default());

    let http = HttpClient::new(&format!("127.0.0.1:{http_port}"));
    let health = wait_for("the dev agent to be healthy on its configured port", SETTLE, || {
        let reply = http.get("/v1/agent/health").ok()?;
        (reply.status == 200).then(|| reply.json().ok()).flatten()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(health, serde_json::json!({"client": {"ok": true, "message": "ok"}, "server": {"ok": true, "message": "ok"}}));
    let me = http.get_json("/v1/agent/self").unwrap();
    assert_eq!(me["config"]["Ports"]["RPC"], rpc_port, "{me}");
    let root = http.request("GET", "/", None).unwrap();
    assert_eq!((root.status, root.header("location")), (307, Some("/ui/")));
    let ui = http.get("/ui/").unwrap();
    assert!(ui.status == 200 && ui.text().contains("no web UI"), "{} {}", ui.status, ui.text());

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.0.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_for("the dev agent to stop", SETTLE, || agent.0.try_wait().ok().flatten()).unwrap();
    assert!(status.success(), "{status}\n{}", logs());
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("INFO"), "the agent logged to stderr: {log}");
    assert!(!log.contains("\x1b["), "color escapes in a log file:\n{log}");
}

fn demo(env: &[(&str, &str)]) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo");
    let mut cmd = Command::new(script);
    cmd.env("NOMAD_RS_BIN", nomad_e2e::binary()).env_remove("DEMO_HTTP_PORT").env_remove("DEMO_RPC_PORT").env_remove("KEEP_RUNNING");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run scripts/demo");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn the_demo_runs_its_own_agent_beside_another_and_fails_when_it_cannot_bind() {
    let dir = tempfile::tempdir().unwrap();
    let other = crate::single_server(&dir.path().join("other"));
    // The caller's NOMAD_ADDR points at another agent: the demo talks to its own.
    let run = demo(&[("NOMAD_ADDR", &format!("http://{}", other.http_addr))]).expect(0, "scripts/demo beside another agent");
    assert!(run.stdout.contains("hello from"), "the demo showed its task's log:\n{}", run.stdout);
    let jobs = other.http().get_json("/v1/jobs").unwrap();
    assert_eq!(jobs, serde_json::json!([]), "the other agent was not used");

    // Its port taken: the demo fails, saying why, instead of talking to whoever holds the port.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let run = demo(&[("DEMO_HTTP_PORT", &port)]);
    assert_eq!(run.code, 1, "--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("demo: the dev agent exited before it listened"), "{}", run.stderr);
    assert!(run.stderr.contains("binding the HTTP listener"), "the agent's own error is shown: {}", run.stderr);
}
