//! The generic scheduler end to end: compute, commit through the FSM, compute again.

use nomad_proto::alloc::{ALLOC_NOT_NEEDED_DESC, ALLOC_RECONNECTED_DESC, ALLOC_UNKNOWN_DESC};
use nomad_proto::eval::trigger;
use nomad_proto::{ClientStatus, Constraint, DesiredStatus, EvalStatus, NetworkResource, NodeStatus, Port};

use super::*;
use crate::scheduler::{ALLOC_UPDATING_DESC, BLOCKED_EVAL_FAILED_PLACEMENTS_DESC};

#[test]
fn places_count_allocs_and_converges() {
    let mut h = Harness::new();
    h.add_nodes(3);
    h.register_job(service_job("web", 3));
    let out = h.run_job("web");
    assert!(complete(&out));
    assert_eq!(names(placed(&out)), vec!["web.web[0]", "web.web[1]", "web.web[2]"]);
    assert_eq!(out.eval_update.queued_allocations["web"], 0);
    let a = placed(&out)[0];
    let m = a.metrics.as_ref().unwrap();
    assert!(m.nodes_evaluated >= 1 && !m.score_meta_data.is_empty());
    assert_eq!(m.nodes_available["dc1"], 3);
    assert!(a.job.is_none(), "placements run the plan's job");
    let r = a.allocated_resources.as_ref().unwrap();
    assert_eq!((r.tasks["server"].cpu.cpu_shares, r.tasks["server"].memory.memory_mb, r.shared.disk_mb), (500, 256, 100));
    assert_eq!(h.live("web").len(), 3);
    assert!(h.live("web").iter().all(|a| a.job.as_ref().is_some_and(|j| j.id == "web")));
    // Nothing left to do.
    let again = h.run_job("web");
    assert!(again.plan.is_no_op());
    assert!(again.new_evals.is_empty());
}

#[test]
fn anti_affinity_spreads_a_group_over_nodes() {
    let mut h = Harness::new();
    h.add_nodes(4);
    h.register_job(service_job("web", 4));
    let out = h.run_job("web");
    assert_eq!(per_node(&out).len(), 4, "each node gets one: {:?}", per_node(&out));
}

#[test]
fn same_eval_on_same_snapshot_places_the_same_way() {
    let mut h = Harness::new();
    h.add_nodes(20);
    h.register_job(service_job("web", 7));
    let e = h.eval("web", trigger::JOB_REGISTER);
    let nodes = |o: &ScheduleOutcome| placed(o).iter().map(|a| (a.name.clone(), a.node_id.clone())).collect::<BTreeMap<_, _>>();
    assert_eq!(nodes(&h.schedule(&e)), nodes(&h.schedule(&e)));
}

#[test]
fn failed_placements_block_with_metrics() {
    let mut h = Harness::new();
    h.add_nodes(1);
    let mut job = service_job("big", 3);
    job.task_groups[0].tasks[0].resources.memory_mb = 3000;
    h.register_job(job);
    let out = h.run_job("big");
    assert_eq!(placed(&out).len(), 2, "8 GiB fits two");
    let failed = &out.eval_update.failed_tg_allocs["web"];
    assert_eq!(failed.dimension_exhausted["memory"], 1);
    assert_eq!(failed.coalesced_failures, 0);
    assert_eq!(out.eval_update.queued_allocations["web"], 1);
    assert_eq!(out.new_evals.len(), 1);
    let blocked = &out.new_evals[0];
    assert_eq!((blocked.status, blocked.triggered_by.as_str()), (EvalStatus::Blocked, trigger::QUEUED_ALLOCS));
    assert_eq!(blocked.status_description, BLOCKED_EVAL_FAILED_PLACEMENTS_DESC);
    assert_eq!(blocked.previous_eval, out.eval_update.id);
    assert_eq!(out.eval_update.blocked_eval, blocked.id);
    assert!(!blocked.escaped_computed_class);
    assert_eq!(blocked.class_eligibility.values().copied().collect::<Vec<_>>(), vec![true]);

    // More failures of the same group coalesce.
    let mut job = service_job("bigger", 4);
    job.task_groups[0].tasks[0].resources.memory_mb = 9000;
    h.register_job(job);
    let out = h.run_job("bigger");
    assert_eq!(out.eval_update.failed_tg_allocs["web"].coalesced_failures, 3);
    assert_eq!(out.eval_update.queued_allocations["web"], 4);
}

#[test]
fn blocked_eval_that_still_cannot_place_is_reblocked() {
    let mut h = Harness::new();
    h.add_nodes(1);
    let mut job = service_job("big", 1);
    job.task_groups[0].tasks[0].resources.memory_mb = 9000;
    h.register_job(job);
    let first = h.run_job("big");
    let mut blocked = first.new_evals[0].clone();
    blocked.status = EvalStatus::Blocked;
    let out = h.schedule(&blocked);
    assert!(out.new_evals.is_empty(), "no second blocked eval");
    assert_eq!(out.eval_update.id, blocked.id);
    assert_eq!(out.eval_update.status, EvalStatus::Blocked);
    assert!(out.eval_update.failed_tg_allocs.contains_key("web"));
    // With room it completes.
    h.add_node(crate::testing::node("roomy"));
    let mut roomy = crate::testing::node("roomy2");
    roomy.node_resources.as_mut().unwrap().memory.memory_mb = 16384;
    h.add_node(roomy);
    let out = h.schedule(&blocked);
    assert_eq!(out.eval_update.status, EvalStatus::Complete);
    assert_eq!(placed(&out).len(), 1);
}

#[test]
fn unknown_trigger_fails_the_eval() {
    let mut h = Harness::new();
    h.register_job(service_job("web", 1));
    let out = h.schedule(&h.eval("web", "made-up"));
    assert_eq!(out.eval_update.status, EvalStatus::Failed);
    assert_eq!(out.eval_update.status_description, "scheduler cannot handle 'made-up' evaluation reason");
    assert!(out.plan.is_no_op());
}

#[test]
fn annotations_count_desired_changes() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(service_job("web", 2));
    let mut e = h.eval("web", trigger::JOB_REGISTER);
    e.annotate_plan = true;
    let out = h.schedule(&e);
    let a = out.annotations.as_ref().unwrap();
    assert_eq!(a.desired_tg_updates["web"].place, 2);
    assert_eq!(out.plan.annotations, out.annotations);
}

#[test]
fn in_place_update_keeps_alloc_and_ports() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = service_job("web", 2);
    job.task_groups[0].networks =
        vec![NetworkResource { dynamic_ports: vec![Port { label: "http".into(), ..Port::default() }], ..NetworkResource::default() }];
    h.register_job(job.clone());
    h.run_job("web");
    let before: BTreeMap<String, i64> =
        h.live("web").iter().map(|a| (a.id.clone(), a.allocated_resources.as_ref().unwrap().shared.ports[0].value)).collect();
    job.task_groups[0].restart_policy = Some(nomad_proto::RestartPolicy { attempts: 7, ..nomad_proto::RestartPolicy::default_service() });
    h.register_job(job);
    let out = h.run_job("web");
    assert!(placed(&out).is_empty() && stopped(&out).is_empty());
    let updated = rewritten(&out);
    assert_eq!(updated.len(), 2);
    assert!(updated.iter().all(|a| a.job.is_none() && before[&a.id] == a.allocated_resources.as_ref().unwrap().shared.ports[0].value));
    assert!(h.live("web").iter().all(|a| a.job.as_ref().unwrap().version == 1));
}

#[test]
fn a_destructive_update_rolls_out_in_a_deployment_one_healthy_alloc_at_a_time() {
    let mut h = Harness::new();
    h.add_nodes(3);
    let mut job = service_job("web", 2);
    h.register_job(job.clone());
    let first = h.run_job("web");
    let d0 = first.plan.deployment.clone().expect("the first version deploys too");
    assert!(placed(&first).iter().all(|a| a.deployment_id == d0.id));
    let ids: Vec<String> = h.live("web").iter().map(|a| a.id.clone()).collect();
    h.report_health(&ids, true);
    let d = h.state().deployment(&d0.id).unwrap().clone();
    assert_eq!((d.task_groups["web"].placed_allocs, d.task_groups["web"].healthy_allocs), (2, 2), "the state counts health");
    let out = h.run_job("web");
    assert_eq!(out.plan.deployment_updates.len(), 1, "all healthy: successful");
    assert_eq!(h.state().deployment(&d0.id).unwrap().status, "successful");
    assert!(h.state().job("default", "web").unwrap().stable, "a successful deployment makes its version stable");

    job.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    h.register_job(job);
    let out = h.run_job("web");
    assert_eq!(stopped(&out).len(), 1);
    assert_eq!(stopped(&out)[0].desired_description, ALLOC_UPDATING_DESC);
    assert_eq!(placed(&out).len(), 1);
    assert_eq!(placed(&out)[0].previous_allocation, stopped(&out)[0].id);
    assert!(out.new_evals.iter().all(|e| e.triggered_by != trigger::ROLLING_UPDATE), "health, not time, moves it on");
    let d1 = out.plan.deployment.clone().expect("a deployment for version 1");
    assert_eq!((d1.job_version, d1.task_groups["web"].desired_total), (1, 2));
    let new_id = placed(&out)[0].id.clone();
    assert_eq!(placed(&out)[0].deployment_id, d1.id);

    // Not healthy yet: nothing more goes.
    let out = h.run_job("web");
    assert!(stopped(&out).is_empty() && placed(&out).is_empty());
    // Healthy: the other one is replaced.
    h.report_health(std::slice::from_ref(&new_id), true);
    let out = h.run_job("web");
    assert_eq!((stopped(&out).len(), placed(&out).len()), (1, 1));
    let last = placed(&out)[0].id.clone();
    h.report_health(&[last], true);
    h.run_job("web");
    let d = h.state().deployment(&d1.id).unwrap().clone();
    assert_eq!((d.status.as_str(), d.task_groups["web"].healthy_allocs), ("successful", 2));
    assert!(h.live("web").iter().all(|a| a.job.as_ref().unwrap().version == 1));
    assert_eq!(h.live("web").len(), 2);
    assert_eq!(h.state().job_version("default", "web", 1).map(|j| j.stable), Some(true));
}

#[test]
fn static_port_collision_is_reported_and_dynamic_ports_assigned() {
    let mut h = Harness::new();
    h.add_nodes(1);
    let mut job = service_job("web", 2);
    job.task_groups[0].networks = vec![NetworkResource {
        reserved_ports: vec![Port { label: "http".into(), value: 8080, ..Port::default() }],
        dynamic_ports: vec![Port { label: "admin".into(), to: -1, ..Port::default() }],
        ..NetworkResource::default()
    }];
    h.register_job(job);
    let out = h.run_job("web");
    assert_eq!(placed(&out).len(), 1);
    let r = placed(&out)[0].allocated_resources.as_ref().unwrap();
    let ports: BTreeMap<&str, i64> = r.shared.ports.iter().map(|p| (p.label.as_str(), p.value)).collect();
    assert_eq!(ports["http"], 8080);
    assert!((20000..=32000).contains(&ports["admin"]));
    assert_eq!(r.shared.networks[0].dynamic_ports[0].value, ports["admin"]);
    let failed = &out.eval_update.failed_tg_allocs["web"];
    assert_eq!(failed.dimension_exhausted["network: reserved port collision http=8080"], 1);
}

#[test]
fn reserved_host_ports_are_never_assigned() {
    let mut h = Harness::new();
    let mut n = crate::testing::node("n");
    n.node_resources.as_mut().unwrap().min_dynamic_port = 20000;
    n.node_resources.as_mut().unwrap().max_dynamic_port = 20003;
    n.reserved_resources = Some(nomad_proto::resources::NodeReservedResources {
        networks: nomad_proto::resources::NodeReservedNetworkResources { reserved_host_ports: "20000-20001".into() },
        ..Default::default()
    });
    h.add_node(n);
    let mut job = service_job("web", 3);
    job.task_groups[0].tasks[0].resources.memory_mb = 10;
    job.task_groups[0].networks =
        vec![NetworkResource { dynamic_ports: vec![Port { label: "p".into(), ..Port::default() }], ..NetworkResource::default() }];
    h.register_job(job);
    let out = h.run_job("web");
    let mut got: Vec<i64> = placed(&out).iter().map(|a| a.allocated_resources.as_ref().unwrap().shared.ports[0].value).collect();
    got.sort();
    assert_eq!(got, vec![20002, 20003]);
    assert_eq!(out.eval_update.failed_tg_allocs["web"].dimension_exhausted["network: dynamic port selection failed"], 1);
}

#[test]
fn stopping_a_job_stops_its_allocs() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(service_job("web", 3));
    h.run_job("web");
    h.stop_job("web", false);
    let out = h.run_job("web");
    assert_eq!(stopped(&out).len(), 3);
    assert!(stopped(&out).iter().all(|a| a.desired_description == nomad_proto::alloc::ALLOC_JOB_STOPPED_DESC));
    assert!(h.live("web").is_empty());
    assert!(out.eval_update.queued_allocations.is_empty());
}

#[test]
fn lost_alloc_is_replaced_on_another_node() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(service_job("web", 1));
    h.run_job("web");
    h.run_all("web");
    let first = h.live("web")[0].clone();
    h.set_node_status(&first.node_id, NodeStatus::Down);
    let out = h.process(&h.eval("web", trigger::NODE_UPDATE));
    let stop = stopped(&out)[0];
    assert_eq!((stop.id.as_str(), stop.client_status), (first.id.as_str(), ClientStatus::Lost));
    let new = placed(&out)[0];
    assert_ne!(new.node_id, first.node_id);
    assert_eq!(new.previous_allocation, first.id);
    assert_eq!(h.state().alloc(&first.id).unwrap().client_status, ClientStatus::Lost);
}

#[test]
fn alloc_on_deregistered_node_is_lost() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(service_job("web", 1));
    h.run_job("web");
    let first = h.live("web")[0].clone();
    h.delete_node(&first.node_id);
    let out = h.process(&h.eval("web", trigger::NODE_UPDATE));
    assert_eq!(stopped(&out)[0].client_status, ClientStatus::Lost);
    assert_eq!(placed(&out)[0].previous_allocation, first.id);
}

#[test]
fn failed_alloc_is_rescheduled_away_from_its_node() {
    let mut h = Harness::new();
    h.add_nodes(2);
    let mut job = service_job("web", 1);
    job.task_groups[0].reschedule_policy =
        Some(nomad_proto::ReschedulePolicy { delay: 0, delay_function: "constant".into(), unlimited: true, ..Default::default() });
    h.register_job(job);
    h.run_job("web");
    let first = h.live("web")[0].clone();
    h.client_status(std::slice::from_ref(&first.id), ClientStatus::Failed);
    let out = h.process(&h.eval("web", trigger::RETRY_FAILED_ALLOC));
    let new = placed(&out)[0];
    assert_eq!(new.previous_allocation, first.id);
    assert_ne!(new.node_id, first.node_id, "the failing node is penalized");
    let scores = &new.metrics.as_ref().unwrap().score_meta_data;
    assert!(
        scores.iter().any(|s| s.scores.get("node-reschedule-penalty") == Some(&-1.0)) || scores.iter().all(|s| s.node_id != first.node_id)
    );
    assert_eq!(new.reschedule_tracker.as_ref().unwrap().events[0].prev_alloc_id, first.id);
}

#[test]
fn constraint_and_driver_filters_show_in_metrics() {
    let mut h = Harness::new();
    let mut other = crate::testing::node("darwin");
    other.attributes.insert("kernel.name".into(), "darwin".into());
    h.add_node(other);
    let mut nodriver = crate::testing::node("nodriver");
    nodriver.drivers.clear();
    nodriver.attributes.remove("driver.raw_exec");
    h.add_node(nodriver);
    h.add_node(crate::testing::node("good"));
    let mut job = service_job("web", 1);
    job.constraints.push(Constraint { l_target: "${attr.kernel.name}".into(), r_target: "linux".into(), operand: "=".into() });
    h.register_job(job);
    let out = h.run_job("web");
    let a = placed(&out)[0];
    assert_eq!(a.node_id, "good");
    let m = a.metrics.as_ref().unwrap();
    let filtered_before = m.nodes_filtered;
    assert!(filtered_before <= 2);
    // Make the good node unusable: the failure names both reasons.
    h.set_node_status("good", NodeStatus::Down);
    h.stop_job("web", true);
    let mut job = service_job("web2", 1);
    job.constraints.push(Constraint { l_target: "${attr.kernel.name}".into(), r_target: "linux".into(), operand: "=".into() });
    h.register_job(job);
    let out = h.run_job("web2");
    let f = &out.eval_update.failed_tg_allocs["web"];
    assert_eq!(f.constraint_filtered["${attr.kernel.name} = linux"], 1);
    assert_eq!(f.constraint_filtered["missing drivers"], 1);
    assert_eq!((f.nodes_evaluated, f.nodes_filtered), (2, 2));
}

#[test]
fn disconnect_marks_unknown_replaces_and_schedules_timeout() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(disconnect_job("web", 1, 300));
    h.run_job("web");
    h.run_all("web");
    let orig = h.live("web")[0].clone();
    h.set_node_status(&orig.node_id, NodeStatus::Disconnected);
    let out = h.process(&h.eval("web", trigger::NODE_UPDATE));
    let marked = rewritten(&out);
    assert_eq!(marked.len(), 1);
    assert_eq!((marked[0].client_status, marked[0].client_description.as_str()), (ClientStatus::Unknown, ALLOC_UNKNOWN_DESC));
    assert!(marked[0].job.is_some(), "rewrites keep their own job version");
    let timeout = out.new_evals.iter().find(|e| e.triggered_by == trigger::MAX_DISCONNECT_TIMEOUT).unwrap();
    assert_eq!(timeout.wait_until, h.now.add_nanos(300 * SEC));
    assert_eq!(timeout.previous_eval, out.eval_update.id);
    assert_eq!(placed(&out)[0].previous_allocation, orig.id);
    let stored = h.state().alloc(&orig.id).unwrap().clone();
    assert_eq!(stored.client_status, ClientStatus::Unknown);
    assert_eq!(stored.desired_status, DesiredStatus::Run);
    assert_eq!(stored.followup_eval_id, timeout.id);
    assert!(stored.needs_to_reconnect());
    // Later evals while away do nothing more.
    let again = h.process(&h.eval("web", trigger::NODE_UPDATE));
    assert!(again.plan.is_no_op(), "{:?}", again.plan);
}

#[test]
fn timeout_followups_are_not_made_by_delayed_evals() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(disconnect_job("web", 1, 300));
    h.run_job("web");
    h.run_all("web");
    let orig = h.live("web")[0].clone();
    h.set_node_status(&orig.node_id, NodeStatus::Disconnected);
    let mut delayed = h.eval("web", trigger::RETRY_FAILED_ALLOC);
    delayed.wait_until = h.now;
    let out = h.schedule(&delayed);
    assert_eq!(rewritten(&out).len(), 1, "still marked unknown");
    assert!(out.new_evals.is_empty(), "but no timeout eval");
}

#[test]
fn disconnect_expiry_then_reconnect_keeps_one() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(disconnect_job("web", 1, 60));
    h.run_job("web");
    h.run_all("web");
    let orig = h.live("web")[0].clone();
    h.set_node_status(&orig.node_id, NodeStatus::Disconnected);
    h.process(&h.eval("web", trigger::NODE_UPDATE));
    h.run_all("web");
    // The node comes back before expiry; the client reports running.
    h.advance(30);
    h.set_node_status(&orig.node_id, NodeStatus::Initializing);
    h.client_status(std::slice::from_ref(&orig.id), ClientStatus::Running);
    let out = h.process(&h.eval("web", trigger::RECONNECT));
    let replacement = stopped(&out)[0];
    assert_eq!(replacement.desired_description, ALLOC_RECONNECTED_DESC);
    assert_eq!(rewritten(&out)[0].id, orig.id);
    let stored = h.state().alloc(&orig.id).unwrap().clone();
    assert_eq!(stored.alloc_states.iter().map(|s| s.value.as_str()).collect::<Vec<_>>(), vec!["unknown", "running"]);
    assert_eq!(h.live("web").len(), 1);
    assert!(h.process(&h.eval("web", trigger::NODE_UPDATE)).plan.is_no_op());
}

#[test]
fn expired_disconnect_is_lost() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(disconnect_job("web", 1, 60));
    h.run_job("web");
    h.run_all("web");
    let orig = h.live("web")[0].clone();
    h.set_node_status(&orig.node_id, NodeStatus::Disconnected);
    let out = h.process(&h.eval("web", trigger::NODE_UPDATE));
    let timeout = out.new_evals.iter().find(|e| e.triggered_by == trigger::MAX_DISCONNECT_TIMEOUT).unwrap().clone();
    h.advance(61);
    let out = h.process(&timeout);
    let lost = stopped(&out)[0];
    assert_eq!((lost.id.as_str(), lost.client_status), (orig.id.as_str(), ClientStatus::Lost));
    assert!(placed(&out).is_empty(), "the replacement already runs");
    let stored = h.state().alloc(&orig.id).unwrap().clone();
    assert_eq!((stored.client_status, stored.desired_status), (ClientStatus::Lost, DesiredStatus::Stop));
}

#[test]
fn count_down_stops_not_needed() {
    let mut h = Harness::new();
    h.add_nodes(3);
    h.register_job(service_job("web", 3));
    h.run_job("web");
    h.register_job(service_job("web", 1));
    let out = h.run_job("web");
    assert_eq!(names(stopped(&out)), vec!["web.web[1]", "web.web[2]"]);
    assert!(stopped(&out).iter().all(|a| a.desired_description == ALLOC_NOT_NEEDED_DESC));
}

#[test]
fn user_stopped_alloc_is_migrated() {
    let mut h = Harness::new();
    h.add_nodes(2);
    h.register_job(service_job("web", 2));
    h.run_job("web");
    let victim = h.live("web")[0].clone();
    let transitions = BTreeMap::from([(victim.id.clone(), nomad_proto::DesiredTransition { migrate: Some(true), ..Default::default() })]);
    h.apply(crate::fsm::Command::AllocDesiredTransition { transitions, evals: vec![] });
    let out = h.process(&h.eval("web", trigger::ALLOC_STOP));
    assert_eq!(stopped(&out)[0].id, victim.id);
    assert_eq!(stopped(&out)[0].desired_description, nomad_proto::alloc::ALLOC_MIGRATING_DESC);
    assert_eq!(placed(&out)[0].previous_allocation, victim.id);
    assert_eq!(placed(&out)[0].name, victim.name);
    assert_eq!(h.live("web").len(), 2);
}

#[test]
fn sticky_disk_keeps_the_replacement_on_its_node() {
    let mut h = Harness::new();
    h.add_nodes(5);
    let mut job = service_job("db", 1);
    job.task_groups[0].ephemeral_disk.sticky = true;
    h.register_job(job.clone());
    h.run_job("db");
    h.run_all("db");
    let before = h.live("db")[0].clone();
    job.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    h.register_job(job);
    let out = h.run_job("db");
    let new = placed(&out)[0];
    assert_eq!((new.previous_allocation.as_str(), new.node_id.as_str()), (before.id.as_str(), before.node_id.as_str()));
}

#[test]
fn groups_are_reconciled_independently() {
    let mut h = Harness::new();
    h.add_nodes(3);
    let mut job = service_job("app", 2);
    let mut api = job.task_groups[0].clone();
    api.name = "api".into();
    api.count = 3;
    job.task_groups.push(api);
    h.register_job(job.clone());
    let out = h.run_job("app");
    assert_eq!(names(placed(&out)), vec!["app.api[0]", "app.api[1]", "app.api[2]", "app.web[0]", "app.web[1]"]);
    assert_eq!((out.eval_update.queued_allocations["web"], out.eval_update.queued_allocations["api"]), (0, 0));
    // Dropping a group stops its allocs only.
    job.task_groups.pop();
    h.register_job(job);
    let out = h.run_job("app");
    assert_eq!(names(stopped(&out)), vec!["app.api[0]", "app.api[1]", "app.api[2]"]);
    assert!(placed(&out).is_empty());
}
