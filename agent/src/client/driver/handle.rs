//! The persisted handle of a running task, and what every driver does with one.

use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nomad_proto::Timestamp;
use serde::{Deserialize, Serialize};

use super::{DriverError, ExitResult, ProcessRef, TaskCgroup};
use crate::executor::EXIT_FILE;
use crate::executor::process::reap_if_child;

/// How long destroy waits for a killed task's executor to finish.
pub(super) const DESTROY_WAIT: Duration = Duration::from_secs(10);

/// Everything needed to find a task again after an agent restart. The agent persists it as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskHandle {
    /// Driver that started the task.
    pub driver: String,
    /// Allocation ID.
    pub alloc_id: String,
    /// Task name.
    pub task_name: String,
    /// The task's supervisor.
    pub executor: ProcessRef,
    /// The task's main process (for oci, the container's init).
    pub task: ProcessRef,
    /// Where the executor keeps its launch spec and writes the exit record.
    pub state_dir: PathBuf,
    /// When the task started.
    pub started_at: Timestamp,
    /// What the driver needs to stop and clean up.
    pub driver_state: DriverState,
}

/// Driver-specific parts of a handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DriverState {
    /// raw_exec keeps nothing else.
    RawExec,
    /// exec: the task's cgroups.
    Exec {
        /// cgroups to remove on destroy.
        cgroup: TaskCgroup,
    },
    /// oci: the container as the runtime knows it.
    Oci {
        /// Runtime binary.
        runtime: PathBuf,
        /// Runtime state directory (`--root`).
        runtime_root: PathBuf,
        /// Container ID.
        container_id: String,
        /// Bundle directory, removed on destroy.
        bundle: PathBuf,
    },
    /// docker: the container the Engine supervises (no executor).
    Docker {
        /// Container ID.
        container_id: String,
        /// The image's ID, reference-counted for image GC.
        image_id: String,
        /// The alloc dir, where the agent writes the container's logs.
        alloc_dir: PathBuf,
        /// Log files kept per stream.
        log_max_files: u32,
        /// Log file size limit in bytes.
        log_max_file_size: u64,
    },
}

/// What [`super::Driver::recover`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// The same task is still running under its executor.
    Running(TaskHandle),
    /// The task ended while the agent was away.
    Exited(ExitResult),
}

/// A task's current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    /// The executor is still supervising the task.
    pub running: bool,
    /// Task PID.
    pub pid: i32,
    /// When it started.
    pub started_at: Timestamp,
    /// How it ended, once it has.
    pub exit: Option<ExitResult>,
}

impl TaskHandle {
    /// The exit record's path.
    pub fn exit_file(&self) -> PathBuf {
        self.state_dir.join(EXIT_FILE)
    }

    /// The exit record, once the executor has written it.
    pub fn read_exit(&self) -> Option<ExitResult> {
        ExitResult::read(&self.exit_file())
    }

    pub(super) fn check_driver(&self, expected: &'static str) -> Result<(), DriverError> {
        if self.driver == expected { Ok(()) } else { Err(DriverError::WrongDriver { expected, found: self.driver.clone() }) }
    }

    /// Waits for the executor to finish (it exits only after recording the task's exit), up to
    /// `timeout`; `None` when it is still running then. If the executor was killed without a
    /// record, waits for the task itself, which may still be running unsupervised.
    pub async fn wait_exit(&self, timeout: Option<Duration>) -> Option<ExitResult> {
        if let Some(exit) = self.read_exit() {
            return Some(exit);
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let remaining = || deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        if !self.executor.wait_exit(remaining()).await {
            return None;
        }
        reap_if_child(self.executor.pid);
        if let Some(exit) = self.read_exit() {
            return Some(exit);
        }
        if !self.task.wait_exit(remaining()).await {
            return None;
        }
        Some(self.lost_exit())
    }

    fn lost_exit(&self) -> ExitResult {
        let task_state = if self.task.is_alive() { "still running unsupervised" } else { "gone" };
        ExitResult::failed(format!(
            "executor (pid {}) exited without recording the task's exit; task pid {} is {task_state}",
            self.executor.pid, self.task.pid
        ))
    }

    /// Reattach or report the exit that happened while nobody was watching.
    pub fn recover(&self) -> Recovered {
        if let Some(exit) = self.read_exit() {
            return Recovered::Exited(exit);
        }
        if self.executor.is_alive() {
            return Recovered::Running(self.clone());
        }
        // The executor may have written its record between the two checks.
        Recovered::Exited(self.read_exit().unwrap_or_else(|| self.lost_exit()))
    }

    /// The current state from the handle alone.
    pub fn status(&self) -> TaskStatus {
        let exit = self.read_exit();
        TaskStatus { running: exit.is_none() && self.executor.is_alive(), pid: self.task.pid, started_at: self.started_at, exit }
    }

    /// Signals the task's process group; a task that already exited is not an error.
    pub(super) fn signal_group(&self, signal: Signal) -> Result<(), DriverError> {
        match self.task.signal_group(signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(DriverError::Signal(e)),
        }
    }

    /// [`Self::signal_group`] in the shape [`stop_with_escalation`] takes.
    pub(super) fn signal_group_boxed(&self, signal: Signal) -> BoxFuture<'static, Result<(), DriverError>> {
        Box::pin(std::future::ready(self.signal_group(signal)))
    }
}

/// Stop with `signal`, then `kill` after `timeout`: shared by every driver, which supply how a
/// signal reaches their task.
pub(super) async fn stop_with_escalation<'a>(
    handle: &TaskHandle,
    signal: Signal,
    timeout: Duration,
    send: impl Fn(Signal) -> BoxFuture<'a, Result<(), DriverError>>,
) -> Result<(), DriverError> {
    if handle.read_exit().is_some() || !(handle.executor.is_alive() || handle.task.is_alive()) {
        return Ok(());
    }
    send(signal).await?;
    if handle.wait_exit(Some(timeout)).await.is_some() {
        return Ok(());
    }
    send(Signal::SIGKILL).await?;
    match handle.wait_exit(Some(DESTROY_WAIT)).await {
        Some(_) => Ok(()),
        None => Err(DriverError::Executor(format!("task pid {} did not exit {}s after SIGKILL", handle.task.pid, DESTROY_WAIT.as_secs()))),
    }
}
