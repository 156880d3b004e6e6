//! The release of a CSI claim on the servers (`CSIVolume.Unpublish` in `nomad/csi_endpoint.go`):
//! one walk, used by the client's `CSIVolume.Unpublish`, the volume watcher (which also carries
//! out what the claim GC marks) and `DELETE /v1/volume/csi/<id>/detach`.
//!
//! ```text
//!  checkpoint the claim as received (a past claim from here on)
//!  node step        the claim's node reported it (its own Unpublish): done
//!                   otherwise: node gone or down → skip; else ClientCsi::node_detach
//!                   (no alloc: every past claim on that node), "Unknown node" = done
//!                   → checkpoint node-detached
//!  controller step  not required / no attach-detach / another live alloc on the node → skip;
//!                   else ClientCsi::controller_detach to a Ready node with a healthy
//!                   controller (all of them, shuffled, next one on a retryable error)
//!                   → checkpoint controller-detached
//!  release          checkpoint ready-to-free: the claim is removed from the volume
//! ```
//!
//! Every checkpoint is a `CsiVolumeClaim` command; a failure returns at once and leaves the last
//! one in `PastClaims`, where whoever resends the stored claim resumes at
//! `csi::unpublish::next_step`.

use nomad_proto::NamespacedId;
use nomad_proto::csi::{CsiVolume, CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState};
use nomad_proto::rpc::client_csi::{ClientCsiControllerDetachRequest, ClientCsiNodeDetachRequest, CsiControllerQuery};

use super::csi_controller::UNKNOWN_NODE;
use super::{EndpointError, Endpoints};
use crate::consensus::BoxFuture;
use crate::csi::ClientCallError;
use crate::csi::unpublish::{ControllerDetachPlan, NodeDetachPlan, UnpublishStep, next_step, plan_controller_detach, plan_node_detach};
use crate::fsm::Command;
use crate::state::{State, Table};

/// Who asks for a release, which decides the node step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseBy {
    /// The claim's own node (`CSIVolume.Unpublish` from its client): it unpublished and
    /// unstaged before it called, so its report is the node step.
    ClaimNode,
    /// A server (the volume watcher, `volume detach`): the node step asks the claim's node,
    /// unless it is gone or down.
    Server,
}

impl Endpoints {
    /// Walks `claim` on `namespace/volume_id` from the state it carries to `ready-to-free`
    /// (see the module docs). Returns the index of the last write.
    pub async fn csi_release_claim(
        &self,
        namespace: &str,
        volume_id: &str,
        mut claim: CsiVolumeClaim,
        by: ReleaseBy,
    ) -> Result<u64, EndpointError> {
        {
            let snap = self.store.snapshot();
            let stored = snap.csi_volume(namespace, volume_id).ok_or_else(|| EndpointError::NotFound("no such volume".into()))?;
            // A claim released meanwhile (by its client, the watcher, an earlier pass) is not
            // brought back as a past claim by whoever sends it late.
            let id = &claim.allocation_id;
            if !id.is_empty()
                && !stored.read_allocs.contains(id)
                && !stored.write_allocs.contains(id)
                && !stored.past_claims.contains_key(id)
            {
                return Ok(snap.index);
            }
        }
        // A release never takes: a claim sent as `taken` (a client's, `volume detach`) starts it.
        if claim.state == CsiVolumeClaimState::Taken {
            claim.state = CsiVolumeClaimState::Unpublishing;
        }
        // Checkpoint what arrived first, so a failure below still leaves a past claim.
        let mut index = self.write_claim(namespace, volume_id, claim.clone()).await?;
        let mut step = next_step(claim.state);
        loop {
            match step {
                UnpublishStep::NodeDetach => {
                    if by == ReleaseBy::Server {
                        self.node_detach(namespace, volume_id, &claim).await?;
                    }
                    claim.state = CsiVolumeClaimState::NodeDetached;
                    index = self.write_claim(namespace, volume_id, claim.clone()).await?;
                    step = UnpublishStep::ControllerDetach;
                }
                UnpublishStep::ControllerDetach => {
                    if self.controller_detach(namespace, volume_id, &mut claim).await? {
                        claim.state = CsiVolumeClaimState::ControllerDetached;
                        index = self.write_claim(namespace, volume_id, claim.clone()).await?;
                    }
                    step = UnpublishStep::Release;
                }
                UnpublishStep::Release => {
                    claim.state = CsiVolumeClaimState::ReadyToFree;
                    return Ok(self.write_claim(namespace, volume_id, claim).await?.max(index));
                }
            }
        }
    }

    /// `volume detach <vol> <node>` (`DELETE /v1/volume/csi/<id>/detach?node=`): Nomad's
    /// `CSIVolume.Unpublish` with a claim of no alloc in GC mode, which node-detaches every past
    /// claim on the node (skipped if the node is down or collected), controller-detaches the
    /// volume from it and moves the volume's index, so the volume watcher frees those claims.
    pub async fn csi_volume_detach(&self, namespace: &str, volume_id: &str, node_id: &str) -> Result<u64, EndpointError> {
        if volume_id.is_empty() {
            return Err(EndpointError::BadRequest("missing volume ID".into()));
        }
        if node_id.is_empty() {
            return Err(EndpointError::BadRequest("detach requires node ID".into()));
        }
        let claim = CsiVolumeClaim { node_id: node_id.to_string(), mode: CsiVolumeClaimMode::Gc, ..CsiVolumeClaim::default() };
        self.csi_release_claim(namespace, volume_id, claim, ReleaseBy::Server).await
    }

    /// The node step (`nodeUnpublishVolume`) for a server-driven release.
    async fn node_detach(&self, namespace: &str, volume_id: &str, claim: &CsiVolumeClaim) -> Result<(), EndpointError> {
        let snap = self.store.snapshot();
        let vol = current_volume(&snap, namespace, volume_id)?;
        let plan = plan_node_detach(&vol, claim, snap.node(&claim.node_id).map(|n| &**n));
        let claims = match plan {
            NodeDetachPlan::NodeGone => {
                tracing::debug!(volume = volume_id, node = %claim.node_id, "skipping node unpublish for down or GC'd node");
                return Ok(());
            }
            NodeDetachPlan::Detach(claims) => claims,
        };
        let mut errs = Vec::new();
        for c in claims {
            let req = ClientCsiNodeDetachRequest {
                plugin_id: vol.plugin_id.clone(),
                node_id: c.node_id.clone(),
                namespace: vol.namespace.clone(),
                volume_id: vol.id.clone(),
                external_id: vol.remote_id().to_string(),
                alloc_id: c.allocation_id.clone(),
                attachment_mode: c.attachment_mode,
                access_mode: c.access_mode,
                read_only: c.mode == CsiVolumeClaimMode::Read,
            };
            match self.client_csi.node_detach(req).await {
                Ok(()) => {}
                // The node went away: nothing is mounted there any more.
                Err(ClientCallError::Failed(m)) if m.contains(UNKNOWN_NODE) => {}
                Err(e) => errs.push(format!("could not detach from node: node detach volume: {e}")),
            }
        }
        match errs.as_slice() {
            [] => Ok(()),
            [one] => Err(EndpointError::Internal(one.clone())),
            many => Err(EndpointError::Internal(multierror(many))),
        }
    }

    /// The controller step (`controllerUnpublishVolume`): `Ok(true)` when a controller
    /// unpublished the volume, `Ok(false)` when none had to.
    async fn controller_detach(&self, namespace: &str, volume_id: &str, claim: &mut CsiVolumeClaim) -> Result<bool, EndpointError> {
        let snap = self.store.snapshot();
        let vol = current_volume(&snap, namespace, volume_id)?;
        let plugin = snap.csi_plugin(&vol.plugin_id).map(|p| &**p);
        let plan = plan_controller_detach(&vol, plugin, claim, |id| snap.alloc(id).map(|a| &**a), snap.node(&claim.node_id).map(|n| &**n))
            .map_err(EndpointError::Internal)?;
        let external_node_id = match plan {
            ControllerDetachPlan::NotNeeded => return Ok(false),
            ControllerDetachPlan::StillUsedOnNode { alloc_id } => {
                tracing::debug!(volume = volume_id, alloc = %alloc_id, "controller unpublish canceled: another non-terminal alloc is on this node");
                return Ok(false);
            }
            ControllerDetachPlan::Detach { external_node_id } => external_node_id,
        };
        // Recorded on the claim, so the checkpoint keeps it for a node that is GC'd later.
        claim.external_node_id = external_node_id.clone();
        if plugin.is_none() {
            return Err(EndpointError::Internal(format!("no such plugin: {:?}", vol.plugin_id)));
        }
        let fail = |e: String| EndpointError::Internal(format!("could not detach from controller: controller detach volume: {e}"));
        self.call_controller(&vol.plugin_id, |node_id| {
            let req = ClientCsiControllerDetachRequest {
                controller: CsiControllerQuery { controller_node_id: node_id, plugin_id: vol.plugin_id.clone() },
                volume_id: vol.remote_id().to_string(),
                client_csi_node_id: external_node_id.clone(),
                secrets: vol.secrets.clone(),
            };
            self.client_csi.controller_detach(req)
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
        Ok(true)
    }

    pub(super) async fn write_claim(&self, namespace: &str, volume_id: &str, claim: CsiVolumeClaim) -> Result<u64, EndpointError> {
        Ok(self
            .consensus
            .apply(Command::CsiVolumeClaim { namespace: namespace.to_string(), volume_id: volume_id.to_string(), claim })
            .await?)
    }
}

impl crate::leader::VolumeWatchHandle for Endpoints {
    fn wait_for_volumes(&self, index: u64, wait: std::time::Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.store.wait_for_change(&[Table::CsiVolumes], index, wait))
    }

    fn volumes_with_past_claims(&self) -> (Vec<CsiVolume>, u64) {
        let snap = self.store.snapshot();
        (snap.csi_volumes_with_past_claims(u64::MAX), snap.table_index(Table::CsiVolumes))
    }

    fn release(&self, namespace: &str, volume_id: &str, claim: CsiVolumeClaim) -> BoxFuture<'_, Result<(), String>> {
        let (namespace, volume_id) = (namespace.to_string(), volume_id.to_string());
        Box::pin(async move {
            self.csi_release_claim(&namespace, &volume_id, claim, ReleaseBy::Server).await.map(|_| ()).map_err(|e| e.to_string())
        })
    }
}

impl crate::leader::ClaimGcHandle for Endpoints {
    fn index(&self) -> u64 {
        self.store.snapshot().index
    }

    fn volumes_to_collect(&self, created_by: u64) -> Vec<NamespacedId> {
        let snap = self.store.snapshot();
        snap.csi_volumes_with_past_claims(created_by).iter().map(|v| NamespacedId::new(&v.namespace, &v.id)).collect()
    }

    fn mark(&self, volume: &NamespacedId) -> BoxFuture<'_, Result<u64, String>> {
        // Nomad's `CSIVolume.Claim{Claim: gc, State: unpublishing}`: no alloc, so the state
        // store only moves the volume's index.
        let claim = CsiVolumeClaim { mode: CsiVolumeClaimMode::Gc, state: CsiVolumeClaimState::Unpublishing, ..CsiVolumeClaim::default() };
        let volume = volume.clone();
        Box::pin(async move { self.write_claim(&volume.namespace, &volume.id, claim).await.map_err(|e| e.to_string()) })
    }
}

/// The volume as the state has it now, denormalized (a new snapshot after every checkpoint).
fn current_volume(snap: &State, namespace: &str, volume_id: &str) -> Result<CsiVolume, EndpointError> {
    let stored = snap.csi_volume(namespace, volume_id).ok_or_else(|| EndpointError::NotFound("no such volume".into()))?;
    Ok(snap.csi_volume_denormalized(stored).volume)
}

/// go-multierror's text.
fn multierror(errs: &[String]) -> String {
    let items: String = errs.iter().map(|e| format!("\n\t* {e}")).collect();
    format!("{} errors occurred:{items}\n\n", errs.len())
}

#[cfg(test)]
#[path = "csi_release_tests.rs"]
mod tests;
