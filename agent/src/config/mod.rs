//! The agent's configuration: files, then command-line flags, then defaults.

pub mod acl;
pub mod consul;
pub mod file;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use file::FileConfig;
use nomad_server::heartbeat::HeartbeatConfig;
use serde_json::Value;

use crate::client::driver::capabilities::{self, CapSet};
use crate::client::driver::exec::DEFAULT_USER_DENYLIST;

pub use file::ConfigError;

/// Flags of `nomad-rs agent` that override files.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentFlags {
    /// `-config` (repeatable): files or directories.
    pub config: Vec<PathBuf>,
    /// `-dev` (also set by `-dev-connect`).
    pub dev: bool,
    /// `-dev-connect`: dev mode listening on every address, the node on the default route's
    /// interface (Nomad's `devModeConfig.connectMode`).
    pub dev_connect: bool,
    /// `-acl-enabled`.
    pub acl_enabled: bool,
    /// `-server`.
    pub server: bool,
    /// `-client`.
    pub client: bool,
    /// `-data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `-bind`.
    pub bind: Option<String>,
    /// `-servers` (comma-separated).
    pub servers: Vec<String>,
    /// `-dc`.
    pub dc: Option<String>,
    /// `-region`.
    pub region: Option<String>,
    /// `-node`.
    pub node: Option<String>,
    /// `-bootstrap-expect`.
    pub bootstrap_expect: Option<usize>,
    /// `-retry-join` / `-join` (repeatable).
    pub join: Vec<String>,
    /// `-log-level`.
    pub log_level: Option<String>,
    /// `-http-port` (nomad-rs extra, for tests and side-by-side agents).
    pub http_port: Option<u16>,
    /// `-rpc-port` (nomad-rs extra).
    pub rpc_port: Option<u16>,
    /// `-encrypt`: the servers' cluster key (`server { encrypt }`).
    pub encrypt: Option<String>,
    /// `-state-dir` (`client { state_dir }`).
    pub state_dir: Option<PathBuf>,
    /// `-alloc-dir` (`client { alloc_dir }`).
    pub alloc_dir: Option<PathBuf>,
    /// `-node-class` (`client { node_class }`).
    pub node_class: Option<String>,
    /// `-node-pool` (`client { node_pool }`).
    pub node_pool: Option<String>,
    /// `-meta key=value` (repeatable), added to `client { meta }`.
    pub meta: Vec<String>,
}

/// Server role settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// Raft data dir.
    pub data_dir: PathBuf,
    /// Servers expected before bootstrapping.
    pub bootstrap_expect: usize,
    /// Servers to join.
    pub join: Vec<String>,
    /// Heartbeat settings.
    pub heartbeat: HeartbeatConfig,
    /// Scheduler workers (0: one per core).
    pub num_schedulers: usize,
    /// Event stream buffer.
    pub event_buffer_size: usize,
    /// The cluster key servers prove themselves to each other with (`encrypt`, base64).
    pub encrypt: Option<String>,
    /// Most allocs one job may ask for (`job_max_count`).
    pub job_max_count: i64,
    /// The CSI volume claim GC (`csi_volume_claim_gc_interval`, `csi_volume_claim_gc_threshold`).
    pub csi_claim_gc: nomad_server::leader::ClaimGcConfig,
    /// The expired ACL token GC (`acl_token_gc_threshold`).
    pub acl_token_gc: nomad_server::leader::TokenGcConfig,
    /// The periodic GC (`job_gc_interval`, `job_gc_threshold`, `eval_gc_threshold`,
    /// `batch_eval_gc_threshold`, `deployment_gc_threshold`, `node_gc_threshold`).
    pub core_gc: nomad_server::endpoints::GcConfig,
    /// Root key rotation and GC (`root_key_rotation_threshold`, `root_key_gc_interval`,
    /// `root_key_gc_threshold`).
    pub keyring: nomad_server::leader::KeyringConfig,
}

/// Client role settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSettings {
    /// Servers' RPC addresses.
    pub servers: Vec<String>,
    /// Client state dir.
    pub state_dir: PathBuf,
    /// Alloc dir.
    pub alloc_dir: PathBuf,
    /// Node class.
    pub node_class: String,
    /// Node pool.
    pub node_pool: String,
    /// Node metadata.
    pub meta: BTreeMap<String, String>,
    /// Client options.
    pub options: BTreeMap<String, String>,
    /// Reserved resources.
    pub reserved: file::Reserved,
    /// Host volumes.
    pub host_volumes: BTreeMap<String, file::HostVolumeBlock>,
    /// Dynamic port range.
    pub dynamic_ports: (i64, i64),
    /// CPU override, MHz.
    pub cpu_total_compute: Option<i64>,
    /// Memory override, MiB.
    pub memory_total_mb: Option<i64>,
    /// The host interface whose address allocs get (`network_interface`; the default route's
    /// when unset).
    pub network_interface: Option<String>,
    /// Bridge and CNI networking.
    pub cni: CniSettings,
    /// `chroot_env`: the exec driver's chroot (host path to path in the chroot); `None`: its
    /// defaults.
    pub chroot_env: Option<BTreeMap<PathBuf, PathBuf>>,
    /// `artifact {}`: the limits of artifact downloads.
    pub artifact: crate::client::artifact::ArtifactConfig,
    /// `template {}`: how templates are rendered.
    pub template: crate::client::template::TemplateConfig,
    /// `gc_*`: when terminal allocs are destroyed.
    pub gc: crate::client::gc::GcConfig,
}

/// `cni_path`, `cni_config_dir` and the `bridge_network_*` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct CniSettings {
    /// Directories searched for plugin binaries, in order.
    pub path: Vec<PathBuf>,
    /// Where `cni/<name>` configs are read from.
    pub config_dir: PathBuf,
    /// The bridge's name.
    pub bridge_name: String,
    /// The bridge's subnet, CIDR.
    pub bridge_subnet: String,
    /// Hairpin mode on the bridge's ports.
    pub hairpin_mode: bool,
}

/// Nomad's `cni_path`, then Debian's `containernetworking-plugins` directory: a plugin Nomad's
/// default finds is found first, and a Debian host works without configuration.
pub const DEFAULT_CNI_PATH: &str = "/opt/cni/bin:/usr/lib/cni";

impl Default for CniSettings {
    fn default() -> CniSettings {
        CniSettings {
            path: std::env::split_paths(DEFAULT_CNI_PATH).collect(),
            config_dir: PathBuf::from("/opt/cni/config"),
            bridge_name: "nomad".into(),
            bridge_subnet: "172.26.64.0/20".into(),
            hairpin_mode: false,
        }
    }
}

impl CniSettings {
    /// From the client block: unset or empty keys take Nomad's defaults (`cni_path` falls back
    /// to `$CNI_PATH`, as Nomad's does); a bridge name that cannot be an interface name or a
    /// subnet that is not an IPv4 CIDR is an error.
    fn resolve(cb: &file::ClientBlock, env_cni_path: Option<String>) -> Result<CniSettings, ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid { path: "agent configuration".into(), key: key.into(), message };
        let d = CniSettings::default();
        let path = match cb.cni_path.clone().filter(|p| !p.is_empty()).or(env_cni_path.filter(|p| !p.is_empty())) {
            Some(p) => std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()).collect(),
            None => d.path,
        };
        let bridge_name = cb.bridge_network_name.clone().filter(|n| !n.is_empty()).unwrap_or(d.bridge_name);
        if bridge_name.len() > 15 || !bridge_name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
            return Err(invalid(
                "client.bridge_network_name",
                format!("{bridge_name:?} is not a valid interface name (at most 15 letters, digits, '-', '_' or '.')"),
            ));
        }
        let bridge_subnet = cb.bridge_network_subnet.clone().filter(|s| !s.is_empty()).unwrap_or(d.bridge_subnet);
        if crate::client::network::parse_cidr(&bridge_subnet).is_none() {
            return Err(invalid("client.bridge_network_subnet", format!("{bridge_subnet:?} is not an IPv4 CIDR such as 172.26.64.0/20")));
        }
        Ok(CniSettings {
            path,
            config_dir: cb.cni_config_dir.clone().filter(|d| !d.is_empty()).map(PathBuf::from).unwrap_or(d.config_dir),
            bridge_name,
            bridge_subnet,
            hairpin_mode: cb.bridge_network_hairpin_mode.unwrap_or(false),
        })
    }
}

/// `client { gc_* }` over Nomad's defaults (a dev agent's when `dev`); a zero keeps the
/// default, as Nomad's config merge does.
fn gc_config(b: &file::ClientBlock, dev: bool) -> Result<crate::client::gc::GcConfig, ConfigError> {
    let invalid =
        |key: &str, message: String| ConfigError::Invalid { path: "agent configuration".into(), key: format!("client.{key}"), message };
    let mut gc = if dev { crate::client::gc::GcConfig::dev() } else { crate::client::gc::GcConfig::default() };
    if let Some(d) = &b.gc_interval {
        match d.0 {
            d if d.is_zero() => return Err(invalid("gc_interval", "gc_interval should be greater than 0s".into())),
            d => gc.interval = d,
        }
    }
    for (key, value, into) in [
        ("gc_disk_usage_threshold", b.gc_disk_usage_threshold, &mut gc.disk_usage_threshold),
        ("gc_inode_usage_threshold", b.gc_inode_usage_threshold, &mut gc.inode_usage_threshold),
    ] {
        match value {
            Some(v) if !(0.0..=100.0).contains(&v) => return Err(invalid(key, format!("{v} is not a percentage between 0 and 100"))),
            Some(v) if v > 0.0 => *into = v,
            _ => {}
        }
    }
    for (key, value, into) in [
        ("gc_max_allocs", b.gc_max_allocs, &mut gc.max_allocs),
        ("gc_parallel_destroys", b.gc_parallel_destroys, &mut gc.parallel_destroys),
    ] {
        match value {
            Some(v) if v < 0 => return Err(invalid(key, format!("{v} is negative"))),
            Some(v) if v > 0 => *into = usize::try_from(v).unwrap_or(usize::MAX),
            _ => {}
        }
    }
    Ok(gc)
}

/// `client { artifact {} }` with Nomad's defaults and checks (`ArtifactConfig.Validate`).
fn artifact_config(b: Option<&file::ArtifactBlock>) -> Result<crate::client::artifact::ArtifactConfig, ConfigError> {
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        path: "agent configuration".into(),
        key: format!("client.artifact.{key}"),
        message,
    };
    let mut c = crate::client::artifact::ArtifactConfig::default();
    let Some(b) = b else { return Ok(c) };
    if let Some(t) = &b.http_read_timeout {
        c.http_read_timeout = nomad_proto::time::parse_go_duration(t)
            .map_err(|e| invalid("http_read_timeout", format!("http_read_timeout not a valid duration: {e}")))
            .and_then(|ns| u64::try_from(ns).map_err(|_| invalid("http_read_timeout", "http_read_timeout must be > 0".into())))
            .map(Duration::from_nanos)?;
    }
    let size = |key: &str, v: &Option<String>, default: u64| -> Result<u64, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) => nomad_proto::jobspec::volume::parse_bytes(s)
                .map(|n| n.max(0) as u64)
                .map_err(|e| invalid(key, format!("{key} not a valid size: {e}"))),
        }
    };
    c.http_max_size = size("http_max_size", &b.http_max_size, c.http_max_size)?;
    c.decompression_size_limit = size("decompression_size_limit", &b.decompression_size_limit, c.decompression_size_limit)?;
    if let Some(n) = b.decompression_file_count_limit {
        c.decompression_file_count_limit = u64::try_from(n)
            .map_err(|_| invalid("decompression_file_count_limit", format!("decompression_file_count_limit must be >= 0 but found {n}")))?;
    }
    Ok(c)
}

/// `client { template {} }` with Nomad's defaults (`DefaultTemplateConfig`) and checks.
fn template_config(b: Option<&file::TemplateBlock>) -> Result<crate::client::template::TemplateConfig, ConfigError> {
    use crate::client::template::Wait;
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        path: "agent configuration".into(),
        key: format!("client.template.{key}"),
        message,
    };
    let mut c = crate::client::template::TemplateConfig::default();
    let Some(b) = b else { return Ok(c) };
    let duration = |key: &str, v: &str| -> Result<Duration, ConfigError> {
        nomad_proto::time::parse_go_duration(v)
            .ok()
            .and_then(|ns| u64::try_from(ns).ok())
            .map(Duration::from_nanos)
            .ok_or_else(|| invalid(key, format!("{key}: {v:?} is not a valid positive duration")))
    };
    let wait = |key: &str, w: &file::TemplateWaitBlock, default: Wait| -> Result<Wait, ConfigError> {
        let min = w.min.as_deref().map(|v| duration(&format!("{key}.min"), v)).transpose()?.unwrap_or(default.min);
        let max = w.max.as_deref().map(|v| duration(&format!("{key}.max"), v)).transpose()?.unwrap_or(default.max);
        if min > max {
            return Err(invalid(key, format!("{key}: min ({min:?}) is greater than max ({max:?})")));
        }
        Ok(Wait { min, max })
    };
    if let Some(list) = b.function_denylist.clone().or_else(|| b.function_blacklist.clone()) {
        c.function_denylist = list;
    }
    c.disable_file_sandbox = b.disable_file_sandbox.unwrap_or(false);
    if let Some(v) = &b.block_query_wait {
        c.block_query_wait = duration("block_query_wait", v)?;
    }
    if let Some(w) = &b.wait {
        c.wait = wait("wait", w, c.wait)?;
    }
    if let Some(w) = &b.wait_bounds {
        c.wait_bounds = Some(wait("wait_bounds", w, Wait { min: Duration::ZERO, max: Duration::MAX })?);
    }
    if let Some(r) = &b.nomad_retry {
        if let Some(v) = &r.backoff {
            c.nomad_retry.0 = duration("nomad_retry.backoff", v)?;
        }
        if let Some(v) = &r.max_backoff {
            c.nomad_retry.1 = duration("nomad_retry.max_backoff", v)?;
        }
    }
    Ok(c)
}

/// The keys of the `telemetry {}` blocks (one block is an object, several an array of them).
fn telemetry_keys(telemetry: Option<&Value>) -> Vec<String> {
    let blocks: Vec<&Value> = match telemetry {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(v) => vec![v],
        None => Vec::new(),
    };
    blocks.iter().filter_map(|b| b.as_object()).flat_map(|o| o.keys().cloned()).collect()
}

/// `telemetry { prometheus_metrics = true }`: the last block that sets it wins.
fn telemetry_prometheus(telemetry: Option<&Value>) -> Result<Option<bool>, String> {
    let blocks: Vec<&Value> = match telemetry {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(v) => vec![v],
        None => Vec::new(),
    };
    let mut set = None;
    for v in blocks.iter().filter_map(|b| b.get("prometheus_metrics")) {
        set = Some(v.as_bool().ok_or_else(|| format!("must be a boolean, got {v}"))?);
    }
    Ok(set)
}

/// What `f` sets that nomad-rs reads but does not act on (see [`AgentConfig::unused`]).
fn unused_keys(f: &FileConfig) -> Vec<String> {
    let mut unused = Vec::new();
    let mut note = |set: bool, key: &str, why: &str| {
        if set {
            unused.push(format!("{key}: accepted for compatibility and not used: {why}"));
        }
    };
    note(f.ui.is_some(), "ui", "nomad-rs has no web UI");
    for key in telemetry_keys(f.telemetry.as_ref()).into_iter().filter(|k| k != "prometheus_metrics") {
        note(true, &format!("telemetry.{key}"), "nomad-rs serves its metrics at /v1/metrics only (no sinks, no collection interval)");
    }
    note(
        f.leave_on_interrupt.is_some(),
        "leave_on_interrupt",
        "there is no gossip pool to leave; servers leave Raft with `operator raft remove-peer`",
    );
    note(
        f.leave_on_terminate.is_some(),
        "leave_on_terminate",
        "there is no gossip pool to leave; servers leave Raft with `operator raft remove-peer`",
    );
    note(
        f.ports.as_ref().is_some_and(|p| p.serf.is_some()),
        "ports.serf",
        "there is no gossip (Serf) listener; servers find each other over RPC",
    );
    note(f.addresses.as_ref().is_some_and(|a| a.serf.is_some()), "addresses.serf", "there is no gossip (Serf) listener");
    note(f.advertise.as_ref().is_some_and(|a| a.serf.is_some()), "advertise.serf", "there is no gossip (Serf) listener");
    if let Some(join) = f.server.as_ref().and_then(|s| s.server_join.as_ref()) {
        note(join.retry_max.is_some(), "server.server_join.retry_max", "nomad-rs retries a join on its own schedule");
        note(join.retry_interval.is_some(), "server.server_join.retry_interval", "nomad-rs retries a join on its own schedule");
    }
    note(
        f.server.as_ref().is_some_and(|s| s.csi_plugin_gc_threshold.is_some()),
        "server.csi_plugin_gc_threshold",
        "a CSI plugin is removed as soon as no node runs an instance of it, so there is nothing left to collect",
    );
    if let Some(t) = f.client.as_ref().and_then(|c| c.template.as_ref()) {
        note(t.max_stale.is_some(), "client.template.max_stale", "templates read Nomad data from the servers' consistent state");
        note(t.consul_retry.is_some(), "client.template.consul_retry", "templates do not read Consul data yet");
        note(t.vault_retry.is_some(), "client.template.vault_retry", "nomad-rs has no Vault integration");
        note(
            t.nomad_retry.as_ref().is_some_and(|r| r.attempts.is_some()),
            "client.template.nomad_retry.attempts",
            "Nomad data is fetched again until it arrives, as with Nomad's default of 0 (unlimited)",
        );
    }
    if let Some(a) = f.client.as_ref().and_then(|c| c.artifact.as_ref()) {
        for (set, key) in [
            (a.gcs_timeout.is_some(), "gcs_timeout"),
            (a.git_timeout.is_some(), "git_timeout"),
            (a.hg_timeout.is_some(), "hg_timeout"),
            (a.s3_timeout.is_some(), "s3_timeout"),
        ] {
            note(
                set,
                &format!("client.artifact.{key}"),
                "nomad-rs fetches only http and https artifacts; other sources are refused at admission",
            );
        }
        note(
            a.disable_filesystem_isolation.is_some(),
            "client.artifact.disable_filesystem_isolation",
            "downloads run inside the agent, confined beneath the task's dirs by openat2, not in a Landlock subprocess, so there is no isolation to turn off",
        );
        note(
            a.set_environment_variables.is_some(),
            "client.artifact.set_environment_variables",
            "downloads run inside the agent, not in a subprocess whose environment these would set",
        );
    }
    for (name, plugin) in f.plugin.iter().flatten() {
        note(plugin.args.is_some(), &format!("plugin \"{name}\" args"), "drivers are built in, not external plugin processes");
    }
    unused
}

/// The resolved configuration an agent runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// Agent and node name.
    pub name: String,
    /// Region.
    pub region: String,
    /// Datacenter.
    pub datacenter: String,
    /// Data dir (a temp dir in dev mode).
    pub data_dir: PathBuf,
    /// Bind address of the HTTP listener: `addresses { http }`, else `bind_addr` (`-bind`).
    pub bind_addr: IpAddr,
    /// Bind address of the RPC listener: `addresses { rpc }`, else `bind_addr`, except in dev
    /// mode, where it is 127.0.0.1 (a dev server's Raft and node RPCs are for this host only).
    pub rpc_bind_addr: IpAddr,
    /// HTTP port.
    pub http_port: u16,
    /// RPC port.
    pub rpc_port: u16,
    /// Advertised HTTP address.
    pub advertise_http: String,
    /// Advertised RPC address.
    pub advertise_rpc: String,
    /// Log level.
    pub log_level: String,
    /// Dev mode (temp data dir, server + client, raw_exec on).
    pub dev: bool,
    /// `-dev-connect`: the client's `network_interface` defaults to the default route's.
    pub dev_connect: bool,
    /// Server role, when enabled.
    pub server: Option<ServerSettings>,
    /// Client role, when enabled.
    pub client: Option<ClientSettings>,
    /// Driver plugin configs by name.
    pub plugins: BTreeMap<String, BTreeMap<String, Value>>,
    /// Listener limits (`limits {}`).
    pub limits: Limits,
    /// Consul (`consul {}`).
    pub consul: consul::ConsulSettings,
    /// ACLs (`acl {}`, `-acl-enabled`).
    pub acl: acl::AclSettings,
    /// TLS (`tls {}`).
    pub tls: crate::tls::TlsSettings,
    /// `telemetry { prometheus_metrics }`: `/v1/metrics?format=prometheus` is served (on in dev
    /// mode, as Nomad's).
    pub prometheus_metrics: bool,
    /// Keys the files set that nomad-rs accepts for compatibility but does not act on, each with
    /// why; the agent logs them at start so no setting is dropped without a word.
    pub unused: Vec<String>,
    /// Files the config was loaded from.
    pub sources: Vec<PathBuf>,
}

/// The agent's `limits {}`, resolved with Nomad's defaults. 0 turns a limit off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time an HTTP connection has to send a full request head.
    pub https_handshake_timeout: Duration,
    /// Most HTTP connections at once from one client IP.
    pub http_max_conns_per_client: usize,
    /// Time an RPC connection has to send its first bytes.
    pub rpc_handshake_timeout: Duration,
    /// Most RPC connections at once from one client IP.
    pub rpc_max_conns_per_client: usize,
}

impl Default for Limits {
    /// Nomad's: 5 s handshakes, 100 connections per client on each listener.
    fn default() -> Self {
        Limits {
            https_handshake_timeout: Duration::from_secs(5),
            http_max_conns_per_client: 100,
            rpc_handshake_timeout: Duration::from_secs(5),
            rpc_max_conns_per_client: 100,
        }
    }
}

impl Limits {
    /// Nomad keeps this many RPC connections per client for streaming calls; a limit must leave
    /// room for them (`rpc_max_conns_per_client must be > 25`).
    const RPC_MIN_CONNS: i64 = 25;

    fn resolve(b: Option<file::LimitsBlock>) -> Result<Limits, ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid { path: "agent configuration".into(), key: key.into(), message };
        let b = b.unwrap_or_default();
        let d = Limits::default();
        let http = b.http_max_conns_per_client.unwrap_or(d.http_max_conns_per_client as i64);
        if http < 0 {
            return Err(invalid("limits.http_max_conns_per_client", format!("http_max_conns_per_client must be >= 0; found: {http}")));
        }
        let rpc = b.rpc_max_conns_per_client.unwrap_or(d.rpc_max_conns_per_client as i64);
        if rpc < 0 || (rpc > 0 && rpc <= Self::RPC_MIN_CONNS) {
            return Err(invalid(
                "limits.rpc_max_conns_per_client",
                format!("rpc_max_conns_per_client must be > {}; found: {rpc}", Self::RPC_MIN_CONNS),
            ));
        }
        Ok(Limits {
            https_handshake_timeout: b.https_handshake_timeout.map_or(d.https_handshake_timeout, |v| v.0),
            http_max_conns_per_client: http as usize,
            rpc_handshake_timeout: b.rpc_handshake_timeout.map_or(d.rpc_handshake_timeout, |v| v.0),
            rpc_max_conns_per_client: rpc as usize,
        })
    }

    /// What the RPC listener enforces.
    pub fn rpc(&self) -> nomad_server::rpc_listener::RpcLimits {
        nomad_server::rpc_listener::RpcLimits {
            handshake_timeout: (!self.rpc_handshake_timeout.is_zero()).then_some(self.rpc_handshake_timeout),
            max_conns_per_client: self.rpc_max_conns_per_client,
        }
    }

    /// What the HTTP listener enforces.
    pub fn http(&self) -> nomad_server::http::listener::HttpLimits {
        nomad_server::http::listener::HttpLimits {
            header_read_timeout: (!self.https_handshake_timeout.is_zero()).then_some(self.https_handshake_timeout),
            max_conns_per_client: self.http_max_conns_per_client,
        }
    }
}

/// Default HTTP port.
pub const DEFAULT_HTTP_PORT: u16 = 4646;
/// Default RPC port.
pub const DEFAULT_RPC_PORT: u16 = 4647;
/// Highest `server { job_max_count }` accepted: at about 6.5 KB per placed alloc, a plan of
/// that many costs the scheduler some 65 GB.
pub const MAX_JOB_MAX_COUNT: i64 = 10_000_000;

impl AgentConfig {
    /// Loads files, applies flags and defaults, and checks the result.
    /// `dev_data_dir` is used as the data dir in dev mode when none is given.
    pub fn resolve(flags: &AgentFlags, dev_data_dir: Option<PathBuf>) -> Result<AgentConfig, ConfigError> {
        let file = file::load(&flags.config)?;
        Self::from_parts(file, flags, dev_data_dir)
    }

    fn from_parts(f: FileConfig, flags: &AgentFlags, dev_data_dir: Option<PathBuf>) -> Result<AgentConfig, ConfigError> {
        let unused = unused_keys(&f);
        let invalid = |key: &str, message: String| ConfigError::Invalid { path: "agent configuration".into(), key: key.into(), message };
        let dev = flags.dev;
        let prometheus_metrics =
            telemetry_prometheus(f.telemetry.as_ref()).map_err(|e| invalid("telemetry.prometheus_metrics", e))?.unwrap_or(dev);
        let name = flags.node.clone().or(f.name).unwrap_or_else(hostname);
        let region = flags.region.clone().or(f.region).unwrap_or_else(|| "global".into());
        let datacenter = flags.dc.clone().or(f.datacenter).unwrap_or_else(|| "dc1".into());
        let data_dir = match flags.data_dir.clone().or(f.data_dir.map(PathBuf::from)) {
            Some(d) => d,
            None if dev => dev_data_dir.ok_or_else(|| invalid("data_dir", "dev mode needs a temporary data dir".into()))?,
            None => return Err(invalid("data_dir", "Must specify data directory (data_dir in a config file or -data-dir)".into())),
        };
        // -dev-connect listens everywhere (so the CLI "just works" whatever address it is given),
        // plain -dev on loopback only.
        let default_bind = if dev && !flags.dev_connect { "127.0.0.1" } else { "0.0.0.0" };
        let bind_str = flags.bind.clone().or(f.bind_addr).unwrap_or_else(|| default_bind.into());
        let bind_addr: IpAddr = bind_str.parse().map_err(|_| invalid("bind_addr", format!("{bind_str:?} is not an IP address")))?;
        let ports = f.ports.unwrap_or_default();
        let http_port = flags.http_port.or(ports.http).unwrap_or(DEFAULT_HTTP_PORT);
        let rpc_port = flags.rpc_port.or(ports.rpc).unwrap_or(DEFAULT_RPC_PORT);
        // `addresses {}` binds one listener elsewhere than `bind_addr` (Nomad's per-listener addresses).
        let addresses = f.addresses.unwrap_or_default();
        let listener_addr = |key: &str, given: Option<String>| -> Result<Option<IpAddr>, ConfigError> {
            given.map(|a| a.parse().map_err(|_| invalid(key, format!("{a:?} is not an IP address")))).transpose()
        };
        let http_bind_addr = listener_addr("addresses.http", addresses.http)?.unwrap_or(bind_addr);
        // A dev server's Raft and node RPCs are for this host only, unless told otherwise.
        let rpc_bind_addr =
            listener_addr("addresses.rpc", addresses.rpc)?.unwrap_or(if dev { IpAddr::from([127, 0, 0, 1]) } else { bind_addr });
        let advertise_host = |addr: IpAddr| {
            if addr.is_unspecified() { local_ip().unwrap_or_else(|| "127.0.0.1".into()) } else { addr.to_string() }
        };
        let advertise = f.advertise.unwrap_or_default();
        let advertise_http = advertise.http.unwrap_or_else(|| format!("{}:{http_port}", advertise_host(http_bind_addr)));
        let advertise_rpc = advertise.rpc.unwrap_or_else(|| format!("{}:{rpc_port}", advertise_host(rpc_bind_addr)));
        let log_level = flags.log_level.clone().or(f.log_level).unwrap_or_else(|| if dev { "DEBUG".into() } else { "INFO".into() });
        if !["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "OFF"].contains(&log_level.to_uppercase().as_str()) {
            return Err(invalid("log_level", format!("{log_level:?} is not one of TRACE, DEBUG, INFO, WARN, ERROR, OFF")));
        }

        let sb = f.server.unwrap_or_default();
        let server_enabled = dev || flags.server || sb.enabled.unwrap_or(false);
        let server = if server_enabled {
            let mut heartbeat = HeartbeatConfig::default();
            if let Some(d) = sb.heartbeat_grace {
                heartbeat.grace = d.0;
            }
            if let Some(d) = sb.min_heartbeat_ttl {
                heartbeat.min_ttl = d.0;
            }
            if let Some(r) = sb.max_heartbeats_per_second {
                // NaN passes a `<= 0` check, and made every heartbeat TTL panic.
                if !r.is_finite() || r <= 0.0 {
                    return Err(invalid("server.max_heartbeats_per_second", format!("must be a positive number; got {r}")));
                }
                heartbeat.max_per_second = r;
            }
            if let Some(d) = sb.failover_heartbeat_ttl {
                heartbeat.failover_ttl = d.0;
            }
            let mut join = flags.join.clone();
            join.extend(sb.retry_join.unwrap_or_default());
            join.extend(sb.server_join.and_then(|j| j.retry_join).unwrap_or_default());
            let bootstrap_expect = flags.bootstrap_expect.or(sb.bootstrap_expect).unwrap_or(1);
            if bootstrap_expect == 0 && join.is_empty() {
                return Err(invalid("server.bootstrap_expect", "0 needs servers to join (server_join { retry_join })".into()));
            }
            let job_max_count = sb.job_max_count.unwrap_or(nomad_proto::limits::DEFAULT_JOB_MAX_COUNT);
            if !(1..=MAX_JOB_MAX_COUNT).contains(&job_max_count) {
                // Nomad reads 0 as "no limit"; here there is always one, so the scheduler's memory stays bounded.
                return Err(invalid(
                    "server.job_max_count",
                    format!(
                        "must be between 1 and {MAX_JOB_MAX_COUNT} (a plan costs the scheduler about 6.5 KB per alloc); got {job_max_count}"
                    ),
                ));
            }
            let mut csi_claim_gc = nomad_server::leader::ClaimGcConfig::default();
            if let Some(d) = sb.csi_volume_claim_gc_interval {
                if d.0.is_zero() {
                    return Err(invalid(
                        "server.csi_volume_claim_gc_interval",
                        "csi_volume_claim_gc_interval should be greater than 0s".into(),
                    ));
                }
                csi_claim_gc.interval = d.0;
            }
            if let Some(d) = sb.csi_volume_claim_gc_threshold {
                csi_claim_gc.threshold = d.0;
            }
            let mut core_gc = nomad_server::endpoints::GcConfig::default();
            if let Some(d) = sb.job_gc_interval {
                if d.0.is_zero() {
                    return Err(invalid("server.job_gc_interval", "job_gc_interval should be greater than 0s".into()));
                }
                core_gc.interval = d.0;
            }
            for (value, slot) in [
                (sb.job_gc_threshold, &mut core_gc.job_threshold),
                (sb.eval_gc_threshold, &mut core_gc.eval_threshold),
                (sb.batch_eval_gc_threshold, &mut core_gc.batch_eval_threshold),
                (sb.deployment_gc_threshold, &mut core_gc.deployment_threshold),
                (sb.node_gc_threshold, &mut core_gc.node_threshold),
            ] {
                if let Some(d) = value {
                    *slot = d.0;
                }
            }
            let mut acl_token_gc = nomad_server::leader::TokenGcConfig::default();
            if let Some(d) = sb.acl_token_gc_threshold {
                acl_token_gc.threshold = d.0;
            }
            let mut keyring = nomad_server::leader::KeyringConfig::default();
            for (name, value, slot) in [
                ("root_key_rotation_threshold", sb.root_key_rotation_threshold, &mut keyring.rotation_threshold),
                ("root_key_gc_interval", sb.root_key_gc_interval, &mut keyring.gc_interval),
                ("root_key_gc_threshold", sb.root_key_gc_threshold, &mut keyring.gc_threshold),
            ] {
                if let Some(d) = value {
                    if d.0.is_zero() {
                        return Err(invalid(&format!("server.{name}"), format!("{name} should be greater than 0s")));
                    }
                    *slot = d.0;
                }
            }
            Some(ServerSettings {
                data_dir: sb.data_dir.map(PathBuf::from).unwrap_or_else(|| data_dir.join("server")),
                bootstrap_expect,
                join,
                heartbeat,
                num_schedulers: sb.num_schedulers.unwrap_or(0),
                event_buffer_size: sb.event_buffer_size.unwrap_or(100),
                encrypt: flags.encrypt.clone().or(sb.encrypt).filter(|k| !k.trim().is_empty()),
                job_max_count,
                csi_claim_gc,
                acl_token_gc,
                core_gc,
                keyring,
            })
        } else {
            None
        };

        let mut cb = f.client.unwrap_or_default();
        let client_enabled = dev || flags.client || cb.enabled.unwrap_or(false);
        let client = if client_enabled {
            let mut servers = flags.servers.clone();
            if servers.is_empty() {
                servers = cb.servers.clone().unwrap_or_default();
            }
            if servers.is_empty() && server.is_some() {
                servers.push(advertise_rpc.clone());
            }
            if servers.is_empty() {
                return Err(invalid("client.servers", "a client needs servers to talk to (client { servers = [...] } or -servers)".into()));
            }
            let mut meta = cb.meta.clone().unwrap_or_default();
            for pair in &flags.meta {
                // Nomad's -meta: `key=value`, the flag winning over the file.
                match pair.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() => {
                        meta.insert(k.trim().to_string(), v.to_string());
                    }
                    _ => return Err(invalid("-meta", format!("{pair:?} is not key=value"))),
                }
            }
            let cni = CniSettings::resolve(&cb, std::env::var("CNI_PATH").ok())?;
            let chroot_env = match cb.chroot_env.take() {
                None => None,
                Some(map) => Some(
                    map.into_iter()
                        .map(|(host, task)| {
                            if !Path::new(&host).is_absolute() || !Path::new(&task).is_absolute() {
                                return Err(invalid("client.chroot_env", format!("{host:?} = {task:?}: both paths must be absolute")));
                            }
                            Ok((PathBuf::from(host), PathBuf::from(task)))
                        })
                        .collect::<Result<BTreeMap<_, _>, _>>()?,
                ),
            };
            let (min_port, max_port) = (cb.min_dynamic_port.unwrap_or(20000), cb.max_dynamic_port.unwrap_or(32000));
            if !(1..=65535).contains(&min_port) || !(1..=65535).contains(&max_port) || min_port > max_port {
                return Err(invalid("client.min_dynamic_port", format!("dynamic port range {min_port}-{max_port} is not valid")));
            }
            let gc = gc_config(&cb, flags.dev)?;
            Some(ClientSettings {
                servers,
                state_dir: flags.state_dir.clone().or(cb.state_dir.map(PathBuf::from)).unwrap_or_else(|| data_dir.join("client")),
                alloc_dir: flags.alloc_dir.clone().or(cb.alloc_dir.map(PathBuf::from)).unwrap_or_else(|| data_dir.join("alloc")),
                node_class: flags.node_class.clone().or(cb.node_class).unwrap_or_default(),
                node_pool: flags.node_pool.clone().or(cb.node_pool).unwrap_or_else(|| "default".into()),
                meta,
                options: cb.options.unwrap_or_default(),
                reserved: cb.reserved.unwrap_or_default(),
                host_volumes: cb.host_volume.unwrap_or_default(),
                dynamic_ports: (min_port, max_port),
                cpu_total_compute: cb.cpu_total_compute,
                memory_total_mb: cb.memory_total_mb,
                network_interface: cb.network_interface.filter(|i| !i.is_empty()),
                cni,
                chroot_env,
                artifact: artifact_config(cb.artifact.as_ref())?,
                template: template_config(cb.template.as_ref())?,
                gc,
            })
        } else {
            None
        };
        if server.is_none() && client.is_none() {
            return Err(invalid("(top level)", "Must specify either server, client or dev mode for the agent".into()));
        }

        let limits = Limits::resolve(f.limits)?;
        let consul = consul::ConsulSettings::resolve(f.consul, |k| std::env::var(k).ok())?;
        let acl = acl::AclSettings::resolve(f.acl, flags.acl_enabled)?;
        let tls = crate::tls::TlsSettings::resolve(f.tls).map_err(|(key, message)| ConfigError::Invalid {
            path: "agent configuration".into(),
            key,
            message,
        })?;
        let mut plugins: BTreeMap<String, BTreeMap<String, Value>> =
            f.plugin.unwrap_or_default().into_iter().map(|(k, v)| (k, v.config.unwrap_or_default())).collect();
        if dev {
            // Dev mode runs raw_exec, as Nomad's does.
            plugins.entry("raw_exec".into()).or_default().entry("enabled".into()).or_insert(Value::Bool(true));
        }
        Ok(AgentConfig {
            name,
            region,
            datacenter,
            data_dir,
            bind_addr: http_bind_addr,
            rpc_bind_addr,
            http_port,
            rpc_port,
            advertise_http,
            advertise_rpc,
            log_level,
            dev,
            dev_connect: dev && flags.dev_connect,
            server,
            client,
            plugins,
            limits,
            consul,
            acl,
            tls,
            prometheus_metrics,
            unused,
            sources: flags.config.clone(),
        })
    }

    /// Whether a driver plugin is enabled (`plugin "NAME" { config { enabled = true } }`).
    pub fn plugin_enabled(&self, name: &str) -> bool {
        self.plugins.get(name).and_then(|c| c.get("enabled")).is_some_and(|v| v.as_bool() == Some(true))
    }

    /// The oci driver's runtime state directory (`plugin "oci" { config { runtime_root = "/run/x" } }`),
    /// when set: it keeps the containers of agents sharing a host apart (each e2e test's agent).
    pub fn oci_runtime_root(&self) -> Result<Option<PathBuf>, String> {
        match self.plugins.get("oci").and_then(|c| c.get("runtime_root")) {
            None => Ok(None),
            Some(Value::String(s)) if std::path::Path::new(s).is_absolute() => Ok(Some(PathBuf::from(s))),
            Some(v) => Err(format!("plugin \"oci\" config runtime_root: must be an absolute path, got {v}")),
        }
    }

    /// The docker driver's settings: `plugin "docker" { config { ... } }` with Nomad's keys and
    /// defaults; an unknown or ill-typed key is an error naming it.
    pub fn docker_options(&self) -> Result<crate::client::driver::docker::DockerOptions, String> {
        let config: serde_json::Map<String, Value> =
            self.plugins.get("docker").map(|c| c.clone().into_iter().collect()).unwrap_or_default();
        crate::client::driver::docker::DockerOptions::from_plugin_config(&config)
    }

    /// The exec driver's policy: `plugin "exec" { config { allow_caps = [...] } }` (Nomad's
    /// default set when absent) and the users tasks may not run as: the client option
    /// `user.denylist` (`root,Administrator` by default; the old `user.blacklist` too) when
    /// `user.checked_drivers` (`exec,qemu,java` by default) names exec.
    pub fn exec_policy(&self, options: &BTreeMap<String, String>) -> Result<(CapSet, BTreeSet<String>), String> {
        let supported = capabilities::supported();
        let allow_caps = match self.plugins.get("exec").and_then(|c| c.get("allow_caps")) {
            None => CapSet::parse(capabilities::NOMAD_DEFAULTS, supported).unwrap_or_default(),
            Some(Value::Array(items)) => {
                let names = items
                    .iter()
                    .map(|v| v.as_str().ok_or_else(|| format!("plugin \"exec\" config allow_caps: every entry must be a string, got {v}")))
                    .collect::<Result<Vec<_>, _>>()?;
                CapSet::parse(&names, supported)
                    .map_err(|e| format!("plugin \"exec\" config allow_caps: configured with capabilities not supported by system: {e}"))?
            }
            Some(v) => return Err(format!("plugin \"exec\" config allow_caps: must be a list of capability names, got {v}")),
        };
        let list = |keys: &[&str], default: &str| -> BTreeSet<String> {
            let raw = keys.iter().find_map(|k| options.get(*k)).map(String::as_str).unwrap_or(default);
            raw.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
        };
        let checked = list(&["user.checked_drivers"], "exec,qemu,java");
        let denylist = if checked.contains("exec") {
            list(&["user.denylist", "user.blacklist"], &DEFAULT_USER_DENYLIST.join(","))
        } else {
            BTreeSet::new()
        };
        Ok((allow_caps, denylist))
    }

    /// The configuration as `/v1/agent/self` shows it (Go field names).
    pub fn to_api_json(&self) -> Value {
        serde_json::json!({
            "Region": self.region,
            "Datacenter": self.datacenter,
            "NodeName": self.name,
            "DataDir": self.data_dir,
            "BindAddr": self.bind_addr.to_string(),
            "LogLevel": self.log_level,
            "DevMode": self.dev,
            "Ports": { "HTTP": self.http_port, "RPC": self.rpc_port, "Serf": 4648 },
            "AdvertiseAddrs": { "HTTP": self.advertise_http, "RPC": self.advertise_rpc },
            "Version": { "Version": nomad_server::http::API_VERSION, "VersionPrerelease": "", "VersionMetadata": format!("nomad-rs.{}", env!("CARGO_PKG_VERSION")) },
            "Server": {
                "Enabled": self.server.is_some(),
                "BootstrapExpect": self.server.as_ref().map_or(0, |s| s.bootstrap_expect),
                "NumSchedulers": self.server.as_ref().map_or(0, |s| s.num_schedulers),
                "JobMaxCount": self.server.as_ref().map_or(0, |s| s.job_max_count),
            },
            "Client": {
                "Enabled": self.client.is_some(),
                "Servers": self.client.as_ref().map(|c| c.servers.clone()).unwrap_or_default(),
                "NodeClass": self.client.as_ref().map(|c| c.node_class.clone()).unwrap_or_default(),
                "Meta": self.client.as_ref().map(|c| c.meta.clone()).unwrap_or_default(),
            },
            "ACL": { "Enabled": self.acl.enabled },
            "Limits": {
                "HTTPSHandshakeTimeout": fmt_duration(self.limits.https_handshake_timeout),
                "HTTPMaxConnsPerClient": self.limits.http_max_conns_per_client,
                "RPCHandshakeTimeout": fmt_duration(self.limits.rpc_handshake_timeout),
                "RPCMaxConnsPerClient": self.limits.rpc_max_conns_per_client,
            },
        })
    }

    /// Heartbeat timings for the server role, or Nomad's defaults.
    pub fn heartbeat(&self) -> HeartbeatConfig {
        self.server.as_ref().map(|s| s.heartbeat.clone()).unwrap_or_default()
    }
}

/// The host's name, as Nomad uses for node names.
pub fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".into())
}

/// A non-loopback address of this host, found by asking the kernel which
/// source address it would use to reach a public address (no packet is sent).
pub fn local_ip() -> Option<String> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect("192.0.2.1:9").ok()?;
    let ip = sock.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then(|| ip.to_string())
}

/// How long a duration is in Go's notation, for banners.
pub fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 { format!("{}s", d.as_secs()) } else { format!("{}ms", d.as_millis()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(src: &str, flags: AgentFlags) -> Result<AgentConfig, ConfigError> {
        let file = if src.is_empty() {
            FileConfig::default()
        } else {
            file::decode(file::parse_str(src, std::path::Path::new("a.hcl"))?, "a.hcl")?
        };
        AgentConfig::from_parts(file, &flags, Some(PathBuf::from("/tmp/dev")))
    }

    #[test]
    fn dev_mode_runs_both_roles_with_raw_exec_on_loopback() {
        let c = resolve("", AgentFlags { dev: true, ..Default::default() }).unwrap();
        assert!(c.server.is_some() && c.client.is_some());
        assert!(c.plugin_enabled("raw_exec"));
        assert_eq!(c.bind_addr.to_string(), "127.0.0.1");
        assert_eq!(c.http_port, 4646);
        assert_eq!(c.client.as_ref().unwrap().servers, vec!["127.0.0.1:4647"]);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/dev"));
    }

    /// `-dev-connect` (which sets `-dev` too) listens everywhere unless told otherwise; its RPC
    /// stays on loopback as any dev agent's; plain `-dev` is not Connect's.
    #[test]
    fn dev_connect_listens_everywhere_and_marks_the_config() {
        let c = resolve("", AgentFlags { dev: true, dev_connect: true, ..Default::default() }).unwrap();
        assert!(c.bind_addr.is_unspecified(), "{}", c.bind_addr);
        assert_eq!(c.rpc_bind_addr.to_string(), "127.0.0.1");
        assert!(c.dev && c.dev_connect && c.plugin_enabled("raw_exec"));
        let c = resolve("", AgentFlags { dev: true, dev_connect: true, bind: Some("127.0.0.1".into()), ..Default::default() }).unwrap();
        assert_eq!(c.bind_addr.to_string(), "127.0.0.1", "-bind wins");
        assert!(!resolve("", AgentFlags { dev: true, ..Default::default() }).unwrap().dev_connect);
    }

    #[test]
    fn a_dev_agent_keeps_rpc_on_loopback_whatever_it_binds_http_to() {
        let c = resolve("", AgentFlags { dev: true, bind: Some("0.0.0.0".into()), ..Default::default() }).unwrap();
        assert!(c.bind_addr.is_unspecified(), "HTTP follows -bind");
        assert_eq!(c.rpc_bind_addr.to_string(), "127.0.0.1");
        assert_eq!(c.advertise_rpc, "127.0.0.1:4647");
        assert_eq!(c.client.as_ref().unwrap().servers, vec!["127.0.0.1:4647"], "its own client reaches it there");
        let server = resolve("data_dir = \"/a\"\nbind_addr = \"0.0.0.0\"\n", AgentFlags { server: true, ..Default::default() }).unwrap();
        assert!(server.rpc_bind_addr.is_unspecified(), "a real server binds RPC where told");
    }

    #[test]
    fn addresses_and_ports_move_each_listener_and_flags_win() {
        let dev = AgentFlags { dev: true, bind: Some("127.0.0.1".into()), ..Default::default() };
        let c = resolve("ports {\n  http = 5646\n  rpc = 5647\n}\n", dev.clone()).unwrap();
        assert_eq!((c.bind_addr.to_string(), c.http_port, c.rpc_port), ("127.0.0.1".to_string(), 5646, 5647));
        assert_eq!((c.advertise_http.as_str(), c.advertise_rpc.as_str()), ("127.0.0.1:5646", "127.0.0.1:5647"));
        assert_eq!(c.client.as_ref().unwrap().servers, vec!["127.0.0.1:5647"], "its own client follows the RPC port");
        let c = resolve("addresses {\n  http = \"127.0.0.2\"\n  rpc = \"127.0.0.3\"\n}\n", dev.clone()).unwrap();
        assert_eq!((c.bind_addr.to_string(), c.rpc_bind_addr.to_string()), ("127.0.0.2".to_string(), "127.0.0.3".to_string()));
        assert_eq!((c.advertise_http.as_str(), c.advertise_rpc.as_str()), ("127.0.0.2:4646", "127.0.0.3:4647"));
        let c = resolve("ports {\n  http = 5646\n}\n", AgentFlags { http_port: Some(0), ..dev.clone() }).unwrap();
        assert_eq!(c.http_port, 0, "-http-port wins over the file");
        let e = resolve("addresses {\n  http = \"eth0\"\n}\n", dev).unwrap_err().to_string();
        assert!(e.contains("addresses.http") && e.contains("\"eth0\" is not an IP address"), "{e}");
    }

    #[test]
    fn nomads_client_and_server_flags_override_the_file() {
        let file = "client {\n  node_class = \"file\"\n  meta {\n    rack = \"r1\"\n    zone = \"z1\"\n  }\n}\nserver {\n  encrypt = \"ZmlsZQ==\"\n}\n";
        let flags = AgentFlags {
            dev: true,
            encrypt: Some("ZmxhZw==".into()),
            state_dir: Some("/s".into()),
            alloc_dir: Some("/a".into()),
            node_class: Some("gpu".into()),
            node_pool: Some("batch".into()),
            meta: vec!["rack=r9".into(), "owner=ops=1".into()],
            ..Default::default()
        };
        let c = resolve(file, flags.clone()).unwrap();
        assert_eq!(c.server.as_ref().unwrap().encrypt.as_deref(), Some("ZmxhZw=="));
        let client = c.client.as_ref().unwrap();
        assert_eq!((client.state_dir.as_path(), client.alloc_dir.as_path()), (std::path::Path::new("/s"), std::path::Path::new("/a")));
        assert_eq!((client.node_class.as_str(), client.node_pool.as_str()), ("gpu", "batch"));
        let meta: Vec<(&str, &str)> = client.meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(meta, vec![("owner", "ops=1"), ("rack", "r9"), ("zone", "z1")]);
        let e = resolve("", AgentFlags { meta: vec!["novalue".into()], ..flags }).unwrap_err().to_string();
        assert!(e.contains("-meta: \"novalue\" is not key=value"), "{e}");
    }

    #[test]
    fn the_cluster_key_comes_from_server_encrypt() {
        let c = resolve("data_dir = \"/a\"\nserver {\n  enabled = true\n  encrypt = \"a2V5\"\n}\n", AgentFlags::default()).unwrap();
        assert_eq!(c.server.unwrap().encrypt.as_deref(), Some("a2V5"));
    }

    #[test]
    fn flags_override_files() {
        let c = resolve(
            "datacenter = \"dc9\"\ndata_dir = \"/a\"\nserver {\n  enabled = true\n  heartbeat_grace = \"1s\"\n}\n",
            AgentFlags {
                dc: Some("dc2".into()),
                data_dir: Some("/b".into()),
                bootstrap_expect: Some(3),
                join: vec!["x:1".into()],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.datacenter, "dc2");
        assert_eq!(c.data_dir, PathBuf::from("/b"));
        let s = c.server.as_ref().unwrap();
        assert_eq!((s.bootstrap_expect, s.join.as_slice()), (3, &["x:1".to_string()][..]));
        assert_eq!(s.heartbeat.grace, Duration::from_secs(1));
        assert!(!c.plugin_enabled("raw_exec"), "raw_exec is off unless enabled");
    }

    #[test]
    fn the_oci_runtime_root_is_an_absolute_path_when_set() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        assert_eq!(resolve("", dev.clone()).unwrap().oci_runtime_root(), Ok(None));
        let c = resolve("plugin \"oci\" {\n  config {\n    runtime_root = \"/run/t1/runc\"\n  }\n}\n", dev.clone()).unwrap();
        assert_eq!(c.oci_runtime_root(), Ok(Some(PathBuf::from("/run/t1/runc"))));
        let c = resolve("plugin \"oci\" {\n  config {\n    runtime_root = \"runc\"\n  }\n}\n", dev.clone()).unwrap();
        assert_eq!(c.oci_runtime_root(), Err("plugin \"oci\" config runtime_root: must be an absolute path, got \"runc\"".to_string()));
        let c = resolve("plugin \"oci\" {\n  config {\n    runtime_root = 3\n  }\n}\n", dev).unwrap();
        assert!(c.oci_runtime_root().unwrap_err().ends_with("got 3"));
    }

    #[test]
    fn client_gc_settings_take_nomads_defaults_a_dev_agents_and_refuse_nonsense() {
        use crate::client::gc::GcConfig;
        let client = |src: &str, dev: bool| {
            let flags =
                AgentFlags { dev, client: true, servers: vec!["127.0.0.1:4647".into()], data_dir: Some("/d".into()), ..Default::default() };
            resolve(src, flags).map(|c| c.client.expect("a client").gc)
        };
        assert_eq!(client("", false).unwrap(), GcConfig::default());
        assert_eq!(client("", true).unwrap().disk_usage_threshold, 99.0);
        let gc = client(
            "client {\n  gc_interval = \"30s\"\n  gc_disk_usage_threshold = 90\n  gc_inode_usage_threshold = 85.5\n  \
             gc_max_allocs = 10\n  gc_parallel_destroys = 0\n}\n",
            false,
        )
        .unwrap();
        assert_eq!(
            gc,
            GcConfig {
                interval: Duration::from_secs(30),
                disk_usage_threshold: 90.0,
                inode_usage_threshold: 85.5,
                max_allocs: 10,
                parallel_destroys: 2
            },
            "a zero keeps the default"
        );
        let err = client("client {\n  gc_disk_usage_threshold = 120\n}\n", false).unwrap_err().to_string();
        assert!(err.contains("client.gc_disk_usage_threshold") && err.contains("between 0 and 100"), "{err}");
        let err = client("client {\n  gc_max_allocs = -1\n}\n", false).unwrap_err().to_string();
        assert!(err.contains("client.gc_max_allocs") && err.contains("negative"), "{err}");
        let err = client("client {\n  gc_interval = \"0s\"\n}\n", false).unwrap_err().to_string();
        assert!(err.contains("greater than 0s"), "{err}");
    }

    #[test]
    fn keys_accepted_for_compatibility_but_unused_are_listed_with_why() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        assert_eq!(resolve("", dev.clone()).unwrap().unused, Vec::<String>::new());
        let src = "telemetry {\n  collection_interval = \"1s\"\n}\nports {\n  serf = 4648\n}\nleave_on_terminate = true\n";
        let unused = resolve(src, dev).unwrap().unused;
        let keys: Vec<&str> = unused.iter().map(|u| u.split(':').next().unwrap()).collect();
        assert_eq!(keys, vec!["telemetry.collection_interval", "leave_on_terminate", "ports.serf"], "{unused:?}");
        assert!(
            unused[0].ends_with("not used: nomad-rs serves its metrics at /v1/metrics only (no sinks, no collection interval)"),
            "{unused:?}"
        );
    }

    #[test]
    fn prometheus_metrics_follow_the_telemetry_block_and_dev_mode() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        assert!(resolve("", dev.clone()).unwrap().prometheus_metrics, "on in dev mode, as Nomad's");
        assert!(!resolve("telemetry {\n  prometheus_metrics = false\n}\n", dev.clone()).unwrap().prometheus_metrics);
        let on = resolve("telemetry {\n  prometheus_metrics = true\n}\n", dev.clone()).unwrap();
        assert!(on.prometheus_metrics);
        assert!(on.unused.is_empty(), "prometheus_metrics is used: {:?}", on.unused);
        let err = resolve("telemetry {\n  prometheus_metrics = \"yes\"\n}\n", dev).unwrap_err().to_string();
        assert!(err.contains("telemetry.prometheus_metrics") && err.contains("must be a boolean"), "{err}");
    }

    #[test]
    fn the_artifact_block_takes_nomads_defaults_limits_and_warns_about_the_other_getters() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        let d = resolve("", dev.clone()).unwrap().client.unwrap().artifact;
        assert_eq!(d, crate::client::artifact::ArtifactConfig::default());
        assert_eq!(
            (d.http_read_timeout, d.http_max_size, d.decompression_file_count_limit),
            (Duration::from_secs(1800), 100_000_000_000, 4096)
        );
        let src = "client {\n  artifact {\n    http_read_timeout = \"5m\"\n    http_max_size = \"1GiB\"\n    decompression_size_limit = \"0\"\n    \
                   decompression_file_count_limit = 10\n    git_timeout = \"1m\"\n    disable_filesystem_isolation = true\n  }\n}\n";
        let cfg = resolve(src, dev.clone()).unwrap();
        let a = cfg.client.as_ref().unwrap().artifact;
        assert_eq!(a.http_read_timeout, Duration::from_secs(300));
        assert_eq!(a.http_max_size, 1 << 30);
        assert_eq!((a.decompression_size_limit, a.decompression_file_count_limit), (0, 10));
        let keys: Vec<&str> = cfg.unused.iter().map(|u| u.split(':').next().unwrap()).collect();
        assert_eq!(keys, ["client.artifact.git_timeout", "client.artifact.disable_filesystem_isolation"], "{:?}", cfg.unused);
        assert!(cfg.unused[0].contains("nomad-rs fetches only http and https artifacts"), "{:?}", cfg.unused);
        for (bad, key, why) in [
            ("http_read_timeout = \"soon\"", "client.artifact.http_read_timeout", "not a valid duration"),
            ("http_read_timeout = \"-1s\"", "client.artifact.http_read_timeout", "must be > 0"),
            ("http_max_size = \"lots\"", "client.artifact.http_max_size", "not a valid size"),
            ("decompression_file_count_limit = -1", "client.artifact.decompression_file_count_limit", "must be >= 0 but found -1"),
            ("s3_region = \"x\"", "client.artifact.s3_region", "unknown field"),
        ] {
            let e = resolve(&format!("client {{\n  artifact {{\n    {bad}\n  }}\n}}\n"), dev.clone()).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn network_interface_reaches_the_client_settings() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        let c = resolve("client {\n  network_interface = \"lo\"\n}\n", dev.clone()).unwrap();
        assert_eq!(c.client.unwrap().network_interface.as_deref(), Some("lo"));
        assert_eq!(resolve("", dev).unwrap().client.unwrap().network_interface, None);
    }

    #[test]
    fn chroot_env_reaches_the_client_settings_with_absolute_paths_only() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        let file = "client {\n  chroot_env = {\n    \"/usr\" = \"/usr\"\n    \"/opt/tools/bin\" = \"/tools\"\n  }\n}\n";
        let env = resolve(file, dev.clone()).unwrap().client.unwrap().chroot_env.unwrap();
        assert_eq!(
            env,
            BTreeMap::from([(PathBuf::from("/opt/tools/bin"), PathBuf::from("/tools")), (PathBuf::from("/usr"), PathBuf::from("/usr"))])
        );
        assert_eq!(resolve("", dev.clone()).unwrap().client.unwrap().chroot_env, None, "the exec driver's defaults");
        let e = resolve("client {\n  chroot_env = {\n    \"usr\" = \"/usr\"\n  }\n}\n", dev).unwrap_err().to_string();
        assert!(e.contains("client.chroot_env") && e.contains("both paths must be absolute"), "{e}");
    }

    #[test]
    fn the_cni_and_bridge_keys_reach_the_client_settings_with_nomads_defaults() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        let file = "client {\n  cni_path = \"/a:/b\"\n  cni_config_dir = \"/c\"\n  bridge_network_name = \"br9\"\n  bridge_network_subnet = \"10.9.0.0/16\"\n  bridge_network_hairpin_mode = true\n}\n";
        let cni = resolve(file, dev.clone()).unwrap().client.unwrap().cni;
        let want = CniSettings {
            path: vec!["/a".into(), "/b".into()],
            config_dir: "/c".into(),
            bridge_name: "br9".into(),
            bridge_subnet: "10.9.0.0/16".into(),
            hairpin_mode: true,
        };
        assert_eq!(cni, want);
        let d = CniSettings::resolve(&file::ClientBlock::default(), None).unwrap();
        assert_eq!(d.path, [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]);
        assert_eq!(
            (d.config_dir.to_str(), d.bridge_name.as_str(), d.bridge_subnet.as_str(), d.hairpin_mode),
            (Some("/opt/cni/config"), "nomad", "172.26.64.0/20", false)
        );
        assert_eq!(
            CniSettings::resolve(&file::ClientBlock::default(), Some("/env".into())).unwrap().path,
            [PathBuf::from("/env")],
            "$CNI_PATH when unset"
        );
        let e = resolve("client {\n  bridge_network_name = \"a-very-long-bridge\"\n}\n", dev.clone()).unwrap_err().to_string();
        assert!(e.contains("client.bridge_network_name"), "{e}");
        let e = resolve("client {\n  bridge_network_subnet = \"nomad\"\n}\n", dev.clone()).unwrap_err().to_string();
        assert!(e.contains("client.bridge_network_subnet") && e.contains("not an IPv4 CIDR"), "{e}");
        let e = resolve("client {\n  bridge_network_mode = \"x\"\n}\n", dev).unwrap_err().to_string();
        assert!(e.contains("bridge_network_mode"), "unknown keys stay errors: {e}");
    }

    #[test]
    fn the_exec_policy_has_nomads_defaults_and_reads_allow_caps_and_the_user_options() {
        let dev = AgentFlags { dev: true, ..Default::default() };
        let supported = capabilities::supported();
        let defaults = CapSet::parse(capabilities::NOMAD_DEFAULTS, supported).unwrap();
        let none = BTreeMap::new();
        let (caps, denied) = resolve("", dev.clone()).unwrap().exec_policy(&none).unwrap();
        assert_eq!(caps, defaults);
        assert_eq!(denied, BTreeSet::from(["root".to_string(), "Administrator".to_string()]));

        let c = resolve("plugin \"exec\" {\n  config {\n    allow_caps = [\"chown\", \"NET_RAW\"]\n  }\n}\n", dev.clone()).unwrap();
        assert_eq!(c.exec_policy(&none).unwrap().0, CapSet::parse(&["chown", "net_raw"], supported).unwrap());
        let c = resolve("plugin \"exec\" {\n  config {\n    allow_caps = [\"chown\", \"flying\"]\n  }\n}\n", dev.clone()).unwrap();
        assert_eq!(
            c.exec_policy(&none).unwrap_err(),
            "plugin \"exec\" config allow_caps: configured with capabilities not supported by system: flying"
        );

        let options = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        let c = resolve("", dev).unwrap();
        let (_, denied) = c.exec_policy(&options(&[("user.denylist", "root, ops")])).unwrap();
        assert_eq!(denied, BTreeSet::from(["root".to_string(), "ops".to_string()]));
        let (_, denied) = c.exec_policy(&options(&[("user.blacklist", "ops")])).unwrap();
        assert_eq!(denied, BTreeSet::from(["ops".to_string()]), "the old name still works");
        let (_, denied) = c.exec_policy(&options(&[("user.checked_drivers", "java")])).unwrap();
        assert!(denied.is_empty(), "exec is not checked");
    }

    #[test]
    fn missing_roles_data_dir_and_servers_are_explained() {
        let e = resolve("data_dir = \"/a\"\n", AgentFlags::default()).unwrap_err().to_string();
        assert!(e.contains("Must specify either server, client or dev mode"), "{e}");
        let e = resolve("", AgentFlags { server: true, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("Must specify data directory"), "{e}");
        let e = resolve("data_dir = \"/a\"\n", AgentFlags { client: true, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("client.servers"), "{e}");
        let e = resolve("data_dir = \"/a\"\nbind_addr = \"nowhere\"\n", AgentFlags { server: true, ..Default::default() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("bind_addr"), "{e}");
        let e = resolve("data_dir = \"/a\"\nlog_level = \"LOUD\"\n", AgentFlags { server: true, ..Default::default() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("log_level"), "{e}");
    }

    #[test]
    fn max_heartbeats_per_second_must_be_a_positive_finite_number() {
        let with_rate = |r: f64| {
            let server = file::ServerBlock { max_heartbeats_per_second: Some(r), ..Default::default() };
            AgentConfig::from_parts(
                FileConfig { server: Some(server), ..Default::default() },
                &AgentFlags { dev: true, ..Default::default() },
                Some(PathBuf::from("/tmp/dev")),
            )
        };
        // NaN passed the old `<= 0` check, and every heartbeat's TTL then panicked.
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -1.0] {
            let e = with_rate(bad).unwrap_err().to_string();
            assert!(e.contains("server.max_heartbeats_per_second: must be a positive number"), "{bad}: {e}");
        }
        let ok = with_rate(100.0).unwrap();
        assert_eq!(ok.heartbeat().max_per_second, 100.0);
        ok.heartbeat().base_ttl(10_000);
    }

    #[test]
    fn csi_claim_gc_settings_reach_the_server_with_nomads_defaults() {
        let c = resolve("", AgentFlags { dev: true, ..Default::default() }).unwrap();
        let gc = &c.server.as_ref().unwrap().csi_claim_gc;
        assert_eq!((gc.interval.as_secs(), gc.threshold.as_secs()), (300, 300));
        assert_eq!(c.server.as_ref().unwrap().acl_token_gc.threshold.as_secs(), 3600);
        let c = resolve("server {\n  acl_token_gc_threshold = \"2h\"\n}\n", AgentFlags { dev: true, ..Default::default() }).unwrap();
        assert_eq!(c.server.as_ref().unwrap().acl_token_gc.threshold.as_secs(), 7200);
        let c = resolve(
            "server {\n  job_gc_interval = \"1m\"\n  job_gc_threshold = \"30m\"\n  batch_eval_gc_threshold = \"2h\"\n}\n",
            AgentFlags { dev: true, ..Default::default() },
        )
        .unwrap();
        let gc = &c.server.as_ref().unwrap().core_gc;
        assert_eq!((gc.interval.as_secs(), gc.job_threshold.as_secs(), gc.batch_eval_threshold.as_secs()), (60, 1800, 7200));
        assert_eq!((gc.eval_threshold.as_secs(), gc.node_threshold.as_secs()), (3600, 86_400), "Nomad's defaults for the rest");
        let err = resolve("server {\n  job_gc_interval = \"0s\"\n}\n", AgentFlags { dev: true, ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("job_gc_interval should be greater than 0s"), "{err}");
        let c = resolve(
            "server {\n  csi_volume_claim_gc_interval = \"3m\"\n  csi_volume_claim_gc_threshold = \"12h\"\n  csi_plugin_gc_threshold = \"12h\"\n}\n",
            AgentFlags { dev: true, ..Default::default() },
        )
        .unwrap();
        let gc = &c.server.as_ref().unwrap().csi_claim_gc;
        assert_eq!((gc.interval.as_secs(), gc.threshold.as_secs()), (180, 43_200));
        assert!(
            c.unused.iter().any(|u| u.starts_with("server.csi_plugin_gc_threshold: accepted for compatibility and not used")),
            "{:?}",
            c.unused
        );
        let e = resolve("server {\n  csi_volume_claim_gc_interval = \"0s\"\n}\n", AgentFlags { dev: true, ..Default::default() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.csi_volume_claim_gc_interval") && e.contains("should be greater than 0s"), "{e}");
    }

    #[test]
    fn job_max_count_reaches_the_server_and_is_bounded() {
        let c = resolve("", AgentFlags { dev: true, ..Default::default() }).unwrap();
        assert_eq!(c.server.as_ref().unwrap().job_max_count, nomad_proto::limits::DEFAULT_JOB_MAX_COUNT);
        let c = resolve("server {\n  job_max_count = 200\n}\n", AgentFlags { dev: true, ..Default::default() }).unwrap();
        assert_eq!(c.server.as_ref().unwrap().job_max_count, 200);
        assert_eq!(c.to_api_json()["Server"]["JobMaxCount"], 200);
        for bad in ["0", "-1", "10000001"] {
            let e = resolve(&format!("server {{\n  job_max_count = {bad}\n}}\n"), AgentFlags { dev: true, ..Default::default() })
                .unwrap_err()
                .to_string();
            assert!(e.contains("server.job_max_count") && e.contains("must be between 1 and 10000000"), "{bad}: {e}");
        }
    }

    #[test]
    fn limits_take_nomads_defaults_and_names_bad_values() {
        let c = resolve("", AgentFlags { dev: true, ..Default::default() }).unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(
            c.limits.http(),
            nomad_server::http::listener::HttpLimits { header_read_timeout: Some(Duration::from_secs(5)), max_conns_per_client: 100 }
        );
        assert_eq!(c.to_api_json()["Limits"]["HTTPMaxConnsPerClient"], 100);
        let c = resolve(
            "limits {\n  https_handshake_timeout = \"250ms\"\n  http_max_conns_per_client = 7\n  rpc_handshake_timeout = \"0s\"\n  rpc_max_conns_per_client = 0\n}\n",
            AgentFlags { dev: true, ..Default::default() },
        )
        .unwrap();
        assert_eq!(
            c.limits,
            Limits {
                https_handshake_timeout: Duration::from_millis(250),
                http_max_conns_per_client: 7,
                rpc_handshake_timeout: Duration::ZERO,
                rpc_max_conns_per_client: 0,
            }
        );
        let off = resolve(
            "limits {\n  https_handshake_timeout = \"0s\"\n  http_max_conns_per_client = 0\n}\n",
            AgentFlags { dev: true, ..Default::default() },
        )
        .unwrap();
        assert_eq!(off.limits.http(), nomad_server::http::listener::HttpLimits { header_read_timeout: None, max_conns_per_client: 0 });
        for (src, key, msg) in [
            ("http_max_conns_per_client = -1", "limits.http_max_conns_per_client", "must be >= 0; found: -1"),
            ("rpc_max_conns_per_client = 20", "limits.rpc_max_conns_per_client", "must be > 25; found: 20"),
            ("https_handshake_timeout = \"soon\"", "limits.https_handshake_timeout", "invalid duration"),
            ("rpc_handshake_timeout = \"-1s\"", "limits.rpc_handshake_timeout", "must not be negative"),
            ("http_max_conns = 1", "limits.http_max_conns", "unknown field"),
        ] {
            let e = resolve(&format!("limits {{\n  {src}\n}}\n"), AgentFlags { dev: true, ..Default::default() }).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(msg), "{src}: {e}");
        }
    }
}
