//! What a stored volume does not hold but every reader needs (`csiVolumeDenormalizePluginsTxn`,
//! `csiVolumeDenormalizeTxn` in Nomad's state store): its plugin's health, and the claims of
//! allocs that finished or were garbage collected turned into past claims to release.

use nomad_proto::csi::{CsiPlugin, CsiVolume, CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState};
use nomad_proto::{AllocListStub, AllocStubFields, Allocation};

/// Copies the plugin's health onto the volume and decides `Schedulable`: some healthy node
/// plugin, and a healthy controller when the plugin needs one. Without the plugin the volume is
/// unschedulable with no healthy instance (the expected counts and provider are left as stored).
pub fn denormalize_plugin(vol: &mut CsiVolume, plugin: Option<&CsiPlugin>) {
    let Some(plug) = plugin else {
        vol.controllers_healthy = 0;
        vol.nodes_healthy = 0;
        vol.schedulable = false;
        return;
    };
    vol.provider = plug.provider.clone();
    vol.provider_version = plug.version.clone();
    vol.controller_required = plug.controller_required;
    vol.controllers_healthy = plug.controllers_healthy;
    vol.nodes_healthy = plug.nodes_healthy;
    vol.controllers_expected = plug.controllers_expected;
    vol.nodes_expected = plug.nodes_expected;
    vol.schedulable = vol.nodes_healthy > 0 && (!vol.controller_required || vol.controllers_healthy > 0);
}

/// Gives every claimed alloc that is terminal or gone (per `alloc`, a lookup in the state) a
/// past claim in state `unpublishing`, unless it has one already: that is what the volume
/// watcher releases. Also repairs claims Nomad's older versions stored incompletely (a claimed
/// alloc without its claim, a claim without modes).
pub fn denormalize_allocs<'a>(vol: &mut CsiVolume, alloc: impl Fn(&str) -> Option<&'a Allocation>) {
    let sides = [(CsiVolumeClaimMode::Read, vol.read_allocs.clone()), (CsiVolumeClaimMode::Write, vol.write_allocs.clone())];
    for (mode, ids) in sides {
        for id in ids {
            let a = alloc(&id);
            let claims = if mode == CsiVolumeClaimMode::Read { &mut vol.read_claims } else { &mut vol.write_claims };
            let current = claims
                .entry(id.clone())
                .or_insert_with(|| CsiVolumeClaim {
                    allocation_id: id.clone(),
                    node_id: a.map(|a| a.node_id.clone()).unwrap_or_default(),
                    mode,
                    ..CsiVolumeClaim::default()
                })
                .clone();
            if a.is_none_or(|a| a.terminal()) && !vol.past_claims.contains_key(&id) {
                vol.past_claims.insert(
                    id.clone(),
                    CsiVolumeClaim {
                        allocation_id: id,
                        node_id: current.node_id,
                        external_node_id: String::new(),
                        mode: current.mode,
                        access_mode: current.access_mode,
                        attachment_mode: current.attachment_mode,
                        state: CsiVolumeClaimState::Unpublishing,
                    },
                );
            }
        }
    }
    let (access, attachment) = (vol.access_mode, vol.attachment_mode);
    for c in vol.read_claims.values_mut().chain(vol.write_claims.values_mut()) {
        if c.access_mode == Default::default() || c.attachment_mode == Default::default() {
            c.access_mode = access;
            c.attachment_mode = attachment;
        }
    }
}

/// The stubs of the claiming allocs still in the state (the API's `Allocations`).
pub fn claim_alloc_stubs<'a>(vol: &CsiVolume, alloc: impl Fn(&str) -> Option<&'a Allocation>) -> Vec<AllocListStub> {
    vol.read_allocs.iter().chain(&vol.write_allocs).filter_map(|id| alloc(id)).map(|a| a.stub(AllocStubFields::default())).collect()
}

#[cfg(test)]
mod tests {
    use nomad_proto::csi::{CsiVolumeAccessMode, CsiVolumeAttachmentMode};
    use nomad_proto::{ClientStatus, DesiredStatus};

    use super::*;

    fn plugin(nodes: i64, controllers: i64, controller_required: bool) -> CsiPlugin {
        CsiPlugin {
            id: "p".into(),
            provider: "hostpath.csi.k8s.io".into(),
            version: "1.0".into(),
            controller_required,
            nodes_healthy: nodes,
            controllers_healthy: controllers,
            nodes_expected: 3,
            ..CsiPlugin::default()
        }
    }

    #[test]
    fn schedulable_follows_plugin_health() {
        let cases = [
            // (node plugins healthy, controllers healthy, controller required) → schedulable
            (1, 0, false, true),
            (0, 5, false, false),
            (1, 0, true, false),
            (1, 1, true, true),
            (0, 1, true, false),
        ];
        for (nodes, ctrls, required, want) in cases {
            let mut vol = CsiVolume { plugin_id: "p".into(), ..CsiVolume::default() };
            denormalize_plugin(&mut vol, Some(&plugin(nodes, ctrls, required)));
            assert_eq!(vol.schedulable, want, "nodes {nodes} controllers {ctrls} required {required}");
            assert_eq!((vol.nodes_healthy, vol.controllers_healthy, vol.nodes_expected), (nodes, ctrls, 3));
            assert_eq!(vol.provider, "hostpath.csi.k8s.io");
            assert_eq!(vol.provider_version, "1.0");
            assert_eq!(vol.controller_required, required);
        }
        // The plugin is gone: unschedulable, no healthy instance.
        let mut vol = CsiVolume { schedulable: true, nodes_healthy: 2, controllers_healthy: 2, ..CsiVolume::default() };
        denormalize_plugin(&mut vol, None);
        assert!(!vol.schedulable);
        assert_eq!((vol.nodes_healthy, vol.controllers_healthy), (0, 0));
    }

    fn alloc(id: &str, status: ClientStatus) -> Allocation {
        Allocation {
            id: id.into(),
            node_id: "n1".into(),
            desired_status: DesiredStatus::Run,
            client_status: status,
            ..Allocation::default()
        }
    }

    #[test]
    fn finished_and_collected_allocs_become_unpublishing_past_claims() {
        let mut vol = CsiVolume {
            access_mode: CsiVolumeAccessMode::MultiNodeMultiWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            ..CsiVolume::default()
        };
        for (id, mode) in [
            ("running", CsiVolumeClaimMode::Write),
            ("done", CsiVolumeClaimMode::Write),
            ("gone", CsiVolumeClaimMode::Read),
            ("resumed", CsiVolumeClaimMode::Read),
        ] {
            let c = CsiVolumeClaim {
                allocation_id: id.into(),
                node_id: "n1".into(),
                mode,
                access_mode: CsiVolumeAccessMode::MultiNodeMultiWriter,
                attachment_mode: CsiVolumeAttachmentMode::FileSystem,
                ..CsiVolumeClaim::default()
            };
            if mode == CsiVolumeClaimMode::Read {
                vol.read_allocs.insert(id.into());
                vol.read_claims.insert(id.into(), c);
            } else {
                vol.write_allocs.insert(id.into());
                vol.write_claims.insert(id.into(), c);
            }
        }
        // A checkpoint already there is kept as it is.
        vol.past_claims.insert(
            "resumed".into(),
            CsiVolumeClaim { allocation_id: "resumed".into(), state: CsiVolumeClaimState::NodeDetached, ..Default::default() },
        );
        let allocs =
            [alloc("running", ClientStatus::Running), alloc("done", ClientStatus::Complete), alloc("resumed", ClientStatus::Failed)];
        let lookup = |id: &str| allocs.iter().find(|a| a.id == id);
        denormalize_allocs(&mut vol, lookup);
        assert!(!vol.past_claims.contains_key("running"));
        let done = &vol.past_claims["done"];
        assert_eq!((done.state, done.mode, done.node_id.as_str()), (CsiVolumeClaimState::Unpublishing, CsiVolumeClaimMode::Write, "n1"));
        assert_eq!(done.access_mode, CsiVolumeAccessMode::MultiNodeMultiWriter);
        assert_eq!(vol.past_claims["gone"].state, CsiVolumeClaimState::Unpublishing);
        assert_eq!(vol.past_claims["gone"].mode, CsiVolumeClaimMode::Read);
        assert_eq!(vol.past_claims["resumed"].state, CsiVolumeClaimState::NodeDetached);
        // Denormalizing changes no claim: the allocs stay claimed until released.
        assert_eq!(vol.read_allocs.len() + vol.write_allocs.len(), 4);
        let stubs = claim_alloc_stubs(&vol, lookup);
        let mut ids: Vec<_> = stubs.iter().map(|s| s.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, ["done", "resumed", "running"]);
    }

    #[test]
    fn claims_stored_incompletely_are_repaired() {
        let mut vol = CsiVolume {
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
            attachment_mode: CsiVolumeAttachmentMode::BlockDevice,
            ..CsiVolume::default()
        };
        vol.write_allocs.insert("a".into());
        let a = alloc("a", ClientStatus::Running);
        denormalize_allocs(&mut vol, |id| (id == "a").then_some(&a));
        let c = &vol.write_claims["a"];
        assert_eq!((c.mode, c.node_id.as_str()), (CsiVolumeClaimMode::Write, "n1"));
        assert_eq!((c.access_mode, c.attachment_mode), (CsiVolumeAccessMode::SingleNodeWriter, CsiVolumeAttachmentMode::BlockDevice));
    }
}
