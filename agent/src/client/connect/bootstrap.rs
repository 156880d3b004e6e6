//! The Envoy bootstrap of a Connect sidecar or gateway, built as `consul connect envoy
//! -bootstrap` (Consul 1.16) builds it for the arguments Nomad's `envoy_bootstrap` hook passes:
//!
//! - `node`: `id` = the proxy's Consul service ID, `cluster` = the service name, metadata with
//!   the Consul namespace and partition (`default` when unset);
//! - `admin` on the admin bind (Nomad: `127.0.0.2:19000 + task index` in bridge mode);
//! - one static cluster `local_agent`: Consul's gRPC (xDS) address over HTTP/2, either a TCP
//!   address or a unix socket (`unix://alloc/tmp/consul_grpc.sock` in bridge mode);
//! - delta ADS v3 for listeners and clusters, with `x-consul-token` (always present, maybe
//!   empty) as initial metadata;
//! - stats tags: the proxy config's `envoy_stats_tags` (Nomad puts `nomad.alloc_id`, ...
//!   there), Consul's extractors for cluster and upstream metric names, then the source tags;
//! - the `/ready` listener for ingress gateways (Consul 1.16 adds it only for them).
//!
//! Envoy 1.40 deprecates two fields Consul 1.16 writes (`Cluster.http2_protocol_options`,
//! `Admin.access_log_path`); their current equivalents are written instead (HTTP/2 through the
//! cluster's `HttpProtocolOptions`, and no admin access log, which is what `/dev/null` meant).

use serde_json::{Value, json};

/// What kind of proxy Envoy runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    /// A Connect sidecar (`connect-proxy:<svc>`).
    Sidecar,
    /// `connect-ingress:<svc>`.
    Ingress,
    /// `connect-terminating:<svc>`.
    Terminating,
    /// `connect-mesh:<svc>`.
    Mesh,
}

/// Consul's gRPC (xDS) endpoint as Envoy reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcEndpoint {
    /// `host:port` (an IP address; Envoy's static clusters take no names).
    Tcp { address: String, port: u16 },
    /// A unix socket path (relative to Envoy's working directory, as Nomad passes it).
    Unix(String),
}

impl GrpcEndpoint {
    /// Parses Nomad's `-grpc-addr` forms: `unix://<path>`, `http://host:port`, `host:port`.
    pub fn parse(raw: &str) -> Result<GrpcEndpoint, String> {
        if let Some(path) = raw.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(format!("invalid gRPC address {raw:?}: empty socket path"));
            }
            return Ok(GrpcEndpoint::Unix(path.to_string()));
        }
        if raw.starts_with("https://") {
            return Err(format!("invalid gRPC address {raw:?}: TLS to Consul's gRPC port is not supported by this client"));
        }
        let hostport = raw.strip_prefix("http://").unwrap_or(raw);
        let sa: std::net::SocketAddr =
            hostport.parse().map_err(|_| format!("invalid gRPC address {raw:?}: want ip:port or unix://<path>"))?;
        Ok(GrpcEndpoint::Tcp { address: sa.ip().to_string(), port: sa.port() })
    }
}

/// Everything the bootstrap depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapParams {
    pub kind: ProxyKind,
    /// The proxy's Consul service ID (`node.id`).
    pub proxy_id: String,
    /// `node.cluster` and the `local_cluster` tag: the sidecar's destination service, or a
    /// gateway's kind (`terminating-gateway`: Consul's `-gateway` default service name, since
    /// Nomad passes no `-service`).
    pub cluster: String,
    /// The service the proxy stands for (`consul.source.service`): the sidecar's destination,
    /// or the gateway's registered name.
    pub service: String,
    /// Consul namespace and partition; empty for the default.
    pub namespace: String,
    pub partition: String,
    /// Consul's datacenter (`consul.source.datacenter`); empty leaves the tag out.
    pub datacenter: String,
    /// Admin listener address.
    pub admin: std::net::SocketAddr,
    /// The ready listener (ingress gateways only).
    pub ready: Option<std::net::SocketAddr>,
    pub grpc: GrpcEndpoint,
    /// `x-consul-token`: the SI token, else the agent's token, else empty.
    pub token: String,
    /// The proxy's `envoy_stats_tags` (`k=v`, or `k` meaning 1).
    pub stats_tags: Vec<String>,
}

fn socket_address(sa: &std::net::SocketAddr) -> Value {
    json!({"socket_address": {"address": sa.ip().to_string(), "port_value": sa.port()}})
}

fn static_cluster(name: &str, address: Value, http2: bool) -> Value {
    let protocol = if http2 { json!({"http2_protocol_options": {}}) } else { json!({"http_protocol_options": {}}) };
    json!({
        "name": name,
        "ignore_health_on_host_removal": false,
        "connect_timeout": if http2 { "1s" } else { "5s" },
        "type": "STATIC",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": protocol,
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
    })
}

/// One stats tag extractor per part of a Consul cluster name
/// (`[hash~][subset.]service.namespace.[partition.]datacenter.routing.trustdomain.consul.`),
/// each capturing its part; `target` spans through the datacenter, `full_target` through the
/// trust domain. `legacy` gives the pre-1.9 `consul.<part>` names (no passthrough prefix).
fn cluster_tag_rules(legacy: bool) -> Vec<Value> {
    const S: &str = "[^.]+";
    // (tag, which part is captured, or the span for target/full_target)
    enum Capture {
        Part(usize),
        Through(usize),
    }
    let parts: [(&str, &str, &str); 8] = [
        ("(?:", "~)?", "custom_hash"),
        ("(?:", "\\.)?", "service_subset"),
        ("", "\\.", "service"),
        ("", "\\.", "namespace"),
        ("(?:", "\\.)?", "partition"),
        ("", "\\.", "datacenter"),
        ("", "\\.", "routing_type"),
        ("", "\\.", "trust_domain"),
    ];
    let mut rules: Vec<(&str, Capture)> = vec![
        ("custom_hash", Capture::Part(0)),
        ("service_subset", Capture::Part(1)),
        ("service", Capture::Part(2)),
        ("namespace", Capture::Part(3)),
        ("partition", Capture::Part(4)),
        ("datacenter", Capture::Part(5)),
        ("routing_type", Capture::Part(6)),
        ("trust_domain", Capture::Part(7)),
        ("target", Capture::Through(5)),
        ("full_target", Capture::Through(7)),
    ];
    if legacy {
        rules.retain(|(name, _)| *name != "partition");
    }
    let mut out = Vec::new();
    for (name, capture) in rules {
        // Partition and datacenter match only internal routing, so the optional partition
        // cannot be mistaken for the datacenter.
        let internal_only = matches!(name, "partition" | "datacenter");
        let mut re = String::from(if legacy { "^cluster\\.(" } else { "^cluster\\.(?:passthrough~)?(" });
        for (i, (open, close, _)) in parts.iter().enumerate() {
            let seg = if i == 6 && internal_only { "internal[^.]*" } else { S };
            if matches!(capture, Capture::Through(_)) && i == 0 {
                re.push('(');
            }
            let seg = match capture {
                Capture::Part(p) if p == i => format!("({seg})"),
                _ => seg.to_string(),
            };
            match capture {
                Capture::Through(last) if last == i => {
                    // The span ends before this part's separator.
                    let close = close.strip_suffix("\\.").unwrap_or(close);
                    re.push_str(&format!("{open}{seg}){close}\\."));
                }
                _ => re.push_str(&format!("{open}{seg}{close}")),
            }
        }
        re.push_str("consul\\.)");
        let tag = if legacy { format!("consul.{name}") } else { format!("consul.destination.{name}") };
        out.push(json!({"regex": re, "tag_name": tag}));
        if !legacy && name == "datacenter" {
            out.push(json!({
                "regex": format!("^cluster\\.({S}\\.(?:{S}\\.)?({S})\\.external\\.{S}\\.consul\\.)"),
                "tag_name": "consul.destination.peer",
            }));
        }
    }
    out
}

/// Extractors for upstream listener metric names
/// (`<tcp|http>.upstream[_peered].<service>[.<namespace>][.<partition>].<datacenter|peer>.`).
fn upstream_tag_rules() -> Vec<Value> {
    const S: &str = "[^.]+";
    let rules = [
        ("service", format!("^(?:tcp|http)\\.upstream(?:_peered)?\\.(({S})(?:\\.{S})?(?:\\.{S})?\\.{S}\\.)")),
        ("datacenter", format!("^(?:tcp|http)\\.upstream\\.({S}(?:\\.{S})?(?:\\.{S})?\\.({S})\\.)")),
        ("peer", format!("^(?:tcp|http)\\.upstream_peered\\.({S}(?:\\.{S})?\\.({S})\\.)")),
        ("namespace", format!("^(?:tcp|http)\\.upstream(?:_peered)?\\.({S}(?:\\.({S}))?(?:\\.{S})?\\.{S}\\.)")),
        ("partition", format!("^(?:tcp|http)\\.upstream\\.({S}(?:\\.{S})?(?:\\.({S}))?\\.{S}\\.)")),
    ];
    rules.into_iter().map(|(name, re)| json!({"regex": re, "tag_name": format!("consul.upstream.{name}")})).collect()
}

/// The `stats_config` (see the module docs): fixed tags first, extractors, then the source
/// tags not already given.
pub fn stats_config(p: &BootstrapParams) -> Value {
    let mut tags = Vec::new();
    let mut given = std::collections::BTreeSet::new();
    for t in &p.stats_tags {
        let (k, v) = t.split_once('=').unwrap_or((t.as_str(), "1"));
        let k = k.to_lowercase();
        tags.push(json!({"tag_name": k, "fixed_value": v}));
        given.insert(k);
    }
    let mut rules = cluster_tag_rules(false);
    let legacy = cluster_tag_rules(true);
    // Consul orders the upstream extractors after the new cluster ones, before the legacy ones.
    rules.extend(upstream_tag_rules());
    rules.extend(legacy);
    tags.extend(rules);
    let or_default = |s: &str| if s.is_empty() { "default".to_string() } else { s.to_string() };
    for (k, v) in [
        ("local_cluster", p.cluster.clone()),
        ("consul.source.service", p.service.clone()),
        ("consul.source.namespace", or_default(&p.namespace)),
        ("consul.source.partition", or_default(&p.partition)),
        ("consul.source.datacenter", p.datacenter.clone()),
    ] {
        if !v.is_empty() && !given.contains(k) {
            tags.push(json!({"tag_name": k, "fixed_value": v}));
        }
    }
    json!({"stats_tags": tags, "use_all_default_tags": true})
}

/// The ready listener: HTTP/1 `/ready` routed to the admin listener's `/ready`, anything else 404.
fn ready_listener(ready: &std::net::SocketAddr) -> Value {
    json!({
        "name": "envoy_ready_listener",
        "address": socket_address(ready),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "envoy_ready",
                "codec_type": "HTTP1",
                "route_config": {
                    "name": "self_admin_route",
                    "virtual_hosts": [{
                        "name": "self_admin",
                        "domains": ["*"],
                        "routes": [
                            {"match": {"path": "/ready"}, "route": {"cluster": "self_admin", "prefix_rewrite": "/ready"}},
                            {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                        ],
                    }],
                },
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                }],
            },
        }]}],
    })
}

/// The bootstrap JSON.
pub fn build(p: &BootstrapParams) -> Value {
    let or_default = |s: &str| if s.is_empty() { "default".to_string() } else { s.to_string() };
    let agent_address = match &p.grpc {
        GrpcEndpoint::Tcp { address, port } => json!({"socket_address": {"address": address, "port_value": port}}),
        GrpcEndpoint::Unix(path) => json!({"pipe": {"path": path}}),
    };
    let mut clusters = vec![static_cluster("local_agent", agent_address, true)];
    let mut listeners = Vec::new();
    if let (ProxyKind::Ingress, Some(ready)) = (p.kind, &p.ready) {
        clusters.push(static_cluster("self_admin", socket_address(&p.admin), false));
        listeners.push(ready_listener(ready));
    }
    let mut static_resources = json!({"clusters": clusters});
    if !listeners.is_empty() {
        static_resources["listeners"] = Value::Array(listeners);
    }
    let ads = json!({"ads": {}, "resource_api_version": "V3"});
    json!({
        "admin": {"address": socket_address(&p.admin)},
        "node": {
            "id": p.proxy_id,
            "cluster": p.cluster,
            "metadata": {"namespace": or_default(&p.namespace), "partition": or_default(&p.partition)},
        },
        "layered_runtime": {"layers": [{"name": "base", "static_layer": {"re2.max_program_size.error_level": 1048576}}]},
        "static_resources": static_resources,
        "stats_config": stats_config(p),
        "dynamic_resources": {
            "lds_config": ads,
            "cds_config": ads,
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "grpc_services": {
                    "envoy_grpc": {"cluster_name": "local_agent"},
                    "initial_metadata": [{"key": "x-consul-token", "value": p.token}],
                },
            },
        },
    })
}

#[cfg(test)]
mod tests;
