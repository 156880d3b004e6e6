//! Blocked evals: evals whose placements did not fit, waiting for capacity.
//!
//! At most one blocked eval is kept per job (the newer wins; the other is
//! canceled). An eval whose constraints are captured by computed node
//! classes is unblocked only by capacity in a class it found eligible or
//! never saw; an eval that escaped class caching is unblocked by any
//! capacity change. Capacity that appeared while the scheduler was working
//! from an older snapshot unblocks at once ("missed unblock").
//!
//! The tracker decides; it writes nothing. Callers turn [`BlockEffects`]
//! into eval writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use nomad_proto::eval::trigger;
use nomad_proto::{Evaluation, NamespacedId};

/// Writes a [`BlockedEvals`] call asks for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BlockEffects {
    /// Evals to run again now.
    pub unblock: Vec<Arc<Evaluation>>,
    /// Evals to cancel, with the status description to give them.
    pub cancel: Vec<(Arc<Evaluation>, String)>,
}

impl BlockEffects {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.unblock.is_empty() && self.cancel.is_empty()
    }

    /// Adds another call's effects.
    pub fn extend(&mut self, other: BlockEffects) {
        self.unblock.extend(other.unblock);
        self.cancel.extend(other.cancel);
    }
}

/// Counts, for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockedStats {
    /// Blocked evals whose constraints computed classes capture.
    pub captured: usize,
    /// Blocked evals that escaped computed classes.
    pub escaped: usize,
}

#[derive(Default, Clone)]
struct Inner {
    enabled: bool,
    captured: HashMap<String, Arc<Evaluation>>,
    escaped: HashMap<String, Arc<Evaluation>>,
    jobs: HashMap<NamespacedId, String>,
    /// Per computed class, the index of the last capacity change.
    unblock_indexes: HashMap<String, u64>,
    /// Per namespace, the index of the last freed CSI volume claim.
    csi_free_indexes: HashMap<String, u64>,
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Arc<Evaluation>> {
        let e = self.captured.remove(id).or_else(|| self.escaped.remove(id))?;
        self.jobs.remove(&e.namespaced_job_id());
        Some(e)
    }

    /// The scheduler saw an older state than a capacity change it could use.
    fn missed_unblock(&self, eval: &Evaluation) -> bool {
        if self.csi_free_indexes.get(&eval.namespace).is_some_and(|&i| eval.snapshot_index < i) {
            return true;
        }
        let mut max = 0;
        for (class, &index) in &self.unblock_indexes {
            max = max.max(index);
            if eval.snapshot_index >= index {
                continue;
            }
            // A class it never saw, or one it found eligible.
            if eval.class_eligibility.get(class).copied().unwrap_or(true) {
                return true;
            }
        }
        eval.escaped_computed_class && eval.snapshot_index < max
    }
}

/// The newer of two blocked evals of a job is the one that saw more state.
fn latest_index(e: &Evaluation) -> u64 {
    e.create_index.max(e.snapshot_index)
}

/// The blocked-eval tracker. Enabled only on the leader.
#[derive(Default)]
pub struct BlockedEvals {
    inner: Mutex<Inner>,
}

impl Clone for BlockedEvals {
    /// A tracker in the same state (tests fork a whole in-process server).
    fn clone(&self) -> Self {
        BlockedEvals { inner: Mutex::new(self.lock().clone()) }
    }
}

impl BlockedEvals {
    /// A disabled tracker.
    pub fn new() -> BlockedEvals {
        BlockedEvals::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enables the tracker, or disables it and forgets everything.
    pub fn set_enabled(&self, enabled: bool) {
        let mut inner = self.lock();
        *inner = Inner { enabled, ..Inner::default() };
    }

    /// Tracks a blocked eval.
    pub fn block(&self, eval: Arc<Evaluation>) -> BlockEffects {
        let mut inner = self.lock();
        let mut effects = BlockEffects::default();
        if !inner.enabled || inner.captured.contains_key(&eval.id) || inner.escaped.contains_key(&eval.id) {
            return effects;
        }
        let job = eval.namespaced_job_id();
        if let Some(existing_id) = inner.jobs.get(&job).cloned() {
            let existing = inner.captured.get(&existing_id).or_else(|| inner.escaped.get(&existing_id)).cloned();
            if let Some(existing) = existing {
                let reason = format!("existing blocked evaluation exists for job {:?}", eval.job_id);
                if latest_index(&existing) > latest_index(&eval) {
                    effects.cancel.push((eval, reason));
                    return effects;
                }
                inner.remove(&existing_id);
                effects.cancel.push((existing, reason));
            }
        }
        if inner.missed_unblock(&eval) {
            effects.unblock.push(eval);
            return effects;
        }
        inner.jobs.insert(job, eval.id.clone());
        if eval.escaped_computed_class {
            inner.escaped.insert(eval.id.clone(), eval);
        } else {
            inner.captured.insert(eval.id.clone(), eval);
        }
        effects
    }

    /// Capacity may have appeared on a node of `class` at Raft `index`:
    /// returns the evals that may now place something.
    pub fn unblock(&self, class: &str, index: u64) -> Vec<Arc<Evaluation>> {
        let mut inner = self.lock();
        if !inner.enabled {
            return Vec::new();
        }
        let slot = inner.unblock_indexes.entry(class.to_string()).or_default();
        *slot = (*slot).max(index);
        let mut ids: Vec<String> = inner.escaped.keys().cloned().collect();
        ids.extend(inner.captured.values().filter(|e| e.class_eligibility.get(class).copied().unwrap_or(true)).map(|e| e.id.clone()));
        ids.into_iter().filter_map(|id| inner.remove(&id)).collect()
    }

    /// A CSI volume claim in `namespace` was freed at Raft `index`: CSI feasibility is not a
    /// class property, so every blocked eval of the namespace may now place something (and one
    /// blocked later from an older snapshot is unblocked at once).
    pub fn unblock_namespace(&self, namespace: &str, index: u64) -> Vec<Arc<Evaluation>> {
        let mut inner = self.lock();
        if !inner.enabled {
            return Vec::new();
        }
        let slot = inner.csi_free_indexes.entry(namespace.to_string()).or_default();
        *slot = (*slot).max(index);
        let ids: Vec<String> =
            inner.captured.values().chain(inner.escaped.values()).filter(|e| e.namespace == namespace).map(|e| e.id.clone()).collect();
        ids.into_iter().filter_map(|id| inner.remove(&id)).collect()
    }

    /// A later eval of the job completed with everything placed: its blocked
    /// eval, if created before that (`before_index`), is no longer needed.
    pub fn untrack(&self, job: &NamespacedId, before_index: u64) -> Option<Arc<Evaluation>> {
        let mut inner = self.lock();
        let id = inner.jobs.get(job)?.clone();
        let e = inner.captured.get(&id).or_else(|| inner.escaped.get(&id))?;
        if e.create_index >= before_index {
            return None;
        }
        inner.remove(&id)
    }

    /// Blocked evals created because plans kept being refused (retried periodically).
    pub fn unblock_failed(&self) -> Vec<Arc<Evaluation>> {
        let mut inner = self.lock();
        let ids: Vec<String> = inner
            .captured
            .values()
            .chain(inner.escaped.values())
            .filter(|e| e.triggered_by == trigger::MAX_PLANS)
            .map(|e| e.id.clone())
            .collect();
        ids.into_iter().filter_map(|id| inner.remove(&id)).collect()
    }

    /// The blocked eval tracked for a job.
    pub fn tracked(&self, job: &NamespacedId) -> Option<String> {
        self.lock().jobs.get(job).cloned()
    }

    /// Current counts.
    pub fn stats(&self) -> BlockedStats {
        let inner = self.lock();
        BlockedStats { captured: inner.captured.len(), escaped: inner.escaped.len() }
    }
}
