//! The CSIVolume and CSIPlugin topics: what each CSI write publishes, through the real FSM.

use std::sync::Arc;

use futures::FutureExt;
use nomad_proto::csi::{
    CsiInfo, CsiNodeInfo, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability, CsiVolumeClaim, CsiVolumeClaimMode,
    CsiVolumeClaimState,
};
use nomad_proto::volume::CsiMountOptions;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Namespace, Node, Timestamp};
use serde_json::json;

use super::{Event, EventBatch, EventBroker, TopicFilter};
use crate::fsm::{Command, Fsm, PlanApply, ServerFsm};
use crate::state::StateStore;
use crate::testing::{job, node};

const NOW: Timestamp = Timestamp(1_700_000_000_000_000_000);

/// A log applied through the FSM, one index per command, with the broker it publishes to.
struct Log {
    fsm: ServerFsm,
    broker: Arc<EventBroker>,
    index: u64,
}

impl Log {
    fn new() -> Log {
        let broker = Arc::new(EventBroker::new(1000));
        Log { fsm: ServerFsm::with_events(Arc::new(StateStore::new()), broker.clone()), broker, index: 0 }
    }

    /// Applies `cmd` (it must commit) and returns the batch published at its index, if any.
    fn apply(&mut self, cmd: Command) -> Option<Arc<EventBatch>> {
        self.index += 1;
        let r = self.fsm.apply(self.index, cmd);
        assert_eq!(r.error, None, "command at index {} refused", self.index);
        self.batch_at(self.index)
    }

    /// Applies a command that must be refused.
    fn refused(&mut self, cmd: Command) -> Option<Arc<EventBatch>> {
        self.index += 1;
        assert!(self.fsm.apply(self.index, cmd).error.is_some());
        self.batch_at(self.index)
    }

    fn batch_at(&self, index: u64) -> Option<Arc<EventBatch>> {
        let mut sub = self.broker.subscribe(index);
        let b = sub.next().now_or_never()?.ok()?;
        (b.index == index).then_some(b)
    }

    fn claim(&mut self, alloc: &str, state: CsiVolumeClaimState) -> Option<Arc<EventBatch>> {
        let claim = CsiVolumeClaim {
            allocation_id: alloc.into(),
            node_id: "n1".into(),
            mode: CsiVolumeClaimMode::Write,
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            state,
            ..CsiVolumeClaim::default()
        };
        self.apply(Command::CsiVolumeClaim { namespace: "prod".into(), volume_id: "vol".into(), claim })
    }
}

/// Node n1 running the `hostpath` node plugin.
fn plugin_node(healthy: bool, fingerprinted_at: i64) -> Node {
    let mut n = node("n1");
    n.csi_node_plugins.insert(
        "hostpath".into(),
        CsiInfo {
            plugin_id: "hostpath".into(),
            alloc_id: "plugin-alloc".into(),
            healthy,
            provider: "hostpath.csi.k8s.io".into(),
            provider_version: "1.11.0".into(),
            update_time: Timestamp(fingerprinted_at),
            node_info: Some(CsiNodeInfo { id: "ext-n1".into(), max_volumes: 10, ..CsiNodeInfo::default() }),
            ..CsiInfo::default()
        },
    );
    n
}

fn volume() -> CsiVolume {
    CsiVolume {
        id: "vol".into(),
        namespace: "prod".into(),
        name: "vol name".into(),
        plugin_id: "hostpath".into(),
        provider: "hostpath.csi.k8s.io".into(),
        requested_capabilities: vec![CsiVolumeCapability {
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        }],
        secrets: [("password".to_string(), "hunter2".to_string())].into(),
        mount_options: Some(CsiMountOptions { fs_type: "ext4".into(), mount_flags: vec!["noatime".into()] }),
        ..CsiVolume::default()
    }
}

fn alloc(status: ClientStatus) -> Allocation {
    Allocation {
        id: "a1".into(),
        namespace: "prod".into(),
        job_id: "j".into(),
        task_group: "web".into(),
        node_id: "n1".into(),
        name: "j.web[0]".into(),
        desired_status: DesiredStatus::Run,
        client_status: status,
        ..Allocation::default()
    }
}

/// A log with namespace `prod`, node n1 running the plugin and alloc a1 in `prod`.
fn log_with_plugin_and_alloc() -> Log {
    let mut log = Log::new();
    log.apply(Command::NamespaceUpsert { namespaces: vec![Namespace { name: "prod".into(), ..Namespace::default() }] });
    log.apply(Command::NodeRegister { node: plugin_node(true, 1), evals: vec![], now: NOW });
    let mut j = job("j", 1);
    j.namespace = "prod".into();
    j.canonicalize();
    log.apply(Command::PlanApply(PlanApply { job: Some(j), allocs_upserted: vec![alloc(ClientStatus::Running)], ..PlanApply::default() }));
    log
}

/// The batch's only event on `topic`.
fn only<'a>(b: &'a EventBatch, topic: &str) -> &'a Event {
    let on: Vec<&Event> = b.events.iter().filter(|e| e.topic == topic).collect();
    assert_eq!(on.len(), 1, "one {topic} event expected: {b:?}");
    on[0]
}

fn volume_event(b: &EventBatch, ty: &str) -> serde_json::Value {
    let e = only(b, "CSIVolume");
    assert_eq!((e.event_type.as_str(), e.key.as_str(), e.namespace.as_str()), (ty, "vol", "prod"));
    assert_eq!(e.index, b.index);
    assert!(e.filter_keys.is_empty());
    let text = serde_json::to_string(b).unwrap();
    assert!(!text.contains("hunter2") && !text.contains("noatime"), "secrets or mount flags published: {text}");
    let v = e.payload["CSIVolume"].clone();
    assert_eq!(v["ID"], "vol");
    assert_eq!(v["Secrets"], serde_json::Value::Null);
    assert_eq!(v["MountOptions"]["MountFlags"], json!(["[REDACTED]"]));
    assert!(v.get("ReadClaims").is_none() && v.get("WriteClaims").is_none() && v.get("PastClaims").is_none(), "{v}");
    v
}

#[test]
fn register_claim_release_and_deregister_each_publish_the_volume_as_the_api_shows_it() {
    let mut log = log_with_plugin_and_alloc();

    let b = log.apply(Command::CsiVolumeRegister { volumes: vec![volume()] }).expect("register publishes");
    assert_eq!(b.events.len(), 1);
    let v = volume_event(&b, "CSIVolumeRegistered");
    assert_eq!((v["Namespace"].as_str(), v["CreateIndex"].as_u64()), (Some("prod"), Some(b.index)));
    // Denormalized as a read is: the plugin's health.
    assert_eq!((v["Schedulable"].as_bool(), v["NodesHealthy"].as_i64()), (Some(true), Some(1)), "{v}");
    assert_eq!(v["Allocations"], json!([]));

    let b = log.claim("a1", CsiVolumeClaimState::Taken).expect("a claim publishes");
    let v = volume_event(&b, "CSIVolumeClaim");
    assert_eq!(v["WriteAllocs"], json!({"a1": null}));
    assert_eq!(v["AccessMode"], "single-node-writer");
    assert_eq!(v["Allocations"][0]["ID"], "a1", "the claiming alloc's stub, as a read shows it");
    assert_eq!(v["ModifyIndex"], b.index);

    // Each checkpoint of the release walk, then the free.
    for state in [CsiVolumeClaimState::Unpublishing, CsiVolumeClaimState::NodeDetached, CsiVolumeClaimState::ControllerDetached] {
        let b = log.claim("a1", state).unwrap_or_else(|| panic!("checkpoint {state:?} publishes"));
        let v = volume_event(&b, "CSIVolumeClaim");
        assert_eq!(v["WriteAllocs"], json!({"a1": null}), "still claimed at {state:?}");
    }
    let b = log.claim("a1", CsiVolumeClaimState::ReadyToFree).expect("the free publishes");
    let v = volume_event(&b, "CSIVolumeClaim");
    assert_eq!((v["WriteAllocs"].clone(), v["Allocations"].clone()), (json!({}), json!([])));

    let dereg = Command::CsiVolumeDeregister { namespace: "prod".into(), volume_ids: vec!["vol".into()], force: false };
    let b = log.apply(dereg.clone()).expect("deregister publishes");
    let v = volume_event(&b, "CSIVolumeDeregistered");
    assert_eq!(v["Name"], "vol name", "the volume as it was last");
    // Refused writes publish nothing.
    assert!(log.refused(dereg).is_none());
    let ghost = CsiVolumeClaim { allocation_id: "a1".into(), mode: CsiVolumeClaimMode::Write, ..CsiVolumeClaim::default() };
    assert!(log.refused(Command::CsiVolumeClaim { namespace: "prod".into(), volume_id: "vol".into(), claim: ghost }).is_none());
}

#[test]
fn reaping_the_claims_of_finished_allocs_publishes_a_claim_event() {
    let mut log = log_with_plugin_and_alloc();
    log.apply(Command::CsiVolumeRegister { volumes: vec![volume()] });
    log.claim("a1", CsiVolumeClaimState::Taken);
    let b = log.apply(Command::AllocClientUpdate { allocs: vec![alloc(ClientStatus::Complete)], evals: vec![], now: NOW }).unwrap();
    assert!(b.events.iter().all(|e| e.topic != "CSIVolume"), "an alloc update does not write the volume");
    // The watcher's (or the claim GC's) claim without an alloc stores the past claims.
    let gc = CsiVolumeClaim { mode: CsiVolumeClaimMode::Gc, state: CsiVolumeClaimState::Unpublishing, ..CsiVolumeClaim::default() };
    let b = log.apply(Command::CsiVolumeClaim { namespace: "prod".into(), volume_id: "vol".into(), claim: gc }).expect("reaping publishes");
    let v = volume_event(&b, "CSIVolumeClaim");
    assert_eq!(v["ModifyIndex"], b.index);
}

#[test]
fn plugin_events_follow_instances_and_health_not_every_register() {
    let mut log = Log::new();
    let b = log.apply(Command::NodeRegister { node: plugin_node(true, 1), evals: vec![], now: NOW }).unwrap();
    let e = only(&b, "CSIPlugin");
    assert_eq!((e.event_type.as_str(), e.key.as_str(), e.namespace.as_str()), ("NodeRegistration", "hostpath", ""));
    let p = &e.payload["CSIPlugin"];
    assert_eq!(
        (p["ID"].as_str(), p["NodesHealthy"].as_i64(), p["Provider"].as_str()),
        (Some("hostpath"), Some(1), Some("hostpath.csi.k8s.io"))
    );
    assert_eq!(p["Nodes"]["n1"]["AllocID"], "plugin-alloc");
    assert_eq!(p["Allocations"], json!([]), "alloc stubs are namespaced; a global event shows none");

    // The same fingerprint again (a newer probe time only): the node changes, the plugin does not.
    let b = log.apply(Command::NodeRegister { node: plugin_node(true, 2), evals: vec![], now: NOW }).unwrap();
    assert!(b.events.iter().all(|e| e.topic != "CSIPlugin"), "{b:?}");
    only(&b, "Node");

    // Health changes.
    let b = log.apply(Command::NodeRegister { node: plugin_node(false, 3), evals: vec![], now: NOW }).unwrap();
    let e = only(&b, "CSIPlugin");
    assert_eq!(e.payload["CSIPlugin"]["NodesHealthy"], 0);
    assert_eq!(e.payload["CSIPlugin"]["Nodes"]["n1"]["Healthy"], false);

    // The node goes: its plugin loses its last instance and is deleted.
    let b = log.apply(Command::NodeDeregister { node_ids: vec!["n1".into()], evals: vec![] }).unwrap();
    let e = only(&b, "CSIPlugin");
    assert_eq!((e.event_type.as_str(), e.key.as_str()), ("NodeDeregistration", "hostpath"));
    assert_eq!((e.payload["CSIPlugin"]["Nodes"].clone(), e.payload["CSIPlugin"]["ModifyIndex"].as_u64()), (json!({}), Some(b.index)));
}

#[test]
fn csi_topics_filter_by_key_and_namespace_and_star_includes_them() {
    let mut log = log_with_plugin_and_alloc();
    let plugin = only(&log.batch_at(2).unwrap(), "CSIPlugin").clone();
    let b = log.apply(Command::CsiVolumeRegister { volumes: vec![volume()] }).unwrap();
    let vol = only(&b, "CSIVolume").clone();
    let f = |topics: &[&str], ns: &str, e: &Event| TopicFilter::parse(topics.iter().copied(), ns).unwrap().matches(e);

    assert!(f(&["CSIVolume"], "prod", &vol));
    assert!(f(&["CSIVolume:vol"], "prod", &vol));
    assert!(f(&["CSIVolume:vol"], "*", &vol));
    assert!(!f(&["CSIVolume:other"], "prod", &vol));
    assert!(!f(&["CSIVolume:hostpath"], "prod", &vol), "the plugin ID is not a volume filter key");
    assert!(!f(&["CSIVolume"], "default", &vol), "volumes are namespaced");
    assert!(!f(&["CSIPlugin"], "prod", &vol));
    assert!(f(&["*"], "prod", &vol) && f(&[], "prod", &vol));

    assert!(f(&["CSIPlugin:hostpath"], "default", &plugin), "plugins are global");
    assert!(f(&["CSIPlugin"], "prod", &plugin));
    assert!(!f(&["CSIPlugin:other"], "default", &plugin));
    assert!(!f(&["CSIVolume"], "default", &plugin));
    assert!(f(&["*"], "default", &plugin));
}
