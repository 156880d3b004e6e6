//! `/v1/deployments`, `/v1/deployment/<id>`, `/v1/deployment/allocations/<id>` and the
//! writes `/v1/deployment/{fail,pause,promote,allocation-health,unblock}/<id>`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::{AllocStubFields, Deployment};
use serde::Deserialize;

use super::HttpState;
use super::util::{HttpError, HttpResult, QueryOptions, decode_body, json_response, list_response, paginate, read_body, require_method};
use crate::state::{Table, Watch};

/// `GET /v1/deployments` (`prefix`, `namespace=*`, paging).
pub async fn deployments(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let ns = q.namespace_filter().map(str::to_string);
        let (list, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Deployments], q.min_index, q.wait, |st| {
                let list: Vec<Deployment> = st
                    .deployments()
                    .filter(|d| ns.as_deref().is_none_or(|n| d.namespace == n) && d.id.starts_with(&q.prefix))
                    .map(|d| (**d).clone())
                    .collect();
                (list, st.table_index(Table::Deployments))
            })
            .await;
        let (page, next) = paginate(list, &q, |d| d.id.clone());
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// Body of the pause action (`DeploymentPauseRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct PauseBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
    pause: bool,
}

/// Body of the promote action (`DeploymentPromoteRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct PromoteBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
    all: bool,
    groups: Option<Vec<String>>,
}

/// Body of the allocation-health action (`DeploymentAllocHealthRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct HealthBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
    #[serde(rename = "HealthyAllocationIDs")]
    healthy: Option<Vec<String>>,
    #[serde(rename = "UnhealthyAllocationIDs")]
    unhealthy: Option<Vec<String>>,
}

/// Body of the fail and unblock actions (`DeploymentFailRequest`): the ID at most.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct IdBody {
    #[serde(rename = "DeploymentID")]
    deployment_id: String,
}

/// Nomad's check of a write's body against the ID in the path.
fn check_body_id(body_id: &str, path_id: &str, required: bool) -> Result<(), HttpError> {
    if body_id.is_empty() {
        return if required { Err(HttpError::bad_request("DeploymentID must be specified")) } else { Ok(()) };
    }
    if body_id != path_id {
        return Err(HttpError::bad_request("Deployment ID does not match"));
    }
    Ok(())
}

/// `/v1/deployment/<id>` and its sub-resources and actions.
pub async fn deployment_specific(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        let path = uri.path().strip_prefix("/v1/deployment/").unwrap_or_default().to_string();
        let (action, id) = match path.split_once('/') {
            Some((a, id)) => (Some(a), id),
            None => (None, path.as_str()),
        };
        if id.is_empty() {
            return Err(HttpError::bad_request("missing deployment ID"));
        }
        match action {
            None => {
                require_method(&method, &[Method::GET])?;
                let (d, index) = s
                    .endpoints
                    .store()
                    .blocking_query_on(&[Watch::Deployment(id.to_string())], q.min_index, q.wait, |st| match st.deployment(id) {
                        Some(d) => (Some(d.clone()), d.modify_index),
                        None => (None, st.table_index(Table::Deployments)),
                    })
                    .await;
                let d = d.ok_or_else(|| HttpError::not_found("deployment not found"))?;
                json_response(&*d, Some(s.meta(index)), q.pretty)
            }
            Some("allocations") => {
                require_method(&method, &[Method::GET])?;
                let (stubs, index) = s
                    .endpoints
                    .store()
                    .blocking_query(&[Table::Allocs, Table::Deployments], q.min_index, q.wait, |st| {
                        let stubs: Option<Vec<_>> =
                            st.deployment(id).map(|d| st.allocs_by_deployment(d).map(|a| a.stub(AllocStubFields::default())).collect());
                        (stubs, st.max_index(&[Table::Allocs, Table::Deployments]))
                    })
                    .await;
                let stubs = stubs.ok_or_else(|| HttpError::not_found("deployment not found"))?;
                list_response(&stubs, None, s.meta(index), q.pretty)
            }
            Some(write) => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                // A write names its namespace: a deployment in another one is not found there.
                if s.endpoints.store().snapshot().deployment(id).is_some_and(|d| d.namespace != q.namespace) {
                    return Err(HttpError::not_found("deployment not found"));
                }
                let bytes = read_body(body).await?;
                let empty = bytes.iter().all(u8::is_ascii_whitespace);
                let resp = match write {
                    "fail" => {
                        let b: IdBody = if empty { IdBody::default() } else { decode_body(&bytes)? };
                        check_body_id(&b.deployment_id, id, false)?;
                        s.endpoints.deployment_fail(id).await?
                    }
                    "pause" => {
                        let b: PauseBody = decode_body(&bytes)?;
                        check_body_id(&b.deployment_id, id, true)?;
                        s.endpoints.deployment_pause(id, b.pause).await?
                    }
                    "promote" => {
                        let b: PromoteBody = decode_body(&bytes)?;
                        check_body_id(&b.deployment_id, id, true)?;
                        s.endpoints.deployment_promote(id, b.all, b.groups.unwrap_or_default()).await?
                    }
                    "allocation-health" => {
                        let b: HealthBody = decode_body(&bytes)?;
                        check_body_id(&b.deployment_id, id, true)?;
                        s.endpoints.deployment_alloc_health(id, b.healthy.unwrap_or_default(), b.unhealthy.unwrap_or_default()).await?
                    }
                    "unblock" => {
                        let b: IdBody = if empty { IdBody::default() } else { decode_body(&bytes)? };
                        check_body_id(&b.deployment_id, id, true)?;
                        return Err(HttpError::bad_request("can't unblock: only multiregion deployments block, and nomad-rs has none"));
                    }
                    other => return Err(HttpError::not_found(format!("deployment action {other:?} is not supported"))),
                };
                let index = resp.index;
                json_response(&resp, Some(s.meta(index)), q.pretty)
            }
        }
    })
    .await
}

/// `GET /v1/job/<id>/deployments[?all=true]`: the job's deployments, newest first; without
/// `all`, only those of the current instance of the job ID.
pub(super) async fn job_deployments(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let all = q.bool("all", false)?;
    let ns = q.namespace.clone();
    let (list, index) = s
        .endpoints
        .store()
        .blocking_query(&[Table::Deployments, Table::Jobs], q.min_index, q.wait, |st| {
            let create_index = st.job(&ns, id).map(|j| j.create_index);
            let mut list: Vec<Deployment> = st
                .deployments_by_job(&ns, id)
                .into_iter()
                .filter(|d| all || create_index.is_none_or(|ci| d.job_create_index == ci))
                .map(|d| (**d).clone())
                .collect();
            list.reverse();
            (list, st.table_index(Table::Deployments))
        })
        .await;
    list_response(&list, None, s.meta(index), q.pretty)
}

/// `GET /v1/job/<id>/deployment`: the newest deployment, or `null`.
pub(super) async fn job_latest_deployment(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let ns = q.namespace.clone();
    let (d, index) = s
        .endpoints
        .store()
        .blocking_query(&[Table::Deployments], q.min_index, q.wait, |st| {
            (st.latest_deployment(&ns, id).cloned(), st.table_index(Table::Deployments))
        })
        .await;
    json_response(&d, Some(s.meta(index)), q.pretty)
}
