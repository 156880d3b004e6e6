//! `exec`: the command in PID, mount, IPC and UTS namespaces, chrooted into its task dir with
//! read-only host system directories, limited by cgroups, as `nobody` unless the task names a
//! user (never one of the client's `user.denylist`, `root` by default), with Nomad's default
//! capabilities (`allow_caps`, `cap_add`, `cap_drop`: see `capabilities`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nomad_proto::{DriverInfo, Timestamp};
use serde::Deserialize;

use super::capabilities::{self, CapSet};
use super::handle::{DESTROY_WAIT, stop_with_escalation};
use super::launch::{launch, launch_spec};
use super::{Driver, DriverError, DriverState, TaskCgroup, TaskConfig, TaskHandle, env_with_path};
use crate::executor::cgroups::{CgroupLimits, detect_version};
use crate::executor::isolation::{BindMount, IsolationSpec, Symlink};
use crate::executor::{LaunchMode, ProcessSpec};

const NAME: &str = "exec";

/// Host directories in the chroot by default; the second field says whether a missing one is an
/// error (`/lib64` and `/sbin` do not exist everywhere).
const DEFAULT_CHROOT: [(&str, bool); 6] =
    [("/bin", true), ("/lib", true), ("/lib64", false), ("/usr", true), ("/etc", true), ("/sbin", false)];

/// Device nodes bound into the chroot.
const DEVICES: [&str; 5] = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/tty"];

/// exec driver settings from the agent configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOptions {
    /// Host path → path in the chroot. `None` uses the defaults; every entry given here must exist.
    pub chroot_env: Option<BTreeMap<PathBuf, PathBuf>>,
    /// Where cgroup hierarchies are mounted.
    pub cgroup_root: PathBuf,
    /// Parent cgroup of every task's cgroup.
    pub cgroup_parent: String,
    /// The capabilities a task may have (`plugin "exec" { config { allow_caps = [...] } }`).
    pub allow_caps: CapSet,
    /// Users tasks may not run as (the client's `user.denylist`, when `user.checked_drivers`
    /// names exec).
    pub user_denylist: BTreeSet<String>,
}

/// The user an exec task runs as when it names none (Nomad's).
pub const DEFAULT_USER: &str = "nobody";

/// Nomad's `user.denylist` default.
pub const DEFAULT_USER_DENYLIST: [&str; 2] = ["root", "Administrator"];

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            chroot_env: None,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "nomad-rs".to_string(),
            allow_caps: CapSet::parse(capabilities::NOMAD_DEFAULTS, capabilities::supported()).unwrap_or_default(),
            user_denylist: DEFAULT_USER_DENYLIST.iter().map(|u| u.to_string()).collect(),
        }
    }
}

/// The task's `config` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecConfig {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    /// Capabilities added to the defaults; each must be in the driver's `allow_caps`.
    #[serde(default)]
    cap_add: Vec<String>,
    /// Capabilities removed from the defaults (`"all"` for every one).
    #[serde(default)]
    cap_drop: Vec<String>,
}

/// The exec driver.
pub struct ExecDriver {
    executor_path: PathBuf,
    options: ExecOptions,
}

impl ExecDriver {
    /// A driver that launches `executor_path`.
    pub fn new(executor_path: PathBuf, options: ExecOptions) -> ExecDriver {
        ExecDriver { executor_path, options }
    }

    fn config(task: &TaskConfig) -> Result<ExecConfig, DriverError> {
        task.parse_driver_config(NAME)
    }

    /// Who the task runs as, and with which capabilities; refuses a denied user or capability.
    fn identity(&self, task: &TaskConfig, config: &ExecConfig) -> Result<(String, CapSet), DriverError> {
        let user = task.user.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| DEFAULT_USER.to_string());
        if self.options.user_denylist.contains(&user) {
            return Err(DriverError::Refused(format!("running as user {user:?} is disallowed")));
        }
        let supported = capabilities::supported();
        let caps =
            capabilities::calculate(self.options.allow_caps, &config.cap_add, &config.cap_drop, supported).map_err(DriverError::Refused)?;
        // As Nomad does: root keeps the set every root task had before allow_caps existed.
        let caps = if user == "root" { CapSet::legacy(supported) } else { caps };
        Ok((user, caps))
    }

    /// Host paths to bind read-only, and host symlinks (e.g. merged-/usr `/bin -> usr/bin`) to copy.
    fn chroot_entries(&self) -> Result<(Vec<BindMount>, Vec<Symlink>), DriverError> {
        let entries: Vec<(PathBuf, PathBuf, bool)> = match &self.options.chroot_env {
            Some(map) => map.iter().map(|(src, dst)| (src.clone(), dst.clone(), true)).collect(),
            None => DEFAULT_CHROOT.iter().map(|(p, required)| (PathBuf::from(p), PathBuf::from(p), *required)).collect(),
        };
        let (mut binds, mut symlinks) = (Vec::new(), Vec::new());
        for (source, target, required) in entries {
            match fs::symlink_metadata(&source) {
                Err(_) if !required => continue,
                Err(_) => return Err(DriverError::MissingChrootSource(source)),
                Ok(meta) if meta.file_type().is_symlink() => {
                    let link = fs::read_link(&source).map_err(|e| DriverError::io(format!("read link {}", source.display()), e))?;
                    symlinks.push(Symlink { path: target, target: link });
                }
                Ok(_) => binds.push(BindMount::private(source, target, true)),
            }
        }
        Ok((binds, symlinks))
    }

    fn isolation(&self, task: &TaskConfig, config: &ExecConfig, cgroup: &TaskCgroup) -> Result<IsolationSpec, DriverError> {
        let (user, caps) = self.identity(task, config)?;
        let (mut binds, symlinks) = self.chroot_entries()?;
        binds.push(BindMount::private(task.shared_dir(), PathBuf::from("/alloc"), false));
        // CSI volumes and a CSI plugin's dirs, made inside the task's mount namespace after its
        // own dirs, with the propagation asked for.
        for m in &task.mounts {
            binds.push(BindMount {
                source: m.host_path.clone(),
                target: PathBuf::from(&m.task_path),
                read_only: m.read_only,
                propagation: m.propagation,
            });
        }
        let hostname: String = task.task_name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(63).collect();
        Ok(IsolationSpec {
            root: task.task_dir(),
            binds,
            symlinks,
            devices: DEVICES.iter().map(PathBuf::from).collect(),
            hostname,
            cgroup_procs: cgroup.procs_files(),
            cwd: PathBuf::from("/"),
            user: Some(user),
            capabilities: Some(caps.bits()),
        })
    }

    async fn destroy_cgroup(cgroup: TaskCgroup) -> Result<(), DriverError> {
        tokio::task::spawn_blocking(move || cgroup.destroy(DESTROY_WAIT))
            .await
            .map_err(|e| DriverError::Cgroup(format!("cleanup task panicked: {e}")))?
            .map_err(|e| DriverError::Cgroup(format!("remove: {e}")))
    }
}

fn cgroup_of(handle: &TaskHandle) -> Option<&TaskCgroup> {
    match &handle.driver_state {
        DriverState::Exec { cgroup } => Some(cgroup),
        _ => None,
    }
}

impl Driver for ExecDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> BoxFuture<'_, DriverInfo> {
        Box::pin(async move {
            let mut info = DriverInfo { update_time: Timestamp::now(), ..DriverInfo::default() };
            let root = &self.options.cgroup_root;
            if !nix::unistd::geteuid().is_root() {
                info.health_description = "exec driver must run as root".to_string();
            } else if !root.join("cgroup.controllers").exists() && !root.join("memory").is_dir() {
                info.health_description = format!("no cgroup memory controller under {}", root.display());
            } else {
                info.detected = true;
                info.healthy = true;
                info.health_description = "Healthy".to_string();
                info.attributes.insert("driver.exec".to_string(), "1".to_string());
                let version = match detect_version(root) {
                    super::CgroupVersion::V1 => "v1",
                    super::CgroupVersion::V2 => "v2",
                };
                info.attributes.insert("driver.exec.cgroups".to_string(), version.to_string());
            }
            info
        })
    }

    fn validate_config(&self, task: &TaskConfig) -> Result<(), DriverError> {
        let config = Self::config(task)?;
        self.identity(task, &config).map(drop)
    }

    fn start<'a>(&'a self, task: &'a TaskConfig) -> BoxFuture<'a, Result<TaskHandle, DriverError>> {
        Box::pin(async move {
            let config = Self::config(task)?;
            // Fail on a missing chroot source or a refused user before creating anything.
            self.chroot_entries()?;
            self.identity(task, &config)?;
            let limits = CgroupLimits {
                memory_max: task.resources.memory_limit_bytes(),
                memory_soft: task.resources.memory_reservation_bytes(),
                cpu_shares: task.resources.cpu_mhz,
                pids_max: task.resources.pids_max,
            };
            let cgroup = TaskCgroup::create(&self.options.cgroup_root, &self.options.cgroup_parent, &task.unique_name(), &limits)
                .map_err(|e| DriverError::Cgroup(format!("create: {e}")))?;
            let started = async {
                let isolation = self.isolation(task, &config, &cgroup)?;
                let mode = LaunchMode::Process(ProcessSpec {
                    command: config.command,
                    args: config.args,
                    env: env_with_path(&task.env),
                    cwd: PathBuf::from("/"),
                    isolation: Some(isolation),
                    netns: task.netns.clone(),
                });
                let spec = launch_spec(task, mode, cgroup.oom_counter_files());
                launch(&self.executor_path, NAME, task, &spec, DriverState::Exec { cgroup: cgroup.clone() }).await
            }
            .await;
            if started.is_err() {
                let _ = Self::destroy_cgroup(cgroup).await;
            }
            started
        })
    }

    fn exec_command(&self, handle: &TaskHandle, command: &str, args: &[String]) -> Result<tokio::process::Command, DriverError> {
        handle.check_driver(NAME)?;
        super::task_exec::require_running(handle)?;
        // The helper reads what to enter from the launch spec itself; it is read here only to
        // fail early and clearly on a task started without one.
        super::task_exec::launch_spec_of(handle)?;
        let spec = handle.state_dir.join(super::launch::SPEC_FILE);
        let mut cmd = tokio::process::Command::new(&self.executor_path);
        cmd.args(crate::executor::enter::exec_args(&spec, handle.task, command, args)).env_clear();
        Ok(cmd)
    }

    fn destroy<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            handle.check_driver(NAME)?;
            // Killing PID 1 of the namespace takes every process in it along.
            stop_with_escalation(handle, Signal::SIGKILL, DESTROY_WAIT, |s| handle.signal_group_boxed(s)).await?;
            // The chroot's mounts lived in the task's own mount namespace and are gone with it.
            match cgroup_of(handle) {
                Some(cgroup) => Self::destroy_cgroup(cgroup.clone()).await,
                None => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::driver::{CgroupVersion, MountConfig, Propagation};

    #[test]
    fn csi_volume_mounts_are_bound_in_the_chroot_after_the_tasks_own_dirs() {
        let mut task = crate::client::taskrunner::hooks::tests_support::config();
        task.mounts = vec![
            MountConfig {
                host_path: "/state/csi/per-alloc/a/v/ro".into(),
                task_path: "/data".into(),
                read_only: true,
                propagation: Propagation::Private,
            },
            MountConfig {
                host_path: "/state/csi/node/p".into(),
                task_path: "/local/csi".into(),
                read_only: false,
                propagation: Propagation::Bidirectional,
            },
        ];
        let driver = ExecDriver::new("/nonexistent/executor".into(), ExecOptions::default());
        let config = ExecConfig { command: "/bin/true".into(), args: Vec::new(), cap_add: Vec::new(), cap_drop: Vec::new() };
        let cgroup = TaskCgroup { version: CgroupVersion::V2, dirs: Vec::new() };
        let spec = driver.isolation(&task, &config, &cgroup).unwrap();
        let n = spec.binds.len();
        assert_eq!(spec.binds[n - 3].target, PathBuf::from("/alloc"));
        assert_eq!(spec.binds[n - 2], BindMount::private("/state/csi/per-alloc/a/v/ro".into(), "/data".into(), true));
        assert_eq!(
            spec.binds[n - 1],
            BindMount {
                source: "/state/csi/node/p".into(),
                target: "/local/csi".into(),
                read_only: false,
                propagation: Propagation::Bidirectional
            },
            "the propagation asked for is kept"
        );
    }
}
