//! The server side of the protocol tests: the real endpoints, the real
//! scheduler and the real plan-applier evaluation over a [`LocalConsensus`],
//! with no background task. Every step is a call the test makes: a client
//! RPC, one scheduler run with its plan judged and applied, the leader's
//! reaction to state changes (blocked evals), a heartbeat expiry, the clock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use nomad_proto::{ClientStatus, DesiredStatus, EvalStatus, Evaluation, JobType, NodeStatus, PlanResult, Timestamp};
use nomad_server::broker::{BlockedEvals, diff_changes, effect_writes};
use nomad_server::consensus::{Consensus, LocalConsensus};
use nomad_server::endpoints::{EndpointConfig, Endpoints};
use nomad_server::fsm::Command;
use nomad_server::heartbeat::{HeartbeatConfig, Heartbeater};
use nomad_server::plan_apply::{PlanSubmission, accepted_nodes, entry_for, take_accepted};
use nomad_server::scheduler::{BuiltinScheduler, Scheduler};
use nomad_server::state::{State, StateStore};
use nomad_server::worker::{WorkerConfig, give_up_submission, submission};

/// One second in nanoseconds.
pub const SEC: i64 = 1_000_000_000;

/// The token every delivery carries (there is no broker to check it).
const TOKEN: &str = "protocol-test";

thread_local! {
    static RT: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
}

/// Runs an endpoint call to completion on this thread's runtime.
/// Runs an endpoint call to completion on this thread's runtime.
pub fn block<F: std::future::Future>(f: F) -> F::Output {
    RT.with(|rt| rt.block_on(f))
}

/// A violated invariant or a step that could not run, with what led to it.
pub type Check = Result<(), String>;

/// A scheduler run whose plan was computed but not yet judged and applied
/// (the scheduler worked on a snapshot that the world moves past).
#[derive(Debug, Clone)]
pub struct InFlight {
    pub eval: Evaluation,
    pub sub: PlanSubmission,
    pub last_blocked: Option<Evaluation>,
    pub attempts: u32,
}

/// The server: state, consensus, endpoints, a virtual clock and the leader's
/// blocked-eval tracker.
pub struct Sim {
    pub store: Arc<StateStore>,
    consensus: Arc<LocalConsensus>,
    pub ep: Endpoints,
    clock: Arc<Mutex<Timestamp>>,
    blocked: BlockedEvals,
    seen: State,
    /// Plans the applier refused at least in part (for the report).
    pub refusals: usize,
    /// Scheduler runs (compute calls).
    pub computes: usize,
    /// What the last finished runs committed, for the step log.
    pub committed: Vec<String>,
    /// The deployment watcher's counts seen so far.
    deployments_seen: std::collections::HashMap<String, nomad_server::leader::deployment_watcher::SeenDeployment>,
}

impl Sim {
    pub fn new(start: Timestamp) -> Sim {
        let blocked = BlockedEvals::new();
        blocked.set_enabled(true);
        Sim::over(StateStore::new(), start, blocked)
    }

    /// An independent copy: same state, clock and blocked evals, its own store.
    pub fn fork(&self) -> Sim {
        let store = StateStore::new();
        store.restore(self.state());
        let mut sim = Sim::over(store, self.now(), self.blocked.clone());
        sim.seen = self.seen.clone();
        sim.deployments_seen = self.deployments_seen.clone();
        sim
    }

    fn over(store: StateStore, start: Timestamp, blocked: BlockedEvals) -> Sim {
        let store = Arc::new(store);
        let consensus = Arc::new(LocalConsensus::new(store.clone()));
        let heartbeats = Arc::new(Heartbeater::new(HeartbeatConfig::default()));
        heartbeats.arm(Vec::<String>::new());
        let clock = Arc::new(Mutex::new(start));
        let c = clock.clone();
        let ep = Endpoints::new(store.clone(), consensus.clone(), heartbeats, EndpointConfig::default())
            .with_clock(Arc::new(move || *c.lock().unwrap()));
        Sim {
            seen: store.snapshot(),
            store,
            consensus,
            ep,
            clock,
            blocked,
            refusals: 0,
            computes: 0,
            committed: Vec::new(),
            deployments_seen: Default::default(),
        }
    }

    pub fn now(&self) -> Timestamp {
        *self.clock.lock().unwrap()
    }

    pub fn advance(&self, ns: i64) {
        let mut c = self.clock.lock().unwrap();
        *c = c.add_nanos(ns);
    }

    pub fn state(&self) -> State {
        self.store.snapshot()
    }

    pub fn apply(&self, cmd: Command) -> Result<u64, String> {
        block(self.consensus.apply(cmd)).map_err(|e| e.to_string())
    }

    /// The leader's change watcher, run to a fixed point: blocked evals are
    /// tracked, unblocked when capacity appears, canceled when superseded; and the
    /// deployment watcher's evals as health arrives.
    pub fn leader(&mut self) -> Check {
        for _ in 0..20 {
            let (state, now) = (self.store.snapshot(), self.now());
            for (_, cmd) in nomad_server::leader::deployment_watcher::writes(&state, &mut self.deployments_seen, now) {
                self.apply(cmd)?;
            }
            let new = self.store.snapshot();
            if new.index == self.seen.index {
                return Ok(());
            }
            let (_pending, effects) = diff_changes(&self.blocked, &self.seen, &new);
            self.seen = new;
            if effects.is_empty() {
                return Ok(());
            }
            let evals = effect_writes(effects, self.now().unix_nanos());
            self.apply(Command::EvalUpsert { evals })?;
        }
        Err("the leader's blocked-eval writes did not settle".into())
    }

    /// Evals the broker would hand out now: pending and due, oldest write first.
    pub fn due_evals(&self) -> Vec<Evaluation> {
        let now = self.now();
        let state = self.state();
        let mut due: Vec<Evaluation> = state
            .evals()
            .filter(|e| e.status == EvalStatus::Pending && (e.wait_until.is_zero() || e.wait_until <= now))
            .map(|e| (**e).clone())
            .collect();
        due.sort_by(|a, b| (a.modify_index, &a.id).cmp(&(b.modify_index, &b.id)));
        due
    }

    /// Pending evals waiting for their `WaitUntil`.
    pub fn delayed_evals(&self) -> Vec<Evaluation> {
        let now = self.now();
        self.state()
            .evals()
            .filter(|e| e.status == EvalStatus::Pending && !e.wait_until.is_zero() && e.wait_until > now)
            .map(|e| (**e).clone())
            .collect()
    }

    /// Runs the scheduler for `eval` on the current state (the plan is not applied yet).
    pub fn compute(&mut self, eval: &Evaluation, attempts: u32) -> InFlight {
        let snap = self.state();
        self.computes += 1;
        let outcome = BuiltinScheduler.compute(&snap, eval, self.now());
        let last_blocked = outcome.new_evals.iter().find(|e| e.status == EvalStatus::Blocked).cloned();
        let sub = submission(eval, TOKEN, snap.index, outcome);
        InFlight { eval: eval.clone(), sub, last_blocked, attempts }
    }

    /// Judges a plan against the current state, checks what is about to be
    /// committed, and writes it. Returns the applier's result.
    pub fn judge_and_apply(&mut self, sub: &PlanSubmission) -> Result<PlanResult, String> {
        let state = self.state();
        let (accepted, refused) = accepted_nodes(&state, &[], &sub.plan);
        let mut plan = sub.plan.clone();
        let result = take_accepted(&state, &mut plan, &accepted, refused);
        if result.refresh_index != 0 {
            self.refusals += 1;
        }
        self.committed.push(describe(&state, sub, &result));
        check_committed(&state, &result)?;
        if let Some(entry) = entry_for(sub, &result, self.now()) {
            self.apply(Command::PlanApply(entry)).map_err(|e| format!("plan apply failed: {e}"))?;
        }
        Ok(result)
    }

    /// Finishes a scheduler run as a worker does: apply, and on a partial
    /// refusal plan again on the newer state, up to the attempt limit
    /// (then the eval fails and a `max-plan-attempts` blocked eval is left).
    pub fn finish(&mut self, mut run: InFlight) -> Check {
        let max = WorkerConfig::default().max_plan_attempts;
        for _ in 0..50 {
            let result = self.judge_and_apply(&run.sub)?;
            if result.refresh_index == 0 {
                return self.leader();
            }
            let progress = !result.node_allocation.is_empty() || !result.node_update.is_empty();
            let attempts = if progress { 0 } else { run.attempts + 1 };
            if attempts >= max {
                let sub = give_up_submission(&run.eval, TOKEN, run.sub.plan.snapshot_index, attempts, run.last_blocked.clone());
                self.judge_and_apply(&sub)?;
                return self.leader();
            }
            run = self.compute(&run.eval, attempts);
        }
        Err(format!("eval {} kept making progress without finishing", run.eval.id))
    }

    /// Heartbeat expiry for a node, as the leader's timer fires it.
    pub fn heartbeat_missed(&mut self, node_id: &str) -> Result<NodeStatus, String> {
        let s = block(self.ep.node_heartbeat_missed(node_id)).map_err(|e| e.to_string())?;
        self.leader()?;
        Ok(s)
    }
}

/// One line on what a judged plan commits and what was refused.
fn describe(state: &State, sub: &PlanSubmission, result: &PlanResult) -> String {
    let name = |id: &str| state.alloc(id).map(|a| a.name.clone()).unwrap_or_default();
    let mut parts = Vec::new();
    for (node, allocs) in &result.node_update {
        for a in allocs {
            parts.push(format!("stop {} {} on {node} ({:?})", name(&a.id), crate::client::short(&a.id), a.desired_description));
        }
    }
    for (node, allocs) in &result.node_allocation {
        for a in allocs {
            let verb = if state.alloc(&a.id).is_some() { "rewrite" } else { "place" };
            parts.push(format!("{verb} {} {} on {node} ({})", a.name, crate::client::short(&a.id), a.client_status));
        }
    }
    let refused: Vec<&String> = sub.plan.node_allocation.keys().filter(|n| !result.node_allocation.contains_key(*n)).collect();
    if !refused.is_empty() {
        parts.push(format!("REFUSED on {refused:?}"));
    }
    if parts.is_empty() { "no-op".into() } else { parts.join("; ") }
}

/// The applier is about to commit `result` on `state`: nothing lands on a
/// node that is not `ready`, except `unknown` markers on a `disconnected`
/// node; no placement duplicates an alloc of the same name and job version
/// that still runs on a `ready` node (whatever the servers think of it;
/// for a system job, on the same node) unless the same commit stops it. Copies on nodes that are away or coming
/// back are what replacements and the reconnect rules are for; a copy of an
/// older version is on its way out (destructive update, older reconnect).
fn check_committed(state: &State, result: &PlanResult) -> Check {
    let stopped: BTreeSet<&str> =
        result.node_update.values().chain(result.node_preemptions.values()).flatten().map(|a| a.id.as_str()).collect();
    for (node_id, allocs) in &result.node_allocation {
        let node = state.node(node_id).ok_or_else(|| format!("plan commits allocs to missing node {node_id}"))?;
        for a in allocs {
            let existing = state.alloc(&a.id);
            match node.status {
                NodeStatus::Ready => {}
                NodeStatus::Disconnected if existing.is_some() && a.client_status == ClientStatus::Unknown => {}
                s => return Err(format!("plan commits alloc {} ({}) to {s} node {node_id}", a.id, a.name)),
            }
            if existing.is_some() {
                continue;
            }
            // New allocs run the plan's job, the current version.
            let job = state.job(&a.namespace, &a.job_id);
            let version = job.map(|j| j.version).unwrap_or_default();
            // A system job runs the same name on every node: a copy is one on the same node.
            let per_node = job.is_some_and(|j| j.job_type == JobType::System);
            let dup = state
                .allocs_by_job(&a.namespace, &a.job_id)
                .map(|o| o.as_ref())
                .filter(|o| o.name == a.name && o.id != a.id && o.desired_status == DesiredStatus::Run && !o.client_terminal())
                .filter(|o| !per_node || o.node_id == *node_id)
                .filter(|o| !stopped.contains(o.id.as_str()))
                .filter(|o| o.job.as_ref().is_none_or(|j| j.version >= version))
                .find(|o| state.node(&o.node_id).is_some_and(|n| n.status == NodeStatus::Ready));
            if let Some(o) = dup {
                return Err(format!(
                    "plan places a second {} on {node_id} while {} ({}) runs it on ready node {}",
                    a.name, o.id, o.client_status, o.node_id
                ));
            }
        }
    }
    Ok(())
}

/// Counts of a job's allocs by client status, from the allocs themselves.
pub fn recount(state: &State, job_id: &str) -> BTreeMap<ClientStatus, i64> {
    let mut m = BTreeMap::new();
    for a in state.allocs_by_job("default", job_id) {
        *m.entry(a.client_status).or_insert(0) += 1;
    }
    m
}
