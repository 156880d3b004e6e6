//! Re-checking a plan against the newest state, node by node.
//!
//! The applier judges plans against a state snapshot plus [`Overlay`]s: the
//! effects of plans accepted but not yet in that snapshot (the entry being
//! written, earlier plans of the same batch). Overlays are keyed by alloc ID,
//! so an effect that did reach the snapshot is not counted twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use nomad_proto::{Allocation, ClientStatus, Node, NodeStatus, Plan, PlanResult, SchedulingEligibility};

use super::fit::allocs_fit;
use crate::state::{State, Table};

/// Alloc changes accepted but maybe not yet in the state being read.
#[derive(Debug, Default, Clone)]
pub struct Overlay {
    nodes: HashMap<String, NodeChanges>,
}

#[derive(Debug, Default, Clone)]
struct NodeChanges {
    upserts: HashMap<String, Arc<Allocation>>,
    stops: HashSet<String>,
}

impl Overlay {
    /// Records the committed part of a plan.
    pub fn add(&mut self, result: &PlanResult) {
        let stops = result.node_update.iter().chain(result.node_preemptions.iter());
        for (node, allocs) in stops {
            let n = self.nodes.entry(node.clone()).or_default();
            for a in allocs {
                n.upserts.remove(&a.id);
                n.stops.insert(a.id.clone());
            }
        }
        for (node, allocs) in &result.node_allocation {
            let n = self.nodes.entry(node.clone()).or_default();
            for a in allocs {
                n.stops.remove(&a.id);
                n.upserts.insert(a.id.clone(), Arc::new(a.clone()));
            }
        }
    }

    /// Nothing recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// The non-terminal allocs on a node as `state` plus `overlays` (in order) have them.
fn live_allocs(state: &State, overlays: &[&Overlay], node_id: &str) -> BTreeMap<String, Arc<Allocation>> {
    let mut live: BTreeMap<String, Arc<Allocation>> =
        state.allocs_by_node(node_id).filter(|a| !a.terminal()).map(|a| (a.id.clone(), a.clone())).collect();
    for o in overlays {
        if let Some(n) = o.nodes.get(node_id) {
            for id in &n.stops {
                live.remove(id);
            }
            for (id, a) in &n.upserts {
                if a.terminal() {
                    live.remove(id);
                } else {
                    live.insert(id.clone(), a.clone());
                }
            }
        }
    }
    live
}

/// Whether the plan's part for one node may be committed; `Err` says why not.
pub fn evaluate_node_plan(state: &State, overlays: &[&Overlay], plan: &Plan, node_id: &str) -> Result<(), String> {
    let placements = plan.node_allocation.get(node_id).map(Vec::as_slice).unwrap_or_default();
    // Stops and evictions only remove load.
    if placements.is_empty() {
        return Ok(());
    }
    let node: &Node = state.node(node_id).ok_or("node does not exist")?;
    match node.status {
        NodeStatus::Ready => {}
        // A disconnected node only takes the scheduler's "unknown" markers for its allocs.
        NodeStatus::Disconnected if placements.iter().all(|a| a.client_status == ClientStatus::Unknown) => return Ok(()),
        NodeStatus::Disconnected => return Err("node is disconnected and contains invalid updates".into()),
        NodeStatus::Initializing | NodeStatus::Down => return Err("node is not ready for placements".into()),
    }
    let mut live = live_allocs(state, overlays, node_id);
    // In-place updates of allocs already there are fine even where new placements are not.
    if placements.iter().all(|a| live.contains_key(&a.id)) {
        return Ok(());
    }
    if node.drain_strategy.is_some() {
        return Err("node is draining".into());
    }
    if node.scheduling_eligibility == SchedulingEligibility::Ineligible {
        return Err("node is not eligible".into());
    }
    let removed = [&plan.node_update, &plan.node_preemptions].into_iter().filter_map(|m| m.get(node_id)).flatten();
    for a in removed {
        live.remove(&a.id);
    }
    for a in placements {
        live.remove(&a.id);
    }
    allocs_fit(node, live.values().map(|a| &**a).chain(placements.iter()))
}

/// The index a worker must reach before planning again after a refusal.
pub fn refresh_index(state: &State) -> u64 {
    state.max_index(&[Table::Allocs, Table::Nodes])
}

/// Decides which parts of `plan` can be committed: every node it touches is
/// re-checked. A refusal sets `refresh_index`; `all_at_once` plans commit
/// everything or nothing.
pub fn evaluate_plan(state: &State, overlays: &[&Overlay], plan: &Plan) -> PlanResult {
    let mut result = PlanResult::default();
    let nodes: std::collections::BTreeSet<&String> =
        plan.node_update.keys().chain(plan.node_allocation.keys()).chain(plan.node_preemptions.keys()).collect();
    let mut refused = false;
    for node_id in nodes {
        if let Err(reason) = evaluate_node_plan(state, overlays, plan, node_id) {
            tracing::info!(node_id = %node_id, eval_id = %plan.eval_id, reason = %reason, "plan for node rejected");
            refused = true;
            if plan.all_at_once {
                break;
            }
            continue;
        }
        let copy = |from: &BTreeMap<String, Vec<Allocation>>, to: &mut BTreeMap<String, Vec<Allocation>>| {
            if let Some(v) = from.get(node_id).filter(|v| !v.is_empty()) {
                to.insert(node_id.clone(), v.clone());
            }
        };
        copy(&plan.node_update, &mut result.node_update);
        copy(&plan.node_allocation, &mut result.node_allocation);
        if let Some(v) = plan.node_preemptions.get(node_id) {
            // Preempting an alloc that already stopped is moot.
            let live: Vec<Allocation> = v.iter().filter(|a| state.alloc(&a.id).is_some_and(|s| !s.terminal())).cloned().collect();
            if !live.is_empty() {
                result.node_preemptions.insert(node_id.clone(), live);
            }
        }
    }
    if refused {
        if plan.all_at_once {
            result = PlanResult::default();
        }
        result.refresh_index = refresh_index(state).max(1);
    }
    result
}
