//! `/v1/nodes` and `/v1/node/<id>[/allocations|/eligibility]`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::{ApiNode, NodeStubFields};
use serde::Deserialize;

use super::HttpState;
use super::util::{
    HttpError, HttpResult, QueryOptions, decode_body, filtered, json_response, list_response, paginate, read_body, require_method,
};
use crate::state::{Table, Watch};

/// `GET /v1/nodes` with `prefix`, `resources` and `os`.
pub async fn nodes(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let fields = NodeStubFields { resources: q.bool("resources", false)?, os: q.bool("os", false)? };
        let (stubs, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Nodes], q.min_index, q.wait, |st| {
                let stubs: Vec<_> = st.nodes_by_prefix(&q.prefix).map(|n| n.stub(fields)).collect();
                (stubs, st.table_index(Table::Nodes))
            })
            .await;
        let (page, next) = paginate(stubs, &q, |n| n.id.clone());
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct EligibilityRequest {
    #[serde(rename = "NodeID")]
    node_id: String,
    eligibility: String,
}

/// `/v1/node/<id>`, `/v1/node/<id>/allocations`, `/v1/node/<id>/eligibility`.
pub async fn node_specific(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        let path = uri.path().strip_prefix("/v1/node/").unwrap_or_default();
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            [id] if !id.is_empty() => {
                require_method(&method, &[Method::GET])?;
                get_node(&s, &q, id).await
            }
            [id, "allocations"] => {
                require_method(&method, &[Method::GET])?;
                let (allocs, index) = s
                    .endpoints
                    .store()
                    .blocking_query_on(&[Watch::NodeAllocs(id.to_string())], q.min_index, q.wait, |st| {
                        let allocs: Vec<_> = st.allocs_by_node(id).map(|a| (**a).clone()).collect();
                        (allocs, st.table_index(Table::Allocs))
                    })
                    .await;
                list_response(&filtered(allocs, &q), None, s.meta(index), q.pretty)
            }
            [id, "eligibility"] => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                let bytes = read_body(body).await?;
                let req: EligibilityRequest = decode_body(&bytes)?;
                let node_id = if req.node_id.is_empty() { id.to_string() } else { req.node_id };
                if node_id != *id {
                    return Err(HttpError::bad_request("NodeID in the body does not match the URL"));
                }
                if req.eligibility.is_empty() {
                    return Err(HttpError::bad_request("Eligibility must be specified"));
                }
                let resp = s.endpoints.node_update_eligibility(&node_id, &req.eligibility).await?;
                let index = resp.index;
                json_response(&resp, Some(s.meta(index)), q.pretty)
            }
            [id, "drain"] => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                let bytes = read_body(body).await?;
                let req: crate::endpoints::DrainRequest = decode_body(&bytes)?;
                if !req.node_id.is_empty() && req.node_id != *id {
                    return Err(HttpError::bad_request("NodeID in the body does not match the URL"));
                }
                let resp = s.endpoints.node_update_drain(id, req).await?;
                let index = resp.index;
                json_response(&resp, Some(s.meta(index)), q.pretty)
            }
            [id, "purge"] => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                let resp = s.endpoints.node_deregister(id).await?;
                let index = resp.index;
                json_response(&resp, Some(s.meta(index)), q.pretty)
            }
            [id, "evaluate"] => {
                require_method(&method, &[Method::PUT, Method::POST])?;
                let resp = s.endpoints.node_evaluate(id).await?;
                let index = resp.index;
                json_response(&resp, Some(s.meta(index)), q.pretty)
            }
            [_, other] => Err(HttpError::not_found(format!("node action {other:?} is not supported by nomad-rs yet"))),
            _ => Err(HttpError::not_found("resource not found")),
        }
    })
    .await
}

async fn get_node(s: &HttpState, q: &QueryOptions, id: &str) -> HttpResult {
    let (node, index) = s
        .endpoints
        .store()
        .blocking_query_on(&[Watch::Node(id.to_string())], q.min_index, q.wait, |st| match st.node(id) {
            Some(n) => (Some(n.clone()), n.modify_index),
            None => (None, st.table_index(Table::Nodes)),
        })
        .await;
    let node = node.ok_or_else(|| HttpError::not_found("node not found"))?;
    json_response(&ApiNode::from(&*node), Some(s.meta(index)), q.pretty)
}
