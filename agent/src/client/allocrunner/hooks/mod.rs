//! Alloc runner hooks: small traits run in one ordered list (decision 6).
//!
//! A hook implements [`AllocHook`] (its name) and returns the phases it takes part in:
//! - **prerun**, before any task starts. In order; stops at the first error, which fails every
//!   task of the alloc. A hook that answers `done` is skipped from then on, across agent
//!   restarts.
//! - **prekill**, before the tasks are killed because the alloc stops (not on agent shutdown).
//!   Every hook runs, in order; errors are collected.
//! - **update**, when the servers send a new version of the alloc. Every hook runs; concurrent
//!   with the tasks.
//! - **postrun**, once every task is dead. Every hook runs.
//! - **destroy**, when the alloc is garbage collected. Every hook runs; must be idempotent and
//!   may run without prerun (an alloc that never started).

mod alloc_dir;
mod checks;
pub mod consul_socket;
pub mod csi;
mod health;
mod network;
mod services;
mod shutdown_delay;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use nomad_proto::{Allocation, TaskState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use alloc_dir::{AllocDirHook, unmount_all_under};
pub use checks::ChecksHook;
pub use consul_socket::{ConsulSocketHook, Endpoint as ConsulEndpoint};
pub use csi::{CsiClaimRpc, CsiHook, CsiMounts, RpcCsiClaims, SaveState};
pub use health::{HealthConfig, HealthHook, Verdict, evaluate};
pub use network::{NetworkHook, status_of as network_status_of};
pub use services::{NodeFn, ServicesHook};
pub use shutdown_delay::ShutdownDelayHook;

use crate::client::services::ServiceRegistrar;
use crate::client::state::HookState;

/// What every phase gets.
pub struct AllocHookRequest<'a> {
    /// The alloc (the newest server copy).
    pub alloc: &'a Allocation,
    /// `<alloc_root>/<alloc_id>`.
    pub alloc_dir: &'a Path,
    /// The hook's state from its last run (also across agent restarts).
    pub previous: Option<&'a HookState>,
}

/// Why a hook failed; the message names what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AllocHookError(pub String);

/// An alloc hook: its name, and the phases it implements.
pub trait AllocHook: Send + Sync {
    /// Stable name: the key of its persisted state.
    fn name(&self) -> &'static str;
    /// Prerun phase.
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        None
    }
    /// Prekill phase.
    fn prekill(&self) -> Option<&dyn PrekillHook> {
        None
    }
    /// Update phase.
    fn update(&self) -> Option<&dyn UpdateHook> {
        None
    }
    /// Postrun phase.
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        None
    }
    /// Destroy phase.
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        None
    }
}

/// Runs before the tasks start.
pub trait PrerunHook {
    /// Prepares the alloc; `Ok(Some(state))` persists the state (with `done` to skip it later).
    /// May wait (a CSI claim waits for a free volume).
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<Option<HookState>, AllocHookError>>;
}

/// Runs before the tasks are killed because the alloc stops.
pub trait PrekillHook {
    /// May wait (the group's `shutdown_delay`).
    fn prekill<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<(), AllocHookError>>;
}

/// Runs on each new version of the alloc.
pub trait UpdateHook {
    /// Reacts to the update.
    fn update(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError>;
}

/// Runs once every task is dead.
pub trait PostrunHook {
    /// Cleans up after the run.
    fn postrun(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError>;
}

/// Runs when the alloc is garbage collected. Idempotent; may run without prerun.
pub trait DestroyHook {
    /// Removes what the hook created.
    fn destroy(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError>;
}

/// What the hooks may use of their runner.
pub struct HookEnv {
    /// Task states as they change.
    pub task_states: watch::Receiver<BTreeMap<String, TaskState>>,
    /// Where the health hook reports a verdict (the alloc's `DeploymentStatus`).
    pub deployment_status: Arc<dyn Fn(serde_json::Value) + Send + Sync>,
    /// Cancelled when the agent shuts down or the alloc is destroyed.
    pub cancel: CancellationToken,
    /// Cancelled only when the agent shuts down.
    pub shutdown: CancellationToken,
    /// Where the alloc's Nomad-native services are registered.
    pub registrar: Arc<dyn ServiceRegistrar>,
    /// Where the alloc's Consul services are registered (none without Consul).
    pub consul: Option<Arc<crate::client::consul::sync::ConsulServices>>,
    /// Consul's check statuses, which the health hook judges checks by (none without Consul).
    pub consul_checks: Option<Arc<crate::client::consul::checks::CheckWatcher>>,
    /// This node as last registered.
    pub node: NodeFn,
    /// Region (interpolation).
    pub region: String,
    /// What the `csi` hook uses.
    pub csi: CsiDeps,
    /// The group network namespaces.
    pub network: Arc<dyn crate::client::network::NetworkManager>,
    /// The agent's `consul {}` (where the Consul sockets lead); `None` without Consul.
    pub consul_config: Option<crate::config::consul::ConsulSettings>,
    /// The results of Nomad service checks (`client/checks/`); `None` in tests that run none.
    pub nomad_checks: Option<Arc<crate::client::checks::CheckStore>>,
    /// The alloc's network status as this client reports it (checks in `alloc` address mode).
    pub network_status: crate::client::checks::runner::NetworkStatusFn,
}

/// What the `csi` hook gets besides the common parts.
pub struct CsiDeps {
    /// The node's volume manager.
    pub volumes: Arc<dyn crate::client::csi::CsiVolumes>,
    /// `CSIVolume.*` RPCs.
    pub rpc: Arc<dyn CsiClaimRpc>,
    /// This node's ID.
    pub node_id: String,
    /// The mounts, shared with the task runners.
    pub mounts: CsiMounts,
    /// Persists a hook's state.
    pub save: SaveState,
}

/// The alloc hooks, in the order every phase runs them.
///
/// Why this order:
/// 1. `alloc_dir` first: it builds `<alloc>/alloc/{data,logs,tmp}`, which the task runners, the
///    executors' logs and every later hook write into; in destroy it removes the directory
///    (unmounting task secrets first), which is safe last-or-first since nothing else in
///    destroy reads the disk.
/// 2. `health` next: it must watch the task states before the first task starts, so it sees
///    the alloc become healthy (or fail) from the beginning.
/// 3. `network` after `health` and before `services`, as in Nomad: the namespace exists (and
///    its address is known) before any task starts or any service is registered; in postrun,
///    every task is dead already, so nothing uses it when it is torn down.
/// 4. `services` before `shutdown_delay`: when the alloc stops, its Nomad services are
///    deregistered first (prekill waits for that attempt), so that during the shutdown delay no
///    one is sent to the alloc any more and traffic drains, as in Nomad.
/// 5. `consul_grpc_socket` and `consul_http_socket` after `network` and `alloc_dir` (the socket
///    goes in `alloc/tmp`, and is what a task in the namespace reaches Consul through) and
///    before any task starts, as in Nomad (after group services, before `csi`); in postrun every
///    task using the socket is dead, so it can go.
/// 6. `csi` after `services`, as in Nomad: its prerun may wait for a claim (and the mounts),
///    and the tasks need its mounts, so it is the last hook of prerun; its postrun releases the
///    volumes in the background, once every task is dead.
/// 7. `checks` after `csi`, as in Nomad: its observers start before any task (a check fails
///    until its task listens); in prekill it stops them and purges their results before
///    `shutdown_delay` waits, as Nomad's PreKill does.
/// 8. `shutdown_delay` last: it only acts in prekill, where it waits the group's
///    `shutdown_delay` between "the alloc stops" and the first kill signal.
pub fn init_hooks(env: HookEnv) -> Vec<Box<dyn AllocHook>> {
    let cancel = env.cancel.clone();
    let services = ServicesHook::new(&env);
    let csi = CsiHook::new(csi::CsiHookEnv {
        volumes: env.csi.volumes.clone(),
        rpc: env.csi.rpc.clone(),
        node_id: env.csi.node_id.clone(),
        region: env.region.clone(),
        mounts: env.csi.mounts.clone(),
        cancel: env.cancel.clone(),
        shutdown: env.shutdown.clone(),
        save: env.csi.save.clone(),
    });
    let network = NetworkHook::new(env.network.clone());
    let socket = |endpoint| ConsulSocketHook::new(endpoint, env.consul_config.clone(), env.node.clone(), env.cancel.clone());
    let (grpc_socket, http_socket) = (socket(ConsulEndpoint::Grpc), socket(ConsulEndpoint::Http));
    let checks = ChecksHook::new(&env);
    vec![
        Box::new(AllocDirHook),
        Box::new(HealthHook::new(env)),
        Box::new(network),
        Box::new(services),
        Box::new(grpc_socket),
        Box::new(http_socket),
        Box::new(csi),
        Box::new(checks),
        Box::new(ShutdownDelayHook::new(cancel)),
    ]
}

/// Runs prerun: in order, skipping done hooks, stopping at the first error. New states go into
/// `states` (the caller persists them).
pub async fn run_prerun(
    hooks: &[Box<dyn AllocHook>],
    alloc: &Allocation,
    alloc_dir: &Path,
    states: &mut BTreeMap<String, HookState>,
) -> Result<(), (&'static str, AllocHookError)> {
    for hook in hooks {
        let Some(phase) = hook.prerun() else { continue };
        let previous = states.get(hook.name());
        if previous.is_some_and(|s| s.done) {
            continue;
        }
        let req = AllocHookRequest { alloc, alloc_dir, previous };
        if let Some(state) = phase.prerun(&req).await.map_err(|e| (hook.name(), e))? {
            states.insert(hook.name().to_string(), state);
        }
    }
    Ok(())
}

/// Runs prekill: every hook in order, collecting errors.
pub async fn run_prekill(
    hooks: &[Box<dyn AllocHook>],
    alloc: &Allocation,
    alloc_dir: &Path,
    states: &BTreeMap<String, HookState>,
) -> Vec<(&'static str, AllocHookError)> {
    let mut errors = Vec::new();
    for hook in hooks {
        let Some(phase) = hook.prekill() else { continue };
        let req = AllocHookRequest { alloc, alloc_dir, previous: states.get(hook.name()) };
        if let Err(e) = phase.prekill(&req).await {
            errors.push((hook.name(), e));
        }
    }
    errors
}

/// The synchronous post phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// New alloc version.
    Update,
    /// Every task dead.
    Postrun,
    /// Garbage collected.
    Destroy,
}

/// Runs update, postrun or destroy: every hook in order, collecting errors.
pub fn run_phase(
    hooks: &[Box<dyn AllocHook>],
    phase: Phase,
    alloc: &Allocation,
    alloc_dir: &Path,
    states: &BTreeMap<String, HookState>,
) -> Vec<(&'static str, AllocHookError)> {
    let mut errors = Vec::new();
    for hook in hooks {
        let req = AllocHookRequest { alloc, alloc_dir, previous: states.get(hook.name()) };
        let result = match phase {
            Phase::Update => hook.update().map(|h| h.update(&req)),
            Phase::Postrun => hook.postrun().map(|h| h.postrun(&req)),
            Phase::Destroy => hook.destroy().map(|h| h.destroy(&req)),
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

    use futures::FutureExt;

    use super::*;

    struct Probe {
        name: &'static str,
        fail: bool,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl AllocHook for Probe {
        fn name(&self) -> &'static str {
            self.name
        }
        fn prerun(&self) -> Option<&dyn PrerunHook> {
            Some(self)
        }
        fn destroy(&self) -> Option<&dyn DestroyHook> {
            Some(self)
        }
    }

    impl PrerunHook for Probe {
        fn prerun<'a>(&'a self, _req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
            self.log.lock().unwrap().push(format!("prerun {}", self.name));
            let r = if self.fail { Err(AllocHookError("boom".into())) } else { Ok(Some(HookState { done: true, ..HookState::default() })) };
            Box::pin(std::future::ready(r))
        }
    }

    impl DestroyHook for Probe {
        fn destroy(&self, _req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
            self.log.lock().unwrap().push(format!("destroy {}", self.name));
            if self.fail { Err(AllocHookError("boom".into())) } else { Ok(()) }
        }
    }

    #[test]
    fn prerun_stops_at_the_first_error_and_destroy_runs_every_hook() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hooks: Vec<Box<dyn AllocHook>> = ["a", "b", "c"]
            .into_iter()
            .map(|name| Box::new(Probe { name, fail: name == "b", log: log.clone() }) as Box<dyn AllocHook>)
            .collect();
        let alloc = Allocation::default();
        let mut states = BTreeMap::new();
        let err = run_prerun(&hooks, &alloc, Path::new("/x"), &mut states).now_or_never().unwrap().unwrap_err();
        assert_eq!(err.0, "b");
        assert_eq!(*log.lock().unwrap(), ["prerun a", "prerun b"]);
        assert!(states["a"].done);
        log.lock().unwrap().clear();
        let _ = run_prerun(&hooks, &alloc, Path::new("/x"), &mut states).now_or_never().unwrap();
        assert_eq!(*log.lock().unwrap(), ["prerun b"], "a is done and skipped");
        log.lock().unwrap().clear();
        let errors = run_phase(&hooks, Phase::Destroy, &alloc, Path::new("/x"), &states);
        assert_eq!(errors.len(), 1);
        assert_eq!(*log.lock().unwrap(), ["destroy a", "destroy b", "destroy c"]);
    }

    #[test]
    fn the_hook_list_order() {
        let (_tx, rx) = watch::channel(BTreeMap::new());
        let env = services::tests::env(rx, Arc::new(services::tests::FakeRegistrar::default()));
        let names: Vec<_> = init_hooks(env).iter().map(|h| h.name()).collect();
        assert_eq!(
            names,
            ["alloc_dir", "health", "network", "services", "consul_grpc_socket", "consul_http_socket", "csi", "checks", "shutdown_delay"]
        );
    }
}
