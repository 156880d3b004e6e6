//! `/v1/allocations` and `/v1/allocation/<id>[/stop]`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::{AllocStubFields, Allocation};

use super::HttpState;
use super::util::{HttpError, HttpResult, QueryOptions, json_response, list_response, paginate, require_method};
use crate::state::{Table, Watch};

/// `GET /v1/allocations`.
pub async fn allocations(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        // Either option present switches to explicit fields, whose default keeps task states.
        let fields = AllocStubFields { resources: q.bool("resources", false)?, task_states: q.bool("task_states", true)? };
        let ns = q.namespace_filter().map(str::to_string);
        let (stubs, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Allocs], q.min_index, q.wait, |st| {
                let stubs: Vec<_> = st
                    .allocs_by_prefix(&q.prefix)
                    .filter(|a| ns.as_deref().is_none_or(|n| a.namespace == n))
                    .map(|a| a.stub(fields))
                    .collect();
                (stubs, st.table_index(Table::Allocs))
            })
            .await;
        let (page, next) = paginate(stubs, &q, |a| a.id.clone());
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// `/v1/allocation/<id>` and `/v1/allocation/<id>/stop`.
pub async fn allocation_specific(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        let path = uri.path().strip_prefix("/v1/allocation/").unwrap_or_default();
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            [id] if !id.is_empty() => {
                require_method(&method, &[Method::GET])?;
                get_alloc(&s, &q, id).await
            }
            [id, "stop"] => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                let no_delay = q.bool("no_shutdown_delay", false)?;
                let resp = s.endpoints.alloc_stop(id, no_delay).await?;
                let index = resp.index;
                json_response(&resp, Some(s.meta(index)), q.pretty)
            }
            _ => Err(HttpError::not_found("resource not found")),
        }
    })
    .await
}

async fn get_alloc(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let (alloc, index): (Option<Arc<Allocation>>, u64) = s
        .endpoints
        .store()
        .blocking_query_on(&[Watch::Alloc(id.to_string())], q.min_index, q.wait, |st| match st.alloc(id) {
            Some(a) => (Some(a.clone()), a.modify_index),
            None => (None, st.table_index(Table::Allocs)),
        })
        .await;
    let alloc = alloc.ok_or_else(|| HttpError::not_found("alloc not found"))?;
    json_response(&*alloc, Some(s.meta(index)), q.pretty)
}
