//! `nomad-rs-executor exec <launch.json> <pid> <start time> <command> [args...]`: runs one
//! command inside a running exec task's isolation, as Nomad's executor runs script checks and
//! `alloc exec` commands inside the task's container.
//!
//! The command joins the task as it is, rather than getting a copy of its isolation: it enters
//! the task's own namespaces (`/proc/<pid>/ns/{ipc,uts,mnt,pid}`), so it sees the task's
//! `/tmp`, its processes and its hostname; its root is the task's root (`/proc/<pid>/root`,
//! opened before entering, as `nsenter --root` does); it joins the task's cgroups, so it counts
//! against the task's limits; and it runs as the task's user with the task's capabilities. What
//! to join comes from the task's launch spec in the agent-private state dir (never from the task
//! dir, which the task can write), and the target is named by PID *and* start time, checked
//! after the namespace files are open, so a recycled PID is never entered.
//!
//! Exit status: the command's own (128 + signal when a signal ended it); [`EXEC_SETUP_FAILED`]
//! (125, as `chroot` and `env` use) with one line `nomad-rs-executor exec: <why>` on stderr when
//! the helper could not enter the task; 126/127 with a line on stderr when the command could not
//! be executed or found, as a shell reports it.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{OFlag, open};
use nix::sched::{CloneFlags, setns};
use nix::sys::stat::Mode;
use nix::unistd::{chdir, chroot, fchdir};

use super::isolation::Identity;
use super::process::ProcessRef;
use super::{LaunchMode, LaunchSpec};

/// Exit status when the helper itself failed (could not enter the task).
pub const EXEC_SETUP_FAILED: i32 = 125;
/// The first word of the helper's own error line on stderr.
pub const EXEC_ERROR_PREFIX: &str = "nomad-rs-executor exec: ";
/// The sub-command that selects this mode.
pub const EXEC_SUBCOMMAND: &str = "exec";

/// The namespaces entered, in order. The PID namespace applies to the child the helper forks.
const NAMESPACES: [(&str, CloneFlags); 4] = [
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

/// The helper's arguments after the sub-command.
pub fn exec_args(spec: &Path, task: ProcessRef, command: &str, args: &[String]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        EXEC_SUBCOMMAND.into(),
        spec.as_os_str().to_owned(),
        task.pid.to_string().into(),
        task.start_time.to_string().into(),
        command.into(),
    ];
    out.extend(args.iter().map(OsString::from));
    out
}

/// Entry point of the sub-command; returns the exit status.
pub fn exec_main(args: &[OsString]) -> i32 {
    let parsed = (|| {
        let spec = PathBuf::from(args.first()?);
        let pid: i32 = args.get(1)?.to_str()?.parse().ok()?;
        let start_time: u64 = args.get(2)?.to_str()?.parse().ok()?;
        let command = args.get(3)?.clone();
        Some((spec, ProcessRef { pid, start_time }, command, args[4..].to_vec()))
    })();
    let Some((spec, task, command, rest)) = parsed else {
        eprintln!("{EXEC_ERROR_PREFIX}usage: nomad-rs-executor exec <launch.json> <pid> <start time> <command> [args...]");
        return EXEC_SETUP_FAILED;
    };
    match enter_and_run(&spec, task, &command, &rest) {
        Ok(code) => code,
        Err(Failure::Setup(why)) => {
            eprintln!("{EXEC_ERROR_PREFIX}{why}");
            EXEC_SETUP_FAILED
        }
        Err(Failure::Command(code, why)) => {
            eprintln!("{why}");
            code
        }
    }
}

enum Failure {
    Setup(String),
    Command(i32, String),
}

fn setup(e: impl std::fmt::Display) -> Failure {
    Failure::Setup(e.to_string())
}

fn enter_and_run(spec_path: &Path, task: ProcessRef, command: &OsStr, args: &[OsString]) -> Result<i32, Failure> {
    let bytes = fs::read(spec_path).map_err(|e| setup(format!("read {}: {e}", spec_path.display())))?;
    let spec: LaunchSpec = serde_json::from_slice(&bytes).map_err(|e| setup(format!("parse {}: {e}", spec_path.display())))?;
    let LaunchMode::Process(process) = spec.mode else {
        return Err(setup("the task is not a process task"));
    };
    let isolation = process.isolation.ok_or_else(|| setup("the task runs without isolation"))?;
    // Host side: the user is looked up in the host's database, as at the task's start.
    let identity = Identity::resolve(&isolation).map_err(setup)?;

    let proc_file = |name: &str| format!("/proc/{}/{name}", task.pid);
    let mut namespaces: Vec<(&str, CloneFlags, OwnedFd)> = Vec::new();
    for (name, flag) in NAMESPACES {
        let path = proc_file(&format!("ns/{name}"));
        let fd = open(path.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).map_err(|e| setup(format!("open {path}: {e}")))?;
        namespaces.push((name, flag, fd));
    }
    let root_path = proc_file("root");
    let root = open(root_path.as_str(), OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| setup(format!("open {root_path}: {e}")))?;
    // Everything is open: only now is the PID known to still be the task's.
    if !task.is_alive() {
        return Err(setup(format!("task pid {} is not running", task.pid)));
    }
    for procs in &isolation.cgroup_procs {
        fs::write(procs, "0").map_err(|e| setup(format!("join cgroup {}: {e}", procs.display())))?;
    }
    for (name, flag, fd) in &namespaces {
        setns(fd.as_fd(), *flag).map_err(|e| setup(format!("enter the task's {name} namespace: {e}")))?;
    }
    fchdir(&root).map_err(|e| setup(format!("enter the task's root: {e}")))?;
    chroot(".").map_err(|e| setup(format!("chroot into the task's root: {e}")))?;
    chdir(&isolation.cwd).map_err(|e| setup(format!("chdir {}: {e}", isolation.cwd.display())))?;
    drop(root);
    drop(namespaces);

    let mut cmd = Command::new(command);
    cmd.args(args).env_clear().envs(&process.env);
    // The helper only waits: a ^C on an `alloc exec` terminal is for the command (which may
    // handle it), so the helper ignores it and the command gets the default dispositions back.
    const TERMINAL_SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGQUIT];
    for sig in TERMINAL_SIGNALS {
        // SAFETY: setting a disposition to SIG_IGN installs no handler code.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // SAFETY: the helper is single-threaded; the hook only makes system calls.
    unsafe {
        cmd.pre_exec(move || {
            for sig in TERMINAL_SIGNALS {
                libc::signal(sig, libc::SIG_DFL);
            }
            identity.apply().map_err(|(_, errno)| std::io::Error::from_raw_os_error(errno as i32))
        });
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Err(Failure::Command(code, format!("exec {:?}: {e}", String::from_utf8_lossy(command.as_bytes()))));
        }
    };
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
