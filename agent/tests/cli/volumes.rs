//! `volume` and `plugin` commands against an in-process server whose node runs a CSI node
//! plugin (as its fingerprint reports it).

use nomad_proto::csi::{CsiInfo, CsiNodeInfo, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeClaim, CsiVolumeClaimMode};
use nomad_proto::{Allocation, ClientStatus, DesiredStatus};
use nomad_server::consensus::Consensus;
use nomad_server::fsm::{Command, PlanApply};
use nomad_server::testing;

use crate::support::{Api, nomad_with};

const NODE: &str = "4e0d0001-aaaa-bbbb-cccc-000000000001";

const HCL_SPEC: &str = r#"
id           = "vol1"
name         = "database"
type         = "csi"
plugin_id    = "hostpath"
external_id  = "ext-vol1"
capacity_min = "10GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}

secrets {
  password = "hunter2"
}

parameters {
  skuname = "Premium_LRS"
}
"#;

const JSON_SPEC: &str = r#"{
  "id": "vol2", "name": "logs", "type": "csi", "plugin_id": "hostpath",
  "capability": [{"access_mode": "multi-node-reader-only", "attachment_mode": "file-system"}],
  "context": {"endpoint": "http://10.0.0.1:9425"}
}"#;

/// A server with a node running a healthy `hostpath` node plugin.
async fn server() -> Api {
    server_calling(testing::RecordingClientCsi::new()).await
}

/// [`server`], its calls to clients going to `calls`.
async fn server_calling(calls: std::sync::Arc<testing::RecordingClientCsi>) -> Api {
    let api = Api::serving(testing::TestServer::new().with_client_csi(calls)).await;
    let mut n = testing::node(NODE);
    n.csi_node_plugins.insert(
        "hostpath".into(),
        CsiInfo {
            plugin_id: "hostpath".into(),
            alloc_id: "plugin-alloc".into(),
            healthy: true,
            health_description: "healthy".into(),
            provider: "hostpath.csi.k8s.io".into(),
            provider_version: "1.11.0".into(),
            node_info: Some(CsiNodeInfo {
                id: "ext-n1".into(),
                max_volumes: 10,
                requires_node_stage_volume: true,
                ..CsiNodeInfo::default()
            }),
            ..CsiInfo::default()
        },
    );
    api.server.register_node(n).await;
    api
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A running alloc of a job on the node, claiming `volume` for writing.
async fn claim(api: &Api, volume: &str, alloc_id: &str) {
    let mut j = testing::job("db", 1);
    j.task_groups[0].volumes.insert(
        "data".into(),
        nomad_proto::VolumeRequest { name: "data".into(), volume_type: "csi".into(), source: volume.into(), ..Default::default() },
    );
    j.canonicalize();
    let alloc = Allocation {
        id: alloc_id.into(),
        namespace: "default".into(),
        job_id: "db".into(),
        task_group: j.task_groups[0].name.clone(),
        node_id: NODE.into(),
        name: "db.web[0]".into(),
        desired_status: DesiredStatus::Run,
        client_status: ClientStatus::Running,
        ..Allocation::default()
    };
    api.server
        .consensus
        .apply(Command::PlanApply(PlanApply { job: Some(j), allocs_upserted: vec![alloc], ..PlanApply::default() }))
        .await
        .unwrap();
    let claim = CsiVolumeClaim {
        allocation_id: alloc_id.into(),
        node_id: NODE.into(),
        mode: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        ..CsiVolumeClaim::default()
    };
    api.server.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: volume.into(), claim }).await.unwrap();
}

#[tokio::test]
async fn volumes_register_from_hcl_and_json_and_show_in_status() {
    let api = server().await;
    let dir = tempfile::tempdir().unwrap();
    let hcl = write(&dir, "vol1.hcl", HCL_SPEC);
    let json = write(&dir, "vol2.json", JSON_SPEC);
    api.nomad(&["volume", "register", &hcl]).await.expect_code(0).stdout_has("Volume \"vol1\" registered");
    api.nomad(&["volume", "register", &json]).await.expect_code(0).stdout_has("Volume \"vol2\" registered");

    let snap = api.server.store.snapshot();
    let v1 = snap.csi_volume("default", "vol1").expect("vol1 stored");
    assert_eq!(v1.secrets["password"], "hunter2", "secrets reach the servers");
    assert_eq!(v1.requested_capacity_min, 10 << 30);
    assert_eq!(v1.parameters["skuname"], "Premium_LRS");
    let v2 = snap.csi_volume("default", "vol2").expect("vol2 stored");
    assert_eq!(v2.context["endpoint"], "http://10.0.0.1:9425");
    assert_eq!(v2.requested_capabilities[0].access_mode, CsiVolumeAccessMode::MultiNodeReader);

    api.nomad(&["volume", "status"])
        .await
        .expect_code(0)
        .stdout_has("Container Storage Interface\nID    Name      Namespace  Plugin ID  Schedulable  Access Mode\n")
        .stdout_has("vol1  database  default    hostpath   true\nvol2  logs      default    hostpath   true");

    claim(&api, "vol1", "a1b2c3d4-0000-0000-0000-000000000001").await;
    let detail = api.nomad(&["volume", "status", "vol1"]).await;
    detail
        .expect_code(0)
        .stdout_has("ID                   = vol1\nName                 = database\nNamespace            = default\n")
        .stdout_has("External ID          = ext-vol1\nPlugin ID            = hostpath\nProvider             = hostpath.csi.k8s.io\n")
        .stdout_has("Version              = 1.11.0\nSchedulable          = true\n")
        .stdout_has("Nodes Healthy        = 1\nNodes Expected       = 0\n")
        .stdout_has("Access Mode          = single-node-writer\nAttachment Mode      = file-system\n")
        .stdout_has("Mount Options        = fs_type: ext4 flags: [REDACTED]\n")
        .stdout_has("\nAllocations\nID        Node ID   Task Group  Version  Desired  Status   Created  Modified\na1b2c3d4  4e0d0001");
    assert!(!detail.stdout.contains("hunter2") && !detail.stdout.contains("noatime"), "{}", detail.stdout);
    let short = api.nomad(&["volume", "status", "-short", "vol1"]).await;
    assert!(short.expect_code(0).stdout.trim_end().ends_with("Mount Options        = fs_type: ext4 flags: [REDACTED]"), "{}", short.stdout);

    let one = api.nomad(&["volume", "status", "-json", "vol2"]).await;
    let v: serde_json::Value = serde_json::from_str(&one.expect_code(0).stdout).unwrap();
    assert_eq!((v["ID"].as_str(), v["Secrets"].is_null()), (Some("vol2"), true));
    let all = api.nomad(&["volume", "status", "-json"]).await;
    let v: serde_json::Value = serde_json::from_str(&all.expect_code(0).stdout).unwrap();
    let ids: Vec<&str> = v.as_array().unwrap().iter().map(|v| v["ID"].as_str().unwrap()).collect();
    assert_eq!(ids, ["vol1", "vol2"]);
    assert_eq!(v[0]["CurrentWriters"], 1);

    api.nomad(&["volume", "status", "vol"])
        .await
        .expect_code(1)
        .stderr_has("Prefix matched multiple volumes\n\nID    Name      Namespace  Plugin ID  Schedulable  Access Mode\nvol1");
    api.nomad(&["volume", "status", "nope"]).await.expect_code(1).stderr_has("No volumes(s) with prefix or ID \"nope\" found");
    api.nomad(&["volume", "status", "-t", "{{.ID}}"]).await.expect_code(1).stderr_has("-t (Go templates) is not supported");
}

#[tokio::test]
async fn deregister_is_refused_while_claimed_and_forced_after_the_alloc_ends() {
    let api = server().await;
    let dir = tempfile::tempdir().unwrap();
    api.nomad(&["volume", "register", &write(&dir, "v.hcl", HCL_SPEC)]).await.expect_code(0);
    let alloc_id = "a1b2c3d4-0000-0000-0000-000000000002";
    claim(&api, "vol1", alloc_id).await;

    api.nomad(&["volume", "deregister", "vol"])
        .await
        .expect_code(1)
        .stderr_has("Error deregistering volume: Unexpected response code: 500 (volume in use: vol1)");
    let done = Allocation { id: alloc_id.into(), node_id: NODE.into(), client_status: ClientStatus::Complete, ..Allocation::default() };
    api.server
        .consensus
        .apply(Command::AllocClientUpdate { allocs: vec![done], evals: vec![], now: nomad_proto::Timestamp::ZERO })
        .await
        .unwrap();
    api.nomad(&["volume", "deregister", "vol1"]).await.expect_code(1).stderr_has("volume in use: vol1");

    let forced = |answer: &'static str| {
        let addr = api.addr.clone();
        async move { nomad_with(&["volume", "deregister", "-force", "vol1", "-address", &addr], &[], answer).await }
    };
    forced("n\n").await.expect_code(0).stdout_has("Cancelling volume deregister");
    forced("yes\n").await.expect_code(0).stdout_has("For confirmation, an exact ‘y’ is required.");
    forced("").await.expect_code(1).stderr_has("Failed to parse answer: EOF");
    assert!(api.server.store.snapshot().csi_volume("default", "vol1").is_some(), "not removed without a y");
    forced("y\n")
        .await
        .expect_code(0)
        .stdout_has("Are you sure you want to force deregister volume \"vol1\"? [y/N] Successfully deregistered volume \"vol1\"!");
    assert!(api.server.store.snapshot().csi_volume("default", "vol1").is_none());
    api.nomad(&["volume", "deregister", "vol1"]).await.expect_code(1).stderr_has("No volumes(s) with prefix or ID \"vol1\" found");
}

#[tokio::test]
async fn plugin_status_lists_and_shows_plugins_reported_by_nodes() {
    let api = server().await;
    api.nomad(&["plugin", "status"])
        .await
        .expect_code(0)
        .stdout_has("Container Storage Interface\nID        Provider             Controllers Healthy/Expected  Nodes Healthy/Expected\n")
        .stdout_has("hostpath  hostpath.csi.k8s.io  0/0                           1/0");
    api.nomad(&["plugin", "status", "-verbose", "host"])
        .await
        .expect_code(0)
        .stdout_has("ID                   = hostpath\nProvider             = hostpath.csi.k8s.io\nVersion              = 1.11.0\n")
        .stdout_has("Controllers Healthy  = 0\nControllers Expected = 0\nNodes Healthy        = 1\nNodes Expected       = 0\n")
        .stdout_has("\nNode Capabilities\n  STAGE_UNSTAGE_VOLUME\n")
        .stdout_has("\nAllocations\n");
    let json = api.nomad(&["plugin", "status", "-json", "hostpath"]).await;
    let v: serde_json::Value = serde_json::from_str(&json.expect_code(0).stdout).unwrap();
    assert_eq!(v["Nodes"][NODE]["NodeInfo"]["ID"], "ext-n1");
    api.nomad(&["plugin", "status", "zz"]).await.expect_code(1).stderr_has("No plugins(s) with prefix or ID \"zz\" found");
    api.nomad(&["plugin", "status", "-type", "host"]).await.expect_code(1).stderr_has("Unsupported plugin type: host");

    let empty = Api::start().await;
    empty.nomad(&["plugin", "status"]).await.expect_code(0).stderr_has("No CSI plugins");
    empty.nomad(&["volume", "status"]).await.expect_code(0).stderr_has("No CSI volumes");
}

#[tokio::test]
async fn bad_spec_files_say_what_is_wrong_and_where() {
    let api = server().await;
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown.hcl", "id = \"v\"\ntype = \"csi\"\nplugin = \"hostpath\"\n", "unknown.hcl:3:1: unknown attribute \"plugin\" in volume"),
        (
            "size.hcl",
            "id = \"v\"\ntype = \"csi\"\ncapacity_max = \"10 xb\"\n",
            "size.hcl:3:16: invalid value for \"capacity_max\" in volume: could not parse value as bytes: unhandled size name: xb",
        ),
        ("noid.hcl", "type = \"csi\"\nplugin_id = \"hostpath\"\n", "noid.hcl: missing required attribute \"id\" in volume"),
        ("host.hcl", "id = \"v\"\ntype = \"host\"\n", "unknown volume type \"host\""),
        (
            "bad.json",
            "{\"id\": \"v\", \"type\": \"csi\", \"capability\": [{\"acces_mode\": \"x\"}]}",
            "bad.json: unknown attribute \"acces_mode\" in capability block of volume; did you mean \"access_mode\"?",
        ),
    ];
    for (name, text, want) in cases {
        let path = write(&dir, name, text);
        let run = api.nomad(&["volume", "register", &path]).await;
        run.expect_code(1).stderr_has("Error parsing the volume specification: ").stderr_has(want);
    }
    let from_stdin = nomad_with(&["volume", "register", "-address", &api.addr, "-"], &[], "id = \"v\"\ntype = \"csi\"\nbogus = 1\n").await;
    from_stdin.expect_code(1).stderr_has("<stdin>:3:1: unknown attribute \"bogus\" in volume");
    api.nomad(&["volume", "register", "/nonexistent/v.hcl"]).await.expect_code(1).stderr_has("Failed to read file: ");
    // The server's own checks come back as its message.
    let noplugin = write(
        &dir,
        "np.hcl",
        "id = \"v\"\ntype = \"csi\"\nplugin_id = \"nope\"\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
    );
    api.nomad(&["volume", "register", &noplugin])
        .await
        .expect_code(1)
        .stderr_has("Error registering volume: ")
        .stderr_has("no CSI plugin named: nope could be found");
    assert!(api.server.store.snapshot().csi_volume("default", "v").is_none());
}

#[tokio::test]
async fn create_and_delete_reach_the_server_and_report_its_refusal() {
    let api = server().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = write(&dir, "v.hcl", HCL_SPEC);
    // The server's own refusals reach the operator: the plugin has no controller to create with,
    // and there is no such volume to delete.
    api.nomad(&["volume", "create", &spec])
        .await
        .expect_code(1)
        .stderr_has("Error creating volume: Unexpected response code: 500 (plugin has no controller)");
    api.nomad(&["volume", "delete", "-secret", "a=b", "vol1"])
        .await
        .expect_code(1)
        .stderr_has("Error deleting volume: Unexpected response code: 404 (volume not found: vol1)");
    api.nomad(&["volume", "delete", "-secret", "ab", "vol1"])
        .await
        .expect_code(1)
        .stderr_has("Secret must be in the format: -secret key=value");
}

#[tokio::test]
async fn detach_takes_a_node_prefix_and_works_for_a_collected_node() {
    let calls = testing::RecordingClientCsi::new();
    let api = server_calling(calls.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    api.nomad(&["volume", "register", &write(&dir, "v.hcl", HCL_SPEC)]).await.expect_code(0);
    claim(&api, "vol1", "a1").await;
    let done = Allocation { id: "a1".into(), node_id: NODE.into(), client_status: ClientStatus::Failed, ..Allocation::default() };
    api.server
        .consensus
        .apply(Command::AllocClientUpdate { allocs: vec![done], evals: vec![], now: nomad_proto::Timestamp::ZERO })
        .await
        .unwrap();

    // The node by prefix: the servers ask it to unmount the finished alloc's claim.
    let run = api.nomad(&["volume", "detach", "vol", "4e0d"]).await;
    run.expect_code(0);
    assert_eq!(
        calls.calls(),
        vec![testing::CsiCall::NodeDetach { node_id: NODE.into(), alloc_id: "a1".into(), external_id: "ext-vol1".into() }]
    );

    // Collected: no node matches, the node is found among the volume's allocs; nothing to ask.
    let idx = api.server.store.snapshot().index + 1;
    api.server.store.write(idx, |tx| tx.delete_node(NODE)).unwrap();
    api.nomad(&["volume", "detach", "vol1", "4e0d"]).await.expect_code(0);
    assert_eq!(calls.calls().len(), 1);
    api.nomad(&["volume", "detach", "nope", "4e0d"]).await.expect_code(1).stderr_has("No volumes(s) with prefix or ID \"nope\" found");
    api.nomad(&["volume", "detach", "vol1"]).await.expect_code(1);
}

#[tokio::test]
async fn the_same_id_in_two_namespaces_is_ambiguous_across_namespaces() {
    let api = server().await;
    let ns = nomad_proto::Namespace { name: "other".into(), ..nomad_proto::Namespace::default() };
    api.server.endpoints.namespace_upsert(ns).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    api.nomad(&["volume", "register", &write(&dir, "d.hcl", HCL_SPEC)]).await.expect_code(0);
    let other = HCL_SPEC.replace("type         = \"csi\"", "type         = \"csi\"\nnamespace    = \"other\"");
    api.nomad(&["volume", "register", &write(&dir, "o.hcl", &other)]).await.expect_code(0);
    assert!(api.server.store.snapshot().csi_volume("other", "vol1").is_some(), "the spec's namespace wins");

    api.nomad(&["volume", "status", "vol1"]).await.expect_code(0).stdout_has("Namespace            = default\n");
    api.nomad(&["volume", "status", "-namespace", "other", "vol1"]).await.expect_code(0).stdout_has("Namespace            = other\n");
    api.nomad(&["volume", "status", "-namespace", "*", "vol1"])
        .await
        .expect_code(1)
        .stderr_has(
            "Prefix matched multiple volumes\n\nID    Name      Namespace  Plugin ID  Schedulable  Access Mode\nvol1  database  default",
        )
        .stderr_has("\nvol1  database  other");
    api.nomad(&["volume", "status", "-namespace", "*"]).await.expect_code(0).stdout_has("vol1  database  other");
    // Deregistering in one namespace leaves the other.
    api.nomad(&["volume", "deregister", "-namespace", "other", "vol1"]).await.expect_code(0);
    let snap = api.server.store.snapshot();
    assert!(snap.csi_volume("other", "vol1").is_none() && snap.csi_volume("default", "vol1").is_some());
}
