//! The plugin's state under `--statedir`:
//! - `volumes/<id>/`: one directory per volume, its data;
//! - `state.json`: what the controller knows: each volume's name, capacity and parameters, and
//!   which node each volume is published to (ControllerPublishVolume), so tests can read it;
//! - `state.lock`: taken around every read-modify-write of `state.json`, so plugins sharing a
//!   state dir (a controller and node plugins on one machine) never lose an update.
//!
//! Node calls never read `state.json`: a volume exists for them when its directory does, so a
//! node plugin works beside a controller in another process.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The most volumes one state dir holds.
pub const MAX_VOLUMES: usize = 4096;
/// `state.json` is refused past this size (it holds at most MAX_VOLUMES small records).
const MAX_STATE_BYTES: u64 = 64 << 20;

/// What `state.json` holds.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    /// By volume ID.
    pub volumes: BTreeMap<String, Volume>,
    /// Controller publications, in the order they were made.
    pub published: Vec<Publication>,
}

/// A volume the controller created.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Volume {
    /// Its ID (its directory's name).
    pub id: String,
    /// The name CreateVolume was called with.
    pub name: String,
    /// Bytes, as recorded (a directory has no size of its own).
    pub capacity_bytes: i64,
    /// The CreateVolume parameters, handed back as the volume context.
    pub parameters: BTreeMap<String, String>,
}

/// A volume published to a node by ControllerPublishVolume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Publication {
    /// The volume.
    pub volume_id: String,
    /// The node.
    pub node_id: String,
    /// Published read-only.
    pub readonly: bool,
}

/// The state dir.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Opens (creating) the state dir and its `volumes/` directory.
    pub fn open(root: &Path) -> io::Result<StateDir> {
        std::fs::create_dir_all(root.join("volumes"))?;
        Ok(StateDir { root: root.to_path_buf() })
    }

    /// The directory of the volume with this (already checked) ID.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.root.join("volumes").join(id)
    }

    /// The file system the volumes live on (for capacity).
    pub fn volumes_root(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// Runs `change` on the state under the lock and writes it back if it changed.
    pub fn update<T, E: From<io::Error>>(&self, change: impl FnOnce(&mut State) -> Result<T, E>) -> Result<T, E> {
        let _lock = self.lock()?;
        let before = self.read()?;
        let mut state = before.clone();
        let result = change(&mut state)?;
        if state != before {
            self.write(&state)?;
        }
        Ok(result)
    }

    /// The state as it is now.
    pub fn snapshot(&self) -> io::Result<State> {
        let _lock = self.lock()?;
        self.read()
    }

    fn lock(&self) -> io::Result<Flock<File>> {
        let file = File::options().create(true).truncate(false).write(true).open(self.root.join("state.lock"))?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| io::Error::from(errno))
    }

    fn read(&self) -> io::Result<State> {
        let path = self.root.join("state.json");
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        if len > MAX_STATE_BYTES {
            return Err(io::Error::other(format!("{} is {len} bytes, more than the {MAX_STATE_BYTES} it may be", path.display())));
        }
        serde_json::from_reader(io::BufReader::new(file)).map_err(|e| io::Error::other(format!("{}: {e}", path.display())))
    }

    /// Writes a new file and renames it over the old one, so a reader never sees half of it.
    fn write(&self, state: &State) -> io::Result<()> {
        let path = self.root.join("state.json");
        let tmp = self.root.join("state.json.tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(state).map_err(io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_persist_and_a_failed_change_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        assert!(dir.path().join("volumes").is_dir());
        assert_eq!(state.snapshot().unwrap(), State::default());

        let volume = Volume { id: "v1".into(), name: "one".into(), capacity_bytes: 10, parameters: BTreeMap::new() };
        state
            .update(|s| {
                s.volumes.insert("v1".into(), volume.clone());
                Ok::<_, io::Error>(())
            })
            .unwrap();
        let failed: Result<(), io::Error> = state.update(|s| {
            s.volumes.clear();
            Err(io::Error::other("refused"))
        });
        assert!(failed.is_err());
        let reopened = StateDir::open(dir.path()).unwrap();
        assert_eq!(reopened.snapshot().unwrap().volumes.get("v1"), Some(&volume));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("state.json")).unwrap()).unwrap();
        assert_eq!(json["volumes"]["v1"]["name"], "one");
    }
}
