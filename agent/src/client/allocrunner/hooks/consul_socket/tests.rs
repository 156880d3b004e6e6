use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::service::ConsulConnect;
use nomad_proto::{Allocation, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::client::connect::proxy::tests::alloc;

fn node(grpc: Option<&str>) -> NodeFn {
    let mut n = Node::default();
    if let Some(p) = grpc {
        n.attributes.insert("consul.grpc".into(), p.into());
    }
    let n = Arc::new(n);
    Arc::new(move || n.clone())
}

fn settings(address: &str, grpc_address: &str) -> ConsulSettings {
    ConsulSettings { address: address.into(), grpc_address: grpc_address.into(), ..ConsulSettings::default() }
}

fn native(mut a: Allocation) -> Allocation {
    let job = Arc::make_mut(a.job.as_mut().unwrap());
    job.task_groups[0].services = vec![nomad_proto::Service {
        name: "n".into(),
        connect: Some(ConsulConnect { native: true, ..ConsulConnect::default() }),
        ..Default::default()
    }];
    a
}

#[test]
fn only_bridge_groups_with_the_matching_connect_services_get_a_socket() {
    assert!(wants(Endpoint::Grpc, &alloc("bridge")));
    assert!(!wants(Endpoint::Http, &alloc("bridge")), "no native service");
    assert!(!wants(Endpoint::Grpc, &alloc("host")));
    assert!(!wants(Endpoint::Grpc, &alloc("cni/mynet")), "Nomad's tgFirstNetworkIsBridge");
    assert!(wants(Endpoint::Http, &native(alloc("bridge"))));
    assert!(!wants(Endpoint::Grpc, &native(alloc("bridge"))));
}

#[test]
fn the_grpc_destination_is_the_configured_one_else_consuls_host_with_the_fingerprinted_port() {
    let n = |p: Option<&str>| (node(p))();
    assert_eq!(destination(Endpoint::Grpc, &settings("10.0.0.5:8500", "10.0.0.6:9502"), &n(Some("8503"))).unwrap(), "10.0.0.6:9502");
    assert_eq!(destination(Endpoint::Grpc, &settings("10.0.0.5:8500", ""), &n(Some("8503"))).unwrap(), "10.0.0.5:8503");
    assert_eq!(destination(Endpoint::Grpc, &settings("10.0.0.5:8500", ""), &n(None)).unwrap(), "10.0.0.5:8502");
    assert_eq!(destination(Endpoint::Grpc, &settings("[::1]:8500", ""), &n(Some("-1"))).unwrap(), "[::1]:8502", "gRPC off in Consul");
    assert_eq!(destination(Endpoint::Http, &settings("10.0.0.5:8500", "x:1"), &n(None)).unwrap(), "10.0.0.5:8500");
    assert_eq!(destination(Endpoint::Http, &settings("", ""), &n(None)).unwrap_err(), "consul address must be set on nomad client");
}

async fn echo_server() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                if let Ok(n) = s.read(&mut buf).await {
                    let _ = s.write_all(&[b"consul:", &buf[..n]].concat()).await;
                }
            });
        }
    });
    addr
}

async fn ask(path: &std::path::Path) -> Vec<u8> {
    let mut c = tokio::net::UnixStream::connect(path).await.unwrap();
    c.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 11];
    tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut got)).await.unwrap().unwrap();
    got.to_vec()
}

fn alloc_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("alloc/tmp")).unwrap();
    dir
}

#[tokio::test]
async fn the_socket_reaches_consul_is_removed_at_postrun_and_made_again_by_a_restarted_agent() {
    let dir = alloc_dir();
    let consul = echo_server().await;
    let a = alloc("bridge");
    let req = AllocHookRequest { alloc: &a, alloc_dir: dir.path(), previous: None };
    let hook = ConsulSocketHook::new(Endpoint::Grpc, Some(settings("127.0.0.1:1", &consul)), node(None), CancellationToken::new());
    assert_eq!(hook.name(), "consul_grpc_socket");
    assert_eq!(PrerunHook::prerun(&hook, &req).await.unwrap(), None, "never done: a restarted agent serves it again");
    let sock = dir.path().join("alloc/tmp/consul_grpc.sock");
    assert!(std::fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
    assert_eq!(ask(&sock).await, b"consul:ping");

    // The agent goes away (its proxy with it); the socket file stays behind.
    let agent_shutdown = CancellationToken::new();
    let before = ConsulSocketHook::new(Endpoint::Grpc, Some(settings("127.0.0.1:1", &consul)), node(None), agent_shutdown.clone());
    PostrunHook::postrun(&hook, &req).unwrap();
    assert!(!sock.exists(), "postrun removes it");
    PrerunHook::prerun(&before, &req).await.unwrap();
    agent_shutdown.cancel();
    let refused = wait_for(|| std::os::unix::net::UnixStream::connect(&sock).is_err()).await;
    assert!(refused, "the stopped agent's socket answers no more");
    assert!(sock.exists());
    let restarted = ConsulSocketHook::new(Endpoint::Grpc, Some(settings("127.0.0.1:1", &consul)), node(None), CancellationToken::new());
    PrerunHook::prerun(&restarted, &req).await.unwrap();
    assert_eq!(ask(&sock).await, b"consul:ping", "the restarted agent serves the same path");

    // Stopped for good: an update does not start it again.
    PostrunHook::postrun(&restarted, &req).unwrap();
    UpdateHook::update(&restarted, &req).unwrap();
    assert!(!sock.exists());
}

#[tokio::test]
async fn a_group_without_connect_in_bridge_mode_gets_no_socket_and_an_update_adding_one_does() {
    let dir = alloc_dir();
    let consul = echo_server().await;
    let hook = ConsulSocketHook::new(Endpoint::Http, Some(settings(&consul, "")), node(None), CancellationToken::new());
    let plain = alloc("bridge");
    PrerunHook::prerun(&hook, &AllocHookRequest { alloc: &plain, alloc_dir: dir.path(), previous: None }).await.unwrap();
    let sock = dir.path().join("alloc/tmp/consul_http.sock");
    assert!(!sock.exists());
    let with_native = native(alloc("bridge"));
    UpdateHook::update(&hook, &AllocHookRequest { alloc: &with_native, alloc_dir: dir.path(), previous: None }).unwrap();
    assert_eq!(ask(&sock).await, b"consul:ping");
    PostrunHook::postrun(&hook, &AllocHookRequest { alloc: &with_native, alloc_dir: dir.path(), previous: None }).unwrap();
}

async fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}
