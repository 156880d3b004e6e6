//! Simulation helpers for tests and benchmarks: small stand-in schedulers
//! behind the [`Scheduler`] trait, simulated nodes, and a leader over a
//! [`TestServer`](crate::testing::TestServer).
//!
//! The stand-ins follow the trait's contract (pure, plan + eval update +
//! new evals) but none of Nomad's placement logic: [`FirstReadyNode`] puts
//! everything on the first ready node; [`RandomFit`] probes random ready
//! nodes for room, which is enough to load the broker, workers and plan
//! applier realistically.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use nomad_proto::plan::{DesiredUpdates, PlanAnnotations};
use nomad_proto::resources::{AllocatedCpuResources, AllocatedMemoryResources, AllocatedTaskResources};
use nomad_proto::{
    AllocMetric, AllocatedResources, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, Node, NodeStatus, Plan,
    TaskGroup, Timestamp,
};

use crate::heartbeat::HeartbeatExpiry;
use crate::leader::{Leader, LeaderConfig, LeaderDeps};
use crate::plan_apply::{Usage, alloc_usage, node_capacity};
use crate::scheduler::{ScheduleOutcome, Scheduler};
use crate::state::State;
use crate::testing::TestServer;

/// What an alloc of `tg` holds: its tasks' asks and the group's disk.
pub fn allocated_resources(tg: &TaskGroup) -> AllocatedResources {
    let mut r = AllocatedResources::default();
    for t in &tg.tasks {
        r.tasks.insert(
            t.name.clone(),
            AllocatedTaskResources {
                cpu: AllocatedCpuResources { cpu_shares: t.resources.cpu, ..Default::default() },
                memory: AllocatedMemoryResources { memory_mb: t.resources.memory_mb, ..Default::default() },
                ..Default::default()
            },
        );
    }
    r.shared.disk_mb = tg.ephemeral_disk.size_mb;
    r
}

/// Decides a node for each new alloc of a group (`None`: no room).
trait Placer {
    fn pick(&mut self, state: &State, job: &Job, tg: &TaskGroup, ask: Usage) -> Option<Arc<Node>>;
}

/// The outcome every stand-in shares: stop what the job no longer wants,
/// place what is missing where the placer says, block on the rest.
fn reconcile(state: &State, eval: &Evaluation, now: Timestamp, placer: &mut dyn Placer) -> ScheduleOutcome {
    let job = state.job(&eval.namespace, &eval.job_id).cloned();
    let mut plan =
        Plan { job: job.clone(), priority: eval.priority, all_at_once: job.as_ref().is_some_and(|j| j.all_at_once), ..Plan::default() };
    let mut update = eval.clone();
    update.status = EvalStatus::Complete;
    update.status_description.clear();
    let mut annotations = PlanAnnotations::default();
    let live: Vec<Arc<Allocation>> = state.allocs_by_job(&eval.namespace, &eval.job_id).filter(|a| !a.terminal()).cloned().collect();
    let stop = |plan: &mut Plan, a: &Allocation, why: &str| {
        let mut s = a.clone();
        s.desired_status = DesiredStatus::Stop;
        s.desired_description = why.to_string();
        plan.node_update.entry(a.node_id.clone()).or_default().push(s);
    };
    let mut failed = BTreeMap::new();
    match job.as_ref().filter(|j| !j.stop) {
        None => {
            for a in &live {
                stop(&mut plan, a, nomad_proto::alloc::ALLOC_JOB_STOPPED_DESC);
            }
        }
        Some(job) => {
            for tg in &job.task_groups {
                let mut mine: Vec<&Arc<Allocation>> = live.iter().filter(|a| a.task_group == tg.name).collect();
                mine.sort_by_key(|a| a.index());
                let want = tg.count.max(0) as usize;
                let desired = annotations.desired_tg_updates.entry(tg.name.clone()).or_insert_with(DesiredUpdates::default);
                for a in mine.iter().skip(want) {
                    stop(&mut plan, a, nomad_proto::alloc::ALLOC_NOT_NEEDED_DESC);
                    desired.stop += 1;
                }
                desired.ignore = mine.len().min(want) as u64;
                let used: BTreeSet<u64> = mine.iter().map(|a| a.index()).collect();
                let mut free_index = (0u64..).filter(|i| !used.contains(i));
                let resources = allocated_resources(tg);
                let ask = Usage { cpu: resources.cpu_shares(), memory_mb: resources.memory_mb(), disk_mb: resources.shared.disk_mb };
                let missing = want.saturating_sub(mine.len());
                let mut unplaced = 0;
                for _ in 0..missing {
                    let Some(node) = placer.pick(state, job, tg, ask) else {
                        unplaced += 1;
                        continue;
                    };
                    let index = free_index.next().expect("unbounded");
                    plan.node_allocation.entry(node.id.clone()).or_default().push(Allocation {
                        id: nomad_proto::new_id(),
                        namespace: job.namespace.clone(),
                        eval_id: eval.id.clone(),
                        name: nomad_proto::alloc::alloc_name(&job.id, &tg.name, index),
                        node_id: node.id.clone(),
                        node_name: node.name.clone(),
                        job_id: job.id.clone(),
                        job: Some(job.clone()),
                        task_group: tg.name.clone(),
                        allocated_resources: Some(resources.clone()),
                        desired_status: DesiredStatus::Run,
                        client_status: ClientStatus::Pending,
                        ..Allocation::default()
                    });
                    desired.place += 1;
                }
                if unplaced > 0 {
                    failed.insert(
                        tg.name.clone(),
                        AllocMetric { nodes_evaluated: state.node_count() as i64, coalesced_failures: unplaced - 1, ..Default::default() },
                    );
                    update.queued_allocations.insert(tg.name.clone(), unplaced);
                }
            }
        }
    }
    let mut new_evals = Vec::new();
    if !failed.is_empty() {
        let blocked = Evaluation {
            id: nomad_proto::new_id(),
            namespace: eval.namespace.clone(),
            priority: eval.priority,
            eval_type: eval.eval_type,
            triggered_by: eval.triggered_by.clone(),
            job_id: eval.job_id.clone(),
            job_modify_index: eval.job_modify_index,
            status: EvalStatus::Blocked,
            status_description: "created to place remaining allocations".into(),
            previous_eval: eval.id.clone(),
            failed_tg_allocs: failed.clone(),
            create_time: now.unix_nanos(),
            modify_time: now.unix_nanos(),
            ..Evaluation::default()
        };
        update.blocked_eval = blocked.id.clone();
        new_evals.push(blocked);
    }
    update.failed_tg_allocs = failed;
    let annotations = eval.annotate_plan.then_some(annotations);
    plan.annotations = annotations.clone();
    ScheduleOutcome { plan, eval_update: update, new_evals, annotations }
}

fn schedulable(n: &Node, job: &Job) -> bool {
    n.is_ready_for_placement() && n.in_any_datacenter(&job.datacenters)
}

/// Places every missing alloc on the first ready node (by ID), ignoring room.
#[derive(Debug, Default, Clone, Copy)]
pub struct FirstReadyNode;

struct First;

impl Placer for First {
    fn pick(&mut self, state: &State, job: &Job, _: &TaskGroup, _: Usage) -> Option<Arc<Node>> {
        state.nodes().find(|n| schedulable(n, job)).cloned()
    }
}

impl Scheduler for FirstReadyNode {
    fn compute(&self, state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome {
        reconcile(state, eval, now, &mut First)
    }
}

/// Probes up to `probes` random ready nodes per alloc and takes the first
/// with room (counting what the plan already put there). Seeded by the eval
/// ID, so a run is reproducible.
#[derive(Debug)]
pub struct RandomFit {
    /// Nodes tried per alloc before giving up.
    pub probes: usize,
    /// Ready nodes as of a nodes-table index: listing 10,000 nodes per eval would dominate.
    ready: std::sync::Mutex<(u64, Arc<Vec<Arc<Node>>>)>,
}

impl RandomFit {
    /// Tries `probes` nodes per alloc.
    pub fn new(probes: usize) -> RandomFit {
        RandomFit { probes, ready: std::sync::Mutex::new((u64::MAX, Arc::new(Vec::new()))) }
    }

    fn ready_nodes(&self, state: &State) -> Arc<Vec<Arc<Node>>> {
        let index = state.table_index(crate::state::Table::Nodes);
        let mut cached = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if cached.0 != index {
            *cached = (index, Arc::new(state.nodes().filter(|n| n.is_ready_for_placement()).cloned().collect()));
        }
        cached.1.clone()
    }
}

impl Default for RandomFit {
    fn default() -> Self {
        RandomFit::new(64)
    }
}

struct Probe {
    ready: Arc<Vec<Arc<Node>>>,
    planned: HashMap<String, Usage>,
    probes: usize,
    rng: u64,
}

impl Probe {
    fn next(&mut self) -> u64 {
        // xorshift64*: fast, good enough to spread load.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

impl Placer for Probe {
    fn pick(&mut self, state: &State, job: &Job, _: &TaskGroup, ask: Usage) -> Option<Arc<Node>> {
        if self.ready.is_empty() {
            return None;
        }
        for _ in 0..self.probes {
            let pick = (self.next() % self.ready.len() as u64) as usize;
            let node = self.ready[pick].clone();
            if !node.in_any_datacenter(&job.datacenters) {
                continue;
            }
            let cap = node_capacity(&node);
            let planned = self.planned.entry(node.id.clone()).or_insert_with(|| {
                state.allocs_by_node(&node.id).filter(|a| !a.terminal()).map(|a| alloc_usage(a)).fold(Usage::default(), |s, u| Usage {
                    cpu: s.cpu + u.cpu,
                    memory_mb: s.memory_mb + u.memory_mb,
                    disk_mb: s.disk_mb + u.disk_mb,
                })
            });
            if planned.cpu + ask.cpu <= cap.cpu
                && planned.memory_mb + ask.memory_mb <= cap.memory_mb
                && planned.disk_mb + ask.disk_mb <= cap.disk_mb
            {
                planned.cpu += ask.cpu;
                planned.memory_mb += ask.memory_mb;
                planned.disk_mb += ask.disk_mb;
                return Some(node);
            }
        }
        None
    }
}

impl Scheduler for RandomFit {
    fn compute(&self, state: &State, eval: &Evaluation, now: Timestamp) -> ScheduleOutcome {
        let ready = self.ready_nodes(state);
        let seed = eval.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)) | 1;
        reconcile(state, eval, now, &mut Probe { ready, planned: HashMap::new(), probes: self.probes, rng: seed })
    }
}

/// A simulated node: `ready`, with the fixture's resources (4 GHz, 8 GiB).
pub fn ready_node(id: &str) -> Node {
    let mut n = crate::testing::node(id);
    n.status = NodeStatus::Ready;
    n.compute_class();
    n
}

/// Starts a leader over a test server with `scheduler`; it runs until the returned task is aborted.
pub fn start_leader(
    server: &TestServer,
    scheduler: Arc<dyn Scheduler>,
    config: LeaderConfig,
) -> (Arc<Leader>, tokio::task::JoinHandle<()>) {
    let deps = LeaderDeps {
        store: server.store.clone(),
        consensus: server.consensus.clone(),
        heartbeats: server.endpoints.heartbeats().clone(),
        heartbeat_expiry: Arc::new(server.endpoints.clone()) as Arc<dyn HeartbeatExpiry>,
        scheduler,
        volume_watch: Arc::new(server.endpoints.clone()),
        claim_gc: Arc::new(server.endpoints.clone()),
        keyring: server.endpoints.keyring().clone(),
    };
    let leader = Arc::new(Leader::new(deps, config));
    let task = tokio::spawn(leader.clone().run());
    (leader, task)
}
