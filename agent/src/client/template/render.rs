//! One template: compiled once with its functions, executed against the [`Store`] as often as
//! the data changes. A data function that finds no answer records its dependency as missing
//! and returns a zero value, as consul-template's do; the caller writes nothing until nothing
//! is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gotmpl::{FuncMap, MissingKey, TemplateError, Value};
use serde_json::Value as Json;

use super::methods::MethodTable;
use super::{Answer, Dependency, Store, funcs};
use crate::client::taskrunner::lock;

/// Most bytes one render may produce.
pub const MAX_OUTPUT: usize = 16 * 1024 * 1024;
/// Most `range` iterations one render may take.
const MAX_RANGE_ITERS: u64 = 10_000_000;
/// The methods Go templates call on the values our functions return (`NomadVarItems`).
const METHODS: [&str; 6] = ["Keys", "Values", "Tuples", "Metadata", "Parent", "ItemsMap"];

/// What a template is rendered with, beyond its text.
#[derive(Clone)]
pub struct RenderContext {
    /// The answers.
    pub store: Arc<Store>,
    /// The job's namespace: the default of `nomadVar` and `nomadService`.
    pub namespace: String,
    /// The task env `env` reads (host variables masked).
    pub env: Arc<BTreeMap<String, String>>,
    /// Functions that error "function is disabled".
    pub denylist: Vec<String>,
    /// The task dir on the host: `file` reads beneath it unless the sandbox is off.
    pub task_dir: PathBuf,
    /// No sandbox for `file`.
    pub sandbox_disabled: bool,
    /// The agent has Consul: the Consul functions work.
    pub consul: bool,
}

/// A compiled template.
pub struct Compiled {
    template: gotmpl::Template,
    scope: Arc<Scope>,
}

/// What one execution produced.
#[derive(Debug, PartialEq)]
pub enum Rendered {
    /// Everything was there.
    Complete(String),
    /// Data is missing: nothing may be written.
    Missing(BTreeSet<Dependency>),
}

/// What a compiled template's functions share: the store, and what this execution used.
pub(super) struct Scope {
    store: Arc<Store>,
    namespace: String,
    task_dir: PathBuf,
    sandbox_disabled: bool,
    methods: Arc<MethodTable>,
    used: Mutex<BTreeSet<Dependency>>,
    missing: Mutex<BTreeSet<Dependency>>,
}

impl Scope {
    /// The answer for `dep`, recording it as used, and as missing while it has none.
    pub(super) fn answer(&self, dep: Dependency) -> Option<Answer> {
        let answer = self.store.get(&dep);
        if answer.is_none() {
            lock(&self.missing).insert(dep.clone());
        }
        lock(&self.used).insert(dep);
        answer
    }

    pub(super) fn mark_missing(&self, dep: Dependency) {
        lock(&self.missing).insert(dep);
    }
}

pub(super) fn err(func: &str, message: impl std::fmt::Display) -> TemplateError {
    TemplateError::Exec(format!("error calling {func}: {message}"))
}

pub(super) fn str_arg<'a>(func: &str, args: &'a [Value], i: usize) -> Result<&'a str, TemplateError> {
    args.get(i).and_then(Value::as_str).ok_or_else(|| err(func, format!("argument {} must be a string", i + 1)))
}

impl Compiled {
    /// Compiles `source` with `left`/`right` delimiters.
    pub fn new(
        name: &str,
        source: &str,
        left: &str,
        right: &str,
        error_on_missing_key: bool,
        ctx: &RenderContext,
    ) -> Result<Compiled, String> {
        let methods = Arc::new(MethodTable::default());
        let scope = Arc::new(Scope {
            store: ctx.store.clone(),
            namespace: ctx.namespace.clone(),
            task_dir: ctx.task_dir.clone(),
            sandbox_disabled: ctx.sandbox_disabled,
            methods: methods.clone(),
            used: Mutex::default(),
            missing: Mutex::default(),
        });
        let mut map = funcs::pure_funcs();
        map.extend(funcs::env_funcs(ctx.env.clone()));
        map.extend(data_funcs(&scope));
        map.extend(super::consul::consul_funcs(&scope, ctx.consul));
        funcs::deny(&mut map, &ctx.denylist);
        let missing_key = if error_on_missing_key { MissingKey::Error } else { MissingKey::Invalid };
        let template = super::methods::compile(name, source, left, right, missing_key, map, &METHODS, methods)?;
        Ok(Compiled { template: template.max_range_iters(MAX_RANGE_ITERS), scope })
    }

    /// Executes the template against the store's current answers.
    pub fn render(&self) -> Result<Rendered, String> {
        lock(&self.scope.used).clear();
        lock(&self.scope.missing).clear();
        self.scope.methods.clear();
        let out = self.template.execute_to_string(&Value::Nil).map_err(|e| e.to_string());
        let missing = std::mem::take(&mut *lock(&self.scope.missing));
        if !missing.is_empty() {
            // A function error caused by missing data (an index into an empty value) waits too.
            return Ok(Rendered::Missing(missing));
        }
        let out = out?;
        if out.len() > MAX_OUTPUT {
            return Err(format!("rendered template is larger than {MAX_OUTPUT} bytes"));
        }
        Ok(Rendered::Complete(out))
    }

    /// What the last execution read.
    pub fn used(&self) -> BTreeSet<Dependency> {
        lock(&self.scope.used).clone()
    }
}

/// Splits `path@namespace[.region]` (consul-template's `nomadVar` argument).
fn var_ref(arg: &str, default_ns: &str) -> (String, String) {
    match arg.rsplit_once('@') {
        Some((path, ns)) => {
            let ns = ns.split('.').next().unwrap_or_default();
            (path.to_string(), if ns.is_empty() { default_ns.to_string() } else { ns.to_string() })
        }
        None => (arg.to_string(), default_ns.to_string()),
    }
}

pub(super) fn json_to_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            n.as_i64().map(Value::Int).or_else(|| n.as_u64().map(Value::Uint)).unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(0.0)))
        }
        Json::String(s) => Value::String(s.as_str().into()),
        Json::Array(a) => Value::List(a.iter().map(json_to_value).collect::<Vec<_>>().into()),
        Json::Object(o) => Value::Map(Arc::new(o.iter().map(|(k, v)| (Arc::from(k.as_str()), json_to_value(v))).collect())),
    }
}

pub(super) fn map(entries: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Map(Arc::new(entries.into_iter().map(|(k, v)| (Arc::from(k), v)).collect()))
}

pub(super) fn field<'a>(v: &'a Json, name: &str) -> &'a Json {
    v.get(name).unwrap_or(&Json::Null)
}

/// A variable's metadata as consul-template's `NomadVarMeta` (times in ns).
fn var_meta(v: &Json) -> Value {
    map(["Namespace", "Path", "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime"].map(|k| (k, json_to_value(field(v, k)))))
}

/// `nomadVar`'s value: the items (each prints its value), with `NomadVarItems`' methods.
fn var_items(scope: &Scope, v: &Json) -> Value {
    let items: BTreeMap<Arc<str>, Value> = field(v, "Items")
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (Arc::from(k.as_str()), Value::String(v.as_str().unwrap_or_default().into()))).collect())
        .unwrap_or_default();
    let keys: Vec<Value> = items.keys().map(|k| Value::String(k.clone())).collect();
    let values: Vec<Value> = items.values().cloned().collect();
    let tuples: Vec<Value> = items.iter().map(|(k, v)| map([("K", Value::String(k.clone())), ("V", v.clone())])).collect();
    let meta = var_meta(v);
    let value = Value::Map(Arc::new(items.clone()));
    let methods = BTreeMap::from([
        ("Keys".to_string(), Value::List(keys.into())),
        ("Values".to_string(), Value::List(values.into())),
        ("Tuples".to_string(), Value::List(tuples.into())),
        ("Metadata".to_string(), meta.clone()),
        ("Parent".to_string(), map([("Metadata", meta), ("Items", Value::Map(Arc::new(items.clone())))])),
        ("ItemsMap".to_string(), Value::Map(Arc::new(items))),
    ]);
    scope.methods.register(&value, methods);
    value
}

/// A registration from `/v1/service/:name` as consul-template's `NomadService`.
fn service_value(s: &Json) -> Value {
    map([
        ("ID", json_to_value(field(s, "ID"))),
        ("Name", json_to_value(field(s, "ServiceName"))),
        ("Namespace", json_to_value(field(s, "Namespace"))),
        ("Node", json_to_value(field(s, "NodeID"))),
        ("Datacenter", json_to_value(field(s, "Datacenter"))),
        ("Tags", json_to_value(field(s, "Tags"))),
        ("JobID", json_to_value(field(s, "JobID"))),
        ("AllocID", json_to_value(field(s, "AllocID"))),
        ("Address", json_to_value(field(s, "Address"))),
        ("Port", json_to_value(field(s, "Port"))),
    ])
}

/// Rendezvous choice of `n` registrations for `key` (the 3-argument `nomadService`): stable for
/// one key while the set is stable, and moving few when it changes.
fn choose(services: &mut Vec<&Json>, n: usize, key: &str) {
    use sha2::Digest;
    let score = |s: &&Json| sha2::Sha256::digest(format!("{}{key}", field(s, "ID").as_str().unwrap_or_default()).as_bytes()).to_vec();
    services.sort_by_cached_key(score);
    services.truncate(n);
}

/// Parses `[tag.]name[@region]`.
fn service_ref(arg: &str) -> (String, String) {
    let name = arg.split('@').next().unwrap_or_default();
    match name.rsplit_once('.') {
        Some((tag, name)) => (tag.to_string(), name.to_string()),
        None => (String::new(), name.to_string()),
    }
}

/// The data functions, sharing `scope`.
fn data_funcs(scope: &Arc<Scope>) -> FuncMap {
    let mut m = FuncMap::new();
    let s = scope.clone();
    m.insert(
        "nomadVar".into(),
        Arc::new(move |args: &[Value]| {
            let (path, namespace) = var_ref(str_arg("nomadVar", args, 0)?, &s.namespace);
            let dep = Dependency::NomadVar { path, namespace };
            match s.answer(dep.clone()) {
                Some(Some(v)) => Ok(var_items(&s, &v)),
                // Waits until the variable exists.
                Some(None) => {
                    s.mark_missing(dep);
                    Ok(Value::Map(Arc::default()))
                }
                None => Ok(Value::Map(Arc::default())),
            }
        }),
    );
    let s = scope.clone();
    m.insert(
        "nomadVarExists".into(),
        Arc::new(move |args: &[Value]| {
            let (path, namespace) = var_ref(str_arg("nomadVarExists", args, 0)?, &s.namespace);
            Ok(Value::Bool(matches!(s.answer(Dependency::NomadVar { path, namespace }), Some(Some(_)))))
        }),
    );
    for (name, safe) in [("nomadVarList", false), ("nomadVarListSafe", true)] {
        let s = scope.clone();
        m.insert(
            name.into(),
            Arc::new(move |args: &[Value]| {
                let arg = match args.first() {
                    Some(v) => v.as_str().ok_or_else(|| err(name, "argument 1 must be a string"))?,
                    None => "",
                };
                let (prefix, namespace) = var_ref(arg, &s.namespace);
                let dep = Dependency::NomadVarList { prefix, namespace };
                let list: Vec<Value> = match s.answer(dep.clone()) {
                    Some(Some(Json::Array(a))) => a.iter().map(var_meta).collect(),
                    _ => Vec::new(),
                };
                if safe && list.is_empty() {
                    s.mark_missing(dep);
                }
                Ok(Value::List(list.into()))
            }),
        );
    }
    let s = scope.clone();
    m.insert(
        "nomadService".into(),
        Arc::new(move |args: &[Value]| {
            let (count, key, arg) = match args.len() {
                1 => (None, "", str_arg("nomadService", args, 0)?),
                3 => {
                    let n =
                        args[0].as_int().filter(|n| *n > 0).ok_or_else(|| err("nomadService", "the count must be a positive integer"))?;
                    (Some(n as usize), str_arg("nomadService", args, 1)?, str_arg("nomadService", args, 2)?)
                }
                n => return Err(err("nomadService", format!("expected 1 or 3 arguments, got {n}"))),
            };
            let (tag, name) = service_ref(arg);
            let dep = Dependency::NomadService { name, tag: tag.clone(), namespace: s.namespace.clone() };
            let Some(Some(Json::Array(all))) = s.answer(dep) else { return Ok(Value::List(Vec::new().into())) };
            let mut chosen: Vec<&Json> = all
                .iter()
                .filter(|r| {
                    tag.is_empty() || field(r, "Tags").as_array().is_some_and(|t| t.iter().any(|x| x.as_str() == Some(tag.as_str())))
                })
                .collect();
            if let Some(n) = count {
                choose(&mut chosen, n, key);
            }
            Ok(Value::List(chosen.into_iter().map(service_value).collect::<Vec<_>>().into()))
        }),
    );
    let s = scope.clone();
    m.insert(
        "nomadServices".into(),
        Arc::new(move |args: &[Value]| {
            let namespace = match args.first().and_then(Value::as_str) {
                Some(a) => a.trim_start_matches('@').split('.').next().unwrap_or_default().to_string(),
                None => s.namespace.clone(),
            };
            let Some(Some(Json::Array(stubs))) = s.answer(Dependency::NomadServices { namespace }) else {
                return Ok(Value::List(Vec::new().into()));
            };
            let mut out: Vec<Value> = Vec::new();
            for stub in &stubs {
                for svc in field(stub, "Services").as_array().into_iter().flatten() {
                    out.push(map([("Name", json_to_value(field(svc, "ServiceName"))), ("Tags", json_to_value(field(svc, "Tags")))]));
                }
            }
            Ok(Value::List(out.into()))
        }),
    );
    let s = scope.clone();
    m.insert(
        "file".into(),
        Arc::new(move |args: &[Value]| {
            let path = file_dep(&s, str_arg("file", args, 0)?).map_err(|e| err("file", e))?;
            let dep = Dependency::File { path };
            match s.answer(dep.clone()) {
                Some(Some(Json::String(content))) => Ok(Value::String(content.into())),
                // Waits until the file exists.
                Some(_) => {
                    s.mark_missing(dep);
                    Ok(Value::String("".into()))
                }
                None => Ok(Value::String("".into())),
            }
        }),
    );
    for name in ["secret", "secrets", "pkiCert"] {
        m.insert(name.into(), Arc::new(move |_: &[Value]| Err(err(name, "Vault is not supported by nomad-rs"))));
    }
    for name in ["node", "nodes", "datacenters", "connect", "caRoots", "caLeaf"] {
        m.insert(name.into(), Arc::new(move |_: &[Value]| Err(err(name, "not supported by nomad-rs yet"))));
    }
    m.insert("sockaddr".into(), super::sockaddr::sockaddr_func());
    for name in ["executeTemplate", "scratch"] {
        m.insert(name.into(), Arc::new(move |_: &[Value]| Err(err(name, "not supported by nomad-rs"))));
    }
    m
}

/// The path `file` reads, relative to the task dir; outside it only without the sandbox.
fn file_dep(scope: &Scope, arg: &str) -> Result<PathBuf, String> {
    let path = Path::new(arg);
    let rel = if path.is_absolute() {
        match path.strip_prefix(&scope.task_dir) {
            Ok(rel) => rel.to_path_buf(),
            Err(_) if scope.sandbox_disabled => return Ok(path.to_path_buf()),
            Err(_) => return Err(format!("{arg:?} is outside of the task's sandbox {}", scope.task_dir.display())),
        }
    } else {
        path.to_path_buf()
    };
    if !scope.sandbox_disabled && rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(format!("{arg:?} is outside of the task's sandbox {}", scope.task_dir.display()));
    }
    Ok(rel)
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
