//! The http getter: one GET (redirects followed, as Go's client does, at most 10), the
//! response streamed into a file with the `http_max_size` limit checked as bytes arrive, the
//! whole exchange bounded by `http_read_timeout`. Nomad turns off go-getter's HEAD probe and
//! X-Terraform-Get, so neither exists here.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, COOKIE, HeaderName, HeaderValue, LOCATION, USER_AGENT};
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use url::Url;

use super::checksum::Hasher;

/// Go's client gives up after this many redirects.
const MAX_REDIRECTS: usize = 10;

type HttpsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// An http and https client with the host's trusted roots, made on first use.
#[derive(Default)]
pub struct Fetcher {
    client: OnceLock<HttpsClient>,
}

/// The limits of one download.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// The whole exchange, headers and body (`http_read_timeout`; zero: none).
    pub timeout: Duration,
    /// Most bytes of body (`http_max_size`; zero: none).
    pub max_bytes: u64,
}

impl Fetcher {
    fn client(&self) -> &HttpsClient {
        self.client.get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
            let tls = rustls::ClientConfig::builder_with_provider(Arc::new(crate::tls::ring_provider()))
                .with_protocol_versions(rustls::ALL_VERSIONS)
                .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                .expect("ring supports every protocol version");
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().wrap_connector(http);
            Client::builder(TokioExecutor::new()).build(https)
        })
    }

    /// GETs `url` with `headers` into `out`, hashing what it writes; returns the byte count.
    pub async fn download(
        &self,
        url: &Url,
        headers: &BTreeMap<String, String>,
        limits: HttpLimits,
        out: &mut tokio::fs::File,
        hasher: Option<&mut Hasher>,
    ) -> Result<u64, String> {
        let exchange = self.exchange(url, headers, limits, out, hasher);
        if limits.timeout.is_zero() {
            return exchange.await;
        }
        match tokio::time::timeout(limits.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the download took longer than the client's artifact http_read_timeout ({})",
                crate::client::taskrunner::restart::go_duration(limits.timeout)
            )),
        }
    }

    async fn exchange(
        &self,
        url: &Url,
        headers: &BTreeMap<String, String>,
        limits: HttpLimits,
        out: &mut tokio::fs::File,
        mut hasher: Option<&mut Hasher>,
    ) -> Result<u64, String> {
        let mut header_map = http::HeaderMap::new();
        for (k, v) in headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| format!("invalid header name {k:?}"))?;
            let value = HeaderValue::from_str(v).map_err(|_| format!("invalid value for header {k:?}"))?;
            header_map.insert(name, value);
        }
        if !header_map.contains_key(USER_AGENT) {
            header_map.insert(USER_AGENT, HeaderValue::from_static(concat!("nomad-rs/", env!("CARGO_PKG_VERSION"))));
        }
        let mut url = url.clone();
        let mut redirects = 0;
        let resp = loop {
            let mut req =
                http::Request::get(url.as_str()).body(Empty::<Bytes>::new()).map_err(|e| format!("GET {}: {e}", redacted(&url)))?;
            *req.headers_mut() = header_map.clone();
            let resp = self.client().request(req).await.map_err(|e| format!("GET {}: {}", redacted(&url), error_chain(&e)))?;
            let status = resp.status();
            if !status.is_redirection() || status == http::StatusCode::NOT_MODIFIED {
                break resp;
            }
            let Some(location) = resp.headers().get(LOCATION).and_then(|l| l.to_str().ok()) else {
                break resp;
            };
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(format!("GET {}: stopped after {MAX_REDIRECTS} redirects", redacted(&url)));
            }
            let next = url.join(location).map_err(|e| format!("GET {}: bad redirect location {location:?}: {e}", redacted(&url)))?;
            if next.scheme() != "http" && next.scheme() != "https" {
                return Err(format!("GET {}: redirected to an unsupported scheme '{}'", redacted(&url), next.scheme()));
            }
            // Go's client keeps credentials only on redirects to the same host.
            if next.host_str() != url.host_str() {
                for h in [AUTHORIZATION, COOKIE, HeaderName::from_static("www-authenticate"), HeaderName::from_static("cookie2")] {
                    header_map.remove(h);
                }
            }
            url = next;
        };
        let status = resp.status();
        if status != http::StatusCode::OK && status != http::StatusCode::PARTIAL_CONTENT {
            return Err(format!("bad response code: {}", status.as_u16()));
        }
        let too_big = || format!("the response is larger than the client's artifact http_max_size ({} bytes)", limits.max_bytes);
        let declared = resp.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if limits.max_bytes > 0 && declared.is_some_and(|n| n > limits.max_bytes) {
            return Err(too_big());
        }
        let mut body = resp.into_body();
        let mut written = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the response: {}", error_chain(&e)))?;
            let Ok(data) = frame.into_data() else { continue };
            written += data.len() as u64;
            if limits.max_bytes > 0 && written > limits.max_bytes {
                return Err(too_big());
            }
            if let Some(h) = hasher.as_deref_mut() {
                h.update(&data);
            }
            out.write_all(&data).await.map_err(|e| format!("writing the download: {e}"))?;
        }
        if declared.is_some_and(|n| written < n) {
            return Err(format!("short read: {written} of {} bytes", declared.unwrap_or_default()));
        }
        out.flush().await.map_err(|e| format!("writing the download: {e}"))?;
        Ok(written)
    }
}

/// The URL without its user info and query, which may carry credentials (go-getter's
/// `RedactURL` hides passwords; signed URLs keep theirs in the query).
fn redacted(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_password(None);
    let _ = u.set_username("");
    u.set_query(None);
    u.to_string()
}

/// An error and its causes, one after another.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
