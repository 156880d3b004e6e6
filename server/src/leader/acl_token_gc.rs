//! The expired ACL token GC (Nomad's core jobs `local-token-expired-gc` and
//! `global-token-expired-gc`, `expiredACLTokenGC` in `nomad/core_sched.go`): every
//! [`TokenGcConfig::interval`] the leader deletes the tokens that have expired and were created
//! at least `acl_token_gc_threshold` ago, at most [`MAX_EXPIRED_BATCH`] in one write. An expired
//! token already resolves to `ACL token expired` everywhere; the GC only stops them piling up.
//!
//! Nomad judges "created long enough ago" by the Raft index its time table gives for the
//! threshold; a token carries its creation time, so that is what is compared here.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::Timestamp;

use crate::consensus::{BoxFuture, Consensus};
use crate::fsm::Command;
use crate::state::StateStore;

/// Nomad's `CoreJobLocalTokenExpiredGC` (one region here: every token is local to it).
pub const CORE_JOB_TOKEN_EXPIRED_GC: &str = "local-token-expired-gc";
/// Most tokens one delete carries (Nomad's `ACLMaxExpiredBatchSize`).
pub const MAX_EXPIRED_BATCH: usize = 4096;

/// What the token GC may do, and nothing else. It runs only while ACLs are on (as Nomad's).
pub trait ExpiredTokens: Send + Sync + 'static {
    /// AccessorIDs of up to `limit` tokens expired at `now` and created before `created_before`.
    fn expired(&self, now: Timestamp, created_before: Timestamp, limit: usize) -> Vec<String>;
    /// Deletes the tokens.
    fn delete(&self, accessor_ids: Vec<String>) -> BoxFuture<'_, Result<u64, String>>;
}

/// Token GC settings (`server { acl_token_gc_threshold }`).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenGcConfig {
    /// How often it runs (Nomad: 5 min, not configurable).
    pub interval: Duration,
    /// How old an expired token must be (Nomad: 1 h).
    pub threshold: Duration,
}

impl Default for TokenGcConfig {
    fn default() -> Self {
        TokenGcConfig { interval: Duration::from_secs(300), threshold: Duration::from_secs(3600) }
    }
}

/// [`ExpiredTokens`] over the state store and consensus.
pub struct StoreTokens {
    /// State.
    pub store: Arc<StateStore>,
    /// Writes.
    pub consensus: Arc<dyn Consensus>,
}

impl ExpiredTokens for StoreTokens {
    fn expired(&self, now: Timestamp, created_before: Timestamp, limit: usize) -> Vec<String> {
        let snap = self.store.snapshot();
        let mut expired: Vec<String> = snap
            .acl_tokens()
            .filter(|t| t.expired(now) && t.create_time < created_before)
            .take(limit)
            .map(|t| t.accessor_id.clone())
            .collect();
        expired.sort_unstable();
        expired
    }

    fn delete(&self, accessor_ids: Vec<String>) -> BoxFuture<'_, Result<u64, String>> {
        Box::pin(async move { self.consensus.apply(Command::AclTokenDelete { accessor_ids }).await.map_err(|e| e.to_string()) })
    }
}

/// The token GC of one term of leadership.
pub struct TokenGc {
    tokens: Arc<dyn ExpiredTokens>,
    config: TokenGcConfig,
}

impl TokenGc {
    /// A GC over `tokens`.
    pub fn new(tokens: Arc<dyn ExpiredTokens>, config: TokenGcConfig) -> TokenGc {
        TokenGc { tokens, config }
    }

    /// Runs until dropped (leadership lost).
    pub async fn run(self) {
        let mut ticks = super::periodic_ticks(self.config.interval);
        loop {
            ticks.tick().await;
            self.collect(Timestamp::now()).await;
        }
    }

    /// One pass at `now`: deletes what is due, batch by batch. The number deleted.
    pub async fn collect(&self, now: Timestamp) -> usize {
        let threshold = i64::try_from(self.config.threshold.as_nanos()).unwrap_or(i64::MAX);
        let created_before = Timestamp::from_unix_nanos(now.unix_nanos().saturating_sub(threshold));
        let mut deleted = 0;
        loop {
            let batch = self.tokens.expired(now, created_before, MAX_EXPIRED_BATCH);
            if batch.is_empty() {
                break;
            }
            let (count, full) = (batch.len(), batch.len() == MAX_EXPIRED_BATCH);
            match self.tokens.delete(batch).await {
                Ok(_) => deleted += count,
                Err(e) => {
                    tracing::warn!(job = CORE_JOB_TOKEN_EXPIRED_GC, error = %e, "failed to delete expired ACL tokens");
                    break;
                }
            }
            if !full {
                break;
            }
        }
        if deleted > 0 {
            tracing::debug!(job = CORE_JOB_TOKEN_EXPIRED_GC, num = deleted, "expired ACL token GC");
        }
        deleted
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Tokens as (AccessorID, created at, expires at) in seconds; what was deleted.
    struct Fake {
        tokens: Mutex<Vec<(String, i64, Option<i64>)>>,
        deletes: Mutex<Vec<usize>>,
    }

    fn secs(s: i64) -> Timestamp {
        Timestamp::from_unix_nanos(s * 1_000_000_000)
    }

    impl ExpiredTokens for Fake {
        fn expired(&self, now: Timestamp, created_before: Timestamp, limit: usize) -> Vec<String> {
            let tokens = self.tokens.lock().unwrap();
            tokens
                .iter()
                .filter(|(_, created, expires)| expires.is_some_and(|e| secs(e) < now) && secs(*created) < created_before)
                .take(limit)
                .map(|(id, _, _)| id.clone())
                .collect()
        }
        fn delete(&self, ids: Vec<String>) -> BoxFuture<'_, Result<u64, String>> {
            self.deletes.lock().unwrap().push(ids.len());
            self.tokens.lock().unwrap().retain(|(id, _, _)| !ids.contains(id));
            Box::pin(async { Ok(1) })
        }
    }

    fn fake(tokens: Vec<(&str, i64, Option<i64>)>) -> Arc<Fake> {
        Arc::new(Fake {
            tokens: Mutex::new(tokens.into_iter().map(|(id, c, e)| (id.to_string(), c, e)).collect()),
            deletes: Mutex::new(Vec::new()),
        })
    }

    #[tokio::test]
    async fn only_expired_tokens_older_than_the_threshold_go() {
        let tokens = fake(vec![
            ("old-expired", 0, Some(100)),
            ("young-expired", 3000, Some(3100)),
            ("old-live", 0, Some(10_000)),
            ("never", 0, None),
        ]);
        let gc = TokenGc::new(tokens.clone(), TokenGcConfig::default());
        assert_eq!(gc.collect(secs(3700)).await, 1);
        let left: Vec<String> = tokens.tokens.lock().unwrap().iter().map(|t| t.0.clone()).collect();
        assert_eq!(left, ["young-expired", "old-live", "never"]);
        // An hour after its creation the younger one goes too.
        assert_eq!(gc.collect(secs(6601)).await, 1);
    }

    #[tokio::test]
    async fn many_expired_tokens_go_in_batches() {
        let many: Vec<(String, i64, Option<i64>)> = (0..MAX_EXPIRED_BATCH + 5).map(|i| (format!("t{i}"), 0, Some(1))).collect();
        let on = fake(vec![]);
        *on.tokens.lock().unwrap() = many;
        assert_eq!(TokenGc::new(on.clone(), TokenGcConfig::default()).collect(secs(7200)).await, MAX_EXPIRED_BATCH + 5);
        assert_eq!(*on.deletes.lock().unwrap(), [MAX_EXPIRED_BATCH, 5]);
    }
}

#[cfg(test)]
mod store_tests {
    use super::*;
    use crate::acl::{AclToken, CLIENT};
    use crate::testing::TestServer;

    #[tokio::test]
    async fn the_store_gc_deletes_old_expired_tokens_through_raft_and_keeps_the_rest() {
        let ts = TestServer::new();
        let now = Timestamp::now();
        let token = |id: &str, created_ago_s: i64, expires_in_s: Option<i64>| AclToken {
            accessor_id: id.into(),
            secret_id: format!("secret-{id}"),
            token_type: CLIENT.into(),
            policies: vec!["p".into()],
            create_time: now.add_nanos(-created_ago_s * 1_000_000_000),
            expiration_time: expires_in_s.map(|s| now.add_nanos(s * 1_000_000_000)),
            ..AclToken::default()
        };
        let tokens = vec![
            token("gone", 7200, Some(-60)),
            token("recent", 120, Some(-60)),
            token("live", 7200, Some(600)),
            token("forever", 7200, None),
        ];
        ts.endpoints.consensus().apply(Command::AclTokenUpsert { tokens }).await.unwrap();

        let store = Arc::new(StoreTokens { store: ts.store.clone(), consensus: ts.endpoints.consensus().clone() });
        let gc = TokenGc::new(store, TokenGcConfig::default());
        assert_eq!(gc.collect(now).await, 1);
        let snap = ts.store.snapshot();
        let mut left: Vec<&str> = snap.acl_tokens().map(|t| t.accessor_id.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["forever", "live", "recent"]);
        assert!(snap.acl_token_by_secret("secret-gone").is_none());
        assert_eq!(gc.collect(now).await, 0, "nothing more is due");
    }
}
