//! exec driver: namespaces, chroot, cgroup limits, user switch. Needs root (these hosts are).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support::{log, options, task, wait_for_output};
use nomad_agent::client::driver::capabilities::{self, CapSet};
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

/// `CapEff` and `CapBnd` of the task's shell, from /proc/self/status.
fn capability_masks(out: &str) -> (u64, u64) {
    let field = |name: &str| {
        let hex = out.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("{name} in {out}")).trim();
        u64::from_str_radix(hex, 16).unwrap()
    };
    (field("CapEff:"), field("CapBnd:"))
}

async fn run_capture(driver: &Arc<dyn Driver>, task: &nomad_agent::client::driver::TaskConfig) -> String {
    let handle = driver.start(task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    assert!(exit.successful(), "{exit:?} {}", log(task, "stderr", 0));
    log(task, "stdout", 0)
}

#[tokio::test]
async fn a_task_without_a_user_runs_as_nobody_with_nomads_default_capabilities() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "default-user", json!({"command": "/bin/sh", "args": ["-c", "id -u; grep ^Cap /proc/self/status"]}));
    let out = run_capture(&exec_driver(&options(false)), &task).await;
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    assert!(out.starts_with(&format!("{}\n", nobody.uid)), "{out}");
    let supported = capabilities::supported();
    let defaults = CapSet::parse(capabilities::NOMAD_DEFAULTS, supported).unwrap();
    let (effective, bounding) = capability_masks(&out);
    assert_eq!(bounding, defaults.bits(), "bounding set is Nomad's defaults: {out}");
    assert_eq!(effective, defaults.bits(), "and the unprivileged task holds them (ambient): {out}");
    assert_eq!(effective & (1 << 21), 0, "no sys_admin");
    assert_eq!(effective & (1 << 13), 0, "no net_raw");
}

#[tokio::test]
async fn cap_drop_all_with_cap_add_leaves_only_what_was_added() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let config =
        json!({"command": "/bin/sh", "args": ["-c", "grep ^Cap /proc/self/status"], "cap_drop": ["ALL"], "cap_add": ["cap_chown"]});
    let task = task(dir.path(), "narrow", config);
    let (effective, bounding) = capability_masks(&run_capture(&exec_driver(&options(false)), &task).await);
    assert_eq!((effective, bounding), (1, 1), "only chown (capability 0)");
}

#[tokio::test]
async fn root_and_capabilities_beyond_allow_caps_are_refused_before_anything_runs() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let driver = exec_driver(&options(false));
    let mut as_root = task(dir.path(), "root", json!({"command": "/bin/true"}));
    as_root.user = Some("root".to_string());
    for err in [driver.validate_config(&as_root).unwrap_err(), driver.start(&as_root).await.unwrap_err()] {
        assert_eq!(err.to_string(), "running as user \"root\" is disallowed");
    }
    let raw = task(dir.path(), "raw", json!({"command": "/bin/true", "cap_add": ["net_raw", "sys_admin"]}));
    assert_eq!(
        driver.validate_config(&raw).unwrap_err().to_string(),
        "driver does not allow the following capabilities: net_raw, sys_admin"
    );
    let typo = task(dir.path(), "typo", json!({"command": "/bin/true", "cap_drop": ["chwon"]}));
    assert_eq!(
        driver.validate_config(&typo).unwrap_err().to_string(),
        "cap_drop configured with capabilities not supported by system: chwon"
    );
}

#[tokio::test]
async fn root_allowed_by_the_operator_gets_nomads_legacy_set_and_allow_caps_widens_what_others_may_add() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let supported = capabilities::supported();
    let mut options = options(false);
    options.exec.user_denylist.clear();
    options.exec.allow_caps = options.exec.allow_caps.union(CapSet::parse(&["net_raw"], supported).unwrap());
    let driver = exec_driver(&options);

    let mut as_root = task(dir.path(), "root", json!({"command": "/bin/sh", "args": ["-c", "id -u; grep ^Cap /proc/self/status"]}));
    as_root.user = Some("root".to_string());
    let out = run_capture(&driver, &as_root).await;
    assert!(out.starts_with("0\n"), "{out}");
    assert_eq!(capability_masks(&out).1, CapSet::legacy(supported).bits(), "{out}");

    let raw = task(dir.path(), "raw", json!({"command": "/bin/sh", "args": ["-c", "grep ^Cap /proc/self/status"], "cap_add": ["net_raw"]}));
    let (effective, _) = capability_masks(&run_capture(&driver, &raw).await);
    assert_ne!(effective & (1 << 13), 0, "net_raw added");
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

/// A command run in an exec task joins the task: its PID namespace (it sees the task as PID 1),
/// its private /tmp, its root (not the host's), its cgroup, its user and capabilities.
#[tokio::test]
async fn exec_task_enters_the_tasks_namespaces_root_cgroup_and_user() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let mut task =
        task(dir.path(), "joined", json!({"command": "/bin/sh", "args": ["-c", "echo inside > /tmp/marker; echo ready; sleep 600"]}));
    task.env.insert("TASK_VAR".into(), "from-task".into());
    let driver = exec_driver(&options(false));
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    let script = "echo pid1=$(cat /proc/1/cmdline | tr '\\0' ' '); echo tmp=$(cat /tmp/marker); echo uid=$(id -u); \
                  echo var=$TASK_VAR; test -e /work || test -e /root/.cargo || echo host-fs-hidden; \
                  echo caps=$(grep CapEff /proc/self/status); cat /proc/self/cgroup";
    let args = vec!["-c".to_string(), script.to_string()];
    let out = driver.exec_task(&handle, "/bin/sh", &args, std::time::Duration::from_secs(20)).await.unwrap();
    let text = String::from_utf8_lossy(&out.output).into_owned();
    assert_eq!(out.exit_code, 0, "{text}");
    assert!(text.contains("pid1=/bin/sh -c echo inside"), "the task is PID 1 here: {text}");
    assert!(text.contains("tmp=inside"), "the task's own /tmp: {text}");
    assert!(text.contains("uid=65534"), "as nobody, like the task: {text}");
    assert!(text.contains("var=from-task"), "{text}");
    assert!(text.contains("host-fs-hidden"), "{text}");
    let task_caps = fs::read_to_string(format!("/proc/{}/status", handle.task.pid)).unwrap();
    let task_eff = task_caps.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string();
    assert!(text.contains(&format!("caps=CapEff: {task_eff}")), "the task's capabilities ({task_eff}): {text}");
    let cgroup_name = task.unique_name();
    assert!(text.contains(&cgroup_name), "in the task's cgroup {cgroup_name}: {text}");

    let out = driver.exec_task(&handle, "no-such-command", &[], std::time::Duration::from_secs(20)).await.unwrap();
    assert_eq!(out.exit_code, 127, "{:?}", String::from_utf8_lossy(&out.output));

    driver.destroy(&handle).await.unwrap();
    let err = driver.exec_task(&handle, "/bin/true", &[], std::time::Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("is not running"), "{err}");
}

/// A temp dir bound onto itself and made a shared mount (as the CSI root is); unmounted on drop.
struct SharedMount(tempfile::TempDir);

impl SharedMount {
    fn new() -> SharedMount {
        use nix::mount::{MsFlags, mount};
        let dir = tempfile::tempdir().unwrap();
        mount(Some(dir.path()), dir.path(), None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        mount(None::<&str>, dir.path(), None::<&str>, MsFlags::MS_SHARED, None::<&str>).unwrap();
        SharedMount(dir)
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        // What the task mounted through the bidirectional bind, then the bind itself.
        for _ in 0..4 {
            let _ = nix::mount::umount2(&self.0.path().join("m"), nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn is_mount_point(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().filter_map(|l| l.split(' ').nth(4)).any(|m| Path::new(m) == path)
}

#[tokio::test]
async fn a_bidirectional_bind_carries_the_tasks_mounts_to_the_host_and_a_host_to_task_one_the_hosts_to_the_task() {
    use nomad_agent::client::driver::{MountConfig, Propagation};
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let (shared, hosts) = (SharedMount::new(), SharedMount::new());
    let private = tempfile::tempdir().unwrap();
    let mut options = options(false);
    options.exec.user_denylist.clear();
    // As a CSI node plugin: mounts under its bidirectional staging root, and under a private
    // bind; then waits for the host to mount something under the host-to-task bind.
    let script = "mkdir -p /plug/m /priv/m && mount -t tmpfs plug /plug/m && echo from-task > /plug/m/f \
                  && mount -t tmpfs priv /priv/m && echo hidden > /priv/m/f && echo ready; \
                  for i in $(seq 1 300); do test -e /fromhost/m/f && echo saw=$(cat /fromhost/m/f) && break; sleep 0.1; done; \
                  exec sleep 600";
    let mut task = task(dir.path(), "plugin", json!({"command": "/bin/sh", "args": ["-c", script]}));
    task.user = Some("root".to_string());
    let bind = |host: &Path, at: &str, propagation| MountConfig {
        host_path: host.to_path_buf(),
        task_path: at.into(),
        read_only: false,
        propagation,
    };
    task.mounts = vec![
        bind(shared.0.path(), "/plug", Propagation::Bidirectional),
        bind(private.path(), "/priv", Propagation::Private),
        bind(hosts.0.path(), "/fromhost", Propagation::HostToTask),
    ];
    let driver = exec_driver(&options);
    let handle = driver.start(&task).await.unwrap_or_else(|e| panic!("{e}"));
    wait_for_output(&task, "ready").await;

    assert!(is_mount_point(&shared.0.path().join("m")), "the task's mount reached the host");
    assert_eq!(fs::read_to_string(shared.0.path().join("m/f")).unwrap(), "from-task\n");
    assert!(!is_mount_point(&private.path().join("m")), "a private bind keeps the task's mounts");
    assert!(!private.path().join("m/f").exists());
    assert!(!is_mount_point(&dir.path().join("alloc-dir/plugin/plug")), "the bind itself stays in the task");

    fs::create_dir_all(hosts.0.path().join("m")).unwrap();
    nix::mount::mount(Some("fromhost"), &hosts.0.path().join("m"), Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>).unwrap();
    fs::write(hosts.0.path().join("m/f"), "host\n").unwrap();
    wait_for_output(&task, "saw=host").await;

    driver.destroy(&handle).await.unwrap();
    assert!(is_mount_point(&shared.0.path().join("m")), "a plugin's mount outlives the plugin");
}
