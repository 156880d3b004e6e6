//! The Raft log, the vote and the log pointers, in redb at `<data_dir>/raft/raft.redb`.
//!
//! Every write is one redb transaction committed with immediate durability
//! (fsync) before openraft hears it is done, so a crash loses nothing that was
//! acknowledged. Entries and pointers are stored as JSON.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, LogId, LogState, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{NodeId, RaftError, TypeConfig};

/// Log index to JSON entry.
const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
/// Pointer name to JSON value.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

/// Failures inside the store, turned into openraft's `StorageError` at the trait boundary.
#[derive(Debug, thiserror::Error)]
enum StoreError {
    #[error(transparent)]
    Database(#[from] redb::DatabaseError),
    #[error(transparent)]
    Transaction(#[from] redb::TransactionError),
    #[error(transparent)]
    Table(#[from] redb::TableError),
    #[error(transparent)]
    Storage(#[from] redb::StorageError),
    #[error(transparent)]
    Commit(#[from] redb::CommitError),
    #[error("decoding {what}: {source}")]
    Decode { what: String, source: serde_json::Error },
    #[error("storage task failed: {0}")]
    Task(String),
}

type StoreResult<T> = Result<T, StoreError>;

fn decode<T: DeserializeOwned>(what: impl FnOnce() -> String, bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Decode { what: what(), source })
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing openraft's and our own plain serde types to a Vec cannot fail.
    serde_json::to_vec(value).expect("raft log values serialize to json")
}

fn storage_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: StoreError) -> StorageError<NodeId> {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

/// The log store; clones share the database and serve as openraft's log readers.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// Opens (or creates) the store and checks that what it holds decodes.
    pub(crate) fn open(path: &Path) -> Result<LogStore, RaftError> {
        let fail = |e: &dyn std::fmt::Display| RaftError::Storage(format!("{}: {e}", path.display()));
        let db = Database::create(path).map_err(|e| fail(&e))?;
        let create_tables = || -> StoreResult<()> {
            let txn = db.begin_write()?;
            txn.open_table(LOGS)?;
            txn.open_table(META)?;
            txn.commit()?;
            Ok(())
        };
        create_tables().map_err(|e| fail(&e))?;
        let store = LogStore { db: Arc::new(db) };
        store.check().map_err(|e| fail(&e))?;
        Ok(store)
    }

    /// Decodes the pointers and the first and last entries, so a corrupt store fails at start.
    fn check(&self) -> StoreResult<()> {
        read_meta::<Vote<NodeId>>(&self.db, VOTE)?;
        read_meta::<Option<LogId<NodeId>>>(&self.db, COMMITTED)?;
        read_meta::<LogId<NodeId>>(&self.db, LAST_PURGED)?;
        let txn = self.db.begin_read()?;
        let logs = txn.open_table(LOGS)?;
        for (index, bytes) in [logs.first()?, logs.last()?].into_iter().flatten() {
            decode::<Entry<TypeConfig>>(|| format!("log entry {}", index.value()), bytes.value())?;
        }
        Ok(())
    }

    /// Runs blocking redb work off the async runtime.
    async fn blocking<T: Send + 'static>(&self, work: impl FnOnce(&Database) -> StoreResult<T> + Send + 'static) -> StoreResult<T> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || work(&db)).await.map_err(|e| StoreError::Task(e.to_string()))?
    }

    async fn write_meta<T: Serialize>(&self, key: &'static str, value: &T) -> StoreResult<()> {
        let bytes = encode(value);
        self.blocking(move |db| {
            let txn = db.begin_write()?;
            txn.open_table(META)?.insert(key, bytes.as_slice())?;
            txn.commit()?;
            Ok(())
        })
        .await
    }
}

fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> StoreResult<Option<T>> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    match meta.get(key)? {
        Some(bytes) => decode(|| key.to_string(), bytes.value()).map(Some),
        None => Ok(None),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let bounds: (Bound<u64>, Bound<u64>) = (range.start_bound().cloned(), range.end_bound().cloned());
        self.blocking(move |db| {
            let txn = db.begin_read()?;
            let logs = txn.open_table(LOGS)?;
            let mut entries = Vec::new();
            for item in logs.range::<u64>(bounds)? {
                let (index, bytes) = item?;
                entries.push(decode(|| format!("log entry {}", index.value()), bytes.value())?);
            }
            Ok(entries)
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Read, e))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        self.blocking(|db| {
            let last_purged_log_id = read_meta::<LogId<NodeId>>(db, LAST_PURGED)?;
            let txn = db.begin_read()?;
            let last_entry = match txn.open_table(LOGS)?.last()? {
                Some((index, bytes)) => Some(decode::<Entry<TypeConfig>>(|| format!("log entry {}", index.value()), bytes.value())?),
                None => None,
            };
            let last_log_id = last_entry.map(|e| e.log_id).or(last_purged_log_id);
            Ok(LogState { last_purged_log_id, last_log_id })
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Read, e))
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.write_meta(VOTE, vote).await.map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.blocking(|db| read_meta(db, VOTE)).await.map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    /// Persisting the committed pointer lets a restarted server re-apply
    /// committed entries at start, before it hears from a leader.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError<NodeId>> {
        self.write_meta(COMMITTED, &committed).await.map_err(|e| storage_error(ErrorSubject::Store, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        self.blocking(|db| Ok(read_meta::<Option<LogId<NodeId>>>(db, COMMITTED)?.flatten()))
            .await
            .map_err(|e| storage_error(ErrorSubject::Store, ErrorVerb::Read, e))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let encoded: Vec<(u64, Vec<u8>)> = entries.into_iter().map(|e| (e.log_id.index, encode(&e))).collect();
        // The transaction is committed (fsynced) before the callback fires and before this returns,
        // which also keeps appends ordered with every other write.
        let result = self
            .blocking(move |db| {
                let txn = db.begin_write()?;
                {
                    let mut logs = txn.open_table(LOGS)?;
                    for (index, bytes) in &encoded {
                        logs.insert(*index, bytes.as_slice())?;
                    }
                }
                txn.commit()?;
                Ok(())
            })
            .await;
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.blocking(move |db| {
            let txn = db.begin_write()?;
            txn.open_table(LOGS)?.retain_in(log_id.index.., |_, _| false)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let pointer = encode(&log_id);
        // The pointer moves in the same transaction as the deletion, so the log state stays consistent.
        self.blocking(move |db| {
            let txn = db.begin_write()?;
            txn.open_table(META)?.insert(LAST_PURGED, pointer.as_slice())?;
            txn.open_table(LOGS)?.retain_in(..=log_id.index, |_, _| false)?;
            txn.commit()?;
            Ok(())
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}
