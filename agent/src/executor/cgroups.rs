//! Per-task cgroups for the exec driver, on cgroup v1 (one directory per controller) or v2.
//!
//! Hybrid hosts (v1 controllers plus an empty cgroup2 at `unified/`) are treated as v1: the
//! controllers we limit live in the v1 hierarchies there.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The controllers whose limits we set, as v1 hierarchy names.
const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// Which cgroup layout the host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupVersion {
    /// Controllers mounted one per directory under the root (also hybrid hosts).
    V1,
    /// One unified hierarchy at the root.
    V2,
}

/// Tells v1 from v2: a pure v2 mount has `cgroup.controllers` at its root.
pub fn detect_version(root: &Path) -> CgroupVersion {
    if root.join("cgroup.controllers").exists() { CgroupVersion::V2 } else { CgroupVersion::V1 }
}

/// Limits for one task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Hard memory limit in bytes (0 = none).
    pub memory_max: u64,
    /// Memory the task is expected to use; a soft limit below `memory_max` (0 = none).
    pub memory_soft: u64,
    /// CPU shares (v1 `cpu.shares`; converted to `cpu.weight` on v2). 0 = leave the default.
    pub cpu_shares: u64,
    /// Maximum number of processes (0 = unlimited).
    pub pids_max: u64,
}

/// A task's cgroup directories (one per v1 controller, or one on v2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCgroup {
    /// v1 or v2.
    pub version: CgroupVersion,
    /// The directories, memory first on v1.
    pub dirs: Vec<PathBuf>,
}

impl TaskCgroup {
    /// Creates `<root>/<ctrl>/<parent>/<name>` (v1) or `<root>/<parent>/<name>` (v2) and writes the limits.
    pub fn create(root: &Path, parent: &str, name: &str, limits: &CgroupLimits) -> io::Result<TaskCgroup> {
        let version = detect_version(root);
        let cgroup = match version {
            CgroupVersion::V1 => {
                TaskCgroup { version, dirs: V1_CONTROLLERS.iter().map(|c| root.join(c).join(parent).join(name)).collect() }
            }
            CgroupVersion::V2 => {
                // Controllers must be enabled in every ancestor's subtree_control to reach the leaf.
                let parent_dir = root.join(parent);
                fs::create_dir_all(&parent_dir).map_err(|e| context(e, &parent_dir))?;
                for dir in [root, parent_dir.as_path()] {
                    write_file(&dir.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
                }
                TaskCgroup { version, dirs: vec![parent_dir.join(name)] }
            }
        };
        for dir in &cgroup.dirs {
            fs::create_dir_all(dir).map_err(|e| context(e, dir))?;
        }
        if let Err(e) = cgroup.apply(limits) {
            let _ = cgroup.remove_dirs(Instant::now());
            return Err(e);
        }
        Ok(cgroup)
    }

    fn apply(&self, limits: &CgroupLimits) -> io::Result<()> {
        let pids = if limits.pids_max == 0 { "max".to_string() } else { limits.pids_max.to_string() };
        match self.version {
            CgroupVersion::V1 => {
                let [memory, cpu, pids_dir] = [&self.dirs[0], &self.dirs[1], &self.dirs[2]];
                if limits.memory_max > 0 {
                    write_file(&memory.join("memory.limit_in_bytes"), &limits.memory_max.to_string())?;
                    // With swap accounting, memory+swap gets the same cap so the task cannot swap past it.
                    let memsw = memory.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write_file(&memsw, &limits.memory_max.to_string())?;
                    }
                }
                if limits.memory_soft > 0 {
                    write_file(&memory.join("memory.soft_limit_in_bytes"), &limits.memory_soft.to_string())?;
                }
                if limits.cpu_shares > 0 {
                    write_file(&cpu.join("cpu.shares"), &limits.cpu_shares.max(2).to_string())?;
                }
                write_file(&pids_dir.join("pids.max"), &pids)?;
            }
            CgroupVersion::V2 => {
                let dir = &self.dirs[0];
                if limits.memory_max > 0 {
                    write_file(&dir.join("memory.max"), &limits.memory_max.to_string())?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write_file(&swap, "0")?;
                    }
                }
                if limits.memory_soft > 0 {
                    write_file(&dir.join("memory.low"), &limits.memory_soft.to_string())?;
                }
                if limits.cpu_shares > 0 {
                    write_file(&dir.join("cpu.weight"), &shares_to_weight(limits.cpu_shares).to_string())?;
                }
                write_file(&dir.join("pids.max"), &pids)?;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes "0" to in order to join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Files holding the `oom_kill <n>` counter.
    pub fn oom_counter_files(&self) -> Vec<PathBuf> {
        match self.version {
            CgroupVersion::V1 => vec![self.dirs[0].join("memory.oom_control")],
            CgroupVersion::V2 => vec![self.dirs[0].join("memory.events")],
        }
    }

    /// Kills whatever is left inside and removes the directories, retrying until `timeout`.
    pub fn destroy(&self, timeout: Duration) -> io::Result<()> {
        self.remove_dirs(Instant::now() + timeout)
    }

    fn remove_dirs(&self, deadline: Instant) -> io::Result<()> {
        for dir in &self.dirs {
            loop {
                kill_members(dir);
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // EBUSY while killed members are still exiting.
                    Err(e) if Instant::now() >= deadline => return Err(context(e, dir)),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        Ok(())
    }
}

fn kill_members(dir: &Path) {
    let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) else { return };
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Maps v1 shares (2..=262144) onto v2 weights (1..=10000) linearly.
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + (shares - 2) * 9_999 / 262_142
}

/// Sums the `oom_kill` counters in these files (missing files count as 0).
pub fn read_oom_kills(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|f| fs::read_to_string(f).ok())
        .flat_map(|text| text.lines().filter_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok()).collect::<Vec<_>>())
        .sum()
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| context(e, path))
}

fn context(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_cover_the_v2_range() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1024), 39);
    }

    #[test]
    fn oom_counters_are_read_from_v1_and_v2_files() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("memory.oom_control");
        fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        let v2 = dir.path().join("memory.events");
        fs::write(&v2, "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n").unwrap();
        assert_eq!(read_oom_kills(&[v1, v2, dir.path().join("missing")]), 3);
    }
}
