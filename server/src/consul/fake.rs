//! A recording stand-in for Consul's ACL and config entry APIs, for server tests that do not
//! run an HTTP stand-in. It can be taken down (every call fails as an unreachable Consul does)
//! and brought back.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::config_entries::ConfigEntry;
use super::{AclTokenCreate, ConsulAcl, ConsulCallError, ConsulConfigEntries, CreatedToken};
use crate::consensus::BoxFuture;

/// A token the fake holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeToken {
    /// What was asked for.
    pub request: AclTokenCreate,
    /// Its secret.
    pub secret_id: String,
}

#[derive(Default)]
struct Inner {
    down: bool,
    tokens: BTreeMap<String, FakeToken>,
    entries: BTreeMap<(String, String, String), ConfigEntry>,
    revoke_attempts: Vec<String>,
    next: u64,
}

/// The fake.
#[derive(Default)]
pub struct FakeConsul {
    inner: Mutex<Inner>,
}

impl FakeConsul {
    /// An empty, reachable fake.
    pub fn new() -> FakeConsul {
        FakeConsul::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the fake down (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// The live tokens, by AccessorID.
    pub fn tokens(&self) -> BTreeMap<String, FakeToken> {
        self.lock().tokens.clone()
    }

    /// The config entries written, by (namespace, kind, name).
    pub fn config_entries(&self) -> BTreeMap<(String, String, String), ConfigEntry> {
        self.lock().entries.clone()
    }

    /// Every revocation asked for (AccessorIDs, in order, failed ones included).
    pub fn revoke_attempts(&self) -> Vec<String> {
        self.lock().revoke_attempts.clone()
    }

    fn down_error() -> ConsulCallError {
        ConsulCallError::unreachable("cannot reach Consul: connection refused")
    }
}

impl ConsulAcl for FakeConsul {
    fn create_token(&self, token: AclTokenCreate) -> BoxFuture<'_, Result<CreatedToken, ConsulCallError>> {
        let result = {
            let mut st = self.lock();
            if st.down {
                Err(Self::down_error())
            } else {
                st.next += 1;
                let accessor_id = format!("00000000-0000-4000-8000-{:012}", st.next);
                let secret_id = format!("11111111-0000-4000-8000-{:012}", st.next);
                let namespace = token.namespace.clone();
                st.tokens.insert(accessor_id.clone(), FakeToken { request: token, secret_id: secret_id.clone() });
                Ok(CreatedToken { accessor_id, secret_id, namespace })
            }
        };
        Box::pin(async move { result })
    }

    fn revoke_token<'a>(&'a self, _namespace: &'a str, accessor_id: &'a str) -> BoxFuture<'a, Result<(), ConsulCallError>> {
        let result = {
            let mut st = self.lock();
            st.revoke_attempts.push(accessor_id.to_string());
            if st.down {
                Err(Self::down_error())
            } else if st.tokens.remove(accessor_id).is_none() {
                Err(ConsulCallError { status: Some(500), message: "Unexpected response code: 500 (Cannot find token to delete)".into() })
            } else {
                Ok(())
            }
        };
        Box::pin(async move { result })
    }
}

impl ConsulConfigEntries for FakeConsul {
    fn set_config_entry<'a>(&'a self, entry: &'a ConfigEntry) -> BoxFuture<'a, Result<(), ConsulCallError>> {
        let result = {
            let mut st = self.lock();
            if st.down {
                Err(Self::down_error())
            } else {
                st.entries.insert((entry.namespace().to_string(), entry.kind().to_string(), entry.name().to_string()), entry.clone());
                Ok(())
            }
        };
        Box::pin(async move { result })
    }
}
