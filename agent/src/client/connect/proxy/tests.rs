use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::resources::{NetworkResource, Port};
use nomad_proto::service::{ConsulConnect, ConsulGateway, ConsulSidecarService, ConsulTerminatingConfigEntry};
use nomad_proto::{Job, Node};

use super::*;

/// Group `api` in `mode` with the app, two sidecars (`count-api`, `other`) and a terminating
/// gateway task; a static port `gw` (8443) and a dynamic one `dyn`.
pub(crate) fn alloc(mode: &str) -> Allocation {
    let sidecar = |svc: &str| Task { name: format!("connect-proxy-{svc}"), kind: format!("connect-proxy:{svc}"), ..Task::default() };
    let connect_sidecar = Some(ConsulConnect { sidecar_service: Some(ConsulSidecarService::default()), ..ConsulConnect::default() });
    let gateway = Some(ConsulConnect {
        gateway: Some(ConsulGateway { terminating: Some(ConsulTerminatingConfigEntry::default()), ..ConsulGateway::default() }),
        ..ConsulConnect::default()
    });
    let group = TaskGroup {
        name: "api".into(),
        networks: vec![NetworkResource {
            mode: mode.into(),
            reserved_ports: vec![Port { label: "gw".into(), value: 8443, ..Port::default() }],
            dynamic_ports: vec![Port { label: "dyn".into(), value: 0, to: -1, ..Port::default() }],
            ..NetworkResource::default()
        }],
        services: vec![
            Service { name: "${NOMAD_META_svc}".into(), port_label: "9001".into(), connect: connect_sidecar.clone(), ..Service::default() },
            Service { name: "other".into(), port_label: "dyn".into(), connect: connect_sidecar, ..Service::default() },
            Service { name: "tgw".into(), port_label: "gw".into(), connect: gateway, ..Service::default() },
            Service { name: "plain".into(), port_label: "http".into(), ..Service::default() },
        ],
        tasks: vec![
            Task { name: "app".into(), ..Task::default() },
            sidecar("count-api"),
            sidecar("other"),
            Task { name: "connect-terminating-tgw".into(), kind: "connect-terminating:tgw".into(), ..Task::default() },
        ],
        ..TaskGroup::default()
    };
    let job = Job { id: "count".into(), task_groups: vec![group], ..Job::default() };
    Allocation { id: "9f1c0a2e".into(), task_group: "api".into(), job: Some(Arc::new(job)), ..Allocation::default() }
}

fn task<'a>(alloc: &'a Allocation, name: &str) -> &'a Task {
    group(alloc).unwrap().lookup_task(name).unwrap()
}

fn with_env<T>(f: impl FnOnce(&Interpolator<'_>) -> T) -> T {
    let env = BTreeMap::from([("NOMAD_META_svc".to_string(), "count-api".to_string())]);
    let node = Node::default();
    f(&Interpolator { env: &env, node: &node, region: "global" })
}

#[test]
fn kinds_come_from_the_task_and_the_services_connect_block() {
    let a = alloc("bridge");
    assert_eq!(task_proxy_kind(task(&a, "connect-proxy-other")), Some(ProxyKind::Sidecar));
    assert_eq!(task_proxy_kind(task(&a, "connect-terminating-tgw")), Some(ProxyKind::Terminating));
    assert_eq!(task_proxy_kind(task(&a, "app")), None);
    assert_eq!(task_proxy_kind(&Task { kind: "connect-native:x".into(), ..Task::default() }), None, "native runs no Envoy");
    let services = &group(&a).unwrap().services;
    let kinds: Vec<_> = services.iter().map(service_proxy_kind).collect();
    assert_eq!(kinds, [Some(ProxyKind::Sidecar), Some(ProxyKind::Sidecar), Some(ProxyKind::Terminating), None]);
    assert_eq!(gateway_kind_name(ProxyKind::Terminating), Some("terminating-gateway"));
}

#[test]
fn the_service_is_found_by_its_interpolated_name_or_nomads_error() {
    let a = alloc("bridge");
    let s = with_env(|i| lookup_service(&a, task(&a, "connect-proxy-count-api"), i)).unwrap();
    assert_eq!((s.name.as_str(), s.port_label.as_str()), ("count-api", "9001"));
    let missing = Task { name: "p".into(), kind: "connect-proxy:nope".into(), ..Task::default() };
    assert_eq!(
        with_env(|i| lookup_service(&a, &missing, i)).unwrap_err(),
        "connect proxy sidecar task exists but no services configured with a sidecar"
    );
    let gw = Task { name: "g".into(), kind: "connect-ingress:nope".into(), ..Task::default() };
    assert_eq!(with_env(|i| lookup_service(&a, &gw, i)).unwrap_err(), "connect gateway task exists but no service associated");
}

#[test]
fn bridge_binds_count_up_from_nomads_bases_by_task_index() {
    let a = alloc("bridge");
    let s = with_env(|i| lookup_service(&a, task(&a, "connect-proxy-count-api"), i)).unwrap();
    assert_eq!(binds(&a, &s, "connect-proxy-count-api").unwrap(), ("127.0.0.2:19001".parse().unwrap(), "127.0.0.1:19101".parse().unwrap()));
    let other = with_env(|i| lookup_service(&a, task(&a, "connect-proxy-other"), i)).unwrap();
    assert_eq!(binds(&a, &other, "connect-proxy-other").unwrap().0, "127.0.0.2:19002".parse().unwrap());
    let tgw = with_env(|i| lookup_service(&a, task(&a, "connect-terminating-tgw"), i)).unwrap();
    assert_eq!(binds(&a, &tgw, "connect-terminating-tgw").unwrap().1, "127.0.0.1:19103".parse().unwrap());
}

#[test]
fn host_binds_use_the_group_networks_port_for_the_service() {
    let a = alloc("host");
    let tgw = with_env(|i| lookup_service(&a, task(&a, "connect-terminating-tgw"), i)).unwrap();
    assert_eq!(binds(&a, &tgw, "connect-terminating-tgw").unwrap(), ("127.0.0.2:8443".parse().unwrap(), "127.0.0.1:8443".parse().unwrap()));
    // A dynamic port has no value in the job: 0, and Envoy picks one (as Nomad).
    let other = with_env(|i| lookup_service(&a, task(&a, "connect-proxy-other"), i)).unwrap();
    assert_eq!(binds(&a, &other, "connect-proxy-other").unwrap().0, "127.0.0.2:0".parse().unwrap());
}

#[test]
fn the_task_env_names_both_listeners_after_the_service() {
    let a = alloc("bridge");
    let env = with_env(|i| task_env(&a, task(&a, "connect-proxy-count-api"), i));
    assert_eq!(
        env,
        [
            ("NOMAD_ENVOY_ADMIN_ADDR_count_api".to_string(), "127.0.0.2:19001".to_string()),
            ("NOMAD_ENVOY_READY_ADDR_count_api".to_string(), "127.0.0.1:19101".to_string()),
        ]
    );
    assert!(with_env(|i| task_env(&a, task(&a, "app"), i)).is_empty());
}

#[test]
fn proxy_ids_are_the_group_service_ids_with_the_sidecar_suffix() {
    let a = alloc("bridge");
    let s = with_env(|i| lookup_service(&a, task(&a, "connect-proxy-count-api"), i)).unwrap();
    assert_eq!(proxy_id(&a, &s, ProxyKind::Sidecar), "_nomad-task-9f1c0a2e-group-api-count-api-9001-sidecar-proxy");
    let tgw = with_env(|i| lookup_service(&a, task(&a, "connect-terminating-tgw"), i)).unwrap();
    assert_eq!(proxy_id(&a, &tgw, ProxyKind::Terminating), "_nomad-task-9f1c0a2e-group-api-tgw-gw");
}

#[test]
fn the_grpc_address_is_the_tasks_else_the_hosts_else_the_allocs_socket() {
    let none = BTreeMap::new();
    assert_eq!(grpc_address(&alloc("host"), &none, None), "127.0.0.1:8502");
    assert_eq!(grpc_address(&alloc("bridge"), &none, None), "unix://alloc/tmp/consul_grpc.sock");
    assert_eq!(
        grpc_address(&alloc("bridge"), &none, Some(Path::new("/var/nomad/alloc/9f1c"))),
        "unix:///var/nomad/alloc/9f1c/alloc/tmp/consul_grpc.sock",
        "raw_exec's working dir holds no alloc/"
    );
    let env = BTreeMap::from([(GRPC_ADDR_ENV.to_string(), "10.0.0.9:8502".to_string())]);
    assert_eq!(grpc_address(&alloc("bridge"), &env, None), "10.0.0.9:8502");
    assert!(first_network_is_bridge(&alloc("bridge")) && !first_network_is_bridge(&alloc("host")));
    assert!(!first_network_is_bridge(&alloc("cni/mynet")));
}
