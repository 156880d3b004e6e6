//! The agent's `acl {}` block and `-acl-enabled` (Nomad's `ACLConfig`, v1.6.1 defaults).
//!
//! `token_ttl`, `policy_ttl` and `role_ttl` are the client agents' cache lifetimes in Nomad;
//! servers ignore them. A nomad-rs client-only agent caches a resolved token (its policies and
//! roles expanded by the servers) for `min(token_ttl, policy_ttl)` (`crate::client::acl`);
//! `role_ttl` is accepted and kept. `replication_token` is accepted for one region (nothing to replicate).

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::file::DurationValue;

/// `acl {}` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AclBlock {
    pub enabled: Option<bool>,
    pub token_ttl: Option<DurationValue>,
    pub policy_ttl: Option<DurationValue>,
    pub role_ttl: Option<DurationValue>,
    pub token_min_expiration_ttl: Option<DurationValue>,
    pub token_max_expiration_ttl: Option<DurationValue>,
    pub replication_token: Option<String>,
}

/// The resolved ACL settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AclSettings {
    /// Enforce ACLs.
    pub enabled: bool,
    /// Client cache lifetime of tokens (default 30s).
    pub token_ttl: Duration,
    /// Client cache lifetime of policies (default 30s).
    pub policy_ttl: Duration,
    /// Client cache lifetime of roles (default 30s).
    pub role_ttl: Duration,
    /// Shortest token expiry at create (default 1m).
    pub token_min_expiration_ttl: Duration,
    /// Longest token expiry at create (default 24h).
    pub token_max_expiration_ttl: Duration,
}

impl Default for AclSettings {
    fn default() -> Self {
        AclSettings {
            enabled: false,
            token_ttl: Duration::from_secs(30),
            policy_ttl: Duration::from_secs(30),
            role_ttl: Duration::from_secs(30),
            token_min_expiration_ttl: Duration::from_secs(60),
            token_max_expiration_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl AclSettings {
    /// Resolves the block; `flag_enabled` is `-acl-enabled`.
    pub fn resolve(block: Option<AclBlock>, flag_enabled: bool) -> Result<AclSettings, ConfigError> {
        let b = block.unwrap_or_default();
        let d = AclSettings::default();
        let s = AclSettings {
            enabled: flag_enabled || b.enabled.unwrap_or(false),
            token_ttl: b.token_ttl.map_or(d.token_ttl, |v| v.0),
            policy_ttl: b.policy_ttl.map_or(d.policy_ttl, |v| v.0),
            role_ttl: b.role_ttl.map_or(d.role_ttl, |v| v.0),
            token_min_expiration_ttl: b.token_min_expiration_ttl.map_or(d.token_min_expiration_ttl, |v| v.0),
            token_max_expiration_ttl: b.token_max_expiration_ttl.map_or(d.token_max_expiration_ttl, |v| v.0),
        };
        if s.token_min_expiration_ttl > s.token_max_expiration_ttl {
            return Err(ConfigError::Invalid {
                path: "(config)".into(),
                key: "acl.token_min_expiration_ttl".into(),
                message: "must not exceed acl.token_max_expiration_ttl".into(),
            });
        }
        Ok(s)
    }

    /// The server's view of these settings; the bootstrap reset file is
    /// `acl-bootstrap-reset` in the server's data dir (`<data_dir>/server` by default).
    pub fn for_server(&self, server_data_dir: &std::path::Path) -> nomad_server::acl::AclConfig {
        nomad_server::acl::AclConfig {
            enabled: self.enabled,
            token_min_expiration_ttl: self.token_min_expiration_ttl,
            token_max_expiration_ttl: self.token_max_expiration_ttl,
            bootstrap_reset_file: Some(server_data_dir.join("acl-bootstrap-reset")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_flag_and_bounds() {
        let d = AclSettings::resolve(None, false).unwrap();
        assert_eq!(d, AclSettings::default());
        assert!(AclSettings::resolve(None, true).unwrap().enabled);
        let b = AclBlock {
            enabled: Some(true),
            token_min_expiration_ttl: Some(DurationValue(Duration::from_secs(5))),
            token_max_expiration_ttl: Some(DurationValue(Duration::from_secs(50))),
            ..AclBlock::default()
        };
        let s = AclSettings::resolve(Some(b), false).unwrap();
        assert!(s.enabled && s.token_min_expiration_ttl == Duration::from_secs(5) && s.token_max_expiration_ttl == Duration::from_secs(50));
        let bad = AclBlock { token_min_expiration_ttl: Some(DurationValue(Duration::from_secs(3600 * 48))), ..AclBlock::default() };
        assert!(AclSettings::resolve(Some(bad), false).is_err());
        let cfg = s.for_server(std::path::Path::new("/d/server"));
        assert_eq!(cfg.bootstrap_reset_file.unwrap(), std::path::Path::new("/d/server/acl-bootstrap-reset"));
    }
}
