//! `alloc_dir`: builds `<alloc_root>/<alloc_id>/alloc/{data,logs,tmp}` (shared by the alloc's
//! tasks) before anything runs; on destroy unmounts whatever is mounted under the alloc dir
//! (task secrets tmpfs) and removes it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, PrerunHook};
use crate::client::state::HookState;

/// See the module docs.
pub struct AllocDirHook;

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

impl PrerunHook for AllocDirHook {
    fn prerun(&self, req: &AllocHookRequest<'_>) -> Result<Option<HookState>, AllocHookError> {
        let shared = req.alloc_dir.join("alloc");
        for (dir, mode) in [(req.alloc_dir.to_path_buf(), 0o755), (shared.clone(), 0o777)]
            .into_iter()
            .chain(["data", "logs", "tmp"].map(|d| (shared.join(d), if d == "tmp" { 0o1777 } else { 0o777 })))
        {
            fs::create_dir_all(&dir).map_err(|e| AllocHookError(format!("create {}: {e}", dir.display())))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                .map_err(|e| AllocHookError(format!("chmod {}: {e}", dir.display())))?;
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
        unmount_all_under(req.alloc_dir).map_err(AllocHookError)?;
        match fs::remove_dir_all(req.alloc_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(AllocHookError(format!("remove {}: {e}", req.alloc_dir.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_shared_dirs_and_destroy_removes_everything_twice_over() {
        let root = tempfile::tempdir().unwrap();
        let alloc_dir = root.path().join("a1");
        let alloc = nomad_proto::Allocation::default();
        let req = AllocHookRequest { alloc: &alloc, alloc_dir: &alloc_dir, previous: None };
        PrerunHook::prerun(&AllocDirHook, &req).unwrap();
        for d in ["alloc/data", "alloc/logs", "alloc/tmp"] {
            assert!(alloc_dir.join(d).is_dir(), "{d}");
        }
        fs::write(alloc_dir.join("alloc/data/x"), "1").unwrap();
        DestroyHook::destroy(&AllocDirHook, &req).unwrap();
        assert!(!alloc_dir.exists());
        DestroyHook::destroy(&AllocDirHook, &req).unwrap();
    }

    #[test]
    fn mount_points_under_a_dir_deepest_first() {
        let mounts = "tmpfs /a/b/t/secrets tmpfs rw 0 0\n/dev/x /a ext4 rw 0 0\ntmpfs /a/b tmpfs rw 0 0\ntmpfs /ab tmpfs rw 0 0\n";
        assert_eq!(mounts_under(mounts, Path::new("/a/b")), [PathBuf::from("/a/b/t/secrets"), PathBuf::from("/a/b")]);
    }
}
