//! Namespaces (`structs.Namespace`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A namespace. `default` always exists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Namespace {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Quota.
    pub quota: String,
    /// User metadata.
    pub meta: BTreeMap<String, String>,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}
