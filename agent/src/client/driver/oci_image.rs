//! Turning the oci driver's `image` into a root filesystem: either a rootfs directory used as is,
//! or an OCI image layout (`oci-layout`, `index.json`, `blobs/<alg>/<hex>`) whose layers are
//! verified against their digests and extracted in order, honouring whiteouts.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use oci_spec::image::{Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os};
use sha2::{Digest as _, Sha256};

use super::DriverError;
use crate::fs_beneath::{Beneath, Links, check_name};

/// Process defaults from an image's config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ImageDefaults {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

/// A root filesystem ready for a bundle.
#[derive(Debug)]
pub(super) struct PreparedImage {
    pub rootfs: PathBuf,
    /// A rootfs directory given by the user is shared between tasks, so it is mounted read-only.
    pub shared: bool,
    pub defaults: ImageDefaults,
}

/// Resolves `image`; a layout is extracted into `<bundle>/rootfs`.
pub(super) fn prepare(image: &Path, bundle: &Path) -> Result<PreparedImage, DriverError> {
    let fail = |reason: String| DriverError::Image { path: image.to_path_buf(), reason };
    let image = fs::canonicalize(image).map_err(|e| fail(format!("cannot open: {e}")))?;
    if !image.is_dir() {
        return Err(fail("is neither a rootfs directory nor an OCI image layout directory".to_string()));
    }
    if !image.join("index.json").exists() && !image.join("oci-layout").exists() {
        return Ok(PreparedImage { rootfs: image, shared: true, defaults: ImageDefaults::default() });
    }
    let rootfs = bundle.join("rootfs");
    let bundle_dir = Beneath::open(bundle).map_err(|e| fail(e.to_string()))?;
    bundle_dir.remove_tree(Path::new("rootfs")).map_err(|e| fail(e.to_string()))?;
    fs::create_dir_all(&rootfs).map_err(|e| fail(format!("create {}: {e}", rootfs.display())))?;
    let layout = Layout { dir: Beneath::open(&image).map_err(|e| fail(e.to_string()))? };
    let defaults = layout.unpack(&rootfs).map_err(fail)?;
    Ok(PreparedImage { rootfs, shared: false, defaults })
}

/// The layout directory; every file in it is opened beneath it as a regular file, never
/// through a symlink (it may be in the task dir, or a FIFO could hang the start).
struct Layout {
    dir: Beneath,
}

impl Layout {
    fn unpack(&self, rootfs: &Path) -> Result<ImageDefaults, String> {
        let index_file = self.dir.read(Path::new("index.json"), Links::Refuse).map_err(|e| format!("index.json: {e}"))?;
        let index = ImageIndex::from_reader(BufReader::new(index_file)).map_err(|e| format!("index.json: {e}"))?;
        let manifest = self.manifest_from_index(&index, 0)?;
        let config_bytes = self.read_blob(manifest.config())?;
        let config =
            ImageConfiguration::from_reader(&config_bytes[..]).map_err(|e| format!("image config {}: {e}", manifest.config().digest()))?;
        for layer in manifest.layers() {
            self.extract_layer(layer, rootfs)?;
        }
        let defaults = config.config().as_ref().map(|c| ImageDefaults {
            entrypoint: c.entrypoint().clone().unwrap_or_default(),
            cmd: c.cmd().clone().unwrap_or_default(),
            env: c.env().clone().unwrap_or_default(),
            working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
            user: c.user().clone().filter(|u| !u.is_empty()),
        });
        Ok(defaults.unwrap_or_default())
    }

    /// The manifest for this host's platform, following nested indexes a little way.
    fn manifest_from_index(&self, index: &ImageIndex, depth: u8) -> Result<ImageManifest, String> {
        let (os, arch) = (Os::default(), Arch::default());
        let descriptor = index
            .manifests()
            .iter()
            .find(|d| d.platform().as_ref().is_none_or(|p| *p.os() == os && *p.architecture() == arch))
            .ok_or_else(|| format!("index lists no manifest for {os}/{arch}"))?;
        let bytes = self.read_blob(descriptor)?;
        if *descriptor.media_type() == MediaType::ImageIndex {
            if depth > 2 {
                return Err("image indexes nested too deeply".to_string());
            }
            let nested = ImageIndex::from_reader(&bytes[..]).map_err(|e| format!("index {}: {e}", descriptor.digest()))?;
            return self.manifest_from_index(&nested, depth + 1);
        }
        ImageManifest::from_reader(&bytes[..]).map_err(|e| format!("manifest {}: {e}", descriptor.digest()))
    }

    /// `blobs/<alg>/<hex>`, relative to the layout.
    fn blob_path(&self, descriptor: &Descriptor) -> PathBuf {
        let digest = descriptor.digest();
        Path::new("blobs").join(digest.algorithm().to_string()).join(digest.digest())
    }

    fn open_blob(&self, descriptor: &Descriptor) -> Result<VerifyingReader<File>, String> {
        let digest = descriptor.digest();
        if digest.algorithm().to_string() != "sha256" {
            return Err(format!("blob {digest}: only sha256 digests are supported"));
        }
        let path = self.blob_path(descriptor);
        let file = self.dir.read(&path, Links::Refuse).map_err(|e| format!("blob {digest}: {e}"))?;
        Ok(VerifyingReader { inner: file, hasher: Sha256::new(), read: 0, descriptor: descriptor.clone() })
    }

    fn read_blob(&self, descriptor: &Descriptor) -> Result<Vec<u8>, String> {
        let mut reader = self.open_blob(descriptor)?;
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(|e| format!("blob {}: {e}", descriptor.digest()))?;
        reader.verify()?;
        Ok(bytes)
    }

    fn extract_layer(&self, layer: &Descriptor, rootfs: &Path) -> Result<(), String> {
        let what = || format!("layer {}", layer.digest());
        let mut reader = self.open_blob(layer)?;
        let mut magic = [0u8; 2];
        let peeked = read_up_to(&mut reader, &mut magic).map_err(|e| format!("{}: {e}", what()))?;
        let head = io::Cursor::new(magic[..peeked].to_vec());
        {
            let stream = head.chain(&mut reader);
            let decoded: Box<dyn Read + '_> = if magic[..peeked] == [0x1f, 0x8b] {
                Box::new(flate2::read::GzDecoder::new(stream))
            } else if *layer.media_type() == MediaType::ImageLayerZstd {
                return Err(format!("{}: zstd layers are not supported", what()));
            } else {
                Box::new(stream)
            };
            unpack_tar(decoded, rootfs).map_err(|e| format!("{}: {}", what(), with_causes(&e)))?;
        }
        // Hash whatever trailing bytes tar did not need, then compare.
        io::copy(&mut reader, &mut io::sink()).map_err(|e| format!("{}: {e}", what()))?;
        reader.verify()
    }
}

/// Extracts a layer tarball: `.wh.<name>` deletes `<name>`, `.wh..wh..opq` empties its directory.
/// Whiteouts resolve beneath the rootfs (an earlier layer's symlink never leads them out of it).
fn unpack_tar(reader: impl Read, rootfs: &Path) -> io::Result<()> {
    let root = Beneath::open(rootfs).map_err(io::Error::other)?;
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_overwrite(true);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            entry.unpack_in(rootfs)?;
            continue;
        };
        if let Some(hidden) = name.strip_prefix(".wh.") {
            // A parent that is not there (or leaves the rootfs) has nothing to delete.
            let Ok(dir) = root.open_dir(path.parent().unwrap_or(Path::new("")), Links::Beneath) else { continue };
            if hidden == ".wh..opq" {
                let mut children = Vec::new();
                dir.for_each_entry(|child, _| children.push(child.to_os_string())).map_err(io::Error::other)?;
                for child in children {
                    dir.remove_tree(Path::new(&child)).map_err(io::Error::other)?;
                }
            } else if check_name(hidden).is_ok() {
                dir.remove_tree(Path::new(hidden)).map_err(io::Error::other)?;
            }
            continue;
        }
        entry.unpack_in(rootfs)?;
    }
    Ok(())
}

/// An error with its causes; tar's errors keep the interesting part in `source()`.
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Hashes and counts what passes through, to check a blob against its descriptor.
struct VerifyingReader<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
    descriptor: Descriptor,
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl<R> VerifyingReader<R> {
    fn verify(self) -> Result<(), String> {
        let digest = self.descriptor.digest();
        if self.read != self.descriptor.size() {
            return Err(format!("blob {digest}: size is {} bytes, the descriptor says {}", self.read, self.descriptor.size()));
        }
        let actual: String = self.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if actual != digest.digest() {
            return Err(format!("blob {digest}: content does not match its digest (sha256:{actual})"));
        }
        Ok(())
    }
}

/// Reads the numeric IDs for `user` ("uid[:gid]" or a name) from the rootfs's /etc/passwd.
pub(super) fn resolve_user(rootfs: &Path, user: &str) -> Result<(u32, u32), String> {
    let (name, group) = match user.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (user, None),
    };
    let (uid, primary_gid) = match name.parse::<u32>() {
        Ok(uid) => (uid, None),
        Err(_) => {
            // The image's file, read beneath its rootfs (never a host file through a link).
            let passwd = Beneath::open(rootfs)
                .and_then(|root| root.read(Path::new("etc/passwd"), Links::Beneath))
                .map(|mut f| {
                    let mut text = String::new();
                    let _ = f.read_to_string(&mut text);
                    text
                })
                .unwrap_or_default();
            let entry = passwd
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 4 && f[0] == name)
                .ok_or_else(|| format!("user {name:?} is not in the image's /etc/passwd"))?;
            let parse = |s: &str| s.parse::<u32>().map_err(|_| format!("bad /etc/passwd entry for {name:?}"));
            (parse(entry[2])?, Some(parse(entry[3])?))
        }
    };
    let gid = match group {
        Some(g) => g.parse::<u32>().map_err(|_| format!("group {g:?} must be numeric"))?,
        None => primary_gid.unwrap_or(uid),
    };
    Ok((uid, gid))
}
