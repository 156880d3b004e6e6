//! A fake CSI plugin for the client's tests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use futures::future::BoxFuture;
use nomad_csi::client::{ControllerCapabilities, NodeCapabilities, NodeInfo, PluginCapabilities, PluginInfo};
use nomad_csi::{CsiError, CsiPluginClient, v1};

/// A plugin whose answers the test sets; `probe_fails` switches its health. Node volume calls
/// succeed and are recorded (`calls`: method, volume ID, path(s), readonly), except while
/// `node_fails` counts down.
#[derive(Default)]
pub(crate) struct FakePlugin {
    pub(crate) probe_fails: AtomicBool,
    pub(crate) caps_fail: AtomicBool,
    /// `NodeGetCapabilities` without STAGE_UNSTAGE_VOLUME.
    pub(crate) no_staging: AtomicBool,
    /// The next this many node volume calls fail (UNAVAILABLE).
    pub(crate) node_fails: AtomicU32,
    pub(crate) calls: Mutex<Vec<String>>,
}

impl FakePlugin {
    fn node_call(&self, method: &'static str, what: String) -> BoxFuture<'_, Result<(), CsiError>> {
        if self.node_fails.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return fail(method);
        }
        self.calls.lock().unwrap().push(format!("{method} {what}"));
        ok(())
    }

    /// The calls recorded so far.
    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

fn unavailable(method: &'static str) -> CsiError {
    CsiError::Status { method, code: tonic::Code::Unavailable, message: format!("{method}: connection refused"), ignorable: false }
}

fn ok<T: Send + 'static>(v: T) -> BoxFuture<'static, Result<T, CsiError>> {
    Box::pin(async move { Ok(v) })
}

fn fail<T: Send + 'static>(method: &'static str) -> BoxFuture<'static, Result<T, CsiError>> {
    Box::pin(async move { Err(unavailable(method)) })
}

impl CsiPluginClient for FakePlugin {
    fn probe(&self) -> BoxFuture<'_, Result<bool, CsiError>> {
        if self.probe_fails.load(Ordering::SeqCst) { fail("/csi.v1.Identity/Probe") } else { ok(true) }
    }
    fn plugin_info(&self) -> BoxFuture<'_, Result<PluginInfo, CsiError>> {
        ok(PluginInfo { name: "hostpath.csi.k8s.io".into(), vendor_version: "1.0.0".into() })
    }
    fn plugin_capabilities(&self) -> BoxFuture<'_, Result<PluginCapabilities, CsiError>> {
        if self.caps_fail.load(Ordering::SeqCst) {
            return fail("/csi.v1.Identity/GetPluginCapabilities");
        }
        ok(PluginCapabilities { controller_service: true, accessibility_constraints: true })
    }
    fn node_info(&self) -> BoxFuture<'_, Result<NodeInfo, CsiError>> {
        ok(NodeInfo {
            node_id: "host-1".into(),
            max_volumes: 7,
            accessible_topology: Some(HashMap::from([("rack".to_string(), "r1".to_string())])),
        })
    }
    fn node_capabilities(&self) -> BoxFuture<'_, Result<NodeCapabilities, CsiError>> {
        let stage_unstage_volume = !self.no_staging.load(Ordering::SeqCst);
        ok(NodeCapabilities { stage_unstage_volume, get_volume_stats: false, expand_volume: true, volume_condition: false })
    }
    fn node_stage_volume(&self, r: v1::NodeStageVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        self.node_call("NodeStageVolume", format!("{} {}", r.volume_id, r.staging_target_path))
    }
    fn node_unstage_volume(&self, id: String, path: String) -> BoxFuture<'_, Result<(), CsiError>> {
        self.node_call("NodeUnstageVolume", format!("{id} {path}"))
    }
    fn node_publish_volume(&self, r: v1::NodePublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        let staging = if r.staging_target_path.is_empty() { "-".to_string() } else { r.staging_target_path.clone() };
        self.node_call("NodePublishVolume", format!("{} {staging} {} readonly={}", r.volume_id, r.target_path, r.readonly))
    }
    fn node_unpublish_volume(&self, id: String, path: String) -> BoxFuture<'_, Result<(), CsiError>> {
        self.node_call("NodeUnpublishVolume", format!("{id} {path}"))
    }
    fn controller_capabilities(&self) -> BoxFuture<'_, Result<ControllerCapabilities, CsiError>> {
        ok(ControllerCapabilities { create_delete_volume: true, publish_unpublish_volume: true, list_volumes: true, ..Default::default() })
    }
    fn controller_publish_volume(&self, _: v1::ControllerPublishVolumeRequest) -> BoxFuture<'_, Result<HashMap<String, String>, CsiError>> {
        fail("ControllerPublishVolume")
    }
    fn controller_unpublish_volume(&self, _: v1::ControllerUnpublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("ControllerUnpublishVolume")
    }
    fn create_volume(&self, _: v1::CreateVolumeRequest) -> BoxFuture<'_, Result<v1::Volume, CsiError>> {
        fail("CreateVolume")
    }
    fn delete_volume(&self, _: v1::DeleteVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("DeleteVolume")
    }
    fn validate_volume_capabilities(&self, _: v1::ValidateVolumeCapabilitiesRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("ValidateVolumeCapabilities")
    }
}
