//! Nomad-native services: the client registers group services while the alloc runs and task
//! services while their task runs, removes them before the shutdown delay, and registers them
//! again after an agent restart, also when the servers come back only later.

use nomad_proto::job::JobType;
use nomad_proto::resources::AllocatedPortMapping;
use nomad_proto::{ClientStatus, Service, ServiceRegistration, TaskLifecycle};
use nomad_server::fsm::Command;

use nomad_agent::client::Client;

use crate::support::{TestServer, client_config, drivers, job, restart_policy, sh_task, start_client, wait_for, wait_ready, wait_until};

fn nomad_service(name: &str, port: &str) -> Service {
    Service {
        name: name.into(),
        port_label: port.into(),
        provider: "nomad".into(),
        tags: vec!["idx-${NOMAD_ALLOC_INDEX}".into(), "rack-${meta.rack}".into()],
        ..Service::default()
    }
}

/// A service job: group service `svcjob-web` on port `http`; main task `web`; a poststart task
/// `once` with service `once-svc` that exits when `<alloc dir>/go` appears.
fn service_job(shutdown_delay_ms: i64) -> nomad_proto::Job {
    let web = sh_task("web", "while true; do sleep 0.1; done");
    let mut once = sh_task("once", "while [ ! -f \"$NOMAD_ALLOC_DIR/go\" ]; do sleep 0.05; done");
    once.lifecycle = Some(TaskLifecycle { hook: "poststart".into(), sidecar: false });
    once.services = vec![nomad_service("once-svc", "http")];
    let mut j = job("svcjob", JobType::Service, vec![web, once], restart_policy(0, 0));
    j.task_groups[0].services = vec![nomad_service("${NOMAD_JOB_NAME}-web", "http"), nomad_service("consul-one", "http")];
    j.task_groups[0].services[1].provider = "consul".into();
    j.task_groups[0].shutdown_delay = Some(shutdown_delay_ms * 1_000_000);
    j.canonicalize();
    j
}

fn with_port(a: &mut nomad_proto::Allocation) {
    let res = a.allocated_resources.as_mut().unwrap();
    res.shared.ports = vec![AllocatedPortMapping { label: "http".into(), value: 24567, to: 0, host_ip: "127.0.0.1".into() }];
}

fn registrations(server: &TestServer) -> Vec<ServiceRegistration> {
    server.store().snapshot().service_registrations().map(|r| (**r).clone()).collect()
}

fn names(server: &TestServer) -> Vec<String> {
    let mut n: Vec<String> = registrations(server).into_iter().map(|r| r.service_name).collect();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_and_task_services_follow_the_alloc_and_its_tasks() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    // A shutdown delay long enough that "the task still runs" below cannot be missed on a loaded
    // machine, short enough to wait for the alloc to complete after it.
    let id = server.place_with(&service_job(10_000), client.node_id(), with_port).await;
    wait_until("both Nomad services are registered", || names(&server) == ["once-svc", "svcjob-web"]).await;
    let regs = registrations(&server);
    let web = regs.iter().find(|r| r.service_name == "svcjob-web").unwrap();
    assert_eq!(web.id, format!("_nomad-task-{id}-group-g-svcjob-web-http"));
    assert_eq!((web.address.as_str(), web.port), ("127.0.0.1", 24567));
    assert_eq!(web.tags, ["idx-0", "rack-r1"]);
    assert_eq!((web.node_id.as_str(), web.alloc_id.as_str(), web.job_id.as_str()), (client.node_id(), id.as_str(), "svcjob"));
    assert_eq!((web.namespace.as_str(), web.datacenter.as_str()), ("default", "dc1"));
    let once = regs.iter().find(|r| r.service_name == "once-svc").unwrap();
    assert_eq!(once.id, format!("_nomad-task-{id}-once-once-svc-http"));
    assert_eq!((once.address.as_str(), once.port), ("127.0.0.1", 24567));

    // The poststart task exits: its service goes, the group's stays.
    std::fs::write(root.path().join("alloc").join(&id).join("alloc/go"), "").unwrap();
    wait_until("the task's service is removed", || names(&server) == ["svcjob-web"]).await;
    let web_state = || client.alloc_runner(&id).unwrap().task("web").unwrap().state().state;
    assert_eq!(web_state(), "running");

    // Stopping the alloc removes the group service before the shutdown delay ends: once the
    // registrations are gone the task is still running (it is killed only after the delay).
    server.stop_alloc(&id).await;
    wait_until("every registration is removed", || registrations(&server).is_empty()).await;
    let web = client.alloc_runner(&id).unwrap().task("web").unwrap().state();
    let killing = web.events.iter().any(|e| e.event_type == nomad_proto::alloc::task_event::KILLING);
    assert!(web.state == "running" && !killing, "the services were removed before the delay ended and the kill began: {web:?}");
    wait_until("the alloc is complete", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Complete)).await;
    assert!(registrations(&server).is_empty());
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_registers_again_once_the_servers_are_back() {
    let mut server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let id = server.place_with(&service_job(0), client.node_id(), with_port).await;
    wait_until("both services are registered", || names(&server) == ["once-svc", "svcjob-web"]).await;

    // The agent stops (tasks keep running); the registrations are lost meanwhile; the servers
    // go away too.
    client.shutdown().await;
    drop(client);
    server.apply(Command::ServiceRegistrationDeleteByAlloc { alloc_ids: vec![id.clone()] }).await;
    assert!(registrations(&server).is_empty());
    let addr = server.addr();
    server.stop().await;

    // The restored agent cannot register while no server answers; its tasks keep running.
    let client = Client::start(client_config(root.path(), vec![addr]), drivers()).await.unwrap();
    let runner = wait_for("the alloc is restored", || client.alloc_runner(&id)).await;
    assert_eq!(runner.task("web").unwrap().state().state, "running");
    server.restart().await;
    wait_until("both services are registered again", || names(&server) == ["once-svc", "svcjob-web"]).await;
    let web = registrations(&server).into_iter().find(|r| r.service_name == "svcjob-web").unwrap();
    assert_eq!((web.address.as_str(), web.port), ("127.0.0.1", 24567));
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_down_with_its_alloc_kept_registers_its_services_again() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let node_id = client.node_id().to_string();
    let id = server.place_with(&service_job(0), &node_id, with_port).await;
    wait_until("both services are registered", || names(&server) == ["once-svc", "svcjob-web"]).await;

    // The servers gave the node up: `down` drops its registrations; its alloc is `unknown`
    // (a client back before the scheduler made it lost keeps it).
    server
        .apply(Command::NodeUpdateStatus {
            node_id: node_id.clone(),
            status: nomad_proto::NodeStatus::Down,
            event: None,
            updated_at: nomad_proto::Timestamp::now().unix_secs(),
            evals: vec![],
        })
        .await;
    assert!(registrations(&server).is_empty(), "a down node's registrations are removed");
    server
        .rewrite_alloc(&id, |a| {
            a.client_status = ClientStatus::Unknown;
            a.append_state(ClientStatus::Unknown, nomad_proto::Timestamp::now());
        })
        .await;

    // Its next heartbeat is answered `initializing`: the services come back with the alloc.
    wait_until("both services are registered again", || names(&server) == ["once-svc", "svcjob-web"]).await;
    wait_until("the node is ready again", || {
        server.store().snapshot().node(&node_id).is_some_and(|n| n.status == nomad_proto::NodeStatus::Ready)
    })
    .await;
    client.shutdown_destroying_allocs().await;
}
