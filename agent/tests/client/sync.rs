//! Alloc sync: nothing before the first alloc pull; tasks keep running without servers, and
//! their state reaches the servers when one is back.

use std::sync::Arc;

use nomad_proto::ClientStatus;
use nomad_proto::job::JobType;

use crate::support::{
    Gate, TestServer, client_config, drivers, job, pid_alive, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready,
    wait_until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_sent_to_the_servers_before_the_first_alloc_pull() {
    let gate = Arc::new(Gate::default());
    gate.open.send_replace(true);
    let server = TestServer::start_gated(gate.clone()).await;
    let root = tempfile::tempdir().unwrap();
    let client = nomad_agent::client::Client::start(client_config(root.path(), vec![server.addr()]), drivers()).await.unwrap();
    wait_ready(&server, &client).await;
    let id = server.place(&job("held", JobType::Service, vec![sh_task("t", "sleep 60")], restart_policy(0, 0)), client.node_id()).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "t")).await;
    wait_until("running on the server", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Running)).await;
    client.shutdown().await;
    drop(client);

    // The next client restores the alloc and has news (it reattached), but the servers hold
    // its alloc watch: it must not report.
    gate.open.send_replace(false);
    let before = gate.update_alloc_calls();
    let client = nomad_agent::client::Client::start(client_config(root.path(), vec![server.addr()]), drivers()).await.unwrap();
    assert_eq!(task_pid(&client, &id, "t"), Some(pid));
    client.alloc_runner(&id).unwrap().task("t").unwrap().append_event(nomad_proto::TaskEvent {
        event_type: "Driver".into(),
        message: "news while the watch is held".into(),
        ..Default::default()
    });
    let ticks = client.stats().sync_ticks;
    wait_until("the syncer ticked ten times with news pending", || {
        let s = client.stats();
        s.sync_ticks >= ticks + 10 && s.sync_pending > 0
    })
    .await;
    assert!(client.stats().heartbeats > 0 || client.stats().registrations > 0, "the client does talk to the servers");
    assert_eq!(gate.update_alloc_calls(), before, "no alloc update before the first pull");
    assert!(!client.servers_contacted());

    gate.open.send_replace(true);
    wait_until("the update goes out after the pull", || gate.update_alloc_calls() > before).await;
    wait_until("the news reached the server", || {
        server.task_state(&id, "t").is_some_and(|s| s.events.iter().any(|e| e.message == "news while the watch is held"))
    })
    .await;
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_keep_running_without_servers_and_their_state_syncs_when_one_is_back() {
    let mut server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let long = server.place(&job("long", JobType::Service, vec![sh_task("t", "sleep 60")], restart_policy(0, 0)), client.node_id()).await;
    let short_script = "while [ ! -e done ]; do sleep 0.05; done; exit 0";
    let short = server.place(&job("short", JobType::Batch, vec![sh_task("t", short_script)], restart_policy(0, 0)), client.node_id()).await;
    let long_pid = wait_for("the long task runs", || task_pid(&client, &long, "t")).await;
    wait_for("the short task runs", || task_pid(&client, &short, "t")).await;
    wait_until("both run on the server", || {
        [&long, &short].iter().all(|id| server.alloc(id).is_some_and(|a| a.client_status == ClientStatus::Running))
    })
    .await;

    server.stop().await;
    // Cut off: the short task finishes; the client cannot report it.
    std::fs::write(root.path().join("alloc").join(&short).join("t").join("done"), "").unwrap();
    let runner = client.alloc_runner(&short).unwrap();
    wait_until("the short task finished", || runner.task("t").unwrap().state().state == "dead").await;
    let ticks = client.stats().sync_ticks;
    wait_until("the syncer kept trying", || client.stats().sync_ticks > ticks + 2).await;
    assert!(pid_alive(long_pid), "the client keeps its tasks running while cut off");

    server.restart().await;
    wait_until("the finished alloc reached the server", || server.alloc(&short).is_some_and(|a| a.client_status == ClientStatus::Complete))
        .await;
    assert_eq!(server.alloc(&long).unwrap().client_status, ClientStatus::Running);
    assert_eq!(task_pid(&client, &long, "t"), Some(long_pid), "never restarted");
    wait_ready(&server, &client).await;
    client.shutdown_destroying_allocs().await;
}
