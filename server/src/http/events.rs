//! `GET /v1/event/stream`: NDJSON, a `{}` heartbeat at once and every 30 s.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, Uri};
use axum::response::Response;
use tokio_stream::wrappers::ReceiverStream;

use super::HttpState;
use super::util::{HttpError, QueryOptions, require_method};
use crate::events::TopicFilter;

/// Time between heartbeat lines, as Nomad.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

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
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
        tokio::spawn(async move {
            if tx.send(Ok(bytes::Bytes::from_static(b"{}\n"))).await.is_err() {
                return;
            }
            let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
            loop {
                tokio::select! {
                    next = sub.next() => match next {
                        Ok(batch) => {
                            if let Some(b) = filter.apply(&batch)
                                && tx.send(Ok(json_line(&b))).await.is_err() {
                                    return;
                                }
                        }
                        Err(closed) => {
                            let _ = tx.send(Ok(json_line(&serde_json::json!({ "Error": closed.to_string() })))).await;
                            return;
                        }
                    },
                    _ = beat.tick() => {
                        if tx.send(Ok(bytes::Bytes::from_static(b"{}\n"))).await.is_err() {
                            return;
                        }
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        let mut r = Response::new(Body::from_stream(ReceiverStream::new(rx)));
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
