//! A rolling update end to end in one process (the scheduler, the real FSM, clients' health
//! reported by hand), with a node drained in the middle of it.

use std::collections::BTreeMap;

use nomad_proto::eval::trigger;
use nomad_proto::job::UpdateStrategy;
use nomad_proto::{Allocation, DesiredTransition};

use super::{deployed_then_changed, placed, stopped, version_of};
use crate::fsm::Command;

#[test]
fn a_node_drained_mid_rollout_moves_its_alloc_and_the_update_still_rolls_max_parallel_at_a_time() {
    let (mut h, _) = deployed_then_changed(UpdateStrategy { max_parallel: 1, ..UpdateStrategy::default_service() });
    let out = h.run_job("web");
    assert_eq!((placed(&out).len(), stopped(&out).len()), (1, 1), "one destructive update at a time");
    let deployment = out.plan.deployment.clone().expect("a deployment").id;
    let first = placed(&out)[0].id.clone();

    // The drainer marks an old alloc still running for migration; its node's eval moves it.
    let old = h.live("web").into_iter().find(|a| version_of(a) == 0).expect("an old alloc left");
    h.drain_node(&old.node_id);
    let migrate = DesiredTransition { migrate: Some(true), ..DesiredTransition::default() };
    h.apply(Command::AllocDesiredTransition { transitions: BTreeMap::from([(old.id.clone(), migrate)]), evals: vec![] });
    let drain = h.eval("web", trigger::NODE_DRAIN);
    let out = h.process(&drain);
    assert!(stopped(&out).iter().any(|a| a.id == old.id), "the drained alloc stops: {:?}", stopped(&out));
    let moved: Vec<&Allocation> = placed(&out).into_iter().filter(|a| a.previous_allocation == old.id).collect();
    assert_eq!(moved.len(), 1, "and is replaced: {:?}", placed(&out));
    assert_ne!(moved[0].node_id, old.node_id, "off the draining node");
    // The plan leaves the job out of each alloc; the stored alloc has it.
    assert_eq!(version_of(h.state().alloc(&moved[0].id).unwrap()), 1, "a replacement runs the job as it is now");
    assert_eq!(moved[0].deployment_id, deployment, "within the deployment");
    let updates = placed(&out).len() - moved.len();
    assert_eq!(updates, 0, "the first update is not healthy yet, so max_parallel 1 allows no other");

    // The rollout finishes, one unhealthy update at most at any time.
    h.report_health(&[first, moved[0].id.clone()], true);
    let mut rounds = 0;
    while h.state().deployment(&deployment).unwrap().status == "running" {
        rounds += 1;
        assert!(rounds < 10, "the rollout finishes");
        let out = h.run_job("web");
        let new: Vec<String> = placed(&out).iter().map(|a| a.id.clone()).collect();
        assert!(new.len() <= 1, "max_parallel 1: {} placed at once", new.len());
        if !new.is_empty() {
            h.report_health(&new, true);
        }
    }
    let d = h.state().deployment(&deployment).unwrap().clone();
    assert_eq!(d.status, "successful", "{}", d.status_description);
    let live = h.live("web");
    assert_eq!(live.len(), 3);
    assert!(live.iter().all(|a| version_of(a) == 1 && a.node_id != old.node_id), "every alloc updated, none on the drained node");
}
