//! The stand-in's Connect control plane: Envoy's delta ADS over gRPC, as Consul v1.16 serves it
//! (`agent/xds/delta.go`; reference connect-data-plane.md §3.1).
//!
//! - Only `DeltaAggregatedResources` works; the state-of-the-world stream answers
//!   `Unimplemented`, as Consul's does.
//! - The proxy is the bootstrap's `node.id`: the proxy service ID registered with the agent.
//! - With ACLs on, the stream's `x-consul-token` must resolve (else `Unauthenticated`) and grant
//!   `service:write` on the sidecar's destination or the gateway's name (else
//!   `PermissionDenied`); it is checked again before every push.
//! - CDS and LDS are wildcard subscriptions, EDS is by name; `initial_resource_versions` are
//!   honoured. Per type at most one response waits for its ACK; LDS waits while CDS or EDS do.
//!   A NACK is recorded ([`super::ConsulStandIn::xds_nacks`]) and not retried until the catalog
//!   changes.
//! - Any catalog or config-entry write (the stand-in's index) recomputes the proxy's resources and
//!   pushes what changed.

mod resources;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use sha1::{Digest, Sha1};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::Shared;
use super::routes::{Who, resolve};
use resources::{CLUSTER, ENDPOINT, LISTENER, ProxyKind};

/// Consul's push order: clusters, then their endpoints, then the listeners that use them.
const ORDER: [&str; 3] = [CLUSTER, ENDPOINT, LISTENER];
/// How long a new stream may take to send its first request.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request the server decodes.
const MAX_REQUEST: usize = 4 * 1024 * 1024;
/// How many NACKs (and streams, and ACKs) the stand-in keeps (the oldest are dropped).
const MAX_NACKS: usize = 1000;
/// The most resource names one stream may subscribe to per type.
const MAX_NAMES: usize = 10_000;
/// The oldest Envoy Consul 1.16 serves.
const OLDEST_ENVOY: (u32, u32) = (1, 23);

/// A NACK a proxy sent: which proxy, for which type, and Envoy's reason.
#[derive(Debug, Clone)]
pub struct Nack {
    pub proxy_id: String,
    pub type_url: String,
    pub message: String,
}

/// The resource names of `proxy_id`'s snapshot, by type URL.
pub(crate) fn resource_names(
    st: &super::State,
    ca: &super::ca::ConnectCa,
    proxy_id: &str,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let snapshot = resources::snapshot(st, ca, proxy_id)?;
    Ok(snapshot.by_type.into_iter().map(|(t, r)| (t.to_string(), r.into_keys().collect())).collect())
}

/// Serves ADS on `listener` until the runtime shuts down.
pub(crate) async fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    let service = AggregatedDiscoveryServiceServer::new(Ads { shared }).max_decoding_message_size(MAX_REQUEST);
    let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(TcpListenerStream::new(listener)).await;
}

struct Ads {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("not implemented"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let token = request.metadata().get("x-consul-token").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let stream = DeltaStream { shared: self.shared.clone(), token, tx, types: BTreeMap::new(), nonce: 0, proxy_id: String::new() };
        tokio::spawn(stream.run(inbound));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// What one resource type's subscription looks like on one stream.
#[derive(Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the proxy holds: name to version.
    sent: BTreeMap<String, String>,
    /// The nonce of the response awaiting its ACK.
    pending: Option<String>,
    /// Whether the first request has had its answer (which may be empty).
    answered: bool,
}

struct DeltaStream {
    shared: Arc<Shared>,
    token: String,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    types: BTreeMap<String, TypeState>,
    nonce: u64,
    proxy_id: String,
}

fn version_of(any: &envoy_types::pb::google::protobuf::Any) -> String {
    Sha1::digest(&any.value).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl DeltaStream {
    async fn run(mut self, mut inbound: Streaming<DeltaDiscoveryRequest>) {
        let first = match tokio::time::timeout(FIRST_REQUEST_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(r))) => r,
            _ => return,
        };
        let node = first.node.clone().unwrap_or_default();
        self.proxy_id = node.id.clone();
        if self.proxy_id.is_empty() {
            let _ = self.tx.send(Err(Status::invalid_argument("node.id is required (the proxy service ID)"))).await;
            return;
        }
        if let Some(envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType::UserAgentBuildVersion(b)) =
            &node.user_agent_version_type
            && let Some(v) = &b.version
            && (v.major_number, v.minor_number) < OLDEST_ENVOY
        {
            let msg = format!("Envoy {}.{}.{} is too old and is not supported by Consul", v.major_number, v.minor_number, v.patch);
            let _ = self.tx.send(Err(Status::failed_precondition(msg))).await;
            return;
        }
        if let Err(status) = self.authorize() {
            let _ = self.tx.send(Err(status)).await;
            return;
        }
        {
            let mut st = self.shared.lock();
            if st.xds_streams.len() >= MAX_NACKS {
                st.xds_streams.remove(0);
            }
            st.xds_streams.push(self.proxy_id.clone());
        }
        if let Err(status) = self.handle(first) {
            let _ = self.tx.send(Err(status)).await;
            return;
        }
        let mut changes = self.shared.index_tx.subscribe();
        loop {
            changes.borrow_and_update();
            if let Err(status) = self.push().await {
                let _ = self.tx.send(Err(status)).await;
                return;
            }
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(r)) => if let Err(status) = self.handle(r) {
                        let _ = self.tx.send(Err(status)).await;
                        return;
                    },
                    _ => return,
                },
                changed = changes.changed() => if changed.is_err() { return },
                _ = self.tx.closed() => return,
            }
        }
    }

    /// The token must resolve and may write the proxy's service, which must be registered (a
    /// deregistered proxy's stream ends).
    fn authorize(&self) -> Result<(), Status> {
        let st = self.shared.lock();
        let who = resolve(&st, &self.token).map_err(|e| Status::unauthenticated(e.to_string()))?;
        let service = match resources::proxy_kind(&st, &self.proxy_id) {
            Ok(ProxyKind::Sidecar { destination }) => destination,
            Ok(ProxyKind::TerminatingGateway { name }) => name,
            Err(e) => return Err(Status::not_found(e)),
        };
        if matches!(who, Who::Management) || who.service_write(&service) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!("permission denied: token lacks 'service:write' on \"{service}\"")))
        }
    }

    fn handle(&mut self, req: DeltaDiscoveryRequest) -> Result<(), Status> {
        if ![CLUSTER, ENDPOINT, LISTENER].contains(&req.type_url.as_str()) {
            // RDS and SDS are never used by these resources; nothing to answer.
            return Ok(());
        }
        let first = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();
        if first {
            ts.sent.extend(req.initial_resource_versions.clone());
            // An empty first subscription is a wildcard for CDS and LDS.
            ts.wildcard = req.resource_names_subscribe.is_empty() && req.type_url != ENDPOINT;
        }
        for name in req.resource_names_subscribe {
            if name == "*" {
                ts.wildcard = true;
            } else {
                ts.names.insert(name);
            }
        }
        for name in req.resource_names_unsubscribe {
            if name == "*" {
                ts.wildcard = false;
            }
            ts.names.remove(&name);
            ts.sent.remove(&name);
        }
        if ts.names.len() > MAX_NAMES || ts.sent.len() > MAX_NAMES {
            return Err(Status::invalid_argument(format!("more than {MAX_NAMES} {} resources subscribed", req.type_url)));
        }
        if !req.response_nonce.is_empty() && ts.pending.as_deref() == Some(req.response_nonce.as_str()) {
            ts.pending = None;
            if req.error_detail.is_none() {
                let mut st = self.shared.lock();
                if st.xds_acks.len() >= MAX_NACKS {
                    st.xds_acks.remove(0);
                }
                st.xds_acks.push((self.proxy_id.clone(), req.type_url.clone()));
            }
            if let Some(err) = req.error_detail {
                let nack = Nack { proxy_id: self.proxy_id.clone(), type_url: req.type_url.clone(), message: err.message };
                eprintln!("consul-standin xds: NACK from {}: {} {}", nack.proxy_id, nack.type_url, nack.message);
                let mut st = self.shared.lock();
                if st.xds_nacks.len() >= MAX_NACKS {
                    st.xds_nacks.remove(0);
                }
                st.xds_nacks.push(nack);
            }
        }
        Ok(())
    }

    /// Sends, type by type, whatever the proxy lacks or holds in excess.
    async fn push(&mut self) -> Result<(), Status> {
        self.authorize()?;
        let snapshot = {
            let st = self.shared.lock();
            let Some(ca) = self.shared.ca.as_ref() else { return Err(Status::failed_precondition("Connect is not enabled")) };
            resources::snapshot(&st, ca, &self.proxy_id).map_err(Status::internal)?
        };
        let held = |t: &str, types: &BTreeMap<String, TypeState>| types.get(t).is_some_and(|s| s.pending.is_some());
        for type_url in ORDER {
            if type_url == LISTENER && (held(CLUSTER, &self.types) || held(ENDPOINT, &self.types)) {
                continue;
            }
            let Some(ts) = self.types.get_mut(type_url) else { continue };
            if ts.pending.is_some() {
                continue;
            }
            let available = snapshot.by_type.get(type_url).cloned().unwrap_or_default();
            let mut wanted = BTreeMap::new();
            for (name, any) in &available {
                if ts.wildcard || ts.names.contains(name) {
                    wanted.insert(name.clone(), any.clone());
                }
            }
            if type_url == ENDPOINT {
                for name in &ts.names {
                    wanted.entry(name.clone()).or_insert_with(|| resources::empty_load_assignment(name));
                }
            }
            let mut resources = Vec::new();
            for (name, any) in &wanted {
                let version = version_of(any);
                if ts.sent.get(name) != Some(&version) {
                    resources.push(Resource {
                        name: name.clone(),
                        version: version.clone(),
                        resource: Some(any.clone()),
                        ..Default::default()
                    });
                }
            }
            let removed: Vec<String> = ts.sent.keys().filter(|n| !wanted.contains_key(*n)).cloned().collect();
            if resources.is_empty() && removed.is_empty() && ts.answered {
                continue;
            }
            self.nonce += 1;
            let nonce = format!("{:08x}", self.nonce);
            for r in &resources {
                ts.sent.insert(r.name.clone(), r.version.clone());
            }
            for n in &removed {
                ts.sent.remove(n);
            }
            ts.pending = Some(nonce.clone());
            ts.answered = true;
            let changed_clusters: Vec<String> =
                if type_url == CLUSTER { resources.iter().map(|r| r.name.clone()).collect() } else { Vec::new() };
            // A changed cluster warms afresh and waits for its endpoints again, so they are resent.
            if let Some(eds) = self.types.get_mut(ENDPOINT) {
                for name in &changed_clusters {
                    eds.sent.remove(name);
                }
            }
            let response = DeltaDiscoveryResponse {
                type_url: type_url.to_string(),
                resources,
                removed_resources: removed,
                nonce,
                system_version_info: String::new(),
                ..Default::default()
            };
            if self.tx.send(Ok(response)).await.is_err() {
                return Err(Status::cancelled("stream closed"));
            }
        }
        Ok(())
    }
}
