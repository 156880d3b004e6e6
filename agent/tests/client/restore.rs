//! A restarted client picks up where the last one left off, from its local state alone.

use nomad_proto::job::JobType;

use crate::support::{
    TestServer, event_types, job, log_file, pid_alive, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready, wait_until,
};

fn ticks(text: &str) -> usize {
    text.lines().filter(|l| l.starts_with("tick-")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_client_reattaches_to_the_same_process_without_restarting_it() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let node_id = client.node_id().to_string();

    let script = "i=0; while [ $i -lt 600 ]; do echo tick-$i; i=$((i+1)); sleep 0.1; done";
    let id = server.place(&job("ticker", JobType::Service, vec![sh_task("t", script)], restart_policy(3, 10)), &node_id).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "t")).await;
    wait_for("the server sees it running", || server.task_state(&id, "t").filter(|s| s.state == "running")).await;

    client.shutdown().await;
    drop(client);
    assert!(pid_alive(pid), "the task outlives the client");
    let before = ticks(&log_file(root.path(), &id, "t", "stdout"));

    let client = start_client(root.path(), &server).await;
    assert_eq!(client.node_id(), node_id);
    let runner = client.alloc_runner(&id).expect("the alloc is restored before any server is contacted");
    assert_eq!(runner.task("t").unwrap().handle().map(|h| h.task.pid), Some(pid), "same process");
    wait_until("the task keeps logging", || ticks(&log_file(root.path(), &id, "t", "stdout")) > before + 3).await;
    let state = runner.task("t").unwrap().state();
    assert_eq!(state.state, "running");
    assert_eq!(state.restarts, 0);
    assert_eq!(event_types(&state).iter().filter(|t| *t == "Started").count(), 1, "not started again");
    assert_eq!(task_pid(&client, &id, "t"), Some(pid));

    // And it is still the client's task: a stop from the servers ends it.
    server.stop_alloc(&id).await;
    wait_until("the reattached task is stopped", || !pid_alive(pid)).await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_exited_while_the_client_was_down_reports_its_real_exit_code() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    // Exits 7 once the file `stop` appears in its task dir; one restart allowed.
    let script = "while [ ! -e stop ]; do sleep 0.05; done; exit 7";
    let id = server.place(&job("exits", JobType::Batch, vec![sh_task("t", script)], restart_policy(1, 10)), client.node_id()).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "t")).await;
    client.shutdown().await;
    drop(client);

    std::fs::write(root.path().join("alloc").join(&id).join("t").join("stop"), "").unwrap();
    wait_until("the task exits while no client watches", || !pid_alive(pid)).await;

    let client = start_client(root.path(), &server).await;
    let state = wait_for("the exit reaches the server", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    let exits: Vec<i64> = state.events.iter().filter(|e| e.event_type == "Terminated").map(|e| e.exit_code).collect();
    assert_eq!(exits, [7, 7], "the real exit code, then the restart's: {:?}", event_types(&state));
    assert_eq!(state.restarts, 1, "the exit went through the restart policy");
    assert!(state.failed);
    client.shutdown().await;
    drop(client);

    // A finished alloc is not run again by the next client.
    let events = state.events.len();
    let client = start_client(root.path(), &server).await;
    let runner = client.alloc_runner(&id).expect("restored");
    wait_until("the client synced with the servers", || client.servers_contacted()).await;
    assert!(runner.task("t").unwrap().handle().is_none());
    assert_eq!(runner.task("t").unwrap().state().events.len(), events, "nothing ran again");
    client.shutdown().await;
}
