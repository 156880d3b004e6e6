//! Nomad service checks (`provider = "nomad"`) with a real dev agent: a raw_exec task serving
//! HTTP on its dynamic port passes its http check, shown on both routes in Nomad's shape and by
//! `alloc status`; the results survive a `kill -9` of the agent; a server that stops makes the
//! check fail, and `check_restart` restarts the task.

use nomad_e2e::{Agent, AgentOptions, wait_for};
use serde_json::{Value, json};

use crate::SETTLE;

/// The PIDs of processes named `comm` whose environment holds `NOMAD_ALLOC_ID=<alloc_id>`.
fn pids_of(alloc_id: &str, comm: &str) -> Vec<i32> {
    let needle = format!("NOMAD_ALLOC_ID={alloc_id}");
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            if name.trim() != comm {
                return None;
            }
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            environ.split(|b| *b == 0).any(|var| var == needle.as_bytes()).then_some(pid)
        })
        .collect()
}

fn job() -> Value {
    // The shell outlives its HTTP server, so killing the server fails the check, not the task.
    let script = "python3 -m http.server \"$NOMAD_PORT_http\" --bind \"$NOMAD_IP_http\" & sleep 3600";
    json!({"Job": {
        "ID": "checks-e2e", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "api", "Count": 1,
            "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Services": [{"Name": "api-tcp", "Provider": "nomad", "PortLabel": "http",
                // A slow check: its first run is 10 s after start, so a restored result is seen
                // before any new run could have made it.
                "Checks": [{"Name": "slow", "Type": "tcp", "Interval": 20_000_000_000u64, "Timeout": 2_000_000_000u64}]}],
            "Tasks": [{"Name": "web", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", script]},
                "Services": [{"Name": "web", "Provider": "nomad", "PortLabel": "http",
                    "Checks": [{"Name": "web-http", "Type": "http", "Path": "/", "Interval": 1_000_000_000u64,
                        "Timeout": 1_000_000_000u64, "CheckRestart": {"Limit": 3, "Grace": 1_000_000_000u64}}]}],
                "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}})
}

/// The check result named `name`, from `path`.
fn result(http: &nomad_e2e::HttpClient, path: &str, name: &str) -> Option<Value> {
    http.get_json(path).ok()?.as_object()?.values().find(|r| r["Check"] == name).cloned()
}

#[test]
fn nomad_checks_pass_fail_restart_the_task_and_survive_an_agent_restart() {
    if std::process::Command::new("python3").arg("--version").output().is_err() {
        panic!("python3 is needed to serve HTTP in the task");
    }
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
        http.get_json("/v1/nodes").ok()?.as_array()?.iter().any(|n| n["Status"] == "ready").then_some(())
    })
    .unwrap();
    http.put_json("/v1/jobs", &job()).unwrap();
    let alloc_id = wait_for("an alloc of the job", SETTLE, || {
        http.get_json("/v1/job/checks-e2e/allocations").ok()?.as_array()?.first()?["ID"].as_str().map(str::to_string)
    })
    .unwrap();
    let server_path = format!("/v1/allocation/{alloc_id}/checks");
    let client_path = format!("/v1/client/allocation/{alloc_id}/checks");

    // Passing, on both routes, in Nomad's shape.
    let web = wait_for("the http check to pass", SETTLE, || result(&http, &server_path, "web-http").filter(|r| r["Status"] == "success"))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let id = web["ID"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "an md5 in hex: {id}");
    assert_eq!(web["Mode"], "healthiness");
    assert_eq!(web["StatusCode"], 200);
    assert_eq!(web["Output"], "nomad: http ok");
    assert_eq!((web["Group"].as_str(), web["Task"].as_str()), (Some("checks-e2e.api[0]"), Some("web")));
    assert_eq!((web["Service"].as_str(), web["Check"].as_str()), (Some("web"), Some("web-http")));
    let ts = web["Timestamp"].as_i64().unwrap();
    assert!((1_600_000_000..10_000_000_000).contains(&ts), "Unix seconds: {ts}");
    let both = http.get_json(&client_path).unwrap();
    assert_eq!(both[&id]["Check"], "web-http", "the client route answers the same: {both}");
    assert_eq!(both.as_object().unwrap().len(), 2, "{both}");
    let unknown = http.request("GET", "/v1/allocation/00000000-0000-0000-0000-000000000000/checks", None).unwrap();
    assert_eq!(unknown.status, 404, "{}", unknown.text());

    // The slow group check passes too (its first run is at 10 s); no Task for a group service.
    let slow =
        wait_for("the slow check to pass", SETTLE, || result(&http, &server_path, "slow").filter(|r| r["Status"] == "success")).unwrap();
    assert!(slow.get("Task").is_none() && slow.get("StatusCode").is_none(), "{slow}");
    assert_eq!(slow["Output"], "nomad: tcp ok");

    // `alloc status` shows them as Nomad 1.6 does.
    let status = crate::cli::nomad(&agent, &["alloc", "status", &alloc_id]).expect(0, "alloc status");
    let stdout = status.stdout;
    assert!(stdout.contains("Nomad Service Checks:\nService  Task     Name      Mode         Status\n"), "{stdout}");
    assert!(stdout.contains("api-tcp  (group)  slow      healthiness  success"), "{stdout}");

    // kill -9 and back: the restored result is served before the slow check could run again.
    agent.kill9().unwrap();
    agent.restart().unwrap();
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    let restored = wait_for("the checks route after the restart", SETTLE, || result(&http, &server_path, "slow")).unwrap();
    assert_eq!(restored["Status"], "success", "not the pending stub: {restored}");
    assert_eq!(restored["Timestamp"], slow["Timestamp"], "the stored result, not a new run: {restored}");

    // The server stops: the check fails; check_restart restarts the task; it passes again.
    let servers = wait_for("the HTTP server process", SETTLE, || Some(pids_of(&alloc_id, "python3")).filter(|p| !p.is_empty())).unwrap();
    for pid in servers {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let failed =
        wait_for("the http check to fail", SETTLE, || result(&http, &client_path, "web-http").filter(|r| r["Status"] == "failure"))
            .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert!(failed["Output"].as_str().unwrap().starts_with("nomad: GET "), "{failed}");
    assert!(failed.get("StatusCode").is_none(), "no response, no code: {failed}");
    let state = wait_for("check_restart to restart the task", SETTLE, || {
        let alloc = http.get_json(&format!("/v1/allocation/{alloc_id}")).ok()?;
        let state = alloc["TaskStates"]["web"].clone();
        (state["Restarts"].as_u64()? >= 1).then_some(state)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let signaled = state["Events"].as_array().unwrap().iter().find(|e| e["Type"] == "Restart Signaled").cloned();
    let signaled = signaled.unwrap_or_else(|| panic!("no Restart Signaled event: {state}"));
    assert_eq!(signaled["RestartReason"], "healthcheck: check \"web-http\" unhealthy", "{signaled}");
    wait_for("the http check to pass again", SETTLE, || result(&http, &server_path, "web-http").filter(|r| r["Status"] == "success"))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));

    // Stopped: the results go with the alloc's prekill.
    http.delete_json("/v1/job/checks-e2e").unwrap();
    wait_for("the results to be purged", SETTLE, || (http.get_json(&client_path).ok()? == Value::Null).then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
}
