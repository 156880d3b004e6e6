//! Consul services (the default provider) against the Consul stand-in: the client registers an
//! alloc's group and task services with Nomad's payload, removes them when the alloc stops,
//! repairs drift, leaves entries it does not own alone, and registers everything again after
//! Consul lost its state, without touching the tasks; Connect sidecars live and go with their
//! service; Consul checks decide an alloc's health as `on_update` says.

use std::collections::BTreeMap;
use std::time::Duration;

use nomad_agent::client::Client;
use nomad_agent::client::consul::{ConsulApi, ConsulClient, ServiceRegistration as ConsulReg};
use nomad_agent::config::consul::ConsulSettings;
use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_proto::job::{JobType, MigrateStrategy};
use nomad_proto::resources::{AllocatedPortMapping, NetworkResource, Port};
use nomad_proto::service::{ConsulConnect, ConsulProxy, ConsulSidecarService, ConsulUpstream, Service, ServiceCheck};
use serde_json::Value;

use crate::support::{TestServer, client_config, drivers, job, restart_policy, sh_task, task_pid, wait_ready, wait_until};

/// A job with group service `web` (an http check and a tcp check on port `http`) and task
/// service `api-${NOMAD_TASK_NAME}` of task `server`.
fn consul_job() -> nomad_proto::Job {
    let mut server = sh_task("server", "while true; do sleep 0.1; done");
    server.services =
        vec![Service { name: "api-${NOMAD_TASK_NAME}".into(), port_label: "http".into(), tags: vec!["v1".into()], ..Service::default() }];
    let mut j = job("cjob", JobType::Service, vec![server], restart_policy(0, 0));
    j.task_groups[0].services = vec![Service {
        name: "web".into(),
        port_label: "http".into(),
        tags: vec!["idx-${NOMAD_ALLOC_INDEX}".into()],
        meta: BTreeMap::from([("team".into(), "edge".into())]),
        checks: vec![
            ServiceCheck {
                name: "alive".into(),
                check_type: "http".into(),
                path: "/health".into(),
                interval: 10_000_000_000,
                timeout: 2_000_000_000,
                ..ServiceCheck::default()
            },
            ServiceCheck {
                name: "port".into(),
                check_type: "tcp".into(),
                interval: 5_000_000_000,
                timeout: 1_000_000_000,
                ..ServiceCheck::default()
            },
        ],
        ..Service::default()
    }];
    j.canonicalize();
    j
}

fn with_port(a: &mut nomad_proto::Allocation) {
    let res = a.allocated_resources.as_mut().unwrap();
    res.shared.ports = vec![AllocatedPortMapping { label: "http".into(), value: 24600, to: 0, host_ip: "127.0.0.1".into() }];
}

async fn start(consul: &ConsulStandIn, server: &TestServer, root: &std::path::Path) -> Client {
    let mut config = client_config(root, vec![server.addr()]);
    config.consul = Some(ConsulSettings { address: consul.addr().to_string(), ..ConsulSettings::default() });
    config.consul_sync_interval = Duration::from_millis(200);
    config.consul_deregister_probation = Duration::ZERO;
    let client = Client::start(config, drivers()).await.expect("client starts");
    wait_ready(server, &client).await;
    client
}

/// The last registration body sent for `id`.
fn last_registration(consul: &ConsulStandIn, id: &str) -> Value {
    consul
        .calls_to("PUT", "/v1/agent/service/register")
        .iter()
        .map(|c| c.json())
        .rfind(|b| b["ID"] == id)
        .unwrap_or_else(|| panic!("no registration of {id}"))
}

fn direct(consul: &ConsulStandIn) -> ConsulClient {
    ConsulClient::new(&ConsulSettings { address: consul.addr().to_string(), ..ConsulSettings::default() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_and_task_services_are_registered_with_nomads_payload_and_removed_on_stop() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start(&consul, &server, root.path()).await;
    let id = server.place_with(&consul_job(), client.node_id(), with_port).await;
    let group_id = format!("_nomad-task-{id}-group-g-web-http");
    let task_id = format!("_nomad-task-{id}-server-api-server-http");
    wait_until("both services are in Consul", || consul.has_service(&group_id) && consul.has_service(&task_id)).await;

    let g = last_registration(&consul, &group_id);
    assert_eq!(g["Name"], "web");
    assert_eq!(g["Tags"], serde_json::json!(["idx-0"]));
    assert_eq!((g["Address"].as_str(), g["Port"].as_i64()), (Some("127.0.0.1"), Some(24600)));
    assert_eq!(g["Meta"], serde_json::json!({"external-source": "nomad", "team": "edge"}));
    let checks = g["Checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0]["Name"], "alive");
    assert_eq!(checks[0]["HTTP"], "http://127.0.0.1:24600/health");
    assert_eq!((checks[0]["Interval"].as_str(), checks[0]["Timeout"].as_str()), (Some("10s"), Some("2s")));
    assert!(checks[0]["CheckID"].as_str().unwrap().starts_with("_nomad-check-"));
    assert_eq!(checks[1]["TCP"], "127.0.0.1:24600");
    let t = last_registration(&consul, &task_id);
    assert_eq!((t["Name"].as_str(), t["Tags"].clone()), (Some("api-server"), serde_json::json!(["v1"])));

    // Consul lists the checks under the service, and runs them (nothing listens: critical).
    let check_id = checks[0]["CheckID"].as_str().unwrap().to_string();
    let listed = direct(&consul).checks().await.unwrap();
    assert_eq!(listed[&check_id].service_id, group_id);

    server.stop_alloc(&id).await;
    wait_until("both services leave Consul", || !consul.has_service(&group_id) && !consul.has_service(&task_id)).await;
    assert!(consul.check_status(&check_id).is_none(), "the checks went with the service");
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_repaired_and_foreign_entries_are_left_alone() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let api = direct(&consul);
    let foreign = ConsulReg { id: "redis-1".into(), name: "redis".into(), port: 6379, ..ConsulReg::default() };
    let orphan = ConsulReg { id: "_nomad-task-gone-group-g-old-http".into(), name: "old".into(), port: 1, ..ConsulReg::default() };
    let agent_own = ConsulReg { id: "_nomad-client-abcdef".into(), name: "nomad-client".into(), port: 4646, ..ConsulReg::default() };
    for r in [&foreign, &orphan, &agent_own] {
        api.service_register(r).await.unwrap();
    }
    let client = start(&consul, &server, root.path()).await;
    let id = server.place_with(&consul_job(), client.node_id(), with_port).await;
    let group_id = format!("_nomad-task-{id}-group-g-web-http");
    wait_until("the group service is in Consul", || consul.has_service(&group_id)).await;
    wait_until("the orphaned Nomad service is removed", || !consul.has_service(&orphan.id)).await;

    // Deleted behind our back: it comes back with the periodic reconcile.
    let registrations_of =
        |sid: &str| consul.calls_to("PUT", "/v1/agent/service/register").iter().filter(|c| c.json()["ID"] == sid).count();
    let before = registrations_of(&group_id);
    api.service_deregister(&group_id).await.unwrap();
    wait_until("the deleted service comes back", || registrations_of(&group_id) > before && consul.has_service(&group_id)).await;

    // Changed behind our back: the reconcile puts Nomad's version back.
    let mut drifted = ConsulReg { id: group_id.clone(), name: "web".into(), port: 1, address: "127.0.0.1".into(), ..ConsulReg::default() };
    drifted.meta.insert("external-source".into(), "nomad".into());
    api.service_register(&drifted).await.unwrap();
    wait_until("the drifted service is repaired", || {
        consul.calls_to("PUT", "/v1/agent/service/register").last().is_some_and(|c| c.json()["ID"] == group_id && c.json()["Port"] == 24600)
    })
    .await;
    assert!(consul.has_service(&foreign.id), "a foreign service is left alone");
    assert!(consul.has_service(&agent_own.id), "the agent's own registration is left alone");
    assert!(consul.calls_to("PUT", "/v1/agent/service/deregister/redis-1").is_empty());
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_that_lost_its_state_gets_everything_back_and_tasks_are_untouched() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start(&consul, &server, root.path()).await;
    let id = server.place_with(&consul_job(), client.node_id(), with_port).await;
    let group_id = format!("_nomad-task-{id}-group-g-web-http");
    let task_id = format!("_nomad-task-{id}-server-api-server-http");
    wait_until("both services are in Consul", || consul.has_service(&group_id) && consul.has_service(&task_id)).await;
    let pid = task_pid(&client, &id, "server").expect("the task runs");

    // Consul goes away for several sync periods, then comes back empty.
    consul.stop();
    consul.forget_services();
    let sync = client.consul_services().expect("consul is configured");
    let mut passes = sync.passes();
    // A pass under way when Consul stopped may still succeed: passes run one after another, so
    // every pass after the next one to end started with Consul gone.
    let stopped_at = *passes.borrow_and_update();
    passes.wait_for(|n| *n > stopped_at).await.unwrap();
    let down_from = *passes.borrow_and_update();
    let synced_before = *sync.synced().borrow();
    // Two passes fail while Consul is away; nothing else happens to the alloc.
    passes.wait_for(|n| *n >= down_from + 2).await.unwrap();
    assert_eq!(*sync.synced().borrow(), synced_before, "no pass succeeded while Consul was away");
    consul.restart().unwrap();
    wait_until("both services are registered again", || consul.has_service(&group_id) && consul.has_service(&task_id)).await;
    wait_until("a pass succeeds again", || *sync.synced().borrow() > synced_before).await;
    let state = client.alloc_runner(&id).unwrap().task("server").unwrap().state();
    assert_eq!(state.state, "running");
    assert_eq!(state.restarts, 0, "the task was not restarted");
    assert_eq!(task_pid(&client, &id, "server"), Some(pid), "the same process runs");
    client.shutdown().await;
}

/// An alloc with one host network carrying `ports` (label, value), as the scheduler places a
/// Connect group (the job mutator's `connect-proxy-<service>` port included).
fn with_network(ports: &'static [(&'static str, i64)]) -> impl FnOnce(&mut nomad_proto::Allocation) {
    move |a| {
        let res = a.allocated_resources.as_mut().unwrap();
        res.shared.ports = ports
            .iter()
            .map(|(l, v)| AllocatedPortMapping { label: (*l).into(), value: *v, to: *v, host_ip: "127.0.0.1".into() })
            .collect();
        res.shared.networks = vec![NetworkResource {
            ip: "127.0.0.1".into(),
            dynamic_ports: ports.iter().map(|(l, v)| Port { label: (*l).into(), value: *v, to: *v, ..Port::default() }).collect(),
            ..NetworkResource::default()
        }];
    }
}

/// A group service with a Connect sidecar: registered with Nomad's `Connect.SidecarService`,
/// Consul's `-sidecar-proxy` kept through every sync pass, and both removed (sidecar first)
/// when the alloc stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_sidecar_is_registered_kept_through_syncs_and_removed_with_its_service() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start(&consul, &server, root.path()).await;
    let mut j = job("mesh", JobType::Service, vec![sh_task("server", "while true; do sleep 0.1; done")], restart_policy(0, 0));
    let proxy = ConsulProxy {
        upstreams: vec![ConsulUpstream { destination_name: "db".into(), local_bind_port: 5432, ..ConsulUpstream::default() }],
        ..ConsulProxy::default()
    };
    j.task_groups[0].services = vec![Service {
        name: "api".into(),
        port_label: "http".into(),
        connect: Some(ConsulConnect {
            sidecar_service: Some(ConsulSidecarService { proxy: Some(proxy), ..ConsulSidecarService::default() }),
            ..ConsulConnect::default()
        }),
        ..Service::default()
    }];
    j.canonicalize();
    let id = server.place_with(&j, client.node_id(), with_network(&[("http", 24610), ("connect-proxy-api", 24611)])).await;
    let parent = format!("_nomad-task-{id}-group-g-api-http");
    let sidecar = format!("{parent}-sidecar-proxy");
    wait_until("the service and its sidecar are in Consul", || consul.has_service(&parent) && consul.has_service(&sidecar)).await;
    let body = last_registration(&consul, &parent);
    let sc = &body["Connect"]["SidecarService"];
    assert_eq!((sc["Address"].as_str(), sc["Port"].as_i64()), (Some("127.0.0.1"), Some(24611)));
    assert_eq!(sc["Proxy"]["Config"]["bind_port"], 24611);
    assert_eq!(sc["Proxy"]["Upstreams"][0]["DestinationName"], "db");
    assert_eq!(sc["Checks"][1]["TCP"], "127.0.0.1:24611");

    // Several passes later the sidecar is still there, never deregistered nor re-registered.
    let sync = client.consul_services().expect("consul is configured");
    let mut passes = sync.synced();
    let now = *passes.borrow_and_update();
    passes.wait_for(|n| *n >= now + 3).await.unwrap();
    assert!(consul.has_service(&sidecar));
    assert!(consul.calls_to("PUT", "/v1/agent/service/deregister/").is_empty());
    assert_eq!(consul.calls_to("PUT", "/v1/agent/service/register").len(), 1, "one registration, no drift seen");

    server.stop_alloc(&id).await;
    wait_until("the service and its sidecar leave Consul", || !consul.has_service(&parent) && !consul.has_service(&sidecar)).await;
    let order: Vec<String> =
        consul.calls_to("PUT", "/v1/agent/service/deregister/").iter().map(|c| c.path.rsplit('/').next().unwrap().to_string()).collect();
    assert_eq!(order, [sidecar, parent], "the sidecar first, as Nomad removes them");
    client.shutdown().await;
}

/// Health (`migrate`, health_check = "checks"): an alloc is healthy only once its Consul checks
/// pass; `on_update = "ignore"` leaves a failing check out, `"require_healthy"` keeps the alloc
/// from being healthy until the deadline; `health_check = "task_states"` ignores checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_checks_decide_alloc_health_as_on_update_says() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start(&consul, &server, root.path()).await;
    // Something listens on one port; nothing on the other.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().port() as i64;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port() as i64
    };
    let health_job = |name: &str, on_update: &str, health_check: &str| {
        let mut j = job(name, JobType::Service, vec![sh_task("server", "while true; do sleep 0.1; done")], restart_policy(0, 0));
        j.task_groups[0].migrate = Some(MigrateStrategy {
            max_parallel: 1,
            health_check: health_check.into(),
            min_healthy_time: 300_000_000,
            healthy_deadline: 4_000_000_000,
        });
        j.task_groups[0].services = vec![Service {
            name: name.into(),
            port_label: "http".into(),
            on_update: on_update.into(),
            checks: vec![ServiceCheck {
                name: "port".into(),
                check_type: "tcp".into(),
                interval: 1_000_000_000,
                timeout: 1_000_000_000,
                ..ServiceCheck::default()
            }],
            ..Service::default()
        }];
        j.canonicalize();
        j
    };
    let on = |port: i64| {
        move |a: &mut nomad_proto::Allocation| {
            a.allocated_resources.as_mut().unwrap().shared.ports =
                vec![AllocatedPortMapping { label: "http".into(), value: port, to: 0, host_ip: "127.0.0.1".into() }];
        }
    };
    let passing = server.place_with(&health_job("passing", "require_healthy", "checks"), client.node_id(), on(open)).await;
    let failing = server.place_with(&health_job("failing", "require_healthy", "checks"), client.node_id(), on(closed)).await;
    let ignored = server.place_with(&health_job("ignored", "ignore", "checks"), client.node_id(), on(closed)).await;
    let tasks_only = server.place_with(&health_job("tasks", "require_healthy", "task_states"), client.node_id(), on(closed)).await;
    let verdict =
        |id: &str| server.alloc(id).and_then(|a| a.deployment_status).and_then(|d| d.get("Healthy").and_then(serde_json::Value::as_bool));
    wait_until("every alloc has a verdict", || [&passing, &failing, &ignored, &tasks_only].iter().all(|id| verdict(id).is_some())).await;
    assert_eq!(verdict(&passing), Some(true), "its check passes");
    assert_eq!(verdict(&failing), Some(false), "its check never passes: unhealthy at the deadline");
    assert_eq!(verdict(&ignored), Some(true), "on_update = ignore leaves the failing check out");
    assert_eq!(verdict(&tasks_only), Some(true), "task_states does not look at checks");
    let check_id = |id: &str| last_registration(&consul, &format!("_nomad-task-{id}-group-g-failing-http"))["Checks"][0]["CheckID"].clone();
    assert_eq!(consul.check_status(check_id(&failing).as_str().unwrap()).as_deref(), Some("critical"));
    drop(listener);
    client.shutdown().await;
}
