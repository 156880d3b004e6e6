//! Bad jobs fail their task with an event that says why; the client keeps serving.

use nomad_proto::ClientStatus;
use nomad_proto::job::JobType;
use serde_json::json;

use crate::support::{TestServer, event_types, job, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_driver_config_or_missing_command_fails_the_task_and_other_allocs_still_run() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let mut wrong_shape = sh_task("t", "true");
    wrong_shape.config.insert("command".into(), json!(["not", "a", "string"]));
    let bad_config = server.place(&job("bad-config", JobType::Service, vec![wrong_shape], restart_policy(3, 10)), client.node_id()).await;

    let mut missing = sh_task("t", "true");
    missing.config.insert("command".into(), json!("/no/such/command"));
    missing.config.remove("args");
    let missing_cmd = server.place(&job("missing-command", JobType::Service, vec![missing], restart_policy(3, 10)), client.node_id()).await;

    let good = server.place(&job("good", JobType::Service, vec![sh_task("t", "sleep 30")], restart_policy(0, 0)), client.node_id()).await;

    let state = wait_for("the bad config fails", || server.task_state(&bad_config, "t").filter(|s| s.state == "dead")).await;
    assert!(state.failed);
    let validation = state.events.iter().find(|e| e.event_type == "Failed Validation").expect("a validation event");
    assert!(
        validation.display_message.contains("invalid raw_exec config") && validation.display_message.contains("command"),
        "{}",
        validation.display_message
    );
    assert_eq!(state.restarts, 0, "an invalid config is never retried");

    let state = wait_for("the missing command fails", || server.task_state(&missing_cmd, "t").filter(|s| s.state == "dead")).await;
    assert!(state.failed);
    let failure = state.events.iter().find(|e| e.event_type == "Driver Failure").expect("a driver failure");
    assert!(failure.driver_error.contains("/no/such/command") && failure.driver_error.contains("not found"), "{}", failure.driver_error);
    assert_eq!(state.events.last().unwrap().event_type, "Not Restarting", "{:?}", event_types(&state));

    wait_for("the good alloc runs", || task_pid(&client, &good, "t")).await;
    wait_for("the good alloc is running on the server", || server.alloc(&good).filter(|a| a.client_status == ClientStatus::Running)).await;
    assert_eq!(server.alloc(&bad_config).unwrap().client_status, ClientStatus::Failed);
    client.shutdown_destroying_allocs().await;
}
