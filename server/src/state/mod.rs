//! The state store: cluster state in persistent maps.
//!
//! ```text
//!  FSM ──write(index, |txn| ...)──▶ [ State ] ──snapshot()──▶ readers (HTTP, RPC, scheduler)
//!                                      │
//!                                      └─ per-table index + watch channel ─▶ blocking queries
//! ```
//!
//! Tables are `imbl` maps of `Arc` values, so [`StateStore::snapshot`] is an
//! O(1) clone that later writes never disturb. A write works on a copy of
//! the state and replaces it only if the whole transaction succeeds, which
//! makes every FSM command atomic.
//!
//! **Invariant:** only the FSM calls [`StateStore::write`]; every change is
//! stamped with the Raft index of the command that made it.

mod acl;
mod allocs;
mod changes;
mod csi_plugins;
mod csi_volumes;
mod deployments;
mod evals;
mod job_versions;
mod jobs;
mod namespaces;
mod node_load;
mod nodes;
mod persist;
mod scaling;
mod scheduler_config;
mod services;
mod si_accessors;
mod variables;
mod waiters;

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use imbl::{OrdMap, OrdSet};
use nomad_proto::{Allocation, Evaluation, Job, JobSummary, Namespace, NamespacedId, Node};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use csi_volumes::CsiVolumeView;
pub use job_versions::{JOB_TRACKED_VERSIONS, PeriodicLaunch};
pub use jobs::job_status;
pub use scheduler_config::{PreemptionConfig, SCHEDULER_ALGORITHM_BINPACK, SchedulerConfigError, SchedulerConfiguration};
pub use si_accessors::{ClusterMetadata, SiTokenAccessor};
pub use variables::{CAS_CONFLICT, VarOp};
pub use waiters::Watch;

/// Keys of the large tables (alloc, eval and node IDs). A write copies the tree nodes on its
/// path, keys included, and frees them when the last snapshot sharing the old ones goes: shared
/// strings make that a reference count each instead of an allocation and a free.
type Key = Arc<str>;
pub use node_load::{AllocHold, Load, NodeLoad, saturating_sum};

/// The tables whose index blocking queries wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Table {
    /// Jobs.
    Jobs,
    /// Job summaries.
    JobSummary,
    /// Nodes.
    Nodes,
    /// Allocations.
    Allocs,
    /// Evaluations.
    Evals,
    /// Namespaces.
    Namespaces,
    /// Nomad-native service registrations.
    Services,
    /// CSI volumes.
    CsiVolumes,
    /// CSI plugins.
    CsiPlugins,
    /// Consul Service Identity token accessors.
    SiTokenAccessors,
    /// ACL policies.
    AclPolicies,
    /// ACL tokens (and the bootstrap index).
    AclTokens,
    /// ACL roles.
    AclRoles,
    /// Nomad Variables.
    Variables,
    /// Keyring root keys.
    RootKeys,
    /// Earlier versions of jobs.
    JobVersions,
    /// Periodic jobs' last launches.
    PeriodicLaunches,
    /// Deployments.
    Deployments,
    /// Groups' scaling policies (stored in their jobs; this index moves when one changes).
    ScalingPolicies,
    /// Jobs' scaling events.
    ScalingEvents,
    /// The scheduler configuration.
    SchedulerConfig,
}

/// Number of tables.
const TABLES: usize = 21;

impl Table {
    /// Every table.
    pub const ALL: [Table; TABLES] = [
        Table::Jobs,
        Table::JobSummary,
        Table::Nodes,
        Table::Allocs,
        Table::Evals,
        Table::Namespaces,
        Table::Services,
        Table::CsiVolumes,
        Table::CsiPlugins,
        Table::SiTokenAccessors,
        Table::AclPolicies,
        Table::AclTokens,
        Table::AclRoles,
        Table::Variables,
        Table::RootKeys,
        Table::JobVersions,
        Table::PeriodicLaunches,
        Table::Deployments,
        Table::ScalingPolicies,
        Table::ScalingEvents,
        Table::SchedulerConfig,
    ];

    fn slot(self) -> usize {
        self as usize
    }
}

/// The whole cluster state at one Raft index. Cloning is O(1).
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Raft index of the last applied command.
    pub index: u64,
    table_index: [u64; TABLES],
    jobs: OrdMap<NamespacedId, Arc<Job>>,
    /// Each job's tracked versions, newest first (the current one included, sharing its `Arc`).
    job_versions: OrdMap<NamespacedId, Arc<Vec<Arc<Job>>>>,
    /// Each periodic job's last launch (or its registration time before the first).
    periodic_launches: OrdMap<NamespacedId, Arc<PeriodicLaunch>>,
    job_summaries: OrdMap<NamespacedId, Arc<JobSummary>>,
    /// Deployments, by ID.
    deployments: OrdMap<Key, Arc<nomad_proto::Deployment>>,
    /// Job → its deployments' IDs.
    deployments_by_job: OrdMap<NamespacedId, OrdSet<Key>>,
    /// Scaling policy ID → the job whose group holds it (derived from `jobs`).
    scaling_policies: OrdMap<Key, NamespacedId>,
    /// Each job's scaling events.
    scaling_events: OrdMap<NamespacedId, Arc<nomad_proto::scaling::JobScalingEvents>>,
    nodes: OrdMap<String, Arc<Node>>,
    allocs: OrdMap<Key, Arc<Allocation>>,
    /// Node ID → its allocs (by alloc ID). The index holds the allocs themselves, not their IDs:
    /// the scheduler and the plan applier walk a node's allocs for every node they consider,
    /// and a lookup per alloc in `allocs` cost more than the rest of the walk.
    allocs_by_node: OrdMap<Key, node_load::NodeAllocs>,
    /// Job → its allocs (by alloc ID), for the same reason.
    allocs_by_job: OrdMap<NamespacedId, OrdMap<Key, Arc<Allocation>>>,
    evals: OrdMap<Key, Arc<Evaluation>>,
    evals_by_job: OrdMap<NamespacedId, OrdSet<Key>>,
    /// Per node, the index at which one of its allocs was last removed (so alloc watches notice GC).
    alloc_removed: OrdMap<String, u64>,
    namespaces: OrdMap<String, Arc<Namespace>>,
    services: OrdMap<String, Arc<nomad_proto::ServiceRegistration>>,
    csi_volumes: OrdMap<NamespacedId, Arc<nomad_proto::csi::CsiVolume>>,
    csi_plugins: OrdMap<String, Arc<nomad_proto::csi::CsiPlugin>>,
    /// Consul SI token accessors, by AccessorID.
    si_accessors: OrdMap<String, Arc<SiTokenAccessor>>,
    /// The cluster's ID, once a leader set it.
    cluster: Option<ClusterMetadata>,
    /// ACL policies, by name.
    acl_policies: OrdMap<String, Arc<crate::acl::AclPolicy>>,
    /// ACL tokens, by AccessorID.
    acl_tokens: OrdMap<String, Arc<crate::acl::AclToken>>,
    /// SecretID → AccessorID.
    acl_tokens_by_secret: OrdMap<String, String>,
    /// ACL roles, by ID.
    acl_roles: OrdMap<String, Arc<crate::acl::AclRole>>,
    /// Raft index of the ACL bootstrap (0: not done).
    acl_bootstrap_index: u64,
    /// Nomad Variables (items encrypted), by namespace and path.
    variables: OrdMap<NamespacedId, Arc<crate::keyring::EncryptedVariable>>,
    /// Keyring root keys (wrapped), by KeyID.
    root_keys: OrdMap<String, Arc<crate::keyring::StoredRootKey>>,
    /// The scheduler configuration, once written.
    scheduler_config: Option<Arc<SchedulerConfiguration>>,
}

impl State {
    /// A fresh state with the `default` namespace.
    pub fn new() -> State {
        let mut s = State::default();
        s.namespaces.insert(
            nomad_proto::job::DEFAULT_NAMESPACE.to_string(),
            Arc::new(Namespace { name: "default".into(), description: "Default shared namespace".into(), ..Namespace::default() }),
        );
        s
    }

    /// The index of one table (the Raft index of its last change).
    pub fn table_index(&self, t: Table) -> u64 {
        self.table_index[t.slot()]
    }

    /// Stamps the state and every table with `index`: a state restored by an operator at that
    /// Raft index, so every reader sees it as newer than anything it saw before.
    pub fn stamp_all(&mut self, index: u64) {
        self.index = index;
        self.table_index = [index; TABLES];
    }

    /// The highest index among `tables`.
    pub fn max_index(&self, tables: &[Table]) -> u64 {
        tables.iter().map(|t| self.table_index(*t)).max().unwrap_or(0)
    }

    /// Namespaces, by name.
    pub fn namespaces(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.namespaces.values()
    }

    /// One namespace.
    pub fn namespace(&self, name: &str) -> Option<&Arc<Namespace>> {
        self.namespaces.get(name)
    }
}

/// An object a transaction wrote, for the event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A job was inserted or updated.
    Job(Arc<Job>),
    /// A node was inserted or updated.
    Node(Arc<Node>),
    /// A node was removed.
    NodeDeleted(Arc<Node>),
    /// An eval was inserted or updated.
    Eval(Arc<Evaluation>),
    /// An alloc was inserted or updated.
    Alloc(Arc<Allocation>),
    /// A service registration was inserted or updated.
    Service(Arc<nomad_proto::ServiceRegistration>),
    /// A service registration was removed.
    ServiceDeleted(Arc<nomad_proto::ServiceRegistration>),
    /// A CSI volume was registered or its claims changed, as reads show it (denormalized).
    CsiVolume(Arc<CsiVolumeView>),
    /// A CSI volume was removed, as reads showed it last.
    CsiVolumeDeleted(Arc<CsiVolumeView>),
    /// A CSI plugin was created or its instances or their health changed.
    CsiPlugin(Arc<nomad_proto::csi::CsiPlugin>),
    /// A CSI plugin lost its last instance and was removed (shown without instances).
    CsiPluginDeleted(Arc<nomad_proto::csi::CsiPlugin>),
    /// A variable was written (metadata only: events never carry items).
    Variable(Arc<nomad_proto::variables::VariableMetadata>),
    /// A variable was removed.
    VariableDeleted(Arc<nomad_proto::variables::VariableMetadata>),
    /// A deployment was created or changed.
    Deployment(Arc<nomad_proto::Deployment>),
}

impl Change {
    fn key(&self) -> (u8, String) {
        match self {
            Change::Job(j) => (0, format!("{}/{}", j.namespace, j.id)),
            Change::Node(n) | Change::NodeDeleted(n) => (1, n.id.clone()),
            Change::Eval(e) => (2, e.id.clone()),
            Change::Alloc(a) => (3, a.id.clone()),
            Change::Service(r) | Change::ServiceDeleted(r) => (4, r.id.clone()),
            Change::CsiVolume(v) | Change::CsiVolumeDeleted(v) => (5, format!("{}/{}", v.volume.namespace, v.volume.id)),
            Change::CsiPlugin(p) | Change::CsiPluginDeleted(p) => (6, p.id.clone()),
            Change::Variable(v) | Change::VariableDeleted(v) => (7, format!("{}/{}", v.namespace, v.path)),
            Change::Deployment(d) => (8, d.id.clone()),
        }
    }
}

/// A write in progress: the FSM's view of the state during one command.
pub struct Txn<'a> {
    state: &'a mut State,
    index: u64,
    touched: BTreeSet<Table>,
    /// The keyed watches this write touched (tables are in `touched`).
    touched_keys: HashSet<Watch>,
    changes: Vec<Change>,
    change_pos: std::collections::HashMap<(u8, String), usize>,
}

impl Txn<'_> {
    /// The Raft index this transaction stamps.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Read access to the state as changed so far.
    pub fn state(&self) -> &State {
        self.state
    }

    fn touch(&mut self, t: Table) {
        self.touched.insert(t);
    }

    /// Marks one object (or one object's children) changed, for the blocking queries on it.
    fn touch_key(&mut self, w: Watch) {
        self.touched_keys.insert(w);
    }

    /// Records a written object; a later write of the same object replaces the record.
    fn record(&mut self, c: Change) {
        let key = c.key();
        match self.change_pos.get(&key) {
            Some(&i) => self.changes[i] = c,
            None => {
                self.change_pos.insert(key, self.changes.len());
                self.changes.push(c);
            }
        }
    }
}

/// An error that aborts a transaction; nothing it did is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TxnError(pub String);

/// The state store: the current [`State`] plus change notification.
pub struct StateStore {
    current: RwLock<State>,
    /// Per-table index channels for the server's own loops ([`StateStore::wait_for_change`]).
    watchers: [watch::Sender<u64>; TABLES],
    /// Blocking queries, by what they wait on.
    waiters: Arc<waiters::Registry>,
    /// How many times the whole state was replaced ([`StateStore::restore`]).
    restores: watch::Sender<u64>,
}

impl Default for StateStore {
    fn default() -> Self {
        StateStore::new()
    }
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").field("index", &self.snapshot().index).finish()
    }
}

impl StateStore {
    /// An empty store with the `default` namespace.
    pub fn new() -> StateStore {
        StateStore {
            current: RwLock::new(State::new()),
            watchers: std::array::from_fn(|_| watch::channel(0).0),
            waiters: Arc::default(),
            restores: watch::channel(0).0,
        }
    }

    /// The state now. O(1); later writes do not change it.
    pub fn snapshot(&self) -> State {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies `f` as one transaction at `index`: either everything it did
    /// is kept and watchers of the touched tables are woken, or nothing is.
    pub fn write<T>(&self, index: u64, f: impl FnOnce(&mut Txn<'_>) -> Result<T, TxnError>) -> Result<T, TxnError> {
        self.write_with_changes(index, f).map(|(out, _)| out)
    }

    /// Like [`StateStore::write`], also returning the objects written, in order.
    pub fn write_with_changes<T>(
        &self,
        index: u64,
        f: impl FnOnce(&mut Txn<'_>) -> Result<T, TxnError>,
    ) -> Result<(T, Vec<Change>), TxnError> {
        let mut guard = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut next = guard.clone();
        let mut txn = Txn {
            state: &mut next,
            index,
            touched: BTreeSet::new(),
            touched_keys: HashSet::new(),
            changes: Vec::new(),
            change_pos: Default::default(),
        };
        let out = f(&mut txn)?;
        let touched = std::mem::take(&mut txn.touched);
        let mut touched_keys = std::mem::take(&mut txn.touched_keys);
        let changes = std::mem::take(&mut txn.changes);
        for t in &touched {
            next.table_index[t.slot()] = index;
        }
        next.index = next.index.max(index);
        *guard = next;
        drop(guard);
        for t in touched {
            self.watchers[t.slot()].send_replace(index);
            touched_keys.insert(Watch::Table(t));
        }
        self.waiters.wake(&touched_keys);
        Ok((out, changes))
    }

    /// Replaces the whole state (snapshot restore) and wakes every watcher.
    pub fn restore(&self, state: State) {
        let indexes = state.table_index;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = state;
        for t in Table::ALL {
            self.watchers[t.slot()].send_replace(indexes[t.slot()]);
        }
        self.waiters.wake_all();
        self.restores.send_modify(|n| *n += 1);
    }

    /// Changes each time the whole state is replaced (a snapshot installed or restored): the
    /// leader's subsystems, which hold views of the state (queued evals, heartbeat timers),
    /// start over from the new one.
    pub fn restores(&self) -> watch::Receiver<u64> {
        self.restores.subscribe()
    }

    /// Waits until one of `tables` has an index above `min_index`, or until `wait` passes.
    /// For the server's own long-lived loops; queries use [`StateStore::blocking_query_on`].
    pub async fn wait_for_change(&self, tables: &[Table], min_index: u64, wait: Duration) {
        let mut rxs: Vec<watch::Receiver<u64>> = tables.iter().map(|t| self.watchers[t.slot()].subscribe()).collect();
        let changed = async {
            loop {
                if rxs.iter_mut().any(|rx| *rx.borrow_and_update() > min_index) {
                    return;
                }
                let futs = rxs.iter_mut().map(|rx| Box::pin(rx.changed()));
                let _ = futures::future::select_all(futs).await;
            }
        };
        let _ = tokio::time::timeout(wait, changed).await;
    }

    /// [`StateStore::blocking_query_on`] waiting on whole tables.
    pub async fn blocking_query<T>(
        &self,
        tables: &[Table],
        min_index: u64,
        wait: Duration,
        query: impl FnMut(&State) -> (T, u64),
    ) -> (T, u64) {
        let watches: Vec<Watch> = tables.iter().copied().map(Watch::Table).collect();
        self.blocking_query_on(&watches, min_index, wait, query).await
    }

    /// Runs `query` against snapshots until its result index is above `min_index` or `wait`
    /// passes (Nomad's blocking query). A `min_index` of 0 returns at once. Between runs the
    /// query sleeps until a write touches one of `watches` (what its result depends on): writes
    /// elsewhere neither wake it nor cost it anything. While it sleeps it holds neither a
    /// snapshot nor a result, so a parked query keeps no old state alive.
    pub async fn blocking_query_on<T>(
        &self,
        watches: &[Watch],
        min_index: u64,
        wait: Duration,
        mut query: impl FnMut(&State) -> (T, u64),
    ) -> (T, u64) {
        if min_index == 0 {
            let (out, index) = query(&self.snapshot());
            return (out, index.max(1));
        }
        let deadline = tokio::time::Instant::now() + wait;
        // Registered before the first snapshot: a write after it wakes this query.
        let registration = self.waiters.register(watches);
        loop {
            {
                let snap = self.snapshot();
                let (out, index) = query(&snap);
                if index > min_index || tokio::time::Instant::now() >= deadline {
                    return (out, index.max(1));
                }
            }
            if tokio::time::timeout_at(deadline, registration.changed()).await.is_err() {
                let (out, index) = query(&self.snapshot());
                return (out, index.max(1));
            }
        }
    }

    /// Blocking queries registered now (one per query and watch): 0 once they all ended.
    pub fn blocking_registrations(&self) -> usize {
        self.waiters.registrations()
    }

    /// Wakes handed to blocking queries so far (one per query and touched watch).
    pub fn blocking_wakeups(&self) -> u64 {
        self.waiters.wakeups()
    }
}

#[cfg(test)]
mod csi_tests;
#[cfg(test)]
mod tests;
