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

#[test]
fn acl_commands_apply_replay_and_snapshot_without_events() {
    use crate::acl::{AclPolicy, AclRole, AclToken, PolicyLink};
    let token =
        |a: &str| AclToken { accessor_id: a.into(), secret_id: format!("s-{a}"), token_type: "management".into(), ..AclToken::default() };
    let cmds = vec![
        Command::AclTokenBootstrap { token: token("boot"), reset_index: 0 },
        Command::AclTokenBootstrap { token: token("again"), reset_index: 0 },
        Command::AclTokenBootstrap { token: token("reset"), reset_index: 1 },
        Command::AclPolicyUpsert {
            policies: vec![AclPolicy { name: "p".into(), rules: "node { policy = \"read\" }".into(), ..AclPolicy::default() }],
        },
        Command::AclRoleUpsert {
            roles: vec![AclRole {
                id: "r1".into(),
                name: "ops".into(),
                policies: vec![PolicyLink { name: "p".into() }],
                ..AclRole::default()
            }],
        },
        Command::AclRoleUpsert { roles: vec![AclRole { id: "r2".into(), name: "ops".into(), ..AclRole::default() }] },
        Command::AclTokenUpsert { tokens: vec![AclToken { token_type: "client".into(), policies: vec!["p".into()], ..token("c") }] },
        Command::AclTokenDelete { accessor_ids: vec!["boot".into()] },
        Command::AclPolicyDelete { names: vec!["missing".into()] },
    ];
    let (a, results) = replay(&cmds);
    let (b, again) = replay(&cmds);
    assert_eq!(results, again);
    assert_eq!(results[1].as_deref(), Some("ACL bootstrap already done (reset index: 1)"));
    assert!(results[2].is_none(), "the current bootstrap index resets");
    assert!(results[5].as_deref().is_some_and(|e| e.contains("already exists")), "{results:?}");
    assert!(results[8].as_deref().is_some_and(|e| e.contains("not found")), "{results:?}");
    let s = a.snapshot();
    assert_eq!(s.acl_bootstrap_index(), 3);
    assert!(s.acl_token("boot").is_none() && s.acl_token_by_secret("s-reset").is_some());
    let c = s.acl_token("c").unwrap();
    assert_eq!((c.create_index, c.hash.is_empty()), (7, false));
    assert_eq!(a.snapshot().to_bytes().unwrap(), b.snapshot().to_bytes().unwrap());
    let restored = Arc::new(StateStore::new());
    ServerFsm::new(restored.clone()).restore(&ServerFsm::new(a.clone()).snapshot().unwrap()).unwrap();
    assert_eq!(restored.snapshot().to_bytes().unwrap(), a.snapshot().to_bytes().unwrap());

    let broker = Arc::new(EventBroker::new(100));
    let fsm = ServerFsm::with_events(Arc::new(StateStore::new()), broker.clone());
    for (i, c) in cmds.iter().enumerate() {
        fsm.apply(i as u64 + 1, c.clone());
    }
    assert!(broker.buffered_indexes().is_empty(), "ACL changes (secrets) are not published");
}
