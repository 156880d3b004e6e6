//! The Consul fingerprint reaching the servers: attributes appear with Consul, change when it
//! is upgraded, and go away when it does (against the Consul stand-in).

use std::time::Duration;

use nomad_agent::client::Client;
use nomad_agent::config::consul::ConsulSettings;
use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_testkit::wait_until;

use crate::support::{TestServer, client_config, drivers, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_attributes_follow_consul_to_the_servers() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let mut config = client_config(root.path(), vec![server.addr()]);
    config.consul = Some(ConsulSettings { address: consul.addr().to_string(), ..ConsulSettings::default() });
    config.consul_fingerprint_interval = Duration::from_millis(100);
    let client = Client::start(config, drivers()).await.expect("client starts");
    wait_ready(&server, &client).await;
    let id = client.node_id().to_string();
    let attr = |k: &str| server.store().snapshot().node(&id).and_then(|n| n.attributes.get(k).cloned());

    // The first registration already carries them.
    let node = server.store().snapshot().node(&id).cloned().unwrap();
    assert_eq!(node.attributes.get("consul.version").map(String::as_str), Some("1.16.1"));
    assert_eq!(node.attributes.get("consul.datacenter").map(String::as_str), Some("dc1"));
    assert_eq!(node.attributes.get("unique.consul.name").map(String::as_str), Some("consul-standin"));
    assert_eq!(node.links.get("consul").map(String::as_str), Some("dc1.consul-standin"));

    consul.set_version("1.17.0");
    wait_until("the upgrade to reach the server", || attr("consul.version").as_deref() == Some("1.17.0")).await;

    consul.stop();
    wait_until("the consul attributes to leave the node", || {
        server
            .store()
            .snapshot()
            .node(&id)
            .is_some_and(|n| n.attributes.keys().all(|k| !k.contains("consul")) && !n.links.contains_key("consul"))
    })
    .await;
    assert!(attr("kernel.name").is_some(), "the other attributes stay");

    consul.restart().unwrap();
    wait_until("consul to come back", || attr("consul.version").as_deref() == Some("1.17.0")).await;
    assert!(consul.calls_to("GET", "/v1/agent/self").len() >= 3, "the fingerprint re-ran");
    client.shutdown().await;
}
