//! ACLs: the policy language, compiled ACLs, the stored objects and token resolution.
//!
//! ```text
//!  secret ──resolve()──▶ AclToken ──policies + roles' policies──▶ Policy::parse ──▶ Acl::compile
//!  ("" = anonymous)       (expired / unknown / node secret → refused)            (management: allow all)
//! ```
//!
//! The HTTP layer asks the resulting [`Acl`] one question per route (`http/authz.rs`).

mod compiled;
mod objects;
mod policy;
mod resolve;

pub use compiled::{Acl, WORKLOAD_READ_SERVICES, WorkloadGrant, glob_match};
pub use objects::{
    ANONYMOUS_ACCESSOR, ANONYMOUS_POLICY, AclPolicy, AclRole, AclToken, CLIENT, MANAGEMENT, PolicyLink, RoleLink, go_duration,
};
pub use policy::{
    LabelledRule, Level, NAMESPACE_CAPABILITIES, NAMESPACE_READ, NAMESPACE_WRITE_EXTRA, NamespaceRule, PathRule, Policy, PolicyError,
    valid_namespace_label, valid_node_pool_label, valid_policy_name,
};
pub use resolve::{AuthError, Identity, policy_names, resolve, resolve_workload};

#[cfg(test)]
mod tests;

/// The server's ACL settings (the agent's `acl {}` block).
#[derive(Debug, Clone)]
pub struct AclConfig {
    /// Enforce ACLs. Off: every route is open and `/v1/acl/*` answers `ACL support disabled`.
    pub enabled: bool,
    /// Shortest `ExpirationTTL` a token may be created with.
    pub token_min_expiration_ttl: std::time::Duration,
    /// Longest `ExpirationTTL` a token may be created with.
    pub token_max_expiration_ttl: std::time::Duration,
    /// `<data_dir>/server/acl-bootstrap-reset`: holds the bootstrap index to allow one more
    /// bootstrap (none in `-dev` without a data dir).
    pub bootstrap_reset_file: Option<std::path::PathBuf>,
}

impl Default for AclConfig {
    fn default() -> Self {
        AclConfig {
            enabled: false,
            token_min_expiration_ttl: std::time::Duration::from_secs(60),
            token_max_expiration_ttl: std::time::Duration::from_secs(24 * 3600),
            bootstrap_reset_file: None,
        }
    }
}
