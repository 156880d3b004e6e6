//! `oci`: an OCI runtime bundle built with `oci-spec` and run by `runc` under the executor.
//!
//! The executor runs `runc create` + `runc start` (see `executor::spawn` for why not a foreground
//! `runc run`). Signals go through `runc kill`; destroy is `runc delete --force`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nomad_proto::{DriverInfo, Timestamp};
use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxMemoryBuilder, LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder, ProcessBuilder,
    RootBuilder, Spec, UserBuilder,
};
use serde::Deserialize;

use super::handle::{DESTROY_WAIT, stop_with_escalation};
use super::launch::{launch, launch_spec};
use super::oci_image::{self, ImageDefaults};
use super::{Driver, DriverError, DriverState, Propagation, SHARED_DIR, TaskConfig, TaskHandle};
use crate::executor::cgroups::{CgroupVersion, detect_version};
use crate::executor::{LaunchMode, OciLaunch};
use crate::fs_beneath::{Beneath, Links};

const NAME: &str = "oci";
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// oci driver settings from the agent configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciOptions {
    /// The runtime binary.
    pub runtime: PathBuf,
    /// The runtime's state directory (`runc --root`).
    pub runtime_root: PathBuf,
    /// Where cgroup hierarchies are mounted (to find OOM counters).
    pub cgroup_root: PathBuf,
    /// Parent cgroup of every container.
    pub cgroup_parent: String,
}

impl Default for OciOptions {
    fn default() -> Self {
        OciOptions {
            runtime: PathBuf::from("runc"),
            runtime_root: PathBuf::from("/run/nomad-rs/runc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "nomad-rs".to_string(),
        }
    }
}

/// The task's `config` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OciConfig {
    /// A rootfs directory or an OCI image layout directory.
    image: PathBuf,
    /// Program to run; defaults to the image's entrypoint/cmd.
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    /// Working directory in the container.
    #[serde(default)]
    work_dir: Option<String>,
}

/// The oci driver.
pub struct OciDriver {
    executor_path: PathBuf,
    options: OciOptions,
}

impl OciDriver {
    /// A driver that launches `executor_path`.
    pub fn new(executor_path: PathBuf, options: OciOptions) -> OciDriver {
        OciDriver { executor_path, options }
    }

    fn config(task: &TaskConfig) -> Result<OciConfig, DriverError> {
        task.parse_driver_config(NAME)
    }

    fn cgroups_path(&self, container_id: &str) -> String {
        format!("/{}/{container_id}", self.options.cgroup_parent)
    }

    fn oom_counter_files(&self, container_id: &str) -> Vec<PathBuf> {
        let root = &self.options.cgroup_root;
        let relative = self.cgroups_path(container_id);
        let relative = relative.trim_start_matches('/');
        match detect_version(root) {
            CgroupVersion::V1 => vec![root.join("memory").join(relative).join("memory.oom_control")],
            CgroupVersion::V2 => vec![root.join(relative).join("memory.events")],
        }
    }

    /// The runtime spec: the image's process defaults overridden by the task, the task's
    /// directories bound in, host networking (no network namespace), per-task cgroup limits.
    fn build_spec(
        &self,
        task: &TaskConfig,
        config: &OciConfig,
        rootfs: &Path,
        read_only_root: bool,
        defaults: &ImageDefaults,
        container_id: &str,
    ) -> Result<Spec, DriverError> {
        let invalid = |reason: String| DriverError::InvalidConfig { driver: NAME, reason };
        let built = |what: &str, e: oci_spec::OciSpecError| DriverError::Runtime(format!("build {what}: {e}"));

        let args = match &config.command {
            Some(command) => std::iter::once(command.clone()).chain(config.args.iter().cloned()).collect(),
            None => {
                let tail = if config.args.is_empty() { &defaults.cmd } else { &config.args };
                defaults.entrypoint.iter().chain(tail).cloned().collect::<Vec<_>>()
            }
        };
        if args.is_empty() {
            return Err(invalid("command: required when the image has no entrypoint or cmd".to_string()));
        }
        let mut env: Vec<String> = task.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for inherited in &defaults.env {
            let key = inherited.split('=').next().unwrap_or_default();
            if !task.env.contains_key(key) {
                env.push(inherited.clone());
            }
        }
        if !env.iter().any(|e| e.starts_with("PATH=")) {
            env.push(DEFAULT_PATH.to_string());
        }
        let user = task.user.as_ref().or(defaults.user.as_ref());
        let (uid, gid) = match user {
            Some(user) => oci_image::resolve_user(rootfs, user).map_err(|e| invalid(format!("user: {e}")))?,
            None => (0, 0),
        };
        let cwd = config.work_dir.clone().or_else(|| defaults.working_dir.clone()).unwrap_or_else(|| "/".to_string());
        let process = ProcessBuilder::default()
            .terminal(false)
            .args(args)
            .env(env)
            .cwd(cwd)
            .user(UserBuilder::default().uid(uid).gid(gid).build().map_err(|e| built("user", e))?)
            .no_new_privileges(true)
            .build()
            .map_err(|e| built("process", e))?;

        let mut mounts: Vec<Mount> = oci_spec::runtime::get_default_mounts();
        // The sources are inside the alloc dir, which tasks write: each is resolved beneath it
        // with no symlink, and runc gets the real path it resolved to.
        let alloc_dir = task.open_alloc_dir()?;
        let task_dir = PathBuf::from(&task.task_name);
        let sources = [
            (PathBuf::from(SHARED_DIR), "/alloc", 0o777),
            (task_dir.join("local"), "/local", 0o777),
            (task_dir.join("secrets"), "/secrets", 0o700),
        ];
        for (relative, destination, mode) in sources {
            let dir = match alloc_dir.open_dir(&relative, Links::Refuse) {
                Err(e) if e.is_not_found() => alloc_dir.create_dir_all(&relative, mode)?,
                other => other?,
            };
            let source = dir.real_path()?;
            mounts.push(
                MountBuilder::default()
                    .destination(destination)
                    .typ("bind")
                    .source(source)
                    .options(vec!["rbind".to_string(), "rw".to_string()])
                    .build()
                    .map_err(|e| built("mount", e))?,
            );
        }
        // CSI volumes and a CSI plugin's dirs: host paths the agent made, not the task's.
        for m in &task.mounts {
            let mode = if m.read_only { "ro" } else { "rw" };
            let propagation = match m.propagation {
                Propagation::Private => "rprivate",
                Propagation::HostToTask => "rslave",
                Propagation::Bidirectional => "rshared",
            };
            mounts.push(
                MountBuilder::default()
                    .destination(&m.task_path)
                    .typ("bind")
                    .source(&m.host_path)
                    .options(vec!["rbind".to_string(), mode.to_string(), propagation.to_string()])
                    .build()
                    .map_err(|e| built("mount", e))?,
            );
        }
        // runc makes the container's mounts rslave unless told otherwise, and a bind can only
        // share with the host what its parent shares: so the rootfs propagation follows the
        // widest mount (as Docker sets it), and runc keeps the rootfs' own parent private.
        let rootfs_propagation = if task.mounts.iter().any(|m| m.propagation == Propagation::Bidirectional) {
            Some("rshared")
        } else if task.mounts.iter().any(|m| m.propagation == Propagation::HostToTask) {
            Some("rslave")
        } else {
            None
        };
        mounts.push(
            MountBuilder::default()
                .destination("/tmp")
                .typ("tmpfs")
                .source("tmpfs")
                .options(vec!["nosuid".to_string(), "nodev".to_string(), "mode=1777".to_string()])
                .build()
                .map_err(|e| built("mount", e))?,
        );

        let limits = &task.resources;
        let mut memory = LinuxMemoryBuilder::default();
        if limits.memory_limit_bytes() > 0 {
            let bytes = limits.memory_limit_bytes() as i64;
            // swap is memory+swap: equal to the limit means no swap.
            memory = memory.limit(bytes).swap(bytes);
        }
        if limits.memory_reservation_bytes() > 0 {
            memory = memory.reservation(limits.memory_reservation_bytes() as i64);
        }
        let mut resources = LinuxResourcesBuilder::default().memory(memory.build().map_err(|e| built("memory", e))?);
        if limits.cpu_mhz > 0 {
            resources = resources.cpu(LinuxCpuBuilder::default().shares(limits.cpu_mhz.max(2)).build().map_err(|e| built("cpu", e))?);
        }
        if limits.pids_max > 0 {
            resources = resources.pids(LinuxPidsBuilder::default().limit(limits.pids_max as i64).build().map_err(|e| built("pids", e))?);
        }
        let mut spec = Spec::default();
        let mut linux = spec.linux().clone().unwrap_or_default();
        // Keep the default device rules (deny all but the basics) alongside our limits.
        let mut resources = resources.build().map_err(|e| built("resources", e))?;
        if let Some(default_resources) = linux.resources() {
            resources.set_devices(default_resources.devices().clone());
        }
        linux.set_resources(Some(resources));
        linux.set_cgroups_path(Some(PathBuf::from(self.cgroups_path(container_id))));
        // The host's network, or the group's network namespace (bridge, none, cni).
        let mut namespaces: Vec<_> = linux.namespaces().clone().unwrap_or_default();
        namespaces.retain(|n| n.typ() != LinuxNamespaceType::Network);
        if let Some(netns) = &task.netns {
            namespaces.push(
                oci_spec::runtime::LinuxNamespaceBuilder::default()
                    .typ(LinuxNamespaceType::Network)
                    .path(netns.clone())
                    .build()
                    .map_err(|e| built("network namespace", e))?,
            );
        }
        linux.set_namespaces(Some(namespaces));
        if let Some(p) = rootfs_propagation {
            linux.set_rootfs_propagation(Some(p.to_string()));
        }
        spec.set_linux(Some(linux));
        spec.set_process(Some(process));
        spec.set_root(Some(RootBuilder::default().path(rootfs).readonly(read_only_root).build().map_err(|e| built("root", e))?));
        spec.set_mounts(Some(mounts));
        spec.set_hostname(Some(task.task_name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(63).collect()));
        Ok(spec)
    }

    fn container(&self, handle: &TaskHandle) -> Result<RuntimeRef, DriverError> {
        handle.check_driver(NAME)?;
        match &handle.driver_state {
            DriverState::Oci { runtime, runtime_root, container_id, bundle } => {
                Ok(RuntimeRef { runtime: runtime.clone(), root: runtime_root.clone(), id: container_id.clone(), bundle: bundle.clone() })
            }
            _ => Err(DriverError::Runtime("handle carries no container state".to_string())),
        }
    }
}

/// The runtime's view of one container.
struct RuntimeRef {
    runtime: PathBuf,
    root: PathBuf,
    id: String,
    bundle: PathBuf,
}

impl RuntimeRef {
    async fn run(&self, args: &[&str]) -> Result<(), String> {
        let output = tokio::process::Command::new(&self.runtime)
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("run {}: {e}", self.runtime.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!("{} {}: {}", self.runtime.display(), args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
        }
    }

    /// `runc kill`; a container that already stopped is not an error.
    async fn kill(&self, handle: &TaskHandle, signal: Signal) -> Result<(), DriverError> {
        let signum = (signal as i32).to_string();
        match self.run(&["kill", &self.id, &signum]).await {
            Ok(()) => Ok(()),
            Err(_) if !handle.task.is_alive() => Ok(()),
            Err(e) => Err(DriverError::Runtime(e)),
        }
    }
}

impl Driver for OciDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> BoxFuture<'_, DriverInfo> {
        Box::pin(async move {
            let mut info = DriverInfo { update_time: Timestamp::now(), ..DriverInfo::default() };
            let output = tokio::process::Command::new(&self.options.runtime).arg("--version").stdin(Stdio::null()).output().await;
            let version = match output {
                Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("runc version ").or_else(|| l.split_whitespace().nth(2)))
                    .unwrap_or("unknown")
                    .trim()
                    .to_string(),
                Ok(out) => {
                    info.health_description = format!("{} --version failed: {}", self.options.runtime.display(), out.status);
                    return info;
                }
                Err(e) => {
                    info.health_description = format!("runtime {} not found: {e}", self.options.runtime.display());
                    return info;
                }
            };
            info.detected = true;
            info.attributes.insert("driver.oci".to_string(), "1".to_string());
            info.attributes.insert(
                "driver.oci.runtime".to_string(),
                self.options.runtime.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            );
            info.attributes.insert("driver.oci.runtime.version".to_string(), version);
            if nix::unistd::geteuid().is_root() {
                info.healthy = true;
                info.health_description = "Healthy".to_string();
            } else {
                info.health_description = "oci driver must run as root".to_string();
            }
            info
        })
    }

    fn validate_config(&self, task: &TaskConfig) -> Result<(), DriverError> {
        Self::config(task).map(drop)
    }

    fn start<'a>(&'a self, task: &'a TaskConfig) -> BoxFuture<'a, Result<TaskHandle, DriverError>> {
        Box::pin(async move {
            let config = Self::config(task)?;
            let bundle = task.state_dir.join("bundle");
            fs::create_dir_all(&bundle).map_err(|e| DriverError::io(format!("create {}", bundle.display()), e))?;
            // A relative image is in the task dir, which the task may have written in an earlier
            // run: resolved beneath it (a symlink out of it, e.g. to the host's `/`, is refused),
            // and used by the real path it resolved to.
            let image = if config.image.is_relative() {
                task.open_task_dir()?.open_dir(&config.image, Links::Beneath)?.real_path()?
            } else {
                config.image.clone()
            };
            let (image_path, bundle_dir) = (image.clone(), bundle.clone());
            // Layer extraction is blocking file work.
            let prepared = tokio::task::spawn_blocking(move || oci_image::prepare(&image_path, &bundle_dir))
                .await
                .map_err(|e| DriverError::Runtime(format!("image preparation panicked: {e}")))??;
            let container_id = task.unique_name();
            let spec = self.build_spec(task, &config, &prepared.rootfs, prepared.shared, &prepared.defaults, &container_id)?;
            let config_path = bundle.join("config.json");
            spec.save(&config_path).map_err(|e| DriverError::Runtime(format!("write {}: {e}", config_path.display())))?;

            let runtime_ref = RuntimeRef {
                runtime: self.options.runtime.clone(),
                root: self.options.runtime_root.clone(),
                id: container_id.clone(),
                bundle: bundle.clone(),
            };
            // A container left by an earlier attempt under the same ID would block create.
            let _ = runtime_ref.run(&["delete", "--force", &container_id]).await;
            let mode = LaunchMode::Oci(OciLaunch {
                runtime: self.options.runtime.clone(),
                runtime_root: self.options.runtime_root.clone(),
                bundle: bundle.clone(),
                container_id: container_id.clone(),
                pid_file: task.state_dir.join("container.pid"),
                log_file: task.state_dir.join("runtime.log"),
            });
            let spec = launch_spec(task, mode, self.oom_counter_files(&container_id));
            let state = DriverState::Oci {
                runtime: self.options.runtime.clone(),
                runtime_root: self.options.runtime_root.clone(),
                container_id,
                bundle,
            };
            launch(&self.executor_path, NAME, task, &spec, state).await
        })
    }

    fn stop<'a>(&'a self, handle: &'a TaskHandle, signal: Signal, timeout: Duration) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let container = self.container(handle)?;
            stop_with_escalation(handle, signal, timeout, |s| Box::pin(container.kill(handle, s))).await
        })
    }

    fn destroy<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let container = self.container(handle)?;
            // delete --force kills a running container, then removes its state and cgroups.
            let deleted = container.run(&["delete", "--force", &container.id]).await;
            if handle.wait_exit(Some(DESTROY_WAIT)).await.is_none() {
                return Err(DriverError::Runtime(format!("container {} still running after delete", container.id)));
            }
            if let Err(e) = deleted
                && !e.contains("does not exist")
            {
                return Err(DriverError::Runtime(e));
            }
            // The rootfs came from an image: removed without following its links or crossing
            // a mount left in it.
            let (Some(parent), Some(name)) = (container.bundle.parent(), container.bundle.file_name()) else {
                return Err(DriverError::Runtime(format!("bundle {} has no parent", container.bundle.display())));
            };
            match Beneath::open(parent) {
                Ok(parent) => Ok(parent.remove_tree(Path::new(name))?),
                Err(e) if e.is_not_found() => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn signal<'a>(&'a self, handle: &'a TaskHandle, signal: Signal) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let container = self.container(handle)?;
            container.kill(handle, signal).await
        })
    }

    /// `runc exec`: the command joins the container, with the process settings of its
    /// config.json (user, capabilities, environment, cwd, no_new_privileges), as `runc exec`
    /// takes them when given no `--process`. runc stays in the foreground as the command's
    /// parent, in the command's process group, so a timeout's kill reaches both.
    fn exec_command(&self, handle: &TaskHandle, command: &str, args: &[String]) -> Result<tokio::process::Command, DriverError> {
        let container = self.container(handle)?;
        super::task_exec::require_running(handle)?;
        let mut cmd = tokio::process::Command::new(&container.runtime);
        cmd.arg("--root").arg(&container.root).arg("exec").arg(&container.id).arg(command).args(args);
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::driver::MountConfig;

    #[test]
    fn csi_volume_mounts_are_bound_into_the_bundle_read_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut task = crate::client::taskrunner::hooks::tests_support::config();
        task.alloc_dir = dir.path().to_path_buf();
        std::fs::create_dir_all(dir.path().join("alloc")).unwrap();
        std::fs::create_dir_all(dir.path().join("t")).unwrap();
        task.mounts = vec![
            MountConfig {
                host_path: "/state/csi/node/p/per-alloc/a/v/ro".into(),
                task_path: "/data".into(),
                read_only: true,
                propagation: Propagation::Private,
            },
            MountConfig {
                host_path: "/state/csi/node/p/per-alloc/a/w/rw".into(),
                task_path: "/scratch".into(),
                read_only: false,
                propagation: Propagation::Private,
            },
        ];
        let config = OciConfig { image: "/img".into(), command: Some("/bin/true".into()), args: Vec::new(), work_dir: None };
        let driver = OciDriver::new("/nonexistent/executor".into(), OciOptions::default());
        let spec = driver.build_spec(&task, &config, Path::new("/rootfs"), false, &ImageDefaults::default(), "c1").unwrap();
        assert_eq!(spec.linux().as_ref().unwrap().rootfs_propagation(), &None, "runc's default when nothing propagates");
        let mounts = spec.mounts().clone().unwrap();
        let find = |dest: &str| mounts.iter().find(|m| m.destination() == Path::new(dest)).cloned().expect(dest);
        let data = find("/data");
        assert_eq!(data.source().as_deref(), Some(Path::new("/state/csi/node/p/per-alloc/a/v/ro")));
        assert_eq!(data.typ().as_deref(), Some("bind"));
        assert_eq!(data.options().clone().unwrap(), ["rbind", "ro", "rprivate"]);
        assert_eq!(find("/scratch").options().clone().unwrap(), ["rbind", "rw", "rprivate"]);
    }

    #[test]
    fn a_csi_plugins_bidirectional_mount_is_rshared_in_a_shared_rootfs() {
        let dir = tempfile::tempdir().unwrap();
        let mut task = crate::client::taskrunner::hooks::tests_support::config();
        task.alloc_dir = dir.path().to_path_buf();
        std::fs::create_dir_all(dir.path().join("alloc")).unwrap();
        std::fs::create_dir_all(dir.path().join("t")).unwrap();
        task.mounts = vec![
            MountConfig { host_path: "/dev".into(), task_path: "/dev".into(), read_only: false, propagation: Propagation::HostToTask },
            MountConfig {
                host_path: "/state/csi/node/p".into(),
                task_path: "/local/csi".into(),
                read_only: false,
                propagation: Propagation::Bidirectional,
            },
        ];
        let driver = OciDriver::new("/nonexistent/executor".into(), OciOptions::default());
        let config = OciConfig { image: "/img".into(), command: Some("/bin/true".into()), args: Vec::new(), work_dir: None };
        let spec = driver.build_spec(&task, &config, Path::new("/rootfs"), false, &ImageDefaults::default(), "c1").unwrap();
        let mounts = spec.mounts().clone().unwrap();
        // The last mount at a destination is the one the task sees (runc's default /dev is a tmpfs).
        let find = |dest: &str| mounts.iter().rev().find(|m| m.destination() == Path::new(dest)).cloned().expect(dest);
        assert_eq!(find("/local/csi").options().clone().unwrap(), ["rbind", "rw", "rshared"]);
        assert_eq!(find("/dev").options().clone().unwrap(), ["rbind", "rw", "rslave"]);
        assert_eq!(spec.linux().as_ref().unwrap().rootfs_propagation().as_deref(), Some("rshared"));
    }
}
