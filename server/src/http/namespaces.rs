//! `/v1/namespaces` and `/v1/namespace/<name>` (reads).

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;

use super::HttpState;
use super::util::{HttpError, QueryOptions, json_response, list_response, require_method};
use crate::state::Table;

/// `GET /v1/namespaces`.
pub async fn namespaces(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let (list, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Namespaces], q.min_index, q.wait, |st| {
                let list: Vec<_> = st.namespaces().filter(|n| n.name.starts_with(&q.prefix)).map(|n| (**n).clone()).collect();
                (list, st.table_index(Table::Namespaces))
            })
            .await;
        list_response(&list, None, s.meta(index), q.pretty)
    })
    .await
}

/// `GET /v1/namespace/<name>`.
pub async fn namespace_specific(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let name = uri.path().strip_prefix("/v1/namespace/").unwrap_or_default();
        let snap = s.endpoints.store().snapshot();
        let ns = snap.namespace(name).ok_or_else(|| HttpError::not_found("namespace not found"))?;
        json_response(&**ns, Some(s.meta(ns.modify_index)), q.pretty)
    })
    .await
}
