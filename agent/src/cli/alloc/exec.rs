//! `nomad-rs alloc exec [-i] [-t] [-task TASK] <alloc> <command> [args...]`: a command in a
//! running task over the agent's websocket (`/v1/client/allocation/<id>/exec`, Nomad's frame
//! protocol). With `-t` the local terminal is put in raw mode for the session (restored after)
//! and its size is sent at the start and on every SIGWINCH; `-i` (on by default) forwards stdin.
//! The command's exit code is this command's.

use std::io::Write;

use clap::Args;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::cli::api::{ApiFlags, encode_path, encode_query};
use crate::cli::{CmdResult, Ctx, Failure, prefix};

/// Flags of `alloc exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Forward stdin to the command.
    #[arg(short = 'i', default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub stdin: bool,
    /// Give the command a terminal (the default when stdin is one).
    #[arg(short = 't', action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub tty: Option<bool>,
    /// The task to run in (optional when the allocation runs one).
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
    /// The command and its arguments.
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// The websocket URL for a session.
pub fn exec_url(address: &str, alloc_id: &str, task: &str, command: &[String], tty: bool) -> String {
    let ws =
        if let Some(rest) = address.strip_prefix("https://") { format!("wss://{rest}") } else { address.replacen("http://", "ws://", 1) };
    let cmd = serde_json::to_string(command).unwrap_or_default();
    format!("{ws}/v1/client/allocation/{}/exec?task={}&tty={tty}&command={}", encode_path(alloc_id), encode_query(task), encode_query(&cmd))
}

/// Restores the terminal's settings when dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else { return RawMode(None) };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        if tcsetattr(&stdin, SetArg::TCSANOW, &raw).is_err() {
            return RawMode(None);
        }
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, saved);
        }
    }
}

/// The local terminal's size (rows, columns).
fn terminal_size() -> Option<(u16, u16)> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize into the pointer, which outlives the call.
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ as _, &mut ws) };
    (r == 0 && ws.ws_row > 0).then_some((ws.ws_row, ws.ws_col))
}

fn tty_size_message((height, width): (u16, u16)) -> Message {
    Message::Text(json!({ "tty_size": { "height": height, "width": width } }).to_string().into())
}

/// Runs `alloc exec`.
pub async fn run(api: &ApiFlags, args: ExecArgs) -> CmdResult {
    use std::io::IsTerminal;
    let tty = args.tty.unwrap_or_else(|| std::io::stdin().is_terminal());
    let ctx = Ctx::new(api)?;
    let alloc = prefix::full_alloc(&ctx, &args.alloc).await?;
    let task = super::pick_task(&alloc, args.task.as_deref())?;
    let config = ctx.client.config().clone();
    let url = exec_url(&config.address, &alloc.id, &task, &args.command, tty);
    let failed = |e: &dyn std::fmt::Display| Failure::new(format!("failed to exec into task: {e}"));
    let mut request = url.as_str().into_client_request().map_err(|e| failed(&e))?;
    if let Some(token) = &config.token {
        request.headers_mut().insert("x-nomad-token", token.parse().map_err(|_| Failure::new("the token is not a valid header value"))?);
    }
    let authority = request.uri().authority().map(|a| a.to_string()).unwrap_or_default();
    let tcp = tokio::net::TcpStream::connect(&authority).await.map_err(|e| failed(&format!("connect to {authority}: {e}")))?;
    let stream: Box<dyn nomad_server::http::listener::Conn> = if url.starts_with("wss://") {
        let host = request.uri().host().unwrap_or_default().to_string();
        Box::new(config.tls.connect(&host, tcp).await.map_err(|e| failed(&format!("TLS to {authority}: {e:#}")))?)
    } else {
        Box::new(tcp)
    };
    let (socket, _) = tokio_tungstenite::client_async(request, stream).await.map_err(|e| failed(&e))?;
    let (mut tx, mut rx) = socket.split();

    let _raw = tty.then(RawMode::enter);
    if tty && let Some(size) = terminal_size() {
        tx.send(tty_size_message(size)).await.map_err(|e| failed(&e))?;
    }
    let (to_send, mut outgoing) = tokio::sync::mpsc::channel::<Message>(16);
    if args.stdin {
        let to_send = to_send.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = to_send.send(Message::Text(json!({"stdin": {"close": true}}).to_string().into())).await;
                        return;
                    }
                    Ok(n) => {
                        let msg = json!({"stdin": {"data": crate::client::base64::encode(&buf[..n])}});
                        if to_send.send(Message::Text(msg.to_string().into())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    } else {
        let _ = to_send.send(Message::Text(json!({"stdin": {"close": true}}).to_string().into())).await;
    }
    if tty {
        let to_send = to_send.clone();
        tokio::spawn(async move {
            let Ok(mut winch) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()) else { return };
            while winch.recv().await.is_some() {
                if let Some(size) = terminal_size()
                    && to_send.send(tty_size_message(size)).await.is_err()
                {
                    return;
                }
            }
        });
    }
    drop(to_send);
    let mut exit_code: Option<i32> = None;
    let mut close_reason: Option<String> = None;
    loop {
        tokio::select! {
            Some(msg) = outgoing.recv() => {
                if tx.send(msg).await.is_err() {
                    break;
                }
            }
            incoming = rx.next() => match incoming {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                    write_output(&v);
                    if v["exited"].as_bool() == Some(true) {
                        exit_code = Some(v["result"]["exit_code"].as_i64().unwrap_or(0) as i32);
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    close_reason = frame.filter(|f| u16::from(f.code) != 1000).map(|f| f.reason.to_string());
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    close_reason = Some(e.to_string());
                    break;
                }
                None => break,
            },
        }
    }
    drop(_raw);
    match (exit_code, close_reason) {
        (Some(code), _) => Ok(code.clamp(0, 255) as u8),
        (None, Some(reason)) => Err(failed(&reason)),
        (None, None) => Err(failed(&"the session ended without an exit code")),
    }
}

fn write_output(v: &Value) {
    let decode = |s: &Value| s["data"].as_str().and_then(|d| crate::client::base64::decode(d).ok());
    if let Some(data) = decode(&v["stdout"]) {
        let mut out = std::io::stdout();
        let _ = out.write_all(&data).and_then(|()| out.flush());
    }
    if let Some(data) = decode(&v["stderr"]) {
        let mut err = std::io::stderr();
        let _ = err.write_all(&data).and_then(|()| err.flush());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_carries_the_command_as_json() {
        let url = exec_url("http://127.0.0.1:4646", "abc", "web", &["/bin/sh".into(), "-c".into(), "echo hi".into()], true);
        assert!(url.starts_with("ws://127.0.0.1:4646/v1/client/allocation/abc/exec?task=web&tty=true&command="), "{url}");
        let q = url.split("command=").nth(1).unwrap();
        assert_eq!(q, "%5B%22%2Fbin%2Fsh%22%2C%22-c%22%2C%22echo%20hi%22%5D");
    }
}
