use std::collections::VecDeque;
use std::path::Path;

use nomad_proto::alloc::DesiredStatus;
use nomad_proto::csi::CsiVolume;
use nomad_proto::{Job, Task, TaskGroup};

use super::super::CsiDeps;
use super::*;
use crate::client::csi::VolumeError;

/// A volume manager that records what it is asked.
#[derive(Default)]
pub(crate) struct FakeVolumes {
    pub(crate) calls: Mutex<Vec<String>>,
    /// Sources that are mount points.
    pub(crate) mounted: Mutex<Vec<PathBuf>>,
    pub(crate) unmount_fails: std::sync::atomic::AtomicU32,
}

impl FakeVolumes {
    fn calls(&self) -> Vec<String> {
        lock(&self.calls).clone()
    }
}

impl CsiVolumes for FakeVolumes {
    fn wait_for_node_plugin<'a>(&'a self, plugin_id: &'a str, _: &'a CancellationToken) -> BoxFuture<'a, Result<(), VolumeError>> {
        lock(&self.calls).push(format!("wait {plugin_id}"));
        Box::pin(async { Ok(()) })
    }
    fn mount_volume<'a>(&'a self, req: &'a MountRequest) -> BoxFuture<'a, Result<MountInfo, VolumeError>> {
        lock(&self.calls).push(format!(
            "mount {} {}/{} {} {}",
            req.plugin_id,
            req.namespace,
            req.volume_id,
            req.external_id,
            req.usage.to_fs()
        ));
        let source = PathBuf::from(format!("/csi/per-alloc/{}/{}", req.alloc_id, req.volume_id));
        lock(&self.mounted).push(source.clone());
        Box::pin(async move { Ok(MountInfo::new(source)) })
    }
    fn unmount_volume<'a>(&'a self, v: &'a VolumeUse) -> BoxFuture<'a, Result<(), VolumeError>> {
        lock(&self.calls).push(format!(
            "unmount {} {}/{} {} {} {} {:?}",
            v.plugin_id,
            v.namespace,
            v.volume_id,
            v.external_id,
            v.alloc_id,
            v.usage.to_fs(),
            v.staging_layout
        ));
        let fail = self.unmount_fails.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        Box::pin(async move { if fail { Err(VolumeError::Plugin("unpublishing: plugin down".into())) } else { Ok(()) } })
    }
    fn has_mount(&self, info: &MountInfo) -> bool {
        lock(&self.mounted).contains(&info.source)
    }
    fn restore_usage(&self, v: &VolumeUse) {
        lock(&self.calls).push(format!(
            "restore {} {}/{} {} {} {:?}",
            v.plugin_id,
            v.namespace,
            v.volume_id,
            v.alloc_id,
            v.usage.to_fs(),
            v.staging_layout
        ));
    }
}

/// Claim answers the test queues (then success), and every unpublish.
#[derive(Default)]
pub(crate) struct FakeRpc {
    pub(crate) claim_errors: Mutex<VecDeque<String>>,
    pub(crate) claims: Mutex<Vec<CsiVolumeClaimRequest>>,
    pub(crate) unpublishes: Mutex<Vec<CsiVolumeUnpublishRequest>>,
}

impl CsiClaimRpc for FakeRpc {
    fn claim(&self, req: CsiVolumeClaimRequest) -> BoxFuture<'static, Result<CsiVolumeClaimResponse, String>> {
        lock(&self.claims).push(req.clone());
        let result = match lock(&self.claim_errors).pop_front() {
            Some(e) => Err(e),
            None => Ok(CsiVolumeClaimResponse {
                volume: Some(CsiVolume {
                    id: req.volume_id.clone(),
                    external_id: format!("ext-{}", req.volume_id),
                    plugin_id: "hostpath".into(),
                    ..CsiVolume::default()
                }),
                ..CsiVolumeClaimResponse::default()
            }),
        };
        Box::pin(async move { result })
    }
    fn unpublish(&self, req: CsiVolumeUnpublishRequest) -> BoxFuture<'static, Result<(), String>> {
        lock(&self.unpublishes).push(req);
        Box::pin(async { Ok(()) })
    }
}

/// The CSI parts of a `HookEnv` for tests of other hooks (no CSI volumes are ever asked for).
pub(crate) fn no_csi() -> CsiDeps {
    CsiDeps {
        volumes: Arc::new(FakeVolumes::default()),
        rpc: Arc::new(FakeRpc::default()),
        node_id: "node-1".into(),
        mounts: CsiMounts::default(),
        save: Arc::new(|_, _| {}),
    }
}

struct Fixture {
    volumes: Arc<FakeVolumes>,
    rpc: Arc<FakeRpc>,
    mounts: CsiMounts,
    saved: Arc<Mutex<Vec<HookState>>>,
    cancel: CancellationToken,
    hook: CsiHook,
}

fn fixture() -> Fixture {
    let volumes = Arc::new(FakeVolumes::default());
    let rpc = Arc::new(FakeRpc::default());
    let mounts = CsiMounts::default();
    let saved = Arc::new(Mutex::new(Vec::new()));
    let cancel = CancellationToken::new();
    let s = saved.clone();
    let env = CsiHookEnv {
        volumes: volumes.clone(),
        rpc: rpc.clone(),
        node_id: "node-1".into(),
        region: "global".into(),
        mounts: mounts.clone(),
        cancel: cancel.clone(),
        shutdown: CancellationToken::new(),
        save: Arc::new(move |name, state| {
            assert_eq!(name, "csi");
            lock(&s).push(state.clone())
        }),
    };
    let hook = CsiHook::with_backoff(env, Duration::from_millis(1), Duration::from_millis(4));
    Fixture { volumes, rpc, mounts, saved, cancel, hook }
}

fn csi_volume(source: &str, read_only: bool, per_alloc: bool) -> VolumeRequest {
    VolumeRequest {
        name: "data".into(),
        volume_type: "csi".into(),
        source: source.into(),
        read_only,
        access_mode: "single-node-writer".into(),
        attachment_mode: "file-system".into(),
        per_alloc,
        ..VolumeRequest::default()
    }
}

fn alloc(driver: &str, volume: VolumeRequest) -> Allocation {
    let group = TaskGroup {
        name: "g".into(),
        tasks: vec![Task { name: "t".into(), driver: driver.into(), ..Task::default() }],
        volumes: BTreeMap::from([("data".to_string(), volume)]),
        ..TaskGroup::default()
    };
    let job = Job { id: "j".into(), namespace: "prod".into(), task_groups: vec![group], ..Job::default() };
    Allocation { id: "a1".into(), name: "j.g[2]".into(), task_group: "g".into(), job: Some(Arc::new(job)), ..Allocation::default() }
}

fn request<'a>(alloc: &'a Allocation, previous: Option<&'a HookState>) -> AllocHookRequest<'a> {
    AllocHookRequest { alloc, alloc_dir: Path::new("/allocs/a1"), previous }
}

/// Waits (bounded) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn prerun_claims_and_mounts_and_postrun_unmounts_then_unpublishes_once() {
    let f = fixture();
    let a = alloc("exec", csi_volume("vol", false, false));
    let state = PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap().expect("the stubs are persisted");
    let claims = lock(&f.rpc.claims).clone();
    assert_eq!(claims.len(), 1);
    let c = &claims[0];
    assert_eq!((c.volume_id.as_str(), c.allocation_id.as_str(), c.node_id.as_str(), c.namespace.as_str()), ("vol", "a1", "node-1", "prod"));
    assert_eq!((c.claim, c.state), (CsiVolumeClaimMode::Write, CsiVolumeClaimState::Taken));
    assert_eq!((c.access_mode, c.attachment_mode), (CsiVolumeAccessMode::SingleNodeWriter, CsiVolumeAttachmentMode::FileSystem));
    assert_eq!(f.volumes.calls(), ["wait hostpath", "mount hostpath prod/vol ext-vol rw-file-system-single-node-writer"]);
    assert_eq!(mount_source(&f.mounts, "data"), Some(PathBuf::from("/csi/per-alloc/a1/vol")));
    let stubs = stubs_of(Some(&state));
    assert_eq!(stubs["data"].mount_info.as_ref().unwrap().source, Path::new("/csi/per-alloc/a1/vol"));
    assert_eq!(stubs["data"].plugin_id, "hostpath");
    assert!(!state.done, "prerun runs again after a restart, to restore the mounts");

    PostrunHook::postrun(&f.hook, &request(&a, Some(&state))).unwrap();
    assert!(lock(&f.mounts).is_empty(), "the tasks lose the mounts");
    until("the unpublish", || lock(&f.rpc.unpublishes).len() == 1).await;
    let calls = f.volumes.calls();
    assert_eq!(calls.last().unwrap(), "unmount hostpath prod/vol ext-vol a1 rw-file-system-single-node-writer Namespaced");
    let u = lock(&f.rpc.unpublishes)[0].clone();
    assert_eq!((u.volume_id.as_str(), u.namespace.as_str()), ("vol", "prod"));
    let claim = u.claim.unwrap();
    assert_eq!((claim.allocation_id.as_str(), claim.node_id.as_str()), ("a1", "node-1"));
    assert_eq!((claim.mode, claim.state), (CsiVolumeClaimMode::Write, CsiVolumeClaimState::Unpublishing));
    assert_eq!(claim.access_mode, CsiVolumeAccessMode::SingleNodeWriter);
    until("the emptied state", || lock(&f.saved).len() == 1).await;
    assert!(stubs_of(lock(&f.saved).first()).is_empty(), "a restarted agent does not release twice");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(lock(&f.rpc.unpublishes).len(), 1, "one Unpublish");
}

#[tokio::test]
async fn a_failed_unmount_is_retried_before_the_one_unpublish() {
    let f = fixture();
    let a = alloc("oci", csi_volume("vol", true, false));
    let state = PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap();
    assert_eq!(lock(&f.rpc.claims)[0].claim, CsiVolumeClaimMode::Read, "read_only claims as a reader");
    f.volumes.unmount_fails.store(2, Ordering::SeqCst);
    PostrunHook::postrun(&f.hook, &request(&a, state.as_ref())).unwrap();
    until("the unpublish", || lock(&f.rpc.unpublishes).len() == 1).await;
    let unmounts = f.volumes.calls().iter().filter(|c| c.starts_with("unmount")).count();
    assert_eq!(unmounts, 3, "two failures, then success, then the unpublish");
    assert_eq!(lock(&f.rpc.unpublishes)[0].claim.as_ref().unwrap().mode, CsiVolumeClaimMode::Read);
}

#[tokio::test]
async fn claims_are_retried_only_on_nomads_retryable_texts() {
    let f = fixture();
    let a = alloc("exec", csi_volume("vol", false, true));
    lock(&f.rpc.claim_errors).extend(["rpc error: volume max claims reached".to_string(), "No cluster leader".to_string()]);
    PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap();
    let claims = lock(&f.rpc.claims).clone();
    assert_eq!(claims.len(), 3);
    assert_eq!(claims[0].volume_id, "vol[2]", "per_alloc: the alloc's index");

    let f = fixture();
    lock(&f.rpc.claim_errors).push_back("volume not found: vol[2]".into());
    let err = PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap_err();
    assert_eq!(err.0, "claiming volumes: could not claim volume vol[2]: volume not found: vol[2]");
    assert_eq!(lock(&f.rpc.claims).len(), 1, "not retried");
    assert!(f.volumes.calls().is_empty(), "nothing mounted");
    assert!(is_retryable_claim_error("no servers known") && is_retryable_claim_error("CSI client error (retryable): x"));
}

#[tokio::test]
async fn a_claim_waiting_for_a_free_volume_gives_up_when_the_alloc_stops() {
    let f = fixture();
    let a = alloc("exec", csi_volume("vol", false, false));
    lock(&f.rpc.claim_errors).extend(std::iter::repeat_n("volume max claims reached".to_string(), 100_000));
    let req = request(&a, None);
    let prerun = PrerunHook::prerun(&f.hook, &req);
    let stopped = Allocation { desired_status: DesiredStatus::Stop, ..a.clone() };
    let stop = async {
        until("a few claims", || lock(&f.rpc.claims).len() >= 3).await;
        UpdateHook::update(&f.hook, &request(&stopped, None)).unwrap();
    };
    let (result, ()) = tokio::join!(prerun, stop);
    let err = result.unwrap_err();
    assert!(err.0.contains("volume max claims reached (gave up: the allocation stopped)"), "{}", err.0);
    let _ = &f.cancel;
}

#[tokio::test]
async fn a_restored_mount_is_kept_without_claim_or_publish_and_a_lost_one_is_claimed_again() {
    let f = fixture();
    let a = alloc("exec", csi_volume("vol", false, false));
    let state = PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap().unwrap();

    // A restarted agent: a new hook, the same volume manager (the mount is still there).
    let g = Fixture { volumes: f.volumes.clone(), ..fixture() };
    let env_hook = {
        let env = CsiHookEnv {
            volumes: g.volumes.clone(),
            rpc: g.rpc.clone(),
            node_id: "node-1".into(),
            region: "global".into(),
            mounts: g.mounts.clone(),
            cancel: CancellationToken::new(),
            shutdown: CancellationToken::new(),
            save: Arc::new(|_, _| {}),
        };
        CsiHook::with_backoff(env, Duration::from_millis(1), Duration::from_millis(4))
    };
    lock(&f.volumes.calls).clear();
    let again = PrerunHook::prerun(&env_hook, &request(&a, Some(&state))).await.unwrap().unwrap();
    assert!(lock(&g.rpc.claims).is_empty(), "no claim");
    assert_eq!(
        f.volumes.calls(),
        ["wait hostpath", "restore hostpath prod/vol a1 rw-file-system-single-node-writer Namespaced"],
        "no mount"
    );
    assert_eq!(stubs_of(Some(&again)), stubs_of(Some(&state)));
    assert_eq!(mount_source(&g.mounts, "data"), Some(PathBuf::from("/csi/per-alloc/a1/vol")));

    // The mount went away meanwhile: claimed and mounted again.
    lock(&f.volumes.mounted).clear();
    lock(&f.volumes.calls).clear();
    PrerunHook::prerun(&env_hook, &request(&a, Some(&state))).await.unwrap();
    assert_eq!(lock(&g.rpc.claims).len(), 1);
    assert_eq!(f.volumes.calls(), ["wait hostpath", "wait hostpath", "mount hostpath prod/vol ext-vol rw-file-system-single-node-writer"]);
}

/// The `csi` hook state an agent from before namespaced staging persisted for alloc `a1` with
/// volume `vol` mounted (no `StagingLayout` in its mount info).
const STUBS_BEFORE_NAMESPACED_STAGING: &str = r#"{"data":{"VolumeID":"vol","VolumeExternalID":"ext-vol","PluginID":"hostpath","Namespace":"prod","Write":true,"Usage":{"ReadOnly":false,"AttachmentMode":"file-system","AccessMode":"single-node-writer","MountOptions":null},"MountInfo":{"Source":"/csi/per-alloc/a1/vol"}}}"#;

#[tokio::test]
async fn a_mount_restored_from_an_agent_before_namespaced_staging_is_unstaged_where_it_was_staged() {
    let f = fixture();
    let a = alloc("exec", csi_volume("vol", false, false));
    let old = HookState { done: false, data: BTreeMap::from([("volumes".to_string(), STUBS_BEFORE_NAMESPACED_STAGING.to_string())]) };
    lock(&f.volumes.mounted).push(PathBuf::from("/csi/per-alloc/a1/vol"));
    let state = PrerunHook::prerun(&f.hook, &request(&a, Some(&old))).await.unwrap().unwrap();
    assert!(lock(&f.rpc.claims).is_empty(), "still mounted: no claim");
    assert_eq!(
        f.volumes.calls(),
        ["wait hostpath", "restore hostpath prod/vol a1 rw-file-system-single-node-writer Unnamespaced"],
        "restored with the layout it was staged with, not remounted"
    );
    let stubs = stubs_of(Some(&state));
    assert_eq!(stubs["data"].mount_info.as_ref().unwrap().staging_layout, StagingLayout::Unnamespaced, "persisted as such");

    PostrunHook::postrun(&f.hook, &request(&a, Some(&state))).unwrap();
    until("the unpublish", || lock(&f.rpc.unpublishes).len() == 1).await;
    assert_eq!(f.volumes.calls().last().unwrap(), "unmount hostpath prod/vol ext-vol a1 rw-file-system-single-node-writer Unnamespaced");
}

#[tokio::test]
async fn a_group_whose_tasks_take_no_mounts_is_refused_and_a_group_without_csi_volumes_is_skipped() {
    let f = fixture();
    let a = alloc("raw_exec", csi_volume("vol", false, false));
    let err = PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap_err();
    assert_eq!(err.0, "no task supports CSI");
    assert!(lock(&f.rpc.claims).is_empty());
    let host = VolumeRequest { volume_type: "host".into(), ..csi_volume("vol", false, false) };
    let a = alloc("raw_exec", host);
    assert_eq!(PrerunHook::prerun(&f.hook, &request(&a, None)).await.unwrap(), None);
    PostrunHook::postrun(&f.hook, &request(&a, None)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(lock(&f.rpc.unpublishes).is_empty());
}
