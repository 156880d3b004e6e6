use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

#[test]
fn capability_sets_read_every_known_capability() {
    use v1::controller_service_capability as c;
    use v1::node_service_capability as n;
    use v1::plugin_capability as p;
    let plugin = v1::GetPluginCapabilitiesResponse {
        capabilities: vec![
            v1::PluginCapability { r#type: Some(p::Type::Service(p::Service { r#type: p::service::Type::ControllerService as i32 })) },
            v1::PluginCapability {
                r#type: Some(p::Type::VolumeExpansion(p::VolumeExpansion { r#type: p::volume_expansion::Type::Online as i32 })),
            },
            // A value from a newer spec reads as unknown.
            v1::PluginCapability { r#type: Some(p::Type::Service(p::Service { r#type: 99 })) },
            v1::PluginCapability { r#type: None },
        ],
    };
    assert_eq!(PluginCapabilities::from(&plugin), PluginCapabilities { controller_service: true, accessibility_constraints: false });

    let node = |types: &[n::rpc::Type]| v1::NodeGetCapabilitiesResponse {
        capabilities: types
            .iter()
            .map(|t| v1::NodeServiceCapability { r#type: Some(n::Type::Rpc(n::Rpc { r#type: *t as i32 })) })
            .collect(),
    };
    assert_eq!(NodeCapabilities::from(&node(&[])), NodeCapabilities::default());
    let all = NodeCapabilities::from(&node(&[
        n::rpc::Type::StageUnstageVolume,
        n::rpc::Type::GetVolumeStats,
        n::rpc::Type::ExpandVolume,
        n::rpc::Type::VolumeCondition,
    ]));
    assert_eq!(all, NodeCapabilities { stage_unstage_volume: true, get_volume_stats: true, expand_volume: true, volume_condition: true });

    let controller = v1::ControllerGetCapabilitiesResponse {
        capabilities: [c::rpc::Type::PublishUnpublishVolume, c::rpc::Type::PublishReadonly, c::rpc::Type::GetVolume]
            .iter()
            .map(|t| v1::ControllerServiceCapability { r#type: Some(c::Type::Rpc(c::Rpc { r#type: *t as i32 })) })
            .collect(),
    };
    let caps = ControllerCapabilities::from(&controller);
    assert!(caps.publish_unpublish_volume && caps.publish_readonly && caps.get_volume);
    assert!(!caps.create_delete_volume && !caps.list_volumes && !caps.expand_volume);
}

#[tokio::test]
async fn statuses_are_explained_in_nomads_words() {
    let client = GrpcPluginClient::new(Path::new("/run/csi.sock")).unwrap();
    let explain = |code| match code {
        Code::NotFound => Some((true, "volume \"v\" could not be found".to_string())),
        Code::Internal => Some((false, INTERNAL_NODE.to_string())),
        _ => None,
    };
    let status = |code, message: &str| Failure::Status(Status::new(code, message));
    let per_try = Duration::from_secs(120);

    let ignorable = client.error("NodeUnpublishVolume", per_try, status(Code::NotFound, "no volume v"), 1, &explain);
    assert_eq!(
        ignorable.to_string(),
        "CSI client error (ignorable): volume \"v\" could not be found: rpc error: code = NotFound desc = no volume v"
    );
    assert!(ignorable.is_ignorable() && !ignorable.is_retryable());

    let internal = client.error("NodeUnpublishVolume", per_try, status(Code::Internal, "boom"), 1, &explain);
    assert!(internal.to_string().contains("check the plugin allocation logs") && !internal.is_ignorable());

    let busy = client.error("NodeUnpublishVolume", per_try, status(Code::Unavailable, "busy"), 3, &explain);
    assert_eq!(busy.to_string(), "rpc error: code = Unavailable desc = busy", "Nomad's text: the caller names the RPC");
    assert!(busy.is_retryable() && busy.code() == Some(Code::Unavailable));
    assert!(client.error("X", per_try, status(Code::ResourceExhausted, ""), 3, &explain).is_retryable());
    for final_code in [Code::InvalidArgument, Code::FailedPrecondition, Code::AlreadyExists, Code::Unimplemented, Code::Aborted] {
        assert!(!client.error("X", per_try, status(final_code, ""), 1, &explain).is_retryable(), "{final_code:?}");
    }

    let timeout = client.error("NodeStageVolume", per_try, Failure::Timeout, 3, &explain);
    assert_eq!(timeout.to_string(), "NodeStageVolume: the plugin did not answer within 120s (try 3)");
    assert!(timeout.is_retryable());
    let missing = client.error("Probe", per_try, Failure::NoSocket, 1, &explain);
    assert_eq!(missing.to_string(), "Probe: CSI plugin socket /run/csi.sock does not exist");
    assert!(missing.is_retryable());
}

#[tokio::test]
async fn requests_missing_required_fields_are_never_sent() {
    // No socket exists: a request that got past the checks would fail as unreachable.
    let client = GrpcPluginClient::new(Path::new("/nonexistent/csi.sock")).unwrap();
    let capability = Some(crate::capability::volume_capability("file-system", "single-node-writer", "", &[]).unwrap());
    let stage = v1::NodeStageVolumeRequest { volume_id: "v".into(), volume_capability: capability.clone(), ..Default::default() };
    let err = client.node_stage_volume(stage).await.unwrap_err();
    assert_eq!(err, CsiError::InvalidRequest { method: "NodeStageVolume", what: "missing StagingTargetPath".into() });
    let publish = v1::NodePublishVolumeRequest { volume_id: "v".into(), target_path: "/t".into(), ..Default::default() };
    assert_eq!(client.node_publish_volume(publish).await.unwrap_err().to_string(), "NodePublishVolume: missing VolumeCapabilities");
    assert_eq!(
        client.node_unstage_volume(String::new(), "/s".into()).await.unwrap_err().to_string(),
        "NodeUnstageVolume: missing volumeID"
    );
    let controller =
        v1::ControllerPublishVolumeRequest { volume_id: "v".into(), volume_capability: capability.clone(), ..Default::default() };
    assert_eq!(client.controller_publish_volume(controller).await.unwrap_err().to_string(), "ControllerPublishVolume: missing NodeID");
    let create = |range| v1::CreateVolumeRequest {
        name: "n".into(),
        volume_capabilities: vec![capability.clone().unwrap()],
        capacity_range: Some(range),
        ..Default::default()
    };
    let err = client.create_volume(create(v1::CapacityRange { required_bytes: 10, limit_bytes: 5 })).await.unwrap_err();
    assert_eq!(err.to_string(), "CreateVolume: LimitBytes cannot be less than RequiredBytes");
    let err = client.create_volume(create(v1::CapacityRange::default())).await.unwrap_err();
    assert!(err.to_string().contains("one of LimitBytes or RequiredBytes must be set"), "{err}");
    let validate = v1::ValidateVolumeCapabilitiesRequest { volume_id: "v".into(), ..Default::default() };
    assert_eq!(
        client.validate_volume_capabilities(validate).await.unwrap_err().to_string(),
        "ValidateVolumeCapabilities: missing Capabilities"
    );
}

/// A fake plugin: the interface is narrow enough to stand in for a real one.
struct FakePlugin {
    /// Probe answers, in order; the last repeats.
    answers: Mutex<Vec<Result<bool, CsiError>>>,
    probes: AtomicU32,
}

impl FakePlugin {
    fn answering(answers: Vec<Result<bool, CsiError>>) -> FakePlugin {
        FakePlugin { answers: Mutex::new(answers), probes: AtomicU32::new(0) }
    }
}

fn not_faked<T>() -> BoxFuture<'static, Result<T, CsiError>> {
    Box::pin(async { Err(CsiError::BadResponse { method: "fake", what: "not faked".into() }) })
}

impl CsiPluginClient for FakePlugin {
    fn probe(&self) -> BoxFuture<'_, Result<bool, CsiError>> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        let mut answers = self.answers.lock().unwrap();
        let answer = if answers.len() > 1 { answers.remove(0) } else { answers[0].clone() };
        Box::pin(async move { answer })
    }
    fn plugin_info(&self) -> BoxFuture<'_, Result<PluginInfo, CsiError>> {
        not_faked()
    }
    fn plugin_capabilities(&self) -> BoxFuture<'_, Result<PluginCapabilities, CsiError>> {
        not_faked()
    }
    fn node_info(&self) -> BoxFuture<'_, Result<NodeInfo, CsiError>> {
        not_faked()
    }
    fn node_capabilities(&self) -> BoxFuture<'_, Result<NodeCapabilities, CsiError>> {
        not_faked()
    }
    fn node_stage_volume(&self, _: v1::NodeStageVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
    fn node_unstage_volume(&self, _: String, _: String) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
    fn node_publish_volume(&self, _: v1::NodePublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
    fn node_unpublish_volume(&self, _: String, _: String) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
    fn controller_capabilities(&self) -> BoxFuture<'_, Result<ControllerCapabilities, CsiError>> {
        not_faked()
    }
    fn controller_publish_volume(&self, _: v1::ControllerPublishVolumeRequest) -> BoxFuture<'_, Result<HashMap<String, String>, CsiError>> {
        not_faked()
    }
    fn controller_unpublish_volume(&self, _: v1::ControllerUnpublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
    fn create_volume(&self, _: v1::CreateVolumeRequest) -> BoxFuture<'_, Result<v1::Volume, CsiError>> {
        not_faked()
    }
    fn delete_volume(&self, _: v1::DeleteVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
    fn validate_volume_capabilities(&self, _: v1::ValidateVolumeCapabilitiesRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        not_faked()
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_is_probed_every_interval_until_the_health_timeout() {
    let unreachable = CsiError::Unreachable { method: "Probe", reason: "no socket yet".into() };
    let plugin = FakePlugin::answering(vec![Err(unreachable), Ok(false), Ok(true)]);
    let started = tokio::time::Instant::now();
    wait_until_ready(&plugin, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap();
    assert_eq!(plugin.probes.load(Ordering::SeqCst), 3);
    assert_eq!(started.elapsed(), Duration::from_secs(10), "two 5 s waits");

    let never = FakePlugin::answering(vec![Ok(false)]);
    let err = wait_until_ready(&never, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err, CsiError::NotReady { after: Duration::from_secs(30), last: "the plugin is not ready".into() });
    assert_eq!(never.probes.load(Ordering::SeqCst), 6, "at 0, 5, ..., 25 s; the next would be past the timeout");
}
