//! `GET /v1/client/allocation/<alloc_id>/exec?task=&command=<JSON array>&tty=&ws_handshake=`:
//! a command in a running task, over a websocket, in Nomad's frame protocol (JSON text
//! messages):
//!
//! - client → agent: `{"stdin":{"data":"<base64>"}}`, `{"stdin":{"close":true}}`,
//!   `{"tty_size":{"height":H,"width":W}}`, and `{}` as a heartbeat; with `ws_handshake=true`
//!   the first message is `{"version":1,"auth_token":"..."}`.
//! - agent → client: `{"stdout":{"data":"<base64>"}}`, `{"stderr":{"data":"<base64>"}}`,
//!   `{"stdout":{"close":true}}` (and stderr's) at their ends, then
//!   `{"exited":true,"result":{"exit_code":N}}` and a normal close.
//!
//! The session runs through the task's driver (`Driver::exec_streaming`), so every driver's
//! isolation applies. A request that cannot run (no task, no command, task not running) is
//! answered after the upgrade with a close frame carrying Nomad's message (1008 for what the
//! caller got wrong, 1011 for a failure here), as Nomad's agent does.
//!
//! For an alloc another agent serves (see the module docs of `http`), this agent opens the
//! exec websocket one hop on first (an HTTP refusal there is answered as it is), then upgrades
//! the caller and relays messages both ways, close frames included. Towards the alloc's node a
//! handshake is read here and not passed on; the caller's `X-Nomad-Token`/`Authorization`
//! headers are, so the node authorizes the same caller.

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use nomad_proto::alloc::task_state;
use nomad_server::http::util::{HttpError, QueryOptions, parse_bool, require_method};
use serde::Deserialize;
use serde_json::json;

use super::forward::Hop;
use super::{ClientHttp, Located};
use crate::client::allocrunner::AllocRunner;
use crate::client::base64;
use crate::client::driver::{ExecInput, ExecOutputChunk};

/// Largest websocket message accepted from the caller (a stdin chunk in base64).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Most command words, and bytes in them together.
pub const MAX_COMMAND_WORDS: usize = 1024;
const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// Close codes: the caller's mistake (Nomad's placeholder), or ours.
const CLOSE_POLICY: u16 = 1008;
const CLOSE_INTERNAL: u16 = 1011;

/// One message from the caller (`ExecTaskStreamingRequestMsg`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct InputMessage {
    stdin: Option<StdinMessage>,
    tty_size: Option<TtySize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StdinMessage {
    data: Option<String>,
    close: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TtySize {
    height: u16,
    width: u16,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Handshake {
    version: i64,
}

/// What the query asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExecRequest {
    task: String,
    command: Vec<String>,
    tty: bool,
    handshake: bool,
}

fn parse(q: &QueryOptions) -> Result<ExecRequest, HttpError> {
    let task = q.params.get("task").cloned().unwrap_or_default();
    let raw = q.params.get("command").map(String::as_str).unwrap_or("");
    if raw.len() > MAX_COMMAND_BYTES {
        return Err(HttpError::bad_request(format!("command is longer than {MAX_COMMAND_BYTES} bytes")));
    }
    let command: Vec<String> = if raw.is_empty() {
        Vec::new()
    } else {
        serde_json::from_str(raw).map_err(|e| HttpError::bad_request(format!("failed to unmarshal command: {e}")))?
    };
    if command.len() > MAX_COMMAND_WORDS {
        return Err(HttpError::bad_request(format!("command has more than {MAX_COMMAND_WORDS} words")));
    }
    let flag = |name: &str, what: &str| -> Result<bool, HttpError> {
        match q.params.get(name).filter(|v| !v.is_empty()) {
            None => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(|| HttpError::bad_request(format!("{what} value is not a boolean: {v:?}"))),
        }
    };
    Ok(ExecRequest { task, command, tty: flag("tty", "tty")?, handshake: flag("ws_handshake", "ws_handshake")? })
}

pub(super) async fn handle(State(state): State<ClientHttp>, Path(alloc_id): Path<String>, req: Request<Body>) -> Response {
    serve(state, alloc_id, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn serve(state: ClientHttp, alloc_id: String, req: Request<Body>) -> Result<Response, HttpError> {
    require_method(req.method(), &[Method::GET])?;
    let q = QueryOptions::parse(req.uri())?;
    let exec = parse(&q)?;
    let located = state.locate(&alloc_id, &req);
    let (mut parts, _) = req.into_parts();
    match located {
        Located::Nowhere(e) => Err(e),
        Located::Local(runner) => Ok(upgrade(&mut parts, &state).await?.on_upgrade(move |socket| session(socket, runner, exec))),
        Located::Remote(addr, hop) => {
            let caller = upgrade(&mut parts, &state).await?;
            let next = match relay::connect(&addr, hop, &parts).await {
                Ok(next) => next,
                Err(refused) => return Ok(refused),
            };
            let read_handshake = exec.handshake && hop == Hop::Node;
            Ok(caller.on_upgrade(move |socket| relay::run(socket, next, read_handshake)))
        }
    }
}

async fn upgrade(parts: &mut axum::http::request::Parts, state: &ClientHttp) -> Result<WebSocketUpgrade, HttpError> {
    WebSocketUpgrade::from_request_parts(parts, state)
        .await
        .map(|u| u.max_message_size(MAX_MESSAGE_BYTES))
        .map_err(|e| HttpError::bad_request(e.body_text()))
}

/// Reads the caller's handshake (`{"version":1,...}`); the close to send when it is wrong.
async fn handshake(socket: &mut WebSocket) -> Result<(), (u16, String)> {
    let first = socket.recv().await;
    let version = match &first {
        Some(Ok(Message::Text(t))) => serde_json::from_str::<Handshake>(t).map(|h| h.version).unwrap_or(0),
        _ => 0,
    };
    if version != 1 {
        return Err((CLOSE_POLICY, format!("unexpected handshake value: {version}")));
    }
    Ok(())
}

/// An exec session relayed to the agent one hop on.
mod relay {
    use axum::extract::ws::{CloseFrame, Message, WebSocket};
    use axum::http::request::Parts;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
    use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame as NextCloseFrame;
    use tokio_tungstenite::tungstenite::{Error as WsError, Message as NextMessage};

    use super::super::forward::{self, Hop};
    use super::{CLOSE_INTERNAL, MAX_MESSAGE_BYTES, close, handshake};

    /// How long the next hop has to accept the connection and the upgrade.
    const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

    pub(super) type Next = tokio_tungstenite::WebSocketStream<Box<dyn nomad_server::http::listener::Conn>>;

    /// The request's path and query for the next hop: towards the node, without `ws_handshake`
    /// (the handshake is read here).
    pub(super) fn next_path(parts: &Parts, hop: Hop) -> String {
        let path = parts.uri.path();
        let pairs: Vec<&str> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            // Towards the node the handshake is this agent's to read.
            .filter(|p| hop == Hop::Server || p.split('=').next() != Some("ws_handshake"))
            .collect();
        if pairs.is_empty() { path.to_string() } else { format!("{path}?{}", pairs.join("&")) }
    }

    /// Opens the exec websocket at `addr`; the answer to give the caller when it is refused.
    pub(super) async fn connect(addr: &str, hop: Hop, parts: &Parts) -> Result<Next, Response> {
        let failed =
            |e: &dyn std::fmt::Display| (StatusCode::BAD_GATEWAY, format!("forwarding to the agent at {addr}: {e}")).into_response();
        let mut request =
            format!("{}://{addr}{}", crate::tls::agent_ws_scheme(), next_path(parts, hop)).into_client_request().map_err(|e| failed(&e))?;
        let mut headers = HeaderMap::new();
        for name in forward::CREDENTIALS {
            if let Some(v) = parts.headers.get(*name) {
                headers.insert(*name, v.clone());
            }
        }
        forward::mark(&mut headers, hop);
        request.headers_mut().extend(headers);
        let config = WebSocketConfig::default().max_message_size(Some(MAX_MESSAGE_BYTES));
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let stream = crate::tls::agent_connect(addr).await.map_err(WsError::Io)?;
            tokio_tungstenite::client_async_with_config(request, stream, Some(config)).await
        })
        .await;
        match connected {
            Ok(Ok((next, _))) => Ok(next),
            // The next hop answered without upgrading (an unknown alloc, a bad request): as it said.
            Ok(Err(WsError::Http(refused))) => {
                let status = StatusCode::from_u16(refused.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
                let body = refused.body().clone().unwrap_or_default();
                Err((status, String::from_utf8_lossy(&body).into_owned()).into_response())
            }
            Ok(Err(e)) => Err(failed(&e)),
            Err(_) => Err(failed(&format!("no answer within {CONNECT_TIMEOUT:?}"))),
        }
    }

    fn to_next(frame: CloseFrame) -> NextCloseFrame {
        NextCloseFrame { code: frame.code.into(), reason: frame.reason.as_str().into() }
    }

    fn from_next(frame: NextCloseFrame) -> CloseFrame {
        CloseFrame { code: frame.code.into(), reason: frame.reason.as_str().into() }
    }

    /// Relays messages both ways until either side closes; a close frame goes on as it came.
    pub(super) async fn run(mut caller: WebSocket, next: Next, read_handshake: bool) {
        let (mut next_tx, mut next_rx) = next.split();
        if read_handshake && let Err((code, message)) = handshake(&mut caller).await {
            let _ = next_tx.send(NextMessage::Close(None)).await;
            return close(&mut caller, code, &message).await;
        }
        let (mut caller_tx, mut caller_rx) = caller.split();
        loop {
            tokio::select! {
                msg = caller_rx.next() => {
                    let out = match msg {
                        Some(Ok(Message::Text(t))) => NextMessage::text(t.as_str()),
                        Some(Ok(Message::Binary(b))) => NextMessage::binary(b),
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                        Some(Ok(Message::Close(frame))) => {
                            let _ = next_tx.send(NextMessage::Close(frame.map(to_next))).await;
                            return;
                        }
                        None | Some(Err(_)) => {
                            let _ = next_tx.send(NextMessage::Close(None)).await;
                            return;
                        }
                    };
                    if next_tx.send(out).await.is_err() {
                        let frame = CloseFrame { code: CLOSE_INTERNAL, reason: "the connection to the alloc's agent ended".into() };
                        let _ = caller_tx.send(Message::Close(Some(frame))).await;
                        return;
                    }
                }
                msg = next_rx.next() => {
                    let out = match msg {
                        Some(Ok(NextMessage::Text(t))) => Message::Text(t.as_str().into()),
                        Some(Ok(NextMessage::Binary(b))) => Message::Binary(b),
                        Some(Ok(NextMessage::Close(frame))) => {
                            let _ = caller_tx.send(Message::Close(frame.map(from_next))).await;
                            return;
                        }
                        Some(Ok(_)) => continue,
                        None | Some(Err(_)) => {
                            let frame = CloseFrame { code: CLOSE_INTERNAL, reason: "the connection to the alloc's agent ended".into() };
                            let _ = caller_tx.send(Message::Close(Some(frame))).await;
                            return;
                        }
                    };
                    if caller_tx.send(out).await.is_err() {
                        let _ = next_tx.send(NextMessage::Close(None)).await;
                        return;
                    }
                }
            }
        }
    }
}

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    // A close reason is at most 123 bytes.
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame { code, reason: reason[..end].into() };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// Nomad's checks before a session starts: (close code, message) when it cannot.
fn check(runner: &AllocRunner, exec: &ExecRequest) -> Result<(), (u16, String)> {
    if exec.task.is_empty() {
        return Err((CLOSE_POLICY, "must provide task name".into()));
    }
    if exec.command.is_empty() || exec.command[0].is_empty() {
        return Err((CLOSE_POLICY, "command is not present".into()));
    }
    let Some(task) = runner.task(&exec.task) else {
        return Err((CLOSE_POLICY, format!("unknown task name {:?}", exec.task)));
    };
    let state = task.state();
    if state.started_at.is_zero() {
        return Err((CLOSE_POLICY, format!("task {:?} not started yet.", exec.task)));
    }
    if state.state != task_state::RUNNING || task.handle().is_none() {
        return Err((CLOSE_POLICY, format!("task {:?} is not running.", exec.task)));
    }
    Ok(())
}

fn out_message(chunk: ExecOutputChunk) -> serde_json::Value {
    match chunk {
        ExecOutputChunk::Stdout(d) => json!({ "stdout": { "data": base64::encode(&d) } }),
        ExecOutputChunk::Stderr(d) => json!({ "stderr": { "data": base64::encode(&d) } }),
        ExecOutputChunk::StdoutClosed => json!({ "stdout": { "close": true } }),
        ExecOutputChunk::StderrClosed => json!({ "stderr": { "close": true } }),
    }
}

/// Turns a caller's message into session input; `Err` names what was wrong.
fn input_of(text: &str) -> Result<Vec<ExecInput>, String> {
    let msg: InputMessage = serde_json::from_str(text).map_err(|e| format!("malformed exec message: {e}"))?;
    let mut out = Vec::new();
    if let Some(stdin) = msg.stdin {
        if let Some(data) = stdin.data.filter(|d| !d.is_empty()) {
            out.push(ExecInput::Stdin(base64::decode(&data).map_err(|e| format!("stdin data is not base64: {e}"))?));
        }
        if stdin.close {
            out.push(ExecInput::CloseStdin);
        }
    } else if let Some(size) = msg.tty_size {
        out.push(ExecInput::Resize { height: size.height, width: size.width });
    }
    Ok(out)
}

async fn session(mut socket: WebSocket, runner: std::sync::Arc<AllocRunner>, exec: ExecRequest) {
    if exec.handshake
        && let Err((code, message)) = handshake(&mut socket).await
    {
        return close(&mut socket, code, &message).await;
    }
    if let Err((code, message)) = check(&runner, &exec) {
        return close(&mut socket, code, &message).await;
    }
    let Some((driver, handle)) = runner.task(&exec.task).and_then(|t| t.running_driver()) else {
        return close(&mut socket, CLOSE_POLICY, &format!("task {:?} is not running.", exec.task)).await;
    };
    tracing::info!(alloc_id = %runner.id(), task = %exec.task, command = ?exec.command, tty = exec.tty, "task exec session starting");
    let started = driver.exec_streaming(&handle, &exec.command[0], &exec.command[1..], exec.tty, None).await;
    let mut s = match started {
        Ok(s) => s,
        Err(e) => return close(&mut socket, CLOSE_INTERNAL, &e.to_string()).await,
    };
    let (mut tx, mut rx) = socket.split();
    let input = s.input.clone();
    // The caller's messages, until it goes away or the command ends.
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = rx.next().await {
            let text = match msg {
                Message::Text(t) => t.to_string(),
                Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                Message::Close(_) => break,
                _ => continue,
            };
            match input_of(&text) {
                Ok(items) => {
                    for item in items {
                        if input.send(item).await.is_err() {
                            return None;
                        }
                    }
                }
                Err(e) => return Some(e),
            }
        }
        None
    });
    let mut failed = None;
    let mut reader = Some(reader);
    loop {
        tokio::select! {
            chunk = s.output.recv() => match chunk {
                Some(chunk) => {
                    if tx.send(Message::Text(out_message(chunk).to_string().into())).await.is_err() {
                        break;
                    }
                }
                None => break,
            },
            done = async { reader.as_mut().expect("guarded").await }, if reader.is_some() => {
                reader = None;
                if let Ok(Some(e)) = done {
                    failed = Some(e);
                    break;
                }
                // The caller went away, or stopped sending: the command still runs to its end
                // (a closed socket fails the next send and ends it).
            }
        }
    }
    if let Some(r) = reader {
        r.abort();
    }
    let (code, reason) = match failed {
        Some(e) => (CLOSE_POLICY, e),
        None => match s.exit.await {
            Ok(Ok(exit_code)) => {
                let done = json!({ "exited": true, "result": { "exit_code": exit_code } });
                let _ = tx.send(Message::Text(done.to_string().into())).await;
                (1000, String::new())
            }
            Ok(Err(e)) => (CLOSE_INTERNAL, e.to_string()),
            Err(_) => (CLOSE_INTERNAL, "the command's session ended without an exit code".to_string()),
        },
    };
    let _ = tx.send(Message::Close(Some(CloseFrame { code, reason: reason.chars().take(100).collect::<String>().into() }))).await;
}

#[cfg(test)]
mod tests {
    use axum::http::Uri;

    use super::*;

    fn q(s: &str) -> Result<ExecRequest, HttpError> {
        parse(&QueryOptions::parse(&format!("/v1/client/allocation/a/exec?{s}").parse::<Uri>().unwrap()).unwrap())
    }

    #[test]
    fn queries_parse_as_nomads_and_bad_ones_are_named() {
        let r = q("task=web&command=%5B%22%2Fbin%2Fsh%22%2C%22-c%22%2C%22echo%20hi%22%5D&tty=true").unwrap();
        assert_eq!(r.command, vec!["/bin/sh", "-c", "echo hi"]);
        assert!(r.tty && !r.handshake && r.task == "web");
        assert!(q("task=web&command=nope").unwrap_err().message.contains("failed to unmarshal command"));
        assert!(q("task=web&command=%5B%5D&tty=maybe").unwrap_err().message.contains("tty value is not a boolean"));
    }

    #[test]
    fn input_messages_become_session_input() {
        assert_eq!(input_of(r#"{"stdin":{"data":"aGk="}}"#).unwrap(), vec![ExecInput::Stdin(b"hi".to_vec())]);
        assert_eq!(input_of(r#"{"stdin":{"close":true}}"#).unwrap(), vec![ExecInput::CloseStdin]);
        assert_eq!(input_of(r#"{"tty_size":{"height":30,"width":100}}"#).unwrap(), vec![ExecInput::Resize { height: 30, width: 100 }]);
        assert_eq!(input_of("{}").unwrap(), vec![], "a heartbeat");
        assert!(input_of(r#"{"stdin":{"data":"!!"}}"#).unwrap_err().contains("base64"));
        assert!(input_of("[").unwrap_err().contains("malformed"));
    }

    #[test]
    fn the_next_hop_to_the_node_is_asked_without_the_handshake() {
        let parts = |uri: &str| axum::http::Request::get(uri).body(()).unwrap().into_parts().0;
        let p = parts("/v1/client/allocation/a/exec?task=t&ws_handshake=true&command=%5B%22sh%22%5D&tty=true");
        assert_eq!(relay::next_path(&p, Hop::Node), "/v1/client/allocation/a/exec?task=t&command=%5B%22sh%22%5D&tty=true");
        assert_eq!(
            relay::next_path(&p, Hop::Server),
            "/v1/client/allocation/a/exec?task=t&ws_handshake=true&command=%5B%22sh%22%5D&tty=true"
        );
        assert_eq!(relay::next_path(&parts("/v1/client/allocation/a/exec?ws_handshake=1"), Hop::Node), "/v1/client/allocation/a/exec");
    }

    #[test]
    fn output_frames_are_nomads() {
        assert_eq!(out_message(ExecOutputChunk::Stdout(b"hi".to_vec())), json!({"stdout": {"data": "aGk="}}));
        assert_eq!(out_message(ExecOutputChunk::StderrClosed), json!({"stderr": {"close": true}}));
    }
}
