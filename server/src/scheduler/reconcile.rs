//! The reconciler: compares a service or batch job with its allocs and the
//! state of their nodes, and returns what to change, in named buckets.
//!
//! ```text
//!  allocs of group ─▶ filter_by_tainted ─▶ untainted │ migrate │ lost │ disconnecting │ reconnecting │ ignore
//!    reconnecting ─▶ keep original or replacement (reconnect.rs)
//!    untainted    ─▶ reschedule now / later (follow-up evals) ─▶ stop surplus ─▶ in-place │ destructive
//!    disconnecting─▶ mark unknown + timeout eval, replace now
//!    lost         ─▶ stop (lost), replace up to count
//! ```
//!
//! Deployments (`deployment.rs`): a service job whose groups have an update strategy rolls a
//! new version out in a deployment. Destructive updates go `max_parallel` at a time, less the
//! deployment's allocs whose health is not known yet, none while one is unhealthy or the
//! deployment is paused or failed; the deployment watcher evaluates the job again as health
//! arrives. Without a deployment (a job whose new version only scales, say) they go
//! `max_parallel` at a time and the rest continue in a `rolling-update` follow-up eval after
//! the group's `min_healthy_time`.
//!
//! Canaries (`update { canary = n }`): a destructive change first places `n` canaries of the
//! new version beside the old allocs (they take the replaced allocs' names) and nothing else
//! changes until the deployment is promoted; then the old allocs with the canaries' names stop
//! and the rest are replaced `max_parallel` at a time. While canarying, a replacement of a lost
//! or failed old alloc runs the old alloc's job version. Canaries of a deployment that was
//! replaced or failed before promotion are stopped.

mod deployment;
mod followups;
mod reconnect;

use std::collections::BTreeMap;

use nomad_proto::alloc::{ALLOC_JOB_STOPPED_DESC, ALLOC_LOST_DESC, ALLOC_MIGRATING_DESC, ALLOC_NOT_NEEDED_DESC, ALLOC_RESCHEDULED_DESC};
use nomad_proto::deployment::alloc_is_canary;
use nomad_proto::plan::DesiredUpdates;
use nomad_proto::{Allocation, ClientStatus, Deployment, DeploymentStatusUpdate, Evaluation, Job, TaskGroup, Timestamp};

use super::alloc_sets::{self, AllocSet, TaintedNodes, difference, filter_by_rescheduleable, filter_by_tainted};
use super::ids::IdSource;
use super::names::NameIndex;
use deployment::requires_canaries;

/// An alloc to place.
#[derive(Debug, Clone)]
pub(crate) struct PlaceRequest<'a> {
    pub(crate) name: String,
    pub(crate) group: String,
    /// The alloc this one replaces (rescheduled, lost, migrated, disconnected).
    pub(crate) previous: Option<&'a Allocation>,
    /// Replaces a failed (or disconnected) alloc: penalize its node, extend its tracker.
    pub(crate) reschedule: bool,
    /// Replaces an alloc lost with its node.
    pub(crate) lost: bool,
    /// Placed as a canary of the deployment.
    pub(crate) canary: bool,
    /// Runs the previous alloc's job version: it replaces an old alloc while canaries of the
    /// new version wait for promotion.
    pub(crate) downgrade: bool,
}

/// New allocs of one group under names no alloc carries, named only as they are placed: a
/// group's `count` may be far more than fits, and the scheduler must not spend memory on
/// placements it cannot make.
#[derive(Debug, Clone)]
pub(crate) struct FreshPlacements {
    pub(crate) group: String,
    /// How many to place.
    pub(crate) count: u64,
    /// Hands out the names, lowest free index first.
    pub(crate) names: NameIndex,
    /// Where these go in the placement order: before `place[before]` (after the group's
    /// replacements, before its migrations).
    pub(crate) before: usize,
}

impl FreshPlacements {
    /// Every name, materialized (tests only: the scheduler takes them one by one).
    #[cfg(test)]
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names = self.names.clone();
        (0..self.count).map(|_| names.take_next()).collect()
    }
}

/// An alloc replaced by a new one because the job changed destructively.
#[derive(Debug, Clone)]
pub(crate) struct DestructiveUpdate<'a> {
    pub(crate) name: String,
    pub(crate) group: String,
    pub(crate) stop: &'a Allocation,
}

/// An alloc to stop.
#[derive(Debug, Clone)]
pub(crate) struct StopRequest<'a> {
    pub(crate) alloc: &'a Allocation,
    pub(crate) client_status: Option<ClientStatus>,
    pub(crate) description: &'static str,
    pub(crate) followup_eval_id: String,
}

/// How an existing alloc takes a new job version.
#[derive(Debug, Clone)]
pub(crate) enum UpdateKind {
    /// Nothing to do.
    Ignore,
    /// Stop it and place a new one.
    Destructive,
    /// Rewrite it on its node.
    InPlace(Box<Allocation>),
}

/// Decides [`UpdateKind`] for an untainted alloc and the current group.
pub(crate) type UpdateFn<'f, 'a> = dyn FnMut(&'a Allocation, &TaskGroup) -> UpdateKind + 'f;

/// What the reconciler decided.
#[derive(Debug, Default)]
pub(crate) struct ReconcileResults<'a> {
    /// Replacements of existing allocs (each names its previous alloc).
    pub(crate) place: Vec<PlaceRequest<'a>>,
    /// New allocs up to each group's count, interleaved with `place` by their `before`.
    pub(crate) fresh: Vec<FreshPlacements>,
    pub(crate) destructive_update: Vec<DestructiveUpdate<'a>>,
    pub(crate) inplace_update: Vec<Allocation>,
    pub(crate) stop: Vec<StopRequest<'a>>,
    /// Allocs rewritten to carry a follow-up eval ID (delayed reschedules).
    pub(crate) attribute_updates: BTreeMap<String, Allocation>,
    /// Allocs on disconnected nodes, now marked `unknown`.
    pub(crate) disconnect_updates: BTreeMap<String, Allocation>,
    /// `unknown` allocs back on their node, with a `running` AllocState appended.
    pub(crate) reconnect_updates: BTreeMap<String, Allocation>,
    pub(crate) desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    /// Delayed evals: reschedules, disconnect timeouts, lost-later.
    pub(crate) followup_evals: Vec<Evaluation>,
    /// Destructive updates were held back by `max_parallel`; continue then.
    pub(crate) rolling_wait_until: Option<Timestamp>,
    /// A deployment this run creates.
    pub(crate) deployment: Option<Deployment>,
    /// Status changes of deployments (cancelled, successful).
    pub(crate) deployment_updates: Vec<DeploymentStatusUpdate>,
    /// The active deployment new allocs join (existing or created), if any.
    pub(crate) deployment_id: Option<String>,
}

/// Inputs of one reconciliation.
pub(crate) struct Reconciler<'a, 'f> {
    /// The job; `None` when it was purged.
    pub(crate) job: Option<&'f Job>,
    pub(crate) job_id: &'a str,
    pub(crate) batch: bool,
    pub(crate) tainted: &'f TaintedNodes<'a>,
    pub(crate) eval_id: &'f str,
    pub(crate) eval_priority: i64,
    pub(crate) now: Timestamp,
    /// Where follow-up evals get their IDs.
    pub(crate) ids: &'f IdSource,
    pub(crate) update_fn: &'f mut UpdateFn<'f, 'a>,
    /// The job's newest deployment.
    pub(crate) deployment: Option<&'f Deployment>,
}

struct Run<'a, 'f, 'r> {
    inputs: &'r mut Reconciler<'a, 'f>,
    results: ReconcileResults<'a>,
    /// The deployment of the job's current version, as this run changes it.
    deployment: Option<Deployment>,
    /// The deployment of an earlier version (or of the stopped job): its unpromoted canaries
    /// go.
    old_deployment: Option<Deployment>,
    /// It is paused: nothing but replacements of lost or failed allocs is placed.
    deployment_paused: bool,
    /// It failed: likewise.
    deployment_failed: bool,
}

impl<'a, 'f> Reconciler<'a, 'f> {
    /// Reconciles `allocs` (all of the job's allocs, terminal ones included).
    pub(crate) fn compute(&mut self, allocs: &[&'a Allocation]) -> ReconcileResults<'a> {
        let mut matrix: BTreeMap<String, AllocSet<'a>> = BTreeMap::new();
        for a in allocs {
            matrix.entry(a.task_group.clone()).or_default().insert(a.id.as_str(), a);
        }
        let job = self.job;
        let mut run = Run {
            inputs: self,
            results: ReconcileResults::default(),
            deployment: None,
            old_deployment: None,
            deployment_paused: false,
            deployment_failed: false,
        };
        run.cancel_unneeded_deployments(job);
        match job {
            Some(job) if !job.stop => {
                for tg in &job.task_groups {
                    matrix.entry(tg.name.clone()).or_default();
                }
                run.deployment_paused = run.deployment.as_ref().is_some_and(|d| d.status == nomad_proto::deployment::status::PAUSED);
                run.deployment_failed = run.deployment.as_ref().is_some_and(|d| d.status == nomad_proto::deployment::status::FAILED);
                let mut complete = true;
                for (group, set) in &matrix {
                    complete &= run.compute_group(job, group, set);
                }
                run.finish_deployment(complete);
            }
            _ => {
                // Stopped or purged: stop everything still live.
                for (group, set) in &matrix {
                    let live: AllocSet<'a> = set.iter().filter(|(_, a)| !a.terminal()).map(|(k, v)| (*k, *v)).collect();
                    let stop = run.filter_and_stop_all(&live, ALLOC_JOB_STOPPED_DESC);
                    run.results.desired_tg_updates.insert(group.clone(), DesiredUpdates { stop, ..DesiredUpdates::default() });
                }
            }
        }
        run.results
    }
}

impl<'a> Run<'a, '_, '_> {
    fn mark_stop(&mut self, set: &AllocSet<'a>, client_status: Option<ClientStatus>, description: &'static str) {
        for &a in set.values() {
            self.results.stop.push(StopRequest { alloc: a, client_status, description, followup_eval_id: String::new() });
        }
    }

    /// Stops every alloc of the set, lost ones as lost.
    fn filter_and_stop_all(&mut self, set: &AllocSet<'a>, description: &'static str) -> u64 {
        let split = filter_by_tainted(set, self.inputs.tainted, self.inputs.now);
        self.mark_stop(&split.untainted, None, description);
        self.mark_stop(&split.migrate, None, description);
        self.mark_stop(&split.lost, Some(ClientStatus::Lost), ALLOC_LOST_DESC);
        self.mark_stop(&split.disconnecting, None, description);
        self.mark_stop(&split.reconnecting, None, description);
        let unknown: AllocSet<'a> =
            split.ignore.iter().filter(|(_, a)| a.client_status == ClientStatus::Unknown).map(|(k, v)| (*k, *v)).collect();
        self.mark_stop(&unknown, None, description);
        set.len() as u64
    }

    /// Reconciles one group; whether its part of the deployment is complete.
    fn compute_group(&mut self, job: &Job, group: &str, all: &AllocSet<'a>) -> bool {
        let mut desired = DesiredUpdates::default();
        let Some(tg) = job.lookup_task_group(group) else {
            // The group was removed from the job.
            let live: AllocSet<'a> = all.iter().filter(|(_, a)| !a.terminal()).map(|(k, v)| (*k, *v)).collect();
            desired.stop = self.filter_and_stop_all(&live, ALLOC_NOT_NEEDED_DESC);
            self.results.desired_tg_updates.insert(group.to_string(), desired);
            return true;
        };
        let (mut dstate, existing_deployment) = self.deployment_state(tg);
        let mut desired_total: i64 = 0;
        let (now, batch) = (self.inputs.now, self.inputs.batch);

        // Batch allocs that finished under an older version are history.
        let all: AllocSet<'a> = if batch {
            let (old, keep): (Vec<_>, Vec<_>) = all.iter().partition(|(_, a)| a.terminal() && is_older(a, job));
            desired.ignore += old.len() as u64;
            keep.into_iter().map(|(k, v)| (*k, *v)).collect()
        } else {
            all.clone()
        };

        let (canaries, all) = self.cancel_unneeded_canaries(&all, &mut desired);

        let mut split = filter_by_tainted(&all, self.inputs.tainted, now);
        desired.ignore += split.ignore.len() as u64;

        // Reconnecting allocs and their replacements are settled first.
        if !split.reconnecting.is_empty() {
            let (reconnect, stop) = self.reconcile_reconnecting(job, &split.reconnecting, &all);
            desired.stop += stop.len() as u64;
            for set in [&mut split.untainted, &mut split.migrate, &mut split.lost, &mut split.disconnecting, &mut split.ignore] {
                *set = difference(set, &stop);
            }
            self.compute_reconnecting(job, &reconnect);
            split.untainted.extend(reconnect);
        }

        let resched = filter_by_rescheduleable(&split.untainted, batch, false, now, self.inputs.eval_id);
        let mut untainted = resched.untainted;
        let mut reschedule_now = resched.now;
        let disconnecting = filter_by_rescheduleable(&split.disconnecting, batch, true, now, self.inputs.eval_id);
        // One replacement per disconnected alloc: one that disconnects again before its
        // reconnect was settled keeps the replacement it already has.
        let replaced =
            |a: &Allocation| all.values().any(|x| x.id != a.id && x.name == a.name && x.create_index > a.create_index && !x.terminal());
        reschedule_now.extend(disconnecting.now.into_iter().filter(|(_, a)| !replaced(a)));

        let lost_later = alloc_sets::delay_by_stop_after_client_disconnect(&split.lost, now);
        let mut followup_ids = self.create_delayed_evals(job, &lost_later);
        followup_ids.extend(self.create_timeout_later_evals(job, &split.disconnecting));
        self.create_reschedule_later_evals(job, &resched.later, &all);

        let taken = untainted.values().chain(split.migrate.values()).chain(reschedule_now.values()).chain(split.lost.values()).copied();
        let mut names = NameIndex::new(self.inputs.job_id, group, tg.count, taken);

        let mut migrate = split.migrate;
        let canarying = dstate.desired_canaries != 0 && !dstate.promoted;
        let stop = self.compute_stop(tg, &mut names, &untainted, &mut migrate, &split.lost, &followup_ids, &canaries, canarying);
        desired.stop += stop.len() as u64;
        untainted = difference(&untainted, &stop);

        let (ignore, inplace, destructive) = self.compute_updates(tg, &untainted);
        desired.ignore += ignore as u64;
        desired.in_place_update += inplace as u64;
        // In-place updates restart nothing: they stay out of the deployment (see deployment.rs).
        desired_total = desired_total.saturating_add(destructive.len() as i64);

        // Canaries are neither counted nor replaced as part of the count until promoted.
        if canarying {
            untainted = difference(&untainted, &canaries);
        }
        let requires_canaries = requires_canaries(tg, &dstate, &destructive, &canaries);
        if requires_canaries {
            self.compute_canaries(tg, &mut dstate, &destructive, &canaries, &mut desired, &mut names);
        }
        let canarying = dstate.desired_canaries != 0 && !dstate.promoted;

        let mut under = self.under_provisioned_by(tg, &untainted, &destructive, &migrate, canarying);
        let place_ready = !self.deployment_paused && !self.deployment_failed && !canarying;
        let (place, mut fresh) = if lost_later.is_empty() {
            self.compute_placements(tg, &untainted, &migrate, &reschedule_now, &split.lost, canarying)
        } else {
            (Vec::new(), 0)
        };
        desired_total = desired_total.saturating_add(place.len() as i64).saturating_add(fresh as i64);
        if !place_ready {
            // Replacements of lost and failed allocs still go; nothing new does.
            fresh = 0;
        }

        // Replacements of failed allocs stop them; disconnected originals keep running.
        let failed: AllocSet<'a> =
            reschedule_now.iter().filter(|(id, _)| !self.results.disconnect_updates.contains_key(**id)).map(|(k, v)| (*k, *v)).collect();
        let placing = (place.len() as u64).saturating_add(fresh);
        desired.place = desired.place.saturating_add(placing);
        under -= usize::try_from(placing).unwrap_or(usize::MAX).min(under);
        self.results.place.extend(place);
        if fresh > 0 {
            let before = self.results.place.len();
            self.results.fresh.push(FreshPlacements { group: tg.name.clone(), count: fresh, names, before });
        }
        self.mark_stop(&failed, None, ALLOC_RESCHEDULED_DESC);
        desired.stop += failed.len() as u64;

        let n = if place_ready { destructive.len().min(under) } else { 0 };
        desired.destructive_update += n as u64;
        desired.ignore += (destructive.len() - n) as u64;
        for &a in name_order(&destructive).iter().take(n) {
            self.results.destructive_update.push(DestructiveUpdate { name: a.name.clone(), group: tg.name.clone(), stop: a });
        }
        dstate.desired_total = dstate.desired_total.saturating_add(desired_total);
        self.create_deployment(job, tg, existing_deployment, dstate, &all, &destructive);
        if n < destructive.len() && self.deployment.is_none() {
            // No deployment to wait on: go on after min_healthy_time.
            let wait = tg.update.as_ref().map_or(0, |u| u.min_healthy_time);
            let at = now.add_nanos(wait);
            self.results.rolling_wait_until = Some(self.results.rolling_wait_until.map_or(at, |t| t.max(at)));
        }
        let work_left = !destructive.is_empty() || placing > 0 || !migrate.is_empty() || !resched.later.is_empty() || requires_canaries;

        desired.migrate += migrate.len() as u64;
        for a in name_order(&migrate) {
            self.results.stop.push(StopRequest {
                alloc: a,
                client_status: None,
                description: ALLOC_MIGRATING_DESC,
                followup_eval_id: String::new(),
            });
            let canary = alloc_is_canary(a);
            self.results.place.push(PlaceRequest {
                name: a.name.clone(),
                group: tg.name.clone(),
                previous: Some(a),
                reschedule: false,
                lost: false,
                canary,
                downgrade: canarying && !canary,
            });
        }
        self.results.desired_tg_updates.insert(group.to_string(), desired);
        !work_left && self.group_healthy(group)
    }

    /// Stops lost allocs and allocs above `count` (highest name indexes first). Canaries are
    /// not counted while they wait for promotion; once promoted, the old allocs that carry
    /// their names go first.
    #[allow(clippy::too_many_arguments)]
    fn compute_stop(
        &mut self,
        tg: &TaskGroup,
        names: &mut NameIndex,
        untainted: &AllocSet<'a>,
        migrate: &mut AllocSet<'a>,
        lost: &AllocSet<'a>,
        followups: &BTreeMap<String, String>,
        canaries: &AllocSet<'a>,
        canarying: bool,
    ) -> AllocSet<'a> {
        let mut stop = lost.clone();
        for &a in lost.values() {
            let followup_eval_id = followups.get(&a.id).cloned().unwrap_or_default();
            self.results.stop.push(StopRequest {
                alloc: a,
                client_status: Some(ClientStatus::Lost),
                description: ALLOC_LOST_DESC,
                followup_eval_id,
            });
        }
        let counted = if canarying { difference(untainted, canaries) } else { untainted.clone() };
        let mut remove = counted.len() as i64 + migrate.len() as i64 - tg.count;
        if remove <= 0 {
            return stop;
        }
        let mut live: AllocSet<'a> = counted.iter().filter(|(_, a)| !a.terminal()).map(|(k, v)| (*k, *v)).collect();
        let stop_one = |this: &mut Self, a: &'a Allocation, stop: &mut AllocSet<'a>| {
            stop.insert(a.id.as_str(), a);
            this.results.stop.push(StopRequest {
                alloc: a,
                client_status: None,
                description: ALLOC_NOT_NEEDED_DESC,
                followup_eval_id: String::new(),
            });
        };
        // Promoted canaries took these names over.
        if !canarying && !canaries.is_empty() {
            let canary_names: std::collections::HashSet<&str> = canaries.values().map(|a| a.name.as_str()).collect();
            let replaced: Vec<&'a Allocation> =
                name_order(&difference(&live, canaries)).into_iter().filter(|a| canary_names.contains(a.name.as_str())).collect();
            for a in replaced {
                stop_one(self, a, &mut stop);
                live.remove(a.id.as_str());
                remove -= 1;
                if remove == 0 {
                    return stop;
                }
            }
        }
        // Prefer stopping allocs that are migrating anyway.
        if !migrate.is_empty() {
            let mut migrating = NameIndex::new(self.inputs.job_id, &tg.name, tg.count, migrate.values().copied());
            let remove_names = migrating.highest(remove as usize);
            let matching: Vec<&'a Allocation> = migrate.values().copied().filter(|a| remove_names.contains(&a.name)).collect();
            for a in matching {
                stop_one(self, a, &mut stop);
                migrate.remove(a.id.as_str());
                names.unset(a.index());
                remove -= 1;
                if remove == 0 {
                    return stop;
                }
            }
        }
        let remove_names = names.highest(remove as usize);
        let by_name: Vec<&'a Allocation> = live.values().copied().filter(|a| remove_names.contains(&a.name)).collect();
        for a in by_name {
            stop_one(self, a, &mut stop);
            live.remove(a.id.as_str());
            remove -= 1;
            if remove == 0 {
                return stop;
            }
        }
        // Duplicate names can leave some to stop.
        for a in live.values().copied().collect::<Vec<_>>() {
            stop_one(self, a, &mut stop);
            remove -= 1;
            if remove == 0 {
                break;
            }
        }
        stop
    }

    /// Sorts untainted allocs by how they take the current job version.
    fn compute_updates(&mut self, tg: &TaskGroup, untainted: &AllocSet<'a>) -> (usize, usize, AllocSet<'a>) {
        let (mut ignore, mut inplace, mut destructive) = (0, 0, AllocSet::new());
        for (&id, &a) in untainted {
            match (self.inputs.update_fn)(a, tg) {
                UpdateKind::Ignore => ignore += 1,
                UpdateKind::Destructive => {
                    destructive.insert(id, a);
                }
                UpdateKind::InPlace(updated) => {
                    inplace += 1;
                    self.results.inplace_update.push(*updated);
                }
            }
        }
        (ignore, inplace, destructive)
    }

    /// Replacements: rescheduled allocs, lost allocs up to count; and how many new names
    /// make up the rest of the count.
    fn compute_placements(
        &self,
        tg: &TaskGroup,
        untainted: &AllocSet<'a>,
        migrate: &AllocSet<'a>,
        reschedule: &AllocSet<'a>,
        lost: &AllocSet<'a>,
        canarying: bool,
    ) -> (Vec<PlaceRequest<'a>>, u64) {
        // A canary's replacement is a canary; an old alloc's runs its version while canarying.
        let replace = |a: &'a Allocation, reschedule: bool, lost: bool| {
            let canary = alloc_is_canary(a);
            PlaceRequest {
                name: a.name.clone(),
                group: tg.name.clone(),
                previous: Some(a),
                reschedule,
                lost,
                canary,
                downgrade: canarying && !canary,
            }
        };
        let mut place: Vec<PlaceRequest<'a>> = reschedule.values().map(|&a| replace(a, true, false)).collect();
        let mut existing = (untainted.len() + migrate.len() + reschedule.len()) as i64;
        // Names a live alloc keeps (or a rescheduled one passes on).
        let live: std::collections::HashSet<&str> =
            untainted.values().chain(migrate.values()).chain(reschedule.values()).map(|a| a.name.as_str()).collect();
        for &a in lost.values() {
            if existing >= tg.count {
                break;
            }
            // A lost alloc whose name another copy still carries (the copy it lost a
            // reconnect to, or its own replacement) is not replaced under that name: the
            // count is made up below with names nothing carries.
            if live.contains(a.name.as_str()) {
                continue;
            }
            existing += 1;
            place.push(replace(a, false, true));
        }
        let fresh = if existing < tg.count { (tg.count - existing) as u64 } else { 0 };
        (place, fresh)
    }
}

/// The alloc runs an older job version (or an older job of the same ID).
fn is_older(a: &Allocation, job: &Job) -> bool {
    a.job.as_ref().is_some_and(|j| j.version < job.version || j.create_index < job.create_index)
}

/// Allocs ordered by name index.
fn name_order<'a>(set: &AllocSet<'a>) -> Vec<&'a Allocation> {
    let mut v: Vec<&'a Allocation> = set.values().copied().collect();
    v.sort_by_key(|a| a.index());
    v
}

#[cfg(test)]
pub(crate) mod tests;
