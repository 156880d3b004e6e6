//! CSI volumes, their claims and CSI plugins, in Nomad's JSON shapes (`nomad/structs/csi.go`,
//! the CSI parts of `nomad/structs/node.go`).
//!
//! A [`CsiVolume`] as stored carries its claims (`ReadClaims`, `WriteClaims`, `PastClaims`) and
//! its secrets; the HTTP API never shows either: [`CsiVolume::to_api_value`] makes the shape
//! Nomad's JSON encoder extension gives (`csiVolumeExt`): claims left out, `Secrets` null, mount
//! flags redacted, and the claimed allocs as `Allocations` stubs.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::alloc::AllocListStub;
use crate::time::Timestamp;
use crate::volume::CsiMountOptions;

/// How a volume's storage is presented (`CSIVolumeAttachmentMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CsiVolumeAttachmentMode {
    /// Not known yet (no claim).
    #[default]
    #[serde(rename = "")]
    Unknown,
    /// A raw block device.
    #[serde(rename = "block-device")]
    BlockDevice,
    /// A mounted file system.
    #[serde(rename = "file-system")]
    FileSystem,
}

impl CsiVolumeAttachmentMode {
    /// Nomad's string.
    pub fn as_str(self) -> &'static str {
        match self {
            CsiVolumeAttachmentMode::Unknown => "",
            CsiVolumeAttachmentMode::BlockDevice => "block-device",
            CsiVolumeAttachmentMode::FileSystem => "file-system",
        }
    }
}

/// How a volume may be shared between nodes and writers (`CSIVolumeAccessMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CsiVolumeAccessMode {
    /// Not known yet (no claim).
    #[default]
    #[serde(rename = "")]
    Unknown,
    /// One node, read only.
    #[serde(rename = "single-node-reader-only")]
    SingleNodeReader,
    /// One node, one writer.
    #[serde(rename = "single-node-writer")]
    SingleNodeWriter,
    /// Many nodes, read only.
    #[serde(rename = "multi-node-reader-only")]
    MultiNodeReader,
    /// Many nodes, one writer.
    #[serde(rename = "multi-node-single-writer")]
    MultiNodeSingleWriter,
    /// Many nodes, many writers.
    #[serde(rename = "multi-node-multi-writer")]
    MultiNodeMultiWriter,
}

impl CsiVolumeAccessMode {
    /// Every known mode.
    pub const ALL: [CsiVolumeAccessMode; 5] = [
        CsiVolumeAccessMode::SingleNodeReader,
        CsiVolumeAccessMode::SingleNodeWriter,
        CsiVolumeAccessMode::MultiNodeReader,
        CsiVolumeAccessMode::MultiNodeSingleWriter,
        CsiVolumeAccessMode::MultiNodeMultiWriter,
    ];

    /// Nomad's string.
    pub fn as_str(self) -> &'static str {
        match self {
            CsiVolumeAccessMode::Unknown => "",
            CsiVolumeAccessMode::SingleNodeReader => "single-node-reader-only",
            CsiVolumeAccessMode::SingleNodeWriter => "single-node-writer",
            CsiVolumeAccessMode::MultiNodeReader => "multi-node-reader-only",
            CsiVolumeAccessMode::MultiNodeSingleWriter => "multi-node-single-writer",
            CsiVolumeAccessMode::MultiNodeMultiWriter => "multi-node-multi-writer",
        }
    }

    /// A mode that allows writers (`ValidCSIVolumeWriteAccessMode`).
    pub fn is_writer(self) -> bool {
        matches!(
            self,
            CsiVolumeAccessMode::SingleNodeWriter | CsiVolumeAccessMode::MultiNodeSingleWriter | CsiVolumeAccessMode::MultiNodeMultiWriter
        )
    }
}

/// Defines an enum Nomad encodes as its Go `iota` integer.
macro_rules! int_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $value:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant,)+
        }

        impl $name {
            /// Nomad's integer.
            pub fn as_int(self) -> u8 {
                match self { $($name::$variant => $value,)+ }
            }

            /// The variant for Nomad's integer.
            pub fn from_int(v: u64) -> Option<$name> {
                match v { $($value => Some($name::$variant),)+ _ => None }
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_u8(self.as_int())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let v = u64::deserialize(d)?;
                $name::from_int(v).ok_or_else(|| serde::de::Error::custom(format!("{} {v} is not one of Nomad's values", stringify!($name))))
            }
        }
    };
}

int_enum!(
    /// What a claim asks for (`CSIVolumeClaimMode`).
    CsiVolumeClaimMode {
        /// A reader.
        #[default]
        Read = 0,
        /// A writer.
        Write = 1,
        /// No alloc: only bumps the volume's index so the volume watcher looks again.
        Gc = 2,
    }
);

int_enum!(
    /// Where a claim is on its way to release (`CSIVolumeClaimState`). A claim that is not
    /// `Taken` is a release checkpoint, kept in `PastClaims` until `ReadyToFree` frees it.
    CsiVolumeClaimState {
        /// Held by a live alloc.
        #[default]
        Taken = 0,
        /// The node plugin has unpublished (and unstaged) it.
        NodeDetached = 1,
        /// The controller plugin has unpublished it.
        ControllerDetached = 2,
        /// Nothing holds it any more: the claim can be removed.
        ReadyToFree = 3,
        /// The alloc is done (or gone) and the release has started.
        Unpublishing = 4,
    }
);

impl CsiVolumeClaimState {
    /// Nomad's name of the state, for messages.
    pub fn name(self) -> &'static str {
        match self {
            CsiVolumeClaimState::Taken => "taken",
            CsiVolumeClaimState::NodeDetached => "node-detached",
            CsiVolumeClaimState::ControllerDetached => "controller-detached",
            CsiVolumeClaimState::ReadyToFree => "ready-to-free",
            CsiVolumeClaimState::Unpublishing => "unpublishing",
        }
    }
}

/// One alloc's claim on a volume (`CSIVolumeClaim`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolumeClaim {
    /// The claiming alloc (empty for GC and detach claims).
    #[serde(rename = "AllocationID")]
    pub allocation_id: String,
    /// The node the alloc runs on.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The storage provider's ID of that node (the node plugin's `NodeGetInfo`).
    #[serde(rename = "ExternalNodeID")]
    pub external_node_id: String,
    /// Read, write or GC.
    pub mode: CsiVolumeClaimMode,
    /// Access mode asked by the group's `volume` block.
    pub access_mode: CsiVolumeAccessMode,
    /// Attachment mode asked by the group's `volume` block.
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Release progress.
    pub state: CsiVolumeClaimState,
}

/// An access and attachment mode pair a volume supports (`CSIVolumeCapability`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolumeCapability {
    /// Attachment mode.
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Access mode.
    pub access_mode: CsiVolumeAccessMode,
}

/// Where storage is reachable (`CSITopology`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiTopology {
    /// Segments, e.g. `{"rack": "r1"}`.
    pub segments: BTreeMap<String, String>,
}

/// Topologies asked of the provider at creation (`CSITopologyRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiTopologyRequest {
    /// Must be met.
    pub required: Vec<CsiTopology>,
    /// Preferred.
    pub preferred: Vec<CsiTopology>,
}

/// A set of IDs Nomad encodes as a map of ID to `null` (`ReadAllocs`, `WriteAllocs`: the allocs
/// themselves are denormalized on read, never stored).
mod id_map {
    use std::collections::{BTreeMap, BTreeSet};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(ids: &BTreeSet<String>, s: S) -> Result<S::Ok, S::Error> {
        ids.iter().map(|id| (id, ())).collect::<BTreeMap<_, _>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<String>, D::Error> {
        let m: BTreeMap<String, serde::de::IgnoredAny> = BTreeMap::deserialize(d)?;
        Ok(m.into_keys().collect())
    }
}

/// A CSI volume (`CSIVolume`). Keyed by (`Namespace`, `ID`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolume {
    /// ID, unique within the namespace.
    #[serde(rename = "ID")]
    pub id: String,
    /// Display name.
    pub name: String,
    /// The provider's ID of the volume (may be URL-unsafe).
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    /// Namespace.
    pub namespace: String,
    /// Topologies asked at creation.
    pub requested_topologies: Option<CsiTopologyRequest>,
    /// Topologies the provider gave.
    pub topologies: Vec<CsiTopology>,
    /// Current access mode (from the first claim).
    pub access_mode: CsiVolumeAccessMode,
    /// Current attachment mode (from the first claim).
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Mount options.
    pub mount_options: Option<CsiMountOptions>,
    /// Secrets handed to the plugin; never shown by reads.
    pub secrets: BTreeMap<String, String>,
    /// Creation parameters.
    pub parameters: BTreeMap<String, String>,
    /// Volume context handed to the plugin.
    pub context: BTreeMap<String, String>,
    /// Bytes.
    pub capacity: i64,
    /// Bytes asked at creation, at least.
    pub requested_capacity_min: i64,
    /// Bytes asked at creation, at most.
    pub requested_capacity_max: i64,
    /// The modes the volume may be claimed with.
    pub requested_capabilities: Vec<CsiVolumeCapability>,
    /// Volume cloned from at creation.
    #[serde(rename = "CloneID")]
    pub clone_id: String,
    /// Snapshot restored at creation.
    #[serde(rename = "SnapshotID")]
    pub snapshot_id: String,
    /// Allocs holding read claims.
    #[serde(with = "id_map")]
    pub read_allocs: BTreeSet<String>,
    /// Allocs holding write claims.
    #[serde(with = "id_map")]
    pub write_allocs: BTreeSet<String>,
    /// Read claims by alloc ID (stored and sent between servers and clients, not shown by HTTP).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub read_claims: BTreeMap<String, CsiVolumeClaim>,
    /// Write claims by alloc ID.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub write_claims: BTreeMap<String, CsiVolumeClaim>,
    /// Claims on their way to release, by alloc ID (the unpublish checkpoints).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub past_claims: BTreeMap<String, CsiVolumeClaim>,
    /// Whether the plugin is healthy enough to use the volume (denormalized on read).
    pub schedulable: bool,
    /// Plugin.
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    /// Plugin vendor (denormalized).
    pub provider: String,
    /// Plugin vendor version (denormalized).
    pub provider_version: String,
    /// The plugin needs a controller (denormalized).
    pub controller_required: bool,
    /// Healthy controllers (denormalized).
    pub controllers_healthy: i64,
    /// Expected controllers (denormalized).
    pub controllers_expected: i64,
    /// Healthy node plugins (denormalized).
    pub nodes_healthy: i64,
    /// Expected node plugins (denormalized).
    pub nodes_expected: i64,
    /// When the provider reported the volume exhausted (zero: never).
    pub resource_exhausted: Timestamp,
    /// Raft index that created it.
    pub create_index: u64,
    /// Raft index of the last change.
    pub modify_index: u64,
}

/// Nomad's placeholder for mount flags, which may hold secrets.
pub const REDACTED: &str = "[REDACTED]";

impl CsiVolume {
    /// The ID the plugin knows the volume by (`RemoteID`).
    pub fn remote_id(&self) -> &str {
        if self.external_id.is_empty() { &self.id } else { &self.external_id }
    }

    /// Whether any alloc holds a claim (`InUse`).
    pub fn in_use(&self) -> bool {
        !self.read_allocs.is_empty() || !self.write_allocs.is_empty()
    }

    /// The list entry (`Stub`).
    pub fn stub(&self) -> CsiVolListStub {
        CsiVolListStub {
            id: self.id.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            external_id: self.external_id.clone(),
            topologies: self.topologies.clone(),
            access_mode: self.access_mode,
            attachment_mode: self.attachment_mode,
            current_readers: self.read_allocs.len(),
            current_writers: self.write_allocs.len(),
            schedulable: self.schedulable,
            plugin_id: self.plugin_id.clone(),
            provider: self.provider.clone(),
            controller_required: self.controller_required,
            controllers_healthy: self.controllers_healthy,
            controllers_expected: self.controllers_expected,
            nodes_healthy: self.nodes_healthy,
            nodes_expected: self.nodes_expected,
            resource_exhausted: self.resource_exhausted,
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }

    /// The volume as Nomad's HTTP API shows it: no claims, `Secrets` null, mount flags
    /// redacted, and `Allocations` with the stubs of the claiming allocs that still exist.
    pub fn to_api_value(&self, allocations: &[AllocListStub]) -> serde_json::Value {
        let mut shown = self.clone();
        shown.read_claims.clear();
        shown.write_claims.clear();
        shown.past_claims.clear();
        shown.secrets.clear();
        if let Some(m) = &mut shown.mount_options
            && !m.mount_flags.is_empty()
        {
            m.mount_flags = vec![REDACTED.to_string()];
        }
        let mut v = serde_json::to_value(&shown).unwrap_or_default();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("Secrets".into(), serde_json::Value::Null);
            obj.insert("Allocations".into(), serde_json::to_value(allocations).unwrap_or_default());
        }
        v
    }
}

/// An entry of `/v1/volumes?type=csi` (`CSIVolListStub`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolListStub {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Provider's ID.
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    /// Topologies.
    pub topologies: Vec<CsiTopology>,
    /// Current access mode.
    pub access_mode: CsiVolumeAccessMode,
    /// Current attachment mode.
    pub attachment_mode: CsiVolumeAttachmentMode,
    /// Read claims.
    pub current_readers: usize,
    /// Write claims.
    pub current_writers: usize,
    /// Schedulable.
    pub schedulable: bool,
    /// Plugin.
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    /// Provider.
    pub provider: String,
    /// Controller required.
    pub controller_required: bool,
    /// Healthy controllers.
    pub controllers_healthy: i64,
    /// Expected controllers.
    pub controllers_expected: i64,
    /// Healthy node plugins.
    pub nodes_healthy: i64,
    /// Expected node plugins.
    pub nodes_expected: i64,
    /// Exhausted since.
    pub resource_exhausted: Timestamp,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}

/// What a node fingerprints of one CSI plugin instance (`CSIInfo`), in
/// `Node.CSIControllerPlugins` / `Node.CSINodePlugins`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiInfo {
    /// Plugin.
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    /// The alloc running the plugin.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Probe answered ready.
    pub healthy: bool,
    /// `healthy` / `unhealthy` or why.
    pub health_description: String,
    /// When this was fingerprinted.
    pub update_time: Timestamp,
    /// Vendor name (`GetPluginInfo`).
    pub provider: String,
    /// Vendor version.
    pub provider_version: String,
    /// The plugin has the `CONTROLLER_SERVICE` capability.
    pub requires_controller_plugin: bool,
    /// The plugin has `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub requires_topologies: bool,
    /// Set for controller instances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_info: Option<CsiControllerInfo>,
    /// Set for node instances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_info: Option<CsiNodeInfo>,
}

/// A controller plugin's capabilities (`CSIControllerInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiControllerInfo {
    /// `CREATE_DELETE_VOLUME`.
    pub supports_create_delete: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`.
    pub supports_attach_detach: bool,
    /// `LIST_VOLUMES`.
    pub supports_list_volumes: bool,
    /// `GET_CAPACITY`.
    pub supports_get_capacity: bool,
    /// `CREATE_DELETE_SNAPSHOT`.
    pub supports_create_delete_snapshot: bool,
    /// `LIST_SNAPSHOTS`.
    pub supports_list_snapshots: bool,
    /// `CLONE_VOLUME`.
    pub supports_clone: bool,
    /// `PUBLISH_READONLY`.
    pub supports_read_only_attach: bool,
    /// `EXPAND_VOLUME`.
    pub supports_expand: bool,
    /// `LIST_VOLUMES_PUBLISHED_NODES`.
    pub supports_list_volumes_attached_nodes: bool,
    /// `VOLUME_CONDITION`.
    pub supports_condition: bool,
    /// `GET_VOLUME`.
    pub supports_get: bool,
}

/// A node plugin's identity and capabilities (`CSINodeInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiNodeInfo {
    /// The provider's ID of this node (`NodeGetInfo`).
    #[serde(rename = "ID")]
    pub id: String,
    /// Most volumes the node may have published (0: no limit).
    pub max_volumes: i64,
    /// Where the node is.
    pub accessible_topology: Option<CsiTopology>,
    /// `STAGE_UNSTAGE_VOLUME`.
    pub requires_node_stage_volume: bool,
    /// `GET_VOLUME_STATS`.
    pub supports_stats: bool,
    /// `EXPAND_VOLUME`.
    pub supports_expand: bool,
    /// `VOLUME_CONDITION`.
    pub supports_condition: bool,
}

/// A job running instances of a plugin (`JobDescription`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiJobDescription {
    /// Namespace.
    pub namespace: String,
    /// Job.
    #[serde(rename = "ID")]
    pub id: String,
    /// Instances expected.
    pub expected: i64,
}

/// Namespace → job ID → description (`JobDescriptions`).
pub type CsiJobDescriptions = BTreeMap<String, BTreeMap<String, CsiJobDescription>>;

/// A CSI plugin as the servers know it from node fingerprints (`CSIPlugin`). Global, not namespaced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiPlugin {
    /// Plugin ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Vendor name.
    pub provider: String,
    /// Vendor version.
    pub version: String,
    /// Volumes need a controller.
    pub controller_required: bool,
    /// Node ID → controller instance.
    pub controllers: BTreeMap<String, CsiInfo>,
    /// Node ID → node instance.
    pub nodes: BTreeMap<String, CsiInfo>,
    /// The plugin's allocs (denormalized on read, never stored).
    pub allocations: Vec<AllocListStub>,
    /// Jobs running controllers.
    pub controller_jobs: CsiJobDescriptions,
    /// Jobs running node plugins.
    pub node_jobs: CsiJobDescriptions,
    /// Healthy controllers.
    pub controllers_healthy: i64,
    /// Expected controllers.
    pub controllers_expected: i64,
    /// Healthy node plugins.
    pub nodes_healthy: i64,
    /// Expected node plugins.
    pub nodes_expected: i64,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}

impl CsiPlugin {
    /// The list entry (`Stub`).
    pub fn stub(&self) -> CsiPluginListStub {
        CsiPluginListStub {
            id: self.id.clone(),
            provider: self.provider.clone(),
            controller_required: self.controller_required,
            controllers_healthy: self.controllers_healthy,
            controllers_expected: self.controllers_expected,
            nodes_healthy: self.nodes_healthy,
            nodes_expected: self.nodes_expected,
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }

    /// The first controller's capabilities (Nomad assumes every instance of a version alike).
    pub fn controller_info(&self) -> Option<&CsiControllerInfo> {
        self.controllers.values().next().and_then(|c| c.controller_info.as_ref())
    }

    /// `HasControllerCapability(CSIControllerSupportsAttachDetach)`.
    pub fn supports_attach_detach(&self) -> bool {
        self.controller_info().is_some_and(|c| c.supports_attach_detach)
    }
}

/// An entry of `/v1/plugins?type=csi` (`CSIPluginListStub`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiPluginListStub {
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Vendor.
    pub provider: String,
    /// Controller required.
    pub controller_required: bool,
    /// Healthy controllers.
    pub controllers_healthy: i64,
    /// Expected controllers.
    pub controllers_expected: i64,
    /// Healthy node plugins.
    pub nodes_healthy: i64,
    /// Expected node plugins.
    pub nodes_expected: i64,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}

/// The body of `PUT /v1/volume/csi/<id>` (`CSIVolumeRegisterRequest`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolumeRegisterRequest {
    /// Volumes.
    pub volumes: Vec<CsiVolume>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_states_use_nomads_encodings() {
        let claim = CsiVolumeClaim {
            allocation_id: "a".into(),
            mode: CsiVolumeClaimMode::Write,
            access_mode: CsiVolumeAccessMode::MultiNodeSingleWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            state: CsiVolumeClaimState::Unpublishing,
            ..CsiVolumeClaim::default()
        };
        let v = serde_json::to_value(&claim).unwrap();
        assert_eq!(v["Mode"], 1);
        assert_eq!(v["State"], 4);
        assert_eq!(v["AccessMode"], "multi-node-single-writer");
        assert_eq!(v["AttachmentMode"], "file-system");
        assert_eq!(v["AllocationID"], "a");
        let back: CsiVolumeClaim = serde_json::from_value(v).unwrap();
        assert_eq!(back, claim);
        for (state, n) in [
            (CsiVolumeClaimState::Taken, 0),
            (CsiVolumeClaimState::NodeDetached, 1),
            (CsiVolumeClaimState::ControllerDetached, 2),
            (CsiVolumeClaimState::ReadyToFree, 3),
            (CsiVolumeClaimState::Unpublishing, 4),
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), n);
        }
        assert_eq!(serde_json::to_value(CsiVolumeClaimMode::Gc).unwrap(), 2);
        let e = serde_json::from_str::<CsiVolumeClaimState>("9").unwrap_err().to_string();
        assert!(e.contains("CsiVolumeClaimState 9"), "{e}");
        assert_eq!(serde_json::to_value(CsiVolumeAccessMode::Unknown).unwrap(), "");
        assert!(serde_json::from_str::<CsiVolumeAccessMode>("\"single-node\"").is_err());
    }

    #[test]
    fn the_api_view_hides_claims_and_secrets_and_redacts_mount_flags() {
        let mut vol = CsiVolume {
            id: "v".into(),
            namespace: "default".into(),
            secrets: [("password".to_string(), "hunter2".to_string())].into(),
            mount_options: Some(CsiMountOptions { fs_type: "ext4".into(), mount_flags: vec!["user=me,pass=hunter2".into()] }),
            ..CsiVolume::default()
        };
        vol.read_allocs.insert("a1".into());
        vol.read_claims.insert("a1".into(), CsiVolumeClaim { allocation_id: "a1".into(), ..CsiVolumeClaim::default() });
        vol.past_claims.insert("a0".into(), CsiVolumeClaim { allocation_id: "a0".into(), ..CsiVolumeClaim::default() });
        // Stored form keeps everything.
        let stored = serde_json::to_value(&vol).unwrap();
        assert_eq!(stored["ReadClaims"]["a1"]["AllocationID"], "a1");
        assert_eq!(stored["Secrets"]["password"], "hunter2");
        assert_eq!(serde_json::from_value::<CsiVolume>(stored).unwrap(), vol);

        let stub = AllocListStub { id: "a1".into(), ..AllocListStub::default() };
        let api = vol.to_api_value(&[stub]);
        let text = api.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(api.get("ReadClaims").is_none() && api.get("PastClaims").is_none() && api.get("WriteClaims").is_none());
        assert_eq!(api["Secrets"], serde_json::Value::Null);
        assert_eq!(api["MountOptions"]["MountFlags"], serde_json::json!([REDACTED]));
        assert_eq!(api["MountOptions"]["FSType"], "ext4");
        assert_eq!(api["ReadAllocs"], serde_json::json!({"a1": null}));
        assert_eq!(api["WriteAllocs"], serde_json::json!({}));
        assert_eq!(api["Allocations"][0]["ID"], "a1");
        assert_eq!(api["ResourceExhausted"], "0001-01-01T00:00:00Z");
    }

    #[test]
    fn csi_info_omits_the_side_it_is_not() {
        let info = CsiInfo {
            plugin_id: "p".into(),
            node_info: Some(CsiNodeInfo { id: "ext".into(), ..CsiNodeInfo::default() }),
            ..CsiInfo::default()
        };
        let v = serde_json::to_value(&info).unwrap();
        assert!(v.get("ControllerInfo").is_none());
        assert_eq!(v["NodeInfo"]["ID"], "ext");
        assert_eq!(v["PluginID"], "p");
    }
}
