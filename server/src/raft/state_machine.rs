//! The adapter between openraft and the [`Fsm`]: applies committed entries,
//! tracks what is applied, and builds, installs and serves snapshots.
//!
//! The FSM itself lives in memory; durability comes from the snapshot on disk
//! plus the log: at start the latest snapshot is restored and openraft
//! re-applies the committed entries after it.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use super::log_store::Unapplied;
use super::snapshot_store::{Meta, SnapshotError, SnapshotStore};
use super::{NodeId, RaftError, TypeConfig};
use crate::fsm::{ApplyResult, Fsm};

/// How far the FSM has got. Guarded together with the FSM calls so a snapshot
/// and its meta always describe the same point in the log.
#[derive(Default)]
struct Applied {
    last_log_id: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
}

pub(crate) struct StateMachine {
    fsm: Arc<dyn Fsm>,
    /// The log's entries in memory: told which entry is being applied, so it lets go of it.
    unapplied: Arc<Unapplied>,
    applied: Arc<Mutex<Applied>>,
    snapshots: Arc<SnapshotStore>,
}

fn snapshot_storage_error(meta: Option<&Meta>, e: impl std::fmt::Display) -> StorageError<NodeId> {
    let subject = ErrorSubject::Snapshot(meta.map(|m| m.signature()));
    StorageIOError::new(subject, ErrorVerb::Write, AnyError::error(e)).into()
}

impl StateMachine {
    /// Opens the snapshot directory and restores the FSM from the latest snapshot, if any.
    pub(crate) fn open(dir: PathBuf, fsm: Arc<dyn Fsm>, unapplied: Arc<Unapplied>) -> Result<StateMachine, RaftError> {
        let (snapshots, current) = SnapshotStore::open(dir).map_err(|e| RaftError::Snapshot(e.to_string()))?;
        let mut applied = Applied::default();
        if let Some((meta, data)) = current {
            fsm.restore(&data).map_err(|e| RaftError::Snapshot(format!("restoring {}: {e}", meta.snapshot_id)))?;
            tracing::info!(snapshot = %meta, "restored fsm from snapshot");
            applied = Applied { last_log_id: meta.last_log_id, membership: meta.last_membership };
        }
        Ok(StateMachine { fsm, unapplied, applied: Arc::new(Mutex::new(applied)), snapshots: Arc::new(snapshots) })
    }
}

fn lock(applied: &Mutex<Applied>) -> MutexGuard<'_, Applied> {
    // A panic inside Fsm::apply poisons the lock; the state is still the best we have.
    applied.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>> {
        let applied = lock(&self.applied);
        Ok((applied.last_log_id, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = lock(&self.applied);
        let mut results = Vec::new();
        for entry in entries {
            applied.last_log_id = Some(entry.log_id);
            self.unapplied.applying(&entry.log_id);
            results.push(match entry.payload {
                EntryPayload::Blank => ApplyResult::ok(),
                EntryPayload::Normal(cmd) => self.fsm.apply(entry.log_id.index, Arc::unwrap_or_clone(cmd)),
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    ApplyResult::ok()
                }
            });
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { fsm: self.fsm.clone(), applied: self.applied.clone(), snapshots: self.snapshots.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<Cursor<Vec<u8>>>) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        {
            let mut applied = lock(&self.applied);
            self.fsm.restore(&data).map_err(|e| snapshot_storage_error(Some(meta), format!("restoring fsm: {e}")))?;
            *applied = Applied { last_log_id: meta.last_log_id, membership: meta.last_membership.clone() };
        }
        tracing::info!(snapshot = %meta, "installed snapshot from leader");
        self.snapshots.save(meta, data).await.map_err(|e| snapshot_storage_error(Some(meta), e))?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let current = self
            .snapshots
            .load()
            .await
            .map_err(|e: SnapshotError| StorageIOError::new(ErrorSubject::Snapshot(None), ErrorVerb::Read, AnyError::new(&e)))?;
        Ok(current.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}

/// Builds a snapshot in a task of its own while the state machine goes on applying.
pub(crate) struct SnapshotBuilder {
    fsm: Arc<dyn Fsm>,
    applied: Arc<Mutex<Applied>>,
    snapshots: Arc<SnapshotStore>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        // Serialize under the apply lock so the bytes match `last_log_id` exactly; write the file outside it.
        let (meta, data) = {
            let applied = lock(&self.applied);
            let data = self.fsm.snapshot().map_err(|e| snapshot_storage_error(None, format!("fsm snapshot: {e}")))?;
            let index = applied.last_log_id.map_or(0, |id| id.index);
            let meta = SnapshotMeta {
                last_log_id: applied.last_log_id,
                last_membership: applied.membership.clone(),
                snapshot_id: format!("{index}-{}", uuid::Uuid::new_v4().simple()),
            };
            (meta, data)
        };
        let data = self.snapshots.save(&meta, data).await.map_err(|e| snapshot_storage_error(Some(&meta), e))?;
        tracing::info!(snapshot = %meta, bytes = data.len(), "built snapshot");
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}
