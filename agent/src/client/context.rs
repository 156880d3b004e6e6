//! What alloc and task runners share with the client: local state, drivers, the node, the
//! channel to the alloc syncer, and the shutdown signal.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use nomad_proto::{Allocation, Node};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::allocrunner::hooks::CsiClaimRpc;
use super::csi::{Connector, CsiPlugins, CsiVolumes};
use super::driver::DriverRegistry;
use super::services::ServiceRegistrar;
use super::state::StateDb;

/// Shared by every runner of one client.
pub struct ClientContext {
    /// Local state.
    pub state: Arc<StateDb>,
    /// Task drivers.
    pub drivers: DriverRegistry,
    /// This node as last registered (attributes and meta for interpolation).
    pub node: RwLock<Arc<Node>>,
    /// Where alloc dirs go: `<alloc_root>/<alloc_id>`.
    pub alloc_root: PathBuf,
    /// Agent-private per-task dirs: `<task_state_root>/<alloc_id>/<task>`.
    pub task_state_root: PathBuf,
    /// Region (`NOMAD_REGION`).
    pub region: String,
    /// Mount task secrets dirs as tmpfs where possible.
    pub secrets_tmpfs: bool,
    /// Upper bound on any task's `kill_timeout` (Nomad's `max_kill_timeout`, 30 s).
    pub max_kill_timeout: Duration,
    /// The agent's environment for raw_exec tasks (deny-listed variables removed).
    pub host_env: BTreeMap<String, String>,
    /// Client-side alloc states for the syncer.
    pub updates: mpsc::UnboundedSender<Allocation>,
    /// Fires when the agent shuts down: runners stop without touching their tasks.
    pub shutdown: CancellationToken,
    /// Every runner task, so shutdown can wait for all of them.
    pub tracker: TaskTracker,
    /// Wakes the alloc GC (an alloc became terminal).
    pub gc_trigger: tokio::sync::Notify,
    /// Registers Nomad-native services with the servers.
    pub registrar: Arc<dyn ServiceRegistrar>,
    /// `<state_dir>/csi`: CSI plugin sockets and staging roots.
    pub csi_root: PathBuf,
    /// The CSI manager, as plugin supervisors see it.
    pub csi_plugins: Arc<dyn CsiPlugins>,
    /// Makes the client for a CSI plugin's socket.
    pub csi_connect: Connector,
    /// The CSI manager's volumes: what the `csi` alloc hook mounts through.
    pub csi_volumes: Arc<dyn CsiVolumes>,
    /// `CSIVolume.Claim` and `CSIVolume.Unpublish`.
    pub csi_rpc: Arc<dyn CsiClaimRpc>,
    /// This node's ID.
    pub node_id: String,
    /// Group network namespaces (bridge, none, cni/<name>).
    pub network: Arc<dyn super::network::NetworkManager>,
    /// The Consul service sync, when the agent has a `consul {}` block.
    pub consul_services: Option<Arc<crate::client::consul::sync::ConsulServices>>,
    /// Consul check statuses for `check_restart`, and the API script checks report through.
    pub consul_checks: Option<Arc<crate::client::consul::checks::CheckWatcher>>,
    /// Asks the servers for Consul SI tokens; set only when the agent's Consul config has a
    /// token (Nomad's condition for the `consul_si_token` hook).
    pub si_tokens: Option<Arc<dyn crate::client::taskrunner::hooks::consul_si_token::SiTokenDeriver>>,
    /// Signs workload identities (`Node.SignIdentities`) for tasks with an `identity` block.
    pub identities: Arc<dyn crate::client::taskrunner::hooks::consul_si_token::SiTokenDeriver>,
    /// The task API (`secrets/api.sock` of tasks with an identity), served by the agent's router.
    pub task_api: Arc<crate::client::task_api::TaskApi>,
    /// Backoff of SI token and identity requests.
    pub si_backoff: crate::client::taskrunner::hooks::consul_si_token::Backoff,
    /// The agent's `consul {}`, when it has one.
    pub consul_config: Option<crate::config::consul::ConsulSettings>,
    /// The agent's Consul client (Envoy versions and proxy registrations), with `consul_config`.
    pub consul_api: Option<Arc<dyn crate::consul::ConsulApi>>,
    /// The same client's blocking reads (templates' Consul functions), with `consul_config`.
    pub consul_query: Option<Arc<dyn crate::consul::ConsulQuery>>,
    /// How long an Envoy bootstrap waits for its proxy's registration (Nomad's, except in tests).
    pub envoy_retry: crate::client::taskrunner::hooks::envoy_bootstrap::Retry,
    /// The results of Nomad service checks (`client/checks/`).
    pub nomad_checks: Arc<crate::client::checks::CheckStore>,
    /// The Nomad check statuses `check_restart` watches (polled from `nomad_checks`).
    pub nomad_check_watcher: Arc<crate::client::consul::checks::CheckWatcher>,
    /// Fetches tasks' artifacts (`client { artifact {} }` limits).
    pub artifacts: Arc<dyn crate::client::artifact::ArtifactGetter>,
    /// The client's `template {}`.
    pub template: crate::client::template::TemplateConfig,
}

impl ClientContext {
    /// The node as last registered.
    pub fn node(&self) -> Arc<Node> {
        self.node.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes the node in one step under the lock, so two loops updating different parts of it
    /// (drivers, Consul, CSI plugins, status) never write back a copy missing the other's change.
    /// `change` says whether it changed anything; returns that.
    pub fn update_node(&self, change: impl FnOnce(&mut Node) -> bool) -> bool {
        let mut node = self.node.write().unwrap_or_else(|e| e.into_inner());
        let mut n = (**node).clone();
        let changed = change(&mut n);
        if changed {
            *node = Arc::new(n);
        }
        changed
    }

    /// `<alloc_root>/<alloc_id>`.
    pub fn alloc_dir(&self, alloc_id: &str) -> PathBuf {
        self.alloc_root.join(alloc_id)
    }
}
