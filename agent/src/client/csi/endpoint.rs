//! The client's answers to the servers' CSI calls (Nomad's `client/csi_endpoint.go`): the
//! controller calls go to the local controller plugin instance through the CSI manager, the
//! node detach to the client's volume manager ([`NodeDetach`]).
//!
//! As in Nomad: each plugin call has 2 min in all ([`CSI_PLUGIN_REQUEST_TIMEOUT`]; the plugin
//! client tries a call up to 3 times within it); a controller plugin not running here is a
//! retryable error (`CSI client error (retryable)`), so the server asks another node; a
//! `ControllerUnpublishVolume` or `DeleteVolume` that finds nothing (`NOT_FOUND`) succeeded
//! already. Errors are Nomad's texts, prefixed with the client RPC.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use nomad_csi::capability::volume_capability;
use nomad_csi::{CsiError, CsiPluginClient, v1};
use nomad_proto::csi::{CsiTopology, CsiTopologyRequest, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability};
use nomad_proto::job::DEFAULT_NAMESPACE;
use nomad_proto::rpc::client_csi::{
    ClientCsiControllerAttachRequest, ClientCsiControllerAttachResponse, ClientCsiControllerCreateRequest,
    ClientCsiControllerCreateResponse, ClientCsiControllerDeleteRequest, ClientCsiControllerDetachRequest,
    ClientCsiControllerValidateVolumeRequest, ClientCsiNodeDetachRequest,
};
use nomad_proto::volume::CsiMountOptions;
use nomad_server::client_conn::methods;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CsiManager, PluginSide};

/// Nomad's `CSIPluginRequestTimeout`: the whole of one plugin call, retries included.
pub const CSI_PLUGIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Nomad's `ErrCSIClientRPCRetryable`.
pub const RETRYABLE: &str = "CSI client error (retryable)";

/// The client's volume manager, as far as the servers reach it: unmount and unstage one
/// alloc's volume (`CSI.NodeDetachVolume`, Nomad's `mounter.UnmountVolume`).
pub trait NodeDetach: Send + Sync {
    /// Unpublishes (and, when nothing else on the node uses it, unstages) the volume.
    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), String>>;
}

/// Where the client has no volume manager: every node detach says so.
pub struct NoVolumeManager;

impl NodeDetach for NoVolumeManager {
    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), String>> {
        let message = format!(
            "CSI.NodeDetachVolume: this client has no CSI volume manager, so it cannot unmount volume {:?} of alloc {}",
            req.volume_id, req.alloc_id
        );
        Box::pin(async move { Err(message) })
    }
}

/// The volume manager as the servers reach it: a node detach is the alloc's unmount, with the
/// usage the claim was mounted with (so the same target and staging dirs are found).
pub struct VolumeManagerDetach(pub Arc<dyn super::CsiVolumes>);

impl NodeDetach for VolumeManagerDetach {
    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let usage = super::UsageOptions {
                read_only: req.read_only,
                attachment_mode: req.attachment_mode,
                access_mode: req.access_mode,
                mount_options: None,
            };
            // Servers before namespaced staging send no namespace: their volumes are "default"'s.
            let namespace = if req.namespace.is_empty() { DEFAULT_NAMESPACE.to_string() } else { req.namespace };
            let volume = super::VolumeUse {
                plugin_id: req.plugin_id,
                namespace,
                volume_id: req.volume_id,
                external_id: req.external_id,
                alloc_id: req.alloc_id,
                usage,
                // Where this process staged or restored the pair, else the layout of this agent.
                staging_layout: super::StagingLayout::Namespaced,
            };
            self.0.unmount_volume(&volume).await.map_err(|e| format!("CSI.NodeDetachVolume: {e}"))
        })
    }
}

/// The local controller plugins, by ID (the CSI manager; a map in tests).
pub trait ControllerPlugins: Send + Sync {
    /// The client of the controller instance of `plugin_id`, or why there is none.
    fn controller(&self, plugin_id: &str) -> Result<Arc<dyn CsiPluginClient>, String>;
}

impl ControllerPlugins for CsiManager {
    fn controller(&self, plugin_id: &str) -> Result<Arc<dyn CsiPluginClient>, String> {
        self.plugin_client(PluginSide::Controller, plugin_id)
    }
}

/// Answers the servers' `CSI.*` calls.
pub struct CsiEndpoint {
    controllers: Arc<dyn ControllerPlugins>,
    node_detach: Arc<dyn NodeDetach>,
    timeout: Duration,
}

fn decode<T: DeserializeOwned>(method: &str, body: serde_json::Value) -> Result<T, String> {
    serde_json::from_value(body).map_err(|e| format!("{method}: decoding the request: {e}"))
}

fn encode<T: Serialize>(method: &str, value: &T) -> Result<serde_json::Value, String> {
    serde_json::to_value(value).map_err(|e| format!("{method}: encoding the reply: {e}"))
}

fn require(method: &str, present: bool, what: &str) -> Result<(), String> {
    if present { Ok(()) } else { Err(format!("{method}: {what} is required")) }
}

fn hash(map: BTreeMap<String, String>) -> std::collections::HashMap<String, String> {
    map.into_iter().collect()
}

fn capability(
    attachment: CsiVolumeAttachmentMode,
    access: CsiVolumeAccessMode,
    mount: Option<&CsiMountOptions>,
) -> Result<v1::VolumeCapability, String> {
    let (fs_type, flags) = mount.map(|m| (m.fs_type.as_str(), m.mount_flags.as_slice())).unwrap_or(("", &[]));
    volume_capability(attachment.as_str(), access.as_str(), fs_type, flags)
}

/// Every capability of a request, with the request's mount options.
fn capabilities(method: &str, caps: &[CsiVolumeCapability], mount: Option<&CsiMountOptions>) -> Result<Vec<v1::VolumeCapability>, String> {
    caps.iter()
        .map(|c| capability(c.attachment_mode, c.access_mode, mount))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{method}: {e}"))
}

fn topologies(t: &[CsiTopology]) -> Vec<v1::Topology> {
    t.iter().map(|t| v1::Topology { segments: t.segments.clone().into_iter().collect() }).collect()
}

fn requirement(r: Option<&CsiTopologyRequest>) -> Option<v1::TopologyRequirement> {
    r.map(|r| v1::TopologyRequirement { requisite: topologies(&r.required), preferred: topologies(&r.preferred) })
}

impl CsiEndpoint {
    /// Controller calls through `controllers`, node detach through `node_detach`.
    pub fn new(controllers: Arc<dyn ControllerPlugins>, node_detach: Arc<dyn NodeDetach>) -> CsiEndpoint {
        CsiEndpoint { controllers, node_detach, timeout: CSI_PLUGIN_REQUEST_TIMEOUT }
    }

    /// With another budget per plugin call (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> CsiEndpoint {
        self.timeout = timeout;
        self
    }

    /// Whether `method` is one of these calls.
    pub fn serves(method: &str) -> bool {
        [
            methods::CONTROLLER_ATTACH,
            methods::CONTROLLER_DETACH,
            methods::CONTROLLER_CREATE,
            methods::CONTROLLER_DELETE,
            methods::CONTROLLER_VALIDATE,
            methods::NODE_DETACH,
        ]
        .contains(&method)
    }

    /// Answers one call: the method's response as JSON, or Nomad's error text.
    pub async fn handle(&self, method: &str, body: serde_json::Value) -> Result<serde_json::Value, String> {
        match method {
            methods::CONTROLLER_ATTACH => encode(method, &self.controller_attach(decode(method, body)?).await?),
            methods::CONTROLLER_DETACH => {
                self.controller_detach(decode(method, body)?).await?;
                Ok(serde_json::json!({}))
            }
            methods::CONTROLLER_CREATE => encode(method, &self.controller_create(decode(method, body)?).await?),
            methods::CONTROLLER_DELETE => {
                self.controller_delete(decode(method, body)?).await?;
                Ok(serde_json::json!({}))
            }
            methods::CONTROLLER_VALIDATE => {
                self.controller_validate(decode(method, body)?).await?;
                Ok(serde_json::json!({}))
            }
            methods::NODE_DETACH => {
                let req: ClientCsiNodeDetachRequest = decode(method, body)?;
                require(method, !req.plugin_id.is_empty(), "PluginID")?;
                require(method, !req.volume_id.is_empty(), "VolumeID")?;
                require(method, !req.alloc_id.is_empty(), "AllocID")?;
                self.node_detach.node_detach(req).await?;
                Ok(serde_json::json!({}))
            }
            other => Err(format!("unknown client rpc {other:?}")),
        }
    }

    fn plugin(&self, method: &str, plugin_id: &str) -> Result<Arc<dyn CsiPluginClient>, String> {
        self.controllers.controller(plugin_id).map_err(|e| format!("{method}: {RETRYABLE}: {e}"))
    }

    /// Runs one plugin call within the budget: the plugin's answer, or the timeout's text.
    async fn within<T>(&self, method: &str, call: BoxFuture<'_, Result<T, CsiError>>) -> Result<Result<T, CsiError>, String> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| format!("{method}: the plugin did not answer within {}s", self.timeout.as_secs()))
    }

    async fn controller_attach(&self, req: ClientCsiControllerAttachRequest) -> Result<ClientCsiControllerAttachResponse, String> {
        let method = methods::CONTROLLER_ATTACH;
        let plugin = self.plugin(method, &req.controller.plugin_id)?;
        require(method, !req.volume_id.is_empty(), "VolumeID")?;
        require(method, !req.client_csi_node_id.is_empty(), "ClientCSINodeID")?;
        let cap = capability(req.attachment_mode, req.access_mode, req.mount_options.as_ref()).map_err(|e| format!("{method}: {e}"))?;
        let csi = v1::ControllerPublishVolumeRequest {
            volume_id: req.volume_id,
            node_id: req.client_csi_node_id,
            volume_capability: Some(cap),
            readonly: req.read_only,
            secrets: hash(req.secrets),
            volume_context: hash(req.volume_context),
        };
        let publish_context = self.within(method, plugin.controller_publish_volume(csi)).await?.map_err(|e| format!("{method}: {e}"))?;
        Ok(ClientCsiControllerAttachResponse { publish_context: publish_context.into_iter().collect() })
    }

    async fn controller_detach(&self, req: ClientCsiControllerDetachRequest) -> Result<(), String> {
        let method = methods::CONTROLLER_DETACH;
        let plugin = self.plugin(method, &req.controller.plugin_id)?;
        require(method, !req.volume_id.is_empty(), "VolumeID")?;
        require(method, !req.client_csi_node_id.is_empty(), "ClientCSINodeID")?;
        let csi =
            v1::ControllerUnpublishVolumeRequest { volume_id: req.volume_id, node_id: req.client_csi_node_id, secrets: hash(req.secrets) };
        match self.within(method, plugin.controller_unpublish_volume(csi)).await? {
            Ok(()) => Ok(()),
            // Already unpublished: what was asked is done.
            Err(e) if e.is_ignorable() => {
                tracing::debug!(error = %e, "could not unpublish volume");
                Ok(())
            }
            Err(e) => Err(format!("{method}: {e}")),
        }
    }

    async fn controller_create(&self, req: ClientCsiControllerCreateRequest) -> Result<ClientCsiControllerCreateResponse, String> {
        let method = methods::CONTROLLER_CREATE;
        let plugin = self.plugin(method, &req.controller.plugin_id)?;
        let caps = capabilities(method, &req.volume_capabilities, req.mount_options.as_ref())?;
        let source = if !req.snapshot_id.is_empty() {
            if !req.clone_id.is_empty() {
                return Err(format!("{method}: one of SnapshotID or CloneID must be set if ContentSource is set"));
            }
            Some(v1::volume_content_source::Type::Snapshot(v1::volume_content_source::SnapshotSource { snapshot_id: req.snapshot_id }))
        } else if !req.clone_id.is_empty() {
            Some(v1::volume_content_source::Type::Volume(v1::volume_content_source::VolumeSource { volume_id: req.clone_id }))
        } else {
            None
        };
        let capacity = (req.capacity_min != 0 || req.capacity_max != 0)
            .then_some(v1::CapacityRange { required_bytes: req.capacity_min, limit_bytes: req.capacity_max });
        let csi = v1::CreateVolumeRequest {
            name: req.name,
            capacity_range: capacity,
            volume_capabilities: caps,
            parameters: hash(req.parameters),
            secrets: hash(req.secrets),
            volume_content_source: source.map(|t| v1::VolumeContentSource { r#type: Some(t) }),
            accessibility_requirements: requirement(req.requested_topologies.as_ref()),
        };
        let volume = self.within(method, plugin.create_volume(csi)).await?.map_err(|e| format!("{method}: {e}"))?;
        Ok(ClientCsiControllerCreateResponse {
            external_volume_id: volume.volume_id,
            capacity_bytes: volume.capacity_bytes,
            volume_context: volume.volume_context.into_iter().collect(),
            topologies: volume
                .accessible_topology
                .into_iter()
                .map(|t| CsiTopology { segments: t.segments.into_iter().collect() })
                .collect(),
        })
    }

    /// `ValidateVolumeCapabilities` for a volume being registered: an error when the plugin
    /// fails the call or confirms other capabilities than those asked.
    async fn controller_validate(&self, req: ClientCsiControllerValidateVolumeRequest) -> Result<(), String> {
        let method = methods::CONTROLLER_VALIDATE;
        require(method, !req.volume_id.is_empty(), "VolumeID")?;
        require(method, !req.controller.plugin_id.is_empty(), "PluginID")?;
        let plugin = self.plugin(method, &req.controller.plugin_id)?;
        let caps = capabilities(method, &req.volume_capabilities, req.mount_options.as_ref())?;
        let csi = v1::ValidateVolumeCapabilitiesRequest {
            volume_id: req.volume_id,
            volume_context: hash(req.context),
            volume_capabilities: caps,
            parameters: hash(req.parameters),
            secrets: hash(req.secrets),
        };
        self.within(method, plugin.validate_volume_capabilities(csi)).await?.map_err(|e| format!("{method}: {e}"))
    }

    async fn controller_delete(&self, req: ClientCsiControllerDeleteRequest) -> Result<(), String> {
        let method = methods::CONTROLLER_DELETE;
        let plugin = self.plugin(method, &req.controller.plugin_id)?;
        let csi = v1::DeleteVolumeRequest { volume_id: req.external_volume_id, secrets: hash(req.secrets) };
        match self.within(method, plugin.delete_volume(csi)).await? {
            Ok(()) => Ok(()),
            Err(e) if e.is_ignorable() => {
                tracing::debug!(error = %e, "could not delete volume");
                Ok(())
            }
            Err(e) => Err(format!("{method}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests;
