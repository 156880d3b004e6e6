//! The CSI tables: volumes registered, claimed, released and removed; plugins from fingerprints.

use std::sync::Arc;

use nomad_proto::csi::{
    CsiControllerInfo, CsiInfo, CsiNodeInfo, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability, CsiVolumeClaim,
    CsiVolumeClaimMode, CsiVolumeClaimState,
};
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Namespace, Node, Timestamp};

use super::*;

fn volume(ns: &str, id: &str) -> CsiVolume {
    CsiVolume {
        id: id.into(),
        namespace: ns.into(),
        plugin_id: "hostpath".into(),
        // The register endpoint copies it from the plugin, as Nomad's does.
        provider: "hostpath.csi.k8s.io".into(),
        requested_capabilities: vec![CsiVolumeCapability {
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        }],
        ..CsiVolume::default()
    }
}

/// A node running the `hostpath` plugin as a monolith (healthy or not).
fn plugin_node(id: &str, healthy: bool) -> Node {
    let info = CsiInfo { healthy, provider: "hostpath.csi.k8s.io".into(), alloc_id: format!("plugin-{id}"), ..CsiInfo::default() };
    let mut n = Node { id: id.into(), ..Node::default() };
    n.csi_controller_plugins.insert(
        "hostpath".into(),
        CsiInfo { requires_controller_plugin: true, controller_info: Some(CsiControllerInfo::default()), ..info.clone() },
    );
    n.csi_node_plugins
        .insert("hostpath".into(), CsiInfo { node_info: Some(CsiNodeInfo { id: format!("ext-{id}"), ..Default::default() }), ..info });
    n
}

fn alloc(id: &str, ns: &str, status: ClientStatus) -> Allocation {
    Allocation {
        id: id.into(),
        namespace: ns.into(),
        job_id: "j".into(),
        node_id: "n1".into(),
        desired_status: DesiredStatus::Run,
        client_status: status,
        ..Allocation::default()
    }
}

fn write_claim(alloc: &str, state: CsiVolumeClaimState) -> CsiVolumeClaim {
    CsiVolumeClaim {
        allocation_id: alloc.into(),
        node_id: "n1".into(),
        mode: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        state,
        ..CsiVolumeClaim::default()
    }
}

/// A store with namespace `other`, a healthy plugin on n1 and allocs a1, a2 (default) and b1 (other).
fn store() -> StateStore {
    let store = StateStore::new();
    store
        .write(1, |tx| {
            tx.upsert_namespace(Namespace { name: "other".into(), ..Namespace::default() });
            tx.upsert_node(plugin_node("n1", true), Timestamp::ZERO);
            tx.upsert_allocs_from_plan(vec![
                alloc("a1", "default", ClientStatus::Running),
                alloc("a2", "default", ClientStatus::Running),
                alloc("b1", "other", ClientStatus::Running),
            ]);
            Ok(())
        })
        .unwrap();
    store
}

#[test]
fn register_claim_release_and_deregister() {
    let store = store();
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "vol")])).unwrap();
    let snap = store.snapshot();
    let stored = snap.csi_volume("default", "vol").unwrap();
    assert_eq!((stored.create_index, stored.modify_index), (2, 2));
    assert_eq!(snap.table_index(Table::CsiVolumes), 2);
    let view = snap.csi_volume_denormalized(stored);
    assert!(view.volume.schedulable, "healthy monolith plugin");
    assert_eq!(view.volume.provider, "hostpath.csi.k8s.io");

    store.write(3, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a1", CsiVolumeClaimState::Taken))).unwrap();
    // The single writer slot is taken: Nomad's message, nothing written.
    let e = store.write(4, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a2", CsiVolumeClaimState::Taken))).unwrap_err();
    assert_eq!(e.0, "volume max claims reached");
    let e = store.write(4, |tx| tx.claim_csi_volume("default", "nope", &write_claim("a2", CsiVolumeClaimState::Taken))).unwrap_err();
    assert_eq!(e.0, "volume not found: nope");
    let snap = store.snapshot();
    let v = snap.csi_volume("default", "vol").unwrap();
    assert!(v.write_allocs.contains("a1") && !v.write_allocs.contains("a2"));
    assert_eq!((v.access_mode, v.modify_index), (CsiVolumeAccessMode::SingleNodeWriter, 3));

    // Claimed volumes can be neither replaced nor removed.
    let e = store.write(5, |tx| tx.upsert_csi_volumes(&[volume("default", "vol")])).unwrap_err();
    assert_eq!(e.0, "volume cannot be updated while in use");
    let e = store.write(5, |tx| tx.deregister_csi_volumes("default", &["vol".into()], false)).unwrap_err();
    assert_eq!(e.0, "volume in use: vol");
    // Not even forced while the alloc runs.
    let e = store.write(5, |tx| tx.deregister_csi_volumes("default", &["vol".into()], true)).unwrap_err();
    assert_eq!(e.0, "volume in use: vol");

    // The release: checkpoints keep the claim, ready-to-free frees it.
    store.write(6, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a1", CsiVolumeClaimState::NodeDetached))).unwrap();
    let snap = store.snapshot();
    let v = snap.csi_volume("default", "vol").unwrap();
    assert_eq!(v.past_claims["a1"].state, CsiVolumeClaimState::NodeDetached);
    assert!(v.in_use());
    store.write(7, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a1", CsiVolumeClaimState::ReadyToFree))).unwrap();
    store.write(8, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a2", CsiVolumeClaimState::Taken))).unwrap();
    store.write(9, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a2", CsiVolumeClaimState::ReadyToFree))).unwrap();
    let snap = store.snapshot();
    assert!(!snap.csi_volume("default", "vol").unwrap().in_use());

    store.write(10, |tx| tx.deregister_csi_volumes("default", &["vol".into()], false)).unwrap();
    assert!(store.snapshot().csi_volume("default", "vol").is_none());
    let e = store.write(11, |tx| tx.deregister_csi_volumes("default", &["vol".into()], false)).unwrap_err();
    assert_eq!(e.0, "volume not found: vol");
}

#[test]
fn force_deregisters_a_volume_whose_claiming_allocs_are_done() {
    let store = store();
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "vol")])).unwrap();
    store.write(3, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a1", CsiVolumeClaimState::Taken))).unwrap();
    store
        .write(4, |tx| {
            tx.update_allocs_from_client(
                &[Allocation { client_status: ClientStatus::Failed, ..alloc("a1", "default", ClientStatus::Failed) }],
                0,
            );
            Ok(())
        })
        .unwrap();
    let e = store.write(5, |tx| tx.deregister_csi_volumes("default", &["vol".into()], false)).unwrap_err();
    assert_eq!(e.0, "volume in use: vol");
    store.write(5, |tx| tx.deregister_csi_volumes("default", &["vol".into()], true)).unwrap();
    assert!(store.snapshot().csi_volume("default", "vol").is_none());
}

#[test]
fn a_claim_stores_past_claims_for_finished_allocs_and_a_gc_claim_only_bumps_the_index() {
    let store = store();
    let mut vol = volume("default", "vol");
    vol.requested_capabilities[0].access_mode = CsiVolumeAccessMode::MultiNodeMultiWriter;
    store.write(2, |tx| tx.upsert_csi_volumes(&[vol])).unwrap();
    let multi =
        |a: &str| CsiVolumeClaim { access_mode: CsiVolumeAccessMode::MultiNodeMultiWriter, ..write_claim(a, CsiVolumeClaimState::Taken) };
    store.write(3, |tx| tx.claim_csi_volume("default", "vol", &multi("a1"))).unwrap();
    store
        .write(4, |tx| {
            tx.update_allocs_from_client(&[alloc("a1", "default", ClientStatus::Complete)], 0);
            Ok(())
        })
        .unwrap();
    let gc = CsiVolumeClaim { mode: CsiVolumeClaimMode::Gc, state: CsiVolumeClaimState::Unpublishing, ..CsiVolumeClaim::default() };
    store.write(5, |tx| tx.claim_csi_volume("default", "vol", &gc)).unwrap();
    let snap = store.snapshot();
    let v = snap.csi_volume("default", "vol").unwrap();
    assert_eq!(v.modify_index, 5);
    assert_eq!(v.past_claims["a1"].state, CsiVolumeClaimState::Unpublishing, "denormalized and stored");
    assert!(v.write_allocs.contains("a1"), "still claimed until released");
    // A claim for an alloc that does not exist is refused.
    let e = store.write(6, |tx| tx.claim_csi_volume("default", "vol", &multi("ghost"))).unwrap_err();
    assert_eq!(e.0, "allocation missing: ghost");
}

#[test]
fn namespaces_with_the_same_volume_id_do_not_see_each_other() {
    let store = store();
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "shared"), volume("other", "shared")])).unwrap();
    store.write(3, |tx| tx.claim_csi_volume("default", "shared", &write_claim("a1", CsiVolumeClaimState::Taken))).unwrap();
    // The same ID in the other namespace is free for its own writer.
    store.write(4, |tx| tx.claim_csi_volume("other", "shared", &write_claim("b1", CsiVolumeClaimState::Taken))).unwrap();
    let snap = store.snapshot();
    let d = snap.csi_volume("default", "shared").unwrap();
    let o = snap.csi_volume("other", "shared").unwrap();
    assert_eq!(d.write_allocs.iter().collect::<Vec<_>>(), ["a1"]);
    assert_eq!(o.write_allocs.iter().collect::<Vec<_>>(), ["b1"]);
    store.write(5, |tx| tx.deregister_csi_volumes("other", &["shared".into()], true)).unwrap_err();
    store.write(5, |tx| tx.claim_csi_volume("other", "shared", &write_claim("b1", CsiVolumeClaimState::ReadyToFree))).unwrap();
    store.write(6, |tx| tx.deregister_csi_volumes("other", &["shared".into()], false)).unwrap();
    let snap = store.snapshot();
    assert!(snap.csi_volume("other", "shared").is_none());
    assert!(snap.csi_volume("default", "shared").unwrap().in_use());
    // A namespace that does not exist is refused.
    let e = store.write(7, |tx| tx.upsert_csi_volumes(&[volume("nowhere", "v")])).unwrap_err();
    assert_eq!(e.0, "volume v is in nonexistent namespace nowhere");
}

#[test]
fn volume_identity_is_fixed_and_past_claims_survive_a_reregister() {
    let store = store();
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "vol")])).unwrap();
    let moved = CsiVolume { plugin_id: "other-plugin".into(), ..volume("default", "vol") };
    let e = store.write(3, |tx| tx.upsert_csi_volumes(&[moved])).unwrap_err();
    assert_eq!(e.0, "volume identity cannot be updated: vol");
    // A checkpoint of a release in progress, with no current claim left.
    store.write(3, |tx| tx.claim_csi_volume("default", "vol", &write_claim("gone", CsiVolumeClaimState::NodeDetached))).unwrap();
    let mut again = volume("default", "vol");
    again.context.insert("k".into(), "v".into());
    // A register cannot smuggle claims in.
    again.write_allocs.insert("a1".into());
    store.write(4, |tx| tx.upsert_csi_volumes(&[again])).unwrap();
    let snap = store.snapshot();
    let v = snap.csi_volume("default", "vol").unwrap();
    assert_eq!((v.create_index, v.modify_index), (2, 4));
    assert_eq!(v.context["k"], "v");
    assert!(v.past_claims.contains_key("gone") && v.write_allocs.is_empty());
}

#[test]
fn plugins_follow_node_fingerprints_and_drive_schedulability() {
    let store = store();
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "vol")])).unwrap();
    let snap = store.snapshot();
    let p = snap.csi_plugin("hostpath").unwrap();
    assert_eq!((p.nodes_healthy, p.controllers_healthy, p.create_index), (1, 1, 1));
    assert_eq!(snap.table_index(Table::CsiPlugins), 1);
    // The plugin turns unhealthy: the volume is no longer schedulable, and a claim is refused.
    store
        .write(3, |tx| {
            tx.upsert_node(plugin_node("n1", false), Timestamp::ZERO);
            Ok(())
        })
        .unwrap();
    let snap = store.snapshot();
    assert_eq!(snap.csi_plugin("hostpath").unwrap().nodes_healthy, 0);
    assert!(!snap.csi_volume_with_plugin(snap.csi_volume("default", "vol").unwrap()).schedulable);
    let e = store.write(4, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a1", CsiVolumeClaimState::Taken))).unwrap_err();
    assert_eq!(e.0, "volume is currently unschedulable");
    // Healthy on a second node; then the first node is removed: the plugin lives on n2.
    store
        .write(5, |tx| {
            tx.upsert_node(plugin_node("n2", true), Timestamp::ZERO);
            tx.delete_node("n1")
        })
        .unwrap();
    let snap = store.snapshot();
    let p = snap.csi_plugin("hostpath").unwrap();
    assert_eq!(p.nodes.keys().collect::<Vec<_>>(), ["n2"]);
    assert_eq!(p.modify_index, 5);
    assert!(snap.csi_volume_with_plugin(snap.csi_volume("default", "vol").unwrap()).schedulable);
    // The last node stops running it: the plugin is gone, the volume stays, unschedulable.
    store
        .write(6, |tx| {
            tx.upsert_node(Node { id: "n2".into(), ..Node::default() }, Timestamp::ZERO);
            Ok(())
        })
        .unwrap();
    let snap = store.snapshot();
    assert!(snap.csi_plugin("hostpath").is_none());
    assert_eq!(snap.table_index(Table::CsiPlugins), 6);
    assert!(!snap.csi_volume_with_plugin(snap.csi_volume("default", "vol").unwrap()).schedulable);
}

#[test]
fn plugin_reads_show_their_allocs_in_the_namespace_asked() {
    let store = store();
    store
        .write(2, |tx| {
            tx.upsert_allocs_from_plan(vec![alloc("plugin-n1", "default", ClientStatus::Running)]);
            Ok(())
        })
        .unwrap();
    let snap = store.snapshot();
    let p = snap.csi_plugin("hostpath").unwrap();
    assert_eq!(snap.csi_plugin_denormalized(p, Some("default")).allocations[0].id, "plugin-n1");
    assert!(snap.csi_plugin_denormalized(p, Some("other")).allocations.is_empty());
}

#[test]
fn csi_tables_survive_a_snapshot_and_old_snapshots_still_load() {
    let store = store();
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "vol")])).unwrap();
    store.write(3, |tx| tx.claim_csi_volume("default", "vol", &write_claim("a1", CsiVolumeClaimState::Taken))).unwrap();
    let snap = store.snapshot();
    let restored = State::from_bytes(&snap.to_bytes().unwrap()).unwrap();
    assert_eq!(restored.csi_volume("default", "vol"), snap.csi_volume("default", "vol"));
    assert_eq!(restored.csi_volume("default", "vol").unwrap().write_claims["a1"].node_id, "n1");
    assert_eq!(restored.csi_plugin("hostpath"), snap.csi_plugin("hostpath"));
    assert_eq!(restored.table_index(Table::CsiVolumes), 3);
    assert_eq!(restored.table_index(Table::CsiPlugins), 1);

    // A snapshot written before the CSI tables existed: seven table indexes, no CSI lists.
    let mut old: serde_json::Value = serde_json::from_slice(&snap.to_bytes().unwrap()).unwrap();
    let obj = old.as_object_mut().unwrap();
    obj.remove("csi_volumes");
    obj.remove("csi_plugins");
    obj.insert("table_index".into(), serde_json::json!([1, 1, 1, 1, 1, 1, 1]));
    let restored = State::from_bytes(&serde_json::to_vec(&old).unwrap()).unwrap();
    assert_eq!(restored.table_index(Table::Services), 1);
    assert_eq!(restored.table_index(Table::CsiVolumes), 0);
    assert!(restored.csi_volumes().next().is_none());
    // One from a newer version is refused rather than misread.
    obj_set(&mut old, "table_index", serde_json::json!(vec![0u64; Table::ALL.len() + 1]));
    let err = State::from_bytes(&serde_json::to_vec(&old).unwrap()).unwrap_err();
    assert!(err.contains(&format!("{} table indexes", Table::ALL.len() + 1)), "{err}");
}

fn obj_set(v: &mut serde_json::Value, k: &str, x: serde_json::Value) {
    v.as_object_mut().unwrap().insert(k.into(), x);
}

#[tokio::test]
async fn a_blocking_volume_read_wakes_on_its_volume_only() {
    let store = Arc::new(store());
    store.write(2, |tx| tx.upsert_csi_volumes(&[volume("default", "a"), volume("default", "b")])).unwrap();
    let s = store.clone();
    let waiter = tokio::spawn(async move {
        s.blocking_query_on(&[Watch::CsiVolume(Watch::job_key("default", "a"))], 2, std::time::Duration::from_secs(30), |st| {
            let v = st.csi_volume("default", "a").map(|v| v.modify_index).unwrap_or(0);
            (v, v)
        })
        .await
    });
    crate::test_support::wait_until("the read to park", || store.blocking_registrations() == 1).await;
    store.write(3, |tx| tx.claim_csi_volume("default", "b", &write_claim("a1", CsiVolumeClaimState::Taken))).unwrap();
    store.write(4, |tx| tx.claim_csi_volume("default", "a", &write_claim("a2", CsiVolumeClaimState::Taken))).unwrap();
    assert_eq!(waiter.await.unwrap(), (4, 4));
    assert_eq!(store.blocking_wakeups(), 1, "the write to b woke nobody");
}

#[test]
fn a_nodes_volumes_are_each_allocs_own_under_per_alloc() {
    let group = nomad_proto::TaskGroup {
        name: "g".into(),
        volumes: [(
            "data".to_string(),
            nomad_proto::volume::VolumeRequest {
                name: "data".into(),
                volume_type: "csi".into(),
                source: "data".into(),
                per_alloc: true,
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let job = Arc::new(nomad_proto::Job { id: "j".into(), task_groups: vec![group], ..Default::default() });
    let placed = |id: &str, index: u64| Allocation {
        name: nomad_proto::alloc::alloc_name("j", "g", index),
        task_group: "g".into(),
        job: Some(job.clone()),
        ..alloc(id, "default", ClientStatus::Running)
    };
    let store = store();
    store
        .write(2, |tx| {
            tx.upsert_csi_volumes(&[volume("default", "data"), volume("default", "data[0]"), volume("default", "data[1]")])?;
            tx.upsert_allocs_from_plan(vec![placed("p0", 0), placed("p1", 1)]);
            Ok(())
        })
        .unwrap();
    let mut ids: Vec<String> = store.snapshot().csi_volumes_by_node("n1").iter().map(|v| v.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, ["data[0]", "data[1]"], "the allocs' own volumes, not the bare source");
}
