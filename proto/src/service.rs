//! Services, checks and Consul Connect blocks (`structs.Service`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Service provider: Nomad's built-in catalog.
pub const SERVICE_PROVIDER_NOMAD: &str = "nomad";
/// Service provider: Consul (Nomad's default).
pub const SERVICE_PROVIDER_CONSUL: &str = "consul";

/// A service advertised for a group or task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Service {
    /// Name (defaults to `<job>-<group>[-<task>]`).
    pub name: String,
    /// Task the service belongs to (group services may name one).
    pub task_name: String,
    /// Port label or number.
    pub port_label: String,
    /// `auto`, `host`, `driver` or `alloc`.
    pub address_mode: String,
    /// Custom address.
    pub address: String,
    /// Let Consul override tags.
    pub enable_tag_override: bool,
    /// Tags.
    pub tags: Vec<String>,
    /// Tags for canaries.
    pub canary_tags: Vec<String>,
    /// Health checks.
    pub checks: Vec<ServiceCheck>,
    /// Consul Connect.
    pub connect: Option<ConsulConnect>,
    /// Metadata.
    pub meta: BTreeMap<String, String>,
    /// Metadata for canaries.
    pub canary_meta: BTreeMap<String, String>,
    /// Tagged addresses.
    pub tagged_addresses: BTreeMap<String, String>,
    /// Consul namespace.
    pub namespace: String,
    /// `require_healthy`, `ignore_warnings` or `ignore`.
    pub on_update: String,
    /// `consul` or `nomad`.
    pub provider: String,
    /// The API's service-level `CheckRestart`: canonicalization merges it into every check
    /// (Nomad's `api.Service.Canonicalize`) and clears it, so it is never stored or sent.
    #[serde(skip_serializing)]
    pub check_restart: Option<CheckRestart>,
}

/// A health check of a service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceCheck {
    /// Name.
    pub name: String,
    /// `http`, `tcp`, `script`, `grpc`.
    #[serde(rename = "Type")]
    pub check_type: String,
    /// Script command.
    pub command: String,
    /// Script args.
    pub args: Vec<String>,
    /// HTTP path.
    pub path: String,
    /// `http` or `https`.
    pub protocol: String,
    /// Port label.
    pub port_label: String,
    /// Expose through the Connect proxy.
    pub expose: bool,
    /// Address mode.
    pub address_mode: String,
    /// Interval, ns.
    pub interval: i64,
    /// Timeout, ns.
    pub timeout: i64,
    /// Initial status.
    pub initial_status: String,
    /// Skip TLS verification.
    #[serde(rename = "TLSSkipVerify")]
    pub tls_skip_verify: bool,
    /// The TLS server name Consul checks with (Consul checks only).
    #[serde(rename = "TLSServerName")]
    pub tls_server_name: String,
    /// HTTP method.
    pub method: String,
    /// HTTP headers.
    pub header: BTreeMap<String, Vec<String>>,
    /// Restart the task on failing checks.
    pub check_restart: Option<CheckRestart>,
    /// gRPC service.
    #[serde(rename = "GRPCService")]
    pub grpc_service: String,
    /// gRPC over TLS.
    #[serde(rename = "GRPCUseTLS")]
    pub grpc_use_tls: bool,
    /// Task the check runs in.
    pub task_name: String,
    /// Passes needed before passing.
    pub success_before_passing: i64,
    /// Failures needed before critical.
    pub failures_before_critical: i64,
    /// HTTP body.
    pub body: String,
    /// Update behaviour.
    pub on_update: String,
}

impl ServiceCheck {
    /// Nomad's `ServiceCheck.Hash(serviceID)`: SHA-1 over the service ID and the check's fields
    /// in Nomad's order, hex. Optional fields are hashed only when set, so IDs stay what older
    /// Nomads made; durations are hashed as Go prints them.
    pub fn hash(&self, service_id: &str) -> String {
        use sha1::{Digest, Sha1};
        let go_duration = crate::validate::go_duration;
        let mut h = Sha1::new();
        for s in [
            service_id,
            &self.name,
            &self.check_type,
            &self.command,
            &self.args.concat(),
            &self.path,
            &self.protocol,
            &self.port_label,
            &go_duration(self.interval),
            &go_duration(self.timeout),
            &self.method,
            &self.body,
            &self.on_update,
        ] {
            h.update(s.as_bytes());
        }
        if self.tls_skip_verify {
            h.update(b"true");
        }
        if !self.tls_server_name.is_empty() {
            h.update(self.tls_server_name.as_bytes());
        }
        if !self.header.is_empty() {
            let mut headers: Vec<String> = self.header.iter().map(|(k, v)| format!("{k}{}", v.concat())).collect();
            headers.sort();
            h.update(headers.concat().as_bytes());
        }
        for s in [&self.address_mode, &self.grpc_service] {
            if !s.is_empty() {
                h.update(s.as_bytes());
            }
        }
        if self.grpc_use_tls {
            h.update(b"true");
        }
        if self.success_before_passing != 0 {
            h.update(format!("success:{}", self.success_before_passing).as_bytes());
        }
        if self.failures_before_critical != 0 {
            h.update(format!("failures:{}", self.failures_before_critical).as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Nomad's `NomadCheckID(allocID, group, check)`: MD5 over the alloc ID, the group and the
    /// check's task, name, type, port label, on_update and address mode, its interval and
    /// timeout (each as Go writes an int64 of nanoseconds in little-endian), protocol, path and
    /// method, hex. Identifies a Nomad-provider check across agent restarts and alloc updates.
    pub fn nomad_check_id(&self, alloc_id: &str, group: &str) -> String {
        use md5::{Digest, Md5};
        let mut h = Md5::new();
        for s in [alloc_id, group, &self.task_name, &self.name, &self.check_type, &self.port_label, &self.on_update, &self.address_mode] {
            h.update(s.as_bytes());
        }
        h.update(self.interval.to_le_bytes());
        h.update(self.timeout.to_le_bytes());
        for s in [&self.protocol, &self.path, &self.method] {
            h.update(s.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Nomad's `GetCheckMode`: `readiness` when `on_update = "ignore"` (its failures never hold
    /// a deployment back), else `healthiness`.
    pub fn nomad_check_mode(&self) -> &'static str {
        if self.on_update == "ignore" { "readiness" } else { "healthiness" }
    }
}

/// Restart a task when its checks fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CheckRestart {
    /// Failures before restart.
    pub limit: i64,
    /// Grace after start, ns.
    pub grace: i64,
    /// Treat warnings as passing.
    pub ignore_warnings: bool,
}

/// Nomad's `api.CheckRestart.Canonicalize` default grace: 1 s.
pub const DEFAULT_CHECK_RESTART_GRACE: i64 = 1_000_000_000;

impl Default for CheckRestart {
    /// No limit; a grace of 1 s when none is given (Nomad's canonicalized default).
    fn default() -> Self {
        CheckRestart { limit: 0, grace: DEFAULT_CHECK_RESTART_GRACE, ignore_warnings: false }
    }
}

impl CheckRestart {
    /// Nomad's `api.CheckRestart.Merge`: `o`'s positive limit, set grace and true
    /// ignore_warnings over `base`.
    pub fn merge(base: Option<&CheckRestart>, o: Option<&CheckRestart>) -> Option<CheckRestart> {
        let Some(base) = base else { return o.cloned() };
        let mut out = base.clone();
        if let Some(o) = o {
            if o.limit > 0 {
                out.limit = o.limit;
            }
            // The API's Grace is a pointer (nil: keep the service's); here a check that gives
            // none has the 1 s default, which therefore does not override.
            if o.grace != DEFAULT_CHECK_RESTART_GRACE {
                out.grace = o.grace;
            }
            if o.ignore_warnings {
                out.ignore_warnings = true;
            }
        }
        Some(out)
    }
}

/// The `connect {}` block of a service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulConnect {
    /// The task speaks Connect natively.
    pub native: bool,
    /// Sidecar service registration.
    pub sidecar_service: Option<ConsulSidecarService>,
    /// Overrides for the sidecar task.
    pub sidecar_task: Option<SidecarTask>,
    /// Gateway settings.
    pub gateway: Option<ConsulGateway>,
}

/// The sidecar service of a Connect service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulSidecarService {
    /// Tags.
    pub tags: Vec<String>,
    /// Port label.
    pub port: String,
    /// Proxy settings.
    pub proxy: Option<ConsulProxy>,
    /// Skip the default TCP check.
    #[serde(rename = "DisableDefaultTCPCheck")]
    pub disable_default_tcp_check: bool,
    /// Metadata.
    pub meta: BTreeMap<String, String>,
}

/// Envoy proxy settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulProxy {
    /// Address of the local service.
    pub local_service_address: String,
    /// Port of the local service.
    pub local_service_port: i64,
    /// Upstreams.
    pub upstreams: Vec<ConsulUpstream>,
    /// Exposed paths.
    pub expose: Option<serde_json::Value>,
    /// Opaque proxy config.
    pub config: BTreeMap<String, serde_json::Value>,
}

/// One upstream of a proxy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulUpstream {
    /// Destination service.
    pub destination_name: String,
    /// Destination namespace.
    pub destination_namespace: String,
    /// Local port.
    pub local_bind_port: i64,
    /// Datacenter.
    pub datacenter: String,
    /// Local address.
    pub local_bind_address: String,
    /// Mesh gateway mode.
    pub mesh_gateway: Option<serde_json::Value>,
    /// Opaque upstream config for Consul.
    pub config: BTreeMap<String, serde_json::Value>,
}

/// Overrides for a sidecar or gateway task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SidecarTask {
    /// Name.
    pub name: String,
    /// Driver.
    pub driver: String,
    /// User.
    pub user: String,
    /// Driver config.
    pub config: BTreeMap<String, serde_json::Value>,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Resources.
    pub resources: Option<crate::Resources>,
    /// Metadata.
    pub meta: BTreeMap<String, String>,
    /// Kill timeout, ns.
    pub kill_timeout: Option<i64>,
    /// Log rotation.
    pub log_config: Option<crate::LogConfig>,
    /// Shutdown delay, ns.
    pub shutdown_delay: Option<i64>,
    /// Kill signal.
    pub kill_signal: String,
}

/// A Connect gateway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulGateway {
    /// Envoy settings of the gateway.
    pub proxy: Option<serde_json::Value>,
    /// Ingress gateway config entry.
    pub ingress: Option<serde_json::Value>,
    /// Terminating gateway config entry.
    pub terminating: Option<ConsulTerminatingConfigEntry>,
    /// Mesh gateway.
    pub mesh: Option<serde_json::Value>,
}

/// The terminating-gateway config entry written to Consul.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulTerminatingConfigEntry {
    /// Linked services.
    pub services: Vec<ConsulLinkedService>,
}

/// A service behind a terminating gateway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ConsulLinkedService {
    /// Service name.
    pub name: String,
    /// CA file.
    #[serde(rename = "CAFile")]
    pub ca_file: String,
    /// Certificate file.
    pub cert_file: String,
    /// Key file.
    pub key_file: String,
    /// SNI.
    #[serde(rename = "SNI")]
    pub sni: String,
}
