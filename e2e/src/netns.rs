//! Network-namespace hosts (root only): agents on their own network stack,
//! connected through a bridge, so a test can cut a host off for real.
//!
//! ```text
//!   root ns: bridge nrs<id> 10.<a>.<b>.1/24 ─┬─ veth ─ netns nrs<id>-h1 (10.<a>.<b>.11)
//!                                            └─ veth ─ netns nrs<id>-h2 (10.<a>.<b>.12)
//! ```
//!
//! Every name carries this process's ID and a counter, so parallel tests and
//! parallel test binaries never collide; everything is removed on drop.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (install iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Whether this process can create network namespaces (root with iproute2).
pub fn available() -> bool {
    nix::unistd::geteuid().is_root() && Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// A bridge in the root namespace that hosts attach to.
pub struct Network {
    bridge: String,
    prefix: String,
    hosts: u8,
    names: Vec<String>,
}

/// A host: a network namespace with one address on the network.
#[derive(Debug, Clone)]
pub struct Host {
    /// Namespace name (`ip netns exec <ns> ...`).
    pub ns: String,
    /// The host's address.
    pub ip: String,
    /// The root-side veth end (set down to cut the host off).
    veth_root: String,
}

impl Network {
    /// Creates a bridge with a fresh /24 (`10.<a>.<b>.0/24`) and gives the root namespace `.1`.
    pub fn new() -> Result<Network> {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let id = format!("{:x}{}", std::process::id() % 0xffff, n);
        // Spread subnets by PID and counter to keep parallel binaries apart.
        let salt = (std::process::id() as u32).wrapping_mul(31).wrapping_add(n);
        let prefix = format!("10.{}.{}", 200 + (salt % 50), (salt / 50) % 250);
        let bridge = format!("nrs{id}");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let net = Network { bridge: bridge.clone(), prefix: prefix.clone(), hosts: 0, names: Vec::new() };
        ip(&["addr", "add", &format!("{prefix}.1/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        Ok(net)
    }

    /// Adds a host; its namespace has loopback and one veth on the bridge.
    pub fn host(&mut self) -> Result<Host> {
        self.hosts += 1;
        let k = self.hosts;
        let ns = format!("{}-h{k}", self.bridge);
        let (veth_root, veth_ns) = (format!("{}r{k}", self.bridge), format!("{}n{k}", self.bridge));
        let addr = format!("{}.{}", self.prefix, 10 + k);
        ip(&["netns", "add", &ns])?;
        self.names.push(ns.clone());
        ip(&["link", "add", &veth_root, "type", "veth", "peer", "name", &veth_ns])?;
        ip(&["link", "set", &veth_ns, "netns", &ns])?;
        ip(&["link", "set", &veth_root, "master", &self.bridge])?;
        ip(&["link", "set", &veth_root, "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &veth_ns])?;
        ip(&["-n", &ns, "link", "set", &veth_ns, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(Host { ns, ip: addr, veth_root })
    }
}

impl Host {
    /// Cuts the host off the network (its link goes down; packets vanish).
    pub fn cut(&self) -> Result<()> {
        ip(&["link", "set", &self.veth_root, "down"])
    }

    /// Reconnects the host.
    pub fn heal(&self) -> Result<()> {
        ip(&["link", "set", &self.veth_root, "up"])
    }

    /// The command prefix that runs a program inside this host.
    pub fn exec_prefix(&self) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.ns.clone()]
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_reach_each_other_until_cut() {
        if !available() {
            eprintln!("skipping: network namespaces need root and iproute2");
            return;
        }
        let mut net = Network::new().unwrap();
        let a = net.host().unwrap();
        let b = net.host().unwrap();
        let ping = |from: &Host, to: &Host| {
            Command::new("ip")
                .args(["netns", "exec", &from.ns, "ping", "-c", "1", "-W", "1", &to.ip])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        assert!(ping(&a, &b), "hosts on one bridge reach each other");
        b.cut().unwrap();
        assert!(!ping(&a, &b), "a cut host is unreachable");
        b.heal().unwrap();
        assert!(ping(&a, &b), "a healed host is reachable again");
    }
}
