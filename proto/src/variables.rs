//! Nomad Variables (1.4+): the API shapes, Nomad's path and size rules, and the root key metadata
//! of the keyring that encrypts them.
//!
//! The servers keep a variable's items encrypted (`nomad-server`'s `keyring`); what travels over
//! the API is [`Variable`] (with `Items`) or [`VariableMetadata`] (lists, never items).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most bytes a variable's keys and values may hold together (not configurable in Nomad).
pub const MAX_VARIABLE_SIZE: usize = 65536;

/// The longest path (Nomad's `^[a-zA-Z0-9-_~/]{1,128}$`).
pub const MAX_VARIABLE_PATH: usize = 128;

/// A variable's metadata: what lists show.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct VariableMetadata {
    /// Namespace.
    pub namespace: String,
    /// Path.
    pub path: String,
    /// Raft index of the first write.
    pub create_index: u64,
    /// Unix nanoseconds of the first write (kept on update).
    pub create_time: i64,
    /// Raft index of the last write.
    pub modify_index: u64,
    /// Unix nanoseconds of the last write.
    pub modify_time: i64,
}

/// A variable with its items, as reads and writes carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Variable {
    /// Namespace.
    pub namespace: String,
    /// Path.
    pub path: String,
    /// Raft index of the first write.
    pub create_index: u64,
    /// Unix nanoseconds of the first write.
    pub create_time: i64,
    /// Raft index of the last write.
    pub modify_index: u64,
    /// Unix nanoseconds of the last write.
    pub modify_time: i64,
    /// The secret items.
    pub items: BTreeMap<String, String>,
}

impl Variable {
    /// The metadata part.
    pub fn metadata(&self) -> VariableMetadata {
        VariableMetadata {
            namespace: self.namespace.clone(),
            path: self.path.clone(),
            create_index: self.create_index,
            create_time: self.create_time,
            modify_index: self.modify_index,
            modify_time: self.modify_time,
        }
    }

    /// The variable of `meta` holding `items`.
    pub fn from_parts(meta: &VariableMetadata, items: BTreeMap<String, String>) -> Variable {
        Variable {
            namespace: meta.namespace.clone(),
            path: meta.path.clone(),
            create_index: meta.create_index,
            create_time: meta.create_time,
            modify_index: meta.modify_index,
            modify_time: meta.modify_time,
            items,
        }
    }

    /// The bytes its keys and values hold (what [`MAX_VARIABLE_SIZE`] limits).
    pub fn items_size(&self) -> usize {
        self.items.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Nomad's `VariableDecrypted.Validate`, with its messages.
    pub fn validate(&self) -> Result<(), String> {
        if self.namespace == "*" {
            return Err("can not target wildcard (\"*\")namespace".into());
        }
        if self.items.is_empty() {
            return Err("empty variables are invalid".into());
        }
        if self.items_size() > MAX_VARIABLE_SIZE {
            return Err("variables are limited to 64KiB in total size".into());
        }
        validate_path(&self.path)
    }
}

/// Nomad's variable path rule: `[a-zA-Z0-9-_~/]{1,128}`, and under `nomad/` only `nomad/jobs[/...]`
/// and `nomad/job-templates/<name>`.
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("variable requires path".into());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '~' | '/');
    if path.len() > MAX_VARIABLE_PATH || !path.chars().all(allowed) {
        return Err(format!("invalid path {path:?}"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts[0] != "nomad" {
        return Ok(());
    }
    match parts.get(1).copied() {
        None => Err("\"nomad\" is a reserved top-level directory path, but you may write variables to \"nomad/jobs\", \"nomad/job-templates\", or below".into()),
        Some("jobs") => Ok(()),
        Some("job-templates") if parts.len() == 3 => Ok(()),
        Some("job-templates") => Err("\"nomad/job-templates\" is a reserved directory path, but you may write variables at the level below it, for example, \"nomad/job-templates/template-name\"".into()),
        Some(_) => Err("only paths at \"nomad/jobs\" or \"nomad/job-templates\" and below are valid paths under the top-level \"nomad\" directory".into()),
    }
}

/// The paths a workload of `job`/`group`/`task` may read and list without a policy (Nomad's
/// implicit workload rule): exactly these four, in the workload's own namespace.
pub fn workload_paths(job: &str, group: &str, task: &str) -> [String; 4] {
    ["nomad/jobs".to_string(), format!("nomad/jobs/{job}"), format!("nomad/jobs/{job}/{group}"), format!("nomad/jobs/{job}/{group}/{task}")]
}

/// A root key's state.
pub mod root_key_state {
    /// Encrypts new writes and signs identities.
    pub const ACTIVE: &str = "active";
    /// Decrypts what it encrypted; nothing new.
    pub const INACTIVE: &str = "inactive";
    /// Inactive, and the leader re-encrypts its variables with the active key (`rotate -full`).
    pub const REKEYING: &str = "rekeying";
}

/// The algorithm of every root key.
pub const ROOT_KEY_ALGORITHM: &str = "aes256-gcm";

/// A root key's metadata (Nomad's `RootKeyMeta`); the key itself never appears in the API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RootKeyMeta {
    /// A UUID.
    #[serde(rename = "KeyID")]
    pub key_id: String,
    /// `aes256-gcm`.
    pub algorithm: String,
    /// Unix nanoseconds of its creation.
    pub create_time: i64,
    /// Raft index of its creation.
    pub create_index: u64,
    /// Raft index of its last change.
    pub modify_index: u64,
    /// `active`, `inactive` or `rekeying`.
    pub state: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(path: &str, items: &[(&str, &str)]) -> Variable {
        Variable {
            namespace: "default".into(),
            path: path.into(),
            items: items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Variable::default()
        }
    }

    #[test]
    fn paths_follow_nomads_rule() {
        for ok in ["a", "app/db", "nomad/jobs", "nomad/jobs/web/g/t", "nomad/job-templates/x", "a-b_c~d"] {
            assert_eq!(validate_path(ok), Ok(()), "{ok}");
        }
        assert_eq!(validate_path(""), Err("variable requires path".into()));
        assert_eq!(validate_path("a b"), Err("invalid path \"a b\"".into()));
        assert_eq!(validate_path("a.b").unwrap_err(), "invalid path \"a.b\"");
        assert!(validate_path(&"a".repeat(129)).is_err());
        assert!(validate_path(&"a".repeat(128)).is_ok());
        assert!(validate_path("nomad").unwrap_err().contains("reserved top-level"));
        assert!(validate_path("nomad/job-templates").unwrap_err().contains("reserved directory path"));
        assert!(validate_path("nomad/job-templates/a/b").unwrap_err().contains("reserved directory path"));
        assert!(validate_path("nomad/other").unwrap_err().starts_with("only paths at"));
    }

    #[test]
    fn items_are_required_and_limited_to_64_kib() {
        assert_eq!(var("a", &[]).validate(), Err("empty variables are invalid".into()));
        let big = "x".repeat(MAX_VARIABLE_SIZE);
        assert_eq!(var("a", &[("k", &big)]).validate(), Err("variables are limited to 64KiB in total size".into()));
        assert_eq!(var("a", &[("", &big)]).validate(), Ok(()));
        let mut any = var("a", &[("k", "v")]);
        any.namespace = "*".into();
        assert!(any.validate().unwrap_err().contains("wildcard"));
    }

    #[test]
    fn the_api_shape_is_nomads() {
        let v = var("a/b", &[("k", "v")]);
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["Path"], "a/b");
        assert_eq!(json["Items"]["k"], "v");
        assert!(json.get("ModifyIndex").is_some());
        let meta = serde_json::to_value(v.metadata()).unwrap();
        assert!(meta.get("Items").is_none());
        let key = serde_json::to_value(RootKeyMeta { key_id: "k".into(), ..RootKeyMeta::default() }).unwrap();
        assert_eq!(key["KeyID"], "k");
    }
}
