//! raw_exec driver: exit status, logs and rotation, stop escalation, errors.

use std::time::{Duration, Instant};

use crate::support::{log, options, task, wait_for_output};
use nix::sys::signal::Signal;
use nomad_agent::client::driver::{DriverError, DriverRegistry, LogConfig};
use serde_json::json;

fn raw_exec() -> std::sync::Arc<dyn nomad_agent::client::driver::Driver> {
    DriverRegistry::new(&options(true)).get("raw_exec").unwrap()
}

#[tokio::test]
async fn exit_code_and_output_land_in_the_result_and_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "web", json!({"command": "sh", "args": ["-c", "echo to-stdout; echo to-stderr >&2; exit 3"]}));
    let driver = raw_exec();
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    assert_eq!((exit.exit_code, exit.signal, exit.err.clone()), (3, 0, None));
    assert!(!exit.finished_at.is_zero());
    assert_eq!(log(&task, "stdout", 0), "to-stdout\n");
    assert_eq!(log(&task, "stderr", 0), "to-stderr\n");
    assert_ne!(handle.executor.pid, handle.task.pid, "the task runs under its own supervisor");
}

#[tokio::test]
async fn rotation_keeps_only_max_files_of_max_file_size() {
    let dir = tempfile::tempdir().unwrap();
    // 1000 lines of 10 bytes: 10 full files of 1000 bytes, of which the newest 3 remain.
    let script = "i=0; while [ $i -lt 1000 ]; do printf 'line-%04d\\n' $i; i=$((i+1)); done";
    let mut task = task(dir.path(), "chatty", json!({"command": "sh", "args": ["-c", script]}));
    task.logs = LogConfig { max_files: 3, max_file_size: 1000 };
    let driver = raw_exec();
    let handle = driver.start(&task).await.unwrap();
    assert!(driver.wait(&handle).await.unwrap().successful());

    let mut names: Vec<String> = std::fs::read_dir(task.log_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("chatty.stdout."))
        .collect();
    names.sort();
    assert_eq!(names, vec!["chatty.stdout.7", "chatty.stdout.8", "chatty.stdout.9"]);
    let kept: String = (7..=9).map(|i| log(&task, "stdout", i)).collect();
    let expected: String = (700..1000).map(|i| format!("line-{i:04}\n")).collect();
    assert_eq!(kept, expected);
}

#[tokio::test]
async fn stop_delivers_the_kill_signal_first() {
    let dir = tempfile::tempdir().unwrap();
    let script = "trap 'echo got-term; exit 4' TERM; echo ready; while :; do sleep 0.05; done";
    let task = task(dir.path(), "graceful", json!({"command": "sh", "args": ["-c", script]}));
    let driver = raw_exec();
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    driver.stop(&handle, Signal::SIGTERM, Duration::from_secs(15)).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    assert_eq!((exit.exit_code, exit.signal), (4, 0), "the task handled SIGTERM itself");
    assert!(log(&task, "stdout", 0).contains("got-term"));
}

#[tokio::test]
async fn a_task_ignoring_sigterm_is_killed_after_kill_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let script = "trap '' TERM; echo ready; while :; do sleep 0.05; done";
    let task = task(dir.path(), "stubborn", json!({"command": "sh", "args": ["-c", script]}));
    let driver = raw_exec();
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    let kill_timeout = Duration::from_millis(500);
    let started = Instant::now();
    driver.stop(&handle, Signal::SIGTERM, kill_timeout).await.unwrap();
    assert!(started.elapsed() >= kill_timeout, "SIGTERM alone must not have stopped it");
    let exit = driver.wait(&handle).await.unwrap();
    assert_eq!(exit.signal, Signal::SIGKILL as i32);
    assert!(!handle.task.is_alive());
}

#[tokio::test]
async fn signal_reaches_the_running_task() {
    let dir = tempfile::tempdir().unwrap();
    let script = "trap 'echo got-usr1' USR1; echo ready; while [ ! -e done ]; do sleep 0.05; done";
    let task = task(dir.path(), "sig", json!({"command": "sh", "args": ["-c", script]}));
    let driver = raw_exec();
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    driver.signal(&handle, Signal::SIGUSR1).await.unwrap();
    wait_for_output(&task, "got-usr1").await;
    std::fs::write(task.task_dir().join("done"), "").unwrap();
    assert!(driver.wait(&handle).await.unwrap().successful());
    let status = driver.inspect(&handle).await.unwrap();
    assert!(!status.running && status.exit.is_some());
}

#[tokio::test]
async fn a_missing_command_fails_saying_it_was_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "typo", json!({"command": "no-such-command-xyz"}));
    let err = raw_exec().start(&task).await.unwrap_err();
    assert!(matches!(err, DriverError::CommandNotFound { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("no-such-command-xyz") && message.contains("not found"), "{message}");
}

#[tokio::test]
async fn a_driver_config_of_the_wrong_shape_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let driver = raw_exec();
    let wrong_type = task(dir.path(), "a", json!({"command": "true", "args": "not-a-list"}));
    let message = driver.validate_config(&wrong_type).unwrap_err().to_string();
    assert!(message.contains("args"), "{message}");
    let unknown = task(dir.path(), "b", json!({"command": "true", "comand": "x"}));
    let message = driver.validate_config(&unknown).unwrap_err().to_string();
    assert!(message.contains("comand"), "{message}");
    let missing = task(dir.path(), "c", json!({"args": []}));
    let message = driver.validate_config(&missing).unwrap_err().to_string();
    assert!(message.contains("command"), "{message}");
}

#[tokio::test]
async fn raw_exec_is_off_unless_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let driver = DriverRegistry::new(&options(false)).get("raw_exec").unwrap();
    let info = driver.fingerprint().await;
    assert!(!info.detected && !info.healthy);
    let err = driver.start(&task(dir.path(), "t", json!({"command": "true"}))).await.unwrap_err();
    assert!(matches!(err, DriverError::Disabled("raw_exec")), "{err:?}");

    let enabled = raw_exec().fingerprint().await;
    assert!(enabled.detected && enabled.healthy);
    assert_eq!(enabled.attributes.get("driver.raw_exec").map(String::as_str), Some("1"));
}

#[tokio::test]
async fn exec_task_runs_in_the_task_dir_with_the_tasks_env_and_refuses_a_stopped_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut task = task(dir.path(), "web", json!({"command": "sh", "args": ["-c", "echo ready; sleep 600"]}));
    task.env.insert("ONLY_IN_TASK".into(), "yes".into());
    let driver = raw_exec();
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    let args = vec!["-c".to_string(), "echo cwd=$(pwd) env=$ONLY_IN_TASK; echo err >&2; exit 1".to_string()];
    let out = driver.exec_task(&handle, "sh", &args, Duration::from_secs(10)).await.unwrap();
    assert_eq!(out.exit_code, 1);
    let text = String::from_utf8_lossy(&out.output).into_owned();
    assert!(text.contains(&format!("cwd={} env=yes\n", task.task_dir().display())), "{text}");
    assert!(text.contains("err\n"), "stderr is kept with stdout: {text}");
    let err = driver.exec_task(&handle, "sleep", &["30".to_string()], Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(err, DriverError::ExecTimedOut(_)), "{err}");

    driver.stop(&handle, Signal::SIGKILL, Duration::from_secs(5)).await.unwrap();
    driver.wait(&handle).await.unwrap();
    let err = driver.exec_task(&handle, "true", &[], Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("task \"web\" is not running"), "{err}");
    driver.destroy(&handle).await.unwrap();
}
