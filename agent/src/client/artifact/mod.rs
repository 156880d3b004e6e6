//! Artifacts: what a task's `artifact {}` blocks fetch before it starts (Nomad's
//! `client/allocrunner/taskrunner/getter`, for http and https sources only; admission refuses
//! the rest).
//!
//! The `artifacts` task hook resolves each artifact (`${...}` interpolated, the destination
//! placed beneath the alloc dir) and hands it to an [`ArtifactGetter`]; [`HttpGetter`] is the
//! real one: `source.rs` decides the request URL, archive type, checksum and target;
//! `http.rs` downloads into a temp file in the task's `tmp/`, hashing as it writes; the
//! checksum is verified before anything reaches the destination; a plain file is then moved
//! into place, an archive unpacked by `unpack.rs`. Every path is opened through
//! [`crate::fs_beneath`] beneath the alloc dir, without following symlinks.
//!
//! Nomad downloads in a re-executed subprocess confined by Landlock; nomad-rs does it in the
//! agent, with the same confinement given by the beneath primitives (see ARCHITECTURE.md).

pub mod checksum;
pub mod http;
pub mod source;
pub mod unpack;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;

use self::source::{Mode, Target};
use self::unpack::Limits;
use crate::fs_beneath::{Beneath, FsError, Links};

/// `client { artifact {} }`: the limits of every download, Nomad's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactConfig {
    /// The whole HTTP exchange (`http_read_timeout`, 30m; zero: none).
    pub http_read_timeout: Duration,
    /// Most bytes downloaded (`http_max_size`, 100GB; zero: none).
    pub http_max_size: u64,
    /// Most bytes unpacked from one archive (`decompression_size_limit`, 100GB; zero: none).
    pub decompression_size_limit: u64,
    /// Most entries of one archive (`decompression_file_count_limit`, 4096; zero: none).
    pub decompression_file_count_limit: u64,
}

impl Default for ArtifactConfig {
    fn default() -> ArtifactConfig {
        ArtifactConfig {
            http_read_timeout: Duration::from_secs(30 * 60),
            http_max_size: 100_000_000_000,
            decompression_size_limit: 100_000_000_000,
            decompression_file_count_limit: 4096,
        }
    }
}

/// One artifact with its `${...}` resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The source URL.
    pub source: String,
    /// Options, appended to the URL's query (`archive`, `checksum`, `filename` are the
    /// getter's own).
    pub options: BTreeMap<String, String>,
    /// Request headers.
    pub headers: BTreeMap<String, String>,
    /// `any`, `file` or `dir`.
    pub mode: Mode,
    /// The alloc dir every path is beneath.
    pub alloc_dir: PathBuf,
    /// The task's name (its dir in the alloc dir; downloads wait in its `tmp/`).
    pub task: String,
    /// The destination, relative to the alloc dir.
    pub destination: PathBuf,
}

/// Fetches one artifact into place. The error is the reason, for the task event.
pub trait ArtifactGetter: Send + Sync {
    /// Fetches `req`.
    fn get<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<(), String>>;
}

/// The http and https getter.
pub struct HttpGetter {
    config: ArtifactConfig,
    http: http::Fetcher,
}

impl HttpGetter {
    /// A getter with the client's limits.
    pub fn new(config: ArtifactConfig) -> HttpGetter {
        HttpGetter { config, http: http::Fetcher::default() }
    }

    fn limits(&self) -> Limits {
        Limits { max_bytes: self.config.decompression_size_limit, max_files: self.config.decompression_file_count_limit }
    }

    async fn fetch(&self, req: &Request) -> Result<(), String> {
        let plan = source::plan(&req.source, &req.options, req.mode, &req.destination)?;
        let root = Beneath::open(&req.alloc_dir).map_err(|e| e.to_string())?;
        let tmp_dir = root.open_dir(&Path::new(&req.task).join("tmp"), Links::Refuse).map_err(|e| e.to_string())?;
        let task_rel = |p: &Path| p.strip_prefix(&req.task).unwrap_or(p).display().to_string();

        if let (None, Target::File(dest), Some(sum)) = (plan.archive, &plan.target, &plan.checksum) {
            // go-getter does not fetch a file that is already there with the right checksum.
            if let Ok(f) = root.read(dest, Links::Refuse) {
                let sum = sum.clone();
                let matches = tokio::task::spawn_blocking(move || sum.matches(std::io::BufReader::new(f)).unwrap_or(false));
                if matches.await.unwrap_or(false) {
                    return Ok(());
                }
            }
        }

        let mut download = TempFile::create(&tmp_dir)?;
        let mut hasher = plan.checksum.as_ref().map(|c| c.hasher());
        let mut out = tokio::fs::File::from_std(download.file.try_clone().map_err(|e| format!("temp file: {e}"))?);
        let limits = http::HttpLimits { timeout: self.config.http_read_timeout, max_bytes: self.config.http_max_size };
        self.http.download(&plan.url, &req.headers, limits, &mut out, hasher.as_mut()).await?;
        drop(out);
        let file_name = plan.url.path().rsplit('/').next().unwrap_or_default().to_string();
        if let (Some(sum), Some(h)) = (&plan.checksum, hasher) {
            let shown = match (&plan.archive, &plan.target) {
                (None, Target::File(dest)) => task_rel(dest),
                _ => file_name.clone(),
            };
            sum.verify(&h.finish(), &shown)?;
        }

        let limits = self.limits();
        let (archive, target) = (plan.archive, plan.target);
        let done = tokio::task::spawn_blocking(move || -> Result<(), String> {
            match (archive, target) {
                (None, Target::File(dest)) => {
                    download
                        .file
                        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
                        .map_err(|e| format!("chmod: {e}"))?;
                    download.move_to(&root, &dest)
                }
                (Some(kind), Target::Dir(dest)) => unpack::unpack_dir(kind, &download.reopen()?, &root, &dest, limits, &file_name),
                (Some(kind), Target::File(dest)) => {
                    let mut single = TempFile::create(&tmp_dir)?;
                    unpack::unpack_single(kind, &download.reopen()?, &mut single.file, limits, &file_name)?;
                    single.move_to(&root, &dest)
                }
                (None, Target::Dir(_)) => Err("a directory needs an archive".into()),
            }
        });
        done.await.map_err(|e| format!("unpacking: {e}"))?
    }
}

impl ArtifactGetter for HttpGetter {
    fn get<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.fetch(req))
    }
}

/// A file in the task's `tmp/` that is removed unless it was moved into place.
struct TempFile {
    dir: Beneath,
    name: PathBuf,
    file: File,
    moved: bool,
}

impl TempFile {
    fn create(dir: &Beneath) -> Result<TempFile, String> {
        let dir = dir.try_clone().map_err(|e| e.to_string())?;
        let name = PathBuf::from(format!(".nomad-rs-artifact-{:016x}", rand::random::<u64>()));
        let file = dir.write(&name, 0o600, Links::Refuse).map_err(|e| e.to_string())?;
        Ok(TempFile { dir, name, file, moved: false })
    }

    /// The file opened again for reading (it was created write-only).
    fn reopen(&self) -> Result<File, String> {
        self.dir.read(&self.name, Links::Refuse).map_err(|e| e.to_string())
    }

    /// Moves the file to `dest` beneath `root` (its parent made if missing). Across file
    /// systems (a destination on another mount) it is copied into the destination's directory
    /// first, so the destination still changes in one rename.
    fn move_to(&mut self, root: &Beneath, dest: &Path) -> Result<(), String> {
        let parent = dest.parent().unwrap_or(Path::new(""));
        unpack::mkdir_p(root, parent).map_err(|e| e.to_string())?;
        match self.dir.rename(&self.name, root, dest) {
            Ok(()) => {
                self.moved = true;
                Ok(())
            }
            Err(FsError::Io { source, .. }) if source.raw_os_error() == Some(libc::EXDEV) => {
                let near = root.open_dir(parent, Links::Refuse).map_err(|e| e.to_string())?;
                let mut copy = TempFile::create(&near)?;
                let mut from = self.reopen()?;
                std::io::copy(&mut from, &mut copy.file).map_err(|e| format!("copying into {}: {e}", parent.display()))?;
                let mode = self.file.metadata().map_err(|e| format!("temp file: {e}"))?.permissions();
                copy.file.set_permissions(mode).map_err(|e| format!("chmod: {e}"))?;
                let name = copy.name.clone();
                copy.dir.rename(&name, root, dest).map_err(|e| e.to_string())?;
                copy.moved = true;
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.moved {
            let _ = self.dir.remove_file(&self.name);
        }
    }
}

#[cfg(test)]
mod tests;
