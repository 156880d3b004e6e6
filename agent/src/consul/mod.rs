//! The agent's Consul HTTP client, shared by both roles: the calls the client role makes to
//! its local Consul agent ([`ConsulApi`]), and the ACL and config entry calls the server role
//! makes (`server.rs`: `nomad_server::consul::ConsulAcl` and `ConsulConfigEntries`).
//!
//! [`ConsulApi`] is the narrow seam the fingerprinter and the service sync loop use;
//! [`ConsulClient`] implements it over hyper against Consul's HTTP API. Every call carries the
//! configured `X-Consul-Token` (and basic auth, and `ns` for Consul Enterprise namespaces), is
//! bounded by the configured `timeout`, and a non-2xx answer comes back as
//! [`ConsulError::Status`] with Consul's status and body (`Unexpected response code: 403 (ACL
//! not found)`, as Consul's Go client words it).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod server;

use crate::cli::api::{encode_path, encode_query};
use crate::config::consul::ConsulSettings;

/// Largest answer read from Consul. `/v1/agent/services` on a busy node is a few hundred KiB.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A failed call to Consul.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ConsulError {
    /// Nothing answered at Consul's address.
    #[error("{method} {url}: cannot reach Consul: {reason}")]
    Connect { method: &'static str, url: String, reason: String },
    /// Consul did not answer in time.
    #[error("{method} {url}: Consul did not answer within {after:?}")]
    Timeout { method: &'static str, url: String, after: Duration },
    /// Consul answered with an error.
    #[error("{method} {url}: Unexpected response code: {code} ({body})")]
    Status { method: &'static str, url: String, code: u16, body: String },
    /// The answer was not what Consul sends.
    #[error("{method} {url}: decoding Consul's answer: {error}")]
    Decode { method: &'static str, url: String, error: String },
    /// Any other transport failure.
    #[error("{method} {url}: {error}")]
    Transport { method: &'static str, url: String, error: String },
}

impl ConsulError {
    /// The HTTP status Consul answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ConsulError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
    /// Whether Consul could not be reached at all (down, or not answering).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ConsulError::Connect { .. } | ConsulError::Timeout { .. } | ConsulError::Transport { .. })
    }
}

/// `api/agent.go` `AgentService`, as `/v1/agent/services` lists it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct AgentService {
    pub kind: String,
    #[serde(rename = "ID")]
    pub id: String,
    pub service: String,
    pub tags: Vec<String>,
    pub meta: BTreeMap<String, String>,
    pub port: i64,
    pub address: String,
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    pub enable_tag_override: bool,
    pub proxy: Option<ConnectProxyConfig>,
    pub connect: Option<Value>,
    pub namespace: String,
    pub datacenter: String,
}

/// `api/agent.go` `ServiceAddress`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceAddress {
    pub address: String,
    pub port: i64,
}

/// `api/agent.go` `AgentCheck`, as `/v1/agent/checks` lists it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct AgentCheck {
    pub node: String,
    #[serde(rename = "CheckID")]
    pub check_id: String,
    pub name: String,
    pub status: String,
    pub notes: String,
    pub output: String,
    #[serde(rename = "ServiceID")]
    pub service_id: String,
    pub service_name: String,
    #[serde(rename = "Type")]
    pub check_type: String,
    pub namespace: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// `api/agent.go` `AgentServiceRegistration` (what `PUT /v1/agent/service/register` takes).
/// Empty fields are left out, as Go's `omitempty` leaves them out.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceRegistration {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(rename = "ID", skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub address: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    #[serde(skip_serializing_if = "is_false")]
    pub enable_tag_override: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    pub checks: Vec<ServiceCheck>,
    /// A gateway's Envoy settings (`Proxy.Config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ConnectProxyConfig>,
    /// `Native`, or the sidecar Consul's agent registers beside the service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect: Option<ServiceConnect>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// `api/agent.go` `AgentServiceConnect`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceConnect {
    #[serde(skip_serializing_if = "is_false")]
    pub native: bool,
    /// Consul's agent expands it into the `<ID>-sidecar-proxy` service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar_service: Option<Box<ServiceRegistration>>,
}

/// `api/agent.go` `AgentServiceConnectProxyConfig`, as sent and as `/v1/agent/services` lists
/// it. `MeshGateway` and `Expose` are Go structs, which `omitempty` never leaves out: they are
/// always sent, `{}` when empty, as Nomad's Go client sends them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConnectProxyConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_service_name: String,
    #[serde(rename = "DestinationServiceID", skip_serializing_if = "String::is_empty")]
    pub destination_service_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_service_address: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub local_service_port: i64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<Upstream>,
    pub mesh_gateway: MeshGatewayConfig,
    pub expose: ExposeConfig,
}

/// `api/agent.go` `Upstream` (`DestinationName` has no `omitempty` in Go).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Upstream {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination_namespace: String,
    pub destination_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub datacenter: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub local_bind_address: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub local_bind_port: i64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, Value>,
    pub mesh_gateway: MeshGatewayConfig,
}

/// `api/config_entry.go` `MeshGatewayConfig` (`Mode` empty is Consul's default mode).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct MeshGatewayConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

/// `api/config_entry.go` `ExposeConfig`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExposeConfig {
    #[serde(skip_serializing_if = "is_false")]
    pub checks: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<ExposePath>,
}

/// `api/config_entry.go` `ExposePath`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ExposePath {
    #[serde(skip_serializing_if = "is_zero")]
    pub listener_port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub local_path_port: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(skip_serializing_if = "is_false")]
    pub parsed_from_check: bool,
}

/// `api/agent.go` `AgentServiceCheck`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceCheck {
    #[serde(rename = "CheckID", skip_serializing_if = "String::is_empty")]
    pub check_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interval: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub timeout: String,
    #[serde(rename = "TTL", skip_serializing_if = "String::is_empty")]
    pub ttl: String,
    #[serde(rename = "HTTP", skip_serializing_if = "String::is_empty")]
    pub http: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub header: BTreeMap<String, Vec<String>>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub method: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub body: String,
    #[serde(rename = "TCP", skip_serializing_if = "String::is_empty")]
    pub tcp: String,
    #[serde(rename = "GRPC", skip_serializing_if = "String::is_empty")]
    pub grpc: String,
    #[serde(rename = "GRPCUseTLS", skip_serializing_if = "is_false")]
    pub grpc_use_tls: bool,
    #[serde(rename = "TLSServerName", skip_serializing_if = "String::is_empty")]
    pub tls_server_name: String,
    #[serde(rename = "TLSSkipVerify", skip_serializing_if = "is_false")]
    pub tls_skip_verify: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub alias_service: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub notes: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub success_before_passing: i64,
    #[serde(skip_serializing_if = "is_zero")]
    pub failures_before_critical: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub deregister_critical_service_after: String,
}

/// A check status for `PUT /v1/agent/check/update/:id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckStatus {
    Passing,
    Warning,
    Critical,
}

impl CheckStatus {
    /// Consul's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Passing => "passing",
            CheckStatus::Warning => "warning",
            CheckStatus::Critical => "critical",
        }
    }
}

/// The Consul agent calls the Nomad client makes. Boxed futures so it can sit behind `dyn`.
pub trait ConsulApi: Send + Sync {
    /// `GET /v1/agent/self`: Consul's `map[string]map[string]interface{}`.
    fn agent_self(&self) -> BoxFuture<'_, Result<Value, ConsulError>>;
    /// `GET /v1/agent/services`.
    fn services(&self) -> BoxFuture<'_, Result<BTreeMap<String, AgentService>, ConsulError>>;
    /// `GET /v1/agent/service/:id` in Consul namespace `namespace` (empty: the configured one);
    /// an unknown ID is Consul's 404.
    fn service<'a>(&'a self, id: &'a str, namespace: &'a str) -> BoxFuture<'a, Result<AgentService, ConsulError>>;
    /// `GET /v1/agent/checks`.
    fn checks(&self) -> BoxFuture<'_, Result<BTreeMap<String, AgentCheck>, ConsulError>>;
    /// `PUT /v1/agent/service/register`.
    fn service_register<'a>(&'a self, reg: &'a ServiceRegistration) -> BoxFuture<'a, Result<(), ConsulError>>;
    /// `PUT /v1/agent/service/deregister/:id`.
    fn service_deregister<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ConsulError>>;
    /// `PUT /v1/agent/check/deregister/:id`.
    fn check_deregister<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ConsulError>>;
    /// `PUT /v1/agent/check/update/:id` (TTL checks).
    fn check_update<'a>(&'a self, id: &'a str, status: CheckStatus, output: &'a str) -> BoxFuture<'a, Result<(), ConsulError>>;
}

/// Blocking reads of Consul's KV store and catalog: what templates watch (`key`, `ls`,
/// `service`, ...). Apart from [`ConsulApi`] so the service sync's fakes need not grow.
pub trait ConsulQuery: Send + Sync {
    /// `GET path` (a path with its query, e.g. `/v1/kv/app?recurse`) as a blocking query from
    /// `index` (0: at once), held by Consul for at most `wait`: the JSON answer (`None` for
    /// Consul's 404) and its `X-Consul-Index`.
    fn query<'a>(&'a self, path: &'a str, index: u64, wait: Duration) -> BoxFuture<'a, Result<(Option<Value>, u64), ConsulError>>;
}

/// [`ConsulApi`] over HTTP.
#[derive(Clone)]
pub struct ConsulClient {
    base: String,
    token: String,
    basic_auth: Option<String>,
    namespace: String,
    timeout: Duration,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for ConsulClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("ConsulClient")
            .field("base", &self.base)
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn go_method(m: &Method) -> &'static str {
    match *m {
        Method::GET => "Get",
        Method::PUT => "Put",
        Method::DELETE => "Delete",
        Method::POST => "Post",
        _ => "Request",
    }
}

impl ConsulClient {
    /// A client for the agent's `consul {}` settings (already validated: plain http).
    pub fn new(settings: &ConsulSettings) -> ConsulClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(settings.timeout));
        let basic_auth =
            settings.auth.as_ref().map(|(u, p)| format!("Basic {}", crate::client::base64::encode(format!("{u}:{p}").as_bytes())));
        ConsulClient {
            base: format!("http://{}", settings.address),
            token: settings.token.clone(),
            basic_auth,
            namespace: settings.namespace.clone(),
            timeout: settings.timeout,
            http: HyperClient::builder(TokioExecutor::new()).build(connector),
        }
    }

    fn url(&self, path: &str) -> String {
        self.url_in(path, "")
    }

    /// The URL of `path` in Consul namespace `namespace` (`ns=`), or the configured one when
    /// empty, as the Go client's `WriteOptions.Namespace` overrides its config's.
    fn url_in(&self, path: &str, namespace: &str) -> String {
        let mut url = format!("{}{}", self.base, path);
        let ns = if namespace.is_empty() { &self.namespace } else { namespace };
        if !ns.is_empty() {
            url.push_str(if url.contains('?') { "&" } else { "?" });
            url.push_str(&format!("ns={}", encode_query(ns)));
        }
        url
    }

    /// One call, bounded by the timeout from connect to the last body byte.
    async fn call(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Bytes, ConsulError> {
        self.call_in(method, path, "", body).await
    }

    /// [`ConsulClient::call`] in Consul namespace `namespace` (empty: the configured one).
    pub(crate) async fn call_in(&self, method: Method, path: &str, namespace: &str, body: Option<Vec<u8>>) -> Result<Bytes, ConsulError> {
        let url = self.url_in(path, namespace);
        let gm = go_method(&method);
        let (status, _, bytes) = self.exchange(method, &url, body, self.timeout).await?;
        if !status.is_success() {
            return Err(ConsulError::Status {
                method: gm,
                url,
                code: status.as_u16(),
                body: String::from_utf8_lossy(&bytes).trim().to_string(),
            });
        }
        Ok(bytes)
    }

    /// One request to `url`, bounded by `timeout` from connect to the last body byte: the
    /// status, headers and body whatever the status.
    async fn exchange(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(http::StatusCode, http::HeaderMap, Bytes), ConsulError> {
        let gm = go_method(&method);
        let mut req = Request::builder().method(method).uri(url);
        if !self.token.is_empty() {
            req = req.header("X-Consul-Token", &self.token);
        }
        if let Some(a) = &self.basic_auth {
            req = req.header(http::header::AUTHORIZATION, a);
        }
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| ConsulError::Transport {
            method: gm,
            url: url.to_string(),
            error: e.to_string(),
        })?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| classify(gm, url, &e))?;
            let (parts, body) = resp.into_parts();
            let bytes = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| ConsulError::Transport { method: gm, url: url.to_string(), error: format!("reading the answer: {e}") })?
                .to_bytes();
            Ok((parts.status, parts.headers, bytes))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(ConsulError::Timeout { method: gm, url: url.to_string(), after: timeout }),
            Ok(r) => r,
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ConsulError> {
        let bytes = self.call(Method::GET, path, None).await?;
        nomad_proto::lenient::from_trusted_slice(&bytes).map_err(|e| ConsulError::Decode {
            method: "Get",
            url: self.url(path),
            error: e.to_string(),
        })
    }
}

/// Names the real cause of a hyper client error (refused, reset, ...).
fn classify(method: &'static str, url: &str, e: &hyper_util::client::legacy::Error) -> ConsulError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut reason = None;
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            reason = Some(match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => "connection reset by peer".to_string(),
                _ => io.to_string(),
            });
            break;
        }
        src = s.source();
    }
    // Without an io error, the whole chain (`client error (SendRequest): connection closed
    // before message completed` when Consul went away under a pooled connection).
    let reason = reason.unwrap_or_else(|| {
        let mut chain = e.to_string();
        let mut s = std::error::Error::source(e);
        while let Some(x) = s {
            chain.push_str(": ");
            chain.push_str(&x.to_string());
            s = x.source();
        }
        chain
    });
    if e.is_connect() {
        ConsulError::Connect { method, url: url.to_string(), reason }
    } else {
        ConsulError::Transport { method, url: url.to_string(), error: reason }
    }
}

impl ConsulApi for ConsulClient {
    fn agent_self(&self) -> BoxFuture<'_, Result<Value, ConsulError>> {
        Box::pin(async move {
            let bytes = self.call(Method::GET, "/v1/agent/self", None).await?;
            serde_json::from_slice(&bytes).map_err(|e| ConsulError::Decode {
                method: "Get",
                url: self.url("/v1/agent/self"),
                error: e.to_string(),
            })
        })
    }

    fn services(&self) -> BoxFuture<'_, Result<BTreeMap<String, AgentService>, ConsulError>> {
        Box::pin(self.get("/v1/agent/services"))
    }

    fn checks(&self) -> BoxFuture<'_, Result<BTreeMap<String, AgentCheck>, ConsulError>> {
        Box::pin(self.get("/v1/agent/checks"))
    }

    fn service<'a>(&'a self, id: &'a str, namespace: &'a str) -> BoxFuture<'a, Result<AgentService, ConsulError>> {
        Box::pin(async move {
            let path = format!("/v1/agent/service/{}", encode_path(id));
            let bytes = self.call_in(Method::GET, &path, namespace, None).await?;
            nomad_proto::lenient::from_trusted_slice(&bytes).map_err(|e| ConsulError::Decode {
                method: "Get",
                url: self.url_in(&path, namespace),
                error: e.to_string(),
            })
        })
    }

    fn service_register<'a>(&'a self, reg: &'a ServiceRegistration) -> BoxFuture<'a, Result<(), ConsulError>> {
        Box::pin(async move {
            let body = serde_json::to_vec(reg).map_err(|e| ConsulError::Transport {
                method: "Put",
                url: self.url("/v1/agent/service/register"),
                error: format!("encoding the registration: {e}"),
            })?;
            self.call(Method::PUT, "/v1/agent/service/register", Some(body)).await.map(drop)
        })
    }

    fn service_deregister<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ConsulError>> {
        Box::pin(async move { self.call(Method::PUT, &format!("/v1/agent/service/deregister/{}", encode_path(id)), None).await.map(drop) })
    }

    fn check_deregister<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ConsulError>> {
        Box::pin(async move { self.call(Method::PUT, &format!("/v1/agent/check/deregister/{}", encode_path(id)), None).await.map(drop) })
    }

    fn check_update<'a>(&'a self, id: &'a str, status: CheckStatus, output: &'a str) -> BoxFuture<'a, Result<(), ConsulError>> {
        Box::pin(async move {
            let body = serde_json::json!({"Status": status.as_str(), "Output": output}).to_string().into_bytes();
            self.call(Method::PUT, &format!("/v1/agent/check/update/{}", encode_path(id)), Some(body)).await.map(drop)
        })
    }
}

impl ConsulQuery for ConsulClient {
    fn query<'a>(&'a self, path: &'a str, index: u64, wait: Duration) -> BoxFuture<'a, Result<(Option<Value>, u64), ConsulError>> {
        Box::pin(async move {
            let sep = if path.contains('?') { '&' } else { '?' };
            let url = self.url(&format!("{path}{sep}index={index}&wait={}ms", wait.as_millis()));
            // Consul holds a blocking query for up to `wait` plus a sixteenth of jitter.
            let (status, headers, bytes) = self.exchange(Method::GET, &url, None, self.timeout + wait + wait / 16).await?;
            let index = headers.get("x-consul-index").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
            if status == http::StatusCode::NOT_FOUND {
                return Ok((None, index));
            }
            if !status.is_success() {
                return Err(ConsulError::Status {
                    method: "Get",
                    url,
                    code: status.as_u16(),
                    body: String::from_utf8_lossy(&bytes).trim().to_string(),
                });
            }
            let value = serde_json::from_slice(&bytes).map_err(|e| ConsulError::Decode { method: "Get", url, error: e.to_string() })?;
            Ok((Some(value), index))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};

    use super::*;

    fn settings(addr: &str, token: &str) -> ConsulSettings {
        ConsulSettings { address: addr.to_string(), token: token.to_string(), timeout: Duration::from_secs(5), ..ConsulSettings::default() }
    }

    fn web() -> ServiceRegistration {
        ServiceRegistration {
            id: "_nomad-task-a1-web-web-http".into(),
            name: "web".into(),
            tags: vec!["v1".into()],
            port: 8080,
            address: "10.0.0.5".into(),
            meta: BTreeMap::from([("external-source".into(), "nomad".into())]),
            tagged_addresses: BTreeMap::from([("lan".into(), ServiceAddress { address: "10.0.0.5".into(), port: 8080 })]),
            checks: vec![
                ServiceCheck { check_id: "_nomad-check-ttl".into(), name: "alive".into(), ttl: "30s".into(), ..Default::default() },
                ServiceCheck {
                    check_id: "_nomad-check-http".into(),
                    name: "http".into(),
                    http: "http://127.0.0.1:1/health".into(),
                    interval: "10s".into(),
                    timeout: "2s".into(),
                    header: BTreeMap::from([("X-A".into(), vec!["b".into()])]),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    /// A template's read: a 404 is an answer (the key is not there), and a blocking query from
    /// the index seen returns when the key is written, with the new index.
    #[tokio::test]
    async fn a_blocking_kv_query_returns_when_the_key_changes() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let c = Arc::new(ConsulClient::new(&settings(&standin.addr().to_string(), "")));
        let (absent, index) = c.query("/v1/kv/app/x", 0, Duration::from_secs(5)).await.unwrap();
        assert_eq!(absent, None);
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.query("/v1/kv/app/x", index, Duration::from_secs(30)).await }
        });
        c.call(Method::PUT, "/v1/kv/app/x", Some(b"v1".to_vec())).await.unwrap();
        let (answer, new_index) = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap().unwrap();
        assert!(new_index > index, "{new_index} > {index}");
        assert_eq!(answer.unwrap()[0]["Value"], crate::client::base64::encode(b"v1"));
        let asked = standin.calls_to("GET", "/v1/kv/app/x");
        assert_eq!(asked[1].query, format!("index={index}&wait=30000ms"));
    }

    #[tokio::test]
    async fn registrations_round_trip_through_consuls_decoder() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let c = ConsulClient::new(&settings(&standin.addr().to_string(), ""));
        assert_eq!(c.agent_self().await.unwrap()["Config"]["Version"], "1.16.1");
        // The stand-in refuses unknown keys as Consul does, so a 200 means every key is Consul's.
        c.service_register(&web()).await.unwrap();
        let body = standin.calls_to("PUT", "/v1/agent/service/register")[0].json();
        assert!(body.get("Kind").is_none() && body.get("Proxy").is_none(), "empty fields are omitted: {body}");
        let services = c.services().await.unwrap();
        let s = &services["_nomad-task-a1-web-web-http"];
        assert_eq!((s.service.as_str(), s.port, s.address.as_str()), ("web", 8080, "10.0.0.5"));
        assert_eq!(s.tags, ["v1"]);
        assert_eq!(s.meta["external-source"], "nomad");
        assert_eq!(s.tagged_addresses["lan"], ServiceAddress { address: "10.0.0.5".into(), port: 8080 });
        let checks = c.checks().await.unwrap();
        assert_eq!(checks["_nomad-check-ttl"].status, "critical");
        assert_eq!(checks["_nomad-check-http"].check_type, "http");
        assert_eq!(checks["_nomad-check-ttl"].service_id, "_nomad-task-a1-web-web-http");

        c.check_update("_nomad-check-ttl", CheckStatus::Passing, "ok").await.unwrap();
        let ttl = &c.checks().await.unwrap()["_nomad-check-ttl"];
        assert_eq!((ttl.status.as_str(), ttl.output.as_str()), ("passing", "ok"));

        c.service_deregister("_nomad-task-a1-web-web-http").await.unwrap();
        assert!(c.services().await.unwrap().is_empty());
        let err = c.service_deregister("_nomad-task-a1-web-web-http").await.unwrap_err();
        assert_eq!(err.status(), Some(404));
        assert!(
            err.to_string().ends_with(
                "Unexpected response code: 404 (Unknown service ID \"_nomad-task-a1-web-web-http\". Ensure that the service ID is passed, not the service name.)"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn one_service_is_read_with_its_proxy_in_a_namespace_and_an_unknown_one_is_consuls_404() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let c = ConsulClient::new(&settings(&standin.addr().to_string(), ""));
        let reg = ServiceRegistration {
            id: "web-1".into(),
            name: "web".into(),
            port: 8080,
            connect: Some(ServiceConnect {
                native: false,
                sidecar_service: Some(Box::new(ServiceRegistration {
                    proxy: Some(ConnectProxyConfig {
                        config: [("envoy_stats_tags".to_string(), serde_json::json!(["a=b"]))].into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        };
        c.service_register(&reg).await.unwrap();
        let proxy = c.service("web-1-sidecar-proxy", "team").await.unwrap();
        assert_eq!((proxy.kind.as_str(), proxy.service.as_str(), proxy.datacenter.as_str()), ("connect-proxy", "web-sidecar-proxy", "dc1"));
        let p = proxy.proxy.unwrap();
        assert_eq!(p.destination_service_name, "web");
        assert_eq!(p.config["envoy_stats_tags"], serde_json::json!(["a=b"]));
        let call = standin.calls_to("GET", "/v1/agent/service/").pop().unwrap();
        assert_eq!((call.path.as_str(), call.query.as_str()), ("/v1/agent/service/web-1-sidecar-proxy", "ns=team"));
        let err = c.service("nope", "").await.unwrap_err();
        assert_eq!(err.status(), Some(404));
        assert!(err.to_string().ends_with("Unexpected response code: 404 (unknown service ID: nope)"), "{err}");
    }

    #[tokio::test]
    async fn the_token_is_sent_and_refusals_carry_consuls_words() {
        let standin = ConsulStandIn::start(ConsulOptions { management_token: Some("root".into()), ..Default::default() }).unwrap();
        let anonymous = ConsulClient::new(&settings(&standin.addr().to_string(), ""));
        let err = anonymous.service_register(&web()).await.unwrap_err();
        assert_eq!(err.status(), Some(403));
        assert!(err.to_string().contains("(Permission denied: anonymous token lacks permission 'service:write' on \"web\")"), "{err}");
        let wrong = ConsulClient::new(&settings(&standin.addr().to_string(), "nope"));
        assert!(wrong.agent_self().await.unwrap_err().to_string().ends_with("Unexpected response code: 403 (ACL not found)"));
        let root = ConsulClient::new(&settings(&standin.addr().to_string(), "root"));
        root.service_register(&web()).await.unwrap();
        assert!(standin.has_service("_nomad-task-a1-web-web-http"));
    }

    #[tokio::test]
    async fn an_absent_or_silent_consul_is_an_error_not_a_hang() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let addr = standin.addr().to_string();
        standin.stop();
        let err = ConsulClient::new(&settings(&addr, "")).agent_self().await.unwrap_err();
        assert!(matches!(err, ConsulError::Connect { .. }) && err.is_unreachable(), "{err:?}");
        assert!(err.to_string().contains("connection refused"), "{err}");

        // A listener that never answers: the kernel accepts, nothing replies.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = settings(&silent.local_addr().unwrap().to_string(), "");
        s.timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let err = ConsulClient::new(&s).services().await.unwrap_err();
        assert!(matches!(err, ConsulError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
