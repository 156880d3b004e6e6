//! `CSIVolume.Register`, `Deregister`, `Create` and `Delete` (`nomad/csi_endpoint.go`).
//!
//! Create and Delete ask a controller of the volume's plugin (`csi_controller`) through
//! `Endpoints::client_csi`, then register or deregister; Register asks one to validate a
//! volume whose plugin has a controller. Claims are in `csi_claim.rs`, their
//! release in `csi_release.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::csi::{CsiPlugin, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode};
use nomad_proto::limits::MAX_CSI_VOLUMES_PER_REQUEST;
use nomad_proto::rpc::client_csi::{
    ClientCsiControllerCreateRequest, ClientCsiControllerDeleteRequest, ClientCsiControllerValidateVolumeRequest, CsiControllerQuery,
};

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

/// Nomad's `CSIVolume.Validate`: every problem at once, `validation: a, b`.
pub fn validate_volume(v: &CsiVolume) -> Result<(), String> {
    let mut errs: Vec<&str> = Vec::new();
    if v.id.is_empty() {
        errs.push("missing volume id");
    }
    if v.plugin_id.is_empty() {
        errs.push("missing plugin id");
    }
    if v.namespace.is_empty() {
        errs.push("missing namespace");
    }
    if !v.snapshot_id.is_empty() && !v.clone_id.is_empty() {
        errs.push("only one of snapshot_id and clone_id is allowed");
    }
    if v.requested_capabilities.is_empty() {
        errs.push("must include at least one capability block");
    }
    if let Some(r) = &v.requested_topologies {
        if r.required.iter().any(|t| t.segments.is_empty()) {
            errs.push("required topology is missing segments field");
        }
        if r.preferred.iter().any(|t| t.segments.is_empty()) {
            errs.push("preferred topology is missing segments field");
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(format!("validation: {}", errs.join(", "))) }
}

/// go-multierror's text, which Nomad's `Merge` errors reach the caller in.
fn multierror(errs: &[&str]) -> String {
    let head = if errs.len() == 1 { "1 error occurred:".to_string() } else { format!("{} errors occurred:", errs.len()) };
    let items: String = errs.iter().map(|e| format!("\n\t* {e}")).collect();
    format!("{head}{items}\n\n")
}

/// Nomad's `CSIVolume.Merge`: an update of a registered volume may change its mutable fields
/// (capacity request, capabilities compatible with the current claim, mount options, secrets,
/// context) but not its identity. Returns the stored volume with the changes.
pub fn merge_volume(existing: &CsiVolume, other: &CsiVolume) -> Result<CsiVolume, String> {
    let mut v = existing.clone();
    let mut errs: Vec<&str> = Vec::new();
    if v.name != other.name && !other.name.is_empty() {
        errs.push("volume name cannot be updated");
    }
    if v.external_id != other.external_id && !other.external_id.is_empty() {
        errs.push("volume external ID cannot be updated");
    }
    if v.plugin_id != other.plugin_id {
        errs.push("volume plugin ID cannot be updated");
    }
    if v.clone_id != other.clone_id && !other.clone_id.is_empty() {
        errs.push("volume clone ID cannot be updated");
    }
    if v.snapshot_id != other.snapshot_id && !other.snapshot_id.is_empty() {
        errs.push("volume snapshot ID cannot be updated");
    }
    if v.capacity != 0 {
        if other.requested_capacity_max < v.capacity || other.requested_capacity_min > v.capacity {
            errs.push("volume requested capacity update was not compatible with existing capacity");
        } else {
            v.requested_capacity_min = other.requested_capacity_min;
            v.requested_capacity_max = other.requested_capacity_max;
        }
    }
    if v.access_mode != CsiVolumeAccessMode::Unknown || v.attachment_mode != CsiVolumeAttachmentMode::Unknown {
        if other.requested_capabilities.iter().any(|c| c.access_mode == v.access_mode && c.attachment_mode == v.attachment_mode) {
            v.requested_capabilities = other.requested_capabilities.clone();
        } else {
            errs.push("volume requested capabilities update was not compatible with existing capability in use");
        }
    } else {
        v.requested_capabilities = other.requested_capabilities.clone();
    }
    if !v.topologies.is_empty() && v.requested_topologies != other.requested_topologies {
        errs.push("volume topology request update was not compatible with existing topology");
    }
    v.mount_options = other.mount_options.clone();
    v.secrets = other.secrets.clone();
    if !other.parameters.is_empty() && v.parameters != other.parameters {
        errs.push("volume parameters cannot be updated");
    }
    v.context = other.context.clone();
    if errs.is_empty() { Ok(v) } else { Err(multierror(&errs)) }
}

impl Endpoints {
    /// The checks `CSIVolume.Register` and `Create` share: the request's size and limits, then
    /// each volume put in `namespace` when it names none, validated, merged onto the stored
    /// volume of its ID (whether there was one is returned too) and given its plugin's
    /// provider. The plugin comes back with each volume.
    fn checked_volumes(&self, namespace: &str, volumes: Vec<CsiVolume>) -> Result<Vec<(CsiVolume, Arc<CsiPlugin>, bool)>, EndpointError> {
        if volumes.is_empty() {
            return Err(EndpointError::Invalid("missing volume definition".into()));
        }
        if volumes.len() > MAX_CSI_VOLUMES_PER_REQUEST {
            return Err(EndpointError::BadRequest(format!(
                "request has {} volumes, more than the limit of {MAX_CSI_VOLUMES_PER_REQUEST}",
                volumes.len()
            )));
        }
        for v in &volumes {
            v.check_limits().map_err(|e| EndpointError::BadRequest(e.to_string()))?;
        }
        let snap = self.store.snapshot();
        let mut out = Vec::with_capacity(volumes.len());
        for mut vol in volumes {
            if vol.namespace.is_empty() {
                vol.namespace = namespace.to_string();
            }
            validate_volume(&vol).map_err(EndpointError::Invalid)?;
            let existed = match snap.csi_volume(&vol.namespace, &vol.id) {
                Some(existing) => {
                    vol = merge_volume(existing, &vol).map_err(EndpointError::Invalid)?;
                    true
                }
                None => false,
            };
            let plugin = snap
                .csi_plugin(&vol.plugin_id)
                .ok_or_else(|| EndpointError::Invalid(format!("no CSI plugin named: {} could be found", vol.plugin_id)))?
                .clone();
            vol.provider = plugin.provider.clone();
            vol.provider_version = plugin.version.clone();
            out.push((vol, plugin, existed));
        }
        Ok(out)
    }

    /// Registers volumes that exist already on the storage provider (`CSIVolume.Register`).
    /// A volume without a namespace goes into `namespace`, the request's. A volume whose plugin
    /// has a controller is registered only if a controller accepts its capabilities
    /// (`ValidateVolumeCapabilities`); the first refusal fails the request, as in Nomad.
    pub async fn csi_volume_register(&self, namespace: &str, volumes: Vec<CsiVolume>) -> Result<u64, EndpointError> {
        let mut out = Vec::new();
        for (mut vol, plugin, existed) in self.checked_volumes(namespace, volumes)? {
            // A new volume is where its requested topology says it is (a created one was
            // told by its controller).
            if !existed
                && vol.topologies.is_empty()
                && let Some(r) = &vol.requested_topologies
            {
                vol.topologies = r.required.clone();
            }
            if plugin.controller_required {
                self.controller_validate(&vol).await?;
            }
            out.push(vol);
        }
        Ok(self.consensus.apply(Command::CsiVolumeRegister { volumes: out }).await?)
    }

    /// Nomad's `controllerValidateVolume`: a controller of the volume's plugin checks the
    /// volume's capabilities (Nomad sends no mount options here).
    async fn controller_validate(&self, vol: &CsiVolume) -> Result<(), EndpointError> {
        let req = ClientCsiControllerValidateVolumeRequest {
            controller: CsiControllerQuery { controller_node_id: String::new(), plugin_id: vol.plugin_id.clone() },
            volume_id: vol.remote_id().to_string(),
            volume_capabilities: vol.requested_capabilities.clone(),
            mount_options: None,
            secrets: vol.secrets.clone(),
            parameters: vol.parameters.clone(),
            context: vol.context.clone(),
        };
        self.call_controller(&vol.plugin_id, |node_id| {
            let mut r = req.clone();
            r.controller.controller_node_id = node_id;
            self.client_csi.controller_validate(r)
        })
        .await
        .map_err(|e| EndpointError::Internal(format!("controller validate volume: {e}")))
    }

    /// Creates volumes with the plugin's controller, then registers those it created
    /// (`CSIVolume.Create`): the controller's external ID, capacity, context and topologies go
    /// on the volume. Every volume is checked before any is created; one that fails to create is
    /// reported (with the others' errors) and not registered.
    pub async fn csi_volume_create(&self, namespace: &str, volumes: Vec<CsiVolume>) -> Result<(Vec<CsiVolume>, u64), EndpointError> {
        let mut valid = Vec::new();
        for (vol, plugin, _) in self.checked_volumes(namespace, volumes)? {
            if !plugin.controller_required {
                return Err(EndpointError::Invalid("plugin has no controller".into()));
            }
            if !plugin.controller_info().is_some_and(|c| c.supports_create_delete) {
                return Err(EndpointError::Invalid("plugin does not support creating volumes".into()));
            }
            valid.push(vol);
        }
        let mut created = Vec::with_capacity(valid.len());
        let mut errors = Vec::new();
        for mut vol in valid {
            let req = ClientCsiControllerCreateRequest {
                controller: CsiControllerQuery { controller_node_id: String::new(), plugin_id: vol.plugin_id.clone() },
                name: vol.name.clone(),
                volume_capabilities: vol.requested_capabilities.clone(),
                mount_options: vol.mount_options.clone(),
                parameters: vol.parameters.clone(),
                secrets: vol.secrets.clone(),
                capacity_min: vol.requested_capacity_min,
                capacity_max: vol.requested_capacity_max,
                snapshot_id: vol.snapshot_id.clone(),
                clone_id: vol.clone_id.clone(),
                requested_topologies: vol.requested_topologies.clone(),
            };
            let answer = self
                .call_controller(&vol.plugin_id, |node_id| {
                    let mut r = req.clone();
                    r.controller.controller_node_id = node_id;
                    self.client_csi.controller_create(r)
                })
                .await;
            match answer {
                Ok(c) => {
                    vol.external_id = c.external_volume_id;
                    vol.capacity = c.capacity_bytes;
                    vol.context = c.volume_context;
                    vol.topologies = c.topologies;
                    created.push(vol);
                }
                Err(e) => errors.push(format!("controller create volume: {e}")),
            }
        }
        let mut index = 0;
        if !created.is_empty() {
            match self.consensus.apply(Command::CsiVolumeRegister { volumes: created.clone() }).await {
                Ok(i) => index = i,
                Err(e) => errors.push(e.to_string()),
            }
        }
        if !errors.is_empty() {
            let refs: Vec<&str> = errors.iter().map(String::as_str).collect();
            return Err(EndpointError::Internal(multierror(&refs)));
        }
        Ok((created, index))
    }

    /// Deletes volumes with the plugin's controller, then deregisters them (`CSIVolume.Delete`).
    /// A volume in use is refused before its controller is asked.
    /// `secrets` (the request's) override the volume's own.
    pub async fn csi_volume_delete(
        &self,
        namespace: &str,
        volume_ids: Vec<String>,
        secrets: BTreeMap<String, String>,
    ) -> Result<u64, EndpointError> {
        if volume_ids.is_empty() {
            return Err(EndpointError::Invalid("missing volume IDs".into()));
        }
        if volume_ids.len() > MAX_CSI_VOLUMES_PER_REQUEST {
            return Err(EndpointError::BadRequest(format!(
                "request has {} volumes, more than the limit of {MAX_CSI_VOLUMES_PER_REQUEST}",
                volume_ids.len()
            )));
        }
        let mut deleted = Vec::new();
        for id in volume_ids {
            let snap = self.store.snapshot();
            // Nomad means to skip a volume already deregistered, but its check never matches
            // and it answers this error; so do we (a delete of a volume not there is a mistake).
            let Some(stored) = snap.csi_volume(namespace, &id) else {
                return Err(EndpointError::NotFound(format!("volume not found: {id}")));
            };
            if stored.in_use() {
                return Err(EndpointError::Invalid(format!("volume in use: {id}")));
            }
            let vol = snap.csi_volume_with_plugin(stored);
            if !vol.controller_required {
                return Err(EndpointError::Invalid(format!(
                    "volume {id:?}: plugin {:?} has no controller to delete it with",
                    vol.plugin_id
                )));
            }
            if snap.csi_plugin(&vol.plugin_id).is_none() {
                return Err(EndpointError::Invalid(format!("plugin not found: {}", vol.plugin_id)));
            }
            let mut combined = vol.secrets.clone();
            combined.extend(secrets.clone());
            let req = ClientCsiControllerDeleteRequest {
                controller: CsiControllerQuery { controller_node_id: String::new(), plugin_id: vol.plugin_id.clone() },
                external_volume_id: vol.external_id.clone(),
                secrets: combined,
            };
            drop(snap);
            self.call_controller(&vol.plugin_id, |node_id| {
                let mut r = req.clone();
                r.controller.controller_node_id = node_id;
                self.client_csi.controller_delete(r)
            })
            .await
            .map_err(|e| EndpointError::Internal(format!("controller delete volume: {e}")))?;
            deleted.push(id);
        }
        Ok(self
            .consensus
            .apply(Command::CsiVolumeDeregister { namespace: namespace.to_string(), volume_ids: deleted, force: false })
            .await?)
    }

    /// Removes volumes (`CSIVolume.Deregister`); a claimed one only with `force`, once every
    /// alloc claiming it is terminal.
    pub async fn csi_volume_deregister(&self, namespace: &str, volume_ids: Vec<String>, force: bool) -> Result<u64, EndpointError> {
        if volume_ids.is_empty() {
            return Err(EndpointError::Invalid("missing volume IDs".into()));
        }
        Ok(self.consensus.apply(Command::CsiVolumeDeregister { namespace: namespace.to_string(), volume_ids, force }).await?)
    }
}

#[cfg(test)]
mod tests {
    use nomad_proto::csi::{CsiTopology, CsiTopologyRequest, CsiVolumeCapability};

    use super::*;

    fn vol() -> CsiVolume {
        CsiVolume {
            id: "v".into(),
            namespace: "default".into(),
            plugin_id: "p".into(),
            requested_capabilities: vec![CsiVolumeCapability {
                access_mode: CsiVolumeAccessMode::SingleNodeWriter,
                attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            }],
            ..CsiVolume::default()
        }
    }

    #[test]
    fn validation_reports_every_problem_in_nomads_words() {
        assert_eq!(validate_volume(&vol()), Ok(()));
        let bad = CsiVolume {
            snapshot_id: "s".into(),
            clone_id: "c".into(),
            requested_topologies: Some(CsiTopologyRequest { required: vec![CsiTopology::default()], preferred: vec![] }),
            ..CsiVolume::default()
        };
        assert_eq!(
            validate_volume(&bad).unwrap_err(),
            "validation: missing volume id, missing plugin id, missing namespace, only one of snapshot_id and clone_id is allowed, \
             must include at least one capability block, required topology is missing segments field"
        );
    }

    #[test]
    fn merge_keeps_identity_and_checks_capabilities_in_use() {
        let mut existing = vol();
        existing.name = "old".into();
        let mut update = vol();
        update.name = "new".into();
        update.plugin_id = "q".into();
        assert_eq!(
            merge_volume(&existing, &update).unwrap_err(),
            "2 errors occurred:\n\t* volume name cannot be updated\n\t* volume plugin ID cannot be updated\n\n"
        );
        // An empty name leaves it; secrets and context change freely.
        let mut update = vol();
        update.secrets.insert("k".into(), "v".into());
        update.context.insert("c".into(), "1".into());
        let merged = merge_volume(&existing, &update).unwrap();
        assert_eq!((merged.name.as_str(), merged.secrets["k"].as_str(), merged.context["c"].as_str()), ("old", "v", "1"));
        // While claimed as single-node-writer, the capabilities must keep that one.
        existing.access_mode = CsiVolumeAccessMode::SingleNodeWriter;
        existing.attachment_mode = CsiVolumeAttachmentMode::FileSystem;
        let mut update = vol();
        update.requested_capabilities[0].access_mode = CsiVolumeAccessMode::MultiNodeReader;
        assert_eq!(
            merge_volume(&existing, &update).unwrap_err(),
            "1 error occurred:\n\t* volume requested capabilities update was not compatible with existing capability in use\n\n"
        );
        // Capacity requests must include the capacity.
        existing.capacity = 100;
        let mut update = vol();
        update.requested_capacity_min = 10;
        update.requested_capacity_max = 50;
        assert!(merge_volume(&existing, &update).unwrap_err().contains("not compatible with existing capacity"));
        update.requested_capacity_max = 200;
        assert_eq!(merge_volume(&existing, &update).unwrap().requested_capacity_max, 200);
    }
}
