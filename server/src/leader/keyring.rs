//! The keyring's leader duties (Nomad's `initializeKeyring`, root key rotation and
//! `root-key-rotate-gc`, and the rekeying of `keyring rotate -full`):
//! - when it takes office with no active root key, the leader makes one;
//! - an active key older than `root_key_rotation_threshold` (720h) is replaced;
//! - the variables of a `rekeying` key are re-encrypted with the active key (a check-and-set
//!   each, so a concurrent write wins), then the key becomes `inactive`;
//! - every `root_key_gc_interval` (10m) it deletes inactive keys older than
//!   `root_key_gc_threshold` (1h) that encrypt no variable and may have signed the identity of
//!   a live alloc (one created before the key stopped being active).

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::Timestamp;
use nomad_proto::variables::root_key_state;

use crate::consensus::Consensus;
use crate::fsm::Command;
use crate::keyring::Keyring;
use crate::state::{StateStore, Table, VarOp};

/// Variables re-encrypted per pass.
const REKEY_BATCH: usize = 64;

/// Keyring settings (`server { root_key_rotation_threshold, root_key_gc_interval, root_key_gc_threshold }`).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyringConfig {
    /// How old the active key may get before it is replaced (Nomad: 720h).
    pub rotation_threshold: Duration,
    /// How often inactive keys are considered for deletion (Nomad: 10m).
    pub gc_interval: Duration,
    /// How old an inactive key must be to be deleted (Nomad: 1h).
    pub gc_threshold: Duration,
}

impl Default for KeyringConfig {
    fn default() -> Self {
        KeyringConfig {
            rotation_threshold: Duration::from_secs(720 * 3600),
            gc_interval: Duration::from_secs(600),
            gc_threshold: Duration::from_secs(3600),
        }
    }
}

/// The keyring duties of one term of leadership.
pub struct KeyringLoop {
    store: Arc<StateStore>,
    consensus: Arc<dyn Consensus>,
    keyring: Arc<Keyring>,
    config: KeyringConfig,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl KeyringLoop {
    /// The loop over the server's state and keyring.
    pub fn new(store: Arc<StateStore>, consensus: Arc<dyn Consensus>, keyring: Arc<Keyring>, config: KeyringConfig) -> KeyringLoop {
        KeyringLoop { store, consensus, keyring, config }
    }

    /// Runs until dropped (leadership lost). A root key change (a rotation asked for over the
    /// API) wakes it at once.
    pub async fn run(self) {
        let gc_every = self.config.gc_interval.max(Duration::from_millis(1));
        let mut next_gc = tokio::time::Instant::now() + gc_every;
        loop {
            let busy = match self.ensure_and_rekey(Timestamp::now()).await {
                Ok(busy) => busy,
                Err(e) => {
                    tracing::warn!(error = %e, "keyring: failed to update root keys");
                    true
                }
            };
            if tokio::time::Instant::now() >= next_gc {
                if let Err(e) = self.collect(Timestamp::now()).await {
                    tracing::warn!(error = %e, "keyring: root key GC failed");
                }
                next_gc = tokio::time::Instant::now() + gc_every;
            }
            // More to rekey: go on at once (a failure backs off a little).
            let wait = if busy { Duration::from_millis(200) } else { next_gc.saturating_duration_since(tokio::time::Instant::now()) };
            let index = self.store.snapshot().table_index(Table::RootKeys);
            self.store.wait_for_change(&[Table::RootKeys], index, wait.min(Duration::from_secs(3600))).await;
        }
    }

    async fn apply(&self, cmd: Command) -> Result<u64, String> {
        self.consensus.apply(cmd).await.map_err(|e| e.to_string())
    }

    /// Makes or replaces the active key when due, and re-encrypts one batch of a rekeying key's
    /// variables. Whether more rekeying is left.
    pub async fn ensure_and_rekey(&self, now: Timestamp) -> Result<bool, String> {
        let snap = self.store.snapshot();
        let due = match snap.active_root_key() {
            None => Some("initialized the keyring"),
            Some(k) if now.unix_nanos().saturating_sub(k.meta.create_time) > nanos(self.config.rotation_threshold) => {
                Some("rotated the root key (root_key_rotation_threshold)")
            }
            Some(_) => None,
        };
        if let Some(what) = due {
            let key = self.keyring.generate(now, root_key_state::ACTIVE);
            let key_id = key.meta.key_id.clone();
            self.apply(Command::RootKeyUpsert { key }).await?;
            tracing::info!(key_id, "keyring: {what}");
        }
        let snap = self.store.snapshot();
        let Some(rekeying) = snap.root_keys().find(|k| k.meta.state == root_key_state::REKEYING).cloned() else { return Ok(false) };
        let key_id = rekeying.meta.key_id.clone();
        let batch: Vec<_> = snap.variables_with_prefix("*", "").filter(|v| v.key_id == key_id).take(REKEY_BATCH).cloned().collect();
        if batch.is_empty() {
            self.apply(Command::RootKeySetState { key_id: key_id.clone(), state: root_key_state::INACTIVE.into() }).await?;
            tracing::info!(key_id, "keyring: rekeying done");
            return Ok(true);
        }
        for v in batch {
            let items = self.keyring.decrypt(&snap, &v).map_err(|e| e.to_string())?;
            let fresh = self.keyring.encrypt(&snap, v.meta.clone(), &items).map_err(|e| e.to_string())?;
            let cmd = Command::VariableApply { op: VarOp::Cas(v.meta.modify_index), variable: fresh, now };
            // A write since the snapshot used the active key already.
            if let Err(e) = self.apply(cmd).await
                && !e.contains(crate::state::CAS_CONFLICT)
            {
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Deletes the inactive keys that are old enough and can be needed by nothing. The number
    /// deleted.
    pub async fn collect(&self, now: Timestamp) -> Result<usize, String> {
        let snap = self.store.snapshot();
        let old_enough = now.unix_nanos().saturating_sub(nanos(self.config.gc_threshold));
        let candidates: Vec<_> = snap
            .root_keys()
            .filter(|k| k.meta.state == root_key_state::INACTIVE && k.meta.create_time < old_enough)
            .filter(|k| snap.variables_using_key(&k.meta.key_id) == 0)
            .cloned()
            .collect();
        if candidates.is_empty() {
            return Ok(0);
        }
        // An alloc created while the key was active may hold an identity it signed: the key
        // became inactive at its modify index at the latest.
        let oldest_live = snap.allocs().filter(|a| !a.client_terminal()).map(|a| a.create_index).min();
        let mut deleted = 0;
        for k in candidates {
            if oldest_live.is_some_and(|i| i < k.meta.modify_index) {
                continue;
            }
            self.apply(Command::RootKeyDelete { key_id: k.meta.key_id.clone() }).await?;
            tracing::info!(key_id = k.meta.key_id, "keyring: deleted an unused root key");
            deleted += 1;
        }
        self.keyring.retain(&self.store.snapshot());
        Ok(deleted)
    }
}
