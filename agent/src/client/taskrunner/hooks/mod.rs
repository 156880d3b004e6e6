//! Task runner hooks: small traits run in one ordered list (decision 6).
//!
//! A hook implements [`TaskHook`] (its name) and returns the phases it takes part in:
//! - **prestart**, before every start of the task. Runs in order and stops at the first error.
//!   A hook that answers `done` is skipped from then on, across agent restarts (its state is
//!   persisted under its name).
//! - **poststart**, after the driver started the task. Every hook runs; errors are collected.
//! - **exited**, after the task exited (before the restart decision). Every hook runs.
//! - **stop**, once the task is dead for good. Every hook runs. Must be idempotent; may run
//!   without prestart having run (a task killed before it started).
//!
//! Hooks do short, blocking file-system work. The exceptions talk to the servers or to Consul and
//! may wait minutes (`consul_si_token`, `envoy_version`, `envoy_bootstrap`): they implement the
//! prestart phase as [`AsyncPrestartHook`], which the runner awaits and abandons when the task is
//! killed or the agent shuts down.

pub mod artifact;
pub mod consul_si_token;
pub mod csi_plugin_supervisor;
mod dispatch_payload;
mod dns;
pub mod envoy_bootstrap;
pub mod envoy_version;
pub mod identity;
mod task_dir;
pub mod template;
mod validate;
mod volumes;

use std::collections::BTreeMap;

use nomad_proto::{Allocation, Task, TaskEvent};

pub use artifact::ArtifactHook;
pub use consul_si_token::ConsulSiTokenHook;
pub use csi_plugin_supervisor::CsiPluginSupervisorHook;
pub use dispatch_payload::DispatchPayloadHook;
pub use dns::{DnsHook, dns_mount};
pub use envoy_bootstrap::{EnvoyBootstrapDeps, EnvoyBootstrapHook};
pub use envoy_version::EnvoyVersionHook;
pub use identity::IdentityHook;
pub use task_dir::{TaskDirHook, mount_secrets_tmpfs};
pub use template::TemplateHook;
pub use validate::ValidateHook;
pub use volumes::{VolumesHook, volume_mounts};

use crate::client::driver::{Driver, TaskConfig};
use crate::client::state::HookState;

/// What every phase gets.
pub struct HookRequest<'a> {
    /// The alloc.
    pub alloc: &'a Allocation,
    /// The task.
    pub task: &'a Task,
    /// What the driver will be given (interpolated config, environment, directories).
    pub config: &'a TaskConfig,
    /// The task's driver, when it exists.
    pub driver: Option<&'a dyn Driver>,
    /// Mount the secrets dir as a tmpfs where the platform allows.
    pub secrets_tmpfs: bool,
    /// The hook's state from its last run (also across agent restarts).
    pub previous: Option<&'a HookState>,
}

/// What a prestart hook hands back.
#[derive(Debug, Default)]
pub struct PrestartResponse {
    /// Never run this hook again for this task.
    pub done: bool,
    /// Hook data to persist under its name.
    pub data: BTreeMap<String, String>,
    /// Events to record on the task.
    pub events: Vec<TaskEvent>,
}

/// Why a hook failed.
#[derive(Debug, Clone, PartialEq)]
pub struct HookError {
    /// What went wrong.
    pub message: String,
    /// Trying again may work (counted by the restart policy); otherwise the task fails.
    pub recoverable: bool,
    /// The event to record instead of a generic `Setup Failure`.
    pub event: Option<Box<TaskEvent>>,
    /// Hook data to persist despite the failure (what it finished before failing).
    pub data: Option<BTreeMap<String, String>>,
}

impl HookError {
    /// A failure that retrying will not fix.
    pub fn fatal(message: impl Into<String>) -> HookError {
        HookError { message: message.into(), recoverable: false, event: None, data: None }
    }

    /// A failure that may pass on retry.
    pub fn recoverable(message: impl Into<String>) -> HookError {
        HookError { message: message.into(), recoverable: true, event: None, data: None }
    }

    /// Recorded as Nomad records a failed hook: a `Task hook failed` event naming the hook.
    pub fn as_hook_event(mut self, hook: &str) -> HookError {
        self.event = Some(Box::new(crate::client::taskrunner::events::hook_failed(hook, &self.message, !self.recoverable)));
        self
    }
}

/// A task hook: its name, and the phases it implements.
pub trait TaskHook: Send + Sync {
    /// Stable name: the key of its persisted state.
    fn name(&self) -> &'static str;
    /// Prestart phase.
    fn prestart(&self) -> Option<&dyn PrestartHook> {
        None
    }
    /// Prestart phase that waits on the network (instead of [`TaskHook::prestart`]).
    fn prestart_async(&self) -> Option<&dyn AsyncPrestartHook> {
        None
    }
    /// Poststart phase.
    fn poststart(&self) -> Option<&dyn PoststartHook> {
        None
    }
    /// Exited phase.
    fn exited(&self) -> Option<&dyn ExitedHook> {
        None
    }
    /// Stop phase.
    fn stop(&self) -> Option<&dyn StopHook> {
        None
    }
}

/// Runs before each start of the task.
pub trait PrestartHook {
    /// Prepares the task. An error stops the prestart phase.
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError>;
}

/// Runs before each start of the task, and may wait (on the servers, on Consul). The runner
/// drops the future when the task is killed or the agent shuts down.
pub trait AsyncPrestartHook: Send + Sync {
    /// Prepares the task. An error stops the prestart phase.
    fn prestart<'a>(&'a self, req: &'a HookRequest<'a>) -> futures::future::BoxFuture<'a, Result<PrestartResponse, HookError>>;
}

/// Runs after the task started.
pub trait PoststartHook {
    /// Reacts to the start.
    fn poststart(&self, req: &HookRequest<'_>) -> Result<(), HookError>;
}

/// Runs after the task exited.
pub trait ExitedHook {
    /// Reacts to the exit.
    fn exited(&self, req: &HookRequest<'_>) -> Result<(), HookError>;
}

/// Runs once the task is dead for good. Idempotent; may run without prestart.
pub trait StopHook {
    /// Cleans up.
    fn stop(&self, req: &HookRequest<'_>) -> Result<(), HookError>;
}

/// The task hooks, in the order every phase runs them.
///
/// Why this order:
/// 1. `validate` first: a task whose driver is missing or whose config has the wrong shape can
///    never run, and nothing should be built on disk for it.
/// 2. `task_dir` next: it builds `local/`, `secrets/` and `tmp/`, which every later hook and the
///    task itself write into.
/// 3. `dns`: it writes `resolv.conf` into the task dir, so it needs `task_dir`.
/// 4. `dispatch_payload`: it writes into the task's `local/` dir, so it needs `task_dir`.
/// 5. `volumes` (for a task with `volume_mount`s): checks that every mounted CSI volume is
///    mounted and that the driver takes mounts; the binds themselves are in the task config.
/// 6. `artifacts` (for a task with `artifact` blocks), Nomad's place: after `volumes`, before
///    the Consul and Envoy hooks; it writes into the task dir, so it needs `task_dir`, and it
///    downloads, so it is async (abandoned on kill).
/// 7. `consul_si_token` (given for a Connect task when the agent has a Consul token, Nomad's
///    condition): it writes `secrets/si_token`, so it needs `task_dir`; it comes after the
///    local file work so a task that cannot be set up fails before the servers are asked for a
///    token. In Nomad it also comes before the Envoy bootstrap, which reads the token.
///    Then `identity` (a task with an `identity` block), for the same reasons: it asks the
///    servers for the task's workload identity and writes `secrets/nomad_token`.
///    Then `template` (a task with templates), Nomad's place: after the artifacts (a template's
///    `source` may be one) and before the services; it blocks until the first render.
/// 8. `envoy_version` then `envoy_bootstrap` (given for a Connect sidecar or gateway task), as in
///    Nomad: after `consul_si_token`, because the bootstrap carries the SI token it wrote, and
///    after `task_dir` (the bootstrap goes in `secrets/`); last of the local work since both
///    may wait on Consul (the bootstrap until the services sync registered the proxy).
/// 9. `csi_plugin_supervisor` (given for a task with `csi_plugin`) last: its poststart probes
///    the started plugin, and nothing after it depends on it.
#[allow(clippy::too_many_arguments)] // one optional hook each; a struct would only rename them
pub fn init_hooks(
    task: &Task,
    csi_supervisor: Option<CsiPluginSupervisorHook>,
    csi_mounts: crate::client::allocrunner::hooks::CsiMounts,
    si_token: Option<ConsulSiTokenHook>,
    identity: Option<IdentityHook>,
    envoy: Option<EnvoyHooks>,
    artifacts: Option<ArtifactHook>,
    template: Option<TemplateHook>,
) -> Vec<Box<dyn TaskHook>> {
    let mut hooks: Vec<Box<dyn TaskHook>> = vec![Box::new(ValidateHook), Box::new(TaskDirHook), Box::new(DnsHook::new())];
    if task.dispatch_payload.is_some() {
        hooks.push(Box::new(DispatchPayloadHook));
    }
    if !task.volume_mounts.is_empty() {
        hooks.push(Box::new(VolumesHook::new(csi_mounts)));
    }
    if let Some(h) = artifacts.filter(|_| !task.artifacts.is_empty()) {
        hooks.push(Box::new(h));
    }
    if let Some(h) = si_token {
        hooks.push(Box::new(h));
    }
    if let Some(h) = identity {
        hooks.push(Box::new(h));
    }
    if let Some(h) = template.filter(|_| !task.templates.is_empty()) {
        hooks.push(Box::new(h));
    }
    if let Some(h) = envoy {
        hooks.push(Box::new(h.version));
        hooks.push(Box::new(h.bootstrap));
    }
    if let Some(h) = csi_supervisor {
        hooks.push(Box::new(h));
    }
    hooks
}

/// The two hooks of an Envoy task (a Connect sidecar or gateway).
pub struct EnvoyHooks {
    /// Resolves `${NOMAD_envoy_version}` in its image.
    pub version: EnvoyVersionHook,
    /// Writes its bootstrap.
    pub bootstrap: EnvoyBootstrapHook,
}

/// Why the prestart phase ended early.
#[derive(Debug)]
pub enum PrestartError {
    /// A hook failed: its name and error.
    Failed(&'static str, HookError),
    /// `cancel` fired while an async hook waited.
    Cancelled,
}

/// Runs the prestart phase: in order, skipping hooks marked done, stopping at the first error.
/// Each hook's new state is written into `states` (the caller persists it). Returns the events
/// to record, or why it stopped. An async hook is abandoned when `cancel` resolves.
pub async fn run_prestart(
    hooks: &[Box<dyn TaskHook>],
    req: &HookRequest<'_>,
    states: &mut BTreeMap<String, HookState>,
    cancel: impl std::future::Future<Output = ()>,
) -> Result<Vec<TaskEvent>, PrestartError> {
    let mut events = Vec::new();
    let mut cancel = std::pin::pin!(cancel);
    for hook in hooks {
        let previous = states.get(hook.name());
        if previous.is_some_and(|s| s.done) {
            continue;
        }
        let req = HookRequest { previous, ..*req };
        let result = if let Some(phase) = hook.prestart() {
            phase.prestart(&req)
        } else if let Some(phase) = hook.prestart_async() {
            tokio::select! {
                r = phase.prestart(&req) => r,
                _ = &mut cancel => return Err(PrestartError::Cancelled),
            }
        } else {
            continue;
        };
        let resp = match result {
            Ok(resp) => resp,
            Err(mut e) => {
                if let Some(data) = e.data.take() {
                    states.insert(hook.name().to_string(), HookState { done: false, data });
                }
                return Err(PrestartError::Failed(hook.name(), e));
            }
        };
        events.extend(resp.events);
        states.insert(hook.name().to_string(), HookState { done: resp.done, data: resp.data });
    }
    Ok(events)
}

/// Which post phase to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostPhase {
    /// After start.
    Poststart,
    /// After exit.
    Exited,
    /// Dead for good.
    Stop,
}

/// Runs a post phase: every hook, in order, collecting the errors.
pub fn run_post(
    hooks: &[Box<dyn TaskHook>],
    phase: PostPhase,
    req: &HookRequest<'_>,
    states: &BTreeMap<String, HookState>,
) -> Vec<(&'static str, HookError)> {
    let mut errors = Vec::new();
    for hook in hooks {
        let req = HookRequest { previous: states.get(hook.name()), ..*req };
        let result = match phase {
            PostPhase::Poststart => hook.poststart().map(|h| h.poststart(&req)),
            PostPhase::Exited => hook.exited().map(|h| h.exited(&req)),
            PostPhase::Stop => hook.stop().map(|h| h.stop(&req)),
        };
        if let Some(Err(e)) = result {
            errors.push((hook.name(), e));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records the order hooks ran in; fails when told to.
    struct Probe {
        name: &'static str,
        fail: bool,
        done: bool,
        log: std::sync::Arc<Mutex<Vec<String>>>,
    }

    impl TaskHook for Probe {
        fn name(&self) -> &'static str {
            self.name
        }
        fn prestart(&self) -> Option<&dyn PrestartHook> {
            Some(self)
        }
        fn stop(&self) -> Option<&dyn StopHook> {
            Some(self)
        }
    }

    impl PrestartHook for Probe {
        fn prestart(&self, _req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
            self.log.lock().unwrap().push(format!("prestart {}", self.name));
            if self.fail {
                return Err(HookError::fatal(format!("{} failed", self.name)));
            }
            Ok(PrestartResponse { done: self.done, ..PrestartResponse::default() })
        }
    }

    impl StopHook for Probe {
        fn stop(&self, _req: &HookRequest<'_>) -> Result<(), HookError> {
            self.log.lock().unwrap().push(format!("stop {}", self.name));
            if self.fail { Err(HookError::fatal(format!("{} failed", self.name))) } else { Ok(()) }
        }
    }

    fn fixture() -> (Allocation, Task, TaskConfig) {
        let task = Task { name: "t".into(), ..Task::default() };
        let config = TaskConfig {
            alloc_id: "a".into(),
            task_name: "t".into(),
            alloc_dir: "/nonexistent".into(),
            state_dir: "/nonexistent".into(),
            driver_config: Default::default(),
            env: Default::default(),
            user: None,
            resources: Default::default(),
            logs: Default::default(),
            kill_signal: nix::sys::signal::Signal::SIGINT,
            kill_timeout: std::time::Duration::from_secs(1),
            mounts: Vec::new(),
            netns: None,
        };
        (Allocation::default(), task, config)
    }

    #[test]
    fn prestart_stops_at_the_first_error_and_skips_done_hooks_while_stop_runs_every_hook() {
        let log = std::sync::Arc::new(Mutex::new(Vec::new()));
        let probe = |name, fail, done| Box::new(Probe { name, fail, done, log: log.clone() }) as Box<dyn TaskHook>;
        let hooks = vec![probe("a", false, true), probe("b", true, false), probe("c", false, false)];
        let (alloc, task, config) = fixture();
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        let mut states = BTreeMap::new();
        let err = futures::executor::block_on(run_prestart(&hooks, &req, &mut states, std::future::pending())).unwrap_err();
        assert!(matches!(err, PrestartError::Failed("b", _)), "{err:?}");
        assert!(states["a"].done);
        assert_eq!(*log.lock().unwrap(), ["prestart a", "prestart b"], "c never ran");

        log.lock().unwrap().clear();
        let _ = futures::executor::block_on(run_prestart(&hooks, &req, &mut states, std::future::pending()));
        assert_eq!(*log.lock().unwrap(), ["prestart b"], "a is done and skipped");

        log.lock().unwrap().clear();
        let errors = run_post(&hooks, PostPhase::Stop, &req, &states);
        assert_eq!(errors.iter().map(|e| e.0).collect::<Vec<_>>(), ["b"]);
        assert_eq!(*log.lock().unwrap(), ["stop a", "stop b", "stop c"], "stop runs every hook despite b's error");
    }

    struct Noop;
    impl csi_plugin_supervisor::TaskControl for Noop {
        fn emit_event(&self, _: TaskEvent) {}
        fn kill_failed(&self, _: TaskEvent) {}
    }

    #[test]
    fn the_hook_list_is_fixed_plus_conditional_hooks() {
        let names =
            |t: &Task| init_hooks(t, None, Default::default(), None, None, None, None, None).iter().map(|h| h.name()).collect::<Vec<_>>();
        assert_eq!(names(&Task::default()), ["validate", "task_dir", "dns"]);
        let t = Task { dispatch_payload: Some(serde_json::json!({"File": "in.txt"})), ..Task::default() };
        assert_eq!(names(&t), ["validate", "task_dir", "dns", "dispatch_payload"]);
        let envoy = EnvoyHooks {
            version: EnvoyVersionHook::new(None),
            bootstrap: EnvoyBootstrapHook::new(EnvoyBootstrapDeps {
                consul: None,
                agent_namespace: String::new(),
                node: std::sync::Arc::new(|| std::sync::Arc::new(nomad_proto::Node::default())),
                region: "global".into(),
                retry: Default::default(),
            }),
        };
        let t = Task { artifacts: vec![Default::default()], volume_mounts: vec![Default::default()], ..Task::default() };
        let getter = std::sync::Arc::new(crate::client::artifact::HttpGetter::new(Default::default()));
        let control: std::sync::Weak<dyn csi_plugin_supervisor::TaskControl> = std::sync::Weak::<Noop>::new();
        let artifacts =
            ArtifactHook::new(getter, control, std::sync::Arc::new(|| std::sync::Arc::new(nomad_proto::Node::default())), "global".into());
        let names: Vec<_> =
            init_hooks(&t, None, Default::default(), None, None, None, Some(artifacts), None).iter().map(|h| h.name()).collect();
        assert_eq!(names, ["validate", "task_dir", "dns", "volumes", "artifacts"], "after volumes, as Nomad");
        let sidecar = Task { kind: "connect-proxy:web".into(), ..Task::default() };
        let names: Vec<_> =
            init_hooks(&sidecar, None, Default::default(), None, None, Some(envoy), None, None).iter().map(|h| h.name()).collect();
        assert_eq!(names, ["validate", "task_dir", "dns", "envoy_version", "envoy_bootstrap"]);
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use crate::client::driver::TaskConfig;

    /// A task config rooted nowhere in particular; tests point `alloc_dir` at a temp dir.
    pub(crate) fn config() -> TaskConfig {
        TaskConfig {
            alloc_id: "a".into(),
            task_name: "t".into(),
            alloc_dir: "/nonexistent".into(),
            state_dir: "/nonexistent".into(),
            driver_config: Default::default(),
            env: Default::default(),
            user: None,
            resources: Default::default(),
            logs: Default::default(),
            kill_signal: nix::sys::signal::Signal::SIGINT,
            kill_timeout: std::time::Duration::from_secs(1),
            mounts: Vec::new(),
            netns: None,
        }
    }
}
