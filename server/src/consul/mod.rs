//! What servers ask of Consul, behind two narrow traits (decision 14).
//!
//! - [`ConsulAcl`]: create a Service Identity token for a Connect task and revoke one by its
//!   accessor (`PUT /v1/acl/token`, `DELETE /v1/acl/token/:accessor`). `Node.DeriveSIToken`
//!   creates; the leader's [`revoker`] revokes the tokens of dead allocs.
//! - [`ConsulConfigEntries`]: write a gateway's config entry (`PUT /v1/config`), which
//!   `Job.Register` does synchronously for every terminating and ingress gateway of the job.
//!
//! The server crate holds only the payloads (Consul's `api` package shapes, built here from the
//! job) and the rules; the agent implements the traits over its Consul HTTP client and hands
//! them to the server when it has a `consul {}` block. Tests use [`fake::FakeConsul`].

pub mod config_entries;
pub mod fake;
pub mod revoker;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::consensus::BoxFuture;

/// `siTokenDescriptionFmt`: how Nomad describes the SI tokens it creates.
pub fn si_token_description(cluster_id: &str, alloc_id: &str, task: &str) -> String {
    format!("_nomad_si [{cluster_id}] [{alloc_id}] [{task}]")
}

/// A call to Consul that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConsulCallError {
    /// The HTTP status Consul answered with (`None`: it did not answer).
    pub status: Option<u16>,
    /// What happened, in the words of Consul's Go client (`Unexpected response code: 500 (...)`).
    pub message: String,
}

impl ConsulCallError {
    /// An error with no answer from Consul.
    pub fn unreachable(message: impl Into<String>) -> ConsulCallError {
        ConsulCallError { status: None, message: message.into() }
    }
}

/// `api.ACLServiceIdentity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclServiceIdentity {
    /// The service the token may register and act as.
    pub service_name: String,
}

/// The `api.ACLToken` fields Nomad sets when it creates an SI token (`consulACLsAPI.CreateToken`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclTokenCreate {
    /// `_nomad_si [<cluster>] [<alloc>] [<task>]`.
    pub description: String,
    /// One identity: the service named by the task's Kind (not its sidecar).
    pub service_identities: Vec<AclServiceIdentity>,
    /// Consul namespace (omitted when empty, as Go's `omitempty`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Always true: the token is local to the datacenter.
    pub local: bool,
}

/// What Consul answered for a created token (the fields of `api.ACLToken` Nomad reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CreatedToken {
    /// The token's public ID, stored in Raft.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// The secret, handed to the client and never stored.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Namespace Consul put it in.
    pub namespace: String,
}

/// Consul ACL calls the servers make.
pub trait ConsulAcl: Send + Sync + 'static {
    /// `PUT /v1/acl/token`.
    fn create_token(&self, token: AclTokenCreate) -> BoxFuture<'_, Result<CreatedToken, ConsulCallError>>;
    /// `DELETE /v1/acl/token/:accessor` in `namespace` (`?ns=`, when not empty). A token
    /// Consul does not have is an error here (`Cannot find token to delete`); the revoker
    /// counts it as revoked, as Nomad does.
    fn revoke_token<'a>(&'a self, namespace: &'a str, accessor_id: &'a str) -> BoxFuture<'a, Result<(), ConsulCallError>>;
}

/// Consul config entry writes the servers make.
pub trait ConsulConfigEntries: Send + Sync + 'static {
    /// `PUT /v1/config` (with `?ns=` of the entry's namespace, when not empty): creates or
    /// replaces the entry.
    fn set_config_entry<'a>(&'a self, entry: &'a config_entries::ConfigEntry) -> BoxFuture<'a, Result<(), ConsulCallError>>;
}

/// The server's handles to Consul: both absent when the agent has no `consul {}` block.
#[derive(Clone, Default)]
pub struct ConsulHandles {
    /// SI tokens.
    pub acl: Option<Arc<dyn ConsulAcl>>,
    /// Config entries.
    pub config_entries: Option<Arc<dyn ConsulConfigEntries>>,
}

impl ConsulHandles {
    /// Both handles from one implementation.
    pub fn from<T: ConsulAcl + ConsulConfigEntries>(consul: Arc<T>) -> ConsulHandles {
        ConsulHandles { acl: Some(consul.clone()), config_entries: Some(consul) }
    }
}

impl std::fmt::Debug for ConsulHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulHandles").field("acl", &self.acl.is_some()).field("config_entries", &self.config_entries.is_some()).finish()
    }
}

#[cfg(test)]
mod tests;
