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

use super::{Answer, Dependency};
use crate::client::task_api::TaskApi;

/// Most bytes of one answer (a variable is at most 64 KiB; a service list can be long).
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// Fetches a dependency's data.
pub trait TemplateSource: Send + Sync {
    /// The answer for `dep` and its index, once the index passes `index` (0: at once) or the
    /// source's wait elapses (then the same answer again).
    fn fetch<'a>(&'a self, dep: &'a Dependency, index: u64) -> BoxFuture<'a, Result<(Answer, u64), String>>;
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
            }
        })
    }
}
