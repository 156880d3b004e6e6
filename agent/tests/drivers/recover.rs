//! Tasks outlive the agent (decision 7): the executor keeps supervising and logging without it,
//! and a restarted agent reattaches from the serialized handle alone.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::{executor_path, log, options, task, wait_for_output, wait_until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nomad_agent::client::driver::{DriverRegistry, ExitResult, ProcessRef, Recovered, TaskHandle};
use nomad_agent::executor::{LaunchMode, LaunchSpec, ProcessSpec, StartReport};
use serde_json::json;

/// A task that prints `tick-N` until the file `stop` appears in its task dir, then exits 3.
const TICKER: &str = "i=0; while [ ! -e stop ]; do echo tick-$i; i=$((i+1)); sleep 0.02; done; exit 3";

fn highest_tick(text: &str) -> Option<u64> {
    text.lines().filter_map(|l| l.strip_prefix("tick-")?.parse().ok()).max()
}

#[tokio::test]
async fn recover_reattaches_to_the_same_running_task_from_the_serialized_handle() {
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "ticker", json!({"command": "sh", "args": ["-c", TICKER]}));
    let persisted = {
        // The first "agent": starts the task, persists the handle, then loses all its state.
        let registry = DriverRegistry::new(&options(true));
        let handle = registry.get("raw_exec").unwrap().start(&task).await.unwrap();
        wait_for_output(&task, "tick-1").await;
        serde_json::to_string(&handle).unwrap()
    };

    // The restarted "agent" knows only the persisted handle.
    let handle: TaskHandle = serde_json::from_str(&persisted).unwrap();
    let driver = DriverRegistry::new(&options(true)).get("raw_exec").unwrap();
    let Recovered::Running(recovered) = driver.recover(&handle).await.unwrap() else { panic!("task should still run") };
    assert_eq!(recovered.task, handle.task, "same process, not a restart");
    assert!(recovered.task.is_alive() && recovered.executor.is_alive());

    let seen = highest_tick(&log(&task, "stdout", 0)).unwrap();
    wait_until("the task keeps logging", || highest_tick(&log(&task, "stdout", 0)) > Some(seen + 2)).await;

    std::fs::write(task.task_dir().join("stop"), "").unwrap();
    let exit = driver.wait(&recovered).await.unwrap();
    assert_eq!(exit.exit_code, 3);
}

#[tokio::test]
async fn a_task_that_exited_while_the_agent_was_down_reports_its_real_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "short", json!({"command": "sh", "args": ["-c", TICKER]}));
    let persisted = {
        let driver = DriverRegistry::new(&options(true)).get("raw_exec").unwrap();
        let handle = driver.start(&task).await.unwrap();
        serde_json::to_string(&handle).unwrap()
    };
    let handle: TaskHandle = serde_json::from_str(&persisted).unwrap();

    // Nobody is waiting on the task when it ends.
    std::fs::write(task.task_dir().join("stop"), "").unwrap();
    wait_until("the executor has exited", || !handle.executor.is_alive()).await;

    let driver = DriverRegistry::new(&options(true)).get("raw_exec").unwrap();
    match driver.recover(&handle).await.unwrap() {
        Recovered::Exited(exit) => assert_eq!((exit.exit_code, exit.err), (3, None)),
        Recovered::Running(_) => panic!("the task has exited"),
    }
}

#[tokio::test]
async fn a_reused_pid_is_not_mistaken_for_the_executor() {
    // Our own PID with another start time: a stranger that inherited the executor's PID.
    let me = ProcessRef::of(std::process::id() as i32).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = TaskHandle {
        driver: "raw_exec".to_string(),
        alloc_id: "a".to_string(),
        task_name: "t".to_string(),
        executor: ProcessRef { start_time: me.start_time + 1, ..me },
        task: ProcessRef { start_time: me.start_time + 1, ..me },
        state_dir: dir.path().to_path_buf(),
        started_at: nomad_proto::Timestamp::now(),
        driver_state: nomad_agent::client::driver::DriverState::RawExec,
    };
    let driver = DriverRegistry::new(&options(true)).get("raw_exec").unwrap();
    match driver.recover(&handle).await.unwrap() {
        Recovered::Exited(exit) => assert!(exit.err.unwrap().contains("without recording")),
        Recovered::Running(_) => panic!("a reused PID must not count as the executor"),
    }
}

/// The real thing: the executor's parent is SIGKILLed. The executor must keep the task running
/// and logging, and still record its exit.
#[tokio::test]
async fn the_executor_keeps_supervising_after_its_parent_is_sigkilled() {
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "orphan", json!({}));
    std::fs::create_dir_all(&task.state_dir).unwrap();
    let spec = LaunchSpec {
        task_name: task.task_name.clone(),
        alloc_dir: task.alloc_dir.clone(),
        log_dir: nomad_agent::client::driver::LOG_DIR.into(),
        log_max_files: 2,
        log_max_file_size: 1 << 20,
        exit_file: task.state_dir.join("exit.json"),
        oom_counter_files: Vec::new(),
        mode: LaunchMode::Process(ProcessSpec {
            command: "sh".to_string(),
            args: vec!["-c".to_string(), TICKER.to_string()],
            env: task.env.clone(),
            cwd: task.task_dir(),
            isolation: None,
            netns: None,
        }),
    };
    let spec_path = task.state_dir.join("launch.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();

    // A stand-in agent: a shell that starts the executor in the background, then waits.
    let mut agent = Command::new("sh")
        .args(["-c", "\"$0\" \"$1\" & echo $!; wait", executor_path().to_str().unwrap(), spec_path.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(agent.stdout.take().unwrap()).lines();
    let mut executor_pid = None;
    let mut started = None;
    while executor_pid.is_none() || started.is_none() {
        let line = lines.next().expect("agent output").unwrap();
        match serde_json::from_str::<StartReport>(&line) {
            Ok(StartReport::Started(task_process)) => started = Some(task_process),
            Ok(StartReport::Failed(e)) => panic!("start failed: {e}"),
            Err(_) => executor_pid = Some(line.trim().parse::<i32>().unwrap()),
        }
    }
    let executor = ProcessRef::of(executor_pid.unwrap()).unwrap();
    let task_process = started.unwrap();

    kill(Pid::from_raw(agent.id() as i32), Signal::SIGKILL).unwrap();
    agent.wait().unwrap();
    drop(lines); // the report pipe's reader is gone too

    wait_for_output(&task, "tick-1").await;
    let seen = highest_tick(&log(&task, "stdout", 0)).unwrap();
    wait_until("logging continues without the agent", || highest_tick(&log(&task, "stdout", 0)) > Some(seen + 2)).await;
    assert!(executor.is_alive() && task_process.is_alive());

    std::fs::write(task.task_dir().join("stop"), "").unwrap();
    wait_until("the exit is recorded", || ExitResult::read(&spec.exit_file).is_some()).await;
    assert_eq!(ExitResult::read(&spec.exit_file).unwrap().exit_code, 3);
}

#[tokio::test]
async fn a_killed_executor_is_reported_and_its_orphaned_task_is_still_destroyed() {
    let dir = tempfile::tempdir().unwrap();
    // Silent after "ready": a task that writes would die of SIGPIPE with its executor gone.
    let quiet = "echo ready; while [ ! -e stop ]; do sleep 0.02; done";
    let task = task(dir.path(), "orphaned", json!({"command": "sh", "args": ["-c", quiet]}));
    let driver = DriverRegistry::new(&options(true)).get("raw_exec").unwrap();
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;

    kill(Pid::from_raw(handle.executor.pid), Signal::SIGKILL).unwrap();
    wait_until("the executor is gone", || !handle.executor.is_alive()).await;
    match driver.recover(&handle).await.unwrap() {
        Recovered::Exited(exit) => {
            let err = exit.err.unwrap();
            assert!(err.contains("without recording") && err.contains("unsupervised"), "{err}");
        }
        Recovered::Running(_) => panic!("a task without its executor is not running normally"),
    }
    assert!(handle.task.is_alive(), "the task itself survived");
    driver.destroy(&handle).await.unwrap();
    assert!(!handle.task.is_alive(), "destroy reaches a task whose executor died");
}
