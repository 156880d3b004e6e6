//! The container's stdout/stderr followed from the agent into the alloc's rotated log files,
//! through the same rotator the executor uses.
//!
//! Lines come with the Engine's timestamps. The follower records the last timestamp it wrote
//! (and how many lines carried it) in the task's state dir after each write, so a restarted
//! agent asks again `since` then and skips what it already wrote: no line twice, none lost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::LogsOptions;
use futures::StreamExt;
use nomad_proto::Timestamp;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::super::{LOG_DIR, LogConfig};
use super::container::status_of;
use crate::executor::logs::RotatingLog;
use crate::fs_beneath::Beneath;

/// The follower's resume point, in the task's state dir.
pub const POSITION_FILE: &str = "docker-logs.json";
/// Waits between reconnects of a stream that ended while the container still runs.
const RECONNECT_MIN: Duration = Duration::from_millis(500);
const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// Where the follower is in the container's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Timestamp (Unix ns) of the last line written.
    pub last_ns: i64,
    /// Lines with exactly that timestamp already written.
    pub at_last: u64,
}

impl Position {
    fn read(path: &Path) -> Position {
        std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    /// Replaces the file whole (a temp file renamed over it): an agent killed mid-write must not
    /// leave a truncated position, which reads as "nothing written yet" and would copy the whole
    /// log again.
    fn write(&self, path: &Path) {
        let tmp = path.with_extension("json.tmp");
        if let Ok(bytes) = serde_json::to_vec(self)
            && let Err(e) = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path))
        {
            tracing::warn!(path = %path.display(), error = %e, "saving the docker log position");
        }
    }

    /// Whether a line stamped `ns` was written before; counts it as written otherwise.
    fn admit(&mut self, ns: i64, seen_at_ns: &mut u64) -> bool {
        if ns < self.last_ns {
            return false;
        }
        if ns == self.last_ns {
            *seen_at_ns += 1;
            if *seen_at_ns <= self.at_last {
                return false;
            }
            self.at_last = *seen_at_ns;
            return true;
        }
        self.last_ns = ns;
        self.at_last = 1;
        *seen_at_ns = 1;
        true
    }
}

/// Splits the Engine's `<RFC 3339 nano> ` prefix off a line.
fn split_timestamp(message: &[u8]) -> Option<(i64, &[u8])> {
    let space = message.iter().position(|b| *b == b' ')?;
    let stamp = std::str::from_utf8(&message[..space]).ok()?;
    let ts = Timestamp::parse_rfc3339(stamp).ok()?;
    Some((ts.unix_nanos(), &message[space + 1..]))
}

/// Where a task's logs go; kept in the handle so a restarted agent resumes them.
#[derive(Debug, Clone)]
pub struct LogTarget {
    pub alloc_dir: PathBuf,
    pub task_name: String,
    pub state_dir: PathBuf,
    pub logs: LogConfig,
}

/// Follows the container's logs until it stops (or `cancel`), then returns.
pub async fn follow(docker: Docker, container_id: String, task: LogTarget, cancel: CancellationToken) {
    let position_path: PathBuf = task.state_dir.join(POSITION_FILE);
    let alloc_dir = match Beneath::open(&task.alloc_dir) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(container = %container_id, error = %e, "docker logs: cannot open the alloc dir");
            return;
        }
    };
    let (Ok(stdout_dir), Ok(stderr_dir)) = (alloc_dir.try_clone(), alloc_dir.try_clone()) else { return };
    let log_dir = Path::new(LOG_DIR);
    let mut stdout =
        RotatingLog::new(stdout_dir, log_dir, &format!("{}.stdout", task.task_name), task.logs.max_files, task.logs.max_file_size);
    let mut stderr =
        RotatingLog::new(stderr_dir, log_dir, &format!("{}.stderr", task.task_name), task.logs.max_files, task.logs.max_file_size);
    let mut position = Position::read(&position_path);
    let mut backoff = RECONNECT_MIN;
    loop {
        let since = i32::try_from(position.last_ns.div_euclid(1_000_000_000)).unwrap_or(0);
        let options = LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            timestamps: true,
            since,
            tail: "all".to_string(),
            ..Default::default()
        };
        let mut stream = docker.logs(&container_id, Some(options));
        let mut seen_at_ns = 0u64;
        let mut got_any = false;
        loop {
            let item = tokio::select! {
                _ = cancel.cancelled() => return,
                item = stream.next() => item,
            };
            match item {
                None => break,
                Some(Err(e)) => {
                    let text = e.to_string();
                    if text.contains("does not support reading") || text.contains("501") {
                        tracing::info!(container = %container_id, "docker logs: the log driver cannot be read; not collecting");
                        return;
                    }
                    tracing::debug!(container = %container_id, error = %text, "docker logs stream ended");
                    break;
                }
                Some(Ok(output)) => {
                    got_any = true;
                    let (is_err, message) = match output {
                        LogOutput::StdErr { message } => (true, message),
                        LogOutput::StdOut { message } | LogOutput::Console { message } => (false, message),
                        LogOutput::StdIn { .. } => continue,
                    };
                    let (ns, line) = split_timestamp(&message).unwrap_or((position.last_ns, &message[..]));
                    if !position.admit(ns, &mut seen_at_ns) {
                        continue;
                    }
                    if is_err {
                        stderr.write(line)
                    } else {
                        stdout.write(line)
                    }
                    position.write(&position_path);
                }
            }
        }
        // The stream ends when the container stops or is removed; anything else (the Engine
        // restarted or cannot be reached for now) reconnects, so no output is lost meanwhile.
        match docker.inspect_container(&container_id, None).await {
            Ok(c) if !c.state.as_ref().and_then(|s| s.running).unwrap_or(false) => return,
            Err(e) if status_of(&e) == Some(404) => return,
            Ok(_) => {}
            Err(e) => tracing::debug!(container = %container_id, error = %e, "docker logs: the Engine does not answer; retrying"),
        }
        if got_any {
            backoff = RECONNECT_MIN;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_skips_what_was_written_and_counts_equal_stamps() {
        let mut p = Position::default();
        let mut seen = 0;
        assert!(p.admit(10, &mut seen));
        assert!(p.admit(10, &mut seen), "a second line with the same stamp");
        assert!(p.admit(20, &mut seen));
        // Resumed with the saved position: the stream starts again at second 0.
        let mut seen = 0;
        assert!(!p.admit(10, &mut seen));
        assert!(!p.admit(10, &mut seen));
        assert!(!p.admit(20, &mut seen), "the last line written is not written again");
        assert!(p.admit(20, &mut seen), "a new line with the same stamp is");
        assert!(p.admit(30, &mut seen));
    }

    #[test]
    fn the_position_is_replaced_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(POSITION_FILE);
        assert_eq!(Position::read(&path), Position::default(), "none yet");
        Position { last_ns: 7, at_last: 2 }.write(&path);
        Position { last_ns: 9, at_last: 1 }.write(&path);
        assert_eq!(Position::read(&path), Position { last_ns: 9, at_last: 1 });
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [POSITION_FILE], "no temp file left behind");
    }

    #[test]
    fn timestamps_are_split_off() {
        let (ns, rest) = split_timestamp(b"2026-12-01T21:40:00.000000001Z hello\n").unwrap();
        assert_eq!(rest, b"hello\n");
        assert_eq!(ns % 1_000_000_000, 1);
        assert!(split_timestamp(b"no-stamp here").is_none());
    }
}
