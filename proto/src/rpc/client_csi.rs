//! Server-to-client CSI calls (Nomad's `ClientCSI.*`): what a server asks the client that runs a
//! controller plugin (attach, detach, create, delete) or the node plugin of a claim (detach).
//!
//! The servers never dial a client: these travel over the channel the client opened to its
//! server (`crate::rpc` `Node.ServerRequests`), so a client behind NAT or a firewall that only
//! lets it call out still answers them. Field names are Nomad's (`nomad/structs/csi.go`,
//! `client/structs/csi.go`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::csi::{CsiTopology, CsiTopologyRequest, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability};
use crate::volume::CsiMountOptions;

/// Which controller answers: a plugin and the node that runs one of its healthy controllers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiControllerQuery {
    /// The node running the controller plugin.
    #[serde(rename = "ControllerNodeID")]
    pub controller_node_id: String,
    /// The plugin.
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
}

/// `ClientCSI.ControllerAttachVolume` (CSI `ControllerPublishVolume`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerAttachRequest {
    /// Target controller.
    #[serde(flatten)]
    pub controller: CsiControllerQuery,
    /// The provider's ID of the volume.
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// The provider's ID of the node the volume is published to (`NodeGetInfo`).
    #[serde(rename = "ClientCSINodeID")]
    pub client_csi_node_id: String,
    /// Attachment mode of the claim.
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Access mode of the claim.
    pub access_mode: CsiVolumeAccessMode,
    /// Mount options.
    pub mount_options: Option<CsiMountOptions>,
    /// A read claim.
    pub read_only: bool,
    /// The volume's secrets.
    pub secrets: BTreeMap<String, String>,
    /// The volume's context.
    pub volume_context: BTreeMap<String, String>,
}

/// Reply to `ClientCSI.ControllerAttachVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerAttachResponse {
    /// Handed to the node plugin's stage and publish.
    pub publish_context: BTreeMap<String, String>,
}

/// `ClientCSI.ControllerDetachVolume` (CSI `ControllerUnpublishVolume`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerDetachRequest {
    /// Target controller.
    #[serde(flatten)]
    pub controller: CsiControllerQuery,
    /// The provider's ID of the volume.
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// The provider's ID of the node it is unpublished from.
    #[serde(rename = "ClientCSINodeID")]
    pub client_csi_node_id: String,
    /// The volume's secrets.
    pub secrets: BTreeMap<String, String>,
}

/// `ClientCSI.ControllerCreateVolume` (CSI `CreateVolume`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerCreateRequest {
    /// Target controller.
    #[serde(flatten)]
    pub controller: CsiControllerQuery,
    /// The volume's name (Nomad passes the volume's `name`).
    pub name: String,
    /// Capabilities asked.
    pub volume_capabilities: Vec<CsiVolumeCapability>,
    /// Mount options.
    pub mount_options: Option<CsiMountOptions>,
    /// Creation parameters.
    pub parameters: BTreeMap<String, String>,
    /// Secrets.
    pub secrets: BTreeMap<String, String>,
    /// Bytes, at least.
    pub capacity_min: i64,
    /// Bytes, at most.
    pub capacity_max: i64,
    /// Snapshot to restore.
    #[serde(rename = "SnapshotID")]
    pub snapshot_id: String,
    /// Volume to clone.
    #[serde(rename = "CloneID")]
    pub clone_id: String,
    /// Topologies asked.
    pub requested_topologies: Option<CsiTopologyRequest>,
}

/// Reply to `ClientCSI.ControllerCreateVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerCreateResponse {
    /// The provider's ID of the new volume.
    #[serde(rename = "ExternalVolumeID")]
    pub external_volume_id: String,
    /// Bytes provisioned.
    pub capacity_bytes: i64,
    /// Context for later calls.
    pub volume_context: BTreeMap<String, String>,
    /// Where it is reachable.
    pub topologies: Vec<CsiTopology>,
}

/// `ClientCSI.ControllerDeleteVolume` (CSI `DeleteVolume`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerDeleteRequest {
    /// Target controller.
    #[serde(flatten)]
    pub controller: CsiControllerQuery,
    /// The provider's ID of the volume.
    #[serde(rename = "ExternalVolumeID")]
    pub external_volume_id: String,
    /// Secrets.
    pub secrets: BTreeMap<String, String>,
}

/// `ClientCSI.NodeDetachVolume`: the claim's node unpublishes (and, when nothing else on the
/// node uses it, unstages) the volume for one alloc.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiNodeDetachRequest {
    /// The node plugin.
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    /// The node that holds the claim.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The volume's namespace (the client's staging path has it; Nomad 1.6 sends none).
    pub namespace: String,
    /// Nomad's ID of the volume.
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// The provider's ID of the volume.
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    /// The alloc whose claim is released.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Attachment mode of the claim.
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Access mode of the claim.
    pub access_mode: CsiVolumeAccessMode,
    /// A read claim.
    pub read_only: bool,
}

/// `ClientCSI.ControllerValidateVolume` (CSI `ValidateVolumeCapabilities`): asked when a volume
/// of a plugin with a controller is registered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClientCsiControllerValidateVolumeRequest {
    /// Target controller.
    #[serde(flatten)]
    pub controller: CsiControllerQuery,
    /// The provider's ID of the volume.
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// Capabilities the volume is registered with.
    pub volume_capabilities: Vec<CsiVolumeCapability>,
    /// Mount options (Nomad's register sends none).
    pub mount_options: Option<CsiMountOptions>,
    /// The volume's secrets.
    pub secrets: BTreeMap<String, String>,
    /// The volume's parameters.
    pub parameters: BTreeMap<String, String>,
    /// The volume's context.
    pub context: BTreeMap<String, String>,
}
