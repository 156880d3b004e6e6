//! Running a command in a running task's context (`Driver::exec_task`): what script checks use
//! now and `alloc exec` will use later.
//!
//! Each driver builds the command ([`super::Driver::exec_command`]) from what the task was
//! started with, read back from its launch spec in the agent-private state dir (so it works the
//! same after an agent restart):
//! - `raw_exec`: the command itself, in the task dir, with the task's environment, as the
//!   agent's user (as the task runs).
//! - `exec`: `nomad-rs-executor exec ...`, which enters the task's namespaces, root, cgroups,
//!   user and capabilities (see `executor::enter`).
//! - `oci`: `runc exec`, which takes the container's process settings (user, capabilities,
//!   environment, cwd) from its config.
//!
//! [`run_bounded`] then runs it in its own process group, keeps the last [`CHECK_BUF_SIZE`]
//! bytes of its stdout and stderr together (Nomad's `circbuf` of `CheckBufSize`), and kills the
//! group when the timeout passes.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::launch::SPEC_FILE;
use super::{DriverError, TaskHandle};
use crate::executor::LaunchSpec;
use crate::executor::enter::{EXEC_ERROR_PREFIX, EXEC_SETUP_FAILED};

/// Output kept of a command (Nomad's `drivers.CheckBufSize`): the last 4 KiB.
pub const CHECK_BUF_SIZE: usize = 4 * 1024;

/// After the command exited, how long output still held open by its children is read.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// What a command run in the task's context did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The last [`CHECK_BUF_SIZE`] bytes of stdout and stderr, interleaved as they came.
    pub output: Vec<u8>,
    /// The exit code; 128 + the signal when a signal ended it.
    pub exit_code: i32,
}

/// The launch spec the task was started with.
pub(super) fn launch_spec_of(handle: &TaskHandle) -> Result<LaunchSpec, DriverError> {
    let path = handle.state_dir.join(SPEC_FILE);
    let bytes = std::fs::read(&path).map_err(|e| DriverError::io(format!("read {}", path.display()), e))?;
    serde_json::from_slice(&bytes).map_err(|e| DriverError::ExecFailed(format!("parse {}: {e}", path.display())))
}

/// The task must still run for a command to join it.
pub(super) fn require_running(handle: &TaskHandle) -> Result<(), DriverError> {
    if handle.read_exit().is_some() || !handle.task.is_alive() {
        return Err(DriverError::ExecFailed(format!("task {:?} is not running", handle.task_name)));
    }
    Ok(())
}

/// A ring of the last `cap` bytes.
struct Tail {
    cap: usize,
    bytes: VecDeque<u8>,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        let chunk = &chunk[chunk.len().saturating_sub(self.cap)..];
        let overflow = (self.bytes.len() + chunk.len()).saturating_sub(self.cap);
        self.bytes.drain(..overflow);
        self.bytes.extend(chunk);
    }
}

async fn pump(mut from: impl AsyncRead + Unpin, into: Arc<Mutex<Tail>>) {
    let mut buf = [0u8; 4096];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => into.lock().unwrap_or_else(|e| e.into_inner()).push(&buf[..n]),
        }
    }
}

/// Runs `cmd` (stdin closed) in its own process group with `timeout`; see the module docs.
pub async fn run_bounded(mut cmd: tokio::process::Command, timeout: Duration) -> Result<ExecOutput, DriverError> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| DriverError::ExecFailed(format!("start the command: {e}")))?;
    let pgid = child.id().map(|p| p as i32);
    let tail = Arc::new(Mutex::new(Tail { cap: CHECK_BUF_SIZE, bytes: VecDeque::new() }));
    let readers = {
        let out = child.stdout.take().map(|s| pump(s, tail.clone()));
        let err = child.stderr.take().map(|s| pump(s, tail.clone()));
        async move {
            tokio::join!(
                async {
                    if let Some(o) = out {
                        o.await
                    }
                },
                async {
                    if let Some(e) = err {
                        e.await
                    }
                }
            );
        }
    };
    tokio::pin!(readers);
    let kill_group = || {
        if let Some(pgid) = pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
    };
    let mut readers_done = false;
    let waited = tokio::time::timeout(timeout, async {
        loop {
            tokio::select! {
                status = child.wait() => return status,
                () = &mut readers, if !readers_done => readers_done = true,
            }
        }
    })
    .await;
    let status = match waited {
        Err(_) => {
            kill_group();
            let _ = child.wait().await;
            return Err(DriverError::ExecTimedOut(timeout));
        }
        Ok(Err(e)) => return Err(DriverError::ExecFailed(format!("wait for the command: {e}"))),
        Ok(Ok(status)) => status,
    };
    // Children that kept the pipes open get a moment, then lose them.
    if !readers_done {
        let _ = tokio::time::timeout(DRAIN_GRACE, &mut readers).await;
    }
    kill_group();
    use std::os::unix::process::ExitStatusExt;
    let exit_code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let output: Vec<u8> = tail.lock().unwrap_or_else(|e| e.into_inner()).bytes.iter().copied().collect();
    if exit_code == EXEC_SETUP_FAILED
        && let Some(line) = String::from_utf8_lossy(&output).lines().find_map(|l| l.strip_prefix(EXEC_ERROR_PREFIX))
    {
        return Err(DriverError::ExecFailed(line.to_string()));
    }
    Ok(ExecOutput { output, exit_code })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes() {
        let mut t = Tail { cap: 4, bytes: VecDeque::new() };
        t.push(b"ab");
        t.push(b"cde");
        assert_eq!(t.bytes.iter().copied().collect::<Vec<u8>>(), b"bcde");
        t.push(b"0123456789");
        assert_eq!(t.bytes.iter().copied().collect::<Vec<u8>>(), b"6789");
    }

    #[tokio::test]
    async fn output_is_bounded_exit_codes_kept_and_timeouts_kill_the_group() {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "head -c 10000 /dev/zero | tr '\\0' a; echo; echo tail >&2; exit 3"]);
        let out = run_bounded(cmd, Duration::from_secs(10)).await.unwrap();
        assert_eq!(out.exit_code, 3);
        assert_eq!(out.output.len(), CHECK_BUF_SIZE);
        // stdout and stderr are two pipes: the order their last bytes arrive in is not fixed
        // (Nomad's shared buffer has the same race), but both are in the tail.
        let text = String::from_utf8_lossy(&out.output).into_owned();
        let without = text.replacen("tail\n", "", 1);
        assert!(text.len() - without.len() == 5 && text[text.len() - 7..].contains("tail"), "{:?}", &text[4000..]);
        assert!(without.bytes().all(|b| b == b'a' || b == b'\n'), "{:?}", &text[4000..]);

        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "kill -TERM $$"]);
        assert_eq!(run_bounded(cmd, Duration::from_secs(10)).await.unwrap().exit_code, 128 + 15);

        // A background child keeps the pipe open: the command still ends when the shell does.
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child");
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", &format!("(sleep 30; touch {}) & echo started", marker.display())]);
        let started = std::time::Instant::now();
        let out = run_bounded(cmd, Duration::from_secs(20)).await.unwrap();
        assert_eq!((out.exit_code, out.output.as_slice()), (0, b"started\n".as_slice()));
        assert!(started.elapsed() < Duration::from_secs(10));

        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "sleep 30 & sleep 30"]);
        let err = run_bounded(cmd, Duration::from_millis(300)).await.unwrap_err();
        assert!(matches!(err, DriverError::ExecTimedOut(_)), "{err}");
    }
}
