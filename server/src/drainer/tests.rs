//! The drain decision over hand-built states, one pass with a recording
//! writer, and the completion command.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use nomad_proto::job::{CsiPluginConfig, MigrateStrategy};
use nomad_proto::node::DrainStrategy;
use nomad_proto::{
    Allocation, ClientStatus, DesiredStatus, DesiredTransition, Evaluation, Job, JobType, NodeStatus, SchedulingEligibility, Task,
    TaskGroup, Timestamp,
};

use super::*;
use crate::fsm::{Command, Fsm, ServerFsm};
use crate::state::StateStore;

const SEC: i64 = 1_000_000_000;
/// A fixed "now" for decisions.
const NOW: Timestamp = Timestamp(1_700_000_000 * SEC);

/// A state built write by write.
struct World {
    store: Arc<StateStore>,
    index: u64,
}

impl World {
    fn new() -> World {
        let w = World { store: Arc::new(StateStore::new()), index: 0 };
        for id in ["n1", "n2", "n3"] {
            w.clone_write(|tx| {
                let mut n = crate::testing::node(id);
                n.status = NodeStatus::Ready;
                tx.upsert_node(n, NOW);
                Ok(())
            });
        }
        w
    }

    fn clone_write(&self, f: impl FnOnce(&mut crate::state::Txn<'_>) -> Result<(), crate::state::TxnError>) {
        let index = self.store.snapshot().index + 1;
        self.store.write(index, f).unwrap();
    }

    fn write(&mut self, f: impl FnOnce(&mut crate::state::Txn<'_>) -> Result<(), crate::state::TxnError>) {
        self.clone_write(f);
        self.index = self.store.snapshot().index;
    }

    /// Drains `node` with a force deadline `deadline` from NOW (None: no deadline).
    fn drain(&mut self, node: &str, deadline: Option<i64>, ignore_system: bool) {
        let d = DrainStrategy {
            deadline: deadline.unwrap_or(0),
            ignore_system_jobs: ignore_system,
            force_deadline: deadline.map_or(Timestamp::ZERO, |d| NOW.add_nanos(d)),
            started_at: NOW,
        };
        self.write(|tx| tx.update_node_drain(node, Some(d), false, None, NOW).map(|_| ()));
    }

    fn job(&mut self, job: Job) -> Job {
        let mut job = job;
        job.canonicalize();
        let j = job.clone();
        self.write(|tx| tx.upsert_job(j).map(|_| ()));
        (**self.store.snapshot().job("default", &job.id).unwrap()).clone()
    }

    /// A running alloc `job.g[i]` on `node`, healthy or not yet judged.
    fn alloc(&mut self, id: &str, job: &Job, i: u64, node: &str, healthy: bool) {
        let a = Allocation {
            id: id.into(),
            namespace: "default".into(),
            name: format!("{}.g[{i}]", job.id),
            job_id: job.id.clone(),
            job: Some(Arc::new(job.clone())),
            task_group: "g".into(),
            node_id: node.into(),
            client_status: ClientStatus::Running,
            deployment_status: healthy.then(|| serde_json::json!({ "Healthy": true })),
            ..Allocation::default()
        };
        self.write(|tx| {
            tx.upsert_allocs_from_plan(vec![a]);
            Ok(())
        });
    }

    fn update(&mut self, id: &str, f: impl FnOnce(&mut Allocation)) {
        let mut a = (**self.store.snapshot().alloc(id).unwrap()).clone();
        f(&mut a);
        self.write(|tx| {
            tx.update_allocs_from_client(&[a.clone()], 0);
            // Fields a client cannot set (desired status, transition) go through the plan path.
            tx.upsert_allocs_from_plan(vec![a]);
            Ok(())
        });
    }

    fn mark(&mut self, id: &str) {
        self.update(id, |a| a.desired_transition.migrate = Some(true));
    }

    fn stop(&mut self, id: &str) {
        self.update(id, |a| a.desired_status = DesiredStatus::Stop);
    }

    fn finish(&mut self, id: &str) {
        self.update(id, |a| a.client_status = ClientStatus::Complete);
    }

    fn decide(&self, now: Timestamp) -> DrainActions {
        let snap = self.store.snapshot();
        let draining: Vec<String> = snap.nodes().filter(|n| n.drain_strategy.is_some()).map(|n| n.id.clone()).collect();
        decide(&snap, draining.iter().map(String::as_str), now)
    }
}

fn service(id: &str, count: i64, max_parallel: i64) -> Job {
    Job {
        id: id.into(),
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count,
            migrate: Some(MigrateStrategy { max_parallel, ..MigrateStrategy::default() }),
            tasks: vec![Task { name: "t".into(), driver: "raw_exec".into(), ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn typed(id: &str, job_type: JobType) -> Job {
    let mut j = service(id, 1, 1);
    j.job_type = job_type;
    j.task_groups[0].migrate = None;
    j
}

fn plugin(id: &str) -> Job {
    let mut j = typed(id, JobType::System);
    j.task_groups[0].tasks[0].csi_plugin_config = Some(CsiPluginConfig { id: "disk".into(), ..CsiPluginConfig::default() });
    j
}

fn marked(a: &DrainActions) -> Vec<&str> {
    a.migrate.keys().map(String::as_str).collect()
}

#[test]
fn service_allocs_migrate_max_parallel_at_a_time_across_draining_nodes() {
    let mut w = World::new();
    let web = w.job(service("web", 3, 1));
    w.alloc("a0", &web, 0, "n1", true);
    w.alloc("a1", &web, 1, "n1", true);
    w.alloc("a2", &web, 2, "n2", true);
    w.drain("n1", None, false);
    w.drain("n2", None, false);
    assert_eq!(marked(&w.decide(NOW)), ["a0"], "one at a time, lowest name first");

    // Marked but not yet stopped by the scheduler: it is leaving, so nothing more moves.
    w.mark("a0");
    assert!(w.decide(NOW).migrate.is_empty());
    // The scheduler stops it and places a replacement on n3, not yet healthy.
    w.stop("a0");
    w.alloc("r0", &web, 0, "n3", false);
    assert!(w.decide(NOW).migrate.is_empty(), "the replacement has not reported health");
    w.update("r0", |a| a.deployment_status = Some(serde_json::json!({ "Healthy": true })));
    assert_eq!(marked(&w.decide(NOW)), ["a1"], "the next batch once the replacement is healthy");
    let d = w.decide(NOW);
    assert!(d.complete.is_empty() && d.next_deadline.is_none());
}

#[test]
fn max_parallel_above_one_moves_that_many_and_unhealthy_allocs_wait() {
    let mut w = World::new();
    let web = w.job(service("web", 4, 2));
    for i in 0..4 {
        w.alloc(&format!("a{i}"), &web, i, "n1", i != 3);
    }
    w.drain("n1", None, false);
    // 3 healthy, count - max_parallel = 2: one may go now.
    assert_eq!(marked(&w.decide(NOW)), ["a0"]);
    w.update("a3", |a| a.deployment_status = Some(serde_json::json!({ "Healthy": false })));
    assert_eq!(marked(&w.decide(NOW)), ["a0", "a1"], "a judged alloc counts, healthy or not (Nomad's HasHealth)");
}

#[test]
fn allocs_of_nodes_that_are_not_draining_are_never_marked() {
    let mut w = World::new();
    let web = w.job(service("web", 2, 1));
    w.alloc("a0", &web, 0, "n1", true);
    w.alloc("a1", &web, 1, "n2", true);
    w.drain("n1", None, false);
    assert_eq!(marked(&w.decide(NOW)), ["a0"]);
    w.mark("a0");
    w.stop("a0");
    w.alloc("r0", &web, 0, "n3", true);
    assert!(w.decide(NOW).migrate.is_empty(), "a1 is on a node that is not draining");
}

#[test]
fn system_allocs_leave_after_everything_else_and_plugins_last() {
    let mut w = World::new();
    let web = w.job(service("web", 1, 1));
    let sys = w.job(typed("logs", JobType::System));
    let csi = w.job(plugin("csi-node"));
    w.alloc("s", &web, 0, "n1", true);
    w.alloc("y", &sys, 0, "n1", false);
    w.alloc("p", &csi, 0, "n1", false);
    w.drain("n1", None, false);
    assert_eq!(marked(&w.decide(NOW)), ["s"]);
    w.mark("s");
    w.stop("s");
    assert!(w.decide(NOW).migrate.is_empty(), "the service alloc is stopping but its client still runs it");
    w.finish("s");
    assert_eq!(marked(&w.decide(NOW)), ["y"], "system next");
    w.mark("y");
    w.stop("y");
    assert!(w.decide(NOW).migrate.is_empty());
    w.finish("y");
    assert_eq!(marked(&w.decide(NOW)), ["p"], "the CSI plugin last");
    w.mark("p");
    w.stop("p");
    w.finish("p");
    let d = w.decide(NOW);
    assert!(d.migrate.is_empty());
    assert_eq!(d.complete, vec![("n1".to_string(), false)]);
}

#[test]
fn ignore_system_jobs_keeps_system_allocs_and_completes_without_them() {
    let mut w = World::new();
    let web = w.job(service("web", 1, 1));
    let sys = w.job(typed("logs", JobType::System));
    w.alloc("s", &web, 0, "n1", true);
    w.alloc("y", &sys, 0, "n1", false);
    w.drain("n1", Some(3600 * SEC), true);
    assert_eq!(marked(&w.decide(NOW)), ["s"]);
    w.mark("s");
    w.stop("s");
    w.finish("s");
    let d = w.decide(NOW);
    assert!(d.migrate.is_empty(), "{d:?}");
    assert_eq!(d.complete, vec![("n1".to_string(), false)]);
    // Even past the deadline the system alloc is left alone.
    let mut w2 = World::new();
    let sys = w2.job(typed("logs", JobType::System));
    w2.alloc("y", &sys, 0, "n1", false);
    w2.drain("n1", Some(SEC), true);
    let d = w2.decide(NOW.add_nanos(2 * SEC));
    assert!(d.migrate.is_empty());
    assert_eq!(d.complete, vec![("n1".to_string(), true)]);
}

#[test]
fn batch_allocs_finish_on_their_own_until_the_deadline_forces_everything() {
    let mut w = World::new();
    let job = w.job(typed("report", JobType::Batch));
    let sys = w.job(typed("logs", JobType::System));
    let slow = w.job(service("slow", 1, 1));
    w.alloc("b", &job, 0, "n1", false);
    w.alloc("y", &sys, 0, "n1", false);
    w.alloc("u", &slow, 0, "n1", false);
    w.drain("n1", Some(60 * SEC), false);
    let d = w.decide(NOW);
    assert!(d.migrate.is_empty(), "batch waits, the unhealthy service alloc waits, system waits for both: {d:?}");
    assert_eq!(d.next_deadline, Some(NOW.add_nanos(60 * SEC)));
    let later = NOW.add_nanos(60 * SEC);
    let d = w.decide(later);
    assert_eq!(marked(&d), ["b", "u", "y"], "the deadline moves everything left at once");
    assert_eq!(d.next_deadline, None);
    for id in ["b", "u", "y"] {
        w.mark(id);
        w.stop(id);
    }
    assert!(w.decide(later).complete.is_empty(), "not done while clients still run them");
    for id in ["b", "u", "y"] {
        w.finish(id);
    }
    assert_eq!(w.decide(later).complete, vec![("n1".to_string(), true)]);
}

#[test]
fn a_batch_alloc_that_finishes_lets_the_drain_complete_before_the_deadline() {
    let mut w = World::new();
    let job = w.job(typed("report", JobType::Batch));
    w.alloc("b", &job, 0, "n1", false);
    w.drain("n1", None, false);
    let d = w.decide(NOW);
    assert!(d.migrate.is_empty() && d.complete.is_empty() && d.next_deadline.is_none(), "no deadline: never forced");
    w.finish("b");
    assert_eq!(w.decide(NOW).complete, vec![("n1".to_string(), false)]);
}

#[test]
fn an_empty_node_completes_at_once_and_lost_allocs_count_as_gone() {
    let mut w = World::new();
    let web = w.job(service("web", 1, 1));
    w.drain("n2", None, false);
    w.alloc("a0", &web, 0, "n1", true);
    w.update("a0", |a| a.client_status = ClientStatus::Lost);
    w.drain("n1", None, false);
    let mut done = w.decide(NOW).complete;
    done.sort();
    assert_eq!(done, vec![("n1".to_string(), false), ("n2".to_string(), false)]);
}

/// One migration write: transitions and evals.
type Migration = (BTreeMap<String, DesiredTransition>, Vec<Evaluation>);

/// Records the drainer's writes and applies them to the store.
#[derive(Default)]
struct Recorder {
    fsm: Mutex<Option<(ServerFsm, u64)>>,
    migrations: Mutex<Vec<Migration>>,
    completions: Mutex<Vec<Vec<DrainComplete>>>,
}

impl Recorder {
    fn over(store: Arc<StateStore>) -> Arc<Recorder> {
        let index = store.snapshot().index;
        Arc::new(Recorder { fsm: Mutex::new(Some((ServerFsm::new(store), index))), ..Recorder::default() })
    }

    fn apply(&self, cmd: Command) -> Result<u64, ApplyError> {
        let mut g = self.fsm.lock().unwrap();
        let (fsm, index) = g.as_mut().unwrap();
        *index = (*index).max(fsm.store().snapshot().index) + 1;
        match fsm.apply(*index, cmd).error {
            None => Ok(*index),
            Some(e) => Err(ApplyError::Refused(e)),
        }
    }
}

impl DrainWriter for Recorder {
    fn migrate(&self, transitions: BTreeMap<String, DesiredTransition>, evals: Vec<Evaluation>) -> BoxFuture<'_, Result<u64, ApplyError>> {
        self.migrations.lock().unwrap().push((transitions.clone(), evals.clone()));
        let r = self.apply(Command::AllocDesiredTransition { transitions, evals });
        Box::pin(async move { r })
    }

    fn drains_complete(&self, nodes: Vec<DrainComplete>, now: Timestamp) -> BoxFuture<'_, Result<u64, ApplyError>> {
        self.completions.lock().unwrap().push(nodes.clone());
        let r = self.apply(Command::NodeDrainComplete { nodes, now });
        Box::pin(async move { r })
    }
}

#[tokio::test]
async fn a_pass_marks_allocs_with_one_node_drain_eval_per_job_and_completes_with_nomads_event() {
    let mut w = World::new();
    let web = w.job(service("web", 2, 2));
    let api = w.job(service("api", 1, 1));
    w.alloc("a0", &web, 0, "n1", true);
    w.alloc("a1", &web, 1, "n1", true);
    w.alloc("b0", &api, 0, "n1", true);
    w.drain("n1", Some(-SEC), false);
    let rec = Recorder::over(w.store.clone());
    let mut drainer = Drainer::new(w.store.clone(), rec.clone(), DrainerConfig { max_per_write: 2, ..DrainerConfig::default() });
    let (actions, wrote) = drainer.pass(&w.store.snapshot(), NOW).await.unwrap();
    assert!(wrote);
    assert_eq!(marked(&actions), ["a0", "a1", "b0"], "forced: everything at once");
    let migrations = rec.migrations.lock().unwrap().clone();
    assert_eq!(migrations.iter().map(|(t, _)| t.len()).collect::<Vec<_>>(), [2, 1], "split into writes of max_per_write");
    let mut jobs: Vec<(String, String, JobType)> =
        migrations.iter().flat_map(|(_, e)| e.iter().map(|e| (e.job_id.clone(), e.triggered_by.clone(), e.eval_type))).collect();
    jobs.sort();
    assert_eq!(jobs, [("api".into(), "node-drain".into(), JobType::Service), ("web".into(), "node-drain".into(), JobType::Service)]);
    let snap = w.store.snapshot();
    assert!(["a0", "a1", "b0"].iter().all(|id| snap.alloc(id).unwrap().desired_transition.should_migrate()));
    assert_eq!(snap.evals().filter(|e| e.triggered_by == "node-drain").count(), 2);

    // Nothing new to do: the next pass writes nothing.
    let (_, wrote) = drainer.pass(&w.store.snapshot(), NOW).await.unwrap();
    assert!(!wrote);
    for id in ["a0", "a1", "b0"] {
        w.stop(id);
        w.finish(id);
    }
    let (actions, wrote) = drainer.pass(&w.store.snapshot(), NOW).await.unwrap();
    assert!(wrote);
    assert_eq!(actions.complete, vec![("n1".to_string(), true)]);
    let n = w.store.snapshot().node("n1").unwrap().clone();
    assert!(n.drain_strategy.is_none());
    assert_eq!(n.scheduling_eligibility, SchedulingEligibility::Ineligible, "the node stays ineligible");
    assert_eq!(n.last_drain.as_ref().unwrap().status, "complete");
    let ev = n.events.last().unwrap();
    assert_eq!((ev.message.as_str(), ev.subsystem.as_str()), ("Node drain complete", "Drain"));
    assert_eq!(ev.details.get("deadline_reached").map(String::as_str), Some("true"));
    assert_eq!(ev.create_index, n.modify_index);

    // The drain is no longer tracked.
    let (actions, wrote) = drainer.pass(&w.store.snapshot(), NOW).await.unwrap();
    assert!(!wrote && actions == DrainActions::default());
    assert!(drainer.draining.is_empty());
}

#[test]
fn completion_skips_nodes_whose_drain_was_cancelled_or_that_are_gone() {
    let mut w = World::new();
    w.drain("n1", None, false);
    let fsm = ServerFsm::new(w.store.clone());
    let next = w.index + 1;
    let cmd = Command::NodeDrainComplete {
        nodes: vec![
            DrainComplete { node_id: "n2".into(), event: complete_event(false, NOW) },
            DrainComplete { node_id: "ghost".into(), event: complete_event(false, NOW) },
            DrainComplete { node_id: "n1".into(), event: complete_event(false, NOW) },
        ],
        now: NOW,
    };
    assert_eq!(fsm.apply(next, cmd).error, None);
    let snap = w.store.snapshot();
    let n2 = snap.node("n2").unwrap();
    assert!(n2.last_drain.is_none() && n2.modify_index < next, "not draining: untouched");
    let n1 = snap.node("n1").unwrap();
    assert_eq!((n1.drain_strategy.as_ref(), n1.last_drain.as_ref().unwrap().status.as_str()), (None, "complete"));
    assert!(n1.events.last().unwrap().details.is_empty(), "no deadline_reached when the drain finished on its own");
}

#[test]
fn completion_and_migration_events_have_nomads_types() {
    let mut w = World::new();
    let web = w.job(service("web", 1, 1));
    w.alloc("a0", &web, 0, "n1", true);
    w.drain("n1", None, false);
    let broker = Arc::new(crate::events::EventBroker::new(100));
    let fsm = ServerFsm::with_events(w.store.clone(), broker.clone());
    let transitions = BTreeMap::from([("a0".to_string(), DesiredTransition { migrate: Some(true), ..DesiredTransition::default() })]);
    assert_eq!(fsm.apply(w.index + 1, Command::AllocDesiredTransition { transitions, evals: vec![] }).error, None);
    let nodes = vec![DrainComplete { node_id: "n1".into(), event: complete_event(true, NOW) }];
    assert_eq!(fsm.apply(w.index + 2, Command::NodeDrainComplete { nodes, now: NOW }).error, None);
    let mut sub = broker.subscribe(0);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (a, b) = rt.block_on(async { (sub.next().await.unwrap(), sub.next().await.unwrap()) });
    assert_eq!((a.events[0].topic.as_str(), a.events[0].event_type.as_str()), ("Allocation", "AllocationUpdateDesiredStatus"));
    assert_eq!((b.events[0].topic.as_str(), b.events[0].event_type.as_str()), ("Node", "NodeDrain"));
    assert_eq!(b.events[0].payload["Node"]["LastDrain"]["Status"], "complete");
    assert_eq!(b.events[0].payload["Node"]["SecretID"], "");
}
