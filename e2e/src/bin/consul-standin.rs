//! The Consul stand-in as a process: `consul-standin [--management-token SECRET]`.
//!
//! Its first line of output is `consul-standin listening on 127.0.0.1:<port>`, for tests (or a
//! shell) to read the kernel-chosen port from; it runs until killed.

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
            other => anyhow::bail!("unknown argument {other:?} (known: --management-token, --datacenter, --version)"),
        }
    }
    let standin = ConsulStandIn::start(opts)?;
    println!("consul-standin listening on {}", standin.addr());
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}
