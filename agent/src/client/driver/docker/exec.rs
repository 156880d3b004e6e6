//! Commands in a running container through the Engine's exec API, with the contract of the
//! other drivers (`task_exec`):
//! - [`run_bounded`] for script checks (`Driver::exec_task`): no stdin, no TTY, the last
//!   [`CHECK_BUF_SIZE`](super::super::CHECK_BUF_SIZE) bytes of stdout and stderr together, the
//!   exit code, killed when the timeout passes.
//! - [`session`] for `alloc exec` (`Driver::exec_streaming`): stdin, stdout and stderr attached,
//!   a TTY when asked (its size set at start and on every resize), the exit code once the
//!   output is drained; dropping the session kills the command.
//!
//! The Engine keeps an exec's output open at most 2 s after its process exits (children that
//! hold it lose it then), so reading to the end of the stream is how the end is found. It has no
//! call to end an exec, so a command that outlives its caller is killed from the host: the PID
//! the exec's inspect reports and the processes under it, each checked by its start time before
//! the signal (no stranger that got a reused PID is hit).

use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::super::task_exec::{SESSION_CHUNK, Tail};
use super::super::{DriverError, ExecInput, ExecOutput, ExecOutputChunk, ExecSession};
use super::container::{engine_error, status_of};
use crate::executor::process::kill_tree;

/// How long the exit code is asked for after the output ended (Nomad polls up to 3 s).
const EXIT_WAIT: Duration = Duration::from_secs(3);
/// Between two asks.
const EXIT_POLL: Duration = Duration::from_millis(25);

type Output = BoxStream<'static, Result<LogOutput, bollard::errors::Error>>;
type Input = std::pin::Pin<Box<dyn AsyncWrite + Send>>;

/// One exec of `command args` in the container, attached.
struct Exec {
    id: String,
    output: Output,
    input: Input,
}

fn not_running(task_name: &str) -> DriverError {
    DriverError::ExecFailed(format!("task {task_name:?} is not running"))
}

/// Creates and starts the exec; `Err` names why it could not run.
async fn start(
    docker: &Docker,
    container_id: &str,
    task_name: &str,
    command: &str,
    args: &[String],
    stdin: bool,
    tty: bool,
) -> Result<Exec, DriverError> {
    let cmd: Vec<String> = std::iter::once(command.to_string()).chain(args.iter().cloned()).collect();
    let options = CreateExecOptions {
        attach_stdin: Some(stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(tty),
        cmd: Some(cmd),
        ..Default::default()
    };
    let id = match docker.create_exec(container_id, options).await {
        Ok(created) => created.id,
        // 404: the container is gone; 409: it is not running (or paused).
        Err(e) if matches!(status_of(&e), Some(404 | 409)) => return Err(not_running(task_name)),
        Err(e) => return Err(engine_error("create exec", e)),
    };
    let start = StartExecOptions { detach: false, tty, output_capacity: Some(SESSION_CHUNK) };
    match docker.start_exec(&id, Some(start)).await {
        Ok(StartExecResults::Attached { output, input }) => Ok(Exec { id, output, input }),
        Ok(StartExecResults::Detached) => Err(DriverError::ExecFailed("the Engine started the exec detached".into())),
        Err(e) if matches!(status_of(&e), Some(404 | 409)) => Err(not_running(task_name)),
        Err(e) => Err(engine_error("start exec", e)),
    }
}

/// The bytes of one output item and whether they are stderr (a TTY's output is one stream).
fn bytes_of(item: LogOutput) -> Option<(bool, bytes::Bytes)> {
    match item {
        LogOutput::StdOut { message } | LogOutput::Console { message } => Some((false, message)),
        LogOutput::StdErr { message } => Some((true, message)),
        LogOutput::StdIn { .. } => None,
    }
}

/// The exit code once the Engine reports the exec ended (up to [`EXIT_WAIT`]).
async fn exit_code(docker: &Docker, id: &str) -> Result<i32, DriverError> {
    let deadline = tokio::time::Instant::now() + EXIT_WAIT;
    loop {
        let inspected = docker.inspect_exec(id).await.map_err(|e| engine_error("inspect exec", e))?;
        if inspected.running == Some(false) {
            return Ok(inspected.exit_code.unwrap_or(-1) as i32);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(DriverError::ExecFailed(format!("the command's output ended but it did not exit within {EXIT_WAIT:?}")));
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// How long a kill keeps at an exec the Engine still reports running.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Kills the exec's process and the processes under it; one already gone is fine.
async fn kill(docker: &Docker, id: &str) {
    let inspect = || async {
        let inspected = docker.inspect_exec(id).await?;
        Ok::<_, bollard::errors::Error>((inspected.running == Some(true), inspected.pid.unwrap_or(0) as i32))
    };
    // Stopped before killed: a child forked after a scan would move to the container's init
    // and could no longer be found under the command (see `kill_tree`).
    let kill_pid = |pid: i32| async move {
        if let Err(e) = tokio::task::spawn_blocking(move || kill_tree(pid)).await {
            tracing::warn!(pid, error = %e, "killing an exec's processes");
        }
    };
    if let Err(e) = kill_until_ended(inspect, kill_pid, KILL_WAIT).await {
        tracing::warn!(exec = %id, error = %e, "the exec's command may outlive its caller");
    }
}

/// Kills the exec's process tree until `inspect` says it no longer runs. The Engine marks an
/// exec running, and lets its output flow, before it records the PID (0 until then), and it
/// reports the end only once it has seen the exit: so a PID of 0 is asked again, and a tree
/// still reported running is killed again (each process is checked by its start time first).
async fn kill_until_ended<I, IF, K, KF, E>(mut inspect: I, kill_pid: K, wait: Duration) -> Result<(), String>
where
    I: FnMut() -> IF,
    IF: std::future::Future<Output = Result<(bool, i32), E>>,
    K: Fn(i32) -> KF,
    KF: std::future::Future<Output = ()>,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match inspect().await {
            Ok((false, _)) => return Ok(()),
            Ok((true, pid)) if pid > 0 => kill_pid(pid).await,
            Ok((true, _)) => {}
            Err(e) => return Err(format!("cannot find the exec's process to kill it: {e}")),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("the Engine still reports it running after {wait:?}"));
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// Runs the command with no stdin and keeps the tail of its output; see the module docs.
pub async fn run_bounded(
    docker: &Docker,
    container_id: &str,
    task_name: &str,
    command: &str,
    args: &[String],
    timeout: Duration,
) -> Result<ExecOutput, DriverError> {
    let mut exec = start(docker, container_id, task_name, command, args, false, false).await?;
    let mut tail = Tail::check_buffer();
    let finished = tokio::time::timeout(timeout, async {
        while let Some(item) = exec.output.next().await {
            match item.map(bytes_of) {
                Ok(Some((_, bytes))) => tail.push(&bytes),
                Ok(None) => {}
                // The connection broke: what the Engine says about the exec decides.
                Err(e) => {
                    tracing::debug!(exec = %exec.id, error = %e, "exec output ended");
                    break;
                }
            }
        }
        exit_code(docker, &exec.id).await
    })
    .await;
    match finished {
        Ok(code) => Ok(ExecOutput { output: tail.to_vec(), exit_code: code? }),
        Err(_) => {
            kill(docker, &exec.id).await;
            Err(DriverError::ExecTimedOut(timeout))
        }
    }
}

/// Starts the command interactively; see the module docs.
pub async fn session(
    docker: &Docker,
    container_id: &str,
    task_name: &str,
    command: &str,
    args: &[String],
    tty: bool,
    size: Option<(u16, u16)>,
) -> Result<ExecSession, DriverError> {
    let exec = start(docker, container_id, task_name, command, args, true, tty).await?;
    let Exec { id, mut output, input } = exec;
    if tty && let Some((height, width)) = size {
        resize(docker, &id, height, width).await;
    }
    let (in_tx, in_rx) = mpsc::channel::<ExecInput>(64);
    let (out_tx, out_rx) = mpsc::channel::<ExecOutputChunk>(64);
    let (exit_tx, exit_rx) = oneshot::channel();
    tokio::spawn(feed_input(docker.clone(), id.clone(), input, in_rx, tty));
    let pump = tokio::spawn(async move {
        while let Some(Ok(item)) = output.next().await {
            let Some((stderr, bytes)) = bytes_of(item) else { continue };
            let chunk = if stderr { ExecOutputChunk::Stderr(bytes.to_vec()) } else { ExecOutputChunk::Stdout(bytes.to_vec()) };
            if out_tx.send(chunk).await.is_err() {
                return;
            }
        }
        let _ = out_tx.send(ExecOutputChunk::StdoutClosed).await;
        let _ = out_tx.send(ExecOutputChunk::StderrClosed).await;
    });
    let docker = docker.clone();
    tokio::spawn(async move {
        let mut exit_tx = exit_tx;
        // Nobody listens any more: the command goes. Checked first, and again after the output
        // ended, since a caller that left can also end the output (or meet its end) first.
        let gone = tokio::select! {
            biased;
            _ = exit_tx.closed() => true,
            _ = pump => exit_tx.is_closed(),
        };
        if gone {
            kill(&docker, &id).await;
            return;
        }
        let _ = exit_tx.send(exit_code(&docker, &id).await);
    });
    Ok(ExecSession { input: in_tx, output: out_rx, exit: exit_rx })
}

async fn resize(docker: &Docker, id: &str, height: u16, width: u16) {
    if let Err(e) = docker.resize_exec(id, ResizeExecOptions { height, width }).await {
        tracing::debug!(exec = %id, error = %e, "resizing the exec's terminal");
    }
}

/// Stdin bytes, its end and terminal resizes, in the order the caller sent them.
async fn feed_input(docker: Docker, id: String, input: Input, mut from: mpsc::Receiver<ExecInput>, tty: bool) {
    let mut stdin = Some(input);
    while let Some(msg) = from.recv().await {
        match msg {
            ExecInput::Stdin(data) => {
                if let Some(w) = stdin.as_mut()
                    && (w.write_all(&data).await.is_err() || w.flush().await.is_err())
                {
                    stdin = None;
                }
            }
            ExecInput::CloseStdin => match stdin.as_mut() {
                // A terminal has no end of its own: EOT at the start of a line is one.
                Some(w) if tty => {
                    let _ = w.write_all(&[4]).await;
                    let _ = w.flush().await;
                }
                // Half-closes the connection: the Engine closes the command's stdin.
                Some(w) => {
                    let _ = w.shutdown().await;
                    stdin = None;
                }
                None => {}
            },
            ExecInput::Resize { height, width } if tty => resize(&docker, &id, height, width).await,
            ExecInput::Resize { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// The Engine's answers in turn (the last one repeats), and the PIDs killed.
    async fn kill_with(answers: &[(bool, i32)], wait: Duration) -> (Result<(), String>, Vec<i32>) {
        let asked = Mutex::new(0usize);
        let killed = Mutex::new(Vec::new());
        let inspect = || {
            let mut n = asked.lock().unwrap();
            let answer = answers[(*n).min(answers.len() - 1)];
            *n += 1;
            async move { Ok::<_, String>(answer) }
        };
        let kill_pid = |pid: i32| {
            killed.lock().unwrap().push(pid);
            async {}
        };
        let result = kill_until_ended(inspect, kill_pid, wait).await;
        (result, killed.into_inner().unwrap())
    }

    #[tokio::test]
    async fn a_pid_the_engine_has_not_recorded_yet_is_asked_for_again_and_killed() {
        let (result, killed) = kill_with(&[(true, 0), (true, 0), (true, 4242), (false, 4242)], KILL_WAIT).await;
        assert_eq!((result, killed), (Ok(()), vec![4242]));
    }

    #[tokio::test]
    async fn an_exec_reported_running_is_killed_again_until_the_deadline_says_so() {
        let (result, killed) = kill_with(&[(true, 7)], Duration::from_millis(100)).await;
        assert!(result.unwrap_err().contains("still reports it running"));
        assert!(killed.len() > 1 && killed.iter().all(|&pid| pid == 7), "{killed:?}");
    }

    #[tokio::test]
    async fn an_exec_already_ended_is_left_alone() {
        let (result, killed) = kill_with(&[(false, 0)], KILL_WAIT).await;
        assert_eq!((result, killed), (Ok(()), vec![]));
    }
}
