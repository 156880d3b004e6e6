//! The nodes a job may be placed on.

use std::collections::{BTreeMap, HashSet};

use nomad_proto::{Job, Node};

use crate::state::State;

/// Ready nodes in the job's datacenters and pool.
pub(crate) struct ReadyNodes<'a> {
    pub(crate) nodes: Vec<&'a Node>,
    /// Nodes of the pool that are not ready (down, draining, ineligible, ...).
    pub(crate) not_ready: HashSet<&'a str>,
    /// Ready nodes per datacenter (`NodesAvailable`).
    pub(crate) by_dc: BTreeMap<String, i64>,
}

/// Nomad's `readyNodesInDCsAndPool`.
pub(crate) fn ready_nodes<'a>(state: &'a State, job: &Job) -> ReadyNodes<'a> {
    let mut out = ReadyNodes { nodes: Vec::new(), not_ready: HashSet::new(), by_dc: BTreeMap::new() };
    for n in state.nodes() {
        if !job.node_pool.is_empty() && !n.in_pool(&job.node_pool) {
            continue;
        }
        if !n.is_ready_for_placement() {
            out.not_ready.insert(n.id.as_str());
            continue;
        }
        if n.in_any_datacenter(&job.datacenters) {
            out.nodes.push(n.as_ref());
            *out.by_dc.entry(n.datacenter.clone()).or_insert(0) += 1;
        }
    }
    out
}
