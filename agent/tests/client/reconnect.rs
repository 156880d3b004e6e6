//! The client side of the reconnect protocol: an `unknown` alloc the servers still want is kept
//! and reported; a desired-stop `unknown` one is stopped and never resumed.

use nomad_proto::alloc::ALLOC_UNKNOWN_DESC;
use nomad_proto::job::JobType;
use nomad_proto::{ClientStatus, DesiredStatus, NodeStatus, Timestamp};
use nomad_server::fsm::Command;

use crate::support::{
    TestServer, event_types, job, pid_alive, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready, wait_until,
};

/// What the scheduler writes for a running alloc on a disconnected node.
fn mark_unknown(a: &mut nomad_proto::Allocation) {
    a.client_status = ClientStatus::Unknown;
    a.client_description = ALLOC_UNKNOWN_DESC.into();
    a.append_state(ClientStatus::Unknown, Timestamp::now());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_alloc_the_servers_still_want_is_reconnected_and_its_state_synced() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let node_id = client.node_id().to_string();

    let mut j = job("keep", JobType::Service, vec![sh_task("t", "sleep 60")], restart_policy(0, 0));
    j.task_groups[0].max_client_disconnect = Some(60_000_000_000);
    let id = server.place(&j, &node_id).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "t")).await;
    wait_until("running on the server", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Running)).await;

    // The servers lost the node for a while: it is disconnected and its alloc unknown.
    let updated_at = Timestamp::now().unix_secs();
    server
        .apply(Command::NodeUpdateStatus {
            node_id: node_id.clone(),
            status: NodeStatus::Disconnected,
            event: None,
            updated_at,
            evals: vec![],
        })
        .await;
    server.rewrite_alloc(&id, mark_unknown).await;

    let alloc =
        wait_for("the alloc is running again on the server", || server.alloc(&id).filter(|a| a.client_status == ClientStatus::Running))
            .await;
    let types = event_types(&alloc.task_states.as_ref().unwrap()["t"]);
    assert!(types.contains(&"Reconnected".to_string()), "{types:?}");
    assert_eq!(task_pid(&client, &id, "t"), Some(pid), "the task kept running");
    assert!(pid_alive(pid));
    // The node went disconnected → initializing → ready once the alloc update landed.
    wait_until("the node is ready again", || server.store().snapshot().node(&node_id).is_some_and(|n| n.status == NodeStatus::Ready)).await;
    // The reconnect eval records a `running` AllocState (a newer AllocModifyIndex); the client
    // pulls that version too and adopts the server's indexes.
    let runner = client.alloc_runner(&id).unwrap();
    wait_until("the server's indexes were adopted", || runner.alloc().alloc_modify_index == server.alloc(&id).unwrap().alloc_modify_index)
        .await;
    assert_eq!(task_pid(&client, &id, "t"), Some(pid), "the task still runs");
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desired_stop_unknown_alloc_is_stopped_and_never_resumed() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let id = server.place(&job("drop", JobType::Service, vec![sh_task("t", "sleep 60")], restart_policy(3, 10)), client.node_id()).await;
    let pid = wait_for("the task runs", || task_pid(&client, &id, "t")).await;
    server
        .rewrite_alloc(&id, |a| {
            mark_unknown(a);
            a.desired_status = DesiredStatus::Stop;
        })
        .await;

    wait_until("the task is stopped", || !pid_alive(pid)).await;
    let runner = client.alloc_runner(&id).unwrap();
    wait_until("the task is dead", || runner.task("t").unwrap().state().state == "dead").await;
    let state = runner.task("t").unwrap().state();
    let types = event_types(&state);
    assert!(!types.contains(&"Reconnected".to_string()), "{types:?}");
    assert_eq!(types.iter().filter(|t| *t == "Started").count(), 1, "{types:?}");
    assert_eq!(state.restarts, 0);
    client.shutdown().await;
    drop((runner, client));

    // Nor does a restarted client bring it back.
    let client = start_client(root.path(), &server).await;
    wait_until("the client pulled its allocs", || client.servers_contacted()).await;
    let runner = client.alloc_runner(&id).expect("still known until garbage collected");
    wait_until("its runner settled", || runner.tasks_finished()).await;
    assert!(runner.task("t").unwrap().handle().is_none());
    assert_eq!(event_types(&runner.task("t").unwrap().state()).iter().filter(|t| *t == "Started").count(), 1);
    client.shutdown().await;
}
