//! Isolation for the exec driver: namespaces, a chroot of read-only host directories, cgroups.
//!
//! The executor prepares mount points on the host side ([`prepare`]), unshares the PID namespace
//! so its next child is PID 1 there, and forks; the child ([`Prepared::enter`]) joins the task's
//! cgroups, unshares mount/IPC/UTS namespaces, mounts everything *inside its own private mount
//! namespace* and chroots. Those mounts are never visible on the host and vanish with the
//! namespace when the task's last process exits, so there is nothing to unmount on destroy.
//!
//! A bind may ask for mount propagation ([`Propagation`], Nomad's `propagation_mode`): a CSI
//! plugin's staging root is `bidirectional`, so what the plugin mounts under it in its chroot
//! appears on the host (and is unmounted there when the plugin unmounts it). The task's mount
//! namespace is made private as a whole first, which cuts every peer link to the host; so the
//! source of such a bind is cloned on the host side before fork (`open_tree(OPEN_TREE_CLONE)`:
//! a detached copy that stays a peer of the source's mount) and attached at its target after
//! the namespace is private (`move_mount`). Its target's parent mount being private, the attach
//! itself does not reach the host; only mounts made under the bind do. A `bidirectional`
//! source must be on a shared mount (checked, never changed here: that is the host's or the
//! caller's business); `host-to-task` then turns the attached copy into a slave (rslave).

use std::ffi::{CStr, CString};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid, User, chdir, chroot, setgid, setgroups, sethostname, setuid};
use serde::{Deserialize, Serialize};

use crate::fs_beneath::{Beneath, FsError, Links};

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
    /// The task's capabilities (bit n for capability n). As root, the bounding, permitted and
    /// effective sets; as another user also the inheritable and ambient sets, so they survive
    /// `execve` (as Nomad's executor sets them). `None` leaves the executor's own.
    #[serde(default)]
    pub capabilities: Option<u64>,
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
    /// Whether mounts under it cross between the host and the task.
    #[serde(default)]
    pub propagation: Propagation,
}

impl BindMount {
    /// A bind with no propagation.
    pub fn private(source: PathBuf, target: PathBuf, read_only: bool) -> BindMount {
        BindMount { source, target, read_only, propagation: Propagation::Private }
    }
}

/// How mounts under a bind cross between the host and the task (Nomad's `propagation_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Propagation {
    /// Neither way (`private`).
    #[default]
    Private,
    /// Mounts the host makes under the source appear in the task (`host-to-task`, rslave).
    HostToTask,
    /// Both ways (`bidirectional`, rshared).
    Bidirectional,
}

impl Propagation {
    /// Nomad's `propagation_mode` (empty: private), or `None` for an unknown one.
    pub fn parse(mode: &str) -> Option<Propagation> {
        match mode {
            "" | "private" => Some(Propagation::Private),
            "host-to-task" => Some(Propagation::HostToTask),
            "bidirectional" => Some(Propagation::Bidirectional),
            _ => None,
        }
    }
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
/// Mount targets are kept relative to the root: the child resolves each beneath the root
/// itself (no symlink on the way) and mounts on the fd it got, never on a path a task could
/// have swapped for a symlink to a host directory.
#[derive(Debug)]
pub struct Prepared {
    root: CString,
    binds: Vec<PreparedBind>,
    proc_dir: CString,
    tmp_dir: CString,
    hostname: String,
    cgroup_procs: Vec<PathBuf>,
    cwd: CString,
    identity: Identity,
}

/// One bind, as the child makes it.
#[derive(Debug)]
struct PreparedBind {
    source: BindSource,
    /// Relative to the root.
    target: CString,
    read_only: bool,
    propagation: Propagation,
}

/// What a bind mounts.
#[derive(Debug)]
enum BindSource {
    /// A host path, bound after the namespace is private.
    Path(CString),
    /// A detached clone of the source's mount tree made on the host side (see the module
    /// docs), still a peer of the source.
    Tree(OwnedFd),
}

/// Who the task's processes run as: the user and the capability sets, resolved on the host
/// side (the host's user database) before fork. Shared by the task's start and by commands run
/// in the task's context later ([`super::enter`]).
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    ids: Option<(Uid, Gid)>,
    capabilities: Option<Capabilities>,
}

impl Identity {
    /// The spec's user (looked up now) and capabilities.
    pub fn resolve(spec: &IsolationSpec) -> Result<Identity, String> {
        let ids = match &spec.user {
            None => None,
            Some(name) => {
                let user = User::from_name(name)
                    .map_err(|e| format!("look up user {name:?}: {e}"))?
                    .ok_or_else(|| format!("user {name:?} does not exist on this host"))?;
                Some((user.uid, user.gid))
            }
        };
        Ok(Identity { ids, capabilities: spec.capabilities.map(|keep| Capabilities { keep, last: last_capability() }) })
    }

    /// Child side, the last step before exec: narrows the capability bounding set, switches
    /// user, and sets the capability sets. Makes only system calls (runs after fork).
    pub fn apply(&self) -> Result<(), StepError> {
        if let Some(caps) = self.capabilities {
            caps.bound().map_err(|e| ("drop capabilities from the bounding set".to_string(), e))?;
        }
        if let Some((uid, gid)) = self.ids {
            if self.capabilities.is_some() {
                // Keep the permitted set across setuid; the ambient set then carries it over exec.
                prctl(libc::PR_SET_KEEPCAPS, 1).map_err(|e| ("keep capabilities".to_string(), e))?;
            }
            setgroups(&[gid]).map_err(|e| ("setgroups".to_string(), e))?;
            setgid(gid).map_err(|e| ("setgid".to_string(), e))?;
            setuid(uid).map_err(|e| ("setuid".to_string(), e))?;
            if let Some(caps) = self.capabilities {
                caps.grant_unprivileged()?;
            }
        } else if let Some(caps) = self.capabilities {
            capset(caps.keep, caps.keep, 0).map_err(|e| ("set capabilities".to_string(), e))?;
        }
        Ok(())
    }
}

/// The capability sets the child applies, resolved before fork.
#[derive(Debug, Clone, Copy)]
struct Capabilities {
    keep: u64,
    /// The kernel's last capability number: every one above `keep` up to it leaves the bounding set.
    last: u32,
}

/// Why the child's setup failed: the step, for the error message, and the errno.
pub type StepError = (String, Errno);

/// `path` inside the root, as a path relative to it.
fn relative_in_root(path: &Path) -> PathBuf {
    path.components().filter(|c| matches!(c, Component::Normal(_))).collect()
}

/// Host-side setup: checks sources, creates mount points and symlinks, resolves the user. The
/// task dir is the task's own (it may have left anything in it in an earlier run), so all of
/// it is done beneath the root through `fs_beneath`, never through a symlink.
pub fn prepare(spec: &IsolationSpec) -> Result<Prepared, String> {
    let root = Beneath::open(&spec.root).map_err(|e| format!("chroot root: {e}"))?;
    let mut binds = Vec::new();
    for link in &spec.symlinks {
        let path = relative_in_root(&link.path);
        match root.stat(&path, Links::Refuse) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => root.symlink(&path, &link.target).map_err(|e| e.to_string())?,
            Err(e) => return Err(e.to_string()),
        }
    }
    for bind in &spec.binds {
        let meta = fs::metadata(&bind.source).map_err(|e| format!("chroot source {} does not exist: {e}", bind.source.display()))?;
        let target = relative_in_root(&bind.target);
        make_mount_point(&root, &target, meta.is_dir())?;
        let source = match bind.propagation {
            Propagation::Private => BindSource::Path(cstring(&bind.source)?),
            propagation => {
                if propagation == Propagation::Bidirectional && !on_shared_mount(&bind.source)? {
                    return Err(format!(
                        "bidirectional mount of {}: it is not on a shared mount, so nothing mounted under it could reach the host",
                        bind.source.display()
                    ));
                }
                BindSource::Tree(clone_tree(&bind.source)?)
            }
        };
        binds.push(PreparedBind { source, target: cstring(&target)?, read_only: bind.read_only, propagation: bind.propagation });
    }
    for device in &spec.devices {
        fs::metadata(device).map_err(|e| format!("device {} is missing on the host: {e}", device.display()))?;
        let target = relative_in_root(device);
        make_mount_point(&root, &target, false)?;
        binds.push(PreparedBind {
            source: BindSource::Path(cstring(device)?),
            target: cstring(&target)?,
            read_only: false,
            propagation: Propagation::Private,
        });
    }
    for dir in ["proc", "tmp"] {
        make_mount_point(&root, Path::new(dir), true)?;
    }
    let identity = Identity::resolve(spec)?;
    Ok(Prepared {
        root: cstring(&spec.root)?,
        binds,
        proc_dir: c"proc".to_owned(),
        tmp_dir: c"tmp".to_owned(),
        hostname: spec.hostname.clone(),
        cgroup_procs: spec.cgroup_procs.clone(),
        cwd: cstring(&spec.cwd)?,
        identity,
    })
}

/// Whether `path` is on a mount that is shared (a member of a peer group: `shared:N` in
/// `/proc/self/mountinfo`), read on the host side.
fn on_shared_mount(path: &Path) -> Result<bool, String> {
    let path = path.canonicalize().map_err(|e| format!("resolve {}: {e}", path.display()))?;
    let info = fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    Ok(mount_containing(&info, &path).is_some_and(|optional| optional.split(' ').any(|f| f.starts_with("shared:"))))
}

/// The optional fields (propagation) of the last-mounted mount whose mount point contains
/// `path`, in a `mountinfo` text.
fn mount_containing<'a>(info: &'a str, path: &Path) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for line in info.lines() {
        let (before, _) = line.split_once(" - ").unwrap_or((line, ""));
        let fields: Vec<&str> = before.splitn(7, ' ').collect();
        let (Some(point), optional) = (fields.get(4), fields.get(6).copied().unwrap_or("")) else { continue };
        let point = PathBuf::from(unescape_mountinfo(point));
        if path.starts_with(&point) {
            let depth = point.components().count();
            // A later line over the same mount point is mounted on top of the earlier one.
            if best.is_none_or(|(d, _)| depth >= d) {
                best = Some((depth, optional));
            }
        }
    }
    best.map(|(_, optional)| optional)
}

/// mountinfo writes space, tab, newline and backslash as `\` and three octal digits.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(Ok(v)) = field.get(i + 1..i + 4).map(|o| u8::from_str_radix(o, 8))
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A detached copy of the mount tree at `source` (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`);
/// each copied mount stays in the peer group of the one it copies.
fn clone_tree(source: &Path) -> Result<OwnedFd, String> {
    let path = cstring(source)?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: open_tree with a NUL-terminated path; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(format!("clone the mount tree of {}: {}", source.display(), Errno::last().desc()));
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Attaches the detached tree `tree` on the directory `rel` beneath `root` (`move_mount`).
fn attach_beneath(root: &OwnedFd, rel: &CStr, tree: &OwnedFd) -> Result<(), Errno> {
    let target = target_beneath(root, rel)?;
    let flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: move_mount with two fds we hold and empty NUL-terminated paths.
    let rc = unsafe { libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), c"".as_ptr(), target.as_raw_fd(), c"".as_ptr(), flags) };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// A directory (or an empty regular file, for a file bind) at `target` beneath the root; an
/// existing one is kept as it is.
fn make_mount_point(root: &Beneath, target: &Path, dir: bool) -> Result<(), String> {
    let fail = |e: FsError| format!("create mount point /{}: {e}", target.display());
    let ensure_dir = |rel: &Path| match root.open_dir(rel, Links::Refuse) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => root.create_dir_all(rel, 0o755).map(drop),
        Err(e) => Err(e),
    };
    if dir {
        ensure_dir(target).map_err(fail)
    } else {
        if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
            ensure_dir(parent).map_err(fail)?;
        }
        root.create_file(target, 0o644).map(drop).map_err(fail)
    }
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| format!("path {} contains a NUL byte", path.display()))
}

/// `/proc/self/fd/<fd>` written into `buf`, without allocating (the child runs after fork).
fn proc_fd_path(fd: RawFd, buf: &mut [u8; 32]) -> &CStr {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.unsigned_abs(), 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        n /= 10;
        len += 1;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    CStr::from_bytes_with_nul(&buf[..PREFIX.len() + len + 1]).unwrap_or(c"/proc/self/fd/")
}

/// Resolves `rel` beneath `root` with no symlink anywhere and returns an `O_PATH` fd on it.
fn target_beneath(root: &OwnedFd, rel: &CStr) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root.as_fd(), rel, how)
}

/// Mounts on `rel` beneath `root`, through the fd of what was resolved.
fn mount_beneath(
    root: &OwnedFd,
    rel: &CStr,
    source: Option<&CStr>,
    fstype: Option<&CStr>,
    flags: MsFlags,
    data: Option<&CStr>,
) -> Result<(), Errno> {
    let target = target_beneath(root, rel)?;
    let mut buf = [0u8; 32];
    mount(source, proc_fd_path(target.as_raw_fd(), &mut buf), fstype, flags, data)
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
        // Opened in the new mount namespace: mount targets resolved from it are in it too.
        let root = nix::fcntl::open(self.root.as_c_str(), OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| (format!("open chroot root {}", self.root.to_string_lossy()), e))?;
        let none = None::<&CStr>;
        for bind in &self.binds {
            let target = bind.target.as_c_str();
            let step = || match &bind.source {
                BindSource::Path(source) => format!("bind {} to /{}", source.to_string_lossy(), target.to_string_lossy()),
                BindSource::Tree(_) => format!("attach the {:?} mount at /{}", bind.propagation, target.to_string_lossy()),
            };
            match &bind.source {
                BindSource::Path(source) => {
                    mount_beneath(&root, target, Some(source.as_c_str()), none, MsFlags::MS_BIND | MsFlags::MS_REC, none)
                }
                BindSource::Tree(tree) => attach_beneath(&root, target, tree),
            }
            .map_err(|e| (step(), e))?;
            // Resolved again from here on: the target now is the mount just made.
            if bind.propagation == Propagation::HostToTask {
                mount_beneath(&root, target, none, none, MsFlags::MS_REC | MsFlags::MS_SLAVE, none).map_err(|e| (step(), e))?;
            }
            if bind.read_only {
                let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
                mount_beneath(&root, target, none, none, flags, none).map_err(|e| (step(), e))?;
            }
        }
        // A fresh procfs shows only this PID namespace.
        let proc_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount_beneath(&root, &self.proc_dir, Some(c"proc"), Some(c"proc"), proc_flags, none).map_err(|e| ("mount /proc".to_string(), e))?;
        let tmp_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount_beneath(&root, &self.tmp_dir, Some(c"tmpfs"), Some(c"tmpfs"), tmp_flags, Some(c"mode=1777"))
            .map_err(|e| ("mount tmpfs /tmp".to_string(), e))?;
        // No fd on the host side of the chroot may reach the task.
        drop(root);
        if !self.hostname.is_empty() {
            sethostname(&self.hostname).map_err(|e| ("set hostname".to_string(), e))?;
        }
        chroot(self.root.as_c_str()).map_err(|e| ("chroot".to_string(), e))?;
        chdir(self.cwd.as_c_str()).map_err(|e| (format!("chdir {}", self.cwd.to_string_lossy()), e))?;
        self.identity.apply()
    }
}

impl Capabilities {
    /// Removes from the bounding set every capability not kept: nothing the task runs (setuid
    /// binaries, file capabilities) can get one back.
    fn bound(&self) -> Result<(), Errno> {
        for cap in 0..=self.last.min(63) {
            if self.keep & (1 << cap) == 0 {
                prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong)?;
            }
        }
        Ok(())
    }

    /// After setuid to another user: permitted and inheritable are the kept set, and each one is
    /// raised in the ambient set, which `execve` turns into the new program's permitted and
    /// effective sets.
    fn grant_unprivileged(&self) -> Result<(), StepError> {
        capset(0, self.keep, self.keep).map_err(|e| ("set capabilities".to_string(), e))?;
        for cap in 0..=self.last.min(63) {
            if self.keep & (1 << cap) != 0 {
                // SAFETY: prctl with integer arguments only.
                let rc = unsafe {
                    libc::prctl(
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                        cap as libc::c_ulong,
                        0 as libc::c_ulong,
                        0 as libc::c_ulong,
                    )
                };
                if rc != 0 {
                    return Err((format!("raise capability {cap} in the ambient set"), Errno::last()));
                }
            }
        }
        Ok(())
    }
}

/// The kernel's highest capability number (`/proc/sys/kernel/cap_last_cap`), read before fork.
fn last_capability() -> u32 {
    fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(36)
}

fn prctl(option: libc::c_int, arg: libc::c_ulong) -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(option, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if rc == 0 { Ok(()) } else { Err(Errno::last()) }
}

/// capset(2) for this thread, version 3 (64-bit sets in two 32-bit halves).
fn capset(effective: u64, permitted: u64, inheritable: u64) -> Result<(), Errno> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let half = |v: u64, i: u32| (v >> (32 * i)) as u32;
    let data = [0, 1].map(|i| Data { effective: half(effective, i), permitted: half(permitted, i), inheritable: half(inheritable, i) });
    // SAFETY: the header and two data structs are the layout capset(2) documents for version 3.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    if rc == 0 { Ok(()) } else { Err(Errno::last()) }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Makes the caller's *next* child PID 1 of a new PID namespace (the caller itself stays put).
pub fn unshare_pid_namespace() -> Result<(), String> {
    unshare(CloneFlags::CLONE_NEWPID).map_err(|e| format!("unshare pid namespace: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(root: &Path) -> IsolationSpec {
        IsolationSpec {
            root: root.to_path_buf(),
            binds: vec![BindMount::private(PathBuf::from("/etc"), PathBuf::from("/etc"), true)],
            symlinks: vec![Symlink { path: PathBuf::from("/lib-link"), target: PathBuf::from("usr/lib") }],
            devices: vec![PathBuf::from("/dev/null")],
            hostname: String::new(),
            cgroup_procs: Vec::new(),
            cwd: PathBuf::from("/"),
            user: None,
            capabilities: None,
        }
    }

    #[test]
    fn proc_fd_paths_are_written_without_allocating() {
        let mut buf = [0u8; 32];
        assert_eq!(proc_fd_path(0, &mut buf), c"/proc/self/fd/0");
        assert_eq!(proc_fd_path(1234567, &mut buf), c"/proc/self/fd/1234567");
        assert_eq!(proc_fd_path(i32::MAX, &mut buf).to_bytes().len(), "/proc/self/fd/".len() + 10);
    }

    #[test]
    fn mount_points_and_symlinks_are_made_beneath_the_task_dir() {
        let dir = tempfile::tempdir().unwrap();
        let prepared = prepare(&spec(dir.path())).unwrap();
        assert!(dir.path().join("etc").is_dir() && dir.path().join("proc").is_dir() && dir.path().join("tmp").is_dir());
        assert!(dir.path().join("dev/null").is_file());
        assert_eq!(fs::read_link(dir.path().join("lib-link")).unwrap(), PathBuf::from("usr/lib"));
        assert_eq!(prepared.binds[0].target.as_c_str(), c"etc", "targets stay relative to the root");
        // Again, with everything in place: nothing changes, nothing fails.
        prepare(&spec(dir.path())).unwrap();
    }

    #[test]
    fn the_mount_holding_a_path_and_its_propagation_are_read_from_mountinfo() {
        let info = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                    45 27 254:0 /var/lib/docker /var/lib/docker rw,relatime shared:1 - ext4 /dev/vda rw\n\
                    50 27 0:40 / /srv/a\\040b rw master:3 shared:7 - tmpfs tmpfs rw\n\
                    51 50 0:41 / /srv/a\\040b/inner rw - tmpfs tmpfs rw\n";
        assert_eq!(mount_containing(info, Path::new("/work/x")), Some(""), "on / (private)");
        assert_eq!(mount_containing(info, Path::new("/var/lib/docker/volumes")), Some("shared:1"));
        assert_eq!(mount_containing(info, Path::new("/srv/a b/c")), Some("master:3 shared:7"), "escapes decoded");
        assert_eq!(mount_containing(info, Path::new("/srv/a b/inner/d")), Some(""), "the deepest mount wins");
        assert_eq!(mount_containing("", Path::new("/x")), None);
        assert_eq!(Propagation::parse("bidirectional"), Some(Propagation::Bidirectional));
        assert_eq!(Propagation::parse(""), Some(Propagation::Private));
        assert_eq!(Propagation::parse("sideways"), None);
    }

    #[test]
    fn a_bidirectional_bind_of_a_path_on_no_shared_mount_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let source = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.binds.push(BindMount {
            source: source.path().to_path_buf(),
            target: PathBuf::from("/local/csi"),
            read_only: false,
            propagation: Propagation::Bidirectional,
        });
        // A temp dir on a mount that is not shared (the test host's `/` is private; when it is
        // shared, this test has nothing to refuse).
        if on_shared_mount(source.path()).unwrap() {
            return;
        }
        let err = prepare(&s).unwrap_err();
        assert!(err.starts_with(&format!("bidirectional mount of {}: it is not on a shared mount", source.path().display())), "{err}");
    }

    #[test]
    fn a_symlink_the_task_left_where_a_mount_point_goes_is_refused_not_followed() {
        // The task dir is the task's own: in an earlier run it replaced `dev` with a link to a
        // host directory, hoping the next start creates `null` (or mounts) there as root.
        for planted in ["dev", "etc", "proc"] {
            let dir = tempfile::tempdir().unwrap();
            let host = tempfile::tempdir().unwrap();
            std::os::unix::fs::symlink(host.path(), dir.path().join(planted)).unwrap();
            let err = prepare(&spec(dir.path())).unwrap_err();
            assert!(err.contains("symlink") && err.contains(planted), "{planted}: {err}");
            assert_eq!(fs::read_dir(host.path()).unwrap().count(), 0, "{planted}: nothing made on the host side");
        }
    }
}
