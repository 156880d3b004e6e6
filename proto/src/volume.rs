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

impl VolumeRequest {
    /// The host volume or CSI volume the alloc named `alloc_name` (`job.group[3]`) uses: the
    /// source, with the alloc's index suffix (`[3]`) under `per_alloc` (Nomad's `AllocSuffix`).
    pub fn source_for(&self, alloc_name: &str) -> std::borrow::Cow<'_, str> {
        if self.per_alloc {
            let suffix = alloc_name.rfind('[').map(|i| &alloc_name[i..]).unwrap_or("");
            std::borrow::Cow::Owned(format!("{}{suffix}", self.source))
        } else {
            std::borrow::Cow::Borrowed(&self.source)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_alloc_sources_carry_the_alloc_index() {
        let shared = VolumeRequest { source: "data".into(), ..VolumeRequest::default() };
        assert_eq!(shared.source_for("web.cache[3]"), "data");
        let per_alloc = VolumeRequest { per_alloc: true, ..shared };
        assert_eq!(per_alloc.source_for("web.cache[3]"), "data[3]");
        assert_eq!(per_alloc.source_for("odd-name"), "data", "no index, no suffix");
    }
}
