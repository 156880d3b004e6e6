//! The HTTP API client behind every command except `agent`.
//!
//! Settings come from the `-address`, `-region`, `-namespace` and `-token`
//! flags, then `NOMAD_ADDR`, `NOMAD_REGION`, `NOMAD_NAMESPACE` and
//! `NOMAD_TOKEN`, then the default address `http://127.0.0.1:4646`. The token
//! travels in `X-Nomad-Token`; region and namespace as query parameters, the
//! way Nomad's Go client sends them. Reads can block (`index`, `wait`) and
//! return the `X-Nomad-Index` they were answered at.
//!
//! Errors read like the Go client's (`Unexpected response code: 404 (job not
//! found)`), and a connection failure says what to check.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The default API address.
pub const DEFAULT_ADDRESS: &str = "http://127.0.0.1:4646";

/// How long a non-blocking request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Extra time a blocking query gets beyond its `wait` (the server adds jitter).
const BLOCKING_SLACK: Duration = Duration::from_secs(30);

/// Flags every API command takes (Nomad's "general options").
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct ApiFlags {
    /// Address of the nomad-rs (or Nomad) HTTP API [env: NOMAD_ADDR; default: http://127.0.0.1:4646].
    #[arg(long, value_name = "ADDR", global = true)]
    pub address: Option<String>,
    /// Region to send requests to [env: NOMAD_REGION].
    #[arg(long, value_name = "REGION", global = true)]
    pub region: Option<String>,
    /// Namespace to use [env: NOMAD_NAMESPACE; default: default].
    #[arg(long, value_name = "NAMESPACE", global = true)]
    pub namespace: Option<String>,
    /// ACL token [env: NOMAD_TOKEN].
    #[arg(long, value_name = "TOKEN", global = true)]
    pub token: Option<String>,
    /// Disable colored output.
    #[arg(long = "no-color", global = true)]
    pub no_color: bool,
    /// CA certificate file to verify the agent's certificate with [env: NOMAD_CACERT].
    #[arg(long = "ca-cert", value_name = "FILE", global = true)]
    pub ca_cert: Option<String>,
    /// Directory of CA certificates [env: NOMAD_CAPATH].
    #[arg(long = "ca-path", value_name = "DIR", global = true)]
    pub ca_path: Option<String>,
    /// Client certificate for TLS authentication [env: NOMAD_CLIENT_CERT].
    #[arg(long = "client-cert", value_name = "FILE", global = true)]
    pub client_cert: Option<String>,
    /// Client key for TLS authentication [env: NOMAD_CLIENT_KEY].
    #[arg(long = "client-key", value_name = "FILE", global = true)]
    pub client_key: Option<String>,
    /// Server name the agent's certificate is checked for [env: NOMAD_TLS_SERVER_NAME].
    #[arg(long = "tls-server-name", value_name = "NAME", global = true)]
    pub tls_server_name: Option<String>,
    /// Do not verify the agent's certificate (not recommended) [env: NOMAD_SKIP_VERIFY].
    #[arg(long = "tls-skip-verify", global = true)]
    pub tls_skip_verify: bool,
}

/// Resolved client settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Base address, e.g. `http://127.0.0.1:4646`.
    pub address: String,
    /// Token, if any.
    pub token: Option<String>,
    /// Namespace, if set (the server defaults to `default`).
    pub namespace: Option<String>,
    /// Region, if set.
    pub region: Option<String>,
    /// TLS settings for an `https://` address.
    pub tls: crate::tls::ClientTls,
}

impl ApiConfig {
    /// Flags first, then the environment (`env` looks a variable up), then defaults.
    pub fn resolve(flags: &ApiFlags, env: impl Fn(&str) -> Option<String>) -> ApiConfig {
        let pick = |flag: &Option<String>, var: &str| flag.clone().filter(|v| !v.is_empty()).or_else(|| env(var).filter(|v| !v.is_empty()));
        ApiConfig {
            address: pick(&flags.address, "NOMAD_ADDR").unwrap_or_else(|| DEFAULT_ADDRESS.to_string()),
            token: pick(&flags.token, "NOMAD_TOKEN").map(|t| t.trim().to_string()),
            namespace: pick(&flags.namespace, "NOMAD_NAMESPACE"),
            region: pick(&flags.region, "NOMAD_REGION"),
            tls: crate::tls::ClientTls {
                ca_cert: pick(&flags.ca_cert, "NOMAD_CACERT").map(Into::into),
                ca_path: pick(&flags.ca_path, "NOMAD_CAPATH").map(Into::into),
                client_cert: pick(&flags.client_cert, "NOMAD_CLIENT_CERT").map(Into::into),
                client_key: pick(&flags.client_key, "NOMAD_CLIENT_KEY").map(Into::into),
                server_name: pick(&flags.tls_server_name, "NOMAD_TLS_SERVER_NAME"),
                // An invalid NOMAD_SKIP_VERIFY is ignored, as Go's client does.
                skip_verify: flags.tls_skip_verify || env("NOMAD_SKIP_VERIFY").and_then(|v| crate::tls::parse_go_bool(&v)).unwrap_or(false),
                chain_only: false,
            },
        }
    }

    /// Resolves against the process environment.
    pub fn from_env(flags: &ApiFlags) -> ApiConfig {
        ApiConfig::resolve(flags, |k| std::env::var(k).ok())
    }
}

/// Why a request failed.
#[derive(Debug)]
pub enum ApiError {
    /// The address is unusable.
    Address {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The connection could not be made.
    Connect {
        /// Go-style method name (`Get`, `Put`, ...).
        method: &'static str,
        /// Full URL.
        url: String,
        /// Why, e.g. `connection refused`.
        reason: String,
    },
    /// No answer in time.
    Timeout {
        /// Method.
        method: &'static str,
        /// URL.
        url: String,
        /// How long we waited.
        after: Duration,
    },
    /// The connection broke or the request could not be sent.
    Transport {
        /// Method.
        method: &'static str,
        /// URL.
        url: String,
        /// The error.
        error: String,
    },
    /// The server answered with a non-2xx status; `body` is its plain-text error.
    Status {
        /// HTTP status.
        code: u16,
        /// Body, trimmed.
        body: String,
    },
    /// The answer was not the JSON we expected.
    Decode {
        /// Method.
        method: &'static str,
        /// URL.
        url: String,
        /// The decoder's message.
        error: String,
    },
}

impl ApiError {
    /// The server does not have this route (an older nomad-rs, or a route not built yet):
    /// 405, or 404 with an empty body, Go's "404 page not found" or a "not supported" message.
    pub fn is_unsupported_route(&self) -> bool {
        match self {
            ApiError::Status { code: 405, .. } => true,
            ApiError::Status { code: 404, body } => {
                body.is_empty() || body.trim_end() == "404 page not found" || body.contains("not supported")
            }
            _ => false,
        }
    }

    /// A 404 (the object does not exist, or the route is missing).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::Status { code: 404, .. })
    }

    /// The request never reached a server.
    pub fn is_connect(&self) -> bool {
        matches!(self, ApiError::Connect { .. })
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Address { address, reason } => {
                write!(f, "invalid address {address:?}: {reason}; set NOMAD_ADDR or -address to http://<host>:<port>")
            }
            ApiError::Connect { method, url, reason } if is_tls_failure(reason) => write!(
                f,
                "{method} {url:?}: {reason} — check the TLS settings: NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME"
            ),
            ApiError::Connect { method, url, reason } => {
                write!(f, "{method} {url:?}: {reason} — is `nomad-rs agent` running? Set NOMAD_ADDR or -address")
            }
            ApiError::Timeout { method, url, after } => {
                write!(f, "{method} {url:?}: no response after {}s", after.as_secs())
            }
            ApiError::Transport { method, url, error } => write!(f, "{method} {url:?}: {error}"),
            ApiError::Status { code, body } => write!(f, "Unexpected response code: {code} ({body})"),
            ApiError::Decode { method, url, error } => {
                write!(f, "{method} {url:?}: the response is not what nomad-rs expected: {error}")
            }
        }
    }
}

impl std::error::Error for ApiError {}

/// Query parameters and blocking options of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    params: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    /// Block until the result's index is above this (0: answer at once).
    pub index: u64,
    /// How long a blocking query may wait on the server.
    pub wait: Option<Duration>,
}

impl Query {
    /// No parameters.
    pub fn new() -> Query {
        Query::default()
    }

    /// Adds a parameter.
    pub fn param(mut self, key: &str, value: impl Into<String>) -> Query {
        self.params.push((key.to_string(), value.into()));
        self
    }

    /// Adds a request header (`X-Nomad-CSI-Secrets`).
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Query {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// `prefix=...`.
    pub fn prefix(self, prefix: &str) -> Query {
        self.param("prefix", prefix)
    }

    /// A blocking read: wait up to `wait` for an index above `index`.
    pub fn blocking(mut self, index: u64, wait: Duration) -> Query {
        self.index = index;
        self.wait = Some(wait);
        self
    }

    fn has(&self, key: &str) -> bool {
        self.params.iter().any(|(k, _)| k == key)
    }
}

/// A decoded answer and the index it was read at.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    /// The value.
    pub value: T,
    /// `X-Nomad-Index` (0 when absent).
    pub index: u64,
}

/// The API client.
#[derive(Clone)]
pub struct Client {
    config: ApiConfig,
    base: String,
    http: HyperClient<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

fn go_method(m: &Method) -> &'static str {
    match *m {
        Method::GET => "Get",
        Method::PUT => "Put",
        Method::POST => "Post",
        Method::DELETE => "Delete",
        _ => "Request",
    }
}

/// Normalizes an address to `http(s)://host:port[/prefix]` without a trailing slash.
pub fn normalize_address(address: &str) -> Result<String, ApiError> {
    let bad = |reason: &str| ApiError::Address { address: address.to_string(), reason: reason.to_string() };
    let a = address.trim();
    let mut scheme = "http";
    let rest = if let Some(r) = a.strip_prefix("http://") {
        r
    } else if let Some(r) = a.strip_prefix("https://") {
        scheme = "https";
        r
    } else if a.starts_with("unix://") {
        return Err(bad("unix sockets are not supported; use http:// or https://"));
    } else if a.contains("://") {
        return Err(bad("unknown scheme"));
    } else {
        a
    };
    let rest = rest.trim_end_matches('/');
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.parse::<http::uri::Authority>().is_err() {
        return Err(bad("not a host:port"));
    }
    Ok(format!("{scheme}://{rest}"))
}

/// Percent-encodes a query component (everything but unreserved characters).
pub fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Escapes what would break a path segment (IDs are normally plain ASCII and pass unchanged).
pub fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_graphic() && !matches!(b, b'?' | b'#' | b'%') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    /// A client for these settings.
    pub fn new(config: ApiConfig) -> Result<Client, ApiError> {
        let base = normalize_address(&config.address)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        let connector = config
            .tls
            .connector(connector, base.starts_with("https://"))
            .map_err(|e| ApiError::Address { address: config.address.clone(), reason: format!("TLS: {e:#}") })?;
        let http = HyperClient::builder(TokioExecutor::new()).build(connector);
        Ok(Client { config, base, http })
    }

    /// The settings in use.
    pub fn config(&self) -> &ApiConfig {
        &self.config
    }

    /// The full URL of `path` with `q`'s parameters plus the client's region and namespace.
    pub fn url(&self, path: &str, q: &Query) -> String {
        let mut params: Vec<(String, String)> = q.params.clone();
        if let Some(ns) = &self.config.namespace
            && !q.has("namespace")
        {
            params.push(("namespace".into(), ns.clone()));
        }
        if let Some(r) = &self.config.region
            && !q.has("region")
        {
            params.push(("region".into(), r.clone()));
        }
        if q.index > 0 {
            params.push(("index".into(), q.index.to_string()));
        }
        if let (Some(w), true) = (q.wait, q.index > 0) {
            params.push(("wait".into(), format!("{}ms", w.as_millis())));
        }
        let mut url = format!("{}{}", self.base, path);
        if !params.is_empty() {
            let qs: Vec<String> = params.iter().map(|(k, v)| format!("{}={}", encode_query(k), encode_query(v))).collect();
            url.push('?');
            url.push_str(&qs.join("&"));
        }
        url
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        q: &Query,
        body: Option<Vec<u8>>,
    ) -> Result<(http::response::Parts, Incoming, String), ApiError> {
        let url = self.url(path, q);
        let gm = go_method(&method);
        let mut req = Request::builder().method(method.clone()).uri(&url);
        if let Some(t) = &self.config.token {
            req = req.header("X-Nomad-Token", t);
        }
        if body.is_some() && !q.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        for (name, value) in &q.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| ApiError::Transport {
            method: gm,
            url: url.clone(),
            error: e.to_string(),
        })?;
        let limit = match (q.index > 0, q.wait) {
            (true, Some(w)) => w + BLOCKING_SLACK,
            _ => REQUEST_TIMEOUT,
        };
        let resp = match tokio::time::timeout(limit, self.http.request(req)).await {
            Err(_) => return Err(ApiError::Timeout { method: gm, url, after: limit }),
            Ok(Err(e)) => return Err(classify(gm, &url, &e)),
            Ok(Ok(r)) => r,
        };
        let (parts, body) = resp.into_parts();
        Ok((parts, body, url))
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        q: &Query,
        body: Option<Vec<u8>>,
    ) -> Result<(Bytes, http::HeaderMap, String), ApiError> {
        let gm = go_method(&method);
        let limit = match (q.index > 0, q.wait) {
            (true, Some(w)) => w + BLOCKING_SLACK,
            _ => REQUEST_TIMEOUT,
        };
        let (parts, body, url) = self.send(method, path, q, body).await?;
        let bytes = match tokio::time::timeout(limit, body.collect()).await {
            Err(_) => return Err(ApiError::Timeout { method: gm, url, after: limit }),
            Ok(Err(e)) => return Err(ApiError::Transport { method: gm, url, error: e.to_string() }),
            Ok(Ok(c)) => c.to_bytes(),
        };
        if !parts.status.is_success() {
            return Err(status_error(parts.status, &bytes));
        }
        Ok((bytes, parts.headers, url))
    }

    /// Decodes with Go's manners (`null` anywhere means "unset", as Go encodes empty maps and
    /// slices), so answers from any Nomad-compatible server fit the typed views.
    fn decode<T: DeserializeOwned>(method: &Method, url: &str, bytes: &[u8]) -> Result<T, ApiError> {
        nomad_proto::lenient::from_trusted_slice(bytes).map_err(|e| ApiError::Decode {
            method: go_method(method),
            url: url.to_string(),
            error: e.to_string(),
        })
    }

    /// `GET path`, decoded.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, q: &Query) -> Result<Answer<T>, ApiError> {
        let (bytes, headers, url) = self.call(Method::GET, path, q, None).await?;
        Ok(Answer { value: Client::decode(&Method::GET, &url, &bytes)?, index: index_of(&headers) })
    }

    /// `GET path` of a paginated list (`per_page`, `next_token`), decoded, with the
    /// `X-Nomad-NextToken` the next page starts at (empty on the last page).
    pub async fn get_page<T: DeserializeOwned>(&self, path: &str, q: &Query) -> Result<(Answer<T>, String), ApiError> {
        let (bytes, headers, url) = self.call(Method::GET, path, q, None).await?;
        let next = headers.get("X-Nomad-NextToken").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        Ok((Answer { value: Client::decode(&Method::GET, &url, &bytes)?, index: index_of(&headers) }, next))
    }

    /// `GET path` as untyped JSON, exactly as sent (for `-json` output).
    pub async fn get_json(&self, path: &str, q: &Query) -> Result<Answer<serde_json::Value>, ApiError> {
        let (bytes, headers, url) = self.call(Method::GET, path, q, None).await?;
        let value = serde_json::from_slice(&bytes).map_err(|e| ApiError::Decode { method: "Get", url, error: e.to_string() })?;
        Ok(Answer { value, index: index_of(&headers) })
    }

    /// A write with a JSON body (or none), decoded.
    pub async fn write<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        q: &Query,
        body: Option<&impl Serialize>,
    ) -> Result<Answer<T>, ApiError> {
        let payload = match body {
            Some(b) => Some(serde_json::to_vec(b).map_err(|e| ApiError::Transport {
                method: go_method(&method),
                url: self.url(path, q),
                error: format!("encoding the request: {e}"),
            })?),
            None => None,
        };
        let (bytes, headers, url) = self.call(method.clone(), path, q, payload).await?;
        let index = index_of(&headers);
        // Some writes answer with an empty body; decode that as JSON null.
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"null" } else { &bytes };
        Ok(Answer { value: Client::decode(&method, &url, bytes)?, index })
    }

    /// `PUT path` with a JSON body.
    pub async fn put<T: DeserializeOwned>(&self, path: &str, q: &Query, body: &impl Serialize) -> Result<Answer<T>, ApiError> {
        self.write(Method::PUT, path, q, Some(body)).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<T: DeserializeOwned>(&self, path: &str, q: &Query, body: &impl Serialize) -> Result<Answer<T>, ApiError> {
        self.write(Method::POST, path, q, Some(body)).await
    }

    /// `DELETE path`.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str, q: &Query) -> Result<Answer<T>, ApiError> {
        self.write(Method::DELETE, path, q, None::<&()>).await
    }

    /// `GET path`, the body as bytes, with the answer's headers (a snapshot archive).
    pub async fn get_bytes(&self, path: &str, q: &Query) -> Result<(Bytes, http::HeaderMap), ApiError> {
        let (bytes, headers, _url) = self.call(Method::GET, path, q, None).await?;
        Ok((bytes, headers))
    }

    /// `PUT path` with `body` sent as it is (`application/octet-stream`); the answer's index.
    pub async fn put_bytes(&self, path: &str, q: &Query, body: Vec<u8>) -> Result<u64, ApiError> {
        let q = q.clone().header("Content-Type", "application/octet-stream");
        let (_bytes, headers, _url) = self.call(Method::PUT, path, &q, Some(body)).await?;
        Ok(index_of(&headers))
    }

    /// `GET path` whose body is read as a stream (task logs). A non-2xx answer is an error.
    pub async fn get_stream(&self, path: &str, q: &Query) -> Result<Incoming, ApiError> {
        let (parts, body, _url) = self.send(Method::GET, path, q, None).await?;
        if !parts.status.is_success() {
            let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            return Err(status_error(parts.status, &bytes));
        }
        Ok(body)
    }
}

fn index_of(headers: &http::HeaderMap) -> u64 {
    headers.get("X-Nomad-Index").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn status_error(status: StatusCode, body: &[u8]) -> ApiError {
    ApiError::Status { code: status.as_u16(), body: String::from_utf8_lossy(body).trim().to_string() }
}

/// A connection that reached the agent but failed in the TLS handshake (rustls' messages).
fn is_tls_failure(reason: &str) -> bool {
    reason.contains("peer certificate") || reason.contains("fatal alert") || reason.contains("peer is incompatible")
}

/// Turns a hyper client error into a message that names the real cause.
fn classify(method: &'static str, url: &str, e: &hyper_util::client::legacy::Error) -> ApiError {
    let mut io_reason = None;
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            io_reason = Some(match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::TimedOut => "connection timed out".to_string(),
                std::io::ErrorKind::ConnectionReset => "connection reset by peer".to_string(),
                _ => io.to_string(),
            });
            break;
        }
        src = s.source();
    }
    if e.is_connect() {
        let reason = io_reason.unwrap_or_else(|| {
            let mut chain = e.to_string();
            let mut s = std::error::Error::source(e);
            while let Some(x) = s {
                chain.push_str(": ");
                chain.push_str(&x.to_string());
                s = x.source();
            }
            chain
        });
        return ApiError::Connect { method, url: url.to_string(), reason };
    }
    ApiError::Transport { method, url: url.to_string(), error: io_reason.unwrap_or_else(|| e.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn flags_beat_the_environment_which_beats_defaults() {
        let none = ApiConfig::resolve(&ApiFlags::default(), env_of(&[]));
        assert_eq!(none.address, DEFAULT_ADDRESS);
        assert_eq!((none.token, none.namespace, none.region), (None, None, None));

        let env = env_of(&[
            ("NOMAD_ADDR", "http://10.0.0.1:4646"),
            ("NOMAD_TOKEN", " t0k "),
            ("NOMAD_NAMESPACE", "prod"),
            ("NOMAD_REGION", "eu"),
        ]);
        let from_env = ApiConfig::resolve(&ApiFlags::default(), &env);
        assert_eq!(from_env.address, "http://10.0.0.1:4646");
        assert_eq!(from_env.token.as_deref(), Some("t0k"));
        assert_eq!(from_env.namespace.as_deref(), Some("prod"));
        assert_eq!(from_env.region.as_deref(), Some("eu"));

        let flags = ApiFlags { address: Some("127.0.0.1:9".into()), namespace: Some("dev".into()), ..ApiFlags::default() };
        let both = ApiConfig::resolve(&flags, &env);
        assert_eq!(both.address, "127.0.0.1:9");
        assert_eq!(both.namespace.as_deref(), Some("dev"));
        assert_eq!(both.region.as_deref(), Some("eu"));
    }

    #[test]
    fn addresses_normalize_and_bad_ones_say_why() {
        assert_eq!(normalize_address("http://127.0.0.1:4646/").unwrap(), "http://127.0.0.1:4646");
        assert_eq!(normalize_address("localhost:4646").unwrap(), "http://localhost:4646");
        assert_eq!(normalize_address("https://x:1/").unwrap(), "https://x:1");
        let e = normalize_address("unix:///run/nomad.sock").unwrap_err().to_string();
        assert!(e.contains("unix sockets are not supported"), "{e}");
        assert!(normalize_address("http://").is_err());
    }

    #[test]
    fn tls_settings_come_from_flags_then_nomads_variables() {
        let env = env_of(&[
            ("NOMAD_CACERT", "/env/ca.pem"),
            ("NOMAD_CAPATH", "/env/cas"),
            ("NOMAD_CLIENT_CERT", "/env/cli.pem"),
            ("NOMAD_CLIENT_KEY", "/env/cli-key.pem"),
            ("NOMAD_TLS_SERVER_NAME", "server.global.nomad"),
            ("NOMAD_SKIP_VERIFY", "1"),
        ]);
        let from_env = ApiConfig::resolve(&ApiFlags::default(), &env).tls;
        assert_eq!(from_env.ca_cert.as_deref(), Some(std::path::Path::new("/env/ca.pem")));
        assert_eq!(from_env.ca_path.as_deref(), Some(std::path::Path::new("/env/cas")));
        assert_eq!(from_env.client_cert.as_deref(), Some(std::path::Path::new("/env/cli.pem")));
        assert_eq!(from_env.client_key.as_deref(), Some(std::path::Path::new("/env/cli-key.pem")));
        assert_eq!(from_env.server_name.as_deref(), Some("server.global.nomad"));
        assert!(from_env.skip_verify && !from_env.chain_only);
        let flags = ApiFlags { ca_cert: Some("/flag/ca.pem".into()), tls_server_name: Some("other".into()), ..ApiFlags::default() };
        let both = ApiConfig::resolve(&flags, &env).tls;
        assert_eq!(both.ca_cert.as_deref(), Some(std::path::Path::new("/flag/ca.pem")));
        assert_eq!(both.server_name.as_deref(), Some("other"));
        // An invalid NOMAD_SKIP_VERIFY is ignored, as Go's client does.
        let invalid = ApiConfig::resolve(&ApiFlags::default(), env_of(&[("NOMAD_SKIP_VERIFY", "sure")])).tls;
        assert!(!invalid.skip_verify);
        // A client certificate without its key is a clear error when the client is made.
        let half = ApiConfig {
            address: "https://h:1".into(),
            token: None,
            namespace: None,
            region: None,
            tls: crate::tls::ClientTls { client_cert: Some("/nowhere/cli.pem".into()), ..Default::default() },
        };
        let e = Client::new(half).unwrap_err().to_string();
        assert!(e.contains("TLS"), "{e}");
    }

    #[test]
    fn urls_carry_namespace_region_and_blocking_options() {
        let cfg = ApiConfig {
            address: "http://h:1".into(),
            token: None,
            namespace: Some("prod".into()),
            region: Some("eu".into()),
            tls: Default::default(),
        };
        let c = Client::new(cfg).unwrap();
        assert_eq!(c.url("/v1/jobs", &Query::new().prefix("we b")), "http://h:1/v1/jobs?prefix=we%20b&namespace=prod&region=eu");
        let q = Query::new().param("namespace", "*").blocking(42, Duration::from_secs(5));
        assert_eq!(c.url("/v1/allocations", &q), "http://h:1/v1/allocations?namespace=%2A&region=eu&index=42&wait=5000ms");
        // index 0 is not a blocking query: no index or wait parameter.
        let q = Query::new().blocking(0, Duration::from_secs(5));
        assert_eq!(c.url("/v1/x", &q), "http://h:1/v1/x?namespace=prod&region=eu");
    }

    #[test]
    fn errors_read_like_the_go_client_and_spot_missing_routes() {
        let e = ApiError::Status { code: 404, body: "job not found".into() };
        assert_eq!(e.to_string(), "Unexpected response code: 404 (job not found)");
        assert!(!e.is_unsupported_route());
        assert!(ApiError::Status { code: 404, body: String::new() }.is_unsupported_route());
        assert!(ApiError::Status { code: 404, body: "404 page not found\n".into() }.is_unsupported_route(), "Go's http.NotFound");
        assert!(ApiError::Status { code: 404, body: "job action \"plan\" is not supported by nomad-rs yet".into() }.is_unsupported_route());
        assert!(ApiError::Status { code: 405, body: "Invalid method".into() }.is_unsupported_route());
        let c = ApiError::Connect { method: "Get", url: "http://127.0.0.1:4646/v1/jobs".into(), reason: "connection refused".into() };
        assert_eq!(
            c.to_string(),
            "Get \"http://127.0.0.1:4646/v1/jobs\": connection refused — is `nomad-rs agent` running? Set NOMAD_ADDR or -address"
        );
        let tls = ApiError::Connect {
            method: "Get",
            url: "https://h:1/v1/jobs".into(),
            reason: "invalid peer certificate: UnknownIssuer".into(),
        };
        assert!(
            tls.to_string().ends_with("— check the TLS settings: NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME"),
            "{tls}"
        );
    }

    #[test]
    fn go_style_nulls_decode_into_the_typed_views() {
        // Go encodes nil slices and maps as null; a real Nomad sends these.
        let allocs = br#"[{"ID":"a1","EvalID":"e1","Name":"j.g[0]","Namespace":"default","NodeID":"n1","NodeName":"","JobID":"j",
            "JobType":"service","JobVersion":0,"TaskGroup":"g","DesiredStatus":"run","DesiredDescription":"","ClientStatus":"running",
            "ClientDescription":"","DesiredTransition":{"Migrate":null},"TaskStates":null,"DeploymentStatus":null,"FollowupEvalID":"",
            "NextAllocation":"","RescheduleTracker":null,"PreemptedAllocations":null,"PreemptedByAllocation":"","CreateIndex":6,
            "ModifyIndex":6,"CreateTime":0,"ModifyTime":0}]"#;
        let v: Vec<nomad_proto::AllocListStub> = Client::decode(&Method::GET, "u", allocs).unwrap();
        assert_eq!(v[0].client_status, nomad_proto::ClientStatus::Running);
        assert!(v[0].preempted_allocations.is_empty());
        let eval = br#"{"ID":"e1","Status":"complete","FailedTGAllocs":null,"QueuedAllocations":null,"ClassEligibility":null}"#;
        let e: nomad_proto::Evaluation = Client::decode(&Method::GET, "u", eval).unwrap();
        assert!(e.failed_tg_allocs.is_empty());
        let nodes = br#"[{"ID":"n1","Name":"n","Status":"ready","HostVolumes":null,"Drivers":null,"LastDrain":null}]"#;
        let n: Vec<nomad_proto::NodeListStub> = Client::decode(&Method::GET, "u", nodes).unwrap();
        assert_eq!(n[0].status, nomad_proto::NodeStatus::Ready);
        let e = Client::decode::<Vec<nomad_proto::NodeListStub>>(&Method::GET, "http://h/v1/nodes", br#"{"x":1}"#).unwrap_err();
        assert!(e.to_string().starts_with("Get \"http://h/v1/nodes\": the response is not what nomad-rs expected"), "{e}");
    }

    #[test]
    fn path_segments_keep_plain_ids() {
        assert_eq!(encode_path("web-1.a_b"), "web-1.a_b");
        assert_eq!(encode_path("a b?"), "a%20b%3F");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        // Bind then drop a listener to get a port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = Client::new(ApiConfig {
            address: format!("http://127.0.0.1:{port}"),
            token: None,
            namespace: None,
            region: None,
            tls: Default::default(),
        })
        .unwrap();
        let e = c.get_json("/v1/jobs", &Query::new()).await.unwrap_err();
        assert!(e.is_connect(), "{e:?}");
        assert!(e.to_string().contains("connection refused"), "{e}");
    }
}
