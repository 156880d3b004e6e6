//! The deployments table, and the accounting that keeps each deployment's counts in step with
//! its allocs (Nomad's `updateDeploymentWithAlloc`): placed allocs, healthy and unhealthy ones,
//! and the time by which it must progress.

use std::sync::Arc;

use nomad_proto::deployment::{alloc_health, alloc_health_time, alloc_is_canary, description, status};
use nomad_proto::{Allocation, Deployment, DeploymentStatusUpdate, NamespacedId, Timestamp};

use super::{Key, State, Table, Txn, TxnError, Watch};

impl State {
    /// One deployment.
    pub fn deployment(&self, id: &str) -> Option<&Arc<Deployment>> {
        self.deployments.get(id)
    }

    /// Every deployment, by ID.
    pub fn deployments(&self) -> impl Iterator<Item = &Arc<Deployment>> {
        self.deployments.values()
    }

    /// A job's deployments (of every instance of the job ID), oldest first.
    pub fn deployments_by_job(&self, namespace: &str, job_id: &str) -> Vec<&Arc<Deployment>> {
        let mut list: Vec<&Arc<Deployment>> = self
            .deployments_by_job
            .get(&NamespacedId::new(namespace, job_id))
            .into_iter()
            .flatten()
            .filter_map(|id| self.deployments.get(id))
            .collect();
        list.sort_by_key(|d| d.create_index);
        list
    }

    /// The job's newest deployment (Nomad's `LatestDeploymentByJobID`).
    pub fn latest_deployment(&self, namespace: &str, job_id: &str) -> Option<&Arc<Deployment>> {
        self.deployments_by_job(namespace, job_id).into_iter().max_by_key(|d| d.create_index)
    }

    /// The allocs placed in a deployment.
    pub fn allocs_by_deployment<'a>(&'a self, d: &'a Deployment) -> impl Iterator<Item = &'a Arc<Allocation>> + 'a {
        self.allocs_by_job(&d.namespace, &d.job_id).filter(move |a| a.deployment_id == d.id)
    }
}

impl Txn<'_> {
    fn put_deployment(&mut self, d: Deployment) {
        let d = Arc::new(d);
        let id: Key = d.id.as_str().into();
        self.state.deployments_by_job.entry(NamespacedId::new(&d.namespace, &d.job_id)).or_default().insert(id.clone());
        self.state.deployments.insert(id, d.clone());
        self.touch(Table::Deployments);
        self.touch_key(Watch::Deployment(d.id.clone()));
        self.record(super::Change::Deployment(d));
    }

    /// Inserts a new deployment, or replaces one (its indexes kept).
    pub fn upsert_deployment(&mut self, mut d: Deployment) {
        d.modify_index = self.index;
        d.create_index = self.state.deployments.get(d.id.as_str()).map_or(self.index, |old| old.create_index);
        self.put_deployment(d);
    }

    /// Applies status changes. A successful deployment makes its job version stable.
    pub fn update_deployment_status(&mut self, updates: &[DeploymentStatusUpdate]) -> Result<(), TxnError> {
        for u in updates {
            let Some(old) = self.state.deployments.get(u.deployment_id.as_str()).cloned() else {
                return Err(TxnError(format!("Deployment ID {:?} couldn't be updated as it does not exist", u.deployment_id)));
            };
            let mut d = (*old).clone();
            d.status = u.status.clone();
            d.status_description = u.status_description.clone();
            d.modify_index = self.index;
            let (ns, job, version) = (d.namespace.clone(), d.job_id.clone(), d.job_version);
            self.put_deployment(d);
            if u.status == status::SUCCESSFUL {
                self.set_job_stability(&ns, &job, version, true)?;
            }
        }
        Ok(())
    }

    /// Changes a deployment in place (promotion, pause, health-driven progress).
    pub fn modify_deployment(&mut self, id: &str, f: impl FnOnce(&mut Deployment)) -> Result<(), TxnError> {
        let Some(old) = self.state.deployments.get(id).cloned() else {
            return Err(TxnError(format!("Deployment ID {id:?} couldn't be updated as it does not exist")));
        };
        let mut d = (*old).clone();
        f(&mut d);
        d.modify_index = self.index;
        self.put_deployment(d);
        Ok(())
    }

    /// Keeps the alloc's deployment counting it: placed when it joins, healthy or unhealthy
    /// when its client decides (moving one count when it changes its mind), and the progress
    /// deadline pushed out by each healthy alloc.
    pub(super) fn account_deployment(&mut self, old: Option<&Allocation>, new: &Allocation) {
        if new.deployment_id.is_empty() {
            return;
        }
        let Some(d) = self.state.deployments.get(new.deployment_id.as_str()).cloned() else { return };
        let Some(group) = d.task_groups.get(&new.task_group) else { return };
        let mut g = group.clone();
        let joined = old.is_none_or(|o| o.deployment_id != new.deployment_id);
        let (was, is) = (old.filter(|_| !joined).and_then(alloc_health), alloc_health(new));
        if joined {
            g.placed_allocs += 1;
            if g.require_progress_by.is_zero() && g.progress_deadline > 0 {
                g.require_progress_by = Timestamp::from_unix_nanos(new.modify_time.saturating_add(g.progress_deadline));
            }
            if alloc_is_canary(new) {
                g.placed_canaries.push(new.id.clone());
            }
        }
        if was != is {
            match was {
                Some(true) => g.healthy_allocs -= 1,
                Some(false) => g.unhealthy_allocs -= 1,
                None => {}
            }
            match is {
                Some(true) => g.healthy_allocs += 1,
                Some(false) => g.unhealthy_allocs += 1,
                None => {}
            }
            if is == Some(true) && g.progress_deadline > 0 {
                let at = alloc_health_time(new).unix_nanos().max(new.modify_time);
                let by = Timestamp::from_unix_nanos(at.saturating_add(g.progress_deadline));
                g.require_progress_by = g.require_progress_by.max(by);
            }
        }
        if &g != group {
            let mut d = (*d).clone();
            d.task_groups.insert(new.task_group.clone(), g);
            d.modify_index = self.index;
            self.put_deployment(d);
        }
    }

    /// Promotes the canaries of every group (`all`) or of the named ones (Nomad's
    /// `UpdateDeploymentPromotion`): each group must have as many healthy canaries as it asked
    /// for; its canaries stop being canaries and its progress deadline starts again from `now`.
    pub fn promote_deployment(&mut self, id: &str, all: bool, groups: &[String], now: Timestamp) -> Result<(), TxnError> {
        let Some(d) = self.state.deployments.get(id).cloned() else {
            return Err(TxnError(format!("Deployment ID {id:?} couldn't be updated as it does not exist")));
        };
        if !d.active() {
            return Err(TxnError(format!("Deployment {id:?} has terminal status {:?}:", d.status)));
        }
        let chosen = |g: &str| all || groups.iter().any(|x| x == g);
        let mut healthy: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        let mut promotable = Vec::new();
        for (group, g) in d.task_groups.iter().filter(|(name, _)| chosen(name)) {
            for a in g.placed_canaries.iter().filter_map(|c| self.state.allocs.get(c.as_str())) {
                if !a.terminal() && alloc_health(a) == Some(true) {
                    *healthy.entry(group.as_str()).or_default() += 1;
                    promotable.push(a.clone());
                }
            }
        }
        let short: Vec<String> = d
            .task_groups
            .iter()
            .filter(|(name, g)| chosen(name) && g.desired_canaries > 0)
            .filter_map(|(name, g)| {
                let have = healthy.get(name.as_str()).copied().unwrap_or(0);
                (have < g.desired_canaries).then(|| format!("Task group {name:?} has {have}/{} healthy allocations", g.desired_canaries))
            })
            .collect();
        if !short.is_empty() {
            return Err(TxnError(short.join("; ")));
        }
        let mut d = (*d).clone();
        for (_, g) in d.task_groups.iter_mut().filter(|(name, _)| chosen(name)) {
            if g.progress_deadline > 0 && !g.require_progress_by.is_zero() {
                g.require_progress_by = Timestamp::from_unix_nanos(now.unix_nanos().saturating_add(g.progress_deadline));
            }
            g.promoted = true;
        }
        if d.status == status::RUNNING && !d.requires_promotion() {
            d.status_description = description::RUNNING.to_string();
        }
        d.modify_index = self.index;
        self.put_deployment(d);
        for a in promotable {
            let mut a = (*a).clone();
            if let Some(serde_json::Value::Object(m)) = a.deployment_status.as_mut() {
                m.insert("Canary".into(), serde_json::Value::Bool(false));
                m.insert("ModifyIndex".into(), self.index.into());
            }
            a.modify_index = self.index;
            a.alloc_modify_index = self.index;
            self.put_alloc(a);
        }
        Ok(())
    }

    /// Sets the health of a deployment's allocs by hand; each must be in the deployment.
    pub fn set_alloc_health(
        &mut self,
        deployment_id: &str,
        healthy: &[String],
        unhealthy: &[String],
        now: Timestamp,
    ) -> Result<(), TxnError> {
        for (ids, h) in [(healthy, true), (unhealthy, false)] {
            for id in ids {
                let Some(a) = self.state.allocs.get(id.as_str()).cloned() else {
                    return Err(TxnError(format!("unknown alloc {id:?}")));
                };
                if a.deployment_id != deployment_id {
                    return Err(TxnError(format!("alloc {id:?} is not part of deployment {deployment_id:?}")));
                }
                let mut a = (*a).clone();
                let canary = a.deployment_status.as_ref().and_then(|s| s.get("Canary")).cloned().unwrap_or(serde_json::Value::Bool(false));
                a.deployment_status =
                    Some(serde_json::json!({ "Healthy": h, "Timestamp": now, "Canary": canary, "ModifyIndex": self.index }));
                a.modify_index = self.index;
                a.alloc_modify_index = self.index;
                self.put_alloc(a);
            }
        }
        Ok(())
    }

    /// Removes deployments (garbage collection).
    pub fn delete_deployments(&mut self, ids: &[String]) {
        for id in ids {
            if let Some(d) = self.state.deployments.remove(id.as_str()) {
                let key = NamespacedId::new(&d.namespace, &d.job_id);
                if let Some(set) = self.state.deployments_by_job.get_mut(&key) {
                    set.remove(id.as_str());
                    if set.is_empty() {
                        self.state.deployments_by_job.remove(&key);
                    }
                }
                self.touch(Table::Deployments);
                self.touch_key(Watch::Deployment(id.clone()));
            }
        }
    }
}
