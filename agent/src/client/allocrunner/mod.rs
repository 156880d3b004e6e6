//! The alloc runner: runs one allocation's tasks on this node, in lifecycle order, and reports
//! the alloc's client state.
//!
//! ```text
//!            prerun hooks ──error──▶ every task failed ─────────────────────┐
//!  new ──▶  (alloc_dir, health)                                            │
//!   │            │ ok                                                      ▼
//!   │            ▼                                          all tasks dead: postrun hooks
//!   │      task runners, started stage by stage ──────────────────────▶  (terminal; the
//!   │      (prestart ▶ main ▶ poststart; poststop last)                   local state stays
//!   │            │ server wants it stopped: prekill hooks (shutdown_delay),  for restores)
//!   │            │ then kill: leader, other tasks, sidecars                      │
//!   │            │ a task failed: kill its siblings                              │ removed by
//!   │            │ the leader died / every main task died: kill the rest         │ the servers
//!   │            ▼                                                               ▼
//!   └─ restored terminal, or desired stop before it ever ran ──────────▶  destroy hooks,
//!                                                                          state deleted
//! ```
//!
//! Every task state change wakes the runner, which recomputes the lifecycle gates, applies the
//! failure rules above and hands the client-side alloc (status from [`status::client_status`])
//! to the syncer when it changed. The runner never starts a task of an alloc the servers want
//! stopped; poststop tasks run only for an alloc that ran.

pub mod hooks;
pub mod lifecycle;
pub mod status;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nomad_proto::alloc::task_state;
use nomad_proto::{Allocation, ClientStatus, TaskEvent, TaskState, Timestamp};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use self::hooks::{AllocHook, HookEnv, Phase, init_hooks, run_phase, run_prekill, run_prerun};
use self::lifecycle::{Gates, Stage, TaskView, gates};
use super::context::ClientContext;
use super::state::{HookState, StateError};
use super::taskrunner::{NotRunning, TaskRunner, events, lock};
use crate::fs_beneath::{Beneath, FsError, Links, check_name};

/// Why a restart request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestartError {
    /// No task by that name in the alloc.
    #[error("unknown task name {0:?}")]
    UnknownTask(String),
    /// The task (or every task) is not running.
    #[error("{0}")]
    NotRunning(#[from] NotRunning),
}

/// Why tasks are being killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillCause {
    /// The servers want the alloc stopped.
    Stopped,
    /// A task failed.
    SiblingFailed,
    /// The leader task died.
    LeaderDead,
    /// The alloc is being destroyed.
    Destroy,
}

/// Runs one alloc.
pub struct AllocRunner {
    id: String,
    ctx: Arc<ClientContext>,
    alloc: Mutex<Arc<Allocation>>,
    tasks: Vec<Arc<TaskRunner>>,
    hooks: Vec<Box<dyn AllocHook>>,
    hook_states: Mutex<BTreeMap<String, HookState>>,
    gates: watch::Sender<Gates>,
    changed: Arc<Notify>,
    /// A status forced by the runner (the alloc cannot be run at all).
    failure: Option<String>,
    deployment_status: Mutex<Option<serde_json::Value>>,
    killing: AtomicBool,
    sidecars_killed: AtomicBool,
    destroy: CancellationToken,
    hook_cancel: CancellationToken,
    task_states: watch::Sender<BTreeMap<String, TaskState>>,
    last_sent: Mutex<Option<Allocation>>,
    on_change_lock: Mutex<()>,
    destroyed: watch::Sender<bool>,
}

impl AllocRunner {
    /// A runner for `alloc`. With `restore`, task and hook states come from the local state.
    pub fn new(ctx: Arc<ClientContext>, alloc: Allocation, restore: bool) -> Result<Arc<AllocRunner>, StateError> {
        let (stored_tasks, hook_states) =
            if restore { (ctx.state.tasks(&alloc.id)?, ctx.state.alloc_hooks(&alloc.id)?) } else { (BTreeMap::new(), BTreeMap::new()) };
        let alloc = Arc::new(alloc);
        let group = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)).cloned();
        let failure = match &group {
            None => Some(format!("task group {:?} not found in the alloc's job", alloc.task_group)),
            Some(g) if g.tasks.is_empty() => Some(format!("task group {:?} has no tasks", alloc.task_group)),
            Some(g) => unsafe_name(&alloc, g),
        };
        let (gates_tx, gates_rx) = watch::channel(Gates::default());
        let changed = Arc::new(Notify::new());
        let mut stored_tasks = stored_tasks;
        let csi_mounts = hooks::CsiMounts::default();
        let tasks: Vec<Arc<TaskRunner>> = group
            .iter()
            .flat_map(|g| g.tasks.iter())
            .map(|t| {
                let restored = stored_tasks.remove(&t.name);
                TaskRunner::new(ctx.clone(), alloc.clone(), t.clone(), restored, gates_rx.clone(), changed.clone(), csi_mounts.clone())
            })
            .collect();
        let states: BTreeMap<String, TaskState> = tasks.iter().map(|t| (t.name().to_string(), t.state())).collect();
        let (task_states, task_states_rx) = watch::channel(states);
        let hook_cancel = ctx.shutdown.child_token();
        let deployment_status = alloc.deployment_status.clone();
        Ok(Arc::new_cyclic(|weak: &std::sync::Weak<AllocRunner>| {
            let weak_for_network = weak.clone();
            let weak = weak.clone();
            // Weak: a worker outliving the runner must not keep the local state open.
            let node_ctx = Arc::downgrade(&ctx);
            let env = HookEnv {
                task_states: task_states_rx,
                deployment_status: Arc::new(move |status| {
                    if let Some(runner) = weak.upgrade() {
                        *lock(&runner.deployment_status) = Some(status);
                        runner.changed.notify_one();
                    }
                }),
                cancel: hook_cancel.clone(),
                shutdown: ctx.shutdown.clone(),
                registrar: ctx.registrar.clone(),
                consul: ctx.consul_services.clone(),
                consul_checks: ctx.consul_checks.clone(),
                node: Arc::new(move || node_ctx.upgrade().map(|c| c.node()).unwrap_or_default()),
                region: ctx.region.clone(),
                csi: hooks::CsiDeps {
                    volumes: ctx.csi_volumes.clone(),
                    rpc: ctx.csi_rpc.clone(),
                    node_id: ctx.node_id.clone(),
                    mounts: csi_mounts.clone(),
                    save: {
                        let (state, alloc_id) = (Arc::downgrade(&ctx.state), alloc.id.clone());
                        Arc::new(move |hook, hook_state| {
                            if let Some(db) = state.upgrade()
                                && let Err(e) = db.put_alloc_hook(&alloc_id, hook, hook_state)
                            {
                                tracing::error!(alloc_id, hook, error = %e, "persisting hook state failed");
                            }
                        })
                    },
                },
                network: ctx.network.clone(),
                consul_config: ctx.consul_config.clone(),
                nomad_checks: Some(ctx.nomad_checks.clone()),
                network_status: {
                    let weak = weak_for_network.clone();
                    Arc::new(move || {
                        let runner = weak.upgrade()?;
                        let states = lock(&runner.hook_states);
                        states.get("network").and_then(hooks::network_status_of).and_then(|s| serde_json::to_value(s).ok())
                    })
                },
            };
            AllocRunner {
                id: alloc.id.clone(),
                ctx,
                alloc: Mutex::new(alloc),
                tasks,
                hooks: init_hooks(env),
                hook_states: Mutex::new(hook_states),
                gates: gates_tx,
                changed,
                failure,
                deployment_status: Mutex::new(deployment_status),
                killing: AtomicBool::new(false),
                sidecars_killed: AtomicBool::new(false),
                destroy: CancellationToken::new(),
                hook_cancel,
                task_states,
                last_sent: Mutex::new(None),
                on_change_lock: Mutex::new(()),
                destroyed: watch::channel(false).0,
            }
        }))
    }

    /// Alloc ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The server copy of the alloc (with the indexes the client adopted).
    pub fn alloc(&self) -> Arc<Allocation> {
        lock(&self.alloc).clone()
    }

    /// `<alloc_root>/<alloc_id>`.
    pub fn alloc_dir(&self) -> PathBuf {
        self.ctx.alloc_dir(&self.id)
    }

    /// The alloc dir, resolved beneath the alloc root: everything the agent reads or writes in
    /// it goes through this handle (see `fs_beneath`).
    pub fn open_alloc_dir(&self) -> Result<Beneath, FsError> {
        if let Err(reason) = check_name(&self.id) {
            let base = self.ctx.alloc_root.clone();
            return Err(FsError::BadPath { base, path: PathBuf::from(&self.id), reason });
        }
        Beneath::open(&self.ctx.alloc_root)?.open_dir(Path::new(&self.id), Links::Refuse)
    }

    /// The alloc's task names, in the group's order.
    pub fn task_names(&self) -> Vec<String> {
        self.tasks.iter().map(|t| t.name().to_string()).collect()
    }

    /// One task's runner.
    pub fn task(&self, name: &str) -> Option<&Arc<TaskRunner>> {
        self.tasks.iter().find(|t| t.name() == name)
    }

    /// Task states as they change.
    pub fn watch_task_states(&self) -> watch::Receiver<BTreeMap<String, TaskState>> {
        self.task_states.subscribe()
    }

    /// Every task's run loop has ended.
    pub fn tasks_finished(&self) -> bool {
        self.tasks.iter().all(|t| t.is_finished())
    }

    /// The destroy hooks ran and the alloc left the local state.
    pub fn is_destroyed(&self) -> bool {
        *self.destroyed.borrow()
    }

    /// When the last task finished (the client GC collects the oldest first).
    pub fn finished_at(&self) -> Timestamp {
        self.tasks.iter().map(|t| t.state().finished_at).max().unwrap_or_default()
    }

    /// The alloc's ephemeral disk, MiB.
    pub fn disk_mb(&self) -> u64 {
        self.alloc().allocated_resources.as_ref().map_or(0, |r| r.shared.disk_mb.max(0) as u64)
    }

    fn hook_request_alloc_dir(&self) -> PathBuf {
        self.alloc_dir()
    }

    /// Runs the alloc until it is destroyed or the agent shuts down.
    pub async fn run(self: Arc<Self>) {
        let alloc = self.alloc();
        let alloc_dir = self.hook_request_alloc_dir();
        let never_ran = self.tasks.iter().all(|t| t.state().started_at.is_zero() && t.handle().is_none());
        let all_dead = self.tasks.iter().all(|t| t.state().state == task_state::DEAD);
        if alloc.server_terminal() && never_ran {
            // The servers want it stopped before it ever ran here: it never starts.
            self.killing.store(true, Ordering::SeqCst);
            for t in &self.tasks {
                t.kill(None);
            }
        } else if let Some(reason) = &self.failure {
            // Refused before anything is made on disk: no alloc dir, no task dir.
            tracing::error!(alloc_id = %self.id, reason, "refusing the alloc");
            for t in &self.tasks {
                if t.handle().is_some() {
                    t.kill(Some(events::failed_validation(reason)));
                } else if t.state().state != task_state::DEAD {
                    t.mark_failed_dead(events::failed_validation(reason));
                }
            }
        } else if !alloc.terminal() && !all_dead {
            let mut states = lock(&self.hook_states).clone();
            let result = tokio::select! {
                r = run_prerun(&self.hooks, &alloc, &alloc_dir, &mut states) => r,
                // Cut short (a CSI claim waiting): the next start runs prerun again.
                _ = self.ctx.shutdown.cancelled() => return,
            };
            self.save_hook_states(&states);
            if let Err((hook, e)) = result {
                tracing::error!(alloc_id = %self.id, hook, error = %e, "alloc prerun failed");
                let message = format!("failed to setup alloc: {e}");
                for t in &self.tasks {
                    t.mark_failed_dead(events::setup_failure(&message, true));
                }
            }
        }
        for t in &self.tasks {
            self.ctx.tracker.spawn(t.clone().run());
        }
        let mut destroying = false;
        loop {
            self.on_change();
            if self.tasks_finished() {
                break;
            }
            tokio::select! {
                _ = self.changed.notified() => {}
                _ = self.destroy.cancelled(), if !destroying => {
                    destroying = true;
                    self.start_kill(KillCause::Destroy);
                }
                _ = self.ctx.shutdown.cancelled() => return,
            }
        }
        let states = lock(&self.hook_states).clone();
        for (hook, e) in run_phase(&self.hooks, Phase::Postrun, &self.alloc(), &alloc_dir, &states) {
            tracing::warn!(alloc_id = %self.id, hook, error = %e, "alloc postrun hook failed");
        }
        self.on_change();
        // One more terminal alloc: the GC may be over a limit and waiting for one.
        self.ctx.gc_trigger.notify_one();
        // A verdict can still come (the health hook judging the failure that ended the
        // alloc): it goes to the servers like any other change.
        loop {
            tokio::select! {
                _ = self.changed.notified() => self.on_change(),
                _ = self.destroy.cancelled() => break,
                _ = self.ctx.shutdown.cancelled() => return,
            }
        }
        self.hook_cancel.cancel();
        for (hook, e) in run_phase(&self.hooks, Phase::Destroy, &self.alloc(), &alloc_dir, &states) {
            tracing::warn!(alloc_id = %self.id, hook, error = %e, "alloc destroy hook failed");
        }
        if let Err(e) = self.ctx.state.delete_alloc(&self.id) {
            tracing::error!(alloc_id = %self.id, error = %e, "removing the alloc from the local state failed");
        }
        self.destroyed.send_replace(true);
    }

    fn save_hook_states(&self, states: &BTreeMap<String, HookState>) {
        let mut current = lock(&self.hook_states);
        for (name, state) in states {
            if current.get(name) != Some(state)
                && let Err(e) = self.ctx.state.put_alloc_hook(&self.id, name, state)
            {
                tracing::error!(alloc_id = %self.id, hook = name, error = %e, "persisting hook state failed");
            }
        }
        *current = states.clone();
    }

    /// Recomputes gates, applies the failure rules, and hands a changed client alloc to the
    /// syncer.
    fn on_change(self: &Arc<Self>) {
        let _serial = lock(&self.on_change_lock);
        let states: BTreeMap<String, TaskState> = self.tasks.iter().map(|t| (t.name().to_string(), t.state())).collect();
        self.task_states.send_if_modified(|cur| {
            if *cur == states {
                false
            } else {
                *cur = states.clone();
                true
            }
        });
        let alloc = self.alloc();

        // Lifecycle gates; they only ever open.
        let views: BTreeMap<String, TaskView<'_>> = self
            .tasks
            .iter()
            .map(|t| (t.name().to_string(), TaskView { stage: t.stage(), sidecar: t.sidecar(), state: &states[t.name()] }))
            .collect();
        let open = gates(&views);
        let ran = self.tasks.iter().filter(|t| t.stage() != Stage::Poststop).any(|t| !states[t.name()].started_at.is_zero());
        if open.poststop && !ran {
            // Nothing ran, so there is nothing to clean up after: poststop tasks never start.
            for t in self.tasks.iter().filter(|t| t.stage() == Stage::Poststop) {
                t.kill(None);
            }
        }
        self.gates.send_if_modified(|g| {
            let new = Gates {
                prestart: g.prestart || open.prestart,
                main: g.main || open.main,
                poststart: g.poststart || open.poststart,
                poststop: g.poststop || (open.poststop && ran),
            };
            let modified = new != *g;
            *g = new;
            modified
        });

        // What makes the alloc's tasks stop.
        if !self.killing.load(Ordering::SeqCst) {
            let dead = |t: &Arc<TaskRunner>| states[t.name()].state == task_state::DEAD;
            if alloc.server_terminal() {
                self.start_kill(KillCause::Stopped);
            } else if let Some(failed) = self.tasks.iter().find(|t| dead(t) && states[t.name()].failed) {
                let name = failed.name().to_string();
                self.start_kill_with(KillCause::SiblingFailed, Some(events::sibling_failed(&name)));
            } else if self.tasks.iter().any(|t| t.leader() && dead(t)) {
                self.start_kill_with(KillCause::LeaderDead, Some(events::leader_dead()));
            } else {
                let mains: Vec<_> = self.tasks.iter().filter(|t| t.stage() == Stage::Main).collect();
                let sidecars_live = self.tasks.iter().any(|t| t.sidecar() && !dead(t));
                if !mains.is_empty() && mains.iter().all(|t| dead(t)) && sidecars_live && !self.sidecars_killed.swap(true, Ordering::SeqCst)
                {
                    for t in self.tasks.iter().filter(|t| t.sidecar()) {
                        t.kill(Some(events::main_dead()));
                    }
                }
            }
        }

        let update = self.client_alloc_from(states);
        let mut last = lock(&self.last_sent);
        if last.as_ref() != Some(&update) {
            let _ = self.ctx.updates.send(with_finish_times(update.clone()));
            *last = Some(update);
        }
    }

    fn start_kill(self: &Arc<Self>, cause: KillCause) {
        self.start_kill_with(cause, None);
    }

    /// Kills the tasks in the background: prekill hooks first when the alloc stops; then the
    /// leader, then the other tasks, then the sidecars. Poststop tasks are left to run, except
    /// on destroy.
    fn start_kill_with(self: &Arc<Self>, cause: KillCause, reason: Option<TaskEvent>) {
        if self.killing.swap(true, Ordering::SeqCst) && cause != KillCause::Destroy {
            return;
        }
        let runner = self.clone();
        let shutdown = self.ctx.shutdown.clone();
        let kill = async move {
            if matches!(cause, KillCause::Stopped | KillCause::Destroy) {
                let states = lock(&runner.hook_states).clone();
                let alloc = runner.alloc();
                for (hook, e) in run_prekill(&runner.hooks, &alloc, &runner.alloc_dir(), &states).await {
                    tracing::warn!(alloc_id = %runner.id, hook, error = %e, "prekill hook failed");
                }
            }
            let kill_group = |pick: &dyn Fn(&TaskRunner) -> bool| {
                let group: Vec<Arc<TaskRunner>> = runner.tasks.iter().filter(|t| pick(t)).cloned().collect();
                for t in &group {
                    t.kill(reason.clone());
                }
                async move {
                    for t in group {
                        t.wait_finished().await;
                    }
                }
            };
            let keep_poststop = cause != KillCause::Destroy;
            let eligible = |t: &TaskRunner| !(keep_poststop && t.stage() == Stage::Poststop);
            kill_group(&|t| t.leader() && eligible(t)).await;
            kill_group(&|t| !t.leader() && !t.sidecar() && eligible(t)).await;
            kill_group(&|t| t.sidecar() && eligible(t)).await;
        };
        // An agent shutting down stops waiting: its task runners return without the tasks
        // finishing (a later agent reattaches and kills what the servers still want stopped),
        // so waiting on would hold the shutdown forever.
        self.ctx.tracker.spawn(async move {
            tokio::select! {
                () = kill => {}
                () = shutdown.cancelled() => {}
            }
        });
    }

    /// The client's view of the alloc, stripped to what it may report.
    pub fn client_alloc(&self) -> Allocation {
        let states: BTreeMap<String, TaskState> = self.tasks.iter().map(|t| (t.name().to_string(), t.state())).collect();
        with_finish_times(self.client_alloc_from(states))
    }

    fn client_alloc_from(&self, states: BTreeMap<String, TaskState>) -> Allocation {
        let alloc = self.alloc();
        let (status, description) = match &self.failure {
            Some(reason) => (ClientStatus::Failed, reason.clone()),
            None => {
                let (s, d) = status::client_status(&states);
                (s, d.to_string())
            }
        };
        Allocation {
            id: self.id.clone(),
            node_id: alloc.node_id.clone(),
            client_status: status,
            client_description: description,
            task_states: Some(states),
            deployment_status: lock(&self.deployment_status).clone(),
            network_status: lock(&self.hook_states)
                .get("network")
                .and_then(hooks::network_status_of)
                .and_then(|s| serde_json::to_value(s).ok()),
            ..Allocation::default()
        }
    }

    /// A new version of the alloc from the servers (already persisted by the client).
    pub fn update(self: &Arc<Self>, alloc: Allocation) {
        let alloc = Arc::new(alloc);
        *lock(&self.alloc) = alloc.clone();
        for t in &self.tasks {
            t.update_alloc(alloc.clone());
        }
        let states = lock(&self.hook_states).clone();
        for (hook, e) in run_phase(&self.hooks, Phase::Update, &alloc, &self.alloc_dir(), &states) {
            tracing::warn!(alloc_id = %self.id, hook, error = %e, "alloc update hook failed");
        }
        self.on_change();
    }

    /// The servers marked the alloc `unknown` while this client was away, and still want it
    /// to run: record `Reconnected` on every task, adopt the server's indexes, save, and queue
    /// the alloc's real state for the servers.
    pub fn reconnect(self: &Arc<Self>, update: &Allocation) -> Result<(), StateError> {
        for t in &self.tasks {
            t.append_event(events::reconnected());
        }
        let mut alloc = (*self.alloc()).clone();
        alloc.alloc_modify_index = update.alloc_modify_index;
        alloc.modify_index = update.modify_index;
        alloc.modify_time = update.modify_time;
        self.ctx.state.put_alloc(&alloc)?;
        *lock(&self.alloc) = Arc::new(alloc);
        self.on_change();
        Ok(())
    }

    /// Restarts one task, or every running task, without counting against restart policies.
    pub fn restart(&self, task: Option<&str>, all_tasks: bool) -> Result<(), RestartError> {
        let reason = "User requested task to restart";
        if let Some(name) = task.filter(|n| !n.is_empty()) {
            let t = self.task(name).ok_or_else(|| RestartError::UnknownTask(name.to_string()))?;
            return Ok(t.restart(events::restart_signaled(reason))?);
        }
        let mut restarted = false;
        for t in &self.tasks {
            if (all_tasks || t.handle().is_some()) && t.restart(events::restart_signaled(reason)).is_ok() {
                restarted = true;
            }
        }
        if restarted { Ok(()) } else { Err(RestartError::NotRunning(NotRunning)) }
    }

    /// Stops everything, runs the destroy hooks and removes the alloc from the local state.
    /// Returns once done (or at agent shutdown).
    pub async fn destroy(self: &Arc<Self>) {
        self.destroy.cancel();
        let mut rx = self.destroyed.subscribe();
        tokio::select! {
            _ = rx.wait_for(|d| *d) => {}
            _ = self.ctx.shutdown.cancelled() => {}
        }
    }
}

/// Why the alloc cannot run here because a name that becomes a directory (the alloc ID under
/// the alloc root, each task under the alloc dir) or the group's name is not one plain path
/// component: `..`, `.`, `/`, NUL, empty. The servers refuse those at admission; this client
/// does not rely on it.
fn unsafe_name(alloc: &Allocation, group: &nomad_proto::TaskGroup) -> Option<String> {
    let named = std::iter::once(("alloc ID", alloc.id.as_str()))
        .chain(std::iter::once(("task group name", group.name.as_str())))
        .chain(group.tasks.iter().map(|t| ("task name", t.name.as_str())));
    for (what, name) in named {
        if let Err(reason) = check_name(name) {
            return Some(format!("{what} {name:?} {reason}: it must be usable as a directory name"));
        }
    }
    None
}

/// A terminal alloc's tasks all get a finish time (the servers compute reschedule times from
/// it), as Nomad's client does.
fn with_finish_times(mut a: Allocation) -> Allocation {
    if a.client_status.is_terminal() {
        let now = Timestamp::now();
        for s in a.task_states.iter_mut().flat_map(|m| m.values_mut()) {
            if s.finished_at.is_zero() {
                s.finished_at = now;
            }
        }
    }
    a
}
