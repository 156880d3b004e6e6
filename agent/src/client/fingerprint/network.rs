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

/// Names of the interfaces carrying `ip`, from `getifaddrs(3)`.
fn interface_of(ip: IpAddr) -> Option<String> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return None;
    }
    let mut found = None;
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
        if addr == Some(ip) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: frees the list allocated above, once.
    unsafe { libc::freeifaddrs(addrs) };
    found
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
        let ip = pick_ip(ctx.advertise_ip.as_deref());
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
}
