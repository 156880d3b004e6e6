//! CSI volume feasibility (Nomad's `CSIVolumeChecker`): can this node mount the group's CSI
//! volumes now?
//!
//! Unlike the checks in `feasible.rs` the answer depends on the node's own plugin instances and
//! on the volumes' claims, not on the node's class, so it is never memoized per class.
//!
//! For each `csi` volume request (source `<source>[<index>]` with `per_alloc`): the volume exists
//! in the job's namespace; the node runs its plugin, healthy, with room under the plugin's
//! `MaxVolumes`; the volume's topologies include the node's; and the volume takes another reader
//! (read-only requests) or writer (the others), unless the writer claims it has are the job's own.

use nomad_proto::csi::{CsiTopology, CsiVolume};
use nomad_proto::{Node, TaskGroup};

use super::fast_hash::FastMap;
use crate::csi::claim::{has_free_write_claims, read_schedulable, write_schedulable};
use crate::state::State;

/// Nomad's filter reasons (`FilterConstraintCSI*`), recorded in `ConstraintFiltered`.
pub(crate) mod reason {
    pub(crate) fn plugin_missing(plugin: &str, node: &str) -> String {
        format!("CSI plugin {plugin} is missing from client {node}")
    }
    pub(crate) fn plugin_unhealthy(plugin: &str, node: &str) -> String {
        format!("CSI plugin {plugin} is unhealthy on client {node}")
    }
    pub(crate) fn plugin_max_volumes(plugin: &str, node: &str) -> String {
        format!("CSI plugin {plugin} has the maximum number of volumes on client {node}")
    }
    pub(crate) fn volume_missing(id: &str) -> String {
        format!("missing CSI Volume {id}")
    }
    pub(crate) fn no_read(id: &str) -> String {
        format!("CSI volume {id} is unschedulable or has exhausted its available reader claims")
    }
    pub(crate) fn no_write(id: &str) -> String {
        format!("CSI volume {id} is unschedulable or is read-only")
    }
    pub(crate) fn in_use(id: &str) -> String {
        format!("CSI volume {id} has exhausted its available writer claims")
    }
    pub(crate) fn gcd_alloc(id: &str, alloc: &str) -> String {
        format!(
            "CSI volume {id} has exhausted its available writer claims and is claimed by a garbage collected allocation {alloc}; waiting for claim to be released"
        )
    }
    pub(crate) const TOPOLOGY: &str = "did not meet topology requirement";
}

/// One group's CSI volume request.
struct CsiAsk {
    request: nomad_proto::volume::VolumeRequest,
}

/// The CSI volume requests of each group of one job, compiled once per eval.
pub(crate) struct CsiChecks {
    namespace: String,
    job_id: String,
    groups: Vec<Vec<CsiAsk>>,
}

impl CsiChecks {
    pub(crate) fn new(job: &nomad_proto::Job) -> CsiChecks {
        CsiChecks { namespace: job.namespace.clone(), job_id: job.id.clone(), groups: job.task_groups.iter().map(group_asks).collect() }
    }

    /// True when no group asks for a CSI volume (the common case costs nothing).
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.iter().all(Vec::is_empty)
    }

    /// Checks group `group` on `node` for the alloc named `alloc_name`; the error is the filter
    /// reason.
    pub(crate) fn check(&self, state: &State, node: &Node, group: usize, alloc_name: &str) -> Result<(), String> {
        let Some(asks) = self.groups.get(group).filter(|a| !a.is_empty()) else { return Ok(()) };
        // Volumes the node's allocs already want or use, per plugin, for `MaxVolumes`.
        let mut per_plugin: FastMap<String, i64> = FastMap::default();
        for vol in state.csi_volumes_by_node(&node.id) {
            *per_plugin.entry(vol.plugin_id.clone()).or_insert(0) += 1;
        }
        for ask in asks {
            let source = ask.request.source_for(alloc_name);
            let Some(stored) = state.csi_volume(&self.namespace, &source) else { return Err(reason::volume_missing(&source)) };
            let vol = state.csi_volume_with_plugin(stored);
            self.check_volume(state, node, &vol, ask.request.read_only, per_plugin.get(&vol.plugin_id).copied().unwrap_or(0))?;
        }
        Ok(())
    }

    fn check_volume(&self, state: &State, node: &Node, vol: &CsiVolume, read_only: bool, on_node: i64) -> Result<(), String> {
        let Some(plugin) = node.csi_node_plugins.get(&vol.plugin_id) else {
            return Err(reason::plugin_missing(&vol.plugin_id, &node.id));
        };
        if !plugin.healthy {
            return Err(reason::plugin_unhealthy(&vol.plugin_id, &node.id));
        }
        let info = plugin.node_info.as_ref();
        // A node plugin that reports no limit (0) has none (Nomad's client stores MaxInt64).
        let max = info.map(|i| i.max_volumes).filter(|m| *m > 0).unwrap_or(i64::MAX);
        if on_node >= max {
            return Err(reason::plugin_max_volumes(&vol.plugin_id, &node.id));
        }
        if !vol.topologies.is_empty()
            && !info.and_then(|i| i.accessible_topology.as_ref()).is_some_and(|t| topology_matches(t, &vol.topologies))
        {
            return Err(reason::TOPOLOGY.into());
        }
        if read_only {
            if !read_schedulable(vol) {
                return Err(reason::no_read(&vol.id));
            }
            return Ok(());
        }
        if !write_schedulable(vol) {
            return Err(reason::no_write(&vol.id));
        }
        if !has_free_write_claims(vol) {
            // Writer claims held by this job's own allocs (an update in place, a replacement
            // waiting for its predecessor's release) do not block it.
            for id in &vol.write_allocs {
                match state.alloc(id) {
                    None => return Err(reason::gcd_alloc(&vol.id, id)),
                    Some(a) if a.namespace != self.namespace || a.job_id != self.job_id => return Err(reason::in_use(&vol.id)),
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

fn group_asks(tg: &TaskGroup) -> Vec<CsiAsk> {
    tg.volumes.values().filter(|v| v.volume_type == "csi").map(|v| CsiAsk { request: v.clone() }).collect()
}

/// The node's topology is one of the volume's (`CSITopology.MatchFound`).
fn topology_matches(node: &CsiTopology, volume: &[CsiTopology]) -> bool {
    volume.iter().any(|t| t.segments == node.segments)
}
