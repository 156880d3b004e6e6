//! Bind mounts and what `/proc/self/mountinfo` says about them.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The directory of its file system that is mounted (for a bind mount, the source's path
    /// within its file system).
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Whether it is mounted read-only.
    pub read_only: bool,
}

/// The mount table of this process's mount namespace, in mount order.
pub fn mount_table() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let root = unescape(fields.nth(3)?);
            let mount_point = PathBuf::from(unescape(fields.next()?));
            let read_only = fields.next()?.split(',').any(|option| option == "ro");
            Some(MountEntry { root, mount_point, read_only })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as three octal digits after a backslash.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at `path`, if it is a mount point.
pub fn mounted_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let path = match std::fs::canonicalize(path) {
        Ok(path) => path,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(mount_table()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// Every mount whose source is the directory `dir_name` (a volume's directory name), wherever
/// its file system is mounted: mountinfo names a bind mount's source only within its file
/// system, so this matches on the last component.
pub fn mounts_of(dir_name: &str) -> io::Result<Vec<MountEntry>> {
    let suffix = format!("/{dir_name}");
    Ok(mount_table()?.into_iter().filter(|m| m.root.ends_with(&suffix)).collect())
}

/// The mount flags bind mounts take, by their `mount -o` names.
pub fn flag(name: &str) -> Option<MsFlags> {
    Some(match name {
        "ro" => MsFlags::MS_RDONLY,
        "rw" => MsFlags::empty(),
        "noexec" => MsFlags::MS_NOEXEC,
        "nosuid" => MsFlags::MS_NOSUID,
        "nodev" => MsFlags::MS_NODEV,
        "noatime" => MsFlags::MS_NOATIME,
        "nodiratime" => MsFlags::MS_NODIRATIME,
        "relatime" => MsFlags::MS_RELATIME,
        _ => return None,
    })
}

/// Bind-mounts `source` at `target`, then applies `flags` (read-only among them) with a
/// remount, the only way a bind mount takes them.
pub fn bind(source: &Path, target: &Path, flags: MsFlags) -> nix::Result<()> {
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    if !flags.is_empty() {
        let remounted = mount(None::<&str>, target, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags, None::<&str>);
        if let Err(e) = remounted {
            // Leave nothing half-done: a writable mount where read-only was asked for.
            let _ = umount2(target, MntFlags::empty());
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts everything stacked at `path` (a retried publish may have stacked several).
pub fn unmount_all(path: &Path) -> io::Result<()> {
    // A bound on a loop that only a broken kernel would not end.
    for _ in 0..16 {
        if mounted_at(path)?.is_none() {
            return Ok(());
        }
        umount2(path, MntFlags::empty()).map_err(io::Error::from)?;
    }
    Err(io::Error::other(format!("{} is still a mount point after 16 unmounts", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_parsed_and_unescaped() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    90 22 8:1 /srv/state/volumes/v1 /mnt/with\\040space ro,nosuid shared:1 - ext4 /dev/sda1 rw\n\
                    short line\n";
        let table = parse_mountinfo(text);
        assert_eq!(
            table,
            vec![
                MountEntry { root: "/".into(), mount_point: "/".into(), read_only: false },
                MountEntry { root: "/srv/state/volumes/v1".into(), mount_point: "/mnt/with space".into(), read_only: true },
            ]
        );
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04", "an incomplete escape is kept as it is");
    }

    #[test]
    fn flags_are_the_bind_mount_ones() {
        assert_eq!(flag("ro"), Some(MsFlags::MS_RDONLY));
        assert_eq!(flag("noexec"), Some(MsFlags::MS_NOEXEC));
        assert_eq!(flag("uid=0"), None);
        assert_eq!(flag("discard"), None);
    }
}
