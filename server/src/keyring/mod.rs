//! The keyring: root keys that encrypt Nomad Variables at rest and sign workload identities.
//!
//! ```text
//!  cluster key ──derive──▶ KEK ──wraps──▶ root key (32 bytes, AES-256-GCM) ──▶ variable items
//!                                              └─derive──▶ Ed25519 key ──▶ workload identity JWTs
//! ```
//!
//! A root key lives in Raft wrapped (AES-256-GCM, its KeyID as additional data) by a key-encryption
//! key derived from the cluster key every server already shares (`rpc_auth::ClusterKey`). So every
//! server can use every root key, replication is Raft's, and neither the Raft log nor a snapshot
//! on disk holds a root key or a variable's items in clear. Nomad keeps key material out of Raft
//! in per-server keystore files replicated by RPC; wrapping with the shared cluster key gives the
//! same guarantee with one less replication path (ARCHITECTURE.md, decisions).
//!
//! Each variable write is encrypted with the active key and a fresh nonce; the record keeps the
//! KeyID, so older keys decrypt what they encrypted until `rotate -full` re-encrypts it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64URL};
use nomad_proto::variables::{RootKeyMeta, VariableMetadata, root_key_state};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use crate::state::State;

/// A root key as Raft keeps it: its metadata and the key wrapped by the KEK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRootKey {
    /// Metadata (what the API shows).
    pub meta: RootKeyMeta,
    /// base64 of nonce ‖ AES-256-GCM(KEK, key), the KeyID as additional data.
    pub wrapped: String,
}

/// A variable as Raft keeps it: metadata in clear, items encrypted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptedVariable {
    /// Metadata.
    pub meta: VariableMetadata,
    /// The root key that encrypted the items.
    pub key_id: String,
    /// base64 of nonce ‖ AES-256-GCM(root key, JSON of the items), the KeyID as additional data.
    pub data: String,
}

/// Why the keyring could not do something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    /// No key is active yet (the leader creates one when it takes office).
    #[error("no active root key: the keyring is not initialized yet, try again")]
    NoActiveKey,
    /// A record names a key the state does not have.
    #[error("root key {0} not found")]
    UnknownKey(String),
    /// Wrong key material or a tampered record.
    #[error("decrypting with root key {0} failed: the key material does not match (was the cluster key changed?)")]
    Decrypt(String),
    /// A malformed record or token.
    #[error("{0}")]
    Malformed(String),
}

struct RootKey {
    aead: LessSafeKey,
    signer: Ed25519KeyPair,
}

/// Key material in memory: the KEK and the root keys unwrapped so far.
pub struct Keyring {
    kek: LessSafeKey,
    keys: RwLock<HashMap<String, Arc<RootKey>>>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Default for Keyring {
    /// A keyring with a random KEK: for servers without a cluster (in-process tests).
    fn default() -> Keyring {
        Keyring::new(rand::random())
    }
}

fn aead_key(bytes: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("32 bytes is an AES-256 key"))
}

fn seal(key: &LessSafeKey, aad: &str, plain: &[u8]) -> String {
    let nonce_bytes: [u8; NONCE_LEN] = rand::random();
    let mut buf = plain.to_vec();
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce_bytes), Aad::from(aad.as_bytes()), &mut buf)
        .expect("AES-GCM seals any input below 64 GiB");
    let mut out = nonce_bytes.to_vec();
    out.extend_from_slice(&buf);
    B64.encode(out)
}

fn open(key: &LessSafeKey, aad: &str, sealed: &str, key_id: &str) -> Result<Vec<u8>, KeyringError> {
    let bytes = B64.decode(sealed).map_err(|e| KeyringError::Malformed(format!("encrypted data is not base64: {e}")))?;
    if bytes.len() < NONCE_LEN {
        return Err(KeyringError::Malformed("encrypted data is too short".into()));
    }
    let (nonce, rest) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyringError::Malformed("bad nonce".into()))?;
    let mut buf = rest.to_vec();
    let plain = key.open_in_place(nonce, Aad::from(aad.as_bytes()), &mut buf).map_err(|_| KeyringError::Decrypt(key_id.to_string()))?;
    Ok(plain.to_vec())
}

/// The Ed25519 seed of a root key: derived, so the AES key is used for one thing only.
fn signing_seed(root: &[u8; 32]) -> [u8; 32] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, root);
    let tag = ring::hmac::sign(&key, b"nomad-rs workload identity signing key v1");
    tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
}

impl Keyring {
    /// A keyring whose root keys are wrapped with `kek`.
    pub fn new(kek: [u8; 32]) -> Keyring {
        Keyring { kek: aead_key(&kek), keys: RwLock::default() }
    }

    /// The keyring of a cluster: its KEK derived from the cluster key.
    pub fn for_cluster(key: &crate::rpc_auth::ClusterKey) -> Keyring {
        Keyring::new(key.derive("nomad-rs keyring key-encryption key v1"))
    }

    /// A new random root key, wrapped, with `state` (active for a rotation).
    pub fn generate(&self, now: nomad_proto::Timestamp, state: &str) -> StoredRootKey {
        let key_id = uuid::Uuid::new_v4().to_string();
        let material: [u8; 32] = rand::random();
        let wrapped = seal(&self.kek, &key_id, &material);
        let meta = RootKeyMeta {
            key_id,
            algorithm: nomad_proto::variables::ROOT_KEY_ALGORITHM.into(),
            create_time: now.unix_nanos(),
            create_index: 0,
            modify_index: 0,
            state: state.into(),
        };
        StoredRootKey { meta, wrapped }
    }

    fn root(&self, state: &State, key_id: &str) -> Result<Arc<RootKey>, KeyringError> {
        if let Some(k) = self.keys.read().unwrap_or_else(|e| e.into_inner()).get(key_id) {
            return Ok(k.clone());
        }
        let stored = state.root_key(key_id).ok_or_else(|| KeyringError::UnknownKey(key_id.to_string()))?;
        let material: [u8; 32] = open(&self.kek, key_id, &stored.wrapped, key_id)?
            .try_into()
            .map_err(|_| KeyringError::Malformed(format!("root key {key_id} is not 32 bytes")))?;
        let signer = Ed25519KeyPair::from_seed_unchecked(&signing_seed(&material)).expect("any 32 bytes seed an Ed25519 key");
        let key = Arc::new(RootKey { aead: aead_key(&material), signer });
        self.keys.write().unwrap_or_else(|e| e.into_inner()).insert(key_id.to_string(), key.clone());
        Ok(key)
    }

    /// Forgets the material of keys the state no longer has.
    pub fn retain(&self, state: &State) {
        self.keys.write().unwrap_or_else(|e| e.into_inner()).retain(|id, _| state.root_key(id).is_some());
    }

    /// `items` encrypted with the active key, for `meta`.
    pub fn encrypt(
        &self,
        state: &State,
        meta: VariableMetadata,
        items: &BTreeMap<String, String>,
    ) -> Result<EncryptedVariable, KeyringError> {
        let active = state.active_root_key().ok_or(KeyringError::NoActiveKey)?;
        let key_id = active.meta.key_id.clone();
        let root = self.root(state, &key_id)?;
        let plain = serde_json::to_vec(items).expect("a string map serializes");
        Ok(EncryptedVariable { meta, data: seal(&root.aead, &key_id, &plain), key_id })
    }

    /// The items of `v`.
    pub fn decrypt(&self, state: &State, v: &EncryptedVariable) -> Result<BTreeMap<String, String>, KeyringError> {
        let root = self.root(state, &v.key_id)?;
        let plain = open(&root.aead, &v.key_id, &v.data, &v.key_id)?;
        serde_json::from_slice(&plain).map_err(|e| KeyringError::Malformed(format!("decrypted items: {e}")))
    }

    /// A JWT (EdDSA, `kid` = the active key) carrying `claims`.
    pub fn sign(&self, state: &State, claims: &serde_json::Value) -> Result<String, KeyringError> {
        let active = state.active_root_key().ok_or(KeyringError::NoActiveKey)?;
        let key_id = active.meta.key_id.clone();
        let root = self.root(state, &key_id)?;
        let header = serde_json::json!({ "alg": "EdDSA", "kid": key_id, "typ": "JWT" });
        let signing_input = format!("{}.{}", B64URL.encode(header.to_string()), B64URL.encode(claims.to_string()));
        let sig = root.signer.sign(signing_input.as_bytes());
        Ok(format!("{signing_input}.{}", B64URL.encode(sig.as_ref())))
    }

    /// The claims of a JWT this cluster's keyring signed, if the signature holds.
    pub fn verify(&self, state: &State, jwt: &str) -> Result<serde_json::Value, KeyringError> {
        let bad = |m: &str| KeyringError::Malformed(format!("invalid workload identity: {m}"));
        let mut parts = jwt.split('.');
        let (Some(h), Some(c), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad("not a JWT"));
        };
        let header: serde_json::Value =
            B64URL.decode(h).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or_else(|| bad("unreadable header"))?;
        if header["alg"] != "EdDSA" {
            return Err(bad("unexpected algorithm"));
        }
        let kid = header["kid"].as_str().ok_or_else(|| bad("no key id"))?;
        let root = self.root(state, kid)?;
        let sig = B64URL.decode(s).map_err(|_| bad("unreadable signature"))?;
        let public = UnparsedPublicKey::new(&ED25519, root.signer.public_key().as_ref());
        public.verify(format!("{h}.{c}").as_bytes(), &sig).map_err(|_| bad("signature does not verify"))?;
        B64URL.decode(c).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or_else(|| bad("unreadable claims"))
    }
}

/// Whether `state` names a key that may encrypt and sign.
pub fn is_active(meta: &RootKeyMeta) -> bool {
    meta.state == root_key_state::ACTIVE
}

#[cfg(test)]
mod tests;
