//! Named network namespaces as Nomad makes them (`client/lib/nsutil`): a file under the netns
//! directory (a shared mount) with the namespace's `nsfs` file bind-mounted on it, so it lives
//! on with no process in it and survives the agent.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};

/// Is `path` a mounted network namespace (on `nsfs`, the file system of `/proc/<pid>/ns/*`)?
pub fn is_netns(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// Makes `dir` a shared mount (bind-mounting it on itself first when it is not a mount point),
/// so namespaces mounted under it show in every mount namespace that was copied from this one.
fn ensure_shared(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    match mount(None::<&str>, dir, None::<&str>, shared, None::<&str>) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) => {
            mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
                .map_err(|e| format!("mount --rbind {} {}: {e}", dir.display(), dir.display()))?;
            mount(None::<&str>, dir, None::<&str>, shared, None::<&str>).map_err(|e| format!("mount --make-rshared {}: {e}", dir.display()))
        }
        Err(e) => Err(format!("mount --make-rshared {}: {e}", dir.display())),
    }
}

/// The empty file a namespace is mounted on, in a shared `dir` (a file left behind without its
/// mount, by a crash between the steps, is made again).
fn mount_point(path: &Path) -> Result<(), String> {
    let dir = path.parent().ok_or_else(|| format!("{} has no parent directory", path.display()))?;
    ensure_shared(dir)?;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
        .map(drop)
        .map_err(|e| format!("create {}: {e}", path.display()))
}

/// Creates the namespace at `path`; `Ok(false)` when one is mounted there already (kept as it
/// is: its tasks may be running in it).
pub fn create(path: &Path) -> Result<bool, String> {
    if is_netns(path) {
        return Ok(false);
    }
    mount_point(path)?;
    let target = path.to_path_buf();
    // unshare moves only the calling thread: a thread of its own, which ends right after.
    let made = std::thread::spawn(move || -> Result<(), String> {
        unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare network namespace: {e}"))?;
        let tid = nix::unistd::gettid();
        let source = format!("/proc/self/task/{tid}/ns/net");
        mount(Some(source.as_str()), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| format!("bind {source} to {}: {e}", target.display()))
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_string())?;
    if let Err(e) = made {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(true)
}

/// Mounts the namespace another owner made (`source`: its nsfs file, such as a container's
/// sandbox) at `path`, so it is found where every alloc's namespace is and lives on while
/// mounted there.
pub fn bind(source: &Path, path: &Path) -> Result<(), String> {
    if !is_netns(source) {
        return Err(format!("{} is not a network namespace", source.display()));
    }
    mount_point(path)?;
    if let Err(e) = mount(Some(source), path, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
        let _ = std::fs::remove_file(path);
        return Err(format!("bind {} to {}: {e}", source.display(), path.display()));
    }
    Ok(())
}

/// Whether two nsfs files are the same namespace.
pub fn same(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Unmounts and removes the namespace file; nothing there is not an error.
pub fn remove(path: &Path) -> Result<(), String> {
    if is_netns(path) {
        umount2(path, MntFlags::MNT_DETACH).map_err(|e| format!("unmount {}: {e}", path.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("remove {}: {e}", path.display())),
    }
}
