//! Scaling policies and scaling events.
//!
//! A group's policy lives in its job (`TaskGroup.scaling`); the state gives it its ID, target
//! and indexes when the job is written (Nomad's `propagateScalingPolicyIDs` and
//! `updateJobScalingPolicies`, done here so the ID comes from the log: the policy of a group
//! keeps its ID across updates, a new one gets an ID derived from the job and the Raft index),
//! and keeps an index from policy ID to job.

use std::sync::Arc;

use nomad_proto::scaling::{JobScalingEvents, ScalingEvent, ScalingPolicy};
use nomad_proto::{Job, NamespacedId};

use super::{Key, State, Table, Txn, TxnError, Watch};

impl State {
    /// A policy by ID, with the namespace of its job.
    pub fn scaling_policy(&self, id: &str) -> Option<(&str, &ScalingPolicy)> {
        let key = self.scaling_policies.get(id)?;
        let job = self.jobs.get(key)?;
        job.scaling_policies().find(|p| p.id == id).map(|p| (job.namespace.as_str(), p))
    }

    /// Every policy, by ID, with the namespace of its job.
    pub fn scaling_policies(&self) -> impl Iterator<Item = (&str, &ScalingPolicy)> {
        self.scaling_policies.keys().filter_map(|id| self.scaling_policy(id))
    }

    /// A job's scaling events.
    pub fn scaling_events(&self, namespace: &str, job_id: &str) -> Option<&Arc<JobScalingEvents>> {
        self.scaling_events.get(&NamespacedId::new(namespace, job_id))
    }

    /// Every job's scaling events (snapshots).
    pub(super) fn all_scaling_events(&self) -> impl Iterator<Item = &Arc<JobScalingEvents>> {
        self.scaling_events.values()
    }

    /// Rebuilds the policy index from the jobs (snapshot restore).
    pub(super) fn index_scaling_policies(&mut self) {
        let entries: Vec<(Key, NamespacedId)> =
            self.jobs.values().flat_map(|j| j.scaling_policies().map(|p| (Key::from(p.id.as_str()), j.namespaced_id()))).collect();
        self.scaling_policies = entries.into_iter().collect();
    }
}

/// The ID of a policy created at `index` for `group` of a job: derived from what the log
/// holds, so every server (and every replay) gives the same one.
fn new_policy_id(namespace: &str, job_id: &str, group: &str, index: u64) -> String {
    let name = format!("scaling-policy\0{namespace}\0{job_id}\0{group}\0{index}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

impl Txn<'_> {
    /// Gives `job`'s policies their target, ID and indexes against the stored version `old`:
    /// a group that had a policy of the same type keeps its ID and create index (and its modify
    /// index when nothing else changed). Whatever ID the submitted job carried is ignored, as
    /// in Nomad (a dispatched child or a revert carries another job's or version's).
    pub(super) fn assign_scaling_policies(&mut self, job: &mut Job, old: Option<&Job>) {
        let index = self.index;
        let (namespace, job_id) = (job.namespace.clone(), job.id.clone());
        for g in &mut job.task_groups {
            let Some(p) = g.scaling.as_mut() else { continue };
            p.canonicalize(&namespace, &job_id, &g.name, g.count);
            let before = old.and_then(|o| o.lookup_task_group(&g.name)).and_then(|og| og.scaling.as_ref());
            match before.filter(|b| b.policy_type == p.policy_type) {
                Some(b) => {
                    p.id = b.id.clone();
                    p.create_index = b.create_index;
                    p.modify_index = if b.spec_eq(p) { b.modify_index } else { index };
                }
                None => {
                    p.id = new_policy_id(&namespace, &job_id, &g.name, index);
                    p.create_index = index;
                    p.modify_index = index;
                }
            }
        }
        let old_ids: Vec<&str> = old.map(|o| o.scaling_policies().map(|p| p.id.as_str()).collect()).unwrap_or_default();
        let new: Vec<(&str, u64)> = job.scaling_policies().map(|p| (p.id.as_str(), p.modify_index)).collect();
        let mut changed = false;
        for id in &old_ids {
            if !new.iter().any(|(n, _)| n == id) {
                self.state.scaling_policies.remove(*id);
                changed = true;
            }
        }
        for (id, modify_index) in &new {
            self.state.scaling_policies.insert(Key::from(*id), job.namespaced_id());
            changed |= *modify_index == index;
        }
        if changed {
            self.touch(Table::ScalingPolicies);
        }
    }

    /// Forgets a purged job's policies and scaling events.
    pub(super) fn delete_job_scaling(&mut self, job: &Job) {
        let mut changed = false;
        for p in job.scaling_policies() {
            changed |= self.state.scaling_policies.remove(p.id.as_str()).is_some();
        }
        if changed {
            self.touch(Table::ScalingPolicies);
        }
        if self.state.scaling_events.remove(&job.namespaced_id()).is_some() {
            self.touch(Table::ScalingEvents);
        }
    }

    /// Records a scaling event for `group` of a job (Nomad's `UpsertScalingEvent`).
    pub fn record_scaling_event(&mut self, namespace: &str, job_id: &str, group: &str, event: ScalingEvent) {
        let key = NamespacedId::new(namespace, job_id);
        let mut events = self.state.scaling_events.get(&key).map(|e| (**e).clone()).unwrap_or_else(|| JobScalingEvents {
            namespace: namespace.to_string(),
            job_id: job_id.to_string(),
            ..JobScalingEvents::default()
        });
        events.record(group, event, self.index);
        self.state.scaling_events.insert(key, Arc::new(events));
        self.touch(Table::ScalingEvents);
        self.touch_key(Watch::Job(Watch::job_key(namespace, job_id)));
    }

    /// `Job.Scale` with a count: sets `group`'s count of the stored job if its job modify
    /// index is still `job_modify_index` (Nomad registers the scaled job with `EnforceIndex`).
    pub fn scale_job(
        &mut self,
        namespace: &str,
        job_id: &str,
        group: &str,
        count: i64,
        job_modify_index: u64,
        now: nomad_proto::Timestamp,
    ) -> Result<Arc<Job>, TxnError> {
        let Some(stored) = self.state.job(namespace, job_id) else {
            return Err(TxnError(format!("job {job_id:?} not found")));
        };
        if stored.job_modify_index != job_modify_index {
            return Err(TxnError(format!(
                "Enforcing job modify index {job_modify_index}: job exists with conflicting job modify index: {}",
                stored.job_modify_index
            )));
        }
        let mut job = (**stored).clone();
        let Some(g) = job.task_groups.iter_mut().find(|g| g.name == group) else {
            return Err(TxnError(format!("task group {group:?} specified for scaling does not exist in job")));
        };
        g.count = count;
        job.submit_time = now.unix_nanos();
        self.upsert_job(job)
    }
}
