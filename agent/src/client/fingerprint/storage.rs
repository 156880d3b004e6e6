//! Storage of the alloc dir: `unique.storage.volume`, `unique.storage.bytestotal`,
//! `unique.storage.bytesfree`.

use std::path::Path;

use super::{Fingerprint, FingerprintContext, Fingerprinter, read};

pub(super) struct Storage;

/// The device mounted at the longest mount point that contains `path`, from `/proc/self/mounts`.
fn volume_of(mounts: &str, path: &Path) -> Option<String> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let device = fields.next()?;
            // Spaces in mount points are escaped as \040.
            let mount_point = fields.next()?.replace("\\040", " ");
            path.starts_with(&mount_point).then(|| (mount_point.len(), device.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, device)| device)
}

/// The nearest existing ancestor: the alloc dir may not exist before the first alloc.
fn existing_ancestor(path: &Path) -> &Path {
    path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"))
}

impl Fingerprinter for Storage {
    fn name(&self) -> &'static str {
        "storage"
    }

    fn fingerprint(&self, ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        let path = existing_ancestor(&ctx.alloc_dir);
        let stat = nix::sys::statvfs::statvfs(path).map_err(|e| format!("statvfs {}: {e}", path.display()))?;
        let frsize = stat.fragment_size() as u64;
        let total = stat.blocks() as u64 * frsize;
        let free = stat.blocks_available() as u64 * frsize;
        out.disk_free_mb = (free / 1024 / 1024) as i64;
        out.attributes.insert("unique.storage.bytestotal".into(), total.to_string());
        out.attributes.insert("unique.storage.bytesfree".into(), free.to_string());
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if let Some(volume) = read("/proc/self/mounts").ok().and_then(|m| volume_of(&m, &canonical)) {
            out.attributes.insert("unique.storage.volume".into(), volume);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_is_the_longest_matching_mount_point() {
        let mounts = "/dev/sda1 / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n/dev/sdb1 /var/lib\\040data xfs rw 0 0\n";
        assert_eq!(volume_of(mounts, Path::new("/var/lib data/alloc")).as_deref(), Some("/dev/sdb1"));
        assert_eq!(volume_of(mounts, Path::new("/tmp/x")).as_deref(), Some("tmpfs"));
        assert_eq!(volume_of(mounts, Path::new("/home")).as_deref(), Some("/dev/sda1"));
    }

    #[test]
    fn a_missing_alloc_dir_is_measured_at_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = FingerprintContext {
            alloc_dir: dir.path().join("not/yet"),
            advertise_ip: None,
            http_addr: String::new(),
            network_interface: None,
        };
        let mut out = Fingerprint::default();
        Storage.fingerprint(&ctx, &mut out).unwrap();
        let total: u64 = out.attributes["unique.storage.bytestotal"].parse().unwrap();
        let free: u64 = out.attributes["unique.storage.bytesfree"].parse().unwrap();
        assert!(total > 0 && free <= total);
    }
}
