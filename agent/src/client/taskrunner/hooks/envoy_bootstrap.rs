//! `envoy_bootstrap`: the Envoy bootstrap of a Connect sidecar or gateway task, written to
//! `secrets/envoy_bootstrap.json` before each start (Nomad's `envoy_bootstrap_hook.go`).
//!
//! Nomad runs `consul connect envoy -bootstrap` for this; nomad-rs needs no Consul binary and
//! builds the same file itself ([`crate::client::connect::bootstrap`]) from what that command
//! would read:
//! - the group service named by the task's kind, its proxy ID, the admin and ready binds and
//!   the gRPC address ([`crate::client::connect::proxy`]);
//! - the proxy's registration in the local Consul agent (`GET /v1/agent/service/<proxy ID>` in
//!   the Consul namespace: the group's `consul { namespace }`, else the agent's): the
//!   destination service, datacenter, namespace and `Proxy.Config.envoy_stats_tags`. The
//!   registration is made asynchronously by the services sync, so a proxy not (yet) known is
//!   asked again, as Nomad retries the command: after 1 s, doubling, each wait with up to
//!   500 ms of jitter, for at most 60 s of waiting; then the task fails with Nomad's text (a
//!   recoverable error, counted by the restart policy);
//! - the SI token from `secrets/si_token` (the `consul_si_token` hook runs first), sent as
//!   `x-consul-token`; none without Consul ACLs.
//!
//! TLS to Consul is refused by the agent's configuration, so the bootstrap never carries CA
//! files. Proxy config keys that change the bootstrap itself (`envoy_prometheus_bind_addr`,
//! `envoy_extra_static_clusters_json`, ...) are not built: a proxy that sets one fails with a
//! message naming it rather than running without it.
//!
//! The file is written (mode 0644, as Nomad's `os.Create`) beneath the alloc dir through
//! `fs_beneath`, never through a symlink the task planted. The hook is not marked done: a
//! restarted task gets a fresh file (its secrets tmpfs may be gone after a reboot), while a task
//! the restarted agent reattaches to keeps the file it runs with; the `NOMAD_ENVOY_*` variables
//! are computed from the alloc by the task runner, the same before and after a restart.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use super::consul_si_token::read_token;
use super::{AsyncPrestartHook, HookError, HookRequest, PrestartResponse, TaskHook};
use crate::client::allocrunner::hooks::NodeFn;
use crate::client::connect::bootstrap::{self, BootstrapParams, GrpcEndpoint};
use crate::client::connect::proxy;
use crate::client::taskrunner::interpolate::Interpolator;
use crate::consul::{AgentService, ConsulApi};
use crate::fs_beneath::{Beneath, Links};

/// The hook's name (part of the on-disk hook state format).
pub const NAME: &str = "envoy_bootstrap";
/// The bootstrap's file in the task's secrets dir.
pub const BOOTSTRAP_FILE: &str = "envoy_bootstrap.json";
/// The file's mode (Nomad creates it with `os.Create`: 0666 less the usual umask).
pub const BOOTSTRAP_MODE: u32 = 0o644;
/// The hook data key holding the proxy ID the bootstrap was written for.
pub const PROXY_ID_KEY: &str = "proxy_id";

/// `errEnvoyBootstrapError` and the link Nomad appends to it.
const BOOTSTRAP_ERROR: &str = "error creating bootstrap configuration for Connect proxy sidecar";
const BOOTSTRAP_ERROR_LINK: &str = "see: <https://www.nomadproject.io/s/envoy-bootstrap-error>";

/// Proxy config keys `consul connect envoy` turns into bootstrap content, which this builder
/// does not make (the others are read by Consul's xDS server, or are `envoy_stats_tags`).
const UNBUILT_KEYS: [&str; 14] = [
    "envoy_bootstrap_json_tpl",
    "envoy_dogstatsd_url",
    "envoy_extra_static_clusters_json",
    "envoy_extra_static_listeners_json",
    "envoy_extra_stats_sinks_json",
    "envoy_hcp_metrics_bind_socket_dir",
    "envoy_prometheus_bind_addr",
    "envoy_stats_bind_addr",
    "envoy_stats_config_json",
    "envoy_stats_flush_interval",
    "envoy_statsd_url",
    "envoy_telemetry_collector_bind_socket_dir",
    "envoy_tracing_json",
    "envoy_ready_bind_addr",
];

/// How long the hook keeps asking for a proxy Consul does not know yet (Nomad's
/// `envoyBootstrapInitialGap`, `envoyBootstrapMaxJitter`, `envoyBootstrapWaitTime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// The first wait; each next one doubles.
    pub initial: Duration,
    /// Up to this much is added to each wait.
    pub max_jitter: Duration,
    /// The most the hook waits in all.
    pub total: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry { initial: Duration::from_secs(1), max_jitter: Duration::from_millis(500), total: Duration::from_secs(60) }
    }
}

impl Retry {
    /// The wait before attempt `attempt` (≥ 1) with jitter `jitter` (0..1), or `None` once the
    /// waits so far (`waited`) and this one would pass the total.
    pub fn wait(&self, attempt: u32, jitter: f64, waited: Duration) -> Option<Duration> {
        let gap = self.initial.saturating_mul(1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX));
        let gap = gap.saturating_add(self.max_jitter.mul_f64(jitter.clamp(0.0, 1.0)));
        (waited.saturating_add(gap) <= self.total).then_some(gap)
    }
}

/// What the hook needs of the agent.
#[derive(Clone)]
pub struct EnvoyBootstrapDeps {
    /// The agent's Consul client; `None` when the agent has no Consul.
    pub consul: Option<Arc<dyn ConsulApi>>,
    /// The agent's `consul { namespace }`.
    pub agent_namespace: String,
    /// This node (interpolation of the service's name).
    pub node: NodeFn,
    /// Region (interpolation).
    pub region: String,
    /// Nomad's timing, except in tests.
    pub retry: Retry,
}

/// See the module docs.
pub struct EnvoyBootstrapHook {
    deps: EnvoyBootstrapDeps,
}

impl EnvoyBootstrapHook {
    /// The hook for one task.
    pub fn new(deps: EnvoyBootstrapDeps) -> EnvoyBootstrapHook {
        EnvoyBootstrapHook { deps }
    }

    /// Writes the bootstrap (see the module docs).
    async fn bootstrap(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        let (alloc, task) = (req.alloc, req.task);
        let Some(task_kind) = proxy::task_proxy_kind(task) else { return Ok(PrestartResponse::default()) };
        let node = (self.deps.node)();
        let interp = Interpolator { env: &req.config.env, node: &node, region: &self.deps.region };
        let service = proxy::lookup_service(alloc, task, &interp).map_err(HookError::fatal)?;
        let kind = proxy::service_proxy_kind(&service).unwrap_or(task_kind);
        // raw_exec runs in its task dir, which holds no `alloc/`: the socket's host path.
        let raw_exec = req.driver.is_some_and(|d| d.name() == "raw_exec");
        let grpc_raw = proxy::grpc_address(alloc, &req.config.env, raw_exec.then_some(req.config.alloc_dir.as_path()));
        let grpc = grpc_endpoint(&grpc_raw).await.map_err(fatal)?;
        let (admin, ready) = proxy::binds(alloc, &service, &task.name).map_err(fatal)?;
        let proxy_id = proxy::proxy_id(alloc, &service, kind);
        let group_ns = proxy::group(alloc).map(nomad_server::consul::config_entries::group_namespace).unwrap_or_default();
        let namespace = if group_ns.is_empty() { self.deps.agent_namespace.clone() } else { group_ns };

        let task_dir = Beneath::open(&req.config.alloc_dir)
            .and_then(|d| d.open_dir(Path::new(&task.name), Links::Refuse))
            .map_err(|e| fatal(format!("open the task dir: {e}")))?;
        let token = read_token(&task_dir)
            .map_err(|e| {
                HookError::fatal(format!("failed to generate envoy bootstrap config: failed to load SI token for {}: {e}", task.name))
            })?
            .unwrap_or_default();

        tracing::info!(
            alloc_id = %alloc.id, task = %task.name, namespace, proxy_id, service = %service.name, grpc_addr = %grpc_raw,
            admin_bind = %admin, ready_bind = %ready, "bootstrapping envoy"
        );
        let consul = self.deps.consul.as_deref().ok_or_else(|| fatal("this client has no Consul configuration"))?;
        let reg = self.registration(consul, &proxy_id, &namespace).await?;
        let stats_tags = proxy_config(reg.proxy.as_ref().map(|p| &p.config)).map_err(fatal)?;
        let destination = reg.proxy.as_ref().map(|p| p.destination_service_name.clone()).unwrap_or_default();
        // Consul's `templateArgs`/`generateConfig`: a sidecar is its destination's cluster; a
        // gateway started with `-gateway <kind>` and no `-service` is its kind's, while the
        // source tag names the registered gateway.
        let cluster = match proxy::gateway_kind_name(kind) {
            Some(kind_name) if destination.is_empty() => kind_name.to_string(),
            _ if destination.is_empty() => proxy_id.clone(),
            _ => destination.clone(),
        };
        let source = if destination.is_empty() { reg.service.clone() } else { destination };
        let params = BootstrapParams {
            kind,
            proxy_id: proxy_id.clone(),
            cluster,
            service: source,
            namespace: if reg.namespace.is_empty() { namespace } else { reg.namespace.clone() },
            partition: String::new(),
            datacenter: reg.datacenter.clone(),
            admin,
            ready: Some(ready),
            grpc,
            token,
            stats_tags,
        };
        let json = serde_json::to_vec_pretty(&bootstrap::build(&params)).map_err(|e| fatal(format!("encode: {e}")))?;
        write_bootstrap(&task_dir, &json)
            .map_err(|e| HookError::recoverable(format!("failed to create secrets/{BOOTSTRAP_FILE} for envoy: {e}")))?;
        let mut resp = PrestartResponse::default();
        resp.data.insert(PROXY_ID_KEY.into(), proxy_id);
        Ok(resp)
    }

    /// The registration, asked again while Consul does not know it or cannot be reached.
    async fn registration(&self, consul: &dyn ConsulApi, proxy_id: &str, namespace: &str) -> Result<AgentService, HookError> {
        let mut waited = Duration::ZERO;
        let mut attempt = 0u32;
        loop {
            let last = match consul.service(proxy_id, namespace).await {
                Ok(s) if s.proxy.is_some() => return Ok(s),
                Ok(_) => format!("service {proxy_id:?} is not a Connect proxy or gateway"),
                Err(e) => format!("failed fetch proxy config from local agent: {e}"),
            };
            attempt = attempt.saturating_add(1);
            let Some(gap) = self.deps.retry.wait(attempt, rand::random::<f64>(), waited) else {
                return Err(HookError::recoverable(format!("{BOOTSTRAP_ERROR}: {last}; {BOOTSTRAP_ERROR_LINK}")));
            };
            tracing::debug!(proxy_id, attempt, error = %last, "the proxy is not registered in Consul yet; asking again");
            tokio::time::sleep(gap).await;
            waited += gap;
        }
    }
}

fn fatal(message: impl std::fmt::Display) -> HookError {
    HookError::fatal(format!("{BOOTSTRAP_ERROR}: {message}; {BOOTSTRAP_ERROR_LINK}"))
}

/// Consul's gRPC address as Envoy's static cluster needs it: an IP address (Consul resolves a
/// name itself, `localhost` included) or a unix socket.
async fn grpc_endpoint(raw: &str) -> Result<GrpcEndpoint, String> {
    match GrpcEndpoint::parse(raw) {
        Ok(e) => Ok(e),
        Err(e) if raw.starts_with("unix://") || raw.starts_with("https://") => Err(e),
        Err(e) => {
            let hostport = raw.strip_prefix("http://").unwrap_or(raw);
            let mut addrs = tokio::net::lookup_host(hostport).await.map_err(|_| e.clone())?;
            let sa = addrs.next().ok_or(e)?;
            Ok(GrpcEndpoint::Tcp { address: sa.ip().to_string(), port: sa.port() })
        }
    }
}

/// `envoy_stats_tags` of a proxy's `Config` (mapstructure's weak decoding: a list, or one
/// value), and the config keys that change the bootstrap, which are refused.
fn proxy_config(config: Option<&BTreeMap<String, Value>>) -> Result<Vec<String>, String> {
    let Some(config) = config else { return Ok(Vec::new()) };
    let unbuilt: Vec<&str> = UNBUILT_KEYS.iter().copied().filter(|k| config.get(*k).is_some_and(|v| !v.is_null())).collect();
    if !unbuilt.is_empty() {
        return Err(format!("proxy config {} not supported by this client's Envoy bootstrap", unbuilt.join(", ")));
    }
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    Ok(match config.get("envoy_stats_tags") {
        Some(Value::Array(items)) => items.iter().filter_map(scalar).collect(),
        Some(v) => scalar(v).into_iter().collect(),
        None => Vec::new(),
    })
}

fn write_bootstrap(task_dir: &Beneath, json: &[u8]) -> Result<(), String> {
    let rel = Path::new("secrets").join(BOOTSTRAP_FILE);
    let mut f = task_dir.write(&rel, BOOTSTRAP_MODE, Links::Refuse).map_err(|e| e.to_string())?;
    f.set_permissions(std::fs::Permissions::from_mode(BOOTSTRAP_MODE)).map_err(|e| e.to_string())?;
    f.write_all(json).map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())
}

impl TaskHook for EnvoyBootstrapHook {
    fn name(&self) -> &'static str {
        NAME
    }
    fn prestart_async(&self) -> Option<&dyn AsyncPrestartHook> {
        Some(self)
    }
}

impl AsyncPrestartHook for EnvoyBootstrapHook {
    fn prestart<'a>(&'a self, req: &'a HookRequest<'a>) -> BoxFuture<'a, Result<PrestartResponse, HookError>> {
        Box::pin(async move { self.bootstrap(req).await.map_err(|e| e.as_hook_event(NAME)) })
    }
}

/// The bootstrap's host path for a task (tests, diagnostics).
pub fn bootstrap_path(alloc_dir: &Path, task: &str) -> PathBuf {
    alloc_dir.join(task).join("secrets").join(BOOTSTRAP_FILE)
}

#[cfg(test)]
mod tests;
