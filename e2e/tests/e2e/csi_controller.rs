//! CSI controller calls end to end: `csi-hostpath` runs as a raw_exec monolith plugin job (a
//! controller and a node) on a dev agent, and `volume create` / `volume delete` go from the CLI
//! through the server, over the client's server-request stream, to the plugin's controller:
//! create makes the volume's directory and registers the volume with the plugin's ID for it;
//! delete removes both.

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
