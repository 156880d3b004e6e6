//! Network-namespace hosts (root only): agents on their own network stack,
//! connected through a bridge, so a test can cut a host off for real.
//!
//! ```text
//!   root ns (10.<a>.<b>.1) ─ veth ─┐
//!   netns nrs<id>-hub: bridge ─────┼─ veth ─ netns nrs<id>-h1 (10.<a>.<b>.11)
//!                                  └─ veth ─ netns nrs<id>-h2 (10.<a>.<b>.12)
//! ```
//!
//! The bridge lives in a namespace of its own, not in the root one: what else runs on the
//! machine (Docker loads `br_netfilter` and sets the root namespace's iptables FORWARD policy to
//! DROP) would otherwise filter the traffic between hosts. The hub's netfilter tables are empty.
//!
//! Every name carries this process's ID and a counter, so parallel tests and
//! parallel test binaries never collide; everything is removed on drop.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};
use nomad_testkit::Prereq;

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (install iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// What creating network namespaces needs (`nomad_testkit::prereq::met(&netns::PREREQS)`).
pub const PREREQS: [Prereq; 2] = [Prereq::Root, Prereq::Iproute2];

/// A bridge in a hub namespace that hosts (and the root namespace) attach to.
pub struct Network {
    bridge: String,
    hub: String,
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
    /// The hub namespace, where the host's bridge-side veth end is.
    hub: String,
    /// The bridge-side veth end (set down to cut the host off).
    veth_bridge: String,
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
        let hub = format!("{bridge}-hub");
        ip(&["netns", "add", &hub])?;
        let net = Network { bridge: bridge.clone(), hub: hub.clone(), prefix: prefix.clone(), hosts: 0, names: vec![hub.clone()] };
        ip(&["-n", &hub, "link", "add", &bridge, "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", &bridge, "up"])?;
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        // The root namespace's own leg: it reaches the hosts as `.1`.
        let (root_end, hub_end) = (format!("{bridge}r0"), format!("{bridge}b0"));
        ip(&["link", "add", &root_end, "type", "veth", "peer", "name", &hub_end])?;
        ip(&["link", "set", &hub_end, "netns", &hub])?;
        ip(&["-n", &hub, "link", "set", &hub_end, "master", &bridge])?;
        ip(&["-n", &hub, "link", "set", &hub_end, "up"])?;
        ip(&["addr", "add", &format!("{prefix}.1/24"), "dev", &root_end])?;
        ip(&["link", "set", &root_end, "up"])?;
        Ok(net)
    }

    /// Adds a host; its namespace has loopback and one veth on the bridge.
    pub fn host(&mut self) -> Result<Host> {
        self.hosts += 1;
        let k = self.hosts;
        let ns = format!("{}-h{k}", self.bridge);
        let (veth_bridge, veth_ns) = (format!("{}b{k}", self.bridge), format!("{}n{k}", self.bridge));
        let addr = format!("{}.{}", self.prefix, 10 + k);
        ip(&["netns", "add", &ns])?;
        self.names.push(ns.clone());
        ip(&["-n", &self.hub, "link", "add", &veth_bridge, "type", "veth", "peer", "name", &veth_ns])?;
        ip(&["-n", &self.hub, "link", "set", &veth_ns, "netns", &ns])?;
        ip(&["-n", &self.hub, "link", "set", &veth_bridge, "master", &self.bridge])?;
        ip(&["-n", &self.hub, "link", "set", &veth_bridge, "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &veth_ns])?;
        ip(&["-n", &ns, "link", "set", &veth_ns, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(Host { ns, ip: addr, hub: self.hub.clone(), veth_bridge })
    }
}

impl Host {
    /// Cuts the host off the network (its link goes down; packets vanish).
    pub fn cut(&self) -> Result<()> {
        ip(&["-n", &self.hub, "link", "set", &self.veth_bridge, "down"])
    }

    /// Reconnects the host.
    pub fn heal(&self) -> Result<()> {
        ip(&["-n", &self.hub, "link", "set", &self.veth_bridge, "up"])
    }

    /// The command prefix that runs a program inside this host.
    pub fn exec_prefix(&self) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.ns.clone()]
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes its links, and a veth goes with its peer; the root leg
        // goes with the hub.
        for ns in &self.names {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_reach_each_other_until_cut() {
        if !nomad_testkit::prereq::met(&PREREQS) {
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
        let root_reaches = |to: &Host| Command::new("ping").args(["-c", "1", "-W", "1", &to.ip]).output().is_ok_and(|o| o.status.success());
        assert!(root_reaches(&b), "the root namespace reaches the hosts");
        b.cut().unwrap();
        assert!(!ping(&a, &b), "a cut host is unreachable");
        b.heal().unwrap();
        assert!(ping(&a, &b), "a healed host is reachable again");
    }
}
