use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;

use super::super::fake::FakePlugin;
use super::super::{Connector, CsiPlugins, PluginRegistration};
use super::*;

fn usage(read_only: bool) -> UsageOptions {
    UsageOptions {
        read_only,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        mount_options: None,
    }
}

/// A manager under a temp CSI root with the fake registered as node plugin `hostpath`.
async fn setup(plugin: Arc<FakePlugin>) -> (tempfile::TempDir, Arc<CsiManager>) {
    let dir = tempfile::tempdir().unwrap();
    let csi_root = dir.path().join("csi");
    let connect: Connector = Arc::new(move |_: &Path| Ok(plugin.clone() as Arc<dyn CsiPluginClient>));
    let manager = CsiManager::with_plugin_wait(Duration::ZERO, connect, csi_root.clone(), Duration::from_millis(200));
    manager.register(PluginRegistration {
        side: PluginSide::Node,
        plugin_id: "hostpath".into(),
        alloc_id: "plugin-alloc".into(),
        socket: csi_root.join("plugins/plugin-alloc/csi.sock"),
        provider: "hostpath.csi.k8s.io".into(),
        version: "1".into(),
        mount_point: csi_root.join("monolith/hostpath"),
        container_mount_point: "/local/csi".into(),
    });
    manager.fingerprint_due().await;
    (dir, manager)
}

fn request(alloc: &str, read_only: bool) -> MountRequest {
    MountRequest {
        plugin_id: "hostpath".into(),
        namespace: "prod".into(),
        volume_id: "vol[0]".into(),
        external_id: "ext-1".into(),
        alloc_id: alloc.into(),
        usage: usage(read_only),
        ..MountRequest::default()
    }
}

fn volume_use(alloc: &str, usage: &UsageOptions) -> VolumeUse {
    VolumeUse {
        plugin_id: "hostpath".into(),
        namespace: "prod".into(),
        volume_id: "vol[0]".into(),
        external_id: "ext-1".into(),
        alloc_id: alloc.into(),
        usage: usage.clone(),
        staging_layout: StagingLayout::Namespaced,
    }
}

#[test]
fn usage_dir_names_are_nomads() {
    assert_eq!(usage(false).to_fs(), "rw-file-system-single-node-writer");
    let ro = UsageOptions { access_mode: CsiVolumeAccessMode::MultiNodeReader, ..usage(true) };
    assert_eq!(ro.to_fs(), "ro-file-system-multi-node-reader-only");
    let ns = StagingLayout::Namespaced;
    let p = VolumePaths::new(ns, "prod", "vol[0]", "a1", &usage(false)).unwrap();
    assert_eq!(p.staging, Path::new("staging/prod/vol[0]/rw-file-system-single-node-writer"));
    assert_eq!(p.target, Path::new("per-alloc/a1/vol[0]/rw-file-system-single-node-writer"));
    let before = VolumePaths::new(StagingLayout::Unnamespaced, "prod", "vol[0]", "a1", &usage(false)).unwrap();
    assert_eq!(before.staging, Path::new("staging/vol[0]/rw-file-system-single-node-writer"), "Nomad 1.6's");
    assert_eq!(before.target, p.target);
    for bad in ["..", ".", "a/b", ""] {
        assert!(
            matches!(VolumePaths::new(ns, bad, "v", "a1", &usage(false)), Err(VolumeError::BadName { what: "namespace", .. })),
            "{bad:?}"
        );
        assert!(
            matches!(VolumePaths::new(ns, "prod", bad, "a1", &usage(false)), Err(VolumeError::BadName { what: "volume ID", .. })),
            "{bad:?}"
        );
        assert!(
            matches!(VolumePaths::new(ns, "prod", "v", bad, &usage(false)), Err(VolumeError::BadName { what: "alloc ID", .. })),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn mount_stages_then_publishes_under_the_plugins_view_and_unmount_unstages_after_the_last_user() {
    let plugin = Arc::new(FakePlugin::default());
    let (dir, manager) = setup(plugin.clone()).await;
    let root = dir.path().join("csi/monolith/hostpath");
    let rw = "rw-file-system-single-node-writer";
    let info = manager.mount_volume(&request("a1", false)).await.unwrap();
    assert_eq!(info.source, root.join(format!("per-alloc/a1/vol[0]/{rw}")));
    assert!(info.source.is_dir());
    for d in [format!("staging/prod/vol[0]/{rw}"), format!("per-alloc/a1/vol[0]/{rw}"), "per-alloc/a1".to_string()] {
        assert_eq!(std::fs::metadata(root.join(&d)).unwrap().permissions().mode() & 0o777, 0o700, "{d}");
    }
    manager.mount_volume(&request("a2", false)).await.unwrap();
    assert_eq!(
        plugin.calls(),
        [
            format!("NodeStageVolume ext-1 /local/csi/staging/prod/vol[0]/{rw}"),
            format!("NodePublishVolume ext-1 /local/csi/staging/prod/vol[0]/{rw} /local/csi/per-alloc/a1/vol[0]/{rw} readonly=false"),
            format!("NodeStageVolume ext-1 /local/csi/staging/prod/vol[0]/{rw}"),
            format!("NodePublishVolume ext-1 /local/csi/staging/prod/vol[0]/{rw} /local/csi/per-alloc/a2/vol[0]/{rw} readonly=false"),
        ]
    );
    plugin.calls.lock().unwrap().clear();

    let u = usage(false);
    manager.unmount_volume(&volume_use("a1", &u)).await.unwrap();
    assert_eq!(plugin.calls(), [format!("NodeUnpublishVolume ext-1 /local/csi/per-alloc/a1/vol[0]/{rw}")], "a2 still uses it: no unstage");
    assert!(!root.join("per-alloc/a1").exists(), "the alloc's emptied dirs are removed");
    plugin.calls.lock().unwrap().clear();
    manager.unmount_volume(&volume_use("a2", &u)).await.unwrap();
    assert_eq!(
        plugin.calls(),
        [
            format!("NodeUnpublishVolume ext-1 /local/csi/per-alloc/a2/vol[0]/{rw}"),
            format!("NodeUnstageVolume ext-1 /local/csi/staging/prod/vol[0]/{rw}"),
        ],
        "the last user unstages"
    );
}

#[tokio::test]
async fn a_plugin_without_staging_is_only_published_read_only_when_asked() {
    let plugin = Arc::new(FakePlugin { no_staging: true.into(), ..FakePlugin::default() });
    let (_dir, manager) = setup(plugin.clone()).await;
    let req = MountRequest { external_id: String::new(), ..request("a1", true) };
    manager.mount_volume(&req).await.unwrap();
    let ro = "ro-file-system-single-node-writer";
    assert_eq!(plugin.calls(), [format!("NodePublishVolume vol[0] - /local/csi/per-alloc/a1/vol[0]/{ro} readonly=true")]);
    plugin.calls.lock().unwrap().clear();
    manager.unmount_volume(&VolumeUse { external_id: String::new(), ..volume_use("a1", &usage(true)) }).await.unwrap();
    assert_eq!(plugin.calls(), [format!("NodeUnpublishVolume vol[0] /local/csi/per-alloc/a1/vol[0]/{ro}")], "no unstage");
}

#[tokio::test]
async fn unpublish_errors_are_ignorable_once_the_target_is_gone_and_reported_while_it_is_there() {
    let plugin = Arc::new(FakePlugin::default());
    let (dir, manager) = setup(plugin.clone()).await;
    let info = manager.mount_volume(&request("a1", false)).await.unwrap();
    let u = usage(false);
    // The plugin fails all three tries of NodeUnpublishVolume: the target is still there.
    plugin.node_fails.store(1, Ordering::SeqCst);
    let err = manager.unmount_volume(&volume_use("a1", &u)).await.unwrap_err();
    assert!(matches!(&err, VolumeError::Plugin(m) if m.contains("unpublishing volume \"vol[0]\"")), "{err}");
    // The fake counts one failure per call (the gRPC client's own retries are not in the fake);
    // the dir was removed anyway, so a second try finds nothing published there.
    assert!(!info.source.exists());
    plugin.node_fails.store(1, Ordering::SeqCst);
    manager.unmount_volume(&volume_use("a1", &u)).await.unwrap();
    assert!(dir.path().join("csi/monolith/hostpath").is_dir());
}

#[tokio::test]
async fn an_unknown_or_unhealthy_plugin_is_waited_for_within_a_bound_and_cancellable() {
    let plugin = Arc::new(FakePlugin::default());
    let (_dir, manager) = setup(plugin.clone()).await;
    let cancel = CancellationToken::new();
    manager.wait_for_node_plugin("hostpath", &cancel).await.unwrap();
    let err = manager.wait_for_node_plugin("other", &cancel).await.unwrap_err();
    assert_eq!(err.to_string(), "plugin other for type csi-node not found");
    plugin.probe_fails.store(true, Ordering::SeqCst);
    manager.fingerprint_due().await;
    cancel.cancel();
    let err = manager.wait_for_node_plugin("hostpath", &cancel).await.unwrap_err();
    assert!(matches!(err, VolumeError::Cancelled(_)), "{err}");
    let err = manager.mount_volume(&MountRequest { plugin_id: "other".into(), ..request("a1", false) }).await.unwrap_err();
    assert_eq!(err, VolumeError::PluginNotFound { plugin: "other".into() });
}

#[test]
fn mount_points_are_read_from_mountinfo_with_escapes() {
    let info = "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n37 35 0:1 / /proc rw - proc proc rw\n";
    let found: Vec<PathBuf> = mount_points(info).collect();
    assert_eq!(found, [PathBuf::from("/mnt/a b"), PathBuf::from("/proc")]);
    assert!(is_mount_point(Path::new("/proc")));
    assert!(!is_mount_point(Path::new("/proc/self")), "a dir that is no mount point");
    assert!(!is_mount_point(Path::new("/nonexistent/x")));
}

#[test]
fn the_usage_tracker_frees_a_pair_only_with_its_last_alloc() {
    let t = UsageTracker::default();
    let (rw, ro) = (usage(false), usage(true));
    let key = |ns: &str, u: &UsageOptions| UsageKey::new("p", ns, "v", u);
    t.claim(key("default", &rw), "a1", StagingLayout::Unnamespaced);
    t.claim(key("default", &rw), "a2", StagingLayout::Namespaced);
    t.claim(key("default", &ro), "a3", StagingLayout::Namespaced);
    t.claim(key("other", &rw), "a4", StagingLayout::Namespaced);
    assert_eq!(t.staged(&key("default", &rw)), Some(StagingLayout::Unnamespaced), "a pair keeps where it was first staged");
    assert!(!t.free(&key("default", &rw), "a1"));
    assert!(t.free(&key("default", &ro), "a3"), "another usage is another pair");
    assert!(t.free(&key("other", &rw), "a4"), "another namespace is another pair");
    assert!(t.free(&key("default", &rw), "a2"));
    assert_eq!(t.staged(&key("default", &rw)), None);
    assert!(t.free(&key("default", &rw), "a9"), "an unknown pair has no users");
}

#[tokio::test]
async fn one_volume_id_in_two_namespaces_is_staged_twice_and_unstaged_apart() {
    let plugin = Arc::new(FakePlugin::default());
    let (_dir, manager) = setup(plugin.clone()).await;
    let rw = "rw-file-system-single-node-writer";
    manager.mount_volume(&request("a1", false)).await.unwrap();
    let other = MountRequest { namespace: "other".into(), external_id: "ext-2".into(), ..request("a2", false) };
    manager.mount_volume(&other).await.unwrap();
    let stages: Vec<String> = plugin.calls().into_iter().filter(|c| c.starts_with("NodeStageVolume")).collect();
    assert_eq!(
        stages,
        [
            format!("NodeStageVolume ext-1 /local/csi/staging/prod/vol[0]/{rw}"),
            format!("NodeStageVolume ext-2 /local/csi/staging/other/vol[0]/{rw}")
        ]
    );
    plugin.calls.lock().unwrap().clear();
    let u = usage(false);
    manager.unmount_volume(&VolumeUse { namespace: "other".into(), external_id: "ext-2".into(), ..volume_use("a2", &u) }).await.unwrap();
    assert_eq!(
        plugin.calls(),
        [
            format!("NodeUnpublishVolume ext-2 /local/csi/per-alloc/a2/vol[0]/{rw}"),
            format!("NodeUnstageVolume ext-2 /local/csi/staging/other/vol[0]/{rw}"),
        ],
        "prod's volume is no user of other's"
    );
}

#[tokio::test]
async fn a_volume_staged_before_namespaced_staging_is_reused_and_unstaged_where_it_is() {
    let plugin = Arc::new(FakePlugin::default());
    let (dir, manager) = setup(plugin.clone()).await;
    let root = dir.path().join("csi/monolith/hostpath");
    let rw = "rw-file-system-single-node-writer";
    // An upgraded agent restores a1's mount, staged by its predecessor at staging/<vol>/<usage>.
    std::fs::create_dir_all(root.join(format!("staging/vol[0]/{rw}"))).unwrap();
    std::fs::create_dir_all(root.join(format!("per-alloc/a1/vol[0]/{rw}"))).unwrap();
    let u = usage(false);
    manager.restore_usage(&VolumeUse { staging_layout: StagingLayout::Unnamespaced, ..volume_use("a1", &u) });

    // A second alloc of the same namespace uses the volume staged where it is, and so records it.
    let info = manager.mount_volume(&request("a2", false)).await.unwrap();
    assert_eq!(info.staging_layout, StagingLayout::Unnamespaced);
    assert_eq!(
        plugin.calls(),
        [
            format!("NodeStageVolume ext-1 /local/csi/staging/vol[0]/{rw}"),
            format!("NodePublishVolume ext-1 /local/csi/staging/vol[0]/{rw} /local/csi/per-alloc/a2/vol[0]/{rw} readonly=false"),
        ]
    );
    plugin.calls.lock().unwrap().clear();
    // The restored stub says where it was staged; the last user unstages there.
    let a1 = VolumeUse { staging_layout: StagingLayout::Unnamespaced, ..volume_use("a1", &u) };
    manager.unmount_volume(&a1).await.unwrap();
    manager.unmount_volume(&VolumeUse { staging_layout: info.staging_layout, ..volume_use("a2", &u) }).await.unwrap();
    assert_eq!(
        plugin.calls(),
        [
            format!("NodeUnpublishVolume ext-1 /local/csi/per-alloc/a1/vol[0]/{rw}"),
            format!("NodeUnpublishVolume ext-1 /local/csi/per-alloc/a2/vol[0]/{rw}"),
            format!("NodeUnstageVolume ext-1 /local/csi/staging/vol[0]/{rw}"),
        ]
    );

    // Once unstaged, a new mount stages with the namespaced layout.
    plugin.calls.lock().unwrap().clear();
    let info = manager.mount_volume(&request("a3", false)).await.unwrap();
    assert_eq!(info.staging_layout, StagingLayout::Namespaced);
    assert_eq!(plugin.calls()[0], format!("NodeStageVolume ext-1 /local/csi/staging/prod/vol[0]/{rw}"));
}

#[test]
fn a_mount_info_persisted_without_a_layout_was_staged_before_namespaces() {
    let old: MountInfo = serde_json::from_str(r#"{"Source":"/s"}"#).unwrap();
    assert_eq!(old, MountInfo { source: "/s".into(), staging_layout: StagingLayout::Unnamespaced });
    let new = serde_json::to_string(&MountInfo::new("/s".into())).unwrap();
    assert_eq!(new, r#"{"Source":"/s","StagingLayout":"namespace/volume"}"#);
    assert_eq!(serde_json::from_str::<MountInfo>(&new).unwrap(), MountInfo::new("/s".into()));
}

#[tokio::test]
async fn a_servers_node_detach_unmounts_the_allocs_volume_through_the_manager() {
    use super::super::endpoint::{NodeDetach, VolumeManagerDetach};
    let plugin = Arc::new(FakePlugin::default());
    let (dir, manager) = setup(plugin.clone()).await;
    let info = manager.mount_volume(&request("a1", false)).await.unwrap();
    assert!(info.source.is_dir());
    let detach = VolumeManagerDetach(manager.clone());
    let req = nomad_proto::rpc::client_csi::ClientCsiNodeDetachRequest {
        plugin_id: "hostpath".into(),
        node_id: "n1".into(),
        namespace: "prod".into(),
        volume_id: "vol[0]".into(),
        external_id: "ext-1".into(),
        alloc_id: "a1".into(),
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        read_only: false,
    };
    detach.node_detach(req.clone()).await.unwrap();
    let rw = "rw-file-system-single-node-writer";
    let calls = plugin.calls();
    assert!(calls.contains(&format!("NodeUnpublishVolume ext-1 /local/csi/per-alloc/a1/vol[0]/{rw}")), "{calls:?}");
    assert!(calls.iter().any(|c| c.starts_with("NodeUnstageVolume ext-1")), "the last user: unstaged too: {calls:?}");
    assert!(!info.source.exists(), "the target dir is gone");
    let unknown = nomad_proto::rpc::client_csi::ClientCsiNodeDetachRequest { plugin_id: "nope".into(), ..req };
    let err = detach.node_detach(unknown).await.unwrap_err();
    assert!(err.starts_with("CSI.NodeDetachVolume: ") && err.contains("nope"), "{err}");
    drop(dir);
}
