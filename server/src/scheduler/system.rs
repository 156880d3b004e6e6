//! The system and sysbatch scheduler: one alloc per feasible node.
//!
//! Each node's allocs are diffed against the names the job requires
//! (`job.group[i]` for every group and index): missing ones are placed on
//! that node, surplus ones stopped, changed ones updated in place or
//! replaced. Disconnected nodes get their running allocs marked `unknown`
//! (no replacement, no timeout eval); expired ones are lost; returning ones
//! get a `running` AllocState appended. Completed sysbatch allocs are not
//! run again unless the job changes.

mod diff;

use std::collections::{BTreeMap, HashSet};

use nomad_proto::alloc::{ALLOC_IN_PLACE_DESC, ALLOC_JOB_STOPPED_DESC, ALLOC_LOST_DESC, ALLOC_NODE_TAINTED_DESC, ALLOC_NOT_NEEDED_DESC};
use nomad_proto::eval::trigger;
use nomad_proto::plan::{DesiredUpdates, PlanAnnotations};
use nomad_proto::{AllocMetric, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType, Node, Plan, Timestamp};

use super::alloc_sets::{stop_lost_on_down_nodes, tainted_nodes};
use super::fast_hash::FastMap;
use super::ids::IdSource;
use super::metrics::exhaust_resources;
use super::nodes::{ReadyNodes, ready_nodes};
use super::proposed::Proposed;
use super::select::{SelectOptions, Stack, StackKind, seed_for};
use super::updates::destructive_change;
use super::{
    ALLOC_UPDATING_DESC, BLOCKED_EVAL_FAILED_PLACEMENTS_DESC, ROLLING_UPDATE_FOLLOWUP_DESC, ScheduleOutcome, Scheduler, finished, refused,
};
use crate::state::State;

use diff::{Diff, Tuple, diff_cluster};

const HANDLED_TRIGGERS: &[&str] = &[
    trigger::JOB_REGISTER,
    trigger::NODE_UPDATE,
    trigger::FAILED_FOLLOW_UP,
    trigger::JOB_DEREGISTER,
    trigger::ROLLING_UPDATE,
    trigger::PREEMPTION,
    trigger::DEPLOYMENT_WATCHER,
    trigger::NODE_DRAIN,
    trigger::ALLOC_STOP,
    trigger::QUEUED_ALLOCS,
    trigger::SCALING,
    trigger::RECONNECT,
];

/// Schedules system and sysbatch jobs.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemScheduler;

impl Scheduler for SystemScheduler {
    fn compute(&self, state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome {
        let sysbatch = eval.eval_type == JobType::Sysbatch;
        let handled = HANDLED_TRIGGERS.contains(&eval.triggered_by.as_str()) || (sysbatch && eval.triggered_by == trigger::PERIODIC_JOB);
        if !handled {
            return refused(state, eval, now);
        }
        run(state, eval, now, sysbatch)
    }
}

fn run(state: &State, eval: &Evaluation, now: Timestamp, sysbatch: bool) -> ScheduleOutcome {
    let job = state.job(&eval.namespace, &eval.job_id).cloned();
    let live_job = job.clone().filter(|j| !j.stop);
    let plan = Plan {
        eval_id: eval.id.clone(),
        priority: eval.priority,
        all_at_once: job.as_ref().is_some_and(|j| j.all_at_once),
        job: job.clone(),
        snapshot_index: state.index,
        ..Plan::default()
    };
    let groups: Vec<String> = job.as_ref().map(|j| j.task_groups.iter().map(|g| g.name.clone()).collect()).unwrap_or_default();
    let mut proposed = Proposed::new(state, plan, &eval.namespace, &eval.job_id, groups);

    let allocs: Vec<&Allocation> = state.allocs_by_job(&eval.namespace, &eval.job_id).map(|a| a.as_ref()).collect();
    let tainted = tainted_nodes(state, &allocs);
    stop_lost_on_down_nodes(&mut proposed, &tainted, &allocs);

    let ready = live_job.as_ref().map(|j| ready_nodes(state, j));
    let eligible: HashSet<&str> = ready.iter().flat_map(|r| r.nodes.iter().map(|n| n.id.as_str())).collect();
    let not_ready: HashSet<&str> = ready.as_ref().map(|r| r.not_ready.clone()).unwrap_or_default();
    let mut diff = diff_cluster(job.as_deref(), sysbatch, &allocs, &eligible, &not_ready, &tainted, now);

    let mut stack = live_job.as_ref().map(|j| Stack::new(j.clone(), StackKind::System, seed_for(&eval.id, state.index)));
    let ids = IdSource::new(&eval.id, state.index);

    // Running allocs on nodes that no longer meet the job's constraints or
    // drivers go away (Nomad 1.6 would leave them until the job changes).
    if let Some(stack) = stack.as_mut() {
        let (keep, infeasible): (Vec<_>, Vec<_>) = std::mem::take(&mut diff.ignore).into_iter().partition(|t| {
            let (Some(a), Some(group)) = (t.alloc.as_deref(), t.group) else { return true };
            let checkable = !a.terminal() && a.client_status != ClientStatus::Unknown && eligible.contains(a.node_id.as_str());
            match state.node(&a.node_id) {
                Some(node) if checkable => stack.node_feasible(node, group, &a.name),
                _ => true,
            }
        });
        diff.ignore = keep;
        diff.infeasible = infeasible;
    }
    for a in diff.infeasible.iter().filter_map(|t| t.alloc.as_deref()) {
        proposed.append_stop(a, ALLOC_NODE_TAINTED_DESC, None, "");
    }

    let stop_desc = if live_job.is_some() { ALLOC_NOT_NEEDED_DESC } else { ALLOC_JOB_STOPPED_DESC };
    for a in diff.stop.iter().filter_map(|t| t.alloc.as_deref()) {
        proposed.append_stop(a, stop_desc, None, "");
    }
    for a in diff.migrate.iter().filter_map(|t| t.alloc.as_deref()) {
        proposed.append_stop(a, ALLOC_NODE_TAINTED_DESC, None, "");
    }
    for a in diff.lost.iter().filter_map(|t| t.alloc.as_deref()) {
        proposed.append_stop(a, ALLOC_LOST_DESC, Some(ClientStatus::Lost), "");
    }
    for a in diff.disconnecting.iter().filter_map(|t| t.alloc.as_deref()) {
        proposed.append_alloc(a.clone());
    }

    let mut inplace = Vec::new();
    let mut destructive = Vec::new();
    let updates = std::mem::take(&mut diff.update).into_iter().chain(std::mem::take(&mut diff.reconnecting));
    for t in updates {
        let done = match (&live_job, stack.as_mut()) {
            (Some(job), Some(stack)) => try_in_place(job, stack, &mut proposed, eval, &t),
            _ => false,
        };
        if done { inplace.push(t) } else { destructive.push(t) }
    }

    let mut annotations = eval.annotate_plan.then(|| PlanAnnotations {
        desired_tg_updates: desired_updates(&diff, &destructive, &inplace, live_job.as_deref()),
        ..PlanAnnotations::default()
    });

    // Replacements beyond the rolling limit wait for the next eval.
    let rolling = live_job.as_ref().and_then(|j| j.update.as_ref()).filter(|u| u.stagger > 0 && u.max_parallel > 0);
    let limit = rolling.map_or(destructive.len(), |u| u.max_parallel as usize);
    let limit_reached = destructive.len() > limit;
    for t in destructive.into_iter().take(limit) {
        if let Some(a) = t.alloc.as_deref() {
            proposed.append_stop(a, ALLOC_UPDATING_DESC, None, "");
        }
        diff.place.push(t);
    }

    let placed = match (&live_job, stack.as_mut(), &ready) {
        (Some(job), Some(stack), Some(ready)) => {
            place(job, stack, &mut proposed, ready, &diff.place, eval, &ids, now, annotations.as_mut())
        }
        _ => Placed::default(),
    };
    let mut new_evals = placed.blocked;

    let plan = proposed.into_plan();
    let mut next_eval = String::new();
    if limit_reached
        && (!plan.is_no_op() || eval.annotate_plan)
        && let (Some(job), Some(u)) = (&live_job, rolling)
    {
        let mut next = Evaluation::for_job(job, trigger::ROLLING_UPDATE, now);
        next.id = ids.next_id();
        next.priority = eval.priority;
        next.status_description = ROLLING_UPDATE_FOLLOWUP_DESC.to_string();
        next.wait_until = now.add_nanos(u.stagger);
        next.previous_eval = eval.id.clone();
        next_eval = next.id.clone();
        new_evals.push(next);
    }
    let mut e = finished(eval, EvalStatus::Complete, "", now);
    e.failed_tg_allocs = placed.failed;
    e.queued_allocations = placed.queued;
    e.next_eval = next_eval;
    e.blocked_eval = new_evals.iter().find(|x| x.status == EvalStatus::Blocked).map(|x| x.id.clone()).unwrap_or_default();
    e.snapshot_index = state.index;
    let mut plan = plan;
    plan.annotations = annotations.clone();
    ScheduleOutcome { plan, eval_update: e, new_evals, annotations }
}

/// What placing the missing allocs produced.
#[derive(Default)]
struct Placed {
    queued: BTreeMap<String, i64>,
    failed: BTreeMap<String, AllocMetric>,
    /// One per node that had no room (Nomad's `addBlocked`).
    blocked: Vec<Evaluation>,
}

/// Places each missing alloc on its own node.
#[allow(clippy::too_many_arguments)]
fn place<'a>(
    job: &Job,
    stack: &mut Stack<'a>,
    proposed: &mut Proposed<'a>,
    ready: &ReadyNodes<'a>,
    missing: &[Tuple<'a>],
    eval: &Evaluation,
    ids: &IdSource,
    now: Timestamp,
    mut annotations: Option<&mut PlanAnnotations>,
) -> Placed {
    let mut out = Placed::default();
    for g in &job.task_groups {
        out.queued.insert(g.name.clone(), 0);
    }
    let nodes: FastMap<&str, &Node> = ready.nodes.iter().map(|n| (n.id.as_str(), *n)).collect();
    for t in missing {
        if let Some(g) = t.group {
            *out.queued.entry(job.task_groups[g].name.clone()).or_insert(0) += 1;
        }
    }
    let mut filtered: BTreeMap<String, AllocMetric> = BTreeMap::new();
    for t in missing {
        let (Some(group), Some(node)) = (t.group, nodes.get(t.node_id.as_str()).copied()) else { continue };
        let tg = &job.task_groups[group];
        let (selection, mut metric) = stack.select_node(proposed, node, group, SelectOptions { alloc_name: &t.name, penalty_nodes: &[] });
        metric.nodes_available = ready.by_dc.clone();
        metric.nodes_in_pool = ready.nodes.len() as i64;
        let Some(sel) = selection else {
            if metric.nodes_filtered > 0 {
                // The node does not meet the job's constraints: not a failure unless none do.
                let q = out.queued.entry(tg.name.clone()).or_insert(0);
                *q -= 1;
                let acc = filtered.entry(tg.name.clone()).or_default();
                merge_filtered(acc, &metric);
                if *q <= 0 {
                    out.failed.insert(tg.name.clone(), acc.clone());
                }
                if let Some(d) = annotations.as_deref_mut().and_then(|a| a.desired_tg_updates.get_mut(&tg.name)) {
                    d.place = d.place.saturating_sub(1);
                }
                continue;
            }
            if let Some(m) = out.failed.get_mut(&tg.name) {
                m.coalesced_failures += 1;
                exhaust_resources(m, tg, 1);
                continue;
            }
            exhaust_resources(&mut metric, tg, 1);
            out.failed.insert(tg.name.clone(), metric);
            out.blocked.push(blocked_eval(eval, &out.failed, stack, &node.id, ids, now));
            continue;
        };
        let alloc = Allocation {
            id: ids.next_id(),
            namespace: job.namespace.clone(),
            eval_id: eval.id.clone(),
            name: t.name.clone(),
            node_id: node.id.clone(),
            node_name: node.name.clone(),
            job_id: job.id.clone(),
            task_group: tg.name.clone(),
            allocated_resources: Some(sel.resources),
            metrics: Some(metric),
            desired_status: DesiredStatus::Run,
            client_status: ClientStatus::Pending,
            previous_allocation: t.alloc.as_ref().map(|a| a.id.clone()).unwrap_or_default(),
            ..Allocation::default()
        };
        proposed.append_alloc(alloc);
        *out.queued.entry(tg.name.clone()).or_insert(0) -= 1;
    }
    out
}

/// Updates in place when the job change allows it and the node still fits.
fn try_in_place<'a>(job: &Job, stack: &mut Stack<'a>, proposed: &mut Proposed<'a>, eval: &Evaluation, t: &Tuple<'a>) -> bool {
    let Some(existing) = t.alloc.as_deref() else { return false };
    let old_job = existing.job.as_deref().unwrap_or(job);
    if destructive_change(job, old_job, &existing.task_group).is_some() {
        return false;
    }
    // Finished sysbatch allocs stay finished.
    if existing.terminal() {
        return true;
    }
    let Some(node) = proposed.state().node(&existing.node_id).map(|n| n.as_ref()) else { return false };
    if !node.in_any_datacenter(&job.datacenters) || !(job.node_pool.is_empty() || node.in_pool(&job.node_pool)) {
        return false;
    }
    let Some(group) = job.task_groups.iter().position(|g| g.name == existing.task_group) else { return false };
    proposed.append_stop(existing, ALLOC_IN_PLACE_DESC, None, "");
    let (selection, metric) = stack.select_node(proposed, node, group, SelectOptions { alloc_name: &existing.name, penalty_nodes: &[] });
    proposed.pop_stop(existing);
    let Some(sel) = selection else { return false };
    let mut resources = sel.resources;
    super::updates::keep_held_networks(existing, &mut resources);
    let mut a = existing.clone();
    a.eval_id = eval.id.clone();
    a.job = None;
    a.allocated_resources = Some(resources);
    a.metrics = Some(metric);
    proposed.append_alloc(a);
    true
}

fn merge_filtered(acc: &mut AllocMetric, cur: &AllocMetric) {
    acc.nodes_evaluated += cur.nodes_evaluated;
    acc.nodes_filtered += cur.nodes_filtered;
    for (k, v) in &cur.class_filtered {
        *acc.class_filtered.entry(k.clone()).or_insert(0) += v;
    }
    for (k, v) in &cur.constraint_filtered {
        *acc.constraint_filtered.entry(k.clone()).or_insert(0) += v;
    }
}

/// A blocked eval for one node that had no room (Nomad's `addBlocked`).
fn blocked_eval(
    eval: &Evaluation,
    failed: &BTreeMap<String, AllocMetric>,
    stack: &Stack<'_>,
    node_id: &str,
    ids: &IdSource,
    now: Timestamp,
) -> Evaluation {
    let escaped = stack.feasibility().escaped();
    Evaluation {
        id: ids.next_id(),
        namespace: eval.namespace.clone(),
        priority: eval.priority,
        eval_type: eval.eval_type,
        triggered_by: trigger::QUEUED_ALLOCS.to_string(),
        job_id: eval.job_id.clone(),
        job_modify_index: eval.job_modify_index,
        node_id: node_id.to_string(),
        status: EvalStatus::Blocked,
        status_description: BLOCKED_EVAL_FAILED_PLACEMENTS_DESC.to_string(),
        previous_eval: eval.id.clone(),
        failed_tg_allocs: failed.clone(),
        class_eligibility: if escaped { BTreeMap::new() } else { stack.feasibility().class_eligibility() },
        escaped_computed_class: escaped,
        create_time: now.unix_nanos(),
        modify_time: now.unix_nanos(),
        ..Evaluation::default()
    }
}

/// `DesiredTGUpdates` from the per-node diff.
fn desired_updates(
    diff: &Diff<'_>,
    destructive: &[Tuple<'_>],
    inplace: &[Tuple<'_>],
    job: Option<&Job>,
) -> BTreeMap<String, DesiredUpdates> {
    let mut out: BTreeMap<String, DesiredUpdates> = BTreeMap::new();
    let group_of = |t: &Tuple<'_>| match (t.group, job) {
        (Some(g), Some(j)) => j.task_groups[g].name.clone(),
        _ => t.alloc.as_ref().map(|a| a.task_group.clone()).unwrap_or_default(),
    };
    for t in &diff.place {
        out.entry(group_of(t)).or_default().place += 1;
    }
    for t in diff.stop.iter().chain(&diff.lost).chain(&diff.infeasible) {
        out.entry(group_of(t)).or_default().stop += 1;
    }
    for t in &diff.ignore {
        out.entry(group_of(t)).or_default().ignore += 1;
    }
    for t in &diff.migrate {
        out.entry(group_of(t)).or_default().migrate += 1;
    }
    for t in &diff.disconnecting {
        out.entry(group_of(t)).or_default().disconnect_updates += 1;
    }
    for t in destructive {
        out.entry(group_of(t)).or_default().destructive_update += 1;
    }
    for t in inplace {
        out.entry(group_of(t)).or_default().in_place_update += 1;
    }
    out
}
