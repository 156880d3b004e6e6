//! Eval broker, blocked evals and the change watcher.
//!
//! Timers run on tokio's paused clock; nothing sleeps to synchronise.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::eval::trigger;
use nomad_proto::{Allocation, ClientStatus, EvalStatus, Evaluation, NamespacedId, NodeStatus, SchedulingEligibility, Timestamp};

use super::failed::failed_eval_updates;
use super::*;
use crate::consensus::{Consensus, LocalConsensus};
use crate::fsm::Command;
use crate::state::StateStore;
use crate::test_support::wait_until;

fn eval(id: &str, job: &str, priority: i64, index: u64) -> Arc<Evaluation> {
    Arc::new(Evaluation {
        id: id.into(),
        namespace: "default".into(),
        job_id: job.into(),
        priority,
        create_index: index,
        modify_index: index,
        ..Evaluation::default()
    })
}

fn broker() -> Arc<EvalBroker> {
    let b = Arc::new(EvalBroker::new(BrokerConfig::default()));
    b.set_enabled(true);
    b
}

async fn next(b: &EvalBroker) -> Delivery {
    b.dequeue(Duration::ZERO).await.unwrap().expect("an eval is ready")
}

async fn nothing_ready(b: &EvalBroker) -> bool {
    b.dequeue(Duration::ZERO).await.unwrap().is_none()
}

#[tokio::test]
async fn evals_dequeue_by_priority_then_age() {
    let b = broker();
    b.enqueue(eval("low", "a", 20, 5));
    b.enqueue(eval("high-new", "b", 80, 9));
    b.enqueue(eval("high-old", "c", 80, 7));
    b.enqueue(eval("mid", "d", 50, 1));
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(next(&b).await.eval.id.clone());
    }
    assert_eq!(order, ["high-old", "high-new", "mid", "low"]);
    assert!(nothing_ready(&b).await);
}

#[tokio::test]
async fn one_eval_per_job_in_flight_and_waiting_ones_merge_on_ack() {
    let b = broker();
    b.enqueue(eval("e1", "web", 50, 1));
    let d1 = next(&b).await;
    b.enqueue(eval("e2", "web", 50, 2));
    b.enqueue(eval("e3", "web", 50, 3));
    b.enqueue(eval("other", "db", 50, 4));
    // Only the other job's eval may run while e1 is in flight.
    assert_eq!(next(&b).await.eval.id, "other");
    assert!(nothing_ready(&b).await);
    assert_eq!(b.stats().pending, 2);

    b.ack("e1", &d1.token).unwrap();
    // The newest waiting eval runs; the older one is superseded.
    assert_eq!(next(&b).await.eval.id, "e3");
    let canceled = b.take_cancelable(10).await.unwrap();
    assert_eq!(canceled.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["e2"]);
    assert_eq!(b.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn ack_and_nack_need_the_delivery_token_and_nack_redelivers_after_a_delay() {
    let b = broker();
    let timers = tokio::spawn({
        let b = b.clone();
        async move { b.run_timers().await }
    });
    b.enqueue(eval("e1", "web", 50, 1));
    let d1 = next(&b).await;
    assert_eq!(b.outstanding("e1"), Some(d1.token.clone()));
    assert_eq!(b.ack("e1", "forged"), Err(BrokerError::TokenMismatch));
    assert_eq!(b.nack("nope", &d1.token), Err(BrokerError::NotOutstanding));

    b.nack("e1", &d1.token).unwrap();
    assert_eq!(b.ack("e1", &d1.token), Err(BrokerError::NotOutstanding), "a nacked delivery is over");
    // First redelivery waits the initial nack delay (1s).
    assert!(nothing_ready(&b).await);
    let d2 = b.dequeue(Duration::from_secs(2)).await.unwrap().expect("redelivered");
    assert_eq!(d2.eval.id, "e1");
    assert_ne!(d2.token, d1.token);
    // The second nack waits the subsequent delay (20s).
    b.nack("e1", &d2.token).unwrap();
    assert!(b.dequeue(Duration::from_secs(19)).await.unwrap().is_none());
    let d3 = b.dequeue(Duration::from_secs(2)).await.unwrap().expect("redelivered again");
    b.ack("e1", &d3.token).unwrap();
    assert_eq!(b.stats(), BrokerStats::default());
    timers.abort();
}

#[tokio::test(start_paused = true)]
async fn the_delivery_limit_sends_an_eval_to_the_failed_queue() {
    let b = broker();
    let timers = tokio::spawn({
        let b = b.clone();
        async move { b.run_timers().await }
    });
    b.enqueue(eval("e1", "web", 50, 1));
    b.enqueue(eval("e2", "web", 50, 2));
    for _ in 0..3 {
        let d = b.dequeue(Duration::from_secs(60)).await.unwrap().expect("delivered");
        assert_eq!(d.eval.id, "e1");
        b.nack("e1", &d.token).unwrap();
    }
    let failed = b.dequeue_failed().await.unwrap();
    assert_eq!(failed.eval.id, "e1");
    // The job's next eval waits until the failed one is dealt with.
    assert!(b.dequeue(Duration::from_secs(30)).await.unwrap().is_none());
    b.ack("e1", &failed.token).unwrap();
    assert_eq!(next(&b).await.eval.id, "e2");
    timers.abort();
}

#[test]
fn a_failed_eval_gets_a_delayed_follow_up() {
    let e = eval("e1", "web", 70, 4);
    let now = Timestamp::from_unix_nanos(1_000_000_000_000);
    let updates = failed_eval_updates(&e, 3, Duration::from_secs(90), now);
    let (failed, followup) = (&updates[0], &updates[1]);
    assert_eq!(failed.status, EvalStatus::Failed);
    assert_eq!(failed.status_description, "evaluation reached delivery limit (3)");
    assert_eq!(failed.next_eval, followup.id);
    assert_eq!(followup.status, EvalStatus::Pending);
    assert_eq!(followup.triggered_by, trigger::FAILED_FOLLOW_UP);
    assert_eq!(followup.previous_eval, "e1");
    assert_eq!((followup.priority, followup.job_id.as_str()), (70, "web"));
    assert_eq!(followup.wait_until, now.plus(Duration::from_secs(90)));
}

#[tokio::test]
async fn the_reaper_writes_the_failed_eval_and_its_follow_up_then_acks() {
    let store = Arc::new(StateStore::new());
    let consensus = Arc::new(LocalConsensus::new(store.clone()));
    let config = BrokerConfig { delivery_limit: 1, ..BrokerConfig::default() };
    let b = Arc::new(EvalBroker::new(config));
    b.set_enabled(true);
    let (writer, _w) = EvalWriter::spawn(consensus.clone());
    let reaper = tokio::spawn(reap_failed_evals(b.clone(), writer));
    let e = eval("e1", "web", 50, 1);
    consensus.apply(Command::EvalUpsert { evals: vec![(*e).clone()] }).await.unwrap();
    b.enqueue(e);
    let d = next(&b).await;
    b.nack("e1", &d.token).unwrap();
    wait_until("e1 to be failed", || store.snapshot().eval("e1").is_some_and(|e| e.status == EvalStatus::Failed)).await;
    let snap = store.snapshot();
    let failed = snap.eval("e1").unwrap();
    let followup = snap.eval(&failed.next_eval).expect("follow-up stored");
    assert_eq!(followup.triggered_by, trigger::FAILED_FOLLOW_UP);
    assert!(followup.wait_until > Timestamp::now().plus(Duration::from_secs(50)));
    wait_until("e1 to be acked", || b.outstanding("e1").is_none()).await;
    reaper.abort();
}

#[tokio::test(start_paused = true)]
async fn an_eval_waits_until_its_wait_until() {
    let b = broker();
    let timers = tokio::spawn({
        let b = b.clone();
        async move { b.run_timers().await }
    });
    let mut e = (*eval("later", "web", 50, 1)).clone();
    e.wait_until = Timestamp::now().plus(Duration::from_secs(30));
    b.enqueue(Arc::new(e));
    b.enqueue(eval("now", "db", 50, 2));
    assert_eq!(next(&b).await.eval.id, "now");
    assert_eq!(b.stats().delayed, 1);
    assert!(b.dequeue(Duration::from_secs(29)).await.unwrap().is_none());
    let d = b.dequeue(Duration::from_secs(2)).await.unwrap().expect("due");
    assert_eq!(d.eval.id, "later");
    timers.abort();
}

#[tokio::test(start_paused = true)]
async fn an_unacked_delivery_is_taken_back_after_the_nack_timeout() {
    let b = broker();
    let timers = tokio::spawn({
        let b = b.clone();
        async move { b.run_timers().await }
    });
    b.enqueue(eval("e1", "web", 50, 1));
    let d1 = next(&b).await;
    // Progress resets the timer.
    tokio::time::sleep(Duration::from_secs(50)).await;
    b.outstanding_reset("e1", &d1.token).unwrap();
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(b.outstanding("e1"), Some(d1.token.clone()), "reset gave it a full timeout again");
    // A paused timer (plan queued at the applier) never fires.
    b.pause_nack_timeout("e1", &d1.token).unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(b.outstanding("e1"), Some(d1.token.clone()));
    b.resume_nack_timeout("e1", &d1.token).unwrap();
    // Timed out: redelivered (after the 1s nack delay) with a new token; the old one is refused.
    let d2 = b.dequeue(Duration::from_secs(62)).await.unwrap().expect("redelivered");
    assert_eq!(d2.eval.id, "e1");
    assert_eq!(b.ack("e1", &d1.token), Err(BrokerError::TokenMismatch));
    b.ack("e1", &d2.token).unwrap();
    timers.abort();
}

#[tokio::test]
async fn disabling_drops_everything_and_wakes_waiting_workers() {
    let b = broker();
    b.enqueue(eval("e1", "web", 50, 1));
    b.enqueue(eval("e2", "db", 50, 2));
    let d = next(&b).await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.dequeue(Duration::ZERO).await.unwrap();
            b.dequeue(Duration::from_secs(3600)).await
        }
    });
    wait_until("the worker to take the ready eval", || b.stats().ready == 0).await;
    b.set_enabled(false);
    assert_eq!(waiting.await.unwrap().unwrap_err(), BrokerError::Disabled);
    assert_eq!(b.stats(), BrokerStats::default());
    assert_eq!(b.ack("e1", &d.token), Err(BrokerError::NotOutstanding));
    b.enqueue(eval("e3", "x", 50, 3));
    assert_eq!(b.stats(), BrokerStats::default(), "a disabled broker takes nothing");
    b.set_enabled(true);
    b.enqueue(eval("e1", "web", 50, 1));
    assert_eq!(next(&b).await.eval.id, "e1", "forgotten evals can come back after re-enabling");
}

// ---- blocked evals ----

fn blocked(id: &str, job: &str, index: u64, eligible: &[(&str, bool)], escaped: bool) -> Arc<Evaluation> {
    let mut e = (*eval(id, job, 50, index)).clone();
    e.status = EvalStatus::Blocked;
    e.snapshot_index = index;
    e.escaped_computed_class = escaped;
    e.class_eligibility = eligible.iter().map(|(c, ok)| (c.to_string(), *ok)).collect();
    Arc::new(e)
}

fn tracker() -> BlockedEvals {
    let t = BlockedEvals::new();
    t.set_enabled(true);
    t
}

#[test]
fn one_blocked_eval_per_job_the_newer_wins() {
    let t = tracker();
    assert!(t.block(blocked("b1", "web", 10, &[], false)).is_empty());
    let fx = t.block(blocked("b2", "web", 12, &[], false));
    assert_eq!(fx.cancel.len(), 1);
    assert_eq!(fx.cancel[0].0.id, "b1");
    assert_eq!(fx.cancel[0].1, "existing blocked evaluation exists for job \"web\"");
    assert_eq!(t.tracked(&NamespacedId::new("default", "web")).as_deref(), Some("b2"));
    // An older one arriving late is the one canceled.
    let fx = t.block(blocked("b0", "web", 5, &[], false));
    assert_eq!(fx.cancel[0].0.id, "b0");
    assert_eq!(t.stats(), BlockedStats { captured: 1, escaped: 0 });
}

#[test]
fn unblocking_follows_class_eligibility_and_escaped_evals_always_go() {
    let t = tracker();
    t.block(blocked("wants-a", "j1", 10, &[("class-a", true), ("class-b", false)], false));
    t.block(blocked("never-saw-c", "j2", 10, &[("class-a", false), ("class-b", false)], false));
    t.block(blocked("escaped", "j3", 10, &[("class-b", false)], true));
    let ids = |v: Vec<Arc<Evaluation>>| {
        let mut ids: Vec<String> = v.iter().map(|e| e.id.clone()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(t.unblock("class-b", 20)), ["escaped"]);
    assert_eq!(ids(t.unblock("class-a", 21)), ["wants-a"]);
    assert_eq!(ids(t.unblock("class-c", 22)), ["never-saw-c"]);
    assert_eq!(t.stats(), BlockedStats::default());
}

#[test]
fn capacity_seen_after_the_schedulers_snapshot_unblocks_at_once() {
    let t = tracker();
    assert!(t.unblock("class-a", 15).is_empty());
    let fx = t.block(blocked("stale", "web", 10, &[("class-a", true)], false));
    assert_eq!(fx.unblock.len(), 1, "the scheduler ran before capacity appeared at 15");
    let fx = t.block(blocked("fresh", "db", 20, &[("class-a", true)], false));
    assert!(fx.unblock.is_empty());
    let fx = t.block(blocked("ineligible", "x", 10, &[("class-a", false)], false));
    assert!(fx.unblock.is_empty(), "capacity in a class it cannot use does not count");
}

#[test]
fn a_successful_later_eval_untracks_the_jobs_blocked_eval() {
    let t = tracker();
    t.block(blocked("b1", "web", 10, &[], false));
    let job = NamespacedId::new("default", "web");
    assert!(t.untrack(&job, 10).is_none(), "an eval that completed before the blocked eval existed says nothing");
    assert_eq!(t.untrack(&job, 11).unwrap().id, "b1");
    assert!(t.tracked(&job).is_none());
}

// ---- the change watcher: state changes → broker and tracker ----

struct Harness {
    store: Arc<StateStore>,
    consensus: Arc<LocalConsensus>,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    watcher: ChangeWatcher,
}

fn harness() -> Harness {
    let store = Arc::new(StateStore::new());
    let consensus = Arc::new(LocalConsensus::new(store.clone()));
    let broker = broker();
    let blocked = Arc::new(tracker());
    let (writer, _task) = EvalWriter::spawn(consensus.clone());
    let watcher = ChangeWatcher::new(store.clone(), broker.clone(), blocked.clone(), writer);
    Harness { store, consensus, broker, blocked, watcher }
}

impl Harness {
    async fn apply(&self, cmd: Command) -> u64 {
        self.consensus.apply(cmd).await.unwrap()
    }

    /// Applies `cmd` and hands the change to the watcher.
    async fn step(&self, cmd: Command) {
        let before = self.store.snapshot();
        self.apply(cmd).await;
        self.watcher.apply_changes(&before, &self.store.snapshot());
    }

    /// Waits for the watcher's own writes (unblocks, cancels) and feeds them back to it.
    async fn settle(&self, mut done: impl FnMut(&crate::state::State) -> bool) {
        let mut seen = self.store.snapshot();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(&self.store.snapshot()) {
            assert!(tokio::time::Instant::now() < deadline, "state never settled");
            self.store.wait_for_change(&[crate::state::Table::Evals], seen.index, Duration::from_millis(100)).await;
            let now = self.store.snapshot();
            self.watcher.apply_changes(&seen, &now);
            seen = now;
        }
    }
}

fn stored_eval(id: &str, job: &str, status: EvalStatus) -> Evaluation {
    Evaluation { id: id.into(), namespace: "default".into(), job_id: job.into(), status, ..Evaluation::default() }
}

#[tokio::test]
async fn restore_on_enable_loads_pending_and_blocked_evals_only() {
    let h = harness();
    h.apply(Command::EvalUpsert {
        evals: vec![
            stored_eval("p1", "web", EvalStatus::Pending),
            stored_eval("b1", "db", EvalStatus::Blocked),
            stored_eval("c1", "old", EvalStatus::Complete),
            stored_eval("f1", "bad", EvalStatus::Failed),
        ],
    })
    .await;
    h.watcher.restore(&h.store.snapshot());
    assert_eq!(next(&h.broker).await.eval.id, "p1");
    assert!(nothing_ready(&h.broker).await);
    assert_eq!(h.blocked.tracked(&NamespacedId::new("default", "db")).as_deref(), Some("b1"));
}

#[tokio::test]
async fn new_pending_evals_are_enqueued_and_blocked_ones_tracked() {
    let h = harness();
    h.step(Command::EvalUpsert {
        evals: vec![stored_eval("p1", "web", EvalStatus::Pending), stored_eval("b1", "db", EvalStatus::Blocked)],
    })
    .await;
    assert_eq!(next(&h.broker).await.eval.id, "p1");
    assert_eq!(h.blocked.stats().captured, 1);
    // A later complete eval with everything placed cancels the job's blocked eval.
    h.step(Command::EvalUpsert { evals: vec![stored_eval("c2", "db", EvalStatus::Complete)] }).await;
    h.settle(|s| s.eval("b1").is_some_and(|e| e.status == EvalStatus::Canceled)).await;
    assert!(h.store.snapshot().eval("b1").unwrap().status_description.contains("c2"));
}

#[tokio::test]
async fn a_node_becoming_ready_unblocks_and_requeues_the_blocked_eval() {
    let h = harness();
    let mut node = crate::testing::node("n1");
    node.status = NodeStatus::Initializing;
    h.step(Command::NodeRegister { node: node.clone(), evals: vec![], now: Timestamp::now() }).await;
    h.step(Command::EvalUpsert { evals: vec![stored_eval("b1", "web", EvalStatus::Blocked)] }).await;
    assert_eq!(h.blocked.stats().captured, 1, "an initializing node offers no room");

    h.step(Command::NodeUpdateStatus { node_id: "n1".into(), status: NodeStatus::Ready, event: None, updated_at: 0, evals: vec![] }).await;
    h.settle(|s| s.eval("b1").is_some_and(|e| e.status == EvalStatus::Pending)).await;
    let e = h.store.snapshot().eval("b1").unwrap().clone();
    assert_eq!(e.triggered_by, trigger::QUEUED_ALLOCS);
    assert_eq!(next(&h.broker).await.eval.id, "b1", "the unblocked eval runs again");
    assert_eq!(h.blocked.stats(), BlockedStats::default());
}

#[tokio::test]
async fn a_freed_csi_claim_unblocks_the_namespaces_blocked_evals() {
    use nomad_proto::csi::{CsiVolume, CsiVolumeAccessMode, CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState};
    let h = harness();
    let vol = CsiVolume { id: "vol".into(), namespace: "default".into(), plugin_id: "p".into(), ..CsiVolume::default() };
    h.step(Command::CsiVolumeRegister { volumes: vec![vol] }).await;
    let claim = CsiVolumeClaim {
        allocation_id: "a1".into(),
        node_id: "n1".into(),
        mode: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        state: CsiVolumeClaimState::NodeDetached,
        ..CsiVolumeClaim::default()
    };
    // A release in progress (a past claim) is held, not freed.
    h.step(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim: claim.clone() }).await;
    h.step(Command::EvalUpsert { evals: vec![stored_eval("b1", "web", EvalStatus::Blocked)] }).await;
    let mut other_ns = stored_eval("b2", "db", EvalStatus::Blocked);
    other_ns.namespace = "other".into();
    h.blocked.block(Arc::new(other_ns));
    assert_eq!(h.blocked.stats().captured, 2);

    let free = CsiVolumeClaim { state: CsiVolumeClaimState::ReadyToFree, ..claim };
    h.step(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim: free }).await;
    h.settle(|s| s.eval("b1").is_some_and(|e| e.status == EvalStatus::Pending)).await;
    assert_eq!(next(&h.broker).await.eval.id, "b1");
    assert_eq!(h.blocked.tracked(&NamespacedId::new("other", "db")).as_deref(), Some("b2"), "another namespace stays blocked");
    // An eval blocked from a snapshot older than the release goes at once.
    let freed_at = h.store.snapshot().csi_volume("default", "vol").unwrap().modify_index;
    let mut stale = stored_eval("b3", "api", EvalStatus::Blocked);
    stale.snapshot_index = freed_at - 1;
    assert_eq!(h.blocked.block(Arc::new(stale)).unblock.len(), 1);
    let mut fresh = stored_eval("b4", "api2", EvalStatus::Blocked);
    fresh.snapshot_index = freed_at;
    assert!(h.blocked.block(Arc::new(fresh)).unblock.is_empty());
}

#[tokio::test]
async fn an_ineligible_node_does_not_unblock_until_it_becomes_eligible() {
    let h = harness();
    h.step(Command::EvalUpsert { evals: vec![stored_eval("b1", "web", EvalStatus::Blocked)] }).await;
    let mut node = crate::sim::ready_node("n1");
    node.scheduling_eligibility = SchedulingEligibility::Ineligible;
    h.step(Command::NodeRegister { node, evals: vec![], now: Timestamp::now() }).await;
    assert_eq!(h.blocked.stats().captured, 1);
    h.step(Command::NodeUpdateEligibility {
        node_id: "n1".into(),
        eligibility: SchedulingEligibility::Eligible,
        event: None,
        evals: vec![],
        now: Timestamp::now(),
    })
    .await;
    h.settle(|s| s.eval("b1").is_some_and(|e| e.status == EvalStatus::Pending)).await;
}

#[tokio::test]
async fn allocs_finishing_on_a_node_unblock() {
    let h = harness();
    h.step(Command::NodeRegister { node: crate::sim::ready_node("n1"), evals: vec![], now: Timestamp::now() }).await;
    let alloc = Allocation {
        id: "a1".into(),
        namespace: "default".into(),
        job_id: "old".into(),
        node_id: "n1".into(),
        task_group: "g".into(),
        ..Allocation::default()
    };
    h.step(Command::PlanApply(crate::fsm::PlanApply { allocs_upserted: vec![alloc.clone()], ..Default::default() })).await;
    // Blocked after the scheduler saw the node and its alloc.
    let mut b1 = stored_eval("b1", "web", EvalStatus::Blocked);
    b1.snapshot_index = h.store.snapshot().index;
    h.step(Command::EvalUpsert { evals: vec![b1] }).await;
    assert_eq!(h.blocked.stats().captured, 1);
    // A running update frees nothing.
    let running = Allocation { client_status: ClientStatus::Running, ..alloc.clone() };
    h.step(Command::AllocClientUpdate { allocs: vec![running], evals: vec![], now: Timestamp::now() }).await;
    assert_eq!(h.blocked.stats().captured, 1);
    let done = Allocation { client_status: ClientStatus::Complete, ..alloc };
    h.step(Command::AllocClientUpdate { allocs: vec![done], evals: vec![], now: Timestamp::now() }).await;
    h.settle(|s| s.eval("b1").is_some_and(|e| e.status == EvalStatus::Pending)).await;
}
