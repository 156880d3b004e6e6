//! The service and batch scheduler: reconcile, then place.

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::alloc::{ALLOC_IN_PLACE_DESC, TaskState, task_state};
use nomad_proto::eval::trigger;
use nomad_proto::plan::PlanAnnotations;
use nomad_proto::{AllocMetric, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType, Plan, TaskGroup, Timestamp};

use super::alloc_sets::{stop_lost_on_down_nodes, tainted_nodes};
use super::ids::IdSource;
use super::metrics::exhaust_resources;
use super::nodes::ready_nodes;
use super::proposed::Proposed;
use super::reconcile::{FreshPlacements, PlaceRequest, ReconcileResults, Reconciler, UpdateKind};
use super::select::{SelectOptions, Selection, Stack, StackKind, seed_for};
use super::updates::destructive_change;
use super::{
    ALLOC_UPDATING_DESC, BLOCKED_EVAL_FAILED_PLACEMENTS_DESC, ROLLING_UPDATE_FOLLOWUP_DESC, ScheduleOutcome, Scheduler, annotate, finished,
    refused,
};
use crate::state::State;

/// Triggers the generic scheduler handles.
const HANDLED_TRIGGERS: &[&str] = &[
    trigger::JOB_REGISTER,
    trigger::JOB_DEREGISTER,
    trigger::NODE_DRAIN,
    trigger::NODE_UPDATE,
    trigger::ALLOC_STOP,
    trigger::ROLLING_UPDATE,
    trigger::QUEUED_ALLOCS,
    trigger::PERIODIC_JOB,
    trigger::MAX_PLANS,
    trigger::DEPLOYMENT_WATCHER,
    trigger::RETRY_FAILED_ALLOC,
    trigger::FAILED_FOLLOW_UP,
    trigger::PREEMPTION,
    trigger::SCALING,
    trigger::MAX_DISCONNECT_TIMEOUT,
    trigger::RECONNECT,
];

/// Schedules service and batch jobs.
#[derive(Debug, Clone, Copy, Default)]
pub struct GenericScheduler;

impl Scheduler for GenericScheduler {
    fn compute(&self, state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome {
        if !HANDLED_TRIGGERS.contains(&eval.triggered_by.as_str()) {
            return refused(state, eval, now);
        }
        GenericRun::new(state, eval, now).run()
    }
}

struct GenericRun<'a> {
    state: &'a State,
    eval: &'a Evaluation,
    now: Timestamp,
    job: Option<Arc<Job>>,
    proposed: Proposed<'a>,
    failed: BTreeMap<String, AllocMetric>,
    queued: BTreeMap<String, i64>,
    ids: IdSource,
    /// The active deployment new allocs join (empty: none).
    deployment_id: String,
}

impl<'a> GenericRun<'a> {
    fn new(state: &'a State, eval: &'a Evaluation, now: Timestamp) -> GenericRun<'a> {
        let job = state.job(&eval.namespace, &eval.job_id).cloned();
        let plan = Plan {
            eval_id: eval.id.clone(),
            priority: eval.priority,
            all_at_once: job.as_ref().is_some_and(|j| j.all_at_once),
            job: job.clone(),
            snapshot_index: state.index,
            ..Plan::default()
        };
        let groups = job.as_ref().map(|j| j.task_groups.iter().map(|g| g.name.clone()).collect()).unwrap_or_default();
        let proposed = Proposed::new(state, plan, &eval.namespace, &eval.job_id, groups);
        let mut queued = BTreeMap::new();
        if let Some(j) = job.as_ref().filter(|j| !j.stop) {
            for g in &j.task_groups {
                queued.insert(g.name.clone(), 0);
            }
        }
        let ids = IdSource::new(&eval.id, state.index);
        GenericRun { state, eval, now, job, proposed, failed: BTreeMap::new(), queued, ids, deployment_id: String::new() }
    }

    fn run(mut self) -> ScheduleOutcome {
        let state = self.state;
        let allocs: Vec<&'a Allocation> = state.allocs_by_job(&self.eval.namespace, &self.eval.job_id).map(|a| a.as_ref()).collect();
        let tainted = tainted_nodes(state, &allocs);
        stop_lost_on_down_nodes(&mut self.proposed, &tainted, &allocs);

        let live_job = self.job.clone().filter(|j| !j.stop);
        let batch = self.job.as_ref().map_or(self.eval.eval_type == JobType::Batch, |j| j.job_type == JobType::Batch);
        let mut stack = live_job.as_ref().map(|j| {
            Stack::new(j.clone(), if batch { StackKind::Batch } else { StackKind::Service }, seed_for(&self.eval.id, state.index))
        });

        let mut results = {
            let job = live_job.as_deref();
            let proposed = &mut self.proposed;
            let eval = self.eval;
            let mut update_fn = |existing: &'a Allocation, tg: &TaskGroup| match (job, stack.as_mut()) {
                (Some(job), Some(stack)) => in_place_or_destructive(existing, job, tg, stack, proposed, eval),
                _ => UpdateKind::Ignore,
            };
            let mut reconciler = Reconciler {
                job: self.job.as_deref(),
                job_id: &self.eval.job_id,
                batch,
                tainted: &tainted,
                eval_id: &self.eval.id,
                eval_priority: self.eval.priority,
                now: self.now,
                ids: &self.ids,
                update_fn: &mut update_fn,
                deployment: state.latest_deployment(&self.eval.namespace, &self.eval.job_id).map(|d| d.as_ref()),
            };
            reconciler.compute(&allocs)
        };
        self.deployment_id = results.deployment_id.clone().unwrap_or_default();

        let annotations = self
            .eval
            .annotate_plan
            .then(|| PlanAnnotations { desired_tg_updates: annotate::desired_updates(&results), ..PlanAnnotations::default() });
        self.apply_results(&results);
        if let (Some(job), Some(stack)) = (live_job.as_ref(), stack.as_mut()) {
            self.place(job, stack, &mut results);
        }
        let escaped = stack.as_ref().is_some_and(|s| s.feasibility().escaped());
        let classes = stack.as_ref().map(|s| s.feasibility().class_eligibility()).unwrap_or_default();
        self.finish(results, annotations, escaped, classes)
    }

    /// Stops, unknown marks, reconnects, in-place updates and follow-up IDs go into the plan.
    fn apply_results(&mut self, r: &ReconcileResults<'a>) {
        for s in &r.stop {
            self.proposed.append_stop(s.alloc, s.description, s.client_status, &s.followup_eval_id);
        }
        let rewrites =
            r.disconnect_updates.values().chain(r.reconnect_updates.values()).chain(&r.inplace_update).chain(r.attribute_updates.values());
        for a in rewrites {
            self.proposed.append_alloc(a.clone());
        }
    }

    /// Destructive updates first, then the replacements and new allocs in reconciler order.
    fn place(&mut self, job: &Arc<Job>, stack: &mut Stack<'a>, r: &mut ReconcileResults<'a>) {
        if r.place.is_empty() && r.destructive_update.is_empty() && r.fresh.is_empty() {
            return;
        }
        let wanted = r.destructive_update.iter().map(|d| (&d.group, 1)).chain(r.place.iter().map(|p| (&p.group, 1)));
        for (group, n) in wanted.chain(r.fresh.iter().map(|f| (&f.group, f.count))) {
            let q = self.queued.entry(group.clone()).or_insert(0);
            *q = q.saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let ready = ready_nodes(self.state, job);
        let pool = Pool { in_pool: ready.nodes.len() as i64, by_dc: ready.by_dc };
        stack.set_nodes(ready.nodes);
        for d in &r.destructive_update {
            let req = PlaceRequest {
                name: d.name.clone(),
                group: d.group.clone(),
                previous: Some(d.stop),
                reschedule: false,
                lost: false,
                canary: false,
                downgrade: false,
            };
            self.place_one(job, stack, &pool, &req, true);
        }
        let mut fresh = std::mem::take(&mut r.fresh).into_iter().peekable();
        // Stacks of the older job versions that replacements run while canaries wait.
        let mut older: Vec<(Arc<Job>, Stack<'a>, Pool)> = Vec::new();
        for (i, req) in r.place.iter().enumerate() {
            while let Some(f) = fresh.next_if(|f| f.before <= i) {
                self.place_fresh(job, stack, &pool, f);
            }
            let old_job = req.previous.and_then(|p| p.job.as_ref()).filter(|old| req.downgrade && !same_version(old, job));
            match old_job {
                Some(old) => {
                    let k = match older.iter().position(|(j, _, _)| same_version(j, old)) {
                        Some(k) => k,
                        None => {
                            let ready = ready_nodes(self.state, old);
                            let pool = Pool { in_pool: ready.nodes.len() as i64, by_dc: ready.by_dc };
                            let mut s = Stack::new(old.clone(), StackKind::Service, seed_for(&self.eval.id, self.state.index));
                            s.set_nodes(ready.nodes);
                            older.push((old.clone(), s, pool));
                            older.len() - 1
                        }
                    };
                    let (old, old_stack, old_pool) = &mut older[k];
                    let old = old.clone();
                    self.place_one(&old, old_stack, old_pool, req, false);
                }
                None => self.place_one(job, stack, &pool, req, false),
            }
        }
        for f in fresh {
            self.place_fresh(job, stack, &pool, f);
        }
    }

    /// New allocs, named one at a time. Once one fails the rest of the group is counted as
    /// failed without being tried or named: the cost is what fits, not the count.
    fn place_fresh(&mut self, job: &Arc<Job>, stack: &mut Stack<'a>, pool: &Pool, mut fresh: FreshPlacements) {
        let Some(tg) = job.lookup_task_group(&fresh.group) else { return };
        for done in 0..fresh.count {
            if let Some(m) = self.failed.get_mut(&fresh.group) {
                let rest = i64::try_from(fresh.count - done).unwrap_or(i64::MAX);
                m.coalesced_failures = m.coalesced_failures.saturating_add(rest);
                exhaust_resources(m, tg, rest);
                return;
            }
            let name = fresh.names.take_next();
            let req = PlaceRequest {
                name,
                group: fresh.group.clone(),
                previous: None,
                reschedule: false,
                lost: false,
                canary: false,
                downgrade: false,
            };
            self.place_one(job, stack, pool, &req, false);
        }
    }

    fn place_one(&mut self, job: &Arc<Job>, stack: &mut Stack<'a>, pool: &Pool, req: &PlaceRequest<'a>, stop_previous: bool) {
        let Some(group) = job.task_groups.iter().position(|g| g.name == req.group) else { return };
        let tg = &job.task_groups[group];
        if let Some(m) = self.failed.get_mut(&tg.name) {
            m.coalesced_failures = m.coalesced_failures.saturating_add(1);
            exhaust_resources(m, tg, 1);
            return;
        }
        // Destructive updates free the old alloc's room first; undone if the new one does not fit.
        if let (true, Some(prev)) = (stop_previous, req.previous) {
            self.proposed.append_stop(prev, ALLOC_UPDATING_DESC, None, "");
        }
        let penalty = penalty_nodes(req.previous);
        let opts = SelectOptions { alloc_name: &req.name, penalty_nodes: &penalty };
        let preferred = req
            .previous
            .filter(|_| tg.ephemeral_disk.sticky || tg.ephemeral_disk.migrate)
            .and_then(|p| self.state.node(&p.node_id))
            .filter(|n| n.is_ready_for_placement());
        let (selection, mut metric) = match preferred {
            Some(node) => match stack.select_node(&mut self.proposed, node, group, opts) {
                (Some(s), m) => (Some(s), m),
                (None, _) => stack.select(&mut self.proposed, group, opts),
            },
            None => stack.select(&mut self.proposed, group, opts),
        };
        metric.nodes_available = pool.by_dc.clone();
        metric.nodes_in_pool = pool.in_pool;
        match selection {
            Some(sel) => {
                let alloc = self.new_alloc(job, tg, req, sel, metric);
                self.proposed.append_alloc(alloc);
                *self.queued.entry(tg.name.clone()).or_insert(0) -= 1;
            }
            None => {
                exhaust_resources(&mut metric, tg, 1);
                self.failed.insert(tg.name.clone(), metric);
                if let (true, Some(prev)) = (stop_previous, req.previous) {
                    self.proposed.pop_stop(prev);
                }
            }
        }
    }

    fn new_alloc(&self, job: &Job, tg: &TaskGroup, req: &PlaceRequest<'a>, sel: Selection<'a>, metric: AllocMetric) -> Allocation {
        let mut alloc = Allocation {
            id: self.ids.next_id(),
            namespace: job.namespace.clone(),
            eval_id: self.eval.id.clone(),
            name: req.name.clone(),
            node_id: sel.node.id.clone(),
            node_name: sel.node.name.clone(),
            job_id: job.id.clone(),
            job: None,
            task_group: tg.name.clone(),
            allocated_resources: Some(sel.resources),
            metrics: Some(metric),
            desired_status: DesiredStatus::Run,
            client_status: ClientStatus::Pending,
            deployment_id: self.deployment_id.clone(),
            ..Allocation::default()
        };
        if req.canary {
            alloc.deployment_status =
                Some(serde_json::json!({ "Healthy": null, "Timestamp": Timestamp::ZERO, "Canary": true, "ModifyIndex": 0 }));
        }
        if self.job.as_ref().is_some_and(|current| !same_version(current, job)) {
            // An older version, placed while canaries of the current one wait: not part of
            // the rollout, and it carries its own job.
            alloc.job = req.previous.and_then(|p| p.job.clone());
            alloc.deployment_id = String::new();
        }
        if let Some(prev) = req.previous {
            alloc.previous_allocation = prev.id.clone();
            if req.reschedule {
                alloc.reschedule_tracker = Some(super::reschedule::tracker_for_replacement(prev, self.now));
            }
            propagate_task_handles(&mut alloc, prev, req.lost);
        }
        alloc
    }

    fn finish(
        self,
        results: ReconcileResults<'a>,
        annotations: Option<PlanAnnotations>,
        escaped: bool,
        classes: BTreeMap<String, bool>,
    ) -> ScheduleOutcome {
        let eval = self.eval;
        let mut new_evals = Vec::new();
        // Follow-ups are only made by evals that are not themselves delayed.
        let delay_instead = !results.followup_evals.is_empty() && eval.wait_until.is_zero();
        let mut blocked_id = String::new();
        if eval.status != EvalStatus::Blocked && !self.failed.is_empty() && !delay_instead {
            let blocked = Evaluation {
                id: self.ids.next_id(),
                namespace: eval.namespace.clone(),
                priority: eval.priority,
                eval_type: eval.eval_type,
                triggered_by: trigger::QUEUED_ALLOCS.to_string(),
                job_id: eval.job_id.clone(),
                job_modify_index: eval.job_modify_index,
                status: EvalStatus::Blocked,
                status_description: BLOCKED_EVAL_FAILED_PLACEMENTS_DESC.to_string(),
                previous_eval: eval.id.clone(),
                failed_tg_allocs: self.failed.clone(),
                class_eligibility: if escaped { BTreeMap::new() } else { classes.clone() },
                escaped_computed_class: escaped,
                create_time: self.now.unix_nanos(),
                modify_time: self.now.unix_nanos(),
                ..Evaluation::default()
            };
            blocked_id = blocked.id.clone();
            new_evals.push(blocked);
        }
        let plan = self.proposed.into_plan();
        let mut next_eval = String::new();
        let deployment_changes = results.deployment.is_some() || !results.deployment_updates.is_empty();
        if !plan.is_no_op() || deployment_changes || eval.annotate_plan {
            if delay_instead {
                for mut f in results.followup_evals {
                    f.previous_eval = eval.id.clone();
                    new_evals.push(f);
                }
            }
            if let (Some(at), Some(job)) = (results.rolling_wait_until, self.job.as_ref()) {
                let mut next = Evaluation::for_job(job, trigger::ROLLING_UPDATE, self.now);
                next.id = self.ids.next_id();
                next.priority = eval.priority;
                next.status_description = ROLLING_UPDATE_FOLLOWUP_DESC.to_string();
                next.wait_until = at;
                next.previous_eval = eval.id.clone();
                next_eval = next.id.clone();
                new_evals.push(next);
            }
        }
        let eval_update = if eval.status == EvalStatus::Blocked && !self.failed.is_empty() {
            // Still blocked: the worker re-blocks it with what was learned.
            let mut e = eval.clone();
            e.escaped_computed_class = escaped;
            e.class_eligibility = classes;
            e.failed_tg_allocs = self.failed;
            e.queued_allocations = self.queued;
            e.snapshot_index = self.state.index;
            e.modify_time = self.now.unix_nanos();
            e
        } else {
            let mut e = finished(eval, EvalStatus::Complete, "", self.now);
            // The deployment the job's allocs roll out in, for `job run` to follow.
            if !self.deployment_id.is_empty() {
                e.deployment_id = self.deployment_id.clone();
            }
            e.failed_tg_allocs = self.failed;
            e.queued_allocations = self.queued;
            e.blocked_eval = blocked_id;
            e.next_eval = next_eval;
            e.snapshot_index = self.state.index;
            e
        };
        let mut plan = plan;
        plan.annotations = annotations.clone();
        plan.deployment = results.deployment;
        plan.deployment_updates = results.deployment_updates;
        ScheduleOutcome { plan, eval_update, new_evals, annotations }
    }
}

/// The ready nodes as every placement's metric reports them.
/// The same version of the same job.
fn same_version(a: &Job, b: &Job) -> bool {
    a.version == b.version && a.create_index == b.create_index && a.job_modify_index == b.job_modify_index
}

struct Pool {
    in_pool: i64,
    by_dc: BTreeMap<String, i64>,
}

/// Nodes a replacement should avoid: where the previous alloc failed and
/// where earlier attempts ran.
fn penalty_nodes(prev: Option<&Allocation>) -> Vec<String> {
    let Some(prev) = prev else { return Vec::new() };
    let mut nodes = Vec::new();
    if prev.client_status == ClientStatus::Failed {
        nodes.push(prev.node_id.clone());
    }
    if let Some(t) = &prev.reschedule_tracker {
        nodes.extend(t.events.iter().map(|e| e.prev_node_id.clone()));
    }
    nodes
}

/// Remote task handles follow allocs off lost or draining nodes.
fn propagate_task_handles(alloc: &mut Allocation, prev: &Allocation, prev_lost: bool) {
    if prev.client_terminal() || !(prev_lost || prev.desired_transition.should_migrate()) {
        return;
    }
    let Some(tasks) = alloc.allocated_resources.as_ref().map(|r| &r.tasks) else { return };
    let handles: BTreeMap<String, TaskState> = prev
        .task_states
        .iter()
        .flatten()
        .filter(|(name, s)| s.task_handle.is_some() && tasks.contains_key(*name))
        .map(|(name, s)| {
            (name.clone(), TaskState { state: task_state::PENDING.into(), task_handle: s.task_handle.clone(), ..TaskState::default() })
        })
        .collect();
    if !handles.is_empty() {
        alloc.task_states = Some(handles);
    }
}

/// Nomad's `genericAllocUpdateFn`: ignore, update in place on the same node
/// when it still fits there, or replace.
fn in_place_or_destructive<'a>(
    existing: &'a Allocation,
    job: &Job,
    tg: &TaskGroup,
    stack: &mut Stack<'a>,
    proposed: &mut Proposed<'a>,
    eval: &Evaluation,
) -> UpdateKind {
    let Some(old_job) = existing.job.as_deref() else { return UpdateKind::Ignore };
    if old_job.job_modify_index == job.job_modify_index {
        return UpdateKind::Ignore;
    }
    if destructive_change(job, old_job, &tg.name).is_some() {
        return UpdateKind::Destructive;
    }
    if existing.terminal() {
        return UpdateKind::Ignore;
    }
    let Some(node) = proposed.state().node(&existing.node_id).map(|n| n.as_ref()) else { return UpdateKind::Destructive };
    if !node.in_any_datacenter(&job.datacenters) || !(job.node_pool.is_empty() || node.in_pool(&job.node_pool)) {
        return UpdateKind::Destructive;
    }
    let Some(group) = job.task_groups.iter().position(|g| g.name == tg.name) else { return UpdateKind::Destructive };
    // Discount the alloc's own resources while checking the new version fits.
    proposed.append_stop(existing, ALLOC_IN_PLACE_DESC, None, "");
    let (selection, _) = stack.select_node(proposed, node, group, SelectOptions { alloc_name: &existing.name, penalty_nodes: &[] });
    proposed.pop_stop(existing);
    let Some(sel) = selection else { return UpdateKind::Destructive };
    UpdateKind::InPlace(Box::new(in_place_alloc(existing, tg, sel.resources, eval)))
}

/// The rewritten alloc: new resources, but the ports and devices it holds.
fn in_place_alloc(existing: &Allocation, tg: &TaskGroup, mut resources: nomad_proto::AllocatedResources, eval: &Evaluation) -> Allocation {
    super::updates::keep_held_networks(existing, &mut resources);
    resources.shared.disk_mb = tg.ephemeral_disk.size_mb;
    let mut a = existing.clone();
    a.eval_id = eval.id.clone();
    // The plan's job.
    a.job = None;
    a.allocated_resources = Some(resources);
    a
}
