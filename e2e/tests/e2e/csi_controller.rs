//! CSI controller calls end to end: `csi-hostpath` runs as a raw_exec monolith plugin job (a
//! controller and a node) on a dev agent, and `volume create` / `volume delete` go from the CLI
//! through the server, over the client's server-request stream, to the plugin's controller:
//! create makes the volume's directory and registers the volume with the plugin's ID for it;
//! delete removes both; a claim (made here as a second, stand-in node would, over gRPC) is
//! published by the controller to the claiming node, as the plugin's record shows.

use std::path::Path;

use nomad_e2e::wait_for;

use crate::SETTLE;
use crate::cli::{dev_agent, nomad};

fn plugin_job(plugin: &Path, state: &Path) -> String {
    format!(
        r#"
job "csi-hostpath" {{
  datacenters = ["dc1"]

  group "plugin" {{
    task "plugin" {{
      driver = "raw_exec"

      config {{
        command = {plugin:?}
        args    = ["--nodeid", "e2e-node", "--statedir", {state:?}]
      }}

      csi_plugin {{
        id   = "hostpath"
        type = "monolith"
      }}

      resources {{
        cpu    = 50
        memory = 64
      }}
    }}
  }}
}}
"#,
        plugin = plugin.display().to_string(),
        state = state.display().to_string(),
    )
}

const VOLUME: &str = r#"
id        = "data"
name      = "data"
type      = "csi"
plugin_id = "hostpath"

capacity_min = "1MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#;

#[test]
fn volume_create_and_delete_go_through_the_plugins_controller() {
    let plugin = nomad_e2e::binary().parent().expect("the binary's dir").join("csi-hostpath");
    assert!(plugin.exists(), "{} is missing: build it first with `cargo build --workspace --bins`", plugin.display());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("hostpath-state");
    let agent = dev_agent(dir.path());
    let http = agent.http();
    let job = dir.path().join("plugin.nomad.hcl");
    std::fs::write(&job, plugin_job(&plugin, &state)).unwrap();
    nomad(&agent, &["job", "run", "-detach", job.to_str().unwrap()]).expect(0, "job run");
    wait_for("a healthy controller", SETTLE, || {
        let p = http.get_json("/v1/plugin/csi/hostpath").ok()?;
        (p["ControllersHealthy"] == 1 && p["NodesHealthy"] == 1).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));

    let spec = dir.path().join("data.hcl");
    std::fs::write(&spec, VOLUME).unwrap();
    let created = nomad(&agent, &["volume", "create", spec.to_str().unwrap()]);
    let created = created.expect(0, "volume create");
    let vol = http.get_json("/v1/volume/csi/data").unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let external = vol["ExternalID"].as_str().unwrap().to_string();
    assert!(!external.is_empty(), "the plugin's ID for the volume: {vol}");
    assert!(created.stdout.contains(&format!("Created external volume {external} with ID data")), "{}", created.stdout);
    assert_eq!(vol["Capacity"], 1 << 20, "{vol}");
    assert_eq!(vol["ControllerRequired"], true);
    assert!(state.join("volumes").join(&external).is_dir(), "the controller made the volume's directory");

    nomad(&agent, &["volume", "delete", "data"]).expect(0, "volume delete");
    assert!(http.get_json("/v1/volume/csi/data").is_err(), "deregistered");
    assert!(!state.join("volumes").join(&external).exists(), "the controller removed the volume's directory");
    // Deleting it again: Nomad's error, from the servers, without asking the controller.
    let again = nomad(&agent, &["volume", "delete", "data"]);
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("volume not found: data"), "{}", again.stderr);
}

/// A stand-in node: registered over gRPC with a `hostpath` node plugin whose node ID is
/// `fake-ext`, kept ready by heartbeats until dropped.
struct StandInNode {
    node: nomad_proto::Node,
    rt: tokio::runtime::Runtime,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn channel(rpc: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{rpc}")).unwrap().connect_lazy()
}

impl StandInNode {
    fn register(rpc: &str) -> StandInNode {
        use nomad_proto::csi::{CsiInfo, CsiNodeInfo};
        use nomad_proto::rpc::{NodeClient, NodeRegisterRequest, NodeUpdateStatusRequest};
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let id = uuid::Uuid::new_v4().to_string();
        let mut node = nomad_proto::Node {
            id: id.clone(),
            secret_id: uuid::Uuid::new_v4().to_string(),
            name: "stand-in".into(),
            datacenter: "dc1".into(),
            node_pool: "default".into(),
            ..Default::default()
        };
        for (k, v) in [("kernel.name", "linux"), ("driver.raw_exec", "1"), ("unique.hostname", "stand-in")] {
            node.attributes.insert(k.into(), v.into());
        }
        node.drivers.insert("raw_exec".into(), nomad_proto::node::DriverInfo { detected: true, healthy: true, ..Default::default() });
        node.node_resources = Some(nomad_proto::resources::NodeResources {
            cpu: nomad_proto::resources::NodeCpuResources { cpu_shares: 4000, total_cpu_cores: 4, ..Default::default() },
            memory: nomad_proto::resources::NodeMemoryResources { memory_mb: 4096 },
            disk: nomad_proto::resources::NodeDiskResources { disk_mb: 10_000 },
            min_dynamic_port: 20000,
            max_dynamic_port: 32000,
            ..Default::default()
        });
        let info = CsiNodeInfo { id: "fake-ext".into(), max_volumes: 100, ..Default::default() };
        node.csi_node_plugins.insert(
            "hostpath".into(),
            CsiInfo {
                plugin_id: "hostpath".into(),
                alloc_id: "stand-in-plugin".into(),
                healthy: true,
                health_description: "healthy".into(),
                node_info: Some(info),
                ..Default::default()
            },
        );
        let ch = {
            let _in_runtime = rt.enter();
            channel(rpc)
        };
        rt.block_on(async {
            let mut c = NodeClient::new(ch.clone());
            c.register(NodeRegisterRequest { node: node.clone(), region: "global".into() }).await.expect("register the stand-in node");
        });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (n, s) = (node.clone(), stop.clone());
        rt.spawn(async move {
            let mut c = NodeClient::new(ch);
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                let hb = NodeUpdateStatusRequest {
                    node_id: n.id.clone(),
                    secret_id: n.secret_id.clone(),
                    status: nomad_proto::NodeStatus::Ready,
                    ..Default::default()
                };
                let _ = c.update_status(hb).await;
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        });
        StandInNode { node, rt, stop }
    }
}

impl Drop for StandInNode {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn pinned_job(node_id: &str) -> String {
    format!(
        r#"
job "claimer" {{
  datacenters = ["dc1"]
  constraint {{
    attribute = "${{node.unique.id}}"
    value     = "{node_id}"
  }}
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sleep"
        args    = ["600"]
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#
    )
}

#[test]
fn a_claim_is_published_by_the_plugins_controller_to_the_claiming_node() {
    use nomad_proto::csi::{CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeClaimMode, CsiVolumeClaimState};
    use nomad_proto::rpc::{CsiVolumeClaimRequest, CsiVolumeClient};
    let plugin = nomad_e2e::binary().parent().expect("the binary's dir").join("csi-hostpath");
    assert!(plugin.exists(), "{} is missing: build it first with `cargo build --workspace --bins`", plugin.display());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("hostpath-state");
    let agent = dev_agent(dir.path());
    let http = agent.http();
    let job = dir.path().join("plugin.nomad.hcl");
    std::fs::write(&job, plugin_job(&plugin, &state)).unwrap();
    nomad(&agent, &["job", "run", "-detach", job.to_str().unwrap()]).expect(0, "job run");
    wait_for("a healthy controller", SETTLE, || {
        let p = http.get_json("/v1/plugin/csi/hostpath").ok()?;
        (p["ControllersHealthy"] == 1).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let spec = dir.path().join("data.hcl");
    std::fs::write(&spec, VOLUME).unwrap();
    nomad(&agent, &["volume", "create", spec.to_str().unwrap()]).expect(0, "volume create");
    let external = http.get_json("/v1/volume/csi/data").unwrap()["ExternalID"].as_str().unwrap().to_string();

    // A second node, whose alloc claims the volume: the dev node's controller publishes it.
    let stand_in = StandInNode::register(&agent.rpc_addr);
    let claimer = dir.path().join("claimer.nomad.hcl");
    std::fs::write(&claimer, pinned_job(&stand_in.node.id)).unwrap();
    nomad(&agent, &["job", "run", "-detach", claimer.to_str().unwrap()]).expect(0, "job run claimer");
    let alloc_id = wait_for("the claimer's alloc on the stand-in node", SETTLE, || {
        let allocs = http.get_json("/v1/job/claimer/allocations").ok()?;
        allocs.as_array()?.iter().find(|a| a["NodeID"] == stand_in.node.id.as_str()).map(|a| a["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let claim = CsiVolumeClaimRequest {
        volume_id: "data".into(),
        allocation_id: alloc_id.clone(),
        node_id: stand_in.node.id.clone(),
        secret_id: stand_in.node.secret_id.clone(),
        claim: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        state: CsiVolumeClaimState::Taken,
        namespace: "default".into(),
        ..Default::default()
    };
    let claimed = stand_in
        .rt
        .block_on(async { CsiVolumeClient::new(channel(&agent.rpc_addr)).claim(claim).await })
        .unwrap_or_else(|e| panic!("claim: {e:?}\n{}", agent.logs()))
        .into_inner();
    assert!(claimed.volume.is_some_and(|v| v.write_allocs.contains(&alloc_id)));
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(state.join("state.json")).unwrap()).unwrap();
    let published = record["published"].as_array().unwrap();
    assert!(
        published.iter().any(|p| p["volume_id"] == external.as_str() && p["node_id"] == "fake-ext" && p["readonly"] == false),
        "the controller published the volume to the stand-in node's plugin ID: {record}"
    );
    let vol = http.get_json("/v1/volume/csi/data").unwrap();
    assert!(vol["WriteAllocs"].as_object().is_some_and(|w| w.contains_key(&alloc_id)), "{vol}");
}
