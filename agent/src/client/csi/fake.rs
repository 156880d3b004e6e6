//! A fake CSI plugin for the client's tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use nomad_csi::client::{ControllerCapabilities, NodeCapabilities, NodeInfo, PluginCapabilities, PluginInfo};
use nomad_csi::{CsiError, CsiPluginClient, v1};

/// A plugin whose answers the test sets; `probe_fails` switches its health.
#[derive(Default)]
pub(crate) struct FakePlugin {
    pub(crate) probe_fails: AtomicBool,
    pub(crate) caps_fail: AtomicBool,
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
        ok(NodeCapabilities { stage_unstage_volume: true, get_volume_stats: false, expand_volume: true, volume_condition: false })
    }
    fn node_stage_volume(&self, _: v1::NodeStageVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("NodeStageVolume")
    }
    fn node_unstage_volume(&self, _: String, _: String) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("NodeUnstageVolume")
    }
    fn node_publish_volume(&self, _: v1::NodePublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("NodePublishVolume")
    }
    fn node_unpublish_volume(&self, _: String, _: String) -> BoxFuture<'_, Result<(), CsiError>> {
        fail("NodeUnpublishVolume")
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
