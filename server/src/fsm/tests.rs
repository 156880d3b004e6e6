//! The FSM is deterministic: replaying the same log rebuilds the same state,
//! and a snapshot restores it exactly.

use std::sync::Arc;

use nomad_proto::{Allocation, ClientStatus, Evaluation, NodeStatus, Timestamp};

use super::{AllocStop, Command, Fsm, PlanApply, ServerFsm};
use crate::events::EventBroker;
use crate::state::StateStore;
use crate::testing::{job, node};

fn log() -> Vec<Command> {
    let now = Timestamp(1_700_000_000_000_000_000);
    let mut j = job("web", 2);
    j.canonicalize();
    let eval = Evaluation::for_job(&j, "job-register", now);
    let alloc = |id: &str, i: u64| Allocation {
        id: id.into(),
        namespace: "default".into(),
        eval_id: eval.id.clone(),
        name: format!("web.web[{i}]"),
        node_id: "n1".into(),
        job_id: "web".into(),
        task_group: "web".into(),
        ..Allocation::default()
    };
    let mut running = alloc("a1", 0);
    running.client_status = ClientStatus::Running;
    vec![
        Command::NodeRegister { node: node("n1"), evals: vec![], now },
        Command::NodeUpdateStatus { node_id: "n1".into(), status: NodeStatus::Ready, event: None, updated_at: 1, evals: vec![] },
        Command::JobRegister { job: j.clone(), eval: Some(eval.clone()), now },
        Command::PlanApply(PlanApply {
            job: Some(j.clone()),
            allocs_upserted: vec![alloc("a1", 0), alloc("a2", 1)],
            eval: Some(Evaluation { status: nomad_proto::EvalStatus::Complete, ..eval.clone() }),
            now,
            ..PlanApply::default()
        }),
        Command::AllocClientUpdate { allocs: vec![running], evals: vec![], now },
        // A refused command (unknown node) must replay as refused too.
        Command::NodeUpdateStatus { node_id: "ghost".into(), status: NodeStatus::Down, event: None, updated_at: 2, evals: vec![] },
        Command::PlanApply(PlanApply {
            job: Some(j.clone()),
            allocs_stopped: vec![AllocStop { alloc_id: "a2".into(), desired_description: "stop".into(), ..AllocStop::default() }],
            now,
            ..PlanApply::default()
        }),
        Command::JobDeregister { namespace: "default".into(), job_id: "web".into(), purge: false, eval: None, now },
    ]
}

fn replay(cmds: &[Command]) -> (Arc<StateStore>, Vec<Option<String>>) {
    let store = Arc::new(StateStore::new());
    let fsm = ServerFsm::new(store.clone());
    let results = cmds.iter().enumerate().map(|(i, c)| fsm.apply(i as u64 + 1, c.clone()).error).collect();
    (store, results)
}

#[test]
fn replaying_the_log_rebuilds_identical_state() {
    let cmds = log();
    let (a, ra) = replay(&cmds);
    let (b, rb) = replay(&cmds);
    assert_eq!(ra, rb);
    assert!(ra[5].as_deref().is_some_and(|e| e.contains("node not found")), "{ra:?}");
    let enc = |s: &StateStore| s.snapshot().to_bytes().unwrap();
    assert_eq!(enc(&a), enc(&b));
    let s = a.snapshot();
    assert_eq!(s.index, cmds.len() as u64, "refused commands still advance the applied index");
    assert_eq!(s.alloc("a1").unwrap().client_status, ClientStatus::Running);
    assert_eq!(s.alloc("a2").unwrap().desired_status, nomad_proto::DesiredStatus::Stop);
    assert!(s.job("default", "web").unwrap().stop);
}

#[test]
fn a_snapshot_restores_the_same_state() {
    let (a, _) = replay(&log());
    let fsm = ServerFsm::new(a.clone());
    let bytes = fsm.snapshot().unwrap();
    let restored = Arc::new(StateStore::new());
    ServerFsm::new(restored.clone()).restore(&bytes).unwrap();
    assert_eq!(restored.snapshot().to_bytes().unwrap(), a.snapshot().to_bytes().unwrap());
    let s = restored.snapshot();
    assert_eq!(s.allocs_by_node("n1").count(), 2, "secondary indexes are rebuilt");
    let (a1, a2) = (s.alloc("a1").unwrap(), s.alloc("a2").unwrap());
    assert!(Arc::ptr_eq(a1.job.as_ref().unwrap(), a2.job.as_ref().unwrap()), "allocs share one job copy again");
    assert!(ServerFsm::new(restored).restore(b"{garbage").unwrap_err().contains("decoding state snapshot"));
}

#[test]
fn events_are_published_once_per_committed_command() {
    let store = Arc::new(StateStore::new());
    let broker = Arc::new(EventBroker::new(100));
    let fsm = ServerFsm::with_events(store, broker.clone());
    for (i, c) in log().iter().enumerate() {
        fsm.apply(i as u64 + 1, c.clone());
    }
    // Index 6 was refused and emits nothing; every other command emits one batch.
    assert_eq!(broker.buffered_indexes(), vec![1, 2, 3, 4, 5, 7, 8]);
}
