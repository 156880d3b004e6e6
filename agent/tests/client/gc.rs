//! The client's own alloc GC: `gc_max_allocs` makes room for new allocs, a disk over
//! `gc_disk_usage_threshold` collects terminal allocs as they finish, running ones stay.

use std::path::Path;
use std::time::Duration;

use nomad_agent::client::Client;
use nomad_agent::client::gc::GcConfig;
use nomad_proto::ClientStatus;
use nomad_proto::job::JobType;

use crate::support::{TestServer, client_config, drivers, job, restart_policy, sh_task, task_pid, wait_for, wait_ready, wait_until};

async fn start_with(root: &Path, server: &TestServer, gc: GcConfig) -> Client {
    let mut config = client_config(root, vec![server.addr()]);
    config.settings.gc = gc;
    Client::start(config, drivers()).await.expect("client starts")
}

/// An hour: only what the tests do wakes the GC.
const NEVER: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_allocs_over_gc_max_allocs_make_room_by_collecting_the_oldest_terminal_alloc() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let gc = GcConfig { interval: NEVER, max_allocs: 2, ..GcConfig::dev() };
    let client = start_with(root.path(), &server, gc).await;
    wait_ready(&server, &client).await;
    let dir = |id: &str| root.path().join("alloc").join(id);

    let mut finished = Vec::new();
    for name in ["first", "second"] {
        let id = server.place(&job(name, JobType::Batch, vec![sh_task("t", "echo done")], restart_policy(0, 0)), client.node_id()).await;
        wait_until("the batch alloc finished", || client.alloc_runner(&id).is_some_and(|r| r.tasks_finished())).await;
        finished.push(id);
    }
    // Two allocs kept is the limit, not over it: nothing was collected.
    assert!(dir(&finished[0]).exists() && dir(&finished[1]).exists());

    let live = server.place(&job("live", JobType::Service, vec![sh_task("t", "sleep 300")], restart_policy(0, 0)), client.node_id()).await;
    wait_for("the new alloc runs", || task_pid(&client, &live, "t")).await;
    assert!(!dir(&finished[0]).exists(), "the oldest terminal alloc made room");
    assert!(client.alloc_runner(&finished[0]).is_some_and(|r| r.is_destroyed()), "its runner stays known until the servers drop it");
    assert!(dir(&finished[1]).exists(), "one was enough");
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_over_the_usage_threshold_collects_allocs_as_they_finish_and_leaves_running_ones() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    // Any disk in use is over 0%.
    let gc = GcConfig { interval: NEVER, disk_usage_threshold: 0.0, ..GcConfig::dev() };
    let client = start_with(root.path(), &server, gc).await;
    wait_ready(&server, &client).await;

    let live = server.place(&job("live", JobType::Service, vec![sh_task("t", "sleep 300")], restart_policy(0, 0)), client.node_id()).await;
    wait_for("the service runs", || task_pid(&client, &live, "t")).await;
    let done = server.place(&job("done", JobType::Batch, vec![sh_task("t", "echo done")], restart_policy(0, 0)), client.node_id()).await;
    // The finish itself wakes the GC (its interval is an hour).
    wait_until("the finished alloc is collected", || client.alloc_runner(&done).is_some_and(|r| r.is_destroyed())).await;
    assert!(!root.path().join("alloc").join(&done).exists());
    assert!(
        root.path().join("alloc").join(&live).exists() && task_pid(&client, &live, "t").is_some(),
        "a running alloc is never collected"
    );
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collected_alloc_the_servers_still_list_keeps_its_record_after_an_agent_restart() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_with(root.path(), &server, GcConfig { interval: NEVER, ..GcConfig::dev() }).await;
    wait_ready(&server, &client).await;
    let marker = root.path().join("runs");
    let script = format!("echo ran >> {}; exit 3", marker.display());
    let id = server.place(&job("failing", JobType::Batch, vec![sh_task("t", &script)], restart_policy(0, 0)), client.node_id()).await;
    wait_until("the servers see it failed", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Failed)).await;
    nomad_agent::client::gc::collect(&client, &id).await.expect("a terminal alloc is collected");
    client.shutdown().await;
    drop(client);

    // The next agent finds the alloc only on the servers' list: it must neither run it again
    // nor report it as a fresh, successful one.
    let client = start_with(root.path(), &server, GcConfig { interval: NEVER, ..GcConfig::dev() }).await;
    wait_until("the alloc is known again", || client.alloc_runner(&id).is_some_and(|r| r.tasks_finished())).await;
    let reported = client.alloc_runner(&id).unwrap().client_alloc();
    assert_eq!(reported.client_status, ClientStatus::Failed, "{reported:?}");
    let task = &reported.task_states.as_ref().expect("task states")["t"];
    assert!(task.failed && task.events.iter().any(|e| e.exit_code == 3), "the first run's record: {task:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap().lines().count(), 1, "the task ran once");
    client.shutdown_destroying_allocs().await;
}
