//! Unpacking a downloaded archive beneath the alloc dir: zip, tar (plain, gz, bz2, xz, zst) and
//! single compressed files (gz, bz2, xz, zst), as go-getter's decompressors do with Nomad's
//! settings (`DisableSymlinks`, setuid/setgid stripped, file count and size limits).
//!
//! Every entry is checked before anything is written (a first pass over the archive): an
//! absolute name, a `..` component, a symlink, a hard link or a special file refuses the whole
//! archive, as do the limits, so a refused archive leaves nothing behind. The second pass
//! writes through [`Beneath`] without following any symlink, and counts the bytes it writes
//! against the size limit again (an archive's sizes are only claims).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::fs_beneath::{Beneath, FsError, Kind, Links};

/// The archive types go-getter knows, by the URL suffix or `archive` option that names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Archive {
    /// `.zip`.
    Zip,
    /// `.tar`.
    Tar,
    /// `.tar.gz`, `.tgz`.
    TarGz,
    /// `.tar.bz2`, `.tbz2`.
    TarBz2,
    /// `.tar.xz`, `.txz`.
    TarXz,
    /// `.tar.zst`, `.tzst`.
    TarZst,
    /// `.gz`: one file.
    Gz,
    /// `.bz2`: one file.
    Bz2,
    /// `.xz`: one file.
    Xz,
    /// `.zst`: one file.
    Zst,
}

const NAMES: [(&str, Archive); 14] = [
    ("zip", Archive::Zip),
    ("tar", Archive::Tar),
    ("tar.gz", Archive::TarGz),
    ("tgz", Archive::TarGz),
    ("tar.bz2", Archive::TarBz2),
    ("tbz2", Archive::TarBz2),
    ("tar.xz", Archive::TarXz),
    ("txz", Archive::TarXz),
    ("tar.zst", Archive::TarZst),
    ("tzst", Archive::TarZst),
    ("gz", Archive::Gz),
    ("bz2", Archive::Bz2),
    ("xz", Archive::Xz),
    ("zst", Archive::Zst),
];

impl Archive {
    /// The type the longest matching suffix (`.<name>`) of a URL path names.
    pub fn by_suffix(path: &str) -> Option<Archive> {
        NAMES.iter().filter(|(n, _)| path.ends_with(&format!(".{n}"))).max_by_key(|(n, _)| n.len()).map(|(_, a)| *a)
    }

    /// The type an `archive` option names.
    pub fn named(name: &str) -> Option<Archive> {
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
    }

    /// Every name, for messages.
    pub fn names() -> Vec<&'static str> {
        NAMES.iter().map(|(n, _)| *n).collect()
    }

    /// The single-file compression of a type that holds one file.
    fn single_name(self) -> Option<&'static str> {
        match self {
            Archive::Gz => Some("gzip"),
            Archive::Bz2 => Some("bzip2"),
            Archive::Xz => Some("xz"),
            Archive::Zst => Some("zstd"),
            _ => None,
        }
    }
}

/// `client { artifact { decompression_size_limit, decompression_file_count_limit } }`; 0 is
/// no limit, as in Nomad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes all unpacked files may hold together.
    pub max_bytes: u64,
    /// Most entries (files and directories) an archive may hold.
    pub max_files: u64,
}

/// What an entry is, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
}

/// One checked entry. `path` is `None` for the archive's root (`./`).
struct Entry {
    path: Option<PathBuf>,
    kind: EntryKind,
    mode: u32,
    size: u64,
    mtime: Option<u64>,
}

/// Unpacks `archive` (the downloaded file) into the directory `dest` (relative to `root`,
/// created if missing). `name` names the archive in messages.
pub fn unpack_dir(kind: Archive, archive: &File, root: &Beneath, dest: &Path, limits: Limits, name: &str) -> Result<(), String> {
    if let Some(single) = kind.single_name() {
        return Err(format!("{single}-compressed files can only unarchive to a single file"));
    }
    scan(kind, archive, limits, false, name)?;
    mkdir_p(root, dest).map_err(|e| e.to_string())?;
    let mut budget = Budget::new(kind, limits);
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    each_entry(kind, archive, name, &mut |entry, data| {
        let Some(path) = entry.path else { return Ok(()) };
        let rel = dest.join(&path);
        match entry.kind {
            EntryKind::Dir => {
                mkdir_p(root, &rel).map_err(|e| e.to_string())?;
                dirs.push((rel, entry.mode));
            }
            EntryKind::File => {
                if let Some(parent) = rel.parent() {
                    mkdir_p(root, parent).map_err(|e| e.to_string())?;
                }
                let mut f = root.write(&rel, 0o600, Links::Refuse).map_err(|e| e.to_string())?;
                budget.copy(data, &mut f)?;
                finish_file(&f, &rel, entry.mode, entry.mtime)?;
            }
        }
        Ok(())
    })?;
    // Modes last: a directory that is not writable would refuse what goes into it.
    for (rel, mode) in dirs.iter().rev() {
        root.set_mode(rel, Kind::Dir, *mode).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Unpacks the one file `archive` holds (or the single compressed file it is) into `out`,
/// with the entry's mode (`0644` for a compressed file).
pub fn unpack_single(kind: Archive, archive: &File, out: &mut File, limits: Limits, name: &str) -> Result<(), String> {
    let mut budget = Budget::new(kind, limits);
    if kind.single_name().is_some() {
        let mut input = rewound(archive)?;
        let mut reader = decoder(kind, &mut input)?;
        budget.copy(&mut reader, out)?;
        return finish_file(out, Path::new(name), 0o644, None);
    }
    scan(kind, archive, limits, true, name)?;
    each_entry(kind, archive, name, &mut |entry, data| {
        if entry.kind == EntryKind::File {
            budget.copy(data, out)?;
            finish_file(out, Path::new(name), entry.mode, entry.mtime)?;
        }
        Ok(())
    })
}

/// The first pass: every entry checked, the limits applied, nothing written.
fn scan(kind: Archive, archive: &File, limits: Limits, single: bool, name: &str) -> Result<(), String> {
    let family = family(kind);
    let (mut entries, mut files, mut bytes) = (0u64, 0u64, 0u64);
    each_entry(kind, archive, name, &mut |entry, _| {
        entries += 1;
        if limits.max_files > 0 && entries > limits.max_files {
            return Err(format!("{family} archive contains too many files: {entries} > {}", limits.max_files));
        }
        match entry.kind {
            EntryKind::Dir if single && entry.path.is_some() => return Err(format!("expected a single file: {name}")),
            EntryKind::Dir => {}
            EntryKind::File => {
                files += 1;
                if single && files > 1 {
                    return Err(format!("expected a single file, got multiple: {name}"));
                }
                bytes = bytes.saturating_add(entry.size);
                if limits.max_bytes > 0 && bytes > limits.max_bytes {
                    return Err(format!("{family} archive larger than limit: {}", limits.max_bytes));
                }
            }
        }
        Ok(())
    })?;
    if files == 0 && (single || entries == 0) {
        return Err(format!("empty archive: {name}"));
    }
    Ok(())
}

fn family(kind: Archive) -> &'static str {
    if kind == Archive::Zip { "zip" } else { "tar" }
}

/// The archive's file from its start, on its own fd (the two passes read it twice).
fn rewound(archive: &File) -> Result<File, String> {
    let mut f = archive.try_clone().map_err(|e| format!("reading the archive: {e}"))?;
    f.seek(SeekFrom::Start(0)).map_err(|e| format!("reading the archive: {e}"))?;
    Ok(f)
}

/// The decompressed stream of a tar or single-file type.
fn decoder<'a>(kind: Archive, input: &'a mut File) -> Result<Box<dyn Read + 'a>, String> {
    let input = BufReader::new(input);
    Ok(match kind {
        Archive::Tar => Box::new(input),
        Archive::TarGz | Archive::Gz => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
        Archive::TarBz2 | Archive::Bz2 => Box::new(bzip2::bufread::MultiBzDecoder::new(input)),
        Archive::TarXz | Archive::Xz => Box::new(lzma_rust2::XzReader::new(input, true)),
        Archive::TarZst | Archive::Zst => {
            Box::new(ruzstd::decoding::StreamingDecoder::new(input).map_err(|e| format!("reading the zstd stream: {e}"))?)
        }
        Archive::Zip => return Err("a zip archive is not a stream".into()),
    })
}

/// Calls `f` with every entry of the archive, checked, and its data.
fn each_entry(
    kind: Archive,
    archive: &File,
    name: &str,
    f: &mut dyn FnMut(Entry, &mut dyn Read) -> Result<(), String>,
) -> Result<(), String> {
    let bad = |e: &dyn std::fmt::Display| format!("reading {} archive {name}: {e}", family(kind));
    let mut input = rewound(archive)?;
    if kind == Archive::Zip {
        let mut zip = zip::ZipArchive::new(input).map_err(|e| bad(&e))?;
        for i in 0..zip.len() {
            let mut file = zip.by_index(i).map_err(|e| bad(&e))?;
            let entry_name = file.name().map_err(|e| bad(&e))?.into_owned();
            let path = checked_path(&entry_name)?;
            const S_IFMT: u32 = 0o170000;
            let special = file.unix_mode().map(|m| m & S_IFMT).filter(|t| ![0, 0o100000, 0o040000, 0o120000].contains(t));
            if file.is_symlink() {
                return Err(format!("entry {entry_name:?} is a symbolic link: nomad-rs does not unpack links"));
            }
            if special.is_some() {
                return Err(format!("entry {entry_name:?} is not a regular file or directory"));
            }
            let kind = if file.is_dir() { EntryKind::Dir } else { EntryKind::File };
            let default = if kind == EntryKind::Dir { 0o755 } else { 0o644 };
            let mode = file.unix_mode().map_or(default, |m| m & 0o777);
            let entry = Entry { path, kind, mode, size: file.size(), mtime: None };
            f(entry, &mut file)?;
        }
        return Ok(());
    }
    let mut tar = tar::Archive::new(decoder(kind, &mut input)?);
    for e in tar.entries().map_err(|e| bad(&e))? {
        let mut e = e.map_err(|e| bad(&e))?;
        let raw = e.path_bytes().into_owned();
        let entry_name = String::from_utf8_lossy(&raw).into_owned();
        let header = e.header();
        use tar::EntryType as T;
        let kind = match header.entry_type() {
            T::Regular | T::Continuous => EntryKind::File,
            T::Directory => EntryKind::Dir,
            // Metadata for other entries, not files.
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => continue,
            T::Symlink => return Err(format!("entry {entry_name:?} is a symbolic link: nomad-rs does not unpack links")),
            T::Link => return Err(format!("entry {entry_name:?} is a hard link: nomad-rs does not unpack links")),
            other => return Err(format!("entry {entry_name:?} is not a regular file or directory ({other:?})")),
        };
        let path = checked_path(&entry_name)?;
        let mode = header.mode().map_err(|e| bad(&e))? & 0o777;
        let size = header.size().map_err(|e| bad(&e))?;
        let mtime = header.mtime().ok().filter(|t| *t > 0);
        f(Entry { path, kind, mode, size, mtime }, &mut e)?;
    }
    Ok(())
}

/// The entry's path below the destination: no absolute name, no `..` (go-getter's
/// `containsDotDot`, on `/` and `\`); `None` for the root itself.
fn checked_path(name: &str) -> Result<Option<PathBuf>, String> {
    if name.starts_with('/') {
        return Err(format!("entry is an absolute path: {name}"));
    }
    if name.split(['/', '\\']).any(|c| c == "..") {
        return Err(format!("entry contains '..': {name}"));
    }
    if name.contains('\0') {
        return Err(format!("entry name contains a NUL byte: {name:?}"));
    }
    let path: PathBuf = name.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    Ok((!path.as_os_str().is_empty()).then_some(path))
}

/// Makes `rel` a directory beneath `root` unless it is one (no symlink anywhere on the way);
/// new directories get 0755.
pub fn mkdir_p(root: &Beneath, rel: &Path) -> Result<(), FsError> {
    if rel.as_os_str().is_empty() {
        return Ok(());
    }
    match root.stat(rel, Links::Refuse) {
        Ok(s) if s.kind == Kind::Dir => Ok(()),
        Ok(_) => root.open_dir(rel, Links::Refuse).map(|_| ()),
        Err(e) if e.is_not_found() => root.create_dir_all(rel, 0o755).map(|_| ()),
        Err(e) => Err(e),
    }
}

/// The entry's mode (setuid, setgid and sticky bits already stripped) and time.
fn finish_file(f: &File, rel: &Path, mode: u32, mtime: Option<u64>) -> Result<(), String> {
    f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777)).map_err(|e| format!("chmod {}: {e}", rel.display()))?;
    if let Some(secs) = mtime {
        let t = UNIX_EPOCH + Duration::from_secs(secs);
        f.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
            .map_err(|e| format!("set times of {}: {e}", rel.display()))?;
    }
    Ok(())
}

/// What is left of the size limit while writing.
struct Budget {
    left: Option<u64>,
    limit: u64,
    what: String,
}

impl Budget {
    fn new(kind: Archive, limits: Limits) -> Budget {
        let what = match kind.single_name() {
            Some(single) => format!("{single}-compressed file"),
            None => format!("{} archive", family(kind)),
        };
        Budget { left: (limits.max_bytes > 0).then_some(limits.max_bytes), limit: limits.max_bytes, what }
    }

    /// Copies `r` into `w`, stopping with an error at the limit.
    fn copy(&mut self, r: &mut dyn Read, w: &mut dyn Write) -> Result<(), String> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf).map_err(|e| format!("reading the {}: {e}", self.what))?;
            if n == 0 {
                return Ok(());
            }
            if let Some(left) = self.left.as_mut() {
                if n as u64 > *left {
                    return Err(format!("{} larger than limit: {}", self.what, self.limit));
                }
                *left -= n as u64;
            }
            w.write_all(&buf[..n]).map_err(|e| format!("writing the {}: {e}", self.what))?;
        }
    }
}
