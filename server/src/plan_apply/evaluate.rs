//! Re-checking a plan against the newest state, node by node.
//!
//! The applier judges plans against a state snapshot plus [`Overlay`]s: the
//! effects of plans accepted but not yet in that snapshot (the entry being
//! written, earlier plans of the same batch). Overlays are keyed by alloc ID,
//! so an effect that did reach the snapshot is not counted twice.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use nomad_proto::{Allocation, ClientStatus, Node, NodeStatus, Plan, PlanResult, SchedulingEligibility};

use super::fit::{Held, fits};
use crate::state::{AllocHold, Load, State, Table};

/// Alloc changes accepted but maybe not yet in the state being read.
#[derive(Debug, Default, Clone)]
pub struct Overlay {
    nodes: HashMap<String, NodeChanges>,
}

#[derive(Debug, Default, Clone)]
struct NodeChanges {
    upserts: HashMap<String, Held>,
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
                n.upserts.insert(a.id.clone(), Held::of(a));
            }
        }
    }

    /// Nothing recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Whether alloc `id` runs on `node_id` as `state` plus `overlays` have it.
fn is_live(state: &State, overlays: &[&Overlay], node_id: &str, id: &str) -> bool {
    for o in overlays.iter().rev() {
        if let Some(n) = o.nodes.get(node_id) {
            if n.stops.contains(id) {
                return false;
            }
            if let Some(h) = n.upserts.get(id) {
                return !h.terminal;
            }
        }
    }
    state.alloc(id).is_some_and(|a| a.node_id == node_id && !a.terminal())
}

/// What the live allocs on a node hold as `state` plus `overlays` (in order) have it, leaving
/// out the allocs in `replaced` (the plan's own stops and placements on the node).
///
/// Starts from the node's summed load in `state` and corrects it for the few allocs the
/// overlays or the plan touch, rather than walking every alloc on the node.
fn load_on(state: &State, overlays: &[&Overlay], node_id: &str, replaced: &[&str]) -> Load {
    let mut load = state.node_load(node_id).map(|l| l.live.clone()).unwrap_or_default();
    // The last overlay to touch an alloc decides it: Some(held) upserted, None stopped.
    let mut touched: Vec<(&str, Option<&Held>)> = Vec::new();
    for o in overlays {
        let Some(n) = o.nodes.get(node_id) else { continue };
        let changes = n.stops.iter().map(|id| (id.as_str(), None)).chain(n.upserts.iter().map(|(id, h)| (id.as_str(), Some(h))));
        for (id, held) in changes {
            match touched.iter_mut().find(|(t, _)| *t == id) {
                Some(t) => t.1 = held,
                None => touched.push((id, held)),
            }
        }
    }
    let mut counted_in_state = |id: &str| {
        if let Some(a) = state.alloc(id)
            && a.node_id == node_id
            && !a.terminal()
        {
            load.remove(&AllocHold::of(a));
        }
    };
    let mut seen: Vec<&str> = Vec::with_capacity(touched.len() + replaced.len());
    for id in touched.iter().map(|(id, _)| *id).chain(replaced.iter().copied()) {
        if !seen.contains(&id) {
            seen.push(id);
            counted_in_state(id);
        }
    }
    for (id, held) in &touched {
        if let Some(h) = held
            && !h.terminal
            && !replaced.contains(id)
        {
            load.add(&h.hold);
        }
    }
    load
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
    // ...and only a disconnected node does: a plan made while the node was away must not mark
    // the allocs its client is reporting again (the client would be ignored, and they replaced).
    if placements.iter().any(|a| a.client_status == ClientStatus::Unknown) {
        return Err(STALE_UNKNOWN.into());
    }
    // In-place updates of allocs already there are fine even where new placements are not.
    if placements.iter().all(|a| is_live(state, overlays, node_id, &a.id)) {
        return Ok(());
    }
    if node.drain_strategy.is_some() {
        return Err("node is draining".into());
    }
    if node.scheduling_eligibility == SchedulingEligibility::Ineligible {
        return Err("node is not eligible".into());
    }
    let removed = [&plan.node_update, &plan.node_preemptions].into_iter().filter_map(|m| m.get(node_id)).flatten();
    let replaced: Vec<&str> = removed.chain(placements.iter()).map(|a| a.id.as_str()).collect();
    let mut load = load_on(state, overlays, node_id, &replaced);
    placements.iter().for_each(|a| load.add(&AllocHold::of(a)));
    fits(node, &load)
}

/// The index a worker must reach before planning again after a refusal.
pub fn refresh_index(state: &State) -> u64 {
    state.max_index(&[Table::Allocs, Table::Nodes])
}

/// Why a node's part that marks allocs `unknown` is refused when the node is no longer disconnected.
pub const STALE_UNKNOWN: &str = "node is no longer disconnected; its allocs cannot be marked unknown";
/// Why a node's part is refused when another node's part for the same alloc name was.
pub const SAME_NAME_REFUSED: &str = "changes an alloc name whose change on another node was refused";

/// The nodes whose part of `plan` may be committed, and whether any was refused.
/// `all_at_once` plans get all their nodes or none.
///
/// A plan's changes to one alloc name are decided together: a replacement
/// placed for an alloc the plan marks `unknown`, a replacement stopped in
/// favour of a reconnecting original, an old alloc stopped for its new
/// version. When the part on one node is refused (the node came back, went
/// down or filled up since the snapshot), the parts on other nodes that touch
/// the same names are refused too, or the commit would leave a name with two
/// copies, or with none, until the worker plans again.
pub fn accepted_nodes(state: &State, overlays: &[&Overlay], plan: &Plan) -> (Vec<String>, bool) {
    let nodes: BTreeSet<&String> = plan.node_update.keys().chain(plan.node_allocation.keys()).chain(plan.node_preemptions.keys()).collect();
    let mut accepted = Vec::with_capacity(nodes.len());
    let mut refused = false;
    for node_id in nodes {
        match evaluate_node_plan(state, overlays, plan, node_id) {
            Ok(()) => accepted.push(node_id.clone()),
            Err(reason) => {
                tracing::info!(node_id = %node_id, eval_id = %plan.eval_id, reason = %reason, "plan for node rejected");
                if plan.all_at_once {
                    return (Vec::new(), true);
                }
                refused = true;
            }
        }
    }
    if refused {
        // Stops may be sent bare (ID only): the stored alloc knows its name.
        let key = |a: &Allocation| -> Option<(String, String)> {
            let stored = state.alloc(&a.id);
            let name = if a.name.is_empty() { stored.map(|s| s.name.clone())? } else { a.name.clone() };
            let ns = if a.namespace.is_empty() { stored.map(|s| s.namespace.clone()).unwrap_or_default() } else { a.namespace.clone() };
            (!name.is_empty()).then_some((ns, name))
        };
        let refused_names: HashSet<(String, String)> = plan
            .node_allocation
            .iter()
            .filter(|(node, _)| !accepted.contains(node))
            .flat_map(|(_, allocs)| allocs)
            .filter_map(key)
            .collect();
        if !refused_names.is_empty() {
            accepted.retain(|node| {
                let touches = [&plan.node_allocation, &plan.node_update]
                    .into_iter()
                    .filter_map(|m| m.get(node))
                    .flatten()
                    .any(|a| key(a).is_some_and(|k| refused_names.contains(&k)));
                if touches {
                    tracing::info!(node_id = %node, eval_id = %plan.eval_id, reason = SAME_NAME_REFUSED, "plan for node rejected");
                }
                !touches
            });
        }
    }
    (accepted, refused)
}

/// Moves the accepted nodes' parts of `plan` into a result; a refusal sets `refresh_index`.
pub fn take_accepted(state: &State, plan: &mut Plan, accepted: &[String], refused: bool) -> PlanResult {
    let mut result = PlanResult::default();
    for node_id in accepted {
        let take = |from: &mut BTreeMap<String, Vec<Allocation>>, to: &mut BTreeMap<String, Vec<Allocation>>| {
            if let Some(v) = from.remove(node_id).filter(|v| !v.is_empty()) {
                to.insert(node_id.clone(), v);
            }
        };
        take(&mut plan.node_update, &mut result.node_update);
        take(&mut plan.node_allocation, &mut result.node_allocation);
        if let Some(v) = plan.node_preemptions.remove(node_id) {
            // Preempting an alloc that already stopped is moot.
            let live: Vec<Allocation> = v.into_iter().filter(|a| state.alloc(&a.id).is_some_and(|s| !s.terminal())).collect();
            if !live.is_empty() {
                result.node_preemptions.insert(node_id.clone(), live);
            }
        }
    }
    if refused {
        result.refresh_index = refresh_index(state).max(1);
    }
    result
}

/// Decides which parts of `plan` can be committed: every node it touches is
/// re-checked. A refusal sets `refresh_index`; `all_at_once` plans commit
/// everything or nothing.
pub fn evaluate_plan(state: &State, overlays: &[&Overlay], plan: &Plan) -> PlanResult {
    let (accepted, refused) = accepted_nodes(state, overlays, plan);
    take_accepted(state, &mut plan.clone(), &accepted, refused)
}
