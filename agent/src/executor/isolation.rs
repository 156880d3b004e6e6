//! Isolation for the exec driver: namespaces, a chroot of read-only host directories, cgroups.
//!
//! The executor prepares mount points on the host side ([`prepare`]), unshares the PID namespace
//! so its next child is PID 1 there, and forks; the child ([`Prepared::enter`]) joins the task's
//! cgroups, unshares mount/IPC/UTS namespaces, mounts everything *inside its own private mount
//! namespace* and chroots. Those mounts are never visible on the host and vanish with the
//! namespace when the task's last process exits, so there is nothing to unmount on destroy.

use std::ffi::CString;
use std::fs;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{Gid, Uid, User, chdir, chroot, setgid, setgroups, sethostname, setuid};
use serde::{Deserialize, Serialize};

/// What the task's chroot contains and who it runs as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationSpec {
    /// Host directory that becomes `/` (the task dir).
    pub root: PathBuf,
    /// Host paths bind-mounted into the root.
    pub binds: Vec<BindMount>,
    /// Symlinks created in the root, e.g. `/bin -> usr/bin` on merged-/usr hosts.
    pub symlinks: Vec<Symlink>,
    /// Device nodes bind-mounted from the host at the same path (`/dev/null`, ...).
    pub devices: Vec<PathBuf>,
    /// Hostname inside the UTS namespace.
    pub hostname: String,
    /// `cgroup.procs` files the task joins before exec.
    pub cgroup_procs: Vec<PathBuf>,
    /// Working directory inside the root.
    pub cwd: PathBuf,
    /// User name to switch to after setup (none: stay root).
    pub user: Option<String>,
}

/// A bind mount into the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    /// Host path.
    pub source: PathBuf,
    /// Absolute path inside the root.
    pub target: PathBuf,
    /// Remounted read-only.
    pub read_only: bool,
}

/// A symlink inside the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symlink {
    /// Absolute path inside the root.
    pub path: PathBuf,
    /// What it points to, as on the host.
    pub target: PathBuf,
}

/// Everything the child needs, resolved before fork so the child only makes system calls.
#[derive(Debug)]
pub struct Prepared {
    root: CString,
    binds: Vec<(CString, CString, bool)>,
    proc_dir: CString,
    tmp_dir: CString,
    hostname: String,
    cgroup_procs: Vec<PathBuf>,
    cwd: CString,
    ids: Option<(Uid, Gid)>,
}

/// Why the child's setup failed: the step, for the error message, and the errno.
pub type StepError = (String, Errno);

/// Host-side setup: checks sources, creates mount points and symlinks, resolves the user.
pub fn prepare(spec: &IsolationSpec) -> Result<Prepared, String> {
    let root = &spec.root;
    if !root.is_dir() {
        return Err(format!("chroot root {} is not a directory", root.display()));
    }
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let mut binds = Vec::new();
    for link in &spec.symlinks {
        let path = inside(&link.path);
        if fs::symlink_metadata(&path).is_err() {
            std::os::unix::fs::symlink(&link.target, &path).map_err(|e| format!("create symlink {}: {e}", path.display()))?;
        }
    }
    for bind in &spec.binds {
        let meta = fs::metadata(&bind.source).map_err(|e| format!("chroot source {} does not exist: {e}", bind.source.display()))?;
        let target = inside(&bind.target);
        make_mount_point(&target, meta.is_dir())?;
        binds.push((cstring(&bind.source)?, cstring(&target)?, bind.read_only));
    }
    for device in &spec.devices {
        fs::metadata(device).map_err(|e| format!("device {} is missing on the host: {e}", device.display()))?;
        let target = inside(device);
        make_mount_point(&target, false)?;
        binds.push((cstring(device)?, cstring(&target)?, false));
    }
    let proc_dir = inside(Path::new("/proc"));
    let tmp_dir = inside(Path::new("/tmp"));
    make_mount_point(&proc_dir, true)?;
    make_mount_point(&tmp_dir, true)?;
    let ids = match &spec.user {
        None => None,
        Some(name) => {
            let user = User::from_name(name)
                .map_err(|e| format!("look up user {name:?}: {e}"))?
                .ok_or_else(|| format!("user {name:?} does not exist on this host"))?;
            Some((user.uid, user.gid))
        }
    };
    Ok(Prepared {
        root: cstring(root)?,
        binds,
        proc_dir: cstring(&proc_dir)?,
        tmp_dir: cstring(&tmp_dir)?,
        hostname: spec.hostname.clone(),
        cgroup_procs: spec.cgroup_procs.clone(),
        cwd: cstring(&spec.cwd)?,
        ids,
    })
}

fn make_mount_point(path: &Path, dir: bool) -> Result<(), String> {
    let made = if dir {
        fs::create_dir_all(path)
    } else {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map(drop)
    };
    made.map_err(|e| format!("create mount point {}: {e}", path.display()))
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| format!("path {} contains a NUL byte", path.display()))
}

impl Prepared {
    /// Child side, after fork and before exec. Order matters: cgroups are joined while host paths
    /// are visible, mounts happen before chroot, and privileges are dropped last.
    pub fn enter(&self) -> Result<(), StepError> {
        for procs in &self.cgroup_procs {
            fs::write(procs, "0").map_err(|e| (format!("join cgroup {}", procs.display()), io_errno(&e)))?;
        }
        unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS)
            .map_err(|e| ("unshare mount/ipc/uts namespaces".to_string(), e))?;
        // Without this, our mounts would propagate back to the host's shared mounts.
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
            .map_err(|e| ("make mounts private".to_string(), e))?;
        for (source, target, read_only) in &self.binds {
            let step = || format!("bind {} to {}", source.to_string_lossy(), target.to_string_lossy());
            mount(Some(source.as_c_str()), target.as_c_str(), None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
                .map_err(|e| (step(), e))?;
            if *read_only {
                let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
                mount(None::<&str>, target.as_c_str(), None::<&str>, flags, None::<&str>).map_err(|e| (step(), e))?;
            }
        }
        // A fresh procfs shows only this PID namespace.
        let proc_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("proc"), self.proc_dir.as_c_str(), Some("proc"), proc_flags, None::<&str>)
            .map_err(|e| ("mount /proc".to_string(), e))?;
        let tmp_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(Some("tmpfs"), self.tmp_dir.as_c_str(), Some("tmpfs"), tmp_flags, Some("mode=1777"))
            .map_err(|e| ("mount tmpfs /tmp".to_string(), e))?;
        if !self.hostname.is_empty() {
            sethostname(&self.hostname).map_err(|e| ("set hostname".to_string(), e))?;
        }
        chroot(self.root.as_c_str()).map_err(|e| ("chroot".to_string(), e))?;
        chdir(self.cwd.as_c_str()).map_err(|e| (format!("chdir {}", self.cwd.to_string_lossy()), e))?;
        if let Some((uid, gid)) = self.ids {
            setgroups(&[gid]).map_err(|e| ("setgroups".to_string(), e))?;
            setgid(gid).map_err(|e| ("setgid".to_string(), e))?;
            setuid(uid).map_err(|e| ("setuid".to_string(), e))?;
        }
        Ok(())
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Makes the caller's *next* child PID 1 of a new PID namespace (the caller itself stays put).
pub fn unshare_pid_namespace() -> Result<(), String> {
    unshare(CloneFlags::CLONE_NEWPID).map_err(|e| format!("unshare pid namespace: {e}"))
}
