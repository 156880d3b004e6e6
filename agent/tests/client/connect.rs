//! A Connect sidecar on real Envoy, started by the client: a bridge-mode group whose
//! `connect-proxy` task (the kind set directly in the job, as the servers' mutator will inject
//! it) runs the host's Envoy under the exec driver with Nomad's injected arguments. The client
//! writes its bootstrap (`envoy_bootstrap`), proxies `alloc/tmp/consul_grpc.sock` to the Consul
//! stand-in's xDS port (`consul_grpc_socket`), and Envoy takes its configuration from there with
//! its SI token. An agent restart keeps Envoy (same PID) and serves the socket again, and Envoy
//! reconnects; stopping the alloc removes the socket and the namespace.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nomad_agent::client::Client;
use nomad_agent::config::consul::ConsulSettings;
use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_proto::job::JobType;
use nomad_proto::resources::NetworkResource;
use nomad_proto::service::{ConsulConnect, ConsulSidecarService, Service};
use nomad_proto::{ClientStatus, Job, Task, TaskLifecycle};
use nomad_testkit::Prereq;
use serde_json::json;

use crate::support::{TestServer, client_config, drivers, job, pid_alive, restart_policy, sh_task, task_pid, wait_ready, wait_until};

const ROOT: &str = "root-token";
const ENVOY: &str = "/usr/local/bin/envoy";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn settings(consul: &ConsulStandIn) -> ConsulSettings {
    ConsulSettings { address: consul.addr().to_string(), token: ROOT.into(), timeout: Duration::from_secs(5), ..ConsulSettings::default() }
}

/// The test's own bridge and subnet (nothing shared with another test), removed on drop with
/// the alloc's namespace if a failed run left them.
struct Bridge {
    name: String,
    subnet: String,
    alloc_id: Option<String>,
}

impl Bridge {
    /// The `n`th of this test process.
    fn new(n: u32) -> Bridge {
        let pid = std::process::id();
        Bridge {
            name: format!("nrscn{}{n}", pid % 100_000),
            subnet: format!("10.{}.{}.0/24", 100 + 25 * n + (pid / 256) % 25, pid % 256),
            alloc_id: None,
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(id) = &self.alloc_id {
            let ns = Path::new("/var/run/netns").join(id);
            let _ = nix::mount::umount2(&ns, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&ns);
        }
        let _ = Command::new("iptables")
            .args(["-w", "-t", "filter", "-D", "NOMAD-ADMIN", "-o", &self.name, "-d", &self.subnet, "-j", "ACCEPT"])
            .output();
        let _ = Command::new("ip").args(["link", "del", &self.name]).output();
    }
}

/// Group `g` in bridge mode with service `count-api` (a sidecar) and two tasks: the app, and
/// the sidecar as Nomad's mutator injects it, but with `driver` (exec or raw_exec) running the
/// host's Envoy, as `sidecar_task` makes it.
fn connect_job(driver: &str) -> Job {
    let app = sh_task("app", "while true; do sleep 0.1; done");
    let mut sidecar =
        Task { name: "connect-proxy-count-api".into(), driver: driver.into(), kind: "connect-proxy:count-api".into(), ..Task::default() };
    sidecar.config.insert("command".into(), json!(ENVOY));
    sidecar.config.insert(
        "args".into(),
        json!([
            "-c",
            "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json",
            "-l",
            "${meta.connect.log_level}",
            "--concurrency",
            "${meta.connect.proxy_concurrency}",
            "--disable-hot-restart"
        ]),
    );
    sidecar.resources.cpu = 250;
    sidecar.resources.memory_mb = 256;
    sidecar.lifecycle = Some(TaskLifecycle { hook: "prestart".into(), sidecar: true });
    let mut j = job("count", JobType::Service, vec![app, sidecar], restart_policy(0, 0));
    let g = &mut j.task_groups[0];
    g.networks = vec![NetworkResource { mode: "bridge".into(), ..NetworkResource::default() }];
    g.services = vec![Service {
        name: "count-api".into(),
        provider: "nomad".into(),
        port_label: "9001".into(),
        connect: Some(ConsulConnect { sidecar_service: Some(ConsulSidecarService::default()), ..ConsulConnect::default() }),
        ..Service::default()
    }];
    j.canonicalize();
    j
}

/// The sidecar's registration, as the client's Consul services sync makes it.
fn register_sidecar(consul: &ConsulStandIn, alloc: &str) {
    let body = json!({"Name": "count-api", "ID": format!("_nomad-task-{alloc}-group-g-count-api-9001"), "Port": 9001,
        "Address": "127.0.0.1", "Connect": {"SidecarService": {"Port": 21000, "Proxy": {"Config": {
            "envoy_stats_tags": [format!("nomad.alloc_id={alloc}")]}}}}});
    let r = nomad_e2e::http::HttpClient::new(&consul.addr().to_string())
        .request("PUT", &format!("/v1/agent/service/register?token={ROOT}"), Some(body.to_string().as_bytes()))
        .expect("the stand-in answers");
    assert_eq!(r.status, 200, "{}", r.text());
}

async fn start(root: &Path, server: &TestServer, consul: &ConsulStandIn, bridge: &Bridge) -> Client {
    let mut config = client_config(root, vec![server.addr()]);
    config.consul = Some(settings(consul));
    config.settings.cni.bridge_name = bridge.name.clone();
    config.settings.cni.bridge_subnet = bridge.subnet.clone();
    // The test registers the sidecar itself; the services sync must not take it for a leftover.
    config.consul_deregister_probation = Duration::from_secs(3600);
    let client = Client::start(config, drivers()).await.expect("client starts");
    wait_ready(server, &client).await;
    client
}

fn environ(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

fn log_of(root: &Path, alloc: &str) -> String {
    let logs = root.join("alloc").join(alloc).join("alloc/logs");
    ["connect-proxy-count-api.stderr.0", "connect-proxy-count-api.stdout.0"]
        .iter()
        .map(|f| std::fs::read_to_string(logs.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_envoy_sidecar_takes_its_config_from_consuls_xds_through_the_alloc_socket_across_an_agent_restart() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Envoy);
    envoy_sidecar_through_the_alloc_socket("exec").await;
}

/// raw_exec runs in its task dir, which holds no `alloc/`: its bootstrap names the socket's
/// host path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_exec_envoy_sidecar_reaches_consuls_xds_through_the_sockets_host_path() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Envoy);
    envoy_sidecar_through_the_alloc_socket("raw_exec").await;
}

async fn envoy_sidecar_through_the_alloc_socket(driver: &str) {
    assert!(Path::new(ENVOY).is_file(), "{ENVOY} missing: scripts/install-deps copies Envoy there for exec tasks");
    let consul = ConsulStandIn::start(ConsulOptions { management_token: Some(ROOT.into()), grpc_port: 0, ..Default::default() }).unwrap();
    let server = TestServer::start_with_consul(&settings(&consul)).await;
    let root = tempfile::tempdir().unwrap();
    let mut bridge = Bridge::new(if driver == "exec" { 0 } else { 1 });
    let client = start(root.path(), &server, &consul, &bridge).await;
    let node = client.node();
    assert_eq!(node.meta["connect.sidecar_image"], "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}");
    assert_eq!(node.attributes["consul.grpc"], consul.grpc_addr().unwrap().port().to_string());

    let id = server.place(&connect_job(driver), client.node_id()).await;
    bridge.alloc_id = Some(id.clone());
    register_sidecar(&consul, &id);
    let proxy_id = format!("_nomad-task-{id}-group-g-count-api-9001-sidecar-proxy");
    wait_until("Envoy runs", || task_pid(&client, &id, "connect-proxy-count-api").is_some()).await;
    let pid = task_pid(&client, &id, "connect-proxy-count-api").unwrap();

    // Envoy (as nobody, in the alloc's namespace) reached the stand-in's xDS through the socket
    // and ACKed its clusters and listeners.
    let configured = || {
        let acked = consul.xds_acked(&proxy_id);
        acked.contains(CLUSTER_TYPE) && acked.contains(LISTENER_TYPE)
    };
    wait_until("Envoy ACKs its clusters and listeners", configured).await;
    assert!(consul.xds_nacks().is_empty(), "{:?}\n{}", consul.xds_nacks(), log_of(root.path(), &id));
    let env = environ(pid);
    assert!(env.contains(&"NOMAD_ENVOY_ADMIN_ADDR_count_api=127.0.0.2:19001".to_string()), "{env:?}");
    assert!(env.contains(&"NOMAD_ENVOY_READY_ADDR_count_api=127.0.0.1:19101".to_string()), "{env:?}");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    assert!(args.windows(2).any(|w| w == ["-l", "info"]), "node meta connect.log_level: {args:?}");
    assert!(args.windows(2).any(|w| w == ["--concurrency", "1"]), "{args:?}");
    let netns = PathBuf::from("/var/run/netns").join(&id);
    let ino = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).ok();
    assert_eq!(ino(Path::new(&format!("/proc/{pid}/ns/net"))), ino(&netns), "Envoy is in the alloc's namespace");
    let bootstrap_path = root.path().join("alloc").join(&id).join("connect-proxy-count-api/secrets/envoy_bootstrap.json");
    let bootstrap = std::fs::read(&bootstrap_path).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&bootstrap).unwrap();
    let si_token = std::fs::read_to_string(root.path().join("alloc").join(&id).join("connect-proxy-count-api/secrets/si_token")).unwrap();
    assert_eq!(b["dynamic_resources"]["ads_config"]["grpc_services"]["initial_metadata"][0]["value"], si_token.as_str());
    let pipe =
        b["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["pipe"]["path"]
            .as_str()
            .unwrap()
            .to_string();
    let socket = root.path().join("alloc").join(&id).join("alloc/tmp/consul_grpc.sock");
    assert_eq!(pipe, if driver == "raw_exec" { socket.display().to_string() } else { "alloc/tmp/consul_grpc.sock".to_string() });
    let streams = consul.xds_streams().iter().filter(|p| **p == proxy_id).count();

    // The agent restarts: Envoy keeps running; its stream to Consul went with the old agent's
    // socket proxy, and it reconnects to the socket the new agent serves.
    client.shutdown().await;
    drop(client);
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "Envoy outlives its agent");
    let client = start(root.path(), &server, &consul, &bridge).await;
    wait_until("Envoy reattached", || task_pid(&client, &id, "connect-proxy-count-api").is_some()).await;
    assert_eq!(task_pid(&client, &id, "connect-proxy-count-api"), Some(pid), "the same Envoy");
    wait_until("Envoy opened a new xDS stream through the new socket", || {
        consul.xds_streams().iter().filter(|p| **p == proxy_id).count() > streams
    })
    .await;
    assert_eq!(std::fs::read(&bootstrap_path).unwrap(), bootstrap, "the bootstrap it runs with is left as it is");

    // Stop: the socket and the namespace go.
    server.stop_alloc(&id).await;
    wait_until("the client finished the alloc", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Complete)).await;
    wait_until("the socket is removed", || !socket.exists()).await;
    wait_until("the namespace is removed", || !netns.exists()).await;
    wait_until("Envoy is gone", || !pid_alive(pid)).await;
    client.shutdown().await;
}

/// Removes the test's image tag whatever happens.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "--force", &self.0]).output();
    }
}

/// The default injection's image: `${meta.connect.sidecar_image}` from the node, whose
/// `${NOMAD_envoy_version}` the `envoy_version` hook turns into Consul's preferred version
/// (the stand-in's first, 1.26.4) before the docker driver creates the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_sidecars_image_gets_the_envoy_version_consul_prefers() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Docker, Prereq::Busybox);
    let repo = format!("nomad-rs-test/envoy-version-{}", std::process::id());
    let image = Image(format!("{repo}:v1.26.4"));
    let rootfs = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-busybox-rootfs");
    let made = Command::new("bash").arg(script).arg(rootfs.path().join("r")).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let import = Command::new("sh")
        .arg("-c")
        .arg(format!("tar -C {} -c . | docker import - {}", rootfs.path().join("r").display(), image.0))
        .output()
        .unwrap();
    assert!(import.status.success(), "{}", String::from_utf8_lossy(&import.stderr));

    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let mut config = client_config(root.path(), vec![server.addr()]);
    config.consul = Some(ConsulSettings { address: consul.addr().to_string(), ..ConsulSettings::default() });
    config.consul_deregister_probation = Duration::from_secs(3600);
    config.settings.meta.insert("connect.sidecar_image".into(), format!("{repo}:v${{NOMAD_envoy_version}}"));
    let client = Client::start(config, drivers()).await.expect("client starts");
    wait_ready(&server, &client).await;

    let mut sidecar =
        Task { name: "connect-proxy-count-api".into(), driver: "docker".into(), kind: "connect-proxy:count-api".into(), ..Task::default() };
    sidecar.config.insert("image".into(), json!("${meta.connect.sidecar_image}"));
    sidecar.config.insert("command".into(), json!("sleep"));
    sidecar.config.insert("args".into(), json!(["300"]));
    sidecar.resources.cpu = 100;
    sidecar.resources.memory_mb = 64;
    let mut j = job("count", JobType::Service, vec![sidecar], restart_policy(0, 0));
    j.task_groups[0].services = vec![Service {
        name: "count-api".into(),
        provider: "nomad".into(),
        port_label: "9001".into(),
        connect: Some(ConsulConnect { sidecar_service: Some(ConsulSidecarService::default()), ..ConsulConnect::default() }),
        ..Service::default()
    }];
    j.canonicalize();
    let id = server.place(&j, client.node_id()).await;
    let body = json!({"Name": "count-api", "ID": format!("_nomad-task-{id}-group-g-count-api-9001"), "Port": 9001,
        "Connect": {"SidecarService": {}}});
    let r = nomad_e2e::http::HttpClient::new(&consul.addr().to_string())
        .request("PUT", "/v1/agent/service/register", Some(body.to_string().as_bytes()))
        .unwrap();
    assert_eq!(r.status, 200);

    wait_until("the sidecar's container runs", || task_pid(&client, &id, "connect-proxy-count-api").is_some()).await;
    let handle = client.alloc_runner(&id).unwrap().task("connect-proxy-count-api").unwrap().handle().unwrap();
    let container = match &handle.driver_state {
        nomad_agent::client::driver::DriverState::Docker { container_id, .. } => container_id.clone(),
        other => panic!("not a docker handle: {other:?}"),
    };
    let inspect = Command::new("docker").args(["inspect", "-f", "{{.Config.Image}}", &container]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), image.0);
    server.stop_alloc(&id).await;
    wait_until("the client finished the alloc", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Complete)).await;
    client.shutdown().await;
}
