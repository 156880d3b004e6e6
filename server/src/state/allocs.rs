//! The allocations table and its node and job indexes.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use nomad_proto::deployment::alloc_is_canary;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, DesiredTransition, NamespacedId};

use super::{Key, State, Table, Txn, TxnError, Watch};

impl State {
    /// One alloc.
    pub fn alloc(&self, id: &str) -> Option<&Arc<Allocation>> {
        self.allocs.get(id)
    }

    /// Every alloc, ordered by ID.
    pub fn allocs(&self) -> impl Iterator<Item = &Arc<Allocation>> {
        self.allocs.values()
    }

    /// Allocs whose ID starts with `prefix`.
    pub fn allocs_by_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Arc<Allocation>> + 'a {
        let from: (Bound<&str>, Bound<&str>) = (Bound::Included(prefix), Bound::Unbounded);
        self.allocs.range::<_, str>(from).map(|(_, a)| a).take_while(move |a| a.id.starts_with(prefix))
    }

    /// Allocs on a node.
    pub fn allocs_by_node<'a>(&'a self, node_id: &str) -> impl Iterator<Item = &'a Arc<Allocation>> + use<'a> {
        self.allocs_by_node.get(node_id).into_iter().flat_map(|allocs| allocs.values())
    }

    /// What the allocs on a node hold (computed once per version of the node's alloc set).
    pub fn node_load(&self, node_id: &str) -> Option<&super::NodeLoad> {
        self.allocs_by_node.get(node_id).map(|allocs| allocs.load())
    }

    /// Allocs of a job.
    pub fn allocs_by_job<'a>(&'a self, namespace: &str, job_id: &str) -> impl Iterator<Item = &'a Arc<Allocation>> + use<'a> {
        self.allocs_of_job_key(&NamespacedId::new(namespace, job_id))
    }

    pub(super) fn allocs_of_job_key<'a>(&'a self, key: &NamespacedId) -> impl Iterator<Item = &'a Arc<Allocation>> + use<'a> {
        self.allocs_by_job.get(key).into_iter().flat_map(|allocs| allocs.values())
    }

    /// The index at which an alloc was last removed from a node (0: never).
    pub fn alloc_removed_index(&self, node_id: &str) -> u64 {
        self.alloc_removed.get(node_id).copied().unwrap_or(0)
    }

    /// Allocs placed by an eval.
    pub fn allocs_by_eval<'a>(&'a self, eval: &'a nomad_proto::Evaluation) -> impl Iterator<Item = &'a Arc<Allocation>> + 'a {
        self.allocs_by_job(&eval.namespace, &eval.job_id).filter(move |a| a.eval_id == eval.id)
    }
}

/// The fields a client may set on its allocs (`Node.UpdateAlloc`). Of the deployment status
/// only the health and its time: whether the alloc is a canary is the servers' to say.
fn merge_client_fields(stored: &Allocation, update: &Allocation, index: u64) -> Allocation {
    let mut a = stored.clone();
    a.client_status = update.client_status;
    a.client_description = update.client_description.clone();
    a.task_states = update.task_states.clone();
    a.network_status = update.network_status.clone();
    if let Some(reported) = &update.deployment_status {
        let field = |k: &str| reported.get(k).cloned().unwrap_or(serde_json::Value::Null);
        let canary = alloc_is_canary(stored);
        a.deployment_status = Some(serde_json::json!({
            "Healthy": field("Healthy"),
            "Timestamp": field("Timestamp"),
            "Canary": canary,
            "ModifyIndex": index,
        }));
    }
    a
}

impl Txn<'_> {
    pub(super) fn put_alloc(&mut self, alloc: Allocation) {
        let key = NamespacedId::new(&alloc.namespace, &alloc.job_id);
        let old = self.state.allocs.get(alloc.id.as_str()).cloned();
        // Keep the job summary's counters in step with client status changes.
        let group = alloc.task_group.clone();
        let (old_status, new_status) = (old.as_ref().map(|o| o.client_status), alloc.client_status);
        if old_status != Some(new_status) {
            self.update_summary(&key, |s| {
                let g = s.summary.entry(group).or_default();
                if let Some(o) = old_status {
                    *g.counter(o) -= 1;
                }
                *g.counter(new_status) += 1;
            });
        }
        self.account_deployment(old.as_deref(), &alloc);
        let alloc = Arc::new(alloc);
        let id: Key = match &old {
            Some(_) => {
                self.state.allocs.get_key_value(alloc.id.as_str()).map(|(k, _)| k.clone()).unwrap_or_else(|| alloc.id.as_str().into())
            }
            None => alloc.id.as_str().into(),
        };
        match self.state.allocs_by_node.get_mut(alloc.node_id.as_str()) {
            Some(on_node) => on_node.insert(id.clone(), alloc.clone()),
            None => self.state.allocs_by_node.entry(alloc.node_id.as_str().into()).or_default().insert(id.clone(), alloc.clone()),
        }
        self.state.allocs_by_job.entry(key).or_default().insert(id.clone(), alloc.clone());
        self.state.allocs.insert(id, alloc.clone());
        self.touch(Table::Allocs);
        self.touch_alloc(&alloc);
        self.record(super::Change::Alloc(alloc));
    }

    /// Upserts allocs decided by the scheduler (plan apply). For known allocs
    /// the client's status and task states win unless the plan marks them
    /// `lost` or `unknown`. Both modify indexes move, so clients pull them.
    pub fn upsert_allocs_from_plan(&mut self, allocs: Vec<Allocation>) -> BTreeSet<NamespacedId> {
        let index = self.index;
        let mut jobs = BTreeSet::new();
        for mut a in allocs {
            match self.state.allocs.get(a.id.as_str()) {
                Some(stored) => {
                    a.create_index = stored.create_index;
                    a.create_time = stored.create_time;
                    if !matches!(a.client_status, ClientStatus::Lost | ClientStatus::Unknown) {
                        a.client_status = stored.client_status;
                        a.client_description = stored.client_description.clone();
                    }
                    a.task_states = stored.task_states.clone();
                }
                None => a.create_index = index,
            }
            a.modify_index = index;
            a.alloc_modify_index = index;
            jobs.insert(NamespacedId::new(&a.namespace, &a.job_id));
            self.put_alloc(a);
        }
        jobs
    }

    /// Stops allocs as the scheduler decided.
    pub fn stop_allocs(&mut self, stops: &[crate::fsm::AllocStop], now_ns: i64) -> BTreeSet<NamespacedId> {
        let index = self.index;
        let mut jobs = BTreeSet::new();
        for s in stops {
            let Some(stored) = self.state.allocs.get(s.alloc_id.as_str()) else { continue };
            let mut a = (**stored).clone();
            a.desired_status = DesiredStatus::Stop;
            a.desired_description = s.desired_description.clone();
            if let Some(cs) = s.client_status {
                a.client_status = cs;
                if cs == ClientStatus::Lost {
                    a.client_description = nomad_proto::alloc::ALLOC_LOST_DESC.to_string();
                }
            }
            if !s.followup_eval_id.is_empty() {
                a.followup_eval_id = s.followup_eval_id.clone();
            }
            a.modify_index = index;
            a.alloc_modify_index = index;
            a.modify_time = now_ns;
            jobs.insert(NamespacedId::new(&a.namespace, &a.job_id));
            self.put_alloc(a);
        }
        jobs
    }

    /// Applies client-reported status (`Node.UpdateAlloc`). Unknown allocs are
    /// skipped. Only `ModifyIndex` moves (clients must not re-pull their own
    /// update), and every node in the batch gets `LastAllocUpdateIndex`.
    pub fn update_allocs_from_client(&mut self, updates: &[Allocation], now_ns: i64) -> BTreeSet<NamespacedId> {
        let index = self.index;
        let mut jobs = BTreeSet::new();
        let mut nodes = BTreeSet::new();
        for u in updates {
            nodes.insert(u.node_id.clone());
            let Some(stored) = self.state.allocs.get(u.id.as_str()) else { continue };
            let mut a = merge_client_fields(stored, u, index);
            a.modify_index = index;
            a.modify_time = now_ns;
            jobs.insert(NamespacedId::new(&a.namespace, &a.job_id));
            self.put_alloc(a);
        }
        for n in nodes {
            self.mark_alloc_update(&n);
        }
        jobs
    }

    /// Merges desired transitions (migrate, reschedule) into allocs.
    pub fn update_desired_transitions(
        &mut self,
        transitions: &std::collections::BTreeMap<String, DesiredTransition>,
    ) -> Result<(), TxnError> {
        let index = self.index;
        for (id, t) in transitions {
            let stored = self.state.allocs.get(id.as_str()).ok_or_else(|| TxnError(format!("alloc not found: {id}")))?;
            let mut a = (**stored).clone();
            let d = &mut a.desired_transition;
            d.migrate = t.migrate.or(d.migrate);
            d.reschedule = t.reschedule.or(d.reschedule);
            d.force_reschedule = t.force_reschedule.or(d.force_reschedule);
            d.no_shutdown_delay = t.no_shutdown_delay.or(d.no_shutdown_delay);
            a.modify_index = index;
            a.alloc_modify_index = index;
            self.put_alloc(a);
        }
        Ok(())
    }

    /// Removes allocs (garbage collection).
    pub fn delete_allocs(&mut self, ids: &[String]) -> BTreeSet<NamespacedId> {
        let mut jobs = BTreeSet::new();
        for id in ids {
            let Some(a) = self.state.allocs.remove(id.as_str()) else { continue };
            let key = NamespacedId::new(&a.namespace, &a.job_id);
            let status = a.client_status;
            let group = a.task_group.clone();
            self.update_summary(&key, |s| {
                if let Some(g) = s.summary.get_mut(&group) {
                    *g.counter(status) -= 1;
                }
            });
            self.state.alloc_removed.insert(a.node_id.clone(), self.index);
            if let Some(set) = self.state.allocs_by_node.get_mut(a.node_id.as_str()) {
                set.remove(id);
                if set.is_empty() {
                    self.state.allocs_by_node.remove(a.node_id.as_str());
                }
            }
            if let Some(set) = self.state.allocs_by_job.get_mut(&key) {
                set.remove(id.as_str());
                if set.is_empty() {
                    self.state.allocs_by_job.remove(&key);
                }
            }
            jobs.insert(key);
            self.touch(Table::Allocs);
            self.touch_alloc(&a);
        }
        jobs
    }

    /// The watches an alloc's insert, update or removal touches.
    fn touch_alloc(&mut self, a: &Allocation) {
        self.touch_key(Watch::Alloc(a.id.clone()));
        self.touch_key(Watch::JobAllocs(Watch::job_key(&a.namespace, &a.job_id)));
        self.touch_key(Watch::NodeAllocs(a.node_id.clone()));
        if !a.eval_id.is_empty() {
            self.touch_key(Watch::EvalAllocs(a.eval_id.clone()));
        }
    }
}
