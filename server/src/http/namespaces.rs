//! `/v1/namespaces` and `/v1/namespace/<name>` (reads).

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;

use super::HttpState;
use nomad_proto::Namespace;

use super::util::{HttpError, QueryOptions, decode_body, filtered, json_response, list_response, read_body, require_method};
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
        list_response(&filtered(list, &q), None, s.meta(index), q.pretty)
    })
    .await
}

/// `GET|PUT|POST|DELETE /v1/namespace/<name>`.
pub async fn namespace_specific(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        let name = uri.path().strip_prefix("/v1/namespace/").unwrap_or_default().to_string();
        match method {
            Method::GET => {
                let snap = s.endpoints.store().snapshot();
                let ns = snap.namespace(&name).ok_or_else(|| HttpError::not_found("namespace not found"))?;
                json_response(&**ns, Some(s.meta(ns.modify_index)), q.pretty)
            }
            Method::PUT | Method::POST => {
                let bytes = read_body(body).await?;
                let mut ns: Namespace = decode_body(&bytes)?;
                if ns.name.is_empty() {
                    ns.name = name.clone();
                }
                if ns.name != name {
                    return Err(HttpError::bad_request("Namespace name does not match request path"));
                }
                let index = s.endpoints.namespace_upsert(ns).await?;
                write_ack(&s, index)
            }
            Method::DELETE => {
                let index = s.endpoints.namespace_delete(&name).await?;
                write_ack(&s, index)
            }
            _ => Err(HttpError::invalid_method()),
        }
    })
    .await
}

/// Nomad answers namespace writes with an empty body and the index header;
/// python-nomad calls `.json()` on 2xx replies, so send `{}` instead.
fn write_ack(s: &HttpState, index: u64) -> super::util::HttpResult {
    json_response(&serde_json::json!({ "Index": index }), Some(s.meta(index)), false)
}
