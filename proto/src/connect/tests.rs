use serde_json::json;

use super::*;
use crate::lenient;
use crate::service::{ConsulProxy, ConsulSidecarService, ConsulUpstream};

const SECOND: i64 = 1_000_000_000;

/// A canonicalized job from Nomad's JSON.
fn job(text: &str) -> Job {
    let mut j: Job = lenient::from_slice(text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    j.canonicalize();
    j
}

/// A job with one bridge group `api` (one raw_exec task `web`) whose services are `services`.
fn group_job(services: Value) -> Job {
    job(&json!({"ID": "countdash", "TaskGroups": [{"Name": "api",
        "Networks": [{"Mode": "bridge", "DynamicPorts": [{"Label": "http", "To": 9001}]}],
        "Services": services,
        "Tasks": [{"Name": "web", "Driver": "raw_exec", "Config": {"command": "/bin/web"}}]}]})
    .to_string())
}

fn sidecar_job() -> Job {
    group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Connect": {"SidecarService": {}}}]))
}

fn mutated(mut j: Job) -> Job {
    j.mutate_connect().unwrap_or_else(|e| panic!("{e}"));
    j
}

fn mutate_err(mut j: Job) -> String {
    j.mutate_connect().expect_err("refused").0
}

fn validate_err(j: &Job) -> String {
    j.validate_connect().expect_err("refused").0
}

fn constraint(l: &str, op: &str, r: &str) -> Constraint {
    Constraint { l_target: l.into(), r_target: r.into(), operand: op.into() }
}

fn envoy_config(image: &str) -> BTreeMap<String, Value> {
    BTreeMap::from([
        ("image".to_string(), json!(image)),
        (
            "args".to_string(),
            json!([
                "-c",
                "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json",
                "-l",
                "${meta.connect.log_level}",
                "--concurrency",
                "${meta.connect.proxy_concurrency}",
                "--disable-hot-restart"
            ]),
        ),
    ])
}

#[test]
fn a_sidecar_service_gets_nomads_envoy_task_and_port() {
    let j = mutated(sidecar_job());
    let g = &j.task_groups[0];
    assert_eq!(g.tasks.len(), 2);
    let t = &g.tasks[1];
    let expected = Task {
        name: "connect-proxy-count-api".into(),
        kind: "connect-proxy:count-api".into(),
        driver: "docker".into(),
        config: envoy_config("${meta.connect.sidecar_image}"),
        shutdown_delay: 5 * SECOND,
        log_config: LogConfig { max_files: 2, max_file_size_mb: 2, disabled: false },
        resources: Resources { cpu: 250, memory_mb: 128, ..Resources::default() },
        lifecycle: Some(TaskLifecycle { hook: "prestart".into(), sidecar: true }),
        constraints: vec![constraint("${attr.consul.version}", "semver", ">= 1.8.0"), constraint("${attr.consul.grpc}", ">", "0")],
        // Canonicalized as every task is: the group's restart policy.
        restart_policy: g.restart_policy.clone(),
        kill_timeout: 5 * SECOND,
        ..Task::default()
    };
    assert_eq!(t, &expected);
    assert_eq!(
        g.networks[0].dynamic_ports[1],
        Port { label: "connect-proxy-count-api".into(), value: 0, to: -1, host_network: String::new() }
    );
    assert_eq!(g.networks[0].dynamic_ports.len(), 2);
    j.validate_connect().unwrap();
    j.validate().unwrap();
}

#[test]
fn the_sidecar_port_label_comes_from_sidecar_service_port_and_is_not_doubled() {
    let j = mutated(group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Connect": {"SidecarService": {"Port": "http"}}}])));
    let labels: Vec<&str> = j.task_groups[0].networks[0].dynamic_ports.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(labels, ["http"], "the group's own port is the proxy's: nothing injected");
    let j = mutated(group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Connect": {"SidecarService": {"Port": "envoy"}}}])));
    let port = j.task_groups[0].networks[0].dynamic_ports.last().unwrap().clone();
    assert_eq!((port.label.as_str(), port.to), ("envoy", -1));
}

#[test]
fn podman_groups_get_a_podman_sidecar_and_any_docker_task_keeps_docker() {
    let mut j = sidecar_job();
    j.task_groups[0].tasks[0].driver = "podman".into();
    assert_eq!(mutated(j.clone()).task_groups[0].tasks[1].driver, "podman");
    let mut other = j.task_groups[0].tasks[0].clone();
    other.name = "db".into();
    other.driver = "docker".into();
    j.task_groups[0].tasks.push(other);
    assert_eq!(mutated(j).task_groups[0].tasks[2].driver, "docker");
}

#[test]
fn a_task_already_named_like_the_sidecar_gives_it_a_six_character_suffix() {
    let mut j = sidecar_job();
    j.task_groups[0].tasks[0].name = "connect-proxy-count-api".into();
    let once = mutated(j.clone());
    let name = once.task_groups[0].tasks[1].name.clone();
    let suffix = name.strip_prefix("connect-proxy-count-api-").unwrap_or_else(|| panic!("{name}"));
    assert_eq!(suffix.len(), 6);
    assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{suffix}");
    assert_eq!(mutated(j).task_groups[0].tasks[1].name, name, "plan and register name it alike");
    assert_eq!(mutated(once.clone()), once, "found again by its kind");
}

#[test]
fn a_task_of_the_sidecars_kind_is_the_sidecar_and_sidecar_task_is_merged_over_it() {
    let mut j = sidecar_job();
    let mut own = j.task_groups[0].tasks[0].clone();
    own.name = "my-envoy".into();
    own.kind = "connect-proxy:count-api".into();
    j.task_groups[0].tasks.push(own.clone());
    j.task_groups[0].services[0].connect.as_mut().unwrap().sidecar_task =
        Some(SidecarTask { env: BTreeMap::from([("A".to_string(), "1".to_string())]), ..SidecarTask::default() });
    j.canonicalize();
    let g = &mutated(j).task_groups[0];
    assert_eq!(g.tasks.len(), 2, "none injected");
    assert_eq!((g.tasks[1].name.as_str(), g.tasks[1].driver.as_str()), ("my-envoy", "raw_exec"));
    assert_eq!(g.tasks[1].env["A"], "1");
}

#[test]
fn sidecar_task_is_merged_as_nomads_merge_into_task() {
    let over = |patch: Value| {
        let mut j = group_job(json!([{"Name": "count-api", "PortLabel": "9001",
            "Connect": {"SidecarService": {}, "SidecarTask": patch}}]));
        j.mutate_connect().unwrap();
        j.task_groups[0].tasks[1].clone()
    };
    // Every field; a different driver replaces the driver config.
    let t = over(json!({"Name": "envoy", "Driver": "raw_exec", "User": "envoy", "Config": {"command": "/usr/bin/envoy"},
        "Env": {"E": "1"}, "Meta": {"m": "v"}, "Resources": {"CPU": 500, "MemoryMB": 64, "MemoryMaxMB": 256},
        "KillTimeout": 7 * SECOND, "LogConfig": {"MaxFiles": 3, "MaxFileSizeMB": 0}, "ShutdownDelay": SECOND, "KillSignal": "SIGTERM"}));
    assert_eq!((t.name.as_str(), t.driver.as_str(), t.user.as_str()), ("envoy", "raw_exec", "envoy"));
    assert_eq!(t.config, BTreeMap::from([("command".to_string(), json!("/usr/bin/envoy"))]));
    assert_eq!((t.env["E"].as_str(), t.meta["m"].as_str()), ("1", "v"));
    assert_eq!((t.resources.cpu, t.resources.memory_mb, t.resources.memory_max_mb), (500, 64, 256));
    assert_eq!((t.kill_timeout, t.shutdown_delay, t.kill_signal.as_str()), (7 * SECOND, SECOND, "SIGTERM"));
    assert_eq!((t.log_config.max_files, t.log_config.max_file_size_mb), (3, 2), "a zero keeps the sidecar's");
    assert_eq!(t.kind, "connect-proxy:count-api");
    assert_eq!(t.lifecycle, Some(TaskLifecycle { hook: "prestart".into(), sidecar: true }));

    // The same driver merges the config key by key.
    let t = over(json!({"Driver": "docker", "Config": {"image": "envoyproxy/envoy:v1.26.2", "ports": ["x"]}}));
    assert_eq!(t.config["image"], json!("envoyproxy/envoy:v1.26.2"));
    assert_eq!(t.config["ports"], json!(["x"]));
    assert_eq!(t.config["args"], envoy_config("")["args"]);

    // As in Nomad, whose API fills a sidecar_task's missing resources, logs, kill_timeout and
    // shutdown_delay with its task defaults before the merge.
    let t = over(json!({"Env": {"E": "1"}}));
    assert_eq!((t.resources.cpu, t.resources.memory_mb), (100, 300));
    assert_eq!((t.log_config.max_files, t.log_config.max_file_size_mb), (10, 10));
    assert_eq!((t.kill_timeout, t.shutdown_delay), (5 * SECOND, 0));
    // ... and a kill timeout of zero is Nomad's 5 s.
    assert_eq!(over(json!({"KillTimeout": 0})).kill_timeout, 5 * SECOND);
}

#[test]
fn native_services_mark_their_task() {
    let j = mutated(group_job(json!([{"Name": "api", "PortLabel": "http", "Connect": {"Native": true}}])));
    let g = &j.task_groups[0];
    assert_eq!(g.tasks.len(), 1);
    assert_eq!(g.tasks[0].kind, "connect-native:api");
    assert_eq!(g.services[0].task_name, "web", "the only task, inferred");
    j.validate_connect().unwrap();
    j.validate().unwrap();

    let mut two = group_job(json!([{"Name": "api", "PortLabel": "http", "Connect": {"Native": true}}]));
    let mut db = two.task_groups[0].tasks[0].clone();
    db.name = "db".into();
    two.task_groups[0].tasks.push(db);
    assert_eq!(mutate_err(two.clone()), "task for Consul Connect Native service api->api is ambiguous and must be set");
    two.task_groups[0].services[0].task_name = "cache".into();
    assert_eq!(mutate_err(two.clone()), "task cache named by Consul Connect Native service api->api does not exist");
    assert_eq!(validate_err(&two), "task cache named by Consul Connect Native service api->api does not exist");
    two.task_groups[0].services[0].task_name = "db".into();
    assert_eq!(mutated(two).task_groups[0].tasks[1].kind, "connect-native:api");
}

fn gateway_job(mode: &str, gateway: Value, port: &str) -> Job {
    job(&json!({"ID": "gw", "TaskGroups": [{"Name": "gateway", "Networks": [{"Mode": mode}],
        "Services": [{"Name": "${NOMAD_JOB_ID}-out", "PortLabel": port, "Connect": {"Gateway": gateway}}]}]})
    .to_string())
}

fn proxy_of(j: &Job) -> GatewayProxy {
    let gw = j.task_groups[0].services[0].connect.as_ref().unwrap().gateway.as_ref().unwrap();
    GatewayProxy::from_value(gw.proxy.as_ref().unwrap()).unwrap()
}

#[test]
fn a_terminating_gateway_in_bridge_mode_gets_its_port_proxy_and_task() {
    let j = mutated(gateway_job("bridge", json!({"Terminating": {"Services": [{"Name": "legacy"}]}}), ""));
    let g = &j.task_groups[0];
    let s = &g.services[0];
    assert_eq!(s.name, "gw-out", "interpolated");
    assert_eq!(s.port_label, "connect-terminating-gw-out");
    assert_eq!(g.networks[0].dynamic_ports, [Port { label: "connect-terminating-gw-out".into(), to: -1, ..Port::default() }]);
    let bind = BTreeMap::from([("default".to_string(), GatewayBindAddress { address: "0.0.0.0".into(), port: -1 })]);
    assert_eq!(
        proxy_of(&j),
        GatewayProxy {
            connect_timeout: Some(5 * SECOND),
            envoy_gateway_no_default_bind: true,
            envoy_gateway_bind_addresses: bind,
            ..GatewayProxy::default()
        }
    );
    let expected = Task {
        name: "connect-terminating-gw-out".into(),
        kind: "connect-terminating:gw-out".into(),
        driver: "docker".into(),
        config: envoy_config("${meta.connect.gateway_image}"),
        shutdown_delay: 5 * SECOND,
        log_config: LogConfig { max_files: 2, max_file_size_mb: 2, disabled: false },
        resources: Resources { cpu: 250, memory_mb: 128, ..Resources::default() },
        constraints: vec![constraint("${attr.consul.version}", "semver", ">= 1.8.0"), constraint("${attr.consul.grpc}", ">", "0")],
        restart_policy: g.restart_policy.clone(),
        ..Task::default()
    };
    assert_eq!(g.tasks, [expected]);
    j.validate_connect().unwrap();
    j.validate().unwrap();
}

#[test]
fn a_gateway_in_host_mode_shares_the_hosts_network_and_keeps_its_port() {
    let j = mutated(gateway_job("host", json!({"Terminating": {"Services": [{"Name": "legacy"}]}, "Proxy": {"Config": {"k": 1}}}), "9000"));
    let g = &j.task_groups[0];
    assert_eq!(g.services[0].port_label, "9000");
    assert!(g.networks[0].dynamic_ports.is_empty());
    assert_eq!(g.tasks[0].config["network_mode"], json!("host"));
    let proxy = proxy_of(&j);
    assert_eq!((proxy.connect_timeout, proxy.envoy_gateway_no_default_bind), (Some(5 * SECOND), false));
    assert!(proxy.envoy_gateway_bind_addresses.is_empty());
    assert_eq!(proxy.config["k"], json!(1), "copied from the operator's");
}

#[test]
fn an_ingress_gateway_in_bridge_mode_binds_each_service_on_its_listener() {
    let ingress = json!({"TLS": {"Enabled": true, "TLSMinVersion": "TLSv1_2"}, "Listeners": [
        {"Port": 8080, "Protocol": "http", "Services": [{"Name": "web"}, {"Name": "api"}]},
        {"Port": 9090, "Services": [{"Name": "db"}]}]});
    let j = mutated(gateway_job("bridge", json!({"Ingress": ingress, "Proxy": {"ConnectTimeout": SECOND}}), "8080"));
    let proxy = proxy_of(&j);
    let at = |port| GatewayBindAddress { address: "0.0.0.0".into(), port };
    assert_eq!(proxy.connect_timeout, Some(SECOND), "the operator's timeout is kept");
    assert!(proxy.envoy_gateway_no_default_bind);
    assert_eq!(
        proxy.envoy_gateway_bind_addresses,
        BTreeMap::from([("web".to_string(), at(8080)), ("api".to_string(), at(8080)), ("db".to_string(), at(9090))])
    );
    let g = &j.task_groups[0];
    assert!(g.networks[0].dynamic_ports.is_empty(), "ingress gateways get no injected port");
    assert_eq!((g.tasks[0].name.as_str(), g.tasks[0].kind.as_str()), ("connect-ingress-gw-out", "connect-ingress:gw-out"));
    assert_eq!(g.tasks[0].constraints.last(), Some(&constraint("${attr.consul.version}", "semver", ">= 1.11.2")), "customized TLS");
    j.validate_connect().unwrap();
    j.validate().unwrap();
}

#[test]
fn an_operators_own_gateway_binds_are_kept() {
    let proxy = json!({"EnvoyGatewayNoDefaultBind": true, "EnvoyGatewayBindAddresses": {"mine": {"Address": "10.0.0.1", "Port": 7000}}});
    let j = mutated(gateway_job("bridge", json!({"Terminating": {"Services": [{"Name": "legacy"}]}, "Proxy": proxy}), ""));
    let p = proxy_of(&j);
    assert_eq!(p.envoy_gateway_bind_addresses.keys().collect::<Vec<_>>(), ["mine"]);
    assert_eq!(p.connect_timeout, Some(5 * SECOND), "Nomad's API default");
}

#[test]
fn a_mesh_gateway_needs_a_port_and_gets_a_lan_one() {
    assert_eq!(mutate_err(gateway_job("bridge", json!({"Mesh": {}}), "")), "service.port must be set for mesh gateway service");
    let j = mutated(gateway_job("bridge", json!({"Mesh": {}}), "wan"));
    let g = &j.task_groups[0];
    assert_eq!(g.networks[0].dynamic_ports[0].label, "connect-mesh-gw-out-lan");
    assert_eq!(g.tasks[0].kind, "connect-mesh:gw-out");
    assert_eq!(proxy_of(&j).envoy_gateway_bind_addresses.keys().collect::<Vec<_>>(), ["lan", "wan"]);
}

#[test]
fn an_exposed_check_gets_nomads_port_and_an_expose_path() {
    let check =
        json!({"Name": "health", "Type": "http", "Path": "/health", "Interval": 10 * SECOND, "Timeout": 2 * SECOND, "Expose": true});
    let plain = json!({"Name": "alive", "Type": "http", "Path": "health", "Interval": 10 * SECOND, "Timeout": 2 * SECOND, "Expose": true});
    let j = mutated(group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Checks": [check, plain],
        "Connect": {"SidecarService": {}}}])));
    let g = &j.task_groups[0];
    let s = &g.services[0];
    let hash = {
        let mut c = s.checks[0].clone();
        c.port_label.clear();
        c.hash("count-api_0")
    };
    let label = format!("svc_count-api_ck_{}", &hash[..6]);
    assert_eq!(s.checks[0].port_label, label);
    assert_eq!(s.checks[1].port_label, "", "a path without a leading / is not exposed");
    assert_eq!(g.networks[0].dynamic_ports.last(), Some(&Port { label: label.clone(), to: -1, ..Port::default() }));
    let proxy = s.connect.as_ref().unwrap().sidecar_service.as_ref().unwrap().proxy.as_ref().unwrap();
    let expose = ExposeConfig::from_value(proxy.expose.as_ref().unwrap()).unwrap();
    assert_eq!(expose.paths, [ExposePath { path: "/health".into(), protocol: String::new(), local_path_port: 9001, listener_port: label }]);
    j.validate_connect().unwrap();
}

#[test]
fn an_exposed_checks_local_port_is_the_services_static_port_or_number() {
    let check = json!({"Name": "health", "Type": "grpc", "Path": "/grpc.health.v1.Health/Check", "PortLabel": "probe",
        "Interval": 10 * SECOND, "Timeout": 2 * SECOND, "Expose": true});
    let mut j = group_job(json!([{"Name": "count-api", "PortLabel": "admin", "Checks": [check], "Connect": {"SidecarService": {}}}]));
    j.task_groups[0].networks[0].reserved_ports.push(Port { label: "admin".into(), value: 8500, ..Port::default() });
    let m = mutated(j.clone());
    let proxy = m.task_groups[0].services[0].connect.as_ref().unwrap().sidecar_service.as_ref().unwrap().proxy.as_ref().unwrap();
    let path = &ExposeConfig::from_value(proxy.expose.as_ref().unwrap()).unwrap().paths[0];
    assert_eq!((path.local_path_port, path.listener_port.as_str()), (8500, "probe"), "the check's own port label is kept");
    // A dynamic port has no value yet: Nomad cannot tell the local port.
    j.task_groups[0].services[0].port_label = "http".into();
    assert_eq!(mutate_err(j), "unable to determine local service port for service check api->count-api->health");
}

#[test]
fn exposed_checks_need_a_bridge_network_and_a_sidecar() {
    let check =
        json!({"Name": "health", "Type": "http", "Path": "/health", "Interval": 10 * SECOND, "Timeout": 2 * SECOND, "Expose": true});
    let mut host =
        group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Checks": [check.clone()], "Connect": {"SidecarService": {}}}]));
    host.task_groups[0].networks[0].mode = "host".into();
    assert_eq!(mutate_err(host.clone()), "group \"api\" must use bridge network for exposing service check(s)");
    let mut two = group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Checks": [check.clone()]}]));
    let second = two.task_groups[0].networks[0].clone();
    two.task_groups[0].networks.push(second);
    assert_eq!(validate_err(&two), "group \"api\" must specify one bridge network for exposing service check(s)");
    let no_sidecar = mutated(group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Checks": [check.clone()]}])));
    assert_eq!(validate_err(&no_sidecar), "exposed service check api->count-api->health requires use of sidecar_proxy");
    let mut in_task = group_job(json!([]));
    in_task.task_groups[0].tasks[0].services =
        vec![lenient::from_value(json!({"Name": "web", "PortLabel": "http", "Checks": [check]})).unwrap()];
    assert_eq!(validate_err(&in_task), "exposed service check api[web]->web->health is not a task-group service");
}

#[test]
fn sidecars_need_one_bridge_network_and_lower_case_names() {
    let mut none = sidecar_job();
    none.task_groups[0].networks.clear();
    let none = mutated(none);
    assert_eq!(none.task_groups[0].tasks.len(), 1, "no network: nothing injected");
    assert_eq!(validate_err(&none), "Consul Connect sidecars require exactly 1 network, found 0 in group \"api\"");
    let mut host = sidecar_job();
    host.task_groups[0].networks[0].mode = "host".into();
    assert_eq!(validate_err(&mutated(host)), "Consul Connect sidecar requires bridge network, found \"host\" in group \"api\"");
    let mut upper = sidecar_job();
    upper.task_groups[0].services[0].name = "Count-API".into();
    assert_eq!(
        validate_err(&mutated(upper)),
        "Consul Connect service name \"Count-API\" in group \"api\" must not contain uppercase characters"
    );
    let mut upper = sidecar_job();
    upper.task_groups[0].name = "API".into();
    assert_eq!(
        validate_err(&mutated(upper)),
        "Consul Connect group \"API\" with service \"count-api\" must not contain uppercase characters"
    );
}

#[test]
fn gateways_need_one_bridge_or_host_network() {
    let mut two = gateway_job("bridge", json!({"Terminating": {"Services": [{"Name": "legacy"}]}}), "");
    two.task_groups[0].networks.push(NetworkResource { mode: "bridge".into(), ..NetworkResource::default() });
    assert_eq!(validate_err(&mutated(two)), "Consul Connect gateways require exactly 1 network, found 2 in group \"gateway\"");
    let none = mutated(gateway_job("none", json!({"Terminating": {"Services": [{"Name": "legacy"}]}}), ""));
    assert_eq!(validate_err(&none), r#"Consul Connect Gateway service requires Task Group with network mode of type "bridge" or "host""#);
}

#[test]
fn upstream_listeners_are_unique_in_a_group() {
    let up = |name: &str, port: i64| json!({"DestinationName": name, "LocalBindPort": port});
    let j = mutated(group_job(json!([
        {"Name": "a", "PortLabel": "9001", "Connect": {"SidecarService": {"Proxy": {"Upstreams": [up("db", 5432), up("cache", 6379)]}}}},
        {"Name": "b", "PortLabel": "9002", "Connect": {"SidecarService": {"Proxy": {"Upstreams": [up("db", 5432)]}}}}
    ])));
    assert_eq!(validate_err(&j), "Consul Connect services \"b\" and \"a\" in group \"api\" using same address for upstreams (:5432)");
    let mut ok = j.clone();
    let proxy = ok.task_groups[0].services[1].connect.as_mut().unwrap().sidecar_service.as_mut().unwrap().proxy.as_mut().unwrap();
    proxy.upstreams[0].local_bind_address = "::1".into();
    ok.validate_connect().unwrap();
    ok.task_groups[0].services[0].connect.as_mut().unwrap().sidecar_service.as_mut().unwrap().proxy.as_mut().unwrap().upstreams[1]
        .local_bind_address = "::1".into();
    ok.task_groups[0].services[0].connect.as_mut().unwrap().sidecar_service.as_mut().unwrap().proxy.as_mut().unwrap().upstreams[1]
        .local_bind_port = 5432;
    assert_eq!(validate_err(&ok), "Consul Connect services \"b\" and \"a\" in group \"api\" using same address for upstreams ([::1]:5432)");
}

#[test]
fn connect_service_names_are_interpolated_with_what_is_known_at_submission() {
    let mut j = group_job(json!([
        {"Name": "${NOMAD_JOB_NAME}-${NOMAD_GROUP_NAME}-${NOMAD_META_TIER}", "PortLabel": "9001", "Connect": {"SidecarService": {}}},
        {"Name": "${NOMAD_ALLOC_ID}-x", "PortLabel": "9002", "Connect": {"SidecarService": {}}}
    ]));
    j.meta.insert("tier".into(), "gold".into());
    let j = mutated(j);
    let g = &j.task_groups[0];
    assert_eq!(g.services[0].name, "countdash-api-gold");
    assert_eq!(g.tasks[1].name, "connect-proxy-countdash-api-gold");
    assert_eq!(g.services[1].name, "${NOMAD_ALLOC_ID}-x", "unknown at submission: left for the client");
}

/// A job with every kind of mutation, mutated again or read back, is unchanged.
#[test]
fn mutating_a_mutated_job_changes_nothing() {
    let check =
        json!({"Name": "health", "Type": "http", "Path": "/health", "Interval": 10 * SECOND, "Timeout": 2 * SECOND, "Expose": true});
    let mut j = job(&json!({"ID": "all", "TaskGroups": [
        {"Name": "api", "Networks": [{"Mode": "bridge"}],
         "Services": [
            {"Name": "count-api", "PortLabel": "9001", "Checks": [check],
             "Connect": {"SidecarService": {"Proxy": {"Upstreams": [{"DestinationName": "db", "LocalBindPort": 5432}]}},
                         "SidecarTask": {"Driver": "raw_exec", "Config": {"command": "envoy"}}}},
            {"Name": "native", "PortLabel": "9002", "TaskName": "web", "Connect": {"Native": true}}],
         "Tasks": [{"Name": "web", "Driver": "raw_exec"}, {"Name": "connect-proxy-count-api", "Driver": "raw_exec"}]},
        {"Name": "gw", "Networks": [{"Mode": "bridge"}],
         "Services": [
            {"Name": "out", "Connect": {"Gateway": {"Terminating": {"Services": [{"Name": "legacy"}]}}}},
            {"Name": "in", "PortLabel": "8080", "Connect": {"Gateway": {"Ingress": {"Listeners": [{"Port": 8080, "Services": [{"Name": "count-api"}]}]}}}}]}
    ]})
    .to_string());
    j.mutate_connect().unwrap();
    let once = j.clone();
    j.mutate_connect().unwrap();
    assert_eq!(j, once, "a second run");
    let mut read_back: Job = lenient::from_slice(&serde_json::to_vec(&once).unwrap()).unwrap();
    read_back.canonicalize();
    read_back.mutate_connect().unwrap();
    assert_eq!(read_back, once, "a job read back");
    once.validate_connect().unwrap();
    once.validate().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(once.task_groups[0].tasks.len(), 3);
    assert_eq!(once.task_groups[1].tasks.len(), 2);
}

#[test]
fn the_service_and_task_rules_nomads_validation_adds() {
    let errors = |j: &Job| j.validate().map(|_| String::new()).unwrap_or_else(|e| e.to_string());
    // A tcp check cannot reach a service bound inside the namespace.
    let tcp = json!({"Name": "alive", "Type": "tcp", "Interval": 10 * SECOND, "Timeout": 2 * SECOND});
    let j = mutated(group_job(json!([{"Name": "count-api", "PortLabel": "9001", "Checks": [tcp], "Connect": {"SidecarService": {}}}])));
    assert!(errors(&j).contains("Check alive invalid: tcp checks are not valid for Connect enabled services"), "{}", errors(&j));
    // Exactly one of sidecar, native, gateway.
    for connect in [json!({}), json!({"Native": true, "SidecarService": {}}), json!({"SidecarTask": {}})] {
        let j = group_job(json!([{"Name": "x", "PortLabel": "9001", "TaskName": "web", "Connect": connect}]));
        let text = errors(&j);
        assert!(text.contains("Consul Connect must be exclusively native, make use of a sidecar, or represent a Gateway"), "{text}");
    }
    // Gateways.
    for (gateway, message) in [
        (json!({"Terminating": {}}), "Consul Terminating Gateway requires at least one service"),
        (json!({"Terminating": {"Services": [{"Name": "x", "CertFile": "c"}]}}), "Consul Linked Service TLS requires CAFile"),
        (
            json!({"Terminating": {"Services": [{"Name": "x", "CAFile": "a", "CertFile": "c"}]}}),
            "Consul Linked Service TLS Cert and Key must both be set",
        ),
        (json!({"Terminating": {"Services": [{"Name": "x", "SNI": "s"}]}}), "Consul Linked Service TLS SNI requires CAFile"),
        (json!({"Ingress": {}}), "Consul Ingress Gateway requires at least one listener"),
        (json!({"Ingress": {"Listeners": [{"Port": 0}]}}), "Consul Ingress Listener requires valid Port"),
        (
            json!({"Ingress": {"Listeners": [{"Port": 1, "Protocol": "udp"}]}}),
            "Consul Ingress Listener requires protocol of tcp, http, http2, grpc, got \"udp\"",
        ),
        (json!({"Ingress": {"Listeners": [{"Port": 1}]}}), "Consul Ingress Listener requires one or more services"),
        (
            json!({"Ingress": {"Listeners": [{"Port": 1, "Services": [{"Name": "*"}]}]}}),
            "Consul Ingress Service doesn't support wildcard name for \"tcp\" protocol",
        ),
        (
            json!({"Ingress": {"Listeners": [{"Port": 1, "Protocol": "http", "Services": [{"Name": "*", "Hosts": ["h"]}]}]}}),
            "with a wildcard \"*\" service name can not also specify hosts",
        ),
        (json!({"Mesh": {}, "Terminating": {"Services": [{"Name": "x"}]}}), "One Consul Gateway Configuration must be set"),
        (
            json!({"Terminating": {"Services": [{"Name": "x"}]}, "Proxy": {"EnvoyDNSDiscoveryType": "X"}}),
            "Envoy DNS Discovery type must be STRICT_DNS or LOGICAL_DNS",
        ),
        (
            json!({"Terminating": {"Services": [{"Name": "x"}]}, "Proxy": {"EnvoyGatewayBindAddresses": {"a": {"Address": "", "Port": 1}}}}),
            "Consul Gateway Bind Address must be set",
        ),
        (
            json!({"Terminating": {"Services": [{"Name": "x"}]}, "Proxy": {"EnvoyGatewayBindAddresses": {"a": {"Address": "x", "Port": 0}}}}),
            "Consul Gateway Bind Address must set valid Port",
        ),
    ] {
        let j = gateway_job("bridge", gateway, "9000");
        let text = errors(&j);
        assert!(text.contains(message), "{message:?} in {text}");
    }
    // Native services name their task (which the mutator infers when there is one).
    let j = group_job(json!([{"Name": "api", "PortLabel": "9001", "Connect": {"Native": true}}]));
    assert!(errors(&j).contains("Service api is Connect Native and requires setting the task"));
    assert_eq!(errors(&mutated(j)), "");
    // An Envoy task of the operator's.
    let mut j = sidecar_job();
    let mut own = j.task_groups[0].tasks[0].clone();
    own.kind = "connect-proxy:other".into();
    own.name = "envoy".into();
    own.leader = true;
    own.services = j.task_groups[0].tasks[0].services.clone();
    own.services.push(Service { name: "s".into(), ..Service::default() });
    j.task_groups[0].tasks.push(own);
    j.canonicalize();
    let text = errors(&mutated(j));
    for needle in [
        "Connect proxy task must not have a service block",
        "Connect proxy task must not have leader set",
        "Connect proxy service name (\"other\") not found in Connect services from task group: [count-api]",
    ] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }
}

#[test]
fn a_connect_job_file_parses_mutates_and_validates() {
    let src = r#"
job "countdash" {
  group "api" {
    network {
      mode = "bridge"
    }
    service {
      name = "count-api"
      port = "9001"
      connect {
        sidecar_service {
          proxy {
            upstreams {
              destination_name = "db"
              local_bind_port  = 5432
              config {
                connect_timeout_ms = 2000
              }
            }
          }
        }
        sidecar_task {
          driver = "exec"
          config {
            command = "/usr/local/bin/envoy"
          }
          resources {
            cpu    = 300
            memory = 96
          }
        }
      }
    }
    task "web" {
      driver = "raw_exec"
      config {
        command = "/bin/web"
      }
    }
  }
}
"#;
    let mut j = crate::jobspec::parse(src, &crate::jobspec::ParseOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    j.canonicalize();
    j.mutate_connect().unwrap();
    j.validate_connect().unwrap();
    j.validate().unwrap();
    let g = &j.task_groups[0];
    let envoy = &g.tasks[1];
    assert_eq!((envoy.name.as_str(), envoy.driver.as_str()), ("connect-proxy-count-api", "exec"));
    assert_eq!(envoy.config, BTreeMap::from([("command".to_string(), json!("/usr/local/bin/envoy"))]));
    assert_eq!((envoy.resources.cpu, envoy.resources.memory_mb), (300, 96));
    let upstream: &ConsulUpstream = &g.services[0]
        .connect
        .as_ref()
        .and_then(|c| c.sidecar_service.as_ref())
        .and_then(|s: &ConsulSidecarService| s.proxy.as_ref())
        .map(|p: &ConsulProxy| &p.upstreams)
        .unwrap()[0];
    assert_eq!(upstream.config["connect_timeout_ms"], json!(2000), "an upstream's config is kept for Consul");
}
