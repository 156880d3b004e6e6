//! Volume capabilities: how a volume will be used, from Nomad's attachment and access mode
//! names, and Nomad's check of the capabilities a controller confirmed.

use crate::v1::VolumeCapability;
use crate::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode};

/// Nomad's attachment mode for a raw block device.
pub const ATTACHMENT_BLOCK_DEVICE: &str = "block-device";
/// Nomad's attachment mode for a mounted file system.
pub const ATTACHMENT_FILE_SYSTEM: &str = "file-system";

/// The CSI access mode of one of Nomad's access mode names (`single-node-writer`, ...).
pub fn access_mode(nomad: &str) -> Option<Mode> {
    Some(match nomad {
        "single-node-reader-only" => Mode::SingleNodeReaderOnly,
        "single-node-writer" => Mode::SingleNodeWriter,
        "multi-node-reader-only" => Mode::MultiNodeReaderOnly,
        "multi-node-single-writer" => Mode::MultiNodeSingleWriter,
        "multi-node-multi-writer" => Mode::MultiNodeMultiWriter,
        _ => return None,
    })
}

/// The capability for Nomad's attachment mode, access mode and mount options (file systems
/// only), or the error Nomad gives for a name it does not know.
pub fn volume_capability(
    attachment_mode: &str,
    nomad_access_mode: &str,
    fs_type: &str,
    mount_flags: &[String],
) -> Result<VolumeCapability, String> {
    let access_type = match attachment_mode {
        ATTACHMENT_BLOCK_DEVICE => AccessType::Block(BlockVolume {}),
        ATTACHMENT_FILE_SYSTEM => AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: mount_flags.to_vec(),
            volume_mount_group: String::new(),
        }),
        other => return Err(format!("unknown volume attachment mode: {other}")),
    };
    let mode = access_mode(nomad_access_mode).ok_or_else(|| format!("unknown volume access mode: {nomad_access_mode}"))?;
    Ok(VolumeCapability { access_type: Some(access_type), access_mode: Some(AccessMode { mode: mode as i32 }) })
}

/// Whether an access mode lets a workload write.
pub fn is_writer(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::SingleNodeWriter
            | Mode::MultiNodeSingleWriter
            | Mode::MultiNodeMultiWriter
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter
    )
}

/// Checks `requested` against what a controller's `ValidateVolumeCapabilities` confirmed, as
/// Nomad does: plugins in the wild confirm incompletely, so the check passes when any confirmed
/// capability agrees with the request, or when none contradicts it; otherwise it fails with
/// every contradiction found.
pub fn check_confirmed(requested: &VolumeCapability, confirmed: &[VolumeCapability]) -> Result<(), String> {
    let mut contradictions = Vec::new();
    for got in confirmed {
        match contradiction(requested, got) {
            Some(Some(why)) => contradictions.push(why),
            // Agrees in full.
            Some(None) => return Ok(()),
            // Says nothing either way (a block confirmation without a mount to compare).
            None => {}
        }
    }
    if contradictions.is_empty() { Ok(()) } else { Err(contradictions.join("; ")) }
}

/// `Some(None)`: agrees; `Some(Some(why))`: contradicts; `None`: neither.
fn contradiction(requested: &VolumeCapability, got: &VolumeCapability) -> Option<Option<String>> {
    let mode_of = |c: &VolumeCapability| c.access_mode.as_ref().map_or(Mode::Unknown, |m| m.mode());
    let (want_mode, got_mode) = (mode_of(requested), mode_of(got));
    // A plugin that does not check access modes answers UNKNOWN.
    if got_mode != Mode::Unknown && got_mode != want_mode {
        return Some(Some(format!("requested access mode {}, got {}", want_mode.as_str_name(), got_mode.as_str_name())));
    }
    let is_block = |c: &VolumeCapability| matches!(c.access_type, Some(AccessType::Block(_)));
    if is_block(got) && !is_block(requested) {
        return Some(Some("'block-device' access type was not requested but was validated by the controller".to_string()));
    }
    let Some(AccessType::Mount(got_mount)) = &got.access_type else { return None };
    let Some(AccessType::Mount(want_mount)) = &requested.access_type else {
        return Some(Some("'file-system' access type was not requested but was validated by the controller".to_string()));
    };
    if want_mount.fs_type != got_mount.fs_type {
        return Some(Some(format!("requested filesystem type {}, got {}", want_mount.fs_type, got_mount.fs_type)));
    }
    if !want_mount.mount_flags.iter().all(|flag| got_mount.mount_flags.contains(flag)) {
        // Mount flags can carry secrets: never name them.
        return Some(Some("requested mount flags did not match available capabilities".to_string()));
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(mode: &str, fs: &str, flags: &[&str]) -> VolumeCapability {
        let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        volume_capability(ATTACHMENT_FILE_SYSTEM, mode, fs, &flags).unwrap()
    }

    #[test]
    fn nomad_modes_map_to_csi() {
        let cap = mount("multi-node-single-writer", "ext4", &["noatime"]);
        assert_eq!(cap.access_mode.unwrap().mode(), Mode::MultiNodeSingleWriter);
        let Some(AccessType::Mount(m)) = cap.access_type else { panic!("a mount") };
        assert_eq!((m.fs_type.as_str(), m.mount_flags), ("ext4", vec!["noatime".to_string()]));
        let block = volume_capability(ATTACHMENT_BLOCK_DEVICE, "single-node-reader-only", "ignored", &[]).unwrap();
        assert!(matches!(block.access_type, Some(AccessType::Block(_))));
        assert_eq!(volume_capability("nfs", "single-node-writer", "", &[]).unwrap_err(), "unknown volume attachment mode: nfs");
        assert_eq!(volume_capability(ATTACHMENT_FILE_SYSTEM, "", "", &[]).unwrap_err(), "unknown volume access mode: ");
        assert!(is_writer(Mode::SingleNodeWriter) && !is_writer(Mode::MultiNodeReaderOnly) && !is_writer(Mode::Unknown));
    }

    #[test]
    fn confirmed_capabilities_are_checked_like_nomad() {
        let want = mount("single-node-writer", "ext4", &["noatime"]);
        assert_eq!(check_confirmed(&want, &[]), Ok(()), "nothing confirmed: nothing contradicts");
        assert_eq!(check_confirmed(&want, &[mount("single-node-writer", "ext4", &["noatime", "nodev"])]), Ok(()));
        let unknown_mode = VolumeCapability { access_mode: None, ..mount("single-node-writer", "ext4", &["noatime"]) };
        assert_eq!(check_confirmed(&want, &[unknown_mode]), Ok(()), "a plugin that does not check modes");
        assert_eq!(
            check_confirmed(&want, &[mount("multi-node-reader-only", "ext4", &[])]).unwrap_err(),
            "requested access mode SINGLE_NODE_WRITER, got MULTI_NODE_READER_ONLY"
        );
        let err = check_confirmed(&want, &[mount("single-node-writer", "xfs", &[]), mount("single-node-writer", "ext4", &[])]).unwrap_err();
        assert_eq!(err, "requested filesystem type ext4, got xfs; requested mount flags did not match available capabilities");
        assert_eq!(
            check_confirmed(&want, &[mount("single-node-writer", "xfs", &[]), mount("single-node-writer", "ext4", &["noatime"])]),
            Ok(()),
            "one agreeing confirmation is enough"
        );
        let block = volume_capability(ATTACHMENT_BLOCK_DEVICE, "single-node-writer", "", &[]).unwrap();
        assert!(check_confirmed(&want, std::slice::from_ref(&block)).unwrap_err().contains("'block-device' access type was not requested"));
        assert!(check_confirmed(&block, std::slice::from_ref(&want)).unwrap_err().contains("'file-system' access type was not requested"));
        assert_eq!(check_confirmed(&block, std::slice::from_ref(&block)), Ok(()), "block against block: nothing to contradict");
    }
}
