//! `csi_plugin_supervisor`: runs a task that is a CSI plugin (`csi_plugin {}`), as Nomad's
//! `plugin_supervisor_hook.go`.
//!
//! - **prestart** makes, beneath the client's `<state_dir>/csi` (through `fs_beneath`, mode
//!   0700, never through a symlink), the socket dir `plugins/<alloc id>` and the plugin's
//!   staging root `<type>/<plugin id>`. A raw_exec plugin has no chroot: its `CSI_ENDPOINT`
//!   (unless it sets one) is `unix://<host socket dir>/csi.sock` and it is sent host paths. An
//!   exec plugin gets, as Nomad's hook asks ([`plugin_mounts`]), the socket dir at
//!   `mount_dir` and the staging root at `stage_publish_base_dir`, both `bidirectional`, and
//!   the host's `/dev` at `/dev`; its `CSI_ENDPOINT` is `unix://<mount_dir>/csi.sock` and it is
//!   sent paths under `stage_publish_base_dir`. For what the plugin mounts there to reach the
//!   host, the CSI root must be a shared mount: prestart makes it one, once ([`share_csi_root`]:
//!   a bind of the dir onto itself, marked shared; it stays, as the volumes under it outlive
//!   plugins and agents). Nomad also binds `/dev` bidirectionally; here it is `host-to-task`, so
//!   the host's `/dev` is never made a shared mount (device nodes are the host's either way).
//!   Other drivers are refused (oci: its containers get no capability to mount with).
//! - **poststart** starts the supervisor once per task runner (also after an agent restart
//!   reattached to the task): it probes every 5 s until the plugin is ready, for at most
//!   `health_timeout`, else kills the task (failing it) with Nomad's events; once ready it
//!   emits `Plugin became healthy`, asks `GetPluginInfo` and registers each side of the plugin
//!   with the CSI manager, then probes every 30 s and emits `Plugin became healthy` /
//!   `Plugin became unhealthy` on every change.
//! - **stop** (the task is dead for good) stops the supervisor, deregisters the plugin and
//!   removes the socket dir.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use nix::mount::{MsFlags, mount};
use nomad_csi::CsiPluginClient;
use nomad_proto::alloc::task_event;
use nomad_proto::job::CsiPluginConfig;
use nomad_proto::{TaskEvent, Timestamp};
use tokio_util::sync::CancellationToken;

use super::{HookError, HookRequest, PoststartHook, PrestartHook, PrestartResponse, StopHook, TaskHook};
use crate::client::csi::volume::is_mount_point;
use crate::client::csi::{Connector, CsiPlugins, PluginRegistration, PluginSide};
use crate::client::driver::{MountConfig, Propagation};
use crate::client::taskrunner::lock;
use crate::client::taskrunner::restart::go_duration;
use crate::fs_beneath::{Beneath, check_name};

/// The socket's file name in the socket dir (`structs.CSISocketName`).
pub const SOCKET_NAME: &str = "csi.sock";
/// Between probes until the plugin is first ready.
pub const READY_PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// Between probes once it was.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(30);
/// `health_timeout` when the job leaves it 0.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest unix socket path the kernel takes (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Nomad's event types.
pub const PLUGIN_HEALTHY: &str = "Plugin became healthy";
/// Nomad's event types.
pub const PLUGIN_UNHEALTHY: &str = "Plugin became unhealthy";

/// What the supervisor may do to its task.
pub trait TaskControl: Send + Sync {
    /// Records an event.
    fn emit_event(&self, event: TaskEvent);
    /// Kills the task for good (failing it), recording `event`.
    fn kill_failed(&self, event: TaskEvent);
}

/// The drivers a plugin task may use: raw_exec (host paths) and exec, which honours
/// [`plugin_mounts`]. oci honours them too, but runs containers with runc's default
/// capabilities: a plugin there could not mount.
pub const PLUGIN_DRIVERS: [&str; 2] = ["raw_exec", "exec"];
/// `stage_publish_base_dir` when the job leaves it empty.
pub const DEFAULT_STAGE_PUBLISH_BASE_DIR: &str = "/local/csi";
/// `mount_dir` when the job leaves it empty.
pub const DEFAULT_MOUNT_DIR: &str = "/csi";

/// The host paths of one plugin task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPaths {
    /// `<csi root>/plugins/<alloc id>`: where the plugin makes its socket.
    pub socket_dir: PathBuf,
    /// `<socket dir>/csi.sock`.
    pub socket: PathBuf,
    /// `<csi root>/<type>/<plugin id>`: the staging and per-alloc mounts.
    pub mount_point: PathBuf,
}

impl PluginPaths {
    /// The paths for `config` of `alloc_id` under `csi_root`, or why there are none.
    pub fn new(csi_root: &Path, alloc_id: &str, config: &CsiPluginConfig) -> Result<PluginPaths, String> {
        check_name(&config.id).map_err(|why| format!("CSI plugin ID {:?} {why}: it must be usable as a directory name", config.id))?;
        check_name(alloc_id).map_err(|why| format!("alloc ID {alloc_id:?} {why}"))?;
        if PluginSide::of_type(&config.plugin_type).is_empty() {
            return Err(format!(
                "CSIPluginConfig PluginType must be one of 'node', 'controller', or 'monolith', got: \"{}\"",
                config.plugin_type
            ));
        }
        let socket_dir = csi_root.join("plugins").join(alloc_id);
        let socket = socket_dir.join(SOCKET_NAME);
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(format!(
                "the CSI plugin's socket path {} is longer than the {MAX_SOCKET_PATH} bytes a unix socket may have: use a shorter client state_dir",
                socket.display()
            ));
        }
        Ok(PluginPaths { socket_dir, socket, mount_point: csi_root.join(&config.plugin_type).join(&config.id) })
    }

    fn relative(&self, csi_root: &Path) -> (PathBuf, PathBuf) {
        let rel = |p: &Path| p.strip_prefix(csi_root).map(Path::to_path_buf).unwrap_or_default();
        (rel(&self.socket_dir), rel(&self.mount_point))
    }
}

fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() { default } else { value }
}

/// The task's `CSI_ENDPOINT` when it sets none: the host socket for a driver without a
/// chroot, else the socket under `mount_dir`. `None` for a task that is no plugin.
pub fn csi_endpoint(csi_root: &Path, alloc_id: &str, config: Option<&CsiPluginConfig>, isolated: bool) -> Option<String> {
    let config = config?;
    if isolated {
        let dir = or_default(&config.mount_dir, DEFAULT_MOUNT_DIR);
        return Some(format!("unix://{}", Path::new(dir).join(SOCKET_NAME).display()));
    }
    let paths = PluginPaths::new(csi_root, alloc_id, config).ok()?;
    Some(format!("unix://{}", paths.socket.display()))
}

/// What an isolated plugin task gets bound (Nomad's supervisor mounts): the socket dir at
/// `mount_dir` and the staging root at `stage_publish_base_dir`, both bidirectional, and
/// `/dev` (host-to-task, see the module docs). Nothing for raw_exec or a task that is no plugin.
pub fn plugin_mounts(csi_root: &Path, alloc_id: &str, config: Option<&CsiPluginConfig>, isolated: bool) -> Vec<MountConfig> {
    let Some(paths) = config.filter(|_| isolated).and_then(|c| PluginPaths::new(csi_root, alloc_id, c).ok().map(|p| (c, p))) else {
        return Vec::new();
    };
    let (config, paths) = paths;
    let bind = |host_path: PathBuf, task_path: &str, propagation| MountConfig {
        host_path,
        task_path: task_path.to_string(),
        read_only: false,
        propagation,
    };
    vec![
        bind(paths.socket_dir, or_default(&config.mount_dir, DEFAULT_MOUNT_DIR), Propagation::Bidirectional),
        bind(paths.mount_point, or_default(&config.stage_publish_base_dir, DEFAULT_STAGE_PUBLISH_BASE_DIR), Propagation::Bidirectional),
        bind(PathBuf::from("/dev"), "/dev", Propagation::HostToTask),
    ]
}

/// Serialises [`share_csi_root`]: two plugins starting at once must not stack two binds.
static SHARING: Mutex<()> = Mutex::new(());

/// Makes `csi_root` a shared mount point of its own, if it is not one yet: a bind of the
/// directory onto itself (with what is mounted under it), then marked shared. Nothing else on
/// the host changes propagation.
pub fn share_csi_root(csi_root: &Path) -> Result<(), String> {
    let _one = lock(&SHARING);
    if !is_mount_point(csi_root) {
        mount(Some(csi_root), csi_root, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
            .map_err(|e| format!("bind the CSI root {} onto itself: {e}", csi_root.display()))?;
    }
    mount(None::<&str>, csi_root, None::<&str>, MsFlags::MS_SHARED, None::<&str>)
        .map_err(|e| format!("make the CSI root {} a shared mount: {e}", csi_root.display()))
}

fn health_timeout(config: &CsiPluginConfig) -> Duration {
    if config.health_timeout > 0 { Duration::from_nanos(config.health_timeout as u64) } else { DEFAULT_HEALTH_TIMEOUT }
}

/// See the module docs.
pub struct CsiPluginSupervisorHook {
    csi_root: PathBuf,
    plugins: Arc<dyn CsiPlugins>,
    connect: Connector,
    control: Weak<dyn TaskControl>,
    supervisor: Mutex<Option<CancellationToken>>,
}

impl CsiPluginSupervisorHook {
    /// A supervisor registering with `plugins`, acting on its task through `control`.
    pub fn new(csi_root: PathBuf, plugins: Arc<dyn CsiPlugins>, connect: Connector, control: Weak<dyn TaskControl>) -> Self {
        CsiPluginSupervisorHook { csi_root, plugins, connect, control, supervisor: Mutex::new(None) }
    }
}

impl TaskHook for CsiPluginSupervisorHook {
    fn name(&self) -> &'static str {
        "csi_plugin_supervisor"
    }
    fn prestart(&self) -> Option<&dyn PrestartHook> {
        Some(self)
    }
    fn poststart(&self) -> Option<&dyn PoststartHook> {
        Some(self)
    }
    fn stop(&self) -> Option<&dyn StopHook> {
        Some(self)
    }
}

fn config_of<'a>(req: &'a HookRequest<'_>) -> Result<&'a CsiPluginConfig, HookError> {
    req.task.csi_plugin_config.as_ref().ok_or_else(|| HookError::fatal("the task has no csi_plugin block"))
}

impl PrestartHook for CsiPluginSupervisorHook {
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        let config = config_of(req)?;
        let driver = req.driver.map_or(req.task.driver.as_str(), |d| d.name());
        if !PLUGIN_DRIVERS.contains(&driver) {
            return Err(HookError::fatal(format!(
                "csi_plugin is supported for raw_exec and exec tasks: the {driver} driver cannot run a plugin that mounts volumes"
            )));
        }
        let paths = PluginPaths::new(&self.csi_root, &req.config.alloc_id, config).map_err(HookError::fatal)?;
        std::fs::create_dir_all(&self.csi_root)
            .map_err(|e| HookError::recoverable(format!("failed to create mount point: {}: {e}", self.csi_root.display())))?;
        let root = Beneath::open(&self.csi_root).map_err(|e| HookError::recoverable(format!("failed to create mount point: {e}")))?;
        let (socket_dir, mount_point) = paths.relative(&self.csi_root);
        root.create_dir_all(&mount_point, 0o700).map_err(|e| HookError::recoverable(format!("failed to create mount point: {e}")))?;
        root.create_dir_all(&socket_dir, 0o700).map_err(|e| HookError::recoverable(format!("failed to create socket mount point: {e}")))?;
        if driver != "raw_exec" {
            share_csi_root(&self.csi_root).map_err(HookError::recoverable)?;
        }
        Ok(PrestartResponse::default())
    }
}

impl PoststartHook for CsiPluginSupervisorHook {
    fn poststart(&self, req: &HookRequest<'_>) -> Result<(), HookError> {
        let config = config_of(req)?.clone();
        let paths = PluginPaths::new(&self.csi_root, &req.config.alloc_id, &config).map_err(HookError::fatal)?;
        let mut running = lock(&self.supervisor);
        if running.is_some() {
            return Ok(());
        }
        let cancel = CancellationToken::new();
        *running = Some(cancel.clone());
        let isolated = req.driver.map_or(req.task.driver.as_str(), |d| d.name()) != "raw_exec";
        let supervisor = Supervisor {
            config,
            isolated,
            alloc_id: req.config.alloc_id.clone(),
            paths,
            plugins: self.plugins.clone(),
            connect: self.connect.clone(),
            control: self.control.clone(),
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = supervisor.run() => {}
                _ = cancel.cancelled() => {}
            }
            supervisor.deregister();
        });
        Ok(())
    }
}

impl StopHook for CsiPluginSupervisorHook {
    fn stop(&self, req: &HookRequest<'_>) -> Result<(), HookError> {
        if let Some(cancel) = lock(&self.supervisor).take() {
            cancel.cancel();
        }
        let Some(config) = req.task.csi_plugin_config.as_ref() else { return Ok(()) };
        for side in PluginSide::of_type(&config.plugin_type) {
            self.plugins.deregister(*side, &config.id, &req.config.alloc_id);
        }
        let Ok(paths) = PluginPaths::new(&self.csi_root, &req.config.alloc_id, config) else { return Ok(()) };
        let (socket_dir, _) = paths.relative(&self.csi_root);
        match Beneath::open(&self.csi_root) {
            Ok(root) => {
                root.remove_tree(&socket_dir).map_err(|e| HookError::recoverable(format!("could not remove plugin socket directory: {e}")))
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(HookError::recoverable(format!("could not remove plugin socket directory: {e}"))),
        }
    }
}

/// The event `kind` with `message`.
pub fn plugin_event(kind: &str, message: String) -> TaskEvent {
    TaskEvent {
        event_type: kind.into(),
        time: Timestamp::now().unix_nanos(),
        display_message: message.clone(),
        message,
        ..TaskEvent::default()
    }
}

/// The `Killing` event of a plugin that failed its supervisor.
pub fn kill_event(health_timeout: Duration) -> TaskEvent {
    let mut e = plugin_event(
        task_event::KILLING,
        format!("CSI plugin did not become healthy before configured {} health timeout", go_duration(health_timeout)),
    );
    e.fails_task = true;
    e
}

struct Supervisor {
    config: CsiPluginConfig,
    /// The task has a file system of its own (exec, oci): it sees `stage_publish_base_dir`.
    isolated: bool,
    alloc_id: String,
    paths: PluginPaths,
    plugins: Arc<dyn CsiPlugins>,
    connect: Connector,
    control: Weak<dyn TaskControl>,
}

impl Supervisor {
    fn emit(&self, event: TaskEvent) {
        if let Some(c) = self.control.upgrade() {
            c.emit_event(event);
        }
    }

    fn kill(&self, reason: String) {
        tracing::error!(plugin = %self.config.id, alloc_id = %self.alloc_id, error = %reason, "killing task because plugin failed");
        self.emit(plugin_event(PLUGIN_UNHEALTHY, format!("Error: {reason}")));
        if let Some(c) = self.control.upgrade() {
            c.kill_failed(kill_event(health_timeout(&self.config)));
        }
    }

    fn healthy_event(&self) -> TaskEvent {
        plugin_event(PLUGIN_HEALTHY, format!("plugin: {}", self.config.id))
    }

    async fn run(&self) {
        let client = match (self.connect)(&self.paths.socket) {
            Ok(c) => c,
            Err(e) => return self.kill(format!("CSI plugin failed probe: {e}")),
        };
        let timeout = health_timeout(&self.config);
        if let Err(e) = nomad_csi::client::wait_until_ready(client.as_ref(), timeout, READY_PROBE_INTERVAL).await {
            let last = match e {
                nomad_csi::CsiError::NotReady { last, .. } => last,
                other => other.to_string(),
            };
            return self.kill(format!("CSI plugin failed probe: {last}"));
        }
        self.emit(self.healthy_event());
        if let Err(e) = self.register(client.as_ref()).await {
            return self.kill(format!("CSI plugin failed to register: {e}"));
        }
        let mut healthy = true;
        loop {
            tokio::time::sleep(PROBE_INTERVAL).await;
            let (now, err) = match client.probe().await {
                Ok(ready) => (ready, None),
                Err(e) => {
                    tracing::error!(plugin = %self.config.id, error = %e, "CSI plugin fingerprinting failed");
                    (false, Some(e))
                }
            };
            if !healthy && now {
                self.emit(self.healthy_event());
            } else if healthy && !now {
                let message = err.map_or_else(|| "Unknown Reason".to_string(), |e| format!("Error: {e}"));
                self.emit(plugin_event(PLUGIN_UNHEALTHY, message));
            }
            healthy = now;
        }
    }

    async fn register(&self, client: &dyn CsiPluginClient) -> Result<(), String> {
        let info = client.plugin_info().await.map_err(|e| format!("failed to probe plugin: {e}"))?;
        for side in PluginSide::of_type(&self.config.plugin_type) {
            self.plugins.register(PluginRegistration {
                side: *side,
                plugin_id: self.config.id.clone(),
                alloc_id: self.alloc_id.clone(),
                socket: self.paths.socket.clone(),
                provider: info.name.clone(),
                version: info.vendor_version.clone(),
                mount_point: self.paths.mount_point.clone(),
                // A raw_exec plugin has no file system of its own, so nothing is mounted at
                // `stage_publish_base_dir`: it is given the host paths of its staging root, as
                // it is given the host socket.
                container_mount_point: if self.isolated {
                    or_default(&self.config.stage_publish_base_dir, DEFAULT_STAGE_PUBLISH_BASE_DIR).to_string()
                } else {
                    self.paths.mount_point.display().to_string()
                },
            });
        }
        Ok(())
    }

    fn deregister(&self) {
        for side in PluginSide::of_type(&self.config.plugin_type) {
            self.plugins.deregister(*side, &self.config.id, &self.alloc_id);
        }
    }
}

#[cfg(test)]
mod tests;
