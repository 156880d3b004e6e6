//! Property tests: the scheduler's invariants hold for random clusters,
//! jobs and histories, with every plan committed through the FSM.

use std::collections::{BTreeMap, BTreeSet};

use nomad_proto::eval::trigger;
use nomad_proto::{
    ClientStatus, Constraint, DesiredStatus, EvalStatus, Evaluation, NetworkResource, Node, NodeStatus, Port, SchedulingEligibility,
};
use proptest::prelude::*;

use super::*;
use crate::scheduler::usage::Capacity;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 48, ..ProptestConfig::default() }
}

#[derive(Debug, Clone)]
struct NodeSpec {
    cpu: i64,
    memory: i64,
    status: NodeStatus,
    eligible: bool,
    draining: bool,
    zone: &'static str,
    dc: &'static str,
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        prop::sample::select(vec![1000i64, 2000, 4000]),
        prop::sample::select(vec![1024i64, 2048, 8192]),
        prop::sample::select(vec![
            NodeStatus::Ready,
            NodeStatus::Ready,
            NodeStatus::Ready,
            NodeStatus::Initializing,
            NodeStatus::Down,
            NodeStatus::Disconnected,
        ]),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.1),
        prop::sample::select(vec!["a", "a", "b"]),
        prop::sample::select(vec!["dc1", "dc1", "dc2"]),
    )
        .prop_map(|(cpu, memory, status, eligible, draining, zone, dc)| NodeSpec { cpu, memory, status, eligible, draining, zone, dc })
}

fn build_node(i: usize, s: &NodeSpec) -> Node {
    let mut n = crate::testing::node(&format!("n{i}"));
    let r = n.node_resources.as_mut().unwrap();
    r.cpu.cpu_shares = s.cpu;
    r.memory.memory_mb = s.memory;
    r.min_dynamic_port = 20000;
    r.max_dynamic_port = 20010;
    n.datacenter = s.dc.into();
    n.meta.insert("zone".into(), s.zone.into());
    if !s.eligible {
        n.scheduling_eligibility = SchedulingEligibility::Ineligible;
    }
    n
}

fn add_cluster(h: &mut Harness, specs: &[NodeSpec]) {
    for (i, s) in specs.iter().enumerate() {
        let n = build_node(i, s);
        h.add_node(n.clone());
        if s.status != NodeStatus::Ready {
            h.set_node_status(&n.id, s.status);
        }
        if s.draining {
            h.drain_node(&n.id);
        }
    }
}

fn small_job(id: &str, count: i64) -> nomad_proto::Job {
    let mut j = service_job(id, count);
    j.task_groups[0].tasks[0].resources.cpu = 50;
    j.task_groups[0].tasks[0].resources.memory_mb = 32;
    j.task_groups[0].ephemeral_disk.size_mb = 10;
    j
}

fn live_count(h: &Harness, job: &str) -> usize {
    h.live(job).len()
}

proptest! {
    #![proptest_config(config())]

    /// (a) With room to spare, the group converges to `count` live allocs through count changes.
    #[test]
    fn group_converges_to_count(nodes in 1usize..6, counts in prop::collection::vec(0i64..12, 1..4)) {
        let mut h = Harness::new();
        h.add_nodes(nodes);
        for c in counts {
            h.register_job(small_job("web", c));
            h.run_job("web");
            h.run_all("web");
            prop_assert_eq!(live_count(&h, "web") as i64, c);
            let mut names: Vec<String> = h.live("web").iter().map(|a| a.name.clone()).collect();
            names.sort();
            let want: Vec<String> = (0..c).map(|i| format!("web.web[{i}]")).collect();
            let mut want = want;
            want.sort();
            prop_assert_eq!(names, want, "names are web.web[0..count)");
        }
    }

    /// (b) One plan never over-commits a node: cpu, memory, disk and host ports.
    #[test]
    fn plans_never_overcommit(
        specs in prop::collection::vec(node_spec(), 1..6),
        jobs in prop::collection::vec((1i64..8, prop::sample::select(vec![100i64, 700, 1500]), prop::sample::select(vec![128i64, 900, 3000]), prop::bool::ANY, 0usize..3), 1..4),
    ) {
        let mut h = Harness::new();
        add_cluster(&mut h, &specs);
        for (i, (count, cpu, mem, static_port, dynamic)) in jobs.iter().enumerate() {
            let id = format!("j{i}");
            let mut job = service_job(&id, *count);
            job.task_groups[0].tasks[0].resources.cpu = *cpu;
            job.task_groups[0].tasks[0].resources.memory_mb = *mem;
            job.task_groups[0].ephemeral_disk.size_mb = 1000;
            let mut net = NetworkResource::default();
            if *static_port {
                net.reserved_ports.push(Port { label: "s".into(), value: 20005, ..Port::default() });
            }
            for d in 0..*dynamic {
                net.dynamic_ports.push(Port { label: format!("d{d}"), ..Port::default() });
            }
            if *static_port || *dynamic > 0 {
                job.task_groups[0].networks = vec![net];
            }
            h.register_job(job);
            h.run_job(&id);
        }
        let state = h.state();
        for n in state.nodes() {
            let cap = Capacity::of(n);
            let live: Vec<_> = state.allocs_by_node(&n.id).filter(|a| !a.client_terminal()).collect();
            let cpu: i64 = live.iter().map(|a| a.allocated_resources.as_ref().unwrap().cpu_shares()).sum();
            let mem: i64 = live.iter().map(|a| a.allocated_resources.as_ref().unwrap().memory_mb()).sum();
            let disk: i64 = live.iter().map(|a| a.allocated_resources.as_ref().unwrap().shared.disk_mb).sum();
            prop_assert!(cpu <= cap.cpu && mem <= cap.memory && disk <= cap.disk, "node {} over: {cpu}/{mem}/{disk} of {:?}", n.id, cap);
            let mut ports = BTreeSet::new();
            for a in &live {
                for p in a.allocated_resources.as_ref().unwrap().host_ports() {
                    prop_assert!(ports.insert(p), "port {p} used twice on {}", n.id);
                    prop_assert!((20000..=20010).contains(&p));
                }
            }
        }
    }

    /// (c) Nothing lands on a node that fails a constraint, is outside the
    /// job's datacenters, or is not ready (initializing, down, disconnected,
    /// ineligible, draining).
    #[test]
    fn placements_respect_node_state_and_constraints(specs in prop::collection::vec(node_spec(), 1..8), count in 1i64..10) {
        let mut h = Harness::new();
        add_cluster(&mut h, &specs);
        let mut job = small_job("web", count);
        job.constraints.push(Constraint { l_target: "${meta.zone}".into(), r_target: "a".into(), operand: "=".into() });
        h.register_job(job);
        let out = h.run_job("web");
        let state = h.state();
        for a in placed(&out) {
            let n = state.node(&a.node_id).unwrap();
            prop_assert!(n.is_ready_for_placement(), "{} is {:?}", n.id, n.status);
            prop_assert_eq!(n.meta["zone"].as_str(), "a");
            prop_assert_eq!(n.datacenter.as_str(), "dc1");
        }
        let fits = specs.iter().filter(|s| s.status == NodeStatus::Ready && s.eligible && !s.draining && s.zone == "a" && s.dc == "dc1").count();
        if fits > 0 {
            prop_assert_eq!(placed(&out).len() as i64, count, "room for all");
        } else {
            prop_assert!(placed(&out).is_empty());
            prop_assert!(out.eval_update.failed_tg_allocs.contains_key("web"));
        }
    }

    /// (d) Stopping a job stops every live alloc, whatever state they are in.
    #[test]
    fn stopping_a_job_stops_everything(
        nodes in 1usize..5,
        count in 1i64..8,
        statuses in prop::collection::vec(prop::sample::select(vec![ClientStatus::Pending, ClientStatus::Running, ClientStatus::Failed, ClientStatus::Complete]), 8),
        down in prop::option::of(0usize..5),
        purge in prop::bool::ANY,
    ) {
        let mut h = Harness::new();
        h.add_nodes(nodes);
        h.register_job(small_job("web", count));
        h.run_job("web");
        for (a, s) in h.allocs("web").iter().zip(statuses) {
            h.client_status(std::slice::from_ref(&a.id), s);
        }
        if let Some(d) = down.filter(|d| *d < nodes) {
            h.set_node_status(&format!("node-{d}"), NodeStatus::Down);
        }
        h.stop_job("web", purge);
        h.run_job("web");
        for a in h.allocs("web") {
            prop_assert!(a.terminal(), "{} is {:?}/{:?}", a.name, a.desired_status, a.client_status);
        }
    }
}

/// One step of a random disconnect history.
#[derive(Debug, Clone)]
enum Step {
    Disconnect(usize),
    Down(usize),
    Reconnect(usize),
    Wait(i64),
    Update { destructive: bool },
    Scale(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0usize..4).prop_map(Step::Disconnect),
        1 => (0usize..4).prop_map(Step::Down),
        3 => (0usize..4).prop_map(Step::Reconnect),
        2 => (10i64..90).prop_map(Step::Wait),
        1 => prop::bool::ANY.prop_map(|destructive| Step::Update { destructive }),
        1 => (1i64..4).prop_map(Step::Scale),
    ]
}

/// A cluster where clients follow the protocol: disconnected nodes send
/// nothing; returning nodes resume unknown allocs still desired to run and
/// stop the others; evals run when due.
struct World {
    h: Harness,
    queue: Vec<Evaluation>,
    version: u64,
    count: i64,
    /// Broken reconnect rules seen so far (checked at every reconnect).
    violations: Vec<String>,
}

/// An alloc coming back with its node, and the copies that could replace it.
#[derive(Debug)]
struct Returning {
    original: Arc<nomad_proto::Allocation>,
    candidates: Vec<Arc<nomad_proto::Allocation>>,
}

/// The reference's rule: the replacement wins if it runs a newer job, or
/// scores strictly better and runs (or the original does not).
fn replacement_wins(o: &nomad_proto::Allocation, r: &nomad_proto::Allocation) -> bool {
    let key = |a: &nomad_proto::Allocation| a.job.as_ref().map(|j| (j.version, j.create_index)).unwrap_or_default();
    let ((ov, oc), (rv, rc)) = (key(o), key(r));
    if rv > ov || rc > oc {
        return true;
    }
    let score = |a: &nomad_proto::Allocation| a.metrics.as_ref().and_then(|m| m.max_norm_score());
    let better = match (score(o), score(r)) {
        (None, Some(_)) => true,
        (Some(x), Some(y)) => y > x,
        _ => false,
    };
    better && (r.client_status == ClientStatus::Running || o.client_status != ClientStatus::Running)
}

impl World {
    fn new() -> World {
        let mut h = Harness::new();
        h.add_nodes(4);
        let mut job = disconnect_job("web", 2, 60);
        job.task_groups[0].tasks[0].resources.memory_mb = 64;
        h.register_job(job);
        let mut w = World { h, queue: Vec::new(), version: 0, count: 2, violations: Vec::new() };
        w.eval(trigger::JOB_REGISTER);
        w
    }

    fn job(&self) -> nomad_proto::Job {
        let mut job = disconnect_job("web", self.count, 60);
        job.task_groups[0].tasks[0].resources.memory_mb = 64;
        job.task_groups[0].tasks[0].env.insert("V".into(), self.version.to_string());
        job
    }

    fn eval(&mut self, trigger: &str) {
        let e = self.h.eval("web", trigger);
        self.process(e);
    }

    fn process(&mut self, e: Evaluation) {
        let out = self.h.process(&e);
        self.queue.extend(out.new_evals.into_iter().filter(|e| e.status == EvalStatus::Pending));
        self.clients_act();
    }

    /// Connected clients start pending allocs and stop desired-stop ones.
    fn clients_act(&mut self) {
        let state = self.h.state();
        let mut run = Vec::new();
        let mut done = Vec::new();
        for a in self.h.allocs("web") {
            let connected = state.node(&a.node_id).is_some_and(|n| !n.status.is_unresponsive());
            if !connected || a.client_terminal() {
                continue;
            }
            if a.desired_status != DesiredStatus::Run {
                done.push(a.id.clone());
            } else if a.client_status == ClientStatus::Pending {
                run.push(a.id.clone());
            }
        }
        if !run.is_empty() {
            self.h.client_status(&run, ClientStatus::Running);
        }
        if !done.is_empty() {
            self.h.client_status(&done, ClientStatus::Complete);
        }
    }

    fn run_due(&mut self) {
        let now = self.h.now;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue).into_iter().partition(|e| e.wait_until <= now);
        self.queue = later;
        for e in due {
            self.process(e);
        }
    }

    fn node_status(&self, i: usize) -> NodeStatus {
        self.h.state().node(&format!("node-{i}")).unwrap().status
    }

    fn apply(&mut self, s: &Step) {
        match s {
            Step::Disconnect(i) => {
                if self.node_status(*i) == NodeStatus::Ready {
                    self.h.set_node_status(&format!("node-{i}"), NodeStatus::Disconnected);
                    self.eval(trigger::NODE_UPDATE);
                }
            }
            Step::Down(i) => {
                if self.node_status(*i) != NodeStatus::Down {
                    self.h.set_node_status(&format!("node-{i}"), NodeStatus::Down);
                    self.eval(trigger::NODE_UPDATE);
                }
            }
            Step::Reconnect(i) => self.reconnect(*i),
            Step::Wait(secs) => {
                self.h.advance(*secs);
                self.run_due();
            }
            Step::Update { destructive } => {
                if *destructive {
                    self.version += 1;
                }
                let mut job = self.job();
                if !destructive {
                    job.task_groups[0].restart_policy = Some(nomad_proto::RestartPolicy {
                        attempts: 1 + (self.h.now.unix_secs() % 5),
                        ..nomad_proto::RestartPolicy::default_service()
                    });
                }
                self.h.register_job(job);
                self.eval(trigger::JOB_REGISTER);
            }
            Step::Scale(c) => {
                self.count = *c;
                self.h.register_job(self.job());
                self.eval(trigger::JOB_REGISTER);
            }
        }
    }

    fn reconnect(&mut self, i: usize) {
        let id = format!("node-{i}");
        let unknown = self.h.state().allocs_by_node(&id).any(|a| !a.terminal() && a.client_status == ClientStatus::Unknown);
        match self.node_status(i) {
            NodeStatus::Disconnected => self.h.set_node_status(&id, NodeStatus::Initializing),
            // A down node whose allocs are still unknown comes back through initializing too
            // (as `Node.UpdateStatus` does); otherwise it comes straight back.
            NodeStatus::Down if unknown => self.h.set_node_status(&id, NodeStatus::Initializing),
            NodeStatus::Down => {}
            _ => return,
        }
        let state = self.h.state();
        let returning = self.returning(&id);
        let mut resume = Vec::new();
        let mut stop = Vec::new();
        for a in state.allocs_by_node(&id) {
            if a.client_terminal() {
                continue;
            }
            // The client resumes what the servers still want and stops the rest.
            if a.desired_status == DesiredStatus::Run {
                if a.client_status == ClientStatus::Unknown {
                    resume.push(a.id.clone());
                }
            } else {
                stop.push(a.id.clone());
            }
        }
        if !resume.is_empty() {
            self.h.client_status(&resume, ClientStatus::Running);
        }
        if !stop.is_empty() {
            self.h.client_status(&stop, ClientStatus::Complete);
        }
        self.eval(trigger::RECONNECT);
        self.h.set_node_status(&id, NodeStatus::Ready);
        self.eval(trigger::NODE_UPDATE);
        self.check_reconnected(&returning);
    }

    /// The `unknown` allocs on a node about to come back, with their possible replacements
    /// (same name, created later, not stopped by the servers).
    fn returning(&self, node: &str) -> Vec<Returning> {
        let state = self.h.state();
        let now = self.h.now;
        let all: Vec<Arc<nomad_proto::Allocation>> = self.h.allocs("web");
        state
            .allocs_by_node(node)
            .filter(|a| a.job_id == "web" && a.client_status == ClientStatus::Unknown && a.desired_status == DesiredStatus::Run)
            .filter(|a| !a.expired(now))
            .map(|o| Returning {
                original: o.clone(),
                candidates: all
                    .iter()
                    .filter(|x| x.id != o.id && x.name == o.name && x.create_index > o.create_index && !x.server_terminal())
                    .cloned()
                    .collect(),
            })
            .collect()
    }

    /// Checks what became of allocs that came back (the client resumed them as running).
    fn check_reconnected(&mut self, returning: &[Returning]) {
        let state = self.h.state();
        let job_version = state.job("default", "web").map(|j| j.version).unwrap_or_default();
        for r in returning {
            let o = state.alloc(&r.original.id).expect("original");
            let mut resumed = (*r.original).clone();
            resumed.client_status = ClientStatus::Running;
            let older = r.original.job.as_ref().is_some_and(|j| j.version < job_version);
            let winners: Vec<&Arc<nomad_proto::Allocation>> = r.candidates.iter().filter(|c| replacement_wins(&resumed, c)).collect();
            let tag = format!("{} ({})", o.name, &o.id[..8]);
            if older {
                if o.desired_status != DesiredStatus::Stop || o.desired_description != nomad_proto::alloc::ALLOC_NOT_NEEDED_DESC {
                    self.violations.push(format!("older {tag} came back and ended {:?} {:?}", o.desired_status, o.desired_description));
                }
                continue;
            }
            if winners.is_empty() {
                let states: Vec<&str> = o.alloc_states.iter().map(|st| st.value.as_str()).collect();
                let n = states.len();
                if o.desired_status != DesiredStatus::Run || n < 2 || states[n - 1] != "running" || states[n - 2] != "unknown" {
                    self.violations.push(format!("{tag} should be kept: {:?}, AllocStates {states:?}", o.desired_status));
                }
                for c in &r.candidates {
                    let c = state.alloc(&c.id).expect("candidate");
                    // A loser still away on a down node is (re)stopped as lost by a later eval.
                    let lost_on_down =
                        c.client_status == ClientStatus::Lost && state.node(&c.node_id).is_none_or(|n| n.status == NodeStatus::Down);
                    let reconnect_loser = c.desired_description == nomad_proto::alloc::ALLOC_RECONNECTED_DESC || lost_on_down;
                    if c.desired_status != DesiredStatus::Stop || !reconnect_loser {
                        self.violations.push(format!(
                            "replacement {} of kept {tag} ended {:?} {:?}",
                            &c.id[..8],
                            c.desired_status,
                            c.desired_description
                        ));
                    }
                }
            } else if o.desired_status != DesiredStatus::Stop || o.desired_description != nomad_proto::alloc::ALLOC_NOT_NEEDED_DESC {
                self.violations.push(format!("{tag} lost to a replacement but ended {:?} {:?}", o.desired_status, o.desired_description));
            }
        }
    }

    /// Brings every node back and lets every pending eval run.
    fn settle(&mut self) {
        for i in 0..4 {
            self.reconnect(i);
        }
        for _ in 0..10 {
            self.h.advance(120);
            self.run_due();
            self.eval(trigger::NODE_UPDATE);
        }
    }

    fn running_names(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for a in self.h.allocs("web") {
            if a.desired_status == DesiredStatus::Run && matches!(a.client_status, ClientStatus::Running | ClientStatus::Pending) {
                *m.entry(a.name.clone()).or_insert(0) += 1;
            }
        }
        m
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// (e) After any history of disconnects, reconnects, expiries and job
    /// updates, once the nodes are back: never two running allocs with the
    /// same name, and exactly `count` of them.
    #[test]
    fn reconnects_never_leave_duplicates(steps in prop::collection::vec(step(), 1..14)) {
        let mut w = World::new();
        for s in &steps {
            w.apply(s);
        }
        w.settle();
        let names = w.running_names();
        for (name, n) in &names {
            prop_assert_eq!(*n, 1, "{} runs {} times after {:?}", name, n, steps);
        }
        prop_assert_eq!(names.len() as i64, w.count, "count after {:?}: {:?}", steps, names);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// (f) At every reconnect of a random history, the original or the one
    /// replacement the rules pick is kept (the original on ties; an older
    /// version never), the loser is stopped with Nomad's description and the
    /// kept original records `running` after `unknown`. At the end nothing
    /// is `unknown`, the job summary agrees with the allocs, and one more
    /// eval (and every follow-up still waiting) changes nothing.
    #[test]
    fn reconnects_keep_the_copy_the_rules_pick(steps in prop::collection::vec(step(), 1..16)) {
        let mut w = World::new();
        for s in &steps {
            w.apply(s);
            prop_assert!(w.violations.is_empty(), "{:?} after {:?}", w.violations, steps);
        }
        w.settle();
        prop_assert!(w.violations.is_empty(), "{:?} after {:?}", w.violations, steps);
        let state = w.h.state();
        let stuck: Vec<String> = w.h.allocs("web").iter().filter(|a| a.client_status == ClientStatus::Unknown).map(|a| a.name.clone()).collect();
        prop_assert!(stuck.is_empty(), "stuck unknown {:?} after {:?}", stuck, steps);
        let summary = state.job_summary("default", "web").unwrap().summary["web"].clone();
        let count = |st: ClientStatus| w.h.allocs("web").iter().filter(|a| a.client_status == st).count() as i64;
        prop_assert_eq!(
            [summary.starting, summary.running, summary.complete, summary.failed, summary.lost, summary.unknown],
            [count(ClientStatus::Pending), count(ClientStatus::Running), count(ClientStatus::Complete), count(ClientStatus::Failed), count(ClientStatus::Lost), count(ClientStatus::Unknown)],
            "summary after {:?}", steps
        );
        // Every follow-up still waiting (disconnect timeouts of reconnected allocs) and a fresh eval change nothing.
        w.h.advance(24 * 3600);
        let before: Vec<(String, DesiredStatus, ClientStatus, u64)> =
            w.h.allocs("web").iter().map(|a| (a.id.clone(), a.desired_status, a.client_status, a.alloc_modify_index)).collect();
        w.run_due();
        let out = w.h.schedule(&w.h.eval("web", trigger::NODE_UPDATE));
        let after: Vec<(String, DesiredStatus, ClientStatus, u64)> =
            w.h.allocs("web").iter().map(|a| (a.id.clone(), a.desired_status, a.client_status, a.alloc_modify_index)).collect();
        prop_assert_eq!(before, after, "a late follow-up changed allocs after {:?}", steps);
        prop_assert!(out.plan.is_no_op(), "a further eval still plans {:?} after {:?}", out.plan, steps);
    }
}
