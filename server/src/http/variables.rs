//! `/v1/vars`, `/v1/var/<path>` (Nomad Variables) and `/v1/operator/keyring/*` (root keys).
//!
//! Items are encrypted by the keyring before the Raft write and decrypted for each read; lists
//! and events carry metadata only. With ACLs on, the middleware resolves the caller
//! ([`super::authz::Need::Variable`]) and these handlers apply the token's `variables` path
//! rules: `read` to get, `list` per listed variable, `write` to put, `destroy` to delete. A
//! check-and-set conflict answers 409 with the current variable, its items left out unless the
//! caller may read it.

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use nomad_proto::variables::{RootKeyMeta, Variable, VariableMetadata, root_key_state};

use super::HttpState;
use super::authz::Caller;
use super::util::{HttpError, HttpResult, QueryOptions, decode_body, json_response, list_response, paginate, read_body, require_method};
use crate::consensus::ApplyError;
use crate::fsm::Command;
use crate::keyring::KeyringError;
use crate::state::{CAS_CONFLICT, State as ClusterState, Table, VarOp};

fn internal(message: impl Into<String>) -> HttpError {
    HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: message.into() }
}

fn keyring_error(e: KeyringError) -> HttpError {
    internal(e.to_string())
}

fn permission_denied() -> HttpError {
    HttpError { code: StatusCode::FORBIDDEN, message: "Permission denied".into() }
}

/// Whether the caller may do `op` on `path` in `ns` (anyone with ACLs off).
fn allowed(caller: Option<&Caller>, ns: &str, path: &str, op: &str) -> bool {
    caller.is_none_or(|c| c.0.acl.allow_variable_op(ns, path, op))
}

/// `GET /v1/vars`: metadata of the variables under `prefix`, each one the caller may list.
pub async fn list(State(s): State<HttpState>, req: Request) -> Response {
    super::respond(async {
        let (parts, _body) = req.into_parts();
        require_method(&parts.method, &[Method::GET])?;
        let q = QueryOptions::parse(&parts.uri)?;
        let caller = parts.extensions.get::<Caller>().cloned();
        let (items, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Variables], q.min_index, q.wait, |st| {
                let items: Vec<VariableMetadata> = st
                    .variables_with_prefix(&q.namespace, &q.prefix)
                    .filter(|v| allowed(caller.as_ref(), &v.meta.namespace, &v.meta.path, "list"))
                    .map(|v| v.meta.clone())
                    .collect();
                (items, st.table_index(Table::Variables))
            })
            .await;
        let (page, next) = paginate(items, &q, |v| if q.namespace == "*" { format!("{}.{}", v.namespace, v.path) } else { v.path.clone() });
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// `/v1/var/<path>`: GET, PUT/POST (`?cas=`), DELETE (`?cas=`).
pub async fn specific(State(s): State<HttpState>, req: Request) -> Response {
    super::respond(async {
        let (parts, body) = req.into_parts();
        let q = QueryOptions::parse(&parts.uri)?;
        let caller = parts.extensions.get::<Caller>().cloned();
        let path = parts.uri.path().strip_prefix("/v1/var/").unwrap_or_default().to_string();
        let cas = match q.params.get("cas") {
            Some(v) => Some(v.parse::<u64>().map_err(|_| HttpError::bad_request(format!("failed to parse cas index {v:?}")))?),
            None => None,
        };
        match parts.method {
            Method::GET | Method::HEAD => get(&s, &q, caller.as_ref(), &path).await,
            Method::PUT | Method::POST => {
                let body = read_body(body).await?;
                put(&s, &q, caller.as_ref(), &path, &body, cas).await
            }
            Method::DELETE => delete(&s, &q, caller.as_ref(), &path, cas).await,
            _ => Err(HttpError::invalid_method()),
        }
    })
    .await
}

fn decrypted(s: &HttpState, st: &ClusterState, ns: &str, path: &str) -> Result<Option<Variable>, HttpError> {
    let Some(v) = st.variable(ns, path) else { return Ok(None) };
    let items = s.endpoints.keyring().decrypt(st, v).map_err(keyring_error)?;
    Ok(Some(Variable::from_parts(&v.meta, items)))
}

async fn get(s: &HttpState, q: &QueryOptions, caller: Option<&Caller>, path: &str) -> HttpResult {
    if q.namespace == "*" {
        return Err(HttpError::bad_request("can not target wildcard (\"*\")namespace"));
    }
    if !allowed(caller, &q.namespace, path, "read") {
        return Err(permission_denied());
    }
    let watch_ns = q.namespace.clone();
    let (found, index) = s
        .endpoints
        .store()
        .blocking_query(&[Table::Variables], q.min_index, q.wait, |st| {
            let found = st.variable(&watch_ns, path).cloned();
            let index = found.as_ref().map_or(st.table_index(Table::Variables), |v| v.meta.modify_index);
            ((found, st.clone()), index)
        })
        .await;
    let (found, st) = found;
    let Some(v) = found else {
        let mut r = HttpError::not_found("variable not found").into_response();
        r.headers_mut().insert("x-nomad-index", index.max(1).into());
        return Ok(r);
    };
    let items = s.endpoints.keyring().decrypt(&st, &v).map_err(keyring_error)?;
    json_response(&Variable::from_parts(&v.meta, items), Some(s.meta(index)), q.pretty)
}

/// The 409 of a check-and-set that did not hold: the current variable (a zero value when there
/// is none), its items only for a caller who may read it.
fn conflict(s: &HttpState, caller: Option<&Caller>, ns: &str, path: &str, pretty: bool) -> HttpResult {
    let st = s.endpoints.store().snapshot();
    let current = if allowed(caller, ns, path, "read") {
        decrypted(s, &st, ns, path)?
    } else {
        st.variable(ns, path).map(|v| Variable::from_parts(&v.meta, BTreeMap::new()))
    };
    let mut r = json_response(&current.unwrap_or_default(), Some(s.meta(st.table_index(Table::Variables))), pretty)?;
    *r.status_mut() = StatusCode::CONFLICT;
    Ok(r)
}

async fn put(s: &HttpState, q: &QueryOptions, caller: Option<&Caller>, path: &str, body: &[u8], cas: Option<u64>) -> HttpResult {
    let mut var: Variable = decode_body(body)?;
    // The body's namespace wins over `?namespace=` (as Nomad's handler decides).
    if var.namespace.is_empty() {
        var.namespace = q.namespace.clone();
    }
    var.path = path.to_string();
    if !allowed(caller, &var.namespace, path, "write") {
        return Err(permission_denied());
    }
    if var.items.is_empty() {
        return Err(HttpError::bad_request("variable missing required Items object"));
    }
    var.validate().map_err(HttpError::bad_request)?;
    let snap = s.endpoints.store().snapshot();
    if snap.namespace(&var.namespace).is_none() {
        return Err(HttpError::bad_request(format!("namespace {:?} does not exist", var.namespace)));
    }
    let meta = VariableMetadata { namespace: var.namespace.clone(), path: path.to_string(), ..VariableMetadata::default() };
    let encrypted = s.endpoints.keyring().encrypt(&snap, meta, &var.items).map_err(keyring_error)?;
    let op = cas.map_or(VarOp::Set, VarOp::Cas);
    let now = nomad_proto::Timestamp::now();
    match s.endpoints.consensus().apply(Command::VariableApply { op, variable: encrypted, now }).await {
        Ok(_) => {}
        Err(ApplyError::Refused(m)) if m.starts_with(CAS_CONFLICT) => return conflict(s, caller, &var.namespace, path, q.pretty),
        Err(ApplyError::Refused(m)) => return Err(HttpError::bad_request(m)),
        Err(e) => return Err(internal(e.to_string())),
    }
    let st = s.endpoints.store().snapshot();
    let stored = st.variable(&var.namespace, path).ok_or_else(|| internal("variable written but not found"))?;
    json_response(&Variable::from_parts(&stored.meta, var.items), Some(s.meta(stored.meta.modify_index)), q.pretty)
}

async fn delete(s: &HttpState, q: &QueryOptions, caller: Option<&Caller>, path: &str, cas: Option<u64>) -> HttpResult {
    if q.namespace == "*" {
        return Err(HttpError::bad_request("can not target wildcard (\"*\")namespace"));
    }
    if !allowed(caller, &q.namespace, path, "destroy") {
        return Err(permission_denied());
    }
    let meta = VariableMetadata { namespace: q.namespace.clone(), path: path.to_string(), ..VariableMetadata::default() };
    let variable = crate::keyring::EncryptedVariable { meta, key_id: String::new(), data: String::new() };
    let op = cas.map_or(VarOp::Delete, VarOp::DeleteCas);
    match s.endpoints.consensus().apply(Command::VariableApply { op, variable, now: nomad_proto::Timestamp::now() }).await {
        Ok(index) => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            r.headers_mut().insert("x-nomad-index", index.into());
            Ok(r)
        }
        Err(ApplyError::Refused(m)) if m.starts_with(CAS_CONFLICT) => conflict(s, caller, &q.namespace, path, q.pretty),
        Err(ApplyError::Refused(m)) => Err(HttpError::bad_request(m)),
        Err(e) => Err(internal(e.to_string())),
    }
}

/// `/v1/operator/keyring/keys` (GET), `/rotate` (PUT/POST, `?full=true`), `/key/<id>` (DELETE).
pub async fn keyring(State(s): State<HttpState>, req: Request) -> Response {
    super::respond(async {
        let (parts, _body) = req.into_parts();
        let q = QueryOptions::parse(&parts.uri)?;
        let rest = parts.uri.path().strip_prefix("/v1/operator/keyring/").unwrap_or_default().to_string();
        let segs: Vec<&str> = rest.split('/').collect();
        match (segs.as_slice(), &parts.method) {
            (["keys"], &Method::GET) => {
                let st = s.endpoints.store().snapshot();
                let keys: Vec<&RootKeyMeta> = st.root_keys().map(|k| &k.meta).collect();
                json_response(&keys, Some(s.meta(st.table_index(Table::RootKeys))), q.pretty)
            }
            (["rotate"], &Method::PUT | &Method::POST) => rotate(&s, &q).await,
            (["key", id], &Method::DELETE) if !id.is_empty() => {
                let index =
                    s.endpoints.consensus().apply(Command::RootKeyDelete { key_id: id.to_string() }).await.map_err(|e| match e {
                        ApplyError::Refused(m) if m.contains("not found") => HttpError::not_found(m),
                        ApplyError::Refused(m) => HttpError::bad_request(m),
                        other => internal(other.to_string()),
                    })?;
                json_response(&serde_json::json!({ "Index": index }), Some(s.meta(index)), q.pretty)
            }
            (["keys"] | ["rotate"] | ["key", _], _) => Err(HttpError::invalid_method()),
            _ => Err(HttpError::not_found("resource not found")),
        }
    })
    .await
}

/// A new active key; with `full`, every older key that encrypts variables is marked rekeying
/// and the leader re-encrypts them in the background.
async fn rotate(s: &HttpState, q: &QueryOptions) -> HttpResult {
    let full = q.bool("full", false)?;
    let key = s.endpoints.keyring().generate(nomad_proto::Timestamp::now(), root_key_state::ACTIVE);
    let key_id = key.meta.key_id.clone();
    let apply_err = |e: ApplyError| internal(e.to_string());
    let mut index = s.endpoints.consensus().apply(Command::RootKeyUpsert { key }).await.map_err(apply_err)?;
    if full {
        let st = s.endpoints.store().snapshot();
        let old: Vec<String> = st
            .root_keys()
            .filter(|k| k.meta.key_id != key_id && k.meta.state == root_key_state::INACTIVE && st.variables_using_key(&k.meta.key_id) > 0)
            .map(|k| k.meta.key_id.clone())
            .collect();
        for id in old {
            let cmd = Command::RootKeySetState { key_id: id, state: root_key_state::REKEYING.into() };
            index = s.endpoints.consensus().apply(cmd).await.map_err(apply_err)?;
        }
    }
    let st = s.endpoints.store().snapshot();
    let meta = st.root_key(&key_id).map(|k| k.meta.clone()).ok_or_else(|| internal("root key written but not found"))?;
    json_response(&serde_json::json!({ "Key": meta, "Index": index }), Some(s.meta(index)), q.pretty)
}
