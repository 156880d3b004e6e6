//! Consul Connect on the servers: Nomad's job admission hooks `jobConnectHook` and
//! `jobExposeCheckHook` (`nomad/job_endpoint_hook_connect.go`, `job_endpoint_hook_expose_check.go`),
//! written without I/O so `Job.Register`, `Job.Plan`, `/v1/validate/job` and the CLI's
//! `job validate` run the same code.
//!
//! [`Job::mutate_connect`] runs on a canonicalized job, in groups that have a network:
//! - `connect { sidecar_service {} }`: the Envoy sidecar task `connect-proxy-<service>` (kind
//!   `connect-proxy:<service>`) unless a task of that kind exists, `sidecar_task {}` merged over
//!   it, and the dynamic port `connect-proxy-<service>` (or `sidecar_service.port`) with `to = -1`;
//! - `connect { native = true }`: the backing task's kind `connect-native:<service>`;
//! - `connect { gateway {} }`: Nomad's default proxy for the network mode, the injected port of a
//!   terminating gateway without one (mesh: the `-lan` port), and the gateway task;
//! - a check with `expose = true` on a sidecar service: the port `svc_<service>_ck_<hash>` and an
//!   expose path in the sidecar's proxy.
//!
//! [`Job::validate_connect`] is Nomad's matching validation. Both are idempotent: a job that
//! was mutated already (a re-registration, a job read back) passes through unchanged.
//!
//! The gateway proxy, ingress entry and expose blocks are kept in the job model as Nomad's JSON
//! (`serde_json::Value`); [`GatewayProxy`], [`IngressConfigEntry`] and [`ExposeConfig`] are
//! their typed views, read with Go's case-insensitive manners.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::job::{Constraint, DEFAULT_KILL_TIMEOUT_NS, Job, LogConfig, Task, TaskGroup, TaskLifecycle, lifecycle_hook, task_kind};
use crate::resources::{NetworkResource, Port, Resources};
use crate::service::{ConsulConnect, ConsulGateway, Service, ServiceCheck, SidecarTask};

/// The sidecar image: node meta the client defaults to Envoy's image for Consul's version.
pub const SIDECAR_IMAGE: &str = "${meta.connect.sidecar_image}";
/// The gateway image, from node meta likewise.
pub const GATEWAY_IMAGE: &str = "${meta.connect.gateway_image}";
/// Where the client writes Envoy's bootstrap (`structs.EnvoyBootstrapPath`).
pub const ENVOY_BOOTSTRAP_PATH: &str = "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json";
/// CPU (MHz) of an injected Envoy task.
pub const PROXY_CPU: i64 = 250;
/// Memory (MiB) of an injected Envoy task.
pub const PROXY_MEMORY_MB: i64 = 128;
/// Shutdown delay of an injected Envoy task, ns.
pub const PROXY_SHUTDOWN_DELAY_NS: i64 = 5_000_000_000;
/// A gateway proxy's connect timeout unless given, ns (Consul's default).
pub const DEFAULT_GATEWAY_CONNECT_TIMEOUT_NS: i64 = 5_000_000_000;
/// The Consul version Envoy tasks need (`connectSidecarVersionConstraint`).
pub const CONSUL_CONNECT_MIN_VERSION: &str = ">= 1.8.0";
/// The Consul version gateways with customized TLS need (`connectGatewayTLSVersionConstraint`).
pub const CONSUL_GATEWAY_TLS_MIN_VERSION: &str = ">= 1.11.2";
/// The node attribute with Consul's gRPC port, which Envoy's xDS needs (`connectListenerConstraint`).
pub const CONSUL_GRPC_ATTRIBUTE: &str = "${attr.consul.grpc}";

/// A Connect block that Nomad's admission hooks refuse, with Nomad's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(pub String);

fn err<T>(msg: String) -> Result<T, ConnectError> {
    Err(ConnectError(msg))
}

/// Nomad's `envoy.PortLabel`: `<prefix>-<service>[-<suffix>]`.
pub fn port_label(prefix: &str, service: &str, suffix: &str) -> String {
    if suffix.is_empty() { format!("{prefix}-{service}") } else { format!("{prefix}-{service}-{suffix}") }
}

/// `<prefix>:<service>`, a Connect task kind (`structs.NewTaskKind`).
pub fn task_kind(prefix: &str, service: &str) -> String {
    format!("{prefix}:{service}")
}

/// A gateway's bind address (`ConsulGatewayBindAddress`); port -1: the client fills it in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct GatewayBindAddress {
    /// Address.
    pub address: String,
    /// Port (-1: the port Nomad allocates).
    pub port: i64,
}

/// A gateway's Envoy settings (`ConsulGatewayProxy`), the typed view of [`ConsulGateway::proxy`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct GatewayProxy {
    /// Upstream connect timeout, ns.
    pub connect_timeout: Option<i64>,
    /// Bind the tagged addresses.
    pub envoy_gateway_bind_tagged_addresses: bool,
    /// Extra listeners by name.
    pub envoy_gateway_bind_addresses: BTreeMap<String, GatewayBindAddress>,
    /// No listener on the service address.
    pub envoy_gateway_no_default_bind: bool,
    /// `STRICT_DNS` or `LOGICAL_DNS`.
    #[serde(rename = "EnvoyDNSDiscoveryType")]
    pub envoy_dns_discovery_type: String,
    /// Opaque Envoy config for Consul.
    pub config: BTreeMap<String, Value>,
}

impl GatewayProxy {
    /// Reads the job's JSON with Go's manners.
    pub fn from_value(v: &Value) -> Result<GatewayProxy, String> {
        crate::lenient::from_value(v.clone()).map_err(|e| e.to_string())
    }

    /// Nomad's JSON shape.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// None of the bind settings is set, so Nomad builds the proxy for the network mode
    /// (`gatewayProxyIsDefault`).
    fn is_default(&self) -> bool {
        !self.envoy_gateway_no_default_bind && !self.envoy_gateway_bind_tagged_addresses && self.envoy_gateway_bind_addresses.is_empty()
    }
}

/// An ingress gateway's TLS settings (`ConsulGatewayTLSConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct GatewayTlsConfig {
    /// TLS on.
    pub enabled: bool,
    /// Lowest version.
    #[serde(rename = "TLSMinVersion")]
    pub tls_min_version: String,
    /// Highest version.
    #[serde(rename = "TLSMaxVersion")]
    pub tls_max_version: String,
    /// Cipher suites.
    pub cipher_suites: Vec<String>,
}

/// A service behind an ingress listener (`ConsulIngressService`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct IngressService {
    /// Service name (`*`: every service, http listeners only).
    pub name: String,
    /// Hosts.
    pub hosts: Vec<String>,
}

/// An ingress listener (`ConsulIngressListener`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct IngressListener {
    /// Port.
    pub port: i64,
    /// `tcp` (when empty, as Nomad's API fills it), `http`, `http2` or `grpc`.
    pub protocol: String,
    /// Services.
    pub services: Vec<IngressService>,
}

impl IngressListener {
    /// The protocol, `tcp` when unset (Nomad's `api.ConsulIngressListener.Canonicalize`).
    pub fn protocol(&self) -> &str {
        if self.protocol.is_empty() { "tcp" } else { &self.protocol }
    }
}

/// An ingress gateway's config entry (`ConsulIngressConfigEntry`), the typed view of
/// [`ConsulGateway::ingress`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct IngressConfigEntry {
    /// TLS.
    #[serde(rename = "TLS")]
    pub tls: Option<GatewayTlsConfig>,
    /// Listeners.
    pub listeners: Vec<IngressListener>,
}

impl IngressConfigEntry {
    /// Reads the job's JSON with Go's manners.
    pub fn from_value(v: &Value) -> Result<IngressConfigEntry, String> {
        crate::lenient::from_value(v.clone()).map_err(|e| e.to_string())
    }

    /// TLS versions or ciphers are set (`ConsulConnect.IsCustomizedTLS`).
    fn customized_tls(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| !t.tls_min_version.is_empty() || !t.tls_max_version.is_empty() || !t.cipher_suites.is_empty())
    }
}

/// One path Envoy exposes without mTLS (`ConsulExposePath`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ExposePath {
    /// HTTP path.
    pub path: String,
    /// `http` or `http2`.
    pub protocol: String,
    /// The service's port inside the network namespace.
    pub local_path_port: i64,
    /// The port label Envoy listens on.
    pub listener_port: String,
}

/// A sidecar proxy's `expose {}` (`ConsulExposeConfig`), the typed view of
/// [`crate::service::ConsulProxy::expose`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ExposeConfig {
    /// Paths.
    pub paths: Vec<ExposePath>,
}

impl ExposeConfig {
    /// Reads the job's JSON with Go's manners.
    pub fn from_value(v: &Value) -> Result<ExposeConfig, String> {
        crate::lenient::from_value(v.clone()).map_err(|e| e.to_string())
    }
}

/// What Nomad's API canonicalization does to a `connect {}` block (`api.ConsulConnect.Canonicalize`),
/// called by [`Job::canonicalize`]: a `sidecar_task {}` gets the API's task defaults (so, as in
/// Nomad, a `sidecar_task` without `resources` asks for 100 MHz and 300 MiB, not the sidecar's
/// 250 and 128), and a gateway `proxy {}` its 5 s connect timeout.
pub(crate) fn canonicalize_connect(c: &mut ConsulConnect) {
    if let Some(t) = c.sidecar_task.as_mut() {
        t.resources.get_or_insert_with(Resources::default);
        t.log_config.get_or_insert_with(LogConfig::default);
        t.kill_timeout.get_or_insert(DEFAULT_KILL_TIMEOUT_NS);
        t.shutdown_delay.get_or_insert(0);
    }
    if let Some(gw) = c.gateway.as_mut()
        && let Some(v) = gw.proxy.as_mut()
        && let Ok(mut p) = GatewayProxy::from_value(v)
    {
        // One that does not decode is left for the mutator to refuse, naming it.
        p.connect_timeout.get_or_insert(DEFAULT_GATEWAY_CONNECT_TIMEOUT_NS);
        *v = p.to_value();
    }
}

/// Nomad's `SidecarTask.MergeIntoTask`: the overrides of `sidecar_task {}` over an Envoy task.
/// A different driver replaces the driver config; the same driver merges it key by key.
pub fn merge_sidecar_task(over: &SidecarTask, task: &mut Task) {
    if !over.name.is_empty() {
        task.name = over.name.clone();
    }
    if !over.driver.is_empty() && over.driver != task.driver {
        task.driver = over.driver.clone();
        task.config = over.config.clone();
    } else {
        task.config.extend(over.config.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if !over.user.is_empty() {
        task.user = over.user.clone();
    }
    task.env.extend(over.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(r) = &over.resources {
        merge_resources(&mut task.resources, r);
    }
    task.meta.extend(over.meta.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(t) = over.kill_timeout {
        task.kill_timeout = t;
    }
    if let Some(l) = &over.log_config {
        if l.max_files > 0 {
            task.log_config.max_files = l.max_files;
        }
        if l.max_file_size_mb > 0 {
            task.log_config.max_file_size_mb = l.max_file_size_mb;
        }
    }
    if let Some(d) = over.shutdown_delay {
        task.shutdown_delay = d;
    }
    if !over.kill_signal.is_empty() {
        task.kill_signal = over.kill_signal.clone();
    }
    // Nomad's `Task.Canonicalize`, which runs after the merge.
    if task.kill_timeout == 0 {
        task.kill_timeout = DEFAULT_KILL_TIMEOUT_NS;
    }
}

/// Nomad's `Resources.Merge`: every non-zero value of `over` wins.
fn merge_resources(r: &mut Resources, over: &Resources) {
    for (mine, theirs) in [
        (&mut r.cpu, over.cpu),
        (&mut r.cores, over.cores),
        (&mut r.memory_mb, over.memory_mb),
        (&mut r.memory_max_mb, over.memory_max_mb),
        (&mut r.disk_mb, over.disk_mb),
    ] {
        if theirs != 0 {
            *mine = theirs;
        }
    }
    if !over.networks.is_empty() {
        r.networks = over.networks.clone();
    }
    if !over.devices.is_empty() {
        r.devices = over.devices.clone();
    }
}

/// The variables Nomad can interpolate into a Connect service name when a job is submitted
/// (`taskenv` built from the job and the group alone): job ID, name and parent, group name, and
/// the job's and group's meta. Anything else is left as written.
struct SubmitEnv {
    vars: BTreeMap<String, String>,
}

impl SubmitEnv {
    fn new(job: &Job, g: &TaskGroup) -> SubmitEnv {
        let mut vars = BTreeMap::new();
        for (k, v) in [
            ("NOMAD_JOB_ID", &job.id),
            ("NOMAD_JOB_NAME", &job.name),
            ("NOMAD_JOB_PARENT_ID", &job.parent_id),
            ("NOMAD_GROUP_NAME", &g.name),
        ] {
            if !v.is_empty() {
                vars.insert(k.to_string(), v.clone());
            }
        }
        for (k, v) in job.meta.iter().chain(g.meta.iter()) {
            vars.insert(format!("NOMAD_META_{}", k.to_uppercase()), v.clone());
            vars.insert(format!("NOMAD_META_{k}"), v.clone());
        }
        SubmitEnv { vars }
    }

    /// Nomad's `ReplaceEnv`: each `${name}` with a known name is replaced.
    fn interpolate(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) if end > 0 => {
                    match self.vars.get(&after[..end]) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&rest[start..start + 2 + end + 1]),
                    }
                    rest = &after[end + 1..];
                }
                _ => {
                    out.push_str(&rest[start..start + 2]);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

impl Job {
    /// Nomad's Connect and expose-check mutators (`jobConnectHook.Mutate`,
    /// `jobExposeCheckHook.Mutate`) on a canonicalized job; the tasks it adds or changes are
    /// canonicalized as the rest are. Idempotent.
    pub fn mutate_connect(&mut self) -> Result<(), ConnectError> {
        for i in 0..self.task_groups.len() {
            // Groups without a network are left to validation, which says what is missing.
            if self.task_groups[i].networks.is_empty() {
                continue;
            }
            let env = SubmitEnv::new(self, &self.task_groups[i]);
            connect_group(&mut self.task_groups[i], &env)?;
        }
        for g in &mut self.task_groups {
            expose_checks(g)?;
        }
        // Injected and merged tasks get the group's restart policy and the other defaults.
        self.canonicalize();
        Ok(())
    }

    /// Nomad's Connect and expose-check validators (`jobConnectHook.Validate`,
    /// `jobExposeCheckHook.Validate`): the first problem, in Nomad's words.
    pub fn validate_connect(&self) -> Result<(), ConnectError> {
        for g in &self.task_groups {
            validate_group(g)?;
        }
        for g in &self.task_groups {
            validate_expose_bridge(g)?;
            validate_expose_use(g)?;
        }
        Ok(())
    }
}

/// `groupConnectHook` for one group with a network.
fn connect_group(g: &mut TaskGroup, env: &SubmitEnv) -> Result<(), ConnectError> {
    let TaskGroup { name: group, services, tasks, networks, .. } = g;
    let mode = networks[0].mode.clone();
    for s in services.iter_mut() {
        let Some(c) = s.connect.as_mut() else { continue };
        if let Some(sidecar) = &c.sidecar_service {
            s.name = env.interpolate(&s.name);
            let kind = task_kind(task_kind::CONNECT_PROXY, &s.name);
            let at = match tasks.iter().position(|t| t.kind == kind) {
                Some(at) => at,
                None => {
                    let mut t = sidecar_task(&s.name, guess_sidecar_driver(tasks));
                    if tasks.iter().any(|o| o.name == t.name) {
                        t.name = unique_task_name(&t.name, group, tasks);
                    }
                    tasks.push(t);
                    tasks.len() - 1
                }
            };
            if let Some(over) = &c.sidecar_task {
                merge_sidecar_task(over, &mut tasks[at]);
            }
            let label = if sidecar.port.is_empty() { port_label(task_kind::CONNECT_PROXY, &s.name, "") } else { sidecar.port.clone() };
            inject_port(&mut networks[0], &label);
        } else if c.native {
            let at = native_task(group, &s.name, &s.task_name, tasks)?;
            tasks[at].kind = task_kind(task_kind::CONNECT_NATIVE, &s.name);
            s.task_name = tasks[at].name.clone();
        } else if let Some(gw) = c.gateway.as_mut() {
            s.name = env.interpolate(&s.name);
            let ingress = match &gw.ingress {
                Some(v) => Some(IngressConfigEntry::from_value(v).map_err(|e| {
                    ConnectError(format!("Consul Connect ingress gateway of service {:?} in group {:?}: {e}", s.name, group))
                })?),
                None => None,
            };
            let proxy = gateway_proxy(gw, ingress.as_ref(), &mode)
                .map_err(|e| ConnectError(format!("Consul Connect gateway proxy of service {:?} in group {:?}: {e}", s.name, group)))?;
            gw.proxy = Some(proxy.to_value());
            if gw.terminating.is_some() && s.port_label.is_empty() {
                let label = port_label(task_kind::CONNECT_TERMINATING, &s.name, "");
                inject_port(&mut networks[0], &label);
                s.port_label = label;
            }
            if gw.mesh.is_some() {
                // The service port is the WAN address; the LAN one is injected.
                if s.port_label.is_empty() {
                    return err("service.port must be set for mesh gateway service".into());
                }
                inject_port(&mut networks[0], &port_label(task_kind::CONNECT_MESH, &s.name, "lan"));
            }
            let has_task = [task_kind::CONNECT_INGRESS, task_kind::CONNECT_TERMINATING, task_kind::CONNECT_MESH]
                .iter()
                .any(|p| tasks.iter().any(|t| t.kind == task_kind(p, &s.name)));
            if !has_task {
                let customized_tls = ingress.as_ref().is_some_and(IngressConfigEntry::customized_tls);
                let mut t = gateway_task(gateway_prefix(gw), &s.name, mode == "host", customized_tls);
                if let Some(over) = &c.sidecar_task {
                    merge_sidecar_task(over, &mut t);
                }
                tasks.push(t);
            }
        }
    }
    Ok(())
}

/// `ConsulGateway.Prefix`: mesh, then ingress, else terminating.
fn gateway_prefix(gw: &ConsulGateway) -> &'static str {
    if gw.mesh.is_some() {
        task_kind::CONNECT_MESH
    } else if gw.ingress.is_some() {
        task_kind::CONNECT_INGRESS
    } else {
        task_kind::CONNECT_TERMINATING
    }
}

/// Nomad's `gatewayProxy`: a proxy with bind settings of the operator's own is kept; otherwise
/// one is built for the network mode (in bridge mode the listeners bind 0.0.0.0 inside the
/// namespace, their ports filled in by the client).
fn gateway_proxy(gw: &ConsulGateway, ingress: Option<&IngressConfigEntry>, mode: &str) -> Result<GatewayProxy, String> {
    let given = match &gw.proxy {
        Some(v) if !v.is_null() => Some(GatewayProxy::from_value(v)?),
        _ => None,
    };
    if let Some(p) = &given
        && !p.is_default()
    {
        let mut p = p.clone();
        p.connect_timeout.get_or_insert(DEFAULT_GATEWAY_CONNECT_TIMEOUT_NS);
        return Ok(p);
    }
    let mut proxy = GatewayProxy::default();
    if let Some(p) = given {
        proxy.connect_timeout = p.connect_timeout;
        proxy.envoy_dns_discovery_type = p.envoy_dns_discovery_type;
        proxy.config = p.config;
    }
    proxy.connect_timeout.get_or_insert(DEFAULT_GATEWAY_CONNECT_TIMEOUT_NS);
    if mode == "bridge" {
        let any = |port| GatewayBindAddress { address: "0.0.0.0".into(), port };
        let binds: BTreeMap<String, GatewayBindAddress> = if let Some(ingress) = ingress {
            ingress.listeners.iter().flat_map(|l| l.services.iter().map(move |s| (s.name.clone(), any(l.port)))).collect()
        } else if gw.terminating.is_some() {
            BTreeMap::from([("default".to_string(), any(-1))])
        } else if gw.mesh.is_some() {
            BTreeMap::from([("wan".to_string(), any(-1)), ("lan".to_string(), any(-1))])
        } else {
            return Ok(proxy);
        };
        proxy.envoy_gateway_no_default_bind = true;
        proxy.envoy_gateway_bind_tagged_addresses = false;
        proxy.envoy_gateway_bind_addresses = binds;
    }
    Ok(proxy)
}

/// `injectPort`: a dynamic port mapped to the same port inside the namespace (`to = -1`),
/// unless the first network has a dynamic port of that label.
fn inject_port(n: &mut NetworkResource, label: &str) {
    if n.dynamic_ports.iter().any(|p| p.label == label) {
        return;
    }
    n.dynamic_ports.push(Port { label: label.to_string(), to: -1, ..Port::default() });
}

/// `groupConnectGuessTaskDriver`: podman when the group has podman tasks and no docker ones.
fn guess_sidecar_driver(tasks: &[Task]) -> &'static str {
    let has = |d: &str| tasks.iter().any(|t| t.driver == d);
    if has("podman") && !has("docker") { "podman" } else { "docker" }
}

/// The sidecar's name when a task already has it: a 6-character suffix, as Nomad's (which takes
/// it from a random UUID; this one is a hash, so plan and register name the task alike).
fn unique_task_name(name: &str, group: &str, tasks: &[Task]) -> String {
    use sha1::{Digest, Sha1};
    (0u32..)
        .map(|attempt| {
            let digest =
                Sha1::new().chain_update(group).chain_update([0]).chain_update(name).chain_update(attempt.to_be_bytes()).finalize();
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            format!("{name}-{}", &hex[..6])
        })
        .find(|candidate| !tasks.iter().any(|t| &t.name == candidate))
        .unwrap_or_else(|| name.to_string())
}

/// The Envoy arguments of every injected task.
fn envoy_args() -> Value {
    json!([
        "-c",
        ENVOY_BOOTSTRAP_PATH,
        "-l",
        "${meta.connect.log_level}",
        "--concurrency",
        "${meta.connect.proxy_concurrency}",
        "--disable-hot-restart"
    ])
}

fn consul_version_constraint(min: &str) -> Constraint {
    Constraint { l_target: crate::admission::CONSUL_VERSION_ATTRIBUTE.into(), r_target: min.into(), operand: "semver".into() }
}

fn consul_grpc_constraint() -> Constraint {
    Constraint { l_target: CONSUL_GRPC_ATTRIBUTE.into(), r_target: "0".into(), operand: ">".into() }
}

/// The fields every injected Envoy task shares.
fn envoy_task(prefix: &str, service: &str, driver: &str, config: BTreeMap<String, Value>, constraints: Vec<Constraint>) -> Task {
    Task {
        name: port_label(prefix, service, ""),
        kind: task_kind(prefix, service),
        driver: driver.into(),
        config,
        shutdown_delay: PROXY_SHUTDOWN_DELAY_NS,
        log_config: LogConfig { max_files: 2, max_file_size_mb: 2, disabled: false },
        resources: Resources { cpu: PROXY_CPU, memory_mb: PROXY_MEMORY_MB, ..Resources::default() },
        constraints,
        ..Task::default()
    }
}

/// `newConnectSidecarTask`: the Envoy sidecar, a prestart sidecar task.
fn sidecar_task(service: &str, driver: &str) -> Task {
    let config = BTreeMap::from([("image".to_string(), json!(SIDECAR_IMAGE)), ("args".to_string(), envoy_args())]);
    let constraints = vec![consul_version_constraint(CONSUL_CONNECT_MIN_VERSION), consul_grpc_constraint()];
    let mut t = envoy_task(task_kind::CONNECT_PROXY, service, driver, config, constraints);
    t.lifecycle = Some(TaskLifecycle { hook: lifecycle_hook::PRESTART.into(), sidecar: true });
    t
}

/// `newConnectGatewayTask`: the gateway's Envoy, a main task; with host networking the container
/// shares the host's network.
fn gateway_task(prefix: &str, service: &str, host_network: bool, customized_tls: bool) -> Task {
    let mut config = BTreeMap::from([("image".to_string(), json!(GATEWAY_IMAGE)), ("args".to_string(), envoy_args())]);
    if host_network {
        config.insert("network_mode".into(), json!("host"));
    }
    let mut constraints = vec![consul_version_constraint(CONSUL_CONNECT_MIN_VERSION), consul_grpc_constraint()];
    if customized_tls {
        constraints.push(consul_version_constraint(CONSUL_GATEWAY_TLS_MIN_VERSION));
    }
    envoy_task(prefix, service, "docker", config, constraints)
}

/// `getNamedTaskForNativeService`: `service.task`, or the group's only task.
fn native_task(group: &str, service: &str, task_name: &str, tasks: &[Task]) -> Result<usize, ConnectError> {
    if task_name.is_empty() {
        if tasks.len() == 1 {
            return Ok(0);
        }
        return err(format!("task for Consul Connect Native service {group}->{service} is ambiguous and must be set"));
    }
    match tasks.iter().position(|t| t.name == task_name) {
        Some(at) => Ok(at),
        None => err(format!("task {task_name} named by Consul Connect Native service {group}->{service} does not exist")),
    }
}

/// `jobExposeCheckHook.Mutate` for one group.
fn expose_checks(g: &mut TaskGroup) -> Result<(), ConnectError> {
    for si in 0..g.services.len() {
        for ci in 0..g.services[si].checks.len() {
            let s = &g.services[si];
            let check = &s.checks[ci];
            if !check.expose || !has_sidecar(s) || !exposable(check) {
                continue;
            }
            validate_expose_bridge(g)?;
            if check.port_label.is_empty() {
                // The check's index makes checks that are otherwise alike hash apart.
                let hash = check.hash(&format!("{}_{ci}", s.name));
                let label = format!("svc_{}_ck_{}", s.name, &hash[..6]);
                // Nomad's port says `HostNetwork: "default"`; here an empty host network is the default.
                g.networks[0].dynamic_ports.push(Port { label: label.clone(), to: -1, ..Port::default() });
                g.services[si].checks[ci].port_label = label;
            }
            let s = &g.services[si];
            let check = &s.checks[ci];
            let local_port = group_port_value(&g.networks, &s.port_label)
                .filter(|v| *v > 0)
                .or_else(|| s.port_label.parse::<i64>().ok().filter(|v| *v > 0))
                .ok_or_else(|| {
                    ConnectError(format!("unable to determine local service port for service check {}->{}->{}", g.name, s.name, check.name))
                })?;
            let path = ExposePath {
                path: check.path.clone(),
                protocol: check.protocol.clone(),
                local_path_port: local_port,
                listener_port: check.port_label.clone(),
            };
            let (service_name, group_name) = (s.name.clone(), g.name.clone());
            let Some(sidecar) = g.services[si].connect.as_mut().and_then(|c| c.sidecar_service.as_mut()) else { continue };
            let proxy = sidecar.proxy.get_or_insert_with(Default::default);
            let mut expose = match &proxy.expose {
                Some(v) if !v.is_null() => ExposeConfig::from_value(v).map_err(|e| {
                    ConnectError(format!("Consul Connect expose block of service {service_name:?} in group {group_name:?}: {e}"))
                })?,
                _ => ExposeConfig::default(),
            };
            if !expose.paths.contains(&path) {
                expose.paths.push(path);
                proxy.expose = Some(serde_json::to_value(&expose).unwrap_or(Value::Null));
            }
        }
    }
    Ok(())
}

/// `checkIsExposable`: an http or grpc check with an absolute path.
fn exposable(c: &ServiceCheck) -> bool {
    matches!(c.check_type.to_lowercase().as_str(), "http" | "grpc") && c.path.starts_with('/')
}

/// `Networks.Port(label).Value`: the value of the first port with that label.
fn group_port_value(networks: &[NetworkResource], label: &str) -> Option<i64> {
    networks.iter().find_map(|n| n.reserved_ports.iter().chain(n.dynamic_ports.iter()).find(|p| p.label == label).map(|p| p.value))
}

fn has_sidecar(s: &Service) -> bool {
    s.connect.as_ref().is_some_and(|c| c.sidecar_service.is_some())
}

/// `groupConnectValidate`.
fn validate_group(g: &TaskGroup) -> Result<(), ConnectError> {
    for s in &g.services {
        let Some(c) = &s.connect else { continue };
        if c.sidecar_service.is_some() {
            if g.networks.len() != 1 {
                return err(format!("Consul Connect sidecars require exactly 1 network, found {} in group {:?}", g.networks.len(), g.name));
            }
            if g.networks[0].mode != "bridge" {
                return err(format!(
                    "Consul Connect sidecar requires bridge network, found {:?} in group {:?}",
                    g.networks[0].mode, g.name
                ));
            }
            // Consul assumes lower-case names without checking them.
            if s.name != s.name.to_lowercase() {
                return err(format!(
                    "Consul Connect service name {:?} in group {:?} must not contain uppercase characters",
                    s.name, g.name
                ));
            }
            if g.name != g.name.to_lowercase() {
                return err(format!("Consul Connect group {:?} with service {:?} must not contain uppercase characters", g.name, s.name));
            }
        } else if c.native {
            native_task(&g.name, &s.name, &s.task_name, &g.tasks)?;
        } else if c.gateway.is_some() {
            if g.networks.len() != 1 {
                return err(format!("Consul Connect gateways require exactly 1 network, found {} in group {:?}", g.networks.len(), g.name));
            }
            if !matches!(g.networks[0].mode.as_str(), "bridge" | "host") {
                return err(r#"Consul Connect Gateway service requires Task Group with network mode of type "bridge" or "host""#.into());
            }
        }
    }
    validate_upstreams(g)
}

/// `groupConnectUpstreamsValidate`: two upstreams of a group cannot listen on one address.
fn validate_upstreams(g: &TaskGroup) -> Result<(), ConnectError> {
    let mut listeners: BTreeMap<String, &str> = BTreeMap::new();
    for s in &g.services {
        let Some(proxy) = s.connect.as_ref().and_then(|c| c.sidecar_service.as_ref()).and_then(|s| s.proxy.as_ref()) else { continue };
        for up in &proxy.upstreams {
            let listener = join_host_port(&up.local_bind_address, up.local_bind_port);
            if let Some(other) = listeners.get(&listener) {
                return err(format!(
                    "Consul Connect services {:?} and {:?} in group {:?} using same address for upstreams ({listener})",
                    s.name, other, g.name
                ));
            }
            listeners.insert(listener, &s.name);
        }
    }
    Ok(())
}

/// Go's `net.JoinHostPort`.
fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// `tgValidateUseOfBridgeMode`: exposed checks need the group's one network in bridge mode.
fn validate_expose_bridge(g: &TaskGroup) -> Result<(), ConnectError> {
    if !g.services.iter().any(|s| s.checks.iter().any(|c| c.expose)) {
        return Ok(());
    }
    if g.networks.len() != 1 {
        return err(format!("group {:?} must specify one bridge network for exposing service check(s)", g.name));
    }
    if g.networks[0].mode != "bridge" {
        return err(format!("group {:?} must use bridge network for exposing service check(s)", g.name));
    }
    Ok(())
}

/// `tgValidateUseOfCheckExpose`: only group services with a sidecar expose checks.
fn validate_expose_use(g: &TaskGroup) -> Result<(), ConnectError> {
    for s in &g.services {
        if let Some(c) = s.checks.iter().find(|c| c.expose && !has_sidecar(s)) {
            return err(format!("exposed service check {}->{}->{} requires use of sidecar_proxy", g.name, s.name, c.name));
        }
    }
    for t in &g.tasks {
        for s in &t.services {
            if let Some(c) = s.checks.iter().find(|c| c.expose) {
                return err(format!("exposed service check {}[{}]->{}->{} is not a task-group service", g.name, t.name, s.name, c.name));
            }
        }
    }
    Ok(())
}

/// Nomad's `ConsulConnect.Validate` and the Connect part of `Service.Validate` for a Consul
/// service, for `validate.rs`: every problem, in Nomad's words.
pub(crate) fn validate_service_connect(s: &Service) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(c) = &s.connect else { return errs };
    if c.sidecar_service.is_some() {
        for check in s.checks.iter().filter(|c| c.check_type == "tcp") {
            errs.push(format!("Check {} invalid: tcp checks are not valid for Connect enabled services", check.name));
        }
    }
    let kinds = usize::from(c.sidecar_service.is_some()) + usize::from(c.native) + usize::from(c.gateway.is_some());
    if kinds != 1 {
        errs.push("Consul Connect must be exclusively native, make use of a sidecar, or represent a Gateway".into());
    } else if let Some(gw) = &c.gateway
        && let Err(e) = validate_gateway(gw)
    {
        errs.push(e);
    }
    if c.native && s.task_name.is_empty() {
        errs.push(format!("Service {} is Connect Native and requires setting the task", s.name));
    }
    errs
}

/// `ConsulGateway.Validate`.
fn validate_gateway(gw: &ConsulGateway) -> Result<(), String> {
    if let Some(v) = gw.proxy.as_ref().filter(|v| !v.is_null()) {
        let p = GatewayProxy::from_value(v).map_err(|e| format!("Consul Gateway Proxy: {e}"))?;
        if p.connect_timeout.is_none() {
            return Err("Consul Gateway Proxy connection_timeout must be set".into());
        }
        if !matches!(p.envoy_dns_discovery_type.as_str(), "" | "STRICT_DNS" | "LOGICAL_DNS") {
            return Err("Consul Gateway Proxy Envoy DNS Discovery type must be STRICT_DNS or LOGICAL_DNS".into());
        }
        for a in p.envoy_gateway_bind_addresses.values() {
            if a.address.is_empty() {
                return Err("Consul Gateway Bind Address must be set".into());
            }
            if a.port <= 0 && a.port != -1 {
                return Err("Consul Gateway Bind Address must set valid Port".into());
            }
        }
    }
    if let Some(v) = gw.ingress.as_ref().filter(|v| !v.is_null()) {
        let e = IngressConfigEntry::from_value(v).map_err(|e| format!("Consul Ingress Gateway: {e}"))?;
        if e.listeners.is_empty() {
            return Err("Consul Ingress Gateway requires at least one listener".into());
        }
        for l in &e.listeners {
            validate_ingress_listener(l)?;
        }
    }
    if let Some(t) = &gw.terminating {
        if t.services.is_empty() {
            return Err("Consul Terminating Gateway requires at least one service".into());
        }
        for s in &t.services {
            if s.name.is_empty() {
                return Err("Consul Linked Service requires Name".into());
            }
            let (ca, cert, key, sni) = (!s.ca_file.is_empty(), !s.cert_file.is_empty(), !s.key_file.is_empty(), !s.sni.is_empty());
            if (cert || key) && !ca {
                return Err("Consul Linked Service TLS requires CAFile".into());
            }
            if cert != key {
                return Err("Consul Linked Service TLS Cert and Key must both be set".into());
            }
            if sni && !ca {
                return Err("Consul Linked Service TLS SNI requires CAFile".into());
            }
        }
    }
    let configured = usize::from(gw.ingress.is_some()) + usize::from(gw.terminating.is_some()) + usize::from(gw.mesh.is_some());
    if configured != 1 {
        return Err("One Consul Gateway Configuration must be set".into());
    }
    Ok(())
}

/// `ConsulIngressListener.Validate` and `ConsulIngressService.Validate`.
fn validate_ingress_listener(l: &IngressListener) -> Result<(), String> {
    if l.port <= 0 {
        return Err("Consul Ingress Listener requires valid Port".into());
    }
    let protocol = l.protocol();
    if !matches!(protocol, "tcp" | "http" | "http2" | "grpc") {
        return Err(format!("Consul Ingress Listener requires protocol of tcp, http, http2, grpc, got {protocol:?}"));
    }
    if l.services.is_empty() {
        return Err("Consul Ingress Listener requires one or more services".into());
    }
    for s in &l.services {
        if s.name.is_empty() {
            return Err("Consul Ingress Service requires a name".into());
        }
        if protocol == "tcp" {
            if s.name == "*" {
                return Err(r#"Consul Ingress Service doesn't support wildcard name for "tcp" protocol"#.into());
            }
            if !s.hosts.is_empty() {
                return Err(r#"Consul Ingress Service doesn't support associating hosts to a service for the "tcp" protocol"#.into());
            }
        } else if s.name == "*" && !s.hosts.is_empty() {
            return Err(r#"Consul Ingress Service with a wildcard "*" service name can not also specify hosts"#.into());
        }
    }
    Ok(())
}

/// Nomad's `Task.Validate` for a task of kind `connect-proxy:<service>`, for `validate.rs`.
pub(crate) fn validate_proxy_task(t: &Task, g: &TaskGroup) -> Vec<String> {
    let mut errs = Vec::new();
    // `TaskKind.IsConnectProxy`: the prefix and a service.
    if t.kind_name() != task_kind::CONNECT_PROXY || t.kind_value().is_empty() {
        return errs;
    }
    if !t.services.is_empty() {
        errs.push("Connect proxy task must not have a service block".into());
    }
    if t.leader {
        errs.push("Connect proxy task must not have leader set".into());
    }
    // `ValidateConnectProxyService`.
    let service = t.kind_value();
    let connect: Vec<&str> = g.services.iter().filter(|s| has_sidecar(s)).map(|s| s.name.as_str()).collect();
    if !connect.contains(&service) {
        if connect.is_empty() {
            errs.push(format!("No Connect services in task group with Connect proxy ({service:?})"));
        } else {
            errs.push(format!(
                "Connect proxy service name ({service:?}) not found in Connect services from task group: [{}]",
                connect.join(" ")
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests;
