//! `/v1/job/<id>/scale` (GET: the scale status; PUT/POST: scale a group),
//! `/v1/scaling/policies` and `/v1/scaling/policy/<id>`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::scaling::{ScalingPolicy, ScalingPolicyStub};
use serde::{Deserialize, Serialize};

use super::HttpState;
use super::util::{HttpError, HttpResult, QueryOptions, decode_body, json_response, list_response, paginate, read_body, require_method};
use crate::endpoints::{JobScaleRequest, job_scale_status};
use crate::state::{Table, Watch};

/// Body of `PUT /v1/job/<id>/scale` (`api.ScalingRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct ScaleBody {
    count: Option<i64>,
    target: Option<std::collections::BTreeMap<String, String>>,
    message: String,
    error: bool,
    meta: Option<serde_json::Map<String, serde_json::Value>>,
    /// Overrides soft-mandatory Sentinel policies: Nomad Enterprise's, none to override here
    /// (Nomad's community edition ignores it too).
    policy_override: bool,
}

/// `/v1/job/<id>/scale`.
pub(super) async fn job_scale(s: &HttpState, q: &QueryOptions, method: &Method, id: &str, body: Body) -> HttpResult {
    require_method(method, &[Method::GET, Method::PUT, Method::POST])?;
    if *method == Method::GET {
        let (ns, key) = (q.namespace.clone(), Watch::job_key(&q.namespace, id));
        let watches = [Watch::Job(key.clone()), Watch::JobAllocs(key)];
        let (status, index) =
            s.endpoints.store().blocking_query_on(&watches, q.min_index, q.wait, |st| job_scale_status(st, &ns, id)).await;
        let status = status.ok_or_else(|| HttpError::not_found("job not found"))?;
        return json_response(&status, Some(s.meta(index)), q.pretty);
    }
    let bytes = read_body(body).await?;
    let req: ScaleBody = decode_body(&bytes)?;
    let _ = req.policy_override;
    let req = JobScaleRequest {
        count: req.count,
        target: req.target.unwrap_or_default(),
        message: req.message,
        error: req.error,
        meta: req.meta,
    };
    let resp = s.endpoints.job_scale(&q.namespace, id, req).await?;
    let index = resp.index;
    json_response(&resp, Some(s.meta(index)), q.pretty)
}

/// A policy stub as listed, with the namespace of its job (which the ACL filter of
/// `namespace=*` lists reads; Nomad's stub has none).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ListedPolicy {
    #[serde(flatten)]
    stub: ScalingPolicyStub,
    namespace: String,
}

/// `GET /v1/scaling/policies` (`job`, `type`, `prefix` on the ID, `namespace=*`, paging).
pub async fn policies(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let ns = q.namespace_filter().map(str::to_string);
        let job = q.params.get("job").filter(|j| !j.is_empty()).cloned();
        let policy_type = q.params.get("type").filter(|t| !t.is_empty()).cloned();
        let (list, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::ScalingPolicies], q.min_index, q.wait, |st| {
                let list: Vec<ListedPolicy> = st
                    .scaling_policies()
                    .filter(|(pns, p)| {
                        ns.as_deref().is_none_or(|n| *pns == n)
                            && p.id.starts_with(&q.prefix)
                            && job.as_deref().is_none_or(|j| p.target.get(nomad_proto::scaling::target::JOB).is_some_and(|t| t == j))
                            && policy_type.as_deref().is_none_or(|t| p.policy_type.starts_with(t))
                    })
                    .map(|(pns, p)| ListedPolicy { stub: p.stub(), namespace: pns.to_string() })
                    .collect();
                (list, st.table_index(Table::ScalingPolicies))
            })
            .await;
        let (page, next) = paginate(list, &q, |p| p.stub.id.clone());
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// A single policy, with the namespace of its job (as `api.ScalingPolicy` has it).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ShownPolicy {
    #[serde(flatten)]
    policy: ScalingPolicy,
    namespace: String,
}

/// `GET /v1/scaling/policy/<id>`.
pub async fn policy_specific(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let id = uri.path().strip_prefix("/v1/scaling/policy/").unwrap_or_default().to_string();
        if id.is_empty() || id.contains('/') {
            return Err(HttpError::not_found("policy not found"));
        }
        let (policy, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::ScalingPolicies], q.min_index, q.wait, |st| match st.scaling_policy(&id) {
                Some((ns, p)) => (Some(ShownPolicy { policy: p.clone(), namespace: ns.to_string() }), p.modify_index),
                None => (None, st.table_index(Table::ScalingPolicies)),
            })
            .await;
        let policy = policy.ok_or_else(|| HttpError::not_found("policy not found"))?;
        json_response(&policy, Some(s.meta(index)), q.pretty)
    })
    .await
}
