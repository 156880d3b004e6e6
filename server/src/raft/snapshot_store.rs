//! The current snapshot: one file, `<data_dir>/raft/snapshots/current.snap`.
//!
//! Layout: the magic `NRSNAP01`, then little-endian u64s for the meta length,
//! the data length and an FNV-1a checksum of both parts, then the meta as JSON
//! and the data (the bytes of `Fsm::snapshot`). A new snapshot is written to a
//! temp file, fsynced and renamed over the old one, so after a crash the
//! directory holds either the old snapshot or the new one, never a mix.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use openraft::{BasicNode, LogId, SnapshotMeta};

use super::NodeId;

pub(crate) type Meta = SnapshotMeta<NodeId, BasicNode>;
/// A snapshot as stored: its meta and the FSM's bytes.
pub(crate) type Stored = (Meta, Vec<u8>);

const MAGIC: &[u8; 8] = b"NRSNAP01";
const HEADER_LEN: usize = MAGIC.len() + 3 * 8;
const CURRENT: &str = "current.snap";
const TEMP_SUFFIX: &str = ".tmp";

#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotError {
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("{path} is corrupt: {reason}")]
    Corrupt { path: String, reason: String },
}

/// Owns the snapshot directory.
pub(crate) struct SnapshotStore {
    dir: PathBuf,
    /// Last log id of the snapshot on disk; serializes writers so an older
    /// snapshot finishing late never replaces a newer one.
    saved: tokio::sync::Mutex<Option<LogId<NodeId>>>,
}

impl SnapshotStore {
    /// Opens the directory, drops temp files a crash left behind and loads the current snapshot.
    pub(crate) fn open(dir: PathBuf) -> Result<(SnapshotStore, Option<Stored>), SnapshotError> {
        let io_err = |context: String| move |source| SnapshotError::Io { context, source };
        fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        for entry in fs::read_dir(&dir).map_err(io_err(format!("reading {}", dir.display())))? {
            let path = entry.map_err(io_err(format!("reading {}", dir.display())))?.path();
            if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
                fs::remove_file(&path).map_err(io_err(format!("removing {}", path.display())))?;
            }
        }
        let current = read(&dir.join(CURRENT))?;
        let saved = current.as_ref().and_then(|(meta, _)| meta.last_log_id);
        Ok((SnapshotStore { dir, saved: tokio::sync::Mutex::new(saved) }, current))
    }

    /// Reads the current snapshot.
    pub(crate) async fn load(&self) -> Result<Option<Stored>, SnapshotError> {
        let _writers = self.saved.lock().await;
        let path = self.dir.join(CURRENT);
        blocking(move || read(&path)).await
    }

    /// Makes `meta` + `data` the current snapshot unless a newer one is already saved; hands `data` back.
    pub(crate) async fn save(&self, meta: &Meta, data: Vec<u8>) -> Result<Vec<u8>, SnapshotError> {
        let mut saved = self.saved.lock().await;
        if meta.last_log_id < *saved {
            return Ok(data);
        }
        let dir = self.dir.clone();
        let meta_json = serde_json::to_vec(meta).expect("snapshot meta serializes to json");
        let id = meta.snapshot_id.clone();
        let data = blocking(move || write(&dir, &id, &meta_json, &data).map(|()| data)).await?;
        *saved = meta.last_log_id;
        Ok(data)
    }
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, SnapshotError> + Send + 'static) -> Result<T, SnapshotError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SnapshotError::Io { context: "snapshot file task".to_string(), source: io::Error::other(e.to_string()) })?
}

fn write(dir: &Path, id: &str, meta: &[u8], data: &[u8]) -> Result<(), SnapshotError> {
    let temp = dir.join(format!("{id}{TEMP_SUFFIX}"));
    let current = dir.join(CURRENT);
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(MAGIC)?;
        file.write_all(&(meta.len() as u64).to_le_bytes())?;
        file.write_all(&(data.len() as u64).to_le_bytes())?;
        file.write_all(&checksum(meta, data).to_le_bytes())?;
        file.write_all(meta)?;
        file.write_all(data)?;
        file.sync_all()?;
        fs::rename(&temp, &current)?;
        // The rename is durable only once the directory is.
        File::open(dir)?.sync_all()
    })();
    result.map_err(|source| {
        let _ = fs::remove_file(&temp);
        SnapshotError::Io { context: format!("writing snapshot {}", current.display()), source }
    })
}

fn read(path: &Path) -> Result<Option<Stored>, SnapshotError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SnapshotError::Io { context: format!("reading {}", path.display()), source });
        }
    };
    let corrupt = |reason: &str| SnapshotError::Corrupt { path: path.display().to_string(), reason: reason.to_string() };
    if bytes.len() < HEADER_LEN || &bytes[..MAGIC.len()] != MAGIC {
        return Err(corrupt("not a snapshot file"));
    }
    let field = |n: usize| {
        let start = MAGIC.len() + 8 * n;
        u64::from_le_bytes(bytes[start..start + 8].try_into().expect("8-byte header field"))
    };
    let (meta_len, data_len, sum) = (field(0), field(1), field(2));
    if (bytes.len() - HEADER_LEN) as u64 != meta_len.saturating_add(data_len) {
        return Err(corrupt("length does not match its header"));
    }
    let (meta, data) = bytes[HEADER_LEN..].split_at(meta_len as usize);
    if checksum(meta, data) != sum {
        return Err(corrupt("checksum mismatch"));
    }
    let meta: Meta = serde_json::from_slice(meta).map_err(|e| corrupt(&format!("decoding meta: {e}")))?;
    let mut bytes = bytes;
    let data = bytes.split_off(HEADER_LEN + meta_len as usize);
    Ok(Some((meta, data)))
}

/// FNV-1a: cheap and dependency-free; catches torn or damaged files, not tampering.
fn checksum(meta: &[u8], data: &[u8]) -> u64 {
    meta.iter().chain(data).fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}
