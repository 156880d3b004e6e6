//! `/v1/evaluations` and `/v1/evaluation/<id>[/allocations]`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::AllocStubFields;

use super::HttpState;
use super::util::{HttpError, QueryOptions, filtered, json_response, list_response, paginate, require_method};
use crate::state::{Table, Watch};

/// `GET /v1/evaluations` with `prefix`, `namespace` and the legacy `status` and `job` filters.
pub async fn evaluations(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
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
