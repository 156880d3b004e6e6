//! The reconciler's deployment decisions (Nomad's `cancelUnneededDeployments`,
//! `computeUnderProvisionedBy`, `createDeployment`, `isDeploymentComplete`).
//!
//! One deployment per job version: created when a version with an update strategy first
//! places or replaces allocs, cancelled when the job stops or a newer version comes, successful
//! once every group has its count healthy and nothing is left to do. In-place updates restart
//! no task, so they stay in the deployment (if any) they were in and do not count toward the
//! new one: the client judges an alloc's health once, when it starts (a departure from Nomad,
//! whose clients judge in-place updated allocs again).

use nomad_proto::deployment::{alloc_health, description, status};
use nomad_proto::{Allocation, Deployment, DeploymentState, DeploymentStatusUpdate, Job, TaskGroup};

use super::Run;
use crate::scheduler::alloc_sets::AllocSet;

/// The group has an update strategy that rolls out in a deployment.
fn has_strategy(tg: &TaskGroup) -> bool {
    tg.update.as_ref().is_some_and(|u| u.max_parallel > 0)
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
            }
            Some(job) if job.stop => {
                if d.active() {
                    self.results.deployment_updates.push(cancel(description::STOPPED_JOB));
                }
            }
            Some(job) if !d.is_for(job) => {
                if d.active() {
                    self.results.deployment_updates.push(cancel(description::NEWER_JOB));
                }
            }
            Some(_) if d.status == status::SUCCESSFUL => {}
            Some(_) => self.deployment = Some(d.clone()),
        }
        if let Some(d) = self.deployment.as_ref().filter(|d| d.active()) {
            self.results.deployment_id = Some(d.id.clone());
        }
    }

    /// How many destructive updates may go now: the group's count without an update strategy
    /// or pending changes; `max_parallel` without a deployment; in one, `max_parallel` less its
    /// allocs whose health is not known, and none while one is unhealthy or the deployment is
    /// paused or failed.
    pub(super) fn under_provisioned_by(
        &self,
        tg: &TaskGroup,
        untainted: &AllocSet<'a>,
        destructive: &AllocSet<'a>,
        migrate: &AllocSet<'a>,
    ) -> usize {
        let count = usize::try_from(tg.count.max(0)).unwrap_or(usize::MAX);
        let Some(update) = tg.update.as_ref().filter(|u| u.max_parallel > 0) else { return count };
        if destructive.len() + migrate.len() == 0 {
            return count;
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
        desired_total: i64,
        all: &AllocSet<'a>,
        destructive: &AllocSet<'a>,
    ) {
        if existing || !has_strategy(tg) || desired_total == 0 {
            return;
        }
        let had_running = all
            .values()
            .any(|a: &&Allocation| a.job.as_ref().is_some_and(|j| j.version == job.version && j.create_index == job.create_index));
        if had_running && destructive.is_empty() {
            return;
        }
        let update = tg.update.as_ref().expect("has_strategy");
        let state = DeploymentState {
            auto_revert: update.auto_revert,
            auto_promote: update.auto_promote,
            progress_deadline: update.progress_deadline,
            desired_total,
            ..DeploymentState::default()
        };
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
