//! `GET /v1/event/stream`: NDJSON, a `{}` heartbeat at once and every 30 s.
//!
//! What a subscriber has not read yet is bounded in bytes ([`SUBSCRIBER_BUFFER_BYTES`]): once
//! that much waits for a slow reader, the stream stops taking batches from the broker, so the
//! subscriber lags behind the broker's ring buffer and is dropped with an error line there
//! (resumable from its last index), instead of its backlog growing in this process.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::HttpState;
use super::authz::Caller;
use super::util::{HttpError, QueryOptions, require_method};
use crate::acl::{Acl, AuthError};
use crate::events::{Event, TopicFilter, topic};
use crate::state::{StateStore, Table};

/// Time between heartbeat lines, as Nomad.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// Most bytes of encoded events one subscriber may have waiting to be read (one batch larger
/// than this is still sent, alone).
pub const SUBSCRIBER_BUFFER_BYTES: usize = 1024 * 1024;

/// A subscriber's outgoing lines, bounded by [`Outbox::budget`] bytes not yet taken by the
/// connection: each line holds its share of the budget until the response body yields it.
struct Outbox {
    tx: mpsc::Sender<(bytes::Bytes, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    limit: usize,
}

type Lines = std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send>>;

impl Outbox {
    /// An outbox of `limit` bytes and the stream a response body reads it from.
    fn new(limit: usize) -> (Outbox, Lines) {
        let (tx, rx) = mpsc::channel(16);
        let lines = ReceiverStream::new(rx).map(|(line, permit): (bytes::Bytes, OwnedSemaphorePermit)| {
            drop(permit);
            Ok(line)
        });
        (Outbox { tx, budget: Arc::new(Semaphore::new(limit)), limit }, Box::pin(lines))
    }

    /// Queues a line once the budget has room for it; `false` once the reader is gone.
    async fn send(&self, line: bytes::Bytes) -> bool {
        let need = u32::try_from(line.len().clamp(1, self.limit)).unwrap_or(u32::MAX);
        let permit = tokio::select! {
            p = self.budget.clone().acquire_many_owned(need) => match p {
                Ok(p) => p,
                Err(_) => return false,
            },
            _ = self.tx.closed() => return false,
        };
        self.tx.send((line, permit)).await.is_ok()
    }

    /// Lines queued and not yet taken by the reader, and the bytes of budget taken (by them and
    /// by a send waiting for more).
    #[cfg(test)]
    fn queued(&self) -> (usize, usize) {
        (self.tx.max_capacity() - self.tx.capacity(), self.limit - self.budget.available_permits())
    }
}

/// What a token may read of the stream (ACLs on).
///
/// The topics asked for are checked once, at subscription, in the namespace asked for; then
/// every event is checked again in its own namespace, so `namespace=*` carries only the
/// namespaces the token may read (Nomad 1.6 let it carry all of them: CVE-2025-0937). The
/// subscription closes when the token expires, is deleted, or loses the access it subscribed
/// with (a policy or role change).
struct StreamAcl {
    store: Arc<StateStore>,
    keyring: Arc<crate::keyring::Keyring>,
    secret: String,
    acl: Arc<Acl>,
    expires: Option<nomad_proto::Timestamp>,
}

/// The ACL tables whose changes may revoke a subscription.
const ACL_TABLES: [Table; 3] = [Table::AclTokens, Table::AclPolicies, Table::AclRoles];

/// Longest wait between two checks of a subscription's token when nothing in the ACL tables
/// changes (a safety net: changes and expiry wake the check at once).
const RECHECK: Duration = Duration::from_secs(60);

/// Whether `acl` may read events of `topic` in namespace `ns` (`*`: in some namespace).
fn may_read(acl: &Acl, topic: &str, ns: &str) -> bool {
    match topic {
        topic::JOB | topic::EVALUATION | topic::ALLOCATION | topic::DEPLOYMENT | topic::SERVICE => acl.allow_namespace_op(ns, "read-job"),
        topic::CSI_VOLUME => acl.allow_namespace_op(ns, "csi-read-volume"),
        topic::NODE => acl.allow_node(false),
        topic::CSI_PLUGIN => acl.allow_plugin_read(),
        // `*` and anything else (ACL objects, node pools): management only, as Nomad.
        _ => acl.is_management(),
    }
}

impl StreamAcl {
    /// Whether every topic of `filter` may be read in its namespace.
    fn allows(acl: &Acl, filter: &TopicFilter) -> bool {
        filter.topics().all(|t| may_read(acl, t, filter.namespace()))
    }

    fn allows_event(&self, e: &Event) -> bool {
        self.acl.is_management() || may_read(&self.acl, &e.topic, &e.namespace)
    }

    /// Resolves the token again (after an ACL change, at its expiry): the ACL tables' index it
    /// was checked at, or the reason the subscription ends.
    fn recheck(&mut self, filter: &TopicFilter) -> Result<u64, String> {
        // One snapshot for both: a change after it wakes the next wait.
        let snap = self.store.snapshot();
        let id = crate::acl::resolve(&snap, &self.keyring, &self.secret, nomad_proto::Timestamp::now()).map_err(|e| e.to_string())?;
        if !Self::allows(&id.acl, filter) {
            return Err(AuthError::Denied.to_string());
        }
        self.acl = id.acl;
        self.expires = id.token.expiration_time.filter(|t| !t.is_zero());
        Ok(snap.max_index(&ACL_TABLES))
    }

    /// Resolves when the token should be checked again: an ACL table changed after
    /// `seen_index`, the token's expiry came, or [`RECHECK`] passed.
    async fn until_recheck(&self, seen_index: u64) {
        // Just past the expiry, so that the token reads as expired when checked.
        let to_expiry = self
            .expires
            .map(|t| {
                Duration::from_nanos(u64::try_from(t.unix_nanos() - nomad_proto::Timestamp::now().unix_nanos()).unwrap_or(0))
                    + Duration::from_millis(1)
            })
            .unwrap_or(RECHECK);
        self.store.wait_for_change(&ACL_TABLES, seen_index, to_expiry.min(RECHECK)).await;
    }
}

/// `GET /v1/event/stream?index=&topic=Topic:Key&namespace=`.
pub async fn stream(State(s): State<HttpState>, caller: Option<Extension<Caller>>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let index: u64 = match q.params.get("index").filter(|v| !v.is_empty()) {
            Some(v) => v.parse().map_err(|_| HttpError::bad_request(format!("Unable to parse index: {v:?} is not a number")))?,
            None => 0,
        };
        let topics: Vec<&str> = q.multi.get("topic").map(|v| v.iter().map(String::as_str).collect()).unwrap_or_default();
        let filter = TopicFilter::parse(topics, &q.namespace).map_err(|e| HttpError::bad_request(e.to_string()))?;
        // The authorization layer put the caller here when ACLs are on.
        let guard = match caller {
            Some(Extension(Caller(id))) => {
                if !StreamAcl::allows(&id.acl, &filter) {
                    return Err(HttpError { code: StatusCode::FORBIDDEN, message: AuthError::Denied.to_string() });
                }
                let store = s.endpoints.store().clone();
                let keyring = s.endpoints.keyring().clone();
                let mut g = StreamAcl { store, keyring, secret: id.token.secret_id.clone(), acl: id.acl, expires: None };
                // Checked again here, with the index the revocation watch starts from.
                let index = g.recheck(&filter).map_err(|why| HttpError { code: StatusCode::FORBIDDEN, message: why })?;
                Some((g, index))
            }
            None => None,
        };
        let mut acl_index = guard.as_ref().map_or(0, |(_, i)| *i);
        let mut guard = guard.map(|(g, _)| g);
        let broker = s.endpoints.events().cloned().ok_or_else(|| HttpError::bad_request("Event stream is disabled on this agent"))?;
        let mut sub = broker.subscribe(index);
        let (tx, lines) = Outbox::new(SUBSCRIBER_BUFFER_BYTES);
        tokio::spawn(async move {
            if !tx.send(bytes::Bytes::from_static(b"{}\n")).await {
                return;
            }
            let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
            loop {
                let recheck = async {
                    match &guard {
                        Some(g) => g.until_recheck(acl_index).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    next = sub.next() => match next {
                        Ok(batch) => {
                            let b = match &guard {
                                // Expiry is checked before every batch, not only when the timer fires.
                                Some(g) if g.expires.is_some_and(|t| t < nomad_proto::Timestamp::now()) => {
                                    let _ = tx.send(json_line(&serde_json::json!({ "Error": AuthError::Expired.to_string() }))).await;
                                    return;
                                }
                                Some(g) => filter.apply_where(&batch, |e| g.allows_event(e)),
                                None => filter.apply(&batch),
                            };
                            if let Some(b) = b
                                && !tx.send(json_line(&b)).await {
                                    return;
                                }
                        }
                        Err(closed) => {
                            let _ = tx.send(json_line(&serde_json::json!({ "Error": closed.to_string() }))).await;
                            return;
                        }
                    },
                    _ = beat.tick() => {
                        if !tx.send(bytes::Bytes::from_static(b"{}\n")).await {
                            return;
                        }
                    }
                    _ = recheck => {
                        let Some(g) = guard.as_mut() else { continue };
                        match g.recheck(&filter) {
                            Ok(index) => acl_index = index,
                            Err(why) => {
                                let _ = tx.send(json_line(&serde_json::json!({ "Error": why }))).await;
                                return;
                            }
                        }
                    }
                    _ = tx.tx.closed() => return,
                }
            }
        });
        let mut r = Response::new(Body::from_stream(lines));
        r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        r.headers_mut().insert("cache-control", HeaderValue::from_static("no-cache"));
        Ok(r)
    })
    .await
}

/// One NDJSON line.
fn json_line(v: &impl serde::Serialize) -> bytes::Bytes {
    let text = serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"Error\":\"encoding event: {e}\"}}"));
    bytes::Bytes::from(format!("{text}\n"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_slow_readers_backlog_is_bounded_in_bytes() {
        let (outbox, mut lines) = Outbox::new(1000);
        let outbox = Arc::new(outbox);
        let sent = Arc::new(AtomicUsize::new(0));
        let line = bytes::Bytes::from(vec![b'x'; 300]);
        let writer = {
            let (outbox, line, sent) = (outbox.clone(), line.clone(), sent.clone());
            tokio::spawn(async move {
                for _ in 0..100 {
                    if !outbox.send(line.clone()).await {
                        return;
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        // Three lines fit in 1000 bytes; the fourth waits for the reader.
        until("the budget to fill", || sent.load(Ordering::SeqCst) == 3).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(sent.load(Ordering::SeqCst), 3, "more than the budget was queued for a reader that reads nothing");
        let (lines_queued, budget_taken) = outbox.queued();
        assert_eq!(lines_queued, 3);
        assert!(budget_taken <= 1000);
        // Reading one line makes room for exactly one more.
        assert_eq!(lines.next().await.unwrap().unwrap(), line);
        until("the next line to be queued", || sent.load(Ordering::SeqCst) == 4).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(sent.load(Ordering::SeqCst), 4, "reading one line made room for more than one");
        assert_eq!(outbox.queued().0, 3);
        // A reader that goes away ends the writer.
        drop(lines);
        writer.await.unwrap();
        assert_eq!(sent.load(Ordering::SeqCst), 4);
        // A line larger than the whole budget still goes out, alone.
        let (big, mut lines) = Outbox::new(10);
        assert!(big.send(bytes::Bytes::from(vec![b'y'; 50])).await);
        assert_eq!(lines.next().await.unwrap().unwrap().len(), 50);
    }
}
