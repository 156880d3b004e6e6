use std::collections::HashMap;
use std::sync::Mutex;

use nomad_csi::client::{ControllerCapabilities, NodeCapabilities, NodeInfo, PluginCapabilities, PluginInfo};
use nomad_proto::csi::CsiVolumeCapability;
use nomad_proto::rpc::client_csi::CsiControllerQuery;

use super::*;

/// A controller plugin that records what it was asked.
#[derive(Default)]
struct Recorder {
    publishes: Mutex<Vec<v1::ControllerPublishVolumeRequest>>,
    unpublishes: Mutex<Vec<v1::ControllerUnpublishVolumeRequest>>,
    creates: Mutex<Vec<v1::CreateVolumeRequest>>,
    deletes: Mutex<Vec<v1::DeleteVolumeRequest>>,
    validations: Mutex<Vec<v1::ValidateVolumeCapabilitiesRequest>>,
    /// Validation answers NOT_FOUND, as for a volume the provider does not have.
    validate_not_found: bool,
    /// The unpublish answer: NOT_FOUND (ignorable) or a real failure.
    unpublish_fails_hard: bool,
    hang: bool,
}

fn status(method: &'static str, code: tonic::Code, ignorable: bool) -> CsiError {
    CsiError::Status { method, code, message: format!("rpc error: code = {code:?} desc = test"), ignorable }
}

impl CsiPluginClient for Recorder {
    fn probe(&self) -> BoxFuture<'_, Result<bool, CsiError>> {
        Box::pin(async { Ok(true) })
    }
    fn plugin_info(&self) -> BoxFuture<'_, Result<PluginInfo, CsiError>> {
        Box::pin(async { Ok(PluginInfo { name: "hostpath.csi.k8s.io".into(), vendor_version: "1".into() }) })
    }
    fn plugin_capabilities(&self) -> BoxFuture<'_, Result<PluginCapabilities, CsiError>> {
        Box::pin(async { Ok(PluginCapabilities::default()) })
    }
    fn node_info(&self) -> BoxFuture<'_, Result<NodeInfo, CsiError>> {
        Box::pin(async { Err(status("NodeGetInfo", tonic::Code::Unimplemented, false)) })
    }
    fn node_capabilities(&self) -> BoxFuture<'_, Result<NodeCapabilities, CsiError>> {
        Box::pin(async { Ok(NodeCapabilities::default()) })
    }
    fn node_stage_volume(&self, _: v1::NodeStageVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async { Ok(()) })
    }
    fn node_unstage_volume(&self, _: String, _: String) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async { Ok(()) })
    }
    fn node_publish_volume(&self, _: v1::NodePublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async { Ok(()) })
    }
    fn node_unpublish_volume(&self, _: String, _: String) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async { Ok(()) })
    }
    fn controller_capabilities(&self) -> BoxFuture<'_, Result<ControllerCapabilities, CsiError>> {
        Box::pin(async { Ok(ControllerCapabilities::default()) })
    }
    fn controller_publish_volume(&self, r: v1::ControllerPublishVolumeRequest) -> BoxFuture<'_, Result<HashMap<String, String>, CsiError>> {
        self.publishes.lock().unwrap().push(r);
        let hang = self.hang;
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok(HashMap::from([("device".to_string(), "/dev/loop7".to_string())]))
        })
    }
    fn controller_unpublish_volume(&self, r: v1::ControllerUnpublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        self.unpublishes.lock().unwrap().push(r);
        let e = if self.unpublish_fails_hard {
            status("ControllerUnpublishVolume", tonic::Code::Internal, false)
        } else {
            status("ControllerUnpublishVolume", tonic::Code::NotFound, true)
        };
        Box::pin(async move { Err(e) })
    }
    fn create_volume(&self, r: v1::CreateVolumeRequest) -> BoxFuture<'_, Result<v1::Volume, CsiError>> {
        self.creates.lock().unwrap().push(r);
        Box::pin(async {
            Ok(v1::Volume {
                capacity_bytes: 4096,
                volume_id: "hp-1".into(),
                volume_context: HashMap::from([("path".to_string(), "/srv/hp-1".to_string())]),
                content_source: None,
                accessible_topology: vec![v1::Topology { segments: HashMap::from([("rack".to_string(), "r1".to_string())]) }],
            })
        })
    }
    fn delete_volume(&self, r: v1::DeleteVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        self.deletes.lock().unwrap().push(r);
        Box::pin(async { Ok(()) })
    }
    fn validate_volume_capabilities(&self, r: v1::ValidateVolumeCapabilitiesRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        self.validations.lock().unwrap().push(r);
        let refused = self.validate_not_found.then(|| status("ValidateVolumeCapabilities", tonic::Code::NotFound, false));
        Box::pin(async move { refused.map_or(Ok(()), Err) })
    }
}

/// One controller, `hostpath`, or none.
struct Plugins(Option<Arc<Recorder>>);

impl ControllerPlugins for Plugins {
    fn controller(&self, plugin_id: &str) -> Result<Arc<dyn CsiPluginClient>, String> {
        match (&self.0, plugin_id) {
            (Some(r), "hostpath") => Ok(r.clone() as Arc<dyn CsiPluginClient>),
            _ => Err(format!("csi-controller plugin {plugin_id:?} is not running on this client")),
        }
    }
}

fn endpoint(r: Option<Arc<Recorder>>) -> CsiEndpoint {
    CsiEndpoint::new(Arc::new(Plugins(r)), Arc::new(NoVolumeManager))
}

fn query() -> CsiControllerQuery {
    CsiControllerQuery { controller_node_id: "n1".into(), plugin_id: "hostpath".into() }
}

fn attach() -> ClientCsiControllerAttachRequest {
    ClientCsiControllerAttachRequest {
        controller: query(),
        volume_id: "vol-ext".into(),
        client_csi_node_id: "node-ext".into(),
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        access_mode: CsiVolumeAccessMode::MultiNodeReader,
        mount_options: Some(CsiMountOptions { fs_type: "ext4".into(), mount_flags: vec!["noatime".into()] }),
        read_only: true,
        secrets: BTreeMap::from([("k".to_string(), "v".to_string())]),
        volume_context: BTreeMap::from([("c".to_string(), "d".to_string())]),
    }
}

#[tokio::test]
async fn attach_publishes_through_the_local_controller_and_answers_its_context() {
    let r = Arc::new(Recorder::default());
    let e = endpoint(Some(r.clone()));
    let answer = e.handle(methods::CONTROLLER_ATTACH, serde_json::to_value(attach()).unwrap()).await.unwrap();
    let answer: ClientCsiControllerAttachResponse = serde_json::from_value(answer).unwrap();
    assert_eq!(answer.publish_context["device"], "/dev/loop7");
    let asked = r.publishes.lock().unwrap()[0].clone();
    assert_eq!((asked.volume_id.as_str(), asked.node_id.as_str(), asked.readonly), ("vol-ext", "node-ext", true));
    assert_eq!(asked.secrets["k"], "v");
    assert_eq!(asked.volume_context["c"], "d");
    let cap = asked.volume_capability.unwrap();
    assert_eq!(cap.access_mode.unwrap().mode, v1::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32);
    let Some(v1::volume_capability::AccessType::Mount(m)) = cap.access_type else { panic!("a file system") };
    assert_eq!((m.fs_type.as_str(), m.mount_flags), ("ext4", vec!["noatime".to_string()]));

    // Fields the call needs, refused before the plugin is asked.
    let mut bad = attach();
    bad.client_csi_node_id.clear();
    let err = e.handle(methods::CONTROLLER_ATTACH, serde_json::to_value(bad).unwrap()).await.unwrap_err();
    assert_eq!(err, "CSI.ControllerAttachVolume: ClientCSINodeID is required");
    assert_eq!(r.publishes.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_controller_not_running_here_is_retryable_and_every_call_has_a_budget() {
    let err = endpoint(None).handle(methods::CONTROLLER_ATTACH, serde_json::to_value(attach()).unwrap()).await.unwrap_err();
    assert!(err.starts_with("CSI.ControllerAttachVolume: CSI client error (retryable): "), "{err}");
    assert!(err.contains("\"hostpath\" is not running on this client"), "{err}");

    let hung = Arc::new(Recorder { hang: true, ..Recorder::default() });
    let e = endpoint(Some(hung)).with_timeout(Duration::from_millis(100));
    let err = e.handle(methods::CONTROLLER_ATTACH, serde_json::to_value(attach()).unwrap()).await.unwrap_err();
    assert_eq!(err, "CSI.ControllerAttachVolume: the plugin did not answer within 0s");
}

#[tokio::test]
async fn detach_of_a_volume_already_gone_succeeds_and_a_real_failure_says_so() {
    let r = Arc::new(Recorder::default());
    let detach = ClientCsiControllerDetachRequest {
        controller: query(),
        volume_id: "vol-ext".into(),
        client_csi_node_id: "node-ext".into(),
        secrets: BTreeMap::from([("k".to_string(), "v".to_string())]),
    };
    endpoint(Some(r.clone())).handle(methods::CONTROLLER_DETACH, serde_json::to_value(&detach).unwrap()).await.unwrap();
    let asked = r.unpublishes.lock().unwrap()[0].clone();
    assert_eq!((asked.volume_id.as_str(), asked.node_id.as_str()), ("vol-ext", "node-ext"));
    let hard = Arc::new(Recorder { unpublish_fails_hard: true, ..Recorder::default() });
    let err = endpoint(Some(hard)).handle(methods::CONTROLLER_DETACH, serde_json::to_value(&detach).unwrap()).await.unwrap_err();
    assert!(err.starts_with("CSI.ControllerDetachVolume: rpc error: code = Internal"), "{err}");
}

#[tokio::test]
async fn create_and_delete_go_to_the_controller_with_nomads_fields() {
    let r = Arc::new(Recorder::default());
    let e = endpoint(Some(r.clone()));
    let create = ClientCsiControllerCreateRequest {
        controller: query(),
        name: "data".into(),
        volume_capabilities: vec![CsiVolumeCapability {
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        }],
        parameters: BTreeMap::from([("p".to_string(), "1".to_string())]),
        capacity_min: 1024,
        capacity_max: 8192,
        snapshot_id: "snap-1".into(),
        requested_topologies: Some(CsiTopologyRequest {
            required: vec![CsiTopology { segments: BTreeMap::from([("rack".to_string(), "r1".to_string())]) }],
            preferred: vec![],
        }),
        ..ClientCsiControllerCreateRequest::default()
    };
    let answer = e.handle(methods::CONTROLLER_CREATE, serde_json::to_value(&create).unwrap()).await.unwrap();
    let answer: ClientCsiControllerCreateResponse = serde_json::from_value(answer).unwrap();
    assert_eq!((answer.external_volume_id.as_str(), answer.capacity_bytes), ("hp-1", 4096));
    assert_eq!(answer.volume_context["path"], "/srv/hp-1");
    assert_eq!(answer.topologies, vec![CsiTopology { segments: BTreeMap::from([("rack".to_string(), "r1".to_string())]) }]);
    let asked = r.creates.lock().unwrap()[0].clone();
    assert_eq!(asked.name, "data");
    assert_eq!(asked.capacity_range, Some(v1::CapacityRange { required_bytes: 1024, limit_bytes: 8192 }));
    assert_eq!(asked.parameters["p"], "1");
    assert_eq!(asked.volume_capabilities.len(), 1);
    assert!(matches!(
        asked.volume_content_source.and_then(|s| s.r#type),
        Some(v1::volume_content_source::Type::Snapshot(s)) if s.snapshot_id == "snap-1"
    ));
    assert_eq!(asked.accessibility_requirements.unwrap().requisite[0].segments["rack"], "r1");
    let mut both = create.clone();
    both.clone_id = "vol-2".into();
    let err = e.handle(methods::CONTROLLER_CREATE, serde_json::to_value(&both).unwrap()).await.unwrap_err();
    assert!(err.contains("one of SnapshotID or CloneID"), "{err}");

    let delete = ClientCsiControllerDeleteRequest { controller: query(), external_volume_id: "hp-1".into(), secrets: BTreeMap::new() };
    e.handle(methods::CONTROLLER_DELETE, serde_json::to_value(&delete).unwrap()).await.unwrap();
    assert_eq!(r.deletes.lock().unwrap()[0].volume_id, "hp-1");
}

#[tokio::test]
async fn node_detach_goes_to_the_volume_manager_and_without_one_says_so() {
    let e = endpoint(None);
    let req = ClientCsiNodeDetachRequest {
        plugin_id: "hostpath".into(),
        node_id: "n1".into(),
        volume_id: "vol".into(),
        alloc_id: "a1".into(),
        ..ClientCsiNodeDetachRequest::default()
    };
    let err = e.handle(methods::NODE_DETACH, serde_json::to_value(&req).unwrap()).await.unwrap_err();
    assert!(err.contains("has no CSI volume manager") && err.contains("\"vol\"") && err.contains("a1"), "{err}");
    let mut missing = req.clone();
    missing.alloc_id.clear();
    assert_eq!(
        e.handle(methods::NODE_DETACH, serde_json::to_value(&missing).unwrap()).await.unwrap_err(),
        "CSI.NodeDetachVolume: AllocID is required"
    );

    struct Detacher(Mutex<Vec<ClientCsiNodeDetachRequest>>);
    impl NodeDetach for Detacher {
        fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), String>> {
            self.0.lock().unwrap().push(req);
            Box::pin(async { Ok(()) })
        }
    }
    let detacher = Arc::new(Detacher(Mutex::new(Vec::new())));
    let e = CsiEndpoint::new(Arc::new(Plugins(None)), detacher.clone());
    e.handle(methods::NODE_DETACH, serde_json::to_value(&req).unwrap()).await.unwrap();
    assert_eq!(detacher.0.lock().unwrap()[0], req);
    let err = e.handle("CSI.Nope", serde_json::json!({})).await.unwrap_err();
    assert_eq!(err, "unknown client rpc \"CSI.Nope\"");
    let err = e.handle(methods::CONTROLLER_DELETE, serde_json::json!({"Secrets": 7})).await.unwrap_err();
    assert!(err.starts_with("CSI.ControllerDeleteVolume: decoding the request"), "{err}");
}

#[tokio::test]
async fn validate_asks_the_controller_with_the_volumes_capabilities_and_reports_a_refusal() {
    let r = Arc::new(Recorder::default());
    let req = ClientCsiControllerValidateVolumeRequest {
        controller: query(),
        volume_id: "vol-ext".into(),
        volume_capabilities: vec![CsiVolumeCapability {
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        }],
        parameters: BTreeMap::from([("p".to_string(), "1".to_string())]),
        context: BTreeMap::from([("c".to_string(), "d".to_string())]),
        secrets: BTreeMap::from([("k".to_string(), "v".to_string())]),
        ..ClientCsiControllerValidateVolumeRequest::default()
    };
    endpoint(Some(r.clone())).handle(methods::CONTROLLER_VALIDATE, serde_json::to_value(&req).unwrap()).await.unwrap();
    let asked = r.validations.lock().unwrap()[0].clone();
    assert_eq!(asked.volume_id, "vol-ext");
    assert_eq!((asked.parameters["p"].as_str(), asked.volume_context["c"].as_str(), asked.secrets["k"].as_str()), ("1", "d", "v"));
    let mode = asked.volume_capabilities[0].access_mode.unwrap().mode;
    assert_eq!(mode, v1::volume_capability::access_mode::Mode::SingleNodeWriter as i32);

    let refusing = Arc::new(Recorder { validate_not_found: true, ..Recorder::default() });
    let err = endpoint(Some(refusing)).handle(methods::CONTROLLER_VALIDATE, serde_json::to_value(&req).unwrap()).await.unwrap_err();
    assert!(err.starts_with("CSI.ControllerValidateVolume: rpc error: code = NotFound"), "{err}");
    let mut missing = req.clone();
    missing.volume_id.clear();
    let err = endpoint(Some(r.clone())).handle(methods::CONTROLLER_VALIDATE, serde_json::to_value(&missing).unwrap()).await.unwrap_err();
    assert_eq!(err, "CSI.ControllerValidateVolume: VolumeID is required");
    let err = endpoint(None).handle(methods::CONTROLLER_VALIDATE, serde_json::to_value(&req).unwrap()).await.unwrap_err();
    assert!(err.starts_with("CSI.ControllerValidateVolume: CSI client error (retryable): "), "{err}");
}
