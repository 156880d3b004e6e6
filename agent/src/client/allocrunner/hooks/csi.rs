//! `csi`: claims, mounts and releases the group's CSI volumes (Nomad's `csi_hook.go`, 1.6).
//!
//! Runs only for a group with a `volume { type = "csi" }`.
//!
//! **Prerun**, for each CSI volume (ID = `source`, plus the alloc's `[N]` with `per_alloc`):
//! 1. at least one task must run on a driver that takes mounts (exec, oci): else
//!    `no task supports CSI`;
//! 2. restore: a volume the persisted state says is mounted, whose source is still a mount
//!    point, is kept as it is (no claim, no publish: a restarted agent changes nothing under a
//!    running task); one that is no mount point any more is claimed and mounted again;
//! 3. claim (`CSIVolume.Claim`, write, or read when `read_only`) with a backoff of 1 s doubling
//!    to 1 min (for at most 24 h) while the servers answer with one of Nomad's retryable texts
//!    (max claims reached, retryable, no servers, no leader); the alloc stopping ends the wait;
//! 4. wait for the node plugin to be healthy, then stage and publish (`CsiVolumes`);
//! 5. the mounts go to the task runners ([`CsiMounts`]: `volume_mount` binds each source at its
//!    destination, exec and oci) and the stubs into the hook's persisted state.
//!
//! **Postrun** (every task dead: stopped, failed, or before a GC) hands the release to a
//! background task, so the alloc's teardown never waits on a plugin or a server: each volume is
//! unmounted (unpublish, and unstage when no other alloc uses it); on failure the unmount is
//! retried with the same backoff; then one `CSIVolume.Unpublish` is sent with the claim
//! `{AllocationID, NodeID, Mode, AccessMode, AttachmentMode, State: unpublishing}`. Errors are
//! logged: the servers' claim GC and volume watcher finish what the client could not. The stubs
//! are then dropped from the persisted state, so a restarted agent does not release twice.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use nomad_proto::Allocation;
use nomad_proto::csi::{CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState};
use nomad_proto::rpc::{CsiVolumeClaimRequest, CsiVolumeClaimResponse, CsiVolumeUnpublishRequest};
use nomad_proto::volume::VolumeRequest;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, PostrunHook, PrerunHook, UpdateHook};
use crate::client::csi::{CsiVolumes, MountInfo, MountRequest, StagingLayout, UsageOptions, VolumeUse};
use crate::client::servers::{RpcError, Servers};
use crate::client::state::HookState;
use crate::client::taskrunner::lock;

/// First wait after a retryable claim error (and a failed unmount).
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Longest a claim (or an unmount) is retried.
pub const BACKOFF_DEADLINE: Duration = Duration::from_secs(24 * 60 * 60);
/// The key of the stubs in the hook's state.
const STUBS_KEY: &str = "volumes";
/// Deadline of one call to the servers.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The drivers whose tasks take mounts.
pub const MOUNT_DRIVERS: [&str; 2] = ["exec", "oci"];

/// The group's CSI volumes as mounted now, by volume name: what `volume_mount` binds.
pub type CsiMounts = Arc<Mutex<BTreeMap<String, MountInfo>>>;

/// Persists a hook's state outside prerun (the release done in the background).
pub type SaveState = Arc<dyn Fn(&'static str, &HookState) + Send + Sync>;

/// The `CSIVolume.*` RPCs the hook makes (a fake in tests).
pub trait CsiClaimRpc: Send + Sync {
    /// `CSIVolume.Claim`; the error carries the servers' text.
    fn claim(&self, req: CsiVolumeClaimRequest) -> BoxFuture<'static, Result<CsiVolumeClaimResponse, String>>;
    /// `CSIVolume.Unpublish`.
    fn unpublish(&self, req: CsiVolumeUnpublishRequest) -> BoxFuture<'static, Result<(), String>>;
}

/// The real RPCs, as the node with its secret.
pub struct RpcCsiClaims {
    servers: Arc<Servers>,
    secret_id: String,
}

impl RpcCsiClaims {
    /// Calls with the node's secret.
    pub fn new(servers: Arc<Servers>, secret_id: &str) -> RpcCsiClaims {
        RpcCsiClaims { servers, secret_id: secret_id.to_string() }
    }
}

fn rpc_text(e: RpcError) -> String {
    match e {
        RpcError::Status { status, .. } => status.message().to_string(),
        other => other.to_string(),
    }
}

impl CsiClaimRpc for RpcCsiClaims {
    fn claim(&self, mut req: CsiVolumeClaimRequest) -> BoxFuture<'static, Result<CsiVolumeClaimResponse, String>> {
        req.secret_id = self.secret_id.clone();
        let servers = self.servers.clone();
        Box::pin(async move { servers.csi_volume(CALL_TIMEOUT, |mut c| async move { c.claim(req).await }).await.map_err(rpc_text) })
    }

    fn unpublish(&self, mut req: CsiVolumeUnpublishRequest) -> BoxFuture<'static, Result<(), String>> {
        req.secret_id = self.secret_id.clone();
        let servers = self.servers.clone();
        Box::pin(async move {
            servers.csi_volume(CALL_TIMEOUT, |mut c| async move { c.unpublish(req).await }).await.map(drop).map_err(rpc_text)
        })
    }
}

/// Whether a claim error is one Nomad retries (`isRetryableClaimRPCError`).
pub fn is_retryable_claim_error(message: &str) -> bool {
    ["volume max claims reached", "CSI client error (retryable)", "no servers", "No cluster leader"].iter().any(|t| message.contains(t))
}

/// One volume of the alloc, as persisted (Nomad's `CSIVolumeStub`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct VolumeStub {
    /// Nomad's volume ID (with the `[N]` of `per_alloc`).
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// The provider's ID.
    #[serde(rename = "VolumeExternalID")]
    pub external_id: String,
    /// The node plugin.
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    /// The volume's namespace (the job's).
    pub namespace: String,
    /// Claimed as writer.
    pub write: bool,
    /// How it is used.
    pub usage: UsageOptions,
    /// Set once mounted.
    pub mount_info: Option<MountInfo>,
}

impl VolumeStub {
    /// The alloc's use of this volume, staged as its mount says.
    fn volume_use(&self, alloc_id: &str) -> VolumeUse {
        VolumeUse {
            plugin_id: self.plugin_id.clone(),
            namespace: self.namespace.clone(),
            volume_id: self.volume_id.clone(),
            external_id: self.external_id.clone(),
            alloc_id: alloc_id.to_string(),
            usage: self.usage.clone(),
            staging_layout: self.mount_info.as_ref().map_or(StagingLayout::Namespaced, |m| m.staging_layout),
        }
    }
}

/// See the module docs.
pub struct CsiHook {
    volumes: Arc<dyn CsiVolumes>,
    rpc: Arc<dyn CsiClaimRpc>,
    node_id: String,
    region: String,
    mounts: CsiMounts,
    /// Ends waits: the alloc stops (update), is destroyed or the agent shuts down.
    stop: CancellationToken,
    shutdown: CancellationToken,
    save: SaveState,
    /// What this process claimed or restored, by volume name.
    stubs: Mutex<BTreeMap<String, VolumeStub>>,
    destroyed: Arc<AtomicBool>,
    backoff: (Duration, Duration),
}

/// The group's CSI volume requests, by name.
fn csi_requests(alloc: &Allocation) -> BTreeMap<String, VolumeRequest> {
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return BTreeMap::new() };
    group.volumes.iter().filter(|(_, v)| v.volume_type == "csi").map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The volume ID a request claims: `source`, plus `[N]` of the alloc's name with `per_alloc`.
pub fn volume_id(request: &VolumeRequest, alloc_name: &str) -> String {
    if request.per_alloc {
        let suffix = alloc_name.rfind('[').map(|i| &alloc_name[i..]).unwrap_or("");
        format!("{}{suffix}", request.source)
    } else {
        request.source.clone()
    }
}

fn parse_mode<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> Result<T, AllocHookError> {
    serde_json::from_value(serde_json::Value::String(value.to_string()))
        .map_err(|_| AllocHookError(format!("unknown volume {what} mode: {value:?}")))
}

fn usage_of(request: &VolumeRequest) -> Result<UsageOptions, AllocHookError> {
    Ok(UsageOptions {
        read_only: request.read_only,
        attachment_mode: parse_mode::<CsiVolumeAttachmentMode>("attachment", &request.attachment_mode)?,
        access_mode: parse_mode::<CsiVolumeAccessMode>("access", &request.access_mode)?,
        mount_options: request.mount_options.clone(),
    })
}

/// The stubs of a persisted state.
pub fn stubs_of(state: Option<&HookState>) -> BTreeMap<String, VolumeStub> {
    state.and_then(|s| s.data.get(STUBS_KEY)).and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default()
}

fn state_of(stubs: &BTreeMap<String, VolumeStub>) -> HookState {
    let json = serde_json::to_string(stubs).unwrap_or_else(|_| "{}".into());
    HookState { done: false, data: BTreeMap::from([(STUBS_KEY.to_string(), json)]) }
}

/// What the hook gets from its runner.
pub struct CsiHookEnv {
    /// The node's volume manager.
    pub volumes: Arc<dyn CsiVolumes>,
    /// The claim RPCs.
    pub rpc: Arc<dyn CsiClaimRpc>,
    /// This node.
    pub node_id: String,
    /// Region of the RPCs.
    pub region: String,
    /// Shared with the task runners.
    pub mounts: CsiMounts,
    /// Cancelled when the agent shuts down or the alloc is destroyed.
    pub cancel: CancellationToken,
    /// Cancelled when the agent shuts down.
    pub shutdown: CancellationToken,
    /// Persists the hook's state.
    pub save: SaveState,
}

impl CsiHook {
    /// A hook with Nomad's backoff.
    pub fn new(env: CsiHookEnv) -> CsiHook {
        CsiHook::with_backoff(env, BACKOFF_MIN, BACKOFF_MAX)
    }

    /// A hook with another backoff (tests).
    pub fn with_backoff(env: CsiHookEnv, min: Duration, max: Duration) -> CsiHook {
        CsiHook {
            volumes: env.volumes,
            rpc: env.rpc,
            node_id: env.node_id,
            region: env.region,
            mounts: env.mounts,
            stop: env.cancel.child_token(),
            shutdown: env.shutdown,
            save: env.save,
            stubs: Mutex::new(BTreeMap::new()),
            destroyed: Arc::new(AtomicBool::new(false)),
            backoff: (min, max),
        }
    }

    fn namespace(alloc: &Allocation) -> String {
        let namespace = alloc.job.as_ref().map(|j| j.namespace.as_str()).filter(|n| !n.is_empty()).unwrap_or(&alloc.namespace);
        if namespace.is_empty() { nomad_proto::job::DEFAULT_NAMESPACE.to_string() } else { namespace.to_string() }
    }

    async fn claim_with_retry(&self, req: CsiVolumeClaimRequest) -> Result<CsiVolumeClaimResponse, String> {
        let deadline = tokio::time::Instant::now() + BACKOFF_DEADLINE;
        let mut backoff = self.backoff.0;
        loop {
            let err = match self.rpc.claim(req.clone()).await {
                Ok(r) => return Ok(r),
                Err(e) if is_retryable_claim_error(&e) => e,
                Err(e) => return Err(e),
            };
            backoff = (backoff * 2).min(self.backoff.1);
            tracing::debug!(volume_id = %req.volume_id, alloc_id = %req.allocation_id, error = %err, retry_in = ?backoff, "volume could not be claimed because it is in use");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = tokio::time::sleep_until(deadline) => return Err(err),
                _ = self.stop.cancelled() => return Err(format!("{err} (gave up: the allocation stopped)")),
            }
        }
    }

    async fn prerun_impl(&self, req: &AllocHookRequest<'_>) -> Result<Option<HookState>, AllocHookError> {
        let alloc = req.alloc;
        let requests = csi_requests(alloc);
        if requests.is_empty() {
            return Ok(None);
        }
        let group = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group));
        if !group.is_some_and(|g| g.tasks.iter().any(|t| MOUNT_DRIVERS.contains(&t.driver.as_str()))) {
            return Err(AllocHookError("no task supports CSI".into()));
        }
        let namespace = Self::namespace(alloc);
        let mut stubs = BTreeMap::new();
        for (name, request) in &requests {
            let usage = usage_of(request)?;
            stubs.insert(
                name.clone(),
                VolumeStub {
                    volume_id: volume_id(request, &alloc.name),
                    namespace: namespace.clone(),
                    write: !request.read_only,
                    usage,
                    ..VolumeStub::default()
                },
            );
        }

        // Restore what a previous run of the agent mounted and is still mounted.
        let previous = stubs_of(req.previous);
        for (name, stub) in stubs.iter_mut() {
            let Some(old) = previous.get(name).filter(|o| o.volume_id == stub.volume_id && o.usage == stub.usage) else { continue };
            let Some(info) = old.mount_info.clone().filter(|_| !old.plugin_id.is_empty()) else { continue };
            self.volumes
                .wait_for_node_plugin(&old.plugin_id, &self.stop)
                .await
                .map_err(|e| AllocHookError(format!("restoring mounts: {e}")))?;
            if self.volumes.has_mount(&info) {
                tracing::info!(alloc_id = %alloc.id, volume = %stub.volume_id, source = %info.source.display(), "CSI volume still mounted: restored");
                // A stub from before namespaced staging keeps its staging dir (see `StagingLayout`).
                self.volumes.restore_usage(&old.volume_use(&alloc.id));
                *stub = old.clone();
            } else {
                tracing::info!(alloc_id = %alloc.id, volume = %stub.volume_id, "CSI volume no longer mounted: claiming it again");
            }
        }

        // Claim what is not mounted.
        let mut publish_contexts = BTreeMap::new();
        let mut volumes = BTreeMap::new();
        for (name, stub) in stubs.iter_mut().filter(|(_, s)| s.mount_info.is_none()) {
            let claim = CsiVolumeClaimRequest {
                volume_id: stub.volume_id.clone(),
                allocation_id: alloc.id.clone(),
                node_id: self.node_id.clone(),
                claim: if stub.write { CsiVolumeClaimMode::Write } else { CsiVolumeClaimMode::Read },
                access_mode: stub.usage.access_mode,
                attachment_mode: stub.usage.attachment_mode,
                state: CsiVolumeClaimState::Taken,
                namespace: stub.namespace.clone(),
                region: self.region.clone(),
                ..CsiVolumeClaimRequest::default()
            };
            let response = self
                .claim_with_retry(claim)
                .await
                .map_err(|e| AllocHookError(format!("claiming volumes: could not claim volume {}: {e}", stub.volume_id)))?;
            let Some(volume) = response.volume else {
                return Err(AllocHookError(format!("claiming volumes: the servers returned no volume for {}", stub.volume_id)));
            };
            stub.plugin_id = volume.plugin_id.clone();
            stub.external_id = volume.remote_id().to_string();
            publish_contexts.insert(name.clone(), response.publish_context);
            volumes.insert(name.clone(), volume);
            // Claimed: postrun releases it even if the mount below fails.
            lock(&self.stubs).insert(name.clone(), stub.clone());
        }

        // Mount what was claimed.
        for (name, stub) in stubs.iter_mut().filter(|(_, s)| s.mount_info.is_none()) {
            let volume = &volumes[name];
            let err = |e: crate::client::csi::VolumeError| AllocHookError(format!("mounting volumes: volume {}: {e}", stub.volume_id));
            self.volumes.wait_for_node_plugin(&stub.plugin_id, &self.stop).await.map_err(err)?;
            let mount = MountRequest {
                plugin_id: stub.plugin_id.clone(),
                namespace: stub.namespace.clone(),
                volume_id: stub.volume_id.clone(),
                external_id: stub.external_id.clone(),
                alloc_id: alloc.id.clone(),
                usage: stub.usage.clone(),
                publish_context: publish_contexts.remove(name).unwrap_or_default(),
                secrets: volume.secrets.clone(),
                volume_context: volume.context.clone(),
                volume_mount_options: volume.mount_options.clone(),
            };
            stub.mount_info = Some(self.volumes.mount_volume(&mount).await.map_err(err)?);
            lock(&self.stubs).insert(name.clone(), stub.clone());
        }
        *lock(&self.stubs) = stubs.clone();
        *lock(&self.mounts) = stubs.iter().filter_map(|(n, s)| s.mount_info.clone().map(|m| (n.clone(), m))).collect();
        Ok(Some(state_of(&stubs)))
    }
}

impl AllocHook for CsiHook {
    fn name(&self) -> &'static str {
        "csi"
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn update(&self) -> Option<&dyn UpdateHook> {
        Some(self)
    }
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        Some(self)
    }
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        Some(self)
    }
}

impl PrerunHook for CsiHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        Box::pin(self.prerun_impl(req))
    }
}

impl UpdateHook for CsiHook {
    fn update(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        if req.alloc.server_terminal() {
            // A claim still waiting for a free volume gives up.
            self.stop.cancel();
        }
        Ok(())
    }
}

/// Everything one release needs, moved into the background task.
struct Release {
    volumes: Arc<dyn CsiVolumes>,
    rpc: Arc<dyn CsiClaimRpc>,
    node_id: String,
    region: String,
    alloc_id: String,
    shutdown: CancellationToken,
    backoff: (Duration, Duration),
}

impl Release {
    async fn unmount(&self, stub: &VolumeStub) -> Result<(), String> {
        self.volumes.unmount_volume(&stub.volume_use(&self.alloc_id)).await.map_err(|e| e.to_string())
    }

    async fn unmount_with_retry(&self, stub: &VolumeStub) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + BACKOFF_DEADLINE;
        let mut backoff = self.backoff.0;
        loop {
            backoff = (backoff * 2).min(self.backoff.1);
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = tokio::time::sleep_until(deadline) => return Err("gave up".into()),
                _ = self.shutdown.cancelled() => return Err("the agent is shutting down".into()),
            }
            match self.unmount(stub).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(alloc_id = %self.alloc_id, volume = %stub.volume_id, error = %e, retry_in = ?backoff, "volume could not be unmounted")
                }
            }
        }
    }

    async fn unpublish(&self, stub: &VolumeStub) {
        let req = CsiVolumeUnpublishRequest {
            volume_id: stub.volume_id.clone(),
            claim: Some(CsiVolumeClaim {
                allocation_id: self.alloc_id.clone(),
                node_id: self.node_id.clone(),
                external_node_id: String::new(),
                mode: if stub.write { CsiVolumeClaimMode::Write } else { CsiVolumeClaimMode::Read },
                access_mode: stub.usage.access_mode,
                attachment_mode: stub.usage.attachment_mode,
                state: CsiVolumeClaimState::Unpublishing,
            }),
            namespace: stub.namespace.clone(),
            region: self.region.clone(),
            node_id: self.node_id.clone(),
            ..CsiVolumeUnpublishRequest::default()
        };
        match self.rpc.unpublish(req).await {
            Ok(()) => tracing::info!(alloc_id = %self.alloc_id, volume = %stub.volume_id, "CSI volume unpublished"),
            Err(e) => tracing::error!(alloc_id = %self.alloc_id, volume = %stub.volume_id, error = %e, "volume could not be unpublished"),
        }
    }

    async fn release(&self, stub: &VolumeStub) {
        if stub.mount_info.is_some()
            && let Err(e) = self.unmount(stub).await
        {
            tracing::warn!(alloc_id = %self.alloc_id, volume = %stub.volume_id, error = %e, "volume could not be unmounted: retrying in the background");
            if let Err(e) = self.unmount_with_retry(stub).await {
                tracing::error!(alloc_id = %self.alloc_id, volume = %stub.volume_id, error = %e, "volume could not be unmounted");
            }
        }
        self.unpublish(stub).await;
    }
}

impl PostrunHook for CsiHook {
    fn postrun(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        let mut stubs = std::mem::take(&mut *lock(&self.stubs));
        if stubs.is_empty() {
            // Not claimed by this process: an alloc that ended while the agent was away.
            stubs = stubs_of(req.previous);
        }
        lock(&self.mounts).clear();
        if stubs.is_empty() {
            return Ok(());
        }
        let release = Release {
            volumes: self.volumes.clone(),
            rpc: self.rpc.clone(),
            node_id: self.node_id.clone(),
            region: self.region.clone(),
            alloc_id: req.alloc.id.clone(),
            shutdown: self.shutdown.clone(),
            backoff: self.backoff,
        };
        let save = self.save.clone();
        let destroyed = self.destroyed.clone();
        let name = self.name();
        tokio::spawn(async move {
            futures::future::join_all(stubs.values().map(|s| release.release(s))).await;
            if !release.shutdown.is_cancelled() && !destroyed.load(Ordering::SeqCst) {
                save(name, &state_of(&BTreeMap::new()));
            }
        });
        Ok(())
    }
}

impl DestroyHook for CsiHook {
    fn destroy(&self, _req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.destroyed.store(true, Ordering::SeqCst);
        self.stop.cancel();
        Ok(())
    }
}

/// The host path of the mount of volume `name`, if mounted.
pub fn mount_source(mounts: &CsiMounts, name: &str) -> Option<PathBuf> {
    lock(mounts).get(name).map(|m| m.source.clone())
}

#[cfg(test)]
pub(crate) mod tests;
