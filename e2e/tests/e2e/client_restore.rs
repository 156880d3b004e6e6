//! Tasks outlive their agent: a dev-style agent (server and client in one process) killed with
//! `kill -9` again and again comes back to the same task process each time, without restarting it.

use nomad_e2e::{Agent, AgentOptions, wait_for};
use serde_json::{Value, json};

use crate::SETTLE;

/// The PID of the process whose command is `comm` and whose environment holds
/// `NOMAD_ALLOC_ID=<alloc_id>`, found by walking `/proc` (not through the agent).
fn task_pid_from_proc(alloc_id: &str, comm: &str) -> Option<i32> {
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

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rfind(')').and_then(|i| s[i + 2..].chars().next());
        !matches!(state, Some('Z') | Some('X') | None)
    })
}

/// Kills the task's process group if the test ends early, so a failure leaves nothing running.
struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.filter(|p| alive(*p)) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn task_state(alloc: &Value) -> &Value {
    &alloc["TaskStates"]["sleeper"]
}

fn started_events(state: &Value) -> usize {
    state["Events"].as_array().map_or(0, |events| events.iter().filter(|e| e["Type"] == "Started").count())
}

#[test]
fn a_task_survives_ten_kill_9s_of_its_agent_with_the_same_pid_and_no_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(
        "dev",
        dir.path(),
        AgentOptions { args: vec!["-dev".into(), "-log-level".into(), "INFO".into()], ..Default::default() },
    )
    .unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    wait_for("the dev node to be ready", SETTLE, || {
        let nodes = http.get_json("/v1/nodes").ok()?;
        nodes.as_array()?.iter().any(|n| n["Status"] == "ready").then_some(())
    })
    .unwrap();

    let job = json!({"Job": {
        "ID": "long", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Tasks": [{"Name": "sleeper", "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": ["3600"]},
                "Resources": {"CPU": 20, "MemoryMB": 16}}]}]}});
    http.put_json("/v1/jobs", &job).unwrap();
    let alloc_id = wait_for("an alloc of the job", SETTLE, || {
        let allocs = http.get_json("/v1/job/long/allocations").ok()?;
        allocs.as_array()?.first()?["ID"].as_str().map(str::to_string)
    })
    .unwrap();
    let mut guard = KillOnDrop(None);
    let pid = wait_for("the task process", SETTLE, || task_pid_from_proc(&alloc_id, "sleep")).unwrap();
    guard.0 = Some(pid);
    wait_for("the task to be running on the server", SETTLE, || {
        let alloc = http.get_json(&format!("/v1/allocation/{alloc_id}")).ok()?;
        (alloc["ClientStatus"] == "running" && task_state(&alloc)["State"] == "running").then_some(())
    })
    .unwrap();

    for round in 1..=10 {
        agent.kill9().unwrap();
        assert!(alive(pid), "round {round}: the task died with its agent");
        assert_eq!(task_pid_from_proc(&alloc_id, "sleep"), Some(pid), "round {round}: one task process, the same one");

        agent.restart().unwrap();
        agent.wait_for_leader(SETTLE).unwrap();
        let http = agent.http();
        // The restored runner holds the task's handle again: the agent reports the task's usage.
        wait_for(&format!("round {round}: the agent to reattach to the task"), SETTLE, || {
            let stats = http.get_json(&format!("/v1/client/allocation/{alloc_id}/stats")).ok()?;
            stats["Tasks"].get("sleeper").map(drop)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        let alloc = http.get_json(&format!("/v1/allocation/{alloc_id}")).unwrap();
        let state = task_state(&alloc);
        assert_eq!(state["State"], "running", "round {round}: {state}");
        assert_eq!(state["Restarts"], 0, "round {round}: {state}");
        assert_eq!(started_events(state), 1, "round {round}: started once: {state}");
        assert_eq!(alloc["ClientStatus"], "running", "round {round}");
        assert!(alive(pid), "round {round}");
        assert_eq!(task_pid_from_proc(&alloc_id, "sleep"), Some(pid), "round {round}: same PID");
    }

    // Still the agent's task after all that: stopping the job ends the very same process.
    let http = agent.http();
    http.delete_json("/v1/job/long").unwrap();
    wait_for("the task to be stopped", SETTLE, || (!alive(pid)).then_some(())).unwrap();
    let alloc = wait_for("the stop to reach the server", SETTLE, || {
        let alloc = http.get_json(&format!("/v1/allocation/{alloc_id}")).ok()?;
        (task_state(&alloc)["State"] == "dead").then_some(alloc)
    })
    .unwrap();
    assert_eq!(task_state(&alloc)["Restarts"], 0);
    assert_eq!(started_events(task_state(&alloc)), 1);
    let status = agent.stop_with(nix::sys::signal::Signal::SIGINT, SETTLE).unwrap();
    assert!(status.success(), "a normal shutdown: {status}");
}
