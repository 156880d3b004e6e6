//! `nomad-rs alloc fs [-stat] [-tail] [-f] [-n LINES] [-c BYTES] <alloc> [path]`: the alloc
//! dir through `/v1/client/fs/*`. A directory is listed (`ls`), a file printed (`cat`); `-stat`
//! describes the entry; `-tail` prints the end (`readat` from size − N), `-f` follows it
//! (`stream`, whose frames are decoded here).

use std::io::Write;

use clap::Args;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::{CmdResult, Ctx, Failure, exit, format, prefix};

/// Lines `-tail` shows when neither -n nor -c is given.
const DEFAULT_TAIL_LINES: u64 = 10;
/// Bytes asked for per wanted line when tailing; surplus lines are cut locally.
const BYTES_PER_LINE: u64 = 256;

/// Flags of `alloc fs`.
#[derive(Debug, Args)]
pub struct FsArgs {
    /// Describe the entry instead of printing it.
    #[arg(long)]
    pub stat: bool,
    /// Print the end of the file.
    #[arg(long)]
    pub tail: bool,
    /// Keep printing what is appended to the file.
    #[arg(short = 'f', long = "follow")]
    pub follow: bool,
    /// With -tail: lines.
    #[arg(short = 'n', value_name = "LINES")]
    pub lines: Option<u64>,
    /// With -tail: bytes.
    #[arg(short = 'c', value_name = "BYTES")]
    pub bytes: Option<u64>,
    /// Print JSON (with -stat or for a listing).
    #[arg(long)]
    pub json: bool,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
    /// Path in the alloc dir (default `/`).
    #[arg(value_name = "PATH", default_value = "/")]
    pub path: String,
}

fn failure(e: impl std::fmt::Display) -> Failure {
    Failure::new(format!("Error reading the alloc dir: {e}"))
}

/// `ls` rows as Nomad's CLI prints them.
pub fn listing(files: &[Value]) -> String {
    let rows: Vec<Vec<String>> = files
        .iter()
        .map(|f| {
            let name = f["Name"].as_str().unwrap_or("");
            let name = if f["IsDir"].as_bool() == Some(true) { format!("{name}/") } else { name.to_string() };
            vec![
                f["FileMode"].as_str().unwrap_or("").to_string(),
                f["Size"].as_i64().unwrap_or(0).to_string(),
                f["ModTime"].as_str().unwrap_or("").to_string(),
                format::safe(&name).into_owned(),
            ]
        })
        .collect();
    format::table_with_header(&["Mode", "Size", "Modified Time", "Name"], rows)
}

/// Runs `alloc fs`.
pub async fn run(api: &ApiFlags, args: FsArgs) -> CmdResult {
    if args.lines.is_some() && args.bytes.is_some() {
        return Err(Failure::new("Give -n or -c, not both"));
    }
    let ctx = Ctx::new(api)?;
    let alloc = prefix::full_alloc(&ctx, &args.alloc).await?;
    let id = encode_path(&alloc.id);
    let q = Query::new().param("path", args.path.clone());
    let info = ctx.client.get_json(&format!("/v1/client/fs/stat/{id}"), &q).await.map_err(failure)?.value;
    let mut out = std::io::stdout();
    if args.stat {
        let text = if args.json { format::json_text(&info) } else { listing(std::slice::from_ref(&info)) };
        println!("{text}");
        return Ok(exit::OK);
    }
    if info["IsDir"].as_bool() == Some(true) {
        let files = ctx.client.get_json(&format!("/v1/client/fs/ls/{id}"), &q).await.map_err(failure)?.value;
        let files = files.as_array().cloned().unwrap_or_default();
        let text = if args.json { format::json_text(&files) } else { listing(&files) };
        println!("{text}");
        return Ok(exit::OK);
    }
    let size = info["Size"].as_u64().unwrap_or(0);
    let wanted = match (args.tail, args.bytes, args.lines) {
        (false, _, _) => None,
        (true, Some(b), _) => Some((b, None)),
        (true, None, n) => {
            let n = n.unwrap_or(DEFAULT_TAIL_LINES);
            Some((n.saturating_mul(BYTES_PER_LINE), Some(n)))
        }
    };
    let offset = wanted.map_or(0, |(b, _)| size.saturating_sub(b));
    if !args.follow {
        let q = q.param("offset", offset.to_string()).param("limit", "0");
        let mut body = ctx.client.get_stream(&format!("/v1/client/fs/readat/{id}"), &q).await.map_err(failure)?;
        let mut data = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(chunk) = frame.map_err(failure)?.into_data() {
                data.extend_from_slice(&chunk);
            }
        }
        let shown = match wanted {
            Some((_, Some(n))) => super::logs::last_lines(&data, n as usize),
            _ => &data[..],
        };
        let _ = out.write_all(shown).and_then(|()| out.flush());
        return Ok(exit::OK);
    }
    let q = q.param("offset", offset.to_string()).param("origin", "start").param("follow", "true");
    let mut body = ctx.client.get_stream(&format!("/v1/client/fs/stream/{id}"), &q).await.map_err(failure)?;
    let stream = async {
        let mut pending: Vec<u8> = Vec::new();
        let mut first = wanted.and_then(|(_, n)| n);
        while let Some(frame) = body.frame().await {
            let Ok(chunk) = frame.map_err(failure)?.into_data() else { continue };
            pending.extend_from_slice(&chunk);
            let (frames, used) = decode_frames(&pending);
            pending.drain(..used);
            for data in frames {
                let shown = match first.take() {
                    Some(n) => super::logs::last_lines(&data, n as usize).to_vec(),
                    None => data,
                };
                if out.write_all(&shown).and_then(|()| out.flush()).is_err() {
                    return Ok(exit::OK);
                }
            }
        }
        Ok(exit::OK)
    };
    tokio::select! {
        r = stream => r,
        _ = crate::cli::interrupted() => Ok(exit::OK),
    }
}

/// The data of the complete stream frames at the start of `buf`, and how many bytes they took.
pub fn decode_frames(buf: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<Value>();
    let mut out = Vec::new();
    let mut used = 0;
    while let Some(Ok(v)) = it.next() {
        used = it.byte_offset();
        if let Some(data) = v["Data"].as_str()
            && let Ok(bytes) = crate::client::base64::decode(data)
        {
            out.push(bytes);
        }
    }
    (out, used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_decoded_as_they_complete() {
        let buf = br#"{"Offset":2,"Data":"aGk=","File":"f"}{}{"Offset":4,"Da"#;
        let (frames, used) = decode_frames(buf);
        assert_eq!(frames, vec![b"hi".to_vec()]);
        assert_eq!(&buf[used..], br#"{"Offset":4,"Da"#);
    }

    #[test]
    fn listings_mark_directories() {
        let files = vec![
            serde_json::json!({"Name": "alloc", "IsDir": true, "Size": 4096, "FileMode": "drwxrwxrwx", "ModTime": "2026-01-01T00:00:00Z"}),
            serde_json::json!({"Name": "x", "IsDir": false, "Size": 3, "FileMode": "-rw-r--r--", "ModTime": "2026-01-01T00:00:00Z"}),
        ];
        let text = listing(&files);
        assert!(text.contains("alloc/") && text.contains("-rw-r--r--") && text.starts_with("Mode"), "{text}");
    }
}
