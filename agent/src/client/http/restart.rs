//! `PUT|POST /v1/client/allocation/<alloc_id>/restart`, optional body `{TaskName, AllTasks}` →
//! `{"Index": 0}`. Restarts one task (or every running one) without counting against the
//! restart policy; each gets a `Restart Signaled` event.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use nomad_server::http::util::{HttpError, json_response, read_body, require_method};
use serde::Deserialize;

use super::{ClientHttp, Target};
use crate::client::allocrunner::RestartError;

/// The optional request body.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct RestartRequest {
    task_name: String,
    all_tasks: bool,
}

pub(super) async fn handle(State(state): State<ClientHttp>, Path(alloc_id): Path<String>, req: Request<Body>) -> Response {
    match serve(state, alloc_id, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve(state: ClientHttp, alloc_id: String, req: Request<Body>) -> Result<Response, HttpError> {
    require_method(req.method(), &[Method::PUT, Method::POST])?;
    let (parts, body) = req.into_parts();
    let bytes = read_body(body).await?;
    let args: RestartRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        RestartRequest::default()
    } else {
        nomad_proto::lenient::from_slice(&bytes).map_err(|e| HttpError::bad_request(e.to_string()))?
    };
    let runner = match state.target(&alloc_id, Request::from_parts(parts, Body::from(bytes))).await {
        Target::Local(r) => r,
        Target::Done(resp) => return Ok(resp),
    };
    let task = (!args.task_name.is_empty()).then_some(args.task_name.as_str());
    runner.restart(task, args.all_tasks).map_err(|e| match e {
        RestartError::UnknownTask(_) => HttpError::bad_request(e.to_string()),
        RestartError::NotRunning(_) => HttpError::bad_request(e.to_string()),
    })?;
    json_response(&serde_json::json!({ "Index": 0 }), None, false)
}
