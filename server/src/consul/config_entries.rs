//! The gateway config entries a job writes to Consul at register (Nomad's `Job.ConfigEntries`,
//! `convertIngressCE` and `convertTerminatingCE`), in Consul's `api` package shapes.

use std::collections::BTreeMap;

use nomad_proto::Job;
use serde::{Deserialize, Serialize};

/// `api.LinkedService`: a service behind a terminating gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct LinkedService {
    /// Service name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// CA file on the gateway's host.
    #[serde(rename = "CAFile", skip_serializing_if = "String::is_empty")]
    pub ca_file: String,
    /// Client certificate file.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cert_file: String,
    /// Client key file.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub key_file: String,
    /// SNI to send.
    #[serde(rename = "SNI", skip_serializing_if = "String::is_empty")]
    pub sni: String,
}

/// `api.TerminatingGatewayConfigEntry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TerminatingGatewayConfigEntry {
    /// `terminating-gateway`.
    pub kind: String,
    /// The gateway service's name.
    pub name: String,
    /// Consul namespace (omitted when empty).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Linked services.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<LinkedService>,
}

/// `api.GatewayTLSConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct GatewayTlsConfig {
    /// TLS on the listeners.
    pub enabled: bool,
    /// Lowest TLS version.
    #[serde(rename = "TLSMinVersion", skip_serializing_if = "String::is_empty")]
    pub tls_min_version: String,
    /// Highest TLS version.
    #[serde(rename = "TLSMaxVersion", skip_serializing_if = "String::is_empty")]
    pub tls_max_version: String,
    /// Cipher suites.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
}

/// `api.IngressService`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct IngressService {
    /// Service name.
    pub name: String,
    /// Hosts it answers for (`null` when none, as Go encodes a nil slice).
    pub hosts: Option<Vec<String>>,
}

/// `api.IngressListener`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct IngressListener {
    /// Port.
    pub port: i64,
    /// `tcp`, `http`, `http2` or `grpc`.
    pub protocol: String,
    /// Services on the listener.
    pub services: Option<Vec<IngressService>>,
}

/// `api.IngressGatewayConfigEntry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct IngressGatewayConfigEntry {
    /// `ingress-gateway`.
    pub kind: String,
    /// The gateway service's name.
    pub name: String,
    /// Consul namespace (omitted when empty).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// TLS (always sent: a struct in Go).
    #[serde(rename = "TLS")]
    pub tls: GatewayTlsConfig,
    /// Listeners (`null` when none, as Go encodes a nil slice).
    pub listeners: Option<Vec<IngressListener>>,
}

/// One config entry to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ConfigEntry {
    /// A terminating gateway's.
    Terminating(TerminatingGatewayConfigEntry),
    /// An ingress gateway's.
    Ingress(IngressGatewayConfigEntry),
}

impl ConfigEntry {
    /// Consul's kind.
    pub fn kind(&self) -> &str {
        match self {
            ConfigEntry::Terminating(e) => &e.kind,
            ConfigEntry::Ingress(e) => &e.kind,
        }
    }
    /// The gateway's name.
    pub fn name(&self) -> &str {
        match self {
            ConfigEntry::Terminating(e) => &e.name,
            ConfigEntry::Ingress(e) => &e.name,
        }
    }
    /// The Consul namespace it is written in (`?ns=`; empty: the agent's default).
    pub fn namespace(&self) -> &str {
        match self {
            ConfigEntry::Terminating(e) => &e.namespace,
            ConfigEntry::Ingress(e) => &e.namespace,
        }
    }
}

/// Nomad's `ConsulIngressConfigEntry` as the job carries it (`TLS`, `Listeners`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct IngressSpec {
    #[serde(rename = "TLS")]
    tls: Option<GatewayTlsConfig>,
    listeners: Vec<IngressListener>,
}

/// The group's Consul namespace (`group { consul { namespace } }`, Nomad's
/// `tg.Consul.GetNamespace()`; empty: the default).
pub fn group_namespace(group: &nomad_proto::TaskGroup) -> String {
    group_consul_namespace(group.consul.as_ref())
}

fn group_consul_namespace(consul: Option<&serde_json::Value>) -> String {
    let Some(serde_json::Value::Object(m)) = consul else { return String::new() };
    m.iter().find(|(k, _)| k.eq_ignore_ascii_case("namespace")).and_then(|(_, v)| v.as_str()).unwrap_or_default().to_string()
}

/// Every gateway config entry `job` defines, by namespace then gateway name (a later group's
/// gateway of the same name replaces an earlier one, as Nomad's map does). A service whose
/// gateway has both blocks writes its ingress entry, as Nomad does. `job` is the admitted job:
/// the Connect mutator has interpolated the gateways' names.
pub fn job_config_entries(job: &Job) -> Result<Vec<ConfigEntry>, String> {
    let mut entries: BTreeMap<(String, String, u8), ConfigEntry> = BTreeMap::new();
    for g in &job.task_groups {
        let ns = group_consul_namespace(g.consul.as_ref());
        for s in &g.services {
            let Some(gw) = s.connect.as_ref().and_then(|c| c.gateway.as_ref()) else { continue };
            if let Some(ingress) = &gw.ingress {
                let mut spec: IngressSpec = nomad_proto::lenient::from_value(ingress.clone())
                    .map_err(|e| format!("group {:?} service {:?}: the ingress gateway's config entry: {e}", g.name, s.name))?;
                // Nomad's API fills a listener's protocol (`ConsulIngressListener.Canonicalize`).
                for l in spec.listeners.iter_mut().filter(|l| l.protocol.is_empty()) {
                    l.protocol = "tcp".into();
                }
                let entry = IngressGatewayConfigEntry {
                    kind: "ingress-gateway".into(),
                    name: s.name.clone(),
                    namespace: ns.clone(),
                    tls: spec.tls.unwrap_or_default(),
                    listeners: (!spec.listeners.is_empty()).then_some(spec.listeners),
                };
                entries.insert((ns.clone(), s.name.clone(), 0), ConfigEntry::Ingress(entry));
            } else if let Some(term) = &gw.terminating {
                let entry = TerminatingGatewayConfigEntry {
                    kind: "terminating-gateway".into(),
                    name: s.name.clone(),
                    namespace: ns.clone(),
                    services: term
                        .services
                        .iter()
                        .map(|l| LinkedService {
                            name: l.name.clone(),
                            ca_file: l.ca_file.clone(),
                            cert_file: l.cert_file.clone(),
                            key_file: l.key_file.clone(),
                            sni: l.sni.clone(),
                        })
                        .collect(),
                };
                entries.insert((ns.clone(), s.name.clone(), 1), ConfigEntry::Terminating(entry));
            }
        }
    }
    Ok(entries.into_values().collect())
}
