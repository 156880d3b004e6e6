//! Task drivers behind one trait (decision 8): `raw_exec`, `exec`, `oci` and `docker`.
//!
//! Every driver but docker starts its task under a `nomad-rs-executor` process (see
//! [`crate::executor`]); docker's containers are supervised by the Docker Engine. Each hands back a serializable [`TaskHandle`]. The agent persists the handle; after a restart,
//! [`Driver::recover`] reattaches to the same task from it, or reports how it ended meanwhile.

pub mod capabilities;
pub mod docker;
mod error;
pub mod exec;
mod handle;
mod launch;
pub mod oci;
mod oci_image;
pub mod raw_exec;
pub mod task_exec;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::fs_beneath::{Beneath, FsError, Links};
use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nomad_proto::DriverInfo;
use serde::de::DeserializeOwned;

pub use crate::executor::ExitResult;
pub use crate::executor::cgroups::{CgroupVersion, TaskCgroup};
pub use crate::executor::process::{ProcessRef, parse_signal};
pub use error::DriverError;
use handle::stop_with_escalation;
pub use handle::{DriverState, Recovered, TaskHandle, TaskStatus};
pub use task_exec::{CHECK_BUF_SIZE, ExecInput, ExecOutput, ExecOutputChunk, ExecSession};

/// A task driver. Object-safe: the registry holds `Arc<dyn Driver>`.
pub trait Driver: Send + Sync {
    /// The name jobs use in `driver = "..."`.
    fn name(&self) -> &'static str;

    /// Whether the driver can run tasks here, and its node attributes.
    fn fingerprint(&self) -> BoxFuture<'_, DriverInfo>;

    /// Checks the task's driver config; the error names the offending key.
    fn validate_config(&self, task: &TaskConfig) -> Result<(), DriverError>;

    /// Starts the task under an executor and returns once it runs.
    fn start<'a>(&'a self, task: &'a TaskConfig) -> BoxFuture<'a, Result<TaskHandle, DriverError>>;

    /// Waits for the task to exit. Works from a handle the agent did not start itself.
    fn wait<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<ExitResult, DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            Ok(handle.wait_exit(None).await.unwrap_or_else(|| ExitResult::failed("wait ended early")))
        })
    }

    /// The signal a stop sends first when the task sets no `kill_signal`: Nomad's SIGINT for
    /// process drivers.
    fn default_kill_signal(&self) -> Signal {
        Signal::SIGINT
    }

    /// Sends `signal`, and SIGKILL if the task is still running after `timeout`. By default
    /// signals go to the task's process group (it leads its own session).
    fn stop<'a>(&'a self, handle: &'a TaskHandle, signal: Signal, timeout: Duration) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            stop_with_escalation(handle, signal, timeout, |s| handle.signal_group_boxed(s)).await
        })
    }

    /// Kills what is left of the task and removes what the driver created for it.
    fn destroy<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<(), DriverError>>;

    /// Reattaches to a task after an agent restart: same process, no restart.
    fn recover<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<Recovered, DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            Ok(handle.recover())
        })
    }

    /// The task's current state.
    fn inspect<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<TaskStatus, DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            Ok(handle.status())
        })
    }

    /// Sends a signal to the task (by default to its process group).
    fn signal<'a>(&'a self, handle: &'a TaskHandle, signal: Signal) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            handle.signal_group(signal)
        })
    }

    /// The process that runs `command` with `args` in the running task's context (its
    /// directory and environment, and for isolated drivers its namespaces, root, cgroups, user
    /// and capabilities), not yet spawned: callers choose its stdio. See `task_exec`.
    fn exec_command(&self, handle: &TaskHandle, command: &str, args: &[String]) -> Result<tokio::process::Command, DriverError> {
        let _ = (handle, command, args);
        Err(DriverError::ExecUnsupported(self.name()))
    }

    /// Runs `command` in the running task's context and waits at most `timeout` for it (then it
    /// is killed): the last 4 KiB of its output and its exit code.
    fn exec_task<'a>(
        &'a self,
        handle: &'a TaskHandle,
        command: &'a str,
        args: &'a [String],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecOutput, DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            let cmd = self.exec_command(handle, command, args)?;
            task_exec::run_bounded(cmd, timeout).await
        })
    }

    /// Starts `command` interactively in the running task's context (`alloc exec`), with a
    /// pseudo-terminal of `size` (rows, columns) when `tty` is set, else pipes. By default it
    /// runs what [`Driver::exec_command`] builds; a driver whose commands do not run as local
    /// processes (a container engine's exec API) overrides this.
    fn exec_streaming<'a>(
        &'a self,
        handle: &'a TaskHandle,
        command: &'a str,
        args: &'a [String],
        tty: bool,
        size: Option<(u16, u16)>,
    ) -> BoxFuture<'a, Result<ExecSession, DriverError>> {
        Box::pin(async move {
            handle.check_driver(self.name())?;
            let cmd = self.exec_command(handle, command, args)?;
            task_exec::spawn_session(cmd, tty, size)
        })
    }
}

/// What the task runner gives a driver to start one task.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// Allocation ID.
    pub alloc_id: String,
    /// Task name.
    pub task_name: String,
    /// The allocation directory: holds `alloc/` (shared) and one directory per task.
    pub alloc_dir: PathBuf,
    /// Agent-private directory for this task (launch spec, exit record, runtime state).
    pub state_dir: PathBuf,
    /// The task's `config { ... }` block, already interpolated.
    pub driver_config: serde_json::Map<String, serde_json::Value>,
    /// The task's complete environment.
    pub env: BTreeMap<String, String>,
    /// User to run as (exec and oci; raw_exec runs as the agent's user).
    pub user: Option<String>,
    /// Resource limits.
    pub resources: TaskResources,
    /// Log rotation.
    pub logs: LogConfig,
    /// Signal sent first on stop (`kill_signal`).
    pub kill_signal: Signal,
    /// Time between that signal and SIGKILL (`kill_timeout`).
    pub kill_timeout: Duration,
    /// Host paths bound into the task (CSI volumes at their `volume_mount.destination`); only
    /// drivers with a file system of their own (exec, oci) are given any.
    pub mounts: Vec<MountConfig>,
    /// The group's network namespace the task joins (bridge, none and cni networks).
    pub netns: Option<PathBuf>,
}

/// A host path bound into the task (Nomad's `drivers.MountConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountConfig {
    /// The host path.
    pub host_path: PathBuf,
    /// Where the task sees it (absolute, inside the task's root).
    pub task_path: String,
    /// Bound read-only.
    pub read_only: bool,
    /// Whether mounts under it cross between host and task (`PropagationMode`).
    pub propagation: Propagation,
}

pub use crate::executor::isolation::Propagation;

/// The shared dir, relative to the alloc dir.
pub const SHARED_DIR: &str = "alloc";
/// The log dir, relative to the alloc dir.
pub const LOG_DIR: &str = "alloc/logs";

impl TaskConfig {
    /// The alloc dir, as the base every path under it is resolved beneath (see `fs_beneath`).
    pub fn open_alloc_dir(&self) -> Result<Beneath, FsError> {
        Beneath::open(&self.alloc_dir)
    }

    /// The task dir, resolved beneath the alloc dir with no symlink on the way.
    pub fn open_task_dir(&self) -> Result<Beneath, FsError> {
        self.open_alloc_dir()?.open_dir(Path::new(&self.task_name), Links::Refuse)
    }

    /// `<alloc_dir>/alloc`, shared by the allocation's tasks.
    pub fn shared_dir(&self) -> PathBuf {
        self.alloc_dir.join("alloc")
    }
    /// `<alloc_dir>/alloc/logs`.
    pub fn log_dir(&self) -> PathBuf {
        self.shared_dir().join("logs")
    }
    /// `<alloc_dir>/<task>`.
    pub fn task_dir(&self) -> PathBuf {
        self.alloc_dir.join(&self.task_name)
    }
    /// `<alloc_dir>/<task>/local`.
    pub fn local_dir(&self) -> PathBuf {
        self.task_dir().join("local")
    }
    /// `<alloc_dir>/<task>/secrets`.
    pub fn secrets_dir(&self) -> PathBuf {
        self.task_dir().join("secrets")
    }
    /// `<alloc_dir>/<task>/tmp`.
    pub fn tmp_dir(&self) -> PathBuf {
        self.task_dir().join("tmp")
    }

    /// A name unique to this task on the host, usable as a cgroup or container name.
    pub fn unique_name(&self) -> String {
        format!("{}.{}", self.alloc_id, self.task_name)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
            .collect()
    }

    /// Parses the driver config into `T`; the error names the key that did not fit.
    pub fn parse_driver_config<T: DeserializeOwned>(&self, driver: &'static str) -> Result<T, DriverError> {
        let value = serde_json::Value::Object(self.driver_config.clone());
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let reason = if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) };
            DriverError::InvalidConfig { driver, reason }
        })
    }
}

/// A task's resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskResources {
    /// CPU in MHz; becomes cpu shares.
    pub cpu_mhz: u64,
    /// Memory in MiB: the hard limit, or the reservation when `memory_max_mib` is set.
    pub memory_mib: u64,
    /// Hard memory limit in MiB when oversubscribing (0 = `memory_mib` is the limit).
    pub memory_max_mib: u64,
    /// Maximum processes (0 = unlimited).
    pub pids_max: u64,
}

impl TaskResources {
    /// The hard memory limit in bytes (0 = none).
    pub fn memory_limit_bytes(&self) -> u64 {
        let mib = if self.memory_max_mib > 0 { self.memory_max_mib } else { self.memory_mib };
        mib * 1024 * 1024
    }
    /// The soft memory reservation in bytes, set only when oversubscribing.
    pub fn memory_reservation_bytes(&self) -> u64 {
        if self.memory_max_mib > 0 { self.memory_mib * 1024 * 1024 } else { 0 }
    }
}

/// Log rotation settings (the job's `logs` block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Files kept per stream.
    pub max_files: u32,
    /// Size at which a file is rotated, in bytes (the job gives MB).
    pub max_file_size: u64,
}

impl Default for LogConfig {
    /// Nomad's defaults: 10 files of 10 MB.
    fn default() -> Self {
        LogConfig { max_files: 10, max_file_size: 10 * 1024 * 1024 }
    }
}

/// Driver settings from the agent configuration.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// The `nomad-rs-executor` binary.
    pub executor_path: PathBuf,
    /// raw_exec runs tasks unisolated as the agent's user, so it is off unless enabled.
    pub raw_exec_enabled: bool,
    /// exec settings.
    pub exec: exec::ExecOptions,
    /// oci settings.
    pub oci: oci::OciOptions,
    /// docker settings (`plugin "docker" { config {...} }`).
    pub docker: docker::DockerOptions,
}

impl DriverOptions {
    /// Defaults, with the executor installed beside the running binary.
    pub fn new(raw_exec_enabled: bool) -> DriverOptions {
        DriverOptions {
            executor_path: default_executor_path(),
            raw_exec_enabled,
            exec: exec::ExecOptions::default(),
            oci: oci::OciOptions::default(),
            docker: docker::DockerOptions::default(),
        }
    }
}

/// `nomad-rs-executor` next to the current executable.
pub fn default_executor_path() -> PathBuf {
    std::env::current_exe().map(|exe| exe.with_file_name("nomad-rs-executor")).unwrap_or_else(|_| PathBuf::from("nomad-rs-executor"))
}

/// Drivers by name.
#[derive(Clone)]
pub struct DriverRegistry {
    drivers: BTreeMap<&'static str, Arc<dyn Driver>>,
    docker: Arc<docker::DockerDriver>,
}

impl DriverRegistry {
    /// Every built-in driver, configured from the agent's options.
    pub fn new(options: &DriverOptions) -> DriverRegistry {
        let docker = Arc::new(docker::DockerDriver::new(options.docker.clone()));
        let drivers: [Arc<dyn Driver>; 4] = [
            Arc::new(raw_exec::RawExecDriver::new(options.executor_path.clone(), options.raw_exec_enabled)),
            Arc::new(exec::ExecDriver::new(options.executor_path.clone(), options.exec.clone())),
            Arc::new(oci::OciDriver::new(options.executor_path.clone(), options.oci.clone())),
            docker.clone(),
        ];
        DriverRegistry { drivers: drivers.into_iter().map(|d| (d.name(), d)).collect(), docker }
    }

    /// What makes the network namespace of a group with a docker task (its infra container).
    pub fn netns_maker(&self) -> Arc<dyn crate::client::network::NetnsMaker> {
        Arc::new(docker::network::InfraContainers(self.docker.clone()))
    }

    /// The driver with this name.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Driver>, DriverError> {
        self.drivers.get(name).cloned().ok_or_else(|| DriverError::UnknownDriver(name.to_string()))
    }

    /// Names of the registered drivers.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.drivers.keys().copied()
    }

    /// Fingerprints every driver, for the node's `Drivers` map.
    pub async fn fingerprint_all(&self) -> BTreeMap<String, DriverInfo> {
        let mut infos = BTreeMap::new();
        for (name, driver) in &self.drivers {
            infos.insert(name.to_string(), driver.fingerprint().await);
        }
        infos
    }
}

/// The signal names accepted, sorted, as Go's `%q` prints a list (`["SIGABRT" "SIGALRM" ...]`).
pub fn valid_signal_names() -> String {
    let mut names: Vec<&str> = Signal::iterator().map(Signal::as_str).collect();
    names.sort_unstable();
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// The signal Nomad's `kill_signal` names (`SIGTERM`, `TERM`, `15`).
pub fn signal_named(name: &str) -> Result<Signal, DriverError> {
    parse_signal(name).ok_or_else(|| DriverError::UnknownSignal(name.to_string()))
}

/// Resolves a command the way the task's `execve` will: a path relative to `base` when it has a
/// slash, otherwise the first executable match in `path_var`.
fn resolve_command(command: &str, base: &Path, path_var: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if command.contains('/') {
        let path = base.join(command);
        return executable(&path).then_some(path);
    }
    path_var.split(':').filter(|d| !d.is_empty()).map(|d| Path::new(d).join(command)).find(|p| executable(p))
}

/// The PATH a task gets when its environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The task's environment with a PATH filled in.
fn env_with_path(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = env.clone();
    env.entry("PATH".to_string()).or_insert_with(|| DEFAULT_PATH.to_string());
    env
}
