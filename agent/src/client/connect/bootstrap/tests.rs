use super::*;

fn sidecar(grpc: GrpcEndpoint) -> BootstrapParams {
    BootstrapParams {
        kind: ProxyKind::Sidecar,
        proxy_id: "_nomad-task-9f1c-group-api-count-api-9001-sidecar-proxy".into(),
        cluster: "count-api".into(),
        service: "count-api".into(),
        namespace: String::new(),
        partition: String::new(),
        datacenter: "dc1".into(),
        admin: "127.0.0.2:19001".parse().unwrap(),
        ready: Some("127.0.0.1:19101".parse().unwrap()),
        grpc,
        token: "si-secret".into(),
        stats_tags: vec!["nomad.alloc_id=9f1c".into(), "nomad.group=api".into(), "Canary".into()],
    }
}

fn gateway(kind: ProxyKind) -> BootstrapParams {
    BootstrapParams {
        kind,
        proxy_id: "_nomad-task-9f1c-group-gw-web-gw-connect-gw".into(),
        cluster: "terminating-gateway".into(),
        service: "web-gw".into(),
        token: String::new(),
        stats_tags: Vec::new(),
        ..sidecar(GrpcEndpoint::Tcp { address: "127.0.0.1".into(), port: 8502 })
    }
}

#[test]
fn a_sidecar_bootstrap_has_consuls_node_admin_agent_cluster_and_delta_ads() {
    let b = build(&sidecar(GrpcEndpoint::Unix("alloc/tmp/consul_grpc.sock".into())));
    assert_eq!(b["node"]["id"], "_nomad-task-9f1c-group-api-count-api-9001-sidecar-proxy");
    assert_eq!(b["node"]["cluster"], "count-api");
    assert_eq!(b["node"]["metadata"], json!({"namespace": "default", "partition": "default"}));
    assert_eq!(b["admin"]["address"]["socket_address"], json!({"address": "127.0.0.2", "port_value": 19001}));
    let agent = &b["static_resources"]["clusters"][0];
    assert_eq!(agent["name"], "local_agent");
    assert_eq!(
        agent["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
        json!({"pipe": {"path": "alloc/tmp/consul_grpc.sock"}})
    );
    assert!(b["static_resources"].get("listeners").is_none(), "a sidecar gets no ready listener in Consul 1.16");
    let ads = &b["dynamic_resources"]["ads_config"];
    assert_eq!(ads["api_type"], "DELTA_GRPC");
    assert_eq!(ads["grpc_services"]["initial_metadata"], json!([{"key": "x-consul-token", "value": "si-secret"}]));
    assert_eq!(b["dynamic_resources"]["lds_config"], json!({"ads": {}, "resource_api_version": "V3"}));
}

#[test]
fn stats_tags_fixed_first_then_extractors_then_source_tags() {
    let s = stats_config(&sidecar(GrpcEndpoint::Tcp { address: "127.0.0.1".into(), port: 8502 }));
    let tags = s["stats_tags"].as_array().unwrap();
    assert_eq!(tags[0], json!({"tag_name": "nomad.alloc_id", "fixed_value": "9f1c"}));
    assert_eq!(tags[2], json!({"tag_name": "canary", "fixed_value": "1"}), "a bare key is lower-cased and means 1");
    let names: Vec<&str> = tags.iter().map(|t| t["tag_name"].as_str().unwrap()).collect();
    // 11 destination, 5 upstream, 9 legacy extractors, then the 5 source tags.
    assert_eq!(names.len(), 3 + 11 + 5 + 9 + 5);
    assert_eq!(&names[3..6], ["consul.destination.custom_hash", "consul.destination.service_subset", "consul.destination.service"]);
    assert_eq!(names[9], "consul.destination.peer");
    assert_eq!(names[14], "consul.upstream.service");
    assert_eq!(names[19], "consul.custom_hash");
    assert_eq!(
        &names[28..],
        ["local_cluster", "consul.source.service", "consul.source.namespace", "consul.source.partition", "consul.source.datacenter"]
    );
    // Consul's published extractor for the target (service through datacenter).
    let target = tags.iter().find(|t| t["tag_name"] == "consul.destination.target").unwrap();
    assert_eq!(
        target["regex"],
        r"^cluster\.(?:passthrough~)?(((?:[^.]+~)?(?:[^.]+\.)?[^.]+\.[^.]+\.(?:[^.]+\.)?[^.]+)\.[^.]+\.[^.]+\.consul\.)"
    );
    let dc = tags.iter().find(|t| t["tag_name"] == "consul.datacenter").unwrap();
    assert_eq!(dc["regex"], r"^cluster\.((?:[^.]+~)?(?:[^.]+\.)?[^.]+\.[^.]+\.(?:[^.]+\.)?([^.]+)\.internal[^.]*\.[^.]+\.consul\.)");
    assert_eq!(s["use_all_default_tags"], true);
}

#[test]
fn an_explicit_tag_overrides_a_source_tag() {
    let mut p = gateway(ProxyKind::Terminating);
    p.stats_tags = vec!["local_cluster=mine".into()];
    let s = stats_config(&p);
    let local: Vec<&Value> = s["stats_tags"].as_array().unwrap().iter().filter(|t| t["tag_name"] == "local_cluster").collect();
    assert_eq!(local, [&json!({"tag_name": "local_cluster", "fixed_value": "mine"})]);
}

#[test]
fn a_gateway_is_its_kinds_cluster_and_the_source_tag_names_the_gateway() {
    let b = build(&gateway(ProxyKind::Terminating));
    assert_eq!(b["node"]["cluster"], "terminating-gateway");
    let tags = b["stats_config"]["stats_tags"].as_array().unwrap();
    assert!(tags.contains(&json!({"tag_name": "local_cluster", "fixed_value": "terminating-gateway"})));
    assert!(tags.contains(&json!({"tag_name": "consul.source.service", "fixed_value": "web-gw"})));
}

#[test]
fn only_an_ingress_gateway_gets_the_ready_listener() {
    let b = build(&gateway(ProxyKind::Ingress));
    assert_eq!(b["static_resources"]["listeners"][0]["name"], "envoy_ready_listener");
    assert_eq!(b["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"], 19101);
    assert_eq!(b["static_resources"]["clusters"][1]["name"], "self_admin");
    assert!(build(&gateway(ProxyKind::Terminating))["static_resources"].get("listeners").is_none());
    assert_eq!(
        build(&gateway(ProxyKind::Terminating))["dynamic_resources"]["ads_config"]["grpc_services"]["initial_metadata"][0]["value"],
        "",
        "the token entry is always there"
    );
}

#[test]
fn grpc_addresses_parse_as_nomad_passes_them() {
    assert_eq!(GrpcEndpoint::parse("unix://alloc/tmp/consul_grpc.sock").unwrap(), GrpcEndpoint::Unix("alloc/tmp/consul_grpc.sock".into()));
    assert_eq!(GrpcEndpoint::parse("127.0.0.1:8502").unwrap(), GrpcEndpoint::Tcp { address: "127.0.0.1".into(), port: 8502 });
    assert_eq!(GrpcEndpoint::parse("http://[::1]:8502").unwrap(), GrpcEndpoint::Tcp { address: "::1".into(), port: 8502 });
    assert!(GrpcEndpoint::parse("consul.service:8502").unwrap_err().contains("want ip:port"));
    assert!(GrpcEndpoint::parse("unix://").is_err());
    assert!(GrpcEndpoint::parse("https://127.0.0.1:8503").unwrap_err().contains("TLS"));
}

/// Real Envoy accepts every kind's bootstrap (`envoy --mode validate`), without warnings about
/// deprecated fields.
#[test]
fn every_bootstrap_passes_envoy_validate() {
    nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Envoy);
    let envoy = nomad_testkit::prereq::envoy_binary().unwrap();
    let cases = [
        ("sidecar-host", sidecar(GrpcEndpoint::Tcp { address: "127.0.0.1".into(), port: 8502 })),
        ("sidecar-bridge", sidecar(GrpcEndpoint::Unix("alloc/tmp/consul_grpc.sock".into()))),
        ("ingress", gateway(ProxyKind::Ingress)),
        ("terminating", gateway(ProxyKind::Terminating)),
        ("mesh", gateway(ProxyKind::Mesh)),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, p) in cases {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&build(&p)).unwrap()).unwrap();
        let out = std::process::Command::new(&envoy).arg("--mode").arg("validate").arg("-c").arg(&path).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{name}: {text}");
        assert!(text.contains("OK"), "{name}: {text}");
        assert!(!text.to_lowercase().contains("deprecated"), "{name} uses a deprecated field: {text}");
    }
}
