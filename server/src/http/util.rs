//! What every route shares: query options, blocking queries, Nomad's
//! response headers, plain-text errors and lenient body decoding.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::endpoints::EndpointError;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Namespace sentinel meaning "every namespace" on list endpoints.
pub const ALL_NAMESPACES: &str = "*";

/// An HTTP error: Nomad answers with plain text and a status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// Status.
    pub code: StatusCode,
    /// Body.
    pub message: String,
}

impl HttpError {
    /// 400 Bad Request.
    pub fn bad_request(msg: impl Into<String>) -> HttpError {
        HttpError { code: StatusCode::BAD_REQUEST, message: msg.into() }
    }

    /// 404 Not Found.
    pub fn not_found(msg: impl Into<String>) -> HttpError {
        HttpError { code: StatusCode::NOT_FOUND, message: msg.into() }
    }

    /// 405 Method Not Allowed.
    pub fn invalid_method() -> HttpError {
        HttpError { code: StatusCode::METHOD_NOT_ALLOWED, message: "Invalid method".into() }
    }
}

impl From<EndpointError> for HttpError {
    fn from(e: EndpointError) -> Self {
        let code = match &e {
            EndpointError::BadRequest(_) => StatusCode::BAD_REQUEST,
            EndpointError::NotFound(_) => StatusCode::NOT_FOUND,
            EndpointError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            EndpointError::Invalid(_) | EndpointError::NoLeader | EndpointError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            EndpointError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        };
        HttpError { code, message: e.to_string() }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut r = (self.code, self.message).into_response();
        r.headers_mut().insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
        r
    }
}

/// The result type of every handler.
pub type HttpResult = Result<Response, HttpError>;

/// Common query parameters (`HTTPServer.parse`).
#[derive(Debug, Clone, Default)]
pub struct QueryOptions {
    /// Raw parameters (last value wins).
    pub params: HashMap<String, String>,
    /// Every value of each parameter, in order (for repeatable ones like `topic`).
    pub multi: HashMap<String, Vec<String>>,
    /// `index`: block until the result index is above this.
    pub min_index: u64,
    /// `wait`: how long to block.
    pub wait: Duration,
    /// `prefix`.
    pub prefix: String,
    /// `namespace` (defaults to `default`; `*` = all).
    pub namespace: String,
    /// `per_page` (0: all).
    pub per_page: usize,
    /// `next_token`.
    pub next_token: String,
    /// `reverse=true`.
    pub reverse: bool,
    /// `pretty`.
    pub pretty: bool,
    /// `filter`: a go-bexpr expression over each list element.
    pub filter: Option<std::sync::Arc<super::filter::Filter>>,
}

/// Longest and default blocking wait.
pub const MAX_BLOCKING_WAIT: Duration = Duration::from_secs(300);

impl QueryOptions {
    /// Parses the query string; bad `wait`, `index` or `per_page` values are 400s.
    pub fn parse(uri: &Uri) -> Result<QueryOptions, HttpError> {
        let mut q = QueryOptions { wait: MAX_BLOCKING_WAIT, namespace: nomad_proto::job::DEFAULT_NAMESPACE.into(), ..Default::default() };
        if let Some(raw) = uri.query() {
            for (k, v) in form_urlencoded_pairs(raw) {
                q.multi.entry(k.clone()).or_default().push(v.clone());
                q.params.insert(k, v);
            }
        }
        if let Some(w) = q.params.get("wait").filter(|w| !w.is_empty()) {
            let ns = nomad_proto::time::parse_go_duration(w).map_err(|_| HttpError::bad_request("Invalid wait time"))?;
            if ns < 0 {
                return Err(HttpError::bad_request("Invalid wait time"));
            }
            q.wait = Duration::from_nanos(ns as u64).min(MAX_BLOCKING_WAIT);
        }
        if let Some(i) = q.params.get("index").filter(|i| !i.is_empty()) {
            q.min_index = i.parse().map_err(|_| HttpError::bad_request("Invalid index"))?;
        }
        if let Some(p) = q.params.get("per_page").filter(|p| !p.is_empty()) {
            q.per_page = p.parse().map_err(|_| HttpError::bad_request("Invalid per_page value"))?;
        }
        q.prefix = q.params.get("prefix").cloned().unwrap_or_default();
        q.next_token = q.params.get("next_token").cloned().unwrap_or_default();
        if let Some(ns) = q.params.get("namespace").filter(|n| !n.is_empty()) {
            q.namespace = ns.clone();
        }
        // Nomad requires the literal `true` here.
        q.reverse = q.params.get("reverse").is_some_and(|r| r == "true");
        q.pretty = q.params.contains_key("pretty");
        if let Some(f) = q.params.get("filter").filter(|f| !f.trim().is_empty()) {
            let parsed =
                super::filter::Filter::parse(f).map_err(|e| HttpError::bad_request(format!("failed to create result paginator: {e}")))?;
            q.filter = Some(std::sync::Arc::new(parsed));
        }
        Ok(q)
    }

    /// `None` for `namespace=*`, else the namespace.
    pub fn namespace_filter(&self) -> Option<&str> {
        (self.namespace != ALL_NAMESPACES).then_some(self.namespace.as_str())
    }

    /// A boolean parameter parsed like Go's `strconv.ParseBool`; absent → `default`.
    pub fn bool(&self, name: &str, default: bool) -> Result<bool, HttpError> {
        match self.params.get(name) {
            None => Ok(default),
            Some(v) if v.is_empty() => Ok(default),
            Some(v) => parse_bool(v).ok_or_else(|| {
                HttpError::bad_request(format!(
                    "Failed to parse value of {name:?} ({v}) as a bool: strconv.ParseBool: parsing {}: invalid syntax",
                    super::agent_local::go_quote(v)
                ))
            }),
        }
    }

    /// An integer parameter; absent → `default`.
    pub fn int(&self, name: &str, default: i64) -> Result<i64, HttpError> {
        match self.params.get(name) {
            None => Ok(default),
            Some(v) if v.is_empty() => Ok(default),
            Some(v) => v.parse().map_err(|_| HttpError::bad_request(format!("Failed to parse value of {name:?} ({v}) as an integer"))),
        }
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn form_urlencoded_pairs(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b))) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Nomad's query meta headers.
#[derive(Debug, Clone, Copy)]
pub struct QueryMeta {
    /// `X-Nomad-Index`.
    pub index: u64,
    /// `X-Nomad-KnownLeader`.
    pub known_leader: bool,
}

/// A JSON response with Nomad's headers.
pub fn json_response<T: Serialize>(value: &T, meta: Option<QueryMeta>, pretty: bool) -> HttpResult {
    let body = if pretty { serde_json::to_vec_pretty(value) } else { serde_json::to_vec(value) }
        .map_err(|e| HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: format!("encoding response: {e}") })?;
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    if let Some(m) = meta {
        set_meta(h, m);
    }
    Ok(r)
}

/// Sets Nomad's query meta headers (`X-Nomad-Index`, ...).
pub fn set_meta(h: &mut HeaderMap, m: QueryMeta) {
    h.insert("x-nomad-index", HeaderValue::from(m.index));
    h.insert("x-nomad-knownleader", HeaderValue::from_static(if m.known_leader { "true" } else { "false" }));
    h.insert("x-nomad-lastcontact", HeaderValue::from_static("0"));
}

/// Decodes a request body with Go's manners; an empty body is a 400.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, HttpError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(HttpError::bad_request("Request body is empty"));
    }
    nomad_proto::lenient::from_slice(body).map_err(|e| HttpError::bad_request(e.to_string()))
}

/// The 413 for a body over [`MAX_BODY_BYTES`].
fn body_too_large() -> HttpError {
    HttpError {
        code: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("Request body too large: the limit is {} MiB", MAX_BODY_BYTES / (1024 * 1024)),
    }
}

/// Reads the body, refusing anything over [`MAX_BODY_BYTES`]: at once when its
/// `Content-Length` says so (nothing read), else as soon as the limit is passed.
pub async fn read_body(body: Body) -> Result<bytes::Bytes, HttpError> {
    if axum::body::HttpBody::size_hint(&body).lower() > MAX_BODY_BYTES as u64 {
        return Err(body_too_large());
    }
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        let too_big =
            std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit")) || e.to_string().contains("length limit");
        if too_big { body_too_large() } else { HttpError::bad_request(format!("Failed to read request body: {e}")) }
    })
}

/// Keeps the items that pass the query's `filter` (all when there is none).
pub fn filtered<T: Serialize>(mut items: Vec<T>, q: &QueryOptions) -> Vec<T> {
    if let Some(f) = &q.filter {
        items.retain(|i| serde_json::to_value(i).is_ok_and(|v| f.matches(&v)));
    }
    items
}

/// Applies `filter`, then cuts a sorted list to one page: items from
/// `next_token` on, at most `per_page`; returns the next page's token when
/// there is one.
pub fn paginate<T: Serialize>(items: Vec<T>, q: &QueryOptions, token_of: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
    let mut items = filtered(items, q);
    if q.reverse {
        items.reverse();
    }
    let start = if q.next_token.is_empty() {
        0
    } else if q.reverse {
        items.iter().position(|i| token_of(i) <= q.next_token).unwrap_or(items.len())
    } else {
        items.iter().position(|i| token_of(i) >= q.next_token).unwrap_or(items.len())
    };
    let mut page: Vec<T> = items.into_iter().skip(start).collect();
    if q.per_page == 0 || page.len() <= q.per_page {
        return (page, None);
    }
    let rest = page.split_off(q.per_page);
    let next = rest.first().map(&token_of);
    (page, next)
}

/// A list response: JSON array, meta headers, and `X-Nomad-NextToken` when paging.
pub fn list_response<T: Serialize>(items: &[T], next: Option<String>, meta: QueryMeta, pretty: bool) -> HttpResult {
    let mut r = json_response(&items, Some(meta), pretty)?;
    if let Some(t) = next
        && let Ok(v) = HeaderValue::from_str(&t)
    {
        r.headers_mut().insert("x-nomad-nexttoken", v);
    }
    Ok(r)
}

/// Only these methods are allowed; anything else is Nomad's 405.
pub fn require_method(method: &Method, allowed: &[Method]) -> Result<(), HttpError> {
    if allowed.contains(method) { Ok(()) } else { Err(HttpError::invalid_method()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<QueryOptions, HttpError> {
        QueryOptions::parse(&format!("/v1/jobs?{s}").parse::<Uri>().unwrap())
    }

    #[test]
    fn query_options_parse_and_refuse_bad_values() {
        let o = q("index=7&wait=5s&prefix=we&namespace=*&per_page=2&reverse=true").unwrap();
        assert_eq!((o.min_index, o.wait, o.prefix.as_str(), o.per_page, o.reverse), (7, Duration::from_secs(5), "we", 2, true));
        assert_eq!(o.namespace_filter(), None);
        assert_eq!(q("wait=soon").unwrap_err().message, "Invalid wait time");
        assert_eq!(q("index=-1").unwrap_err().message, "Invalid index");
        assert_eq!(q("wait=10m").unwrap().wait, MAX_BLOCKING_WAIT);
        assert!(!q("reverse=True").unwrap().reverse, "only the literal true counts");
        assert_eq!(q("").unwrap().namespace, "default");
        assert!(q("filter=Status%20%3D%3D%20running").unwrap().filter.is_some());
        let e = q("filter=Status%20%3D").unwrap_err();
        assert!(e.message.starts_with("failed to create result paginator: "), "{}", e.message);
    }

    #[test]
    fn bool_params_follow_go() {
        let o = q("a=True&b=0&c=yes").unwrap();
        assert!(o.bool("a", false).unwrap());
        assert!(!o.bool("b", true).unwrap());
        assert_eq!(
            o.bool("c", false).unwrap_err().message,
            "Failed to parse value of \"c\" (yes) as a bool: strconv.ParseBool: parsing \"yes\": invalid syntax",
            "Go's text, as Nomad's job deregister answers a bad `purge`"
        );
        assert!(o.bool("missing", true).unwrap());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb+c%zz%"), "a/b c%zz%");
    }

    #[test]
    fn pagination_hands_out_tokens() {
        let o = q("per_page=2").unwrap();
        let (page, next) = paginate(vec!["a", "b", "c"], &o, |s| s.to_string());
        assert_eq!((page, next), (vec!["a", "b"], Some("c".to_string())));
        let o = q("per_page=2&next_token=c").unwrap();
        let (page, next) = paginate(vec!["a", "b", "c"], &o, |s| s.to_string());
        assert_eq!((page, next), (vec!["c"], None));
    }

    #[test]
    fn empty_and_malformed_bodies_are_400s() {
        #[derive(serde::Deserialize, Debug)]
        struct X {
            #[allow(dead_code)]
            a: i64,
        }
        assert_eq!(decode_body::<X>(b"  ").unwrap_err().message, "Request body is empty");
        let e = decode_body::<X>(b"{\"a\":").unwrap_err();
        assert_eq!(e.code, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("invalid JSON"));
    }
}
