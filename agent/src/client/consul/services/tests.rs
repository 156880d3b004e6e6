//! Consul registration payloads, field by field, against what Nomad 1.6 sends (reference §10).

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources, AllocatedSharedResources};
use nomad_proto::{Job, TaskGroup};
use sha1::{Digest, Sha1};

use super::*;

fn svc(name: &str, port: &str) -> Service {
    Service { name: name.into(), port_label: port.into(), address_mode: "auto".into(), ..Service::default() }
}

fn http_check(name: &str) -> JobCheck {
    JobCheck {
        name: name.into(),
        check_type: "http".into(),
        path: "/health?deep=1".into(),
        interval: 10_000_000_000,
        timeout: 2_000_000_000,
        ..JobCheck::default()
    }
}

fn fixture(group_services: Vec<Service>, task_services: Vec<Service>) -> (Allocation, Node) {
    let job = Job {
        id: "web".into(),
        name: "web".into(),
        task_groups: vec![TaskGroup {
            name: "front".into(),
            services: group_services,
            tasks: vec![Task { name: "server".into(), services: task_services, ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
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
                ports: vec![
                    AllocatedPortMapping { label: "http".into(), value: 23456, to: 8080, host_ip: "10.1.2.3".into() },
                    AllocatedPortMapping { label: "admin".into(), value: 23457, to: 0, host_ip: "10.1.2.3".into() },
                ],
                ..AllocatedSharedResources::default()
            },
            ..AllocatedResources::default()
        }),
        ..Allocation::default()
    };
    let mut node = Node { id: "node-1".into(), datacenter: "dc2".into(), ..Node::default() };
    node.attributes.insert("unique.network.ip-address".into(), "10.9.9.9".into());
    node.meta.insert("rack".into(), "r7".into());
    (alloc, node)
}

fn one(s: Service) -> ServiceRegistration {
    let (alloc, node) = fixture(vec![s], vec![]);
    let built = build_consul(&alloc, &node, "global", "", Which::All);
    assert!(built.errors.is_empty(), "{:?}", built.errors);
    built.registrations.into_values().next().expect("one registration")
}

fn err(s: Service) -> String {
    let (alloc, node) = fixture(vec![s], vec![]);
    let built = build_consul(&alloc, &node, "global", "", Which::All);
    assert!(built.registrations.is_empty());
    built.errors.join("; ")
}

fn sha1_hex(s: &str) -> String {
    Sha1::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_check_hash_is_nomads_sha1_over_its_fields_in_order() {
    // What Nomad's ServiceCheck.Hash writes, field by field, for this check.
    let c = JobCheck {
        name: "check".into(),
        check_type: "http".into(),
        args: vec!["a".into(), "b".into()],
        path: "/p".into(),
        protocol: "https".into(),
        port_label: "http".into(),
        interval: 10_000_000_000,
        timeout: 1_500_000_000,
        method: "POST".into(),
        body: "{}".into(),
        on_update: "ignore".into(),
        tls_skip_verify: true,
        header: BTreeMap::from([("X-B".into(), vec!["2".into()]), ("X-A".into(), vec!["1".into(), "1b".into()])]),
        address_mode: "host".into(),
        grpc_service: "svc".into(),
        grpc_use_tls: true,
        success_before_passing: 3,
        failures_before_critical: 4,
        ..JobCheck::default()
    };
    let expected = sha1_hex("ServiceIDcheckhttpab/phttpshttp10s1.5sPOST{}ignoretrueX-A11bX-B2hostsvctruesuccess:3failures:4");
    assert_eq!(check_hash("ServiceID", &c), expected);
    assert_eq!(check_id("ServiceID", &c), format!("_nomad-check-{expected}"));

    // Unset optional fields are not written at all (IDs stable with older Nomads).
    let plain = JobCheck { name: "check".into(), success_before_passing: 3, failures_before_critical: 4, ..JobCheck::default() };
    let expected = sha1_hex("ServiceIDcheck0s0ssuccess:3failures:4");
    assert_eq!(check_hash("ServiceID", &plain), expected);
    assert_ne!(check_hash("OtherID", &plain), expected, "the service ID is part of the hash");
}

#[test]
fn id_name_tags_meta_and_flags() {
    let mut s = svc("${NOMAD_JOB_NAME}-api", "http");
    s.tags = vec!["idx-${NOMAD_ALLOC_INDEX}".into(), "rack-${meta.rack}".into()];
    s.canary_tags = vec!["canary".into()];
    s.meta = BTreeMap::from([("version".into(), "${NOMAD_ALLOC_INDEX}".into())]);
    s.enable_tag_override = true;
    let r = one(s);
    assert_eq!(r.id, "_nomad-task-a1b2-group-front-web-api-http");
    assert_eq!(r.name, "web-api");
    assert_eq!(r.kind, "");
    assert_eq!(r.tags, ["idx-3", "rack-r7"], "tags interpolated; canary_tags only for canaries");
    assert_eq!(r.meta, BTreeMap::from([("external-source".into(), "nomad".into()), ("version".into(), "3".into())]));
    assert!(r.enable_tag_override);
    assert!(r.checks.is_empty());
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["Checks"], serde_json::json!([]), "Nomad always sends Checks");
    assert_eq!(json["EnableTagOverride"], true);
    assert_eq!(json["ID"], "_nomad-task-a1b2-group-front-web-api-http");
    assert_eq!(json["Meta"]["external-source"], "nomad");
    assert!(json.get("Connect").is_none() && json.get("Proxy").is_none() && json.get("Kind").is_none());
}

#[test]
fn an_unpromoted_canary_registers_its_canary_tags_and_meta() {
    let mut s = svc("api", "http");
    s.tags = vec!["live".into()];
    s.canary_tags = vec!["canary-${NOMAD_ALLOC_INDEX}".into()];
    s.meta = BTreeMap::from([("role".into(), "live".into())]);
    s.canary_meta = BTreeMap::from([("role".into(), "canary".into())]);
    let (mut alloc, node) = fixture(vec![s.clone()], vec![]);
    alloc.deployment_status = Some(serde_json::json!({"Healthy": null, "Canary": true}));
    let built = build_consul(&alloc, &node, "global", "", Which::All);
    let r = built.registrations.values().next().unwrap();
    assert_eq!(r.tags, ["canary-3"]);
    assert_eq!(r.meta.get("role").map(String::as_str), Some("canary"));
    // Promoted: the ordinary ones again, under the same service ID.
    alloc.deployment_status = Some(serde_json::json!({"Healthy": true, "Canary": false}));
    let promoted = build_consul(&alloc, &node, "global", "", Which::All);
    let p = promoted.registrations.values().next().unwrap();
    assert_eq!((p.id.as_str(), p.tags.as_slice()), (r.id.as_str(), ["live".to_string()].as_slice()));
    assert_eq!(p.meta.get("role").map(String::as_str), Some("live"));
}

#[test]
fn address_and_port_per_address_mode() {
    let r = one(svc("auto", "http"));
    assert_eq!((r.address.as_str(), r.port), ("10.1.2.3", 23456));
    let mut host = svc("host", "8081");
    host.address_mode = "host".into();
    let r = one(host);
    assert_eq!((r.address.as_str(), r.port, r.id.as_str()), ("10.9.9.9", 8081, "_nomad-task-a1b2-group-front-host-8081"));
    let mut custom = svc("custom", "http");
    custom.address = "${meta.rack}.example.com".into();
    let r = one(custom);
    assert_eq!((r.address.as_str(), r.port), ("r7.example.com", 23456));

    // alloc: the alloc network's address and the port's `to`.
    let mut alloc_mode = svc("inside", "http");
    alloc_mode.address_mode = "alloc".into();
    let (mut alloc, node) = fixture(vec![alloc_mode.clone()], vec![]);
    alloc.network_status = Some(serde_json::json!({"Address": "172.26.64.5", "InterfaceName": "eth0"}));
    let r = build_consul(&alloc, &node, "global", "", Which::All).registrations.into_values().next().unwrap();
    assert_eq!((r.address.as_str(), r.port), ("172.26.64.5", 8080));
    assert!(err(alloc_mode).contains("no allocation network status reported"));

    let mut host_custom = svc("hc", "http");
    host_custom.address_mode = "host".into();
    host_custom.address = "1.2.3.4".into();
    assert!(err(host_custom).contains("cannot use custom advertise address with \"host\" address mode"));
    assert!(err(svc("missing", "nope")).contains("port label not found"));
}

#[test]
fn tagged_addresses_take_the_service_port_unless_given() {
    let mut s = svc("t", "http");
    s.tagged_addresses =
        BTreeMap::from([("lan".into(), "10.0.0.1".into()), ("wan".into(), "1.2.3.4:80".into()), ("v6".into(), "[::1]:81".into())]);
    let r = one(s);
    assert_eq!(
        r.tagged_addresses,
        BTreeMap::from([
            ("lan".into(), ServiceAddress { address: "10.0.0.1".into(), port: 23456 }),
            ("v6".into(), ServiceAddress { address: "::1".into(), port: 81 }),
            ("wan".into(), ServiceAddress { address: "1.2.3.4".into(), port: 80 }),
        ])
    );
    let mut bad = svc("t", "http");
    bad.tagged_addresses = BTreeMap::from([("lan".into(), "not an ip".into())]);
    assert!(err(bad).contains("not an IP address"));
}

#[test]
fn http_checks_carry_url_method_header_tls_and_ids() {
    let mut c = http_check("alive");
    c.method = "POST".into();
    c.header = BTreeMap::from([("X-Probe".into(), vec!["${NOMAD_ALLOC_INDEX}".into()])]);
    c.tls_skip_verify = true;
    c.protocol = "https".into();
    c.port_label = "admin".into();
    c.on_update = "ignore_warnings".into();
    c.initial_status = "passing".into();
    let mut s = svc("web", "http");
    s.checks = vec![c.clone()];
    let r = one(s);
    let got = &r.checks[0];
    let mut interpolated = c.clone();
    interpolated.header = BTreeMap::from([("X-Probe".into(), vec!["3".into()])]);
    assert_eq!(got.check_id, check_id("_nomad-task-a1b2-group-front-web-http", &interpolated), "hash over the interpolated check");
    assert_eq!(got.name, "alive");
    assert_eq!(got.http, "https://10.1.2.3:23457/health?deep=1", "check port label, host address");
    assert_eq!((got.interval.as_str(), got.timeout.as_str()), ("10s", "2s"));
    assert_eq!(got.method, "POST");
    assert_eq!(got.header["X-Probe"], ["3"]);
    assert!(got.tls_skip_verify);
    assert_eq!(got.status, "passing");
    let json = serde_json::to_value(got).unwrap();
    assert_eq!(json["HTTP"], "https://10.1.2.3:23457/health?deep=1");
    assert_eq!(json["TLSSkipVerify"], true);
    assert!(json["CheckID"].as_str().unwrap().starts_with("_nomad-check-"));
    assert!(json.get("TCP").is_none() && json.get("TTL").is_none());

    // The default protocol is http and the port is the service's.
    let mut s = svc("web", "http");
    let mut plain = http_check("p");
    plain.path = "status".into();
    s.checks = vec![plain];
    assert_eq!(one(s).checks[0].http, "http://10.1.2.3:23456/status");
}

#[test]
fn a_check_follows_a_custom_service_address() {
    let mut s = svc("web", "http");
    s.address = "192.168.7.7".into();
    s.checks = vec![JobCheck {
        name: "t".into(),
        check_type: "tcp".into(),
        interval: 1_000_000_000,
        timeout: 1_000_000_000,
        ..JobCheck::default()
    }];
    assert_eq!(one(s).checks[0].tcp, "192.168.7.7:23456");
}

#[test]
fn tcp_and_grpc_checks() {
    let mut s = svc("db", "http");
    s.checks = vec![
        JobCheck { name: "tcp".into(), check_type: "tcp".into(), interval: 5_000_000_000, timeout: 1_000_000_000, ..JobCheck::default() },
        JobCheck {
            name: "grpc".into(),
            check_type: "grpc".into(),
            grpc_service: "health.v1".into(),
            grpc_use_tls: true,
            interval: 60_000_000_000,
            timeout: 500_000_000,
            ..JobCheck::default()
        },
    ];
    let r = one(s);
    assert_eq!(r.checks[0].tcp, "10.1.2.3:23456");
    assert_eq!((r.checks[0].interval.as_str(), r.checks[0].timeout.as_str()), ("5s", "1s"));
    assert_eq!(r.checks[1].grpc, "10.1.2.3:23456/health.v1");
    assert!(r.checks[1].grpc_use_tls);
    assert_eq!((r.checks[1].interval.as_str(), r.checks[1].timeout.as_str()), ("1m0s", "500ms"));
    assert_ne!(r.checks[0].check_id, r.checks[1].check_id);
}

#[test]
fn services_that_cannot_be_registered_are_skipped_with_a_reason() {
    let mut noport = svc("np", "");
    noport.checks = vec![http_check("h")];
    assert!(err(noport).contains("http checks require an address"));
    let mut connect = svc("c", "http");
    connect.connect = Some(Default::default());
    assert_eq!(err(connect), "service \"c\": invalid Consul Connect configuration: Connect configuration empty for service c");
}

#[test]
fn task_services_only_for_running_tasks_and_nomad_services_left_out() {
    let mut native = svc("native", "http");
    native.provider = "nomad".into();
    let mut explicit = svc("explicit", "http");
    explicit.provider = "consul".into();
    let (alloc, node) = fixture(vec![svc("grp", "http"), native, explicit], vec![svc("tsk-${NOMAD_TASK_NAME}", "http")]);
    assert!(has_consul_services(&alloc));
    let built = build_consul(&alloc, &node, "global", "team-a", Which::Running(&[]));
    let ids: Vec<&str> = built.registrations.keys().map(String::as_str).collect();
    assert_eq!(ids, ["_nomad-task-a1b2-group-front-explicit-http", "_nomad-task-a1b2-group-front-grp-http"]);
    assert!(built.registrations.values().all(|r| r.namespace == "team-a"));
    let built = build_consul(&alloc, &node, "global", "", Which::Running(&["server"]));
    assert!(built.registrations.contains_key("_nomad-task-a1b2-server-tsk-server-http"));
}

#[test]
fn script_checks_are_registered_as_ttl_checks_and_listed_for_their_task() {
    use nomad_proto::service::CheckRestart;
    let script = JobCheck {
        name: "sh-${NOMAD_TASK_NAME}".into(),
        check_type: "script".into(),
        command: "/bin/check".into(),
        args: vec!["${NOMAD_ALLOC_INDEX}".into()],
        interval: 10_000_000_000,
        timeout: 2_000_000_000,
        task_name: "server".into(),
        ..JobCheck::default()
    };
    // A group service without a port: a script check needs no address.
    let mut group = svc("grp", "");
    group.checks = vec![script.clone(), JobCheck { task_name: "other".into(), ..script.clone() }];
    let mut task_svc = svc("tsk", "http");
    task_svc.checks = vec![
        JobCheck { name: "own".into(), task_name: String::new(), ..script.clone() },
        JobCheck { check_restart: Some(CheckRestart { limit: 3, grace: 1_000_000_000, ignore_warnings: true }), ..http_check("h") },
        http_check("plain"),
    ];
    let (alloc, node) = fixture(vec![group], vec![task_svc]);
    let built = build_consul(&alloc, &node, "global", "", Which::All);
    assert!(built.errors.is_empty(), "{:?}", built.errors);
    let g = &built.registrations["_nomad-task-a1b2-group-front-grp-"];
    let ttl = &g.checks[0];
    // Nomad's createCheckReg: TTL = interval + 31s, no Interval or Timeout (Consul refuses both).
    assert_eq!((ttl.ttl.as_str(), ttl.interval.as_str(), ttl.timeout.as_str()), ("41s", "", ""));
    assert!(ttl.http.is_empty() && ttl.tcp.is_empty());
    let body = serde_json::to_value(ttl).unwrap();
    assert_eq!(body.as_object().unwrap().keys().collect::<Vec<_>>(), ["CheckID", "Name", "TTL"]);

    let task = alloc.job.as_ref().unwrap().task_groups[0].tasks[0].clone();
    let listed = task_checks(&alloc, &node, "global", &task);
    let t = &built.registrations["_nomad-task-a1b2-server-tsk-http"];
    // The task's own script, its check_restart check, and the group script naming it; not the
    // plain http check, not the group script of task "other".
    let ids: Vec<&str> = listed.iter().map(|c| c.check_id.as_str()).collect();
    assert_eq!(ids, [t.checks[0].check_id.as_str(), t.checks[1].check_id.as_str(), g.checks[0].check_id.as_str()]);
    assert_eq!(listed[0].script, Some(("/bin/check".to_string(), vec!["3".to_string()])));
    assert_eq!(listed[0].interval, std::time::Duration::from_secs(10));
    assert_eq!(listed[0].timeout, std::time::Duration::from_secs(2));
    assert!(listed[1].script.is_none());
    assert_eq!(listed[1].restart.as_ref().map(|r| (r.limit, r.ignore_warnings)), Some((3, true)));
    // The group check's name is interpolated as registered (the group has no task name).
    assert_eq!(listed[2].name, g.checks[0].name);
    assert_eq!(g.checks[0].name, "sh-${NOMAD_TASK_NAME}");
}
