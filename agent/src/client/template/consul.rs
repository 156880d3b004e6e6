//! consul-template's Consul data functions: `key`, `keyExists`, `keyOrDefault`, `ls`,
//! `safeLs`, `tree`, `safeTree`, `service` and `services`, with consul-template's argument
//! syntax (`path@dc`, `tag.name@dc~near|filter`) and the shapes templates range over
//! (`KeyPair`, `HealthService`, `CatalogSnippet`). The answers are Consul's own JSON, fetched
//! by [`super::source::ConsulSource`].

use std::sync::{Arc, LazyLock};

use gotmpl::{FuncMap, TemplateError, Value};
use regex::Regex;
use serde_json::Value as Json;

use super::Dependency;
use super::render::{Scope, err, field, json_to_value, map, str_arg};

/// The Consul functions: the working ones when the agent has Consul, otherwise each fails by
/// name (a template that needs Consul cannot render without it).
pub(super) fn consul_funcs(scope: &Arc<Scope>, has_consul: bool) -> FuncMap {
    let mut m = FuncMap::new();
    if !has_consul {
        for name in ["key", "keyExists", "keyOrDefault", "ls", "safeLs", "tree", "safeTree", "service", "services"] {
            m.insert(
                name.into(),
                Arc::new(move |_: &[Value]| Err(err(name, "this client has no consul {} block to read Consul data from"))),
            );
        }
        return m;
    }
    let s = scope.clone();
    m.insert(
        "key".into(),
        Arc::new(move |args: &[Value]| {
            let arg = str_arg("key", args, 0)?;
            if arg.is_empty() {
                return Ok(Value::String("".into()));
            }
            let (key, dc) = kv_ref("key", arg)?;
            let dep = Dependency::ConsulKey { key, dc, block: true };
            match s.answer(dep.clone()) {
                Some(Some(v)) => Ok(Value::String(kv_value(first(&v)).into())),
                // Blocks until the key exists.
                Some(None) => {
                    s.mark_missing(dep);
                    Ok(Value::String("".into()))
                }
                None => Ok(Value::String("".into())),
            }
        }),
    );
    let s = scope.clone();
    m.insert(
        "keyExists".into(),
        Arc::new(move |args: &[Value]| {
            let arg = str_arg("keyExists", args, 0)?;
            if arg.is_empty() {
                return Ok(Value::Bool(false));
            }
            let (key, dc) = kv_ref("keyExists", arg)?;
            Ok(Value::Bool(matches!(s.answer(Dependency::ConsulKey { key, dc, block: false }), Some(Some(_)))))
        }),
    );
    let s = scope.clone();
    m.insert(
        "keyOrDefault".into(),
        Arc::new(move |args: &[Value]| {
            let (arg, default) = (str_arg("keyOrDefault", args, 0)?, str_arg("keyOrDefault", args, 1)?);
            if arg.is_empty() {
                return Ok(Value::String(default.into()));
            }
            let (key, dc) = kv_ref("keyOrDefault", arg)?;
            let value = match s.answer(Dependency::ConsulKey { key, dc, block: false }) {
                Some(Some(v)) => kv_value(first(&v)),
                _ => String::new(),
            };
            Ok(Value::String(if value.is_empty() { default.into() } else { value.into() }))
        }),
    );
    for (name, deep, empty_is_safe) in [("ls", false, true), ("safeLs", false, false), ("tree", true, true), ("safeTree", true, false)] {
        let s = scope.clone();
        m.insert(
            name.into(),
            Arc::new(move |args: &[Value]| {
                let arg = str_arg(name, args, 0)?;
                if arg.is_empty() {
                    return Ok(Value::List(Vec::new().into()));
                }
                let (prefix, dc) = kv_ref(name, arg)?;
                let dep = Dependency::ConsulKeys { prefix: prefix.clone(), dc };
                let Some(Some(Json::Array(entries))) = s.answer(dep.clone()) else { return Ok(Value::List(Vec::new().into())) };
                let pairs: Vec<Value> = entries
                    .iter()
                    .filter_map(|e| {
                        let full = field(e, "Key").as_str().unwrap_or_default();
                        let key = full.strip_prefix(prefix.as_str()).unwrap_or(full).trim_start_matches('/');
                        // `ls`: the keys right under the prefix; `tree`: every key, no folders.
                        let keep = if deep { !key.ends_with('/') && !key.is_empty() } else { !key.is_empty() && !key.contains('/') };
                        keep.then(|| key_pair(e, full, key))
                    })
                    .collect();
                if pairs.is_empty() && !empty_is_safe {
                    s.mark_missing(dep);
                }
                Ok(Value::List(pairs.into()))
            }),
        );
    }
    let s = scope.clone();
    m.insert(
        "service".into(),
        Arc::new(move |args: &[Value]| {
            let parts: Vec<&str> = (0..args.len()).map(|i| str_arg("service", args, i)).collect::<Result<_, _>>()?;
            if parts.first().is_none_or(|p| p.is_empty()) {
                return Ok(Value::List(Vec::new().into()));
            }
            let dep = service_ref(&parts.join("|")).map_err(|e| err("service", e))?;
            let Dependency::ConsulService { filters, near, .. } = &dep else { unreachable!("service_ref makes a service dependency") };
            let (filters, by_distance) = (filters.clone(), !near.is_empty());
            let Some(Some(Json::Array(entries))) = s.answer(dep) else { return Ok(Value::List(Vec::new().into())) };
            let mut out: Vec<(String, String, Value)> = entries
                .iter()
                .filter_map(|e| {
                    let status = aggregated_status(field(e, "Checks"));
                    filters.iter().any(|f| f == "any" || *f == status).then(|| health_service(e, status))
                })
                .collect();
            // Consul's order for `~near`, otherwise by node then ID.
            if !by_distance {
                out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
            }
            Ok(Value::List(out.into_iter().map(|(_, _, v)| v).collect::<Vec<_>>().into()))
        }),
    );
    let s = scope.clone();
    m.insert(
        "services".into(),
        Arc::new(move |args: &[Value]| {
            let parts: Vec<&str> = (0..args.len()).map(|i| str_arg("services", args, i)).collect::<Result<_, _>>()?;
            let arg = parts.concat();
            let dc = match CATALOG_RE.captures(&arg) {
                Some(c) => c.name("dc").map(|m| m.as_str().to_string()).unwrap_or_default(),
                None => return Err(err("services", format!("catalog.services: invalid format: {arg:?}"))),
            };
            let Some(Some(Json::Object(services))) = s.answer(Dependency::ConsulServices { dc }) else {
                return Ok(Value::List(Vec::new().into()));
            };
            // A JSON object's keys come sorted: the catalog's order by name.
            let out: Vec<Value> = services
                .iter()
                .map(|(name, tags)| map([("Name", Value::String(name.as_str().into())), ("Tags", sorted_tags(tags))]))
                .collect();
            Ok(Value::List(out.into()))
        }),
    );
    m
}

/// consul-template's `[tag.]name[@dc][~near][|filter,...]`.
static SERVICE_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\A((?P<tag>[\w=:.\-]+)\.)?(?P<name>[\w\-]+)(@(?P<dc>[\w.\-]+))?(~(?P<near>[\w.\-]+))?(\|(?P<filter>[\w,]+))?\z")
        .expect("valid")
});
/// consul-template's KV argument: `[/]key[@dc]`.
static KV_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\A/?(?P<key>[^@]+)(@(?P<dc>[\w.\-]+))?\z").expect("valid"));
/// `services`' argument: `[@dc]`.
static CATALOG_RE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\A(@(?P<dc>[\w.\-]+))?\z").expect("valid"));

fn kv_ref(func: &str, arg: &str) -> Result<(String, String), TemplateError> {
    let c = KV_RE.captures(arg).ok_or_else(|| err(func, format!("kv: invalid format: {arg:?}")))?;
    Ok((c["key"].to_string(), c.name("dc").map(|m| m.as_str().to_string()).unwrap_or_default()))
}

/// The `service` argument (its parts joined with `|`) as a dependency.
pub(super) fn service_ref(arg: &str) -> Result<Dependency, String> {
    let c = SERVICE_RE.captures(arg).ok_or_else(|| format!("health.service: invalid format: {arg:?}"))?;
    let get = |n: &str| c.name(n).map(|m| m.as_str().to_string()).unwrap_or_default();
    let mut filters = Vec::new();
    for f in get("filter").split(',').map(str::trim).filter(|f| !f.is_empty()) {
        match f {
            "any" | "passing" | "warning" | "critical" | "maintenance" => filters.push(f.to_string()),
            _ => return Err(format!("health.service: invalid filter: {f:?} in {arg:?}")),
        }
    }
    if filters.is_empty() {
        filters.push("passing".into());
    }
    filters.sort();
    Ok(Dependency::ConsulService { name: get("name"), tag: get("tag"), dc: get("dc"), near: get("near"), filters })
}

fn first(entries: &Json) -> &Json {
    entries.as_array().and_then(|a| a.first()).unwrap_or(&Json::Null)
}

/// A KV entry's value: Consul sends it base64-encoded (null when empty).
fn kv_value(entry: &Json) -> String {
    let raw = field(entry, "Value").as_str().unwrap_or_default();
    crate::client::base64::decode(raw).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// consul-template's `KeyPair`: `Key` relative to the prefix, `Path` the full key.
fn key_pair(e: &Json, full: &str, key: &str) -> Value {
    map([
        ("Path", Value::String(full.into())),
        ("Key", Value::String(key.into())),
        ("Value", Value::String(kv_value(e).into())),
        ("Exists", Value::Bool(true)),
        ("CreateIndex", json_to_value(field(e, "CreateIndex"))),
        ("ModifyIndex", json_to_value(field(e, "ModifyIndex"))),
        ("LockIndex", json_to_value(field(e, "LockIndex"))),
        ("Flags", json_to_value(field(e, "Flags"))),
        ("Session", Value::String(field(e, "Session").as_str().unwrap_or_default().into())),
    ])
}

/// Consul's `HealthChecks.AggregatedStatus`: maintenance, then critical, warning, passing.
fn aggregated_status(checks: &Json) -> &'static str {
    let checks = checks.as_array().map(Vec::as_slice).unwrap_or_default();
    let id = |c: &Json| field(c, "CheckID").as_str().unwrap_or_default().to_string();
    if checks.iter().any(|c| id(c) == "_node_maintenance" || id(c).starts_with("_service_maintenance:")) {
        return "maintenance";
    }
    let has = |s: &str| checks.iter().any(|c| field(c, "Status") == s);
    if has("critical") {
        "critical"
    } else if has("warning") {
        "warning"
    } else {
        "passing"
    }
}

fn sorted_tags(tags: &Json) -> Value {
    let mut tags: Vec<&str> = tags.as_array().into_iter().flatten().filter_map(Json::as_str).collect();
    tags.sort_unstable();
    Value::List(tags.into_iter().map(|t| Value::String(t.into())).collect::<Vec<_>>().into())
}

/// consul-template's `HealthService` from one `/v1/health/service` entry, with its node and ID
/// (the sort keys).
fn health_service(e: &Json, status: &str) -> (String, String, Value) {
    let (node, svc) = (field(e, "Node"), field(e, "Service"));
    let node_name = field(node, "Node").as_str().unwrap_or_default().to_string();
    let id = field(svc, "ID").as_str().unwrap_or_default().to_string();
    let address = match field(svc, "Address").as_str().unwrap_or_default() {
        "" => field(node, "Address").clone(),
        a => Json::String(a.into()),
    };
    let value = map([
        ("Node", Value::String(node_name.as_str().into())),
        ("NodeID", json_to_value(field(node, "ID"))),
        ("NodeAddress", json_to_value(field(node, "Address"))),
        ("NodeDatacenter", json_to_value(field(node, "Datacenter"))),
        ("NodeTaggedAddresses", json_to_value(field(node, "TaggedAddresses"))),
        ("NodeMeta", json_to_value(field(node, "Meta"))),
        ("ServiceMeta", json_to_value(field(svc, "Meta"))),
        ("Address", json_to_value(&address)),
        ("ServiceTaggedAddresses", json_to_value(field(svc, "TaggedAddresses"))),
        ("ID", Value::String(id.as_str().into())),
        ("Name", json_to_value(field(svc, "Service"))),
        ("Kind", json_to_value(field(svc, "Kind"))),
        ("Tags", sorted_tags(field(svc, "Tags"))),
        ("Checks", json_to_value(field(e, "Checks"))),
        ("Status", Value::String(status.into())),
        ("Port", json_to_value(field(svc, "Port"))),
        ("Weights", json_to_value(field(svc, "Weights"))),
        ("Namespace", json_to_value(field(svc, "Namespace"))),
    ]);
    (node_name, id, value)
}

#[cfg(test)]
#[path = "consul_tests.rs"]
mod tests;
