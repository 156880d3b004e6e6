//! Resolving a caller's secret to its token and compiled [`Acl`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use nomad_proto::Timestamp;

use super::{Acl, AclPolicy, AclToken, Policy};
use crate::keyring::Keyring;
use crate::state::State;

/// Why a secret was refused; the texts are Nomad's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token has this secret (403).
    #[error("ACL token not found")]
    NotFound,
    /// The token expired (403 on routes, as Nomad masks it).
    #[error("ACL token expired")]
    Expired,
    /// The secret is not an ACL token at all (a node's SecretID): 403.
    #[error("Permission denied")]
    Denied,
}

/// Who is calling: the token and what it may do.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The token (the anonymous one for an empty secret).
    pub token: Arc<AclToken>,
    /// Its compiled ACL.
    pub acl: Arc<Acl>,
}

/// Resolves `secret` against `state` at `now`: an empty secret is the anonymous token; a node's
/// SecretID is refused (node identities are not HTTP callers); an unknown secret is
/// `ACL token not found`; an expired token is `ACL token expired`. A JWT is a workload identity
/// (see [`resolve_workload`]).
pub fn resolve(state: &State, keyring: &Keyring, secret: &str, now: Timestamp) -> Result<Identity, AuthError> {
    if secret.split('.').count() == 3 {
        return resolve_workload(state, keyring, secret);
    }
    let token = if secret.is_empty() {
        Arc::new(AclToken::anonymous())
    } else {
        match state.acl_token_by_secret(secret) {
            Some(t) => t.clone(),
            None if state.nodes().any(|n| !n.secret_id.is_empty() && n.secret_id == secret) => return Err(AuthError::Denied),
            None => return Err(AuthError::NotFound),
        }
    };
    if token.expired(now) {
        return Err(AuthError::Expired);
    }
    let acl = if token.is_management() { Arc::new(Acl::management()) } else { compile_for(state, &token) };
    Ok(Identity { token, acl })
}

/// A workload identity: a JWT this cluster's keyring signed, for an alloc that exists and has not
/// finished on its client (valid only while the alloc runs). Its ACL is the implicit workload
/// access of its job, group and task (the job is the parent of a dispatched or periodic child,
/// as the claim says). A signature that does not verify is `ACL token not found`; a finished
/// or unknown alloc, or claims that do not match it, `Permission denied`.
pub fn resolve_workload(state: &State, keyring: &Keyring, jwt: &str) -> Result<Identity, AuthError> {
    let claims = keyring.verify(state, jwt).map_err(|_| AuthError::NotFound)?;
    let claim = |k: &str| claims.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let (alloc_id, task, job, ns) = (claim("nomad_allocation_id"), claim("nomad_task"), claim("nomad_job_id"), claim("nomad_namespace"));
    let alloc = state.alloc(&alloc_id).ok_or(AuthError::Denied)?;
    let runs_task = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)).is_some_and(|g| g.lookup_task(&task).is_some());
    if alloc.client_terminal() || alloc.namespace != ns || !runs_task {
        return Err(AuthError::Denied);
    }
    let token = Arc::new(AclToken {
        accessor_id: String::new(),
        name: format!("workload identity of task {task:?} of alloc {alloc_id}"),
        token_type: super::CLIENT.into(),
        ..AclToken::default()
    });
    Ok(Identity { token, acl: Arc::new(Acl::workload(&ns, &job, &alloc.task_group, &task)) })
}

/// The names of the policies a token carries, directly or through its roles (deduplicated).
pub fn policy_names(state: &State, token: &AclToken) -> Vec<String> {
    let mut names: Vec<String> = token.policies.clone();
    for link in &token.roles {
        if let Some(role) = state.acl_role(&link.id) {
            names.extend(role.policies.iter().map(|p| p.name.clone()));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Compiled ACLs by the policy objects they came from: parsing a policy's HCL on every request
/// would cost more than the request. A stored policy is never changed in place (an update is a
/// new `Arc`), so the objects' addresses name their contents; the cache holds the `Arc`s, so an
/// address cannot be reused for other rules while its entry lives.
struct CompiledCache {
    entries: HashMap<Vec<usize>, CompiledEntry>,
}

/// The policies an ACL was compiled from (held, so their addresses stay theirs) and the ACL.
type CompiledEntry = (Vec<Arc<AclPolicy>>, Arc<Acl>);

/// Most policy sets kept compiled (Nomad keeps 512 too); when full the cache starts over.
const COMPILED_CACHE_ENTRIES: usize = 512;

fn compiled_cache() -> &'static Mutex<CompiledCache> {
    static CACHE: OnceLock<Mutex<CompiledCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(CompiledCache { entries: HashMap::new() }))
}

fn compile_for(state: &State, token: &AclToken) -> Arc<Acl> {
    // Missing policies grant nothing; stored ones were validated on write.
    let policies: Vec<Arc<AclPolicy>> = policy_names(state, token).iter().filter_map(|n| state.acl_policy(n)).cloned().collect();
    let key: Vec<usize> = policies.iter().map(|p| Arc::as_ptr(p) as usize).collect();
    if let Some((_, acl)) = compiled_cache().lock().unwrap_or_else(|e| e.into_inner()).entries.get(&key) {
        return acl.clone();
    }
    let parsed: Vec<Policy> = policies.iter().filter_map(|p| Policy::parse(&p.rules).ok()).collect();
    let acl = Arc::new(Acl::compile(&parsed));
    let mut cache = compiled_cache().lock().unwrap_or_else(|e| e.into_inner());
    if cache.entries.len() >= COMPILED_CACHE_ENTRIES {
        cache.entries.clear();
    }
    cache.entries.insert(key, (policies, acl.clone()));
    acl
}
