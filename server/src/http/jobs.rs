//! `/v1/jobs` and `/v1/job/<id>[/<action>]`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::{AllocStubFields, Job, JobSummary};
use serde::Deserialize;

use super::HttpState;
use super::util::{
    HttpError, HttpResult, QueryOptions, decode_body, filtered, json_response, list_response, paginate, read_body, require_method,
};
use crate::endpoints::{DispatchRequest, JobRegisterOptions, JobRevertRequest, JobVersionsResponse};
use crate::state::{Table, Watch};

/// Body of `PUT /v1/jobs` (`api.JobRegisterRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobRegisterRequest {
    job: Option<Job>,
    enforce_index: bool,
    job_modify_index: u64,
    policy_override: bool,
    preserve_counts: bool,
    eval_priority: i64,
    region: String,
    namespace: String,
}

/// `GET|PUT|POST /v1/jobs`.
pub async fn jobs(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        match method {
            Method::GET => list_jobs(&s, &q).await,
            Method::PUT | Method::POST => register(&s, &q, None, body).await,
            _ => Err(HttpError::invalid_method()),
        }
    })
    .await
}

async fn list_jobs(s: &HttpState, q: &QueryOptions) -> HttpResult {
    let with_meta = q.bool("meta", false)?;
    let ns = q.namespace_filter().map(str::to_string);
    let (stubs, index) = s
        .endpoints
        .store()
        .blocking_query(&[Table::Jobs, Table::JobSummary], q.min_index, q.wait, |st| {
            let stubs: Vec<_> = st
                .jobs_by_prefix(ns.as_deref(), &q.prefix)
                .map(|j| j.stub(st.job_summary(&j.namespace, &j.id).map(|x| (**x).clone()), with_meta))
                .collect();
            (stubs, st.max_index(&[Table::Jobs, Table::JobSummary]))
        })
        .await;
    let (page, next) = paginate(stubs, q, |j| format!("{}.{}", j.namespace, j.id));
    list_response(&page, next, s.meta(index), q.pretty)
}

async fn register(s: &HttpState, q: &QueryOptions, url_id: Option<&str>, body: Body) -> HttpResult {
    let bytes = read_body(body).await?;
    let req: JobRegisterRequest = decode_body(&bytes)?;
    let _ = (req.policy_override, &req.region);
    let Some(mut job) = req.job else {
        return Err(HttpError::bad_request("Job must be specified"));
    };
    if job.id.is_empty() {
        return Err(HttpError::bad_request("Job ID hasn't been provided"));
    }
    if let Some(id) = url_id
        && id != job.id
    {
        return Err(HttpError::bad_request("Job ID does not match name"));
    }
    if job.job_type == nomad_proto::JobType::System
        && let Some(g) = job.task_groups.iter().find(|g| g.scaling.is_some())
    {
        return Err(HttpError::bad_request(format!("Task group {:?} has a scaling policy, which system jobs do not support", g.name)));
    }
    // Namespace precedence: ?namespace, then the request body, then the job.
    if q.params.get("namespace").is_some_and(|n| !n.is_empty()) {
        job.namespace = q.namespace.clone();
    } else if !req.namespace.is_empty() {
        job.namespace = req.namespace.clone();
    }
    let opts = JobRegisterOptions {
        enforce_index: req.enforce_index,
        job_modify_index: req.job_modify_index,
        preserve_counts: req.preserve_counts,
        eval_priority: req.eval_priority,
    };
    let resp = s.endpoints.job_register(job, opts).await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

/// Body of `PUT /v1/jobs/parse` (`api.JobsParseRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobsParseRequest {
    #[serde(rename = "JobHCL")]
    job_hcl: String,
    #[serde(rename = "hclv1")]
    hcl_v1: bool,
    /// Contents of a variables file.
    variables: String,
    canonicalize: bool,
}

/// `PUT|POST /v1/jobs/parse`: HCL2 to a job, with the same parser the CLI uses.
pub async fn jobs_parse(State(_s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::PUT, Method::POST])?;
        let q = QueryOptions::parse(&uri)?;
        let bytes = read_body(body).await?;
        let req: JobsParseRequest = decode_body(&bytes)?;
        if req.job_hcl.trim().is_empty() {
            return Err(HttpError::bad_request("Job spec is empty"));
        }
        if req.hcl_v1 {
            return Err(HttpError::bad_request("HCLv1 job files are not supported by nomad-rs; use HCL2"));
        }
        // Nomad's parse endpoint never lets a job file read the server's filesystem (AllowFS: false).
        let mut opts = nomad_proto::jobspec::ParseOptions { filename: "input.hcl".into(), allow_fs: false, ..Default::default() };
        if !req.variables.trim().is_empty() {
            opts.var_files.push(("variables.hcl".into(), req.variables.clone()));
        }
        let mut job =
            nomad_proto::jobspec::parse(&req.job_hcl, &opts).map_err(|e| HttpError::bad_request(format!("Failed to parse job: {e}")))?;
        if req.canonicalize {
            job.canonicalize();
        }
        json_response(&job, None, q.pretty)
    })
    .await
}

/// Body of `PUT /v1/validate/job` (`api.JobValidateRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobValidateRequest {
    job: Option<Job>,
}

/// `PUT|POST /v1/validate/job`: the admission checks of `Job.Register` (limits, what nomad-rs
/// does not run, validation), answered as a list instead of a refusal.
pub async fn validate_job(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::PUT, Method::POST])?;
        let q = QueryOptions::parse(&uri)?;
        let bytes = read_body(body).await?;
        let req: JobValidateRequest = decode_body(&bytes)?;
        let Some(job) = req.job else {
            return Err(HttpError::bad_request("Job must be specified"));
        };
        json_response(&s.endpoints.job_validate(job), None, q.pretty)
    })
    .await
}

/// Body of `PUT /v1/job/<id>/evaluate` (`api.JobEvaluateRequest`); an empty body is allowed.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobEvaluateRequest {
    #[serde(rename = "JobID")]
    job_id: String,
    eval_options: EvalOptions,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct EvalOptions {
    force_reschedule: bool,
}

/// `PUT|POST /v1/job/<id>/evaluate`: a new eval for the job (`-force-reschedule`: its failed
/// allocs are rescheduled now).
async fn evaluate(s: &HttpState, q: &QueryOptions, id: &str, body: Body) -> HttpResult {
    let bytes = read_body(body).await?;
    let req: JobEvaluateRequest =
        if bytes.iter().all(u8::is_ascii_whitespace) { JobEvaluateRequest::default() } else { decode_body(&bytes)? };
    if !req.job_id.is_empty() && req.job_id != id {
        return Err(HttpError::bad_request("Job ID does not match"));
    }
    let resp = s.endpoints.job_evaluate(&q.namespace, id, req.eval_options.force_reschedule).await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

/// `GET /v1/job/<id>/versions[?diffs=true]`: the tracked versions, newest first.
async fn versions(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let diffs = q.bool("diffs", false)?;
    let ns = q.namespace.clone();
    let (resp, index) = s
        .endpoints
        .store()
        .blocking_query(&[Table::JobVersions], q.min_index, q.wait, |st| {
            (JobVersionsResponse::from_state(st, &ns, id, diffs), st.table_index(Table::JobVersions))
        })
        .await;
    let resp = resp.ok_or_else(|| HttpError::not_found("job versions not found"))?;
    let body = serde_json::json!({
        "Versions": resp.versions,
        "Diffs": resp.diffs,
        "Index": index,
        "KnownLeader": true,
        "LastContact": 0,
        "NextToken": "",
    });
    json_response(&body, Some(s.meta(index)), q.pretty)
}

/// Body of `PUT /v1/job/<id>/revert` (`api.JobRevertRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobRevertBody {
    #[serde(rename = "JobID")]
    job_id: String,
    job_version: u64,
    enforce_prior_version: Option<u64>,
    consul_token: String,
    vault_token: String,
}

/// `PUT|POST /v1/job/<id>/revert`: registers a copy of an earlier version.
async fn revert(s: &HttpState, q: &QueryOptions, id: &str, body: Body) -> HttpResult {
    let bytes = read_body(body).await?;
    let req: JobRevertBody = decode_body(&bytes)?;
    // Tokens for the registration's Consul and Vault checks: nomad-rs's servers check neither.
    let _ = (&req.consul_token, &req.vault_token);
    if req.job_id.is_empty() {
        return Err(HttpError::bad_request("JobID must be specified"));
    }
    if req.job_id != id {
        return Err(HttpError::bad_request("Job ID does not match"));
    }
    let resp = s
        .endpoints
        .job_revert(&q.namespace, id, JobRevertRequest { job_version: req.job_version, enforce_prior_version: req.enforce_prior_version })
        .await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

/// Body of `PUT /v1/job/<id>/stable` (`api.JobStabilityRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobStableBody {
    #[serde(rename = "JobID")]
    job_id: String,
    job_version: u64,
    stable: bool,
}

/// `PUT|POST /v1/job/<id>/stable`: marks a version stable (or not).
async fn stable(s: &HttpState, q: &QueryOptions, id: &str, body: Body) -> HttpResult {
    let bytes = read_body(body).await?;
    let req: JobStableBody = decode_body(&bytes)?;
    if req.job_id.is_empty() {
        return Err(HttpError::bad_request("JobID must be specified"));
    }
    if req.job_id != id {
        return Err(HttpError::bad_request("Job ID does not match"));
    }
    let index = s.endpoints.job_stable(&q.namespace, id, req.job_version, req.stable).await?;
    json_response(&serde_json::json!({ "Index": index }), Some(s.meta(index)), q.pretty)
}

/// Body of `PUT /v1/job/<id>/dispatch` (`api.JobDispatchRequest` with its write options).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobDispatchBody {
    #[serde(rename = "JobID")]
    job_id: String,
    /// Base64, as Go encodes `[]byte`.
    payload: Option<String>,
    meta: Option<std::collections::BTreeMap<String, String>>,
    id_prefix_template: String,
    idempotency_token: String,
}

/// `PUT|POST /v1/job/<id>/dispatch`: a child of a parameterized job. `?idempotency_token=`
/// wins over the body's.
async fn dispatch(s: &HttpState, q: &QueryOptions, id: &str, body: Body) -> HttpResult {
    use base64::Engine;
    let bytes = read_body(body).await?;
    let req: JobDispatchBody = decode_body(&bytes)?;
    if !req.job_id.is_empty() && req.job_id != id {
        return Err(HttpError::bad_request("Job ID does not match"));
    }
    let payload = match req.payload.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => base64::engine::general_purpose::STANDARD
            .decode(p)
            .map_err(|e| HttpError::bad_request(format!("Payload is not valid base64: {e}")))?,
        None => Vec::new(),
    };
    let token = q.params.get("idempotency_token").filter(|t| !t.is_empty()).cloned().unwrap_or(req.idempotency_token);
    let resp = s
        .endpoints
        .job_dispatch(
            &q.namespace,
            id,
            DispatchRequest {
                payload,
                meta: req.meta.unwrap_or_default(),
                id_prefix_template: req.id_prefix_template,
                idempotency_token: token,
            },
        )
        .await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

/// Body of `PUT /v1/job/<id>/plan` (`api.JobPlanRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct JobPlanRequest {
    job: Option<Job>,
    diff: bool,
    policy_override: bool,
    region: String,
    namespace: String,
}

/// `PUT|POST /v1/job/<id>/plan`: a dry run of the scheduler.
async fn plan(s: &HttpState, q: &QueryOptions, url_id: &str, body: Body) -> HttpResult {
    let bytes = read_body(body).await?;
    let req: JobPlanRequest = decode_body(&bytes)?;
    // Sentinel policies are an enterprise feature; the override changes nothing here.
    let _ = (req.policy_override, &req.region);
    let Some(mut job) = req.job else {
        return Err(HttpError::bad_request("Job must be specified"));
    };
    if job.id.is_empty() {
        return Err(HttpError::bad_request("Job must have a valid ID"));
    }
    if job.id != url_id {
        return Err(HttpError::bad_request("Job ID does not match"));
    }
    if q.params.get("namespace").is_some_and(|n| !n.is_empty()) {
        job.namespace = q.namespace.clone();
    } else if !req.namespace.is_empty() {
        job.namespace = req.namespace.clone();
    }
    let resp = s.endpoints.job_plan(job, req.diff).await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

/// `/v1/job/<id>` and its sub-resources.
pub async fn job_specific(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        let path = decode_path(uri.path().strip_prefix("/v1/job/").unwrap_or_default())?;
        let (id, action) = split_action(
            &path,
            &[
                "allocations",
                "evaluations",
                "summary",
                "plan",
                "versions",
                "evaluate",
                "deployments",
                "deployment",
                "scale",
                "services",
                "submission",
                "periodic/force",
                "dispatch",
                "revert",
                "stable",
            ],
        );
        if id.is_empty() {
            return Err(HttpError::not_found("missing job ID"));
        }
        match action {
            None => match method {
                Method::GET => get_job(&s, &q, &id).await,
                Method::PUT | Method::POST => register(&s, &q, Some(&id), body).await,
                Method::DELETE => deregister(&s, &q, &id).await,
                _ => Err(HttpError::invalid_method()),
            },
            Some("allocations") => {
                require_method(&method, &[Method::GET])?;
                job_allocations(&s, &q, &id).await
            }
            Some("evaluations") => {
                require_method(&method, &[Method::GET])?;
                job_evaluations(&s, &q, &id).await
            }
            Some("summary") => {
                require_method(&method, &[Method::GET])?;
                job_summary(&s, &q, &id).await
            }
            Some("plan") => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                plan(&s, &q, &id, body).await
            }
            Some("evaluate") => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                evaluate(&s, &q, &id, body).await
            }
            Some("versions") => {
                require_method(&method, &[Method::GET])?;
                versions(&s, &q, &id).await
            }
            Some("revert") => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                revert(&s, &q, &id, body).await
            }
            Some("periodic/force") => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                let resp = s.endpoints.periodic_force(&q.namespace, &id).await?;
                let index = resp.index;
                let body = serde_json::json!({ "EvalID": resp.eval_id, "EvalCreateIndex": resp.eval_create_index, "Index": index });
                json_response(&body, Some(s.meta(index)), q.pretty)
            }
            Some("deployments") => {
                require_method(&method, &[Method::GET])?;
                super::deployments::job_deployments(&s, &q, &id).await
            }
            Some("deployment") => {
                require_method(&method, &[Method::GET])?;
                super::deployments::job_latest_deployment(&s, &q, &id).await
            }
            Some("dispatch") => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                dispatch(&s, &q, &id, body).await
            }
            Some("stable") => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                stable(&s, &q, &id, body).await
            }
            Some("scale") => super::scaling::job_scale(&s, &q, &method, &id, body).await,
            Some(other) => Err(HttpError::not_found(format!("job action {other:?} is not supported by nomad-rs yet"))),
        }
    })
    .await
}

/// Percent-decodes a URL path the way Go's `URL.Path` reads it, which is what Nomad's HTTP
/// layer splits into job ID and action: `/v1/job/a%2Fb` and `/v1/job/a/b` both name job
/// `a/b` (periodic and dispatched children have slashes in their IDs), and `%2F` before an
/// action name is a separator as well. `+` stays a plus sign in a path.
pub(super) fn decode_path(raw: &str) -> Result<String, HttpError> {
    if !raw.contains('%') {
        return Ok(raw.to_string());
    }
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            match (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b))) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => {
                    let bad: String = raw[i..].chars().take(3).collect();
                    return Err(HttpError::bad_request(format!("invalid URL escape {bad:?}")));
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| HttpError::bad_request("invalid URL path: not UTF-8 once decoded"))
}

/// Splits `web/summary` into (`web`, `summary`); a job ID may itself contain slashes.
pub(super) fn split_action(path: &str, actions: &[&'static str]) -> (String, Option<&'static str>) {
    for a in actions {
        if let Some(id) = path.strip_suffix(&format!("/{a}")) {
            return (id.to_string(), Some(a));
        }
    }
    (path.to_string(), None)
}

async fn get_job(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let ns = q.namespace.clone();
    let (job, index): (Option<Arc<Job>>, u64) = s
        .endpoints
        .store()
        .blocking_query_on(&[Watch::Job(Watch::job_key(&ns, id))], q.min_index, q.wait, |st| match st.job(&ns, id) {
            Some(j) => (Some(j.clone()), j.modify_index),
            None => (None, st.table_index(Table::Jobs)),
        })
        .await;
    let job = job.ok_or_else(|| HttpError::not_found("job not found"))?;
    json_response(&*job, Some(s.meta(index)), q.pretty)
}

async fn deregister(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let purge = q.bool("purge", false)?;
    let _global = q.bool("global", false)?;
    let _no_shutdown_delay = q.bool("no_shutdown_delay", false)?;
    let eval_priority = q.int("eval_priority", 0)?;
    let resp = s.endpoints.job_deregister(&q.namespace, id, purge, eval_priority).await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

async fn job_allocations(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let all = q.bool("all", false)?;
    let ns = q.namespace.clone();
    let (stubs, index) = s
        .endpoints
        .store()
        // The job too: which allocs show depends on its CreateIndex.
        .blocking_query_on(&[Watch::JobAllocs(Watch::job_key(&ns, id)), Watch::Job(Watch::job_key(&ns, id))], q.min_index, q.wait, |st| {
            let current = st.job(&ns, id).map(|j| j.create_index);
            let stubs: Vec<_> = st
                .allocs_by_job(&ns, id)
                // Without `all`, allocs of an earlier job with the same ID are hidden.
                .filter(|a| all || current.is_none_or(|ci| a.job.as_ref().is_none_or(|j| j.create_index == ci)))
                .map(|a| a.stub(AllocStubFields::default()))
                .collect();
            (stubs, st.table_index(Table::Allocs))
        })
        .await;
    list_response(&filtered(stubs, q), None, s.meta(index), q.pretty)
}

async fn job_evaluations(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let ns = q.namespace.clone();
    let (evals, index) = s
        .endpoints
        .store()
        .blocking_query_on(&[Watch::JobEvals(Watch::job_key(&ns, id))], q.min_index, q.wait, |st| {
            let evals: Vec<_> = st.evals_by_job(&ns, id).map(|e| (**e).clone()).collect();
            (evals, st.table_index(Table::Evals))
        })
        .await;
    list_response(&filtered(evals, q), None, s.meta(index), q.pretty)
}

async fn job_summary(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let ns = q.namespace.clone();
    let (summary, index): (Option<Arc<JobSummary>>, u64) = s
        .endpoints
        .store()
        .blocking_query_on(&[Watch::JobSummary(Watch::job_key(&ns, id))], q.min_index, q.wait, |st| match st.job_summary(&ns, id) {
            Some(js) => (Some(with_children(st, js)), js.modify_index),
            None => (None, st.table_index(Table::JobSummary)),
        })
        .await;
    let summary = summary.ok_or_else(|| HttpError::not_found("job not found"))?;
    json_response(&*summary, Some(s.meta(index)), q.pretty)
}

/// A periodic or parameterized job's summary counts its children by status (Nomad keeps the
/// counts in the summary; counting them when asked cannot drift).
fn with_children(st: &crate::state::State, summary: &Arc<JobSummary>) -> Arc<JobSummary> {
    let Some(job) = st.job(&summary.namespace, &summary.job_id).filter(|j| j.is_periodic_or_parameterized()) else {
        return summary.clone();
    };
    let mut s = (**summary).clone();
    let prefix = format!("{}/", job.id);
    for child in st.jobs_by_prefix(Some(&job.namespace), &prefix).filter(|c| c.parent_id == job.id) {
        match child.status {
            nomad_proto::JobStatus::Pending => s.children.pending += 1,
            nomad_proto::JobStatus::Running => s.children.running += 1,
            nomad_proto::JobStatus::Dead => s.children.dead += 1,
        }
    }
    Arc::new(s)
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Method, Request, StatusCode};
    use serde_json::json;
    use tower::ServiceExt;

    use super::{decode_path, split_action};
    use crate::testing::{TestServer, job};

    async fn call(ts: &TestServer, method: Method, path: &str, body: String) -> (StatusCode, String) {
        let req = Request::builder().method(method).uri(path).body(Body::from(body)).unwrap();
        let resp = ts.router().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn body_of(j: &nomad_proto::Job) -> String {
        json!({ "Job": serde_json::to_value(j).unwrap() }).to_string()
    }

    /// `job eval`: a new `job-register` eval each time; a failed alloc is marked for a forced
    /// reschedule only when asked; an unknown job is Nomad's 404.
    #[tokio::test]
    async fn evaluate_creates_an_eval_and_force_reschedule_marks_failed_allocs() {
        let ts = TestServer::new();
        let (status, text) = call(&ts, Method::PUT, "/v1/jobs", body_of(&job("web", 1))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let evals_before = ts.store.snapshot().evals().count();
        let (status, text) = call(&ts, Method::PUT, "/v1/job/web/evaluate", String::new()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let snap = ts.store.snapshot();
        let eval = snap.eval(v["EvalID"].as_str().unwrap()).expect("the eval is stored");
        assert_eq!((eval.job_id.as_str(), eval.triggered_by.as_str()), ("web", "job-register"));
        assert_eq!(snap.evals().count(), evals_before + 1);

        // A failed alloc of a group that reschedules: marked only with ForceReschedule.
        let mut failed =
            nomad_proto::Allocation { id: "a1".into(), job_id: "web".into(), namespace: "default".into(), ..Default::default() };
        failed.task_group = "web".into();
        failed.client_status = nomad_proto::ClientStatus::Failed;
        failed.job = snap.job("default", "web").map(|j| (**j).clone()).map(std::sync::Arc::new);
        let idx = ts.store.snapshot().index + 1;
        ts.store
            .write(idx, |tx| {
                tx.upsert_allocs_from_plan(vec![failed]);
                Ok(())
            })
            .unwrap();
        let body = json!({"JobID": "web", "EvalOptions": {"ForceReschedule": true}}).to_string();
        let (status, text) = call(&ts, Method::POST, "/v1/job/web/evaluate", body).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(ts.store.snapshot().alloc("a1").unwrap().desired_transition.should_force_reschedule());

        let (status, text) = call(&ts, Method::PUT, "/v1/job/nope/evaluate", String::new()).await;
        assert_eq!((status, text.trim()), (StatusCode::NOT_FOUND, "job not found"));
    }

    #[tokio::test]
    async fn a_slash_in_a_job_id_reads_the_same_escaped_or_not() {
        let ts = TestServer::new();
        let child = job("batch/dispatch-1", 1);
        let (status, text) = call(&ts, Method::PUT, "/v1/jobs", body_of(&child)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        for path in ["/v1/job/batch/dispatch-1", "/v1/job/batch%2Fdispatch-1", "/v1/job/batch%2fdispatch-1"] {
            let (status, text) = call(&ts, Method::GET, path, String::new()).await;
            assert_eq!(status, StatusCode::OK, "{path}: {text}");
            assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["ID"], "batch/dispatch-1", "{path}");
        }
        for path in ["/v1/job/batch/dispatch-1/summary", "/v1/job/batch%2Fdispatch-1/summary", "/v1/job/batch/dispatch-1%2Fsummary"] {
            let (status, text) = call(&ts, Method::GET, path, String::new()).await;
            assert_eq!(status, StatusCode::OK, "{path}: {text}");
            assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["JobID"], "batch/dispatch-1", "{path}");
        }
        // A write through the escaped path matches the body's ID.
        let (status, text) = call(&ts, Method::PUT, "/v1/job/batch%2Fdispatch-1", body_of(&job("batch/dispatch-1", 2))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let (status, text) = call(&ts, Method::DELETE, "/v1/job/batch%2Fdispatch-1?purge=true", String::new()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(ts.store.snapshot().job("default", "batch/dispatch-1").is_none(), "purged through the escaped path");
        let (status, text) = call(&ts, Method::GET, "/v1/job/a%zz", String::new()).await;
        assert_eq!((status, text.as_str()), (StatusCode::BAD_REQUEST, "invalid URL escape \"%zz\""));
    }

    #[test]
    fn paths_decode_like_gos_url_path() {
        assert_eq!(decode_path("a%2Fb").unwrap(), "a/b");
        assert_eq!(decode_path("a+b%20c").unwrap(), "a+b c");
        assert!(decode_path("a%2").is_err());
        assert!(decode_path("%ff%fe").is_err(), "not UTF-8");
    }

    #[tokio::test]
    async fn a_count_of_2_31_is_a_400_at_register_and_plan_and_the_server_still_answers() {
        let ts = TestServer::new();
        ts.register_node(crate::testing::node("n1")).await;
        let huge = body_of(&job("web", 1 << 31));
        let want = "task group \"web\" count 2147483648 is greater than job_max_count (50000)";
        assert_eq!(call(&ts, Method::PUT, "/v1/jobs", huge.clone()).await, (StatusCode::BAD_REQUEST, want.to_string()));
        assert_eq!(call(&ts, Method::PUT, "/v1/job/web/plan", huge).await, (StatusCode::BAD_REQUEST, want.to_string()));
        let (status, text) = call(&ts, Method::GET, "/v1/jobs", String::new()).await;
        assert_eq!((status, text.as_str()), (StatusCode::OK, "[]"));
        let (status, text) = call(&ts, Method::PUT, "/v1/job/web/plan", body_of(&job("web", 2))).await;
        assert_eq!(status, StatusCode::OK, "{text}");
    }

    #[tokio::test]
    async fn a_job_id_with_a_newline_is_refused_and_never_echoed_raw() {
        let ts = TestServer::new();
        let (status, text) = call(&ts, Method::PUT, "/v1/jobs", body_of(&job("web\n[ERROR]forged", 1))).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
        assert!(text.contains("Job ID contains a control character"), "{text}");
        assert!(!text.contains("web\n"), "{text:?}");
    }

    #[test]
    fn job_ids_with_slashes_keep_their_action() {
        let acts = &["summary", "periodic/force"];
        assert_eq!(split_action("web", acts), ("web".into(), None));
        assert_eq!(split_action("web/summary", acts), ("web".into(), Some("summary")));
        assert_eq!(split_action("batch/dispatch-1/summary", acts), ("batch/dispatch-1".into(), Some("summary")));
        assert_eq!(split_action("cron/periodic/force", acts), ("cron".into(), Some("periodic/force")));
    }
}
