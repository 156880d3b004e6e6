//! Volume requests of a group and mounts of a task.

use serde::{Deserialize, Serialize};

/// A group's `volume "<name>" {}` block.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct VolumeRequest {
    /// Name tasks mount it by.
    pub name: String,
    /// `host` or `csi`.
    #[serde(rename = "Type")]
    pub volume_type: String,
    /// Host volume name or CSI volume ID.
    pub source: String,
    /// Mount read-only.
    pub read_only: bool,
    /// CSI access mode.
    pub access_mode: String,
    /// CSI attachment mode.
    pub attachment_mode: String,
    /// CSI mount options.
    pub mount_options: Option<CsiMountOptions>,
    /// Append the alloc index to the source (`vol[0]`).
    pub per_alloc: bool,
}

/// CSI mount options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiMountOptions {
    /// Filesystem type.
    #[serde(rename = "FSType")]
    pub fs_type: String,
    /// Mount flags.
    pub mount_flags: Vec<String>,
}

/// A task's `volume_mount {}` block.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct VolumeMount {
    /// Group volume name.
    pub volume: String,
    /// Path inside the task.
    pub destination: String,
    /// Mount read-only.
    pub read_only: bool,
    /// `private`, `host-to-task` or `bidirectional`.
    pub propagation_mode: String,
}
