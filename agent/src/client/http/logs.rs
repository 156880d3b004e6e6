//! `GET /v1/client/fs/logs/<alloc_id>?task=&type=stdout|stderr&plain=&follow=&offset=&origin=`
//!
//! A task's logs are the files `<alloc_dir>/alloc/logs/<task>.<type>.<N>`, N growing as the
//! executor rotates them. `origin=start` (default) counts `offset` from the first byte still on
//! disk, `origin=end` back from the last. With `plain=true` the bytes come as they are;
//! otherwise as Nomad's stream frames, JSON objects one after another:
//! `{"Offset": <offset in File after Data>, "Data": <base64>, "File": "alloc/logs/..."}`.
//! `follow=true` keeps streaming new output, across rotations, until the task is dead and
//! everything is read, or the client goes away.
//!
//! The log dir is the task's to write, and the agent reads as root: files are opened through
//! `fs_beneath` from the alloc dir, so a symlink, FIFO or hard link the task put in place of a
//! log file is skipped (and logged), never read through.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use nomad_proto::alloc::task_state;
use nomad_server::http::util::{HttpError, QueryOptions, parse_bool, require_method};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

use super::{ClientHttp, Target};
use crate::client::allocrunner::AllocRunner;
use crate::client::driver::LOG_DIR;
use crate::fs_beneath::{Beneath, FsError, Kind, Links};

/// Largest chunk read (and framed) at once.
const CHUNK: usize = 64 * 1024;
/// How often a followed log is checked for new data.
const POLL: Duration = Duration::from_millis(100);
/// An idle followed stream sends an empty frame this often, as Nomad's does.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Which logs, from where.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LogRequest {
    task: String,
    stream: String,
    plain: bool,
    follow: bool,
    offset: i64,
    from_end: bool,
}

fn parse(q: &QueryOptions) -> Result<LogRequest, HttpError> {
    let task = q.params.get("task").cloned().unwrap_or_default();
    if task.is_empty() {
        return Err(HttpError::bad_request("must provide task name"));
    }
    let flag = |name: &str| -> Result<bool, HttpError> {
        match q.params.get(name).filter(|v| !v.is_empty()) {
            None => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(|| HttpError::bad_request(format!("failed to parse {name} field to boolean: {v:?}"))),
        }
    };
    let follow = flag("follow")?;
    let plain = flag("plain")?;
    let stream = q.params.get("type").cloned().unwrap_or_default();
    if stream != "stdout" && stream != "stderr" {
        return Err(HttpError::bad_request("must provide log type (stdout/stderr)"));
    }
    let offset = match q.params.get("offset").filter(|v| !v.is_empty()) {
        None => 0,
        Some(v) => v.parse::<i64>().map_err(|_| HttpError::bad_request(format!("error parsing offset: {v:?} is not an integer")))?,
    };
    if offset < 0 {
        return Err(HttpError::bad_request("offset must be non-negative"));
    }
    let from_end = match q.params.get("origin").map(String::as_str) {
        None | Some("") | Some("start") => false,
        Some("end") => true,
        Some(_) => return Err(HttpError::bad_request("origin must be start or end")),
    };
    Ok(LogRequest { task, stream, plain, follow, offset, from_end })
}

/// Most log files one request considers (the newest ones): the log dir is the task's to fill.
const MAX_LOG_FILES: usize = 10_000;

/// The index of `<base>.<N>`.
fn index_of(name: &std::ffi::OsStr, base: &str) -> Option<u64> {
    name.to_str()?.strip_prefix(base)?.strip_prefix('.')?.parse().ok()
}

/// Indexes of `<base>.<N>` entries in `dir`, ascending, at most the newest [`MAX_LOG_FILES`].
fn indexes(dir: &Beneath, base: &str) -> Vec<u64> {
    let mut newest: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let _ = dir.for_each_entry(|name, _| {
        if let Some(i) = index_of(name, base) {
            newest.push(Reverse(i));
            if newest.len() > MAX_LOG_FILES {
                newest.pop();
            }
        }
    });
    let mut found: Vec<u64> = newest.into_iter().map(|Reverse(i)| i).collect();
    found.sort_unstable();
    found
}

/// The lowest index above `index`, if any.
fn next_index(dir: &Beneath, base: &str, index: u64) -> Option<u64> {
    let mut next = None;
    let _ = dir.for_each_entry(|name, _| {
        if let Some(i) = index_of(name, base).filter(|i| *i > index) {
            next = Some(next.map_or(i, |n: u64| n.min(i)));
        }
    });
    next
}

/// Where reading starts: (file index, offset in it). Only regular files count; the size of
/// what a symlink points to is never looked at.
fn start_position(dir: &Beneath, base: &str, offset: u64, from_end: bool) -> (u64, u64) {
    let files: Vec<(u64, u64)> = indexes(dir, base)
        .into_iter()
        .map(|i| {
            let len = dir.stat(Path::new(&format!("{base}.{i}")), Links::Refuse).ok().filter(|s| s.kind == Kind::File).map_or(0, |s| s.len);
            (i, len)
        })
        .collect();
    let Some(&(last, last_len)) = files.last() else { return (0, 0) };
    let mut remaining = offset;
    if from_end {
        for &(i, len) in files.iter().rev() {
            if remaining <= len {
                return (i, len - remaining);
            }
            remaining -= len;
        }
        (files[0].0, 0)
    } else {
        for &(i, len) in &files {
            if remaining < len {
                return (i, remaining);
            }
            remaining -= len;
        }
        (last, last_len)
    }
}

fn frame(file: &str, offset: u64, data: &[u8]) -> Bytes {
    let v = serde_json::json!({ "Offset": offset, "Data": crate::client::base64::encode(data), "File": file });
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// The alloc's log dir, resolved beneath the alloc dir with no symlink on the way; `None` while
/// it does not exist yet.
fn open_log_dir(runner: &AllocRunner) -> Result<Option<Beneath>, FsError> {
    match runner.open_alloc_dir().and_then(|alloc_dir| alloc_dir.open_dir(Path::new(LOG_DIR), Links::Refuse)) {
        Ok(dir) => Ok(Some(dir)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Streams the logs into `tx` until done or the receiver is gone.
async fn stream_logs(
    runner: std::sync::Arc<AllocRunner>,
    req: LogRequest,
    mut dir: Option<Beneath>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let base = format!("{}.{}", req.task, req.stream);
    let (mut index, mut offset) = dir.as_ref().map_or((0, 0), |d| start_position(d, &base, req.offset as u64, req.from_end));
    let mut states = runner.watch_task_states();
    let mut idle = tokio::time::Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut refused: Option<u64> = None;
    loop {
        if dir.is_none() {
            // Not there yet when the request came: the task has not started.
            dir = open_log_dir(&runner).ok().flatten();
        }
        let name = format!("{base}.{index}");
        let mut read_any = false;
        // Opened through the log dir's fd: a regular file of one link, never a symlink or FIFO
        // the task put in its place.
        let opened = dir.as_ref().map(|d| d.read_log(&name));
        match opened {
            Some(Ok(file)) => {
                let mut file = tokio::fs::File::from_std(file);
                if file.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
                    loop {
                        let n = match file.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        offset += n as u64;
                        read_any = true;
                        let chunk = if req.plain {
                            Bytes::copy_from_slice(&buf[..n])
                        } else {
                            frame(&format!("alloc/logs/{name}"), offset, &buf[..n])
                        };
                        if tx.send(Ok(chunk)).await.is_err() {
                            return;
                        }
                    }
                }
            }
            Some(Err(e)) if !e.is_not_found() && refused != Some(index) => {
                tracing::warn!(alloc_id = %runner.id(), task = %req.task, error = %e, "not serving a log file");
                refused = Some(index);
            }
            _ => {}
        }
        // A newer file means this one is complete: move on (a rotated-away file is skipped).
        if let Some(next) = dir.as_ref().and_then(|d| next_index(d, &base, index)) {
            index = next;
            offset = 0;
            continue;
        }
        if !req.follow {
            return;
        }
        if read_any {
            idle = tokio::time::Instant::now();
            continue;
        }
        let dead = states.borrow_and_update().get(&req.task).is_none_or(|s| s.state == task_state::DEAD);
        if dead && runner.task(&req.task).is_none_or(|t| t.is_finished()) {
            return;
        }
        if !req.plain && idle.elapsed() >= HEARTBEAT {
            idle = tokio::time::Instant::now();
            if tx.send(Ok(Bytes::from_static(b"{}"))).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = tx.closed() => return,
        }
    }
}

pub(super) async fn handle(State(state): State<ClientHttp>, UrlPath(alloc_id): UrlPath<String>, req: Request<Body>) -> Response {
    match serve(state, alloc_id, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve(state: ClientHttp, alloc_id: String, req: Request<Body>) -> Result<Response, HttpError> {
    require_method(req.method(), &[Method::GET])?;
    if alloc_id.is_empty() {
        return Err(HttpError::bad_request("must provide a valid alloc id"));
    }
    let q = QueryOptions::parse(req.uri())?;
    let log_req = parse(&q)?;
    let runner = match state.target(&alloc_id, req).await {
        Target::Local(r) => r,
        Target::Done(resp) => return Ok(resp),
    };
    if runner.task(&log_req.task).is_none() {
        return Err(HttpError::bad_request(format!("unknown task name {:?}", log_req.task)));
    }
    let dir = match open_log_dir(&runner) {
        Ok(dir) => dir,
        Err(e) => {
            let message = format!("failed to open the logs of task {:?}: {e}", log_req.task);
            return Err(HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message });
        }
    };
    let content_type = if log_req.plain { "text/plain; charset=utf-8" } else { "application/json" };
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(stream_logs(runner, log_req, dir, tx));
    let mut resp = Response::new(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)));
    resp.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use axum::http::Uri;

    use super::*;

    fn q(s: &str) -> Result<LogRequest, HttpError> {
        parse(&QueryOptions::parse(&format!("/v1/client/fs/logs/a?{s}").parse::<Uri>().unwrap()).unwrap())
    }

    #[test]
    fn query_parsing_and_its_errors() {
        let r = q("task=web&type=stderr&plain=true&follow=1&offset=10&origin=end").unwrap();
        assert_eq!(r, LogRequest { task: "web".into(), stream: "stderr".into(), plain: true, follow: true, offset: 10, from_end: true });
        assert_eq!(q("type=stdout").unwrap_err().message, "must provide task name");
        assert_eq!(q("task=web").unwrap_err().message, "must provide log type (stdout/stderr)");
        assert_eq!(q("task=web&type=stdin").unwrap_err().message, "must provide log type (stdout/stderr)");
        assert_eq!(q("task=web&type=stdout&origin=middle").unwrap_err().message, "origin must be start or end");
        assert!(q("task=web&type=stdout&offset=x").unwrap_err().message.contains("offset"));
        assert!(q("task=web&type=stdout&follow=maybe").unwrap_err().message.contains("follow"));
    }

    #[test]
    fn offsets_span_rotated_files_from_either_end() {
        let dir = tempfile::tempdir().unwrap();
        for (i, content) in [(3, "aaaa"), (4, "bbbb"), (5, "cc")] {
            std::fs::write(dir.path().join(format!("web.stdout.{i}")), content).unwrap();
        }
        let logs = Beneath::open(dir.path()).unwrap();
        let at = |offset, end| start_position(&logs, "web.stdout", offset, end);
        assert_eq!(at(0, false), (3, 0));
        assert_eq!(at(5, false), (4, 1));
        assert_eq!(at(100, false), (5, 2), "past the end: at the end");
        assert_eq!(at(0, true), (5, 2));
        assert_eq!(at(2, true), (5, 0));
        assert_eq!(at(3, true), (4, 3));
        assert_eq!(at(100, true), (3, 0), "before the start: at the start");
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(start_position(&Beneath::open(empty.path()).unwrap(), "web.stdout", 5, false), (0, 0));
    }

    #[test]
    fn a_planted_symlink_counts_for_nothing_and_its_target_is_never_measured() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("shadow"), "x".repeat(1000)).unwrap();
        std::fs::write(dir.path().join("web.stdout.3"), "aaaa").unwrap();
        std::os::unix::fs::symlink(outside.path().join("shadow"), dir.path().join("web.stdout.4")).unwrap();
        let logs = Beneath::open(dir.path()).unwrap();
        assert_eq!(start_position(&logs, "web.stdout", 0, true), (4, 0), "the link has no length");
        assert_eq!(start_position(&logs, "web.stdout", 4, true), (3, 0));
        assert_eq!(next_index(&logs, "web.stdout", 3), Some(4));
        assert_eq!(next_index(&logs, "web.stdout", 4), None);
        assert_eq!(indexes(&logs, "web.stdout"), vec![3, 4]);
        assert_eq!(indexes(&logs, "web.stderr"), Vec::<u64>::new());
    }

    #[test]
    fn frames_are_nomads() {
        let f = frame("alloc/logs/web.stdout.0", 5, b"hello");
        let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
        assert_eq!(v, serde_json::json!({"Offset": 5, "Data": "aGVsbG8=", "File": "alloc/logs/web.stdout.0"}));
    }
}
