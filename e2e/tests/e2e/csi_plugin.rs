//! A CSI plugin run as a job: the workspace's `csi-hostpath` as a raw_exec monolith task. The
//! plugin supervisor finds it ready and registers it, the client's CSI manager fingerprints it
//! into the node, and the servers' plugin table shows one healthy controller and one healthy
//! node; stopping the job takes the plugin away again.

use std::path::PathBuf;

use nomad_e2e::wait_for;
use serde_json::Value;

use crate::SETTLE;
use crate::cli::{dev_agent, nomad};

/// `csi-hostpath`, built beside the `nomad-rs` binary by `cargo build --workspace --bins`.
fn hostpath_binary() -> PathBuf {
    let bin = nomad_e2e::binary().parent().expect("the binary's dir").join("csi-hostpath");
    assert!(bin.exists(), "{} is missing: build it first with `cargo build --workspace --bins`", bin.display());
    bin
}

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
