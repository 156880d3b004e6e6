//! `/v1/evaluations` and `/v1/evaluation/<id>[/allocations]`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::AllocStubFields;

use super::HttpState;
use super::util::{HttpError, QueryOptions, filtered, json_response, list_response, paginate, read_body, require_method};
use crate::endpoints::{EvalSelection, MAX_UUIDS_PER_WRITE_REQUEST};
use crate::state::{Table, Watch};

/// `GET /v1/evaluations` with `prefix`, `namespace` and the legacy `status` and `job` filters;
/// `DELETE /v1/evaluations` with `{"EvalIDs": [...]}` or `{"Filter": "..."}` (see [`delete`]).
pub async fn evaluations(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET, Method::DELETE])?;
        let q = QueryOptions::parse(&uri)?;
        if method == Method::DELETE {
            return delete(&s, &q, body).await;
        }
        let status = q.params.get("status").cloned().unwrap_or_default();
        let job = q.params.get("job").cloned().unwrap_or_default();
        if q.filter.is_some() && (!status.is_empty() || !job.is_empty()) {
            return Err(HttpError::bad_request("Filter expression cannot be used with other filter parameters"));
        }
        let ns = q.namespace_filter().map(str::to_string);
        let (evals, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Evals], q.min_index, q.wait, |st| {
                let evals: Vec<_> = st
                    .evals_by_prefix(&q.prefix)
                    .filter(|e| ns.as_deref().is_none_or(|n| e.namespace == n))
                    .filter(|e| status.is_empty() || e.status.as_str() == status)
                    .filter(|e| job.is_empty() || e.job_id == job)
                    .map(|e| (**e).clone())
                    .collect();
                (evals, st.table_index(Table::Evals))
            })
            .await;
        let (page, next) = paginate(evals, &q, |e| e.id.clone());
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// `DELETE /v1/evaluations` (Nomad's `Eval.Delete`): by ID (at most
/// [`MAX_UUIDS_PER_WRITE_REQUEST`]) or by filter, never both; refused unless the eval broker is
/// paused. Answers `{Count, Index}`.
async fn delete(s: &HttpState, q: &QueryOptions, body: Body) -> super::util::HttpResult {
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "PascalCase")]
    struct EvalDeleteRequest {
        #[serde(rename = "EvalIDs")]
        eval_ids: Vec<String>,
        filter: String,
    }
    let body = read_body(body).await?;
    let request: EvalDeleteRequest = super::util::decode_body(&body)?;
    let selection = match (request.eval_ids.is_empty(), request.filter.is_empty()) {
        (false, false) => return Err(HttpError::bad_request("evals cannot be deleted by both ID and filter")),
        (true, true) => return Err(HttpError::bad_request("evals must be deleted by either ID or filter")),
        (false, true) if request.eval_ids.len() > MAX_UUIDS_PER_WRITE_REQUEST => {
            return Err(HttpError::bad_request(format!(
                "request includes {} evaluation IDs, must be {MAX_UUIDS_PER_WRITE_REQUEST} or fewer",
                request.eval_ids.len()
            )));
        }
        (false, true) => EvalSelection::Ids(request.eval_ids),
        (true, false) => {
            let filter = super::filter::Filter::parse(&request.filter).map_err(|e| HttpError::bad_request(e.to_string()))?;
            EvalSelection::Matching(Box::new(move |e| serde_json::to_value(e).is_ok_and(|v| filter.matches(&v))))
        }
    };
    let (count, index) = s.endpoints.delete_evals(selection).await?;
    json_response(&serde_json::json!({ "Count": count, "Index": index }), Some(s.meta(index)), q.pretty)
}

/// `GET /v1/evaluation/<id>` and `GET /v1/evaluation/<id>/allocations`.
pub async fn evaluation_specific(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let path = uri.path().strip_prefix("/v1/evaluation/").unwrap_or_default();
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            [id] if !id.is_empty() => {
                let (eval, index) = s
                    .endpoints
                    .store()
                    .blocking_query_on(&[Watch::Eval(id.to_string())], q.min_index, q.wait, |st| match st.eval(id) {
                        Some(e) => (Some(e.clone()), e.modify_index),
                        None => (None, st.table_index(Table::Evals)),
                    })
                    .await;
                let eval = eval.ok_or_else(|| HttpError::not_found("eval not found"))?;
                json_response(&*eval, Some(s.meta(index)), q.pretty)
            }
            [id, "allocations"] => {
                let (stubs, index) = s
                    .endpoints
                    .store()
                    .blocking_query_on(&[Watch::EvalAllocs(id.to_string())], q.min_index, q.wait, |st| {
                        let stubs: Vec<_> = match st.eval(id) {
                            Some(e) => st.allocs_by_eval(e).map(|a| a.stub(AllocStubFields::default())).collect(),
                            None => Vec::new(),
                        };
                        (stubs, st.table_index(Table::Allocs))
                    })
                    .await;
                list_response(&filtered(stubs, &q), None, s.meta(index), q.pretty)
            }
            _ => Err(HttpError::not_found("resource not found")),
        }
    })
    .await
}
