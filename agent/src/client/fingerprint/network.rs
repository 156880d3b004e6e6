//! Network: `unique.network.ip-address`, and the host interface allocs get ports on.

use std::net::IpAddr;

use super::{Fingerprint, FingerprintContext, Fingerprinter};

pub(super) struct Network;

/// The interface and address allocs on this node use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAddress {
    /// Interface name (`eth0`, `lo`); empty when it could not be found.
    pub device: String,
    /// The address.
    pub ip: String,
}

/// Every (interface name, address) pair of the host, from `getifaddrs(3)`.
fn interface_addresses() -> Vec<(String, IpAddr)> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: the family says which sockaddr type the pointer holds.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        if let Some(addr) = addr {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found.push((name.to_string_lossy().into_owned(), addr));
        }
    }
    // SAFETY: frees the list allocated above, once.
    unsafe { libc::freeifaddrs(addrs) };
    found
}

/// The name of the interface carrying `ip`.
fn interface_of(ip: IpAddr) -> Option<String> {
    interface_addresses().into_iter().find(|(_, a)| *a == ip).map(|(name, _)| name)
}

/// The interface of the default route's source address (what `-dev-connect` makes the node's,
/// as Nomad's `sockaddr.GetDefaultInterfaces`), if the host has one.
pub(crate) fn default_route_interface() -> Option<String> {
    let ip: IpAddr = crate::config::local_ip()?.parse().ok()?;
    interface_of(ip).filter(|name| name != "lo")
}

/// The address of the interface `name` (its first IPv4 one, else its first global IPv6 one),
/// or why there is none, in Nomad's words.
pub(crate) fn interface_address(name: &str) -> Result<IpAddr, String> {
    let all = interface_addresses();
    let mine: Vec<IpAddr> = all.iter().filter(|(n, _)| n == name).map(|(_, a)| *a).collect();
    let fail = |why: &str| format!("Error while detecting network interface {name} during fingerprinting: {why}");
    if mine.is_empty() {
        let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        return Err(fail(&format!("no interface {name:?} with an address on this host (it has: {})", names.join(", "))));
    }
    mine.iter()
        .find(|a| a.is_ipv4())
        .or_else(|| mine.iter().find(|a| matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) != 0xfe80)))
        .copied()
        .ok_or_else(|| fail("it has only link-local addresses"))
}

/// The address to use: the advertised one when it is concrete, else the default route's.
fn pick_ip(advertise: Option<&str>) -> IpAddr {
    advertise
        .and_then(|a| a.parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_unspecified())
        .or_else(|| crate::config::local_ip().and_then(|s| s.parse().ok()))
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

impl Fingerprinter for Network {
    fn name(&self) -> &'static str {
        "network"
    }

    fn fingerprint(&self, ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        let ip = match &ctx.network_interface {
            Some(name) => interface_address(name)?,
            None => pick_ip(ctx.advertise_ip.as_deref()),
        };
        let device = interface_of(ip).unwrap_or_default();
        out.attributes.insert("unique.network.ip-address".into(), ip.to_string());
        out.network = Some(HostAddress { device, ip: ip.to_string() });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_on_its_interface() {
        assert_eq!(pick_ip(Some("127.0.0.1")), IpAddr::from([127, 0, 0, 1]));
        assert!(!pick_ip(Some("0.0.0.0")).is_unspecified());
        assert_eq!(interface_of(IpAddr::from([127, 0, 0, 1])).as_deref(), Some("lo"));
    }

    /// `-dev-connect`'s interface is the one holding the default route's source address.
    #[test]
    fn the_default_route_interface_holds_the_default_route_address() {
        let Some(ip) = crate::config::local_ip() else { return };
        let iface = default_route_interface().expect("the default route's interface");
        assert_eq!(interface_address(&iface).map(|a| a.to_string()), Ok(ip));
        assert_ne!(iface, "lo");
    }

    #[test]
    fn network_interface_gives_the_nodes_address_and_a_missing_one_is_an_error() {
        assert_eq!(interface_address("lo"), Ok(IpAddr::from([127, 0, 0, 1])));
        let ctx = FingerprintContext {
            alloc_dir: "/".into(),
            advertise_ip: Some("10.9.9.9".into()),
            http_addr: String::new(),
            network_interface: Some("lo".into()),
        };
        let mut out = Fingerprint::default();
        Network.fingerprint(&ctx, &mut out).unwrap();
        assert_eq!(out.network, Some(HostAddress { device: "lo".into(), ip: "127.0.0.1".into() }), "the interface wins over advertise");
        let err = interface_address("nosuch0").unwrap_err();
        assert!(err.starts_with("Error while detecting network interface nosuch0 during fingerprinting: no interface"), "{err}");
        assert!(err.contains("lo"), "names the interfaces there are: {err}");
    }
}
