//! `raw_exec`: runs the command as the agent's user, without isolation, in its own session.

use std::path::PathBuf;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nomad_proto::{DriverInfo, Timestamp};
use serde::Deserialize;

use super::handle::{DESTROY_WAIT, stop_with_escalation};
use super::launch::{launch, launch_spec};
use super::{Driver, DriverError, DriverState, TaskConfig, TaskHandle, env_with_path, resolve_command};
use crate::executor::{LaunchMode, ProcessSpec};

const NAME: &str = "raw_exec";

/// The task's `config` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExecConfig {
    command: String,
    #[serde(default)]
    args: Vec<String>,
}

/// The raw_exec driver.
pub struct RawExecDriver {
    executor_path: PathBuf,
    enabled: bool,
}

impl RawExecDriver {
    /// A driver that launches `executor_path`; refuses tasks unless `enabled`.
    pub fn new(executor_path: PathBuf, enabled: bool) -> RawExecDriver {
        RawExecDriver { executor_path, enabled }
    }

    fn config(task: &TaskConfig) -> Result<RawExecConfig, DriverError> {
        task.parse_driver_config(NAME)
    }
}

impl Driver for RawExecDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> BoxFuture<'_, DriverInfo> {
        Box::pin(async move {
            let mut info = DriverInfo { update_time: Timestamp::now(), ..DriverInfo::default() };
            if self.enabled {
                info.detected = true;
                info.healthy = true;
                info.health_description = "Healthy".to_string();
                info.attributes.insert("driver.raw_exec".to_string(), "1".to_string());
            } else {
                info.health_description = "disabled".to_string();
            }
            info
        })
    }

    fn validate_config(&self, task: &TaskConfig) -> Result<(), DriverError> {
        Self::config(task).map(drop)
    }

    fn start<'a>(&'a self, task: &'a TaskConfig) -> BoxFuture<'a, Result<TaskHandle, DriverError>> {
        Box::pin(async move {
            if !self.enabled {
                return Err(DriverError::Disabled(NAME));
            }
            let config = Self::config(task)?;
            let env = env_with_path(&task.env);
            let task_dir = task.task_dir();
            // Checked here so the error is clear and synchronous rather than an exec errno.
            let path_var = env.get("PATH").map(String::as_str).unwrap_or_default();
            if resolve_command(&config.command, &task_dir, path_var).is_none() {
                return Err(DriverError::CommandNotFound {
                    command: config.command,
                    detail: format!("no executable file by that name in the task dir or in PATH={path_var}"),
                });
            }
            let command =
                if config.command.contains('/') { task_dir.join(&config.command).to_string_lossy().into_owned() } else { config.command };
            let mode = LaunchMode::Process(ProcessSpec {
                command,
                args: config.args,
                env,
                cwd: task_dir,
                isolation: None,
                netns: task.netns.clone(),
            });
            let spec = launch_spec(task, mode, Vec::new());
            launch(&self.executor_path, NAME, task, &spec, DriverState::RawExec).await
        })
    }

    fn exec_command(&self, handle: &TaskHandle, command: &str, args: &[String]) -> Result<tokio::process::Command, DriverError> {
        handle.check_driver(NAME)?;
        super::task_exec::require_running(handle)?;
        let LaunchMode::Process(spec) = super::task_exec::launch_spec_of(handle)?.mode else {
            return Err(DriverError::ExecFailed("the task's launch spec is not a process".into()));
        };
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(args).env_clear().envs(&spec.env).current_dir(&spec.cwd);
        Ok(cmd)
    }

    fn destroy<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            handle.check_driver(NAME)?;
            stop_with_escalation(handle, Signal::SIGKILL, DESTROY_WAIT, |s| handle.signal_group_boxed(s)).await
        })
    }
}
