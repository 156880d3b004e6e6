//! `nomad-rs monitor [-log-level L] [-json] [-node-id ID] [-server-id ID]`: streams the agent's
//! log lines (`GET /v1/agent/monitor`) to stdout until the agent ends the stream or Ctrl-C, as
//! Nomad's `monitor`. The stream is Nomad's frames (`{"Data": <base64>}`, `{}` heartbeats),
//! concatenated JSON objects.

use std::io::Write;

use base64::Engine as _;
use clap::Args;
use http_body_util::BodyExt as _;

use super::api::{ApiFlags, Query};
use super::{CmdResult, Ctx, Failure, exit};

/// Flags of `monitor`.
#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The level to stream at (default: INFO), whatever level the agent logs at.
    #[arg(long = "log-level", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// The node whose agent to stream (that agent must be the one asked).
    #[arg(long = "node-id", value_name = "ID")]
    pub node_id: Option<String>,
    /// The server whose agent to stream (that agent must be the one asked).
    #[arg(long = "server-id", value_name = "ID")]
    pub server_id: Option<String>,
    /// Log lines as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A frame's payload larger than this ends the stream as broken (the agent frames 1 KiB).
const MAX_PENDING_BYTES: usize = 4 * 1024 * 1024;

/// Runs `monitor`.
pub async fn run(args: MonitorArgs) -> CmdResult {
    let ctx = Ctx::new(&args.api)?;
    let q = Query::new()
        .param("log_level", args.log_level.clone().unwrap_or_default())
        .param("node_id", args.node_id.clone().unwrap_or_default())
        .param("server_id", args.server_id.clone().unwrap_or_default())
        .param("log_json", args.json.to_string());
    let mut body = ctx
        .client
        .get_stream("/v1/agent/monitor", &q)
        .await
        .map_err(|e| Failure::new(format!("==> Error starting monitor: {e}\n==> For additional help try 'nomad-rs monitor -help'")))?;
    let mut stdout = std::io::stdout();
    let stream = async {
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Failure::new(format!("==> error monitoring logs: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            pending.extend_from_slice(&data);
            let (lines, used) = decode_frames(&pending).map_err(|e| Failure::new(format!("==> error monitoring logs: {e}")))?;
            pending.drain(..used);
            if pending.len() > MAX_PENDING_BYTES {
                return Err(Failure::new("==> error monitoring logs: a frame larger than 4 MiB"));
            }
            if !lines.is_empty() && stdout.write_all(&lines).and_then(|()| stdout.flush()).is_err() {
                // The reader went away (a closed pipe): stop quietly.
                return Ok(exit::OK);
            }
        }
        Ok(exit::OK)
    };
    tokio::select! {
        r = stream => r,
        _ = super::interrupted() => Ok(exit::OK),
    }
}

/// The log bytes of the complete frames at the start of `buf`, and how many bytes they took
/// (a frame cut short waits for the rest).
fn decode_frames(buf: &[u8]) -> Result<(Vec<u8>, usize), String> {
    let mut out = Vec::new();
    let mut frames = serde_json::Deserializer::from_slice(buf).into_iter::<serde_json::Value>();
    let mut used = 0;
    loop {
        match frames.next() {
            None => break,
            Some(Ok(frame)) => {
                used = frames.byte_offset();
                if let Some(data) = frame.get("Data").and_then(|d| d.as_str()) {
                    let bytes = base64::engine::general_purpose::STANDARD.decode(data).map_err(|e| format!("bad frame data: {e}"))?;
                    out.extend_from_slice(&bytes);
                }
            }
            Some(Err(e)) if e.is_eof() => break,
            Some(Err(e)) => return Err(format!("bad frame: {e}")),
        }
    }
    Ok((out, used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_decoded_across_chunk_boundaries() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let stream = format!("{{\"Data\":\"{}\",\"FileEvent\":\"log\"}}{{}}{{\"Data\":\"{}\"}}", b64("one\n"), b64("two\n"));
        let cut = stream.len() - 5;
        let (lines, used) = decode_frames(&stream.as_bytes()[..cut]).unwrap();
        assert_eq!(lines, b"one\n", "the heartbeat prints nothing, the cut frame waits");
        let rest = format!("{}{}", &stream[used..cut], &stream[cut..]);
        let (lines, used) = decode_frames(rest.as_bytes()).unwrap();
        assert_eq!((lines.as_slice(), used), (&b"two\n"[..], rest.len()));
        assert!(decode_frames(b"{\"Data\":\"!!\"}").is_err());
        assert!(decode_frames(b"nonsense").is_err());
    }
}
