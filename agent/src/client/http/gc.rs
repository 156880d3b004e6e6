//! `/v1/client/gc?node_id=` (every terminal alloc of this node) and
//! `/v1/client/allocation/<alloc_id>/gc` (one), any method as Nomad's; empty 200 answers.
//! See `client::gc`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use nomad_server::http::util::{HttpError, QueryOptions};

use super::{ClientHttp, Target, local_node_client};
use crate::client::gc::{GcError, collect, collect_all};

pub(super) async fn alloc(State(state): State<ClientHttp>, Path(alloc_id): Path<String>, req: Request<Body>) -> Response {
    if let Target::Done(resp) = state.target(&alloc_id, req).await {
        return resp;
    }
    let Some(client) = state.client.as_ref() else { return super::unknown_alloc(&alloc_id).into_response() };
    match collect(client, &alloc_id).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e @ GcError::UnknownAlloc(_)) => HttpError::not_found(e.to_string()).into_response(),
        Err(e) => HttpError::bad_request(e.to_string()).into_response(),
    }
}

pub(super) async fn all(State(state): State<ClientHttp>, req: Request<Body>) -> Response {
    let q = match QueryOptions::parse(req.uri()) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    match local_node_client(&state, q.params.get("node_id").map(String::as_str)) {
        Ok(client) => {
            let ids = collect_all(&client).await;
            tracing::info!(allocs = ids.len(), "garbage collected terminal allocs on request");
            StatusCode::OK.into_response()
        }
        Err(e) => e.into_response(),
    }
}
