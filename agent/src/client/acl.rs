//! ACLs on a client-only agent's own routes (`/v1/client/*`): the caller's token is resolved
//! through the servers (`Node.ResolveToken`, as Nomad's client asks `ACL.ResolveToken`), the
//! policies compiled here with `nomad_server::acl`, and the answer cached per secret for
//! `min(token_ttl, policy_ttl)` (30 s by default). The rows are the servers' own
//! ([`nomad_server::http::authz::ROWS`], decided by [`decide`]); an alloc's namespace comes from
//! this client's own allocs. An alloc not running here passes if any namespace allows: the
//! request goes on to a server, which checks it again against its state.
//!
//! A token's expiry is checked at every use, cached or not; refusals are not cached, so a token
//! created a moment ago works at once. A deleted token or a changed policy may still be honoured
//! for up to the TTL, as in Nomad.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use nomad_proto::Timestamp;
use nomad_proto::rpc::NodeResolveTokenRequest;
use nomad_server::acl::{Acl, Policy};
use nomad_server::http::authz::{AllocFacts, Need, decide, query_task, request_secret, row_for};
use nomad_server::http::util::HttpError;

use super::Client;

/// One resolve call may take this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Cached secrets at most; the cache starts over when full.
const MAX_CACHED: usize = 4096;

/// A resolved token: its ACL and expiry.
#[derive(Clone)]
struct Resolved {
    acl: Arc<Acl>,
    expires: Option<Timestamp>,
    at: Instant,
}

/// The client's token cache and what it resolves with.
pub struct ClientAcl {
    client: Client,
    ttl: Duration,
    cache: Mutex<HashMap<String, Resolved>>,
}

/// Why a secret gives no ACL: Nomad's refusal text (403), or a failure to ask (500).
enum Refused {
    Token(String),
    Unresolved(String),
}

impl ClientAcl {
    /// Resolves through `client`'s servers; answers live for `ttl`.
    pub fn new(client: Client, ttl: Duration) -> ClientAcl {
        ClientAcl { client, ttl, cache: Mutex::new(HashMap::new()) }
    }

    async fn resolve(&self, secret: &str) -> Result<Arc<Acl>, Refused> {
        let now = Timestamp::now();
        let cached = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(secret).filter(|r| r.at.elapsed() < self.ttl).cloned();
        let resolved = match cached {
            Some(r) => r,
            None => {
                let r = self.ask(secret).await?;
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
                cache.insert(secret.to_string(), r.clone());
                r
            }
        };
        if resolved.expires.is_some_and(|t| t <= now) {
            return Err(Refused::Token("ACL token expired".into()));
        }
        Ok(resolved.acl)
    }

    async fn ask(&self, secret: &str) -> Result<Resolved, Refused> {
        let req = NodeResolveTokenRequest {
            node_id: self.client.node_id().to_string(),
            secret_id: self.client.inner.identity.secret_id.clone(),
            auth_token: secret.to_string(),
            region: self.client.inner.config.region.clone(),
        };
        let resp = self
            .client
            .inner
            .servers
            .node(CALL_TIMEOUT, |mut c| async move { c.resolve_token(req).await })
            .await
            .map_err(|e| Refused::Unresolved(format!("failed to resolve ACL token: {e}")))?;
        if !resp.error.is_empty() {
            return Err(Refused::Token(resp.error));
        }
        let acl = if resp.token_type == nomad_server::acl::MANAGEMENT {
            Acl::management()
        } else {
            // Stored policies were validated on write; one that no longer parses grants nothing.
            let parsed: Vec<Policy> = resp.policies.iter().filter_map(|p| Policy::parse(&p.rules).ok()).collect();
            Acl::compile(&parsed)
        };
        Ok(Resolved { acl: Arc::new(acl), expires: resp.expiration_time, at: Instant::now() })
    }
}

/// The middleware: the servers' row for the request, checked with the caller's ACL and this
/// client's allocs.
pub async fn authorize(State(acls): State<Arc<ClientAcl>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let Some(row) = row_for(req.method(), &path) else { return denied() };
    // Open routes (`/v1/metrics`) need no token, so no server is asked about one.
    if row.need == Need::Public {
        return next.run(req).await;
    }
    let acl = match acls.resolve(&request_secret(req.headers())).await {
        Ok(acl) => acl,
        Err(Refused::Token(text)) => return HttpError { code: StatusCode::FORBIDDEN, message: text }.into_response(),
        Err(Refused::Unresolved(text)) => return HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: text }.into_response(),
    };
    let task = query_task(req.uri());
    let facts = |id: &str| acls.client.alloc_runner(id).map(|r| AllocFacts::of(&r.alloc(), task.as_deref()));
    if !decide(row.need, &acl, &path, facts) {
        return denied();
    }
    next.run(req).await
}

fn denied() -> Response {
    HttpError { code: StatusCode::FORBIDDEN, message: "Permission denied".into() }.into_response()
}
