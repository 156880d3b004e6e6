//! `/v1/operator/raft/*`: the servers of the Raft configuration, and removing one that is gone
//! for good (`nomad operator raft list-peers` / `remove-peer`). Without the removal a dead
//! server stays a voter forever, and a three-server cluster that lost one for good would lose
//! its quorum at the next failure.
//!
//! `/v1/operator/snapshot`: GET saves the state as an archive (`crate::snapshot`), PUT/POST
//! restores one through Raft (`nomad operator snapshot save|restore`).
//!
//! `/v1/operator/scheduler/configuration`: the scheduler configuration (`PauseEvalBroker`
//! honoured, see `crate::state::SchedulerConfiguration`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, Uri};
use axum::response::Response;
use serde_json::json;

use super::HttpState;
use super::util::{HttpError, QueryOptions, json_response, read_body, require_method, set_meta};
use crate::endpoints::EndpointError;

/// `GET /v1/operator/raft/configuration`.
pub async fn raft_configuration(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let servers: Vec<_> = s
            .endpoints
            .consensus()
            .raft_configuration()
            .into_iter()
            .map(|p| {
                json!({
                    "ID": p.id.to_string(),
                    "Node": p.addr,
                    "Address": p.addr,
                    "Leader": p.leader,
                    "Voter": p.voter,
                    "RaftProtocol": "3",
                })
            })
            .collect();
        let index = s.endpoints.store().snapshot().index;
        json_response(&json!({ "Index": index, "Servers": servers }), None, q.pretty)
    })
    .await
}

/// `DELETE /v1/operator/raft/peer?id=<raft id>` or `?address=<ip:port>`.
pub async fn raft_peer(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::DELETE])?;
        let q = QueryOptions::parse(&uri)?;
        let peers = s.endpoints.consensus().raft_configuration();
        let id = match (q.params.get("id").filter(|v| !v.is_empty()), q.params.get("address").filter(|v| !v.is_empty())) {
            (Some(_), Some(_)) => return Err(HttpError::bad_request("Must specify only one of ?id or ?address")),
            (None, None) => {
                return Err(HttpError::bad_request(
                    "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove",
                ));
            }
            (Some(id), None) => {
                let id: u64 = id.parse().map_err(|_| HttpError::bad_request(format!("invalid server ID {id:?}: expected a number")))?;
                if !peers.iter().any(|p| p.id == id) {
                    return Err(HttpError::not_found(format!("id {id} was not found in the Raft configuration")));
                }
                id
            }
            (None, Some(addr)) => match peers.iter().find(|p| p.addr == *addr) {
                Some(p) => p.id,
                None => return Err(HttpError::not_found(format!("address {addr:?} was not found in the Raft configuration"))),
            },
        };
        s.endpoints.consensus().remove_raft_peer(id).await.map_err(EndpointError::from)?;
        json_response(&json!({}), None, q.pretty)
    })
    .await
}

/// `GET /v1/operator/snapshot` saves a snapshot (the archive as the body, `Digest` its SHA-256,
/// `X-Nomad-Index` the index it was saved at); `PUT|POST` restores the archive in the body
/// (at most [`crate::snapshot::MAX_ARCHIVE_BYTES`]) and answers with the restore's index.
/// A follower hands both to the leader (a save with `?stale` is answered from its own state).
pub async fn snapshot(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET, Method::PUT, Method::POST])?;
        // Only validated: a save with `?stale` is told apart by the forwarding layer.
        QueryOptions::parse(&uri)?;
        if method == Method::GET {
            let saved = s.endpoints.save_snapshot().await?;
            let digest = crate::snapshot::digest_header(&saved.archive);
            let mut response = Response::new(Body::from(saved.archive));
            let headers = response.headers_mut();
            headers.insert("content-type", HeaderValue::from_static("application/octet-stream"));
            headers.insert("digest", HeaderValue::try_from(digest).map_err(|e| EndpointError::Internal(e.to_string()))?);
            set_meta(headers, s.meta(saved.meta.index));
            return Ok(response);
        }
        let archive = read_body(body).await?;
        let index = s.endpoints.restore_snapshot(archive).await?;
        let mut response = Response::new(Body::empty());
        set_meta(response.headers_mut(), s.meta(index));
        Ok(response)
    })
    .await
}

/// `GET /v1/operator/scheduler/configuration` (operator read) answers
/// `{SchedulerConfig, Index, KnownLeader, LastContact}`; `PUT|POST` (operator write) writes the
/// configuration in the body, with `?cas=<ModifyIndex>` only over that one, and answers
/// `{Updated, Index}`.
pub async fn scheduler_configuration(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET, Method::PUT, Method::POST])?;
        let q = QueryOptions::parse(&uri)?;
        if method == Method::GET {
            let state = s.endpoints.store().snapshot();
            let index = state.table_index(crate::state::Table::SchedulerConfig).max(1);
            let meta = s.meta(index);
            let reply = json!({
                "SchedulerConfig": state.scheduler_config(),
                "Index": index,
                "KnownLeader": meta.known_leader,
                "LastContact": 0,
            });
            return json_response(&reply, Some(meta), q.pretty);
        }
        let body = read_body(body).await?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(HttpError::bad_request("Error parsing scheduler config: Request body is empty"));
        }
        let config: crate::state::SchedulerConfiguration =
            nomad_proto::lenient::from_slice(&body).map_err(|e| HttpError::bad_request(format!("Error parsing scheduler config: {e}")))?;
        let cas = match q.params.get("cas") {
            None => None,
            Some(v) => Some(v.parse::<u64>().map_err(|e| HttpError::bad_request(format!("Error parsing cas value: {e}")))?),
        };
        let (updated, index) = s.endpoints.set_scheduler_config(config, cas).await?;
        json_response(&json!({ "Updated": updated, "Index": index }), Some(s.meta(index)), q.pretty)
    })
    .await
}
