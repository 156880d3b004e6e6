//! The system and sysbatch scheduler: one alloc per feasible node.
//!
//! Each node's allocs are diffed against the names the job requires
//! (`job.group[i]` for every group and index): missing ones are placed on
//! that node, surplus ones stopped, changed ones updated in place or
//! replaced. Disconnected nodes get their running allocs marked `unknown`
//! (no replacement, no timeout eval); expired ones are lost; returning ones
//! get a `running` AllocState appended. Completed sysbatch allocs are not
//! run again unless the job changes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use nomad_proto::alloc::{ALLOC_IN_PLACE_DESC, ALLOC_JOB_STOPPED_DESC, ALLOC_LOST_DESC, ALLOC_NODE_TAINTED_DESC, ALLOC_NOT_NEEDED_DESC, ALLOC_UNKNOWN_DESC};
use nomad_proto::eval::trigger;
use nomad_proto::plan::{DesiredUpdates, PlanAnnotations};
use nomad_proto::{AllocMetric, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType, Node, NodeStatus, Plan, Timestamp};

use super::alloc_sets::{TaintedNodes, stop_lost_on_down_nodes, tainted_nodes};
use super::metrics::exhaust_resources;
use super::nodes::ready_nodes;
use super::proposed::Proposed;
use super::reschedule::ran_successfully;
use super::select::{SelectOptions, Stack, StackKind, seed_for};
use super::updates::destructive_change;
use super::{ALLOC_UPDATING_DESC, BLOCKED_EVAL_FAILED_PLACEMENTS_DESC, ROLLING_UPDATE_FOLLOWUP_DESC, ScheduleOutcome, Scheduler, finished, refused};
use crate::state::State;

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

/// One required or existing alloc name on one node.
struct Tuple<'a> {
    name: String,
    group: Option<usize>,
    node_id: String,
    alloc: Option<Cow<'a, Allocation>>,
}

#[derive(Default)]
struct Diff<'a> {
    place: Vec<Tuple<'a>>,
    update: Vec<Tuple<'a>>,
    migrate: Vec<Tuple<'a>>,
    stop: Vec<Tuple<'a>>,
    ignore: Vec<Tuple<'a>>,
    lost: Vec<Tuple<'a>>,
    disconnecting: Vec<Tuple<'a>>,
    reconnecting: Vec<Tuple<'a>>,
}

struct DiffInputs<'a, 'i> {
    job: &'i Job,
    sysbatch: bool,
    required: &'i BTreeMap<String, usize>,
    eligible: &'i HashSet<&'a str>,
    not_ready: &'i HashSet<&'a str>,
    tainted: &'i TaintedNodes<'a>,
    terminal: &'i BTreeMap<(&'a str, &'a str), &'a Allocation>,
    now: Timestamp,
}

fn supports_disconnect(a: &Allocation) -> bool {
    a.job.as_ref().and_then(|j| j.lookup_task_group(&a.task_group)).is_some_and(|g| g.supports_disconnected_clients())
}

fn tuple<'a>(name: &str, group: Option<usize>, node_id: &str, alloc: Option<Cow<'a, Allocation>>) -> Tuple<'a> {
    Tuple { name: name.to_string(), group, node_id: node_id.to_string(), alloc }
}

/// Nomad's `diffSystemAllocsForNode`.
fn diff_node<'a>(inp: &DiffInputs<'a, '_>, node_id: &'a str, allocs: &[&'a Allocation], out: &mut Diff<'a>) {
    let mut existing = BTreeSet::new();
    for &a in allocs {
        existing.insert(a.name.as_str());
        let Some(&group) = inp.required.get(&a.name) else {
            out.stop.push(tuple(&a.name, None, node_id, Some(Cow::Borrowed(a))));
            continue;
        };
        let t = |a: Cow<'a, Allocation>| tuple(&a.name.clone(), Some(group), node_id, Some(a));
        let supports = supports_disconnect(a);
        let mut reconnect = false;
        let mut expired = false;
        if supports && matches!(a.client_status, ClientStatus::Unknown | ClientStatus::Running) {
            reconnect = a.needs_to_reconnect();
            expired = reconnect && a.expired(inp.now);
        }
        if !a.terminal() && a.desired_transition.should_migrate() {
            out.migrate.push(t(Cow::Borrowed(a)));
            continue;
        }
        if inp.sysbatch && a.terminal() {
            out.ignore.push(t(Cow::Borrowed(a)));
            continue;
        }
        if supports && expired {
            out.lost.push(t(Cow::Borrowed(a)));
            continue;
        }
        if supports && a.client_status == ClientStatus::Unknown && a.desired_status == DesiredStatus::Run {
            out.ignore.push(t(Cow::Borrowed(a)));
            continue;
        }
        let tainted = inp.tainted.get(a.node_id.as_str());
        if supports && tainted.is_none() && reconnect {
            let mut copy = a.clone();
            copy.append_state(a.client_status, inp.now);
            out.reconnecting.push(t(Cow::Owned(copy)));
            continue;
        }
        if let Some(node) = tainted {
            if a.job_type() == JobType::Sysbatch && ran_successfully(a) {
                out.ignore.push(t(Cow::Borrowed(a)));
                continue;
            }
            if node.is_some_and(|n| n.status == NodeStatus::Disconnected) && supports && a.client_status == ClientStatus::Running {
                let mut copy = a.clone();
                copy.client_status = ClientStatus::Unknown;
                copy.append_state(ClientStatus::Unknown, inp.now);
                copy.client_description = ALLOC_UNKNOWN_DESC.to_string();
                out.disconnecting.push(t(Cow::Owned(copy)));
                continue;
            }
            if !a.terminal() && node.is_none_or(|n| n.status == NodeStatus::Down) {
                out.lost.push(t(Cow::Borrowed(a)));
            } else {
                out.ignore.push(t(Cow::Borrowed(a)));
            }
            continue;
        }
        if inp.not_ready.contains(node_id) {
            out.ignore.push(t(Cow::Borrowed(a)));
            continue;
        }
        if !inp.eligible.contains(node_id) {
            out.stop.push(t(Cow::Borrowed(a)));
            continue;
        }
        if a.job.as_ref().is_some_and(|j| j.job_modify_index != inp.job.job_modify_index) {
            out.update.push(t(Cow::Borrowed(a)));
            continue;
        }
        out.ignore.push(t(Cow::Borrowed(a)));
    }

    for (name, &group) in inp.required {
        if existing.contains(name.as_str()) {
            continue;
        }
        let terminal = inp.terminal.get(&(node_id, name.as_str())).copied();
        if inp.sysbatch
            && let Some(term) = terminal
        {
            let changed = term.job.as_ref().is_some_and(|j| j.job_modify_index != inp.job.job_modify_index);
            let t = tuple(name, Some(group), node_id, Some(Cow::Borrowed(term)));
            if changed { out.update.push(t) } else { out.ignore.push(t) }
            continue;
        }
        if inp.tainted.contains_key(node_id) || !inp.eligible.contains(node_id) {
            continue;
        }
        out.place.push(tuple(name, Some(group), node_id, terminal.map(Cow::Borrowed)));
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
    let mut required = BTreeMap::new();
    if let Some(j) = &live_job {
        let prefix = if j.name.is_empty() { &j.id } else { &j.name };
        for (gi, tg) in j.task_groups.iter().enumerate() {
            for i in 0..tg.count.max(0) {
                required.insert(format!("{prefix}.{}[{i}]", tg.name), gi);
            }
        }
    }
    // The newest terminal alloc per (node, name).
    let mut terminal: BTreeMap<(&str, &str), &Allocation> = BTreeMap::new();
    let mut by_node: BTreeMap<&str, Vec<&Allocation>> = BTreeMap::new();
    for &a in &allocs {
        if a.terminal() {
            let key = (a.node_id.as_str(), a.name.as_str());
            if terminal.get(&key).is_none_or(|t| t.create_index < a.create_index) {
                terminal.insert(key, a);
            }
        } else {
            by_node.entry(a.node_id.as_str()).or_default().push(a);
        }
    }
    for id in &eligible {
        by_node.entry(id).or_default();
    }
    let job_for_diff = live_job.clone().or(job.clone()).unwrap_or_default();
    let inputs = DiffInputs { job: &job_for_diff, sysbatch, required: &required, eligible: &eligible, not_ready: &not_ready, tainted: &tainted, terminal: &terminal, now };
    let mut diff = Diff::default();
    for (node_id, node_allocs) in &by_node {
        diff_node(&inputs, node_id, node_allocs, &mut diff);
    }

    let stop_desc = if live_job.is_some() { ALLOC_NOT_NEEDED_DESC } else { ALLOC_JOB_STOPPED_DESC };
    for t in &diff.stop {
        proposed.append_stop(t.alloc.as_deref().expect("existing alloc"), stop_desc, None, "");
    }
    for t in &diff.migrate {
        proposed.append_stop(t.alloc.as_deref().expect("existing alloc"), ALLOC_NODE_TAINTED_DESC, None, "");
    }
    for t in &diff.lost {
        proposed.append_stop(t.alloc.as_deref().expect("existing alloc"), ALLOC_LOST_DESC, Some(ClientStatus::Lost), "");
    }
    for t in &diff.disconnecting {
        proposed.append_alloc(t.alloc.as_deref().expect("existing alloc").clone());
    }

    let mut stack = live_job.as_ref().map(|j| Stack::new(j.clone(), StackKind::System, seed_for(&eval.id, state.index)));
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

    let mut annotations = eval.annotate_plan.then(|| PlanAnnotations { desired_tg_updates: desired_updates(&diff, &destructive, &inplace, live_job.as_deref()), ..PlanAnnotations::default() });

    // Replacements beyond the rolling limit wait for the next eval.
    let rolling = live_job.as_ref().and_then(|j| j.update.as_ref()).filter(|u| u.stagger > 0 && u.max_parallel > 0);
    let limit = rolling.map_or(destructive.len(), |u| u.max_parallel as usize);
    let limit_reached = destructive.len() > limit;
    for t in destructive.into_iter().take(limit) {
        proposed.append_stop(t.alloc.as_deref().expect("existing alloc"), ALLOC_UPDATING_DESC, None, "");
        diff.place.push(t);
    }

    let mut queued: BTreeMap<String, i64> = BTreeMap::new();
    if let Some(j) = &live_job {
        for g in &j.task_groups {
            queued.insert(g.name.clone(), 0);
        }
    }
    let mut failed: BTreeMap<String, AllocMetric> = BTreeMap::new();
    let mut new_evals = Vec::new();
    if let (Some(job), Some(stack), Some(ready)) = (&live_job, stack.as_mut(), &ready) {
        let nodes: BTreeMap<&str, &Node> = ready.nodes.iter().map(|n| (n.id.as_str(), *n)).collect();
        for t in &diff.place {
            if let Some(g) = t.group {
                *queued.entry(job.task_groups[g].name.clone()).or_insert(0) += 1;
            }
        }
        let mut filtered: BTreeMap<String, AllocMetric> = BTreeMap::new();
        for t in &diff.place {
            let (Some(group), Some(node)) = (t.group, nodes.get(t.node_id.as_str()).copied()) else { continue };
            let tg = &job.task_groups[group];
            let (selection, mut metric) = stack.select_node(&mut proposed, node, group, SelectOptions { alloc_name: &t.name, penalty_nodes: &[] });
            metric.nodes_available = ready.by_dc.clone();
            metric.nodes_in_pool = ready.nodes.len() as i64;
            let Some(sel) = selection else {
                if metric.nodes_filtered > 0 {
                    // The node does not meet the job's constraints: not a failure unless none do.
                    let q = queued.entry(tg.name.clone()).or_insert(0);
                    *q -= 1;
                    let acc = filtered.entry(tg.name.clone()).or_default();
                    merge_filtered(acc, &metric);
                    if *q <= 0 {
                        failed.insert(tg.name.clone(), acc.clone());
                    }
                    if let Some(d) = annotations.as_mut().and_then(|a| a.desired_tg_updates.get_mut(&tg.name)) {
                        d.place = d.place.saturating_sub(1);
                    }
                    continue;
                }
                if let Some(m) = failed.get_mut(&tg.name) {
                    m.coalesced_failures += 1;
                    exhaust_resources(m, tg);
                    continue;
                }
                exhaust_resources(&mut metric, tg);
                failed.insert(tg.name.clone(), metric);
                new_evals.push(blocked_eval(eval, &failed, stack, &node.id, now));
                continue;
            };
            let alloc = Allocation {
                id: nomad_proto::new_id(),
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
            *queued.entry(tg.name.clone()).or_insert(0) -= 1;
        }
    }

    let plan = proposed.into_plan();
    let mut next_eval = String::new();
    if limit_reached
        && (!plan.is_no_op() || eval.annotate_plan)
        && let (Some(job), Some(u)) = (&live_job, rolling)
    {
        let mut next = Evaluation::for_job(job, trigger::ROLLING_UPDATE, now);
        next.priority = eval.priority;
        next.status_description = ROLLING_UPDATE_FOLLOWUP_DESC.to_string();
        next.wait_until = now.add_nanos(u.stagger);
        next.previous_eval = eval.id.clone();
        next_eval = next.id.clone();
        new_evals.push(next);
    }
    let mut e = finished(eval, EvalStatus::Complete, "", now);
    e.failed_tg_allocs = failed;
    e.queued_allocations = queued;
    e.next_eval = next_eval;
    e.blocked_eval = new_evals.iter().find(|x| x.status == EvalStatus::Blocked).map(|x| x.id.clone()).unwrap_or_default();
    e.snapshot_index = state.index;
    let mut plan = plan;
    plan.annotations = annotations.clone();
    ScheduleOutcome { plan, eval_update: e, new_evals, annotations }
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
    if let Some(old) = &existing.allocated_resources {
        for (task, r) in resources.tasks.iter_mut() {
            let prev = old.tasks.get(task);
            r.networks = prev.map(|p| p.networks.clone()).unwrap_or_default();
            r.devices = prev.map(|p| p.devices.clone()).unwrap_or_default();
        }
        resources.shared.networks = old.shared.networks.clone();
        resources.shared.ports = old.shared.ports.clone();
    }
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
fn blocked_eval(eval: &Evaluation, failed: &BTreeMap<String, AllocMetric>, stack: &Stack<'_>, node_id: &str, now: Timestamp) -> Evaluation {
    let escaped = stack.feasibility().escaped();
    Evaluation {
        id: nomad_proto::new_id(),
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
fn desired_updates(diff: &Diff<'_>, destructive: &[Tuple<'_>], inplace: &[Tuple<'_>], job: Option<&Job>) -> BTreeMap<String, DesiredUpdates> {
    let mut out: BTreeMap<String, DesiredUpdates> = BTreeMap::new();
    let group_of = |t: &Tuple<'_>| match (t.group, job) {
        (Some(g), Some(j)) => j.task_groups[g].name.clone(),
        _ => t.alloc.as_ref().map(|a| a.task_group.clone()).unwrap_or_default(),
    };
    for t in &diff.place {
        out.entry(group_of(t)).or_default().place += 1;
    }
    for t in diff.stop.iter().chain(&diff.lost) {
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
