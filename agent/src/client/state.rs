//! The client's local state, in redb at `<state_dir>/client.redb`.
//!
//! What is kept, and why:
//! - the node identity (ID and SecretID), created once, so the node keeps its name in the
//!   cluster across restarts;
//! - the server copy of every alloc the client runs, so a restarted agent rebuilds its alloc
//!   runners before it talks to any server;
//! - per task: its [`TaskState`], the driver's [`TaskHandle`] while the task runs, and the state
//!   of each task hook under the hook's name;
//! - per alloc: the state of each alloc hook under the hook's name;
//! - per alloc: the last result of each Nomad service check whose status changed (the check
//!   store restores them after a restart; `client/checks/`).
//!
//! Values are JSON. Writes that something else acts on (the identity, an alloc, a task handle,
//! a hook marked done) are committed with immediate durability (fsync) before the caller goes
//! on; task-state-only writes (events) are committed lazily and made durable by the next
//! durable commit.
//!
//! **Hook names are part of this format**: renaming a hook makes a restarted agent run it again.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard};

use nomad_proto::{Allocation, TaskState};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::client::driver::TaskHandle;

/// Name of the database file in the state dir.
pub const STATE_FILE: &str = "client.redb";

/// Key to JSON value: the node identity.
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Alloc ID to the JSON server copy of the alloc.
const ALLOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("allocs");
/// (alloc ID, task name) to JSON [`LocalTaskState`].
const TASKS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("tasks");
/// (alloc ID, hook name) to JSON [`HookState`].
const ALLOC_HOOKS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("alloc_hooks");
/// (alloc ID, check ID) to a JSON Nomad check result.
const CHECKS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("check_results");

const IDENTITY: &str = "node_identity";

/// Why the local state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The database could not be opened.
    #[error("open {path}: {source}")]
    Open {
        /// Database file.
        path: String,
        /// Why.
        source: redb::DatabaseError,
    },
    /// A redb operation failed.
    #[error("local state: {0}")]
    Db(String),
    /// A stored value did not decode.
    #[error("decode {what}: {source}")]
    Decode {
        /// What was being read.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
}

macro_rules! db_error {
    ($($t:ty),*) => {$(
        impl From<$t> for StateError {
            fn from(e: $t) -> StateError {
                StateError::Db(e.to_string())
            }
        }
    )*};
}
db_error!(redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError, redb::SetDurabilityError);

/// The node's identity: created once, kept forever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// Node ID.
    pub node_id: String,
    /// The secret the node authenticates with.
    pub secret_id: String,
}

/// What a hook left behind, stored under its name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookState {
    /// The hook finished for good: a restarted agent skips it.
    pub done: bool,
    /// Hook-specific data.
    pub data: BTreeMap<String, String>,
}

/// Everything kept about one task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalTaskState {
    /// The state reported to the servers.
    pub state: TaskState,
    /// The driver's handle while the task runs.
    pub handle: Option<TaskHandle>,
    /// Task hook states by hook name.
    pub hooks: BTreeMap<String, HookState>,
}

/// How hard a write must be on disk before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync'ed before returning: something is about to act on it.
    Durable,
    /// Made durable by the next durable write (task events).
    Lazy,
}

/// The local state database. [`StateDb::close`] releases the file at once, whoever still
/// holds the handle: the next agent on the same state dir can open it even while a stray
/// task of this one has not yet dropped its clone.
pub struct StateDb {
    db: RwLock<Option<Database>>,
}

/// The open database, held open while borrowed.
struct Open<'a>(RwLockReadGuard<'a, Option<Database>>);

impl std::ops::Deref for Open<'_> {
    type Target = Database;
    fn deref(&self) -> &Database {
        self.0.as_ref().expect("checked open when borrowed")
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain serde structs with string keys always serialize.
    serde_json::to_vec(value).expect("local state values serialize to json")
}

fn decode<T: DeserializeOwned>(what: impl FnOnce() -> String, bytes: &[u8]) -> Result<T, StateError> {
    serde_json::from_slice(bytes).map_err(|source| StateError::Decode { what: what(), source })
}

impl StateDb {
    /// Opens (or creates) `<state_dir>/client.redb`.
    pub fn open(state_dir: &Path) -> Result<StateDb, StateError> {
        std::fs::create_dir_all(state_dir).map_err(|e| StateError::Db(format!("create {}: {e}", state_dir.display())))?;
        let path = state_dir.join(STATE_FILE);
        let db = Database::create(&path).map_err(|source| StateError::Open { path: path.display().to_string(), source })?;
        let txn = db.begin_write()?;
        txn.open_table(META)?;
        txn.open_table(ALLOCS)?;
        txn.open_table(TASKS)?;
        txn.open_table(ALLOC_HOOKS)?;
        txn.open_table(CHECKS)?;
        txn.commit()?;
        Ok(StateDb { db: RwLock::new(Some(db)) })
    }

    /// Closes the database once the reads and writes in flight finished; every later one
    /// fails with "the local state is closed".
    pub fn close(&self) {
        let db = self.db.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(db);
    }

    fn open_db(&self) -> Result<Open<'_>, StateError> {
        let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            return Err(StateError::Db("the local state is closed".into()));
        }
        Ok(Open(guard))
    }

    fn write(&self, durability: Durability, f: impl FnOnce(&redb::WriteTransaction) -> Result<(), StateError>) -> Result<(), StateError> {
        let db = self.open_db()?;
        let mut txn = db.begin_write()?;
        if durability == Durability::Lazy {
            txn.set_durability(redb::Durability::None)?;
        }
        f(&txn)?;
        txn.commit()?;
        Ok(())
    }

    /// The stored node identity, if one was created.
    pub fn identity(&self) -> Result<Option<NodeIdentity>, StateError> {
        let db = self.open_db()?;
        let txn = db.begin_read()?;
        let meta = txn.open_table(META)?;
        let value = meta.get(IDENTITY)?;
        value.map(|v| decode(|| "node identity".into(), v.value())).transpose()
    }

    /// Stores the node identity (durably).
    pub fn put_identity(&self, identity: &NodeIdentity) -> Result<(), StateError> {
        let bytes = encode(identity);
        self.write(Durability::Durable, |txn| {
            txn.open_table(META)?.insert(IDENTITY, bytes.as_slice())?;
            Ok(())
        })
    }

    /// Stores the server copy of an alloc (durably).
    pub fn put_alloc(&self, alloc: &Allocation) -> Result<(), StateError> {
        let bytes = encode(alloc);
        self.write(Durability::Durable, |txn| {
            txn.open_table(ALLOCS)?.insert(alloc.id.as_str(), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Every stored alloc. One that does not decode is skipped with a warning: the servers
    /// still have it, and the agent must not refuse to start over it.
    pub fn allocs(&self) -> Result<Vec<Allocation>, StateError> {
        let db = self.open_db()?;
        let txn = db.begin_read()?;
        let table = txn.open_table(ALLOCS)?;
        let mut out = Vec::new();
        for item in table.iter()? {
            let (key, value) = item?;
            match decode::<Allocation>(|| format!("alloc {}", key.value()), value.value()) {
                Ok(a) => out.push(a),
                Err(e) => tracing::warn!(error = %e, "skipping an unreadable alloc in the local state"),
            }
        }
        Ok(out)
    }

    /// Removes an alloc with its tasks and hook states (durably).
    pub fn delete_alloc(&self, alloc_id: &str) -> Result<(), StateError> {
        self.write(Durability::Durable, |txn| {
            txn.open_table(ALLOCS)?.remove(alloc_id)?;
            let range = (alloc_id, "")..=(alloc_id, "\u{10FFFF}");
            txn.open_table(TASKS)?.retain_in(range.clone(), |_, _| false)?;
            txn.open_table(ALLOC_HOOKS)?.retain_in(range.clone(), |_, _| false)?;
            txn.open_table(CHECKS)?.retain_in(range, |_, _| false)?;
            Ok(())
        })
    }

    /// Stores one task's state.
    pub fn put_task(&self, alloc_id: &str, task: &str, state: &LocalTaskState, durability: Durability) -> Result<(), StateError> {
        let bytes = encode(state);
        self.write(durability, |txn| {
            txn.open_table(TASKS)?.insert((alloc_id, task), bytes.as_slice())?;
            Ok(())
        })
    }

    /// The stored tasks of an alloc, by name.
    pub fn tasks(&self, alloc_id: &str) -> Result<BTreeMap<String, LocalTaskState>, StateError> {
        let db = self.open_db()?;
        let txn = db.begin_read()?;
        let table = txn.open_table(TASKS)?;
        let mut out = BTreeMap::new();
        for item in table.range((alloc_id, "")..=(alloc_id, "\u{10FFFF}"))? {
            let (key, value) = item?;
            let (_, task) = key.value();
            out.insert(task.to_string(), decode(|| format!("task {alloc_id}/{task}"), value.value())?);
        }
        Ok(out)
    }

    /// Stores an alloc hook's state (durably: hooks act on it after a restart).
    pub fn put_alloc_hook(&self, alloc_id: &str, hook: &str, state: &HookState) -> Result<(), StateError> {
        let bytes = encode(state);
        self.write(Durability::Durable, |txn| {
            txn.open_table(ALLOC_HOOKS)?.insert((alloc_id, hook), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Stores one check result (durably: written only when a status changes, and a restarted
    /// agent reports it until the check runs again).
    pub fn put_check_result<T: Serialize>(&self, alloc_id: &str, check_id: &str, result: &T) -> Result<(), StateError> {
        let bytes = encode(result);
        self.write(Durability::Durable, |txn| {
            txn.open_table(CHECKS)?.insert((alloc_id, check_id), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Removes some of an alloc's check results, or all of them (`None`).
    pub fn delete_check_results(&self, alloc_id: &str, check_ids: Option<&[String]>) -> Result<(), StateError> {
        self.write(Durability::Lazy, |txn| {
            let mut table = txn.open_table(CHECKS)?;
            match check_ids {
                Some(ids) => {
                    for id in ids {
                        table.remove((alloc_id, id.as_str()))?;
                    }
                }
                None => {
                    table.retain_in((alloc_id, "")..=(alloc_id, "\u{10FFFF}"), |_, _| false)?;
                }
            }
            Ok(())
        })
    }

    /// Every stored check result: alloc ID to check ID to result. One that does not decode is
    /// skipped with a warning (the check runs again and replaces it).
    pub fn check_results<T: DeserializeOwned>(&self) -> Result<BTreeMap<String, BTreeMap<String, T>>, StateError> {
        let db = self.open_db()?;
        let txn = db.begin_read()?;
        let table = txn.open_table(CHECKS)?;
        let mut out: BTreeMap<String, BTreeMap<String, T>> = BTreeMap::new();
        for item in table.iter()? {
            let (key, value) = item?;
            let (alloc, check) = key.value();
            match decode::<T>(|| format!("check result {alloc}/{check}"), value.value()) {
                Ok(r) => {
                    out.entry(alloc.to_string()).or_default().insert(check.to_string(), r);
                }
                Err(e) => tracing::warn!(error = %e, "skipping an unreadable check result in the local state"),
            }
        }
        Ok(out)
    }

    /// The stored alloc hook states of an alloc, by hook name.
    pub fn alloc_hooks(&self, alloc_id: &str) -> Result<BTreeMap<String, HookState>, StateError> {
        let db = self.open_db()?;
        let txn = db.begin_read()?;
        let table = txn.open_table(ALLOC_HOOKS)?;
        let mut out = BTreeMap::new();
        for item in table.range((alloc_id, "")..=(alloc_id, "\u{10FFFF}"))? {
            let (key, value) = item?;
            let (_, hook) = key.value();
            out.insert(hook.to_string(), decode(|| format!("alloc hook {alloc_id}/{hook}"), value.value())?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_survives_a_reopen_and_deleting_an_alloc_removes_its_tasks_and_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let id = NodeIdentity { node_id: "n".into(), secret_id: "s".into() };
        {
            let db = StateDb::open(dir.path()).unwrap();
            assert_eq!(db.identity().unwrap(), None);
            db.put_identity(&id).unwrap();
            for alloc in ["a1", "a2"] {
                db.put_alloc(&Allocation { id: alloc.into(), ..Allocation::default() }).unwrap();
                let mut t = LocalTaskState::default();
                t.state.restarts = 3;
                t.hooks.insert("task_dir".into(), HookState { done: true, data: BTreeMap::new() });
                db.put_task(alloc, "web", &t, Durability::Lazy).unwrap();
                db.put_task(alloc, "side", &t, Durability::Durable).unwrap();
                db.put_alloc_hook(alloc, "alloc_dir", &HookState { done: true, ..HookState::default() }).unwrap();
            }
        }
        let db = StateDb::open(dir.path()).unwrap();
        assert_eq!(db.identity().unwrap(), Some(id));
        assert_eq!(db.allocs().unwrap().len(), 2);
        let tasks = db.tasks("a1").unwrap();
        assert_eq!(tasks.keys().collect::<Vec<_>>(), ["side", "web"]);
        assert_eq!(tasks["web"].state.restarts, 3);
        assert!(tasks["web"].hooks["task_dir"].done);
        assert!(db.alloc_hooks("a1").unwrap()["alloc_dir"].done);

        db.delete_alloc("a1").unwrap();
        assert_eq!(db.allocs().unwrap().iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["a2"]);
        assert!(db.tasks("a1").unwrap().is_empty());
        assert!(db.alloc_hooks("a1").unwrap().is_empty());
        assert_eq!(db.tasks("a2").unwrap().len(), 2, "other allocs are untouched");
    }

    #[test]
    fn a_closed_state_releases_the_file_while_a_clone_is_still_held() {
        let dir = tempfile::tempdir().unwrap();
        let db = std::sync::Arc::new(StateDb::open(dir.path()).unwrap());
        let straggler = db.clone();
        assert!(matches!(StateDb::open(dir.path()), Err(StateError::Open { .. })), "redb refuses a second opener");
        db.close();
        let err = straggler.identity().unwrap_err().to_string();
        assert!(err.contains("the local state is closed"), "{err}");
        StateDb::open(dir.path()).expect("the next agent opens the file");
    }
}
