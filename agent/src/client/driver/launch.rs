//! Starting a task's executor and reading its start report.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nomad_proto::Timestamp;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{DriverError, DriverState, ProcessRef, TaskConfig, TaskHandle};
use crate::executor::{EXIT_FILE, LaunchMode, LaunchSpec, StartReport};

/// Name of the launch spec in the task's state directory.
pub(super) const SPEC_FILE: &str = "launch.json";
/// The executor's own diagnostics (the task's output goes to the task's logs).
const EXECUTOR_LOG: &str = "executor.log";
/// An executor that has not reported within this time is considered hung. Generous because
/// runc create plus a cold page cache can take seconds on a loaded host.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds the common parts of a launch spec for `task`.
pub(super) fn launch_spec(task: &TaskConfig, mode: LaunchMode, oom_counter_files: Vec<std::path::PathBuf>) -> LaunchSpec {
    LaunchSpec {
        task_name: task.task_name.clone(),
        alloc_dir: task.alloc_dir.clone(),
        log_dir: PathBuf::from(super::LOG_DIR),
        log_max_files: task.logs.max_files,
        log_max_file_size: task.logs.max_file_size,
        exit_file: task.state_dir.join(EXIT_FILE),
        oom_counter_files,
        mode,
    }
}

/// Starts an executor for `spec` and returns the handle once the task runs.
pub(super) async fn launch(
    executor_path: &Path,
    driver: &'static str,
    task: &TaskConfig,
    spec: &LaunchSpec,
    driver_state: DriverState,
) -> Result<TaskHandle, DriverError> {
    let state_dir = &task.state_dir;
    fs::create_dir_all(state_dir).map_err(|e| DriverError::io(format!("create {}", state_dir.display()), e))?;
    // Inside the alloc dir, which the task can write: resolved beneath it, as the alloc_dir hook
    // makes it.
    task.open_alloc_dir()?.create_dir_all(&spec.log_dir, 0o777)?;
    // A restarted task reuses the state dir; an old exit record would look like an instant exit.
    let _ = fs::remove_file(&spec.exit_file);
    let spec_path = state_dir.join(SPEC_FILE);
    let json = serde_json::to_vec_pretty(spec).map_err(|e| DriverError::Executor(format!("encode launch spec: {e}")))?;
    fs::write(&spec_path, json).map_err(|e| DriverError::io(format!("write {}", spec_path.display()), e))?;
    let log_path = state_dir.join(EXECUTOR_LOG);
    let executor_log = fs::File::create(&log_path).map_err(|e| DriverError::io(format!("create {}", log_path.display()), e))?;

    // No pre_exec hooks here, so std can use posix_spawn: cheap however large the agent grows.
    // The executor puts itself in a new session.
    let mut child = tokio::process::Command::new(executor_path)
        .arg(&spec_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(executor_log)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| DriverError::Executor(format!("run {}: {e}", executor_path.display())))?;
    let pid = child.id().ok_or_else(|| DriverError::Executor("executor exited at once".to_string()))? as i32;
    // Still our unreaped child, so its /proc entry exists even if it already exited.
    let executor = ProcessRef::of(pid).map_err(|e| DriverError::io(format!("read executor pid {pid}"), e))?;
    let stdout = child.stdout.take().ok_or_else(|| DriverError::Executor("no stdout pipe".to_string()))?;

    let mut line = String::new();
    let read = tokio::time::timeout(START_TIMEOUT, BufReader::new(stdout).read_line(&mut line)).await;
    // Dropping the child leaves it running; tokio reaps it in the background once it exits.
    drop(child);
    let report = match read {
        Err(_) => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            return Err(DriverError::Executor(format!("no start report within {}s", START_TIMEOUT.as_secs())));
        }
        Ok(Err(e)) => return Err(DriverError::io("read the executor's start report", e)),
        Ok(Ok(_)) => serde_json::from_str::<StartReport>(line.trim()).map_err(|_| {
            let diagnostics = fs::read_to_string(&log_path).unwrap_or_default();
            DriverError::Executor(format!("exited without a start report: {}", diagnostics.trim()))
        })?,
    };
    match report {
        StartReport::Started(task_process) => Ok(TaskHandle {
            driver: driver.to_string(),
            alloc_id: task.alloc_id.clone(),
            task_name: task.task_name.clone(),
            executor,
            task: task_process,
            state_dir: state_dir.clone(),
            started_at: Timestamp::now(),
            driver_state,
        }),
        StartReport::Failed(message) => Err(DriverError::StartFailed(message)),
    }
}
