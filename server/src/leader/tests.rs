//! End to end in one process: endpoints → consensus → state → watcher →
//! broker → workers (stand-in scheduler) → plan applier → state.

use std::sync::Arc;

use nomad_proto::eval::trigger;
use nomad_proto::rpc::{NodeRegisterRequest, NodeUpdateStatusRequest};
use nomad_proto::{EvalStatus, Evaluation, NodeStatus, Timestamp};

use super::*;
use crate::consensus::Consensus;
use crate::endpoints::JobRegisterOptions;
use crate::fsm::Command;
use crate::sim::{FirstReadyNode, ready_node, start_leader};
use crate::state::State;
use crate::test_support::eventually;
use crate::testing::{TestServer, job, node};

fn config() -> LeaderConfig {
    LeaderConfig { num_schedulers: 2, evals_in_flight: 4, ..LeaderConfig::default() }
}

async fn register(ts: &TestServer, id: &str, count: i64) -> String {
    ts.endpoints.job_register(job(id, count), JobRegisterOptions::default()).await.unwrap().eval_id
}

fn live_allocs(s: &State, job: &str) -> usize {
    s.allocs_by_job("default", job).filter(|a| !a.terminal()).count()
}

fn eval_status(s: &State, id: &str) -> Option<EvalStatus> {
    s.eval(id).map(|e| e.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_a_job_places_its_allocs_and_completes_the_eval() {
    let ts = TestServer::new();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: Timestamp::now() }).await.unwrap();
    let (leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config());
    let eval_id = register(&ts, "web", 3).await;
    let s = eventually(&ts, "eval complete", |s| eval_status(s, &eval_id) == Some(EvalStatus::Complete)).await;
    assert_eq!(live_allocs(&s, "web"), 3, "the allocs are written with the eval update");
    for a in s.allocs_by_job("default", "web") {
        assert_eq!(a.node_id, "n1");
        assert_eq!(a.eval_id, eval_id);
        assert!(a.job.is_some(), "allocs get their job back from the plan entry");
    }
    assert_eq!(s.job_summary("default", "web").unwrap().summary["web"].starting, 3);
    eventually(&ts, "broker drained", |_| leader.broker().stats() == crate::broker::BrokerStats::default()).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eval_that_cannot_place_blocks_until_a_node_becomes_ready() {
    let ts = TestServer::new();
    let (leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config());
    let eval_id = register(&ts, "web", 2).await;
    let s = eventually(&ts, "eval complete", |s| eval_status(s, &eval_id) == Some(EvalStatus::Complete)).await;
    let done = s.eval(&eval_id).unwrap().clone();
    assert!(done.failed_tg_allocs.contains_key("web"));
    let blocked_id = done.blocked_eval.clone();
    assert_eq!(eval_status(&s, &blocked_id), Some(EvalStatus::Blocked));
    eventually(&ts, "blocked eval tracked", |_| leader.blocked().stats().captured == 1).await;

    // A node registers (initializing: no room yet), then its first heartbeat makes it ready.
    let n = node("n1");
    ts.endpoints.node_register(NodeRegisterRequest { node: n.clone(), region: String::new() }).await.unwrap();
    assert_eq!(eval_status(&ts.store.snapshot(), &blocked_id), Some(EvalStatus::Blocked));
    ts.endpoints
        .node_update_status(NodeUpdateStatusRequest {
            node_id: n.id.clone(),
            status: NodeStatus::Ready,
            secret_id: n.secret_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let s = eventually(&ts, "blocked eval re-run", |s| eval_status(s, &blocked_id) == Some(EvalStatus::Complete)).await;
    assert_eq!(s.eval(&blocked_id).unwrap().triggered_by, trigger::QUEUED_ALLOCS);
    assert_eq!(live_allocs(&s, "web"), 2);
    assert_eq!(leader.blocked().stats(), crate::broker::BlockedStats::default());
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_refused_again_and_again_fail_the_eval_and_leave_a_blocked_eval() {
    let ts = TestServer::new();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: Timestamp::now() }).await.unwrap();
    // The stand-in ignores room: 40 × 300 MiB never fit the node's 8 GiB, so every plan is refused.
    let (_leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config());
    let eval_id = register(&ts, "big", 40).await;
    let s = eventually(&ts, "eval failed", |s| eval_status(s, &eval_id) == Some(EvalStatus::Failed)).await;
    let failed = s.eval(&eval_id).unwrap();
    assert_eq!(failed.status_description, crate::worker::max_attempts_description(5));
    let blocked = s.eval(&failed.blocked_eval).expect("blocked eval created");
    assert_eq!((blocked.status, blocked.triggered_by.as_str()), (EvalStatus::Blocked, trigger::MAX_PLANS));
    assert_eq!(live_allocs(&s, "big"), 0);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evals_of_one_job_run_one_at_a_time_and_the_newest_wins() {
    let ts = TestServer::new();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: Timestamp::now() }).await.unwrap();
    let (leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config());
    let mut evals = Vec::new();
    for count in 1..=6 {
        evals.push(register(&ts, "web", count).await);
    }
    let s = eventually(&ts, "every eval settled", |s| evals.iter().all(|e| s.eval(e).is_some_and(|e| e.status.is_terminal()))).await;
    assert_eq!(live_allocs(&s, "web"), 6, "the last version's count");
    assert_eq!(eval_status(&s, evals.last().unwrap()), Some(EvalStatus::Complete));
    for e in &evals {
        let st = s.eval(e).unwrap();
        assert!(matches!(st.status, EvalStatus::Complete | EvalStatus::Canceled), "{st:?}");
        if st.status == EvalStatus::Canceled {
            assert_eq!(st.status_description, crate::broker::CANCELED_SUPERSEDED);
        }
    }
    eventually(&ts, "broker drained", |_| leader.broker().stats() == crate::broker::BrokerStats::default()).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_leadership_stops_everything_and_winning_it_again_restores_pending_evals() {
    let ts = TestServer::new();
    ts.consensus.apply(Command::NodeRegister { node: ready_node("n1"), evals: vec![], now: Timestamp::now() }).await.unwrap();
    let heartbeats = ts.endpoints.heartbeats().clone();
    let (leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config());
    eventually(&ts, "leading", |_| leader.broker().enabled() && heartbeats.tracked() == 1).await;

    ts.consensus.set_leader(false);
    eventually(&ts, "stepped down", |_| !leader.broker().enabled() && heartbeats.tracked() == 0).await;
    // A job and its eval arrive through replication while this server follows.
    let mut j = job("web", 2);
    j.canonicalize();
    let e = Evaluation::for_job(&j, trigger::JOB_REGISTER, Timestamp::now());
    let index = ts.store.snapshot().index + 1;
    crate::fsm::Fsm::apply(
        &crate::fsm::ServerFsm::new(ts.store.clone()),
        index,
        Command::JobRegister { job: j, eval: Some(e.clone()), now: Timestamp::now() },
    );
    assert_eq!(leader.broker().stats(), crate::broker::BrokerStats::default(), "a follower queues nothing");

    ts.consensus.set_leader(true);
    let s = eventually(&ts, "restored eval ran", |s| eval_status(s, &e.id) == Some(EvalStatus::Complete)).await;
    assert_eq!(live_allocs(&s, "web"), 2);
    // Timers are re-armed as leadership starts, in no fixed order with the first eval's run.
    eventually(&ts, "heartbeat timers re-armed for the live node", |_| heartbeats.tracked() == 1).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eval_with_nothing_to_do_still_completes() {
    let ts = TestServer::new();
    let (_leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config());
    let eval_id = register(&ts, "idle", 0).await;
    let s = eventually(&ts, "eval complete", |s| eval_status(s, &eval_id) == Some(EvalStatus::Complete)).await;
    assert!(s.eval(&eval_id).unwrap().failed_tg_allocs.is_empty());
    assert!(s.eval(&eval_id).unwrap().snapshot_index > 0);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_evals_fill_nodes_without_overcommitting_them() {
    let ts = TestServer::new();
    for id in ["n1", "n2"] {
        ts.consensus.apply(Command::NodeRegister { node: ready_node(id), evals: vec![], now: Timestamp::now() }).await.unwrap();
    }
    let (_leader, task) =
        start_leader(&ts, Arc::new(crate::sim::RandomFit::new(8)), LeaderConfig { num_schedulers: 2, evals_in_flight: 8, ..config() });
    // 6 jobs × 12 allocs × 300 MiB: 72 allocs where 2 × 27 fit. Workers plan on stale
    // snapshots and race at the applier; only the applier's re-check keeps nodes from filling twice.
    let mut evals = Vec::new();
    for i in 0..6 {
        evals.push(register(&ts, &format!("job-{i}"), 12).await);
    }
    let s = eventually(&ts, "every eval settled", |s| evals.iter().all(|e| s.eval(e).is_some_and(|e| e.status.is_terminal()))).await;
    let placed: usize = (0..6).map(|i| live_allocs(&s, &format!("job-{i}"))).sum();
    assert!((27..=54).contains(&placed), "{placed} placed");
    for id in ["n1", "n2"] {
        let node = s.node(id).unwrap();
        let held = s.allocs_by_node(id).filter(|a| !a.terminal()).map(|a| crate::plan_apply::alloc_usage(a).memory_mb).sum::<i64>();
        assert!(held <= crate::plan_apply::node_capacity(node).memory_mb, "{id} holds {held} MiB");
    }
    task.abort();
}
