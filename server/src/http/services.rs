//! `/v1/services` and `/v1/service/<name>`: Nomad-native service registrations.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use nomad_proto::service_registration::{ServiceRegistrationListStub, ServiceRegistrationStub};

use super::HttpState;
use super::util::{HttpError, QueryOptions, filtered, list_response, require_method};
use crate::state::{Table, Watch};

/// `GET /v1/services`: service names and tags, grouped by namespace.
pub async fn services(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let ns = q.namespace_filter().map(str::to_string);
        let (list, index) = s
            .endpoints
            .store()
            .blocking_query(&[Table::Services], q.min_index, q.wait, |st| {
                let mut by_ns: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
                for r in st.service_registrations().filter(|r| ns.as_deref().is_none_or(|n| r.namespace == n)) {
                    let tags = by_ns.entry(r.namespace.clone()).or_default().entry(r.service_name.clone()).or_default();
                    for t in &r.tags {
                        if !tags.contains(t) {
                            tags.push(t.clone());
                        }
                    }
                }
                let list: Vec<ServiceRegistrationListStub> = by_ns
                    .into_iter()
                    .map(|(namespace, svcs)| ServiceRegistrationListStub {
                        namespace,
                        services: svcs.into_iter().map(|(service_name, tags)| ServiceRegistrationStub { service_name, tags }).collect(),
                    })
                    .collect();
                (list, st.table_index(Table::Services))
            })
            .await;
        list_response(&filtered(list, &q), None, s.meta(index), q.pretty)
    })
    .await
}

/// `GET /v1/service/<name>`: the instances of a service.
pub async fn service_specific(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let name = uri.path().strip_prefix("/v1/service/").unwrap_or_default().to_string();
        if name.is_empty() || name.contains('/') {
            return Err(HttpError::not_found("resource not found"));
        }
        let ns = q.namespace_filter().map(str::to_string);
        let (regs, index) = s
            .endpoints
            .store()
            .blocking_query_on(&[Watch::Service(name.clone())], q.min_index, q.wait, |st| {
                let regs: Vec<_> = st.service_registrations_by_name(ns.as_deref(), &name).map(|r| (**r).clone()).collect();
                (regs, st.table_index(Table::Services))
            })
            .await;
        list_response(&filtered(regs, &q), None, s.meta(index), q.pretty)
    })
    .await
}
