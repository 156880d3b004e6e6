//! Identifying, watching and signalling a process we are not necessarily the parent of.
//!
//! A PID alone is not an identity: after a process exits its PID can be handed to a stranger.
//! [`ProcessRef`] pairs the PID with the process's start time (field 22 of `/proc/<pid>/stat`,
//! in clock ticks since boot), which two processes sharing a PID can never both have.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// A process, identified by PID and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    /// PID in the host's PID namespace.
    pub pid: i32,
    /// `/proc/<pid>/stat` field 22 (clock ticks after boot).
    pub start_time: u64,
}

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// One-letter state: R, S, D, Z (zombie), X (dead), ...
    pub state: char,
    /// Start time in clock ticks after boot.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat`.
pub fn read_stat(pid: i32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("unparsable /proc/{pid}/stat")))
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    let after_comm = &text[text.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `state` is field 3, so field 22 is 19 further on.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

impl ProcessRef {
    /// Captures the identity of a live (or zombie) process.
    pub fn of(pid: i32) -> io::Result<ProcessRef> {
        Ok(ProcessRef { pid, start_time: read_stat(pid)?.start_time })
    }

    /// True while this very process exists and has not exited (a zombie counts as exited).
    pub fn is_alive(&self) -> bool {
        match read_stat(self.pid) {
            Ok(stat) => stat.start_time == self.start_time && !matches!(stat.state, 'Z' | 'X'),
            Err(_) => false,
        }
    }

    /// Sends `signal` to this process if it is still the one we mean.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        if !self.is_alive() {
            return Err(Errno::ESRCH);
        }
        kill(Pid::from_raw(self.pid), signal)
    }

    /// Sends `signal` to the process group this process leads (tasks run in their own session).
    pub fn signal_group(&self, signal: Signal) -> nix::Result<()> {
        if !self.is_alive() {
            return Err(Errno::ESRCH);
        }
        killpg(Pid::from_raw(self.pid), signal)
    }

    /// Waits (blocking, up to `timeout`) until this process is stopped or gone.
    pub fn wait_stopped(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match read_stat(self.pid) {
                Ok(stat) if stat.start_time == self.start_time && !matches!(stat.state, 'T' | 't' | 'Z' | 'X') => {}
                _ => return,
            }
            if std::time::Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the process exits or `timeout` passes; returns true when it has exited.
    ///
    /// Works without being the parent: a pidfd becomes readable when the process exits. Where
    /// pidfds are unavailable, polls `/proc` instead.
    pub async fn wait_exit(&self, timeout: Option<Duration>) -> bool {
        let wait = self.wait_exit_forever();
        match timeout {
            Some(t) => tokio::time::timeout(t, wait).await.is_ok(),
            None => {
                wait.await;
                true
            }
        }
    }

    async fn wait_exit_forever(&self) {
        let pidfd = match pidfd_open(self.pid) {
            Ok(fd) => fd,
            Err(Errno::ESRCH) => return,
            Err(_) => return self.poll_until_exit().await,
        };
        // The PID may have been reused between our caller's check and the pidfd_open.
        if !self.is_alive() {
            return;
        }
        // SAFETY: the AsyncFd owns this OwnedFd, so the fd stays open and unchanged while registered.
        let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
        match registered {
            Ok(fd) => {
                // Readable means exited; the guard is dropped without clearing on purpose.
                let _ = fd.readable().await;
            }
            Err(_) => self.poll_until_exit().await,
        }
    }

    async fn poll_until_exit(&self) {
        while self.is_alive() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Opens a pidfd (Linux 5.3+): a file descriptor that becomes readable when the process exits.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just gave us this fd and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reaps `pid` if it is our exited child (a fresh agent is not the parent; then this is a no-op).
pub fn reap_if_child(pid: i32) {
    let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
}

/// Parses a signal name as Nomad spells them (`SIGTERM`, `TERM`, `sigint`) or a number.
pub fn parse_signal(name: &str) -> Option<Signal> {
    let trimmed = name.trim();
    if let Ok(n) = trimmed.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let upper = trimmed.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    full.parse().ok()
}

/// `pid` and its descendants, from one pass over `/proc/*/stat`.
pub fn process_tree(pid: i32) -> Vec<i32> {
    descendants(&[pid])
}

/// `roots` and every process under them, from one pass over `/proc/*/stat`.
fn descendants(roots: &[i32]) -> Vec<i32> {
    let mut children: std::collections::HashMap<i32, Vec<i32>> = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Field 4 (ppid) follows the command name, which may hold spaces and parentheses.
        let Some(after_name) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        if let Some(parent) = after_name.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            children.entry(parent).or_default().push(child);
        }
    }
    let mut tree: Vec<i32> = Vec::with_capacity(roots.len());
    for &root in roots {
        if !tree.contains(&root) {
            tree.push(root);
        }
    }
    let mut next = 0;
    while next < tree.len() {
        if let Some(kids) = children.get(&tree[next]) {
            for &kid in kids {
                if !tree.contains(&kid) {
                    tree.push(kid);
                }
            }
        }
        next += 1;
    }
    tree
}

/// Passes over `/proc` [`kill_tree`] makes at most before it kills what it has stopped.
const KILL_TREE_PASSES: usize = 64;
/// How long one process is given to reach its stop before the next pass looks for its children.
const STOP_WAIT: Duration = Duration::from_millis(200);

/// Kills `pid` and every process under it, forks made meanwhile included, without a cgroup to
/// do it. Scanning and then killing lets a child forked between the two escape (reparented, it
/// can no longer be found), so the tree is stopped first: a stopped process cannot fork, and once
/// it shows state `T` any fork it was in has finished and its child is under it. Pass after pass
/// stops what is new until a pass finds no one, then all of them get SIGKILL. Each process is
/// checked by its start time before every signal. Blocks (each stop is waited on in `/proc`).
pub fn kill_tree(pid: i32) {
    let mut stopped: Vec<ProcessRef> = Vec::new();
    for _ in 0..KILL_TREE_PASSES {
        // A stopped parent cannot exit and drop its children, so every one stopped is a root.
        let roots: Vec<i32> = std::iter::once(pid).chain(stopped.iter().map(|p| p.pid)).collect();
        let new: Vec<ProcessRef> =
            descendants(&roots).into_iter().filter_map(|p| ProcessRef::of(p).ok()).filter(|p| !stopped.contains(p)).collect();
        if new.is_empty() {
            break;
        }
        for process in &new {
            let _ = process.signal(Signal::SIGSTOP);
        }
        for process in &new {
            process.wait_stopped(STOP_WAIT);
        }
        stopped.extend(new);
    }
    for process in &stopped {
        let _ = process.signal(Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(parse_stat(line), Some(ProcStat { state: 'S', start_time: 987654 }));
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = ProcessRef::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        let impostor = ProcessRef { start_time: me.start_time + 1, ..me };
        assert!(!impostor.is_alive());
    }

    /// A shell that forks without pause: whatever escapes a scan-then-kill would survive it.
    #[test]
    fn kill_tree_leaves_nothing_of_a_tree_that_keeps_forking() {
        use std::os::unix::process::CommandExt;
        let mut shell =
            std::process::Command::new("/bin/sh").args(["-c", "while :; do sleep 300 & done"]).process_group(0).spawn().unwrap();
        let group = shell.id() as i32;
        // Until the shell has children, there is nothing to race with.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process_tree(group).len() < 20 {
            assert!(std::time::Instant::now() < deadline, "the shell forked nothing");
            std::thread::sleep(Duration::from_millis(5));
        }

        kill_tree(group);
        let _ = shell.wait();
        // Every member of the shell's process group, reparented or not, is gone (zombies
        // waiting for init to reap them count as gone).
        let in_group = || {
            std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
                .filter(|stat| {
                    let after = &stat[stat.rfind(')').unwrap() + 1..];
                    let fields: Vec<&str> = after.split_whitespace().collect();
                    fields[2].parse::<i32>() == Ok(group) && !matches!(fields[0], "Z" | "X")
                })
                .count()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while in_group() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let left = in_group();
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        assert_eq!(left, 0, "processes of the tree outlived kill_tree");
    }

    #[test]
    fn signal_names_parse_in_every_spelling() {
        assert_eq!(parse_signal("SIGTERM"), Some(Signal::SIGTERM));
        assert_eq!(parse_signal("int"), Some(Signal::SIGINT));
        assert_eq!(parse_signal("9"), Some(Signal::SIGKILL));
        assert_eq!(parse_signal("SIGNOPE"), None);
    }
}
