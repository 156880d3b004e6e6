//! A drain through the whole leader in one process: drain endpoint → drainer
//! → node-drain evals → built-in schedulers → plan applier, with a stand-in
//! client that runs what it is given (reporting health at once) and stops
//! what it is told to. The event stream is the record that is checked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::job::MigrateStrategy;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Job, JobType, Timestamp};

use super::*;
use crate::endpoints::{DrainRequest, DrainSpec, JobRegisterOptions};
use crate::fsm::Command;
use crate::scheduler::BuiltinScheduler;
use crate::sim::{ready_node, start_leader};
use crate::state::Table;
use crate::test_support::eventually;
use crate::testing::{TestServer, job};

/// Every node's client: runs new allocs (healthy at once), finishes stopped ones.
fn spawn_clients(ts: &TestServer) -> tokio::task::JoinHandle<()> {
    let store = ts.store.clone();
    let consensus = ts.consensus.clone();
    tokio::spawn(async move {
        loop {
            let snap = store.snapshot();
            let mut updates = Vec::new();
            for a in snap.allocs() {
                let mut u = (**a).clone();
                if a.desired_status == DesiredStatus::Run && a.client_status == ClientStatus::Pending {
                    u.client_status = ClientStatus::Running;
                    u.deployment_status = Some(serde_json::json!({ "Healthy": true }));
                } else if a.desired_status != DesiredStatus::Run && !a.client_terminal() {
                    u.client_status = ClientStatus::Complete;
                } else {
                    continue;
                }
                u.job = None;
                updates.push(u);
            }
            if !updates.is_empty() {
                let _ = consensus.apply(Command::AllocClientUpdate { allocs: updates, evals: vec![], now: Timestamp::now() }).await;
            }
            store.wait_for_change(&[Table::Allocs], snap.index, Duration::from_secs(1)).await;
        }
    })
}

fn web(count: i64) -> Job {
    let mut j = job("web", count);
    j.task_groups[0].migrate = Some(MigrateStrategy { max_parallel: 1, ..MigrateStrategy::default() });
    j
}

fn system() -> Job {
    let mut j = job("logs", 1);
    j.job_type = JobType::System;
    j
}

fn healthy(a: &Allocation) -> bool {
    a.deployment_status.as_ref().and_then(|d| d.get("Healthy")).is_some_and(|h| h == true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_service_allocs_one_at_a_time_then_system_allocs_and_completes() {
    let ts = TestServer::new();
    for id in ["n1", "n2"] {
        ts.consensus.apply(Command::NodeRegister { node: ready_node(id), evals: vec![], now: Timestamp::now() }).await.unwrap();
    }
    let config = LeaderConfig { num_schedulers: 2, evals_in_flight: 4, ..LeaderConfig::default() };
    let (_leader, leader_task) = start_leader(&ts, Arc::new(BuiltinScheduler), config);
    let clients = spawn_clients(&ts);

    // Everything starts on n1.
    ts.endpoints.node_update_eligibility("n2", "ineligible").await.unwrap();
    ts.endpoints.job_register(system(), JobRegisterOptions::default()).await.unwrap();
    ts.endpoints.job_register(web(3), JobRegisterOptions::default()).await.unwrap();
    eventually(&ts, "3 web and 1 system alloc running healthy on n1", |s| {
        let live: Vec<_> = s.allocs_by_node("n1").filter(|a| !a.terminal() && healthy(a)).collect();
        live.len() == 4
    })
    .await;
    ts.endpoints.node_update_eligibility("n2", "eligible").await.unwrap();
    let start = eventually(&ts, "the system job placed on n2 too", |s| {
        s.allocs_by_node("n2").any(|a| a.job_id == "logs" && a.client_status == ClientStatus::Running)
    })
    .await;
    let mut events = ts.endpoints.events().unwrap().subscribe(start.index + 1);

    let req = DrainRequest { drain_spec: Some(DrainSpec { deadline: 0, ignore_system_jobs: false }), ..DrainRequest::default() };
    ts.endpoints.node_update_drain("n1", req).await.unwrap();
    let done = eventually(&ts, "the drain to complete", |s| s.node("n1").unwrap().drain_strategy.is_none()).await;

    let n1 = done.node("n1").unwrap();
    assert_eq!(n1.last_drain.as_ref().unwrap().status, "complete");
    assert_eq!(n1.scheduling_eligibility, nomad_proto::SchedulingEligibility::Ineligible);
    assert!(n1.events.last().unwrap().details.is_empty(), "finished before any deadline");
    assert!(done.allocs_by_node("n1").all(|a| a.client_terminal()), "nothing left on n1");
    let web_live: Vec<_> = done.allocs_by_job("default", "web").filter(|a| !a.terminal()).collect();
    assert_eq!(web_live.len(), 3);
    assert!(web_live.iter().all(|a| a.node_id == "n2" && a.client_status == ClientStatus::Running));
    assert!(
        done.evals().filter(|e| e.triggered_by == "node-drain").count() >= 4,
        "one node-drain eval per batch: 3 web batches and the system one"
    );

    // Replay what happened, index by index.
    let mut allocs: BTreeMap<String, Allocation> =
        start.allocs().map(|a| (a.id.clone(), Allocation { job: None, ..(**a).clone() })).collect();
    let originals: Vec<String> = start.allocs_by_node("n1").filter(|a| a.job_id == "web").map(|a| a.id.clone()).collect();
    let sys_on_n1 = start.allocs_by_node("n1").find(|a| a.job_id == "logs").unwrap().id.clone();
    let (mut stopped_at, mut last_web_gone, mut sys_marked) = (BTreeMap::new(), 0, 0);
    loop {
        let batch = events.next().await.unwrap();
        if batch.index <= start.index {
            continue; // subscribing past the newest batch replays that one first
        }
        for e in batch.events.iter().filter(|e| e.topic == "Allocation") {
            let a: Allocation = serde_json::from_value(e.payload["Allocation"].clone()).unwrap();
            allocs.insert(a.id.clone(), a);
        }
        // max_parallel = 1 of count 3: at least 2 healthy web allocs that are staying, at every index.
        let staying =
            allocs.values().filter(|a| a.job_id == "web" && !a.terminal() && healthy(a) && !a.desired_transition.should_migrate()).count();
        assert!(staying >= 2, "index {}: only {staying} web allocs serving", batch.index);
        for id in &originals {
            let a = &allocs[id];
            if a.desired_status == DesiredStatus::Stop {
                stopped_at.entry(id.clone()).or_insert(batch.index);
            }
            if a.client_terminal() {
                last_web_gone = last_web_gone.max(a.modify_index);
            }
        }
        if sys_marked == 0 && allocs[&sys_on_n1].desired_transition.should_migrate() {
            sys_marked = batch.index;
        }
        if batch.index >= done.index {
            break;
        }
    }
    for id in &originals {
        let replacement = allocs.values().find(|a| a.previous_allocation == *id).expect("every original has a replacement");
        assert_eq!(replacement.node_id, "n2");
        assert!(replacement.create_index <= stopped_at[id], "{id} was stopped before its replacement was placed");
    }
    assert!(sys_marked > last_web_gone, "system allocs drain only after the service allocs are gone");
    assert_eq!(allocs[&sys_on_n1].client_status, ClientStatus::Complete);
    clients.abort();
    leader_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_set_while_not_leading_is_finished_by_the_next_term() {
    let ts = TestServer::new();
    for id in ["n1", "n2"] {
        ts.consensus.apply(Command::NodeRegister { node: ready_node(id), evals: vec![], now: Timestamp::now() }).await.unwrap();
    }
    let config = LeaderConfig { num_schedulers: 1, evals_in_flight: 2, ..LeaderConfig::default() };
    let (_leader, leader_task) = start_leader(&ts, Arc::new(BuiltinScheduler), config);
    ts.endpoints.node_update_eligibility("n2", "ineligible").await.unwrap();
    ts.endpoints.job_register(web(2), JobRegisterOptions::default()).await.unwrap();
    eventually(&ts, "2 web allocs placed on n1", |s| s.allocs_by_node("n1").filter(|a| !a.terminal()).count() == 2).await;
    ts.endpoints.node_update_eligibility("n2", "eligible").await.unwrap();

    // The drain is set while this server does not lead (the endpoint would be refused, so it is
    // written directly): the term that starts next must find it in the state and finish it.
    ts.consensus.set_leader(false);
    let d = nomad_proto::node::DrainStrategy { force_deadline: Timestamp::now().add_nanos(-1), ..Default::default() };
    ts.store
        .write(ts.store.snapshot().index + 1, |tx| tx.update_node_drain("n1", Some(d), false, None, Timestamp::now()).map(|_| ()))
        .unwrap();

    // Leading again: the new term's drainer forces the (past-deadline) drain through.
    ts.consensus.set_leader(true);
    let clients = spawn_clients(&ts);
    let done = eventually(&ts, "the drain to complete", |s| s.node("n1").unwrap().drain_strategy.is_none()).await;
    let ev = done.node("n1").unwrap().events.last().unwrap().clone();
    assert_eq!(ev.details.get("deadline_reached").map(String::as_str), Some("true"));
    assert_eq!(done.allocs_by_job("default", "web").filter(|a| !a.terminal() && a.node_id == "n2").count(), 2);
    clients.abort();
    leader_task.abort();
}
