//! The client's CSI manager (Nomad's `client/pluginmanager/csimanager` and the dynamic plugin
//! registry, `client/dynamicplugins`).
//!
//! A plugin task's supervisor hook registers the plugin here once it answers its probe
//! ([`CsiPlugins`]: all a hook sees), once per side: `csi-controller` and `csi-node`, both for a
//! monolith. The manager keeps one instance per (side, plugin ID); a newer alloc's registration
//! replaces an older one, and a deregistration only removes the alloc that registered. Each
//! instance is fingerprinted at once and then every [`FINGERPRINT_INTERVAL`] (Nomad's 30 s):
//! - once, until it succeeds: `GetPluginCapabilities` (`RequiresControllerPlugin`,
//!   `RequiresTopologies`) and, for the node side, `NodeGetInfo` (the plugin's node ID, max
//!   volumes, topology);
//! - every time: `Probe` (`Healthy`), then `ControllerGetCapabilities` or `NodeGetCapabilities`.
//!
//! A failure leaves the instance in the maps, unhealthy, with Nomad's `HealthDescription`. The
//! maps (`Node.CSIControllerPlugins`, `Node.CSINodePlugins`) are published on a watch channel
//! whenever they change; the client puts them on its node and registers it again, which is how
//! the servers' plugin table learns of healthy and unhealthy instances and of those gone.
//! `UpdateTime` is the time an instance last changed, so a steady plugin causes no register.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nomad_csi::CsiPluginClient;
use nomad_proto::Timestamp;
use nomad_proto::csi::{CsiControllerInfo, CsiInfo, CsiNodeInfo, CsiTopology};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::taskrunner::lock;

/// How often every instance is fingerprinted (Nomad's `managerFingerprintInterval`).
pub const FINGERPRINT_INTERVAL: Duration = Duration::from_secs(30);

/// Which side of a plugin an instance serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginSide {
    /// The controller service (`csi-controller`).
    Controller,
    /// The node service (`csi-node`).
    Node,
}

impl PluginSide {
    /// Nomad's dynamic plugin type.
    pub fn registry_type(self) -> &'static str {
        match self {
            PluginSide::Controller => "csi-controller",
            PluginSide::Node => "csi-node",
        }
    }

    /// The sides a `csi_plugin { type }` serves.
    pub fn of_type(plugin_type: &str) -> &'static [PluginSide] {
        match plugin_type {
            "controller" => &[PluginSide::Controller],
            "node" => &[PluginSide::Node],
            "monolith" => &[PluginSide::Controller, PluginSide::Node],
            _ => &[],
        }
    }
}

/// A plugin a supervisor found ready (Nomad's `dynamicplugins.PluginInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginRegistration {
    /// The side.
    pub side: PluginSide,
    /// `csi_plugin { id }`.
    pub plugin_id: String,
    /// The alloc running it.
    pub alloc_id: String,
    /// The host path of its socket.
    pub socket: PathBuf,
    /// Vendor name (`GetPluginInfo`).
    pub provider: String,
    /// Vendor version.
    pub version: String,
    /// The host dir for its staging and per-alloc mounts.
    pub mount_point: PathBuf,
    /// The same dir as the plugin sees it (`stage_publish_base_dir`).
    pub container_mount_point: String,
}

/// What a plugin supervisor hook may do with the manager.
pub trait CsiPlugins: Send + Sync {
    /// Adds (or replaces) the instance of `reg.side`/`reg.plugin_id`.
    fn register(&self, reg: PluginRegistration);
    /// Removes the instance, if `alloc_id` still owns it.
    fn deregister(&self, side: PluginSide, plugin_id: &str, alloc_id: &str);
}

/// Makes the client for a plugin's socket (a fake in tests).
pub type Connector = Arc<dyn Fn(&Path) -> Result<Arc<dyn CsiPluginClient>, String> + Send + Sync>;

/// The gRPC client over the socket.
pub fn grpc_connector() -> Connector {
    Arc::new(|socket: &Path| {
        nomad_csi::GrpcPluginClient::new(socket).map(|c| Arc::new(c) as Arc<dyn CsiPluginClient>).map_err(|e| e.to_string())
    })
}

/// The node's two maps: controllers, nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsiMaps {
    /// `Node.CSIControllerPlugins`.
    pub controllers: BTreeMap<String, CsiInfo>,
    /// `Node.CSINodePlugins`.
    pub nodes: BTreeMap<String, CsiInfo>,
}

struct Instance {
    reg: PluginRegistration,
    client: Option<Arc<dyn CsiPluginClient>>,
    /// The once-only part, after it succeeded.
    basic: Option<CsiInfo>,
    /// The last fingerprint; `None` until the first.
    info: Option<CsiInfo>,
    due: Instant,
}

/// See the module docs.
pub struct CsiManager {
    instances: Mutex<BTreeMap<(PluginSide, String), Instance>>,
    wake: Notify,
    interval: Duration,
    connect: Connector,
    maps: watch::Sender<CsiMaps>,
    /// `<state_dir>/csi`: every plugin's root is beneath it.
    csi_root: PathBuf,
    /// Which allocs use which staged volumes.
    usage: volume::UsageTracker,
    /// How long a mount waits for its node plugin.
    plugin_wait: Duration,
}

impl CsiManager {
    /// A manager fingerprinting every `interval` through clients from `connect`, with plugin
    /// roots beneath `csi_root`.
    pub fn new(interval: Duration, connect: Connector, csi_root: PathBuf) -> Arc<CsiManager> {
        CsiManager::with_plugin_wait(interval, connect, csi_root, volume::PLUGIN_WAIT)
    }

    /// The same, waiting at most `plugin_wait` for a node plugin before a mount (tests).
    pub fn with_plugin_wait(interval: Duration, connect: Connector, csi_root: PathBuf, plugin_wait: Duration) -> Arc<CsiManager> {
        Arc::new(CsiManager {
            instances: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            interval,
            connect,
            maps: watch::channel(CsiMaps::default()).0,
            csi_root,
            usage: volume::UsageTracker::default(),
            plugin_wait,
        })
    }

    /// The client of the registered instance of `side`/`plugin_id` (connected on first use), or
    /// why there is none.
    pub fn plugin_client(&self, side: PluginSide, plugin_id: &str) -> Result<Arc<dyn CsiPluginClient>, String> {
        let mut instances = lock(&self.instances);
        let Some(i) = instances.get_mut(&(side, plugin_id.to_string())) else {
            return Err(format!("{} plugin {plugin_id:?} is not running on this client", side.registry_type()));
        };
        match &i.client {
            Some(c) => Ok(c.clone()),
            None => {
                let c = (self.connect)(&i.reg.socket)?;
                i.client = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// The node's maps, as they change.
    pub fn subscribe(&self) -> watch::Receiver<CsiMaps> {
        self.maps.subscribe()
    }

    /// Fingerprints due instances until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let next = self.fingerprint_due().await;
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.wake.notified() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Fingerprints every instance that is due, publishes the maps, and returns when the next
    /// one is due.
    pub async fn fingerprint_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let due: Vec<_> = {
            let mut instances = lock(&self.instances);
            instances
                .iter_mut()
                .filter(|(_, i)| i.due <= now)
                .map(|(key, i)| {
                    if i.client.is_none() {
                        i.client = (self.connect)(&i.reg.socket)
                            .inspect_err(|e| tracing::warn!(plugin = %i.reg.plugin_id, error = %e, "connecting to the CSI plugin failed"))
                            .ok();
                    }
                    (key.clone(), i.reg.clone(), i.client.clone(), i.basic.clone())
                })
                .collect()
        };
        let results = futures::future::join_all(due.into_iter().map(|(key, reg, client, basic)| async move {
            let (basic, info) = match client {
                Some(c) => fingerprint(c.as_ref(), &reg, basic).await,
                None => (None, unreachable_info(&reg)),
            };
            (key, reg.alloc_id, basic, info)
        }))
        .await;
        let mut instances = lock(&self.instances);
        for (key, alloc_id, basic, mut info) in results {
            // Replaced or removed meanwhile: this result is of no one.
            let Some(i) = instances.get_mut(&key).filter(|i| i.reg.alloc_id == alloc_id) else { continue };
            info.update_time = match &i.info {
                Some(old) if same_ignoring_time(old, &info) => old.update_time,
                _ => Timestamp::now(),
            };
            i.basic = basic;
            i.info = Some(info);
            i.due = Instant::now() + self.interval;
        }
        self.publish(&instances);
        instances.values().map(|i| i.due).min()
    }

    fn publish(&self, instances: &BTreeMap<(PluginSide, String), Instance>) {
        let mut maps = CsiMaps::default();
        for ((side, id), i) in instances {
            let Some(info) = &i.info else { continue };
            let map = match side {
                PluginSide::Controller => &mut maps.controllers,
                PluginSide::Node => &mut maps.nodes,
            };
            map.insert(id.clone(), info.clone());
        }
        self.maps.send_if_modified(|current| {
            let changed = *current != maps;
            if changed {
                *current = maps;
            }
            changed
        });
    }
}

impl CsiPlugins for CsiManager {
    fn register(&self, reg: PluginRegistration) {
        tracing::info!(plugin = %reg.plugin_id, side = reg.side.registry_type(), alloc_id = %reg.alloc_id, "CSI plugin registered");
        let key = (reg.side, reg.plugin_id.clone());
        lock(&self.instances).insert(key, Instance { reg, client: None, basic: None, info: None, due: Instant::now() });
        self.wake.notify_one();
    }

    fn deregister(&self, side: PluginSide, plugin_id: &str, alloc_id: &str) {
        let mut instances = lock(&self.instances);
        let key = (side, plugin_id.to_string());
        if instances.get(&key).is_some_and(|i| i.reg.alloc_id == alloc_id) {
            instances.remove(&key);
            tracing::info!(plugin = %plugin_id, side = side.registry_type(), alloc_id, "CSI plugin deregistered");
            self.publish(&instances);
        }
    }
}

fn same_ignoring_time(a: &CsiInfo, b: &CsiInfo) -> bool {
    CsiInfo { update_time: Timestamp::ZERO, ..a.clone() } == CsiInfo { update_time: Timestamp::ZERO, ..b.clone() }
}

/// What Nomad's basic fingerprint starts from.
fn base_info(reg: &PluginRegistration) -> CsiInfo {
    CsiInfo {
        plugin_id: reg.plugin_id.clone(),
        alloc_id: reg.alloc_id.clone(),
        provider: reg.provider.clone(),
        provider_version: reg.version.clone(),
        healthy: false,
        health_description: "initial fingerprint not completed".into(),
        controller_info: (reg.side == PluginSide::Controller).then(CsiControllerInfo::default),
        node_info: (reg.side == PluginSide::Node).then(CsiNodeInfo::default),
        ..CsiInfo::default()
    }
}

fn unreachable_info(reg: &PluginRegistration) -> CsiInfo {
    CsiInfo {
        health_description: format!("failed initial fingerprint with err: no client for socket {}", reg.socket.display()),
        ..base_info(reg)
    }
}

/// One fingerprint of one instance, as Nomad's `pluginFingerprinter.fingerprint`: the basic part
/// (kept once it succeeded) and the whole info.
pub async fn fingerprint(client: &dyn CsiPluginClient, reg: &PluginRegistration, basic: Option<CsiInfo>) -> (Option<CsiInfo>, CsiInfo) {
    let basic = match basic {
        Some(b) => b,
        None => match basic_fingerprint(client, reg).await {
            Ok(b) => b,
            Err((mut info, e)) => {
                info.healthy = false;
                info.health_description = format!("failed initial fingerprint with err: {e}");
                return (None, info);
            }
        },
    };
    let info = match side_fingerprint(client, reg.side, basic.clone()).await {
        Ok(info) => info,
        Err(e) => CsiInfo { healthy: false, health_description: format!("failed fingerprinting with error: {e}"), ..basic.clone() },
    };
    (Some(basic), info)
}

async fn basic_fingerprint(client: &dyn CsiPluginClient, reg: &PluginRegistration) -> Result<CsiInfo, (CsiInfo, nomad_csi::CsiError)> {
    let mut info = base_info(reg);
    let caps = match client.plugin_capabilities().await {
        Ok(c) => c,
        Err(e) => return Err((info, e)),
    };
    info.requires_controller_plugin = caps.controller_service;
    info.requires_topologies = caps.accessibility_constraints;
    if reg.side == PluginSide::Node {
        let node = match client.node_info().await {
            Ok(n) => n,
            Err(e) => return Err((info, e)),
        };
        let n = info.node_info.get_or_insert_with(CsiNodeInfo::default);
        n.id = node.node_id;
        n.max_volumes = node.max_volumes;
        n.accessible_topology = node.accessible_topology.map(|t| CsiTopology { segments: t.into_iter().collect() });
    }
    Ok(info)
}

async fn side_fingerprint(client: &dyn CsiPluginClient, side: PluginSide, base: CsiInfo) -> Result<CsiInfo, nomad_csi::CsiError> {
    let healthy = client.probe().await?;
    let mut info = base;
    info.healthy = healthy;
    info.health_description = if healthy { "healthy" } else { "unhealthy" }.into();
    match side {
        PluginSide::Controller => {
            let c = client.controller_capabilities().await?;
            info.controller_info = Some(CsiControllerInfo {
                supports_create_delete: c.create_delete_volume,
                supports_attach_detach: c.publish_unpublish_volume,
                supports_list_volumes: c.list_volumes,
                supports_get_capacity: c.get_capacity,
                supports_create_delete_snapshot: c.create_delete_snapshot,
                supports_list_snapshots: c.list_snapshots,
                supports_clone: c.clone_volume,
                supports_read_only_attach: c.publish_readonly,
                supports_expand: c.expand_volume,
                supports_list_volumes_attached_nodes: c.list_volumes_published_nodes,
                supports_condition: c.volume_condition,
                supports_get: c.get_volume,
            });
        }
        PluginSide::Node => {
            let c = client.node_capabilities().await?;
            let n = info.node_info.get_or_insert_with(CsiNodeInfo::default);
            n.requires_node_stage_volume = c.stage_unstage_volume;
            n.supports_stats = c.get_volume_stats;
            n.supports_expand = c.expand_volume;
            n.supports_condition = c.volume_condition;
        }
    }
    Ok(info)
}

pub mod endpoint;
pub mod volume;

pub use volume::{CsiVolumes, MountInfo, MountRequest, StagingLayout, UsageOptions, VolumeError, VolumeUse};

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
