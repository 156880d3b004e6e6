//! One run of a Nomad check (Nomad's `checks.checker`): a TCP dial or an HTTP request from the
//! client process, at most the check's `timeout` (HTTP also at most 10 minutes, as Nomad).

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{HeaderName, HeaderValue, USER_AGENT};
use nomad_proto::{Allocation, Node};

use super::{CheckQueryResult, CheckStatus, NomadCheck, unix_now};
use crate::client::consul::services::{http_check_url, join_host_port};
use crate::client::services::get_address;

/// Nomad's `outputSizeLimit`: how much of a response body becomes the output.
pub const OUTPUT_LIMIT: usize = 3 * 1024;
/// Nomad's `maxTimeoutHTTP`.
const MAX_HTTP_TIMEOUT: Duration = Duration::from_secs(600);

/// The User-Agent sent unless the check gives one (Nomad sends its `useragent.String()`).
pub fn user_agent() -> String {
    format!("nomad-rs/{} (+https://www.nomadproject.io/; rust)", env!("CARGO_PKG_VERSION"))
}

type HttpClient = hyper_util::client::legacy::Client<crate::tls::AgentConnector, Full<Bytes>>;

/// One pooled client for every check (https against the host's roots, as Go's default client).
fn client() -> &'static HttpClient {
    static CLIENT: OnceLock<HttpClient> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let connector = crate::tls::ClientTls::default()
            .connector(http.clone(), true)
            .or_else(|e| {
                tracing::error!(error = %format!("{e:#}"), "TLS for https checks: the host's roots could not be loaded");
                crate::tls::ClientTls::default().connector(http, false)
            })
            .expect("a TLS config without files");
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector)
    })
}

/// Where a check probes: `host:port` by its `address_mode` (`host` by default, `auto` when the
/// service has an `address`) and its port label (the service's when it has none).
pub fn address(check: &NomadCheck, alloc: &Allocation, node: &Node) -> Result<String, String> {
    let mode = match check.check.address_mode.as_str() {
        "" if !check.custom_address.is_empty() => "auto",
        "" => "host",
        m => m,
    };
    let label = if check.check.port_label.is_empty() { &check.service_port_label } else { &check.check.port_label };
    let (host, port) = get_address(alloc, node, &check.task, mode, label, &check.custom_address)?;
    Ok(if port > 0 { join_host_port(&host, port) } else { host })
}

/// Runs `check` once against `alloc` on `node`.
pub async fn run(check: &NomadCheck, alloc: &Allocation, node: &Node) -> CheckQueryResult {
    let timeout = Duration::from_nanos(check.check.timeout.max(0) as u64);
    let addr = match address(check, alloc, node) {
        Ok(a) => a,
        Err(e) => return check.result(CheckStatus::Failure, 0, e, unix_now()),
    };
    let (status, code, output) = match check.check.check_type.as_str() {
        "http" => http(check, &addr, timeout.min(MAX_HTTP_TIMEOUT)).await,
        _ => tcp(&addr, timeout).await,
    };
    check.result(status, code, output, unix_now())
}

/// A TCP dial (Nomad's `checkTCP`); the output of a failure is the dial error.
pub async fn tcp(addr: &str, timeout: Duration) -> (CheckStatus, u16, String) {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => (CheckStatus::Success, 0, "nomad: tcp ok".into()),
        Ok(Err(e)) => (CheckStatus::Failure, 0, format!("dial tcp {addr}: {e}")),
        Err(_) => (CheckStatus::Failure, 0, format!("dial tcp {addr}: i/o timeout")),
    }
}

/// An HTTP request (Nomad's `checkHTTP`).
pub async fn http(check: &NomadCheck, addr: &str, timeout: Duration) -> (CheckStatus, u16, String) {
    let c = &check.check;
    let protocol = if c.protocol.is_empty() { "http" } else { c.protocol.as_str() };
    let url = match http_check_url(protocol, addr, &c.path) {
        Ok(u) => u,
        Err(e) => return (CheckStatus::Failure, 0, format!("nomad: {e}")),
    };
    let method = if c.method.is_empty() { "GET" } else { c.method.as_str() };
    let request = build_request(method, &url, &c.header, &c.body);
    let request = match request {
        Ok(r) => r,
        Err(e) => return (CheckStatus::Failure, 0, format!("nomad: {e}")),
    };
    let work = async {
        let resp = client().request(request).await.map_err(|e| error_chain(&e))?;
        let code = resp.status().as_u16();
        if code == 200 {
            return Ok::<_, String>((CheckStatus::Success, code, "nomad: http ok".to_string()));
        }
        let status = if code < 400 { CheckStatus::Success } else { CheckStatus::Failure };
        Ok((status, code, read_capped(resp.into_body()).await))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => (CheckStatus::Failure, 0, format!("nomad: {method} {url:?}: {e}")),
        Err(_) => (CheckStatus::Failure, 0, format!("nomad: {method} {url:?}: context deadline exceeded")),
    }
}

fn build_request(
    method: &str,
    url: &str,
    headers: &std::collections::BTreeMap<String, Vec<String>>,
    body: &str,
) -> Result<Request<Full<Bytes>>, String> {
    let method = hyper::Method::from_bytes(method.as_bytes()).map_err(|e| format!("invalid method {method:?}: {e}"))?;
    let mut req = Request::builder().method(method).uri(url).body(Full::new(Bytes::from(body.to_string()))).map_err(|e| e.to_string())?;
    for (name, values) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("invalid header name {name:?}: {e}"))?;
        for v in values {
            let value = HeaderValue::from_str(v).map_err(|e| format!("invalid value of header {name}: {e}"))?;
            // A `Host` header is the request's Host, as Nomad sets `request.Host`.
            req.headers_mut().append(name.clone(), value);
        }
    }
    if !req.headers().contains_key(USER_AGENT) {
        req.headers_mut().insert(USER_AGENT, HeaderValue::from_str(&user_agent()).map_err(|e| e.to_string())?);
    }
    Ok(req)
}

/// The first [`OUTPUT_LIMIT`] bytes of a body; the rest is never read.
async fn read_capped(mut body: hyper::body::Incoming) -> String {
    let mut out = Vec::with_capacity(OUTPUT_LIMIT);
    while out.len() < OUTPUT_LIMIT {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let take = data.len().min(OUTPUT_LIMIT - out.len());
                    out.extend_from_slice(&data[..take]);
                }
            }
            Some(Err(e)) => return format!("nomad: {}", error_chain(&e)),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An error with its causes, as Go's wrapped errors read.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}
