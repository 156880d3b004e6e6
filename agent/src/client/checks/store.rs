//! The check results of every alloc on this client (Nomad's `checkstore.Shim`): in memory,
//! written to the local state only when a check's status changes (a result that only refreshes
//! its output or time is not worth a disk write), restored when the agent starts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{AllocResults, CheckQueryResult, CheckResults, CheckStatus};
use crate::client::consul::checks::{StatusGetter, Statuses};
use crate::client::state::StateDb;

/// See the module docs.
pub struct CheckStore {
    db: Arc<StateDb>,
    current: Mutex<BTreeMap<String, AllocResults>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CheckStore {
    /// A store over `db`, with the results it holds.
    pub fn restore(db: Arc<StateDb>) -> Arc<CheckStore> {
        let current = match db.check_results::<CheckQueryResult>() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "failed to restore health check results");
                BTreeMap::new()
            }
        };
        Arc::new(CheckStore { db, current: Mutex::new(current) })
    }

    /// Records a result. A `pending` one never replaces a result the check has (a restored
    /// agent's stubs must not hide what was known). Persisted when the status is new.
    pub fn set(&self, alloc_id: &str, result: CheckQueryResult) {
        let mut current = lock(&self.current);
        let results = current.entry(alloc_id.to_string()).or_default();
        let previous = results.get(&result.id).map(|r| r.status);
        if result.status == CheckStatus::Pending && previous.is_some() {
            return;
        }
        if previous != Some(result.status)
            && let Err(e) = self.db.put_check_result(alloc_id, &result.id, &result)
        {
            tracing::error!(alloc_id, check_id = %result.id, error = %e, "failed to set check status");
        }
        results.insert(result.id.clone(), result);
    }

    /// The check IDs of the alloc that are not in `keep`.
    pub fn difference(&self, alloc_id: &str, keep: &[String]) -> Vec<String> {
        lock(&self.current).get(alloc_id).map(|r| r.keys().filter(|id| !keep.contains(id)).cloned().collect()).unwrap_or_default()
    }

    /// Forgets some checks of an alloc.
    pub fn remove(&self, alloc_id: &str, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        if let Some(r) = lock(&self.current).get_mut(alloc_id) {
            for id in ids {
                r.remove(id);
            }
        }
        if let Err(e) = self.db.delete_check_results(alloc_id, Some(ids)) {
            tracing::error!(alloc_id, error = %e, "failed to remove check results");
        }
    }

    /// Forgets every check of an alloc.
    pub fn purge(&self, alloc_id: &str) {
        lock(&self.current).remove(alloc_id);
        if let Err(e) = self.db.delete_check_results(alloc_id, None) {
            tracing::error!(alloc_id, error = %e, "failed to purge check results");
        }
    }

    /// Every check's status by check ID (Nomad's `Snapshot`): what `check_restart` watches.
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        lock(&self.current).values().flat_map(|r| r.values().map(|c| (c.id.clone(), c.status.as_str().to_string()))).collect()
    }
}

impl CheckResults for CheckStore {
    fn alloc_results(&self, alloc_id: &str) -> Option<AllocResults> {
        lock(&self.current).get(alloc_id).filter(|r| !r.is_empty()).cloned()
    }
}

impl StatusGetter for CheckStore {
    fn get(&self) -> futures::future::BoxFuture<'_, Result<Statuses, String>> {
        Box::pin(std::future::ready(Ok(Arc::new(self.snapshot()))))
    }
}
