//! Starting the task: a plain process, an isolated one (exec), or an OCI container through runc.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::fcntl::OFlag;
use nix::unistd::{pipe2, setsid};

use super::isolation::{self, Prepared};
use super::{LaunchMode, OciLaunch, ProcessSpec};

/// Starts the task with `stdout`/`stderr` as its output; returns its PID.
pub fn spawn_task(mode: &LaunchMode, stdout: OwnedFd, stderr: OwnedFd) -> Result<i32, String> {
    match mode {
        LaunchMode::Process(spec) => spawn_process(spec, stdout, stderr),
        LaunchMode::Oci(oci) => spawn_container(oci, stdout, stderr),
    }
}

fn spawn_process(spec: &ProcessSpec, stdout: OwnedFd, stderr: OwnedFd) -> Result<i32, String> {
    let prepared: Option<Prepared> = match &spec.isolation {
        Some(iso) => {
            let prepared = isolation::prepare(iso)?;
            isolation::unshare_pid_namespace()?;
            Some(prepared)
        }
        None => None,
    };
    // Opened before fork: the child only calls setns(2) on it.
    let netns = match &spec.netns {
        Some(path) => Some(std::fs::File::open(path).map_err(|e| format!("open network namespace {}: {e}", path.display()))?),
        None => None,
    };
    let mut command = Command::new(&spec.command);
    command.args(&spec.args).env_clear().envs(&spec.env).stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    if prepared.is_none() {
        // Isolated tasks chdir after chroot instead (std would chdir before our pre_exec).
        command.current_dir(&spec.cwd);
    }
    // The child reports which setup step failed here; std only carries the errno back.
    let (step_reader, step_writer) = pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("create pipe: {e}"))?;
    // SAFETY: the executor is single-threaded, so allocating in the child after fork cannot
    // deadlock on a lock held by another thread.
    unsafe {
        command.pre_exec(move || {
            // Its own session and process group, so the agent can signal the whole task at once.
            setsid()?;
            if let Some(ns) = &netns
                && let Err(errno) = nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
            {
                let message = format!("enter network namespace: {}", errno.desc());
                let _ = nix::unistd::write(&step_writer, message.as_bytes());
                return Err(std::io::Error::from_raw_os_error(errno as i32));
            }
            if let Some(prepared) = &prepared
                && let Err((step, errno)) = prepared.enter()
            {
                let message = format!("{step}: {}", errno.desc());
                let _ = nix::unistd::write(&step_writer, message.as_bytes());
                return Err(std::io::Error::from_raw_os_error(errno as i32));
            }
            Ok(())
        });
    }
    let spawned = command.spawn();
    drop(command); // closes our copy of the step pipe's write end
    match spawned {
        Ok(child) => Ok(child.id() as i32),
        Err(e) => {
            let mut step = String::new();
            let _ = std::fs::File::from(step_reader).read_to_string(&mut step);
            if step.is_empty() {
                Err(format!("exec {:?}: {e}", spec.command))
            } else {
                Err(format!("set up isolation for {:?}: {step}", spec.command))
            }
        }
    }
}

/// `runc create` then `runc start`, instead of a foreground `runc run`: runc exits once the
/// container is created, so no Go runtime stays resident per task, and because we are a child
/// subreaper the container's init is re-parented to us, which lets us reap it and record its
/// real exit status. Its stdio are our pipes, inherited through runc's pass-through mode.
fn spawn_container(oci: &OciLaunch, stdout: OwnedFd, stderr: OwnedFd) -> Result<i32, String> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("become child subreaper: {e}"))?;
    let _ = std::fs::remove_file(&oci.pid_file);
    let status = runc(oci)
        .arg("create")
        .arg("--bundle")
        .arg(&oci.bundle)
        .arg("--pid-file")
        .arg(&oci.pid_file)
        .arg(&oci.container_id)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .status()
        .map_err(|e| format!("run {}: {e}", oci.runtime.display()))?;
    if !status.success() {
        return Err(format!("{} create failed ({status}): {}", oci.runtime.display(), log_tail(&oci.log_file)));
    }
    let pid = std::fs::read_to_string(&oci.pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .ok_or_else(|| format!("runtime wrote no pid to {}", oci.pid_file.display()))?;
    let started = runc(oci).arg("start").arg(&oci.container_id).stdin(Stdio::null()).stdout(Stdio::null()).status();
    match started {
        Ok(s) if s.success() => Ok(pid),
        other => {
            let _ = runc(oci).args(["delete", "--force", &oci.container_id]).stdout(Stdio::null()).status();
            let why = match other {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            };
            Err(format!("{} start failed ({why}): {}", oci.runtime.display(), log_tail(&oci.log_file)))
        }
    }
}

fn runc(oci: &OciLaunch) -> Command {
    let mut command = Command::new(&oci.runtime);
    command.arg("--root").arg(&oci.runtime_root).arg("--log").arg(&oci.log_file).stderr(Stdio::null());
    command
}

/// The last few lines of the runtime's log, where it explains a failure.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() { format!("no details in {}", path.display()) } else { tail }
}
