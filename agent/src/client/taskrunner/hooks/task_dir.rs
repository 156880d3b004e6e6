//! `task_dir`: builds `<alloc_dir>/<task>/{local,secrets,tmp}`. `secrets` is a 1 MiB tmpfs with
//! mode 0700, `noexec,nosuid,nodev` where the agent may mount (root on Linux), else a plain
//! 0700 directory. Done once per task: a restarted task or agent keeps the directory (and what
//! the task left in `local/`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{HookError, HookRequest, PrestartHook, PrestartResponse, TaskHook};
use crate::client::taskrunner::events;

/// See the module docs.
pub struct TaskDirHook;

/// Size of the secrets tmpfs.
const SECRETS_SIZE: &str = "size=1m";

impl TaskHook for TaskDirHook {
    fn name(&self) -> &'static str {
        "task_dir"
    }
    fn prestart(&self) -> Option<&dyn PrestartHook> {
        Some(self)
    }
}

/// Mounts a tmpfs (mode 0700, noexec) on `dir` unless something is mounted there already.
/// Returns whether `dir` is now a tmpfs.
pub fn mount_secrets_tmpfs(dir: &Path) -> bool {
    use nix::mount::{MsFlags, mount};
    if is_mount_point(dir) {
        return true;
    }
    let flags = MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let data = format!("{SECRETS_SIZE},mode=0700");
    mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(data.as_str())).is_ok()
}

/// True when `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(dir), dir.parent().map(fs::metadata)) {
        (Ok(d), Some(Ok(p))) => d.dev() != p.dev(),
        _ => false,
    }
}

fn mkdir(dir: &Path, mode: u32) -> Result<(), HookError> {
    fs::create_dir_all(dir).map_err(|e| HookError::recoverable(format!("create {}: {e}", dir.display())))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(|e| HookError::recoverable(format!("chmod {}: {e}", dir.display())))
}

impl PrestartHook for TaskDirHook {
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        let c = req.config;
        mkdir(&c.task_dir(), 0o777)?;
        mkdir(&c.local_dir(), 0o777)?;
        mkdir(&c.tmp_dir(), 0o1777)?;
        mkdir(&c.secrets_dir(), 0o700)?;
        let tmpfs = req.secrets_tmpfs && nix::unistd::geteuid().is_root() && mount_secrets_tmpfs(&c.secrets_dir());
        let mut resp = PrestartResponse { done: true, events: vec![events::task_setup()], ..PrestartResponse::default() };
        resp.data.insert("secrets_tmpfs".into(), tmpfs.to_string());
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_task_dirs_with_private_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        let alloc = nomad_proto::Allocation::default();
        let task = nomad_proto::Task::default();
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        let resp = PrestartHook::prestart(&TaskDirHook, &req).unwrap();
        assert!(resp.done);
        assert_eq!(resp.events[0].event_type, "Task Setup");
        for d in [config.local_dir(), config.tmp_dir(), config.secrets_dir()] {
            assert!(d.is_dir(), "{}", d.display());
        }
        let mode = fs::metadata(config.secrets_dir()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(resp.data["secrets_tmpfs"], "false");
    }

    #[test]
    fn secrets_is_a_noexec_tmpfs_as_root() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        let alloc = nomad_proto::Allocation::default();
        let task = nomad_proto::Task::default();
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: true, previous: None };
        let resp = PrestartHook::prestart(&TaskDirHook, &req).unwrap();
        let secrets = config.secrets_dir();
        let mounted = resp.data["secrets_tmpfs"] == "true";
        if mounted {
            assert!(is_mount_point(&secrets));
            let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
            let line = mounts.lines().find(|l| l.split_whitespace().nth(1) == Some(secrets.to_str().unwrap())).unwrap();
            assert!(line.contains("tmpfs") && line.contains("noexec"), "{line}");
            assert_eq!(fs::metadata(&secrets).unwrap().permissions().mode() & 0o777, 0o700);
            nix::mount::umount2(&secrets, nix::mount::MntFlags::MNT_DETACH).unwrap();
        }
    }
}
