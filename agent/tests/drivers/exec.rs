//! exec driver: namespaces, chroot, cgroup limits, user switch. Needs root (these hosts are).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support::{log, options, task, wait_for_output};
use nomad_agent::client::driver::{
    CgroupVersion, Driver, DriverError, DriverOptions, DriverRegistry, DriverState, TaskHandle, TaskResources,
};
use serde_json::json;

/// The exec driver needs root: without it the test is skipped (or fails under CI).
macro_rules! require_root {
    () => {
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root);
    };
}

fn exec_driver(options: &DriverOptions) -> Arc<dyn Driver> {
    DriverRegistry::new(options).get("exec").unwrap()
}

fn cgroup_dirs(handle: &TaskHandle) -> Vec<PathBuf> {
    match &handle.driver_state {
        DriverState::Exec { cgroup } => cgroup.dirs.clone(),
        other => panic!("not an exec handle: {other:?}"),
    }
}

fn read_trimmed(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display())).trim().to_string()
}

#[tokio::test]
async fn the_task_is_pid_1_in_a_chroot_and_cannot_see_host_processes() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    // A host process the task must not see.
    let mut marker = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    let script = "echo pid=$$; echo procs=$(ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '); \
                  test -e /work || test -e /root/.cargo || echo host-fs-hidden; \
                  echo shared > /alloc/from-task; echo host=$(hostname)";
    let task = task(dir.path(), "isolated", json!({"command": "/bin/sh", "args": ["-c", script]}));
    let driver = exec_driver(&options(false));
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    marker.kill().unwrap();
    marker.wait().unwrap();

    let out = log(&task, "stdout", 0);
    assert!(exit.successful(), "{exit:?} stderr: {}", log(&task, "stderr", 0));
    assert!(out.contains("pid=1\n"), "{out}");
    let procs: Vec<u32> =
        out.lines().find_map(|l| l.strip_prefix("procs=")).unwrap().split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert!(procs.contains(&1), "{out}");
    assert!(!procs.contains(&marker.id()), "host process {} visible: {out}", marker.id());
    assert!(procs.iter().all(|p| *p < 20), "only the namespace's own PIDs: {out}");
    assert!(out.contains("host-fs-hidden"), "{out}");
    assert!(out.contains("host=isolated"), "{out}");
    assert_eq!(fs::read_to_string(task.shared_dir().join("from-task")).unwrap(), "shared\n");
}

#[tokio::test]
async fn host_directories_are_read_only_in_the_chroot_and_alloc_is_writable() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    // A host directory of the test's own, bound like /etc is: a broken remount writes here,
    // never into the real /etc.
    let host_dir = tempfile::tempdir().unwrap();
    let mut options = options(false);
    let mut chroot: BTreeMap<PathBuf, PathBuf> =
        ["/bin", "/lib", "/lib64", "/usr"].iter().filter(|p| Path::new(p).exists()).map(|p| (PathBuf::from(p), PathBuf::from(p))).collect();
    chroot.insert(host_dir.path().to_path_buf(), PathBuf::from("/probe"));
    options.exec.chroot_env = Some(chroot);
    let script = "touch /probe/x 2>/dev/null && echo probe=writable || echo probe=read-only; \
                  echo x > /alloc/probe && echo alloc=writable; echo y > /tmp/probe && echo tmp=writable";
    let task = task(dir.path(), "ro", json!({"command": "/bin/sh", "args": ["-c", script]}));
    let driver = exec_driver(&options);
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    let out = log(&task, "stdout", 0);
    assert!(exit.successful(), "{exit:?} stderr: {}", log(&task, "stderr", 0));
    for line in ["probe=read-only", "alloc=writable", "tmp=writable"] {
        assert!(out.contains(line), "{line}: {out}");
    }
    assert_eq!(fs::read_dir(host_dir.path()).unwrap().count(), 0, "nothing written into the host dir");
}

#[tokio::test]
async fn cgroup_limits_are_written_and_removed_on_destroy() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let mut task = task(dir.path(), "limited", json!({"command": "/bin/sh", "args": ["-c", "echo ready; while :; do sleep 1; done"]}));
    task.resources = TaskResources { cpu_mhz: 250, memory_mib: 64, memory_max_mib: 0, pids_max: 32 };
    let driver = exec_driver(&options(false));
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;

    let dirs = cgroup_dirs(&handle);
    match nomad_agent::executor::cgroups::detect_version(Path::new("/sys/fs/cgroup")) {
        CgroupVersion::V1 => {
            let [memory, cpu, pids] = [&dirs[0], &dirs[1], &dirs[2]];
            assert_eq!(read_trimmed(&memory.join("memory.limit_in_bytes")), (64u64 << 20).to_string());
            assert_eq!(read_trimmed(&cpu.join("cpu.shares")), "250");
            assert_eq!(read_trimmed(&pids.join("pids.max")), "32");
        }
        CgroupVersion::V2 => {
            assert_eq!(read_trimmed(&dirs[0].join("memory.max")), (64u64 << 20).to_string());
            assert_eq!(read_trimmed(&dirs[0].join("pids.max")), "32");
            assert!(!read_trimmed(&dirs[0].join("cpu.weight")).is_empty());
        }
    }
    for d in &dirs {
        let procs = read_trimmed(&d.join("cgroup.procs"));
        assert!(procs.lines().any(|p| p == handle.task.pid.to_string()), "task not in {}: {procs}", d.display());
    }

    driver.destroy(&handle).await.unwrap();
    assert!(!handle.task.is_alive());
    for d in &dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[tokio::test]
async fn a_task_over_its_memory_limit_is_oom_killed_and_reported() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    // tail keeps the whole "line" in memory, and /dev/zero never ends one.
    let mut task = task(dir.path(), "hungry", json!({"command": "/usr/bin/tail", "args": ["/dev/zero"]}));
    task.resources = TaskResources { memory_mib: 16, ..TaskResources::default() };
    let driver = exec_driver(&options(false));
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    assert!(exit.oom_killed, "{exit:?}");
    assert_eq!(exit.signal, nix::sys::signal::Signal::SIGKILL as i32);
}

#[tokio::test]
async fn the_task_runs_as_the_configured_user() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let mut task = task(dir.path(), "unprivileged", json!({"command": "/bin/sh", "args": ["-c", "id -u; id -g"]}));
    task.user = Some("nobody".to_string());
    let driver = exec_driver(&options(false));
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    assert!(exit.successful(), "{exit:?} {}", log(&task, "stderr", 0));
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    assert_eq!(log(&task, "stdout", 0), format!("{}\n{}\n", nobody.uid, nobody.gid));
}

#[tokio::test]
async fn a_missing_chroot_source_fails_clearly_and_leaves_no_cgroup() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(false);
    let missing = PathBuf::from("/nonexistent-chroot-source-xyz");
    options.exec.chroot_env =
        Some(BTreeMap::from([(PathBuf::from("/usr"), PathBuf::from("/usr")), (missing.clone(), PathBuf::from("/opt/tool"))]));
    let task = task(dir.path(), "broken", json!({"command": "/bin/true"}));
    let err = exec_driver(&options).start(&task).await.unwrap_err();
    assert!(matches!(&err, DriverError::MissingChrootSource(p) if *p == missing), "{err:?}");
    assert!(err.to_string().contains("/nonexistent-chroot-source-xyz"), "{err}");
    assert!(!Path::new("/sys/fs/cgroup/memory/nomad-rs").join(task.unique_name()).exists());
}

#[tokio::test]
async fn a_command_missing_inside_the_chroot_fails_to_start_naming_it() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "typo", json!({"command": "/bin/no-such-tool-xyz"}));
    let err = exec_driver(&options(false)).start(&task).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, DriverError::StartFailed(_)), "{err:?}");
    assert!(message.contains("no-such-tool-xyz") && message.contains("No such file"), "{message}");
}

#[tokio::test]
async fn fingerprint_reports_exec_with_its_cgroup_version() {
    require_root!();
    let info = exec_driver(&options(false)).fingerprint().await;
    assert!(info.detected && info.healthy, "{info:?}");
    assert_eq!(info.attributes.get("driver.exec").map(String::as_str), Some("1"));
    assert!(info.attributes.contains_key("driver.exec.cgroups"));
}
