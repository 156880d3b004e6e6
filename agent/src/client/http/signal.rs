//! `PUT|POST /v1/client/allocation/<alloc_id>/signal`, body `{Signal, Task}` → `{"Index": 0}`.
//!
//! The signal goes through the task's driver (`Driver::signal`), so each driver delivers it its
//! own way (the process group, a container). Each task signalled gets a `Signaling` event with
//! the signal in its details, as Nomad's. With no `Task`, every task of the alloc is signalled
//! and the failures are reported together; a task that is not running is "Task not running".
//! A signal name that does not exist is a 400 with the text Nomad's drivers give
//! (`failed to parse signal: invalid signal "X" - valid signals are [...]`).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use nomad_server::http::util::{HttpError, json_response, read_body, require_method};
use serde::Deserialize;

use super::{ClientHttp, Target};
use crate::client::allocrunner::AllocRunner;
use crate::client::driver::signal_named;
use crate::client::taskrunner::events;

/// The request body (`AllocSignalRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct SignalRequest {
    signal: String,
    task: String,
}

/// Longest signal name accepted.
const MAX_SIGNAL_NAME: usize = 32;

pub(super) async fn handle(State(state): State<ClientHttp>, Path(alloc_id): Path<String>, req: Request<Body>) -> Response {
    serve(state, alloc_id, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn serve(state: ClientHttp, alloc_id: String, req: Request<Body>) -> Result<Response, HttpError> {
    require_method(req.method(), &[Method::PUT, Method::POST])?;
    let (parts, body) = req.into_parts();
    let bytes = read_body(body).await?;
    let args: SignalRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        SignalRequest::default()
    } else {
        nomad_proto::lenient::from_slice(&bytes).map_err(|e| HttpError::bad_request(format!("Failed to decode body: {e}")))?
    };
    if args.signal.len() > MAX_SIGNAL_NAME {
        return Err(HttpError::bad_request(format!("signal name is longer than {MAX_SIGNAL_NAME} bytes")));
    }
    let runner = match state.target(&alloc_id, Request::from_parts(parts, Body::from(bytes))).await {
        Target::Local(r) => r,
        Target::Done(resp) => return Ok(resp),
    };
    // A name no driver can deliver is the caller's mistake: 400 with the drivers' text.
    if let Err(e) = signal_named(&args.signal) {
        return Err(HttpError::bad_request(format!("failed to parse signal: {e}")));
    }
    signal_alloc(&runner, &args.task, &args.signal)
        .await
        .map_err(|message| HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message })?;
    json_response(&serde_json::json!({ "Index": 0 }), None, false)
}

/// Signals one task (or every task when `task` is empty) of the alloc.
pub async fn signal_alloc(runner: &AllocRunner, task: &str, signal: &str) -> Result<(), String> {
    let parsed = signal_named(signal).map_err(|e| e.to_string())?;
    if !task.is_empty() {
        if runner.task(task).is_none() {
            return Err("Task not found".into());
        }
        return signal_task(runner, task, signal, parsed).await;
    }
    let mut errors = Vec::new();
    for name in runner.task_names() {
        if let Err(e) = signal_task(runner, &name, signal, parsed).await {
            errors.push(format!("Failed to signal task: {name}, err: {e}"));
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = errors.iter().map(|e| format!("\t* {e}")).collect();
    Err(format!("{} error{} occurred:\n{}\n\n", errors.len(), if errors.len() == 1 { "" } else { "s" }, list.join("\n")))
}

async fn signal_task(runner: &AllocRunner, name: &str, text: &str, signal: nix::sys::signal::Signal) -> Result<(), String> {
    let task = runner.task(name).ok_or("Task not found")?;
    let (driver, handle) = task.running_driver().ok_or("Task not running")?;
    task.append_event(events::signaling(text));
    driver.signal(&handle, signal).await.map_err(|e| e.to_string())
}
