//! The reconciler's deployment decisions (Nomad's `cancelUnneededDeployments`,
//! `computeUnderProvisionedBy`, `createDeployment`, `isDeploymentComplete`).
//!
//! One deployment per job version: created when a version with an update strategy first
//! places or replaces allocs, cancelled when the job stops or a newer version comes, successful
//! once every group has its count healthy and nothing is left to do. In-place updates restart
//! no task, so they stay in the deployment (if any) they were in and do not count toward the
//! new one: the client judges an alloc's health once, when it starts (a departure from Nomad,
//! whose clients judge in-place updated allocs again).

use nomad_proto::alloc::{ALLOC_LOST_DESC, ALLOC_MIGRATING_DESC, ALLOC_NOT_NEEDED_DESC};
use nomad_proto::deployment::{alloc_health, description, status};
use nomad_proto::plan::DesiredUpdates;
use nomad_proto::{Allocation, ClientStatus, Deployment, DeploymentState, DeploymentStatusUpdate, DesiredStatus, Job, TaskGroup};

use super::{PlaceRequest, Run};
use crate::scheduler::alloc_sets::{AllocSet, difference, filter_by_tainted};
use crate::scheduler::names::NameIndex;

/// The group has an update strategy that rolls out in a deployment.
fn has_strategy(tg: &TaskGroup) -> bool {
    tg.update.as_ref().is_some_and(|u| u.max_parallel > 0)
}

/// The group wants more canaries for a destructive change (Nomad's `requiresCanaries`).
pub(super) fn requires_canaries(tg: &TaskGroup, dstate: &DeploymentState, destructive: &AllocSet<'_>, canaries: &AllocSet<'_>) -> bool {
    let wanted = tg.update.as_ref().map_or(0, |u| usize::try_from(u.canary.max(0)).unwrap_or(usize::MAX));
    !destructive.is_empty() && canaries.len() < wanted && !dstate.promoted
}

impl<'a> Run<'a, '_, '_> {
    /// Picks the deployment of the job's current version, and cancels one the job has moved
    /// past (stopped, or a newer version) while it is still active. A successful one is done:
    /// a later change to the same version (a count, say) needs no deployment.
    pub(super) fn cancel_unneeded_deployments(&mut self, job: Option<&Job>) {
        let Some(d) = self.inputs.deployment else { return };
        let cancel = |desc: &str| DeploymentStatusUpdate {
            deployment_id: d.id.clone(),
            status: status::CANCELLED.to_string(),
            status_description: desc.to_string(),
        };
        match job {
            None => {
                if d.active() {
                    self.results.deployment_updates.push(cancel(description::STOPPED_JOB));
                }
                self.old_deployment = Some(d.clone());
            }
            Some(job) if job.stop => {
                if d.active() {
                    self.results.deployment_updates.push(cancel(description::STOPPED_JOB));
                }
                self.old_deployment = Some(d.clone());
            }
            Some(job) if !d.is_for(job) => {
                if d.active() {
                    self.results.deployment_updates.push(cancel(description::NEWER_JOB));
                }
                self.old_deployment = Some(d.clone());
            }
            Some(_) if d.status == status::SUCCESSFUL => {}
            Some(_) => self.deployment = Some(d.clone()),
        }
        if let Some(d) = self.deployment.as_ref().filter(|d| d.active()) {
            self.results.deployment_id = Some(d.id.clone());
        }
    }

    /// The group's part of the current deployment, or a new one from its update strategy;
    /// and whether the deployment has it already (Nomad's `initializeDeploymentState`).
    pub(super) fn deployment_state(&self, tg: &TaskGroup) -> (DeploymentState, bool) {
        if let Some(existing) = self.deployment.as_ref().and_then(|d| d.task_groups.get(&tg.name)) {
            return (existing.clone(), true);
        }
        let state = match tg.update.as_ref().filter(|u| u.max_parallel > 0) {
            Some(u) => DeploymentState {
                auto_revert: u.auto_revert,
                auto_promote: u.auto_promote,
                progress_deadline: u.progress_deadline,
                ..DeploymentState::default()
            },
            None => DeploymentState::default(),
        };
        (state, false)
    }

    /// Stops the unpromoted canaries of an older deployment or of a failed current one, and
    /// canaries whose node is draining or gone (they are placed again, not migrated). Returns
    /// the current deployment's canaries still in place, and the group's allocs without those
    /// stopped (Nomad's `cancelUnneededCanaries`).
    pub(super) fn cancel_unneeded_canaries(&mut self, all: &AllocSet<'a>, desired: &mut DesiredUpdates) -> (AllocSet<'a>, AllocSet<'a>) {
        let unpromoted = |d: &Deployment| -> Vec<String> {
            d.task_groups.values().filter(|g| !g.promoted).flat_map(|g| g.placed_canaries.iter().cloned()).collect()
        };
        let mut stop_ids = self.old_deployment.as_ref().map(unpromoted).unwrap_or_default();
        if let Some(d) = self.deployment.as_ref().filter(|d| d.status == status::FAILED) {
            stop_ids.extend(unpromoted(d));
        }
        let stop: AllocSet<'a> = from_keys(all, &stop_ids);
        // Once stopped, a canary is history (stopping it in every eval would churn); a failed
        // one the servers still want running is stopped too, or it would be rescheduled.
        let live: AllocSet<'a> = stop.iter().filter(|(_, a)| a.desired_status == DesiredStatus::Run).map(|(k, v)| (*k, *v)).collect();
        self.mark_stop(&live, None, ALLOC_NOT_NEEDED_DESC);
        desired.stop += live.len() as u64;
        let mut all = difference(all, &stop);

        let Some(d) = &self.deployment else { return (AllocSet::new(), all) };
        let ids: Vec<String> = d.task_groups.values().flat_map(|g| g.placed_canaries.iter().cloned()).collect();
        let canaries = from_keys(&all, &ids);
        let split = filter_by_tainted(&canaries, self.inputs.tainted, self.inputs.now);
        // Not counted in the desired changes: they are part of the rollout, not a change to it.
        self.mark_stop(&split.migrate, None, ALLOC_MIGRATING_DESC);
        self.mark_stop(&split.lost, Some(ClientStatus::Lost), ALLOC_LOST_DESC);
        all = difference(&difference(&all, &split.migrate), &split.lost);
        (split.untainted, all)
    }

    /// Places the canaries the group still lacks, unless the deployment is paused or failed
    /// (Nomad's `computeCanaries`).
    pub(super) fn compute_canaries(
        &mut self,
        tg: &TaskGroup,
        dstate: &mut DeploymentState,
        destructive: &AllocSet<'a>,
        canaries: &AllocSet<'a>,
        desired: &mut DesiredUpdates,
        names: &mut NameIndex,
    ) {
        let wanted = tg.update.as_ref().map_or(0, |u| u.canary.max(0));
        dstate.desired_canaries = wanted;
        if self.deployment_paused || self.deployment_failed {
            return;
        }
        let missing = usize::try_from(wanted).unwrap_or(usize::MAX).saturating_sub(canaries.len());
        desired.canary += missing as u64;
        for name in names.next_canaries(missing, canaries.values().copied(), destructive.values().copied()) {
            self.results.place.push(PlaceRequest {
                name,
                group: tg.name.clone(),
                previous: None,
                reschedule: false,
                lost: false,
                canary: true,
                downgrade: false,
            });
        }
    }

    /// How many destructive updates may go now: the group's count without an update strategy
    /// or pending changes; `max_parallel` without a deployment; in one, `max_parallel` less its
    /// allocs whose health is not known, and none while one is unhealthy, the deployment is
    /// paused or failed, or canaries wait for promotion.
    pub(super) fn under_provisioned_by(
        &self,
        tg: &TaskGroup,
        untainted: &AllocSet<'a>,
        destructive: &AllocSet<'a>,
        migrate: &AllocSet<'a>,
        canarying: bool,
    ) -> usize {
        let count = usize::try_from(tg.count.max(0)).unwrap_or(usize::MAX);
        let Some(update) = tg.update.as_ref().filter(|u| u.max_parallel > 0) else { return count };
        if destructive.len() + migrate.len() == 0 {
            return count;
        }
        if canarying {
            return 0;
        }
        let max_parallel = usize::try_from(update.max_parallel).unwrap_or(usize::MAX);
        let Some(d) = &self.deployment else { return max_parallel };
        if self.deployment_paused || self.deployment_failed {
            return 0;
        }
        let mut under = max_parallel;
        for a in untainted.values().filter(|a| a.deployment_id == d.id) {
            match alloc_health(a) {
                Some(false) => return 0,
                Some(true) => {}
                None => under = under.saturating_sub(1),
            }
        }
        under
    }

    /// Starts the deployment of this version for the group, if it needs one: an update
    /// strategy, something to place or replace, and either a first run of this version or a
    /// destructive change.
    pub(super) fn create_deployment(
        &mut self,
        job: &Job,
        tg: &TaskGroup,
        existing: bool,
        state: DeploymentState,
        all: &AllocSet<'a>,
        destructive: &AllocSet<'a>,
    ) {
        if existing || !has_strategy(tg) || state.desired_total == 0 {
            return;
        }
        let had_running = all
            .values()
            .any(|a: &&Allocation| a.job.as_ref().is_some_and(|j| j.version == job.version && j.create_index == job.create_index));
        if had_running && destructive.is_empty() {
            return;
        }
        if self.deployment.is_none() {
            let d = Deployment::new(self.inputs.ids.next_id(), job, self.inputs.eval_priority);
            self.results.deployment_id = Some(d.id.clone());
            self.deployment = Some(d);
            self.results.deployment = self.deployment.clone();
        }
        if let Some(d) = self.deployment.as_mut() {
            d.task_groups.insert(tg.name.clone(), state.clone());
        }
        if let Some(d) = self.results.deployment.as_mut() {
            d.task_groups.insert(tg.name.clone(), state);
            d.status_description = d.running_description().to_string();
        }
    }

    /// The group's part of the deployment has its allocs healthy (true without a deployment
    /// or when the group is not in it).
    pub(super) fn group_healthy(&self, group: &str) -> bool {
        let Some(d) = &self.deployment else { return true };
        let Some(g) = d.task_groups.get(group) else { return true };
        g.healthy_allocs >= g.desired_total.max(g.desired_canaries) && (g.desired_canaries == 0 || g.promoted)
    }

    /// Marks the current deployment successful once every group is complete.
    pub(super) fn finish_deployment(&mut self, complete: bool) {
        let Some(d) = &self.deployment else { return };
        // A deployment created by this run has placed nothing yet.
        if self.results.deployment.is_some() || !complete || d.status == status::SUCCESSFUL {
            return;
        }
        if d.active() {
            self.results.deployment_updates.push(DeploymentStatusUpdate {
                deployment_id: d.id.clone(),
                status: status::SUCCESSFUL.to_string(),
                status_description: description::SUCCESSFUL.to_string(),
            });
        }
    }
}

/// The allocs of `set` with these IDs.
fn from_keys<'a>(set: &AllocSet<'a>, ids: &[String]) -> AllocSet<'a> {
    ids.iter().filter_map(|id| set.get_key_value(id.as_str()).map(|(k, v)| (*k, *v))).collect()
}
