//! Operator snapshots: the state saved as an archive ([`crate::snapshot`]), and an archive
//! restored through Raft (`Command::SnapshotRestore`), so every server ends with the same state.

use super::{EndpointError, Endpoints};
use crate::fsm::{Command, StateImage};
use crate::snapshot::{SnapshotMeta, read_archive, write_archive};
use crate::state::State;

/// A saved snapshot.
#[derive(Debug)]
pub struct SavedSnapshot {
    /// The archive's bytes.
    pub archive: Vec<u8>,
    /// What `meta.json` says.
    pub meta: SnapshotMeta,
}

impl Endpoints {
    /// Saves the state as it is now. The state is taken in O(1); encoding and compressing it run
    /// on the blocking pool, so writes go on meanwhile.
    pub async fn save_snapshot(&self) -> Result<SavedSnapshot, EndpointError> {
        let state = self.store().snapshot();
        let term = self.consensus().raft_term();
        let now = (self.clock)();
        tokio::task::spawn_blocking(move || {
            let bytes = state.to_bytes().map_err(EndpointError::Internal)?;
            let meta = SnapshotMeta::new(state.index, term, now.unix_nanos() / 1_000_000, bytes.len() as u64);
            let archive = write_archive(&meta, &bytes).map_err(|e| EndpointError::Internal(e.to_string()))?;
            Ok(SavedSnapshot { archive, meta })
        })
        .await
        .map_err(|e| EndpointError::Internal(format!("snapshot task: {e}")))?
    }

    /// Restores an archive: verified (sums, limits) and decoded here first, so a bad one is
    /// refused before anything is written; then applied through Raft. Returns the index of the
    /// restore, which the restored state carries.
    pub async fn restore_snapshot(&self, archive: bytes::Bytes) -> Result<u64, EndpointError> {
        let bad = |e: String| EndpointError::BadRequest(format!("failed to restore from snapshot: {e}"));
        let image = tokio::task::spawn_blocking(move || {
            let read = read_archive(&archive).map_err(|e| bad(e.to_string()))?;
            State::from_bytes(&read.state).map_err(bad)?;
            String::from_utf8(read.state).map_err(|_| bad("state.bin is not UTF-8 JSON".into()))
        })
        .await
        .map_err(|e| EndpointError::Internal(format!("snapshot task: {e}")))??;
        let index = self.consensus().apply(Command::SnapshotRestore { state: StateImage(image) }).await?;
        tracing::info!(index, "restored the state from an operator snapshot");
        Ok(index)
    }
}
