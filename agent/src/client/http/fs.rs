//! `alloc fs`: `GET /v1/client/fs/{ls,stat,cat,readat,stream}/<alloc_id>?path=...`.
//!
//! A path names an entry of the alloc dir as Nomad's do: relative to it, a leading `/` meaning
//! the alloc dir itself, `..` allowed only while it stays inside ("Path escapes the alloc
//! directory" otherwise). Every entry is reached through `fs_beneath` from the alloc dir's fd,
//! so a symlink the task planted that leads out of it (absolute, or climbing with `..`), at the
//! end of the path or on the way, is refused by the kernel, never followed; one that stays
//! inside is followed. Reading a task's `secrets/` or `private/` dir is refused (listing is
//! not), judged on the real path of the file opened, so no symlink gets around it.
//!
//! - `ls`: `[AllocFileInfo]` (an entry is described, not followed), at most [`MAX_ENTRIES`].
//! - `stat`: `AllocFileInfo` with `ContentType` sniffed from the first 512 bytes.
//! - `cat`: the file's bytes. `readat`: `limit` bytes (all when 0) from `offset`.
//! - `stream`: Nomad's `StreamFrame`s (`{"Offset","Data","File","FileEvent"}`, empty fields
//!   left out) from `offset` counted from `origin` (start|end), following new data by default
//!   (`follow=false` ends at EOF); a truncated file is read again from 0 with
//!   `FileEvent: "file truncated"`, a deleted one ends with `"file deleted"`.

use std::fs::{File, Metadata};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use nomad_proto::Timestamp;
use nomad_server::http::util::{HttpError, QueryOptions, json_response, parse_bool, require_method};
use serde::Serialize;
use tokio::sync::mpsc;

use super::{ClientHttp, Target};
use crate::client::allocrunner::AllocRunner;
use crate::fs_beneath::{Beneath, FsError, Links};

/// Longest `path` accepted (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most entries one `ls` returns (the dir is the task's to fill).
pub const MAX_ENTRIES: usize = 10_000;
/// Largest chunk read (and framed) at once, as Nomad's frames.
const CHUNK: usize = 64 * 1024;
/// How often a followed file is checked for new data.
const POLL: Duration = Duration::from_millis(100);
/// An idle followed stream sends an empty frame this often, as Nomad's does.
const HEARTBEAT: Duration = Duration::from_secs(10);

const ESCAPES: &str = "Path escapes the alloc directory";

/// Nomad's `AllocFileInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocFileInfo {
    pub name: String,
    pub is_dir: bool,
    pub size: i64,
    pub file_mode: String,
    pub mod_time: Timestamp,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub content_type: String,
}

/// Which operation, for its error codes: Nomad answers 500 to a failed `ls`/`stat` (404 when
/// nothing is there) and 400 to a file a stream cannot open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    List,
    Stat,
    Read,
}

fn fail(op: Op, message: impl Into<String>) -> HttpError {
    let code = if op == Op::Read { StatusCode::BAD_REQUEST } else { StatusCode::INTERNAL_SERVER_ERROR };
    HttpError { code, message: message.into() }
}

/// The request's path relative to the alloc dir (`.` for the dir itself), `..` resolved
/// lexically; an escape is refused before anything is opened.
pub fn alloc_relative(path: &str) -> Result<PathBuf, &'static str> {
    if path.len() > MAX_PATH_BYTES {
        return Err("path is too long");
    }
    if path.contains('\0') {
        return Err("path must not contain a NUL byte");
    }
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(ESCAPES);
                }
            }
            Component::Normal(p) => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Ok(PathBuf::from("."));
    }
    Ok(parts.iter().collect())
}

/// What an `FsError` means to the caller; `path` is the request's.
fn fs_error(op: Op, path: &str, e: &FsError) -> HttpError {
    match e {
        FsError::Escapes { .. } | FsError::BadPath { .. } => fail(op, ESCAPES),
        e if e.is_not_found() => {
            let message = format!("stat {path}: no such file or directory");
            if op == Op::Read { fail(op, message) } else { HttpError::not_found(message) }
        }
        FsError::Symlink { .. } => fail(op, format!("stat {path}: too many levels of symbolic links")),
        FsError::NotRegular { kind, .. } => fail(op, format!("{path:?} is a {kind}, not a regular file")),
        e => fail(op, e.to_string()),
    }
}

fn errno_of(e: &FsError) -> Option<i32> {
    match e {
        FsError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// An entry reached beneath the alloc dir, symlinks inside it followed.
enum Entry {
    Dir(Beneath),
    File(File),
}

fn open_entry(alloc: &Beneath, rel: &Path) -> Result<Entry, FsError> {
    if rel == Path::new(".") {
        return alloc.try_clone().map(Entry::Dir);
    }
    match alloc.open_dir(rel, Links::Beneath) {
        Ok(d) => Ok(Entry::Dir(d)),
        Err(e) if errno_of(&e) == Some(libc::ENOTDIR) => alloc.read(rel, Links::Beneath).map(Entry::File),
        Err(e) => Err(e),
    }
}

/// Go's `FileMode.String()`: type letters (or `-`), then `rwxrwxrwx`.
pub fn go_file_mode(meta: &Metadata) -> String {
    let ft = meta.file_type();
    let mode = meta.permissions().mode();
    let mut s = String::new();
    if ft.is_dir() {
        s.push('d');
    }
    if ft.is_symlink() {
        s.push('L');
    }
    if ft.is_block_device() || ft.is_char_device() {
        s.push('D');
    }
    if ft.is_fifo() {
        s.push('p');
    }
    if ft.is_socket() {
        s.push('S');
    }
    if mode & 0o4000 != 0 {
        s.push('u');
    }
    if mode & 0o2000 != 0 {
        s.push('g');
    }
    if ft.is_char_device() {
        s.push('c');
    }
    if mode & 0o1000 != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

fn info_of(name: String, meta: &Metadata) -> AllocFileInfo {
    AllocFileInfo {
        name,
        is_dir: meta.is_dir(),
        size: meta.len() as i64,
        file_mode: go_file_mode(meta),
        mod_time: Timestamp::from_unix_nanos(meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec())),
        content_type: String::new(),
    }
}

/// A subset of Go's `http.DetectContentType` on a file's first bytes.
pub fn sniff_content_type(head: &[u8]) -> &'static str {
    const SIGNATURES: &[(&[u8], &str)] = &[
        (b"%PDF-", "application/pdf"),
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"\x1f\x8b\x08", "application/x-gzip"),
        (b"PK\x03\x04", "application/zip"),
        (b"%!PS-Adobe-", "application/postscript"),
    ];
    if let Some((_, t)) = SIGNATURES.iter().find(|(sig, _)| head.starts_with(sig)) {
        return t;
    }
    let trimmed = head.iter().position(|b| !b" \t\n\r\x0c".contains(b)).map_or(&head[..0], |i| &head[i..]);
    let lower: Vec<u8> = trimmed.iter().take(14).map(u8::to_ascii_lowercase).collect();
    if lower.starts_with(b"<!doctype html") || lower.starts_with(b"<html") || lower.starts_with(b"<head") || lower.starts_with(b"<body") {
        return "text/html; charset=utf-8";
    }
    if lower.starts_with(b"<?xml") {
        return "text/xml; charset=utf-8";
    }
    // Go's rule: binary if any byte is a control character other than whitespace and ESC.
    let binary = head.iter().any(|b| matches!(b, 0x00..=0x08 | 0x0b | 0x0e..=0x1a | 0x1c..=0x1f));
    if binary { "application/octet-stream" } else { "text/plain; charset=utf-8" }
}

fn content_type(file: &mut File, rel: &Path) -> String {
    let mut head = [0u8; 512];
    let mut t = match file.read(&mut head) {
        Ok(n) if n > 0 => sniff_content_type(&head[..n]).to_string(),
        _ => "application/octet-stream".to_string(),
    };
    if rel.extension().is_some_and(|e| e == "json") {
        t = "application/json".to_string();
    }
    t
}

fn base_name(rel: &Path, alloc: &Beneath) -> String {
    match rel.file_name() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => alloc.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    }
}

/// `ls`: the entries of a directory, each described as it is (a symlink is not followed).
pub fn list(alloc: &Beneath, path: &str) -> Result<Vec<AllocFileInfo>, HttpError> {
    let rel = alloc_relative(path).map_err(|m| fail(Op::List, m))?;
    let dir = match open_entry(alloc, &rel).map_err(|e| fs_error(Op::List, path, &e))? {
        Entry::Dir(d) => d,
        Entry::File(_) => return Err(fail(Op::List, format!("readdirent {path}: not a directory"))),
    };
    let mut names = Vec::new();
    dir.for_each_entry(|name, _| {
        if names.len() < MAX_ENTRIES {
            names.push(name.to_os_string());
        }
    })
    .map_err(|e| fs_error(Op::List, path, &e))?;
    names.sort();
    // Each name is one component looked up in the dir's fd: `lstat`, never followed.
    let base = dir.fd_path();
    Ok(names
        .into_iter()
        .filter_map(|n| std::fs::symlink_metadata(base.join(&n)).ok().map(|m| info_of(n.to_string_lossy().into_owned(), &m)))
        .collect())
}

/// `stat`: one entry, symlinks inside the alloc dir followed.
pub fn stat(alloc: &Beneath, path: &str) -> Result<AllocFileInfo, HttpError> {
    let rel = alloc_relative(path).map_err(|m| fail(Op::Stat, m))?;
    let name = base_name(&rel, alloc);
    let err = |e: std::io::Error| fail(Op::Stat, format!("stat {path}: {e}"));
    match open_entry(alloc, &rel).map_err(|e| fs_error(Op::Stat, path, &e))? {
        Entry::Dir(d) => {
            let mut info = info_of(name, &std::fs::metadata(d.fd_path()).map_err(err)?);
            info.content_type = "application/octet-stream".into();
            Ok(info)
        }
        Entry::File(mut f) => {
            let mut info = info_of(name, &f.metadata().map_err(err)?);
            info.content_type = content_type(&mut f, &rel);
            Ok(info)
        }
    }
}

/// Opens a file for reading (cat, readat, stream): a regular file, not in a task's secrets or
/// private dir.
pub fn open_for_read(alloc: &Beneath, path: &str, task_names: &[String]) -> Result<File, HttpError> {
    let rel = alloc_relative(path).map_err(|m| fail(Op::Read, m))?;
    let file = match open_entry(alloc, &rel).map_err(|e| fs_error(Op::Read, path, &e))? {
        Entry::Dir(_) => return Err(fail(Op::Read, format!("file {path:?} is a directory"))),
        Entry::File(f) => f,
    };
    // Judged on where the opened file really is, so a symlink cannot lead around it.
    let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)))
        .map_err(|e| fail(Op::Read, format!("resolve {path}: {e}")))?;
    let root = alloc.real_path().map_err(|e| fail(Op::Read, e.to_string()))?;
    for task in task_names {
        if real.starts_with(root.join(task).join("secrets")) {
            return Err(fail(Op::Read, format!("Reading secret file prohibited: {path}")));
        }
        if real.starts_with(root.join(task).join("private")) {
            return Err(fail(Op::Read, format!("Reading private file prohibited: {path}")));
        }
    }
    Ok(file)
}

/// One Nomad `StreamFrame`, empty fields left out.
pub fn stream_frame(file: &str, offset: u64, data: &[u8], event: &str) -> Bytes {
    let mut v = serde_json::Map::new();
    if offset != 0 {
        v.insert("Offset".into(), offset.into());
    }
    if !data.is_empty() {
        v.insert("Data".into(), crate::client::base64::encode(data).into());
    }
    if !file.is_empty() {
        v.insert("File".into(), file.into());
    }
    if !event.is_empty() {
        v.insert("FileEvent".into(), event.into());
    }
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// How a file is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadSpec {
    offset: u64,
    /// Bytes at most; 0 for all.
    limit: u64,
    /// Frames (else plain bytes).
    framed: bool,
    follow: bool,
}

type Chunks = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// Sends the file's bytes into `tx` as `spec` says, on a blocking thread.
fn send_file(mut file: File, path: String, spec: ReadSpec, tx: Chunks, stop: tokio_util::sync::CancellationToken) {
    let mut offset = spec.offset;
    let mut left = if spec.limit == 0 { u64::MAX } else { spec.limit };
    let mut buf = vec![0u8; CHUNK];
    let mut event = "";
    let mut idle = std::time::Instant::now();
    if file.seek(SeekFrom::Start(offset)).is_err() {
        return;
    }
    loop {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match file.read(&mut buf[..want]) {
            Ok(n) => n,
            Err(_) => return,
        };
        offset += n as u64;
        left -= n as u64;
        if n > 0 || !event.is_empty() {
            let chunk = if spec.framed { stream_frame(&path, offset, &buf[..n], event) } else { Bytes::copy_from_slice(&buf[..n]) };
            event = "";
            if tx.blocking_send(Ok(chunk)).is_err() {
                return;
            }
            idle = std::time::Instant::now();
        }
        if left == 0 {
            return;
        }
        if n > 0 {
            continue;
        }
        if !spec.follow {
            return;
        }
        match file.metadata() {
            Ok(m) if m.nlink() == 0 => {
                let _ = tx.blocking_send(Ok(stream_frame(&path, offset, &[], "file deleted")));
                return;
            }
            Ok(m) if m.len() < offset => {
                offset = 0;
                if file.seek(SeekFrom::Start(0)).is_err() {
                    return;
                }
                event = "file truncated";
                continue;
            }
            Ok(_) => {}
            Err(_) => return,
        }
        if spec.framed && idle.elapsed() >= HEARTBEAT {
            idle = std::time::Instant::now();
            if tx.blocking_send(Ok(Bytes::from_static(b"{}"))).is_err() {
                return;
            }
        }
        if tx.is_closed() || stop.is_cancelled() {
            return;
        }
        std::thread::sleep(POLL);
    }
}

fn int_param(q: &QueryOptions, name: &str, required: bool) -> Result<i64, HttpError> {
    match q.params.get(name).map(String::as_str) {
        None | Some("") if !required => Ok(0),
        v => {
            let v = v.unwrap_or("");
            let n: i64 = v.parse().map_err(|_| HttpError::bad_request(format!("error parsing {name}: {v:?} is not an integer")))?;
            if n < 0 {
                return Err(HttpError::bad_request(format!("{name} must be non-negative")));
            }
            Ok(n)
        }
    }
}

/// Which of the five.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FsRoute {
    Ls,
    Stat,
    Cat,
    ReadAt,
    Stream,
}

macro_rules! route {
    ($name:ident, $route:expr) => {
        pub(super) async fn $name(State(state): State<ClientHttp>, UrlPath(alloc_id): UrlPath<String>, req: Request<Body>) -> Response {
            serve(state, alloc_id, req, $route).await.unwrap_or_else(IntoResponse::into_response)
        }
    };
}
route!(ls, FsRoute::Ls);
route!(stat_route, FsRoute::Stat);
route!(cat, FsRoute::Cat);
route!(readat, FsRoute::ReadAt);
route!(stream, FsRoute::Stream);

async fn serve(state: ClientHttp, alloc_id: String, req: Request<Body>, route: FsRoute) -> Result<Response, HttpError> {
    require_method(req.method(), &[Method::GET])?;
    if alloc_id.is_empty() {
        return Err(HttpError::bad_request("must provide a valid alloc id"));
    }
    let q = QueryOptions::parse(req.uri())?;
    let path = q.params.get("path").cloned().unwrap_or_default();
    let path = match (route, path.is_empty()) {
        (FsRoute::Ls, true) => "/".to_string(),
        (_, true) => return Err(HttpError::bad_request("must provide a file name")),
        (_, false) => path,
    };
    // Parsed before anything is forwarded, so a bad request fails here.
    let spec = match route {
        FsRoute::Ls | FsRoute::Stat => None,
        FsRoute::Cat => Some(ReadSpec { offset: 0, limit: 0, framed: false, follow: false }),
        FsRoute::ReadAt => Some(ReadSpec {
            offset: int_param(&q, "offset", true)? as u64,
            limit: int_param(&q, "limit", false)? as u64,
            framed: false,
            follow: false,
        }),
        FsRoute::Stream => {
            let follow = match q.params.get("follow").filter(|v| !v.is_empty()) {
                None => true,
                Some(v) => {
                    parse_bool(v).ok_or_else(|| HttpError::bad_request(format!("failed to parse follow field to boolean: {v:?}")))?
                }
            };
            Some(ReadSpec { offset: int_param(&q, "offset", false)? as u64, limit: 0, framed: true, follow })
        }
    };
    let from_end = match q.params.get("origin").map(String::as_str) {
        None | Some("") | Some("start") => false,
        Some("end") if route == FsRoute::Stream => true,
        Some(_) if route == FsRoute::Stream => return Err(HttpError::bad_request("origin must be start or end")),
        Some(_) => false,
    };
    let runner = match state.target(&alloc_id, req).await {
        Target::Local(r) => r,
        Target::Done(resp) => return Ok(resp),
    };
    let alloc = open_alloc(&runner)?;
    match (route, spec) {
        (FsRoute::Ls, _) => json_response(&list(&alloc, &path)?, None, false),
        (FsRoute::Stat, _) => json_response(&stat(&alloc, &path)?, None, false),
        (_, Some(mut spec)) => {
            let file = open_for_read(&alloc, &path, &runner.task_names())?;
            if from_end {
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                spec.offset = size.saturating_sub(spec.offset);
            }
            let content_type = if spec.framed { "application/json" } else { "text/plain; charset=utf-8" };
            let (tx, rx) = mpsc::channel(8);
            let stop = tokio_util::sync::CancellationToken::new();
            let guard = stop.clone().drop_guard();
            tokio::task::spawn_blocking(move || send_file(file, path, spec, tx, stop));
            let body = futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), move |c| {
                let _keep = &guard;
                c
            });
            let mut resp = Response::new(Body::from_stream(body));
            resp.headers_mut().insert("content-type", HeaderValue::from_static(content_type));
            // What a task wrote is not to be rendered as a page (Nomad's untrusted content).
            resp.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
            Ok(resp)
        }
        (_, None) => unreachable!("every read route has a spec"),
    }
}

fn open_alloc(runner: &Arc<AllocRunner>) -> Result<Beneath, HttpError> {
    runner
        .open_alloc_dir()
        .map_err(|e| HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: format!("failed to open the alloc dir: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_to_the_alloc_dir_and_may_not_climb_out() {
        assert_eq!(alloc_relative("/").unwrap(), PathBuf::from("."));
        assert_eq!(alloc_relative("").unwrap(), PathBuf::from("."));
        assert_eq!(alloc_relative("/alloc/logs").unwrap(), PathBuf::from("alloc/logs"));
        assert_eq!(alloc_relative("web/../alloc/./x").unwrap(), PathBuf::from("alloc/x"));
        assert_eq!(alloc_relative("../etc/passwd"), Err(ESCAPES));
        assert_eq!(alloc_relative("/web/../../x"), Err(ESCAPES));
        assert_eq!(alloc_relative("a\0b"), Err("path must not contain a NUL byte"));
        assert_eq!(alloc_relative(&"a/".repeat(3000)), Err("path is too long"));
    }

    #[test]
    fn modes_print_as_gos() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4754)).unwrap();
        assert_eq!(go_file_mode(&std::fs::metadata(&f).unwrap()), "urwxr-xr--");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(go_file_mode(&std::fs::metadata(dir.path()).unwrap()), "dtrwxrwxrwx");
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        assert_eq!(go_file_mode(&std::fs::symlink_metadata(dir.path().join("l")).unwrap()), "Lrwxrwxrwx");
        assert_eq!(go_file_mode(&std::fs::metadata("/dev/null").unwrap()), "Dcrw-rw-rw-");
    }

    #[test]
    fn content_types_are_sniffed_as_go_does() {
        assert_eq!(sniff_content_type(b"hello\n"), "text/plain; charset=utf-8");
        assert_eq!(sniff_content_type(b"\x7fELF\x02\x01\x01\0"), "application/octet-stream");
        assert_eq!(sniff_content_type(b"  <html><body>"), "text/html; charset=utf-8");
        assert_eq!(sniff_content_type(b"\x89PNG\r\n\x1a\nrest"), "image/png");
    }

    #[test]
    fn frames_leave_out_empty_fields() {
        let v: serde_json::Value = serde_json::from_slice(&stream_frame("alloc/x", 5, b"hello", "")).unwrap();
        assert_eq!(v, serde_json::json!({"Offset": 5, "Data": "aGVsbG8=", "File": "alloc/x"}));
        let v: serde_json::Value = serde_json::from_slice(&stream_frame("alloc/x", 0, b"", "file truncated")).unwrap();
        assert_eq!(v, serde_json::json!({"File": "alloc/x", "FileEvent": "file truncated"}));
    }

    /// The alloc dir of these tests: a task dir with a file, secrets, and planted symlinks.
    fn alloc_dir() -> (tempfile::TempDir, Beneath) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("web/local")).unwrap();
        std::fs::create_dir_all(p.join("web/secrets")).unwrap();
        std::fs::create_dir_all(p.join("alloc/data")).unwrap();
        std::fs::write(p.join("web/local/hello.txt"), "hello world\n").unwrap();
        std::fs::write(p.join("web/secrets/token"), "s3cret").unwrap();
        std::os::unix::fs::symlink("/etc", p.join("web/etc")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/passwd", p.join("web/passwd")).unwrap();
        std::os::unix::fs::symlink("/", p.join("alloc/rootlink")).unwrap();
        std::os::unix::fs::symlink("local/hello.txt", p.join("web/inside")).unwrap();
        std::os::unix::fs::symlink("secrets", p.join("web/notsecret")).unwrap();
        let b = Beneath::open(p).unwrap();
        (dir, b)
    }

    #[test]
    fn symlinks_leading_out_are_refused_and_ones_inside_followed() {
        let (_dir, alloc) = alloc_dir();
        let tasks = vec!["web".to_string()];
        for path in ["web/etc/passwd", "web/passwd", "alloc/rootlink/etc/passwd", "/web/etc", "../x"] {
            let e = open_for_read(&alloc, path, &tasks).unwrap_err();
            assert_eq!((e.code, e.message.as_str()), (StatusCode::BAD_REQUEST, ESCAPES), "{path}");
        }
        let e = list(&alloc, "web/etc").unwrap_err();
        assert_eq!(e.message, ESCAPES);
        let e = stat(&alloc, "alloc/rootlink/etc").unwrap_err();
        assert_eq!(e.message, ESCAPES);
        // An absolute request path is the alloc dir's, never the host's.
        let e = stat(&alloc, "/etc/passwd").unwrap_err();
        assert_eq!(e.code, StatusCode::NOT_FOUND, "{}", e.message);

        let mut s = String::new();
        open_for_read(&alloc, "/web/inside", &tasks).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello world\n");
        let info = stat(&alloc, "web/inside").unwrap();
        assert_eq!(
            (info.name.as_str(), info.size, info.is_dir, info.content_type.as_str()),
            ("inside", 12, false, "text/plain; charset=utf-8")
        );
    }

    #[test]
    fn secrets_are_listed_but_never_read_even_through_a_symlink() {
        let (_dir, alloc) = alloc_dir();
        let tasks = vec!["web".to_string()];
        let names: Vec<String> = list(&alloc, "web/secrets").unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, vec!["token"]);
        let e = open_for_read(&alloc, "web/secrets/token", &tasks).unwrap_err();
        assert_eq!(e.message, "Reading secret file prohibited: web/secrets/token");
        let e = open_for_read(&alloc, "web/notsecret/token", &tasks).unwrap_err();
        assert_eq!(e.message, "Reading secret file prohibited: web/notsecret/token");
    }

    #[test]
    fn listings_describe_entries_without_following_them() {
        let (_dir, alloc) = alloc_dir();
        let listed = list(&alloc, "/web").unwrap();
        let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, vec!["etc", "inside", "local", "notsecret", "passwd", "secrets"]);
        let etc = &listed[0];
        assert!(!etc.is_dir && etc.file_mode.starts_with('L'), "{etc:?}");
        assert!(listed[2].is_dir && listed[2].file_mode.starts_with('d'));
        let e = list(&alloc, "web/local/hello.txt").unwrap_err();
        assert!(e.message.contains("not a directory"), "{}", e.message);
        assert_eq!(list(&alloc, "nope").unwrap_err().code, StatusCode::NOT_FOUND);
        let root = stat(&alloc, "/").unwrap();
        assert!(root.is_dir);
        assert_eq!(open_for_read(&alloc, "/web", &[]).unwrap_err().message, "file \"/web\" is a directory");
    }

    fn collect(file: File, spec: ReadSpec) -> Vec<Bytes> {
        let (tx, mut rx) = mpsc::channel(64);
        let stop = tokio_util::sync::CancellationToken::new();
        let t = std::thread::spawn(move || send_file(file, "f".into(), spec, tx, stop));
        let mut out = Vec::new();
        while let Some(Ok(c)) = rx.blocking_recv() {
            out.push(c);
        }
        t.join().unwrap();
        out
    }

    #[test]
    fn readat_honours_offset_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "0123456789").unwrap();
        let open = || File::open(dir.path().join("f")).unwrap();
        let plain = |offset, limit| collect(open(), ReadSpec { offset, limit, framed: false, follow: false }).concat();
        assert_eq!(plain(1, 10), b"123456789");
        assert_eq!(plain(2, 3), b"234");
        assert_eq!(plain(0, 0), b"0123456789");
        assert_eq!(plain(20, 0), b"");
        let frames = collect(open(), ReadSpec { offset: 4, limit: 0, framed: true, follow: false });
        let v: serde_json::Value = serde_json::from_slice(&frames[0]).unwrap();
        assert_eq!(v, serde_json::json!({"Offset": 10, "Data": crate::client::base64::encode(b"456789"), "File": "f"}));
    }

    #[test]
    fn a_followed_stream_sees_appends_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "abc").unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let stop = tokio_util::sync::CancellationToken::new();
        let file = File::open(&p).unwrap();
        let s = stop.clone();
        let t =
            std::thread::spawn(move || send_file(file, "f".into(), ReadSpec { offset: 1, limit: 0, framed: true, follow: true }, tx, s));
        let next = |rx: &mut mpsc::Receiver<Result<Bytes, std::io::Error>>| -> serde_json::Value {
            serde_json::from_slice(&rx.blocking_recv().unwrap().unwrap()).unwrap()
        };
        assert_eq!(next(&mut rx)["Offset"], 3);
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"defg").unwrap();
        let v = next(&mut rx);
        assert_eq!((v["Offset"].clone(), v["Data"].clone()), (7.into(), crate::client::base64::encode(b"defg").into()));
        std::fs::write(&p, "xy").unwrap();
        // The truncation may be seen before or after "xy" is written: data after the event.
        let v = next(&mut rx);
        assert_eq!(v["FileEvent"], "file truncated");
        let mut after = crate::client::base64::decode(v["Data"].as_str().unwrap_or("")).unwrap();
        while after.len() < 2 {
            after.extend(crate::client::base64::decode(next(&mut rx)["Data"].as_str().unwrap_or("")).unwrap());
        }
        assert_eq!(after, b"xy");
        std::fs::remove_file(&p).unwrap();
        assert_eq!(next(&mut rx)["FileEvent"], "file deleted");
        t.join().unwrap();
    }
}
