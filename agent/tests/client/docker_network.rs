//! A group network with a docker task, through the alloc runner's `network` hook on the real
//! Engine: its namespace is the docker driver's infra container, mounted at the alloc's path,
//! shared by the group's other tasks and removed with the alloc; a missing infra image fails the
//! alloc with an event naming it.

use std::path::{Path, PathBuf};

use nomad_agent::client::Client;
use nomad_agent::client::driver::docker::DockerOptions;
use nomad_agent::client::driver::{DriverOptions, DriverRegistry};
use nomad_proto::Task;
use nomad_proto::alloc::task_state;
use nomad_proto::job::JobType;
use nomad_proto::resources::NetworkResource;
use nomad_testkit::Prereq;
use serde_json::json;

use crate::support::{TestServer, client_config, executor_path, job, restart_policy, sh_task, task_pid, wait_for, wait_ready, wait_until};

async fn docker_client(root: &Path, server: &TestServer, infra_image: &str) -> Client {
    let docker = DockerOptions { infra_image: infra_image.to_string(), dangling_enabled: false, ..DockerOptions::default() };
    let drivers = DriverRegistry::new(&DriverOptions { executor_path: executor_path(), docker, ..DriverOptions::new(true) });
    Client::start(client_config(root, vec![server.addr()]), drivers).await.expect("client starts")
}

fn docker_task(name: &str, image: &str) -> Task {
    let mut t = Task { name: name.into(), driver: "docker".into(), ..Task::default() };
    t.config.insert("image".into(), json!(image));
    t.config.insert("command".into(), json!("sleep"));
    t.config.insert("args".into(), json!(["300"]));
    t.resources.cpu = 100;
    t.resources.memory_mb = 64;
    t
}

/// IDs of the containers (running or not) labelled with the alloc ID.
fn containers_of(alloc_id: &str) -> Vec<String> {
    let filter = format!("label=com.hashicorp.nomad.alloc_id={alloc_id}");
    let out = std::process::Command::new("docker").args(["ps", "-aq", "--filter", &filter]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Removes the alloc's containers and namespace whatever happened.
struct Leftovers(String);
impl Drop for Leftovers {
    fn drop(&mut self) {
        for c in containers_of(&self.0) {
            let _ = std::process::Command::new("docker").args(["rm", "-f", &c]).output();
        }
        let ns = Path::new("/var/run/netns").join(&self.0);
        let _ = nix::mount::umount2(&ns, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&ns);
    }
}

fn netns_inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// `mode = "none"` takes the same path as bridge without CNI: the docker task and the raw_exec
/// task run in the infra container's namespace, which goes with the alloc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_network_with_a_docker_task_is_its_infra_containers_namespace_shared_and_removed_with_the_alloc() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Docker, Prereq::Busybox);
    let (busybox, pause) =
        tokio::task::spawn_blocking(|| (nomad_testkit::docker::busybox_image(), nomad_testkit::docker::pause_image())).await.unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = docker_client(root.path(), &server, pause).await;
    wait_ready(&server, &client).await;
    let mut j = job("isolated", JobType::Service, vec![docker_task("web", busybox), sh_task("side", "sleep 300")], restart_policy(0, 0));
    j.task_groups[0].networks = vec![NetworkResource { mode: "none".into(), ..NetworkResource::default() }];
    let id = server.place(&j, client.node_id()).await;
    let _leftovers = Leftovers(id.clone());
    let web = wait_for("the docker task runs", || task_pid(&client, &id, "web")).await;
    let side = wait_for("the raw_exec task runs", || task_pid(&client, &id, "side")).await;

    let netns = PathBuf::from("/var/run/netns").join(&id);
    let ns = |pid: i32| netns_inode(&PathBuf::from(format!("/proc/{pid}/ns/net")));
    assert_eq!(ns(web), netns_inode(&netns), "the docker task is in the alloc's namespace");
    assert_eq!(ns(side), netns_inode(&netns), "so is the raw_exec task");
    assert_ne!(ns(web), netns_inode(Path::new("/proc/self/ns/net")));
    assert_eq!(containers_of(&id).len(), 2, "the infra container and the task's");

    client.shutdown_destroying_allocs().await;
    assert!(!netns.exists(), "the namespace is removed");
    assert_eq!(containers_of(&id), Vec::<String>::new(), "no container is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_infra_image_fails_the_alloc_with_an_event_naming_it() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Docker, Prereq::Busybox);
    let busybox = tokio::task::spawn_blocking(nomad_testkit::docker::busybox_image).await.unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let absent = format!("nomad-rs-test/absent-pause:{}", uuid::Uuid::new_v4());
    let client = docker_client(root.path(), &server, &absent).await;
    wait_ready(&server, &client).await;
    let mut j = job("no-infra", JobType::Service, vec![docker_task("web", busybox)], restart_policy(0, 0));
    j.task_groups[0].networks = vec![NetworkResource { mode: "none".into(), ..NetworkResource::default() }];
    let id = server.place(&j, client.node_id()).await;
    let _leftovers = Leftovers(id.clone());
    let state = wait_for("the task to fail", || server.task_state(&id, "web").filter(|s| s.state == task_state::DEAD)).await;
    assert!(state.failed, "{state:?}");
    let event = state.events.iter().find(|e| e.event_type == "Setup Failure").expect("a setup failure event");
    let expected = format!(
        "failed to setup alloc: failed to create network for alloc: Failed to pull `{absent}`: image not found locally and no registry reachable"
    );
    assert!(event.display_message.starts_with(&expected), "{}", event.display_message);
    wait_until("the alloc's network is cleaned up", || !Path::new("/var/run/netns").join(&id).exists()).await;
    assert_eq!(containers_of(&id), Vec::<String>::new());
    client.shutdown_destroying_allocs().await;
}
