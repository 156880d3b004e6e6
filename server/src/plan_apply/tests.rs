//! The plan applier: node checks, races, partial commits, tokens, batching.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nomad_proto::node::DrainStrategy;
use nomad_proto::{ClientStatus, EvalStatus, NodeStatus, SchedulingEligibility};
use tokio::sync::watch;

use super::*;
use crate::broker::BrokerConfig;
use crate::consensus::{BoxFuture, LocalConsensus};
use crate::state::State;
use crate::test_support::wait_until;

/// LocalConsensus that records entries, can hold writes at a gate, and can fail them.
struct TestConsensus {
    inner: LocalConsensus,
    /// Plans per entry written.
    entries: Mutex<Vec<usize>>,
    started: AtomicUsize,
    gate: tokio::sync::Mutex<()>,
    fail: AtomicBool,
}

impl Consensus for TestConsensus {
    fn apply(&self, cmd: Command) -> BoxFuture<'_, Result<u64, ApplyError>> {
        Box::pin(async move {
            self.started.fetch_add(1, Ordering::SeqCst);
            let _open = self.gate.lock().await;
            if self.fail.load(Ordering::SeqCst) {
                return Err(ApplyError::NoLeader);
            }
            let plans = match &cmd {
                Command::PlanApply(_) => 1,
                Command::PlanApplyBatch(v) => v.len(),
                _ => 0,
            };
            let index = self.inner.apply(cmd).await?;
            if plans > 0 {
                self.entries.lock().unwrap().push(plans);
            }
            Ok(index)
        })
    }
    fn is_leader(&self) -> bool {
        true
    }
    fn leadership(&self) -> watch::Receiver<bool> {
        self.inner.leadership()
    }
    fn leader_rpc_addr(&self) -> Option<String> {
        self.inner.leader_rpc_addr()
    }
    fn peers(&self) -> Vec<String> {
        self.inner.peers()
    }
}

struct Setup {
    store: Arc<StateStore>,
    consensus: Arc<TestConsensus>,
    broker: Arc<EvalBroker>,
    plans: PlanQueue,
}

fn setup() -> Setup {
    let store = Arc::new(StateStore::new());
    let consensus = Arc::new(TestConsensus {
        inner: LocalConsensus::new(store.clone()),
        entries: Mutex::new(Vec::new()),
        started: AtomicUsize::new(0),
        gate: tokio::sync::Mutex::new(()),
        fail: AtomicBool::new(false),
    });
    // Nacked evals come straight back, so tests can redeliver without timers.
    let broker = Arc::new(EvalBroker::new(BrokerConfig { initial_nack_delay: Duration::ZERO, ..BrokerConfig::default() }));
    broker.set_enabled(true);
    let (plans, _task) = spawn_plan_applier(store.clone(), consensus.clone(), broker.clone(), PlanApplierConfig::default());
    Setup { store, consensus, broker, plans }
}

impl Setup {
    async fn write(&self, cmd: Command) {
        self.consensus.inner.apply(cmd).await.unwrap();
    }

    async fn node(&self, id: &str, status: NodeStatus) {
        let mut n = crate::testing::node(id);
        n.status = status;
        self.write(Command::NodeRegister { node: n, evals: vec![], now: Timestamp::now() }).await;
    }

    /// Stores a pending eval and delivers it; returns the plan skeleton carrying its token.
    async fn delivered(&self, eval_id: &str) -> Plan {
        let e = Evaluation { id: eval_id.into(), namespace: "default".into(), job_id: format!("job-{eval_id}"), ..Evaluation::default() };
        self.write(Command::EvalUpsert { evals: vec![e.clone()] }).await;
        self.broker.enqueue(Arc::new(e));
        let d = self.broker.dequeue(Duration::ZERO).await.unwrap().expect("delivered");
        assert_eq!(d.eval.id, eval_id);
        Plan { eval_id: eval_id.into(), eval_token: d.token, snapshot_index: self.store.snapshot().index, ..Plan::default() }
    }

    fn allocs_on(&self, node: &str) -> usize {
        self.store.snapshot().allocs_by_node(node).filter(|a| !a.terminal()).count()
    }
}

fn placement(id: &str, node: &str, cpu: i64, mem: i64) -> Allocation {
    let mut a = crate::plan_apply::fit::tests::sized(cpu, mem, &[]);
    a.id = id.into();
    a.namespace = "default".into();
    a.job_id = "web".into();
    a.task_group = "g".into();
    a.node_id = node.into();
    a
}

fn place(plan: &mut Plan, a: Allocation) {
    plan.node_allocation.entry(a.node_id.clone()).or_default().push(a);
}

fn completed(plan: &Plan) -> PlanSubmission {
    let update = Evaluation {
        id: plan.eval_id.clone(),
        namespace: "default".into(),
        job_id: format!("job-{}", plan.eval_id),
        status: EvalStatus::Complete,
        ..Evaluation::default()
    };
    PlanSubmission { plan: plan.clone(), eval_update: Some(update), new_evals: vec![] }
}

fn placed(r: &PlanResult) -> Vec<String> {
    r.node_allocation.values().flatten().map(|a| a.id.clone()).collect()
}

#[tokio::test]
async fn placements_only_go_to_nodes_ready_for_them() {
    let s = setup();
    s.node("ready", NodeStatus::Ready).await;
    s.node("down", NodeStatus::Down).await;
    s.node("init", NodeStatus::Initializing).await;
    s.node("draining", NodeStatus::Ready).await;
    s.write(Command::NodeUpdateDrain {
        node_id: "draining".into(),
        drain: Some(DrainStrategy::default()),
        mark_eligible: false,
        event: None,
        evals: vec![],
        now: Timestamp::now(),
    })
    .await;
    s.node("ineligible", NodeStatus::Ready).await;
    s.write(Command::NodeUpdateEligibility {
        node_id: "ineligible".into(),
        eligibility: SchedulingEligibility::Ineligible,
        event: None,
        evals: vec![],
        now: Timestamp::now(),
    })
    .await;
    s.node("gone-away", NodeStatus::Disconnected).await;
    let state: State = s.store.snapshot();
    let mut plan = Plan::default();
    for node in ["ready", "down", "init", "draining", "ineligible", "gone-away", "no-such-node"] {
        place(&mut plan, placement(&format!("a-{node}"), node, 100, 100));
    }
    let r = evaluate_plan(&state, &[], &plan);
    assert_eq!(placed(&r), ["a-ready"]);
    assert!(r.refresh_index >= state.max_index(&[crate::state::Table::Nodes]));
    let why = |node: &str| evaluate_node_plan(&state, &[], &plan, node).unwrap_err();
    assert_eq!(why("down"), "node is not ready for placements");
    assert_eq!(why("init"), "node is not ready for placements");
    assert_eq!(why("draining"), "node is draining");
    assert_eq!(why("ineligible"), "node is not eligible");
    assert_eq!(why("gone-away"), "node is disconnected and contains invalid updates");
    assert_eq!(why("no-such-node"), "node does not exist");

    // A disconnected node takes the scheduler's "unknown" markers for its allocs.
    let mut marker = placement("a-gone-away", "gone-away", 100, 100);
    marker.client_status = ClientStatus::Unknown;
    let mut plan = Plan::default();
    place(&mut plan, marker);
    assert_eq!(placed(&evaluate_plan(&state, &[], &plan)), ["a-gone-away"]);
}

#[tokio::test]
async fn unknown_markers_only_land_on_disconnected_nodes_and_their_replacements_go_with_them() {
    let s = setup();
    s.node("back", NodeStatus::Ready).await;
    s.node("init", NodeStatus::Initializing).await;
    s.node("spare", NodeStatus::Ready).await;
    let state: State = s.store.snapshot();
    // A plan made while "back" was away: mark its alloc unknown, replace it on "spare".
    for node in ["back", "init"] {
        let mut marker = placement(&format!("orig-{node}"), node, 100, 100);
        marker.name = format!("web.g[{node}]");
        marker.client_status = ClientStatus::Unknown;
        let mut repl = placement(&format!("repl-{node}"), "spare", 100, 100);
        repl.name = marker.name.clone();
        repl.previous_allocation = marker.id.clone();
        let mut plan = Plan::default();
        place(&mut plan, marker);
        place(&mut plan, repl);
        let r = evaluate_plan(&state, &[], &plan);
        assert!(placed(&r).is_empty(), "{node}: neither the marker nor its replacement: {:?}", placed(&r));
        assert!(r.refresh_index > 0);
    }
    let mut plan = Plan::default();
    let mut marker = placement("orig", "back", 100, 100);
    marker.client_status = ClientStatus::Unknown;
    place(&mut plan, marker);
    assert_eq!(evaluate_node_plan(&state, &[], &plan, "back"), Err(super::evaluate::STALE_UNKNOWN.into()));
}

#[tokio::test]
async fn a_stop_waits_for_the_refused_placement_of_the_same_name() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    s.node("n2", NodeStatus::Down).await;
    let state: State = s.store.snapshot();
    // A destructive update: stop the old web[0] on n1, place the new one on n2 (refused).
    let mut old = placement("old", "n1", 100, 100);
    old.name = "web.g[0]".into();
    let mut new = placement("new", "n2", 100, 100);
    new.name = old.name.clone();
    let mut other = placement("other", "n1", 100, 100);
    other.name = "web.g[1]".into();
    let mut plan = Plan::default();
    plan.node_update.entry("n1".into()).or_default().push(old);
    place(&mut plan, new);
    let mut plan_other = plan.clone();
    let r = evaluate_plan(&state, &[], &plan);
    assert!(r.node_update.is_empty(), "the old copy keeps running until its replacement can be placed");
    // Unrelated names on the node still go through.
    plan_other.node_update.clear();
    place(&mut plan_other, other);
    let r = evaluate_plan(&state, &[], &plan_other);
    assert_eq!(placed(&r), ["other"]);
}

#[tokio::test]
async fn in_place_updates_pass_on_an_ineligible_node_but_new_placements_do_not() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    s.write(Command::PlanApply(PlanApply { allocs_upserted: vec![placement("existing", "n1", 100, 100)], ..Default::default() })).await;
    s.write(Command::NodeUpdateEligibility {
        node_id: "n1".into(),
        eligibility: SchedulingEligibility::Ineligible,
        event: None,
        evals: vec![],
        now: Timestamp::now(),
    })
    .await;
    let state = s.store.snapshot();
    let mut update = Plan::default();
    place(&mut update, placement("existing", "n1", 200, 100));
    assert!(evaluate_node_plan(&state, &[], &update, "n1").is_ok());
    place(&mut update, placement("new", "n1", 100, 100));
    assert_eq!(evaluate_node_plan(&state, &[], &update, "n1"), Err("node is not eligible".into()));
}

#[tokio::test]
async fn a_node_with_only_stops_always_passes() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    s.write(Command::PlanApply(PlanApply { allocs_upserted: vec![placement("a1", "n1", 100, 100)], ..Default::default() })).await;
    s.write(Command::NodeUpdateStatus { node_id: "n1".into(), status: NodeStatus::Down, event: None, updated_at: 0, evals: vec![] }).await;
    let mut plan = s.delivered("e1").await;
    let mut stop = placement("a1", "n1", 100, 100);
    stop.desired_description = "alloc is lost since its node is down".into();
    stop.client_status = ClientStatus::Lost;
    plan.node_update.insert("n1".into(), vec![stop]);
    let r = s.plans.submit(completed(&plan)).await.unwrap();
    assert_eq!(r.refresh_index, 0);
    assert!(r.alloc_index > 0);
    let snap = s.store.snapshot();
    let a = snap.alloc("a1").unwrap();
    assert!(a.server_terminal());
    assert_eq!(a.client_status, ClientStatus::Lost);
    assert_eq!(snap.eval("e1").unwrap().status, EvalStatus::Complete, "the eval update rides with the plan");
}

#[tokio::test]
async fn two_plans_racing_for_one_node_only_one_fits() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    // Each wants 3 of the node's 4 GHz; both were planned on the same snapshot.
    let mut p1 = s.delivered("e1").await;
    let mut p2 = s.delivered("e2").await;
    place(&mut p1, placement("a1", "n1", 3000, 100));
    place(&mut p2, placement("a2", "n1", 3000, 100));
    let (r1, r2) = tokio::join!(s.plans.submit(completed(&p1)), s.plans.submit(completed(&p2)));
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    let winners = [&r1, &r2].iter().filter(|r| r.refresh_index == 0).count();
    assert_eq!(winners, 1, "{r1:?} {r2:?}");
    let loser = if r1.refresh_index == 0 { &r2 } else { &r1 };
    assert!(placed(loser).is_empty());
    assert_eq!(s.allocs_on("n1"), 1);
}

#[tokio::test]
async fn a_plan_judged_while_the_previous_entry_is_written_counts_that_entry() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    let mut p1 = s.delivered("e1").await;
    let mut p2 = s.delivered("e2").await;
    place(&mut p1, placement("a1", "n1", 3000, 100));
    place(&mut p2, placement("a2", "n1", 3000, 100));
    // Hold p1's entry mid-write, then submit p2: it is judged against state + p1.
    let gate = s.consensus.gate.lock().await;
    let first = tokio::spawn({
        let plans = s.plans.clone();
        let sub = completed(&p1);
        async move { plans.submit(sub).await }
    });
    wait_until("the first apply to start", || s.consensus.started.load(Ordering::SeqCst) >= 1).await;
    let second = tokio::spawn({
        let plans = s.plans.clone();
        let sub = completed(&p2);
        async move { plans.submit(sub).await }
    });
    // p2 is refused without a write; its answer waits for p1's index.
    tokio::task::yield_now().await;
    drop(gate);
    let (r1, r2) = (first.await.unwrap().unwrap(), second.await.unwrap().unwrap());
    assert_eq!(placed(&r1), ["a1"]);
    assert!(placed(&r2).is_empty());
    assert!(r2.refresh_index >= r1.alloc_index, "the worker must plan again on a state that has a1");
    assert_eq!(s.allocs_on("n1"), 1);
}

#[tokio::test]
async fn a_partly_refused_plan_commits_the_rest_and_asks_for_a_refresh() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    s.node("n2", NodeStatus::Down).await;
    let mut plan = s.delivered("e1").await;
    place(&mut plan, placement("fits", "n1", 100, 100));
    place(&mut plan, placement("refused", "n2", 100, 100));
    let mut sub = completed(&plan);
    sub.new_evals.push(Evaluation {
        id: "blocked".into(),
        namespace: "default".into(),
        job_id: "job-e1".into(),
        status: EvalStatus::Blocked,
        ..Evaluation::default()
    });
    let r = s.plans.submit(sub).await.unwrap();
    assert_eq!(placed(&r), ["fits"]);
    assert!(r.refresh_index >= r.alloc_index && r.alloc_index > 0);
    let snap = s.store.snapshot();
    assert!(snap.alloc("fits").is_some() && snap.alloc("refused").is_none());
    assert_eq!(snap.eval("e1").unwrap().status, EvalStatus::Pending, "the eval update waits for the full plan");
    assert!(snap.eval("blocked").is_none());
}

#[tokio::test]
async fn all_at_once_plans_commit_everything_or_nothing() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    s.node("n2", NodeStatus::Ready).await;
    let mut plan = s.delivered("e1").await;
    plan.all_at_once = true;
    place(&mut plan, placement("a1", "n1", 100, 100));
    place(&mut plan, placement("too-big", "n2", 100, 100_000));
    let r = s.plans.submit(completed(&plan)).await.unwrap();
    assert!(placed(&r).is_empty() && r.refresh_index > 0);
    assert_eq!(s.allocs_on("n1"), 0);

    let mut plan = s.delivered("e2").await;
    plan.all_at_once = true;
    place(&mut plan, placement("a1", "n1", 100, 100));
    place(&mut plan, placement("a2", "n2", 100, 100));
    let r = s.plans.submit(completed(&plan)).await.unwrap();
    assert_eq!((placed(&r).len(), r.refresh_index), (2, 0));
}

#[tokio::test]
async fn a_plan_from_a_stale_delivery_is_refused() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    let mut plan = s.delivered("e1").await;
    place(&mut plan, placement("a1", "n1", 100, 100));
    let stale = plan.eval_token.clone();
    // The delivery is taken back (a nack, or its nack timeout) and delivered again.
    s.broker.nack("e1", &stale).unwrap();
    let again = s.broker.dequeue(Duration::ZERO).await.unwrap().expect("redelivered");
    assert_ne!(again.token, stale);
    assert_eq!(s.plans.submit(completed(&plan)).await.unwrap_err(), PlanError::Token(BrokerError::TokenMismatch));
    plan.eval_id = "never-delivered".into();
    assert_eq!(s.plans.submit(completed(&plan)).await.unwrap_err(), PlanError::Token(BrokerError::NotOutstanding));
    assert_eq!(s.allocs_on("n1"), 0);
    assert_eq!(s.store.snapshot().eval("e1").unwrap().status, EvalStatus::Pending);
}

#[tokio::test]
async fn plans_queued_during_a_write_share_the_next_entry_and_no_op_plans_still_write_their_eval() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    let mut first = s.delivered("first").await;
    place(&mut first, placement("a0", "n1", 10, 10));
    let mut rest = Vec::new();
    for i in 0..5 {
        let mut p = s.delivered(&format!("e{i}")).await;
        if i % 2 == 0 {
            place(&mut p, placement(&format!("a{}", i + 1), "n1", 10, 10));
        }
        rest.push(p);
    }
    let gate = s.consensus.gate.lock().await;
    let first = tokio::spawn({
        let plans = s.plans.clone();
        let sub = completed(&first);
        async move { plans.submit(sub).await }
    });
    wait_until("the first apply to start", || s.consensus.started.load(Ordering::SeqCst) >= 1).await;
    let waiting: Vec<_> = rest
        .iter()
        .map(|p| {
            let plans = s.plans.clone();
            let sub = completed(p);
            tokio::spawn(async move { plans.submit(sub).await })
        })
        .collect();
    // Let them all reach the applier before the first entry is released.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    drop(gate);
    first.await.unwrap().unwrap();
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().refresh_index, 0);
    }
    assert_eq!(*s.consensus.entries.lock().unwrap(), vec![1, 5], "five plans, one entry");
    let snap = s.store.snapshot();
    for i in 0..5 {
        assert_eq!(snap.eval(&format!("e{i}")).unwrap().status, EvalStatus::Complete);
    }
    assert_eq!(s.allocs_on("n1"), 4);
}

#[tokio::test]
async fn a_failed_write_fails_its_plans_and_sends_back_those_judged_against_it() {
    let s = setup();
    s.node("n1", NodeStatus::Ready).await;
    let mut p1 = s.delivered("e1").await;
    let mut p2 = s.delivered("e2").await;
    place(&mut p1, placement("a1", "n1", 100, 100));
    place(&mut p2, placement("a2", "n1", 100, 100));
    let gate = s.consensus.gate.lock().await;
    s.consensus.fail.store(true, Ordering::SeqCst);
    let first = tokio::spawn({
        let plans = s.plans.clone();
        let sub = completed(&p1);
        async move { plans.submit(sub).await }
    });
    wait_until("the first apply to start", || s.consensus.started.load(Ordering::SeqCst) >= 1).await;
    let second = tokio::spawn({
        let plans = s.plans.clone();
        let sub = completed(&p2);
        async move { plans.submit(sub).await }
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    drop(gate);
    assert_eq!(first.await.unwrap().unwrap_err(), PlanError::Apply(ApplyError::NoLeader));
    // p2 was judged assuming p1 would commit; it is sent back to be planned again, or
    // (if it arrived after p1 failed) its own write fails too. Either way nothing lands.
    s.consensus.fail.store(false, Ordering::SeqCst);
    match second.await.unwrap() {
        Ok(r) => assert!(placed(&r).is_empty() && r.refresh_index > 0, "{r:?}"),
        Err(e) => assert_eq!(e, PlanError::Apply(ApplyError::NoLeader)),
    }
    assert_eq!(s.allocs_on("n1"), 0);
    // The applier goes on.
    let r = s.plans.submit(completed(&p2)).await.unwrap();
    assert_eq!(placed(&r), ["a2"]);
}

#[test]
fn stops_keep_the_clients_status_unless_the_scheduler_marks_them_lost() {
    let mut a = placement("a1", "n1", 1, 1);
    a.client_status = ClientStatus::Running;
    a.desired_description = "alloc not needed".into();
    assert_eq!(stop_of(&a).client_status, None);
    a.client_status = ClientStatus::Lost;
    assert_eq!(stop_of(&a).client_status, Some(ClientStatus::Lost));
}
