//! The nodes a job may be placed on.

use std::collections::{BTreeMap, HashSet};

use nomad_proto::node::glob_match;
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

/// Nomad's `readyNodesInDCsAndPool`. Datacenter globs are matched once per
/// distinct datacenter, not once per node.
pub(crate) fn ready_nodes<'a>(state: &'a State, job: &Job) -> ReadyNodes<'a> {
    let mut out = ReadyNodes { nodes: Vec::with_capacity(state.node_count()), not_ready: HashSet::new(), by_dc: BTreeMap::new() };
    // (datacenter, matches the job, ready nodes seen) for the few datacenters there are.
    let mut dcs: Vec<(&'a str, bool, i64)> = Vec::new();
    let any_pool = job.node_pool.is_empty() || job.node_pool == nomad_proto::job::ALL_NODE_POOL;
    for n in state.nodes() {
        // Status fields sit in the node itself; pool and datacenter strings cost a pointer chase.
        let ready = n.is_ready_for_placement();
        if !any_pool && !n.in_pool(&job.node_pool) {
            continue;
        }
        if !ready {
            out.not_ready.insert(n.id.as_str());
            continue;
        }
        let pos = match dcs.iter().position(|(dc, _, _)| *dc == n.datacenter) {
            Some(p) => p,
            None => {
                let ok = job.datacenters.iter().any(|p| glob_match(p, &n.datacenter));
                dcs.push((n.datacenter.as_str(), ok, 0));
                dcs.len() - 1
            }
        };
        let entry = &mut dcs[pos];
        if entry.1 {
            entry.2 += 1;
            out.nodes.push(n.as_ref());
        }
    }
    out.by_dc = dcs.into_iter().filter(|(_, ok, _)| *ok).map(|(dc, _, n)| (dc.to_string(), n)).collect();
    out
}
