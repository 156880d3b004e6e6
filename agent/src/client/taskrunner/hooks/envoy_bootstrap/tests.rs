use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_proto::{Allocation, Node, Task};
use serde_json::json;

use super::*;
use crate::client::connect::proxy::tests::alloc;
use crate::config::consul::ConsulSettings;
use crate::consul::{ConsulClient, ServiceConnect, ServiceRegistration};

const SIDECAR: &str = "connect-proxy-count-api";
const GATEWAY: &str = "connect-terminating-tgw";
const SIDECAR_ID: &str = "_nomad-task-9f1c0a2e-group-api-count-api-9001-sidecar-proxy";
const GATEWAY_ID: &str = "_nomad-task-9f1c0a2e-group-api-tgw-gw";

fn fast() -> Retry {
    Retry { initial: Duration::from_millis(20), max_jitter: Duration::from_millis(5), total: Duration::from_millis(2_000) }
}

struct Fixture {
    standin: ConsulStandIn,
    client: Arc<ConsulClient>,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let settings = ConsulSettings { address: standin.addr().to_string(), ..ConsulSettings::default() };
        let dir = tempfile::tempdir().unwrap();
        for task in [SIDECAR, GATEWAY] {
            std::fs::create_dir_all(dir.path().join(task).join("secrets")).unwrap();
        }
        Fixture { standin, client: Arc::new(ConsulClient::new(&settings)), dir }
    }

    fn hook(&self, agent_namespace: &str, retry: Retry) -> EnvoyBootstrapHook {
        EnvoyBootstrapHook::new(EnvoyBootstrapDeps {
            consul: Some(self.client.clone()),
            agent_namespace: agent_namespace.into(),
            node: Arc::new(|| Arc::new(Node::default())),
            region: "global".into(),
            retry,
        })
    }

    /// Registers the group service with its sidecar, as the services sync does.
    async fn register_sidecar(&self) {
        let reg = ServiceRegistration {
            id: "_nomad-task-9f1c0a2e-group-api-count-api-9001".into(),
            name: "count-api".into(),
            port: 9001,
            connect: Some(ServiceConnect {
                native: false,
                sidecar_service: Some(Box::new(ServiceRegistration {
                    port: 21000,
                    proxy: Some(typed(json!({"Config": {
                        "bind_address": "0.0.0.0", "bind_port": 21000,
                        "envoy_stats_tags": ["nomad.alloc_id=9f1c0a2e", "nomad.group=api"]}}))),
                    ..ServiceRegistration::default()
                })),
            }),
            ..ServiceRegistration::default()
        };
        self.client.service_register(&reg).await.unwrap();
    }

    async fn register_gateway(&self) {
        let reg = ServiceRegistration {
            kind: "terminating-gateway".into(),
            id: GATEWAY_ID.into(),
            name: "tgw".into(),
            port: 8443,
            proxy: Some(typed(json!({"Config": {"connect_timeout_ms": 5000, "envoy_gateway_no_default_bind": true}}))),
            ..ServiceRegistration::default()
        };
        self.client.service_register(&reg).await.unwrap();
    }

    fn bootstrap(&self, task: &str) -> Value {
        serde_json::from_slice(&std::fs::read(bootstrap_path(self.dir.path(), task)).unwrap()).unwrap()
    }
}

async fn run(hook: &EnvoyBootstrapHook, alloc: &Allocation, task: &str, dir: &Path) -> Result<PrestartResponse, HookError> {
    let task: Task = proxy::group(alloc).unwrap().lookup_task(task).unwrap().clone();
    let mut config = super::super::tests_support::config();
    config.alloc_dir = dir.to_path_buf();
    config.task_name = task.name.clone();
    config.env = BTreeMap::from([("NOMAD_META_svc".to_string(), "count-api".to_string())]);
    let req = HookRequest { alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
    AsyncPrestartHook::prestart(hook, &req).await
}

#[tokio::test]
async fn a_sidecar_bootstrap_is_written_from_its_registration_with_the_si_token() {
    let f = Fixture::new();
    f.register_sidecar().await;
    std::fs::write(f.dir.path().join(SIDECAR).join("secrets/si_token"), "si-secret").unwrap();
    let resp = run(&f.hook("", fast()), &alloc("bridge"), SIDECAR, f.dir.path()).await.unwrap();
    assert!(!resp.done, "every start writes it again, as Nomad");
    assert_eq!(resp.data[PROXY_ID_KEY], SIDECAR_ID);

    let path = bootstrap_path(f.dir.path(), SIDECAR);
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o644);
    let b = f.bootstrap(SIDECAR);
    assert_eq!(b["node"]["id"], SIDECAR_ID);
    assert_eq!(b["node"]["cluster"], "count-api");
    assert_eq!(b["admin"]["address"]["socket_address"], json!({"address": "127.0.0.2", "port_value": 19001}));
    let agent = &b["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
    assert_eq!(agent, &json!({"pipe": {"path": "alloc/tmp/consul_grpc.sock"}}), "bridge mode: the alloc's socket");
    assert_eq!(b["dynamic_resources"]["ads_config"]["grpc_services"]["initial_metadata"][0]["value"], "si-secret");
    let tags: Vec<(String, String)> = b["stats_config"]["stats_tags"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| Some((t["tag_name"].as_str()?.to_string(), t["fixed_value"].as_str()?.to_string())))
        .collect();
    assert!(tags.contains(&("nomad.alloc_id".into(), "9f1c0a2e".into())), "the proxy's envoy_stats_tags: {tags:?}");
    assert!(tags.contains(&("consul.source.datacenter".into(), "dc1".into())), "the registration's datacenter: {tags:?}");
    assert!(tags.contains(&("consul.source.service".into(), "count-api".into())));
    let lookups = f.standin.calls_to("GET", "/v1/agent/service/");
    assert_eq!(lookups.len(), 1);
    assert_eq!(lookups[0].path, format!("/v1/agent/service/{SIDECAR_ID}"));
}

#[tokio::test]
async fn a_proxy_registered_late_is_waited_for_and_one_never_registered_fails_as_nomad() {
    let f = Fixture::new();
    let a = alloc("bridge");
    let hook = f.hook("", fast());
    let (hook_result, ()) = tokio::join!(run(&hook, &a, SIDECAR, f.dir.path()), async {
        // Registered once the hook has asked and been told no.
        while f.standin.calls_to("GET", "/v1/agent/service/").is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        f.register_sidecar().await;
    });
    hook_result.unwrap();
    assert!(f.standin.calls_to("GET", "/v1/agent/service/").len() >= 2);
    assert_eq!(f.bootstrap(SIDECAR)["node"]["id"], SIDECAR_ID);

    let gone = Fixture::new();
    let retry = Retry { initial: Duration::from_millis(10), max_jitter: Duration::ZERO, total: Duration::from_millis(75) };
    let err = run(&gone.hook("", retry), &a, SIDECAR, gone.dir.path()).await.unwrap_err();
    assert!(err.recoverable, "counted by the restart policy, as Nomad's exit error");
    assert!(
        err.message
            .starts_with("error creating bootstrap configuration for Connect proxy sidecar: failed fetch proxy config from local agent: ")
    );
    assert!(err.message.contains(&format!("(unknown service ID: {SIDECAR_ID})")), "{}", err.message);
    assert!(err.message.ends_with("; see: <https://www.nomadproject.io/s/envoy-bootstrap-error>"));
    let event = err.event.as_deref().expect("Nomad's hook event");
    assert_eq!(event.event_type, "Task hook failed");
    assert_eq!(event.message, format!("envoy_bootstrap: {}", err.message));
    assert!(!event.fails_task, "recoverable");
    // Waits of 10, 20 and 40 ms fit in 75 ms; the next (80) does not: four attempts.
    assert_eq!(gone.standin.calls_to("GET", "/v1/agent/service/").len(), 4);
    assert!(!bootstrap_path(gone.dir.path(), SIDECAR).exists());
}

#[test]
fn nomads_retry_schedule_doubles_from_a_second_within_a_minute() {
    let r = Retry::default();
    let waits: Vec<u64> = (1..=6).map(|a| r.wait(a, 0.0, Duration::ZERO).unwrap().as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32]);
    assert_eq!(r.wait(1, 1.0, Duration::ZERO), Some(Duration::from_millis(1500)), "up to 500 ms of jitter");
    assert_eq!(r.wait(6, 0.0, Duration::from_secs(31)), None, "31 s waited + 32 s > 60 s");
    assert_eq!(r.wait(40, 0.0, Duration::ZERO), None, "no overflow");
}

#[tokio::test]
async fn the_groups_consul_namespace_wins_over_the_agents() {
    let f = Fixture::new();
    f.register_sidecar().await;
    let hook = f.hook("agent-ns", fast());
    run(&hook, &alloc("bridge"), SIDECAR, f.dir.path()).await.unwrap();
    let mut a = alloc("bridge");
    let job = Arc::make_mut(a.job.as_mut().unwrap());
    job.task_groups[0].consul = Some(json!({"Namespace": "team"}));
    run(&hook, &a, SIDECAR, f.dir.path()).await.unwrap();
    let queries: Vec<String> = f.standin.calls_to("GET", "/v1/agent/service/").into_iter().map(|c| c.query).collect();
    assert_eq!(queries, ["ns=agent-ns", "ns=team"]);
}

#[tokio::test]
async fn a_gateway_is_its_kinds_cluster_and_host_mode_dials_consuls_grpc_port() {
    let f = Fixture::new();
    f.register_gateway().await;
    run(&f.hook("", fast()), &alloc("host"), GATEWAY, f.dir.path()).await.unwrap();
    let b = f.bootstrap(GATEWAY);
    assert_eq!(b["node"]["id"], GATEWAY_ID);
    assert_eq!(b["node"]["cluster"], "terminating-gateway", "Consul's -gateway default name");
    let tags = b["stats_config"]["stats_tags"].as_array().unwrap();
    assert!(tags.contains(&json!({"tag_name": "consul.source.service", "fixed_value": "tgw"})));
    assert_eq!(
        b["admin"]["address"]["socket_address"],
        json!({"address": "127.0.0.2", "port_value": 8443}),
        "host mode: the service's port"
    );
    let agent = &b["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
    assert_eq!(agent, &json!({"socket_address": {"address": "127.0.0.1", "port_value": 8502}}));
    assert_eq!(b["dynamic_resources"]["ads_config"]["grpc_services"]["initial_metadata"][0]["value"], "", "no ACLs: no token");
}

#[tokio::test]
async fn a_planted_symlink_is_not_written_through_and_unbuilt_config_is_named() {
    let f = Fixture::new();
    f.register_sidecar().await;
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "host file").unwrap();
    std::os::unix::fs::symlink(&victim, bootstrap_path(f.dir.path(), SIDECAR)).unwrap();
    let err = run(&f.hook("", fast()), &alloc("bridge"), SIDECAR, f.dir.path()).await.unwrap_err();
    assert!(err.message.starts_with("failed to create secrets/envoy_bootstrap.json for envoy: "), "{}", err.message);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file");

    let reg = ServiceRegistration {
        kind: "terminating-gateway".into(),
        id: GATEWAY_ID.into(),
        name: "tgw".into(),
        proxy: Some(typed(json!({"Config": {"envoy_prometheus_bind_addr": "0.0.0.0:9102"}}))),
        ..ServiceRegistration::default()
    };
    f.client.service_register(&reg).await.unwrap();
    let err = run(&f.hook("", fast()), &alloc("bridge"), GATEWAY, f.dir.path()).await.unwrap_err();
    assert!(!err.recoverable);
    assert!(err.message.contains("proxy config envoy_prometheus_bind_addr not supported"), "{}", err.message);
}

/// What the hook writes for a sidecar (bridge), a terminating gateway (bridge) and a gateway on
/// the host network passes real `envoy --mode validate`.
#[tokio::test]
async fn every_written_bootstrap_passes_envoy_validate() {
    nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Envoy);
    let envoy = nomad_testkit::prereq::envoy_binary().unwrap();
    let cases = [("sidecar-bridge", "bridge", SIDECAR), ("terminating-bridge", "bridge", GATEWAY), ("terminating-host", "host", GATEWAY)];
    for (name, mode, task) in cases {
        let f = Fixture::new();
        f.register_sidecar().await;
        f.register_gateway().await;
        run(&f.hook("", fast()), &alloc(mode), task, f.dir.path()).await.unwrap();
        let out =
            std::process::Command::new(&envoy).args(["--mode", "validate", "-c"]).arg(bootstrap_path(f.dir.path(), task)).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("OK"), "{name}: {text}");
        assert!(!text.to_lowercase().contains("deprecated"), "{name}: {text}");
    }
}

/// A Consul API shape from its JSON, as the agent answers it.
fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a Consul API shape")
}
