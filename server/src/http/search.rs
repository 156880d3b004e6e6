//! `/v1/search` (prefix) and `/v1/search/fuzzy` (substring), as Nomad's `search_endpoint.go`
//! answers them: matches per context, at most [`PREFIX_LIMIT`] (prefix) or [`FUZZY_LIMIT`]
//! (fuzzy) each with a truncation flag, and only the contexts the caller's ACL may read (the
//! authorization row is [`super::authz::Need::Search`]).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use nomad_proto::Job;
use serde::{Deserialize, Serialize};

use super::HttpState;
use super::authz::Caller;
use super::util::{HttpError, QueryOptions, decode_body, json_response, read_body, require_method};
use crate::acl::{Acl, AuthError};
use crate::state::State as ClusterState;

/// Most matches of one context in a prefix search (Nomad's `truncateLimit`).
const PREFIX_LIMIT: usize = 20;
/// Most matches of one context in a fuzzy search (`search.limit_results`).
const FUZZY_LIMIT: usize = 100;
/// The shortest fuzzy term (`search.min_term_length`).
const FUZZY_MIN_TERM: usize = 2;
/// The longest term either search takes.
const MAX_TERM: usize = 1024;

/// The prefix search's contexts, in Nomad's order.
const PREFIX_CONTEXTS: &[&str] =
    &["jobs", "evals", "allocs", "nodes", "node_pools", "deployment", "plugins", "volumes", "scaling_policy", "vars", "namespaces"];
/// The fuzzy search's own contexts (jobs expand into groups, services, tasks, images,
/// commands and classes).
const FUZZY_CONTEXTS: &[&str] = &["jobs", "allocs", "nodes", "plugins", "namespaces"];

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct SearchRequest {
    prefix: String,
    text: String,
    context: String,
    namespace: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct SearchResponse<T> {
    matches: BTreeMap<String, Vec<T>>,
    truncations: BTreeMap<String, bool>,
}

/// One fuzzy match: what matched and where it lives (`[namespace, job, group, task]`, as deep
/// as it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
struct FuzzyMatch {
    #[serde(rename = "ID")]
    id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    scope: Vec<String>,
}

/// What the caller may see: everything with ACLs off.
struct Reader<'a> {
    acl: Option<&'a Acl>,
}

impl Reader<'_> {
    /// Nomad's `sufficientSearchPerms`: a caller with no read access of any kind in `ns`, or
    /// one asking for a context it may not read, is refused rather than shown an empty answer.
    fn sufficient(&self, ns: &str, context: &str) -> bool {
        let Some(acl) = self.acl else { return true };
        let node_read = acl.allow_node(false);
        let allow_ns = acl.allow_namespace(ns);
        let job_read = self.ns(ns, &["read-job"]);
        let volume_read = self.ns(ns, &["csi-list-volume", "csi-read-volume", "list-jobs", "read-job"]);
        if !(node_read || allow_ns || job_read || volume_read) {
            return false;
        }
        match context {
            "nodes" => node_read,
            "namespaces" => allow_ns,
            "jobs" | "allocs" | "evals" | "deployment" => job_read,
            _ => true,
        }
    }

    fn ns(&self, ns: &str, caps: &[&str]) -> bool {
        self.acl.is_none_or(|a| caps.iter().any(|c| a.allow_namespace_op(ns, c)))
    }
    /// Whether `context` may be searched in namespace `ns` at all.
    fn context(&self, context: &str, ns: &str) -> bool {
        let Some(acl) = self.acl else { return true };
        match context {
            "jobs" => self.ns(ns, &["list-jobs", "read-job"]),
            "evals" | "allocs" | "deployment" => self.ns(ns, &["read-job"]),
            "nodes" => acl.allow_node(false),
            "node_pools" => acl.allow_node_pool_op("*", "read") || acl.allow_node(false),
            "plugins" => acl.allow_plugin_list(),
            "volumes" => self.ns(ns, &["csi-list-volume", "csi-read-volume"]),
            "scaling_policy" => self.ns(ns, &["list-scaling-policies", "read-scaling-policy", "read-job"]),
            // Each variable is checked against the path rules on its own.
            "vars" | "namespaces" => true,
            _ => false,
        }
    }
}

/// `PUT|POST /v1/search`.
pub async fn prefix(State(s): State<HttpState>, caller: Option<Extension<Caller>>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let (q, req) = request(&method, &uri, body).await?;
        let term = req.prefix.as_str();
        let contexts = contexts(&req.context, PREFIX_CONTEXTS)?;
        let reader = Reader { acl: caller.as_ref().map(|Extension(Caller(id))| id.acl.as_ref()) };
        let state = s.endpoints.store().snapshot();
        let namespaces = namespaces(&state, &q, &req, &reader);
        if namespaces.iter().all(|ns| !reader.sufficient(ns, &req.context)) {
            return Err(HttpError { code: StatusCode::FORBIDDEN, message: AuthError::Denied.to_string() });
        }
        let mut resp = SearchResponse { matches: BTreeMap::new(), truncations: BTreeMap::new() };
        for ctx in contexts {
            let ids = prefix_matches(&state, ctx, term, &namespaces, &reader);
            let truncated = ids.len() > PREFIX_LIMIT;
            resp.matches.insert(ctx.to_string(), ids.into_iter().take(PREFIX_LIMIT).collect());
            resp.truncations.insert(ctx.to_string(), truncated);
        }
        json_response(&resp, Some(s.meta(state.index)), q.pretty)
    })
    .await
}

/// `PUT|POST /v1/search/fuzzy`.
pub async fn fuzzy(State(s): State<HttpState>, caller: Option<Extension<Caller>>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let (q, req) = request(&method, &uri, body).await?;
        let text = req.text.as_str();
        let all = req.context == "all";
        let contexts = contexts(&req.context, FUZZY_CONTEXTS)?;
        let reader = Reader { acl: caller.as_ref().map(|Extension(Caller(id))| id.acl.as_ref()) };
        let state = s.endpoints.store().snapshot();
        let namespaces = namespaces(&state, &q, &req, &reader);
        // A wildcard search is filtered object by object instead.
        let wildcard = namespace_of(&q, &req) == "*";
        if !wildcard && namespaces.iter().all(|ns| !reader.sufficient(ns, &req.context)) {
            return Err(HttpError { code: StatusCode::FORBIDDEN, message: AuthError::Denied.to_string() });
        }
        // After the permission check, as Nomad.
        if text.chars().count() < FUZZY_MIN_TERM {
            return Err(HttpError::bad_request(format!(
                "fuzzy search query must be at least {FUZZY_MIN_TERM} characters, got {}",
                text.chars().count()
            )));
        }
        let mut found: BTreeMap<String, Vec<FuzzyMatch>> = BTreeMap::new();
        let mut truncations: BTreeMap<String, bool> = BTreeMap::new();
        let needle = text.to_lowercase();
        for ctx in contexts {
            // Every context searched has a truncation entry, matches or not (as Nomad).
            truncations.insert(ctx.to_string(), false);
            fuzzy_matches(&state, ctx, &needle, &namespaces, &reader, &mut found);
        }
        // "all" adds prefix matches of the UUID-named objects.
        if all {
            for ctx in ["evals", "deployment", "volumes"] {
                let ids = prefix_matches(&state, ctx, text, &namespaces, &reader);
                found.entry(ctx.into()).or_default().extend(ids.into_iter().map(|id| FuzzyMatch { id, scope: Vec::new() }));
            }
        }
        let mut resp = SearchResponse { matches: BTreeMap::new(), truncations };
        for (ctx, mut list) in found {
            // Earlier matches first, then shorter IDs, then by ID.
            list.sort_by_cached_key(|m| (m.id.to_lowercase().find(&needle).unwrap_or(usize::MAX), m.id.len(), m.id.clone()));
            list.dedup();
            resp.truncations.insert(ctx.clone(), list.len() > FUZZY_LIMIT);
            list.truncate(FUZZY_LIMIT);
            resp.matches.insert(ctx, list);
        }
        json_response(&resp, Some(s.meta(state.index)), q.pretty)
    })
    .await
}

async fn request(method: &Method, uri: &Uri, body: Body) -> Result<(QueryOptions, SearchRequest), HttpError> {
    require_method(method, &[Method::PUT, Method::POST])?;
    let q = QueryOptions::parse(uri)?;
    let bytes = read_body(body).await?;
    let req: SearchRequest = decode_body(&bytes)?;
    if req.prefix.len() > MAX_TERM || req.text.len() > MAX_TERM {
        return Err(HttpError::bad_request(format!("search term is longer than {MAX_TERM} bytes")));
    }
    Ok((q, req))
}

/// The contexts `context` names: all of `known` for `all` (or none given).
fn contexts<'a>(context: &str, known: &'a [&'a str]) -> Result<Vec<&'a str>, HttpError> {
    match context {
        "" | "all" => Ok(known.to_vec()),
        c => known.iter().find(|k| **k == c).map(|k| vec![*k]).ok_or_else(|| {
            HttpError::bad_request(format!("context must be one of [{}] or 'all' for all contexts; got {c:?}", known.join(" ")))
        }),
    }
}

/// The namespaces searched: `?namespace=` (or the body's), every one the caller may see for `*`.
fn namespaces(state: &ClusterState, q: &QueryOptions, req: &SearchRequest, reader: &Reader<'_>) -> Vec<String> {
    let ns = namespace_of(q, req);
    if ns == "*" {
        state.namespaces().map(|n| n.name.clone()).filter(|n| reader.acl.is_none_or(|a| a.allow_namespace(n))).collect()
    } else {
        vec![ns]
    }
}

/// The namespace asked for: `?namespace=`, else the body's, else `default`.
fn namespace_of(q: &QueryOptions, req: &SearchRequest) -> String {
    if q.params.get("namespace").is_none_or(|n| n.is_empty()) && !req.namespace.is_empty() {
        req.namespace.clone()
    } else {
        q.namespace.clone()
    }
}

/// A UUID prefix as Nomad reads it: an odd length is cut to the even length below.
fn uuid_prefix(term: &str) -> &str {
    let hex = term.chars().filter(|c| *c != '-').count();
    if hex % 2 == 1 { &term[..term.len() - 1] } else { term }
}

/// The IDs of `ctx` starting with `term`, sorted, at most one past the limit.
fn prefix_matches(state: &ClusterState, ctx: &str, term: &str, namespaces: &[String], reader: &Reader<'_>) -> Vec<String> {
    let in_ns = |ns: &str| namespaces.iter().any(|n| n == ns) && reader.context(ctx, ns);
    let id_term = uuid_prefix(term);
    let mut ids: Vec<String> = match ctx {
        "jobs" => state.jobs().filter(|j| in_ns(&j.namespace) && j.id.starts_with(term)).map(|j| j.id.clone()).collect(),
        "evals" => state.evals().filter(|e| in_ns(&e.namespace) && e.id.starts_with(id_term)).map(|e| e.id.clone()).collect(),
        "allocs" => state.allocs().filter(|a| in_ns(&a.namespace) && a.id.starts_with(id_term)).map(|a| a.id.clone()).collect(),
        "nodes" if reader.context(ctx, "") => state.nodes().filter(|n| n.id.starts_with(id_term)).map(|n| n.id.clone()).collect(),
        "node_pools" if reader.context(ctx, "") => {
            let mut pools: Vec<String> = ["all".to_string(), "default".to_string()].into();
            pools.extend(state.nodes().map(|n| n.node_pool.clone()).filter(|p| !p.is_empty()));
            pools.sort();
            pools.dedup();
            pools.into_iter().filter(|p| p.starts_with(term)).collect()
        }
        "plugins" if reader.context(ctx, "") => state.csi_plugins().filter(|p| p.id.starts_with(term)).map(|p| p.id.clone()).collect(),
        "volumes" => state.csi_volumes().filter(|v| in_ns(&v.namespace) && v.id.starts_with(term)).map(|v| v.id.clone()).collect(),
        "vars" => namespaces
            .iter()
            .filter(|ns| reader.context(ctx, ns))
            .flat_map(|ns| state.variables_with_prefix(ns, term))
            .filter(|v| reader.acl.is_none_or(|a| a.allow_variable_op(&v.meta.namespace, &v.meta.path, "list")))
            .map(|v| v.meta.path.clone())
            .collect(),
        "namespaces" => state
            .namespaces()
            .filter(|n| n.name.starts_with(term) && reader.acl.is_none_or(|a| a.allow_namespace(&n.name)))
            .map(|n| n.name.clone())
            .collect(),
        "deployment" => state.deployments().filter(|d| in_ns(&d.namespace) && d.id.starts_with(id_term)).map(|d| d.id.clone()).collect(),
        "scaling_policy" => {
            state.scaling_policies().filter(|(ns, p)| in_ns(ns) && p.id.starts_with(id_term)).map(|(_, p)| p.id.clone()).collect()
        }
        _ => Vec::new(),
    };
    ids.sort();
    ids.dedup();
    ids.truncate(PREFIX_LIMIT + 1);
    ids
}

/// Adds the fuzzy matches of `ctx` for the lower-cased `needle` to `found`.
fn fuzzy_matches(
    state: &ClusterState,
    ctx: &str,
    needle: &str,
    namespaces: &[String],
    reader: &Reader<'_>,
    found: &mut BTreeMap<String, Vec<FuzzyMatch>>,
) {
    let hit = |s: &str| s.to_lowercase().contains(needle);
    let mut add = |key: &str, id: &str, scope: Vec<String>| found.entry(key.into()).or_default().push(FuzzyMatch { id: id.into(), scope });
    let in_ns = |ns: &str| namespaces.iter().any(|n| n == ns) && reader.context(ctx, ns);
    match ctx {
        "jobs" => {
            for job in state.jobs().filter(|j| in_ns(&j.namespace)) {
                job_matches(job, &hit, &mut add);
            }
        }
        "allocs" => {
            for a in state.allocs().filter(|a| in_ns(&a.namespace) && hit(&a.name)) {
                add("allocs", &a.name, vec![a.namespace.clone(), a.id.clone()]);
            }
        }
        "nodes" if reader.context(ctx, "") => {
            for n in state.nodes().filter(|n| hit(&n.name)) {
                add("nodes", &n.name, vec![n.id.clone()]);
            }
        }
        "plugins" if reader.context(ctx, "") => {
            for p in state.csi_plugins().filter(|p| hit(&p.id)) {
                add("plugins", &p.id, Vec::new());
            }
        }
        "namespaces" => {
            for n in state.namespaces().filter(|n| hit(&n.name) && reader.acl.is_none_or(|a| a.allow_namespace(&n.name))) {
                add("namespaces", &n.name, Vec::new());
            }
        }
        _ => {}
    }
}

/// A job's fuzzy matches: itself, its groups, services, tasks, and its tasks' images, commands
/// and classes (from the driver config), each scoped to where it is.
fn job_matches(job: &Job, hit: &dyn Fn(&str) -> bool, add: &mut dyn FnMut(&str, &str, Vec<String>)) {
    let ns = job.namespace.clone();
    if hit(&job.id) {
        add("jobs", &job.id, vec![ns.clone()]);
    }
    for g in &job.task_groups {
        let group_scope = vec![ns.clone(), job.id.clone()];
        if hit(&g.name) {
            add("groups", &g.name, group_scope.clone());
        }
        for s in g.services.iter().filter(|s| hit(&s.name)) {
            add("services", &s.name, vec![ns.clone(), job.id.clone(), g.name.clone()]);
        }
        for t in &g.tasks {
            let task_scope = vec![ns.clone(), job.id.clone(), g.name.clone()];
            if hit(&t.name) {
                add("tasks", &t.name, task_scope.clone());
            }
            for s in t.services.iter().filter(|s| hit(&s.name)) {
                add("services", &s.name, vec![ns.clone(), job.id.clone(), g.name.clone(), t.name.clone()]);
            }
            let config = |key: &str| t.config.get(key).and_then(|v| v.as_str()).filter(|v| hit(v)).map(str::to_string);
            let scope = vec![ns.clone(), job.id.clone(), g.name.clone(), t.name.clone()];
            for (key, ctx) in [("image", "images"), ("command", "commands"), ("class", "classes")] {
                if let Some(v) = config(key) {
                    add(ctx, &v, scope.clone());
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
