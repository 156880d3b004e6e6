//! `GET /v1/event/stream`: NDJSON, a `{}` heartbeat at once and every 30 s.
//!
//! What a subscriber has not read yet is bounded in bytes ([`SUBSCRIBER_BUFFER_BYTES`]): once
//! that much waits for a slow reader, the stream stops taking batches from the broker, so the
//! subscriber lags behind the broker's ring buffer and is dropped with an error line there
//! (resumable from its last index), instead of its backlog growing in this process.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, Uri};
use axum::response::Response;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::HttpState;
use super::util::{HttpError, QueryOptions, require_method};
use crate::events::TopicFilter;

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

/// `GET /v1/event/stream?index=&topic=Topic:Key&namespace=`.
pub async fn stream(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let index: u64 = match q.params.get("index").filter(|v| !v.is_empty()) {
            Some(v) => v.parse().map_err(|_| HttpError::bad_request(format!("Unable to parse index: {v:?} is not a number")))?,
            None => 0,
        };
        let topics: Vec<&str> = q.multi.get("topic").map(|v| v.iter().map(String::as_str).collect()).unwrap_or_default();
        let filter = TopicFilter::parse(topics, &q.namespace).map_err(|e| HttpError::bad_request(e.to_string()))?;
        let broker = s.endpoints.events().cloned().ok_or_else(|| HttpError::bad_request("Event stream is disabled on this agent"))?;
        let mut sub = broker.subscribe(index);
        let (tx, lines) = Outbox::new(SUBSCRIBER_BUFFER_BYTES);
        tokio::spawn(async move {
            if !tx.send(bytes::Bytes::from_static(b"{}\n")).await {
                return;
            }
            let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
            loop {
                tokio::select! {
                    next = sub.next() => match next {
                        Ok(batch) => {
                            if let Some(b) = filter.apply(&batch)
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
