//! The CSI volumes table, keyed by (namespace, volume ID).
//!
//! A stored volume holds its claims but neither its plugin's health nor its allocs' fate: reads
//! that answer with a volume denormalize a copy (`crate::csi::denormalize`), as Nomad's
//! `CSIVolumeByID` and `CSIVolumeDenormalize` do.

use std::sync::Arc;

use nomad_proto::csi::{CsiVolume, CsiVolumeClaim, CsiVolumeClaimState};
use nomad_proto::{AllocListStub, DesiredStatus, NamespacedId};

use super::{Change, State, Table, Txn, TxnError, Watch};
use crate::csi;

/// A volume as reads show it: denormalized, with the stubs of its claiming allocs.
#[derive(Debug, Clone, PartialEq)]
pub struct CsiVolumeView {
    /// The volume, plugin health and past claims filled in.
    pub volume: CsiVolume,
    /// The claiming allocs still in the state.
    pub allocations: Vec<AllocListStub>,
}

impl State {
    /// Every volume, ordered by (namespace, ID).
    pub fn csi_volumes(&self) -> impl Iterator<Item = &Arc<CsiVolume>> {
        self.csi_volumes.values()
    }

    /// One volume as stored.
    pub fn csi_volume(&self, namespace: &str, id: &str) -> Option<&Arc<CsiVolume>> {
        self.csi_volumes.get(&NamespacedId::new(namespace, id))
    }

    /// A copy of `vol` with its plugin's health (`CSIVolumeDenormalizePlugins`).
    pub fn csi_volume_with_plugin(&self, vol: &CsiVolume) -> CsiVolume {
        let mut v = vol.clone();
        csi::denormalize_plugin(&mut v, self.csi_plugin(&vol.plugin_id).map(|p| &**p));
        v
    }

    /// A copy of `vol` with its plugin's health and its allocs' fate (`CSIVolumeDenormalize`).
    pub fn csi_volume_denormalized(&self, vol: &CsiVolume) -> CsiVolumeView {
        let mut v = self.csi_volume_with_plugin(vol);
        let lookup = |id: &str| self.alloc(id).map(|a| &**a);
        csi::denormalize_allocs(&mut v, lookup);
        let allocations = csi::denormalize::claim_alloc_stubs(&v, lookup);
        CsiVolumeView { volume: v, allocations }
    }

    /// Every volume created at or below `created_by` that has past claims once denormalized
    /// (claims of finished or collected allocs, releases in progress): what the volume watcher
    /// reaps and the claim GC marks.
    pub fn csi_volumes_with_past_claims(&self, created_by: u64) -> Vec<CsiVolume> {
        self.csi_volumes
            .values()
            .filter(|v| v.create_index <= created_by)
            .map(|v| {
                let mut v = self.csi_volume_with_plugin(v);
                csi::denormalize_allocs(&mut v, |id| self.alloc(id).map(|a| &**a));
                v
            })
            .filter(|v| !v.past_claims.is_empty())
            .collect()
    }

    /// The CSI volumes the allocs on a node want or use (`CSIVolumesByNodeID`): for allocs
    /// desired to run or running, each `csi` volume of their group; a `per_alloc` volume is the
    /// alloc's own (`source[index]`; Nomad 1.6 counts the bare source, which no volume has).
    pub fn csi_volumes_by_node(&self, node_id: &str) -> Vec<Arc<CsiVolume>> {
        let mut keys = std::collections::BTreeSet::new();
        for a in self.allocs_by_node(node_id) {
            if a.desired_status != DesiredStatus::Run && a.client_status != nomad_proto::ClientStatus::Running {
                continue;
            }
            let Some(tg) = a.job.as_ref().and_then(|j| j.lookup_task_group(&a.task_group)) else { continue };
            for v in tg.volumes.values().filter(|v| v.volume_type == "csi") {
                keys.insert(NamespacedId::new(&a.namespace, &v.source_for(&a.name)));
            }
        }
        keys.iter().filter_map(|k| self.csi_volumes.get(k).cloned()).collect()
    }
}

impl Txn<'_> {
    fn put_csi_volume(&mut self, vol: CsiVolume) {
        let key = NamespacedId::new(&vol.namespace, &vol.id);
        self.touch(Table::CsiVolumes);
        self.touch_key(Watch::CsiVolume(Watch::job_key(&vol.namespace, &vol.id)));
        // The event shows the volume as a read would, so it is denormalized here, once.
        let view = self.state.csi_volume_denormalized(&vol);
        self.state.csi_volumes.insert(key, Arc::new(vol));
        self.record(Change::CsiVolume(Arc::new(view)));
    }

    /// Registers volumes (`UpsertCSIVolume`): the namespace must exist; a known volume keeps its
    /// identity (external ID, plugin, provider) and cannot be replaced while allocs claim it.
    /// Its past claims (releases in progress) are kept.
    pub fn upsert_csi_volumes(&mut self, volumes: &[CsiVolume]) -> Result<(), TxnError> {
        for v in volumes {
            if self.state.namespace(&v.namespace).is_none() {
                return Err(TxnError(format!("volume {} is in nonexistent namespace {}", v.id, v.namespace)));
            }
            let mut v = v.clone();
            match self.state.csi_volume(&v.namespace, &v.id).cloned() {
                Some(old) => {
                    if old.external_id != v.external_id || old.plugin_id != v.plugin_id || old.provider != v.provider {
                        return Err(TxnError(format!("volume identity cannot be updated: {}", v.id)));
                    }
                    if old.in_use() {
                        return Err(TxnError("volume cannot be updated while in use".into()));
                    }
                    v.create_index = old.create_index;
                    v.read_allocs.clear();
                    v.write_allocs.clear();
                    v.read_claims.clear();
                    v.write_claims.clear();
                    v.past_claims = old.past_claims.clone();
                }
                None => {
                    v.create_index = self.index;
                    v.read_allocs.clear();
                    v.write_allocs.clear();
                    v.read_claims.clear();
                    v.write_claims.clear();
                    v.past_claims.clear();
                }
            }
            v.modify_index = self.index;
            self.put_csi_volume(v);
        }
        Ok(())
    }

    /// Applies a claim or a release checkpoint (`CSIVolumeClaim`). The volume is stored
    /// denormalized (so past claims for finished allocs are written too); a claim without an
    /// alloc (GC, detach) changes nothing but the volume's index, which wakes the volume watcher.
    pub fn claim_csi_volume(&mut self, namespace: &str, volume_id: &str, claim: &CsiVolumeClaim) -> Result<(), TxnError> {
        let stored = self.state.csi_volume(namespace, volume_id).ok_or_else(|| TxnError(format!("volume not found: {volume_id}")))?;
        let alloc_exists = claim.state == CsiVolumeClaimState::Taken && self.state.alloc(&claim.allocation_id).is_some();
        let mut vol = self.state.csi_volume_denormalized(stored).volume;
        if !claim.allocation_id.is_empty() {
            csi::claim(&mut vol, claim.clone(), alloc_exists).map_err(|e| TxnError(e.to_string()))?;
        }
        vol.modify_index = self.index;
        self.put_csi_volume(vol);
        Ok(())
    }

    /// Removes volumes (`CSIVolumeDeregister`). A claimed volume is refused unless `force` and
    /// every claiming alloc still in the state is terminal.
    pub fn deregister_csi_volumes(&mut self, namespace: &str, ids: &[String], force: bool) -> Result<(), TxnError> {
        for id in ids {
            let key = NamespacedId::new(namespace, id);
            let vol = self.state.csi_volumes.get(&key).ok_or_else(|| TxnError(format!("volume not found: {id}")))?;
            if vol.in_use() {
                let safe = vol.read_allocs.iter().chain(&vol.write_allocs).all(|a| self.state.alloc(a).is_none_or(|a| a.terminal()));
                if !force || !safe {
                    return Err(TxnError(format!("volume in use: {id}")));
                }
            }
            let last = self.state.csi_volume_denormalized(vol);
            self.state.csi_volumes.remove(&key);
            self.record(Change::CsiVolumeDeleted(Arc::new(last)));
            self.touch(Table::CsiVolumes);
            self.touch_key(Watch::CsiVolume(Watch::job_key(namespace, id)));
        }
        Ok(())
    }
}
