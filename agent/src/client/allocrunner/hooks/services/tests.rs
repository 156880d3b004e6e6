//! The services hook against a fake registrar.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use nomad_proto::alloc::task_state;
use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources, AllocatedSharedResources};
use nomad_proto::{Allocation, Job, Node, Service, ServiceRegistration, Task, TaskGroup, TaskState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::super::{AllocHook, HookEnv, Phase, init_hooks, run_phase, run_prekill, run_prerun};
use crate::client::services::{RegistrarError, ServiceRegistrar};
use crate::client::state::HookState;

/// A registrar keeping registrations in memory; it can fail the next calls.
#[derive(Default)]
pub(crate) struct FakeRegistrar {
    regs: Mutex<BTreeMap<String, ServiceRegistration>>,
    /// Every call: `upsert <id>...`, `delete <id>`, `delete_alloc <id>`, prefixed `failed ` when refused.
    log: Mutex<Vec<String>>,
    fail_next: AtomicUsize,
    calls: watch::Sender<u64>,
    answers: watch::Sender<u64>,
}

impl FakeRegistrar {
    fn record(&self, entry: String) -> Result<(), RegistrarError> {
        let fail = self.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        self.log.lock().unwrap().push(if fail { format!("failed {entry}") } else { entry });
        self.calls.send_modify(|n| *n += 1);
        if fail { Err(RegistrarError("servers unreachable".into())) } else { Ok(()) }
    }

    fn ids(&self) -> Vec<String> {
        self.regs.lock().unwrap().keys().cloned().collect()
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until `cond` holds, re-checking after every call.
    async fn wait(&self, what: &str, cond: impl Fn(&FakeRegistrar) -> bool) {
        let mut rx = self.calls.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if cond(self) {
                    return;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        assert!(waited.is_ok(), "timed out waiting for {what}; registered {:?}, calls {:?}", self.ids(), self.log());
    }

    /// Another call to the servers got an answer.
    fn answer(&self) {
        self.answers.send_modify(|n| *n += 1);
    }
}

impl ServiceRegistrar for FakeRegistrar {
    fn upsert(&self, regs: Vec<ServiceRegistration>) -> BoxFuture<'static, Result<(), RegistrarError>> {
        let ids: Vec<&str> = regs.iter().map(|r| r.id.as_str()).collect();
        let result = self.record(format!("upsert {}", ids.join(" ")));
        if result.is_ok() {
            let mut m = self.regs.lock().unwrap();
            for r in regs {
                m.insert(r.id.clone(), r);
            }
        }
        Box::pin(async move { result })
    }

    fn delete_by_id(&self, _namespace: String, id: String) -> BoxFuture<'static, Result<(), RegistrarError>> {
        let result = self.record(format!("delete {id}"));
        if result.is_ok() {
            self.regs.lock().unwrap().remove(&id);
        }
        Box::pin(async move { result })
    }

    fn delete_by_alloc(&self, alloc_id: String) -> BoxFuture<'static, Result<(), RegistrarError>> {
        let result = self.record(format!("delete_alloc {alloc_id}"));
        if result.is_ok() {
            self.regs.lock().unwrap().retain(|_, r| r.alloc_id != alloc_id);
        }
        Box::pin(async move { result })
    }

    fn answers(&self) -> watch::Receiver<u64> {
        self.answers.subscribe()
    }
}

/// A hook environment over `registrar`.
pub(crate) fn env(task_states: watch::Receiver<BTreeMap<String, TaskState>>, registrar: Arc<dyn ServiceRegistrar>) -> HookEnv {
    let mut node = Node { id: "node-1".into(), datacenter: "dc1".into(), ..Node::default() };
    node.attributes.insert("unique.network.ip-address".into(), "10.0.0.9".into());
    let node = Arc::new(node);
    HookEnv {
        task_states,
        deployment_status: Arc::new(|_| {}),
        cancel: CancellationToken::new(),
        shutdown: CancellationToken::new(),
        consul: None,
        consul_checks: None,
        registrar,
        node: Arc::new(move || node.clone()),
        region: "global".into(),
        csi: crate::client::allocrunner::hooks::csi::tests::no_csi(),
        network: Arc::new(crate::client::network::CniNetworks::new(
            crate::config::CniSettings::default(),
            std::path::Path::new("/nonexistent"),
        )),
        consul_config: None,
        nomad_checks: None,
        network_status: Arc::new(|| None),
    }
}

const GROUP_ID: &str = "_nomad-task-a1-group-g-grp-http";
const TASK_ID: &str = "_nomad-task-a1-t-tsk-http";

fn nomad_service(name: &str) -> Service {
    Service { name: name.into(), port_label: "http".into(), provider: "nomad".into(), ..Service::default() }
}

/// A batch alloc (no health watcher) with a group service, a task service, and a long
/// `shutdown_delay`.
fn alloc() -> Allocation {
    let job = Job {
        id: "j".into(),
        job_type: nomad_proto::JobType::Batch,
        task_groups: vec![TaskGroup {
            name: "g".into(),
            services: vec![nomad_service("grp")],
            shutdown_delay: Some(3_600_000_000_000),
            tasks: vec![Task { name: "t".into(), services: vec![nomad_service("tsk")], ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    };
    Allocation {
        id: "a1".into(),
        namespace: "default".into(),
        job_id: "j".into(),
        node_id: "node-1".into(),
        task_group: "g".into(),
        job: Some(Arc::new(job)),
        allocated_resources: Some(AllocatedResources {
            shared: AllocatedSharedResources {
                ports: vec![AllocatedPortMapping { label: "http".into(), value: 31000, to: 0, host_ip: "10.0.0.9".into() }],
                ..AllocatedSharedResources::default()
            },
            ..AllocatedResources::default()
        }),
        ..Allocation::default()
    }
}

fn task_in(t: &str) -> BTreeMap<String, TaskState> {
    BTreeMap::from([("t".to_string(), TaskState { state: t.into(), ..TaskState::default() })])
}

struct Fixture {
    registrar: Arc<FakeRegistrar>,
    task_states: watch::Sender<BTreeMap<String, TaskState>>,
    cancel: CancellationToken,
    hooks: Vec<Box<dyn AllocHook>>,
    dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let registrar = Arc::new(FakeRegistrar::default());
    let (task_states, rx) = watch::channel(task_in(task_state::PENDING));
    let env = env(rx, registrar.clone());
    let cancel = env.cancel.clone();
    Fixture { registrar, task_states, cancel, hooks: init_hooks(env), dir: tempfile::tempdir().unwrap() }
}

impl Fixture {
    fn prerun(&self, alloc: &Allocation, states: &mut BTreeMap<String, HookState>) {
        run_prerun(&self.hooks, alloc, &self.dir.path().join("a1"), states).now_or_never().expect("no CSI volumes: at once").unwrap();
    }
}

#[tokio::test]
async fn group_services_register_at_prerun_and_task_services_while_the_task_runs() {
    let f = fixture();
    let a = alloc();
    let mut states = BTreeMap::new();
    f.prerun(&a, &mut states);
    assert!(states["services"].data.contains_key("registered"), "the hook records that registrations may exist");
    f.registrar.wait("the group service", |r| r.ids() == [GROUP_ID]).await;
    let g = f.registrar.regs.lock().unwrap()[GROUP_ID].clone();
    assert_eq!((g.address.as_str(), g.port, g.node_id.as_str(), g.alloc_id.as_str()), ("10.0.0.9", 31000, "node-1", "a1"));

    f.task_states.send_replace(task_in(task_state::RUNNING));
    f.registrar.wait("the task service", |r| r.ids() == [GROUP_ID, TASK_ID]).await;
    // The task stops (a restart, say): its service goes, the group's stays; it comes back.
    f.task_states.send_replace(task_in(task_state::PENDING));
    f.registrar.wait("the task service removed", |r| r.ids() == [GROUP_ID]).await;
    assert!(f.registrar.log().contains(&format!("delete {TASK_ID}")), "removed by ID: {:?}", f.registrar.log());
    f.task_states.send_replace(task_in(task_state::RUNNING));
    f.registrar.wait("the task service again", |r| r.ids() == [GROUP_ID, TASK_ID]).await;
    f.cancel.cancel();
}

#[tokio::test]
async fn a_failing_registrar_is_retried_until_it_succeeds() {
    let f = fixture();
    f.registrar.fail_next.store(2, Ordering::SeqCst);
    let a = alloc();
    let mut states = BTreeMap::new();
    // Prerun does not wait for the servers: the alloc starts whatever they say.
    f.prerun(&a, &mut states);
    f.registrar.wait("a first failed call", |r| r.log().len() == 1).await;
    assert!(f.registrar.ids().is_empty());
    // Another call getting through ends the backoff at once.
    f.registrar.answer();
    f.registrar.wait("a second call", |r| r.log().len() == 2).await;
    assert_eq!(f.registrar.log(), [format!("failed upsert {GROUP_ID}"), format!("failed upsert {GROUP_ID}")]);
    // Without answers, the backoff alone (2 s now) brings the next attempt.
    f.registrar.wait("the registration", |r| r.ids() == [GROUP_ID]).await;
    assert_eq!(f.registrar.log().len(), 3);
    f.cancel.cancel();
}

#[tokio::test]
async fn prekill_deregisters_before_the_shutdown_delay_and_destroy_is_idempotent() {
    let f = fixture();
    let a = alloc();
    let mut states = BTreeMap::new();
    f.prerun(&a, &mut states);
    f.task_states.send_replace(task_in(task_state::RUNNING));
    f.registrar.wait("both services", |r| r.ids().len() == 2).await;

    let alloc_dir = f.dir.path().join("a1");
    let prekill = run_prekill(&f.hooks, &a, &alloc_dir, &states);
    tokio::pin!(prekill);
    tokio::select! {
        errors = &mut prekill => panic!("prekill ended before the hour-long shutdown delay: {errors:?}"),
        _ = f.registrar.wait("deregistration during prekill", |r| r.ids().is_empty()) => {}
    }
    assert_eq!(f.registrar.log().last().unwrap(), "delete_alloc a1");
    // Still in the shutdown delay; ending it (as an agent shutdown does) lets prekill finish.
    f.cancel.cancel();
    let errors = tokio::time::timeout(Duration::from_secs(10), prekill).await.expect("prekill ends once the delay is cancelled");
    assert!(errors.is_empty(), "{errors:?}");

    let calls = f.registrar.log().len();
    for phase in [Phase::Postrun, Phase::Destroy, Phase::Destroy] {
        assert!(run_phase(&f.hooks, phase, &a, &f.dir.path().join("a1"), &states).is_empty());
    }
    // Task state changes after the stop register nothing again.
    f.task_states.send_replace(task_in(task_state::DEAD));
    f.task_states.send_replace(task_in(task_state::RUNNING));
    tokio::task::yield_now().await;
    assert_eq!(f.registrar.log().len(), calls, "nothing left to remove, nothing registered again: {:?}", f.registrar.log());
    assert!(f.registrar.ids().is_empty());
}

#[tokio::test]
async fn prekill_does_not_wait_for_unreachable_servers_and_the_removal_goes_on_in_the_background() {
    let registrar = Arc::new(FakeRegistrar::default());
    let (_tx, rx) = watch::channel(task_in(task_state::RUNNING));
    let hook = super::ServicesHook::new(&env(rx, registrar.clone()));
    let hooks: Vec<Box<dyn AllocHook>> = vec![Box::new(hook)];
    let dir = tempfile::tempdir().unwrap();
    let a = alloc();
    let mut states = BTreeMap::new();
    run_prerun(&hooks, &a, &dir.path().join("a1"), &mut states).await.unwrap();
    registrar.wait("both services", |r| r.ids().len() == 2).await;
    registrar.fail_next.store(2, Ordering::SeqCst);
    let errors = tokio::time::timeout(Duration::from_secs(10), run_prekill(&hooks, &a, &dir.path().join("a1"), &states)).await.unwrap();
    assert!(errors.is_empty());
    assert_eq!(registrar.log().last().unwrap(), "failed delete_alloc a1", "prekill returned after the first attempt");
    registrar.answer();
    registrar.wait("the removal", |r| r.ids().is_empty()).await;
    assert_eq!(registrar.log().iter().filter(|l| l.contains("delete_alloc")).count(), 3);
}

#[tokio::test]
async fn a_restored_alloc_registers_again_and_drops_services_of_tasks_that_stopped_meanwhile() {
    let registrar = Arc::new(FakeRegistrar::default());
    // What the previous agent registered: both services.
    let a = alloc();
    for id in [GROUP_ID, TASK_ID] {
        registrar
            .regs
            .lock()
            .unwrap()
            .insert(id.into(), ServiceRegistration { id: id.into(), alloc_id: "a1".into(), ..Default::default() });
    }
    // The task exited while the agent was away.
    let (_tx, rx) = watch::channel(task_in(task_state::DEAD));
    let hooks = init_hooks(env(rx, registrar.clone()));
    let dir = tempfile::tempdir().unwrap();
    let mut states = BTreeMap::from([("services".to_string(), HookState::default())]);
    run_prerun(&hooks, &a, &dir.path().join("a1"), &mut states).await.unwrap();
    registrar.wait("the stale task service removed", |r| r.ids() == [GROUP_ID]).await;
    assert_eq!(registrar.log(), [format!("upsert {GROUP_ID}"), format!("delete {TASK_ID}")], "upserted again, stale one removed");

    // A restored alloc that is already over (no prerun) still removes what may be left.
    let registrar = Arc::new(FakeRegistrar::default());
    let (_tx, rx) = watch::channel(task_in(task_state::DEAD));
    let hooks = init_hooks(env(rx, registrar.clone()));
    run_phase(&hooks, Phase::Postrun, &a, &dir.path().join("a1"), &states);
    registrar.wait("the removal", |r| !r.log().is_empty()).await;
    run_phase(&hooks, Phase::Destroy, &a, &dir.path().join("a1"), &states);
    assert_eq!(registrar.log(), ["delete_alloc a1"]);

    // One that never registered anything calls nothing.
    let registrar = Arc::new(FakeRegistrar::default());
    let (_tx, rx) = watch::channel(task_in(task_state::DEAD));
    let hooks = init_hooks(env(rx, registrar.clone()));
    run_phase(&hooks, Phase::Destroy, &a, &dir.path().join("a1"), &BTreeMap::new());
    tokio::task::yield_now().await;
    assert!(registrar.log().is_empty());
}
