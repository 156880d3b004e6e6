//! Untrusted stored state: counts far beyond what fits, resource values past the admission
//! bounds, and the reproducibility of a run (IDs included). The state here is written
//! through the FSM directly, as a job stored before the limits existed would be.

use nomad_proto::eval::trigger;
use nomad_proto::resources::{AllocatedCpuResources, AllocatedMemoryResources, AllocatedTaskResources};
use nomad_proto::{AllocatedResources, EvalStatus, JobType};

use super::*;
use crate::fsm::PlanApply;

const HUGE_COUNT: i64 = 1 << 31;

/// Issue 11: a stored `count = 2^31` made the scheduler allocate about 48 GB and abort, on
/// every leader in turn. Now it places what fits and counts the rest as failed.
#[test]
fn a_stored_count_of_2_pow_31_places_what_fits_and_blocks_the_rest() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = service_job("huge", HUGE_COUNT);
    job.task_groups[0].tasks[0].resources.memory_mb = 3000;
    h.register_job(job);
    let mut e = h.eval("huge", trigger::JOB_REGISTER);
    e.annotate_plan = true;
    let out = h.schedule(&e);

    assert!(complete(&out));
    assert_eq!(placed(&out).len(), 4, "8 GiB nodes take two allocs of 3000 MiB each");
    assert_eq!(out.plan.node_allocation.values().map(Vec::len).sum::<usize>(), 4, "the plan holds what was placed, no more");
    let failed = &out.eval_update.failed_tg_allocs["web"];
    assert_eq!(failed.coalesced_failures, HUGE_COUNT - 5, "one failure tried, the rest coalesced");
    assert_eq!(failed.dimension_exhausted["memory"], 2);
    assert_eq!(failed.resources_exhausted["server"]["MemoryMB"], serde_json::json!(3000 * (HUGE_COUNT - 4)));
    assert_eq!(out.eval_update.queued_allocations["web"], HUGE_COUNT - 4);
    assert_eq!(out.annotations.as_ref().unwrap().desired_tg_updates["web"].place, HUGE_COUNT as u64);
    assert_eq!(out.new_evals.len(), 1);
    let blocked = out.new_evals[0].clone();
    assert_eq!(blocked.status, EvalStatus::Blocked);

    // Committed, the blocked eval runs again at the same bounded cost and stays blocked.
    h.commit(&out);
    let again = h.schedule(&blocked);
    assert_eq!(again.eval_update.status, EvalStatus::Blocked);
    assert!(placed(&again).is_empty());
    assert_eq!(again.eval_update.failed_tg_allocs["web"].coalesced_failures, HUGE_COUNT - 5);
    assert_eq!(again.eval_update.queued_allocations["web"], HUGE_COUNT - 4);
}

/// Two tasks asking `5e18` MHz, stored past admission.
fn impossible_job(id: &str) -> Job {
    let mut j = service_job(id, 1);
    let mut second = j.task_groups[0].tasks[0].clone();
    second.name = "second".into();
    j.task_groups[0].tasks.push(second);
    for t in &mut j.task_groups[0].tasks {
        t.resources.cpu = 5_000_000_000_000_000_000;
    }
    j
}

/// Issue 20: `5e18 + 5e18` wrapped negative in fit, so the job was placed; the node's load
/// then went negative and a second impossible job fit too.
#[test]
fn asks_whose_sum_passes_i64_are_never_placed_and_the_node_load_never_goes_negative() {
    let mut h = Harness::new();
    h.add_nodes(1);
    h.register_job(impossible_job("greedy"));
    let out = h.run_job("greedy");
    assert!(placed(&out).is_empty(), "placed: {:?}", placed(&out));
    assert_eq!(out.eval_update.failed_tg_allocs["web"].dimension_exhausted["cpu"], 1);
    let exhausted = &out.eval_update.failed_tg_allocs["web"].resources_exhausted["server"]["CPU"];
    assert_eq!(*exhausted, serde_json::json!(5_000_000_000_000_000_000i64));

    // An alloc holding that much, stored directly (as a plan from before the bounds would
    // have): the node is full, not in credit.
    let task = |cpu| AllocatedTaskResources {
        cpu: AllocatedCpuResources { cpu_shares: cpu, ..Default::default() },
        memory: AllocatedMemoryResources { memory_mb: 10, ..Default::default() },
        ..Default::default()
    };
    let mut resources = AllocatedResources::default();
    resources.tasks.insert("a".into(), task(5_000_000_000_000_000_000));
    resources.tasks.insert("b".into(), task(5_000_000_000_000_000_000));
    let stored = Allocation {
        id: "hog".into(),
        namespace: "default".into(),
        job_id: "greedy".into(),
        task_group: "web".into(),
        name: "greedy.web[0]".into(),
        node_id: "node-0".into(),
        allocated_resources: Some(resources),
        desired_status: DesiredStatus::Run,
        client_status: ClientStatus::Running,
        ..Allocation::default()
    };
    let now = h.now;
    let apply = PlanApply {
        job: None,
        allocs_upserted: vec![stored],
        allocs_stopped: vec![],
        eval: None,
        evals: vec![],
        now,
        ..PlanApply::default()
    };
    h.apply(Command::PlanApply(apply));
    let load = h.state().node_load("node-0").cloned().expect("node load");
    assert!(load.placed.cpu >= i128::from(i64::MAX) && load.live.cpu >= i128::from(i64::MAX), "{load:?}");
    assert!(load.placed.memory_mb >= 0 && load.placed.disk_mb >= 0);

    h.register_job(service_job("small", 1));
    let out = h.run_job("small");
    assert!(placed(&out).is_empty(), "the node is full: {:?}", placed(&out));
    assert_eq!(out.eval_update.failed_tg_allocs["web"].dimension_exhausted["cpu"], 1);
}

/// A node that reserves more than it has (stored past registration's bounds) offers nothing.
#[test]
fn a_node_reserving_more_than_it_has_takes_nothing() {
    let mut h = Harness::new();
    let mut node = crate::testing::node("node-0");
    node.reserved_resources = Some(nomad_proto::resources::NodeReservedResources {
        cpu: nomad_proto::resources::NodeReservedCpuResources { cpu_shares: i64::MAX, ..Default::default() },
        ..Default::default()
    });
    node.node_resources.as_mut().unwrap().cpu.cpu_shares = i64::MIN;
    h.add_node(node);
    h.register_job(service_job("web", 1));
    let out = h.run_job("web");
    assert!(placed(&out).is_empty());
    assert_eq!(out.eval_update.failed_tg_allocs["web"].dimension_exhausted["cpu"], 1);
}

/// Issue 20: alloc and eval IDs came from the OS; the same snapshot and eval must give the
/// same outcome, IDs included.
#[test]
fn two_runs_on_the_same_snapshot_and_eval_give_identical_outcomes_ids_included() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = service_job("web", 5);
    job.task_groups[0].tasks[0].resources.memory_mb = 3000;
    h.register_job(job);
    let e = h.eval("web", trigger::JOB_REGISTER);
    let (first, second) = (h.schedule(&e), h.schedule(&e));
    assert_eq!(first, second);
    let ids: std::collections::BTreeSet<&str> = placed(&first).iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids.len(), 4, "each alloc its own ID");
    assert_eq!(first.new_evals.len(), 1, "a blocked eval, with the same ID both times");
    assert!(!ids.contains(first.new_evals[0].id.as_str()));

    // Run again on the newer snapshot (as a worker does after a partial commit): what it
    // places gets new IDs, never one the committed allocs carry.
    h.commit(&first);
    h.add_node(crate::testing::node("node-2"));
    let retry = h.schedule(&e);
    assert_eq!(placed(&retry).len(), 1);
    assert!(!ids.contains(placed(&retry)[0].id.as_str()));
}

#[test]
fn system_runs_are_reproducible_too() {
    let mut h = Harness::new();
    h.add_nodes(3);
    let mut job = crate::testing::job("sys", 1);
    job.job_type = JobType::System;
    h.register_job(job);
    let e = h.eval("sys", trigger::JOB_REGISTER);
    let (first, second) = (h.schedule(&e), h.schedule(&e));
    assert_eq!(placed(&first).len(), 3);
    assert_eq!(first, second);
}
