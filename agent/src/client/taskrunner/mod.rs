//! The task runner: runs one task of an alloc through its driver, restarts it by its policy,
//! kills it when asked, and records what happened as Nomad task states and events.
//!
//! ```text
//!                      ┌──────────── Restarting (delay) ◀──────────────┐
//!                      ▼                                               │ restart policy
//!  pending ──gate──▶ prestart hooks ──▶ driver start ──▶ running ──▶ exited ──▶ decision
//!     │                   │ error            │ error       │ kill                │ no restart
//!     │                   └────────┬─────────┘             ▼                     ▼
//!     │                            └──────────────▶ decision     Killing ─▶ Killed ─▶ dead ──▶ stop hooks
//!     └── killed before it started ────────────────────────────────────────────▶ dead
//! ```
//!
//! The state lives in [`LocalTaskState`] and is persisted on every change; the driver's handle
//! is persisted (durably) in the same write that marks the task running, before anyone hears
//! it runs. On agent restart the runner starts from the persisted state: a handle means the
//! task may still run, and the driver's `recover` either reattaches (same process, no restart)
//! or reports how it ended meanwhile, which then goes through the restart policy.
//!
//! An agent shutdown stops the runner at its next wait without touching the task.

pub mod env;
pub mod events;
pub mod hooks;
pub mod interpolate;
pub mod restart;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nomad_proto::alloc::task_state;
use nomad_proto::{Allocation, RestartPolicy, Task, TaskEvent, TaskState, Timestamp};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use self::env::{EnvInput, TaskDirs, build_env};
use self::hooks::consul_si_token::read_token;
use self::hooks::csi_plugin_supervisor::{TaskControl, csi_endpoint, plugin_mounts};
use self::hooks::{
    ConsulSiTokenHook, CsiPluginSupervisorHook, EnvoyBootstrapDeps, EnvoyBootstrapHook, EnvoyVersionHook, HookRequest, PostPhase,
    PrestartError, TaskHook, envoy_version, run_post, run_prestart,
};
use self::interpolate::Interpolator;
use self::restart::{Decision, Policy, RestartTracker};
use super::allocrunner::lifecycle::{Gates, Stage};
use super::context::ClientContext;
use super::driver::{Driver, DriverError, ExitResult, LogConfig, Recovered, TaskConfig, TaskHandle, TaskResources, parse_signal};
use super::state::{Durability, LocalTaskState};
use crate::client::template::TemplateControl;
use crate::fs_beneath::{Beneath, Links};

/// Nomad's default kill signal for process drivers (a driver may have its own).
const DEFAULT_KILL_SIGNAL: Signal = Signal::SIGINT;

/// A restart was asked of a task that is not running.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Task not running")]
pub struct NotRunning;

/// Runs one task.
pub struct TaskRunner {
    alloc_id: String,
    name: String,
    stage: Stage,
    sidecar: bool,
    leader: bool,
    ctx: Arc<ClientContext>,
    alloc: Mutex<Arc<Allocation>>,
    task: Mutex<Task>,
    local: Mutex<LocalTaskState>,
    hooks: Vec<Box<dyn TaskHook>>,
    gates: watch::Receiver<Gates>,
    kill: CancellationToken,
    restart: Notify,
    restart_pending: AtomicBool,
    /// The pending restart counts as a failure (check_restart).
    restart_failure: AtomicBool,
    changed: Arc<Notify>,
    finished: watch::Sender<bool>,
    /// The group's CSI volumes as the `csi` alloc hook mounted them.
    csi_mounts: crate::client::allocrunner::hooks::CsiMounts,
}

/// What the loop does next.
enum Next {
    Start,
    Attach(Arc<dyn Driver>, TaskHandle),
    Exited(ExitResult),
    Finished,
}

/// How a run of the loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Done,
    Shutdown,
}

/// Why the task stopped running.
enum How {
    Natural,
    Killed,
    Restart,
    /// Restarted by `check_restart`: counts as a failure.
    RestartFailure,
}

/// Why a start failed.
struct StartFailure {
    recoverable: bool,
    /// A prestart hook was abandoned because the task was killed or the agent shuts down.
    cancelled: bool,
}

fn recoverable(e: &DriverError) -> bool {
    e.transient_files_error()
        || matches!(
            e,
            DriverError::Executor(_)
                | DriverError::Cgroup(_)
                | DriverError::Runtime(_)
                | DriverError::Docker(_)
                | DriverError::Signal(_)
                | DriverError::Io { .. }
        )
}

impl TaskRunner {
    /// A runner for `task` of `alloc`; `restored` is its persisted state after an agent restart.
    pub fn new(
        ctx: Arc<ClientContext>,
        alloc: Arc<Allocation>,
        task: Task,
        restored: Option<LocalTaskState>,
        gates: watch::Receiver<Gates>,
        changed: Arc<Notify>,
        csi_mounts: crate::client::allocrunner::hooks::CsiMounts,
    ) -> Arc<TaskRunner> {
        let fresh = restored.is_none();
        let local = restored.unwrap_or_else(|| {
            let mut l = LocalTaskState::default();
            // A finished alloc this client no longer has (collected, then listed again by the
            // servers after a restart) keeps the servers' record of its tasks, as Nomad's task
            // runner starts from the alloc's task state: it never runs again, and its report
            // must not turn a failed run into a fresh, successful one.
            let finished = alloc.client_terminal().then(|| alloc.task_states.as_ref()?.get(&task.name)).flatten();
            match finished {
                Some(state) => l.state = state.clone(),
                None => {
                    l.state.state = task_state::PENDING.into();
                    events::append(&mut l.state, events::received());
                }
            }
            l
        });
        let runner = Arc::new_cyclic(|me: &std::sync::Weak<TaskRunner>| TaskRunner {
            alloc_id: alloc.id.clone(),
            name: task.name.clone(),
            stage: Stage::of(task.lifecycle.as_ref()),
            sidecar: task.lifecycle.as_ref().is_some_and(|l| l.sidecar),
            leader: task.leader,
            hooks: hooks::init_hooks(
                &task,
                task.csi_plugin_config.is_some().then(|| {
                    let control: std::sync::Weak<dyn TaskControl> = me.clone();
                    CsiPluginSupervisorHook::new(ctx.csi_root.clone(), ctx.csi_plugins.clone(), ctx.csi_connect.clone(), control)
                }),
                csi_mounts.clone(),
                ctx.si_tokens
                    .clone()
                    .filter(|_| task.uses_connect())
                    .map(|deriver| ConsulSiTokenHook::new(deriver, &alloc.id, &task.name, ctx.alloc_dir(&alloc.id), ctx.si_backoff)),
                hooks::identity::IdentityRequest::of(&task).map(|wants| {
                    let alloc_dir = ctx.alloc_dir(&alloc.id);
                    hooks::IdentityHook::new(
                        ctx.identities.clone(),
                        ctx.task_api.clone(),
                        &alloc.id,
                        &task.name,
                        alloc_dir,
                        wants,
                        ctx.si_backoff,
                    )
                }),
                task.uses_connect_sidecar().then(|| envoy_hooks(&ctx)),
                (!task.artifacts.is_empty()).then(|| {
                    let control: std::sync::Weak<dyn TaskControl> = me.clone();
                    let node_ctx = ctx.clone();
                    hooks::ArtifactHook::new(ctx.artifacts.clone(), control, Arc::new(move || node_ctx.node()), ctx.region.clone())
                }),
                (!task.templates.is_empty()).then(|| {
                    let control: std::sync::Weak<dyn TemplateControl> = me.clone();
                    let deps = hooks::template::TemplateDeps {
                        signer: ctx.identities.clone(),
                        backoff: ctx.si_backoff,
                        api: ctx.task_api.clone(),
                        config: ctx.template.clone(),
                        host_env: Arc::new(ctx.host_env.clone()),
                        consul: ctx.consul_query.clone(),
                    };
                    hooks::TemplateHook::new(deps, control, &alloc.id, &task.name, ctx.alloc_dir(&alloc.id))
                }),
            ),
            csi_mounts,
            ctx,
            alloc: Mutex::new(alloc),
            task: Mutex::new(task),
            local: Mutex::new(local),
            gates,
            kill: CancellationToken::new(),
            restart: Notify::new(),
            restart_pending: AtomicBool::new(false),
            restart_failure: AtomicBool::new(false),
            changed,
            finished: watch::channel(false).0,
        });
        if fresh {
            runner.update(Durability::Lazy, |_| {});
        }
        runner
    }

    /// Task name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lifecycle stage.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// A sidecar keeps running beside the main tasks.
    pub fn sidecar(&self) -> bool {
        self.sidecar
    }

    /// The group's leader task.
    pub fn leader(&self) -> bool {
        self.leader
    }

    /// The task's state as reported to the servers.
    pub fn state(&self) -> TaskState {
        let mut s = lock(&self.local).state.clone();
        s.task_handle = None;
        s
    }

    /// The driver handle while the task runs.
    pub fn handle(&self) -> Option<TaskHandle> {
        lock(&self.local).handle.clone()
    }

    /// The driver and handle of the running task (for signals and exec sessions).
    pub fn running_driver(&self) -> Option<(Arc<dyn Driver>, TaskHandle)> {
        let handle = self.handle()?;
        let driver = self.ctx.drivers.get(&handle.driver).ok()?;
        Some((driver, handle))
    }

    /// The run loop has ended (the task is dead and its stop hooks ran).
    pub fn is_finished(&self) -> bool {
        *self.finished.borrow()
    }

    /// Waits until the run loop has ended.
    pub async fn wait_finished(&self) {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|f| *f).await;
    }

    /// Asks the task to stop for good, recording `reason` first. Returns at once.
    pub fn kill(&self, reason: Option<TaskEvent>) {
        if self.kill.is_cancelled() {
            return;
        }
        if let Some(event) = reason
            && lock(&self.local).state.state != task_state::DEAD
        {
            self.append_event(event);
        }
        self.kill.cancel();
    }

    /// Restarts a running task without counting against its restart policy.
    pub fn restart(&self, event: TaskEvent) -> Result<(), NotRunning> {
        if lock(&self.local).handle.is_none() || self.kill.is_cancelled() {
            return Err(NotRunning);
        }
        self.append_event(event);
        self.restart_failure.store(false, Ordering::SeqCst);
        self.restart_pending.store(true, Ordering::SeqCst);
        self.restart.notify_one();
        Ok(())
    }

    /// Restarts a running task because a check with `check_restart` stayed unhealthy; it counts
    /// against the restart policy (Nomad's `Restart(ctx, event, failure = true)`).
    pub fn restart_unhealthy(&self, check_name: &str) {
        if lock(&self.local).handle.is_none() || self.kill.is_cancelled() {
            return;
        }
        self.append_event(events::restart_signaled(&format!("healthcheck: check {check_name:?} unhealthy")));
        self.restart_failure.store(true, Ordering::SeqCst);
        self.restart_pending.store(true, Ordering::SeqCst);
        self.restart.notify_one();
    }

    /// Starts the script checks and check_restart watches of this run (see
    /// `client/consul/checks.rs`): those of its Consul checks, watched through Consul, and those
    /// of its Nomad checks, watched through the client's check store. The token ends them (a
    /// restart by either ends the run, and so the other's watches).
    fn start_checks(self: &Arc<Self>, driver: &Arc<dyn Driver>, handle: &TaskHandle) -> Option<CancellationToken> {
        let alloc = self.alloc();
        let consul = self.ctx.consul_checks.clone().map(|watcher| {
            (watcher, crate::client::consul::services::task_checks(&alloc, &self.ctx.node(), &self.ctx.region, &self.task()))
        });
        let nomad = (self.ctx.nomad_check_watcher.clone(), crate::client::checks::task_restart_checks(&alloc, &self.name));
        let sources: Vec<_> = consul.into_iter().chain([nomad]).filter(|(_, checks)| !checks.is_empty()).collect();
        if sources.is_empty() {
            return None;
        }
        let stop = CancellationToken::new();
        for (watcher, checks) in sources {
            let me: Arc<dyn crate::client::consul::checks::TaskRestarter> = Arc::new(Restarting(Arc::downgrade(self)));
            tokio::spawn(crate::client::consul::checks::run_task_checks(watcher, driver.clone(), handle.clone(), checks, me, stop.clone()));
        }
        Some(stop)
    }

    /// Records an event.
    pub fn append_event(&self, event: TaskEvent) {
        self.update(Durability::Lazy, |l| events::append(&mut l.state, event));
    }

    /// Marks a task that will never run dead and failed (its alloc could not be set up).
    pub fn mark_failed_dead(&self, event: TaskEvent) {
        self.update(Durability::Durable, |l| {
            events::append(&mut l.state, event);
            l.state.failed = true;
            l.state.state = task_state::DEAD.into();
            if l.state.finished_at.is_zero() {
                l.state.finished_at = Timestamp::now();
            }
        });
    }

    /// A new version of the alloc from the servers.
    pub fn update_alloc(&self, alloc: Arc<Allocation>) {
        let task = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)).and_then(|g| g.lookup_task(&self.name)).cloned();
        if let Some(task) = task {
            *lock(&self.task) = task;
        }
        *lock(&self.alloc) = alloc;
    }

    fn alloc(&self) -> Arc<Allocation> {
        lock(&self.alloc).clone()
    }

    fn task(&self) -> Task {
        lock(&self.task).clone()
    }

    /// Changes the local state, persists it and tells the alloc runner. The lock is held across
    /// the write so writes land in the order the changes were made.
    fn update(&self, durability: Durability, f: impl FnOnce(&mut LocalTaskState)) {
        {
            let mut local = lock(&self.local);
            f(&mut local);
            if let Err(e) = self.ctx.state.put_task(&self.alloc_id, &self.name, &local, durability) {
                tracing::error!(alloc_id = %self.alloc_id, task = %self.name, error = %e, "persisting task state failed");
            }
        }
        self.changed.notify_one();
    }

    fn set_state(&self, state: &str, event: Option<TaskEvent>, durability: Durability) {
        self.update(durability, |l| {
            l.state.state = state.to_string();
            if state == task_state::DEAD && l.state.finished_at.is_zero() {
                l.state.finished_at = Timestamp::now();
            }
            if let Some(e) = event {
                events::append(&mut l.state, e);
            }
        });
    }

    /// The policy: the task's, else its group's, else Nomad's default for the job type.
    fn restart_tracker(&self) -> RestartTracker {
        let alloc = self.alloc();
        let task = self.task();
        let job_type = alloc.job_type();
        let group_policy = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)).and_then(|g| g.restart_policy.clone());
        let policy = task.restart_policy.clone().or(group_policy).unwrap_or_else(|| match job_type {
            nomad_proto::JobType::Batch | nomad_proto::JobType::Sysbatch => RestartPolicy::default_batch(),
            _ => RestartPolicy::default_service(),
        });
        RestartTracker::new(Policy::from_job(&policy), job_type, task.lifecycle.as_ref(), Instant::now())
    }

    /// The driver config for a start: directories, environment, interpolated config.
    pub fn task_config(&self, driver: Option<&dyn Driver>) -> TaskConfig {
        let alloc = self.alloc();
        let task = self.task();
        let node = self.ctx.node();
        let alloc_dir = self.ctx.alloc_dir(&alloc.id);
        let isolated = driver.is_some_and(|d| d.name() != "raw_exec");
        let dirs = if isolated {
            TaskDirs::isolated()
        } else {
            let task_dir = alloc_dir.join(&task.name);
            TaskDirs { alloc: alloc_dir.join("alloc"), local: task_dir.join("local"), secrets: task_dir.join("secrets") }
        };
        let host_env = (!isolated).then_some(&self.ctx.host_env);
        let mut env = build_env(&EnvInput { alloc: &alloc, task: &task, node: &node, region: &self.ctx.region, dirs: &dirs, host_env });
        if !env.contains_key("CSI_ENDPOINT")
            && let Some(endpoint) = csi_endpoint(&self.ctx.csi_root, &alloc.id, task.csi_plugin_config.as_ref(), isolated)
        {
            env.insert("CSI_ENDPOINT".into(), endpoint);
        }
        if task.is_connect_native() && !env.contains_key("CONSUL_HTTP_TOKEN") {
            // Nomad's connect-native hook: the task's SI token, when it has one (ACLs on).
            match Beneath::open(&alloc_dir)
                .and_then(|d| d.open_dir(std::path::Path::new(&task.name), Links::Refuse))
                .and_then(|d| read_token(&d))
            {
                Ok(Some(token)) if !token.is_empty() => {
                    env.insert("CONSUL_HTTP_TOKEN".into(), token);
                }
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(alloc_id = %alloc.id, task = %task.name, error = %e, "failed to load SI token for native task"),
            }
        }
        // An Envoy task's listener variables (`NOMAD_ENVOY_*_ADDR_<service>`), from the alloc
        // alone, as the `envoy_bootstrap` hook binds them; after the task's own `env`, as
        // Nomad's hook variables are.
        let proxy_env =
            crate::client::connect::proxy::task_env(&alloc, &task, &Interpolator { env: &env, node: &node, region: &self.ctx.region });
        env.extend(proxy_env);
        let driver_config = Interpolator { env: &env, node: &node, region: &self.ctx.region }.config(&task.config);
        let allocated = alloc.allocated_resources.as_ref().and_then(|r| r.tasks.get(&task.name));
        let cpu = allocated.map(|a| a.cpu.cpu_shares).filter(|c| *c > 0).unwrap_or(task.resources.cpu);
        let memory = allocated.map(|a| a.memory.memory_mb).filter(|m| *m > 0).unwrap_or(task.resources.memory_mb);
        let memory_max = allocated.map(|a| a.memory.memory_max_mb).unwrap_or(task.resources.memory_max_mb);
        let kill_timeout = Duration::from_nanos(task.kill_timeout.max(0) as u64).min(self.ctx.max_kill_timeout);
        let mut mounts = hooks::volume_mounts(&alloc, &task, &self.csi_mounts);
        mounts.extend(hooks::dns_mount(&alloc, &task.driver, &alloc_dir.join(&task.name)));
        mounts.extend(plugin_mounts(&self.ctx.csi_root, &alloc.id, task.csi_plugin_config.as_ref(), isolated));
        TaskConfig {
            alloc_id: alloc.id.clone(),
            task_name: task.name.clone(),
            alloc_dir,
            state_dir: self.ctx.task_state_root.join(&alloc.id).join(&task.name),
            driver_config,
            env,
            user: (!task.user.is_empty()).then(|| task.user.clone()),
            resources: TaskResources {
                cpu_mhz: cpu.max(0) as u64,
                memory_mib: memory.max(0) as u64,
                memory_max_mib: memory_max.max(0) as u64,
                pids_max: 0,
            },
            logs: LogConfig {
                max_files: task.log_config.max_files.clamp(1, i64::from(u32::MAX)) as u32,
                max_file_size: (task.log_config.max_file_size_mb.max(1) as u64) * 1024 * 1024,
            },
            kill_signal: parse_signal(&task.kill_signal).unwrap_or_else(|| driver.map_or(DEFAULT_KILL_SIGNAL, |d| d.default_kill_signal())),
            kill_timeout,
            mounts,
            netns: match crate::client::network::Mode::of_alloc(&alloc) {
                Ok(crate::client::network::Mode::Host) | Err(_) => None,
                Ok(_) => Some(self.ctx.network.netns_path(&alloc.id)),
            },
        }
    }

    /// May this task (re)start? Never once the client finished the alloc, and never once the
    /// servers want it stopped, except a poststop task (the alloc runner only lets those run
    /// for an alloc that ran).
    fn may_run(&self) -> bool {
        let alloc = self.alloc();
        !self.kill.is_cancelled() && !alloc.client_terminal() && (!alloc.server_terminal() || self.stage == Stage::Poststop)
    }

    /// Runs the task until it is dead for good, or the agent shuts down.
    pub async fn run(self: Arc<Self>) {
        if self.run_loop().await == Flow::Shutdown {
            return;
        }
        let finished_already = lock(&self.local).state.state == task_state::DEAD;
        if !finished_already {
            self.set_state(task_state::DEAD, None, Durability::Durable);
        }
        let driver = self.ctx.drivers.get(&self.task().driver).ok();
        let config = self.task_config(driver.as_deref());
        let alloc = self.alloc();
        let task = self.task();
        let states = lock(&self.local).hooks.clone();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: driver.as_deref(),
            secrets_tmpfs: self.ctx.secrets_tmpfs,
            previous: None,
        };
        for (hook, e) in run_post(&self.hooks, PostPhase::Stop, &req, &states) {
            tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, hook, error = %e.message, "stop hook failed");
        }
        self.finished.send_replace(true);
        self.changed.notify_one();
    }

    /// Where a restored runner picks up.
    async fn initial(&self) -> Next {
        let (handle, dead) = {
            let l = lock(&self.local);
            (l.handle.clone(), l.state.state == task_state::DEAD)
        };
        let Some(handle) = handle else {
            return if dead { Next::Finished } else { Next::Start };
        };
        let driver = match self.ctx.drivers.get(&handle.driver) {
            Ok(d) => d,
            Err(e) => return Next::Exited(ExitResult::failed(format!("recovering the task: {e}"))),
        };
        match driver.recover(&handle).await {
            Ok(Recovered::Running(h)) => {
                tracing::info!(alloc_id = %self.alloc_id, task = %self.name, pid = h.task.pid, "reattached to a running task");
                Next::Attach(driver, h)
            }
            Ok(Recovered::Exited(exit)) => Next::Exited(exit),
            Err(e) => Next::Exited(ExitResult::failed(format!("recovering the task: {e}"))),
        }
    }

    async fn run_loop(self: &Arc<Self>) -> Flow {
        let mut tracker = self.restart_tracker();
        let mut next = self.initial().await;
        loop {
            let (driver, handle) = match std::mem::replace(&mut next, Next::Start) {
                Next::Finished => return Flow::Done,
                Next::Attach(driver, handle) => {
                    // As after a start: the hooks that watch a running task (the CSI plugin
                    // supervisor) take it up again.
                    self.run_poststart(driver.as_ref());
                    (driver, handle)
                }
                Next::Exited(exit) => {
                    self.finish_run(&exit).await;
                    let decision =
                        if self.kill.is_cancelled() { Decision::Killed } else { tracker.exited(&exit, Instant::now(), rand::random()) };
                    match self.apply(decision).await {
                        Flow::Continue => continue,
                        other => return other,
                    }
                }
                Next::Start => {
                    match self.wait_for_start().await {
                        Flow::Continue => {}
                        other => return other,
                    }
                    match self.start().await {
                        Ok(started) => started,
                        Err(failure) if failure.cancelled && self.ctx.shutdown.is_cancelled() => return Flow::Shutdown,
                        Err(failure) => {
                            let decision = if self.kill.is_cancelled() {
                                Decision::Killed
                            } else {
                                tracker.start_failed(failure.recoverable, Instant::now(), rand::random())
                            };
                            match self.apply(decision).await {
                                Flow::Continue => continue,
                                other => return other,
                            }
                        }
                    }
                }
            };
            let checks = self.start_checks(&driver, &handle);
            let ended = self.wait_task(driver.as_ref(), &handle).await;
            if let Some(stop) = checks {
                stop.cancel();
            }
            let (exit, how) = match ended {
                Some(ended) => ended,
                None => return Flow::Shutdown,
            };
            self.finish_run(&exit).await;
            let decision = match how {
                How::Killed => Decision::Killed,
                How::Restart => tracker.restart_requested(),
                How::RestartFailure => tracker.restart_failed(Instant::now(), rand::random()),
                How::Natural if self.kill.is_cancelled() => Decision::Killed,
                How::Natural => tracker.exited(&exit, Instant::now(), rand::random()),
            };
            match self.apply(decision).await {
                Flow::Continue => {}
                other => return other,
            }
        }
    }

    /// Waits until the task's lifecycle gate opens. `Done` when it must not run.
    async fn wait_for_start(&self) -> Flow {
        let mut gates = self.gates.clone();
        loop {
            if !self.may_run() {
                return Flow::Done;
            }
            if gates.borrow_and_update().allows(self.stage) {
                return Flow::Continue;
            }
            tokio::select! {
                changed = gates.changed() => if changed.is_err() { return Flow::Done },
                _ = self.kill.cancelled() => return Flow::Done,
                _ = self.ctx.shutdown.cancelled() => return Flow::Shutdown,
            }
        }
    }

    /// Prestart hooks, then the driver. The handle is persisted with the running state before
    /// this returns.
    async fn start(&self) -> Result<(Arc<dyn Driver>, TaskHandle), StartFailure> {
        let alloc = self.alloc();
        let task = self.task();
        let driver = self.ctx.drivers.get(&task.driver).ok();
        let config = self.task_config(driver.as_deref());
        let mut states = lock(&self.local).hooks.clone();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: driver.as_deref(),
            secrets_tmpfs: self.ctx.secrets_tmpfs,
            previous: None,
        };
        let cancelled = async {
            tokio::select! {
                _ = self.kill.cancelled() => {}
                _ = self.ctx.shutdown.cancelled() => {}
            }
        };
        let prestart = run_prestart(&self.hooks, &req, &mut states, cancelled).await;
        let hook_events = match prestart {
            Ok(events) => events,
            Err(PrestartError::Cancelled) => {
                // Killed or shutting down while a hook waited on the servers: nothing failed.
                self.update(Durability::Durable, |l| l.hooks = states);
                return Err(StartFailure { recoverable: true, cancelled: true });
            }
            Err(PrestartError::Failed(hook, e)) => {
                tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, hook, error = %e.message, "prestart hook failed");
                let event = e.event.clone().map(|b| *b).unwrap_or_else(|| events::setup_failure(&e.message, !e.recoverable));
                self.update(Durability::Durable, |l| {
                    l.hooks = states;
                    events::append(&mut l.state, event);
                });
                return Err(StartFailure { recoverable: e.recoverable, cancelled: false });
            }
        };
        self.update(Durability::Durable, |l| {
            l.hooks = states;
            for e in hook_events {
                events::append(&mut l.state, e);
            }
        });
        // A native task's CONSUL_HTTP_TOKEN comes from the file the `consul_si_token` hook
        // may just have written.
        let mut config = if task.is_connect_native() { self.task_config(driver.as_deref()) } else { config };
        // The image with the Envoy version the `envoy_version` hook just resolved.
        let resolved = lock(&self.local).hooks.get(envoy_version::NAME).and_then(|s| s.data.get(envoy_version::IMAGE_KEY)).cloned();
        if let Some(image) = resolved {
            config.driver_config.insert("image".into(), serde_json::Value::String(image));
        }
        // The variables of its `env = true` templates, over the task's own (as Nomad's).
        for (k, v) in hooks::template::env_of(lock(&self.local).hooks.get(hooks::template::NAME)) {
            config.env.insert(k.to_string(), v.to_string());
        }
        // The workload identity the `identity` hook holds, for a task that asked for it in its env.
        if hooks::identity::IdentityRequest::of(&task).is_some_and(|w| w.env)
            && let Some(token) = hooks::identity::token_of(lock(&self.local).hooks.get(hooks::identity::NAME))
        {
            config.env.insert("NOMAD_TOKEN".into(), token.to_string());
        }
        let Some(driver) = driver.clone() else {
            // validate reports this; kept for a hook list without it.
            self.append_event(events::driver_failure(&format!("unknown driver {:?}", task.driver)));
            return Err(StartFailure { recoverable: false, cancelled: false });
        };
        self.restart_pending.store(false, Ordering::SeqCst);
        match driver.start(&config).await {
            Ok(handle) => {
                self.update(Durability::Durable, |l| {
                    l.handle = Some(handle.clone());
                    l.state.state = task_state::RUNNING.into();
                    l.state.started_at = Timestamp::now();
                    l.state.finished_at = Timestamp::ZERO;
                    events::append(&mut l.state, events::started());
                });
                self.run_poststart(driver.as_ref());
                Ok((driver, handle))
            }
            Err(e) => {
                tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, error = %e, "starting the task failed");
                self.append_event(events::driver_failure(&e.to_string()));
                Err(StartFailure { recoverable: recoverable(&e), cancelled: false })
            }
        }
    }

    /// The poststart hooks, for a task that was started or reattached to.
    fn run_poststart(&self, driver: &dyn Driver) {
        let alloc = self.alloc();
        let task = self.task();
        let config = self.task_config(Some(driver));
        let states = lock(&self.local).hooks.clone();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: Some(driver),
            secrets_tmpfs: self.ctx.secrets_tmpfs,
            previous: None,
        };
        for (hook, e) in run_post(&self.hooks, PostPhase::Poststart, &req, &states) {
            tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, hook, error = %e.message, "poststart hook failed");
        }
    }

    /// Waits for the task to exit, stopping it when killed or restarted. `None` on agent
    /// shutdown (the task keeps running).
    async fn wait_task(&self, driver: &dyn Driver, handle: &TaskHandle) -> Option<(ExitResult, How)> {
        let wait = driver.wait(handle);
        tokio::pin!(wait);
        let exited = |r: Result<ExitResult, DriverError>| r.unwrap_or_else(|e| ExitResult::failed(format!("waiting for the task: {e}")));
        let how = loop {
            tokio::select! {
                r = &mut wait => return Some((exited(r), How::Natural)),
                _ = self.kill.cancelled() => break How::Killed,
                // A stale wake-up (the request was for an earlier run) is ignored.
                _ = self.restart.notified() => if self.restart_pending.swap(false, Ordering::SeqCst) {
                    break if self.restart_failure.swap(false, Ordering::SeqCst) { How::RestartFailure } else { How::Restart };
                },
                _ = self.ctx.shutdown.cancelled() => return None,
            }
        };
        let config = self.task_config(Some(driver));
        if matches!(how, How::Killed) {
            let name = format!("{:?}", config.kill_signal);
            self.append_event(events::killing(&name, config.kill_timeout));
            let delay = Duration::from_nanos(self.task().shutdown_delay.max(0) as u64);
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = self.ctx.shutdown.cancelled() => {}
                }
            }
        }
        // The stop waits up to kill_timeout for the task to go: an agent shutting down leaves it
        // (and the task) there, and the next agent, finding the alloc still to be stopped,
        // kills it again.
        let stopped = async {
            if let Err(e) = driver.stop(handle, config.kill_signal, config.kill_timeout).await {
                tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, error = %e, "stopping the task failed");
            }
            wait.await
        };
        tokio::select! {
            r = stopped => Some((exited(r), how)),
            _ = self.ctx.shutdown.cancelled() => None,
        }
    }

    /// The run ended: the driver removes what it created for it, then the exit is recorded.
    async fn finish_run(&self, exit: &ExitResult) {
        if let Some(handle) = self.handle() {
            self.destroy_run(&handle).await;
        }
        self.record_exit(exit);
    }

    /// Removes what the driver created for one run of the task (exec: its cgroups; oci: the
    /// container's runtime state, cgroups and bundle), as Nomad's task runner destroys the
    /// driver's task after every exit, restarts included. It runs while the handle is still
    /// stored, so an agent that dies before the exit is recorded finds the handle again on
    /// restart and cleans up then; every driver's destroy is safe to repeat.
    async fn destroy_run(&self, handle: &TaskHandle) {
        let driver = match self.ctx.drivers.get(&handle.driver) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, error = %e, "cannot clean up after the task");
                return;
            }
        };
        if let Err(e) = driver.destroy(handle).await {
            tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, error = %e, "cleaning up after the task failed");
        }
    }

    /// `Terminated`, the handle dropped (durably: the task is gone), exited hooks.
    fn record_exit(&self, exit: &ExitResult) {
        self.update(Durability::Durable, |l| {
            l.handle = None;
            if !exit.finished_at.is_zero() {
                l.state.finished_at = exit.finished_at;
            }
            events::append(&mut l.state, events::terminated(exit));
        });
        let alloc = self.alloc();
        let task = self.task();
        let driver = self.ctx.drivers.get(&task.driver).ok();
        let config = self.task_config(driver.as_deref());
        let states = lock(&self.local).hooks.clone();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: driver.as_deref(),
            secrets_tmpfs: self.ctx.secrets_tmpfs,
            previous: None,
        };
        for (hook, e) in run_post(&self.hooks, PostPhase::Exited, &req, &states) {
            tracing::warn!(alloc_id = %self.alloc_id, task = %self.name, hook, error = %e.message, "exited hook failed");
        }
    }

    /// Acts on a restart decision.
    async fn apply(&self, decision: Decision) -> Flow {
        match decision {
            Decision::Killed => {
                self.set_state(task_state::DEAD, Some(events::killed()), Durability::Durable);
                Flow::Done
            }
            Decision::Done { reason } => {
                tracing::info!(alloc_id = %self.alloc_id, task = %self.name, reason, "not restarting task");
                self.set_state(task_state::DEAD, None, Durability::Durable);
                Flow::Done
            }
            Decision::Fail { reason } => {
                tracing::info!(alloc_id = %self.alloc_id, task = %self.name, reason, "not restarting task");
                self.set_state(task_state::DEAD, Some(events::not_restarting(&reason)), Durability::Durable);
                Flow::Done
            }
            Decision::Restart { delay, reason } => {
                if self.kill.is_cancelled() {
                    self.set_state(task_state::DEAD, None, Durability::Durable);
                    return Flow::Done;
                }
                self.set_state(task_state::PENDING, Some(events::restarting(delay, &reason)), Durability::Lazy);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => Flow::Continue,
                    _ = self.kill.cancelled() => Flow::Done,
                    _ = self.ctx.shutdown.cancelled() => Flow::Shutdown,
                }
            }
        }
    }
}

/// The hooks that start an Envoy task: its image's version and its bootstrap.
fn envoy_hooks(ctx: &Arc<ClientContext>) -> hooks::EnvoyHooks {
    // Weak: the hook must not keep the client's context (its local state) open.
    let node_ctx = Arc::downgrade(ctx);
    hooks::EnvoyHooks {
        version: EnvoyVersionHook::new(ctx.consul_api.clone()),
        bootstrap: EnvoyBootstrapHook::new(EnvoyBootstrapDeps {
            consul: ctx.consul_api.clone(),
            agent_namespace: ctx.consul_config.as_ref().map(|c| c.namespace.clone()).unwrap_or_default(),
            node: Arc::new(move || node_ctx.upgrade().map(|c| c.node()).unwrap_or_default()),
            region: ctx.region.clone(),
            retry: ctx.envoy_retry,
        }),
    }
}

/// The task runner as its checks see it (weak: the checks never keep a runner alive).
struct Restarting(std::sync::Weak<TaskRunner>);

impl crate::client::consul::checks::TaskRestarter for Restarting {
    fn restart_unhealthy(&self, check_name: &str) {
        if let Some(runner) = self.0.upgrade() {
            runner.restart_unhealthy(check_name);
        }
    }
}

impl TaskControl for TaskRunner {
    fn emit_event(&self, event: TaskEvent) {
        self.append_event(event);
    }

    fn kill_failed(&self, event: TaskEvent) {
        self.update(Durability::Durable, |l| l.state.failed = true);
        self.kill(Some(event));
    }
}

impl TemplateControl for TaskRunner {
    fn emit_event(&self, event: TaskEvent) {
        self.append_event(event);
    }

    fn kill_failed(&self, event: TaskEvent) {
        TaskControl::kill_failed(self, event);
    }

    fn restart(&self, event: TaskEvent) {
        // Not running (between runs): the next start renders from the same files anyway.
        let _ = TaskRunner::restart(self, event);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> futures::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let (driver, handle) = self.running_driver().ok_or("the task is not running")?;
            driver.signal(&handle, signal).await.map_err(|e| e.to_string())
        })
    }

    fn exec(&self, command: String, args: Vec<String>, timeout: Duration) -> futures::future::BoxFuture<'_, Result<i32, String>> {
        Box::pin(async move {
            let (driver, handle) = self.running_driver().ok_or("the task is not running")?;
            let out = driver.exec_task(&handle, &command, &args, timeout).await.map_err(|e| e.to_string())?;
            Ok(out.exit_code)
        })
    }
}

/// Locks a mutex, recovering from poisoning (a panicked holder left consistent data: every
/// critical section here is a plain assignment or append).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
