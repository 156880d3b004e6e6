//! The stand-in's HTTP routes, check runners and ACL rules.
//!
//! Status codes and error texts follow Consul's `agent/agent_endpoint.go`, `agent/http.go`,
//! `agent/kvs_endpoint.go`, `agent/acl_endpoint.go` and `agent/config_endpoint.go`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::decode::{self, Shape};
use super::{Call, CheckState, KvEntry, Shared, State, parse_go_duration};

pub const GLOBAL_MANAGEMENT_ID: &str = "00000000-0000-0000-0000-000000000001";
/// Consul's KV value limit (`kv_max_value_size`, 512 KiB).
const KV_MAX_VALUE: usize = 512 * 1024;
/// Any other body.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// Consul's longest blocking wait.
const MAX_WAIT: Duration = Duration::from_secs(600);

type Resp = Response<Full<Bytes>>;

pub(crate) async fn accept_loop(listener: std::net::TcpListener, shared: Arc<Shared>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(shared, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        }
    }
    // Consul going away cuts its connections too, blocking queries included.
    conns.abort_all();
    drop(listener);
}

fn text(status: StatusCode, msg: impl Into<String>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(msg.into())));
    *r.status_mut() = status;
    r.headers_mut().insert("content-type", "text/plain; charset=utf-8".parse().unwrap());
    r
}

fn json_resp(value: &Value, index: Option<u64>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(serde_json::to_vec(value).unwrap_or_default())));
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    if let Some(i) = index {
        r.headers_mut().insert("x-consul-index", i.to_string().parse().unwrap());
        r.headers_mut().insert("x-consul-knownleader", "true".parse().unwrap());
        r.headers_mut().insert("x-consul-lastcontact", "0".parse().unwrap());
    }
    r
}

fn bad(msg: impl Into<String>) -> Resp {
    text(StatusCode::BAD_REQUEST, msg)
}

fn not_found(msg: impl Into<String>) -> Resp {
    text(StatusCode::NOT_FOUND, msg)
}

pub fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// A query-string value: `+` is a space.
fn percent_decode(s: &str) -> String {
    decode_percent(s, true)
}

/// A path segment (a KV key, a service ID): `+` is itself.
fn path_decode(s: &str) -> String {
    decode_percent(s, false)
}

fn decode_percent(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // Bytes, not a str slice: a `%` before a multi-byte character must not split it.
        let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        if b[i] == b'%'
            && let Some(v) = hex
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if plus_is_space && b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Who is calling, once the token is resolved.
#[derive(Debug, Clone)]
pub(crate) enum Who {
    Management,
    Anonymous,
    /// A created token: its AccessorID and the services its identities grant.
    Identity {
        accessor: String,
        services: Vec<String>,
    },
}

impl Who {
    fn deny(&self, perm: &str, resource: &str) -> Resp {
        let who = match self {
            Who::Anonymous => "anonymous token".to_string(),
            Who::Identity { accessor, .. } => format!("token with AccessorID '{accessor}'"),
            Who::Management => "management token".to_string(),
        };
        text(StatusCode::FORBIDDEN, format!("Permission denied: {who} lacks permission '{perm}' on \"{resource}\""))
    }
    fn management(&self) -> bool {
        matches!(self, Who::Management)
    }
    /// Service identities grant `service:write` on the service and its sidecar, and read on all.
    pub(crate) fn service_write(&self, name: &str) -> bool {
        match self {
            Who::Management => true,
            Who::Anonymous => false,
            Who::Identity { services, .. } => services.iter().any(|s| s == name || format!("{s}-sidecar-proxy") == name),
        }
    }
    fn read(&self) -> bool {
        !matches!(self, Who::Anonymous)
    }
}

/// The error is Consul's 403 body for a secret it does not know.
pub(crate) fn resolve(st: &State, req_token: &str) -> Result<Who, &'static str> {
    if st.opts.management_token.is_none() {
        return Ok(Who::Management);
    }
    if req_token.is_empty() {
        return Ok(Who::Anonymous);
    }
    let Some(tok) = st.tokens.values().find(|t| t["SecretID"] == req_token) else {
        return Err("ACL not found");
    };
    let management =
        tok["Policies"].as_array().into_iter().flatten().any(|p| p["ID"] == GLOBAL_MANAGEMENT_ID || p["Name"] == "global-management");
    if management {
        return Ok(Who::Management);
    }
    let services =
        tok["ServiceIdentities"].as_array().into_iter().flatten().filter_map(|s| s["ServiceName"].as_str().map(String::from)).collect();
    Ok(Who::Identity { accessor: tok["AccessorID"].as_str().unwrap_or_default().to_string(), services })
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Resp {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let header_token = req.headers().get("x-consul-token").and_then(|v| v.to_str().ok()).map(String::from).or_else(|| {
        req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(String::from)
    });
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, format!("Request body too large, max size: {MAX_BODY} bytes")),
    };
    let q = query_map(&query);
    shared.lock().calls.push(Call { method: method.clone(), path: path.clone(), query: query.clone(), body: body.clone() });
    let token = header_token.or_else(|| q.get("token").cloned()).unwrap_or_default();
    let who = match resolve(&shared.lock(), &token) {
        Ok(w) => w,
        Err(e) => return text(StatusCode::FORBIDDEN, e),
    };
    route(&shared, &method, &path, &q, &body, &who).await
}

async fn route(shared: &Arc<Shared>, method: &str, path: &str, q: &BTreeMap<String, String>, body: &[u8], who: &Who) -> Resp {
    let segs: Vec<&str> = path.trim_start_matches('/').splitn(4, '/').collect();
    let not_allowed = || text(StatusCode::METHOD_NOT_ALLOWED, format!("method {method} not allowed"));
    match segs.as_slice() {
        ["v1", "agent", "self"] => match method {
            "GET" => agent_self(shared, who),
            _ => not_allowed(),
        },
        ["v1", "agent", "services"] => match method {
            "GET" => agent_services(shared, who),
            _ => not_allowed(),
        },
        ["v1", "agent", "checks"] => match method {
            "GET" => agent_checks(shared, who),
            _ => not_allowed(),
        },
        ["v1", "agent", "service", rest] => match (method, rest.split_once('/')) {
            ("GET", None) => agent_service_get(shared, &path_decode(rest), who),
            ("PUT", None) if *rest == "register" => service_register(shared, q, body, who),
            ("PUT", Some(("deregister", id))) => service_deregister(shared, &path_decode(id), who),
            _ => not_allowed(),
        },
        ["v1", "agent", "check", rest] => match (method, rest.split_once('/')) {
            ("PUT", Some((op @ ("update" | "pass" | "warn" | "fail"), id))) => check_update(shared, op, &path_decode(id), q, body, who),
            ("PUT", Some(("deregister", id))) => check_deregister(shared, &path_decode(id), who),
            _ => not_allowed(),
        },
        ["v1", "agent", "connect", rest] => match (method, rest.split_once('/')) {
            ("GET", Some(("ca", "roots"))) => ca_roots(shared),
            ("GET", Some(("ca", leaf))) if leaf.starts_with("leaf/") => ca_leaf(shared, &path_decode(&leaf["leaf/".len()..]), who),
            _ => not_allowed(),
        },
        ["v1", "connect", "ca", "roots"] => match method {
            "GET" => ca_roots(shared),
            _ => not_allowed(),
        },
        ["v1", "catalog", "services"] => match method {
            "GET" => blocking(shared, q, |st| (catalog_services(st, who), st.index)).await,
            _ => not_allowed(),
        },
        ["v1", "catalog", "service", name] => match method {
            "GET" => catalog_service(shared, &path_decode(name), who),
            _ => not_allowed(),
        },
        ["v1", "health", "service", name] => match method {
            "GET" => {
                let name = path_decode(name);
                blocking(shared, q, |st| (health_service(st, &name, q, who), st.index)).await
            }
            _ => not_allowed(),
        },
        ["v1", "acl", "token"] => match method {
            "PUT" => token_create(shared, body, who),
            _ => not_allowed(),
        },
        ["v1", "acl", "token", id] => match method {
            "GET" if *id == "self" => token_self(shared, who),
            "GET" => token_read(shared, id, who),
            "DELETE" => token_delete(shared, id, who),
            _ => not_allowed(),
        },
        ["v1", "config"] => match method {
            "PUT" => config_put(shared, body, who),
            _ => not_allowed(),
        },
        ["v1", "config", rest] => config_entry(shared, method, rest, who),
        ["v1", "config", kind, name] => config_entry(shared, method, &format!("{kind}/{name}"), who),
        ["v1", "kv", ..] => {
            let key = path_decode(path.trim_start_matches("/v1/kv/").trim_start_matches("/v1/kv"));
            kv(shared, method, &key, q, body, who).await
        }
        _ => not_found(""),
    }
}

/// `GET /v1/connect/ca/roots` and `/v1/agent/connect/ca/roots`: public, as in Consul (no ACL).
fn ca_roots(shared: &Shared) -> Resp {
    let index = shared.lock().index;
    match &shared.ca {
        Some(ca) => json_resp(&ca.roots_json(index), Some(index)),
        None => text(StatusCode::INTERNAL_SERVER_ERROR, "Connect must be enabled in order to use this endpoint"),
    }
}

/// `GET /v1/agent/connect/ca/leaf/:service`: needs `service:write` on the service.
fn ca_leaf(shared: &Shared, service: &str, who: &Who) -> Resp {
    let Some(ca) = &shared.ca else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "Connect must be enabled in order to use this endpoint");
    };
    if service.is_empty()
        || service.len() > 256
        || !service.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return bad(format!("Invalid service name {service:?}"));
    }
    if !who.service_write(service) {
        return who.deny("service:write", service);
    }
    let index = shared.lock().index;
    match ca.leaf(service) {
        Ok(leaf) => json_resp(&leaf.to_json(index), Some(index)),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("failed to sign the leaf certificate: {e:#}")),
    }
}

fn agent_self(shared: &Shared, who: &Who) -> Resp {
    let st = shared.lock();
    if !who.read() {
        return who.deny("agent:read", &st.opts.node_name);
    }
    let o = &st.opts;
    let mut tags = json!({"role": if o.server { "consul" } else { "node" }, "dc": o.datacenter, "build": format!("{}:{}", o.version, o.revision), "vsn": "2"});
    if let Some(seg) = &o.segment {
        tags["segment"] = json!(seg);
    }
    // Shapes: `agent/agent_endpoint.go` `Self` (Config, DebugConfig, Coord, Member, Stats, Meta, xDS).
    json_resp(
        &json!({
            "Config": {
                "Datacenter": o.datacenter, "PrimaryDatacenter": o.datacenter, "NodeName": o.node_name, "NodeID": o.node_id,
                "Partition": "", "Revision": o.revision, "Server": o.server, "Version": o.version, "BuildDate": "2023-08-07T00:00:00Z",
            },
            "DebugConfig": {
                "ConnectEnabled": o.connect_enabled, "GRPCPort": o.grpc_port, "GRPCTLSPort": o.grpc_tls_port,
                "Datacenter": o.datacenter, "NodeName": o.node_name, "ACLsEnabled": o.management_token.is_some(),
            },
            "Coord": {"Vec": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "Error": 1.5, "Adjustment": 0.0, "Height": 1e-5},
            "Member": {"Name": o.node_name, "Addr": "127.0.0.1", "Port": 8301, "Tags": tags, "Status": 1,
                       "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2, "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4},
            "Stats": {},
            "Meta": {"consul-network-segment": o.segment.clone().unwrap_or_default()},
            "xDS": {"SupportedProxies": {"envoy": o.supported_envoy}, "Port": o.grpc_port, "Ports": {"Plaintext": o.grpc_port, "TLS": o.grpc_tls_port}},
        }),
        None,
    )
}

/// `api/agent.go` `AgentService`, from a canonical registration.
fn agent_service(st: &State, reg: &Value) -> Value {
    let mut s = json!({
        "ID": reg["ID"], "Service": reg["Name"],
        "Tags": reg.get("Tags").cloned().unwrap_or(json!([])),
        "Meta": reg.get("Meta").cloned().unwrap_or(json!({})),
        "Port": reg.get("Port").cloned().unwrap_or(json!(0)),
        "Address": reg.get("Address").cloned().unwrap_or(json!("")),
        "Weights": reg.get("Weights").cloned().unwrap_or(json!({"Passing": 1, "Warning": 1})),
        "EnableTagOverride": reg.get("EnableTagOverride").cloned().unwrap_or(json!(false)),
        "Datacenter": st.opts.datacenter,
    });
    for k in ["Kind", "TaggedAddresses", "Proxy", "Namespace"] {
        if let Some(v) = reg.get(k) {
            s[k] = v.clone();
        }
    }
    if reg["Connect"]["Native"] == true {
        s["Connect"] = json!({"Native": true});
    }
    s
}

/// `GET /v1/agent/service/:id` (what `consul connect envoy` reads its proxy from): needs read
/// on the service; a proxy or gateway always carries its `Proxy`, as Consul's `buildAgentService`.
fn agent_service_get(shared: &Shared, id: &str, who: &Who) -> Resp {
    let st = shared.lock();
    let Some(reg) = st.services.get(id) else {
        return not_found(format!("unknown service ID: {id}"));
    };
    if !who.read() {
        return who.deny("service:read", reg["Name"].as_str().unwrap_or_default());
    }
    let mut s = agent_service(&st, reg);
    let kind = reg.get("Kind").and_then(Value::as_str).unwrap_or_default();
    if (kind == "connect-proxy" || kind.ends_with("-gateway")) && s.get("Proxy").is_none() {
        s["Proxy"] = json!({"Config": null});
    }
    json_resp(&s, None)
}

fn agent_services(shared: &Shared, who: &Who) -> Resp {
    let st = shared.lock();
    let out: serde_json::Map<String, Value> =
        st.services.iter().filter(|_| who.read()).map(|(id, reg)| (id.clone(), agent_service(&st, reg))).collect();
    json_resp(&Value::Object(out), None)
}

/// A check's status now: TTLs expire, alias checks follow their service.
pub(crate) fn effective_status(st: &State, c: &CheckState) -> String {
    if let Some(alias) = c.def.get("AliasService").and_then(Value::as_str) {
        let statuses: Vec<String> = st
            .checks
            .values()
            .filter(|o| o.service_id == alias && o.def.get("AliasService").is_none())
            .map(|o| effective_status(st, o))
            .collect();
        if !st.services.contains_key(alias) {
            return "critical".into();
        }
        return worst(statuses.iter().map(String::as_str)).to_string();
    }
    if let Some(deadline) = c.ttl_deadline
        && Instant::now() > deadline
    {
        return "critical".into();
    }
    c.status.clone()
}

fn effective_output(st: &State, c: &CheckState) -> String {
    if c.ttl_deadline.is_some_and(|d| Instant::now() > d) {
        return "TTL expired".into();
    }
    if c.def.get("AliasService").is_some() {
        return if effective_status(st, c) == "passing" {
            "All checks passing.".into()
        } else {
            "Aliased service has failing checks".into()
        };
    }
    c.output.clone()
}

fn worst<'a>(statuses: impl Iterator<Item = &'a str>) -> &'a str {
    let mut w = "passing";
    for s in statuses {
        match s {
            "critical" => return "critical",
            "warning" => w = "warning",
            _ => {}
        }
    }
    w
}

fn check_type(def: &Value) -> &'static str {
    for (k, t) in [
        ("HTTP", "http"),
        ("TCP", "tcp"),
        ("UDP", "udp"),
        ("GRPC", "grpc"),
        ("TTL", "ttl"),
        ("AliasService", "alias"),
        ("ScriptArgs", "script"),
        ("H2PING", "h2ping"),
    ] {
        if def.get(k).is_some() {
            return t;
        }
    }
    ""
}

/// `api/agent.go` `AgentCheck` / `api/health.go` `HealthCheck`.
fn agent_check(st: &State, c: &CheckState) -> Value {
    let svc = st.services.get(&c.service_id);
    let mut definition = json!({});
    for k in [
        "HTTP",
        "Header",
        "Method",
        "Body",
        "TLSServerName",
        "TLSSkipVerify",
        "TCP",
        "UDP",
        "GRPC",
        "GRPCUseTLS",
        "Interval",
        "Timeout",
        "DeregisterCriticalServiceAfter",
    ] {
        if let Some(v) = c.def.get(k) {
            definition[k] = v.clone();
        }
    }
    json!({
        "Node": st.opts.node_name, "CheckID": c.id, "Name": c.name,
        "Status": effective_status(st, c), "Notes": c.notes, "Output": effective_output(st, c),
        "ServiceID": c.service_id,
        "ServiceName": svc.map(|s| s["Name"].clone()).unwrap_or(json!("")),
        "ServiceTags": svc.and_then(|s| s.get("Tags").cloned()).unwrap_or(json!([])),
        "Type": check_type(&c.def), "ExposedPort": 0, "Definition": definition,
        "CreateIndex": c.create_index, "ModifyIndex": c.create_index,
    })
}

fn agent_checks(shared: &Shared, who: &Who) -> Resp {
    let st = shared.lock();
    let out: serde_json::Map<String, Value> =
        st.checks.iter().filter(|_| who.read()).map(|(id, c)| (id.clone(), agent_check(&st, c))).collect();
    json_resp(&Value::Object(out), None)
}

/// Validates a check as Consul's `CheckType.Validate` does; the error is the 400 body.
fn validate_check(def: &Value) -> Result<(), String> {
    let kinds =
        ["HTTP", "TCP", "UDP", "GRPC", "TTL", "AliasService", "ScriptArgs", "H2PING"].iter().filter(|k| def.get(**k).is_some()).count();
    if kinds != 1 {
        return Err("Invalid check: must be one of script, HTTP, TCP, UDP, gRPC, H2PING, alias, or TTL type".into());
    }
    let interval =
        def.get("Interval").and_then(Value::as_str).map(|s| parse_go_duration(s).ok_or(format!("Invalid check: invalid Interval \"{s}\"")));
    let interval = interval.transpose()?;
    if let Some(t) = def.get("TTL").and_then(Value::as_str) {
        match parse_go_duration(t) {
            Some(d) if d > Duration::ZERO => {}
            _ => return Err("Invalid check: TTL must be > 0 for TTL checks".into()),
        }
    } else if def.get("AliasService").is_none() && interval.is_none_or(|d| d.is_zero()) {
        return Err("Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP or UDP checks".into());
    }
    if let Some(s) = def.get("Status").and_then(Value::as_str)
        && !["passing", "warning", "critical"].contains(&s)
    {
        return Err(format!("Invalid check: status \"{s}\" is not one of passing, warning, critical"));
    }
    Ok(())
}

fn service_register(shared: &Arc<Shared>, q: &BTreeMap<String, String>, body: &[u8], who: &Who) -> Resp {
    let mut reg = match decode::decode(body, &decode::SERVICE_REGISTRATION) {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    let Some(name) = reg.get("Name").and_then(Value::as_str).map(String::from).filter(|n| !n.is_empty()) else {
        return bad("Missing service name");
    };
    if !who.service_write(&name) {
        return who.deny("service:write", &name);
    }
    let id = reg.get("ID").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or(&name).to_string();
    reg["ID"] = json!(id);
    if reg.get("Kind").and_then(Value::as_str) == Some("connect-proxy")
        && reg["Proxy"]["DestinationServiceName"].as_str().is_none_or(str::is_empty)
    {
        return bad("Invalid Proxy Configuration: Missing DestinationServiceName");
    }
    let checks = match collect_checks(&mut reg, &id, &name) {
        Ok(c) => c,
        Err(e) => return bad(e),
    };
    let mut sidecar = None;
    if let Some(sc) = reg.get_mut("Connect").and_then(|c| c.as_object_mut()).and_then(|c| c.remove("SidecarService")) {
        if reg.get("Kind").and_then(Value::as_str).is_some_and(|k| !k.is_empty()) {
            return bad("Invalid SidecarService: a connect-proxy or gateway cannot have a sidecar service");
        }
        sidecar = Some(sc);
    }
    let mut st = shared.lock();
    // A service registered on its own is nobody's sidecar, whatever its ID.
    st.sidecars.remove(&id);
    let mut sidecar_id = None;
    let mut regs = vec![(reg, checks)];
    if let Some(mut sc) = sidecar {
        // Consul's agent expands `SidecarService` (agent/sidecar_service.go): ID and Name
        // derive from the parent's; kind, address, tags and meta default to the parent's (kind
        // to connect-proxy); the port comes from 21000-21255 (the lowest free one, or the one it
        // already had); without checks it gets a TCP listening check and an alias check.
        let sc_id = format!("{id}-sidecar-proxy");
        if sc.get("ID").is_some_and(|v| v != &json!(sc_id)) {
            return bad("Invalid SidecarService: ID must not be specified");
        }
        sc["ID"] = json!(sc_id);
        if sc.get("Name").is_none() {
            sc["Name"] = json!(format!("{name}-sidecar-proxy"));
        }
        let sc_name = sc["Name"].as_str().unwrap_or_default().to_string();
        if !who.service_write(&sc_name) {
            return who.deny("service:write", &sc_name);
        }
        if sc.get("Kind").and_then(Value::as_str).is_none_or(str::is_empty) {
            sc["Kind"] = json!("connect-proxy");
        }
        // Consul copies them when the sidecar's are empty (`len(...) == 0`, `== ""`), not only absent.
        let empty = |v: Option<&Value>| match v {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty(),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        for k in ["Tags", "Meta", "Address"] {
            if empty(sc.get(k))
                && let Some(v) = regs[0].0.get(k)
            {
                sc[k] = v.clone();
            }
        }
        let port = sc.get("Port").and_then(Value::as_i64).unwrap_or(0);
        let previous = st.services.get(&sc_id).and_then(|s| s.get("Port")).and_then(Value::as_i64).filter(|p| (21000..=21255).contains(p));
        if port == 0
            && let Some(p) = previous
        {
            sc["Port"] = json!(p);
        } else if port == 0 {
            let used: BTreeSet<i64> =
                st.services.iter().filter(|(k, _)| **k != sc_id).filter_map(|(_, s)| s.get("Port").and_then(Value::as_i64)).collect();
            let Some(free) = (21000..=21255).find(|p| !used.contains(p)) else {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "No sidecar ports available");
            };
            sc["Port"] = json!(free);
        }
        let proxy = sc.as_object_mut().expect("object").entry("Proxy").or_insert(json!({}));
        if !proxy.is_object() {
            *proxy = json!({});
        }
        for (k, v) in [("DestinationServiceName", &name), ("DestinationServiceID", &id)] {
            if proxy.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                proxy[k] = json!(v);
            }
        }
        let local_addr_missing = proxy.get("LocalServiceAddress").and_then(Value::as_str).is_none_or(str::is_empty);
        let local_port_missing = proxy.get("LocalServicePort").and_then(Value::as_i64).is_none_or(|p| p < 1);
        if proxy.get("LocalServiceSocketPath").is_none() && (local_addr_missing || local_port_missing) {
            if local_addr_missing {
                proxy["LocalServiceAddress"] = json!("127.0.0.1");
            }
            if local_port_missing {
                proxy["LocalServicePort"] = regs[0].0.get("Port").cloned().unwrap_or(json!(0));
            }
        }
        for k in ["MeshGateway", "Expose"] {
            if proxy.get(k).is_none() {
                proxy[k] = json!({});
            }
        }
        let mut sc_checks = match collect_checks(&mut sc, &sc_id, &sc_name) {
            Ok(c) => c,
            Err(e) => return bad(e),
        };
        if sc_checks.is_empty() {
            // The sidecar's address, else the proxy's local service address.
            let addr = sc
                .get("Address")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
                .or_else(|| sc["Proxy"]["LocalServiceAddress"].as_str())
                .unwrap_or("127.0.0.1")
                .to_string();
            sc_checks.push(json!({"CheckID": format!("service:{sc_id}:1"), "Name": "Connect Sidecar Listening", "TCP": format!("{addr}:{}", sc["Port"]), "Interval": "10s"}));
            sc_checks.push(
                json!({"CheckID": format!("service:{sc_id}:2"), "Name": format!("Connect Sidecar Aliasing {id}"), "AliasService": id}),
            );
        }
        regs.push((sc, sc_checks));
        sidecar_id = Some(sc_id);
    }
    let replace = q.contains_key("replace-existing-checks");
    let index = st.bump();
    for (reg, checks) in regs {
        let sid = reg["ID"].as_str().unwrap_or_default().to_string();
        let keep: BTreeSet<String> = checks.iter().filter_map(|c| c["CheckID"].as_str().map(String::from)).collect();
        if replace {
            let stale: Vec<String> =
                st.checks.iter().filter(|(k, c)| c.service_id == sid && !keep.contains(*k)).map(|(k, _)| k.clone()).collect();
            for k in stale {
                if let Some(r) = st.checks.remove(&k).and_then(|c| c.runner) {
                    r.abort();
                }
            }
        }
        for def in checks {
            add_check(shared, &mut st, &sid, def, index);
        }
        st.services.insert(sid, reg);
    }
    if let Some(sc_id) = sidecar_id {
        st.sidecars.insert(sc_id);
    }
    drop(st);
    shared.notify(index);
    text(StatusCode::OK, "")
}

/// Takes `Check` and `Checks` out of a registration, filling Consul's default IDs and names.
fn collect_checks(reg: &mut Value, service_id: &str, service_name: &str) -> Result<Vec<Value>, String> {
    let mut checks = Vec::new();
    let obj = reg.as_object_mut().expect("object");
    if let Some(c) = obj.remove("Check") {
        checks.push(c);
    }
    if let Some(Value::Array(cs)) = obj.remove("Checks") {
        checks.extend(cs.into_iter().filter(|c| !c.is_null()));
    }
    let n = checks.len();
    for (i, c) in checks.iter_mut().enumerate() {
        validate_check(c)?;
        if c.get("CheckID").and_then(Value::as_str).is_none_or(str::is_empty) {
            c["CheckID"] = json!(if n == 1 { format!("service:{service_id}") } else { format!("service:{service_id}:{}", i + 1) });
        }
        if c.get("Name").and_then(Value::as_str).is_none_or(str::is_empty) {
            c["Name"] = json!(format!("Service '{service_name}' check"));
        }
    }
    Ok(checks)
}

fn add_check(shared: &Arc<Shared>, st: &mut State, service_id: &str, def: Value, index: u64) {
    let id = def["CheckID"].as_str().unwrap_or_default().to_string();
    if let Some(r) = st.checks.remove(&id).and_then(|c| c.runner) {
        r.abort();
    }
    let ttl = def.get("TTL").and_then(Value::as_str).and_then(parse_go_duration);
    let interval = def.get("Interval").and_then(Value::as_str).and_then(parse_go_duration);
    let timeout = def.get("Timeout").and_then(Value::as_str).and_then(parse_go_duration).unwrap_or(Duration::from_secs(10));
    let runner = match (check_type(&def), interval) {
        ("http" | "tcp", Some(interval)) => {
            let shared2 = shared.clone();
            let id2 = id.clone();
            let def2 = def.clone();
            Some(tokio::spawn(async move { run_check(shared2, id2, def2, interval, timeout).await }).abort_handle())
        }
        _ => None,
    };
    let state = CheckState {
        id: id.clone(),
        name: def["Name"].as_str().unwrap_or_default().to_string(),
        service_id: service_id.to_string(),
        status: def.get("Status").and_then(Value::as_str).unwrap_or("critical").to_string(),
        output: String::new(),
        notes: def.get("Notes").and_then(Value::as_str).unwrap_or_default().to_string(),
        ttl_deadline: ttl.map(|d| Instant::now() + d),
        ttl,
        runner,
        create_index: index,
        def,
    };
    st.checks.insert(id, state);
}

/// Runs an http or tcp check at its interval, as the Consul agent does (first run at once).
async fn run_check(shared: Arc<Shared>, id: String, def: Value, interval: Duration, timeout: Duration) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    loop {
        let (status, output) = if let Some(addr) = def.get("TCP").and_then(Value::as_str) {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_)) => ("passing", format!("TCP connect {addr}: Success")),
                Ok(Err(e)) => ("critical", format!("dial tcp {addr}: connect: {e}")),
                Err(_) => ("critical", format!("dial tcp {addr}: i/o timeout")),
            }
        } else {
            let url = def["HTTP"].as_str().unwrap_or_default().to_string();
            let method = def.get("Method").and_then(Value::as_str).unwrap_or("GET").to_string();
            http_check(&client, &url, &method, &def, timeout).await
        };
        {
            let mut st = shared.lock();
            let Some(c) = st.checks.get_mut(&id) else { return };
            let changed = c.status != status;
            c.status = status.to_string();
            c.output = output;
            if changed {
                let i = st.bump();
                drop(st);
                shared.notify(i);
            }
        }
        tokio::time::sleep(interval).await;
    }
}

async fn http_check(
    client: &hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    url: &str,
    method: &str,
    def: &Value,
    timeout: Duration,
) -> (&'static str, String) {
    let mut b =
        Request::builder().method(method).uri(url).header("user-agent", "Consul Health Check").header("accept", "text/plain, text/*, */*");
    if let Some(h) = def.get("Header").and_then(Value::as_object) {
        for (k, vs) in h {
            for v in vs.as_array().into_iter().flatten().filter_map(Value::as_str) {
                b = b.header(k.as_str(), v);
            }
        }
    }
    let body = def.get("Body").and_then(Value::as_str).unwrap_or_default().to_string();
    let Ok(req) = b.body(Full::new(Bytes::from(body))) else {
        return ("critical", format!("http: invalid check request {method} {url}"));
    };
    match tokio::time::timeout(timeout, client.request(req)).await {
        Err(_) => ("critical", format!("{method} {url}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)")),
        Ok(Err(e)) => ("critical", format!("{method} {url}: {e}")),
        Ok(Ok(resp)) => {
            let code = resp.status();
            let text: String = resp
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()[..]).chars().take(4096).collect())
                .unwrap_or_default();
            let out = format!("HTTP {method} {url}: {} Output: {text}", code);
            let status = if code.is_success() {
                "passing"
            } else if code == StatusCode::TOO_MANY_REQUESTS {
                "warning"
            } else {
                "critical"
            };
            (status, out)
        }
    }
}

fn service_deregister(shared: &Shared, id: &str, who: &Who) -> Resp {
    let mut st = shared.lock();
    let Some(reg) = st.services.get(id) else {
        return not_found(format!("Unknown service ID {id:?}. Ensure that the service ID is passed, not the service name."));
    };
    let name = reg["Name"].as_str().unwrap_or_default().to_string();
    if !who.service_write(&name) {
        return who.deny("service:write", &name);
    }
    remove_service(&mut st, id);
    // Consul's agent takes the sidecar it registered for this service with it
    // (`agent.go` `removeServiceSidecars`).
    let sidecar = format!("{id}-sidecar-proxy");
    if st.sidecars.contains(&sidecar) {
        remove_service(&mut st, &sidecar);
    }
    let i = st.bump();
    drop(st);
    shared.notify(i);
    text(StatusCode::OK, "")
}

/// Removes a service and its checks.
fn remove_service(st: &mut State, id: &str) {
    st.services.remove(id);
    st.sidecars.remove(id);
    let ids: Vec<String> = st.checks.iter().filter(|(_, c)| c.service_id == id).map(|(k, _)| k.clone()).collect();
    for k in ids {
        if let Some(r) = st.checks.remove(&k).and_then(|c| c.runner) {
            r.abort();
        }
    }
}

/// `PUT /v1/agent/check/deregister/:id`: a service's check needs `service:write` on it.
fn check_deregister(shared: &Shared, id: &str, who: &Who) -> Resp {
    let mut st = shared.lock();
    let Some(c) = st.checks.get(id) else {
        return not_found(format!("Unknown check ID {id:?}. Ensure that the check ID is passed, not the check name."));
    };
    let service = st.services.get(&c.service_id).and_then(|s| s["Name"].as_str()).unwrap_or_default().to_string();
    if !service.is_empty() && !who.service_write(&service) {
        return who.deny("service:write", &service);
    }
    if let Some(r) = st.checks.remove(id).and_then(|c| c.runner) {
        r.abort();
    }
    let i = st.bump();
    drop(st);
    shared.notify(i);
    text(StatusCode::OK, "")
}

fn check_update(shared: &Shared, op: &str, id: &str, q: &BTreeMap<String, String>, body: &[u8], who: &Who) -> Resp {
    let (status, output) = match op {
        "update" => {
            let v = match decode::decode(body, &decode::CHECK_UPDATE) {
                Ok(v) => v,
                Err(e) => return bad(e),
            };
            let status = v.get("Status").and_then(Value::as_str).unwrap_or_default().to_string();
            if !["passing", "warning", "critical"].contains(&status.as_str()) {
                return bad("Invalid 'Status' provided");
            }
            (status, v.get("Output").and_then(Value::as_str).unwrap_or_default().to_string())
        }
        "pass" => ("passing".to_string(), q.get("note").cloned().unwrap_or_default()),
        "warn" => ("warning".to_string(), q.get("note").cloned().unwrap_or_default()),
        _ => ("critical".to_string(), q.get("note").cloned().unwrap_or_default()),
    };
    let mut st = shared.lock();
    let Some(c) = st.checks.get(id) else {
        return not_found(format!("Unknown check ID {id:?}. Ensure that the check ID is passed, not the check name."));
    };
    let svc_name = st.services.get(&c.service_id).and_then(|s| s["Name"].as_str()).unwrap_or_default().to_string();
    if !who.service_write(&svc_name) {
        return who.deny("service:write", &svc_name);
    }
    let c = st.checks.get_mut(id).expect("present");
    let Some(ttl) = c.ttl else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("CheckID {id:?} does not have associated TTL"));
    };
    c.status = status;
    // Consul truncates check output to 4 KiB (`check_output_max_size`).
    c.output = output.chars().take(4096).collect();
    c.ttl_deadline = Some(Instant::now() + ttl);
    let i = st.bump();
    drop(st);
    shared.notify(i);
    text(StatusCode::OK, "")
}

fn catalog_services(st: &State, who: &Who) -> Resp {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if who.read() {
        out.insert("consul".into(), BTreeSet::new());
        for s in st.services.values() {
            let tags = out.entry(s["Name"].as_str().unwrap_or_default().to_string()).or_default();
            tags.extend(s["Tags"].as_array().into_iter().flatten().filter_map(|t| t.as_str().map(String::from)));
        }
    }
    json_resp(&json!(out), Some(st.index))
}

fn node_json(st: &State) -> Value {
    json!({"ID": st.opts.node_id, "Node": st.opts.node_name, "Address": "127.0.0.1", "Datacenter": st.opts.datacenter,
           "TaggedAddresses": {"lan": "127.0.0.1", "wan": "127.0.0.1"}, "Meta": {"consul-network-segment": ""}})
}

fn instances<'a>(st: &'a State, name: &'a str, who: &Who) -> Vec<&'a Value> {
    st.services.values().filter(|s| who.read() && s["Name"] == name).collect()
}

/// `api/catalog.go` `CatalogService`.
fn catalog_service(shared: &Shared, name: &str, who: &Who) -> Resp {
    let st = shared.lock();
    let out: Vec<Value> = instances(&st, name, who)
        .into_iter()
        .map(|s| {
            let a = agent_service(&st, s);
            json!({
                "ID": st.opts.node_id, "Node": st.opts.node_name, "Address": "127.0.0.1", "Datacenter": st.opts.datacenter,
                "TaggedAddresses": {"lan": "127.0.0.1", "wan": "127.0.0.1"}, "NodeMeta": {"consul-network-segment": ""},
                "ServiceKind": a.get("Kind").cloned().unwrap_or(json!("")), "ServiceID": a["ID"], "ServiceName": a["Service"],
                "ServiceTags": a["Tags"], "ServiceMeta": a["Meta"], "ServiceAddress": a["Address"], "ServicePort": a["Port"],
                "ServiceTaggedAddresses": a.get("TaggedAddresses").cloned().unwrap_or(json!({})), "ServiceWeights": a["Weights"],
                "ServiceEnableTagOverride": a["EnableTagOverride"], "ServiceProxy": a.get("Proxy").cloned().unwrap_or(json!({"MeshGateway": {}, "Expose": {}})),
                "ServiceConnect": a.get("Connect").cloned().unwrap_or(json!({})), "CreateIndex": st.index, "ModifyIndex": st.index,
            })
        })
        .collect();
    json_resp(&Value::Array(out), Some(st.index))
}

/// `api/health.go` `ServiceEntry` (`?passing` keeps only entries whose checks all pass, `?tag`
/// those with the tag).
fn health_service(st: &State, name: &str, q: &BTreeMap<String, String>, who: &Who) -> Resp {
    let passing_only = q.get("passing").is_some_and(|v| v.is_empty() || v == "true" || v == "1");
    let serf = json!({"Node": st.opts.node_name, "CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing", "Notes": "",
                      "Output": "Agent alive and reachable", "ServiceID": "", "ServiceName": "", "ServiceTags": [], "Type": "", "Definition": {}});
    let tag = q.get("tag").filter(|t| !t.is_empty());
    let out: Vec<Value> = instances(st, name, who)
        .into_iter()
        .filter(|s| tag.is_none_or(|t| s["Tags"].as_array().is_some_and(|tags| tags.iter().any(|x| x == t.as_str()))))
        .map(|s| {
            let sid = s["ID"].as_str().unwrap_or_default();
            let mut checks = vec![serf.clone()];
            checks.extend(st.checks.values().filter(|c| c.service_id == sid).map(|c| agent_check(st, c)));
            json!({"Node": node_json(st), "Service": agent_service(st, s), "Checks": checks})
        })
        .filter(|e| !passing_only || e["Checks"].as_array().into_iter().flatten().all(|c| c["Status"] == "passing"))
        .collect();
    json_resp(&Value::Array(out), Some(st.index))
}

fn valid_service_identity(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn token_create(shared: &Shared, body: &[u8], who: &Who) -> Resp {
    if !who.management() {
        return who.deny("acl:write", "");
    }
    let mut tok = match decode::decode(body, &decode::ACL_TOKEN) {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    for si in tok.get("ServiceIdentities").and_then(Value::as_array).into_iter().flatten() {
        let name = si.get("ServiceName").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            return bad("Service identity is missing the service name field on this token");
        }
        if !valid_service_identity(name) {
            return bad(format!(
                "Service identity {name:?} has an invalid name. Only lowercase alphanumeric characters, '-' and '_' are allowed"
            ));
        }
    }
    let mut st = shared.lock();
    let accessor = tok
        .get("AccessorID")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    if st.tokens.contains_key(&accessor) {
        return bad("Invalid Token: AccessorID is already in use");
    }
    let i = st.bump();
    tok["AccessorID"] = json!(accessor);
    if tok.get("SecretID").and_then(Value::as_str).is_none_or(str::is_empty) {
        tok["SecretID"] = json!(uuid::Uuid::new_v4().to_string());
    }
    for k in ["Description"] {
        if tok.get(k).is_none() {
            tok[k] = json!("");
        }
    }
    if tok.get("Local").is_none() {
        tok["Local"] = json!(false);
    }
    tok["CreateTime"] = json!(now_rfc3339());
    tok["Hash"] = json!(base64::engine::general_purpose::STANDARD.encode(accessor.as_bytes()));
    tok["CreateIndex"] = json!(i);
    tok["ModifyIndex"] = json!(i);
    st.tokens.insert(accessor, tok.clone());
    json_resp(&tok, None)
}

fn token_read(shared: &Shared, accessor: &str, who: &Who) -> Resp {
    if !who.management() {
        return who.deny("acl:read", "");
    }
    match shared.lock().tokens.get(accessor) {
        Some(t) => json_resp(t, None),
        None => text(StatusCode::FORBIDDEN, "ACL not found"),
    }
}

fn token_self(shared: &Shared, who: &Who) -> Resp {
    let st = shared.lock();
    let accessor = match who {
        Who::Identity { accessor, .. } => accessor.clone(),
        Who::Anonymous => return text(StatusCode::FORBIDDEN, "ACL not found"),
        Who::Management if st.opts.management_token.is_none() => return text(StatusCode::UNAUTHORIZED, "ACL support disabled"),
        Who::Management => {
            // Resolve which management token it was by its secret: the caller only knows the secret.
            return st
                .tokens
                .values()
                .find(|t| t["Policies"].as_array().into_iter().flatten().any(|p| p["Name"] == "global-management"))
                .map(|t| json_resp(t, None))
                .unwrap_or_else(|| text(StatusCode::FORBIDDEN, "ACL not found"));
        }
    };
    st.tokens.get(&accessor).map(|t| json_resp(t, None)).unwrap_or_else(|| text(StatusCode::FORBIDDEN, "ACL not found"))
}

fn token_delete(shared: &Shared, accessor: &str, who: &Who) -> Resp {
    if !who.management() {
        return who.deny("acl:write", "");
    }
    let mut st = shared.lock();
    if st.tokens.remove(accessor).is_none() {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "Cannot find token to delete");
    }
    st.bump();
    json_resp(&json!(true), None)
}

fn config_put(shared: &Shared, body: &[u8], who: &Who) -> Resp {
    if !who.management() {
        return who.deny("mesh:write", "");
    }
    let raw: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad("Request decoding failed: json: cannot unmarshal into Go value of type map[string]interface {}"),
        Err(e) => return bad(format!("Request decoding failed: {e}")),
    };
    // `structs.DecodeConfigEntry` looks for `Kind`, then `kind`.
    let kind = raw.get("Kind").or_else(|| raw.get("kind"));
    let kind = match kind {
        None => return bad("Request decoding failed: Payload does not contain a kind/Kind key at the top level"),
        Some(Value::String(k)) => k.clone(),
        Some(_) => return bad("Request decoding failed: Kind value in payload is not a string"),
    };
    let shape: &Shape = match decode::config_entry_shape(&kind) {
        Ok(s) => s,
        Err(e) => return bad(format!("Request decoding failed: {e}")),
    };
    let mut entry = match decode::decode_config_entry(&raw, shape) {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    let Some(name) = entry.get("Name").and_then(Value::as_str).filter(|n| !n.is_empty()).map(String::from) else {
        return bad("Name is required");
    };
    let mut st = shared.lock();
    let i = st.bump();
    let create = st.config_entries.get(&(kind.clone(), name.clone())).and_then(|e| e["CreateIndex"].as_u64()).unwrap_or(i);
    entry["CreateIndex"] = json!(create);
    entry["ModifyIndex"] = json!(i);
    st.config_entries.insert((kind, name), entry);
    drop(st);
    shared.notify(i);
    json_resp(&json!(true), None)
}

fn config_entry(shared: &Shared, method: &str, rest: &str, who: &Who) -> Resp {
    let (kind, name) = rest.split_once('/').map(|(k, n)| (k.to_string(), path_decode(n))).unwrap_or((rest.to_string(), String::new()));
    if let Err(e) = decode::config_entry_shape(&kind) {
        return bad(e);
    }
    let mut st = shared.lock();
    match (method, name.is_empty()) {
        ("GET", true) => {
            if !who.read() {
                return json_resp(&json!([]), Some(st.index));
            }
            let list: Vec<Value> = st.config_entries.iter().filter(|((k, _), _)| *k == kind).map(|(_, e)| e.clone()).collect();
            json_resp(&Value::Array(list), Some(st.index))
        }
        ("GET", false) => match st.config_entries.get(&(kind.clone(), name.clone())) {
            Some(e) if who.read() => json_resp(e, Some(st.index)),
            Some(_) => who.deny("service:read", &name),
            None => not_found(format!("Config entry not found for {kind:?} / {name:?}")),
        },
        ("DELETE", false) => {
            if !who.management() {
                return who.deny("mesh:write", &name);
            }
            st.config_entries.remove(&(kind, name));
            let i = st.bump();
            drop(st);
            shared.notify(i);
            json_resp(&json!({}), None)
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, format!("method {method} not allowed")),
    }
}

fn kv_entry_json(key: &str, e: &KvEntry) -> Value {
    json!({"LockIndex": 0, "Key": key, "Flags": e.flags, "Value": if e.value.is_empty() { Value::Null } else { json!(base64::engine::general_purpose::STANDARD.encode(&e.value)) },
           "CreateIndex": e.create_index, "ModifyIndex": e.modify_index})
}

async fn kv(shared: &Arc<Shared>, method: &str, key: &str, q: &BTreeMap<String, String>, body: &[u8], who: &Who) -> Resp {
    if !who.management() {
        let perm = if method == "GET" { "key:read" } else { "key:write" };
        return who.deny(perm, key);
    }
    match method {
        "GET" => kv_get(shared, key, q).await,
        "PUT" => {
            if key.is_empty() {
                return bad("Missing key name");
            }
            if body.len() > KV_MAX_VALUE {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "Request body({} bytes) too large, max size: {KV_MAX_VALUE} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
                        body.len()
                    ),
                );
            }
            let flags = match q.get("flags").map(|f| f.parse::<u64>()) {
                None => 0,
                Some(Ok(f)) => f,
                Some(Err(_)) => return bad("Invalid flags"),
            };
            let mut st = shared.lock();
            if let Some(cas) = q.get("cas") {
                let Ok(cas) = cas.parse::<u64>() else { return bad("Invalid cas index") };
                let current = st.kv.get(key).map(|e| e.modify_index).unwrap_or(0);
                if cas != current {
                    return json_resp(&json!(false), None);
                }
            }
            let i = st.bump();
            let create = st.kv.get(key).map(|e| e.create_index).unwrap_or(i);
            st.kv.insert(key.to_string(), KvEntry { value: body.to_vec(), flags, create_index: create, modify_index: i });
            st.kv_index = i;
            drop(st);
            shared.notify(i);
            json_resp(&json!(true), None)
        }
        "DELETE" => {
            let mut st = shared.lock();
            let i = st.bump();
            if q.contains_key("recurse") {
                st.kv.retain(|k, _| !k.starts_with(key));
            } else {
                st.kv.remove(key);
            }
            st.kv_index = i;
            drop(st);
            shared.notify(i);
            json_resp(&json!(true), None)
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, format!("method {method} not allowed")),
    }
}

async fn kv_get(shared: &Arc<Shared>, key: &str, q: &BTreeMap<String, String>) -> Resp {
    blocking(shared, q, |st| kv_read(st, key, q)).await
}

/// A read as Consul's blocking queries make it (`?index=&wait=`): answered once `read`'s index
/// passes `index`, or when the wait ends.
async fn blocking(shared: &Arc<Shared>, q: &BTreeMap<String, String>, read: impl Fn(&State) -> (Resp, u64)) -> Resp {
    let min_index = match q.get("index").map(|i| i.parse::<u64>()) {
        None => None,
        Some(Ok(i)) => Some(i),
        Some(Err(_)) => return bad("Invalid index"),
    };
    let wait = match q.get("wait").map(|w| parse_go_duration(w)) {
        None => Duration::from_secs(300),
        Some(Some(w)) => w.min(MAX_WAIT),
        Some(None) => return bad("Invalid wait time"),
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut rx = shared.index_tx.subscribe();
    loop {
        rx.borrow_and_update();
        let (resp, index) = read(&shared.lock());
        let ready = min_index.is_none_or(|m| m == 0 || index > m);
        if ready || tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
            let mut resp = resp;
            resp.headers_mut().insert("x-consul-index", index.max(1).to_string().parse().unwrap());
            resp.headers_mut().insert("x-consul-knownleader", "true".parse().unwrap());
            return resp;
        }
    }
}

/// One KV read and the index a blocking query compares (the newest matching entry's, or the
/// table's when nothing matches).
fn kv_read(st: &State, key: &str, q: &BTreeMap<String, String>) -> (Resp, u64) {
    if q.contains_key("keys") {
        let sep = q.get("separator").cloned().unwrap_or_default();
        let mut keys = BTreeSet::new();
        let mut index = 0;
        for (k, e) in st.kv.range(key.to_string()..).take_while(|(k, _)| k.starts_with(key)) {
            index = index.max(e.modify_index);
            let rest = &k[key.len()..];
            match (!sep.is_empty()).then(|| rest.find(&sep)).flatten() {
                Some(p) => keys.insert(format!("{key}{}", &rest[..p + sep.len()])),
                None => keys.insert(k.clone()),
            };
        }
        if keys.is_empty() {
            return (not_found(""), st.kv_index);
        }
        return (json_resp(&json!(keys), None), index);
    }
    if q.contains_key("recurse") {
        let entries: Vec<(&String, &KvEntry)> = st.kv.range(key.to_string()..).take_while(|(k, _)| k.starts_with(key)).collect();
        if entries.is_empty() {
            return (not_found(""), st.kv_index);
        }
        let index = entries.iter().map(|(_, e)| e.modify_index).max().unwrap_or(0);
        return (json_resp(&Value::Array(entries.into_iter().map(|(k, e)| kv_entry_json(k, e)).collect()), None), index);
    }
    match st.kv.get(key) {
        None => (not_found(""), st.kv_index),
        Some(e) if q.contains_key("raw") => {
            let mut r = Response::new(Full::new(Bytes::from(e.value.clone())));
            r.headers_mut().insert("content-type", "text/plain; charset=utf-8".parse().unwrap());
            (r, e.modify_index)
        }
        Some(e) => (json_resp(&json!([kv_entry_json(key, e)]), None), e.modify_index),
    }
}
