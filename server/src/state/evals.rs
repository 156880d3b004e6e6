//! The evaluations table.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use nomad_proto::{Evaluation, NamespacedId};

use super::{State, Table, Txn, Watch};

impl State {
    /// One eval.
    pub fn eval(&self, id: &str) -> Option<&Arc<Evaluation>> {
        self.evals.get(id)
    }

    /// Every eval, ordered by ID.
    pub fn evals(&self) -> impl Iterator<Item = &Arc<Evaluation>> {
        self.evals.values()
    }

    /// Evals whose ID starts with `prefix`.
    pub fn evals_by_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Arc<Evaluation>> + 'a {
        let from: (Bound<&str>, Bound<&str>) = (Bound::Included(prefix), Bound::Unbounded);
        self.evals.range::<_, str>(from).map(|(_, e)| e).take_while(move |e| e.id.starts_with(prefix))
    }

    /// Evals of a job.
    pub fn evals_by_job<'a>(&'a self, namespace: &str, job_id: &str) -> impl Iterator<Item = &'a Arc<Evaluation>> + use<'a> {
        self.evals_of_job_key(&NamespacedId::new(namespace, job_id))
    }

    pub(super) fn evals_of_job_key<'a>(&'a self, key: &NamespacedId) -> impl Iterator<Item = &'a Arc<Evaluation>> + use<'a> {
        self.evals_by_job.get(key).into_iter().flat_map(|ids| ids.iter()).filter_map(|id| self.evals.get(id))
    }
}

impl Txn<'_> {
    /// Inserts or updates evals. Queued counts from the scheduler land in the
    /// job summary.
    pub fn upsert_evals(&mut self, evals: Vec<Evaluation>) -> BTreeSet<NamespacedId> {
        let index = self.index;
        let mut jobs = BTreeSet::new();
        for mut e in evals {
            e.create_index = self.state.evals.get(e.id.as_str()).map_or(index, |old| old.create_index);
            e.modify_index = index;
            let key = e.namespaced_job_id();
            if !e.queued_allocations.is_empty() {
                let queued = e.queued_allocations.clone();
                self.update_summary(&key, |s| {
                    for (group, n) in queued {
                        s.summary.entry(group).or_default().queued = n;
                    }
                });
            }
            let id: super::Key = e.id.as_str().into();
            self.state.evals_by_job.entry(key.clone()).or_default().insert(id.clone());
            let e = Arc::new(e);
            self.state.evals.insert(id, e.clone());
            self.touch_key(Watch::Eval(e.id.clone()));
            self.touch_key(Watch::JobEvals(Watch::job_key(&key.namespace, &key.id)));
            self.record(super::Change::Eval(e));
            jobs.insert(key);
        }
        if !jobs.is_empty() {
            self.touch(Table::Evals);
        }
        jobs
    }

    /// Removes evals (garbage collection).
    pub fn delete_evals(&mut self, ids: &[String]) -> BTreeSet<NamespacedId> {
        let mut jobs = BTreeSet::new();
        for id in ids {
            let Some(e) = self.state.evals.remove(id.as_str()) else { continue };
            let key = e.namespaced_job_id();
            if let Some(set) = self.state.evals_by_job.get_mut(&key) {
                set.remove(id.as_str());
                if set.is_empty() {
                    self.state.evals_by_job.remove(&key);
                }
            }
            self.touch_key(Watch::Eval(e.id.clone()));
            self.touch_key(Watch::JobEvals(Watch::job_key(&key.namespace, &key.id)));
            jobs.insert(key);
            self.touch(Table::Evals);
        }
        jobs
    }
}
