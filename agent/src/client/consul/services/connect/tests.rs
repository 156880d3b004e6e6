//! Connect registrations, the whole payload at once, against what Nomad 1.6 sends (reference
//! §10, `command/agent/consul/connect.go` and `service_client.go` `serviceRegs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources, AllocatedSharedResources, NetworkResource, Port};
use nomad_proto::service::{ConsulGateway, ConsulLinkedService, ConsulTerminatingConfigEntry, Service};
use nomad_proto::{Job, Task, TaskGroup};
use serde_json::json;

use super::*;
use crate::client::consul::services::{BuiltConsul, build_consul};
use crate::client::consul::{ConsulApi, ConsulClient};
use crate::client::services::Which;
use crate::config::consul::ConsulSettings;

const HOST_IP: &str = "10.1.2.3";

/// An alloc of job `web`, group `front`, alloc index 3, with one network of `mode` whose ports
/// are `(label, host value, to)`.
fn alloc_with(mode: &str, services: Vec<Service>, ports: &[(&str, i64, i64)]) -> (Allocation, Node) {
    let job = Job {
        id: "web".into(),
        name: "web".into(),
        task_groups: vec![TaskGroup {
            name: "front".into(),
            services,
            tasks: vec![Task { name: "app".into(), ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    };
    let network = NetworkResource {
        mode: mode.into(),
        ip: HOST_IP.into(),
        dynamic_ports: ports.iter().map(|(l, v, t)| Port { label: (*l).into(), value: *v, to: *t, ..Port::default() }).collect(),
        ..NetworkResource::default()
    };
    let alloc = Allocation {
        id: "a1b2".into(),
        name: "web.front[3]".into(),
        namespace: "default".into(),
        job_id: "web".into(),
        task_group: "front".into(),
        job: Some(Arc::new(job)),
        allocated_resources: Some(AllocatedResources {
            shared: AllocatedSharedResources {
                ports: ports
                    .iter()
                    .map(|(l, v, t)| AllocatedPortMapping { label: (*l).into(), value: *v, to: *t, host_ip: HOST_IP.into() })
                    .collect(),
                networks: vec![network],
                ..AllocatedSharedResources::default()
            },
            ..AllocatedResources::default()
        }),
        ..Allocation::default()
    };
    let mut node = Node { id: "node-1".into(), datacenter: "dc1".into(), ..Node::default() };
    node.attributes.insert("unique.network.ip-address".into(), "10.9.9.9".into());
    (alloc, node)
}

fn built(alloc: &Allocation, node: &Node) -> BuiltConsul {
    build_consul(alloc, node, "global", "", Which::All)
}

fn only(alloc: &Allocation, node: &Node) -> serde_json::Value {
    let b = built(alloc, node);
    assert!(b.errors.is_empty(), "{:?}", b.errors);
    assert_eq!(b.registrations.len(), 1);
    serde_json::to_value(b.registrations.values().next().unwrap()).unwrap()
}

fn sidecar_service(sidecar: ConsulSidecarService) -> Service {
    Service {
        name: "api".into(),
        port_label: "http".into(),
        connect: Some(ConsulConnect { sidecar_service: Some(sidecar), ..ConsulConnect::default() }),
        ..Service::default()
    }
}

const API_ID: &str = "_nomad-task-a1b2-group-front-api-http";

#[test]
fn a_sidecar_with_upstreams_expose_meta_and_tags_is_nomads_payload_field_by_field() {
    let proxy = ConsulProxy {
        local_service_address: "127.0.0.1".into(),
        local_service_port: 8080,
        config: BTreeMap::from([("protocol".into(), json!("http")), ("idx".into(), json!("${NOMAD_ALLOC_INDEX}"))]),
        upstreams: vec![
            ConsulUpstream {
                destination_name: "db-${NOMAD_ALLOC_INDEX}".into(),
                destination_namespace: "team".into(),
                local_bind_port: 5432,
                datacenter: "dc2".into(),
                local_bind_address: "127.0.0.2".into(),
                mesh_gateway: Some(json!({"Mode": "local"})),
                config: BTreeMap::from([("connect_timeout_ms".into(), json!(1000))]),
            },
            ConsulUpstream {
                destination_name: "cache".into(),
                local_bind_port: 6379,
                mesh_gateway: Some(json!({"Mode": "bogus"})),
                ..ConsulUpstream::default()
            },
        ],
        expose: Some(json!({"Paths": [{"Path": "/health", "Protocol": "http", "LocalPathPort": 8080, "ListenerPort": "ck"}]})),
    };
    let css = ConsulSidecarService {
        tags: vec!["sc-${NOMAD_ALLOC_INDEX}".into()],
        meta: BTreeMap::from([("role".into(), "${NOMAD_ALLOC_INDEX}".into())]),
        proxy: Some(proxy),
        ..ConsulSidecarService::default()
    };
    // The sidecar port maps to another port inside the namespace: bind_port is that one.
    let (alloc, node) = alloc_with(
        "bridge",
        vec![sidecar_service(css)],
        &[("http", 23456, 8080), ("connect-proxy-api", 25001, 21001), ("ck", 25002, 25002)],
    );
    let got = only(&alloc, &node);
    let expected = json!({
        "ID": API_ID,
        "Name": "api",
        "Port": 23456,
        "Address": HOST_IP,
        "Meta": {"external-source": "nomad"},
        "Checks": [],
        "Connect": {"SidecarService": {
            "Tags": ["sc-3"],
            "Port": 25001,
            "Address": HOST_IP,
            "Meta": {"role": "${NOMAD_ALLOC_INDEX}"},
            "Checks": [
                {"Name": format!("Connect Sidecar Aliasing {API_ID}"), "AliasService": API_ID},
                {"Name": "Connect Sidecar Listening", "TCP": "10.1.2.3:25001", "Interval": "10s"},
            ],
            "Proxy": {
                "LocalServiceAddress": "127.0.0.1",
                "LocalServicePort": 8080,
                "Config": {
                    "bind_address": "0.0.0.0",
                    "bind_port": 21001,
                    "envoy_stats_tags": ["nomad.alloc_id=a1b2", "nomad.group=front", "nomad.job=web", "nomad.namespace=default"],
                    "idx": "3",
                    "protocol": "http",
                },
                "Upstreams": [
                    {"DestinationNamespace": "team", "DestinationName": "db-3", "Datacenter": "dc2", "LocalBindAddress": "127.0.0.2",
                     "LocalBindPort": 5432, "Config": {"connect_timeout_ms": 1000}, "MeshGateway": {"Mode": "local"}},
                    {"DestinationName": "cache", "LocalBindPort": 6379, "MeshGateway": {}},
                ],
                "MeshGateway": {},
                "Expose": {"Paths": [{"ListenerPort": 25002, "Path": "/health", "LocalPathPort": 8080, "Protocol": "http"}]},
            },
        }},
    });
    assert_eq!(got, expected, "got:\n{}", serde_json::to_string_pretty(&got).unwrap());
}

#[test]
fn the_default_sidecar_port_label_and_disable_default_tcp_check() {
    let css = ConsulSidecarService { disable_default_tcp_check: true, ..ConsulSidecarService::default() };
    let (alloc, node) = alloc_with("bridge", vec![sidecar_service(css)], &[("http", 23456, 8080), ("connect-proxy-api", 25001, 25001)]);
    let got = only(&alloc, &node);
    let sc = &got["Connect"]["SidecarService"];
    assert_eq!(sc["Port"], 25001, "the connect-proxy-<service> port by default");
    assert_eq!(sc["Checks"], json!([{"Name": format!("Connect Sidecar Aliasing {API_ID}"), "AliasService": API_ID}]), "no listening check");
    assert_eq!(
        sc["Proxy"],
        json!({
            "Config": {"bind_address": "0.0.0.0", "bind_port": 25001,
                       "envoy_stats_tags": ["nomad.alloc_id=a1b2", "nomad.group=front", "nomad.job=web", "nomad.namespace=default"]},
            "MeshGateway": {}, "Expose": {},
        }),
        "local service address and port left for Consul to default"
    );
    assert!(sc.get("Tags").is_none() && sc.get("Meta").is_none() && sc.get("ID").is_none() && sc.get("Name").is_none());

    // The user's stats tags are kept; Nomad's are added after them.
    let css = ConsulSidecarService {
        port: "custom".into(),
        proxy: Some(ConsulProxy {
            config: BTreeMap::from([("envoy_stats_tags".into(), json!(["team=edge", "nomad.job=mine"]))]),
            ..ConsulProxy::default()
        }),
        ..ConsulSidecarService::default()
    };
    let (alloc, node) = alloc_with("bridge", vec![sidecar_service(css)], &[("http", 23456, 8080), ("custom", 26000, 26000)]);
    let got = only(&alloc, &node);
    assert_eq!(got["Connect"]["SidecarService"]["Port"], 26000, "sidecar_service.port names the label");
    assert_eq!(
        got["Connect"]["SidecarService"]["Proxy"]["Config"]["envoy_stats_tags"],
        json!(["team=edge", "nomad.job=mine", "nomad.alloc_id=a1b2", "nomad.group=front", "nomad.namespace=default"])
    );
}

#[test]
fn a_sidecar_without_its_port_or_network_is_skipped_with_nomads_error() {
    let css = ConsulSidecarService::default();
    let (alloc, node) = alloc_with("bridge", vec![sidecar_service(css.clone())], &[("http", 23456, 8080)]);
    let b = built(&alloc, &node);
    assert!(b.registrations.is_empty());
    assert_eq!(b.errors, ["service \"api\": invalid Consul Connect configuration: No port of label \"connect-proxy-api\" defined"]);

    let (mut alloc, node) = alloc_with("bridge", vec![sidecar_service(css)], &[("http", 23456, 8080), ("connect-proxy-api", 1, 1)]);
    let res = alloc.allocated_resources.as_mut().unwrap();
    res.shared.networks.push(res.shared.networks[0].clone());
    assert_eq!(
        built(&alloc, &node).errors,
        ["service \"api\": invalid Consul Connect configuration: Connect only supported with exactly 1 network (found 2)"]
    );

    let empty = Service { connect: Some(ConsulConnect::default()), ..sidecar_service(ConsulSidecarService::default()) };
    let (alloc, node) = alloc_with("bridge", vec![empty], &[("http", 23456, 8080)]);
    assert_eq!(
        built(&alloc, &node).errors,
        ["service \"api\": invalid Consul Connect configuration: Connect configuration empty for service api"]
    );
}

#[test]
fn connect_native_is_connect_native_true_and_nothing_else() {
    let native = Service {
        name: "native".into(),
        port_label: "http".into(),
        task_name: "app".into(),
        connect: Some(ConsulConnect { native: true, ..ConsulConnect::default() }),
        ..Service::default()
    };
    let (alloc, node) = alloc_with("bridge", vec![native], &[("http", 23456, 8080)]);
    let got = only(&alloc, &node);
    assert_eq!(
        got,
        json!({"ID": "_nomad-task-a1b2-group-front-native-http", "Name": "native", "Port": 23456, "Address": HOST_IP,
               "Meta": {"external-source": "nomad"}, "Checks": [], "Connect": {"Native": true}})
    );
}

/// The gateway proxy block as the jobspec (and Nomad's mutator for a bridge terminating
/// gateway) leaves it.
fn gateway(kind: &str, proxy: serde_json::Value) -> ConsulGateway {
    let mut g = ConsulGateway { proxy: Some(proxy), ..ConsulGateway::default() };
    match kind {
        "terminating" => {
            g.terminating =
                Some(ConsulTerminatingConfigEntry { services: vec![ConsulLinkedService { name: "ext".into(), ..Default::default() }] })
        }
        "ingress" => g.ingress = Some(json!({"Listeners": [{"Port": 8080, "Protocol": "tcp", "Services": [{"Name": "api"}]}]})),
        _ => g.mesh = Some(json!({})),
    }
    g
}

fn gateway_service(name: &str, port: &str, g: ConsulGateway) -> Service {
    Service {
        name: name.into(),
        port_label: port.into(),
        connect: Some(ConsulConnect { gateway: Some(g), ..ConsulConnect::default() }),
        ..Service::default()
    }
}

#[test]
fn a_bridge_terminating_gateway_gets_its_kind_and_its_allocated_default_bind_port() {
    let proxy = json!({
        "ConnectTimeout": 5_500_000_000_i64,
        "EnvoyGatewayBindTaggedAddresses": false,
        "EnvoyGatewayBindAddresses": {"default": {"Address": "0.0.0.0", "Port": -1}},
        "EnvoyGatewayNoDefaultBind": true,
        "EnvoyDNSDiscoveryType": "STRICT_DNS",
        "Config": {"idx": "${NOMAD_ALLOC_INDEX}", "envoy_dns_discovery_type": "LOGICAL_DNS"},
    });
    let s = gateway_service("tgw", "connect-terminating-tgw", gateway("terminating", proxy));
    let (alloc, node) = alloc_with("bridge", vec![s], &[("connect-terminating-tgw", 25003, 25003)]);
    let got = only(&alloc, &node);
    assert_eq!(
        got,
        json!({
            "Kind": "terminating-gateway",
            "ID": "_nomad-task-a1b2-group-front-tgw-connect-terminating-tgw",
            "Name": "tgw",
            "Port": 25003,
            "Address": HOST_IP,
            "Meta": {"external-source": "nomad"},
            "Checks": [],
            "Proxy": {
                "Config": {
                    "connect_timeout_ms": 5500,
                    "envoy_dns_discovery_type": "LOGICAL_DNS",
                    "envoy_gateway_bind_addresses": {"default": {"Address": "0.0.0.0", "Port": 25003}},
                    "envoy_gateway_no_default_bind": true,
                    "idx": "3",
                },
                "MeshGateway": {},
                "Expose": {},
            },
        }),
        "the user's config wins over the built keys, as Nomad merges it last"
    );
}

#[test]
fn a_host_mode_ingress_gateway_and_a_gateway_without_proxy_settings() {
    let proxy = json!({
        "ConnectTimeout": 5_000_000_000_i64,
        "EnvoyGatewayBindTaggedAddresses": true,
        "EnvoyGatewayBindAddresses": {"api": {"Address": "0.0.0.0", "Port": 8080}},
        "EnvoyGatewayNoDefaultBind": true,
        "EnvoyDNSDiscoveryType": "",
        "Config": {},
    });
    let s = gateway_service("igw", "inbound", gateway("ingress", proxy));
    let (alloc, node) = alloc_with("host", vec![s], &[("inbound", 8080, 0)]);
    let got = only(&alloc, &node);
    assert_eq!(got["Kind"], "ingress-gateway");
    assert_eq!((got["Address"].as_str(), got["Port"].as_i64()), (Some(HOST_IP), Some(8080)), "the host's address and port");
    assert_eq!(
        got["Proxy"],
        json!({"Config": {"connect_timeout_ms": 5000, "envoy_gateway_bind_addresses": {"api": {"Address": "0.0.0.0", "Port": 8080}},
                          "envoy_gateway_bind_tagged_addresses": true, "envoy_gateway_no_default_bind": true},
               "MeshGateway": {}, "Expose": {}})
    );
    assert!(got.get("Connect").is_none(), "gateways have no Connect block");

    // Without a proxy block Nomad still sends an empty Proxy.
    let s = gateway_service("igw", "inbound", ConsulGateway { ingress: Some(json!({})), ..ConsulGateway::default() });
    let (alloc, node) = alloc_with("host", vec![s], &[("inbound", 8080, 0)]);
    assert_eq!(only(&alloc, &node)["Proxy"], json!({"MeshGateway": {}, "Expose": {}}));
}

#[test]
fn a_mesh_gateway_binds_wan_to_its_service_port_and_lan_to_its_own() {
    let proxy =
        json!({"EnvoyGatewayBindAddresses": {"wan": {"Address": "0.0.0.0", "Port": -1}, "lan": {"Address": "0.0.0.0", "Port": -1}}});
    let s = gateway_service("mgw", "wan", gateway("mesh", proxy));
    let (alloc, node) = alloc_with("host", vec![s], &[("wan", 9100, 0), ("connect-mesh-mgw-lan", 9101, 0)]);
    let got = only(&alloc, &node);
    assert_eq!(got["Kind"], "mesh-gateway");
    assert_eq!(
        got["Proxy"]["Config"]["envoy_gateway_bind_addresses"],
        json!({"lan": {"Address": "0.0.0.0", "Port": 9101}, "wan": {"Address": "0.0.0.0", "Port": 9100}})
    );
}

/// Nomad's sidecar payload through the stand-in's copy of Consul's decoder and agent: accepted
/// whole, and expanded into `<ID>-sidecar-proxy` as Consul's `agent/sidecar_service.go` does.
#[tokio::test]
async fn consul_expands_nomads_sidecar_payload() {
    let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let api = ConsulClient::new(&ConsulSettings {
        address: standin.addr().to_string(),
        timeout: std::time::Duration::from_secs(5),
        ..ConsulSettings::default()
    });
    let css = ConsulSidecarService {
        proxy: Some(ConsulProxy {
            upstreams: vec![ConsulUpstream { destination_name: "db".into(), local_bind_port: 5432, ..ConsulUpstream::default() }],
            ..ConsulProxy::default()
        }),
        ..ConsulSidecarService::default()
    };
    let mut api_service = sidecar_service(css);
    api_service.tags = vec!["v1".into()];
    let (alloc, node) = alloc_with("bridge", vec![api_service], &[("http", 23456, 8080), ("connect-proxy-api", 25001, 25001)]);
    let b = built(&alloc, &node);
    api.service_register(&b.registrations[API_ID]).await.unwrap();

    let services = api.services().await.unwrap();
    let sidecar_id = format!("{API_ID}-sidecar-proxy");
    let sc = &services[&sidecar_id];
    assert_eq!((sc.kind.as_str(), sc.service.as_str()), ("connect-proxy", "api-sidecar-proxy"));
    assert_eq!((sc.address.as_str(), sc.port), (HOST_IP, 25001));
    assert_eq!(sc.tags, ["v1"], "no sidecar tags: the parent's");
    let proxy = sc.proxy.as_ref().unwrap();
    assert_eq!((proxy.destination_service_name.as_str(), proxy.destination_service_id.as_str()), ("api", API_ID));
    assert_eq!((proxy.local_service_address.as_str(), proxy.local_service_port), ("127.0.0.1", 23456), "Consul's defaults");
    assert_eq!(proxy.upstreams[0].destination_name, "db");
    let checks = api.checks().await.unwrap();
    let mine: BTreeMap<&str, &str> =
        checks.values().filter(|c| c.service_id == sidecar_id).map(|c| (c.check_id.as_str(), c.name.as_str())).collect();
    let aliasing = format!("Connect Sidecar Aliasing {API_ID}");
    assert_eq!(
        mine,
        BTreeMap::from([
            (format!("service:{sidecar_id}:1").as_str(), aliasing.as_str()),
            (format!("service:{sidecar_id}:2").as_str(), "Connect Sidecar Listening"),
        ]),
        "Nomad's two checks, with Consul's IDs in Nomad's order"
    );
    // The stand-in's xDS server serves this sidecar what Consul would: its public listener on
    // bind_address:bind_port, local_app, and the upstream's listener.
    let names = standin.xds_resource_names(&sidecar_id).unwrap();
    let listeners = &names["type.googleapis.com/envoy.config.listener.v3.Listener"];
    assert!(listeners.contains(&"public_listener:0.0.0.0:25001".to_string()), "{listeners:?}");
    assert!(listeners.contains(&"db:127.0.0.1:5432".to_string()), "{listeners:?}");
    assert!(names["type.googleapis.com/envoy.config.cluster.v3.Cluster"].contains(&"local_app".to_string()));

    // Deregistering the service takes its sidecar with it.
    api.service_deregister(API_ID).await.unwrap();
    assert!(api.services().await.unwrap().is_empty());
    assert!(api.checks().await.unwrap().is_empty());
}

#[test]
fn check_on_update_is_listed_by_check_id() {
    let mut s = Service { name: "api".into(), port_label: "http".into(), ..Service::default() };
    s.checks = vec![
        nomad_proto::service::ServiceCheck {
            name: "a".into(),
            check_type: "tcp".into(),
            interval: 1_000_000_000,
            timeout: 1_000_000_000,
            on_update: "ignore_warnings".into(),
            ..Default::default()
        },
        nomad_proto::service::ServiceCheck {
            name: "b".into(),
            check_type: "tcp".into(),
            interval: 1_000_000_000,
            timeout: 1_000_000_000,
            on_update: "ignore".into(),
            ..Default::default()
        },
    ];
    let (alloc, node) = alloc_with("host", vec![s], &[("http", 23456, 0)]);
    let b = built(&alloc, &node);
    let reg = &b.registrations[API_ID];
    let expected: BTreeMap<String, String> = BTreeMap::from([
        (reg.checks[0].check_id.clone(), "ignore_warnings".to_string()),
        (reg.checks[1].check_id.clone(), "ignore".to_string()),
    ]);
    assert_eq!(b.on_update, expected);
}
