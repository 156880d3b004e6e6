//! The routes every agent answers about itself, whatever roles it runs, never forwarded:
//!
//! - `GET /v1/agent/servers`: the RPC addresses the client role uses (sorted), and
//!   `PUT|POST /v1/agent/servers?address=a&address=b`: replace them. 501 without a client role,
//!   as Nomad's agent answers.
//! - `GET /v1/metrics`: the agent's figures in go-metrics' JSON (`crate::metrics`), or
//!   `?format=prometheus` when `telemetry { prometheus_metrics = true }` (415 otherwise, as Nomad).
//! - `GET /v1/agent/monitor?log_level=&log_json=&plain=`: the agent's log lines as they happen,
//!   in Nomad's stream frames (`{"Data": <base64>, "FileEvent": "log"}`, `{}` heartbeats each
//!   second) or, with `plain=true`, as text.
//! - On an agent without the server role, `/v1/agent/join` and `/v1/agent/force-leave` answer
//!   501 here (a client is never asked to change the servers' membership through its server).
//!
//! The agent puts these behind the same authorization table as its other routes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use serde_json::json;

use super::util::{HttpError, QueryOptions, json_response, parse_bool, require_method};
use crate::consensus::BoxFuture;
use crate::log_hub::LogHub;
use crate::metrics::{MetricsSnapshot, MetricsSource, interval_timestamp};

/// Every route of [`router`] (the authorization table is checked against them).
pub const LOCAL_ROUTE_PATHS: &[&str] =
    &["/v1/agent/servers", "/v1/metrics", "/v1/agent/monitor", "/v1/agent/join", "/v1/agent/force-leave"];

/// Addresses one `PUT /v1/agent/servers` may name at most.
pub const MAX_SERVER_ADDRESSES: usize = 64;
/// Longest server address accepted.
pub const MAX_ADDRESS_BYTES: usize = 256;
/// Heartbeat frames go out this often on an idle JSON monitor (Nomad's framer: 1 s).
const MONITOR_HEARTBEAT: Duration = Duration::from_secs(1);
/// Bytes of log lines one frame carries at most (Nomad's framer: 1024).
const FRAME_BYTES: usize = 1024;

/// The client role's server list.
pub trait ClientServers: Send + Sync {
    /// The servers the client uses now.
    fn servers(&self) -> Vec<String>;
    /// Replaces them with those of `addrs` that resolve and answer; how many were kept, or why
    /// none was (Nomad's text).
    fn set_servers(&self, addrs: Vec<String>) -> BoxFuture<'_, Result<usize, String>>;
}

/// What the agent-wide routes need.
#[derive(Clone)]
pub struct AgentLocal {
    /// The client role's servers; `None` without a client role.
    pub client_servers: Option<Arc<dyn ClientServers>>,
    /// The client role's node ID (`/v1/agent/monitor?node_id=` may name it).
    pub node_id: Option<String>,
    /// This server's member name (`<name>.<region>`), with the server role.
    pub server_name: Option<String>,
    /// The server role runs here and serves `/v1/agent/join` and `/v1/agent/force-leave`.
    pub server_role: bool,
    /// Where `/v1/metrics` reads figures from.
    pub metrics: Vec<MetricsSource>,
    /// The `host` label of gauges (go-metrics' hostname).
    pub host: String,
    /// `telemetry { prometheus_metrics }`.
    pub prometheus: bool,
    /// The log lines `/v1/agent/monitor` streams.
    pub logs: Arc<LogHub>,
}

/// The routes (no fallback, so the agent merges them beside its others).
pub fn router(local: AgentLocal) -> Router {
    let server_role = local.server_role;
    let routes =
        Router::new().route("/v1/agent/servers", any(servers)).route("/v1/metrics", any(metrics)).route("/v1/agent/monitor", any(monitor));
    let routes = if server_role {
        routes
    } else {
        routes.route("/v1/agent/join", any(no_server_role)).route("/v1/agent/force-leave", any(no_server_role))
    };
    routes.with_state(Arc::new(local))
}

/// Nomad's answer where the agent lacks the role a route needs.
fn not_implemented() -> HttpError {
    HttpError { code: StatusCode::NOT_IMPLEMENTED, message: "Invalid method".into() }
}

async fn no_server_role(method: Method) -> Response {
    match require_method(&method, &[Method::PUT, Method::POST]) {
        Ok(()) => not_implemented().into_response(),
        Err(e) => e.into_response(),
    }
}

async fn servers(State(local): State<Arc<AgentLocal>>, method: Method, uri: Uri) -> Response {
    super::respond(async {
        let write = match method {
            Method::GET => false,
            Method::PUT | Method::POST => true,
            _ => return Err(HttpError::invalid_method()),
        };
        let client = local.client_servers.as_ref().ok_or_else(not_implemented)?;
        let q = QueryOptions::parse(&uri)?;
        if !write {
            let mut list = client.servers();
            list.sort();
            return json_response(&list, None, q.pretty);
        }
        let addrs: Vec<String> = q.multi.get("address").cloned().unwrap_or_default().into_iter().filter(|a| !a.is_empty()).collect();
        if addrs.is_empty() {
            return Err(HttpError::bad_request("missing server address"));
        }
        if addrs.len() > MAX_SERVER_ADDRESSES {
            return Err(HttpError::bad_request(format!("too many server addresses: {} (at most {MAX_SERVER_ADDRESSES})", addrs.len())));
        }
        if let Some(long) = addrs.iter().find(|a| a.len() > MAX_ADDRESS_BYTES) {
            let start: String = long.chars().take(32).collect();
            return Err(HttpError::bad_request(format!("server address {start:?}... is longer than {MAX_ADDRESS_BYTES} bytes")));
        }
        client.set_servers(addrs).await.map_err(HttpError::bad_request)?;
        Ok(StatusCode::OK.into_response())
    })
    .await
}

async fn metrics(State(local): State<Arc<AgentLocal>>, method: Method, uri: Uri) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let snapshot = MetricsSnapshot::gather(&local.host, &local.metrics);
        if q.params.get("format").is_some_and(|f| f == "prometheus") {
            if !local.prometheus {
                return Err(HttpError { code: StatusCode::UNSUPPORTED_MEDIA_TYPE, message: "Prometheus is not enabled".into() });
            }
            let mut r = Response::new(Body::from(snapshot.to_prometheus()));
            r.headers_mut().insert("content-type", HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
            return Ok(r);
        }
        json_response(&snapshot.to_json(&interval_timestamp(std::time::SystemTime::now())), None, q.pretty)
    })
    .await
}

/// hclog's `LevelFromString`: `Some(None)` for `off`, `None` for no level.
fn hclog_level(s: &str) -> Option<Option<tracing::Level>> {
    match s.trim().to_ascii_lowercase().as_str() {
        "trace" => Some(Some(tracing::Level::TRACE)),
        "debug" => Some(Some(tracing::Level::DEBUG)),
        "info" => Some(Some(tracing::Level::INFO)),
        "warn" => Some(Some(tracing::Level::WARN)),
        "error" => Some(Some(tracing::Level::ERROR)),
        "off" => Some(None),
        _ => None,
    }
}

/// A boolean monitor option, with Nomad's error (`Unknown option for <what>: strconv.ParseBool: ...`).
fn monitor_bool(q: &QueryOptions, key: &str, what: &str) -> Result<bool, HttpError> {
    match q.params.get(key).filter(|v| !v.is_empty()) {
        None => Ok(false),
        Some(v) => parse_bool(v).ok_or_else(|| {
            HttpError::bad_request(format!("Unknown option for {what}: strconv.ParseBool: parsing {}: invalid syntax", go_quote(v)))
        }),
    }
}

/// Go's `%q` of a string, near enough for an error message.
pub fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

async fn monitor(State(local): State<Arc<AgentLocal>>, method: Method, uri: Uri) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let level_text = q.params.get("log_level").filter(|l| !l.is_empty()).map_or("INFO", String::as_str);
        let level = hclog_level(level_text).ok_or_else(|| HttpError::bad_request(format!("Unknown log level: {level_text}")))?;
        let json = monitor_bool(&q, "log_json", "log json")?;
        let plain = monitor_bool(&q, "plain", "plain")?;
        let node_id = q.params.get("node_id").filter(|v| !v.is_empty());
        let server_id = q.params.get("server_id").filter(|v| !v.is_empty());
        if node_id.is_some() && server_id.is_some() {
            return Err(HttpError::bad_request("Cannot target node and server simultaneously"));
        }
        // nomad-rs streams only the agent asked; another agent is asked directly.
        if let Some(id) = node_id
            && local.node_id.as_deref() != Some(id.as_str())
        {
            return Err(HttpError::bad_request(format!(
                "node {id:?} is not this agent's client: monitoring another agent through this one is not supported; ask that node's agent"
            )));
        }
        if let Some(id) = server_id
            && !local.server_name.as_deref().is_some_and(|name| name == id || name.split_once('.').is_some_and(|(short, _)| short == id))
        {
            return Err(HttpError::bad_request(format!(
                "server {id:?} is not this agent: monitoring another agent through this one is not supported; ask that server's agent"
            )));
        }
        let subscription = match level {
            Some(level) => Some(
                local
                    .logs
                    .subscribe(level, json)
                    .map_err(|e| HttpError { code: StatusCode::SERVICE_UNAVAILABLE, message: e.to_string() })?,
            ),
            None => None,
        };
        let stream = futures::stream::unfold((subscription, plain), |(mut sub, plain)| async move {
            let chunk = next_chunk(sub.as_mut(), plain).await;
            Some((Ok::<Bytes, std::io::Error>(chunk), (sub, plain)))
        });
        let mut r = Response::new(Body::from_stream(stream));
        let content_type = if plain { "text/plain" } else { "application/json" };
        r.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
        Ok(r)
    })
    .await
}

/// The next piece of a monitor's body: the lines queued now (up to a frame's worth), framed
/// unless `plain`; on a second without lines, a heartbeat frame (nothing in plain text, which
/// has none, so the wait goes on).
async fn next_chunk(mut sub: Option<&mut crate::log_hub::Subscription>, plain: bool) -> Bytes {
    loop {
        let first = match sub.as_deref_mut() {
            Some(s) => tokio::time::timeout(MONITOR_HEARTBEAT, s.next_line()).await.ok().flatten(),
            None => {
                tokio::time::sleep(MONITOR_HEARTBEAT).await;
                None
            }
        };
        let Some(first) = first else {
            if plain {
                continue;
            }
            return Bytes::from_static(b"{}");
        };
        let mut data = BytesMut::from(&first[..]);
        if let Some(s) = sub.as_deref_mut() {
            while data.len() < FRAME_BYTES {
                match s.try_next_line() {
                    Some(line) => data.extend_from_slice(&line),
                    None => break,
                }
            }
        }
        if plain {
            return data.freeze();
        }
        let frame = json!({ "Data": base64::engine::general_purpose::STANDARD.encode(&data), "FileEvent": "log" });
        return Bytes::from(serde_json::to_vec(&frame).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests;
