//! The xDS resources Consul v1.16 gives a proxy (`agent/xds/{listeners,clusters,endpoints}.go`,
//! reference connect-data-plane.md §3.2-§3.4), built from the stand-in's catalog.
//!
//! A sidecar (`connect-proxy`) gets its public mTLS listener, the `local_app` cluster, and per
//! upstream a plaintext local listener and an mTLS cluster whose endpoints are the destination's
//! sidecars (and the terminating gateways linking it). A terminating gateway gets one SNI-matched
//! filter chain and one cluster per service its config entry links.
//!
//! Intentions are default-allow (an empty `DENY` RBAC policy), whatever the ACL default policy.

use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, HealthStatus, SocketAddress, TrafficDirection, TransportSocket,
    address, config_source, data_source, socket_address, transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::config::rbac::v3 as rbac;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SubjectAltNameMatcher, TlsCertificate, TlsParameters,
    UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration as PbDuration, UInt32Value};
use envoy_types::util::pack_any;
use prost::Name;
use serde_json::Value;

use super::super::State;
use super::super::ca::{ConnectCa, Leaf};
use super::super::routes::effective_status;

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// The stand-in's node address (every service without its own address is on it).
const NODE_ADDRESS: &str = "127.0.0.1";
/// Consul's `local_connect_timeout_ms` and resolver connect timeout defaults.
const CONNECT_TIMEOUT_MS: u64 = 5000;

/// One proxy's resources by type URL, then name.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub by_type: BTreeMap<&'static str, BTreeMap<String, Any>>,
}

impl Snapshot {
    fn add<T: Name + prost::Message>(&mut self, type_url: &'static str, name: String, resource: T) {
        self.by_type.entry(type_url).or_default().insert(name, pack_any(resource));
    }
}

/// What kind of proxy a registration is, and the service it needs `service:write` on.
pub enum ProxyKind {
    Sidecar { destination: String },
    TerminatingGateway { name: String },
}

/// The registered proxy with this service ID, or why it cannot be served.
pub fn proxy_kind(st: &State, proxy_id: &str) -> Result<ProxyKind, String> {
    let Some(reg) = st.services.get(proxy_id) else {
        return Err(format!("no proxy service with ID {proxy_id:?} is registered with the local agent"));
    };
    match reg.get("Kind").and_then(Value::as_str).unwrap_or_default() {
        "connect-proxy" => Ok(ProxyKind::Sidecar { destination: str_of(&reg["Proxy"]["DestinationServiceName"]) }),
        "terminating-gateway" => Ok(ProxyKind::TerminatingGateway { name: str_of(&reg["Name"]) }),
        other => {
            Err(format!("service {proxy_id:?} is not a proxy (Kind {other:?}); only connect-proxy and terminating-gateway are served"))
        }
    }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn port_of(v: &Value) -> u32 {
    v.as_i64().filter(|p| (0..=65535).contains(p)).unwrap_or(0) as u32
}

fn non_empty(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(String::from)
}

/// Builds everything `proxy_id` should hold now.
pub fn snapshot(st: &State, ca: &ConnectCa, proxy_id: &str) -> Result<Snapshot, String> {
    let reg = st.services.get(proxy_id).ok_or_else(|| format!("proxy {proxy_id:?} is not registered"))?;
    match proxy_kind(st, proxy_id)? {
        ProxyKind::Sidecar { destination } => sidecar(st, ca, reg, &destination),
        ProxyKind::TerminatingGateway { name } => terminating_gateway(st, ca, reg, &name),
    }
}

fn sidecar(st: &State, ca: &ConnectCa, reg: &Value, destination: &str) -> Result<Snapshot, String> {
    let proxy = &reg["Proxy"];
    let config = &proxy["Config"];
    let leaf = ca.leaf(destination).map_err(|e| format!("leaf certificate for {destination:?}: {e:#}"))?;
    let mut snap = Snapshot::default();

    // The public listener: mTLS from mesh clients, then local_app.
    let bind_address = non_empty(&config["bind_address"]).or_else(|| non_empty(&reg["Address"])).unwrap_or_else(|| "0.0.0.0".into());
    let bind_port = config["bind_port"].as_i64().map(|_| port_of(&config["bind_port"])).unwrap_or_else(|| port_of(&reg["Port"]));
    let name = format!("public_listener:{bind_address}:{bind_port}");
    let chain = FilterChain {
        filters: vec![rbac_filter(), tcp_proxy_filter("public_listener", "local_app")],
        transport_socket: Some(downstream_tls(ca, &leaf)),
        ..Default::default()
    };
    snap.add(
        LISTENER,
        name.clone(),
        Listener {
            name,
            address: Some(socket(&bind_address, bind_port)),
            filter_chains: vec![chain],
            traffic_direction: TrafficDirection::Inbound as i32,
            ..Default::default()
        },
    );

    let local_address = non_empty(&proxy["LocalServiceAddress"]).unwrap_or_else(|| NODE_ADDRESS.into());
    let local_port = port_of(&proxy["LocalServicePort"]);
    let timeout_ms = config["local_connect_timeout_ms"].as_u64().filter(|t| *t > 0 && *t <= 600_000).unwrap_or(CONNECT_TIMEOUT_MS);
    snap.add(CLUSTER, "local_app".into(), static_cluster("local_app", &local_address, local_port, timeout_ms));

    for upstream in proxy["Upstreams"].as_array().into_iter().flatten() {
        let service = str_of(&upstream["DestinationName"]);
        if service.is_empty() || upstream["DestinationType"].as_str().is_some_and(|t| !t.is_empty() && t != "service") {
            // Prepared-query upstreams are not served by the stand-in.
            continue;
        }
        let sni = ca.sni(&service);
        let bind = non_empty(&upstream["LocalBindAddress"]).unwrap_or_else(|| NODE_ADDRESS.into());
        let port = port_of(&upstream["LocalBindPort"]);
        let dc_suffix = non_empty(&upstream["Datacenter"]).map(|dc| format!("?dc={dc}")).unwrap_or_default();
        let name = format!("{service}{dc_suffix}:{bind}:{port}");
        let stat_prefix = format!("upstream.{service}.default.default.{}", ca.datacenter);
        snap.add(
            LISTENER,
            name.clone(),
            Listener {
                name,
                address: Some(socket(&bind, port)),
                filter_chains: vec![FilterChain { filters: vec![tcp_proxy_filter(&stat_prefix, &sni)], ..Default::default() }],
                traffic_direction: TrafficDirection::Outbound as i32,
                ..Default::default()
            },
        );
        let mut c = eds_cluster(&sni, CONNECT_TIMEOUT_MS);
        c.alt_stat_name = sni.clone();
        c.transport_socket = Some(upstream_tls(ca, &leaf, &sni, &ca.spiffe_id(&service)));
        snap.add(CLUSTER, sni.clone(), c);
        snap.add(ENDPOINT, sni.clone(), mesh_endpoints(st, &sni, &service));
    }
    Ok(snap)
}

fn terminating_gateway(st: &State, ca: &ConnectCa, reg: &Value, gateway: &str) -> Result<Snapshot, String> {
    let mut snap = Snapshot::default();
    let entry = st.config_entries.get(&("terminating-gateway".to_string(), gateway.to_string()));
    let mut linked: Vec<&Value> = entry.and_then(|e| e["Services"].as_array()).into_iter().flatten().collect();
    linked.sort_by_key(|s| str_of(&s["Name"]));
    let mut chains = Vec::new();
    for link in linked {
        let service = str_of(&link["Name"]);
        if service.is_empty() || service == "*" {
            // Wildcard links are not served by the stand-in.
            continue;
        }
        let sni = ca.sni(&service);
        let leaf = ca.leaf(&service).map_err(|e| format!("leaf certificate for {service:?}: {e:#}"))?;
        chains.push(FilterChain {
            filter_chain_match: Some(FilterChainMatch { server_names: vec![sni.clone()], ..Default::default() }),
            filters: vec![rbac_filter(), tcp_proxy_filter(&format!("upstream.{sni}"), &sni)],
            transport_socket: Some(downstream_tls(ca, &leaf)),
            ..Default::default()
        });
        let mut c = eds_cluster(&sni, CONNECT_TIMEOUT_MS);
        if let Some(ca_file) = non_empty(&link["CAFile"]) {
            // TLS origination to the external service, with files where Envoy runs.
            c.transport_socket =
                Some(external_tls(&ca_file, non_empty(&link["CertFile"]), non_empty(&link["KeyFile"]), non_empty(&link["SNI"])));
        }
        snap.add(CLUSTER, sni.clone(), c);
        snap.add(ENDPOINT, sni.clone(), external_endpoints(st, &sni, &service));
    }
    let tls_inspector = ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(TlsInspector::default()))),
        ..Default::default()
    };
    for (bind_name, address, port) in gateway_binds(reg) {
        let name = format!("{bind_name}:{address}:{port}");
        snap.add(
            LISTENER,
            name.clone(),
            Listener {
                name,
                address: Some(socket(&address, port)),
                filter_chains: chains.clone(),
                listener_filters: vec![tls_inspector.clone()],
                traffic_direction: TrafficDirection::Outbound as i32,
                ..Default::default()
            },
        );
    }
    Ok(snap)
}

/// Where a gateway listens (Consul's `listenersFromSnapshotGateway`): its service address
/// (`default`, 0.0.0.0 when it has none) unless `envoy_gateway_no_default_bind`, its tagged
/// addresses with `envoy_gateway_bind_tagged_addresses`, and each `envoy_gateway_bind_addresses`
/// entry (Nomad's bridge mode: `default` on 0.0.0.0, the registration's address being the
/// host's); sorted by name, one listener per address.
fn gateway_binds(reg: &Value) -> Vec<(String, String, u32)> {
    let config = &reg["Proxy"]["Config"];
    let field = |v: &Value, key: &str| {
        v.as_object().and_then(|o| o.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.clone())).unwrap_or(Value::Null)
    };
    let mut binds = Vec::new();
    if !weak_bool(&config["envoy_gateway_no_default_bind"]) {
        binds.push(("default".to_string(), non_empty(&reg["Address"]).unwrap_or_else(|| "0.0.0.0".into()), port_of(&reg["Port"])));
    }
    let mut named = |map: &Value| {
        for (name, a) in map.as_object().into_iter().flatten() {
            binds.push((name.clone(), non_empty(&field(a, "Address")).unwrap_or_default(), port_of(&field(a, "Port"))));
        }
    };
    if weak_bool(&config["envoy_gateway_bind_tagged_addresses"]) {
        named(&reg["TaggedAddresses"]);
    }
    named(&config["envoy_gateway_bind_addresses"]);
    binds.sort_by(|a, b| a.0.cmp(&b.0));
    let mut seen = std::collections::BTreeSet::new();
    binds.retain(|(_, address, port)| seen.insert((address.clone(), *port)));
    binds
}

/// A proxy config flag as Consul decodes it (mapstructure's weak typing: `true`, `"true"`, `1`).
fn weak_bool(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(s.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"),
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        _ => false,
    }
}

fn socket(address: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn duration_ms(ms: u64) -> PbDuration {
    PbDuration { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

fn inline(s: &str) -> DataSource {
    DataSource { specifier: Some(data_source::Specifier::InlineString(s.to_string())), ..Default::default() }
}

fn file(path: &str) -> DataSource {
    DataSource { specifier: Some(data_source::Specifier::Filename(path.to_string())), ..Default::default() }
}

/// `envoy.filters.network.rbac` with no deny rules: every mesh client is allowed.
fn rbac_filter() -> Filter {
    let rbac = Rbac {
        rules: Some(rbac::Rbac { action: rbac::rbac::Action::Deny as i32, ..Default::default() }),
        stat_prefix: "connect_authz".into(),
        ..Default::default()
    };
    Filter { name: "envoy.filters.network.rbac".into(), config_type: Some(filter::ConfigType::TypedConfig(pack_any(rbac))) }
}

fn tcp_proxy_filter(stat_prefix: &str, cluster: &str) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string())),
        ..Default::default()
    };
    Filter { name: "envoy.filters.network.tcp_proxy".into(), config_type: Some(filter::ConfigType::TypedConfig(pack_any(proxy))) }
}

fn common_tls(ca: &ConnectCa, leaf: &Leaf, san: Option<&str>) -> CommonTlsContext {
    let validation = CertificateValidationContext {
        trusted_ca: Some(inline(&ca.root_pem)),
        match_typed_subject_alt_names: san
            .map(|s| SubjectAltNameMatcher {
                san_type: subject_alt_name_matcher::SanType::Uri as i32,
                matcher: Some(StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact(s.to_string())),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .into_iter()
            .collect(),
        ..Default::default()
    };
    CommonTlsContext {
        tls_params: Some(TlsParameters::default()),
        tls_certificates: vec![TlsCertificate {
            certificate_chain: Some(inline(&leaf.cert_pem)),
            private_key: Some(inline(&leaf.key_pem)),
            ..Default::default()
        }],
        validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(validation)),
        ..Default::default()
    }
}

/// Server side of mesh mTLS: this service's leaf, and a client certificate from the CA required.
fn downstream_tls(ca: &ConnectCa, leaf: &Leaf) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(common_tls(ca, leaf, None)),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket { name: "tls".into(), config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))) }
}

/// Client side of mesh mTLS: own leaf, SNI, and the destination's SPIFFE ID required.
fn upstream_tls(ca: &ConnectCa, leaf: &Leaf, sni: &str, spiffe_id: &str) -> TransportSocket {
    let ctx =
        UpstreamTlsContext { common_tls_context: Some(common_tls(ca, leaf, Some(spiffe_id))), sni: sni.to_string(), ..Default::default() };
    TransportSocket { name: "tls".into(), config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))) }
}

/// A terminating gateway's TLS to an external service (the config entry's CAFile, CertFile,
/// KeyFile and SNI).
fn external_tls(ca_file: &str, cert: Option<String>, key: Option<String>, sni: Option<String>) -> TransportSocket {
    let validation = CertificateValidationContext {
        trusted_ca: Some(file(ca_file)),
        match_typed_subject_alt_names: sni
            .iter()
            .map(|s| SubjectAltNameMatcher {
                san_type: subject_alt_name_matcher::SanType::Dns as i32,
                matcher: Some(StringMatcher { match_pattern: Some(string_matcher::MatchPattern::Exact(s.clone())), ..Default::default() }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let tls_certificates = match (cert, key) {
        (Some(c), Some(k)) => vec![TlsCertificate { certificate_chain: Some(file(&c)), private_key: Some(file(&k)), ..Default::default() }],
        _ => vec![],
    };
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters::default()),
            tls_certificates,
            validation_context_type: Some(common_tls_context::ValidationContextType::ValidationContext(validation)),
            ..Default::default()
        }),
        sni: sni.unwrap_or_default(),
        ..Default::default()
    };
    TransportSocket { name: "tls".into(), config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(ctx))) }
}

fn static_cluster(name: &str, address: &str, port: u32, timeout_ms: u64) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Static as i32)),
        connect_timeout: Some(duration_ms(timeout_ms)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![lb_endpoint_at(address, port, HealthStatus::Unknown, 1)],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn eds_cluster(name: &str, timeout_ms: u64) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ConfigSource {
                resource_api_version: ApiVersion::V3 as i32,
                config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource::default())),
                ..Default::default()
            }),
            ..Default::default()
        }),
        connect_timeout: Some(duration_ms(timeout_ms)),
        // No panic routing: an unhealthy endpoint never gets traffic.
        common_lb_config: Some(cluster::CommonLbConfig {
            healthy_panic_threshold: Some(envoy_types::pb::envoy::r#type::v3::Percent { value: 0.0 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn lb_endpoint_at(address: &str, port: u32, health: HealthStatus, weight: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(socket(address, port)),
            ..Default::default()
        })),
        health_status: health as i32,
        load_balancing_weight: Some(UInt32Value { value: weight.clamp(1, 128) }),
        ..Default::default()
    }
}

/// A service instance's health as Consul computes it for EDS: unhealthy if any check is critical.
fn health_of(st: &State, service_id: &str) -> HealthStatus {
    let critical = st.checks.values().filter(|c| c.service_id == service_id).any(|c| effective_status(st, c) == "critical");
    if critical { HealthStatus::Unhealthy } else { HealthStatus::Healthy }
}

fn instance_endpoint(st: &State, instance: &Value) -> LbEndpoint {
    let address = non_empty(&instance["Address"]).unwrap_or_else(|| NODE_ADDRESS.into());
    let weight = instance["Weights"]["Passing"].as_u64().unwrap_or(1) as u32;
    lb_endpoint_at(&address, port_of(&instance["Port"]), health_of(st, instance["ID"].as_str().unwrap_or_default()), weight)
}

fn load_assignment(cluster_name: &str, lb_endpoints: Vec<LbEndpoint>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        // Always one locality, possibly empty: Envoy needs an answer for every EDS cluster.
        endpoints: vec![LocalityLbEndpoints { lb_endpoints, ..Default::default() }],
        ..Default::default()
    }
}

/// The mesh instances of `service`: its sidecars, its Connect-native instances, and the
/// terminating gateways that link it.
fn mesh_endpoints(st: &State, cluster_name: &str, service: &str) -> ClusterLoadAssignment {
    let gateways: Vec<&str> = st
        .config_entries
        .iter()
        .filter(|((kind, _), e)| {
            kind == "terminating-gateway" && e["Services"].as_array().into_iter().flatten().any(|s| s["Name"] == service)
        })
        .map(|((_, name), _)| name.as_str())
        .collect();
    let endpoints = st
        .services
        .values()
        .filter(|s| match s.get("Kind").and_then(Value::as_str).unwrap_or_default() {
            "connect-proxy" => s["Proxy"]["DestinationServiceName"] == service,
            "terminating-gateway" => gateways.iter().any(|g| s["Name"] == *g),
            "" => s["Name"] == service && s["Connect"]["Native"] == true,
            _ => false,
        })
        .map(|s| instance_endpoint(st, s))
        .collect();
    load_assignment(cluster_name, endpoints)
}

/// The catalog instances of an external service a terminating gateway links.
fn external_endpoints(st: &State, cluster_name: &str, service: &str) -> ClusterLoadAssignment {
    let endpoints = st
        .services
        .values()
        .filter(|s| s["Name"] == service && s.get("Kind").and_then(Value::as_str).unwrap_or_default().is_empty())
        .filter(|s| non_empty(&s["Address"]).is_none_or(|a| a.parse::<IpAddr>().is_ok()))
        .map(|s| instance_endpoint(st, s))
        .collect();
    load_assignment(cluster_name, endpoints)
}

/// An explicit empty answer for an EDS name the proxy asked for that the catalog does not have.
pub fn empty_load_assignment(cluster_name: &str) -> Any {
    pack_any(load_assignment(cluster_name, vec![]))
}
