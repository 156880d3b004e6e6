//! What one client heartbeat (`Node.UpdateStatus`) costs over the RPC port, as a client agent
//! makes it: registers a node of its own with the server at `--addr`, then sends `--count`
//! heartbeats one after another over the client's cached channel, and prints
//! `<p50> <p99>` in µs. With `--ca --cert --key` it dials with mutual TLS (`tls { rpc = true,
//! verify_server_hostname = true }`) as a client agent with a `client.<region>.nomad`
//! certificate does. Run by `scripts/bench-http`, which compares it against the plain port.

use std::time::{Duration, Instant};

use nomad_agent::client::servers::Servers;
use nomad_agent::tls::{TlsBlock, TlsSettings};
use nomad_proto::NodeStatus;
use nomad_proto::rpc::{NodeRegisterRequest, NodeUpdateStatusRequest};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = arg(&args, "--addr").expect("--addr host:port");
    let count: usize = arg(&args, "--count").map_or(2000, |c| c.parse().expect("--count N"));
    if let (Some(ca), Some(cert), Some(key)) = (arg(&args, "--ca"), arg(&args, "--cert"), arg(&args, "--key")) {
        let block = TlsBlock {
            rpc: Some(true),
            ca_file: Some(ca),
            cert_file: Some(cert),
            key_file: Some(key),
            verify_server_hostname: Some(true),
            ..TlsBlock::default()
        };
        let settings = TlsSettings::resolve(Some(block)).unwrap_or_else(|(k, m)| panic!("tls.{k}: {m}"));
        let tls = settings.rpc_tls("global").expect("rpc tls").expect("rpc on");
        nomad_server::rpc_tls::install(tls);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let servers = Servers::new(vec![addr]);
        let mut node = nomad_server::testing::node(&uuid::Uuid::new_v4().to_string());
        node.secret_id = uuid::Uuid::new_v4().to_string();
        node.datacenter = "bench-none".into();
        let (node_id, secret_id) = (node.id.clone(), node.secret_id.clone());
        let reg = NodeRegisterRequest { node, region: "global".into() };
        servers.node(Duration::from_secs(10), |mut c| async move { c.register(reg).await }).await.expect("Node.Register");
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            let req = NodeUpdateStatusRequest {
                node_id: node_id.clone(),
                secret_id: secret_id.clone(),
                status: NodeStatus::Ready,
                ..NodeUpdateStatusRequest::default()
            };
            let t0 = Instant::now();
            servers.node(Duration::from_secs(10), |mut c| async move { c.update_status(req).await }).await.expect("Node.UpdateStatus");
            times.push(t0.elapsed().as_micros());
        }
        times.sort_unstable();
        println!("{} {}", times[times.len() / 2], times[(times.len() * 99 / 100).min(times.len() - 1)]);
    });
}
