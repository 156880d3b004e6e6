//! Authorization of every HTTP route, in one table.
//!
//! [`ROWS`] maps (method, path pattern) to the capability a caller needs (Nomad's per-endpoint
//! checks, reference §1.8). [`authorize`] is the one middleware: it resolves the caller's secret
//! (`X-Nomad-Token`, else `Authorization: Bearer`), finds the row, and refuses before the handler
//! runs. A request no row matches is refused (default deny). With ACLs off it lets everything
//! through untouched.
//!
//! Where an object's namespace decides (an alloc by ID, a job registered from a body), the
//! middleware finds it first: from the state for alloc and eval IDs, from the body's `Namespace`
//! for job registration. Reads of single objects and `namespace=*` lists are checked on the way
//! out: an object of a namespace the caller may not read is a 403, and a list keeps only the
//! objects of namespaces it may read (by each element's `Namespace`).
//!
//! The event stream checks its topics and then each event's namespace itself
//! ([`Need::EventStream`]). The client routes (`/v1/client/*`) check the capability Nomad's
//! client endpoints do in the namespace of the alloc their path names ([`NsFrom::Alloc`]);
//! `alloc exec` also needs `alloc-node-exec` when the task runs without filesystem isolation
//! (raw_exec, [`Need::AllocExec`]). A client-only agent applies the same rows with
//! [`decide`], knowing allocs from its own state.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::util::{HttpError, MAX_BODY_BYTES};
use crate::acl::{Acl, AuthError, Identity, WORKLOAD_READ_SERVICES};
use crate::endpoints::Endpoints;

/// Which methods a row covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum M {
    /// Every method.
    Any,
    /// GET and HEAD.
    Get,
    /// PUT and POST.
    Write,
    /// DELETE.
    Delete,
}

impl M {
    fn covers(self, m: &Method) -> bool {
        match self {
            M::Any => true,
            M::Get => *m == Method::GET || *m == Method::HEAD,
            M::Write => *m == Method::PUT || *m == Method::POST,
            M::Delete => *m == Method::DELETE,
        }
    }
}

/// Where the namespace of a namespaced check comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsFrom {
    /// `?namespace=` (default `default`; `*` = any namespace, lists filtered per object).
    Query,
    /// Every namespace the write names: `?namespace=`, and in the body the request's, the
    /// job's and each volume's (job registration, plan, validate; CSI volume writes).
    WriteBody,
    /// The alloc whose ID (or ID prefix) is path segment `n`, counted from `v1` = 0
    /// (`/v1/allocation/<id>` is 2, `/v1/client/fs/ls/<id>` is 4). An alloc the agent does not
    /// know passes if any namespace allows (the handler answers 404).
    Alloc(usize),
    /// The object returned: the check passes if any namespace allows, then the response's
    /// `Namespace` decides (403 if not allowed).
    Response,
}

/// What a row requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: not even a valid token (status, bootstrap).
    Public,
    /// Any valid token, the anonymous one included; the handler narrows what it shows.
    AnyToken,
    /// The handler resolves the token itself (`/v1/acl/token/self`: expiry is not checked).
    Handler,
    /// One of these namespace capabilities, in the namespace `from` says.
    Ns(&'static [&'static str], NsFrom),
    /// Any capability in the namespace named by the last path segment (namespace reads); lists
    /// keep the namespaces with any capability (by `Name`).
    NsAny,
    /// `alloc-exec` in the namespace of the alloc at path segment 3
    /// (`/v1/client/allocation/<id>/exec`), plus `alloc-node-exec` when the task asked for
    /// (`?task=`; any task of the group when none) uses a driver without filesystem isolation.
    AllocExec,
    /// `node` read / write.
    Node(bool),
    /// `node` read; the allocs listed keep only those of namespaces with `read-job`.
    NodeAllocs,
    /// `agent` read / write.
    Agent(bool),
    /// `operator` read / write.
    Operator(bool),
    /// `plugin` list.
    PluginList,
    /// `plugin` read.
    PluginRead,
    /// A token other than the anonymous one; the event stream's handler checks the topics
    /// asked for and then each event's namespace (`http/events.rs`).
    EventStream,
    /// Any valid token, the anonymous one included; the handler applies the token's
    /// `variables` path rules to the path (and to each variable a list shows).
    Variable,
    /// Any valid token; the search handler refuses one that can read none of what it
    /// searches and filters the rest (Nomad's `sufficientSearchPerms`, `http/search.rs`).
    Search,
    /// A management token.
    Management,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Methods.
    pub method: M,
    /// Path pattern: literal segments, `:x` for one segment, `*` for one or more.
    pub pattern: &'static str,
    /// The requirement.
    pub need: Need,
}

const fn row(method: M, pattern: &'static str, need: Need) -> Row {
    Row { method, pattern, need }
}

use M::{Any, Delete, Get, Write};
use Need::*;
use NsFrom::{Alloc, Query, Response as Resp, WriteBody};

/// `/v1/allocation/<id>`.
const ALLOC: NsFrom = Alloc(2);
/// `/v1/client/allocation/<id>/...`.
const CLIENT_ALLOC: NsFrom = Alloc(3);
/// `/v1/client/fs/<op>/<id>`.
const FS_ALLOC: NsFrom = Alloc(4);

/// The authorization table. The first row that matches decides; no row: refused.
pub const ROWS: &[Row] = &[
    // Status and ACL bootstrap: anyone.
    row(Get, "/v1/status/leader", Public),
    row(Get, "/v1/status/peers", Public),
    row(Get, "/v1/regions", Public),
    row(Get, "/v1/agent/health", Public),
    // Nomad 1.6 leaves its metrics open (`metrics_endpoint.go` checks no token).
    row(Get, "/v1/metrics", Public),
    row(Write, "/v1/acl/bootstrap", Public),
    // ACL objects (handlers narrow reads to the caller's own).
    row(Get, "/v1/acl/policies", AnyToken),
    row(Get, "/v1/acl/policy/:name", AnyToken),
    row(Write, "/v1/acl/policy/:name", Management),
    row(Delete, "/v1/acl/policy/:name", Management),
    row(Get, "/v1/acl/tokens", Management),
    row(Write, "/v1/acl/token", Management),
    row(Get, "/v1/acl/token/self", Handler),
    row(Get, "/v1/acl/token/:accessor", AnyToken),
    row(Write, "/v1/acl/token/:accessor", Management),
    row(Delete, "/v1/acl/token/:accessor", Management),
    row(Get, "/v1/acl/roles", AnyToken),
    row(Write, "/v1/acl/role", Management),
    row(Get, "/v1/acl/role/name/:name", AnyToken),
    row(Get, "/v1/acl/role/:id", AnyToken),
    row(Write, "/v1/acl/role/:id", Management),
    row(Delete, "/v1/acl/role/:id", Management),
    // Jobs.
    row(Get, "/v1/jobs", Ns(&["list-jobs"], Query)),
    row(Write, "/v1/jobs", Ns(&["submit-job"], WriteBody)),
    row(Write, "/v1/jobs/parse", Ns(&["parse-job", "submit-job"], Query)),
    row(Write, "/v1/validate/job", Ns(&["read-job"], WriteBody)),
    row(Get, "/v1/job/*/allocations", Ns(&["read-job"], Query)),
    row(Get, "/v1/job/*/evaluations", Ns(&["read-job"], Query)),
    row(Get, "/v1/job/*/summary", Ns(&["read-job"], Query)),
    row(Write, "/v1/job/*/plan", Ns(&["submit-job"], WriteBody)),
    row(Write, "/v1/job/*/evaluate", Ns(&["read-job"], Query)),
    row(Get, "/v1/job/*/versions", Ns(&["read-job"], Query)),
    row(Write, "/v1/job/*/revert", Ns(&["submit-job"], Query)),
    row(Write, "/v1/job/*/stable", Ns(&["submit-job"], Query)),
    row(Write, "/v1/job/*/periodic/force", Ns(&["submit-job"], Query)),
    row(Write, "/v1/job/*/dispatch", Ns(&["dispatch-job"], Query)),
    row(Get, "/v1/job/*/deployments", Ns(&["read-job"], Query)),
    row(Get, "/v1/job/*/deployment", Ns(&["read-job"], Query)),
    row(Get, "/v1/job/*/scale", Ns(&["read-job", "read-job-scaling"], Query)),
    row(Write, "/v1/job/*/scale", Ns(&["scale-job", "submit-job"], Query)),
    row(Get, "/v1/job/*", Ns(&["read-job"], Query)),
    row(Write, "/v1/job/*", Ns(&["submit-job"], WriteBody)),
    row(Delete, "/v1/job/*", Ns(&["submit-job"], Query)),
    // Deployments: reads filtered by the answer's namespace; writes in the query's.
    row(Get, "/v1/deployments", Ns(&["read-job"], Query)),
    row(Get, "/v1/deployment/allocations/:id", Ns(&["read-job"], Resp)),
    row(Get, "/v1/deployment/:id", Ns(&["read-job"], Resp)),
    row(Write, "/v1/deployment/:action/:id", Ns(&["submit-job"], Query)),
    // Allocations and evaluations.
    row(Get, "/v1/allocations", Ns(&["read-job"], Query)),
    row(Write, "/v1/allocation/:id/stop", Ns(&["alloc-lifecycle"], ALLOC)),
    row(Get, "/v1/allocation/:id/checks", Ns(&["read-job"], ALLOC)),
    row(Get, "/v1/allocation/*", Ns(&["read-job"], ALLOC)),
    row(Get, "/v1/evaluations", Ns(&["read-job"], Query)),
    // Deleting evals alters the cluster's core state: management only, as Nomad.
    row(Delete, "/v1/evaluations", Management),
    row(Get, "/v1/evaluation/*", Ns(&["read-job"], Resp)),
    // Nodes.
    row(Get, "/v1/nodes", Node(false)),
    row(Get, "/v1/node/:id/allocations", NodeAllocs),
    row(Get, "/v1/node/*", Node(false)),
    row(Write, "/v1/node/*", Node(true)),
    // Namespaces.
    row(Get, "/v1/namespaces", NsAny),
    row(Get, "/v1/namespace/:name", NsAny),
    row(Write, "/v1/namespace/:name", Management),
    row(Delete, "/v1/namespace/:name", Management),
    // Nomad Variables: path rules checked by the handlers (`http/variables.rs`).
    row(Get, "/v1/vars", Variable),
    row(Any, "/v1/var/*", Variable),
    // The keyring: management only, as Nomad.
    row(Get, "/v1/operator/keyring/keys", Management),
    row(Write, "/v1/operator/keyring/rotate", Management),
    row(Delete, "/v1/operator/keyring/key/:id", Management),
    // Search: the handler searches only the contexts and namespaces the token may read.
    row(Write, "/v1/search", Search),
    row(Write, "/v1/search/fuzzy", Search),
    // Scaling policies: Nomad also lets list-jobs with read-job through; here read-job does.
    // The answers carry each policy's `Namespace` for the filter.
    row(Get, "/v1/scaling/policies", Ns(&["list-scaling-policies", "read-job"], Query)),
    row(Get, "/v1/scaling/policy/:id", Ns(&["read-scaling-policy", "read-job"], Resp)),
    // Forced garbage collection: management only, as Nomad.
    row(Write, "/v1/system/gc", Management),
    row(Write, "/v1/system/reconcile/summaries", Management),
    // Agent and operator.
    row(Get, "/v1/agent/self", Agent(false)),
    row(Get, "/v1/agent/members", Node(false)),
    row(Get, "/v1/agent/servers", Agent(false)),
    row(Write, "/v1/agent/servers", Agent(true)),
    // Nomad 1.6 checks no token on a join; a join changes the cluster, so agent write here.
    row(Write, "/v1/agent/join", Agent(true)),
    row(Write, "/v1/agent/force-leave", Agent(true)),
    row(Get, "/v1/agent/monitor", Agent(false)),
    row(Get, "/v1/operator/raft/configuration", Management),
    row(Delete, "/v1/operator/raft/peer", Management),
    row(Get, "/v1/operator/snapshot", Management),
    row(Write, "/v1/operator/snapshot", Management),
    row(Get, "/v1/operator/scheduler/configuration", Operator(false)),
    row(Write, "/v1/operator/scheduler/configuration", Operator(true)),
    // The event stream: topics checked at subscription, each event by its own namespace.
    row(Get, "/v1/event/stream", EventStream),
    // Services.
    // A workload identity reads its own namespace's services (`nomadService`).
    row(Get, "/v1/services", Ns(&["read-job", WORKLOAD_READ_SERVICES], Query)),
    row(Get, "/v1/service/*", Ns(&["read-job", WORKLOAD_READ_SERVICES], Query)),
    row(Delete, "/v1/service/*", Ns(&["submit-job"], Query)),
    // CSI volumes and plugins.
    row(Get, "/v1/volumes", Ns(&["csi-list-volume", "csi-read-volume", "csi-mount-volume", "list-jobs"], Query)),
    row(Get, "/v1/volume/csi/*", Ns(&["csi-read-volume", "csi-mount-volume", "read-job"], Query)),
    row(Write, "/v1/volume/csi/*", Ns(&["csi-write-volume"], WriteBody)),
    row(Delete, "/v1/volume/csi/*", Ns(&["csi-write-volume"], Query)),
    row(Get, "/v1/plugins", PluginList),
    row(Get, "/v1/plugin/csi/:id", PluginRead),
    row(Delete, "/v1/plugin/csi/:id", Management),
    // Client routes, in the alloc's namespace (Nomad's `client/*_endpoint.go`).
    row(Get, "/v1/client/fs/logs/:id", Ns(&["read-logs", "read-fs"], FS_ALLOC)),
    row(Get, "/v1/client/fs/:op/:id", Ns(&["read-fs"], FS_ALLOC)),
    row(Get, "/v1/client/allocation/:id/exec", AllocExec),
    row(Write, "/v1/client/allocation/:id/restart", Ns(&["alloc-lifecycle"], CLIENT_ALLOC)),
    row(Write, "/v1/client/allocation/:id/signal", Ns(&["alloc-lifecycle"], CLIENT_ALLOC)),
    row(Get, "/v1/client/allocation/:id/stats", Ns(&["read-job"], CLIENT_ALLOC)),
    row(Get, "/v1/client/allocation/:id/checks", Ns(&["read-job"], CLIENT_ALLOC)),
    row(Any, "/v1/client/allocation/:id/gc", Ns(&["submit-job"], CLIENT_ALLOC)),
    row(Get, "/v1/client/stats", Node(false)),
    row(Any, "/v1/client/gc", Node(true)),
];

/// Whether `path` matches `pattern` (see [`Row::pattern`]).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let Some(star) = pat.iter().position(|p| *p == "*") else {
        return pat.len() == segs.len() && pat.iter().zip(&segs).all(|(p, s)| seg_matches(p, s));
    };
    let (head, tail) = (&pat[..star], &pat[star + 1..]);
    segs.len() > head.len() + tail.len()
        && head.iter().zip(&segs).all(|(p, s)| seg_matches(p, s))
        && tail.iter().rev().zip(segs.iter().rev()).all(|(p, s)| seg_matches(p, s))
        && segs[head.len()..segs.len() - tail.len()].iter().all(|s| !s.is_empty())
}

fn seg_matches(pattern: &str, seg: &str) -> bool {
    if pattern.starts_with(':') { !seg.is_empty() } else { pattern == seg }
}

/// The row deciding a request, if any.
pub fn row_for(method: &Method, path: &str) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.method.covers(method) && path_matches(r.pattern, path))
}

/// The caller as the middleware resolved it (a request extension). Absent with ACLs off.
#[derive(Debug, Clone)]
pub struct Caller(pub Identity);

/// The secret a request carries: `X-Nomad-Token` (trimmed), else `Authorization: Bearer <t>`.
pub fn request_secret(headers: &HeaderMap) -> String {
    if let Some(t) = headers.get("x-nomad-token").and_then(|v| v.to_str().ok()).map(str::trim).filter(|t| !t.is_empty()) {
        return t.to_string();
    }
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let mut it = v.split_whitespace();
            match (it.next(), it.next()) {
                (Some(scheme), Some(tok)) if scheme.eq_ignore_ascii_case("bearer") => Some(tok.to_string()),
                _ => None,
            }
        })
        .unwrap_or_default()
}

fn denied() -> Response {
    HttpError { code: StatusCode::FORBIDDEN, message: "Permission denied".into() }.into_response()
}

fn auth_error(e: AuthError) -> Response {
    HttpError { code: StatusCode::FORBIDDEN, message: e.to_string() }.into_response()
}

fn query_namespace(uri: &axum::http::Uri) -> String {
    super::util::QueryOptions::parse(uri).map(|q| q.namespace).unwrap_or_else(|_| nomad_proto::job::DEFAULT_NAMESPACE.into())
}

/// What to check on the response.
enum After {
    Nothing,
    /// Keep the list elements (or the object) whose `Namespace` allows one of these.
    Filter(&'static [&'static str]),
    /// Keep namespaces (by `Name`) with any capability.
    Namespaces,
}

/// The middleware: resolve, find the row, check, run the handler, filter what it answers.
pub async fn authorize(State(endpoints): State<Endpoints>, req: Request, next: Next) -> Response {
    if !endpoints.acl_config().enabled {
        return next.run(req).await;
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let Some(row) = row_for(&method, &path) else { return denied() };
    let snap = endpoints.store().snapshot();
    let identity = match row.need {
        Public | Handler => None,
        _ => match crate::acl::resolve(&snap, endpoints.keyring(), &request_secret(req.headers()), nomad_proto::Timestamp::now()) {
            Ok(id) => Some(id),
            Err(e) => return auth_error(e),
        },
    };
    let Some(id) = identity else { return next.run(req).await };
    let acl = id.acl.clone();
    let id_is_anonymous = id.token.accessor_id == crate::acl::ANONYMOUS_ACCESSOR;
    let mut req = req;
    req.extensions_mut().insert(Caller(id));
    let mut after = After::Nothing;
    let allowed = match row.need {
        Public | Handler | AnyToken | Variable | Search => true,
        // Nomad refuses the anonymous token here: its policy does not apply to the stream.
        EventStream => !id_is_anonymous,
        Management => acl.is_management(),
        AllocExec => allow_exec(&acl, state_alloc_facts(&snap, &path, 3, req.uri()).as_ref()),
        Node(w) => acl.allow_node(w),
        NodeAllocs => {
            after = After::Filter(&["read-job"]);
            acl.allow_node(false)
        }
        Agent(w) => acl.allow_agent(w),
        Operator(w) => acl.allow_operator(w),
        PluginList => acl.allow_plugin_list(),
        PluginRead => acl.allow_plugin_read(),
        NsAny => {
            after = After::Namespaces;
            match path.strip_prefix("/v1/namespace/") {
                Some(name) => acl.allow_namespace(name),
                None => true,
            }
        }
        Ns(caps, from) => {
            let ns = match from {
                // A write may not name "any namespace": it would pass if any one allowed it.
                Query if !is_read(&method) && query_namespace(req.uri()) == "*" => return denied(),
                Query => query_namespace(req.uri()),
                Resp => "*".to_string(),
                // Unknown alloc: the handler answers 404 to anyone allowed somewhere.
                Alloc(n) => state_alloc_facts(&snap, &path, n, req.uri()).map_or_else(|| "*".to_string(), |f| f.namespace),
                WriteBody => {
                    let (parts, body) = req.into_parts();
                    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
                        Ok(b) => b,
                        Err(_) => return HttpError::bad_request("request body too large").into_response(),
                    };
                    let names = write_namespaces(&parts.uri, &bytes);
                    req = Request::from_parts(parts, Body::from(bytes));
                    // The handler picks one of these by its own precedence: each must allow.
                    if names.iter().any(|ns| ns == "*" || !caps.iter().any(|c| acl.allow_namespace_op(ns, c))) {
                        return denied();
                    }
                    names.into_iter().next().unwrap_or_default()
                }
            };
            // A known alloc's namespace is exact; otherwise the answer's `Namespace` decides.
            if ns == "*" || from == Resp {
                after = After::Filter(caps);
            }
            caps.iter().any(|c| acl.allow_namespace_op(&ns, c))
        }
    };
    if !allowed {
        return denied();
    }
    let resp = next.run(req).await;
    if acl.is_management() {
        return resp;
    }
    match after {
        After::Nothing => resp,
        After::Filter(caps) => filter_response(resp, &acl, "Namespace", |acl, ns| caps.iter().any(|c| acl.allow_namespace_op(ns, c))).await,
        After::Namespaces => filter_response(resp, &acl, "Name", |acl, ns| acl.allow_namespace(ns)).await,
    }
}

/// Refuses every request (`Permission denied`): routes an agent cannot authorize yet.
pub async fn refuse(_req: Request, _next: Next) -> Response {
    denied()
}

/// What an agent knows of the alloc a path names: enough to check a client row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocFacts {
    /// The alloc's namespace.
    pub namespace: String,
    /// The task asked for (`?task=`; any task of the group when none) runs with a driver that
    /// shares the host's filesystem (Nomad's `FSIsolation` none), so exec needs `alloc-node-exec`.
    pub node_exec: bool,
}

/// Drivers without filesystem isolation.
pub const NO_FS_ISOLATION: &[&str] = &["raw_exec"];

impl AllocFacts {
    /// The facts of `alloc` for a request asking for `task` (`None`: any task).
    pub fn of(alloc: &nomad_proto::Allocation, task: Option<&str>) -> AllocFacts {
        let group = alloc.job.as_ref().and_then(|j| j.task_groups.iter().find(|g| g.name == alloc.task_group));
        let node_exec = group.is_some_and(|g| {
            g.tasks.iter().filter(|t| task.is_none_or(|name| t.name == name)).any(|t| NO_FS_ISOLATION.contains(&t.driver.as_str()))
        });
        AllocFacts { namespace: alloc.namespace.clone(), node_exec }
    }
}

/// Path segment `n`, counted from `v1` = 0.
pub fn path_segment(path: &str, n: usize) -> &str {
    path.trim_start_matches('/').split('/').nth(n).unwrap_or_default()
}

/// `?task=`, when named.
pub fn query_task(uri: &axum::http::Uri) -> Option<String> {
    super::util::QueryOptions::parse(uri).ok().and_then(|mut q| q.params.remove("task")).filter(|t| !t.is_empty())
}

/// The facts of the alloc at path segment `n` (an ID or a unique ID prefix) in the server's state.
fn state_alloc_facts(snap: &crate::state::State, path: &str, n: usize, uri: &axum::http::Uri) -> Option<AllocFacts> {
    let id = path_segment(path, n);
    if id.is_empty() {
        return None;
    }
    let task = query_task(uri);
    if let Some(a) = snap.alloc(id) {
        return Some(AllocFacts::of(a, task.as_deref()));
    }
    let mut found = snap.allocs().filter(|a| a.id.starts_with(id));
    let first = found.next()?;
    found.next().is_none().then(|| AllocFacts::of(first, task.as_deref()))
}

/// `alloc exec`: `alloc-exec` in the alloc's namespace, and `alloc-node-exec` too without
/// filesystem isolation. An unknown alloc passes if any namespace allows exec (the handler
/// answers 404 or forwards to where it is checked again).
fn allow_exec(acl: &Acl, facts: Option<&AllocFacts>) -> bool {
    match facts {
        Some(f) => {
            acl.allow_namespace_op(&f.namespace, "alloc-exec") && (!f.node_exec || acl.allow_namespace_op(&f.namespace, "alloc-node-exec"))
        }
        None => acl.allow_namespace_op("*", "alloc-exec"),
    }
}

/// The decision of a row that needs neither a body nor the server's state, with the facts an
/// agent has of the alloc the path names (`facts` gets the path segment): what a client-only
/// agent checks. Rows it cannot decide (job bodies, answers filtered by namespace) are refused.
pub fn decide(need: Need, acl: &Acl, path: &str, facts: impl Fn(&str) -> Option<AllocFacts>) -> bool {
    match need {
        Public => true,
        Management => acl.is_management(),
        Node(w) => acl.allow_node(w),
        Agent(w) => acl.allow_agent(w),
        Operator(w) => acl.allow_operator(w),
        AllocExec => allow_exec(acl, facts(path_segment(path, 3)).as_ref()),
        Ns(caps, Alloc(n)) => {
            let ns = facts(path_segment(path, n)).map_or_else(|| "*".to_string(), |f| f.namespace);
            caps.iter().any(|c| acl.allow_namespace_op(&ns, c))
        }
        _ => false,
    }
}

fn is_read(m: &Method) -> bool {
    *m == Method::GET || *m == Method::HEAD
}

/// Every namespace a write names: `?namespace=`, the request's `Namespace`, the job's and each
/// volume's (the default one when none is named). The handler's precedence picks among them, so
/// checking them all leaves no way to be checked in one namespace and written in another.
fn write_namespaces(uri: &axum::http::Uri, body: &[u8]) -> Vec<String> {
    let query_ns = query_namespace(uri);
    let explicit = uri.query().is_some_and(|q| q.split('&').any(|kv| kv.strip_prefix("namespace=").is_some_and(|v| !v.is_empty())));
    let mut names: Vec<String> = Vec::new();
    if explicit {
        names.push(query_ns.clone());
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let named = |o: &serde_json::Value| o.get("Namespace").and_then(|n| n.as_str()).filter(|n| !n.is_empty()).map(str::to_string);
        names.extend(named(&v));
        names.extend(v.get("Job").and_then(named));
        // Each volume is written in its own namespace, or the request's when it names none
        // (checking only the request's was CVE-2024-10975).
        for vol in v.get("Volumes").and_then(|vs| vs.as_array()).into_iter().flatten() {
            names.push(named(vol).unwrap_or_else(|| query_ns.clone()));
        }
    }
    if names.is_empty() {
        names.push(nomad_proto::job::DEFAULT_NAMESPACE.into());
    }
    names.sort();
    names.dedup();
    names
}

/// Drops list elements whose `key` the ACL does not allow; a single object not allowed is a
/// 403. Non-JSON and error answers pass unchanged.
async fn filter_response(resp: Response, acl: &Arc<Acl>, key: &str, allow: impl Fn(&Acl, &str) -> bool) -> Response {
    if !resp.status().is_success() {
        return resp;
    }
    let is_json = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("application/json"));
    if !is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else { return denied() };
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let ok = |item: &serde_json::Value| item.get(key).and_then(|n| n.as_str()).is_none_or(|ns| allow(acl, ns));
    match &mut v {
        serde_json::Value::Array(items) => items.retain(ok),
        obj @ serde_json::Value::Object(_) if !ok(&*obj) => return denied(),
        _ => {}
    }
    let out = serde_json::to_vec(&v).unwrap_or_default();
    parts.headers.remove("content-length");
    Response::from_parts(parts, Body::from(out))
}

#[cfg(test)]
mod tests;
