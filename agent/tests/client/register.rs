//! Registration: the node's identity, fingerprint and readiness.

use nomad_proto::NodeStatus;

use crate::support::{TestServer, start_client, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registers_with_its_fingerprint_and_becomes_ready() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let node = server.store().snapshot().node(client.node_id()).cloned().unwrap();
    assert_eq!(node.status, NodeStatus::Ready);
    assert_eq!(node.name, "test-node");
    assert_eq!(node.http_addr, "127.0.0.1:4646");
    assert_eq!(node.node_class, "test");
    assert_eq!(node.meta.get("rack").map(String::as_str), Some("r1"));
    for attr in [
        "kernel.name",
        "cpu.numcores",
        "cpu.totalcompute",
        "memory.totalbytes",
        "unique.storage.bytesfree",
        "unique.hostname",
        "nomad.version",
        "driver.raw_exec",
    ] {
        assert!(node.attributes.contains_key(attr), "attribute {attr} missing: {:?}", node.attributes.keys());
    }
    assert_eq!(node.attributes["nomad.version"], nomad_server::http::API_VERSION);
    assert!(node.drivers["raw_exec"].healthy);
    let res = node.node_resources.as_ref().unwrap();
    assert!(res.cpu.cpu_shares > 0 && res.memory.memory_mb > 0);
    assert_eq!((res.min_dynamic_port, res.max_dynamic_port), (20000, 32000));
    client.shutdown().await;
    drop(client);

    // The identity is kept: a restarted client is the same node.
    let id = node.id.clone();
    let client = start_client(root.path(), &server).await;
    assert_eq!(client.node_id(), id);
    assert_eq!(server.store().snapshot().nodes().count(), 1);
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_servers_forgot_registers_again() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let registrations = client.stats().registrations;

    server.apply(nomad_server::fsm::Command::NodeDeregister { node_ids: vec![client.node_id().to_string()], evals: vec![] }).await;
    assert!(server.store().snapshot().node(client.node_id()).is_none());
    crate::support::wait_until("the client registered again", || client.stats().registrations > registrations).await;
    wait_ready(&server, &client).await;
    client.shutdown().await;
}
