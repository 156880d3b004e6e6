//! `/v1/volumes`, `/v1/volume/csi/<id>`, `/v1/plugins` and `/v1/plugin/csi/<id>`
//! (`command/agent/csi_endpoint.go`).
//!
//! Reads answer from this server's state, writes go through the endpoints (and, on a follower,
//! to the leader like every other write). `create` and `delete` go through a controller of the
//! volume's plugin; `detach` runs the servers' release walk (`Endpoints::csi_volume_detach`).

use axum::body::Body;
use axum::extract::State;
use std::collections::BTreeMap;

use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use nomad_proto::csi::{CsiPluginListStub, CsiVolListStub, CsiVolumeRegisterRequest};

use super::HttpState;
use super::util::{HttpError, QueryOptions, decode_body, json_response, list_response, paginate, parse_bool, read_body};
use crate::state::{Table, Watch};

/// Nomad's `resourceNotFoundErr`.
const RESOURCE_NOT_FOUND: &str = "resource not found";

/// What `?type=` asked for on the list routes: Nomad answers `[]` without it and `null` for a
/// type other than `csi` (it has no other kind of volume or plugin).
enum ListType {
    Missing,
    Other,
    Csi,
}

fn list_type(q: &QueryOptions) -> ListType {
    match q.multi.get("type").and_then(|v| v.first()) {
        None => ListType::Missing,
        Some(t) if t == "csi" => ListType::Csi,
        Some(_) => ListType::Other,
    }
}

/// `GET /v1/volumes?type=csi` (`prefix`, `plugin_id`, `node_id`, `namespace` with `*`,
/// `filter`, paging); `PUT|POST /v1/volumes` registers, as Nomad's route does.
pub async fn volumes(State(s): State<HttpState>, method: Method, uri: Uri, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        match method {
            Method::PUT | Method::POST => return register(&s, &q, body).await,
            Method::GET => {}
            _ => return Err(HttpError::invalid_method()),
        }
        match list_type(&q) {
            ListType::Missing => return json_response(&Vec::<CsiVolListStub>::new(), None, q.pretty),
            ListType::Other => return json_response(&serde_json::Value::Null, None, q.pretty),
            ListType::Csi => {}
        }
        let ns = q.namespace_filter().map(str::to_string);
        let plugin_id = q.params.get("plugin_id").cloned().unwrap_or_default();
        let node_id = q.params.get("node_id").cloned().unwrap_or_default();
        let watches = [Watch::Table(Table::CsiVolumes), Watch::Table(Table::CsiPlugins)];
        let (stubs, index) = s
            .endpoints
            .store()
            .blocking_query_on(&watches, q.min_index, q.wait, |st| {
                let candidates: Vec<_> =
                    if node_id.is_empty() { st.csi_volumes().cloned().collect() } else { st.csi_volumes_by_node(&node_id) };
                let stubs: Vec<CsiVolListStub> = candidates
                    .iter()
                    .filter(|v| ns.as_deref().is_none_or(|n| v.namespace == n))
                    .filter(|v| v.id.starts_with(&q.prefix))
                    .filter(|v| plugin_id.is_empty() || v.plugin_id == plugin_id)
                    .map(|v| st.csi_volume_with_plugin(v).stub())
                    .collect();
                (stubs, st.max_index(&[Table::CsiVolumes, Table::CsiPlugins]))
            })
            .await;
        let (page, next) = paginate(stubs, &q, |v| format!("{}.{}", v.namespace, v.id));
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// `GET|PUT|DELETE /v1/volume/csi/<id>`, `PUT|POST .../create`, `DELETE .../delete`, and
/// `DELETE .../detach?node=`.
pub async fn volume_specific(State(s): State<HttpState>, method: Method, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    super::respond(async {
        let q = QueryOptions::parse(&uri)?;
        let path = super::jobs::decode_path(uri.path().strip_prefix("/v1/volume/csi/").unwrap_or_default())?;
        let tokens: Vec<&str> = path.split('/').collect();
        match (tokens.as_slice(), &method) {
            ([id], &Method::GET) => get_volume(&s, &q, id).await,
            ([_], &Method::PUT) => register(&s, &q, body).await,
            ([id], &Method::DELETE) => {
                let force = match q.params.get("force").filter(|f| !f.is_empty()) {
                    None => false,
                    Some(f) => parse_bool(f).ok_or_else(|| HttpError::bad_request("invalid force value"))?,
                };
                let index = s.endpoints.csi_volume_deregister(&q.namespace, vec![id.to_string()], force).await?;
                write_ack(&s, index)
            }
            ([_], _) => Err(HttpError::invalid_method()),
            ([_, "create"], &Method::PUT | &Method::POST) => create(&s, &q, body).await,
            ([id, "delete"], &Method::DELETE) => {
                let index = s.endpoints.csi_volume_delete(&q.namespace, vec![id.to_string()], csi_secrets(&headers)).await?;
                write_ack(&s, index)
            }
            ([id, "detach"], &Method::DELETE) => {
                let node =
                    q.params.get("node").filter(|n| !n.is_empty()).ok_or_else(|| HttpError::bad_request("detach requires node ID"))?;
                let index = s.endpoints.csi_volume_detach(&q.namespace, id, node).await?;
                write_ack(&s, index)
            }
            ([_, "create"], _) | ([_, "detach"], _) => Err(HttpError::invalid_method()),
            ([_, _], m) if *m != Method::PUT && *m != Method::DELETE => Err(HttpError::invalid_method()),
            _ => Err(HttpError::not_found(RESOURCE_NOT_FOUND)),
        }
    })
    .await
}

async fn get_volume(s: &HttpState, q: &QueryOptions, id: &str) -> super::util::HttpResult {
    if id.is_empty() {
        return Err(HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: "missing volume ID".into() });
    }
    let ns = q.namespace.clone();
    let watches = [Watch::CsiVolume(Watch::job_key(&ns, id)), Watch::Table(Table::CsiPlugins)];
    let (view, index) = s
        .endpoints
        .store()
        .blocking_query_on(&watches, q.min_index, q.wait, |st| {
            let view = st.csi_volume(&ns, id).map(|v| st.csi_volume_denormalized(v));
            (view, st.max_index(&[Table::CsiVolumes, Table::CsiPlugins]))
        })
        .await;
    let view = view.ok_or_else(|| HttpError::not_found("volume not found"))?;
    json_response(&view.volume.to_api_value(&view.allocations), Some(s.meta(index)), q.pretty)
}

/// Nomad's `parseCSISecrets`: `X-Nomad-CSI-Secrets: k=v,k2=v2` (pairs without `=` dropped).
fn csi_secrets(headers: &HeaderMap) -> BTreeMap<String, String> {
    let Some(raw) = headers.get("X-Nomad-CSI-Secrets").and_then(|v| v.to_str().ok()) else { return BTreeMap::new() };
    raw.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `CSIVolume.Create`: answers with the volumes as created (`CSIVolumeCreateResponse`).
async fn create(s: &HttpState, q: &QueryOptions, body: Body) -> super::util::HttpResult {
    let bytes = read_body(body).await?;
    let req: CsiVolumeRegisterRequest = decode_body(&bytes)?;
    let (volumes, index) = s.endpoints.csi_volume_create(&q.namespace, req.volumes).await?;
    let volumes: Vec<serde_json::Value> = volumes.iter().map(|v| v.to_api_value(&[])).collect();
    json_response(&serde_json::json!({ "Volumes": volumes, "Index": index }), Some(s.meta(index)), q.pretty)
}

async fn register(s: &HttpState, q: &QueryOptions, body: Body) -> super::util::HttpResult {
    let bytes = read_body(body).await?;
    let req: CsiVolumeRegisterRequest = decode_body(&bytes)?;
    let index = s.endpoints.csi_volume_register(&q.namespace, req.volumes).await?;
    write_ack(s, index)
}

/// Nomad answers volume writes with an empty body and the index header; python-nomad calls
/// `.json()` on 2xx replies, so send the index as JSON, as the namespace routes do.
fn write_ack(s: &HttpState, index: u64) -> super::util::HttpResult {
    json_response(&serde_json::json!({ "Index": index }), Some(s.meta(index)), false)
}

/// `GET /v1/plugins?type=csi` (`prefix`, `filter`).
pub async fn plugins(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        super::util::require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        match list_type(&q) {
            ListType::Missing => return json_response(&Vec::<CsiPluginListStub>::new(), None, q.pretty),
            ListType::Other => return json_response(&serde_json::Value::Null, None, q.pretty),
            ListType::Csi => {}
        }
        let (stubs, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::CsiPlugins], q.min_index, q.wait, |st| {
                let stubs: Vec<CsiPluginListStub> = st.csi_plugins().filter(|p| p.id.starts_with(&q.prefix)).map(|p| p.stub()).collect();
                (stubs, st.table_index(Table::CsiPlugins))
            })
            .await;
        let (page, next) = paginate(stubs, &q, |p| p.id.clone());
        list_response(&page, next, s.meta(index), q.pretty)
    })
    .await
}

/// `GET /v1/plugin/csi/<id>`: the plugin, with its allocs in the request's namespace.
pub async fn plugin_specific(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        super::util::require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let path = super::jobs::decode_path(uri.path().strip_prefix("/v1/plugin/csi/").unwrap_or_default())?;
        let tokens: Vec<&str> = path.split('/').collect();
        if tokens.len() > 2 {
            return Err(HttpError::not_found(RESOURCE_NOT_FOUND));
        }
        let id = tokens[0].to_string();
        if id.is_empty() {
            return Err(HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: "missing plugin ID".into() });
        }
        let ns = q.namespace_filter().map(str::to_string);
        let (plugin, index) = s
            .endpoints
            .store()
            .blocking_query_on(&[Watch::CsiPlugin(id.clone())], q.min_index, q.wait, |st| {
                let p = st.csi_plugin(&id).map(|p| st.csi_plugin_denormalized(p, ns.as_deref()));
                (p, st.table_index(Table::CsiPlugins))
            })
            .await;
        let plugin = plugin.ok_or_else(|| HttpError::not_found("plugin not found"))?;
        json_response(&plugin, Some(s.meta(index)), q.pretty)
    })
    .await
}
