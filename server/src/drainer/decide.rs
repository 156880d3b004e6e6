//! What the drainer does next, decided from one state snapshot and the time.
//!
//! The decision keeps no memory between runs: everything it needs is in the
//! state (drain strategies, alloc health, `DesiredTransition.Migrate`), so a
//! new leader picks up a drain exactly where the old one left it.
//!
//! Per draining node, in order (reference: nomad-node-lifecycle.md §7):
//! 1. service, batch and sysbatch allocs. Service groups migrate
//!    `migrate.max_parallel` at a time across the cluster: a group may have at
//!    most `max_parallel` allocs that are not healthy-and-staying, so the next
//!    batch waits until the replacements of the last one report health.
//!    Batch and sysbatch allocs are not migrated: they may finish until the
//!    deadline.
//! 2. once every alloc of step 1 is client-terminal: system allocs (unless
//!    the drain ignores system jobs);
//! 3. once those are client-terminal too: CSI plugin allocs, so volumes can
//!    still be unpublished while everything else leaves.
//!
//! At the force deadline every alloc still there is migrated at once. The
//! drain is complete when every alloc that must leave is client-terminal.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use nomad_proto::{Allocation, Job, JobType, NamespacedId, Node, Timestamp};

use crate::state::State;

/// What to do now.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DrainActions {
    /// Allocs to mark for migration, by ID.
    pub migrate: BTreeMap<String, Arc<Allocation>>,
    /// Nodes whose drain is done, with whether the force deadline had passed.
    pub complete: Vec<(String, bool)>,
    /// The earliest force deadline still ahead (when to look again even if nothing changes).
    pub next_deadline: Option<Timestamp>,
}

/// The drain phase an alloc belongs to (lower phases leave first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Service, batch and sysbatch.
    Workload,
    /// System jobs.
    System,
    /// CSI plugins (of any job type).
    Plugin,
}

fn job_is_plugin(job: &Job) -> bool {
    job.task_groups.iter().flat_map(|g| g.tasks.iter()).any(|t| t.csi_plugin_config.is_some())
}

fn phase(a: &Allocation) -> Phase {
    match a.job.as_deref() {
        Some(j) if job_is_plugin(j) => Phase::Plugin,
        Some(j) if j.job_type == JobType::System => Phase::System,
        _ => Phase::Workload,
    }
}

/// The client has judged the alloc's health (healthy or not), as Nomad's `HasHealth`.
fn has_health(a: &Allocation) -> bool {
    a.deployment_status.as_ref().and_then(|d| d.get("Healthy")).is_some_and(|h| !h.is_null())
}

/// The node's force deadline has passed.
fn forced(node: &Node, now: Timestamp) -> bool {
    node.drain_strategy.as_ref().is_some_and(|d| !d.force_deadline.is_zero() && d.force_deadline <= now)
}

/// Must this alloc leave the node for the drain to be done?
fn must_leave(node: &Node, a: &Allocation) -> bool {
    let ignore_system = node.drain_strategy.as_ref().is_some_and(|d| d.ignore_system_jobs);
    !(ignore_system && a.job_type() == JobType::System)
}

/// Still to be asked to move: not stopping or stopped, not marked yet.
fn movable(a: &Allocation) -> bool {
    !a.terminal() && !a.desired_transition.should_migrate()
}

/// Decides for the draining nodes among `nodes` (IDs; nodes that are gone or
/// no longer draining are skipped).
pub fn decide<'a>(state: &State, nodes: impl IntoIterator<Item = &'a str>, now: Timestamp) -> DrainActions {
    let mut out = DrainActions::default();
    let mut jobs: BTreeSet<NamespacedId> = BTreeSet::new();
    for id in nodes {
        let Some(node) = state.node(id) else { continue };
        let Some(strategy) = node.drain_strategy.as_ref() else { continue };
        let allocs: Vec<&Arc<Allocation>> = state.allocs_by_node(id).filter(|a| must_leave(node, a)).collect();
        let is_forced = forced(node, now);
        if allocs.iter().all(|a| a.client_terminal()) {
            out.complete.push((id.to_string(), is_forced));
            continue;
        }
        if is_forced {
            for a in allocs.iter().filter(|a| movable(a)) {
                out.migrate.insert(a.id.clone(), (*a).clone());
            }
            continue;
        }
        if !strategy.force_deadline.is_zero() {
            out.next_deadline = Some(out.next_deadline.map_or(strategy.force_deadline, |t| t.min(strategy.force_deadline)));
        }
        // The first phase with an alloc still running holds the later ones back.
        let Some(open) = allocs.iter().filter(|a| !a.client_terminal()).map(|a| phase(a)).min() else { continue };
        match open {
            Phase::Workload => {
                for a in allocs.iter().filter(|a| phase(a) == Phase::Workload && movable(a)) {
                    jobs.insert(NamespacedId::new(&a.namespace, &a.job_id));
                }
            }
            later => {
                for a in allocs.iter().filter(|a| phase(a) == later && movable(a)) {
                    out.migrate.insert(a.id.clone(), (*a).clone());
                }
            }
        }
    }
    for key in &jobs {
        migrate_job(state, key, now, &mut out.migrate);
    }
    out
}

/// Picks which allocs of a service job on draining (not yet forced) nodes
/// may migrate now, group by group, so that each group keeps at least
/// `count - max_parallel` healthy allocs that are not leaving.
fn migrate_job(state: &State, key: &NamespacedId, now: Timestamp, migrate: &mut BTreeMap<String, Arc<Allocation>>) {
    // A purged job's allocs are stopped by its scheduler run; batch and
    // sysbatch allocs may finish until the deadline.
    let Some(job) = state.job(&key.namespace, &key.id) else { return };
    if job.job_type != JobType::Service || job_is_plugin(job) {
        return;
    }
    let allocs: Vec<&Arc<Allocation>> = state.allocs_by_job(&key.namespace, &key.id).collect();
    for tg in &job.task_groups {
        let max_parallel =
            tg.migrate.as_ref().map_or_else(|| nomad_proto::job::MigrateStrategy::default().max_parallel, |m| m.max_parallel);
        let group: Vec<&Arc<Allocation>> = allocs.iter().copied().filter(|a| a.task_group == tg.name).collect();
        // Allocs marked for migration are leaving even before the scheduler stops them.
        let healthy = group.iter().filter(|a| !a.terminal() && has_health(a) && !a.desired_transition.should_migrate()).count() as i64;
        let mut drainable: Vec<&Arc<Allocation>> = group
            .iter()
            .copied()
            .filter(|a| movable(a))
            .filter(|a| state.node(&a.node_id).is_some_and(|n| n.drain_strategy.is_some() && !forced(n, now)))
            .collect();
        drainable.sort_by(|a, b| (a.index(), &a.id).cmp(&(b.index(), &b.id)));
        let allowed = healthy - (tg.count - max_parallel);
        for a in drainable.into_iter().take(allowed.max(0) as usize) {
            migrate.insert(a.id.clone(), a.clone());
        }
    }
}
