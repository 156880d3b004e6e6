//! Who waits on what: the registry blocking queries park in.
//!
//! A blocking query registers the [`Watch`]es its result depends on (a whole table for a list,
//! one object or one object's children for a single read) and sleeps. A write wakes only the
//! waiters registered under a watch it touched: the cost of a write is one map lookup per
//! distinct watch it touched plus one wake per waiter that has to answer, never a pass over
//! every waiter. A waiter's registration goes when its query ends (the [`Registration`] guard),
//! and a watch with no waiter left takes no memory.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::Table;

/// What a blocking query's result depends on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Watch {
    /// Any change to the table.
    Table(Table),
    /// One job (`namespace/id` as [`Watch::job_key`] makes it).
    Job(String),
    /// One job's summary.
    JobSummary(String),
    /// The allocs of one job.
    JobAllocs(String),
    /// The evals of one job.
    JobEvals(String),
    /// One node.
    Node(String),
    /// The allocs placed on one node (also their removal by GC).
    NodeAllocs(String),
    /// One alloc.
    Alloc(String),
    /// The allocs one eval created.
    EvalAllocs(String),
    /// One eval.
    Eval(String),
    /// The registrations of one service name, in any namespace.
    Service(String),
    /// One CSI volume (`namespace/id`, as [`Watch::job_key`] makes it).
    CsiVolume(String),
    /// One CSI plugin.
    CsiPlugin(String),
    /// One deployment.
    Deployment(String),
}

impl Watch {
    /// The key of a job's watches.
    pub fn job_key(namespace: &str, id: &str) -> String {
        format!("{namespace}/{id}")
    }
}

impl From<Table> for Watch {
    fn from(t: Table) -> Self {
        Watch::Table(t)
    }
}

/// The waiters of each watch. One lock: registering, leaving and waking are short map
/// operations, and a write takes it once.
#[derive(Default)]
pub(super) struct Registry {
    waiters: Mutex<HashMap<Watch, HashMap<u64, Arc<Notify>>>>,
    next_id: AtomicU64,
    wakeups: AtomicU64,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("registrations", &self.registrations()).finish()
    }
}

impl Registry {
    /// Registers one waiter under every watch in `watches`. The waiter is woken (a stored
    /// permit, so a write between registering and sleeping is not missed) by every write that
    /// touches one of them, until the returned guard is dropped.
    pub(super) fn register(self: &Arc<Self>, watches: &[Watch]) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let mut unique: Vec<Watch> = watches.to_vec();
        unique.sort();
        unique.dedup();
        let mut map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        for w in &unique {
            map.entry(w.clone()).or_default().insert(id, notify.clone());
        }
        drop(map);
        Registration { registry: self.clone(), id, watches: unique, notify }
    }

    /// Wakes the waiters of `touched`, each once however many of its watches were touched.
    pub(super) fn wake(&self, touched: &HashSet<Watch>) {
        if touched.is_empty() {
            return;
        }
        let map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        let mut woken = 0;
        for w in touched {
            if let Some(waiters) = map.get(w) {
                for n in waiters.values() {
                    n.notify_one();
                    woken += 1;
                }
            }
        }
        drop(map);
        self.wakeups.fetch_add(woken, Ordering::Relaxed);
    }

    /// Wakes every waiter (snapshot restore: anything may have changed).
    pub(super) fn wake_all(&self) {
        let map = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        let mut woken = 0;
        for waiters in map.values() {
            for n in waiters.values() {
                n.notify_one();
                woken += 1;
            }
        }
        drop(map);
        self.wakeups.fetch_add(woken, Ordering::Relaxed);
    }

    /// Registrations held now (one per waiter and watch).
    pub(super) fn registrations(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).values().map(HashMap::len).sum()
    }

    /// Wakes handed out since the store was made (one per waiter and touched watch).
    pub(super) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
}

/// One waiter's place in the registry; dropping it leaves.
pub(super) struct Registration {
    registry: Arc<Registry>,
    id: u64,
    watches: Vec<Watch>,
    notify: Arc<Notify>,
}

impl Registration {
    /// Resolves once a write touched one of the watches since the last wake (at once if one
    /// already did).
    pub(super) async fn changed(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.registry.waiters.lock().unwrap_or_else(|e| e.into_inner());
        for w in &self.watches {
            if let Some(waiters) = map.get_mut(w) {
                waiters.remove(&self.id);
                if waiters.is_empty() {
                    map.remove(w);
                }
            }
        }
    }
}
