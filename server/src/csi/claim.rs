//! Claims under the access-mode rules (`CSIVolume.Claim` and its helpers in Nomad's
//! `nomad/structs/csi.go`).
//!
//! | access mode              | a read claim is free when | a write claim is free when |
//! |--------------------------|---------------------------|----------------------------|
//! | single-node-reader-only  | no read claims            | never                      |
//! | single-node-writer       | no read and no write claims | no write claims          |
//! | multi-node-reader-only   | always                    | never                      |
//! | multi-node-single-writer | always                    | no write claims            |
//! | multi-node-multi-writer  | always                    | always                     |
//! | unknown (never claimed)  | always                    | always                     |
//!
//! Before that, the volume must be schedulable (its plugin healthy, see `denormalize.rs`) and not
//! resource-exhausted; a write claim also needs a writer mode (for a volume never claimed: one
//! among its requested capabilities).

use nomad_proto::csi::{
    CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability, CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState,
};

/// Why a claim was refused. The messages are Nomad's: clients match them as text
/// (`claimWithRetry` retries on [`ClaimError::MaxClaims`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// `ErrCSIVolumeMaxClaims`.
    #[error("volume max claims reached")]
    MaxClaims,
    /// `ErrCSIVolumeUnschedulable`.
    #[error("volume is currently unschedulable")]
    Unschedulable,
    /// The claiming alloc does not exist.
    #[error("allocation missing: {0}")]
    AllocMissing(String),
    /// A claim with another attachment mode than the one the volume is used with.
    #[error("cannot change attachment mode of claimed volume")]
    AttachmentModeChange,
}

/// The volume may take read claims at all (`ReadSchedulable`).
pub fn read_schedulable(vol: &CsiVolume) -> bool {
    vol.schedulable && vol.resource_exhausted.is_zero()
}

/// The volume may take write claims at all (`WriteSchedulable`): a writer mode now, or, while it
/// has none, a writer mode among the capabilities it was registered with.
pub fn write_schedulable(vol: &CsiVolume) -> bool {
    if !vol.schedulable || !vol.resource_exhausted.is_zero() {
        return false;
    }
    match vol.access_mode {
        CsiVolumeAccessMode::Unknown => vol.requested_capabilities.iter().any(|c| c.access_mode.is_writer()),
        mode => mode.is_writer(),
    }
}

/// Another read claim fits the current access mode (`HasFreeReadClaims`).
pub fn has_free_read_claims(vol: &CsiVolume) -> bool {
    match vol.access_mode {
        CsiVolumeAccessMode::SingleNodeReader => vol.read_claims.is_empty(),
        CsiVolumeAccessMode::SingleNodeWriter => vol.read_claims.is_empty() && vol.write_claims.is_empty(),
        // Multi-node modes have no reader limit in the CSI spec; exhaustion is tracked by
        // `ResourceExhausted`. A volume never claimed was checked by `read_schedulable`.
        CsiVolumeAccessMode::MultiNodeReader
        | CsiVolumeAccessMode::MultiNodeSingleWriter
        | CsiVolumeAccessMode::MultiNodeMultiWriter
        | CsiVolumeAccessMode::Unknown => true,
    }
}

/// Another write claim fits the current access mode (`HasFreeWriteClaims`).
pub fn has_free_write_claims(vol: &CsiVolume) -> bool {
    match vol.access_mode {
        CsiVolumeAccessMode::SingleNodeWriter | CsiVolumeAccessMode::MultiNodeSingleWriter => vol.write_claims.is_empty(),
        CsiVolumeAccessMode::MultiNodeMultiWriter | CsiVolumeAccessMode::Unknown => true,
        CsiVolumeAccessMode::SingleNodeReader | CsiVolumeAccessMode::MultiNodeReader => false,
    }
}

/// Applies a claim to the volume (`CSIVolume.Claim`). A `Taken` read or write claim takes the
/// volume for its alloc (`alloc_exists`: whether that alloc is in the state); any other claim is
/// a release: `ReadyToFree` removes the alloc from the volume, anything else records the claim
/// as a past claim (a checkpoint of the unpublish). On error the volume is unchanged.
pub fn claim(vol: &mut CsiVolume, claim: CsiVolumeClaim, alloc_exists: bool) -> Result<(), ClaimError> {
    if vol.attachment_mode != CsiVolumeAttachmentMode::Unknown
        && claim.attachment_mode != CsiVolumeAttachmentMode::Unknown
        && vol.attachment_mode != claim.attachment_mode
    {
        return Err(ClaimError::AttachmentModeChange);
    }
    // Volumes stored without capabilities get the one they are used with (Nomad's COMPAT).
    if vol.requested_capabilities.is_empty()
        && vol.access_mode != CsiVolumeAccessMode::Unknown
        && vol.attachment_mode != CsiVolumeAttachmentMode::Unknown
    {
        vol.requested_capabilities = vec![CsiVolumeCapability { access_mode: vol.access_mode, attachment_mode: vol.attachment_mode }];
    }
    match (claim.state, claim.mode) {
        (CsiVolumeClaimState::Taken, CsiVolumeClaimMode::Read) => claim_read(vol, claim, alloc_exists),
        (CsiVolumeClaimState::Taken, CsiVolumeClaimMode::Write) => claim_write(vol, claim, alloc_exists),
        // A GC claim or an unpublish checkpoint.
        _ => {
            release(vol, claim);
            Ok(())
        }
    }
}

fn claim_read(vol: &mut CsiVolume, claim: CsiVolumeClaim, alloc_exists: bool) -> Result<(), ClaimError> {
    if vol.read_allocs.contains(&claim.allocation_id) {
        return Ok(());
    }
    if !alloc_exists {
        return Err(ClaimError::AllocMissing(claim.allocation_id));
    }
    if !read_schedulable(vol) {
        return Err(ClaimError::Unschedulable);
    }
    if !has_free_read_claims(vol) {
        return Err(ClaimError::MaxClaims);
    }
    let id = claim.allocation_id.clone();
    vol.write_allocs.remove(&id);
    vol.write_claims.remove(&id);
    vol.past_claims.remove(&id);
    vol.read_allocs.insert(id.clone());
    set_modes_from_claim(vol, &claim);
    vol.read_claims.insert(id, claim);
    Ok(())
}

fn claim_write(vol: &mut CsiVolume, claim: CsiVolumeClaim, alloc_exists: bool) -> Result<(), ClaimError> {
    if vol.write_allocs.contains(&claim.allocation_id) {
        return Ok(());
    }
    if !alloc_exists {
        return Err(ClaimError::AllocMissing(claim.allocation_id));
    }
    if !write_schedulable(vol) {
        return Err(ClaimError::Unschedulable);
    }
    if !has_free_write_claims(vol) {
        return Err(ClaimError::MaxClaims);
    }
    let id = claim.allocation_id.clone();
    vol.read_allocs.remove(&id);
    vol.read_claims.remove(&id);
    vol.past_claims.remove(&id);
    vol.write_allocs.insert(id.clone());
    set_modes_from_claim(vol, &claim);
    vol.write_claims.insert(id, claim);
    Ok(())
}

/// The first claim decides the modes the volume is used with, for status and later claims.
fn set_modes_from_claim(vol: &mut CsiVolume, claim: &CsiVolumeClaim) {
    if vol.attachment_mode == CsiVolumeAttachmentMode::Unknown {
        vol.attachment_mode = claim.attachment_mode;
    }
    if vol.access_mode == CsiVolumeAccessMode::Unknown {
        vol.access_mode = claim.access_mode;
    }
}

fn release(vol: &mut CsiVolume, claim: CsiVolumeClaim) {
    let id = claim.allocation_id.clone();
    if claim.state != CsiVolumeClaimState::ReadyToFree {
        vol.past_claims.insert(id, claim);
        return;
    }
    vol.read_allocs.remove(&id);
    vol.write_allocs.remove(&id);
    vol.read_claims.remove(&id);
    vol.write_claims.remove(&id);
    vol.past_claims.remove(&id);
    if vol.read_claims.is_empty() && vol.write_claims.is_empty() && vol.past_claims.is_empty() {
        vol.access_mode = CsiVolumeAccessMode::Unknown;
        vol.attachment_mode = CsiVolumeAttachmentMode::Unknown;
    }
}

#[cfg(test)]
mod tests {
    use nomad_proto::Timestamp;

    use super::*;

    fn volume(caps: &[CsiVolumeAccessMode]) -> CsiVolume {
        CsiVolume {
            id: "vol".into(),
            namespace: "default".into(),
            plugin_id: "p".into(),
            schedulable: true,
            requested_capabilities: caps
                .iter()
                .map(|m| CsiVolumeCapability { access_mode: *m, attachment_mode: CsiVolumeAttachmentMode::FileSystem })
                .collect(),
            ..CsiVolume::default()
        }
    }

    fn taken(alloc: &str, mode: CsiVolumeClaimMode, access: CsiVolumeAccessMode) -> CsiVolumeClaim {
        CsiVolumeClaim {
            allocation_id: alloc.into(),
            node_id: "n1".into(),
            mode,
            access_mode: access,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            ..CsiVolumeClaim::default()
        }
    }

    use CsiVolumeAccessMode as A;
    use CsiVolumeClaimMode::{Read, Write};

    /// What the second claim gets after a first claim of `first` took the volume in `mode`.
    fn second(mode: A, first: CsiVolumeClaimMode, next: CsiVolumeClaimMode) -> Result<(), ClaimError> {
        let mut vol = volume(&[mode]);
        claim(&mut vol, taken("a1", first, mode), true).expect("first claim");
        claim(&mut vol, taken("a2", next, mode), true)
    }

    #[test]
    fn every_access_mode_follows_nomads_claim_table() {
        let max = Err(ClaimError::MaxClaims);
        let unsched = Err(ClaimError::Unschedulable);
        // (mode, first claim, second claim, result of the second).
        let table: &[(A, CsiVolumeClaimMode, CsiVolumeClaimMode, Result<(), ClaimError>)] = &[
            (A::SingleNodeReader, Read, Read, max.clone()),
            (A::SingleNodeReader, Read, Write, unsched.clone()),
            (A::SingleNodeWriter, Read, Read, max.clone()),
            (A::SingleNodeWriter, Write, Read, max.clone()),
            (A::SingleNodeWriter, Write, Write, max.clone()),
            // A reader does not take the single writer's place.
            (A::SingleNodeWriter, Read, Write, Ok(())),
            (A::MultiNodeReader, Read, Read, Ok(())),
            (A::MultiNodeReader, Read, Write, unsched.clone()),
            (A::MultiNodeSingleWriter, Read, Read, Ok(())),
            (A::MultiNodeSingleWriter, Write, Read, Ok(())),
            (A::MultiNodeSingleWriter, Read, Write, Ok(())),
            (A::MultiNodeSingleWriter, Write, Write, max.clone()),
            (A::MultiNodeMultiWriter, Write, Write, Ok(())),
            (A::MultiNodeMultiWriter, Write, Read, Ok(())),
            (A::MultiNodeMultiWriter, Read, Read, Ok(())),
        ];
        for (mode, first, next, want) in table {
            assert_eq!(&second(*mode, *first, *next), want, "{} {first:?} then {next:?}", mode.as_str());
        }
        // Reader-only volumes refuse even the first writer.
        for mode in [A::SingleNodeReader, A::MultiNodeReader] {
            let mut vol = volume(&[mode]);
            assert_eq!(claim(&mut vol, taken("a1", Write, mode), true), Err(ClaimError::Unschedulable), "{}", mode.as_str());
            assert!(!has_free_write_claims(&CsiVolume { access_mode: mode, ..vol.clone() }));
        }
        // Every mode takes a first reader, and the claim sets the volume's modes.
        for mode in A::ALL {
            let mut vol = volume(&[mode]);
            claim(&mut vol, taken("a1", Read, mode), true).unwrap();
            assert_eq!(vol.access_mode, mode);
            assert_eq!(vol.attachment_mode, CsiVolumeAttachmentMode::FileSystem);
            assert!(vol.read_allocs.contains("a1") && vol.read_claims.contains_key("a1"));
        }
    }

    #[test]
    fn unschedulable_exhausted_and_missing_allocs_are_refused_first() {
        let mut vol = volume(&[A::MultiNodeMultiWriter]);
        vol.schedulable = false;
        assert_eq!(claim(&mut vol, taken("a1", Read, A::MultiNodeMultiWriter), true), Err(ClaimError::Unschedulable));
        assert_eq!(claim(&mut vol, taken("a1", Write, A::MultiNodeMultiWriter), true), Err(ClaimError::Unschedulable));
        vol.schedulable = true;
        vol.resource_exhausted = Timestamp(1);
        assert_eq!(claim(&mut vol, taken("a1", Read, A::MultiNodeMultiWriter), true), Err(ClaimError::Unschedulable));
        vol.resource_exhausted = Timestamp::ZERO;
        let e = claim(&mut vol, taken("a1", Read, A::MultiNodeMultiWriter), false).unwrap_err();
        assert_eq!(e.to_string(), "allocation missing: a1");
        assert!(vol.read_allocs.is_empty(), "a refused claim changes nothing");
        // A volume never claimed takes writers only if a writer capability was registered.
        let mut ro = volume(&[A::MultiNodeReader]);
        assert!(!write_schedulable(&ro));
        ro.requested_capabilities
            .push(CsiVolumeCapability { access_mode: A::SingleNodeWriter, attachment_mode: CsiVolumeAttachmentMode::FileSystem });
        assert!(write_schedulable(&ro));
        assert_eq!(ClaimError::MaxClaims.to_string(), "volume max claims reached");
        assert_eq!(ClaimError::Unschedulable.to_string(), "volume is currently unschedulable");
    }

    #[test]
    fn claims_are_idempotent_and_move_between_read_and_write() {
        let mode = A::MultiNodeSingleWriter;
        let mut vol = volume(&[mode]);
        claim(&mut vol, taken("a1", Write, mode), true).unwrap();
        // The same alloc again: no-op even though the writer slot is taken (by itself).
        claim(&mut vol, taken("a1", Write, mode), true).unwrap();
        // Even when the alloc was GC'd meanwhile.
        claim(&mut vol, taken("a1", Write, mode), false).unwrap();
        assert_eq!(vol.write_claims.len(), 1);
        // A read claim of the writer moves it.
        claim(&mut vol, taken("a1", Read, mode), true).unwrap();
        assert!(vol.write_allocs.is_empty() && vol.write_claims.is_empty());
        assert!(vol.read_allocs.contains("a1"));
        // So another alloc can write now.
        claim(&mut vol, taken("a2", Write, mode), true).unwrap();
    }

    #[test]
    fn attachment_mode_cannot_change_while_claimed() {
        let mode = A::MultiNodeMultiWriter;
        let mut vol = volume(&[mode]);
        claim(&mut vol, taken("a1", Write, mode), true).unwrap();
        let mut block = taken("a2", Write, mode);
        block.attachment_mode = CsiVolumeAttachmentMode::BlockDevice;
        assert_eq!(claim(&mut vol, block, true), Err(ClaimError::AttachmentModeChange));
    }

    #[test]
    fn release_checkpoints_then_frees_and_resets_the_modes() {
        let mode = A::SingleNodeWriter;
        let mut vol = volume(&[mode]);
        claim(&mut vol, taken("a1", Write, mode), true).unwrap();
        for state in [CsiVolumeClaimState::Unpublishing, CsiVolumeClaimState::NodeDetached, CsiVolumeClaimState::ControllerDetached] {
            let c = CsiVolumeClaim { state, ..taken("a1", Write, mode) };
            claim(&mut vol, c, false).unwrap();
            assert_eq!(vol.past_claims["a1"].state, state);
            // Still held: a checkpoint does not free the claim.
            assert!(vol.write_allocs.contains("a1"));
            assert_eq!(claim(&mut vol.clone(), taken("a2", Write, mode), true), Err(ClaimError::MaxClaims));
        }
        let free = CsiVolumeClaim { state: CsiVolumeClaimState::ReadyToFree, ..taken("a1", Write, mode) };
        claim(&mut vol, free, false).unwrap();
        assert!(vol.write_allocs.is_empty() && vol.write_claims.is_empty() && vol.past_claims.is_empty());
        assert_eq!(vol.access_mode, A::Unknown);
        assert_eq!(vol.attachment_mode, CsiVolumeAttachmentMode::Unknown);
        claim(&mut vol, taken("a2", Write, mode), true).unwrap();
        // A GC claim in state taken is a release too: it only records a past claim.
        let gc = CsiVolumeClaim { mode: CsiVolumeClaimMode::Gc, ..taken("a3", Read, mode) };
        claim(&mut vol, gc, false).unwrap();
        assert!(vol.past_claims.contains_key("a3") && !vol.read_allocs.contains("a3"));
    }

    #[test]
    fn modes_are_kept_while_other_claims_remain() {
        let mode = A::MultiNodeMultiWriter;
        let mut vol = volume(&[mode]);
        claim(&mut vol, taken("a1", Write, mode), true).unwrap();
        claim(&mut vol, taken("a2", Read, mode), true).unwrap();
        claim(&mut vol, CsiVolumeClaim { state: CsiVolumeClaimState::ReadyToFree, ..taken("a1", Write, mode) }, false).unwrap();
        assert_eq!(vol.access_mode, mode);
    }
}
