//! The system and sysbatch scheduler end to end.

use std::collections::BTreeMap;

use nomad_proto::alloc::{ALLOC_NOT_NEEDED_DESC, ALLOC_UNKNOWN_DESC, TaskState};
use nomad_proto::eval::trigger;
use nomad_proto::{ClientStatus, Constraint, Job, JobType, NodeStatus};

use super::*;

fn system_job(id: &str) -> Job {
    let mut j = service_job(id, 1);
    j.job_type = JobType::System;
    j
}

#[test]
fn one_alloc_per_feasible_node() {
    let mut h = Harness::new();
    h.add_nodes(3);
    let mut other = crate::testing::node("darwin");
    other.attributes.insert("kernel.name".into(), "darwin".into());
    h.add_node(other);
    let mut job = system_job("agent");
    job.constraints.push(Constraint { l_target: "${attr.kernel.name}".into(), r_target: "linux".into(), operand: "=".into() });
    h.register_job(job);
    let out = h.run_job("agent");
    assert_eq!(per_node(&out).keys().cloned().collect::<Vec<_>>(), vec!["node-0", "node-1", "node-2"]);
    assert!(placed(&out).iter().all(|a| a.name == "agent.web[0]"));
    assert!(out.eval_update.failed_tg_allocs.is_empty(), "constraint-filtered nodes are not failures");
    assert!(out.new_evals.is_empty());
    assert!(h.run_job("agent").plan.is_no_op());
}

#[test]
fn new_node_gets_an_alloc_and_lost_node_loses_it() {
    let mut h = Harness::new();
    h.add_nodes(1);
    h.register_job(system_job("agent"));
    h.run_job("agent");
    h.add_node(crate::testing::node("late"));
    let out = h.process(&h.eval("agent", trigger::NODE_UPDATE));
    assert_eq!(per_node(&out).keys().cloned().collect::<Vec<_>>(), vec!["late"]);
    h.set_node_status("late", NodeStatus::Down);
    let out = h.process(&h.eval("agent", trigger::NODE_UPDATE));
    let s = stopped(&out);
    assert_eq!((s.len(), s[0].node_id.as_str(), s[0].client_status), (1, "late", ClientStatus::Lost));
    assert!(placed(&out).is_empty());
}

#[test]
fn node_that_stops_fitting_loses_its_alloc() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(system_job("agent"));
    h.run_job("agent");
    // Move node-1 out of the job's datacenters.
    let mut moved = crate::testing::node("node-1");
    moved.datacenter = "dc2".into();
    h.add_node(moved);
    let out = h.process(&h.eval("agent", trigger::NODE_UPDATE));
    let s = stopped(&out);
    assert_eq!((s.len(), s[0].node_id.as_str(), s[0].desired_description.as_str()), (1, "node-1", ALLOC_NOT_NEEDED_DESC));
}

#[test]
fn full_node_is_a_failure_with_a_blocked_eval() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = system_job("agent");
    job.task_groups[0].tasks[0].resources.memory_mb = 9000;
    h.register_job(job);
    let out = h.run_job("agent");
    let f = &out.eval_update.failed_tg_allocs["web"];
    assert_eq!((f.dimension_exhausted["memory"], f.coalesced_failures), (1, 1));
    assert_eq!(out.new_evals.len(), 1);
    assert_eq!(out.new_evals[0].status, nomad_proto::EvalStatus::Blocked);
    assert!(!out.new_evals[0].node_id.is_empty());
}

#[test]
fn stopping_the_job_stops_every_alloc() {
    let mut h = Harness::new();
    h.add_nodes(3);
    h.register_job(system_job("agent"));
    h.run_job("agent");
    h.stop_job("agent", false);
    let out = h.run_job("agent");
    assert_eq!(stopped(&out).len(), 3);
    assert!(stopped(&out).iter().all(|a| a.desired_description == nomad_proto::alloc::ALLOC_JOB_STOPPED_DESC));
    assert!(h.live("agent").is_empty());
}

#[test]
fn disconnect_marks_unknown_without_replacement_then_reconnects() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = system_job("agent");
    job.task_groups[0].max_client_disconnect = Some(60 * SEC);
    h.register_job(job);
    h.run_job("agent");
    h.run_all("agent");
    h.set_node_status("node-0", NodeStatus::Disconnected);
    let out = h.process(&h.eval("agent", trigger::NODE_UPDATE));
    let marked = rewritten(&out);
    assert_eq!(
        (marked.len(), marked[0].client_status, marked[0].client_description.as_str()),
        (1, ClientStatus::Unknown, ALLOC_UNKNOWN_DESC)
    );
    assert!(placed(&out).is_empty() && stopped(&out).is_empty());
    assert!(out.new_evals.is_empty(), "no timeout eval for system jobs");
    // Back: the client reports running; the reconnect is recorded in place.
    h.set_node_status("node-0", NodeStatus::Ready);
    let id = marked[0].id.clone();
    h.client_status(std::slice::from_ref(&id), ClientStatus::Running);
    let out = h.process(&h.eval("agent", trigger::RECONNECT));
    assert_eq!(rewritten(&out).len(), 1);
    assert!(placed(&out).is_empty() && stopped(&out).is_empty());
    let stored = h.state().alloc(&id).unwrap().clone();
    assert_eq!(stored.alloc_states.iter().map(|s| s.value.as_str()).collect::<Vec<_>>(), vec!["unknown", "running"]);
    assert!(h.process(&h.eval("agent", trigger::NODE_UPDATE)).plan.is_no_op());
}

#[test]
fn expired_unknown_system_alloc_is_lost() {
    let mut h = Harness::new();
    h.add_nodes(1);
    let mut job = system_job("agent");
    job.task_groups[0].max_client_disconnect = Some(60 * SEC);
    h.register_job(job);
    h.run_job("agent");
    h.run_all("agent");
    h.set_node_status("node-0", NodeStatus::Disconnected);
    h.process(&h.eval("agent", trigger::NODE_UPDATE));
    h.advance(61);
    let out = h.process(&h.eval("agent", trigger::NODE_UPDATE));
    assert_eq!(stopped(&out)[0].client_status, ClientStatus::Lost);
}

#[test]
fn disconnect_without_support_is_ignored_until_down() {
    let mut h = Harness::new();
    h.add_nodes(1);
    h.register_job(system_job("agent"));
    h.run_job("agent");
    h.run_all("agent");
    h.set_node_status("node-0", NodeStatus::Disconnected);
    assert!(h.process(&h.eval("agent", trigger::NODE_UPDATE)).plan.is_no_op());
}

#[test]
fn completed_sysbatch_allocs_are_not_rerun() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = system_job("once");
    job.job_type = JobType::Sysbatch;
    h.register_job(job.clone());
    h.run_job("once");
    let ids: Vec<String> = h.live("once").iter().map(|a| a.id.clone()).collect();
    let mut states = BTreeMap::new();
    states.insert("server".to_string(), TaskState { state: "dead".into(), ..TaskState::default() });
    let state = h.state();
    let allocs = ids
        .iter()
        .map(|id| {
            let a = state.alloc(id).unwrap();
            nomad_proto::Allocation {
                id: a.id.clone(),
                node_id: a.node_id.clone(),
                client_status: ClientStatus::Complete,
                task_states: Some(states.clone()),
                ..Default::default()
            }
        })
        .collect();
    let now = h.now;
    h.apply(crate::fsm::Command::AllocClientUpdate { allocs, evals: vec![], now });
    let out = h.run_job("once");
    assert!(out.plan.is_no_op(), "{:?}", out.plan);
    // A destructive change runs it again.
    job.task_groups[0].tasks[0].env.insert("RUN".into(), "2".into());
    h.register_job(job);
    let out = h.run_job("once");
    assert_eq!(placed(&out).len(), 2);
}

#[test]
fn node_that_stops_meeting_constraints_loses_its_alloc() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = system_job("agent");
    job.constraints.push(Constraint { l_target: "${attr.kernel.name}".into(), r_target: "linux".into(), operand: "=".into() });
    h.register_job(job);
    h.run_job("agent");
    let mut changed = crate::testing::node("node-1");
    changed.attributes.insert("kernel.name".into(), "darwin".into());
    h.add_node(changed);
    let out = h.process(&h.eval("agent", trigger::NODE_UPDATE));
    let s = stopped(&out);
    assert_eq!(
        (s.len(), s[0].node_id.as_str(), s[0].desired_description.as_str()),
        (1, "node-1", nomad_proto::alloc::ALLOC_NODE_TAINTED_DESC)
    );
    assert!(placed(&out).is_empty());
}

#[test]
fn drained_node_alloc_is_stopped_as_tainted() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(system_job("agent"));
    h.run_job("agent");
    h.drain_node("node-0");
    let id = h.live("agent").iter().find(|a| a.node_id == "node-0").unwrap().id.clone();
    let transitions = BTreeMap::from([(id.clone(), nomad_proto::DesiredTransition { migrate: Some(true), ..Default::default() })]);
    h.apply(crate::fsm::Command::AllocDesiredTransition { transitions, evals: vec![] });
    let out = h.process(&h.eval("agent", trigger::NODE_DRAIN));
    let s = stopped(&out);
    assert_eq!(
        (s.len(), s[0].id.as_str(), s[0].desired_description.as_str()),
        (1, id.as_str(), nomad_proto::alloc::ALLOC_NODE_TAINTED_DESC)
    );
    assert!(placed(&out).is_empty(), "the draining node gets no replacement");
}

#[test]
fn system_plan_annotations_count_places() {
    let mut h = Harness::new();
    h.add_nodes(3);
    h.register_job(system_job("agent"));
    let mut e = h.eval("agent", trigger::JOB_REGISTER);
    e.annotate_plan = true;
    let out = h.schedule(&e);
    assert_eq!(out.annotations.as_ref().unwrap().desired_tg_updates["web"].place, 3);
}
