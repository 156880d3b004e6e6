//! `/v1/operator/raft/*`: the servers of the Raft configuration, and removing one that is gone
//! for good (`nomad operator raft list-peers` / `remove-peer`). Without the removal a dead
//! server stays a voter forever, and a three-server cluster that lost one for good would lose
//! its quorum at the next failure.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use serde_json::json;

use super::HttpState;
use super::util::{HttpError, QueryOptions, json_response, require_method};
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
