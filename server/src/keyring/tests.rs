use std::collections::BTreeMap;

use nomad_proto::Timestamp;
use nomad_proto::variables::{VariableMetadata, root_key_state};

use super::*;
use crate::state::{StateStore, VarOp};

fn items(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn meta(ns: &str, path: &str) -> VariableMetadata {
    VariableMetadata { namespace: ns.into(), path: path.into(), ..VariableMetadata::default() }
}

/// A store holding one active key of `ring`.
fn store_with_key(ring: &Keyring) -> (StateStore, String) {
    let store = StateStore::new();
    let key = ring.generate(Timestamp::now(), root_key_state::ACTIVE);
    let id = key.meta.key_id.clone();
    store
        .write(1, |txn| {
            txn.upsert_root_key(&key);
            Ok(())
        })
        .unwrap();
    (store, id)
}

#[test]
fn items_round_trip_and_are_never_stored_in_clear() {
    let ring = Keyring::default();
    let (store, key_id) = store_with_key(&ring);
    let snap = store.snapshot();
    let secret = items(&[("password", "hunter2-very-secret")]);
    let enc = ring.encrypt(&snap, meta("default", "app/db"), &secret).unwrap();
    assert_eq!(enc.key_id, key_id);
    assert!(!enc.data.contains("hunter2"));
    assert_eq!(ring.decrypt(&snap, &enc).unwrap(), secret);
    // A fresh nonce per write: the same items never encrypt the same way twice.
    assert_ne!(ring.encrypt(&snap, meta("default", "app/db"), &secret).unwrap().data, enc.data);
    // Neither the wrapped key nor the record holds anything readable, and a snapshot neither.
    store.write(2, |txn| txn.apply_variable(VarOp::Set, &enc, 5)).unwrap();
    let bytes = store.snapshot().to_bytes().unwrap();
    assert!(!String::from_utf8_lossy(&bytes).contains("hunter2"));
}

#[test]
fn a_tampered_record_or_another_clusters_key_does_not_decrypt() {
    let ring = Keyring::default();
    let (store, _) = store_with_key(&ring);
    let snap = store.snapshot();
    let enc = ring.encrypt(&snap, meta("default", "a"), &items(&[("k", "v")])).unwrap();
    let mut bytes = B64.decode(&enc.data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let tampered = EncryptedVariable { data: B64.encode(bytes), ..enc.clone() };
    assert!(matches!(ring.decrypt(&snap, &tampered), Err(KeyringError::Decrypt(_))));
    // Another KEK (another cluster key) cannot unwrap the root key.
    let other = Keyring::default();
    let err = other.decrypt(&snap, &enc).unwrap_err();
    assert!(matches!(err, KeyringError::Decrypt(_)), "{err}");
    assert!(err.to_string().contains("cluster key"), "{err}");
    // A record naming a key that is gone.
    let orphan = EncryptedVariable { key_id: "nope".into(), ..enc };
    assert_eq!(ring.decrypt(&snap, &orphan), Err(KeyringError::UnknownKey("nope".into())));
}

#[test]
fn without_an_active_key_nothing_is_encrypted_or_signed() {
    let ring = Keyring::default();
    let snap = StateStore::new().snapshot();
    assert_eq!(ring.encrypt(&snap, meta("default", "a"), &items(&[("k", "v")])), Err(KeyringError::NoActiveKey));
    assert_eq!(ring.sign(&snap, &serde_json::json!({})), Err(KeyringError::NoActiveKey));
}

#[test]
fn identities_verify_only_untouched_and_under_a_known_key() {
    let ring = Keyring::default();
    let (store, key_id) = store_with_key(&ring);
    let snap = store.snapshot();
    let claims = serde_json::json!({ "nomad_namespace": "default", "nomad_job_id": "web", "nomad_allocation_id": "a1", "nomad_task": "t" });
    let jwt = ring.sign(&snap, &claims).unwrap();
    let header: serde_json::Value = serde_json::from_slice(&B64URL.decode(jwt.split('.').next().unwrap()).unwrap()).unwrap();
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["kid"], key_id.as_str());
    assert_eq!(ring.verify(&snap, &jwt).unwrap(), claims);
    // Claims changed after signing.
    let mut parts: Vec<String> = jwt.split('.').map(str::to_string).collect();
    parts[1] = B64URL.encode(serde_json::json!({ "nomad_job_id": "other" }).to_string());
    assert!(ring.verify(&snap, &parts.join(".")).is_err());
    // Garbage, and a token signed by another cluster's keyring for a key this one lacks.
    assert!(ring.verify(&snap, "a.b").is_err());
    let other = Keyring::default();
    let (other_store, _) = store_with_key(&other);
    let foreign = other.sign(&other_store.snapshot(), &claims).unwrap();
    assert!(matches!(ring.verify(&snap, &foreign), Err(KeyringError::UnknownKey(_))));
}

#[test]
fn one_key_is_active_and_keys_in_use_are_kept() {
    let ring = Keyring::default();
    let (store, first) = store_with_key(&ring);
    let snap = store.snapshot();
    let enc = ring.encrypt(&snap, meta("default", "a"), &items(&[("k", "v")])).unwrap();
    store.write(2, |txn| txn.apply_variable(VarOp::Set, &enc, 1)).unwrap();
    let second = ring.generate(Timestamp::now(), root_key_state::ACTIVE);
    store
        .write(3, |txn| {
            txn.upsert_root_key(&second);
            Ok(())
        })
        .unwrap();
    let snap = store.snapshot();
    assert_eq!(snap.active_root_key().unwrap().meta.key_id, second.meta.key_id);
    assert_eq!(snap.root_key(&first).unwrap().meta.state, root_key_state::INACTIVE);
    assert_eq!(snap.root_keys().filter(|k| is_active(&k.meta)).count(), 1);
    // The old key still decrypts what it encrypted.
    assert_eq!(ring.decrypt(&snap, snap.variable("default", "a").unwrap()).unwrap(), items(&[("k", "v")]));
    let err = store.write(4, |txn| txn.delete_root_key(&second.meta.key_id)).unwrap_err();
    assert!(err.0.contains("active root key cannot be deleted"), "{err}");
    let err = store.write(4, |txn| txn.delete_root_key(&first)).unwrap_err();
    assert!(err.0.contains("still encrypts 1 variable"), "{err}");
    store.write(4, |txn| txn.apply_variable(VarOp::Delete, &enc, 1)).unwrap();
    store.write(5, |txn| txn.delete_root_key(&first)).unwrap();
    assert!(store.snapshot().root_key(&first).is_none());
}

#[test]
fn check_and_set_holds_only_at_the_stored_index() {
    let ring = Keyring::default();
    let (store, _) = store_with_key(&ring);
    let snap = store.snapshot();
    let enc = ring.encrypt(&snap, meta("default", "a"), &items(&[("k", "v")])).unwrap();
    // cas=0: create only.
    store.write(2, |txn| txn.apply_variable(VarOp::Cas(0), &enc, 100)).unwrap();
    let err = store.write(3, |txn| txn.apply_variable(VarOp::Cas(0), &enc, 200)).unwrap_err();
    assert!(err.0.starts_with(crate::state::CAS_CONFLICT), "{err}");
    store.write(3, |txn| txn.apply_variable(VarOp::Cas(2), &enc, 200)).unwrap();
    let v = store.snapshot().variable("default", "a").unwrap().clone();
    assert_eq!((v.meta.create_index, v.meta.create_time, v.meta.modify_index, v.meta.modify_time), (2, 100, 3, 200));
    assert!(store.write(4, |txn| txn.apply_variable(VarOp::DeleteCas(2), &enc, 300)).is_err());
    store.write(4, |txn| txn.apply_variable(VarOp::DeleteCas(3), &enc, 300)).unwrap();
    assert!(store.snapshot().variable("default", "a").is_none());
}
