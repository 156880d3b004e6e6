//! The observers of one alloc's Nomad checks (Nomad's `checksHook` observers): one task per
//! check, the first run at interval/2 and then one per interval, each result into the store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nomad_proto::{Allocation, Node};
use tokio_util::sync::CancellationToken;

use super::{CheckStore, NomadCheck, alloc_checks, probe, unix_now};

/// This node as last registered.
pub type NodeFn = Arc<dyn Fn() -> Arc<Node> + Send + Sync>;
/// The alloc's network status as this client reports it (`alloc` address mode).
pub type NetworkStatusFn = Arc<dyn Fn() -> Option<serde_json::Value> + Send + Sync>;

/// The shortest wait between two runs, whatever the job says (validation keeps it at 1 s).
const MIN_INTERVAL: Duration = Duration::from_millis(100);

struct Shared {
    alloc_id: String,
    store: Arc<CheckStore>,
    alloc: Mutex<Arc<Allocation>>,
    node: NodeFn,
    network_status: NetworkStatusFn,
}

impl Shared {
    /// The newest alloc, with the network status this client knows.
    fn alloc_now(&self) -> Allocation {
        let mut alloc = (**self.alloc.lock().unwrap_or_else(|e| e.into_inner())).clone();
        if let Some(status) = (self.network_status)() {
            alloc.network_status = Some(status);
        }
        alloc
    }
}

/// See the module docs.
pub struct AllocChecks {
    shared: Arc<Shared>,
    observers: Mutex<BTreeMap<String, CancellationToken>>,
    stop: CancellationToken,
}

impl AllocChecks {
    /// Observers for `alloc`, none started yet; they all end with `stop`.
    pub fn new(
        alloc: Arc<Allocation>,
        store: Arc<CheckStore>,
        node: NodeFn,
        network_status: NetworkStatusFn,
        stop: CancellationToken,
    ) -> AllocChecks {
        let shared = Arc::new(Shared { alloc_id: alloc.id.clone(), store, alloc: Mutex::new(alloc), node, network_status });
        AllocChecks { shared, observers: Mutex::new(BTreeMap::new()), stop }
    }

    /// Starts an observer for every check of `alloc` not observed yet, and stops those the
    /// alloc no longer has (their results are removed). Each new check gets its stub result,
    /// which a restored result is kept over.
    pub fn sync(&self, alloc: Arc<Allocation>) {
        let wanted = alloc_checks(&alloc);
        *self.shared.alloc.lock().unwrap_or_else(|e| e.into_inner()) = alloc;
        let ids: Vec<String> = wanted.keys().cloned().collect();
        let mut observers = self.observers.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone = self.shared.store.difference(&self.shared.alloc_id, &ids);
        gone.extend(observers.keys().filter(|id| !wanted.contains_key(*id)).cloned());
        gone.sort();
        gone.dedup();
        for id in &gone {
            if let Some(token) = observers.remove(id) {
                token.cancel();
            }
        }
        self.shared.store.remove(&self.shared.alloc_id, &gone);
        if self.stop.is_cancelled() {
            return;
        }
        for (id, check) in wanted {
            if observers.contains_key(&id) {
                continue;
            }
            self.shared.store.set(&self.shared.alloc_id, check.stub(unix_now()));
            let token = self.stop.child_token();
            observers.insert(id, token.clone());
            tokio::spawn(observe(check, self.shared.clone(), token));
        }
    }

    /// How many checks are observed.
    pub fn len(&self) -> usize {
        self.observers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no check is observed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops every observer.
    pub fn stop(&self) {
        self.stop.cancel();
        self.observers.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

async fn observe(check: NomadCheck, shared: Arc<Shared>, stop: CancellationToken) {
    let interval = Duration::from_nanos(check.check.interval.max(0) as u64).max(MIN_INTERVAL);
    let mut wait = interval / 2;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        let alloc = shared.alloc_now();
        let node = (shared.node)();
        let result = tokio::select! {
            r = probe::run(&check, &alloc, &node) => r,
            _ = stop.cancelled() => return,
        };
        if stop.is_cancelled() {
            return;
        }
        shared.store.set(&shared.alloc_id, result);
        wait = interval;
    }
}
