//! Running allocs: exit codes, restart policies, stops, kill timeouts, lifecycle order.

use std::time::{Duration, Instant};

use nomad_proto::job::JobType;
use nomad_proto::{ClientStatus, TaskLifecycle};

use crate::support::{
    TestServer, event_types, job, pid_alive, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready, wait_until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_exit_code_lands_in_the_allocs_task_states_on_the_server() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let j = job("exit3", JobType::Batch, vec![sh_task("t", "echo $NOMAD_ALLOC_ID; exit 3")], restart_policy(0, 0));
    let id = server.place(&j, client.node_id()).await;
    let state = wait_for("the task is dead on the server", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    let terminated = state.events.iter().find(|e| e.event_type == "Terminated").expect("a Terminated event");
    assert_eq!(terminated.exit_code, 3);
    assert!(state.failed);
    assert!(!state.started_at.is_zero() && !state.finished_at.is_zero());
    assert_eq!(event_types(&state)[..3], ["Received", "Task Setup", "Started"]);
    wait_until("the alloc is failed on the server", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Failed)).await;
    // The task saw its environment.
    assert!(crate::support::log_file(root.path(), &id, "t", "stdout").contains(&id));
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_policy_counts_restarts_then_fails_the_task() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let j = job("flaky", JobType::Service, vec![sh_task("t", "exit 1")], restart_policy(2, 10));
    let id = server.place(&j, client.node_id()).await;
    let state = wait_for("the task failed for good", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    assert_eq!(state.restarts, 2, "two restarts within the policy: {:?}", event_types(&state));
    assert!(state.failed);
    assert!(!state.last_restart.is_zero());
    let last = state.events.last().unwrap();
    assert_eq!(last.event_type, "Not Restarting");
    assert!(last.display_message.contains("Exceeded allowed attempts 2"), "{}", last.display_message);
    assert_eq!(event_types(&state).iter().filter(|t| *t == "Terminated").count(), 3);
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_from_the_servers_kills_with_kill_signal_then_sigkill_after_kill_timeout() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    // Ignores SIGTERM; only SIGKILL ends it.
    let mut task = sh_task("stubborn", "trap '' TERM; echo ready; while true; do sleep 0.1; done");
    task.kill_signal = "SIGTERM".into();
    task.kill_timeout = 1_000_000_000;
    let j = job("stubborn", JobType::Service, vec![task], restart_policy(0, 0));
    let id = server.place(&j, client.node_id()).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "stubborn")).await;
    wait_until("the trap is set", || crate::support::log_file(root.path(), &id, "stubborn", "stdout").contains("ready")).await;

    let stopped_at = Instant::now();
    server.stop_alloc(&id).await;
    wait_until("the task is gone", || !pid_alive(pid)).await;
    assert!(stopped_at.elapsed() >= Duration::from_secs(1), "SIGTERM alone did not end it; SIGKILL came after kill_timeout");
    let state = wait_for("the task is dead on the server", || server.task_state(&id, "stubborn").filter(|s| s.state == "dead")).await;
    let types = event_types(&state);
    let killing = types.iter().position(|t| t == "Killing").expect("Killing");
    let killed = types.iter().position(|t| t == "Killed").expect("Killed");
    assert!(killing < killed, "{types:?}");
    let terminated = state.events.iter().find(|e| e.event_type == "Terminated").unwrap();
    assert_eq!(terminated.signal, 9, "killed by SIGKILL");
    assert!(!state.failed, "a stopped task is not a failure");
    wait_until("the alloc is complete", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Complete)).await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_shutting_down_while_a_task_is_being_killed_stops_waiting_and_the_next_agent_finishes_the_kill() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    // Outlives the first SIGTERM (not the second), and its kill_timeout is long: the kill is
    // still waiting at shutdown.
    let mut task = sh_task("stubborn", "trap 'echo got-term; trap - TERM' TERM; echo ready; while true; do sleep 0.1; done");
    task.kill_signal = "SIGTERM".into();
    task.kill_timeout = 3_600_000_000_000;
    let j = job("slowkill", JobType::Service, vec![task], restart_policy(0, 0));
    let id = server.place(&j, client.node_id()).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "stubborn")).await;
    wait_until("the trap is set", || crate::support::log_file(root.path(), &id, "stubborn", "stdout").contains("ready")).await;
    server.stop_alloc(&id).await;
    wait_until("the first SIGTERM came", || crate::support::log_file(root.path(), &id, "stubborn", "stdout").contains("got-term")).await;

    tokio::time::timeout(Duration::from_secs(20), client.shutdown()).await.expect("the shutdown does not wait for the kill");
    drop(client);
    assert!(pid_alive(pid), "a shutting-down agent leaves its tasks running");

    // The next agent on the same state dir reattaches and kills what the servers want stopped.
    let client = start_client(root.path(), &server).await;
    wait_until("the task is gone", || !pid_alive(pid)).await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_tasks_run_in_order_and_sidecars_stop_with_the_main_task() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    // Each task appends its name to a shared file; main checks that prestart finished first.
    let log = "$NOMAD_ALLOC_DIR/order";
    let mut init = sh_task("init", &format!("sleep 0.2; echo init >> {log}"));
    init.lifecycle = Some(TaskLifecycle { hook: "prestart".into(), sidecar: false });
    let mut side = sh_task("side", &format!("echo side >> {log}; while true; do sleep 0.1; done"));
    side.lifecycle = Some(TaskLifecycle { hook: "prestart".into(), sidecar: true });
    let main = sh_task("main", &format!("grep -q init {log} || exit 9; echo main >> {log}; sleep 0.5"));
    let mut post = sh_task("post", &format!("echo post >> {log}"));
    post.lifecycle = Some(TaskLifecycle { hook: "poststart".into(), sidecar: false });
    let mut cleanup = sh_task("cleanup", &format!("echo cleanup >> {log}"));
    cleanup.lifecycle = Some(TaskLifecycle { hook: "poststop".into(), sidecar: false });
    let j = job("lifecycle", JobType::Batch, vec![init, side, main, post, cleanup], restart_policy(0, 0));
    let id = server.place(&j, client.node_id()).await;

    wait_until("every task is dead", || {
        server.alloc(&id).and_then(|a| a.task_states).is_some_and(|s| s.len() == 5 && s.values().all(|t| t.state == "dead"))
    })
    .await;
    let alloc = server.alloc(&id).unwrap();
    let states = alloc.task_states.unwrap();
    assert!(!states["main"].failed, "main ran after init: {:?}", event_types(&states["main"]));
    assert!(
        event_types(&states["side"]).contains(&"Main Tasks Dead".to_string()),
        "the sidecar was stopped: {:?}",
        event_types(&states["side"])
    );
    let order = std::fs::read_to_string(root.path().join("alloc").join(&id).join("alloc/order")).unwrap();
    let lines: Vec<&str> = order.lines().collect();
    let pos = |n: &str| lines.iter().position(|l| *l == n).unwrap_or_else(|| panic!("{n} never ran: {lines:?}"));
    assert!(pos("init") < pos("main"));
    assert!(pos("post") < pos("cleanup") && pos("main") < pos("cleanup"));
    // poststart starts once main runs (their output may interleave).
    assert!(states["post"].started_at >= states["main"].started_at);
    assert!(states["main"].started_at >= states["init"].finished_at);
    assert_eq!(lines.last(), Some(&"cleanup"), "poststop runs last: {lines:?}");
    assert_eq!(alloc.client_status, ClientStatus::Complete);
    client.shutdown_destroying_allocs().await;
}
