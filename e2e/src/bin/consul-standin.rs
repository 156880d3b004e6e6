//! The Consul stand-in as a process: `consul-standin [--management-token SECRET] [--xds]`.
//!
//! Its first line of output is `consul-standin listening on 127.0.0.1:<port>`, for tests (or a
//! shell) to read the kernel-chosen port from; with `--xds` (the Connect control plane on a
//! kernel-chosen gRPC port, reported in `/v1/agent/self`) a second line says
//! `consul-standin grpc on 127.0.0.1:<port>`. It runs until killed.

use std::io::Write;

use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};

fn main() -> anyhow::Result<()> {
    let mut opts = ConsulOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--management-token" => {
                opts.management_token = Some(args.next().ok_or_else(|| anyhow::anyhow!("--management-token needs a value"))?)
            }
            "--datacenter" => opts.datacenter = args.next().ok_or_else(|| anyhow::anyhow!("--datacenter needs a value"))?,
            "--version" => opts.version = args.next().ok_or_else(|| anyhow::anyhow!("--version needs a value"))?,
            "--xds" => opts.grpc_port = 0,
            other => anyhow::bail!("unknown argument {other:?} (known: --management-token, --datacenter, --version, --xds)"),
        }
    }
    let standin = ConsulStandIn::start(opts)?;
    println!("consul-standin listening on {}", standin.addr());
    if let Some(grpc) = standin.grpc_addr() {
        println!("consul-standin grpc on {grpc}");
    }
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}
