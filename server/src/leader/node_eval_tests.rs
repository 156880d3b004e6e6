//! Node evals end to end in one process: a node registers, heartbeats or
//! changes through the real endpoints, and the built-in schedulers decide
//! what lands on it (reference: nomad-node-lifecycle.md §5).

use std::sync::Arc;

use nomad_proto::rpc::{NodeRegisterRequest, NodeUpdateStatusRequest};
use nomad_proto::{Constraint, EvalStatus, Job, JobType, Node, NodeStatus};

use super::*;
use crate::endpoints::JobRegisterOptions;
use crate::scheduler::BuiltinScheduler;
use crate::sim::start_leader;
use crate::state::State;
use crate::test_support::eventually;
use crate::testing::{TestServer, job, node};

/// Every eval written so far is done (complete, failed, canceled or parked as blocked).
fn settled(s: &State) -> bool {
    s.evals().all(|e| e.status != EvalStatus::Pending)
}

fn system_job(namespace: &str, id: &str, dcs: &[&str]) -> Job {
    let mut j = job(id, 1);
    j.namespace = namespace.into();
    j.job_type = JobType::System;
    j.datacenters = dcs.iter().map(|d| d.to_string()).collect();
    j
}

fn leader(ts: &TestServer) -> tokio::task::JoinHandle<()> {
    let config = LeaderConfig { num_schedulers: 1, evals_in_flight: 2, ..LeaderConfig::default() };
    start_leader(ts, Arc::new(BuiltinScheduler), config).1
}

/// Registers `n` and sends its first heartbeat (initializing → ready).
async fn join(ts: &TestServer, n: &Node) {
    ts.endpoints.node_register(NodeRegisterRequest { node: n.clone(), region: String::new() }).await.unwrap();
    heartbeat(ts, n).await;
}

async fn heartbeat(ts: &TestServer, n: &Node) -> u64 {
    let req =
        NodeUpdateStatusRequest { node_id: n.id.clone(), status: NodeStatus::Ready, secret_id: n.secret_id.clone(), ..Default::default() };
    ts.endpoints.node_update_status(req).await.unwrap().index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_job_in_dc1_gets_no_eval_and_no_alloc_on_a_dc2_node() {
    let ts = TestServer::new();
    let task = leader(&ts);
    ts.endpoints.job_register(system_job("default", "logs", &["dc1"]), JobRegisterOptions::default()).await.unwrap();
    let mut dc2 = node("far");
    dc2.datacenter = "dc2".into();
    join(&ts, &dc2).await;
    let near = node("near");
    join(&ts, &near).await;
    let s = eventually(&ts, "the system job placed in dc1 and every eval settled", |s| {
        settled(s) && s.allocs_by_job("default", "logs").any(|a| a.node_id == "near")
    })
    .await;
    assert!(s.evals().all(|e| e.node_id != "far"), "no node eval for the dc2 node");
    assert_eq!(s.allocs_by_node("far").count(), 0);

    // Re-evaluating the job, or the node, places nothing there either.
    ts.endpoints.job_register(system_job("default", "logs", &["dc1"]), JobRegisterOptions::default()).await.unwrap();
    let forced = ts.endpoints.node_evaluate("far").await.unwrap();
    assert!(forced.eval_ids.is_empty(), "nothing to evaluate on the dc2 node");
    let s = eventually(&ts, "evals settled", settled).await;
    assert_eq!(s.allocs_by_node("far").count(), 0);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_named_system_jobs_in_two_namespaces_both_land_on_a_new_node() {
    let ts = TestServer::new();
    let task = leader(&ts);
    ts.endpoints.namespace_upsert(nomad_proto::Namespace { name: "prod".into(), ..Default::default() }).await.unwrap();
    for ns in ["default", "prod"] {
        ts.endpoints.job_register(system_job(ns, "logs", &["dc*"]), JobRegisterOptions::default()).await.unwrap();
    }
    eventually(&ts, "both job evals settled", settled).await;
    let n = node("n1");
    join(&ts, &n).await;
    let s = eventually(&ts, "an alloc of each job on n1", |s| {
        ["default", "prod"].iter().all(|ns| s.allocs_by_job(ns, "logs").any(|a| a.node_id == "n1" && !a.terminal()))
    })
    .await;
    let mut node_evals: Vec<&str> = s.evals().filter(|e| e.node_id == "n1").map(|e| e.namespace.as_str()).collect();
    node_evals.sort();
    assert_eq!(node_evals, ["default", "prod"], "one node eval per namespace, not deduplicated by job ID alone");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_nodes_meta_so_a_constraint_holds_places_the_system_job() {
    let ts = TestServer::new();
    let task = leader(&ts);
    let mut j = system_job("default", "rack-agent", &["dc1"]);
    j.constraints.push(Constraint { l_target: "${meta.rack}".into(), r_target: "r1".into(), operand: "=".into() });
    ts.endpoints.job_register(j, JobRegisterOptions::default()).await.unwrap();
    let mut n = node("n1");
    join(&ts, &n).await;
    let s = eventually(&ts, "the node's evals settled", settled).await;
    assert!(s.evals().any(|e| e.node_id == "n1" && e.job_id == "rack-agent"), "the new node was evaluated");
    assert_eq!(s.allocs_by_node("n1").count(), 0, "the constraint does not hold yet");

    // The same registration again changes nothing feasibility reads: no eval.
    let r = ts.endpoints.node_register(NodeRegisterRequest { node: n.clone(), region: String::new() }).await.unwrap();
    assert!(r.eval_ids.is_empty());

    n.meta.insert("rack".into(), "r1".into());
    let r = ts.endpoints.node_register(NodeRegisterRequest { node: n.clone(), region: String::new() }).await.unwrap();
    assert_eq!(r.eval_ids.len(), 1, "meta changed: one node eval for the system job");
    let s = eventually(&ts, "the system job placed", |s| s.allocs_by_node("n1").any(|a| a.job_id == "rack-agent" && !a.terminal())).await;
    assert_eq!(s.node("n1").unwrap().meta.get("rack").map(String::as_str), Some("r1"));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_heartbeat_writes_no_raft_entry_and_emits_no_event() {
    let ts = TestServer::new();
    let task = leader(&ts);
    let n = node("n1");
    join(&ts, &n).await;
    // The new leader's own first write (the keyring's root key) lands too, whenever it comes.
    let before = eventually(&ts, "evals settled and the root key written", |s| settled(s) && s.active_root_key().is_some()).await;
    let mut events = ts.endpoints.events().unwrap().subscribe(before.index + 1);
    for _ in 0..3 {
        assert_eq!(heartbeat(&ts, &n).await, 0, "no write index");
    }
    assert_eq!(ts.store.snapshot().index, before.index, "no Raft entry");
    // The next batch on the stream is the next write, not anything from the heartbeats.
    let marker = ts.endpoints.job_register(job("marker", 1), JobRegisterOptions::default()).await.unwrap();
    let mut batch = events.next().await.unwrap();
    // Subscribing past the newest batch replays the newest one first (as Nomad's broker does).
    while batch.index <= before.index {
        batch = events.next().await.unwrap();
    }
    assert_eq!(batch.index, marker.index);
    assert!(batch.events.iter().all(|e| e.topic != "Node"), "{:?}", batch.events);
    task.abort();
}
