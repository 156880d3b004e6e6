//! The Raft log, the vote and the log pointers, in redb at `<data_dir>/raft/raft.redb`.
//!
//! Every write goes through one writer thread, in the order openraft asked for it, and is
//! committed with immediate durability (fsync) before openraft hears it is done, so a crash
//! loses nothing that was acknowledged. Appends waiting in the writer's queue are committed
//! together in one transaction (group commit): under load many entries share one fsync instead
//! of queueing for one each. Entries stay in memory ([`Unapplied`]) from `append` until they are
//! both on disk and applied: readable at once, as openraft requires of `append`, and handed to
//! the state machine without decoding them again. Entries and pointers are stored as JSON.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

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
    /// A failure a test injected in place of the disk's.
    #[error("{0}")]
    Injected(std::io::Error),
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
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    unapplied: Arc<Unapplied>,
    fault: Arc<StorageFault>,
    writes: Mutex<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// Entries appended and not yet both on disk and applied, by index. Removed as a contiguous
/// prefix (both happen in index order), so what remains is the tail of the log.
#[derive(Default)]
pub(crate) struct Unapplied {
    entries: Mutex<BTreeMap<u64, Held>>,
}

struct Held {
    entry: Entry<TypeConfig>,
    flushed: bool,
    applied: bool,
}

impl Unapplied {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Held>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn append(&self, entries: &[Entry<TypeConfig>]) {
        let held = entries.iter().map(|e| (e.log_id.index, Held { entry: e.clone(), flushed: false, applied: false }));
        self.lock().extend(held);
    }

    /// The writer committed these entries.
    fn flushed<'a>(&self, entries: impl Iterator<Item = &'a Entry<TypeConfig>>) {
        let mut held = self.lock();
        for e in entries {
            // A truncation may have replaced it in the meantime; only this entry is on disk.
            let Some(h) = held.get_mut(&e.log_id.index).filter(|h| h.entry.log_id == e.log_id) else { continue };
            h.flushed = true;
            if h.applied {
                held.remove(&e.log_id.index);
            }
        }
    }

    /// The state machine is applying the entry: once on disk, memory lets go of it, so the
    /// state machine holds the only reference to its command and can take it apart.
    pub(crate) fn applying(&self, log_id: &LogId<NodeId>) {
        let mut held = self.lock();
        let Some(h) = held.get_mut(&log_id.index).filter(|h| h.entry.log_id == *log_id) else { return };
        h.applied = true;
        if h.flushed {
            held.remove(&log_id.index);
        }
    }

    fn range(&self, bounds: (Bound<u64>, Bound<u64>)) -> Vec<Entry<TypeConfig>> {
        self.lock().range(bounds).map(|(_, h)| h.entry.clone()).collect()
    }

    fn last(&self) -> Option<LogId<NodeId>> {
        self.lock().last_key_value().map(|(_, h)| h.entry.log_id)
    }

    fn retain(&self, keep: impl Fn(u64) -> bool) {
        self.lock().retain(|index, _| keep(*index));
    }
}

/// Makes every later write fail as a full disk would (tests only set it): lets tests drive the
/// path a real ENOSPC takes, from the writer thread up to openraft's fatal error.
#[derive(Default)]
pub(crate) struct StorageFault {
    failing: AtomicBool,
}

impl StorageFault {
    #[cfg(test)]
    pub(crate) fn fail_writes(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }

    fn check(&self) -> StoreResult<()> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(StoreError::Injected(std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device (injected)")));
        }
        Ok(())
    }
}

impl Drop for Inner {
    /// Lets the writer finish what it was given, so the database is closed when the store is.
    fn drop(&mut self) {
        drop(self.writes.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = writer.join();
        }
    }
}

/// A write other than an append, run on the writer thread.
type Work = Box<dyn FnOnce(&Database) -> StoreResult<()> + Send>;

/// A write for the writer thread.
enum Job {
    Append { entries: Vec<Entry<TypeConfig>>, callback: LogFlushed<TypeConfig> },
    Other { work: Work, done: tokio::sync::oneshot::Sender<StoreResult<()>> },
}

impl LogStore {
    /// Opens (or creates) the store and checks that what it holds reads and decodes. A corrupt
    /// file (a zeroed or torn tail, pages overwritten) is refused with an error naming it and
    /// what to do, also when redb panics on it.
    pub(crate) fn open(path: &Path) -> Result<LogStore, RaftError> {
        let fail = |e: &dyn std::fmt::Display| RaftError::Storage(format!("{}: {e}", path.display()));
        let corrupt = |e: &dyn std::fmt::Display| {
            RaftError::Storage(format!(
                "{} is corrupt ({e}). Move the file aside (keep it for inspection) and restart: in a cluster \
                 this server gets the log again from the leader; a single server comes back from its last \
                 snapshot and loses the writes after it",
                path.display()
            ))
        };
        // redb trusts the pages of a cleanly closed file and may panic on damaged ones: every
        // read of the file at open time happens inside this boundary.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open_checked(path)));
        let db = match opened {
            Ok(Ok(db)) => Arc::new(db),
            Ok(Err(e)) if e.is_corruption() => return Err(corrupt(&e)),
            Ok(Err(e)) => return Err(fail(&e)),
            Err(panic) => return Err(corrupt(&format!("reading it panicked: {}", panic_message(&*panic)))),
        };
        let unapplied = Arc::new(Unapplied::default());
        let fault = Arc::new(StorageFault::default());
        let (writes, jobs) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn({
                let (db, unapplied, fault) = (db.clone(), unapplied.clone(), fault.clone());
                move || run_writer(&db, &jobs, &unapplied, &fault)
            })
            .map_err(|e| fail(&e))?;
        let inner = Inner { db, unapplied, fault, writes: Mutex::new(Some(writes)), writer: Mutex::new(Some(writer)) };
        Ok(LogStore { inner: Arc::new(inner) })
    }

    /// The switch tests use to make this store's writes fail.
    pub(crate) fn fault(&self) -> Arc<StorageFault> {
        self.inner.fault.clone()
    }

    /// The entries in memory, for the state machine to say what it applies.
    pub(crate) fn unapplied(&self) -> Arc<Unapplied> {
        self.inner.unapplied.clone()
    }

    fn send(&self, job: Job) -> StoreResult<()> {
        let writes = self.inner.writes.lock().unwrap_or_else(|e| e.into_inner());
        let sent = writes.as_ref().map(|w| w.send(job));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(StoreError::Task("the log writer has stopped".into())),
        }
    }

    /// Runs a write on the writer thread, after every write sent before it.
    async fn write(&self, work: impl FnOnce(&Database) -> StoreResult<()> + Send + 'static) -> StoreResult<()> {
        let (done, result) = tokio::sync::oneshot::channel();
        self.send(Job::Other { work: Box::new(work), done })?;
        result.await.map_err(|_| StoreError::Task("the log writer has stopped".into()))?
    }

    /// Runs blocking redb reads off the async runtime.
    async fn blocking<T: Send + 'static>(&self, work: impl FnOnce(&Database) -> StoreResult<T> + Send + 'static) -> StoreResult<T> {
        let db = self.inner.db.clone();
        tokio::task::spawn_blocking(move || work(&db)).await.map_err(|e| StoreError::Task(e.to_string()))?
    }

    async fn write_meta<T: Serialize>(&self, key: &'static str, value: &T) -> StoreResult<()> {
        let bytes = encode(value);
        self.write(move |db| {
            let txn = db.begin_write()?;
            txn.open_table(META)?.insert(key, bytes.as_slice())?;
            txn.commit()?;
            Ok(())
        })
        .await
    }
}

impl StoreError {
    /// Whether the file's content is damaged (rather than, say, unreadable for permissions).
    fn is_corruption(&self) -> bool {
        let storage = match self {
            StoreError::Storage(e) => Some(e),
            StoreError::Database(redb::DatabaseError::Storage(e)) => Some(e),
            StoreError::Transaction(redb::TransactionError::Storage(e)) => Some(e),
            StoreError::Table(redb::TableError::Storage(e)) => Some(e),
            StoreError::Commit(redb::CommitError::Storage(e)) => Some(e),
            StoreError::Decode { .. } => return true,
            _ => None,
        };
        match storage {
            Some(redb::StorageError::Corrupted(_)) => true,
            // What redb reports for a file that does not hold a database (a zeroed header).
            Some(redb::StorageError::Io(e)) => e.kind() == std::io::ErrorKind::InvalidData,
            _ => false,
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "no message".to_string(),
    }
}

/// Opens the file, creates the tables, and checks the content (see [`check`]).
fn open_checked(path: &Path) -> StoreResult<Database> {
    let db = Database::create(path)?;
    let txn = db.begin_write()?;
    txn.open_table(LOGS)?;
    txn.open_table(META)?;
    txn.commit()?;
    check(&db)?;
    Ok(db)
}

/// Decodes the pointers and the first and last entries, and reads every entry's page, so a
/// corrupt store fails at start rather than when Raft first reads the damaged part.
fn check(db: &Database) -> StoreResult<()> {
    read_meta::<Vote<NodeId>>(db, VOTE)?;
    read_meta::<Option<LogId<NodeId>>>(db, COMMITTED)?;
    read_meta::<LogId<NodeId>>(db, LAST_PURGED)?;
    let txn = db.begin_read()?;
    let logs = txn.open_table(LOGS)?;
    for (index, bytes) in [logs.first()?, logs.last()?].into_iter().flatten() {
        decode::<Entry<TypeConfig>>(|| format!("log entry {}", index.value()), bytes.value())?;
    }
    // The log is bounded by snapshots (`snapshot_logs` plus what is kept behind one), so one
    // pass over it is cheap next to replaying it.
    for item in logs.iter()? {
        let (_, bytes) = item?;
        std::hint::black_box(bytes.value().len());
    }
    Ok(())
}

/// The writer thread: runs writes in the order they were sent; appends that are queued
/// together are committed in one transaction, then acknowledged in order.
fn run_writer(db: &Database, jobs: &mpsc::Receiver<Job>, unapplied: &Unapplied, fault: &StorageFault) {
    let mut next = None;
    loop {
        let job = match next.take() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let (entries, callback) = match job {
            Job::Other { work, done } => {
                let _ = done.send(fault.check().and_then(|()| work(db)));
                continue;
            }
            Job::Append { entries, callback } => (entries, callback),
        };
        let mut batch = vec![(entries, callback)];
        while let Ok(job) = jobs.try_recv() {
            match job {
                Job::Append { entries, callback } => batch.push((entries, callback)),
                other => {
                    next = Some(other);
                    break;
                }
            }
        }
        let result = fault.check().and_then(|()| commit_appends(db, batch.iter().flat_map(|(entries, _)| entries)));
        if result.is_ok() {
            unapplied.flushed(batch.iter().flat_map(|(entries, _)| entries));
        }
        // Let go of the entries before openraft hears they are durable and applies them: the
        // state machine should hold the only reference to each command.
        let callbacks: Vec<LogFlushed<TypeConfig>> = batch.into_iter().map(|(_, callback)| callback).collect();
        for callback in callbacks {
            callback.log_io_completed(result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string())));
        }
    }
}

fn commit_appends<'a>(db: &Database, entries: impl Iterator<Item = &'a Entry<TypeConfig>>) -> StoreResult<()> {
    let txn = db.begin_write()?;
    {
        let mut logs = txn.open_table(LOGS)?;
        for e in entries {
            logs.insert(e.log_id.index, encode(e).as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
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
        // Entries not committed yet come from memory; the rest, below the first of them, from disk.
        let in_memory = self.inner.unapplied.range(bounds);
        let disk_end = match in_memory.first() {
            Some(first) => Bound::Excluded(first.log_id.index),
            None => bounds.1,
        };
        let mut entries = self
            .blocking(move |db| {
                let txn = db.begin_read()?;
                let logs = txn.open_table(LOGS)?;
                let mut entries = Vec::new();
                for item in logs.range::<u64>((bounds.0, disk_end))? {
                    let (index, bytes) = item?;
                    entries.push(decode(|| format!("log entry {}", index.value()), bytes.value())?);
                }
                Ok(entries)
            })
            .await
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        entries.extend(in_memory);
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_pending = self.inner.unapplied.last();
        self.blocking(move |db| {
            let last_purged_log_id = read_meta::<LogId<NodeId>>(db, LAST_PURGED)?;
            let txn = db.begin_read()?;
            let last_entry = match txn.open_table(LOGS)?.last()? {
                Some((index, bytes)) => Some(decode::<Entry<TypeConfig>>(|| format!("log entry {}", index.value()), bytes.value())?),
                None => None,
            };
            let last_log_id = last_pending.or(last_entry.map(|e| e.log_id)).or(last_purged_log_id);
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
        // Readable at once (from memory), durable when the writer calls back. Encoding happens
        // on the writer thread, off openraft's core loop.
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        self.inner.unapplied.append(&entries);
        self.send(Job::Append { entries, callback }).map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.inner.unapplied.retain(|index| index < log_id.index);
        self.write(move |db| {
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
        self.inner.unapplied.retain(|index| index > log_id.index);
        // The pointer moves in the same transaction as the deletion, so the log state stays consistent.
        self.write(move |db| {
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
