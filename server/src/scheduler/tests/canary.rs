//! Canary deployments end to end in one process: the scheduler, the real FSM and the
//! deployment watcher's decisions, with clients' health reported by hand.

use std::collections::HashMap;

use nomad_proto::deployment::alloc_is_canary;
use nomad_proto::job::UpdateStrategy;

use super::{Harness, SEC, deployed_then_changed, placed, stopped, version_of};
use crate::fsm::Command;
use crate::leader::deployment_watcher::{SeenDeployment, writes};

/// One look of the leader's deployment watcher, its writes applied.
fn watch(h: &mut Harness, seen: &mut HashMap<String, SeenDeployment>) -> Vec<Command> {
    let cmds: Vec<Command> = writes(&h.state(), seen, h.now).into_iter().map(|(_, c)| c).collect();
    for c in &cmds {
        h.apply(c.clone());
    }
    cmds
}

#[test]
fn a_canary_waits_for_promotion_then_the_rest_roll_max_parallel_at_a_time() {
    let (mut h, _) = deployed_then_changed(UpdateStrategy { max_parallel: 1, canary: 1, ..UpdateStrategy::default_service() });
    let out = h.run_job("web");
    assert!(stopped(&out).is_empty(), "nothing old stops for a canary");
    let canary = placed(&out)[0].clone();
    assert_eq!(placed(&out).len(), 1);
    assert!(alloc_is_canary(&canary));
    let d = out.plan.deployment.clone().expect("a deployment");
    assert_eq!(h.state().deployment(&d.id).unwrap().task_groups["web"].placed_canaries, vec![canary.id.clone()]);
    assert_eq!(h.live("web").len(), 4, "the canary runs beside the three old allocs");

    // Healthy, but not promoted: nothing moves, and the watcher only evaluates.
    h.report_health(std::slice::from_ref(&canary.id), true);
    let out = h.run_job("web");
    assert!(placed(&out).is_empty() && stopped(&out).is_empty());
    let mut seen = HashMap::new();
    assert!(watch(&mut h, &mut seen).iter().all(|c| matches!(c, Command::EvalUpsert { .. })), "no auto_promote");
    assert!(h.state().deployment(&d.id).unwrap().requires_promotion());

    h.apply(Command::DeploymentPromotion { deployment_id: d.id.clone(), all: true, groups: vec![], eval: None, now: h.now });
    assert!(!alloc_is_canary(h.state().alloc(&canary.id).unwrap()), "promotion makes it an ordinary alloc");
    // Promoted: the old alloc under the canary's name goes, then one at a time as each is healthy.
    let mut rounds = 0;
    while h.state().deployment(&d.id).unwrap().status == "running" {
        rounds += 1;
        assert!(rounds < 10, "the rollout finishes");
        let out = h.run_job("web");
        let new: Vec<String> = placed(&out).iter().map(|a| a.id.clone()).collect();
        assert!(new.len() <= 1, "max_parallel 1: {} placed at once", new.len());
        h.report_health(&new, true);
    }
    let d = h.state().deployment(&d.id).unwrap().clone();
    assert_eq!(d.status, "successful");
    let live = h.live("web");
    assert_eq!(live.len(), 3);
    assert!(live.iter().all(|a| version_of(a) == 1));
    assert!(live.iter().any(|a| a.id == canary.id), "the promoted canary stays");
}

#[test]
fn a_failing_canary_with_auto_revert_takes_the_job_back_to_its_stable_version() {
    let update =
        UpdateStrategy { max_parallel: 1, canary: 1, auto_revert: true, progress_deadline: 0, ..UpdateStrategy::default_service() };
    let (mut h, _) = deployed_then_changed(update);
    let out = h.run_job("web");
    let canary = placed(&out)[0].id.clone();
    let d = out.plan.deployment.clone().unwrap();
    h.report_health(std::slice::from_ref(&canary), false);

    let mut seen = HashMap::new();
    let cmds = watch(&mut h, &mut seen);
    assert!(matches!(cmds.as_slice(), [Command::DeploymentStatusUpdate { revert_to: Some(_), .. }]), "{cmds:?}");
    let state = h.state();
    let failed = state.deployment(&d.id).unwrap();
    assert_eq!(failed.status_description, "Failed due to unhealthy allocations - rolling back to job version 0");
    let job = state.job("default", "web").unwrap();
    assert_eq!(job.version, 2);
    assert!(!job.task_groups[0].tasks[0].env.contains_key("V"), "the stable version's spec");

    // The reverted job stops the canary and keeps the old allocs (the same spec: in place).
    let out = h.run_job("web");
    assert!(stopped(&out).iter().any(|a| a.id == canary), "{:?}", stopped(&out));
    assert!(placed(&out).is_empty(), "the old allocs run the reverted spec already");
    let live = h.live("web");
    assert_eq!(live.len(), 3);
    assert!(live.iter().all(|a| a.id != canary && version_of(a) == 2));
}

#[test]
fn auto_promote_promotes_once_every_canary_is_healthy() {
    let update = UpdateStrategy { max_parallel: 2, canary: 2, auto_promote: true, ..UpdateStrategy::default_service() };
    let (mut h, _) = deployed_then_changed(update);
    let out = h.run_job("web");
    let canaries: Vec<String> = placed(&out).iter().map(|a| a.id.clone()).collect();
    assert_eq!(canaries.len(), 2);
    let d = out.plan.deployment.clone().unwrap();
    assert_eq!(d.status_description, "Deployment is running pending automatic promotion");

    let mut seen = HashMap::new();
    h.report_health(&canaries[..1], true);
    let cmds = watch(&mut h, &mut seen);
    assert!(!cmds.iter().any(|c| matches!(c, Command::DeploymentPromotion { .. })), "one of two is not enough");
    h.advance(SEC);
    h.report_health(&canaries[1..], true);
    let cmds = watch(&mut h, &mut seen);
    assert!(cmds.iter().any(|c| matches!(c, Command::DeploymentPromotion { all: true, .. })), "{cmds:?}");
    let d = h.state().deployment(&d.id).unwrap().clone();
    assert!(d.task_groups["web"].promoted);
    assert_eq!(d.status_description, "Deployment is running");
    // And the rollout goes on: the old allocs under the canaries' names stop.
    let out = h.run_job("web");
    assert_eq!(stopped(&out).len(), 2 + 1, "two replaced by the canaries, one destructive update: {:?}", stopped(&out));
}
