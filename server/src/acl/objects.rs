//! The stored ACL objects in Nomad's JSON shapes: policies, tokens, roles.

use base64::Engine as _;
use blake2::Digest as _;
use nomad_proto::Timestamp;
use serde::{Deserialize, Serialize};

/// AccessorID of the token an empty secret resolves to.
pub const ANONYMOUS_ACCESSOR: &str = "anonymous";
/// The policy the anonymous token carries.
pub const ANONYMOUS_POLICY: &str = "anonymous";
/// `Type` of a token that is allowed everything.
pub const MANAGEMENT: &str = "management";
/// `Type` of a token limited to its policies and roles.
pub const CLIENT: &str = "client";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn blake2b256(parts: &[&[u8]]) -> String {
    let mut h = blake2::Blake2b256::new();
    for p in parts {
        h.update(p);
    }
    b64(&h.finalize())
}

/// An ACL policy (`structs.ACLPolicy`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AclPolicy {
    /// Name (`^[a-zA-Z0-9-]{1,128}$`).
    pub name: String,
    /// Description (≤256).
    pub description: String,
    /// The HCL or JSON rules.
    pub rules: String,
    /// Parsed rules as JSON (not kept; Nomad sends null).
    #[serde(rename = "RulesJSON")]
    pub rules_json: Option<serde_json::Value>,
    /// Workload-identity attachment (unused here; kept for the shape).
    #[serde(rename = "JobACL")]
    pub job_acl: Option<serde_json::Value>,
    /// blake2b-256 of name, description and rules, base64.
    pub hash: String,
    /// Raft index of creation.
    pub create_index: u64,
    /// Raft index of the last change.
    pub modify_index: u64,
}

impl AclPolicy {
    /// Sets [`AclPolicy::hash`].
    pub fn set_hash(&mut self) {
        self.hash = blake2b256(&[self.name.as_bytes(), self.description.as_bytes(), self.rules.as_bytes()]);
    }

    /// The list stub.
    pub fn stub(&self) -> serde_json::Value {
        serde_json::json!({
            "Name": self.name, "Description": self.description, "Hash": self.hash,
            "CreateIndex": self.create_index, "ModifyIndex": self.modify_index,
        })
    }
}

/// A role link on a token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RoleLink {
    /// Role ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Role name.
    pub name: String,
}

/// An ACL token (`structs.ACLToken`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AclToken {
    /// Public ID (UUID).
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// Bearer secret (UUID).
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Name (≤256).
    pub name: String,
    /// `client` or `management`.
    #[serde(rename = "Type")]
    pub token_type: String,
    /// Policy names.
    pub policies: Vec<String>,
    /// Roles.
    pub roles: Vec<RoleLink>,
    /// Replicated to every region.
    pub global: bool,
    /// blake2b-256 of name, type, policies, global/local and role IDs, base64.
    pub hash: String,
    /// Creation time (UTC).
    pub create_time: Timestamp,
    /// Expiry; unset (null) = never.
    #[serde(with = "optional_time")]
    pub expiration_time: Option<Timestamp>,
    /// Create-only: lifetime requested, a Go duration string (or integer nanoseconds) in, a
    /// string out ("" when unset).
    #[serde(rename = "ExpirationTTL", with = "go_duration")]
    pub expiration_ttl: i64,
    /// Raft index of creation.
    pub create_index: u64,
    /// Raft index of the last change.
    pub modify_index: u64,
}

impl AclToken {
    /// Sets [`AclToken::hash`].
    pub fn set_hash(&mut self) {
        let mut parts: Vec<&[u8]> = vec![self.name.as_bytes(), self.token_type.as_bytes()];
        for p in &self.policies {
            parts.push(p.as_bytes());
        }
        parts.push(if self.global { b"global" } else { b"local" });
        for r in &self.roles {
            parts.push(r.id.as_bytes());
        }
        self.hash = blake2b256(&parts);
    }

    /// Whether this token expired at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expiration_time.is_some_and(|t| !t.is_zero() && t < now)
    }

    /// Whether this is a management token.
    pub fn is_management(&self) -> bool {
        self.token_type == MANAGEMENT
    }

    /// The anonymous token an empty secret resolves to.
    pub fn anonymous() -> AclToken {
        AclToken {
            accessor_id: ANONYMOUS_ACCESSOR.into(),
            name: "Anonymous Token".into(),
            token_type: CLIENT.into(),
            policies: vec![ANONYMOUS_POLICY.into()],
            ..AclToken::default()
        }
    }

    /// The list stub: no SecretID and no ExpirationTTL.
    pub fn stub(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.remove("SecretID");
            m.remove("ExpirationTTL");
        }
        v
    }
}

/// A policy link on a role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PolicyLink {
    /// Policy name.
    pub name: String,
}

/// An ACL role (`structs.ACLRole`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AclRole {
    /// UUID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Unique name (policy-name format).
    pub name: String,
    /// Description (≤256).
    pub description: String,
    /// Policies (≥1, each must exist).
    pub policies: Vec<PolicyLink>,
    /// blake2b-256 of name, description and policy names, base64.
    pub hash: String,
    /// Raft index of creation.
    pub create_index: u64,
    /// Raft index of the last change.
    pub modify_index: u64,
}

impl AclRole {
    /// Sets [`AclRole::hash`].
    pub fn set_hash(&mut self) {
        let mut parts: Vec<&[u8]> = vec![self.name.as_bytes(), self.description.as_bytes()];
        for p in &self.policies {
            parts.push(p.name.as_bytes());
        }
        self.hash = blake2b256(&parts);
    }
}

mod optional_time {
    use nomad_proto::Timestamp;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) if !t.is_zero() => t.serialize(s),
            _ => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        Ok(Option::<Timestamp>::deserialize(d)?.filter(|t| !t.is_zero()))
    }
}

/// A Go duration as JSON: a string (or integer nanoseconds) in, a string out.
pub mod go_duration {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Formats nanoseconds as Go does for whole units (`"1h0m0s"`, `"90s"` → `"1m30s"`); "" for 0.
    pub fn format(ns: i64) -> String {
        if ns == 0 {
            return String::new();
        }
        let neg = ns < 0;
        let ns = ns.unsigned_abs();
        let secs = ns / 1_000_000_000;
        let frac = ns % 1_000_000_000;
        let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        let mut out = String::new();
        if neg {
            out.push('-');
        }
        if h > 0 {
            out.push_str(&format!("{h}h{m}m"));
        } else if m > 0 {
            out.push_str(&format!("{m}m"));
        }
        if frac == 0 {
            out.push_str(&format!("{s}s"));
        } else {
            let f = format!("{frac:09}");
            out.push_str(&format!("{s}.{}s", f.trim_end_matches('0')));
        }
        out
    }

    pub fn serialize<S: Serializer>(ns: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*ns))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Null => Ok(0),
            serde_json::Value::Number(n) => n.as_i64().ok_or_else(|| serde::de::Error::custom("ExpirationTTL: not an integer")),
            serde_json::Value::String(s) if s.is_empty() => Ok(0),
            serde_json::Value::String(s) => nomad_proto::time::parse_go_duration(&s).map_err(|e| serde::de::Error::custom(e.to_string())),
            other => Err(serde::de::Error::custom(format!("ExpirationTTL: invalid value {other}"))),
        }
    }
}
