//! csi-hostpath as a child process on a socket in a temp dir, driven through the plugin client
//! the way Nomad's client drives plugins.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nomad_csi::capability::{ATTACHMENT_FILE_SYSTEM, volume_capability};
use nomad_csi::client::{CsiError, CsiPluginClient, GrpcPluginClient, Timeouts, wait_until_ready};
use nomad_csi::{endpoint, v1};
use nomad_testkit::prereq::Prereq;
use nomad_testkit::require_prereqs;
use tonic::Code;

const BINARY: &str = env!("CARGO_BIN_EXE_csi-hostpath");
const NODE: &str = "node-1";
const MIB: i64 = 1 << 20;

/// A running csi-hostpath in its own temp dir; dropping it kills the plugin and detaches any
/// mount a failed test left under the temp dir.
struct Hostpath {
    child: tokio::process::Child,
    socket: PathBuf,
    statedir: PathBuf,
    flags: Vec<String>,
    client: GrpcPluginClient,
    dir: tempfile::TempDir,
}

/// Starts csi-hostpath on `socket`, its stderr appended to `dir/plugin.log`.
fn spawn(dir: &Path, socket: &Path, statedir: &Path, flags: &[String]) -> tokio::process::Child {
    let log = std::fs::File::options().create(true).append(true).open(dir.join("plugin.log")).unwrap();
    tokio::process::Command::new(BINARY)
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .args(["--nodeid", NODE, "--statedir"])
        .arg(statedir)
        .args(flags)
        .stdin(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Timeouts short enough for tests; the tries and backoff are Nomad's.
fn test_timeouts() -> Timeouts {
    Timeouts {
        probe: Duration::from_secs(5),
        fingerprint: Duration::from_secs(5),
        volume_try: Duration::from_secs(10),
        ..Timeouts::default()
    }
}

impl Hostpath {
    async fn start(flags: &[&str]) -> Hostpath {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().join("state");
        Hostpath::start_in(dir, statedir, flags).await
    }

    /// With its own temp dir but the given state dir (another plugin's, to share it).
    async fn start_in(dir: tempfile::TempDir, statedir: PathBuf, flags: &[&str]) -> Hostpath {
        let socket = dir.path().join("csi.sock");
        let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        let child = spawn(dir.path(), &socket, &statedir, &flags);
        let client = GrpcPluginClient::with_timeouts(&socket, test_timeouts()).unwrap();
        wait_until_ready(&client, Duration::from_secs(20), Duration::from_millis(20)).await.expect("csi-hostpath becomes ready");
        Hostpath { child, socket, statedir, flags, client, dir }
    }

    /// Kills the plugin with SIGKILL (it leaves its socket behind) and starts it again.
    async fn kill_and_restart(&mut self) {
        self.child.kill().await.unwrap();
        assert!(self.socket.exists(), "a killed plugin cannot remove its socket");
        let err = self.client.probe().await.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unavailable), "nothing listens on the stale socket: {err}");
        assert!(err.is_retryable());
        self.child = spawn(self.dir.path(), &self.socket, &self.statedir, &self.flags);
        wait_until_ready(&self.client, Duration::from_secs(20), Duration::from_millis(20))
            .await
            .expect("the same client reaches the new plugin");
    }

    /// How many calls of `method` the plugin has answered (it logs each before answering).
    fn calls(&self, method: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("plugin.log")).unwrap();
        log.lines().filter(|line| line.contains(&format!("method=\"{method}\""))).count()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.statedir.join("state.json")).unwrap()).unwrap()
    }

    fn volume_dir(&self, id: &str) -> PathBuf {
        self.statedir.join("volumes").join(id)
    }

    async fn create(&self, name: &str, required_bytes: i64) -> Result<v1::Volume, CsiError> {
        self.client.create_volume(create_request(name, required_bytes)).await
    }

    /// A raw gRPC node client, for requests the plugin client would refuse to send.
    fn raw_node(&self) -> v1::node_client::NodeClient<tonic::transport::Channel> {
        v1::node_client::NodeClient::new(endpoint::channel(&self.socket).unwrap())
    }

    fn raw_controller(&self) -> v1::controller_client::ControllerClient<tonic::transport::Channel> {
        v1::controller_client::ControllerClient::new(endpoint::channel(&self.socket).unwrap())
    }
}

impl Drop for Hostpath {
    fn drop(&mut self) {
        for mount in mounts_under(self.dir.path()) {
            let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn writer() -> v1::VolumeCapability {
    volume_capability(ATTACHMENT_FILE_SYSTEM, "single-node-writer", "", &[]).unwrap()
}

fn create_request(name: &str, required_bytes: i64) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(v1::CapacityRange { required_bytes, limit_bytes: 0 }),
        volume_capabilities: vec![writer()],
        parameters: HashMap::from([("kind".to_string(), "test".to_string())]),
        ..Default::default()
    }
}

fn stage_request(volume_id: &str, staging: &Path) -> v1::NodeStageVolumeRequest {
    v1::NodeStageVolumeRequest {
        volume_id: volume_id.to_string(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(writer()),
        ..Default::default()
    }
}

fn publish_request(volume_id: &str, staging: Option<&Path>, target: &Path, readonly: bool) -> v1::NodePublishVolumeRequest {
    v1::NodePublishVolumeRequest {
        volume_id: volume_id.to_string(),
        staging_target_path: staging.map(|s| s.display().to_string()).unwrap_or_default(),
        target_path: target.display().to_string(),
        volume_capability: Some(writer()),
        readonly,
        ..Default::default()
    }
}

fn controller_publish(volume_id: &str, node_id: &str, readonly: bool) -> v1::ControllerPublishVolumeRequest {
    v1::ControllerPublishVolumeRequest {
        volume_id: volume_id.to_string(),
        node_id: node_id.to_string(),
        volume_capability: Some(writer()),
        readonly,
        ..Default::default()
    }
}

/// Mount points at or below `dir`, from this process's mount table (the plugin shares it).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().filter_map(|line| line.split(' ').nth(4)).map(PathBuf::from).filter(|m| m.starts_with(dir)).collect()
}

fn mount_of(path: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.display().to_string();
    table.lines().rev().find(|line| line.split(' ').nth(4) == Some(path.as_str())).map(str::to_string)
}

fn code(result: Result<impl std::fmt::Debug, CsiError>) -> (Code, String) {
    let err = result.expect_err("the call fails");
    (err.code().unwrap_or_else(|| panic!("a status, not {err:?}")), err.to_string())
}

#[tokio::test]
async fn identity_and_capabilities_are_reported() {
    let plugin = Hostpath::start(&["--max-volumes", "7"]).await;
    let info = plugin.client.plugin_info().await.unwrap();
    assert_eq!(info.name, "hostpath.csi.k8s.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = plugin.client.plugin_capabilities().await.unwrap();
    assert!(caps.controller_service && !caps.accessibility_constraints, "{caps:?}");
    let node = plugin.client.node_info().await.unwrap();
    assert_eq!((node.node_id.as_str(), node.max_volumes, node.accessible_topology), (NODE, 7, None));
    let node_caps = plugin.client.node_capabilities().await.unwrap();
    assert!(node_caps.stage_unstage_volume && node_caps.get_volume_stats && node_caps.expand_volume, "{node_caps:?}");
    let controller = plugin.client.controller_capabilities().await.unwrap();
    assert!(controller.create_delete_volume && controller.publish_unpublish_volume && controller.list_volumes, "{controller:?}");
    assert!(!controller.create_delete_snapshot && !controller.clone_volume, "{controller:?}");

    let unlimited = Hostpath::start(&[]).await;
    assert_eq!(unlimited.client.node_info().await.unwrap().max_volumes, i64::MAX, "no limit reads as Nomad's MaxInt64");
}

#[tokio::test]
async fn create_and_delete_are_idempotent_by_name() {
    let plugin = Hostpath::start(&[]).await;
    let volume = plugin.create("vol-a", MIB).await.unwrap();
    assert_eq!(volume.capacity_bytes, MIB);
    assert_eq!(volume.volume_context.get("kind").map(String::as_str), Some("test"), "parameters come back as the context");
    assert!(plugin.volume_dir(&volume.volume_id).is_dir());
    assert_eq!(plugin.state()["volumes"][&volume.volume_id]["name"], "vol-a");

    let again = plugin.create("vol-a", MIB).await.unwrap();
    assert_eq!(again.volume_id, volume.volume_id, "the same name is the same volume");
    let smaller = plugin.create("vol-a", MIB / 2).await.unwrap();
    assert_eq!(smaller.volume_id, volume.volume_id, "an existing volume large enough satisfies a smaller request");

    let (code_, message) = code(plugin.create("vol-a", 2 * MIB).await);
    assert_eq!(code_, Code::AlreadyExists);
    assert!(message.contains("volume \"vol-a\" already exists but is incompatible with these parameters"), "{message}");
    let mut other_parameters = create_request("vol-a", MIB);
    other_parameters.parameters.insert("kind".into(), "other".into());
    assert_eq!(plugin.client.create_volume(other_parameters).await.unwrap_err().code(), Some(Code::AlreadyExists));

    let (code_, message) = code(plugin.create("too-big", 2 << 40).await);
    assert_eq!(code_, Code::OutOfRange, "{message}");
    assert!(message.contains("unsupported capacity_range for volume \"too-big\""), "{message}");

    // Missing fields: the client refuses to send; the plugin answers INVALID_ARGUMENT.
    let unnamed = plugin.create("", MIB).await.unwrap_err();
    assert!(matches!(unnamed, CsiError::InvalidRequest { .. }) && unnamed.to_string() == "CreateVolume: missing Name", "{unnamed}");
    let raw = plugin.raw_controller().create_volume(create_request("", MIB)).await.unwrap_err();
    assert_eq!((raw.code(), raw.message()), (Code::InvalidArgument, "name is required"));
    let raw = plugin.raw_controller().create_volume(v1::CreateVolumeRequest { name: "x".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!((raw.code(), raw.message()), (Code::InvalidArgument, "volume_capabilities is required"));

    let delete = |id: &str| v1::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() };
    plugin.client.delete_volume(delete(&volume.volume_id)).await.unwrap();
    assert!(!plugin.volume_dir(&volume.volume_id).exists());
    assert!(plugin.state()["volumes"].get(&volume.volume_id).is_none());
    plugin.client.delete_volume(delete(&volume.volume_id)).await.expect("deleting a deleted volume succeeds");
    plugin.client.delete_volume(delete("../escape")).await.expect("an ID no volume can have is deleted already");
    let recreated = plugin.create("vol-a", 2 * MIB).await.unwrap();
    assert_ne!(recreated.volume_id, volume.volume_id, "after delete the name is free");
}

#[tokio::test]
async fn controller_publish_is_recorded() {
    let plugin = Hostpath::start(&["--max-volumes", "1"]).await;
    let volume = plugin.create("vol-p", MIB).await.unwrap();
    let id = volume.volume_id.as_str();
    plugin.client.controller_publish_volume(controller_publish(id, NODE, false)).await.unwrap();
    let expected = serde_json::json!([{ "volume_id": id, "node_id": NODE, "readonly": false }]);
    assert_eq!(plugin.state()["published"], expected);
    plugin.client.controller_publish_volume(controller_publish(id, NODE, false)).await.expect("publishing again is idempotent");
    assert_eq!(plugin.state()["published"], expected);

    let (code_, message) = code(plugin.client.controller_publish_volume(controller_publish(id, NODE, true)).await);
    assert_eq!(code_, Code::AlreadyExists);
    assert!(message.contains("but with capabilities or a read_only setting incompatible"), "{message}");
    let (code_, message) = code(plugin.client.controller_publish_volume(controller_publish(id, "node-2", false)).await);
    assert_eq!(code_, Code::FailedPrecondition, "a single-node volume on a second node");
    assert!(message.contains("FailedPrecondition"), "Nomad's servers match the Go code name: {message}");
    let (code_, message) = code(plugin.client.controller_publish_volume(controller_publish("no-such-volume", NODE, false)).await);
    assert_eq!(code_, Code::NotFound);
    assert!(message.contains("volume \"no-such-volume\" or node \"node-1\" could not be found"), "{message}");
    let second = plugin.create("vol-q", MIB).await.unwrap();
    let (code_, message) = code(plugin.client.controller_publish_volume(controller_publish(&second.volume_id, NODE, false)).await);
    assert_eq!(code_, Code::ResourceExhausted, "--max-volumes 1");
    assert!(message.contains("has reached the maximum allowable number of attached volumes"), "{message}");

    let delete = v1::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() };
    let (code_, message) = code(plugin.client.delete_volume(delete.clone()).await);
    assert_eq!(code_, Code::FailedPrecondition);
    assert!(message.contains("is in use"), "{message}");

    let unpublish = v1::ControllerUnpublishVolumeRequest { volume_id: id.to_string(), node_id: NODE.to_string(), ..Default::default() };
    plugin.client.controller_unpublish_volume(unpublish.clone()).await.unwrap();
    assert_eq!(plugin.state()["published"], serde_json::json!([]));
    plugin.client.controller_unpublish_volume(unpublish).await.expect("unpublishing again is idempotent");
    plugin.client.delete_volume(delete).await.expect("an unpublished volume can be deleted");
}

#[tokio::test]
async fn capabilities_are_validated() {
    let plugin = Hostpath::start(&[]).await;
    let volume = plugin.create("vol-v", MIB).await.unwrap();
    let validate = |id: &str, capability: v1::VolumeCapability| v1::ValidateVolumeCapabilitiesRequest {
        volume_id: id.to_string(),
        volume_capabilities: vec![capability],
        ..Default::default()
    };
    plugin.client.validate_volume_capabilities(validate(&volume.volume_id, writer())).await.unwrap();
    let (code_, message) = code(plugin.client.validate_volume_capabilities(validate("missing", writer())).await);
    assert_eq!(code_, Code::NotFound);
    assert!(message.contains("volume \"missing\" could not be found"), "{message}");
    // Block is not confirmed: the plugin says why, and the spec makes that no refusal.
    let block = volume_capability("block-device", "single-node-writer", "", &[]).unwrap();
    let raw = plugin.raw_controller().validate_volume_capabilities(validate(&volume.volume_id, block)).await.unwrap().into_inner();
    assert!(raw.confirmed.is_none() && raw.message.contains("block volumes are not supported"), "{raw:?}");
}

#[tokio::test]
async fn node_calls_check_their_fields() {
    let plugin = Hostpath::start(&[]).await;
    let volume = plugin.create("vol-n", MIB).await.unwrap();
    let staging = plugin.path("staging");
    let status = |result: Result<tonic::Response<v1::NodeStageVolumeResponse>, tonic::Status>| {
        let status = result.unwrap_err();
        (status.code(), status.message().to_string())
    };
    let mut request = stage_request(&volume.volume_id, &staging);
    request.staging_target_path.clear();
    assert_eq!(
        status(plugin.raw_node().node_stage_volume(request).await),
        (Code::InvalidArgument, "staging_target_path is required".into())
    );
    let mut request = stage_request(&volume.volume_id, &staging);
    request.staging_target_path = "relative/path".into();
    let (code_, message) = status(plugin.raw_node().node_stage_volume(request).await);
    assert_eq!(code_, Code::InvalidArgument, "{message}");
    assert!(message.contains("is not an absolute path"), "{message}");
    let mut request = stage_request(&volume.volume_id, &staging);
    request.volume_capability = None;
    assert_eq!(status(plugin.raw_node().node_stage_volume(request).await), (Code::InvalidArgument, "volume_capability is required".into()));
    for id in ["no-such-volume", "../state", "."] {
        let (code_, message) = status(plugin.raw_node().node_stage_volume(stage_request(id, &staging)).await);
        assert_eq!(code_, Code::NotFound, "{id}: {message}");
    }
    assert!(!staging.exists(), "nothing was staged");
}

#[tokio::test]
async fn stage_and_publish_are_bind_mounts_and_unpublish_leaves_none() {
    require_prereqs!(Prereq::Root);
    let plugin = Hostpath::start(&[]).await;
    let volume = plugin.create("vol-m", MIB).await.unwrap();
    let id = volume.volume_id.as_str();
    let staging = plugin.path("staging/vol-m/rw-file-system-single-node-writer");
    let target = plugin.path("per-alloc/alloc-1/vol-m/rw-file-system-single-node-writer");

    let (code_, message) = code(plugin.client.node_publish_volume(publish_request(id, Some(&staging), &target, false)).await);
    assert_eq!(code_, Code::FailedPrecondition, "publishing before staging: {message}");

    plugin.client.node_stage_volume(stage_request(id, &staging)).await.unwrap();
    assert!(mount_of(&staging).is_some_and(|m| m.contains(&format!("/volumes/{id} "))), "{:?}", mount_of(&staging));
    plugin.client.node_stage_volume(stage_request(id, &staging)).await.expect("staging again is idempotent");
    plugin.client.node_publish_volume(publish_request(id, Some(&staging), &target, false)).await.unwrap();
    plugin.client.node_publish_volume(publish_request(id, Some(&staging), &target, false)).await.expect("publishing again is idempotent");
    assert_eq!(mounts_under(plugin.dir.path()).iter().filter(|m| **m == target).count(), 1, "idempotent calls stack no mounts");

    std::fs::write(target.join("data"), "written by the task").unwrap();
    assert_eq!(std::fs::read_to_string(plugin.volume_dir(id).join("data")).unwrap(), "written by the task", "the target is the volume");
    let (code_, _) = code(plugin.client.node_publish_volume(publish_request(id, Some(&staging), &target, true)).await);
    assert_eq!(code_, Code::AlreadyExists, "the same target, read-only this time");

    let delete = v1::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() };
    assert_eq!(
        plugin.client.delete_volume(delete.clone()).await.unwrap_err().code(),
        Some(Code::FailedPrecondition),
        "a mounted volume stays"
    );

    plugin.client.node_unpublish_volume(id.to_string(), target.display().to_string()).await.unwrap();
    assert!(!target.exists(), "unpublish removes the target");
    plugin.client.node_unpublish_volume(id.to_string(), target.display().to_string()).await.expect("unpublishing again succeeds");
    plugin.client.node_unstage_volume(id.to_string(), staging.display().to_string()).await.unwrap();
    assert!(!staging.exists(), "unstage removes the staging path");
    assert_eq!(mounts_under(plugin.dir.path()), Vec::<PathBuf>::new(), "no mount is left");
    assert_eq!(std::fs::read_to_string(plugin.volume_dir(id).join("data")).unwrap(), "written by the task", "the data outlives the mounts");

    let gone = plugin.client.node_unpublish_volume("no-such-volume".into(), target.display().to_string()).await.unwrap_err();
    assert!(gone.is_ignorable() && gone.to_string().contains("CSI client error (ignorable)"), "{gone}");
    plugin.client.delete_volume(delete).await.expect("an unmounted volume can be deleted");
}

#[tokio::test]
async fn a_read_only_publish_refuses_writes() {
    require_prereqs!(Prereq::Root);
    let plugin = Hostpath::start(&[]).await;
    let volume = plugin.create("vol-ro", MIB).await.unwrap();
    let id = volume.volume_id.as_str();
    std::fs::write(plugin.volume_dir(id).join("seed"), "from before").unwrap();
    let staging = plugin.path("staging/ro");
    let target = plugin.path("target/ro");
    plugin.client.node_stage_volume(stage_request(id, &staging)).await.unwrap();
    plugin.client.node_publish_volume(publish_request(id, Some(&staging), &target, true)).await.unwrap();

    assert_eq!(std::fs::read_to_string(target.join("seed")).unwrap(), "from before", "reads work");
    let err = std::fs::write(target.join("new"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_erofs()), "writes are refused: {err}");
    std::fs::write(staging.join("through-staging"), "x").expect("the staging mount stays writable");

    plugin.client.node_unpublish_volume(id.to_string(), target.display().to_string()).await.unwrap();
    plugin.client.node_unstage_volume(id.to_string(), staging.display().to_string()).await.unwrap();
    assert_eq!(mounts_under(plugin.dir.path()), Vec::<PathBuf>::new());
}

fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
}

#[tokio::test]
async fn without_staging_publish_binds_the_volume_directly() {
    let plugin = Hostpath::start(&["--no-staging"]).await;
    assert!(!plugin.client.node_capabilities().await.unwrap().stage_unstage_volume, "--no-staging is reported");
    let volume = plugin.create("vol-ns", MIB).await.unwrap();
    let id = volume.volume_id.as_str();
    let (code_, message) = code(plugin.client.node_stage_volume(stage_request(id, &plugin.path("staging"))).await);
    assert_eq!(code_, Code::Unimplemented, "{message}");

    require_prereqs!(Prereq::Root);
    let target = plugin.path("target/ns");
    let (code_, _) = code(plugin.client.node_publish_volume(publish_request(id, Some(&plugin.path("staging")), &target, false)).await);
    assert_eq!(code_, Code::InvalidArgument, "a staging path this plugin never staged");
    plugin.client.node_publish_volume(publish_request(id, None, &target, false)).await.unwrap();
    std::fs::write(target.join("direct"), "x").unwrap();
    assert!(plugin.volume_dir(id).join("direct").is_file(), "the target is the volume directory itself");
    assert!(!plugin.path("staging").exists(), "nothing was staged");
    plugin.client.node_unpublish_volume(id.to_string(), target.display().to_string()).await.unwrap();
    assert_eq!(mounts_under(plugin.dir.path()), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn separate_controller_and_node_plugins_share_a_state_dir() {
    require_prereqs!(Prereq::Root);
    let controller = Hostpath::start(&["--no-staging"]).await;
    let shared = controller.statedir.clone();
    let node = Hostpath::start_in(tempfile::tempdir().unwrap(), shared, &["--no-controller"]).await;
    assert!(!node.client.plugin_capabilities().await.unwrap().controller_service, "--no-controller is reported");
    let (code_, _) = code(node.create("x", MIB).await);
    assert_eq!(code_, Code::Unimplemented, "a node plugin serves no Controller");

    let volume = controller.create("vol-shared", MIB).await.unwrap();
    controller.client.controller_publish_volume(controller_publish(&volume.volume_id, NODE, false)).await.unwrap();
    let staging = node.path("staging");
    let target = node.path("target");
    node.client.node_stage_volume(stage_request(&volume.volume_id, &staging)).await.unwrap();
    node.client.node_publish_volume(publish_request(&volume.volume_id, Some(&staging), &target, false)).await.unwrap();
    std::fs::write(target.join("f"), "x").unwrap();
    assert!(controller.volume_dir(&volume.volume_id).join("f").is_file());
    node.client.node_unpublish_volume(volume.volume_id.clone(), target.display().to_string()).await.unwrap();
    node.client.node_unstage_volume(volume.volume_id.clone(), staging.display().to_string()).await.unwrap();
}

#[tokio::test]
async fn injected_failures_are_retried_by_the_client() {
    let plugin =
        Hostpath::start(&["--fail-times", "CreateVolume=2", "--fail-times", "DeleteVolume=3", "--fail-times", "NodeGetInfo=1"]).await;
    plugin.create("vol-f", MIB).await.expect("two UNAVAILABLE answers, then the third try succeeds");

    let volume = plugin.create("vol-f", MIB).await.unwrap();
    let delete = v1::DeleteVolumeRequest { volume_id: volume.volume_id.clone(), ..Default::default() };
    let err = plugin.client.delete_volume(delete.clone()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(err.is_retryable() && err.to_string().contains("injected failure of DeleteVolume"), "{err}");
    assert!(err.to_string().contains("0 more to come"), "all three tries were made: {err}");
    plugin.client.delete_volume(delete).await.expect("the fourth call succeeds");

    // Fingerprint calls are tried once: their caller loops.
    assert_eq!(plugin.client.node_info().await.unwrap_err().code(), Some(Code::Unavailable));
    assert_eq!(plugin.client.node_info().await.unwrap().node_id, NODE);
}

#[tokio::test]
async fn a_final_code_is_not_retried() {
    let plugin = Hostpath::start(&["--fail-times", "CreateVolume=1"]).await;
    let mut request = create_request("vol-x", MIB);
    request.volume_capabilities = vec![volume_capability("block-device", "single-node-writer", "", &[]).unwrap()];
    let (code_, message) = code(plugin.client.create_volume(request).await);
    assert_eq!(code_, Code::InvalidArgument, "{message}");
    assert_eq!(plugin.calls("CreateVolume"), 2, "UNAVAILABLE was retried, INVALID_ARGUMENT was not");
    let (code_, _) = code(plugin.client.node_stage_volume(stage_request("no-such-volume", &plugin.path("s"))).await);
    assert_eq!((code_, plugin.calls("NodeStageVolume")), (Code::NotFound, 1));
}

#[tokio::test]
async fn every_call_has_a_deadline() {
    // Its probes are slow too: Hostpath::start waits for it with a probe deadline of 5 s.
    let slow = Hostpath::start(&["--slow", "2000"]).await;
    let timeouts = Timeouts { volume_try: Duration::from_millis(200), probe: Duration::from_millis(200), ..Timeouts::default() };
    let client = GrpcPluginClient::with_timeouts(&slow.socket, timeouts).unwrap();
    let started = tokio::time::Instant::now();
    let err = client.create_volume(create_request("vol-slow", MIB)).await.unwrap_err();
    assert!(matches!(err, CsiError::Timeout { attempts: 3, .. }) && err.is_retryable(), "{err}");
    // Three 200 ms tries and 300 ms of backoff; without deadlines, three 2 s answers.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(client.probe().await.unwrap_err(), CsiError::Timeout { attempts: 1, .. }));
}

#[tokio::test]
async fn a_missing_socket_is_reported_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let client = GrpcPluginClient::with_timeouts(&socket, test_timeouts()).unwrap();
    let err = client.node_publish_volume(publish_request("v", None, Path::new("/t"), false)).await.unwrap_err();
    assert!(matches!(err, CsiError::Unreachable { .. }) && err.is_retryable(), "{err}");
    assert!(err.to_string().contains(&format!("CSI plugin socket {} does not exist", socket.display())), "{err}");
    let err = wait_until_ready(&client, Duration::from_millis(100), Duration::from_millis(20)).await.unwrap_err();
    assert!(err.to_string().starts_with("CSI plugin failed probe within 100ms: Probe: CSI plugin socket"), "{err}");
}

#[tokio::test]
async fn sigterm_stops_the_plugin_and_removes_its_socket() {
    let mut plugin = Hostpath::start(&[]).await;
    assert!(plugin.socket.exists());
    let pid = nix::unistd::Pid::from_raw(plugin.child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), plugin.child.wait()).await.expect("it exits").unwrap();
    assert!(status.success(), "{status}");
    assert!(!plugin.socket.exists(), "the socket is removed");
    let err = plugin.client.probe().await.unwrap_err();
    assert!(matches!(err, CsiError::Unreachable { .. }), "{err}");
}

#[tokio::test]
async fn a_restarted_plugin_keeps_its_volumes_and_publications() {
    let mut plugin = Hostpath::start(&[]).await;
    let volume = plugin.create("vol-r", MIB).await.unwrap();
    plugin.client.controller_publish_volume(controller_publish(&volume.volume_id, NODE, false)).await.unwrap();
    plugin.kill_and_restart().await;
    assert_eq!(plugin.create("vol-r", MIB).await.unwrap().volume_id, volume.volume_id, "the name still finds the volume");
    let (code_, _) = code(plugin.client.controller_publish_volume(controller_publish(&volume.volume_id, NODE, true)).await);
    assert_eq!(code_, Code::AlreadyExists, "the publication survived the restart");
}

#[tokio::test]
async fn bad_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let output = std::process::Command::new(BINARY).args(args).env_remove("CSI_ENDPOINT").output().unwrap();
        assert!(!output.status.success(), "{args:?} must fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let sock = format!("unix://{}", dir.path().join("s.sock").display());
    let stderr = run(&["--endpoint", &sock, "--nodeid", "n", "--statedir", state, "--fail-times", "NodePublish=1"]);
    assert!(stderr.contains("unknown method \"NodePublish\""), "{stderr}");
    let stderr = run(&["--endpoint", "tcp://127.0.0.1:1", "--nodeid", "n", "--statedir", state]);
    assert!(stderr.contains("is not a unix socket URL"), "{stderr}");
    let stderr = run(&["--nodeid", "n", "--statedir", state]);
    assert!(stderr.contains("--endpoint"), "no endpoint and no CSI_ENDPOINT: {stderr}");

    // CSI_ENDPOINT is the default endpoint.
    let socket = dir.path().join("env.sock");
    let mut child = tokio::process::Command::new(BINARY)
        .args(["--nodeid", "n", "--statedir", state])
        .env("CSI_ENDPOINT", format!("unix://{}", socket.display()))
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = GrpcPluginClient::with_timeouts(&socket, test_timeouts()).unwrap();
    wait_until_ready(&client, Duration::from_secs(20), Duration::from_millis(20)).await.unwrap();
    child.kill().await.unwrap();
}
