//! `GET /v1/client/allocation/<alloc_id>/checks` (and `/v1/allocation/<alloc_id>/checks`, the
//! same handler in Nomad): the alloc's Nomad service check results by check ID, in Nomad's
//! `CheckQueryResult` shape; `null` when it has none. An alloc this client does not run is
//! found and forwarded like the other client routes; an unknown one is a 404.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use nomad_server::http::util::{json_response, require_method};

use super::{ClientHttp, Target};

pub(super) async fn handle(State(state): State<ClientHttp>, Path(alloc_id): Path<String>, req: Request<Body>) -> Response {
    if let Err(e) = require_method(req.method(), &[Method::GET]) {
        return e.into_response();
    }
    let pretty =
        req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "pretty" || kv.starts_with("pretty=") && kv != "pretty=false"));
    let runner = match state.target(&alloc_id, req).await {
        Target::Local(r) => r,
        Target::Done(resp) => return resp,
    };
    let results = state.client.as_ref().and_then(|c| c.nomad_check_results(runner.id()));
    json_response(&results, None, pretty).unwrap_or_else(IntoResponse::into_response)
}

/// Where the agent's router finds `/v1/allocation/<id>/checks`: under the client route's path,
/// which Nomad serves with the same handler (the server role's `/v1/allocation/{*rest}` would
/// otherwise take it). `None` for any other path.
pub(super) fn client_path_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/allocation/")?;
    let (id, tail) = rest.split_once('/')?;
    (!id.is_empty() && tail == "checks").then(|| format!("/v1/client/allocation/{id}/checks"))
}
