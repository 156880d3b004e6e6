//! The volume manager: stages and publishes CSI volumes through a node plugin, and takes them
//! down again (Nomad's `client/pluginmanager/csimanager/volume.go` and `usage_tracker.go`).
//!
//! Paths, per node plugin, under the plugin's host root `<csi root>/<type>/<plugin id>` (made
//! by the plugin supervisor):
//! - staging: `<root>/staging/<namespace>/<volume id>/<usage>`,
//! - publish target: `<root>/per-alloc/<alloc id>/<volume id>/<usage>`,
//!
//! where `<usage>` is [`UsageOptions::to_fs`] (`rw-file-system-single-node-writer`). The plugin
//! is sent the same paths under its own view of the root (`PluginRegistration::
//! container_mount_point`). Every directory is made beneath the CSI root through `fs_beneath`
//! (mode 0700, never through a symlink), and removed the same way, never across a mount point.
//! Namespaces, volume and alloc IDs must be plain names.
//!
//! Volumes are namespaced, so the staging dir is too: Nomad 1.6's `staging/<volume id>/<usage>`
//! let two namespaces' volumes with one ID collide on a node (Nomad fixed it the same way
//! later). The publish target needs no namespace: an alloc claims volumes of its own namespace
//! only. A volume staged by an agent from before the namespaced layout stays where it is
//! ([`StagingLayout::Unnamespaced`], recorded in the alloc's stub and in the usage tracker)
//! until its last user unstages it, so an upgraded agent never moves a mount under a plugin
//! that recorded its path.
//!
//! [`CsiVolumes::mount_volume`]: `NodeStageVolume` when the plugin has `STAGE_UNSTAGE_VOLUME`,
//! then `NodePublishVolume` (read-only when asked); each call has a deadline and is tried 3
//! times with backoff (the plugin client's `Timeouts`, as Nomad). The usage tracker then records
//! that the alloc uses the (volume, usage) pair.
//!
//! [`CsiVolumes::unmount_volume`]: `NodeUnpublishVolume`, then the target dir is removed; a
//! target dir already gone makes a plugin error ignorable (as Nomad). `NodeUnstageVolume` only
//! once no other alloc uses the (volume, usage) pair.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use nomad_csi::CsiPluginClient;
use nomad_csi::v1;
use nomad_proto::csi::{CsiVolumeAccessMode, CsiVolumeAttachmentMode};
use nomad_proto::volume::CsiMountOptions;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{CsiManager, PluginSide};
use crate::client::taskrunner::lock;
use crate::fs_beneath::{Beneath, FsError, check_name};

/// `StagingDirName`.
pub const STAGING_DIR: &str = "staging";
/// `AllocSpecificDirName`.
pub const PER_ALLOC_DIR: &str = "per-alloc";
/// The mode of every directory the manager makes.
const DIR_MODE: u32 = 0o700;
/// How long a mount waits for its node plugin to be registered and healthy.
pub const PLUGIN_WAIT: Duration = Duration::from_secs(5 * 60);

/// How an alloc uses a volume (Nomad's `UsageOptions`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct UsageOptions {
    /// Mounted read-only.
    pub read_only: bool,
    /// Attachment mode of the claim.
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Access mode of the claim.
    pub access_mode: CsiVolumeAccessMode,
    /// The group's `mount_options`, over the volume's.
    pub mount_options: Option<CsiMountOptions>,
}

impl UsageOptions {
    /// The usage's directory name (`ToFS`): `ro-` or `rw-`, the attachment mode, `-`, the access
    /// mode.
    pub fn to_fs(&self) -> String {
        format!("{}-{}-{}", if self.read_only { "ro" } else { "rw" }, self.attachment_mode.as_str(), self.access_mode.as_str())
    }
}

/// Which layout a volume's staging dir follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StagingLayout {
    /// `staging/<volume id>/<usage>`: Nomad 1.6's, written by agents before the namespaced
    /// layout (their stubs name no layout).
    #[serde(rename = "volume")]
    Unnamespaced,
    /// `staging/<namespace>/<volume id>/<usage>`.
    #[serde(rename = "namespace/volume")]
    Namespaced,
}

impl StagingLayout {
    /// What a stub without a layout was staged with.
    fn before_namespaces() -> StagingLayout {
        StagingLayout::Unnamespaced
    }
}

/// Where a mounted volume is on the host (Nomad's `MountInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MountInfo {
    /// The host publish target: what tasks bind at their `volume_mount.destination`.
    pub source: PathBuf,
    /// The layout of the staging dir the volume was staged at (for its unstage).
    #[serde(default = "StagingLayout::before_namespaces")]
    pub staging_layout: StagingLayout,
}

impl MountInfo {
    /// A mount at `source` staged with the namespaced layout.
    pub fn new(source: PathBuf) -> MountInfo {
        MountInfo { source, staging_layout: StagingLayout::Namespaced }
    }
}

/// A volume to mount for an alloc.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MountRequest {
    /// The node plugin.
    pub plugin_id: String,
    /// The volume's namespace (paths).
    pub namespace: String,
    /// Nomad's volume ID (paths).
    pub volume_id: String,
    /// The provider's volume ID (`RemoteID`: the external ID, else the ID): sent to the plugin.
    pub external_id: String,
    /// The alloc.
    pub alloc_id: String,
    /// How the alloc uses it.
    pub usage: UsageOptions,
    /// From the controller's publish.
    pub publish_context: BTreeMap<String, String>,
    /// The volume's secrets.
    pub secrets: BTreeMap<String, String>,
    /// The volume's context.
    pub volume_context: BTreeMap<String, String>,
    /// The volume's own mount options (the usage's win where set).
    pub volume_mount_options: Option<CsiMountOptions>,
}

/// One alloc's use of one mounted volume: what its unmount needs.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeUse {
    /// The node plugin.
    pub plugin_id: String,
    /// The volume's namespace.
    pub namespace: String,
    /// Nomad's volume ID (paths).
    pub volume_id: String,
    /// The provider's ID (sent to the plugin; empty: the same as `volume_id`).
    pub external_id: String,
    /// The alloc.
    pub alloc_id: String,
    /// How the alloc uses it.
    pub usage: UsageOptions,
    /// The layout it was staged with, when the usage tracker does not know it (a use this
    /// process never mounted nor restored).
    pub staging_layout: StagingLayout,
}

impl VolumeUse {
    fn key(&self) -> UsageKey {
        UsageKey::new(&self.plugin_id, &self.namespace, &self.volume_id, &self.usage)
    }
}

/// Why a volume operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// The node plugin is not registered here (or never became healthy).
    #[error("plugin {plugin} for type csi-node not found")]
    PluginNotFound {
        /// The plugin ID.
        plugin: String,
    },
    /// A name that becomes a directory is not a plain name.
    #[error("{what} {name:?} {reason}: it must be usable as a directory name")]
    BadName {
        /// What it names.
        what: &'static str,
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// Making or removing a directory failed.
    #[error("{0}")]
    Fs(String),
    /// The plugin refused or failed.
    #[error("{0}")]
    Plugin(String),
    /// Gave up waiting (the alloc stops, or the agent).
    #[error("{0}")]
    Cancelled(String),
}

/// What the `csi` alloc hook (and the server-requested node detach) may do with the node's
/// volumes.
pub trait CsiVolumes: Send + Sync {
    /// Waits until the node plugin is registered and healthy, at most [`PLUGIN_WAIT`], or until
    /// `cancel`.
    fn wait_for_node_plugin<'a>(&'a self, plugin_id: &'a str, cancel: &'a CancellationToken) -> BoxFuture<'a, Result<(), VolumeError>>;
    /// Stages (if the plugin stages) and publishes the volume for the alloc.
    fn mount_volume<'a>(&'a self, req: &'a MountRequest) -> BoxFuture<'a, Result<MountInfo, VolumeError>>;
    /// Unpublishes the alloc's use of the volume, and unstages it when no other alloc uses the
    /// (volume, usage) pair.
    ///
    /// This is also what a server-requested `ClientCSI.NodeDetachVolume` calls, with the
    /// request's `PluginID`, `Namespace`, `VolumeID`, `ExternalID`, `AllocID` and a usage of
    /// its `ReadOnly`, `AttachmentMode` and `AccessMode`.
    fn unmount_volume<'a>(&'a self, volume: &'a VolumeUse) -> BoxFuture<'a, Result<(), VolumeError>>;
    /// Whether a restored mount is still there: its source is a mount point.
    fn has_mount(&self, info: &MountInfo) -> bool;
    /// Records that a restored alloc still uses the (volume, usage) pair, staged with
    /// `volume.staging_layout`.
    fn restore_usage(&self, volume: &VolumeUse);
}

/// A (plugin, namespace, volume, usage) whose users are tracked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UsageKey {
    plugin_id: String,
    namespace: String,
    volume_id: String,
    usage: String,
}

impl UsageKey {
    /// The key of a volume's usage.
    pub fn new(plugin_id: &str, namespace: &str, volume_id: &str, usage: &UsageOptions) -> UsageKey {
        UsageKey { plugin_id: plugin_id.into(), namespace: namespace.into(), volume_id: volume_id.into(), usage: usage.to_fs() }
    }
}

/// The allocs using a staged volume, and where it is staged.
#[derive(Debug)]
struct Users {
    staging_layout: StagingLayout,
    allocs: BTreeSet<String>,
}

/// Which allocs use each (plugin, namespace, volume, usage), and where it is staged (Nomad's
/// `usageTracker`).
#[derive(Debug, Default)]
pub struct UsageTracker {
    users: Mutex<BTreeMap<UsageKey, Users>>,
}

impl UsageTracker {
    /// Records the alloc's use of a pair staged with `layout` (a pair already in use keeps the
    /// layout it was staged with).
    pub fn claim(&self, key: UsageKey, alloc_id: &str, layout: StagingLayout) {
        let mut users = lock(&self.users);
        let users = users.entry(key).or_insert_with(|| Users { staging_layout: layout, allocs: BTreeSet::new() });
        users.allocs.insert(alloc_id.into());
    }

    /// Where a pair in use is staged.
    pub fn staged(&self, key: &UsageKey) -> Option<StagingLayout> {
        lock(&self.users).get(key).map(|u| u.staging_layout)
    }

    /// Drops the alloc's use; true when no alloc uses the pair any more.
    pub fn free(&self, key: &UsageKey, alloc_id: &str) -> bool {
        let mut users = lock(&self.users);
        let Some(u) = users.get_mut(key) else { return true };
        u.allocs.remove(alloc_id);
        if u.allocs.is_empty() {
            users.remove(key);
            true
        } else {
            false
        }
    }
}

/// A node plugin's paths and client, as a mount needs them.
#[derive(Clone)]
pub struct NodePlugin {
    /// The plugin's client.
    pub client: Arc<dyn CsiPluginClient>,
    /// The host root, relative to the CSI root (`<type>/<plugin id>`).
    pub root: PathBuf,
    /// The root as the plugin sees it.
    pub plugin_root: PathBuf,
    /// The plugin stages volumes (`STAGE_UNSTAGE_VOLUME`).
    pub requires_staging: bool,
    /// The last fingerprint found it healthy.
    pub healthy: bool,
}

/// The directories of one (volume, usage, alloc), relative to the plugin's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePaths {
    /// `staging/<namespace>/<vol>/<usage>` (`staging/<vol>/<usage>` in the unnamespaced
    /// layout).
    pub staging: PathBuf,
    /// `per-alloc/<alloc>/<vol>/<usage>`.
    pub target: PathBuf,
}

impl VolumePaths {
    /// The paths, or why a name cannot be a directory.
    pub fn new(
        layout: StagingLayout,
        namespace: &str,
        volume_id: &str,
        alloc_id: &str,
        usage: &UsageOptions,
    ) -> Result<VolumePaths, VolumeError> {
        let bad = |what, name: &str, reason| VolumeError::BadName { what, name: name.to_string(), reason };
        if layout == StagingLayout::Namespaced {
            check_name(namespace).map_err(|r| bad("namespace", namespace, r))?;
        }
        check_name(volume_id).map_err(|r| bad("volume ID", volume_id, r))?;
        check_name(alloc_id).map_err(|r| bad("alloc ID", alloc_id, r))?;
        let usage = usage.to_fs();
        let staging = match layout {
            StagingLayout::Namespaced => Path::new(STAGING_DIR).join(namespace).join(volume_id).join(&usage),
            StagingLayout::Unnamespaced => Path::new(STAGING_DIR).join(volume_id).join(&usage),
        };
        Ok(VolumePaths { staging, target: Path::new(PER_ALLOC_DIR).join(alloc_id).join(volume_id).join(&usage) })
    }
}

fn fs_err(e: FsError) -> VolumeError {
    VolumeError::Fs(e.to_string())
}

/// The mount options of a mount: the usage's fields where set, else the volume's (`Merge`).
fn merged_mount_options(volume: Option<&CsiMountOptions>, usage: Option<&CsiMountOptions>) -> CsiMountOptions {
    let mut out = volume.cloned().unwrap_or_default();
    if let Some(u) = usage {
        if !u.fs_type.is_empty() {
            out.fs_type = u.fs_type.clone();
        }
        if !u.mount_flags.is_empty() {
            out.mount_flags = u.mount_flags.clone();
        }
    }
    out
}

/// Whether `path` is a mount point in this mount namespace (`/proc/self/mountinfo`).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(path) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    mount_points(&info).any(|m| m == path)
}

/// The mount points listed in a `mountinfo` text (field 5, octal escapes decoded).
fn mount_points(info: &str) -> impl Iterator<Item = PathBuf> + '_ {
    info.lines().filter_map(|l| l.split(' ').nth(4)).map(|m| PathBuf::from(unescape_mount(m)))
}

fn unescape_mount(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(Ok(v)) = s.get(i + 1..i + 4).map(|o| u8::from_str_radix(o, 8))
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl CsiManager {
    /// The node plugin `plugin_id` as registered now (connecting its client if need be).
    pub fn node_plugin(&self, plugin_id: &str) -> Option<NodePlugin> {
        let mut instances = lock(&self.instances);
        let i = instances.get_mut(&(PluginSide::Node, plugin_id.to_string()))?;
        if i.client.is_none() {
            i.client = (self.connect)(&i.reg.socket).ok();
        }
        let client = i.client.clone()?;
        let root = i.reg.mount_point.strip_prefix(&self.csi_root).ok()?.to_path_buf();
        let node_info = i.info.as_ref().and_then(|info| info.node_info.as_ref());
        Some(NodePlugin {
            client,
            root,
            plugin_root: PathBuf::from(&i.reg.container_mount_point),
            requires_staging: node_info.is_some_and(|n| n.requires_node_stage_volume),
            healthy: i.info.as_ref().is_some_and(|info| info.healthy),
        })
    }

    fn csi_root_dir(&self) -> Result<Beneath, VolumeError> {
        std::fs::create_dir_all(&self.csi_root).map_err(|e| VolumeError::Fs(format!("create {}: {e}", self.csi_root.display())))?;
        Beneath::open(&self.csi_root).map_err(fs_err)
    }

    async fn mount(&self, req: &MountRequest) -> Result<MountInfo, VolumeError> {
        let plugin = self.node_plugin(&req.plugin_id).ok_or_else(|| VolumeError::PluginNotFound { plugin: req.plugin_id.clone() })?;
        let key = UsageKey::new(&req.plugin_id, &req.namespace, &req.volume_id, &req.usage);
        // A pair already in use is staged again where it is (stage is idempotent there only).
        let layout = self.usage.staged(&key).unwrap_or(StagingLayout::Namespaced);
        let paths = VolumePaths::new(layout, &req.namespace, &req.volume_id, &req.alloc_id, &req.usage)?;
        let root = self.csi_root_dir()?;
        let remote_id = if req.external_id.is_empty() { req.volume_id.clone() } else { req.external_id.clone() };
        let options = merged_mount_options(req.volume_mount_options.as_ref(), req.usage.mount_options.as_ref());
        let capability = nomad_csi::capability::volume_capability(
            req.usage.attachment_mode.as_str(),
            req.usage.access_mode.as_str(),
            &options.fs_type,
            &options.mount_flags,
        )
        .map_err(VolumeError::Plugin)?;
        let to_map = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let staging_target_path = if plugin.requires_staging {
            root.create_dir_all(&plugin.root.join(&paths.staging), DIR_MODE).map_err(fs_err)?;
            let staging = plugin.plugin_root.join(&paths.staging).display().to_string();
            plugin
                .client
                .node_stage_volume(v1::NodeStageVolumeRequest {
                    volume_id: remote_id.clone(),
                    publish_context: to_map(&req.publish_context),
                    staging_target_path: staging.clone(),
                    volume_capability: Some(capability.clone()),
                    secrets: to_map(&req.secrets),
                    volume_context: to_map(&req.volume_context),
                })
                .await
                .map_err(|e| VolumeError::Plugin(format!("staging volume {:?}: {e}", req.volume_id)))?;
            staging
        } else {
            String::new()
        };
        root.create_dir_all(&plugin.root.join(&paths.target), DIR_MODE).map_err(fs_err)?;
        plugin
            .client
            .node_publish_volume(v1::NodePublishVolumeRequest {
                volume_id: remote_id,
                publish_context: to_map(&req.publish_context),
                staging_target_path,
                target_path: plugin.plugin_root.join(&paths.target).display().to_string(),
                volume_capability: Some(capability),
                readonly: req.usage.read_only,
                secrets: to_map(&req.secrets),
                volume_context: to_map(&req.volume_context),
            })
            .await
            .map_err(|e| VolumeError::Plugin(format!("publishing volume {:?}: {e}", req.volume_id)))?;
        self.usage.claim(key, &req.alloc_id, layout);
        Ok(MountInfo { source: self.csi_root.join(&plugin.root).join(&paths.target), staging_layout: layout })
    }

    async fn unmount(&self, volume: &VolumeUse) -> Result<(), VolumeError> {
        let VolumeUse { plugin_id, namespace, volume_id, external_id, alloc_id, usage, .. } = volume;
        let (plugin_id, volume_id, alloc_id) = (plugin_id.as_str(), volume_id.as_str(), alloc_id.as_str());
        let plugin = self.node_plugin(plugin_id).ok_or_else(|| VolumeError::PluginNotFound { plugin: plugin_id.to_string() })?;
        let key = volume.key();
        let layout = self.usage.staged(&key).unwrap_or(volume.staging_layout);
        let paths = VolumePaths::new(layout, namespace, volume_id, alloc_id, usage)?;
        let root = self.csi_root_dir()?;
        let remote_id = if external_id.is_empty() { volume_id } else { external_id.as_str() };
        let host_target = plugin.root.join(&paths.target);
        let rpc =
            plugin.client.node_unpublish_volume(remote_id.to_string(), plugin.plugin_root.join(&paths.target).display().to_string()).await;
        let exists = match root.stat(&host_target, crate::fs_beneath::Links::Refuse) {
            Ok(_) => true,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(fs_err(e)),
        };
        let unpublished = match (rpc, exists) {
            (Ok(()), false) => Ok(()),
            // The target is gone: whatever the plugin said, nothing is published there.
            (Err(e), false) => {
                tracing::debug!(volume_id, alloc_id, error = %e, "unpublish error ignored: the target is gone");
                Ok(())
            }
            (rpc, true) => {
                let removed = root.remove_tree(&host_target).map_err(fs_err);
                match (rpc, removed) {
                    (Ok(()), r) => r,
                    (Err(e), _) if e.is_ignorable() => Ok(()),
                    (Err(e), Ok(())) => Err(VolumeError::Plugin(format!("unpublishing volume {volume_id:?}: {e}"))),
                    (Err(e), Err(r)) => Err(VolumeError::Plugin(format!("unpublishing volume {volume_id:?}: {e}; {r}"))),
                }
            }
        };
        unpublished?;
        // The emptied per-alloc dirs (a dir still holding something stays).
        for dir in [Path::new(PER_ALLOC_DIR).join(alloc_id).join(volume_id), Path::new(PER_ALLOC_DIR).join(alloc_id)] {
            let _ = remove_empty_dir(&root, &plugin.root.join(dir));
        }
        if !self.usage.free(&key, alloc_id) || !plugin.requires_staging {
            return Ok(());
        }
        let staging = plugin.plugin_root.join(&paths.staging).display().to_string();
        match plugin.client.node_unstage_volume(remote_id.to_string(), staging).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_ignorable() => Ok(()),
            Err(e) => Err(VolumeError::Plugin(format!("unstaging volume {volume_id:?}: {e}"))),
        }
    }

    async fn wait_for_node(&self, plugin_id: &str, cancel: &CancellationToken) -> Result<(), VolumeError> {
        let mut maps = self.subscribe();
        let deadline = tokio::time::Instant::now() + self.plugin_wait;
        loop {
            if self.node_plugin(plugin_id).is_some_and(|p| p.healthy) {
                return Ok(());
            }
            tokio::select! {
                changed = maps.changed() => if changed.is_err() { return Err(VolumeError::PluginNotFound { plugin: plugin_id.to_string() }) },
                _ = tokio::time::sleep_until(deadline) => return Err(VolumeError::PluginNotFound { plugin: plugin_id.to_string() }),
                _ = cancel.cancelled() => return Err(VolumeError::Cancelled(format!("stopped waiting for CSI plugin {plugin_id:?}"))),
            }
        }
    }
}

/// Removes `rel` if it is an empty directory.
fn remove_empty_dir(root: &Beneath, rel: &Path) -> Result<(), FsError> {
    let dir = root.open_dir(rel, crate::fs_beneath::Links::Refuse)?;
    let mut empty = true;
    dir.for_each_entry(|_, _| empty = false)?;
    if empty { root.remove_tree(rel) } else { Ok(()) }
}

impl CsiVolumes for CsiManager {
    fn wait_for_node_plugin<'a>(&'a self, plugin_id: &'a str, cancel: &'a CancellationToken) -> BoxFuture<'a, Result<(), VolumeError>> {
        Box::pin(self.wait_for_node(plugin_id, cancel))
    }

    fn mount_volume<'a>(&'a self, req: &'a MountRequest) -> BoxFuture<'a, Result<MountInfo, VolumeError>> {
        Box::pin(self.mount(req))
    }

    fn unmount_volume<'a>(&'a self, volume: &'a VolumeUse) -> BoxFuture<'a, Result<(), VolumeError>> {
        Box::pin(self.unmount(volume))
    }

    fn has_mount(&self, info: &MountInfo) -> bool {
        is_mount_point(&info.source)
    }

    fn restore_usage(&self, volume: &VolumeUse) {
        self.usage.claim(volume.key(), &volume.alloc_id, volume.staging_layout);
    }
}

#[cfg(test)]
mod tests;
