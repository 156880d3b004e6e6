//! `task_dir`: builds `<alloc_dir>/<task>/{local,secrets,tmp}`. `secrets` is a 1 MiB tmpfs with
//! mode 0700, `noexec,nosuid,nodev` where the agent may mount (root on Linux), else a plain
//! 0700 directory. An exec task runs as its own user (`nobody` by default), so, as root, the
//! agent gives that user the secrets dir (still 0700): the task reads what hooks write there, its
//! Envoy bootstrap say (Nomad makes the dir 0777 and gives it to `nobody`). Done once per task: a
//! restarted task or agent keeps the directory (and what the task left in `local/`).
//!
//! Everything is made beneath the alloc dir through `fs_beneath`: the task name must be one
//! plain name (a task named `..` would otherwise make the alloc root its task dir), no directory
//! is created or chmodded through a symlink, and the tmpfs is mounted on the fd of the secrets
//! dir it resolved, never on a path a task could have swapped for a link to a host directory.

use std::path::Path;

use super::{HookError, HookRequest, PrestartHook, PrestartResponse, TaskHook};
use crate::client::taskrunner::events;
use crate::fs_beneath::{Beneath, FsError, Links, check_name};

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

/// Mounts a tmpfs (mode 0700, noexec) on `secrets`, a directory of `task_dir`, unless something
/// is mounted there already. Returns whether it is now a mount point.
pub fn mount_secrets_tmpfs(task_dir: &Beneath, secrets: &Beneath) -> bool {
    use nix::mount::{MsFlags, mount};
    if is_mount_point(task_dir, secrets) {
        return true;
    }
    let flags = MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let data = format!("{SECRETS_SIZE},mode=0700");
    match mount(Some("tmpfs"), &secrets.fd_path(), Some("tmpfs"), flags, Some(data.as_str())) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(dir = %secrets.path().display(), error = %e, "mounting the secrets tmpfs failed; secrets is a plain directory");
            false
        }
    }
}

/// True when `dir` is on another device than `parent`, its parent: a mount point.
fn is_mount_point(parent: &Beneath, dir: &Beneath) -> bool {
    match (dir.stat(Path::new("."), Links::Refuse), parent.stat(Path::new("."), Links::Refuse)) {
        (Ok(d), Ok(p)) => d.dev != p.dev,
        _ => false,
    }
}

fn setup_error(e: FsError) -> HookError {
    HookError::recoverable(e.to_string())
}

/// The user and group an exec task runs as, when the agent may give them its secrets dir (it is
/// root). A user the host does not know is left to the driver to report.
fn exec_owner(task: &nomad_proto::Task) -> Option<(nix::unistd::Uid, nix::unistd::Gid)> {
    if task.driver != "exec" || !nix::unistd::geteuid().is_root() {
        return None;
    }
    let name = if task.user.is_empty() { crate::client::driver::exec::DEFAULT_USER } else { task.user.as_str() };
    nix::unistd::User::from_name(name).ok().flatten().map(|u| (u.uid, u.gid))
}

impl PrestartHook for TaskDirHook {
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        let c = req.config;
        check_name(&c.task_name)
            .map_err(|reason| HookError::fatal(format!("task name {:?} {reason}: it must be usable as a directory name", c.task_name)))?;
        let alloc_dir = c.open_alloc_dir().map_err(setup_error)?;
        let task_dir = alloc_dir.create_dir_all(Path::new(&c.task_name), 0o777).map_err(setup_error)?;
        task_dir.create_dir_all(Path::new("local"), 0o777).map_err(setup_error)?;
        task_dir.create_dir_all(Path::new("tmp"), 0o1777).map_err(setup_error)?;
        let secrets = task_dir.create_dir_all(Path::new("secrets"), 0o700).map_err(setup_error)?;
        let tmpfs = req.secrets_tmpfs && nix::unistd::geteuid().is_root() && mount_secrets_tmpfs(&task_dir, &secrets);
        if let Some((uid, gid)) = exec_owner(req.task) {
            // Opened again: after the mount, the tmpfs root is the directory to give.
            let secrets = task_dir.open_dir(Path::new("secrets"), Links::Refuse).map_err(setup_error)?;
            nix::unistd::fchown(&secrets, Some(uid), Some(gid))
                .map_err(|e| HookError::recoverable(format!("chown {}: {e}", secrets.path().display())))?;
        }
        let mut resp = PrestartResponse { done: true, events: vec![events::task_setup()], ..PrestartResponse::default() };
        resp.data.insert("secrets_tmpfs".into(), tmpfs.to_string());
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

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
        let mode = |d: &Path| fs::metadata(d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&config.task_dir()), 0o777);
        assert_eq!(mode(&config.local_dir()), 0o777);
        assert_eq!(mode(&config.tmp_dir()), 0o1777);
        assert_eq!(mode(&config.secrets_dir()), 0o700);
        assert_eq!(resp.data["secrets_tmpfs"], "false");
    }

    #[test]
    fn a_task_named_dot_dot_never_touches_the_alloc_root() {
        let root = tempfile::tempdir().unwrap();
        let alloc_dir = root.path().join("a1");
        fs::create_dir(&alloc_dir).unwrap();
        let before = fs::metadata(root.path()).unwrap().permissions().mode();
        let alloc = nomad_proto::Allocation::default();
        let task = nomad_proto::Task::default();
        for name in ["..", ".", "a/b", ""] {
            let mut config = super::super::tests_support::config();
            config.alloc_dir = alloc_dir.clone();
            config.task_name = name.into();
            let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
            let err = PrestartHook::prestart(&TaskDirHook, &req).unwrap_err();
            assert!(!err.recoverable, "{name:?}");
            assert!(err.message.starts_with(&format!("task name {name:?}")), "{}", err.message);
        }
        assert_eq!(fs::metadata(root.path()).unwrap().permissions().mode(), before, "the alloc root is not chmodded");
        for d in ["local", "secrets", "tmp"] {
            assert!(!root.path().join(d).exists() && !alloc_dir.join(d).exists(), "{d}");
        }
    }

    #[test]
    fn a_secrets_dir_swapped_for_a_symlink_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        fs::create_dir_all(config.task_dir()).unwrap();
        std::os::unix::fs::symlink(host.path(), config.secrets_dir()).unwrap();
        let before = fs::metadata(host.path()).unwrap().permissions().mode();
        let alloc = nomad_proto::Allocation::default();
        let task = nomad_proto::Task::default();
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: true, previous: None };
        let err = PrestartHook::prestart(&TaskDirHook, &req).unwrap_err();
        assert!(err.message.contains("secrets") && err.message.contains("symlink"), "{}", err.message);
        assert_eq!(fs::metadata(host.path()).unwrap().permissions().mode(), before, "not chmodded 0700");
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(!mounts.contains(host.path().to_str().unwrap()), "no tmpfs on the host dir");
    }

    #[test]
    fn secrets_is_a_noexec_tmpfs_as_root() {
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root); // to mount the secrets tmpfs
        let dir = tempfile::tempdir().unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        let alloc = nomad_proto::Allocation::default();
        let task = nomad_proto::Task::default();
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: true, previous: None };
        let resp = PrestartHook::prestart(&TaskDirHook, &req).unwrap();
        let secrets = config.secrets_dir();
        let mounted = resp.data["secrets_tmpfs"] == "true";
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        let line = mounts.lines().find(|l| l.split_whitespace().nth(1) == Some(secrets.to_str().unwrap())).map(str::to_string);
        let task_dir = Beneath::open(&config.task_dir()).unwrap();
        let is_mount = is_mount_point(&task_dir, &task_dir.open_dir(Path::new("secrets"), Links::Refuse).unwrap());
        let mode = fs::metadata(&secrets).unwrap().permissions().mode() & 0o777;
        if line.is_some() {
            nix::mount::umount2(&secrets, nix::mount::MntFlags::MNT_DETACH).unwrap();
        }
        assert!(mounted && is_mount, "root mounts the secrets tmpfs");
        let line = line.expect("the tmpfs is in /proc/self/mounts");
        assert!(line.contains("tmpfs") && line.contains("noexec"), "{line}");
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn an_exec_tasks_user_owns_its_secrets_dir() {
        use std::os::unix::fs::MetadataExt;
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root); // to chown
        let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("the host has nobody");
        let alloc = nomad_proto::Allocation::default();
        for (driver, tmpfs, owner) in [("exec", true, nobody.uid.as_raw()), ("exec", false, nobody.uid.as_raw()), ("raw_exec", false, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let mut config = super::super::tests_support::config();
            config.alloc_dir = dir.path().to_path_buf();
            let task = nomad_proto::Task { driver: driver.into(), ..nomad_proto::Task::default() };
            let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: tmpfs, previous: None };
            let resp = PrestartHook::prestart(&TaskDirHook, &req).unwrap();
            let meta = fs::metadata(config.secrets_dir()).unwrap();
            if resp.data["secrets_tmpfs"] == "true" {
                nix::mount::umount2(&config.secrets_dir(), nix::mount::MntFlags::MNT_DETACH).unwrap();
            }
            assert_eq!((meta.uid(), meta.mode() & 0o7777), (owner, 0o700), "{driver} tmpfs={tmpfs}");
        }
    }
}
