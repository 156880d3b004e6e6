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
//!
//! [`spawn_session`] runs it interactively (`alloc exec`): input, output and the exit code go
//! through an [`ExecSession`]'s channels. With a TTY the command gets a new pseudo-terminal as
//! its controlling terminal (stdin, stdout and stderr; resizes applied to it); without one, three
//! pipes. Dropping the session kills the command's process group.

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

/// Input to an interactive command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for its stdin.
    Stdin(Vec<u8>),
    /// Its stdin is closed (end of input).
    CloseStdin,
    /// The terminal's new size (ignored without a TTY).
    Resize { height: u16, width: u16 },
}

/// Output of an interactive command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutputChunk {
    /// Bytes from its stdout (with a TTY: everything the terminal shows).
    Stdout(Vec<u8>),
    /// Bytes from its stderr.
    Stderr(Vec<u8>),
    /// The stream is at its end (no more of this kind).
    StdoutClosed,
    /// The stream is at its end (no more of this kind).
    StderrClosed,
}

/// A command running interactively in a task (see [`spawn_session`]).
pub struct ExecSession {
    /// What the command reads.
    pub input: tokio::sync::mpsc::Sender<ExecInput>,
    /// What it writes; ends after its output is drained once it exited.
    pub output: tokio::sync::mpsc::Receiver<ExecOutputChunk>,
    /// Its exit code (128 + signal) once it exited and its output is drained.
    pub exit: tokio::sync::oneshot::Receiver<Result<i32, DriverError>>,
}

/// Bytes read from a command's output at once.
pub(super) const SESSION_CHUNK: usize = 16 * 1024;

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
pub(super) struct Tail {
    cap: usize,
    bytes: VecDeque<u8>,
}

impl Tail {
    /// An empty ring of [`CHECK_BUF_SIZE`] bytes.
    pub(super) fn check_buffer() -> Tail {
        Tail { cap: CHECK_BUF_SIZE, bytes: VecDeque::new() }
    }

    /// What it holds, oldest first.
    pub(super) fn to_vec(&self) -> Vec<u8> {
        self.bytes.iter().copied().collect()
    }

    pub(super) fn push(&mut self, chunk: &[u8]) {
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
    let tail = Arc::new(Mutex::new(Tail::check_buffer()));
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
    let output = tail.lock().unwrap_or_else(|e| e.into_inner()).to_vec();
    if exit_code == EXEC_SETUP_FAILED
        && let Some(line) = String::from_utf8_lossy(&output).lines().find_map(|l| l.strip_prefix(EXEC_ERROR_PREFIX))
    {
        return Err(DriverError::ExecFailed(line.to_string()));
    }
    Ok(ExecOutput { output, exit_code })
}

/// Starts `cmd` interactively, with a pseudo-terminal when `tty` is set, else pipes.
pub fn spawn_session(mut cmd: tokio::process::Command, tty: bool, size: Option<(u16, u16)>) -> Result<ExecSession, DriverError> {
    use tokio::sync::{mpsc, oneshot};
    let failed = |what: &str, e: &dyn std::fmt::Display| DriverError::ExecFailed(format!("{what}: {e}"));
    let (in_tx, mut in_rx) = mpsc::channel::<ExecInput>(64);
    let (out_tx, out_rx) = mpsc::channel::<ExecOutputChunk>(64);
    let (exit_tx, exit_rx) = oneshot::channel();
    cmd.kill_on_drop(true);
    let mut terminal: Option<std::os::fd::OwnedFd> = None;
    if tty {
        let winsize = size.map(|(height, width)| nix::pty::Winsize { ws_row: height, ws_col: width, ws_xpixel: 0, ws_ypixel: 0 });
        let pty =
            nix::pty::openpty(winsize.as_ref(), None::<&nix::sys::termios::Termios>).map_err(|e| failed("open a pseudo-terminal", &e))?;
        let slave = std::fs::File::from(pty.slave);
        let dup = |f: &std::fs::File| f.try_clone().map_err(|e| failed("duplicate the terminal", &e));
        cmd.stdin(dup(&slave)?).stdout(dup(&slave)?).stderr(slave);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // A session of its own with the terminal as its controlling one, so the shell
                // gets job control and ^C reaches what runs in the foreground.
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        terminal = Some(pty.master);
    } else {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| failed("start the command", &e))?;
    // Its own session or group either way: the group ID is its PID.
    let pgid = child.id().map(|p| p as i32);
    // The parent's copies of the terminal's slave side went with `cmd`'s stdio once spawned.
    drop(cmd);

    type Reader = std::pin::Pin<Box<dyn AsyncRead + Send>>;
    type Writer = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;
    type Ends = (Option<Writer>, Option<Reader>, Option<Reader>, Option<std::os::fd::OwnedFd>);
    let (stdin_writer, stdout_reader, stderr_reader, master_raw): Ends = match terminal {
        Some(master) => {
            let resize_fd = master.try_clone().map_err(|e| failed("duplicate the terminal", &e))?;
            let write_fd = master.try_clone().map_err(|e| failed("duplicate the terminal", &e))?;
            let reader = tokio::fs::File::from_std(std::fs::File::from(master));
            let writer = tokio::fs::File::from_std(std::fs::File::from(write_fd));
            (Some(Box::pin(writer)), Some(Box::pin(reader)), None, Some(resize_fd))
        }
        None => (
            child.stdin.take().map(|w| Box::pin(w) as _),
            child.stdout.take().map(|r| Box::pin(r) as Reader),
            child.stderr.take().map(|r| Box::pin(r) as Reader),
            None,
        ),
    };

    // Input: stdin bytes, its close, and terminal resizes.
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut stdin = stdin_writer;
        while let Some(msg) = in_rx.recv().await {
            match msg {
                ExecInput::Stdin(data) => {
                    if let Some(w) = stdin.as_mut()
                        && (w.write_all(&data).await.is_err() || w.flush().await.is_err())
                    {
                        stdin = None;
                    }
                }
                ExecInput::CloseStdin => {
                    if master_raw.is_some() {
                        // A terminal has no end of its own: EOT at the start of a line is one.
                        if let Some(w) = stdin.as_mut() {
                            let _ = w.write_all(&[4]).await;
                        }
                    } else {
                        stdin = None;
                    }
                }
                ExecInput::Resize { height, width } => {
                    if let Some(fd) = &master_raw {
                        let ws = libc::winsize { ws_row: height, ws_col: width, ws_xpixel: 0, ws_ypixel: 0 };
                        // SAFETY: TIOCSWINSZ reads a winsize from the pointer, which outlives the call.
                        unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(fd), libc::TIOCSWINSZ as _, &ws) };
                    }
                }
            }
        }
    });

    async fn pump_session(
        reader: Option<Reader>,
        tx: mpsc::Sender<ExecOutputChunk>,
        data: fn(Vec<u8>) -> ExecOutputChunk,
        closed: ExecOutputChunk,
    ) {
        if let Some(mut r) = reader {
            let mut buf = vec![0u8; SESSION_CHUNK];
            loop {
                match r.read(&mut buf).await {
                    // A terminal whose last holder closed it reads as EIO: its end.
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(data(buf[..n].to_vec())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let _ = tx.send(closed).await;
    }
    let out = tokio::spawn(pump_session(stdout_reader, out_tx.clone(), ExecOutputChunk::Stdout, ExecOutputChunk::StdoutClosed));
    let err = tokio::spawn(pump_session(stderr_reader, out_tx, ExecOutputChunk::Stderr, ExecOutputChunk::StderrClosed));
    tokio::spawn(async move {
        let mut exit_tx = exit_tx;
        let kill_group = || {
            if let Some(pgid) = pgid {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
            }
        };
        let status = tokio::select! {
            s = child.wait() => s,
            // Nobody listens any more: the command goes.
            _ = exit_tx.closed() => {
                kill_group();
                let _ = child.wait().await;
                return;
            }
        };
        // Children that kept the output open get a moment, then lose it.
        let drained = tokio::time::timeout(DRAIN_GRACE, async {
            let _ = out.await;
            let _ = err.await;
        });
        let _ = drained.await;
        kill_group();
        use std::os::unix::process::ExitStatusExt;
        let result = status
            .map(|s| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)))
            .map_err(|e| DriverError::ExecFailed(format!("wait for the command: {e}")));
        let _ = exit_tx.send(result);
    });
    Ok(ExecSession { input: in_tx, output: out_rx, exit: exit_rx })
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

    /// Reads a session's stdout until `want` is in it.
    async fn read_until(session: &mut ExecSession, want: &str) -> String {
        let mut seen = String::new();
        let got = tokio::time::timeout(Duration::from_secs(20), async {
            while !seen.contains(want) {
                match session.output.recv().await {
                    Some(ExecOutputChunk::Stdout(d)) | Some(ExecOutputChunk::Stderr(d)) => seen.push_str(&String::from_utf8_lossy(&d)),
                    Some(_) => {}
                    None => return,
                }
            }
        })
        .await;
        assert!(got.is_ok() && seen.contains(want), "wanted {want:?}, saw {seen:?}");
        seen
    }

    #[tokio::test]
    async fn a_piped_session_echoes_stdin_and_reports_the_exit_code() {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "read line; echo got-$line; echo err >&2; exit 7"]);
        let mut s = spawn_session(cmd, false, None).unwrap();
        s.input.send(ExecInput::Stdin(b"hello\n".to_vec())).await.unwrap();
        read_until(&mut s, "got-hello").await;
        let code = tokio::time::timeout(Duration::from_secs(20), &mut s.exit).await.unwrap().unwrap().unwrap();
        assert_eq!(code, 7);

        // Closing stdin ends `cat`.
        let mut cmd = tokio::process::Command::new("/bin/cat");
        cmd.env_clear();
        let mut s = spawn_session(cmd, false, None).unwrap();
        s.input.send(ExecInput::Stdin(b"abc".to_vec())).await.unwrap();
        read_until(&mut s, "abc").await;
        s.input.send(ExecInput::CloseStdin).await.unwrap();
        assert_eq!(tokio::time::timeout(Duration::from_secs(20), &mut s.exit).await.unwrap().unwrap().unwrap(), 0);
    }

    #[tokio::test]
    async fn a_tty_session_has_a_terminal_that_follows_resizes() {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "tty >/dev/null && echo is-a-tty; stty size; read x; stty size; exit 3"]);
        let mut s = spawn_session(cmd, true, Some((24, 80))).unwrap();
        let first = read_until(&mut s, "24 80").await;
        assert!(first.contains("is-a-tty"), "{first:?}");
        s.input.send(ExecInput::Resize { height: 50, width: 132 }).await.unwrap();
        s.input.send(ExecInput::Stdin(b"go\r".to_vec())).await.unwrap();
        let seen = read_until(&mut s, "50 132").await;
        assert!(!seen.contains("not a tty"), "{seen:?}");
        assert_eq!(tokio::time::timeout(Duration::from_secs(20), &mut s.exit).await.unwrap().unwrap().unwrap(), 3);
    }

    #[tokio::test]
    async fn output_is_bounded_exit_codes_kept_and_timeouts_kill_the_group() {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "head -c 10000 /dev/zero | tr '\\0' a; echo; echo tail; exit 3"]);
        let out = run_bounded(cmd, Duration::from_secs(10)).await.unwrap();
        assert_eq!(out.exit_code, 3);
        // The last CHECK_BUF_SIZE bytes, oldest first.
        assert_eq!(out.output.len(), CHECK_BUF_SIZE);
        assert!(out.output.ends_with(b"a\ntail\n"), "{:?}", String::from_utf8_lossy(&out.output[4000..]));
        assert!(out.output[..CHECK_BUF_SIZE - 6].iter().all(|&b| b == b'a'));

        // stderr is kept too. (With both pipes busy, the order their bytes arrive in is not
        // fixed, as in Nomad's shared buffer, so it is checked on its own.)
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", "echo to-stderr >&2"]);
        assert_eq!(run_bounded(cmd, Duration::from_secs(10)).await.unwrap().output, b"to-stderr\n");

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
