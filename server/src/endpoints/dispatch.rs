//! `Job.Dispatch`: a child of a parameterized job, with its payload and meta.

use std::collections::BTreeMap;

use base64::Engine;
use nomad_proto::eval::trigger;
use nomad_proto::{Evaluation, Job};
use serde::Serialize;

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

/// The largest payload a dispatch may carry, uncompressed (Nomad's `DispatchPayloadSizeLimit`).
pub const DISPATCH_PAYLOAD_SIZE_LIMIT: usize = 16 * 1024;

/// The longest `IdPrefixTemplate` accepted (ours: it becomes part of the child's ID).
const MAX_ID_PREFIX_TEMPLATE: usize = 128;

/// What `/v1/job/<id>/dispatch` asks.
#[derive(Debug, Clone, Default)]
pub struct DispatchRequest {
    /// The payload, decoded.
    pub payload: Vec<u8>,
    /// Meta merged over the job's.
    pub meta: BTreeMap<String, String>,
    /// Put into the child's ID: `<job>/dispatch-<template>-<unix>-<8 hex>`.
    pub id_prefix_template: String,
    /// A retried dispatch with the same token returns the child it made.
    pub idempotency_token: String,
}

/// Reply to a dispatch, in Nomad's shape.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DispatchResponse {
    /// The child job.
    #[serde(rename = "DispatchedJobID")]
    pub dispatched_job_id: String,
    /// Its eval (empty for a periodic child, which its own schedule launches).
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Index of the eval.
    pub eval_create_index: u64,
    /// Index the child was created at.
    pub job_create_index: u64,
    /// Index of the write.
    pub index: u64,
}

/// Nomad's `validateDispatchRequest`: the payload rule and size, then the meta keys.
fn validate_dispatch(req: &DispatchRequest, job: &Job) -> Result<(), String> {
    let rules = job.parameterized_job.as_ref().expect("checked by the caller");
    let has_payload = !req.payload.is_empty();
    match rules.payload.as_str() {
        "required" if !has_payload => return Err("Payload is not provided but required by parameterized job".into()),
        "forbidden" if has_payload => return Err("Payload provided but forbidden by parameterized job".into()),
        _ => {}
    }
    if req.payload.len() > DISPATCH_PAYLOAD_SIZE_LIMIT {
        return Err(format!("Payload exceeds maximum size; {} > {}", req.payload.len(), DISPATCH_PAYLOAD_SIZE_LIMIT));
    }
    let allowed = |k: &String| rules.meta_required.contains(k) || rules.meta_optional.contains(k);
    let unpermitted: Vec<&str> = req.meta.keys().filter(|k| !allowed(k)).map(String::as_str).collect();
    if !unpermitted.is_empty() {
        return Err(format!("Dispatch request included unpermitted metadata keys: [{}]", unpermitted.join(" ")));
    }
    let missing: Vec<&str> = rules.meta_required.iter().filter(|k| !req.meta.contains_key(*k)).map(String::as_str).collect();
    if !missing.is_empty() {
        return Err(format!("Dispatch did not provide required meta keys: [{}]", missing.join(" ")));
    }
    Ok(())
}

/// The template goes into a job ID: none of what job IDs may not hold, and a bounded length.
fn check_id_prefix_template(t: &str) -> Result<(), String> {
    if t.len() > MAX_ID_PREFIX_TEMPLATE {
        return Err(format!("IdPrefixTemplate is {} bytes; at most {MAX_ID_PREFIX_TEMPLATE} are allowed", t.len()));
    }
    if t.contains('/') || t.contains("..") || t.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "IdPrefixTemplate {:?} may not contain '/', '..', whitespace or control characters",
            nomad_proto::validate::escape_unsafe_chars(t, &[])
        ));
    }
    Ok(())
}

/// `<parent>/dispatch-[<template>-]<unix seconds>-<8 hex>` (Nomad's `DispatchedID`).
fn dispatched_id(parent: &str, template: &str, unix: i64) -> String {
    let uuid = uuid::Uuid::new_v4().to_string();
    let short = &uuid[..8];
    if template.is_empty() { format!("{parent}/dispatch-{unix}-{short}") } else { format!("{parent}/dispatch-{template}-{unix}-{short}") }
}

impl Endpoints {
    /// `Job.Dispatch`: checks the request against the parameterized job, returns the live child
    /// an idempotency token already made, or registers a new child (its payload
    /// snappy-compressed, as Nomad stores it) with an eval, in one command.
    pub async fn job_dispatch(&self, namespace: &str, job_id: &str, req: DispatchRequest) -> Result<DispatchResponse, EndpointError> {
        if job_id.is_empty() {
            return Err(EndpointError::BadRequest("missing parameterized job ID".into()));
        }
        check_id_prefix_template(&req.id_prefix_template).map_err(EndpointError::BadRequest)?;
        let snap = self.store.snapshot();
        let Some(parent) = snap.job(namespace, job_id).cloned() else {
            return Err(EndpointError::NotFound("parameterized job not found".into()));
        };
        if !parent.is_parameterized() {
            return Err(EndpointError::BadRequest(format!("Specified job {job_id:?} is not a parameterized job")));
        }
        if parent.stop {
            return Err(EndpointError::BadRequest(format!("Specified job {job_id:?} is stopped")));
        }
        validate_dispatch(&req, &parent).map_err(EndpointError::BadRequest)?;
        if !req.idempotency_token.is_empty() {
            let children = format!("{job_id}/");
            let earlier = snap
                .jobs_by_prefix(Some(namespace), &children)
                .find(|j| j.parent_id == parent.id && j.dispatch_idempotency_token == req.idempotency_token);
            if let Some(child) = earlier {
                return Ok(DispatchResponse {
                    dispatched_job_id: child.id.clone(),
                    job_create_index: child.create_index,
                    index: child.modify_index,
                    ..DispatchResponse::default()
                });
            }
        }
        let now = self.now();
        let mut child: Job = (*parent).clone();
        child.id = dispatched_id(&parent.id, &req.id_prefix_template, now.unix_nanos().div_euclid(1_000_000_000));
        child.name = child.id.clone();
        child.parent_id = parent.id.clone();
        child.dispatched = true;
        child.dispatch_idempotency_token = req.idempotency_token.clone();
        child.meta.extend(req.meta);
        let compressed = snap::raw::Encoder::new()
            .compress_vec(&req.payload)
            .map_err(|e| EndpointError::Internal(format!("compressing the dispatch payload: {e}")))?;
        child.payload = Some(base64::engine::general_purpose::STANDARD.encode(compressed));
        let eval = child.periodic.is_none().then(|| Evaluation::for_job(&child, trigger::JOB_REGISTER, now));
        let eval_id = eval.as_ref().map(|e| e.id.clone()).unwrap_or_default();
        let child_id = child.id.clone();
        let index = self.consensus.apply(Command::JobRegister { job: child, eval, now }).await?;
        Ok(DispatchResponse {
            dispatched_job_id: child_id,
            eval_create_index: if eval_id.is_empty() { 0 } else { index },
            eval_id,
            job_create_index: index,
            index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nomad_proto::job::ParameterizedJobConfig;

    fn parameterized(payload: &str, required: &[&str], optional: &[&str]) -> Job {
        Job {
            parameterized_job: Some(ParameterizedJobConfig {
                payload: payload.into(),
                meta_required: required.iter().map(|s| s.to_string()).collect(),
                meta_optional: optional.iter().map(|s| s.to_string()).collect(),
            }),
            ..Job::default()
        }
    }

    fn req(payload: &[u8], meta: &[(&str, &str)]) -> DispatchRequest {
        DispatchRequest {
            payload: payload.to_vec(),
            meta: meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..DispatchRequest::default()
        }
    }

    #[test]
    fn dispatch_requests_are_checked_with_nomads_messages() {
        let job = parameterized("required", &["a"], &["b"]);
        assert_eq!(
            validate_dispatch(&req(b"", &[("a", "1")]), &job).unwrap_err(),
            "Payload is not provided but required by parameterized job"
        );
        let job = parameterized("forbidden", &[], &[]);
        assert_eq!(validate_dispatch(&req(b"x", &[]), &job).unwrap_err(), "Payload provided but forbidden by parameterized job");
        let job = parameterized("optional", &["a"], &["b"]);
        let big = vec![b'x'; DISPATCH_PAYLOAD_SIZE_LIMIT + 1];
        assert_eq!(validate_dispatch(&req(&big, &[("a", "1")]), &job).unwrap_err(), "Payload exceeds maximum size; 16385 > 16384");
        assert_eq!(
            validate_dispatch(&req(b"", &[("a", "1"), ("c", "2")]), &job).unwrap_err(),
            "Dispatch request included unpermitted metadata keys: [c]"
        );
        assert_eq!(validate_dispatch(&req(b"", &[("b", "2")]), &job).unwrap_err(), "Dispatch did not provide required meta keys: [a]");
        validate_dispatch(&req(&vec![b'x'; DISPATCH_PAYLOAD_SIZE_LIMIT], &[("a", "1"), ("b", "2")]), &job).unwrap();
    }

    #[test]
    fn id_prefix_templates_cannot_reshape_the_child_id() {
        check_id_prefix_template("run1").unwrap();
        check_id_prefix_template("").unwrap();
        for bad in ["a/b", "..", "a b", "x\ny"] {
            assert!(check_id_prefix_template(bad).is_err(), "{bad:?}");
        }
        assert!(check_id_prefix_template(&"x".repeat(MAX_ID_PREFIX_TEMPLATE + 1)).is_err());
        let id = dispatched_id("batch", "run1", 1700000000);
        assert!(id.starts_with("batch/dispatch-run1-1700000000-") && id.len() == "batch/dispatch-run1-1700000000-".len() + 8, "{id}");
        let id = dispatched_id("batch", "", 1700000000);
        assert!(id.starts_with("batch/dispatch-1700000000-"), "{id}");
    }
}
