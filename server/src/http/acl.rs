//! `/v1/acl/*`: bootstrap, policies, tokens and roles, in Nomad's shapes and texts.
//!
//! Who may call what is decided by `authz.rs` before these handlers run; reads open to any token
//! narrow here what a non-management caller sees (its own policies, roles and token). Writes go
//! through Raft as one command each.

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::HttpState;
use super::authz::{Caller, request_secret};
use super::util::{HttpError, HttpResult, QueryOptions, decode_body, json_response, read_body};
use crate::acl::{
    AclConfig, AclPolicy, AclRole, AclToken, AuthError, CLIENT, MANAGEMENT, Policy, RoleLink, policy_names, valid_policy_name,
};
use crate::consensus::ApplyError;
use crate::fsm::Command;
use crate::state::State as ClusterState;

/// Every `/v1/acl/...` route.
pub async fn acl_route(State(s): State<HttpState>, req: Request) -> Response {
    super::respond(handle(s, req)).await
}

fn forbidden(msg: &str) -> HttpError {
    HttpError { code: StatusCode::FORBIDDEN, message: msg.into() }
}

fn apply_error(e: ApplyError) -> HttpError {
    match e {
        ApplyError::Refused(m) if m.contains("not found") => HttpError::not_found(m),
        ApplyError::Refused(m) => HttpError::bad_request(m),
        other => HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: other.to_string() },
    }
}

async fn handle(s: HttpState, req: Request) -> HttpResult {
    let cfg = s.endpoints.acl_config().clone();
    if !cfg.enabled {
        return Err(HttpError::bad_request("ACL support disabled"));
    }
    let (parts, body) = req.into_parts();
    let q = QueryOptions::parse(&parts.uri)?;
    let caller = parts.extensions.get::<Caller>().cloned();
    let path = parts.uri.path().strip_prefix("/v1/acl/").unwrap_or_default().to_string();
    let segs: Vec<&str> = path.split('/').collect();
    let m = parts.method.clone();
    let write = m == Method::PUT || m == Method::POST;
    let body = if write { read_body(body).await? } else { Default::default() };
    let snap = s.endpoints.store().snapshot();
    let mgmt = caller.as_ref().is_some_and(|c| c.0.token.is_management());
    let own_policies = caller.as_ref().map(|c| policy_names(&snap, &c.0.token)).unwrap_or_default();
    match (segs.as_slice(), &m) {
        (["bootstrap"], _) if write => bootstrap(&s, &cfg, &snap, &body).await,
        (["policies"], &Method::GET) => {
            let list: Vec<_> = snap
                .acl_policies()
                .filter(|p| p.name.starts_with(&q.prefix) && (mgmt || own_policies.contains(&p.name)))
                .map(|p| p.stub())
                .collect();
            json_response(&list, Some(s.meta(snap.table_index(crate::state::Table::AclPolicies))), q.pretty)
        }
        (["policy", name], &Method::GET) => {
            if !(mgmt || own_policies.iter().any(|p| p == name) || *name == crate::acl::ANONYMOUS_POLICY) {
                return Err(forbidden("Permission denied"));
            }
            let p = snap.acl_policy(name).ok_or_else(|| HttpError::not_found("ACL policy not found"))?;
            json_response(&**p, Some(s.meta(p.modify_index)), q.pretty)
        }
        (["policy", name], _) if write => {
            let mut p: AclPolicy = decode_body(&body)?;
            if p.name.is_empty() {
                p.name = name.to_string();
            }
            if p.name != *name {
                return Err(HttpError::bad_request("ACL policy name does not match request path"));
            }
            if !valid_policy_name(&p.name) {
                return Err(HttpError::bad_request(format!("invalid name '{}'", p.name)));
            }
            if p.description.len() > 256 {
                return Err(HttpError::bad_request("description longer than 256"));
            }
            Policy::parse(&p.rules).map_err(|e| HttpError::bad_request(e.0))?;
            p.rules_json = None;
            p.job_acl = None;
            let index = s.endpoints.consensus().apply(Command::AclPolicyUpsert { policies: vec![p] }).await.map_err(apply_error)?;
            ack(&s, index)
        }
        (["policy", name], &Method::DELETE) => {
            if snap.acl_policy(name).is_none() {
                return Err(HttpError::not_found("ACL policy not found"));
            }
            let index =
                s.endpoints.consensus().apply(Command::AclPolicyDelete { names: vec![name.to_string()] }).await.map_err(apply_error)?;
            ack(&s, index)
        }
        (["tokens"], &Method::GET) => {
            let list: Vec<_> = snap.acl_tokens().filter(|t| t.accessor_id.starts_with(&q.prefix)).map(|t| t.stub()).collect();
            json_response(&list, Some(s.meta(snap.table_index(crate::state::Table::AclTokens))), q.pretty)
        }
        (["token"], _) if write => {
            let t: AclToken = decode_body(&body)?;
            if !t.accessor_id.is_empty() {
                return Err(HttpError::bad_request("AccessorID must be empty to create a token"));
            }
            create_token(&s, &cfg, &snap, t).await
        }
        (["token", "self"], &Method::GET) => {
            // Expiry is not checked here, as in Nomad: a caller may look at its expired token.
            let secret = request_secret(&parts.headers);
            match crate::acl::resolve(&snap, s.endpoints.keyring(), &secret, nomad_proto::Timestamp::ZERO) {
                Ok(id) => json_response(&*id.token, Some(s.meta(id.token.modify_index)), q.pretty),
                Err(AuthError::NotFound) | Err(AuthError::Expired) => Err(HttpError::not_found("ACL token not found")),
                Err(AuthError::Denied) => Err(forbidden("Permission denied")),
            }
        }
        (["token", accessor], &Method::GET) => {
            let own = caller.as_ref().is_some_and(|c| c.0.token.accessor_id == *accessor);
            if !(mgmt || own) {
                return Err(forbidden("Permission denied"));
            }
            let t = snap.acl_token(accessor).ok_or_else(|| HttpError::not_found("ACL token not found"))?;
            json_response(&**t, Some(s.meta(t.modify_index)), q.pretty)
        }
        (["token", accessor], _) if write => {
            let t: AclToken = decode_body(&body)?;
            if !t.accessor_id.is_empty() && t.accessor_id != *accessor {
                return Err(HttpError::bad_request("Token AccessorID does not match request path"));
            }
            update_token(&s, &snap, accessor, t).await
        }
        (["token", accessor], &Method::DELETE) => {
            if snap.acl_token(accessor).is_none() {
                return Err(HttpError::not_found("ACL token not found"));
            }
            let index = s
                .endpoints
                .consensus()
                .apply(Command::AclTokenDelete { accessor_ids: vec![accessor.to_string()] })
                .await
                .map_err(apply_error)?;
            ack(&s, index)
        }
        (["roles"], &Method::GET) => {
            let own: Vec<&str> = caller.as_ref().map(|c| c.0.token.roles.iter().map(|l| l.id.as_str()).collect()).unwrap_or_default();
            let list: Vec<AclRole> = snap
                .acl_roles()
                .filter(|r| r.name.starts_with(&q.prefix) && (mgmt || own.contains(&r.id.as_str())))
                .map(|r| (**r).clone())
                .collect();
            json_response(&list, Some(s.meta(snap.table_index(crate::state::Table::AclRoles))), q.pretty)
        }
        (["role"], _) if write => {
            let r: AclRole = decode_body(&body)?;
            if !r.id.is_empty() {
                return Err(HttpError::bad_request("ID must be empty to create a role"));
            }
            upsert_role(&s, &snap, AclRole { id: uuid::Uuid::new_v4().to_string(), ..r }).await
        }
        (["role", "name", name], &Method::GET) => {
            let r = snap.acl_role_by_name(name).ok_or_else(|| HttpError::not_found("ACL role not found"))?;
            read_role(&s, &caller, mgmt, r, q.pretty)
        }
        (["role", id], &Method::GET) => {
            let r = snap.acl_role(id).ok_or_else(|| HttpError::not_found("ACL role not found"))?;
            read_role(&s, &caller, mgmt, r, q.pretty)
        }
        (["role", id], _) if write => {
            let mut r: AclRole = decode_body(&body)?;
            if r.id.is_empty() {
                r.id = id.to_string();
            }
            if r.id != *id {
                return Err(HttpError::bad_request("ACL role ID does not match request path"));
            }
            if snap.acl_role(id).is_none() {
                return Err(HttpError::not_found("ACL role not found"));
            }
            upsert_role(&s, &snap, r).await
        }
        (["role", id], &Method::DELETE) => {
            if snap.acl_role(id).is_none() {
                return Err(HttpError::not_found("ACL role not found"));
            }
            let index = s.endpoints.consensus().apply(Command::AclRoleDelete { ids: vec![id.to_string()] }).await.map_err(apply_error)?;
            ack(&s, index)
        }
        (["bootstrap" | "policies" | "policy" | "tokens" | "token" | "roles" | "role", ..], _) => Err(HttpError::invalid_method()),
        _ => Err(HttpError::not_found(super::NOT_FOUND_TEXT.trim_end())),
    }
}

/// A write's answer: `{"Index": n}` with the index header (python-nomad decodes every 2xx body).
fn ack(s: &HttpState, index: u64) -> HttpResult {
    json_response(&serde_json::json!({ "Index": index }), Some(s.meta(index)), false)
}

fn read_role(s: &HttpState, caller: &Option<Caller>, mgmt: bool, r: &AclRole, pretty: bool) -> HttpResult {
    let linked = caller.as_ref().is_some_and(|c| c.0.token.roles.iter().any(|l| l.id == r.id));
    if !(mgmt || linked) {
        return Err(forbidden("Permission denied"));
    }
    json_response(r, Some(s.meta(r.modify_index)), pretty)
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "PascalCase")]
struct BootstrapRequest {
    bootstrap_secret: String,
}

async fn bootstrap(s: &HttpState, cfg: &AclConfig, snap: &ClusterState, body: &[u8]) -> HttpResult {
    let req: BootstrapRequest = if body.iter().all(u8::is_ascii_whitespace) { BootstrapRequest::default() } else { decode_body(body)? };
    if !req.bootstrap_secret.is_empty() && uuid::Uuid::parse_str(&req.bootstrap_secret).is_err() {
        return Err(HttpError::bad_request("invalid acl token"));
    }
    let done = snap.acl_bootstrap_index();
    let mut reset_index = 0;
    if done != 0 {
        let specified = cfg
            .bootstrap_reset_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|text| text.trim().parse::<u64>().ok());
        match specified {
            None => return Err(HttpError::bad_request(format!("ACL bootstrap already done (reset index: {done})"))),
            Some(n) if n != done => {
                return Err(HttpError::bad_request(format!("Invalid bootstrap reset index (specified {n}, reset index: {done})")));
            }
            Some(n) => reset_index = n,
        }
    }
    let secret = if req.bootstrap_secret.is_empty() { uuid::Uuid::new_v4().to_string() } else { req.bootstrap_secret };
    let token = AclToken {
        accessor_id: uuid::Uuid::new_v4().to_string(),
        secret_id: secret,
        name: "Bootstrap Token".into(),
        token_type: MANAGEMENT.into(),
        global: true,
        create_time: s.endpoints.now(),
        ..AclToken::default()
    };
    let accessor = token.accessor_id.clone();
    let index = s.endpoints.consensus().apply(Command::AclTokenBootstrap { token, reset_index }).await.map_err(apply_error)?;
    stored_token(s, &accessor, index)
}

fn stored_token(s: &HttpState, accessor: &str, index: u64) -> HttpResult {
    let snap = s.endpoints.store().snapshot();
    let t = snap.acl_token(accessor).ok_or_else(|| HttpError::not_found("ACL token not found"))?;
    json_response(&**t, Some(s.meta(index)), false)
}

/// Nomad's token checks shared by create and update.
fn validate_token(snap: &ClusterState, t: &mut AclToken) -> Result<(), HttpError> {
    if t.name.len() > 256 {
        return Err(HttpError::bad_request("token name too long"));
    }
    // Role links by ID or name, stored as deduplicated IDs.
    let mut links: Vec<RoleLink> = Vec::new();
    for l in &t.roles {
        let role = if !l.id.is_empty() { snap.acl_role(&l.id) } else { snap.acl_role_by_name(&l.name) };
        let Some(role) = role else {
            return Err(HttpError::bad_request(format!("cannot find role {}", if l.id.is_empty() { &l.name } else { &l.id })));
        };
        if !links.iter().any(|x| x.id == role.id) {
            links.push(RoleLink { id: role.id.clone(), name: role.name.clone() });
        }
    }
    t.roles = links;
    match t.token_type.as_str() {
        CLIENT if t.policies.is_empty() && t.roles.is_empty() => Err(HttpError::bad_request("client token missing policies or roles")),
        CLIENT => Ok(()),
        MANAGEMENT if !t.policies.is_empty() || !t.roles.is_empty() => {
            Err(HttpError::bad_request("management token cannot be associated with policies or roles"))
        }
        MANAGEMENT => Ok(()),
        _ => Err(HttpError::bad_request("token type must be client or management")),
    }
}

async fn create_token(s: &HttpState, cfg: &AclConfig, snap: &ClusterState, mut t: AclToken) -> HttpResult {
    validate_token(snap, &mut t)?;
    let now = s.endpoints.now();
    if t.expiration_ttl < 0 {
        return Err(HttpError::bad_request("token expiration TTL cannot be negative"));
    }
    if t.expiration_ttl > 0 {
        t.expiration_time = Some(now.add_nanos(t.expiration_ttl));
    }
    if let Some(exp) = t.expiration_time.filter(|e| !e.is_zero()) {
        let ahead = std::time::Duration::from_nanos(exp.unix_nanos().saturating_sub(now.unix_nanos()).max(0) as u64);
        if ahead < cfg.token_min_expiration_ttl {
            return Err(HttpError::bad_request(format!(
                "expiration time cannot be less than {} in the future",
                crate::acl::go_duration::format(cfg.token_min_expiration_ttl.as_nanos() as i64)
            )));
        }
        if ahead > cfg.token_max_expiration_ttl {
            return Err(HttpError::bad_request(format!(
                "expiration time cannot be more than {} in the future",
                crate::acl::go_duration::format(cfg.token_max_expiration_ttl.as_nanos() as i64)
            )));
        }
    }
    t.accessor_id = uuid::Uuid::new_v4().to_string();
    t.secret_id = uuid::Uuid::new_v4().to_string();
    t.create_time = now;
    let accessor = t.accessor_id.clone();
    let index = s.endpoints.consensus().apply(Command::AclTokenUpsert { tokens: vec![t] }).await.map_err(apply_error)?;
    stored_token(s, &accessor, index)
}

async fn update_token(s: &HttpState, snap: &ClusterState, accessor: &str, mut t: AclToken) -> HttpResult {
    let old = snap.acl_token(accessor).ok_or_else(|| HttpError::not_found("ACL token not found"))?;
    if t.global != old.global {
        return Err(HttpError::bad_request("cannot toggle global mode"));
    }
    if t.expiration_time.is_some_and(|e| Some(e) != old.expiration_time) || t.expiration_ttl != 0 {
        return Err(HttpError::bad_request("cannot update expiration time"));
    }
    if t.token_type.is_empty() {
        t.token_type = old.token_type.clone();
    }
    validate_token(snap, &mut t)?;
    t.accessor_id = old.accessor_id.clone();
    t.secret_id = old.secret_id.clone();
    t.expiration_time = old.expiration_time;
    t.create_time = old.create_time;
    let index = s.endpoints.consensus().apply(Command::AclTokenUpsert { tokens: vec![t] }).await.map_err(apply_error)?;
    stored_token(s, accessor, index)
}

async fn upsert_role(s: &HttpState, snap: &ClusterState, r: AclRole) -> HttpResult {
    if !valid_policy_name(&r.name) {
        return Err(HttpError::bad_request(format!("invalid name '{}'", r.name)));
    }
    if r.description.len() > 256 {
        return Err(HttpError::bad_request("description longer than 256"));
    }
    if r.policies.is_empty() {
        return Err(HttpError::bad_request("at least one policy should be specified"));
    }
    if let Some(missing) = r.policies.iter().find(|p| snap.acl_policy(&p.name).is_none()) {
        return Err(HttpError::bad_request(format!("cannot find policy {}", missing.name)));
    }
    if snap.acl_role_by_name(&r.name).is_some_and(|o| o.id != r.id) {
        return Err(HttpError::bad_request(format!("role with name {} already exists", r.name)));
    }
    let id = r.id.clone();
    let index = s.endpoints.consensus().apply(Command::AclRoleUpsert { roles: vec![r] }).await.map_err(apply_error)?;
    let snap = s.endpoints.store().snapshot();
    let r = snap.acl_role(&id).ok_or_else(|| HttpError::not_found("ACL role not found"))?;
    json_response(&**r, Some(s.meta(index)), false)
}
