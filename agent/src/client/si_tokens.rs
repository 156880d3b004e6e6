//! `Node.DeriveSIToken` from the client: the `consul_si_token` hook's [`SiTokenDeriver`] over
//! the server list, authenticated by the node's SecretID (Nomad's `Client.deriveSIToken`).
//! A server's refusal (the reply's `Error`, or a refused call) is final; a call no server could
//! answer is retried by the hook.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use nomad_proto::rpc::{DeriveSiTokenRequest, SignIdentitiesRequest};

use super::servers::Servers;
use super::taskrunner::hooks::consul_si_token::{DeriveError, SiTokenDeriver};

/// One derive call may take this long (the servers call Consul once per task, in parallel).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// See the module docs.
pub struct RpcSiTokens {
    servers: Arc<Servers>,
    node_id: String,
    secret_id: String,
    region: String,
}

impl RpcSiTokens {
    /// Calls as node `node_id` with its secret.
    pub fn new(servers: Arc<Servers>, node_id: &str, secret_id: &str, region: &str) -> RpcSiTokens {
        RpcSiTokens { servers, node_id: node_id.into(), secret_id: secret_id.into(), region: region.into() }
    }
}

impl SiTokenDeriver for RpcSiTokens {
    fn derive(&self, alloc_id: String, tasks: Vec<String>) -> BoxFuture<'static, Result<BTreeMap<String, String>, DeriveError>> {
        let servers = self.servers.clone();
        let req = DeriveSiTokenRequest {
            node_id: self.node_id.clone(),
            secret_id: self.secret_id.clone(),
            alloc_id,
            tasks,
            region: self.region.clone(),
        };
        Box::pin(async move {
            match servers.node(CALL_TIMEOUT, |mut c| async move { c.derive_si_token(req).await }).await {
                Ok(resp) => {
                    if let Some(e) = resp.error {
                        return Err(DeriveError::Refused(e.err));
                    }
                    if resp.tokens.is_empty() {
                        return Err(DeriveError::Refused("failed to derive SI tokens: invalid response".into()));
                    }
                    Ok(resp.tokens)
                }
                Err(e) if e.is_unreachable() || e.is_no_leader() => Err(DeriveError::Unreachable(format!("DeriveSIToken RPC failed: {e}"))),
                Err(e) => Err(DeriveError::Refused(format!("DeriveSIToken RPC failed: {e}"))),
            }
        })
    }
}

/// `Node.SignIdentities` through the same seam: workload identities by task, for the `identity`
/// hook. Refusals are final; a call no server could answer is retried by the hook.
pub struct RpcIdentities(RpcSiTokens);

impl RpcIdentities {
    /// Calls as node `node_id` with its secret.
    pub fn new(servers: Arc<Servers>, node_id: &str, secret_id: &str, region: &str) -> RpcIdentities {
        RpcIdentities(RpcSiTokens::new(servers, node_id, secret_id, region))
    }
}

impl SiTokenDeriver for RpcIdentities {
    fn derive(&self, alloc_id: String, tasks: Vec<String>) -> BoxFuture<'static, Result<BTreeMap<String, String>, DeriveError>> {
        let servers = self.0.servers.clone();
        let req = SignIdentitiesRequest {
            node_id: self.0.node_id.clone(),
            secret_id: self.0.secret_id.clone(),
            alloc_id,
            tasks,
            region: self.0.region.clone(),
        };
        Box::pin(async move {
            match servers.node(CALL_TIMEOUT, |mut c| async move { c.sign_identities(req).await }).await {
                Ok(resp) => match resp.error {
                    Some(e) if e.recoverable => Err(DeriveError::Unreachable(e.err)),
                    Some(e) => Err(DeriveError::Refused(e.err)),
                    None => Ok(resp.identities),
                },
                Err(e) if e.is_unreachable() || e.is_no_leader() => {
                    Err(DeriveError::Unreachable(format!("SignIdentities RPC failed: {e}")))
                }
                Err(e) => Err(DeriveError::Refused(format!("SignIdentities RPC failed: {e}"))),
            }
        })
    }
}
