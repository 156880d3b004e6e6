//! A CSI plugin run as a job: the workspace's `csi-hostpath` as a raw_exec monolith task. The
//! plugin supervisor finds it ready and registers it, the client's CSI manager fingerprints it
//! into the node, and the servers' plugin table shows one healthy controller and one healthy
//! node; stopping the job takes the plugin away again.
//!
//! And the same plugin as an `exec` task, in its own chroot: what it mounts under its
//! `stage_publish_base_dir` reaches the host through the bidirectional bind, so an exec
//! consumer's writes land in the volume on the plugin's storage.

use std::path::Path;

use nomad_e2e::{Cluster, ClusterOptions, wait_for};
use nomad_testkit::prereq::{self, Prereq};
use serde_json::Value;

use crate::SETTLE;
use crate::cli::{dev_agent, nomad};
use crate::csi_volume::{alloc_with_status_at, allocs, consumer_job_in, hostpath_binary, logs, no_claims, run_job, volume_at_when};

fn job(plugin: &std::path::Path) -> String {
    format!(
        r#"
job "csi-hostpath" {{
  datacenters = ["dc1"]

  group "plugin" {{
    task "plugin" {{
      driver = "raw_exec"

      config {{
        command = {plugin:?}
        args    = ["--nodeid", "e2e-node", "--statedir", "${{NOMAD_TASK_DIR}}/state"]
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
"#
    )
}

#[test]
fn a_plugin_job_becomes_a_healthy_csi_plugin_and_goes_with_the_job() {
    let plugin = hostpath_binary();
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(dir.path());
    let http = agent.http();
    let file = dir.path().join("plugin.nomad.hcl");
    std::fs::write(&file, job(&plugin)).unwrap();
    nomad(&agent, &["job", "run", "-detach", file.to_str().unwrap()]).expect(0, "job run");

    let healthy = wait_for("the plugin to have a healthy controller and node", SETTLE, || {
        let p = http.get_json("/v1/plugin/csi/hostpath").ok()?;
        (p["ControllersHealthy"] == 1 && p["NodesHealthy"] == 1).then_some(p)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert_eq!(healthy["Provider"], "hostpath.csi.k8s.io");
    assert_eq!(healthy["ControllerRequired"], true);
    let node_id = http.get_json("/v1/nodes").unwrap()[0]["ID"].as_str().unwrap().to_string();
    let instance = &healthy["Nodes"][&node_id];
    assert_eq!(instance["NodeInfo"]["ID"], "e2e-node", "NodeGetInfo's node ID: {healthy}");
    assert_eq!(instance["HealthDescription"], "healthy");
    assert_eq!(healthy["Controllers"][&node_id]["ControllerInfo"]["SupportsAttachDetach"], true, "{healthy}");

    // The task's events say so in Nomad's words.
    let allocs = http.get_json("/v1/job/csi-hostpath/allocations").unwrap();
    let alloc_id = allocs[0]["ID"].as_str().unwrap().to_string();
    let alloc = http.get_json(&format!("/v1/allocation/{alloc_id}")).unwrap();
    let events: &Vec<Value> = alloc["TaskStates"]["plugin"]["Events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["Type"] == "Plugin became healthy" && e["Message"] == "plugin: hostpath"), "{events:?}");
    nomad(&agent, &["job", "stop", "-detach", "csi-hostpath"]).expect(0, "job stop");
    wait_for("the plugin to be gone", SETTLE, || http.get_json("/v1/plugin/csi/hostpath").is_err().then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let plugins = http.get_json("/v1/plugins?type=csi").unwrap();
    assert_eq!(plugins.as_array().map(Vec::len), Some(0), "{plugins}");
}

/// Where the exec plugin's binary is in its chroot.
const PLUGIN_IN_CHROOT: &str = "/opt/csi/csi-hostpath";

/// `csi-hostpath` as an `exec` monolith plugin, run as root (it mounts), keeping its volumes
/// in the alloc's shared dir.
const EXEC_PLUGIN_JOB: &str = r#"
job "csi-plugin" {
  datacenters = ["dc1"]

  group "plugin" {
    task "plugin" {
      driver = "exec"
      user   = "root"

      config {
        command = "/opt/csi/csi-hostpath"
        args    = ["--nodeid", "${node.unique.name}", "--statedir", "/alloc/hostpath"]
      }

      csi_plugin {
        id   = "hostpath"
        type = "monolith"
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"#;

const VOLUME: &str = r#"
id        = "data"
name      = "data"
type      = "csi"
plugin_id = "hostpath"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#;

/// Whether `path` is a mount point in this (the host's) mount namespace.
fn is_mount_point(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).any(|m| Path::new(m) == path)
}

#[test]
fn an_exec_plugin_stages_and_publishes_through_its_bidirectional_mount_for_an_exec_consumer() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    // The exec chroot: the default host dirs, and the plugin's binary; root may run tasks.
    let chroot: String = ["/bin", "/lib", "/lib64", "/usr", "/etc", "/sbin"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| format!("    {p:?} = {p:?}\n"))
        .chain([format!("    {:?} = {PLUGIN_IN_CHROOT:?}\n", hostpath_binary().display().to_string())])
        .collect();
    let client_config = format!("  options = {{\n    \"user.denylist\" = \"\"\n  }}\n  chroot_env = {{\n{chroot}  }}\n");
    let cluster = Cluster::start(ClusterOptions { servers: 1, clients: 1, client_config, ..Default::default() }).expect("cluster");
    let server = &cluster.servers[0];
    let http = server.http();
    let dir = tempfile::tempdir().unwrap();
    run_job(server, dir.path(), "plugin", EXEC_PLUGIN_JOB);
    wait_for("a healthy exec plugin", SETTLE, || {
        let p = http.get_json("/v1/plugin/csi/hostpath").ok()?;
        (p["ControllersHealthy"] == 1 && p["NodesHealthy"] == 1).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    let plugin_alloc = allocs(&http, "csi-plugin")[0]["ID"].as_str().unwrap().to_string();
    let client = &cluster.clients[0];
    let storage = client.data_dir().join("alloc").join(&plugin_alloc).join("alloc/hostpath");

    // Created through the plugin's controller, in its chroot: on the host, under its alloc.
    let spec = dir.path().join("data.hcl");
    std::fs::write(&spec, VOLUME).unwrap();
    nomad(server, &["volume", "create", spec.to_str().unwrap()]).expect(0, "volume create");
    let external = http.get_json("/v1/volume/csi/data").unwrap()["ExternalID"].as_str().unwrap().to_string();
    let volume_dir = storage.join("volumes").join(&external);
    assert!(volume_dir.is_dir(), "{} on the host", volume_dir.display());
    // The consumer runs as nobody.
    std::fs::set_permissions(&volume_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    let script = "echo written > /data/out.txt; exec sleep 600";
    run_job(server, dir.path(), "writer", &consumer_job_in("default", "writer", "client1", "service", "data", script));
    let writer = alloc_with_status_at(&cluster, "/v1/job/writer/allocations", "running");
    let writer_id = writer["ID"].as_str().unwrap();
    // The plugin's publish, made in its own mount namespace, is a mount on the host too: the
    // consumer bound it, and its write is in the volume on the plugin's storage.
    let target =
        client.data_dir().join("client/csi/monolith/hostpath/per-alloc").join(writer_id).join("data/rw-file-system-single-node-writer");
    assert!(is_mount_point(&target), "{} is a mount on the host", target.display());
    wait_for("the consumer's write in the plugin's storage", SETTLE, || {
        std::fs::read_to_string(volume_dir.join("out.txt")).ok().filter(|s| s.trim() == "written")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));

    // The plugin's unpublish and unstage reach the host the same way.
    nomad(server, &["job", "stop", "-detach", "writer"]).expect(0, "job stop writer");
    volume_at_when(&cluster, "/v1/volume/csi/data", "the writer's claim released", no_claims);
    let staging = client.data_dir().join("client/csi/monolith/hostpath/staging/default/data/rw-file-system-single-node-writer");
    wait_for("the publish and staging mounts to be gone from the host", SETTLE, || {
        (!is_mount_point(&target) && !is_mount_point(&staging)).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    assert_eq!(std::fs::read_to_string(volume_dir.join("out.txt")).unwrap().trim(), "written", "the data stays on the storage");
}
