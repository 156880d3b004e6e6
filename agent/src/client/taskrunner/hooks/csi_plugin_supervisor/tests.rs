use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;

use nomad_proto::{Allocation, Task};

use super::*;
use crate::client::csi::fake::FakePlugin;

fn plugin_config(plugin_type: &str) -> CsiPluginConfig {
    CsiPluginConfig {
        id: "hostpath".into(),
        plugin_type: plugin_type.into(),
        mount_dir: "/csi".into(),
        stage_publish_base_dir: "/local/csi".into(),
        health_timeout: 30_000_000_000,
    }
}

#[derive(Default)]
struct Recorder {
    registered: Mutex<Vec<PluginRegistration>>,
    deregistered: Mutex<Vec<(PluginSide, String, String)>>,
    events: Mutex<Vec<TaskEvent>>,
    killed: Mutex<Vec<TaskEvent>>,
}

impl CsiPlugins for Recorder {
    fn register(&self, reg: PluginRegistration) {
        lock(&self.registered).push(reg);
    }
    fn deregister(&self, side: PluginSide, plugin_id: &str, alloc_id: &str) {
        lock(&self.deregistered).push((side, plugin_id.into(), alloc_id.into()));
    }
}

impl TaskControl for Recorder {
    fn emit_event(&self, event: TaskEvent) {
        lock(&self.events).push(event);
    }
    fn kill_failed(&self, event: TaskEvent) {
        lock(&self.killed).push(event);
    }
}

fn hook(root: &Path, rec: &Arc<Recorder>, plugin: Arc<FakePlugin>) -> CsiPluginSupervisorHook {
    let connect: Connector = Arc::new(move |_: &Path| Ok(plugin.clone() as Arc<dyn CsiPluginClient>));
    let control: Weak<dyn TaskControl> = Arc::downgrade(rec) as Weak<dyn TaskControl>;
    CsiPluginSupervisorHook::new(root.to_path_buf(), rec.clone(), connect, control)
}

fn task(plugin_type: &str) -> Task {
    Task { name: "plugin".into(), driver: "raw_exec".into(), csi_plugin_config: Some(plugin_config(plugin_type)), ..Task::default() }
}

#[test]
fn paths_and_endpoint_follow_nomads_layout() {
    let root = Path::new("/var/nomad/csi");
    let paths = PluginPaths::new(root, "a1", &plugin_config("monolith")).unwrap();
    assert_eq!(paths.socket_dir, Path::new("/var/nomad/csi/plugins/a1"));
    assert_eq!(paths.socket, Path::new("/var/nomad/csi/plugins/a1/csi.sock"));
    assert_eq!(paths.mount_point, Path::new("/var/nomad/csi/monolith/hostpath"));
    // raw_exec has no chroot: the host socket; an isolated task: the one under mount_dir.
    let c = plugin_config("node");
    assert_eq!(csi_endpoint(root, "a1", Some(&c), false).unwrap(), "unix:///var/nomad/csi/plugins/a1/csi.sock");
    assert_eq!(csi_endpoint(root, "a1", Some(&c), true).unwrap(), "unix:///csi/csi.sock");
    assert_eq!(csi_endpoint(root, "a1", None, false), None, "no plugin, no endpoint");
}

#[test]
fn ids_that_are_no_directory_name_types_nomad_lacks_and_long_sockets_are_refused() {
    let root = Path::new("/var/nomad/csi");
    for id in ["..", "a/b", "."] {
        let err = PluginPaths::new(root, "a1", &CsiPluginConfig { id: id.into(), ..plugin_config("node") }).unwrap_err();
        assert!(err.starts_with(&format!("CSI plugin ID {id:?}")), "{err}");
    }
    let err = PluginPaths::new(root, "a1", &plugin_config("sidecar")).unwrap_err();
    assert_eq!(err, "CSIPluginConfig PluginType must be one of 'node', 'controller', or 'monolith', got: \"sidecar\"");
    let deep = PathBuf::from(format!("/{}", "d".repeat(100)));
    let err = PluginPaths::new(&deep, "a1", &plugin_config("node")).unwrap_err();
    assert!(err.contains("longer than the 107 bytes"), "{err}");
}

#[test]
fn prestart_makes_private_dirs_and_stop_removes_the_socket_dir_and_deregisters() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("csi");
    let rec = Arc::new(Recorder::default());
    let h = hook(&root, &rec, Arc::new(FakePlugin::default()));
    let (alloc, task) = (Allocation::default(), task("monolith"));
    let mut config = super::super::tests_support::config();
    config.alloc_id = "a1".into();
    let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
    PrestartHook::prestart(&h, &req).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&root.join("plugins/a1")), 0o700);
    assert_eq!(mode(&root.join("monolith/hostpath")), 0o700);

    StopHook::stop(&h, &req).unwrap();
    assert!(!root.join("plugins/a1").exists());
    assert!(root.join("monolith/hostpath").exists(), "the staging root outlives the plugin alloc");
    let gone = lock(&rec.deregistered).clone();
    assert_eq!(
        gone,
        [(PluginSide::Controller, "hostpath".to_string(), "a1".to_string()), (PluginSide::Node, "hostpath".to_string(), "a1".to_string())]
    );
}

#[test]
fn prestart_never_follows_a_symlink_in_the_csi_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("csi");
    let elsewhere = dir.path().join("elsewhere");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("plugins")).unwrap();
    let rec = Arc::new(Recorder::default());
    let h = hook(&root, &rec, Arc::new(FakePlugin::default()));
    let (alloc, task) = (Allocation::default(), task("node"));
    let mut config = super::super::tests_support::config();
    config.alloc_id = "a1".into();
    let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
    let err = PrestartHook::prestart(&h, &req).unwrap_err();
    assert!(err.message.starts_with("failed to create socket mount point"), "{}", err.message);
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was made through the link");
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    nomad_testkit::wait_until(what, f).await;
}

#[tokio::test]
async fn a_ready_plugin_is_announced_and_registered_for_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let h = hook(&dir.path().join("csi"), &rec, Arc::new(FakePlugin::default()));
    let (alloc, task) = (Allocation::default(), task("monolith"));
    let mut config = super::super::tests_support::config();
    config.alloc_id = "a1".into();
    let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
    PoststartHook::poststart(&h, &req).unwrap();
    PoststartHook::poststart(&h, &req).unwrap();
    eventually("both sides registered", || lock(&rec.registered).len() >= 2).await;
    let regs = lock(&rec.registered).clone();
    assert_eq!(regs.len(), 2, "one supervisor per task runner");
    assert_eq!(regs.iter().map(|r| r.side).collect::<Vec<_>>(), [PluginSide::Controller, PluginSide::Node]);
    let r = &regs[0];
    assert_eq!(
        (r.plugin_id.as_str(), r.alloc_id.as_str(), r.provider.as_str(), r.version.as_str()),
        ("hostpath", "a1", "hostpath.csi.k8s.io", "1.0.0")
    );
    assert_eq!(r.socket, dir.path().join("csi/plugins/a1/csi.sock"));
    assert_eq!(r.container_mount_point, r.mount_point.display().to_string(), "raw_exec sees host paths, not stage_publish_base_dir");
    assert_eq!(r.mount_point, dir.path().join("csi/monolith/hostpath"));
    let events = lock(&rec.events).clone();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].event_type.as_str(), events[0].message.as_str()), (PLUGIN_HEALTHY, "plugin: hostpath"));
    assert!(lock(&rec.killed).is_empty());

    StopHook::stop(&h, &req).unwrap();
    assert_eq!(lock(&rec.deregistered).len(), 2);
}

#[tokio::test]
async fn a_plugin_never_ready_within_its_health_timeout_fails_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let plugin = Arc::new(FakePlugin::default());
    plugin.probe_fails.store(true, Ordering::SeqCst);
    let h = hook(&dir.path().join("csi"), &rec, plugin);
    let mut task = task("node");
    task.csi_plugin_config.as_mut().unwrap().health_timeout = 200_000_000;
    let alloc = Allocation::default();
    let mut config = super::super::tests_support::config();
    config.alloc_id = "a1".into();
    let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
    PoststartHook::poststart(&h, &req).unwrap();
    eventually("the task is killed", || !lock(&rec.killed).is_empty()).await;
    let kill = lock(&rec.killed)[0].clone();
    assert_eq!(kill.event_type, "Killing");
    assert_eq!(kill.display_message, "CSI plugin did not become healthy before configured 200ms health timeout");
    assert!(kill.fails_task);
    let events = lock(&rec.events).clone();
    assert_eq!(events[0].event_type, PLUGIN_UNHEALTHY);
    assert!(events[0].message.starts_with("Error: CSI plugin failed probe: "), "{}", events[0].message);
    assert!(lock(&rec.registered).is_empty());
}

#[test]
fn an_exec_plugin_gets_its_dirs_bound_bidirectionally_and_raw_exec_or_no_plugin_gets_nothing() {
    let root = Path::new("/var/nomad/csi");
    let c = CsiPluginConfig { mount_dir: String::new(), stage_publish_base_dir: String::new(), ..plugin_config("node") };
    let mounts = plugin_mounts(root, "a1", Some(&c), true);
    let got: Vec<(&Path, &str, Propagation)> =
        mounts.iter().map(|m| (m.host_path.as_path(), m.task_path.as_str(), m.propagation)).collect();
    assert_eq!(
        got,
        [
            (Path::new("/var/nomad/csi/plugins/a1"), "/csi", Propagation::Bidirectional),
            (Path::new("/var/nomad/csi/node/hostpath"), "/local/csi", Propagation::Bidirectional),
            (Path::new("/dev"), "/dev", Propagation::HostToTask),
        ],
        "Nomad's defaults for mount_dir and stage_publish_base_dir"
    );
    assert!(mounts.iter().all(|m| !m.read_only));
    let custom = CsiPluginConfig { mount_dir: "/sock".into(), stage_publish_base_dir: "/srv/csi".into(), ..plugin_config("node") };
    let targets: Vec<String> = plugin_mounts(root, "a1", Some(&custom), true).into_iter().map(|m| m.task_path).collect();
    assert_eq!(targets, ["/sock", "/srv/csi", "/dev"]);
    assert!(plugin_mounts(root, "a1", Some(&c), false).is_empty(), "raw_exec is given host paths");
    assert!(plugin_mounts(root, "a1", None, true).is_empty(), "no plugin");
}

#[test]
fn a_driver_that_cannot_run_a_plugin_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let h = hook(&dir.path().join("csi"), &rec, Arc::new(FakePlugin::default()));
    let alloc = Allocation::default();
    let config = super::super::tests_support::config();
    for driver in ["docker", "oci"] {
        let task = Task { driver: driver.into(), ..task("node") };
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        let err = PrestartHook::prestart(&h, &req).unwrap_err();
        assert_eq!(
            err.message,
            format!("csi_plugin is supported for raw_exec and exec tasks: the {driver} driver cannot run a plugin that mounts volumes")
        );
        assert!(!err.recoverable);
    }
    assert!(!dir.path().join("csi").exists(), "nothing made");
}

/// How many mounts are at `path` in this mount namespace, and whether the top one is shared.
fn mounts_at(path: &Path) -> (usize, bool) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let at: Vec<&str> = info.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == path)).collect();
    (at.len(), at.last().is_some_and(|l| l.split(" - ").next().unwrap_or("").contains(" shared:")))
}

#[tokio::test]
async fn an_exec_plugin_makes_the_csi_root_a_shared_mount_once_and_sees_its_staging_root_at_stage_publish_base_dir() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("csi");
    let rec = Arc::new(Recorder::default());
    let h = hook(&root, &rec, Arc::new(FakePlugin::default()));
    let (alloc, task) = (Allocation::default(), Task { driver: "exec".into(), ..task("monolith") });
    let mut config = super::super::tests_support::config();
    config.alloc_id = "a1".into();
    let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
    PrestartHook::prestart(&h, &req).unwrap();
    PrestartHook::prestart(&h, &req).unwrap();
    let (count, shared) = mounts_at(&root.canonicalize().unwrap());
    let _unmount = Unmount(root.clone());
    assert_eq!((count, shared), (1, true), "one bind of the CSI root onto itself, shared");

    PoststartHook::poststart(&h, &req).unwrap();
    eventually("both sides registered", || lock(&rec.registered).len() >= 2).await;
    let r = lock(&rec.registered)[0].clone();
    assert_eq!(r.container_mount_point, "/local/csi", "an exec plugin sees its staging root there");
    assert_eq!(r.mount_point, root.join("monolith/hostpath"));
    StopHook::stop(&h, &req).unwrap();
}

/// Detaches the CSI root's bind when the test ends.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}
