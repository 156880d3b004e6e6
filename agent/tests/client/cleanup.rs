//! What a task leaves on the host once it is over: exec cgroups and oci containers (runtime
//! state, cgroups, bundle) are removed when a run ends, whether the task finished, was stopped
//! by the servers, or was killed by a dev agent's shutdown. Needs root, runc and busybox-static
//! (scripts/install-deps installs them): without them each test is skipped loudly, or fails
//! under CI (`nomad_testkit::prereq`).

use std::path::{Path, PathBuf};

use nomad_agent::client::driver::{CgroupVersion, DriverOptions, DriverRegistry};
use nomad_agent::client::{Client, ClientConfig};
use nomad_proto::Task;
use nomad_proto::job::JobType;
use serde_json::json;

use crate::support::{TestServer, client_config, executor_path, job, restart_policy, task_pid, wait_for, wait_ready, wait_until};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// exec and oci tasks need root, runc and busybox-static.
macro_rules! require_isolated_host {
    () => {
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root, nomad_testkit::Prereq::Runc, nomad_testkit::Prereq::Busybox);
    };
}

/// Drivers with runc's state inside the test's dir, so leftovers are easy to see.
fn drivers(root: &Path) -> DriverRegistry {
    let mut options = DriverOptions { executor_path: executor_path(), ..DriverOptions::new(true) };
    options.oci.runtime_root = root.join("runc-state");
    DriverRegistry::new(&options)
}

async fn start(root: &Path, server: &TestServer) -> Client {
    let config: ClientConfig = client_config(root, vec![server.addr()]);
    Client::start(config, drivers(root)).await.expect("client starts")
}

/// Every cgroup directory of a task (`<root>/<ctrl>/nomad-rs/<alloc>.<task>` on v1).
fn cgroup_dirs(alloc_id: &str, task: &str) -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    let name = format!("{alloc_id}.{task}");
    match nomad_agent::executor::cgroups::detect_version(root) {
        CgroupVersion::V2 => vec![root.join("nomad-rs").join(&name)],
        CgroupVersion::V1 => std::fs::read_dir(root)
            .map(|dirs| dirs.filter_map(Result::ok).map(|d| d.path().join("nomad-rs").join(&name)).collect())
            .unwrap_or_default(),
    }
}

fn existing_cgroups(alloc_id: &str, task: &str) -> Vec<PathBuf> {
    cgroup_dirs(alloc_id, task).into_iter().filter(|d| d.exists()).collect()
}

fn exec_task(name: &str, command: &str, args: &[&str]) -> Task {
    let mut t = Task { name: name.into(), driver: "exec".into(), ..Task::default() };
    t.config.insert("command".into(), json!(command));
    t.config.insert("args".into(), json!(args));
    t.resources.cpu = 100;
    t.resources.memory_mb = 64;
    t
}

fn oci_task(name: &str, rootfs: &Path, script: &str) -> Task {
    let mut t = Task { name: name.into(), driver: "oci".into(), ..Task::default() };
    t.config.insert("image".into(), json!(rootfs));
    t.config.insert("command".into(), json!("/bin/sh"));
    t.config.insert("args".into(), json!(["-c", script]));
    t.resources.cpu = 100;
    t.resources.memory_mb = 32;
    t
}

/// A busybox rootfs made by the project's script.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-busybox-rootfs");
    let out = std::process::Command::new(script).arg(&rootfs).output().expect("run make-busybox-rootfs");
    assert!(out.status.success(), "make-busybox-rootfs: {}", String::from_utf8_lossy(&out.stderr));
    rootfs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_shutdown_leaves_no_cgroups_or_containers_of_running_or_finished_tasks() {
    require_isolated_host!();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(root.path());
    let client = start(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let running = job("exec-sleep", JobType::Service, vec![exec_task("sleeper", "/bin/sleep", &["600"])], restart_policy(0, 0));
    let running_id = server.place(&running, client.node_id()).await;
    let finished = job("oci-once", JobType::Batch, vec![oci_task("box", &rootfs, "echo done")], restart_policy(0, 0));
    let finished_id = server.place(&finished, client.node_id()).await;

    wait_for("the exec task runs", || task_pid(&client, &running_id, "sleeper")).await;
    assert!(!existing_cgroups(&running_id, "sleeper").is_empty(), "a running exec task has its cgroups");
    let state = wait_for("the oci task finished", || server.task_state(&finished_id, "box").filter(|s| s.state == "dead")).await;
    assert!(!state.failed, "{:?}", state.events);

    // A finished run is cleaned up at once, not only when the alloc is destroyed.
    let container = root.path().join("runc-state").join(format!("{finished_id}.box"));
    wait_until("the finished container is deleted", || !container.exists()).await;
    assert_eq!(existing_cgroups(&finished_id, "box"), Vec::<PathBuf>::new(), "the finished container's cgroups");

    client.shutdown_destroying_allocs().await;
    assert_eq!(existing_cgroups(&running_id, "sleeper"), Vec::<PathBuf>::new(), "the killed exec task's cgroups");
    assert_eq!(existing_cgroups(&finished_id, "box"), Vec::<PathBuf>::new(), "the finished container's cgroups");
    let left: Vec<_> = std::fs::read_dir(root.path().join("runc-state")).map(|d| d.filter_map(Result::ok).collect()).unwrap_or_default();
    assert!(left.is_empty(), "runc still knows containers: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_task_stopped_by_the_servers_or_restarted_leaves_one_cgroup_at_most() {
    require_isolated_host!();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start(root.path(), &server).await;
    wait_ready(&server, &client).await;

    // Exits at once, restarted twice by its policy: every run's cgroup goes with it.
    let flaky = job("exec-flaky", JobType::Service, vec![exec_task("t", "/bin/sh", &["-c", "exit 1"])], restart_policy(2, 10));
    let flaky_id = server.place(&flaky, client.node_id()).await;
    let state = wait_for("the flaky task failed for good", || server.task_state(&flaky_id, "t").filter(|s| s.state == "dead")).await;
    assert_eq!(state.restarts, 2);
    assert_eq!(existing_cgroups(&flaky_id, "t"), Vec::<PathBuf>::new(), "cgroups of a task that is over");

    let j = job("exec-stopped", JobType::Service, vec![exec_task("t", "/bin/sleep", &["600"])], restart_policy(0, 0));
    let id = server.place(&j, client.node_id()).await;
    wait_for("the task runs", || task_pid(&client, &id, "t")).await;
    server.stop_alloc(&id).await;
    wait_for("the task is dead on the server", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    assert_eq!(existing_cgroups(&id, "t"), Vec::<PathBuf>::new(), "cgroups of a stopped task, before any destroy");
    client.shutdown_destroying_allocs().await;
}
