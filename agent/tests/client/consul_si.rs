//! Consul Service Identity tokens end to end, against the Consul stand-in with ACLs on: a real
//! server (Raft, `Node.DeriveSIToken`, the revoker) and a real client (the `consul_si_token`
//! hook) running raw_exec tasks. Jobs carry Connect task kinds directly (the job mutator that
//! injects sidecars, and the admission entries for Connect, belong to the next issue).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use nomad_agent::client::Client;
use nomad_agent::config::consul::ConsulSettings;
use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_proto::job::JobType;
use nomad_proto::service::{ConsulConnect, ConsulSidecarService, Service};
use nomad_proto::{ClientStatus, Job};

use crate::support::{TestServer, client_config, drivers, job, restart_policy, sh_task, task_pid, wait_ready, wait_until};

const ROOT: &str = "root-token";

fn settings(consul: &ConsulStandIn, token: &str) -> ConsulSettings {
    ConsulSettings { address: consul.addr().to_string(), token: token.into(), timeout: Duration::from_secs(5), ..ConsulSettings::default() }
}

/// Group service `web` with a sidecar; tasks: the sidecar (`connect-proxy:web`), a native task
/// (`connect-native:api`) that writes its `CONSUL_HTTP_TOKEN` into its local dir, and a plain one.
fn connect_job() -> Job {
    let mut sidecar = sh_task("connect-proxy-web", "while true; do sleep 0.1; done");
    sidecar.kind = "connect-proxy:web".into();
    let mut native = sh_task("native", "printf %s \"$CONSUL_HTTP_TOKEN\" > local/token; while true; do sleep 0.1; done");
    native.kind = "connect-native:api".into();
    let plain = sh_task("plain", "printf %s \"${CONSUL_HTTP_TOKEN:-none}\" > local/token; while true; do sleep 0.1; done");
    let mut j = job("shop", JobType::Service, vec![sidecar, native, plain], restart_policy(0, 0));
    j.task_groups[0].services = vec![Service {
        name: "web".into(),
        provider: "nomad".into(),
        port_label: "9090".into(),
        connect: Some(ConsulConnect { sidecar_service: Some(ConsulSidecarService::default()), ..ConsulConnect::default() }),
        ..Service::default()
    }];
    j.canonicalize();
    j
}

async fn start(root: &Path, server: &TestServer, consul: &ConsulStandIn, token: &str) -> Client {
    let mut config = client_config(root, vec![server.addr()]);
    config.consul = Some(settings(consul, token));
    let client = Client::start(config, drivers()).await.expect("client starts");
    wait_ready(server, &client).await;
    client
}

/// The sidecar's registration, as the client's Consul services sync makes it: the sidecar's
/// `envoy_bootstrap` hook waits for it before the task starts.
fn register_sidecar(consul: &ConsulStandIn, alloc: &str, token: &str) {
    let body = serde_json::json!({"Name": "web", "ID": format!("_nomad-task-{alloc}-group-g-web-9090"), "Port": 9090,
        "Connect": {"SidecarService": {}}});
    let r = nomad_e2e::http::HttpClient::new(&consul.addr().to_string())
        .request("PUT", &format!("/v1/agent/service/register?token={token}"), Some(body.to_string().as_bytes()))
        .expect("the stand-in answers");
    assert_eq!(r.status, 200, "{}", r.text());
}

fn token_file(root: &Path, alloc: &str, task: &str) -> std::path::PathBuf {
    root.join("alloc").join(alloc).join(task).join("secrets/si_token")
}

fn running(client: &Client, alloc: &str, tasks: &[&str]) -> bool {
    tasks.iter().all(|t| task_pid(client, alloc, t).is_some())
}

/// `GET /v1/acl/token/self` as `token`: (status, body).
fn token_self(consul: &ConsulStandIn, token: &str) -> (u16, String) {
    let r = nomad_e2e::http::HttpClient::new(&consul.addr().to_string())
        .request("GET", &format!("/v1/acl/token/self?token={token}"), None)
        .expect("the stand-in answers");
    (r.status, r.text())
}

/// The descriptions of the tokens created so far.
fn si_tokens(consul: &ConsulStandIn) -> Vec<String> {
    consul.calls_to("PUT", "/v1/acl/token").iter().map(|call| call.json()["Description"].as_str().unwrap_or_default().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_per_connect_task_0440_reused_after_an_agent_restart_and_revoked_when_the_alloc_stops() {
    let consul = ConsulStandIn::start(ConsulOptions { management_token: Some(ROOT.into()), ..Default::default() }).unwrap();
    let server = TestServer::start_with_consul(&settings(&consul, ROOT)).await;
    let root = tempfile::tempdir().unwrap();
    let client = start(root.path(), &server, &consul, ROOT).await;
    let id = server.place(&connect_job(), client.node_id()).await;
    register_sidecar(&consul, &id, ROOT);
    let tasks = ["connect-proxy-web", "native", "plain"];
    wait_until("every task runs", || running(&client, &id, &tasks)).await;

    // One token per Connect task, none for the plain one, each 0440 in secrets/.
    let created = si_tokens(&consul);
    assert_eq!(created.len(), 2, "{created:?}");
    let snap = server.store().snapshot();
    let cluster = snap.cluster_metadata().unwrap().cluster_id.clone();
    for task in ["connect-proxy-web", "native"] {
        assert!(created.contains(&format!("_nomad_si [{cluster}] [{id}] [{task}]")), "{task}: {created:?}");
        let meta = std::fs::metadata(token_file(root.path(), &id, task)).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o440, "{task}");
    }
    assert!(!token_file(root.path(), &id, "plain").exists());
    let sidecar_token = std::fs::read_to_string(token_file(root.path(), &id, "connect-proxy-web")).unwrap();
    let native_token = std::fs::read_to_string(token_file(root.path(), &id, "native")).unwrap();
    assert_ne!(sidecar_token, native_token);
    // The sidecar's Envoy presents its SI token to Consul's xDS.
    let bootstrap = root.path().join("alloc").join(&id).join("connect-proxy-web/secrets/envoy_bootstrap.json");
    let bootstrap: serde_json::Value = serde_json::from_slice(&std::fs::read(bootstrap).unwrap()).unwrap();
    assert_eq!(bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]["initial_metadata"][0]["value"], sidecar_token.as_str());
    // The token is Consul's: it resolves to the service identity, not the sidecar's name.
    let (status, body) = token_self(&consul, &native_token);
    assert_eq!(status, 200, "{body}");
    let me: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(me["ServiceIdentities"], serde_json::json!([{"ServiceName": "api"}]));
    assert_eq!(me["Local"], true);
    // CONSUL_HTTP_TOKEN for the native task only.
    let native_env = root.path().join("alloc").join(&id).join("native/local/token");
    wait_until("the native task wrote its env", || std::fs::read_to_string(&native_env).is_ok_and(|t| !t.is_empty())).await;
    assert_eq!(std::fs::read_to_string(&native_env).unwrap(), native_token);
    let plain_env = root.path().join("alloc").join(&id).join("plain/local/token");
    wait_until("the plain task wrote its env", || std::fs::read_to_string(&plain_env).is_ok_and(|t| !t.is_empty())).await;
    assert_eq!(std::fs::read_to_string(&plain_env).unwrap(), "none");
    let accessors: Vec<String> = snap.si_token_accessors_by_alloc(&id).map(|a| a.task_name.clone()).collect();
    assert_eq!(accessors.len(), 2);

    // The agent restarts; the tasks keep running and keep their tokens: nothing new is derived.
    let pid = task_pid(&client, &id, "native").unwrap();
    client.shutdown().await;
    drop(client);
    let client = start(root.path(), &server, &consul, ROOT).await;
    wait_until("tasks reattached", || running(&client, &id, &tasks)).await;
    assert_eq!(task_pid(&client, &id, "native"), Some(pid), "reattached, not restarted");
    assert_eq!(std::fs::read_to_string(token_file(root.path(), &id, "native")).unwrap(), native_token);
    assert_eq!(si_tokens(&consul).len(), 2, "no token derived again");

    // Consul goes away; the alloc is stopped; the client reports it complete. The revoker
    // cannot revoke yet and keeps the accessors; once Consul is back, both tokens go.
    consul.stop();
    server.stop_alloc(&id).await;
    wait_until("the client finished the alloc", || server.alloc(&id).is_some_and(|a| a.client_status == ClientStatus::Complete)).await;
    assert_eq!(server.store().snapshot().si_token_accessors_by_alloc(&id).count(), 2, "kept while Consul is down");
    consul.restart().unwrap();
    wait_until("the tokens are revoked and their accessors purged", || {
        server.store().snapshot().si_token_accessors_by_alloc(&id).count() == 0
    })
    .await;
    let deleted: Vec<String> = consul.calls_to("DELETE", "/v1/acl/token/").iter().map(|c| c.path.clone()).collect();
    assert_eq!(deleted.len(), 2, "{deleted:?}");
    for token in [&sidecar_token, &native_token] {
        assert_eq!(token_self(&consul, token), (403, "ACL not found".to_string()), "a revoked token is unknown to Consul");
    }
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_consul_token_the_agent_derives_nothing() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start_with_consul(&settings(&consul, "")).await;
    let root = tempfile::tempdir().unwrap();
    let client = start(root.path(), &server, &consul, "").await;
    let id = server.place(&connect_job(), client.node_id()).await;
    register_sidecar(&consul, &id, "");
    wait_until("every task runs", || running(&client, &id, &["connect-proxy-web", "native", "plain"])).await;
    assert!(!token_file(root.path(), &id, "connect-proxy-web").exists());
    assert!(consul.calls_to("PUT", "/v1/acl/token").is_empty());
    let native_env = root.path().join("alloc").join(&id).join("native/local/token");
    wait_until("the native task wrote its env", || std::fs::read_to_string(&native_env).is_ok()).await;
    assert_eq!(std::fs::read_to_string(&native_env).unwrap(), "", "no CONSUL_HTTP_TOKEN without a token file");
    client.shutdown().await;
}
