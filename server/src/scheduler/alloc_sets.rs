//! Sets of allocs and the filters that sort them into reconciler buckets
//! (Nomad's `reconcile_util.go`). Sets are ordered by alloc ID so every run
//! over the same snapshot decides the same way.

use std::collections::BTreeMap;

use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Node, NodeStatus, Timestamp};

use super::reschedule;
use crate::state::State;

/// Allocs by ID.
pub(crate) type AllocSet<'a> = BTreeMap<&'a str, &'a Allocation>;

/// Reschedules within this window of now happen now (clock drift between servers).
pub(crate) const RESCHEDULE_WINDOW_NS: i64 = 1_000_000_000;

/// `a` without the members of `b`.
pub(crate) fn difference<'a>(a: &AllocSet<'a>, b: &AllocSet<'a>) -> AllocSet<'a> {
    a.iter().filter(|(k, _)| !b.contains_key(*k)).map(|(k, v)| (*k, *v)).collect()
}

/// Nodes of the job's allocs that force a decision: missing (`None`), down,
/// draining or disconnected. `initializing` nodes are not tainted.
pub(crate) type TaintedNodes<'a> = BTreeMap<&'a str, Option<&'a Node>>;

/// The tainted nodes among those of `allocs`.
pub(crate) fn tainted_nodes<'a>(state: &'a State, allocs: &[&'a Allocation]) -> TaintedNodes<'a> {
    let mut out = TaintedNodes::new();
    let mut seen = std::collections::HashSet::new();
    for a in allocs {
        if !seen.insert(a.node_id.as_str()) {
            continue;
        }
        match state.node(&a.node_id) {
            None => {
                out.insert(a.node_id.as_str(), None);
            }
            Some(n) if n.status == NodeStatus::Down || n.status == NodeStatus::Disconnected || n.drain_strategy.is_some() => {
                out.insert(a.node_id.as_str(), Some(n.as_ref()));
            }
            Some(_) => {}
        }
    }
    out
}

fn supports_disconnect(a: &Allocation) -> bool {
    a.job.as_ref().and_then(|j| j.lookup_task_group(&a.task_group)).is_some_and(|g| g.supports_disconnected_clients())
}

/// The buckets of [`filter_by_tainted`].
#[derive(Debug, Default)]
pub(crate) struct TaintedSplit<'a> {
    pub(crate) untainted: AllocSet<'a>,
    pub(crate) migrate: AllocSet<'a>,
    pub(crate) lost: AllocSet<'a>,
    pub(crate) disconnecting: AllocSet<'a>,
    pub(crate) reconnecting: AllocSet<'a>,
    pub(crate) ignore: AllocSet<'a>,
}

/// Sorts allocs by what their node's state means for them (reference §3, in order).
pub(crate) fn filter_by_tainted<'a>(set: &AllocSet<'a>, tainted: &TaintedNodes<'a>, now: Timestamp) -> TaintedSplit<'a> {
    let mut out = TaintedSplit::default();
    for (&id, &a) in set {
        let supports = supports_disconnect(a);
        let mut reconnect = false;
        let mut expired = false;
        if supports && matches!(a.client_status, ClientStatus::Unknown | ClientStatus::Running | ClientStatus::Failed) {
            reconnect = a.needs_to_reconnect();
            if reconnect {
                expired = a.expired(now);
            }
        }
        // A reconnecting alloc that failed while away is handled as a failed reconnect.
        if supports && reconnect && a.desired_status == DesiredStatus::Run && a.client_status == ClientStatus::Failed {
            out.reconnecting.insert(id, a);
            continue;
        }
        let tainted_node = tainted.get(a.node_id.as_str());
        if let Some(Some(node)) = tainted_node {
            match node.status {
                NodeStatus::Disconnected => {
                    if !supports {
                        out.lost.insert(id, a);
                        continue;
                    }
                    match a.client_status {
                        ClientStatus::Running => {
                            out.disconnecting.insert(id, a);
                            continue;
                        }
                        ClientStatus::Pending => {
                            out.lost.insert(id, a);
                            continue;
                        }
                        _ => {}
                    }
                }
                NodeStatus::Ready if reconnect => {
                    if expired {
                        out.lost.insert(id, a);
                    } else {
                        out.reconnecting.insert(id, a);
                    }
                    continue;
                }
                _ => {}
            }
        }
        if a.terminal() && !reconnect {
            out.untainted.insert(id, a);
            continue;
        }
        if a.desired_transition.should_migrate() {
            out.migrate.insert(id, a);
            continue;
        }
        if supports && a.expired(now) {
            out.lost.insert(id, a);
            continue;
        }
        if supports && a.client_status == ClientStatus::Unknown && a.desired_status == DesiredStatus::Run {
            out.ignore.insert(id, a);
            continue;
        }
        if supports && reconnect && a.client_status == ClientStatus::Failed && a.desired_status == DesiredStatus::Stop {
            out.ignore.insert(id, a);
            continue;
        }
        match tainted_node {
            None => {
                if reconnect {
                    if expired {
                        out.lost.insert(id, a);
                    } else {
                        out.reconnecting.insert(id, a);
                    }
                } else {
                    out.untainted.insert(id, a);
                }
            }
            Some(None) => {
                out.lost.insert(id, a);
            }
            Some(Some(n)) if n.status == NodeStatus::Down => {
                out.lost.insert(id, a);
            }
            Some(Some(_)) => {
                out.untainted.insert(id, a);
            }
        }
    }
    out
}

/// A failed alloc to reschedule at a later time.
#[derive(Debug, Clone)]
pub(crate) struct DelayedReschedule<'a> {
    pub(crate) alloc: &'a Allocation,
    pub(crate) at: Timestamp,
}

/// The buckets of [`filter_by_rescheduleable`].
#[derive(Debug, Default)]
pub(crate) struct RescheduleSplit<'a> {
    pub(crate) untainted: AllocSet<'a>,
    pub(crate) now: AllocSet<'a>,
    pub(crate) later: Vec<DelayedReschedule<'a>>,
}

/// Splits off allocs to replace now or later. With `disconnecting`, every
/// live, not-yet-unknown alloc is replaced now whatever its policy, and the
/// untainted bucket stays empty.
pub(crate) fn filter_by_rescheduleable<'a>(
    set: &AllocSet<'a>,
    batch: bool,
    disconnecting: bool,
    now: Timestamp,
    eval_id: &str,
) -> RescheduleSplit<'a> {
    let mut out = RescheduleSplit::default();
    for (&id, &a) in set {
        if disconnecting && a.client_status == ClientStatus::Unknown {
            continue;
        }
        // Failed allocs that were already replaced are done.
        if !a.next_allocation.is_empty() && a.terminal() {
            continue;
        }
        let (untainted, ignore) = should_filter(a, batch);
        if untainted && !disconnecting {
            out.untainted.insert(id, a);
        }
        if untainted || ignore {
            continue;
        }
        let (resched_now, later) = reschedule_decision(a, now, eval_id, disconnecting);
        if !disconnecting && !resched_now {
            out.untainted.insert(id, a);
            if let Some(at) = later {
                out.later.push(DelayedReschedule { alloc: a, at });
            }
        } else {
            out.now.insert(id, a);
        }
    }
    out
}

/// (untainted, ignore) for allocs that need no reschedule decision.
fn should_filter(a: &Allocation, batch: bool) -> (bool, bool) {
    if batch {
        match a.desired_status {
            DesiredStatus::Stop => return (reschedule::ran_successfully(a), !reschedule::ran_successfully(a)),
            DesiredStatus::Evict => return (false, true),
            DesiredStatus::Run => {}
        }
        return if a.client_status == ClientStatus::Failed { (false, false) } else { (true, false) };
    }
    if matches!(a.desired_status, DesiredStatus::Stop | DesiredStatus::Evict) {
        return (false, true);
    }
    if matches!(a.client_status, ClientStatus::Complete | ClientStatus::Lost) {
        return (false, true);
    }
    (false, false)
}

/// (reschedule now, reschedule at) for a failed (or disconnecting) alloc.
fn reschedule_decision(a: &Allocation, now: Timestamp, eval_id: &str, disconnecting: bool) -> (bool, Option<Timestamp>) {
    let forced = a.desired_transition.should_force_reschedule();
    let next = if disconnecting { reschedule::next_reschedule_time_from(a, now) } else { reschedule::next_reschedule_time(a) };
    let Some((at, _)) = next.filter(|(_, eligible)| *eligible) else { return (forced, None) };
    if a.followup_eval_id == eval_id || at.unix_nanos() - now.unix_nanos() <= RESCHEDULE_WINDOW_NS {
        return (true, None);
    }
    let later = a.followup_eval_id.is_empty().then_some(at);
    (forced, later)
}

/// Lost allocs whose group has `stop_after_client_disconnect` wait out the
/// delay (plus the longest kill timeout) before being replaced.
pub(crate) fn delay_by_stop_after_client_disconnect<'a>(lost: &AllocSet<'a>, now: Timestamp) -> Vec<DelayedReschedule<'a>> {
    let mut out = Vec::new();
    for &a in lost.values() {
        let Some(tg) = a.job.as_ref().and_then(|j| j.lookup_task_group(&a.task_group)) else { continue };
        let Some(stop_after) = tg.stop_after_client_disconnect.filter(|d| *d != 0) else { continue };
        // Count from the first time the alloc was marked lost, else from now.
        let since = a
            .alloc_states
            .iter()
            .find(|s| s.field == nomad_proto::alloc::ALLOC_STATE_FIELD_CLIENT_STATUS && s.value == ClientStatus::Lost.as_str())
            .map(|s| s.time)
            .unwrap_or(now);
        let kill = tg.tasks.iter().map(|t| t.kill_timeout).fold(nomad_proto::job::DEFAULT_KILL_TIMEOUT_NS, i64::max);
        let at = since.add_nanos(stop_after).add_nanos(kill);
        if at > now {
            out.push(DelayedReschedule { alloc: a, at });
        }
    }
    out
}

/// Disconnecting allocs time out `max_client_disconnect` from now.
pub(crate) fn delay_by_max_client_disconnect<'a>(disconnecting: &AllocSet<'a>, now: Timestamp) -> Vec<DelayedReschedule<'a>> {
    disconnecting
        .values()
        .filter_map(|&a| {
            let at = a.disconnect_timeout(now);
            (at > now).then_some(DelayedReschedule { alloc: a, at })
        })
        .collect()
}

/// Allocs the servers already stopped but whose node went down (or away)
/// while they ran are marked lost (Nomad's `updateNonTerminalAllocsToLost`).
pub(crate) fn stop_lost_on_down_nodes(proposed: &mut super::proposed::Proposed<'_>, tainted: &TaintedNodes<'_>, allocs: &[&Allocation]) {
    for &a in allocs {
        let Some(node) = tainted.get(a.node_id.as_str()) else { continue };
        if node.is_some_and(|n| n.status != NodeStatus::Down) {
            continue;
        }
        if a.server_terminal() && matches!(a.client_status, ClientStatus::Running | ClientStatus::Pending) {
            proposed.append_stop(a, nomad_proto::alloc::ALLOC_LOST_DESC, Some(ClientStatus::Lost), "");
        }
    }
}
