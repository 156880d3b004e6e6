//! Scheduler tests: a harness that commits outcomes through the real FSM,
//! fixtures, and the test suites.

mod bench;
mod bounded;
mod canary;
mod csi;
mod feasibility;
mod generic;
mod props;
mod rolling;
mod system;

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::eval::trigger;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, Node, NodeStatus, Timestamp};

use super::{BuiltinScheduler, ScheduleOutcome, Scheduler};
use crate::fsm::{AllocStop, Command, Fsm, PlanApply, ServerFsm};
use crate::state::{State, StateStore};

/// One second in nanoseconds.
pub(crate) const SEC: i64 = 1_000_000_000;

/// A state store driven through the FSM, with a controllable clock.
pub(crate) struct Harness {
    pub(crate) store: Arc<StateStore>,
    fsm: ServerFsm,
    index: u64,
    pub(crate) now: Timestamp,
}

impl Harness {
    pub(crate) fn new() -> Harness {
        let store = Arc::new(StateStore::new());
        Harness { fsm: ServerFsm::new(store.clone()), store, index: 0, now: Timestamp(1_700_000_000 * SEC) }
    }

    pub(crate) fn apply(&mut self, cmd: Command) {
        self.index += 1;
        let r = self.fsm.apply(self.index, cmd);
        assert!(r.error.is_none(), "command refused: {:?}", r.error);
    }

    pub(crate) fn state(&self) -> State {
        self.store.snapshot()
    }

    pub(crate) fn advance(&mut self, secs: i64) {
        self.now = self.now.add_nanos(secs * SEC);
    }

    /// Registers a node and makes it `ready` (unless it says otherwise).
    pub(crate) fn add_node(&mut self, mut node: Node) -> Node {
        if node.status == NodeStatus::Initializing {
            node.status = NodeStatus::Ready;
        }
        let now = self.now;
        self.apply(Command::NodeRegister { node: node.clone(), evals: vec![], now });
        node
    }

    /// `n` ready nodes `node-0` ... from the standard fixture.
    pub(crate) fn add_nodes(&mut self, n: usize) -> Vec<Node> {
        (0..n).map(|i| self.add_node(crate::testing::node(&format!("node-{i}")))).collect()
    }

    pub(crate) fn set_node_status(&mut self, id: &str, status: NodeStatus) {
        let updated_at = self.now.unix_secs();
        self.apply(Command::NodeUpdateStatus { node_id: id.into(), status, event: None, updated_at, evals: vec![] });
    }

    pub(crate) fn drain_node(&mut self, id: &str) {
        let now = self.now;
        let drain = Some(nomad_proto::node::DrainStrategy { deadline: 3600 * SEC, ..Default::default() });
        self.apply(Command::NodeUpdateDrain { node_id: id.into(), drain, mark_eligible: false, event: None, evals: vec![], now });
    }

    pub(crate) fn delete_node(&mut self, id: &str) {
        self.apply(Command::NodeDeregister { node_ids: vec![id.into()], evals: vec![] });
    }

    /// Canonicalizes and registers (or updates) a job.
    pub(crate) fn register_job(&mut self, mut job: Job) -> Arc<Job> {
        job.canonicalize();
        let now = self.now;
        let (ns, id) = (job.namespace.clone(), job.id.clone());
        self.apply(Command::JobRegister { job, eval: None, now });
        self.state().job(&ns, &id).cloned().expect("job stored")
    }

    pub(crate) fn stop_job(&mut self, id: &str, purge: bool) {
        let now = self.now;
        self.apply(Command::JobDeregister { namespace: "default".into(), job_id: id.into(), purge, eval: None, now });
    }

    /// A pending eval for the job as stored (or a purged one).
    pub(crate) fn eval(&self, job_id: &str, triggered_by: &str) -> Evaluation {
        match self.state().job("default", job_id) {
            Some(j) => Evaluation::for_job(j, triggered_by, self.now),
            None => Evaluation {
                id: nomad_proto::new_id(),
                namespace: "default".into(),
                job_id: job_id.into(),
                triggered_by: triggered_by.into(),
                ..Evaluation::default()
            },
        }
    }

    pub(crate) fn schedule(&self, eval: &Evaluation) -> ScheduleOutcome {
        BuiltinScheduler.compute(&self.state(), eval, self.now)
    }

    /// Commits an outcome the way the plan applier does.
    pub(crate) fn commit(&mut self, outcome: &ScheduleOutcome) {
        let plan = &outcome.plan;
        let allocs_stopped = plan
            .node_update
            .values()
            .flatten()
            .map(|a| AllocStop {
                alloc_id: a.id.clone(),
                desired_description: a.desired_description.clone(),
                client_status: (a.client_status == ClientStatus::Lost).then_some(ClientStatus::Lost),
                followup_eval_id: a.followup_eval_id.clone(),
            })
            .collect();
        let apply = PlanApply {
            job: plan.job.as_deref().cloned(),
            allocs_upserted: plan.node_allocation.values().flatten().cloned().collect(),
            allocs_stopped,
            eval: Some(outcome.eval_update.clone()),
            evals: outcome.new_evals.clone(),
            now: self.now,
            deployment: plan.deployment.clone().map(Box::new),
            deployment_updates: plan.deployment_updates.clone(),
        };
        self.apply(Command::PlanApply(apply));
    }

    /// Schedules and commits.
    pub(crate) fn process(&mut self, eval: &Evaluation) -> ScheduleOutcome {
        let out = self.schedule(eval);
        self.commit(&out);
        out
    }

    /// Runs a `job-register` eval and commits it.
    pub(crate) fn run_job(&mut self, job_id: &str) -> ScheduleOutcome {
        let e = self.eval(job_id, trigger::JOB_REGISTER);
        self.process(&e)
    }

    /// The client reports a status for its allocs.
    pub(crate) fn client_status(&mut self, alloc_ids: &[String], status: ClientStatus) {
        let state = self.state();
        let allocs = alloc_ids
            .iter()
            .map(|id| {
                let a = state.alloc(id).expect("alloc");
                Allocation {
                    id: a.id.clone(),
                    node_id: a.node_id.clone(),
                    client_status: status,
                    task_states: a.task_states.clone(),
                    ..Allocation::default()
                }
            })
            .collect();
        let now = self.now;
        self.apply(Command::AllocClientUpdate { allocs, evals: vec![], now });
    }

    /// The client reports its allocs running and, in their deployment, healthy (or not).
    pub(crate) fn report_health(&mut self, alloc_ids: &[String], healthy: bool) {
        let state = self.state();
        let allocs = alloc_ids
            .iter()
            .map(|id| {
                let a = state.alloc(id).expect("alloc");
                Allocation {
                    id: a.id.clone(),
                    node_id: a.node_id.clone(),
                    client_status: ClientStatus::Running,
                    task_states: a.task_states.clone(),
                    deployment_status: Some(serde_json::json!({ "Healthy": healthy, "Timestamp": self.now })),
                    ..Allocation::default()
                }
            })
            .collect();
        let now = self.now;
        self.apply(Command::AllocClientUpdate { allocs, evals: vec![], now });
    }

    /// Marks every live alloc of the job running.
    pub(crate) fn run_all(&mut self, job_id: &str) {
        let ids: Vec<String> =
            self.live(job_id).iter().filter(|a| a.client_status == ClientStatus::Pending).map(|a| a.id.clone()).collect();
        if !ids.is_empty() {
            self.client_status(&ids, ClientStatus::Running);
        }
    }

    pub(crate) fn allocs(&self, job_id: &str) -> Vec<Arc<Allocation>> {
        self.state().allocs_by_job("default", job_id).cloned().collect()
    }

    /// Allocs the servers want running and the client has not finished.
    pub(crate) fn live(&self, job_id: &str) -> Vec<Arc<Allocation>> {
        self.allocs(job_id).into_iter().filter(|a| a.desired_status == DesiredStatus::Run && !a.client_terminal()).collect()
    }
}

/// `web` with 3 allocs of version 0 on 4 nodes, deployed and stable, and version 1 (a new env)
/// registered: the start of every update scenario.
pub(crate) fn deployed_then_changed(update: nomad_proto::job::UpdateStrategy) -> (Harness, Job) {
    let mut h = Harness::new();
    h.add_nodes(4);
    let mut job = service_job("web", 3);
    job.update = Some(update);
    h.register_job(job.clone());
    h.run_job("web");
    let ids: Vec<String> = h.live("web").iter().map(|a| a.id.clone()).collect();
    h.report_health(&ids, true);
    h.run_job("web");
    assert!(h.state().job("default", "web").unwrap().stable, "version 0 deployed and stable");
    job.task_groups[0].tasks[0].env.insert("V".into(), "1".into());
    h.register_job(job.clone());
    (h, job)
}

/// The job version a stored alloc runs (the plan's allocs leave the job out).
pub(crate) fn version_of(a: &Allocation) -> u64 {
    a.job.as_ref().map_or(u64::MAX, |j| j.version)
}

/// New allocs of an outcome (rewrites of stored allocs carry their create index).
pub(crate) fn placed(out: &ScheduleOutcome) -> Vec<&Allocation> {
    out.plan.node_allocation.values().flatten().filter(|a| a.create_index == 0).collect()
}

/// Stored allocs the outcome rewrites (unknown marks, reconnects, in-place updates).
pub(crate) fn rewritten(out: &ScheduleOutcome) -> Vec<&Allocation> {
    out.plan.node_allocation.values().flatten().filter(|a| a.create_index > 0).collect()
}

/// Stops of an outcome, flattened.
pub(crate) fn stopped(out: &ScheduleOutcome) -> Vec<&Allocation> {
    out.plan.node_update.values().flatten().collect()
}

/// Names of a list of allocs, sorted.
pub(crate) fn names<'a>(allocs: impl IntoIterator<Item = &'a Allocation>) -> Vec<String> {
    let mut v: Vec<String> = allocs.into_iter().map(|a| a.name.clone()).collect();
    v.sort();
    v
}

/// How many allocs each node holds in an outcome.
pub(crate) fn per_node(out: &ScheduleOutcome) -> BTreeMap<String, usize> {
    out.plan.node_allocation.iter().map(|(k, v)| (k.clone(), v.len())).collect()
}

/// A service job with `count` allocs of a 500 MHz / 256 MiB task.
pub(crate) fn service_job(id: &str, count: i64) -> Job {
    let mut j = crate::testing::job(id, count);
    j.task_groups[0].tasks[0].resources.cpu = 500;
    j.task_groups[0].tasks[0].resources.memory_mb = 256;
    j.task_groups[0].ephemeral_disk.size_mb = 100;
    j
}

/// A service job whose group keeps allocs `unknown` for `secs` when their node disconnects.
pub(crate) fn disconnect_job(id: &str, count: i64, secs: i64) -> Job {
    let mut j = service_job(id, count);
    j.task_groups[0].max_client_disconnect = Some(secs * SEC);
    j
}

/// True when the eval update says complete.
pub(crate) fn complete(out: &ScheduleOutcome) -> bool {
    out.eval_update.status == EvalStatus::Complete
}
