//! The per-task supervisor ("executor"), run as its own small process: `nomad-rs-executor <spec>`.
//!
//! One executor per running task (decision 7). It detaches into its own session, starts the task
//! from a [`LaunchSpec`], reports the task's PID on its stdout (one JSON [`StartReport`] line),
//! pumps the task's stdout/stderr into rotated log files, reaps the task, and writes an
//! [`ExitResult`] atomically into the task's state directory before exiting. It does not depend on
//! the agent after start: the agent may die and return, and recovers from the files.
//!
//! Kept single-threaded and without an async runtime: its memory is the per-task overhead.

pub mod cgroups;
pub mod enter;
pub mod isolation;
pub mod logs;
pub mod process;
pub mod spawn;

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};
use nomad_proto::Timestamp;
use serde::{Deserialize, Serialize};

use crate::fs_beneath::Beneath;
use isolation::IsolationSpec;
use logs::RotatingLog;
use process::{ProcessRef, pidfd_open};

/// Name of the exit record in the task's state directory.
pub const EXIT_FILE: &str = "exit.json";
/// How long output is still collected after the task exits, for pipes its children keep open.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Without a pidfd, how often to check whether the task exited.
const REAP_POLL: Duration = Duration::from_millis(100);

/// Everything the executor needs, written by the driver as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Task name, the prefix of the log files.
    pub task_name: String,
    /// The alloc dir, the one directory here the executor trusts: everything under it is
    /// resolved beneath it (see `fs_beneath`).
    pub alloc_dir: PathBuf,
    /// Where `<task>.stdout.N` / `<task>.stderr.N` go, relative to `alloc_dir` (`alloc/logs`).
    pub log_dir: PathBuf,
    /// Log files kept per stream.
    pub log_max_files: u32,
    /// Size at which a log file is rotated, in bytes.
    pub log_max_file_size: u64,
    /// Where the [`ExitResult`] is written.
    pub exit_file: PathBuf,
    /// cgroup files with an `oom_kill` counter, read after the task exits.
    pub oom_counter_files: Vec<PathBuf>,
    /// How to start the task.
    pub mode: LaunchMode,
}

/// How the task is started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LaunchMode {
    /// A process, optionally isolated (exec driver).
    Process(ProcessSpec),
    /// An OCI container run by an OCI runtime CLI.
    Oci(OciLaunch),
}

/// A process to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessSpec {
    /// Program (looked up in the task's PATH when it has no slash).
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// The complete environment.
    pub env: BTreeMap<String, String>,
    /// Working directory (inside the chroot when isolated).
    pub cwd: PathBuf,
    /// Namespaces, chroot, cgroups and user; none for raw_exec.
    pub isolation: Option<IsolationSpec>,
    /// The group's network namespace, entered before exec (bridge, none and cni networks).
    #[serde(default)]
    pub netns: Option<PathBuf>,
}

/// An OCI bundle to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OciLaunch {
    /// The runtime binary (runc).
    pub runtime: PathBuf,
    /// The runtime's state directory (`--root`).
    pub runtime_root: PathBuf,
    /// The bundle directory (config.json + rootfs).
    pub bundle: PathBuf,
    /// Container ID.
    pub container_id: String,
    /// Where the runtime writes the container's init PID.
    pub pid_file: PathBuf,
    /// The runtime's own log.
    pub log_file: PathBuf,
}

/// The single line the executor prints once the task started (or failed to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartReport {
    /// The task runs.
    Started(ProcessRef),
    /// The task could not be started.
    Failed(String),
}

/// How a task ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExitResult {
    /// Exit code (0 when killed by a signal).
    pub exit_code: i32,
    /// Signal that killed the task (0 when it exited).
    pub signal: i32,
    /// The kernel's OOM killer killed a process of the task.
    pub oom_killed: bool,
    /// When the task ended, as the executor saw it.
    pub finished_at: Timestamp,
    /// Why the exit is not a plain exit status (start failure, lost supervisor).
    pub err: Option<String>,
    /// Log bytes that could not be written (full disk).
    pub log_bytes_dropped: u64,
}

impl ExitResult {
    /// True for exit code 0 without a signal or error.
    pub fn successful(&self) -> bool {
        self.exit_code == 0 && self.signal == 0 && self.err.is_none()
    }

    /// A result for a task whose exit could not be observed.
    pub fn failed(err: impl Into<String>) -> ExitResult {
        ExitResult { exit_code: -1, finished_at: Timestamp::now(), err: Some(err.into()), ..ExitResult::default() }
    }

    /// Reads an exit record, if one was written.
    pub fn read(path: &Path) -> Option<ExitResult> {
        serde_json::from_slice(&fs::read(path).ok()?).ok()
    }
}

/// Entry point of the `nomad-rs-executor` binary.
pub fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == enter::EXEC_SUBCOMMAND) {
        std::process::exit(enter::exec_main(&args[2..]));
    }
    let code = match args.get(1) {
        Some(spec) => match supervise(Path::new(&spec)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("nomad-rs-executor: {e}");
                1
            }
        },
        None => {
            eprintln!("usage: nomad-rs-executor <launch-spec.json>");
            2
        }
    };
    std::process::exit(code);
}

fn supervise(spec_path: &Path) -> Result<(), String> {
    // Its own session: a Ctrl-C or hangup aimed at the agent's terminal does not reach us. (The
    // agent spawns us without pre_exec hooks so it can use posix_spawn, cheap at any agent size.)
    let _ = nix::unistd::setsid();
    let bytes = fs::read(spec_path).map_err(|e| format!("read {}: {e}", spec_path.display()))?;
    let spec: LaunchSpec = serde_json::from_slice(&bytes).map_err(|e| format!("parse {}: {e}", spec_path.display()))?;
    let logs_anchor = match open_log_anchors(&spec) {
        Ok(anchors) => anchors,
        Err(message) => {
            write_exit(&spec.exit_file, &ExitResult::failed(format!("failed to start task: {message}")));
            report(&StartReport::Failed(message.clone()));
            return Err(message);
        }
    };

    let (out_reader, out_writer) = pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("create pipe: {e}"))?;
    let (err_reader, err_writer) = pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("create pipe: {e}"))?;
    let task_pid = match spawn::spawn_task(&spec.mode, out_writer, err_writer) {
        Ok(pid) => pid,
        Err(message) => {
            write_exit(&spec.exit_file, &ExitResult::failed(format!("failed to start task: {message}")));
            report(&StartReport::Failed(message.clone()));
            return Err(message);
        }
    };
    let task = ProcessRef::of(task_pid).unwrap_or(ProcessRef { pid: task_pid, start_time: 0 });
    report(&StartReport::Started(task));
    detach_stdout();

    let [out_anchor, err_anchor] = logs_anchor;
    let new_log = |anchor, stream: &str| {
        RotatingLog::new(anchor, &spec.log_dir, &format!("{}.{stream}", spec.task_name), spec.log_max_files, spec.log_max_file_size)
    };
    let mut stdout_log = new_log(out_anchor, "stdout");
    let mut stderr_log = new_log(err_anchor, "stderr");
    let (status, finished_at) = pump_until_exit(task_pid, [(out_reader, &mut stdout_log), (err_reader, &mut stderr_log)]);

    let mut result = match status {
        Some(WaitStatus::Exited(_, code)) => ExitResult { exit_code: code, ..ExitResult::default() },
        Some(WaitStatus::Signaled(_, signal, _)) => ExitResult { signal: signal as i32, ..ExitResult::default() },
        _ => ExitResult::failed("the task exited but its exit status could not be collected"),
    };
    result.finished_at = finished_at;
    result.oom_killed = cgroups::read_oom_kills(&spec.oom_counter_files) > 0;
    result.log_bytes_dropped = stdout_log.dropped_bytes() + stderr_log.dropped_bytes();
    write_exit(&spec.exit_file, &result);
    Ok(())
}

/// The alloc dir, opened once per log stream, before the task starts: a task whose logs have
/// nowhere safe to go does not start. The log dir must be a plain relative path under it.
fn open_log_anchors(spec: &LaunchSpec) -> Result<[Beneath; 2], String> {
    let relative = spec.log_dir.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    if !relative || spec.log_dir.as_os_str().is_empty() {
        return Err(format!("log dir {} must be a plain path relative to the alloc dir", spec.log_dir.display()));
    }
    let anchor = Beneath::open(&spec.alloc_dir).map_err(|e| e.to_string())?;
    let second = anchor.try_clone().map_err(|e| e.to_string())?;
    Ok([anchor, second])
}

/// Prints the start report for the agent, which reads exactly one line.
fn report(report: &StartReport) {
    let mut line = serde_json::to_vec(report).unwrap_or_default();
    line.push(b'\n');
    // The agent may already be gone; Rust ignores SIGPIPE, so this is just an error.
    let _ = io::stdout().lock().write_all(&line);
    let _ = io::stdout().lock().flush();
}

/// Points stdout at /dev/null so a dead agent's closed pipe can never hurt us later.
fn detach_stdout() {
    if let Ok(null) = fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(null);
    }
}

/// Copies both pipes into their logs until the task has exited and the pipes are drained (or
/// the drain grace ran out); returns the task's wait status and when it was reaped.
fn pump_until_exit(task_pid: i32, streams: [(OwnedFd, &mut RotatingLog); 2]) -> (Option<WaitStatus>, Timestamp) {
    let pidfd = pidfd_open(task_pid).ok();
    let mut streams: Vec<(Option<OwnedFd>, &mut RotatingLog)> = streams.into_iter().map(|(fd, log)| (Some(fd), log)).collect();
    let mut status: Option<WaitStatus> = None;
    let mut finished_at = Timestamp::ZERO;
    let mut task_gone = false;
    let mut drain_deadline: Option<Instant> = None;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !task_gone {
            match reap(task_pid) {
                Reaped::Task(s) => {
                    status = Some(s);
                    task_gone = true;
                }
                Reaped::NotOurs => task_gone = true,
                Reaped::Running => {}
            }
        }
        if task_gone && drain_deadline.is_none() {
            finished_at = Timestamp::now();
            drain_deadline = Some(Instant::now() + DRAIN_GRACE);
        }
        let open_pipes = streams.iter().filter(|(fd, _)| fd.is_some()).count();
        if task_gone && (open_pipes == 0 || drain_deadline.is_some_and(|d| Instant::now() >= d)) {
            return (status, finished_at);
        }

        let mut fds: Vec<libc::pollfd> = streams
            .iter()
            .filter_map(|(fd, _)| fd.as_ref())
            .map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        if !task_gone && let Some(pidfd) = &pidfd {
            fds.push(libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        let timeout = match (drain_deadline, &pidfd) {
            (Some(deadline), _) => deadline.saturating_duration_since(Instant::now()),
            (None, Some(_)) => Duration::from_secs(3600),
            (None, None) => REAP_POLL,
        };
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if ready <= 0 {
            continue; // timeout or EINTR: re-check the task
        }
        for (fd, log) in streams.iter_mut() {
            let Some(pipe) = fd.as_ref() else { continue };
            let revents = fds.iter().find(|p| p.fd == pipe.as_raw_fd()).map_or(0, |p| p.revents);
            if revents == 0 {
                continue;
            }
            match nix::unistd::read(pipe, &mut buf) {
                Ok(0) => *fd = None,
                Ok(n) => log.write(&buf[..n]),
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
                Err(_) => *fd = None,
            }
        }
    }
}

enum Reaped {
    Task(WaitStatus),
    Running,
    /// The task is not our child (should not happen) and is gone: its status is unknowable.
    NotOurs,
}

/// Reaps every exited child (as a subreaper we also inherit the runtime's orphans) and tells
/// whether the task was among them.
fn reap(task_pid: i32) -> Reaped {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return Reaped::Running,
            Ok(status @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _))) if pid.as_raw() == task_pid => {
                return Reaped::Task(status);
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                // ECHILD: nothing left to reap. The task is ours only if it is still alive.
                let alive = fs::metadata(format!("/proc/{task_pid}")).is_ok();
                return if alive { Reaped::Running } else { Reaped::NotOurs };
            }
        }
    }
}

/// Writes the exit record atomically (temp file + rename), retrying briefly on a full disk.
fn write_exit(path: &Path, result: &ExitResult) {
    let bytes = serde_json::to_vec(result).unwrap_or_default();
    let tmp = path.with_extension("json.tmp");
    for attempt in 0..20 {
        let written = (|| -> io::Result<()> {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, path)
        })();
        match written {
            Ok(()) => return,
            Err(e) if attempt == 19 => eprintln!("nomad-rs-executor: write {}: {e}", path.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}
