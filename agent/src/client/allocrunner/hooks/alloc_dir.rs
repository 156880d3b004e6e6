//! `alloc_dir`: builds `<alloc_root>/<alloc_id>/alloc/{data,logs,tmp}` (shared by the alloc's
//! tasks) before anything runs; on destroy unmounts whatever is mounted under the alloc dir
//! (task secrets tmpfs) and removes it.
//!
//! Both go through `fs_beneath` from the alloc root: the alloc ID must be a plain name, nothing
//! is created, chmodded or removed through a symlink, and removal unlinks what a task planted
//! (a symlink to a host directory is removed, not followed) and stops at a mount point it could
//! not unmount instead of deleting what is mounted there.

use std::fs;
use std::path::{Path, PathBuf};

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, PrerunHook};
use crate::client::state::HookState;
use crate::fs_beneath::{Beneath, check_name};

/// See the module docs.
pub struct AllocDirHook;

/// The shared dirs and their modes: the alloc dir itself, `alloc/` and what is in it.
const SHARED_DIRS: [(&str, u32); 4] = [("alloc", 0o777), ("alloc/data", 0o777), ("alloc/logs", 0o777), ("alloc/tmp", 0o1777)];

impl AllocHook for AllocDirHook {
    fn name(&self) -> &'static str {
        "alloc_dir"
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        Some(self)
    }
}

/// The alloc root (trusted: the agent's configuration) and the alloc dir's name in it, the
/// alloc ID. Taken from the ID, never from the path: `<root>/../x` or `<root>/.` would name
/// something else than a directory of the alloc's own.
fn split<'a>(req: &AllocHookRequest<'a>) -> Result<(&'a Path, &'a str), AllocHookError> {
    let id = req.alloc.id.as_str();
    check_name(id).map_err(|reason| AllocHookError(format!("alloc ID {id:?} {reason}")))?;
    let root = req.alloc_dir.parent().filter(|_| req.alloc_dir.file_name() == Some(std::ffi::OsStr::new(id)));
    let root = root.ok_or_else(|| AllocHookError(format!("alloc dir {} is not <alloc root>/{id}", req.alloc_dir.display())))?;
    Ok((root, id))
}

impl PrerunHook for AllocDirHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> futures::future::BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        Box::pin(std::future::ready(self.prerun_now(req)))
    }
}

impl AllocDirHook {
    fn prerun_now(&self, req: &AllocHookRequest<'_>) -> Result<Option<HookState>, AllocHookError> {
        let (root, name) = split(req)?;
        fs::create_dir_all(root).map_err(|e| AllocHookError(format!("create {}: {e}", root.display())))?;
        let err = |e: crate::fs_beneath::FsError| AllocHookError(e.to_string());
        let alloc_dir = Beneath::open(root).map_err(err)?.create_dir_all(Path::new(name), 0o755).map_err(err)?;
        for (dir, mode) in SHARED_DIRS {
            alloc_dir.create_dir_all(Path::new(dir), mode).map_err(err)?;
        }
        // Not marked done: it is idempotent, and a restarted agent should rebuild a directory
        // someone removed.
        Ok(None)
    }
}

/// Mount points at or under `dir`, deepest first (from `/proc/self/mounts`).
fn mounts_under(mounts: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    found
}

/// Lazily unmounts everything mounted under `dir`.
pub fn unmount_all_under(dir: &Path) -> Result<(), String> {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else { return Ok(()) };
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    for m in mounts_under(&mounts, &dir) {
        nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH).map_err(|e| format!("unmount {}: {e}", m.display()))?;
    }
    Ok(())
}

impl DestroyHook for AllocDirHook {
    fn destroy(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        let (root, name) = split(req)?;
        unmount_all_under(req.alloc_dir).map_err(AllocHookError)?;
        let root = match Beneath::open(root) {
            Ok(root) => root,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(AllocHookError(e.to_string())),
        };
        root.remove_tree(Path::new(name)).map_err(|e| AllocHookError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn request<'a>(alloc: &'a nomad_proto::Allocation, alloc_dir: &'a Path) -> AllocHookRequest<'a> {
        AllocHookRequest { alloc, alloc_dir, previous: None }
    }

    fn alloc(id: &str) -> nomad_proto::Allocation {
        nomad_proto::Allocation { id: id.into(), ..Default::default() }
    }

    #[test]
    fn builds_the_shared_dirs_and_destroy_removes_everything_twice_over() {
        let root = tempfile::tempdir().unwrap();
        let alloc_dir = root.path().join("a1");
        let alloc = alloc("a1");
        let req = request(&alloc, &alloc_dir);
        AllocDirHook.prerun_now(&req).unwrap();
        let mode = |d: &str| fs::metadata(alloc_dir.join(d)).unwrap().permissions().mode() & 0o7777;
        for (d, m) in SHARED_DIRS {
            assert_eq!(mode(d), m, "{d}");
        }
        assert_eq!(fs::metadata(&alloc_dir).unwrap().permissions().mode() & 0o7777, 0o755);
        fs::write(alloc_dir.join("alloc/data/x"), "1").unwrap();
        DestroyHook::destroy(&AllocDirHook, &req).unwrap();
        assert!(!alloc_dir.exists());
        DestroyHook::destroy(&AllocDirHook, &req).unwrap();
    }

    #[test]
    fn destroy_removes_what_a_task_planted_without_following_it() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        fs::write(host.path().join("important"), b"keep").unwrap();
        let alloc_dir = root.path().join("a1");
        let alloc = alloc("a1");
        let req = request(&alloc, &alloc_dir);
        AllocDirHook.prerun_now(&req).unwrap();
        std::os::unix::fs::symlink(host.path(), alloc_dir.join("alloc/data/host")).unwrap();
        std::os::unix::fs::symlink(host.path().join("important"), alloc_dir.join("alloc/logs/web.stdout.0")).unwrap();
        // `alloc` itself swapped for a link to the host directory.
        fs::rename(alloc_dir.join("alloc"), alloc_dir.join("alloc.real")).unwrap();
        std::os::unix::fs::symlink(host.path(), alloc_dir.join("alloc")).unwrap();
        DestroyHook::destroy(&AllocDirHook, &req).unwrap();
        assert!(!alloc_dir.exists());
        assert_eq!(fs::read(host.path().join("important")).unwrap(), b"keep");
    }

    #[test]
    fn prerun_refuses_a_shared_dir_swapped_for_a_symlink() {
        let root = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let alloc_dir = root.path().join("a1");
        let alloc = alloc("a1");
        let req = request(&alloc, &alloc_dir);
        AllocDirHook.prerun_now(&req).unwrap();
        fs::remove_dir_all(alloc_dir.join("alloc/logs")).unwrap();
        std::os::unix::fs::symlink(host.path(), alloc_dir.join("alloc/logs")).unwrap();
        let before = fs::metadata(host.path()).unwrap().permissions().mode();
        let err = AllocDirHook.prerun_now(&req).unwrap_err();
        assert!(err.0.contains("alloc/logs") && err.0.contains("symlink"), "{}", err.0);
        assert_eq!(fs::metadata(host.path()).unwrap().permissions().mode(), before, "the host dir was not chmodded 0777");
    }

    #[test]
    fn an_alloc_id_that_is_not_one_plain_name_is_refused_and_nothing_outside_is_touched() {
        let root = tempfile::tempdir().unwrap();
        let alloc_root = root.path().join("allocs");
        fs::create_dir(&alloc_root).unwrap();
        let marker = alloc_root.join("keep");
        fs::write(&marker, b"").unwrap();
        for id in [".", "..", "", "x/..", "../allocs", "a/b"] {
            let alloc = alloc(id);
            let alloc_dir = alloc_root.join(id);
            let req = request(&alloc, &alloc_dir);
            let err = AllocDirHook.prerun_now(&req).unwrap_err();
            assert!(err.0.starts_with(&format!("alloc ID {id:?}")), "{id:?}: {}", err.0);
            assert!(DestroyHook::destroy(&AllocDirHook, &req).is_err(), "{id:?}");
        }
        assert!(marker.exists(), "the alloc root was not removed");
        assert_eq!(fs::metadata(&alloc_root).unwrap().permissions().mode() & 0o777, 0o755, "nor chmodded");
        // A dir that is not <root>/<id> is refused too.
        let alloc = alloc("a1");
        let elsewhere = root.path().join("elsewhere");
        let req = request(&alloc, &elsewhere);
        assert!(AllocDirHook.prerun_now(&req).unwrap_err().0.contains("is not <alloc root>/a1"));
    }

    #[test]
    fn mount_points_under_a_dir_deepest_first() {
        let mounts = "tmpfs /a/b/t/secrets tmpfs rw 0 0\n/dev/x /a ext4 rw 0 0\ntmpfs /a/b tmpfs rw 0 0\ntmpfs /ab tmpfs rw 0 0\n";
        assert_eq!(mounts_under(mounts, Path::new("/a/b")), [PathBuf::from("/a/b/t/secrets"), PathBuf::from("/a/b")]);
    }
}
