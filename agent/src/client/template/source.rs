//! Where template data comes from.
//!
//! Nomad data is read from the agent's own HTTP router in process, as Nomad's template runner
//! reads it through an in-memory listener: the same routes, authorization and forwarding to the
//! servers as any client gets, with the task's workload identity as the token. Each fetch is a
//! blocking query from the last index seen, so a change is seen when it happens.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use serde_json::json;

use super::{Answer, Dependency};
use crate::client::task_api::TaskApi;
use crate::consul::ConsulQuery;

/// Most bytes of one answer (a variable is at most 64 KiB; a service list can be long).
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// Fetches a dependency's data.
pub trait TemplateSource: Send + Sync {
    /// The answer for `dep` and its index, once the index passes `index` (0: at once) or the
    /// source's wait elapses (then the same answer again).
    fn fetch<'a>(&'a self, dep: &'a Dependency, index: u64) -> BoxFuture<'a, Result<(Answer, u64), String>>;

    /// Whether Consul dependencies can be fetched (the agent has a `consul {}` block).
    fn serves_consul(&self) -> bool {
        false
    }
}

/// [`TemplateSource`] over the agent's router.
pub struct RouterSource {
    api: Arc<TaskApi>,
    token: String,
    wait: Duration,
}

impl RouterSource {
    /// Reads with `token` (the task's workload identity), each blocking query for at most `wait`.
    pub fn new(api: Arc<TaskApi>, token: String, wait: Duration) -> RouterSource {
        RouterSource { api, token, wait }
    }

    async fn get(&self, path: &str, index: u64) -> Result<(u16, u64, serde_json::Value), String> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let uri = format!("{path}{sep}index={index}&wait={}s", self.wait.as_secs().max(1));
        let req = http::Request::get(&uri)
            .header("X-Nomad-Token", &self.token)
            .body(Body::empty())
            .map_err(|e| format!("bad request {uri}: {e}"))?;
        let resp = self.api.call(req).await?;
        let status = resp.status().as_u16();
        let index = resp.headers().get("x-nomad-index").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
        let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("reading {path}: {e}"))?
            .to_bytes();
        if status == 404 {
            return Ok((status, index, serde_json::Value::Null));
        }
        if status != 200 {
            return Err(format!("{path}: {status}: {}", String::from_utf8_lossy(&body).trim()));
        }
        let value = serde_json::from_slice(&body).map_err(|e| format!("{path}: bad JSON: {e}"))?;
        Ok((status, index, value))
    }
}

/// `s` with every byte outside the unreserved set percent-encoded, `/` kept.
fn escape_path(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace("%2F", "/").replace('+', "%20")
}

fn escape(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl TemplateSource for RouterSource {
    fn fetch<'a>(&'a self, dep: &'a Dependency, index: u64) -> BoxFuture<'a, Result<(Answer, u64), String>> {
        Box::pin(async move {
            match dep {
                Dependency::NomadVar { path, namespace } => {
                    let (status, index, v) =
                        self.get(&format!("/v1/var/{}?namespace={}", escape_path(path), escape(namespace)), index).await?;
                    Ok(((status == 200).then_some(v), index))
                }
                Dependency::NomadVarList { prefix, namespace } => {
                    let (_, index, v) =
                        self.get(&format!("/v1/vars?prefix={}&namespace={}", escape(prefix), escape(namespace)), index).await?;
                    Ok((Some(v), index))
                }
                Dependency::NomadService { name, namespace, .. } => {
                    let (status, index, v) =
                        self.get(&format!("/v1/service/{}?namespace={}", escape_path(name), escape(namespace)), index).await?;
                    Ok((Some(if status == 200 { v } else { serde_json::json!([]) }), index))
                }
                Dependency::NomadServices { namespace } => {
                    let (_, index, v) = self.get(&format!("/v1/services?namespace={}", escape(namespace)), index).await?;
                    Ok((Some(v), index))
                }
                Dependency::File { .. } => Err("files are read by the template manager".to_string()),
                _ => Err(format!("{dep} is not Nomad data")),
            }
        })
    }
}

/// [`TemplateSource`] for Consul data, over the agent's Consul client (its address, token and
/// namespace), by blocking queries as consul-template makes them.
pub struct ConsulSource {
    consul: Arc<dyn ConsulQuery>,
    wait: Duration,
}

impl ConsulSource {
    /// Reads through `consul`, each blocking query held for at most `wait`.
    pub fn new(consul: Arc<dyn ConsulQuery>, wait: Duration) -> ConsulSource {
        ConsulSource { consul, wait }
    }
}

/// `path` with `dc=` (and the other non-empty `params`) added.
fn consul_path(path: String, dc: &str, params: &[(&str, &str)]) -> String {
    let mut query: Vec<String> = params.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={}", escape(v))).collect();
    if !dc.is_empty() {
        query.push(format!("dc={}", escape(dc)));
    }
    if query.is_empty() { path } else { format!("{path}?{}", query.join("&")) }
}

impl TemplateSource for ConsulSource {
    fn fetch<'a>(&'a self, dep: &'a Dependency, index: u64) -> BoxFuture<'a, Result<(Answer, u64), String>> {
        Box::pin(async move {
            let (path, absent) = match dep {
                Dependency::ConsulKey { key, dc, .. } => (consul_path(format!("/v1/kv/{}", escape_path(key)), dc, &[]), None),
                Dependency::ConsulKeys { prefix, dc } => {
                    (consul_path(format!("/v1/kv/{}", escape_path(prefix)), dc, &[("recurse", "true")]), Some(json!([])))
                }
                Dependency::ConsulService { name, tag, dc, near, filters } => {
                    let passing = if filters.iter().map(String::as_str).eq(["passing"]) { "true" } else { "" };
                    let path = consul_path(
                        format!("/v1/health/service/{}", escape_path(name)),
                        dc,
                        &[("tag", tag), ("near", near), ("passing", passing)],
                    );
                    (path, Some(json!([])))
                }
                Dependency::ConsulServices { dc } => (consul_path("/v1/catalog/services".into(), dc, &[]), Some(json!({}))),
                _ => return Err(format!("{dep} is not Consul data")),
            };
            let (answer, index) = self.consul.query(&path, index, self.wait).await.map_err(|e| e.to_string())?;
            Ok((answer.or(absent), index))
        })
    }

    fn serves_consul(&self) -> bool {
        true
    }
}

/// A task's sources: Nomad data from the agent's router, Consul data from Consul when the
/// agent has a `consul {}` block.
pub struct TaskSources {
    /// Nomad data.
    pub nomad: RouterSource,
    /// Consul data.
    pub consul: Option<ConsulSource>,
}

impl TemplateSource for TaskSources {
    fn fetch<'a>(&'a self, dep: &'a Dependency, index: u64) -> BoxFuture<'a, Result<(Answer, u64), String>> {
        match (&self.consul, dep.is_consul()) {
            (_, false) => self.nomad.fetch(dep, index),
            (Some(c), true) => c.fetch(dep, index),
            (None, true) => Box::pin(async move { Err(format!("{dep}: this client has no consul {{}} block")) }),
        }
    }

    fn serves_consul(&self) -> bool {
        self.consul.is_some()
    }
}
