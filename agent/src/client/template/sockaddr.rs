//! consul-template's `sockaddr` function: evaluates a go-sockaddr template
//! (github.com/hashicorp/go-sockaddr/template, v1.0.7 behaviour) against the
//! host's interface addresses.
//!
//! `{{ sockaddr "GetPrivateIP" }}` joins its arguments with spaces, wraps them
//! as `{{ <args> }}` and renders that with the go-sockaddr functions, the
//! list of every interface address being the template's dot.
//!
//! Inside the inner template an address list is a `List` of `String`s, each
//! the Go `fmt` form of one go-sockaddr `IfAddr`, so printing a list gives
//! what go-sockaddr prints. The strings are keys into a per-evaluation
//! [`Arena`] holding the real addresses; a string the arena does not know is
//! not an address (as in Go, where a string is never an `IfAddrs`).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};

use gotmpl::{FuncMap, MissingKey, Template, TemplateError, Value, ValueFunc};

/// Longest accepted expression (the joined arguments of `sockaddr`).
pub const MAX_EXPRESSION_LEN: usize = 4096;
/// Longest accepted output of one evaluation.
const MAX_OUTPUT_LEN: usize = 1 << 20;
/// `{{range}}` iterations allowed per evaluation, across nested ranges.
const MAX_RANGE_ITERS: u64 = 10_000;
/// Distinct addresses one evaluation may create (`math` makes new ones).
const MAX_ARENA_ENTRIES: usize = 100_000;
/// Regexes (`include "name"`, `GetInterfaceIP`) are user input: bound them.
const MAX_REGEX_SIZE: usize = 1 << 20;
/// Go's sort.Sort uses insertion sort up to this length; beyond it we merge.
const INSERTION_SORT_MAX: usize = 12;
/// The pseudo-RFC go-sockaddr uses for its list of non-forwardable blocks.
const FORWARDING_BLACKLIST: u64 = 4_294_967_295;
/// Linux route flags (`include/uapi/linux/route.h`).
const RTF_UP: u32 = 0x0001;
const RTF_GATEWAY: u32 = 0x0002;
const RTF_REJECT: u32 = 0x0200;

/// Interface flags, as Go's `net.Flags` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IfFlags {
    pub up: bool,
    pub broadcast: bool,
    pub loopback: bool,
    pub point_to_point: bool,
    pub multicast: bool,
    pub running: bool,
}

impl IfFlags {
    /// Go's `net.Flags.String()`: names joined by `|`, `0` for none.
    fn go_string(&self) -> String {
        let names = [
            (self.up, "up"),
            (self.broadcast, "broadcast"),
            (self.loopback, "loopback"),
            (self.point_to_point, "pointtopoint"),
            (self.multicast, "multicast"),
            (self.running, "running"),
        ];
        let set: Vec<&str> = names.iter().filter(|(on, _)| *on).map(|(_, name)| *name).collect();
        if set.is_empty() { "0".to_string() } else { set.join("|") }
    }

    /// True when every flag set in `required` is set here.
    fn contains(&self, required: &IfFlags) -> bool {
        (!required.up || self.up)
            && (!required.broadcast || self.broadcast)
            && (!required.loopback || self.loopback)
            && (!required.point_to_point || self.point_to_point)
            && (!required.multicast || self.multicast)
            && (!required.running || self.running)
    }
}

/// One IP address of one interface (go-sockaddr's `IfAddr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IfAddr {
    pub name: String,
    pub index: u32,
    pub mtu: u32,
    /// `aa:bb:cc:dd:ee:ff`, empty when the link has none (loopback).
    pub hardware_addr: String,
    pub flags: IfFlags,
    pub address: IpAddr,
    pub prefix_len: u8,
    /// Whether the interface carries the host's default route.
    pub is_default: bool,
}

impl IfAddr {
    fn net(&self) -> Net {
        Net::new(self.address, self.prefix_len)
    }

    /// Go's `IfAddr.String()`: the sockaddr, then `net.Interface` printed with `%v`.
    fn go_string(&self) -> String {
        format!(
            "{} {{{} {} {} {} {}}}",
            self.net().sockaddr_string(),
            self.index,
            self.mtu,
            self.name,
            self.hardware_addr,
            self.flags.go_string()
        )
    }
}

// ---------------------------------------------------------------- addresses

/// An address with its prefix length, as go-sockaddr's IPv4Addr / IPv6Addr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Net {
    Net { addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
}

#[allow(clippy::too_many_arguments)]
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16, prefix: u8) -> Net {
    Net { addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), prefix }
}

impl Net {
    fn new(addr: IpAddr, prefix: u8) -> Net {
        Net { addr, prefix: prefix.min(width(&addr)) }
    }

    fn from_bits(is_v4: bool, bits: u128, prefix: u8) -> Net {
        let addr = if is_v4 {
            // Truncation is the point: an IPv4 value lives in the low 32 bits.
            IpAddr::V4(Ipv4Addr::from(bits as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(bits))
        };
        Net::new(addr, prefix)
    }

    fn is_v4(&self) -> bool {
        self.addr.is_ipv4()
    }

    fn width(&self) -> u8 {
        width(&self.addr)
    }

    fn bits(&self) -> u128 {
        match self.addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        }
    }

    fn mask(&self) -> u128 {
        prefix_mask(self.width(), self.prefix)
    }

    fn host_mask(&self) -> u128 {
        prefix_mask(self.width(), self.width())
    }

    fn network_bits(&self) -> u128 {
        self.bits() & self.mask()
    }

    fn last_bits(&self) -> u128 {
        self.network_bits() | (self.host_mask() & !self.mask())
    }

    /// go-sockaddr's `Contains`: same family and `other`'s whole network inside ours.
    fn contains(&self, other: &Net) -> bool {
        self.is_v4() == other.is_v4() && self.network_bits() <= other.network_bits() && self.last_bits() >= other.last_bits()
    }

    fn host(&self, bits: u128) -> Net {
        Net::from_bits(self.is_v4(), bits, self.width())
    }

    /// go-sockaddr's `SockAddr.String()`: no prefix for a single host.
    fn sockaddr_string(&self) -> String {
        let ip = go_ip_string(&self.addr);
        if self.prefix == self.width() { ip } else { format!("{ip}/{}", self.prefix) }
    }
}

fn width(addr: &IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn prefix_mask(width: u8, prefix: u8) -> u128 {
    let all = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
    let host_bits = u32::from(width.saturating_sub(prefix));
    if host_bits >= 128 { 0 } else { all & !((1u128 << host_bits) - 1) }
}

/// Go's `net.IP.String()`: an IPv4-mapped IPv6 address prints as IPv4.
fn go_ip_string(addr: &IpAddr) -> String {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        IpAddr::V4(v4) => v4.to_string(),
    }
}

/// go-sockaddr's `NewIPAddr` for the forms a template uses: `a.b.c.d[/n]`, `v6[/n]`, `[v6]`.
fn parse_net(s: &str) -> Result<Net, String> {
    let (ip_text, prefix_text) = match s.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (s.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')).unwrap_or(s), None),
    };
    let addr: IpAddr = ip_text.parse().map_err(|_| format!("invalid IPAddr {s}"))?;
    let prefix = match prefix_text {
        None => width(&addr),
        Some(p) => match p.parse::<u8>() {
            Ok(n) if n <= width(&addr) && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("invalid IPAddr {s}")),
        },
    };
    Ok(Net::new(addr, prefix))
}

// ---------------------------------------------------------------- RFC table

/// The blocks go-sockaddr knows per RFC number (its `KnownRFCs`).
fn rfc_nets(rfc: u64) -> Option<&'static [Net]> {
    const RFC_919: &[Net] = &[v4(255, 255, 255, 255, 32)];
    const RFC_1112: &[Net] = &[v4(224, 0, 0, 0, 4)];
    const RFC_1122: &[Net] = &[v4(0, 0, 0, 0, 8), v4(127, 0, 0, 0, 8)];
    const RFC_1918: &[Net] = &[v4(10, 0, 0, 0, 8), v4(172, 16, 0, 0, 12), v4(192, 168, 0, 0, 16)];
    const RFC_2544: &[Net] = &[v4(198, 18, 0, 0, 15)];
    const RFC_2765: &[Net] = &[v6(0, 0, 0, 0, 0, 0xffff, 0, 0, 96)];
    const RFC_2928: &[Net] = &[v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 16)];
    const RFC_3056: &[Net] = &[v6(0x2002, 0, 0, 0, 0, 0, 0, 0, 16)];
    const RFC_3068: &[Net] = &[v4(192, 88, 99, 0, 24), v6(0x2002, 0xc058, 0x6301, 0, 0, 0, 0, 0, 120)];
    const RFC_3171: &[Net] = &[v4(224, 0, 0, 0, 4)];
    const RFC_3330: &[Net] = &[
        v4(0, 0, 0, 0, 8),
        v4(10, 0, 0, 0, 8),
        v4(127, 0, 0, 0, 8),
        v4(169, 254, 0, 0, 16),
        v4(172, 16, 0, 0, 12),
        v4(192, 0, 2, 0, 24),
        v4(192, 88, 99, 0, 24),
        v4(192, 168, 0, 0, 16),
        v4(198, 18, 0, 0, 15),
        v4(224, 0, 0, 0, 4),
        v4(240, 0, 0, 0, 4),
    ];
    const RFC_3849: &[Net] = &[v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0, 32)];
    const RFC_3927: &[Net] = &[v4(169, 254, 0, 0, 16)];
    const RFC_4038: &[Net] = &[v6(0, 0, 0, 0, 0, 0xffff, 0, 0, 96)];
    const RFC_4193: &[Net] = &[v6(0xfc00, 0, 0, 0, 0, 0, 0, 0, 7)];
    const RFC_4291: &[Net] = &[
        v6(0, 0, 0, 0, 0, 0, 0, 0, 128),
        v6(0, 0, 0, 0, 0, 0, 0, 1, 128),
        v6(0, 0, 0, 0, 0, 0, 0, 0, 96),
        v6(0, 0, 0, 0, 0, 0xffff, 0, 0, 96),
        v6(0xfe80, 0, 0, 0, 0, 0, 0, 0, 10),
        v6(0xfec0, 0, 0, 0, 0, 0, 0, 0, 10),
        v6(0xff00, 0, 0, 0, 0, 0, 0, 0, 8),
    ];
    const RFC_4380: &[Net] = &[v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 32)];
    const RFC_4773: &[Net] = &[v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 23)];
    const RFC_4843: &[Net] = &[v6(0x2001, 0x10, 0, 0, 0, 0, 0, 0, 28)];
    const RFC_5180: &[Net] = &[v6(0x2001, 0x200, 0, 0, 0, 0, 0, 0, 48)];
    const RFC_5735: &[Net] = &[v4(192, 0, 2, 0, 24), v4(198, 51, 100, 0, 24), v4(203, 0, 113, 0, 24), v4(198, 18, 0, 0, 15)];
    const RFC_5737: &[Net] = &[v4(192, 0, 2, 0, 24), v4(198, 51, 100, 0, 24), v4(203, 0, 113, 0, 24)];
    const RFC_6052: &[Net] = &[v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0, 96)];
    const RFC_6333: &[Net] = &[v4(192, 0, 0, 0, 29)];
    const RFC_6598: &[Net] = &[v4(100, 64, 0, 0, 10)];
    const RFC_6666: &[Net] = &[v6(0x100, 0, 0, 0, 0, 0, 0, 0, 64)];
    // The IPv4 and IPv6 special-purpose registries; go-sockaddr includes the
    // whole 2001::/16 superblock, so e.g. 2001:470::/32 counts as "private".
    const RFC_6890: &[Net] = &[
        v4(0, 0, 0, 0, 8),
        v4(10, 0, 0, 0, 8),
        v4(100, 64, 0, 0, 10),
        v4(127, 0, 0, 0, 8),
        v4(169, 254, 0, 0, 16),
        v4(172, 16, 0, 0, 12),
        v4(192, 0, 0, 0, 24),
        v4(192, 0, 0, 0, 29),
        v4(192, 0, 2, 0, 24),
        v4(192, 88, 99, 0, 24),
        v4(192, 168, 0, 0, 16),
        v4(198, 18, 0, 0, 15),
        v4(198, 51, 100, 0, 24),
        v4(203, 0, 113, 0, 24),
        v4(240, 0, 0, 0, 4),
        v4(255, 255, 255, 255, 32),
        v6(0, 0, 0, 0, 0, 0, 0, 1, 128),
        v6(0, 0, 0, 0, 0, 0, 0, 0, 128),
        v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0, 96),
        v6(0, 0, 0, 0, 0, 0xffff, 0, 0, 96),
        v6(0x100, 0, 0, 0, 0, 0, 0, 0, 64),
        v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 16),
        v6(0x2002, 0, 0, 0, 0, 0, 0, 0, 16),
        v6(0xfc00, 0, 0, 0, 0, 0, 0, 0, 7),
        v6(0xfe80, 0, 0, 0, 0, 0, 0, 0, 10),
    ];
    const RFC_7335: &[Net] = &[v4(192, 0, 0, 0, 29)];
    // Blocks RFC 6890 marks non-forwardable (go-sockaddr's pseudo-RFC).
    const NON_FORWARDABLE: &[Net] = &[
        v4(0, 0, 0, 0, 8),
        v4(127, 0, 0, 0, 8),
        v4(169, 254, 0, 0, 16),
        v4(192, 0, 0, 0, 24),
        v4(192, 0, 2, 0, 24),
        v4(198, 51, 100, 0, 24),
        v4(203, 0, 113, 0, 24),
        v4(240, 0, 0, 0, 4),
        v4(255, 255, 255, 255, 32),
        v6(0, 0, 0, 0, 0, 0, 0, 1, 128),
        v6(0, 0, 0, 0, 0, 0, 0, 0, 128),
        v6(0, 0, 0, 0, 0, 0xffff, 0, 0, 96),
        v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0, 32),
        v6(0x2001, 0x10, 0, 0, 0, 0, 0, 0, 28),
        v6(0xfe80, 0, 0, 0, 0, 0, 0, 0, 10),
    ];
    Some(match rfc {
        919 => RFC_919,
        1112 => RFC_1112,
        1122 => RFC_1122,
        1918 => RFC_1918,
        2544 => RFC_2544,
        2765 => RFC_2765,
        2928 => RFC_2928,
        3056 => RFC_3056,
        3068 => RFC_3068,
        3171 => RFC_3171,
        3330 => RFC_3330,
        3849 => RFC_3849,
        3927 => RFC_3927,
        4038 => RFC_4038,
        4193 => RFC_4193,
        4291 => RFC_4291,
        4380 => RFC_4380,
        4773 => RFC_4773,
        4843 => RFC_4843,
        5180 => RFC_5180,
        5735 => RFC_5735,
        5737 => RFC_5737,
        6052 => RFC_6052,
        6333 => RFC_6333,
        6598 => RFC_6598,
        6666 => RFC_6666,
        6890 => RFC_6890,
        7335 => RFC_7335,
        FORWARDING_BLACKLIST => NON_FORWARDABLE,
        _ => return None,
    })
}

fn in_rfc(rfc: u64, net: &Net) -> bool {
    rfc_nets(rfc).is_some_and(|nets| nets.iter().any(|block| block.contains(net)))
}

fn is_private(addr: &IfAddr) -> bool {
    in_rfc(6890, &addr.net())
}

fn is_forwardable(addr: &IfAddr) -> bool {
    !in_rfc(FORWARDING_BLACKLIST, &addr.net())
}

// ---------------------------------------------------------------- attributes

/// go-sockaddr's `IfAddr.Attr`: interface, IP, then family-specific attributes.
fn attr(addr: &IfAddr, name: &str) -> Result<String, String> {
    let net = addr.net();
    let width = net.width();
    let value = match name.to_ascii_lowercase().as_str() {
        "flags" => addr.flags.go_string(),
        "name" => addr.name.clone(),
        "address" => go_ip_string(&net.addr),
        "binary" => format!("{:0w$b}", net.bits(), w = usize::from(width)),
        "hex" => format!("{:0w$x}", net.bits(), w = usize::from(width / 4)),
        "first_usable" => {
            let step = u128::from(net.is_v4() && net.prefix < 31);
            net.host(net.network_bits() + step).sockaddr_string()
        }
        "last_usable" => {
            let step = u128::from(net.is_v4() && net.prefix < 31);
            net.host(net.last_bits() - step).sockaddr_string()
        }
        "host" => net.host(net.bits()).sockaddr_string(),
        "mask_bits" => net.prefix.to_string(),
        "netmask" => net.host(net.mask()).sockaddr_string(),
        "network" => go_ip_string(&net.host(net.network_bits()).addr),
        "octets" => {
            let octets: Vec<String> = match net.addr {
                IpAddr::V4(a) => a.octets().iter().map(u8::to_string).collect(),
                IpAddr::V6(a) => a.octets().iter().map(u8::to_string).collect(),
            };
            octets.join(" ")
        }
        "port" => "0".to_string(),
        "size" => match 1u128.checked_shl(u32::from(width - net.prefix)) {
            Some(size) => size.to_string(),
            // A /0 IPv6 network holds 2^128 addresses, one more than u128 holds.
            None => "340282366920938463463374607431768211456".to_string(),
        },
        "broadcast" if net.is_v4() => net.host(net.last_bits()).sockaddr_string(),
        "uint32" if net.is_v4() => net.bits().to_string(),
        "uint128" if !net.is_v4() => net.bits().to_string(),
        "string" => net.sockaddr_string(),
        "type" => (if net.is_v4() { "IPv4" } else { "IPv6" }).to_string(),
        _ => return Err(format!("unsupported attribute name {name:?}")),
    };
    Ok(value)
}

// ---------------------------------------------------------------- filters

fn compile_regex(what: &str, pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_REGEX_SIZE)
        .build()
        .map_err(|e| format!("unable to compile {what} regexp {pattern:?}: {e}"))
}

/// Splits `addrs` by `pred`: (matched, remainder).
fn partition(addrs: &[IfAddr], mut pred: impl FnMut(&IfAddr) -> bool) -> (Vec<IfAddr>, Vec<IfAddr>) {
    let mut matched = Vec::new();
    let mut rest = Vec::new();
    for addr in addrs {
        if pred(addr) { matched.push(addr.clone()) } else { rest.push(addr.clone()) }
    }
    (matched, rest)
}

/// go-sockaddr's `IfByFlag`: kernel flags must all be set, or any address
/// property must hold. `down` only clears `up` from the required flags, so on
/// its own it matches everything, as in go-sockaddr.
fn by_flag(param: &str, addrs: &[IfAddr]) -> Result<(Vec<IfAddr>, Vec<IfAddr>), String> {
    #[derive(PartialEq)]
    enum Property {
        Forwardable,
        GlobalUnicast,
        InterfaceLocalMulticast,
        LinkLocalMulticast,
        LinkLocalUnicast,
        Loopback,
        Multicast,
        Unspecified,
    }
    let mut required = IfFlags::default();
    let mut check_flags = false;
    let mut properties = Vec::new();
    for flag in param.to_lowercase().split('|') {
        match flag {
            "broadcast" => (check_flags, required.broadcast) = (true, true),
            "down" => (check_flags, required.up) = (true, false),
            "up" => (check_flags, required.up) = (true, true),
            "point-to-point" => (check_flags, required.point_to_point) = (true, true),
            "loopback" => {
                (check_flags, required.loopback) = (true, true);
                properties.push(Property::Loopback);
            }
            "multicast" => {
                (check_flags, required.multicast) = (true, true);
                properties.push(Property::Multicast);
            }
            "forwardable" => properties.push(Property::Forwardable),
            "global unicast" => properties.push(Property::GlobalUnicast),
            "interface-local multicast" => properties.push(Property::InterfaceLocalMulticast),
            "link-local multicast" => properties.push(Property::LinkLocalMulticast),
            "link-local unicast" => properties.push(Property::LinkLocalUnicast),
            "unspecified" => properties.push(Property::Unspecified),
            _ => return Err(format!("unknown interface flag: {flag:?}")),
        }
    }
    Ok(partition(addrs, |addr| {
        if check_flags && addr.flags.contains(&required) {
            return true;
        }
        let ip = go_canonical(&addr.address);
        properties.iter().any(|p| match p {
            Property::Forwardable => is_forwardable(addr),
            Property::GlobalUnicast => is_global_unicast(&ip),
            Property::InterfaceLocalMulticast => matches!(ip, IpAddr::V6(a) if a.segments()[0] & 0xff0f == 0xff01),
            Property::LinkLocalMulticast => match ip {
                IpAddr::V4(a) => a.octets()[..3] == [224, 0, 0],
                IpAddr::V6(a) => a.segments()[0] & 0xff0f == 0xff02,
            },
            Property::LinkLocalUnicast => is_link_local_unicast(&ip),
            Property::Loopback => ip.is_loopback(),
            Property::Multicast => ip.is_multicast(),
            Property::Unspecified => ip.is_unspecified(),
        })
    }))
}

/// Go's net.IP predicates treat an IPv4-mapped IPv6 address as IPv4.
fn go_canonical(ip: &IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(*ip, IpAddr::V4),
        IpAddr::V4(_) => *ip,
    }
}

fn is_link_local_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// Go's `IsGlobalUnicast`, which counts private addresses as global.
fn is_global_unicast(ip: &IpAddr) -> bool {
    let broadcast = matches!(ip, IpAddr::V4(a) if a.is_broadcast());
    !broadcast && !ip.is_unspecified() && !ip.is_loopback() && !ip.is_multicast() && !is_link_local_unicast(ip)
}

/// go-sockaddr's `IfByType`; with several types an address is tested once per
/// type, so it can land in both results (or twice in one), as in go-sockaddr.
fn by_type(param: &str, addrs: &[IfAddr]) -> Result<(Vec<IfAddr>, Vec<IfAddr>), String> {
    let lowered = param.to_lowercase();
    let types: Vec<&str> = lowered.split('|').collect();
    if let Some(bad) = types.iter().find(|t| !matches!(**t, "ip" | "ipv4" | "ipv6" | "unix")) {
        return Err(format!("unsupported type {bad:?} {param:?}"));
    }
    let (mut matched, mut rest) = (Vec::new(), Vec::new());
    for addr in addrs {
        for kind in &types {
            let hit = match *kind {
                "ip" => true,
                "ipv4" => addr.address.is_ipv4(),
                "ipv6" => addr.address.is_ipv6(),
                _ => false,
            };
            if hit { matched.push(addr.clone()) } else { rest.push(addr.clone()) }
        }
    }
    Ok((matched, rest))
}

/// go-sockaddr's `IfByNetwork`: one pass per `|`-separated network.
fn by_network(param: &str, addrs: &[IfAddr]) -> Result<(Vec<IfAddr>, Vec<IfAddr>), String> {
    let (mut matched, mut rest) = (Vec::new(), Vec::new());
    for text in param.split('|') {
        let block = parse_net(text).map_err(|e| format!("unable to create an IP address from {text:?}: {e}"))?;
        let (m, r) = partition(addrs, |addr| block.contains(&addr.net()));
        matched.extend(m);
        rest.extend(r);
    }
    Ok((matched, rest))
}

/// go-sockaddr's `IfByRFCs`: one pass per `|`-separated RFC number.
fn by_rfcs(param: &str, addrs: &[IfAddr]) -> Result<(Vec<IfAddr>, Vec<IfAddr>), String> {
    let (mut matched, mut rest) = (Vec::new(), Vec::new());
    for text in param.split('|') {
        let rfc: u64 =
            text.parse().map_err(|e| format!("unable to lookup RFC number {text:?}: unable to parse RFC number {text:?}: {e}"))?;
        if rfc_nets(rfc).is_none() {
            return Err(format!("unable to lookup RFC number {text:?}: unsupported RFC {rfc}"));
        }
        let (m, r) = partition(addrs, |addr| in_rfc(rfc, &addr.net()));
        matched.extend(m);
        rest.extend(r);
    }
    Ok((matched, rest))
}

fn by_size(param: &str, addrs: &[IfAddr]) -> Result<(Vec<IfAddr>, Vec<IfAddr>), String> {
    let size: u64 = param.parse().map_err(|e| format!("invalid exclude size argument ({param:?}): {e}"))?;
    for addr in addrs {
        if addr.address.is_ipv4() && size > 32 {
            return Err(format!("mask size out of bounds for IPv4 address: {size}"));
        }
        if addr.address.is_ipv6() && size > 128 {
            return Err(format!("mask size out of bounds for IPv6 address: {size}"));
        }
    }
    Ok(partition(addrs, |addr| u64::from(addr.prefix_len) == size))
}

/// `include` (keep matches) and `exclude` (keep the rest).
fn select(selector: &str, param: &str, addrs: &[IfAddr], keep_matched: bool) -> Result<Vec<IfAddr>, String> {
    let (matched, rest) = match selector.to_lowercase().as_str() {
        "address" => {
            let re = compile_regex("address", param)?;
            partition(addrs, |addr| re.is_match(&addr.net().sockaddr_string()))
        }
        "name" => {
            let re = compile_regex("name", param)?;
            partition(addrs, |addr| re.is_match(&addr.name))
        }
        // Interface addresses carry no port: it is always 0.
        "port" => {
            let re = compile_regex("port", param)?;
            partition(addrs, |_| re.is_match("0"))
        }
        "flag" | "flags" => by_flag(param, addrs)?,
        "network" => by_network(param, addrs)?,
        "rfc" | "rfcs" => by_rfcs(param, addrs)?,
        "size" => by_size(param, addrs)?,
        "type" => by_type(param, addrs)?,
        _ => {
            let verb = if keep_matched { "include" } else { "exclude" };
            return Err(format!("invalid {verb} selector {selector:?}"));
        }
    };
    Ok(if keep_matched { matched } else { rest })
}

// ---------------------------------------------------------------- sorting

/// One sort clause; `Less` means "a before b", `Equal` defers to the next clause.
type Cmp = fn(&IfAddr, &IfAddr) -> Ordering;

fn cmp_address(a: &IfAddr, b: &IfAddr) -> Ordering {
    if a.address.is_ipv4() != b.address.is_ipv4() {
        return Ordering::Equal;
    }
    a.net().bits().cmp(&b.net().bits())
}

fn cmp_default(a: &IfAddr, b: &IfAddr) -> Ordering {
    b.is_default.cmp(&a.is_default)
}

fn cmp_name(a: &IfAddr, b: &IfAddr) -> Ordering {
    a.name.cmp(&b.name)
}

/// Interface addresses all have port 0.
fn cmp_port(_: &IfAddr, _: &IfAddr) -> Ordering {
    Ordering::Equal
}

/// Private first; against the other family only a private `a` decides (go-sockaddr's CmpRFC).
fn cmp_private(a: &IfAddr, b: &IfAddr) -> Ordering {
    let a_private = is_private(a);
    if a.address.is_ipv4() != b.address.is_ipv4() {
        return if a_private { Ordering::Less } else { Ordering::Equal };
    }
    is_private(b).cmp(&a_private)
}

/// Larger networks (shorter prefixes) first; families are not compared.
fn cmp_size(a: &IfAddr, b: &IfAddr) -> Ordering {
    if a.address.is_ipv4() != b.address.is_ipv4() {
        return Ordering::Equal;
    }
    a.prefix_len.cmp(&b.prefix_len)
}

/// IPv4 before IPv6.
fn cmp_type(a: &IfAddr, b: &IfAddr) -> Ordering {
    b.address.is_ipv4().cmp(&a.address.is_ipv4())
}

fn sort_clauses(param: &str) -> Result<Vec<(Cmp, bool)>, String> {
    param
        .split(',')
        .map(|clause| {
            let lowered = clause.trim().to_lowercase();
            let (descending, key) = match lowered.strip_prefix('-') {
                Some(key) => (true, key),
                None => (false, lowered.strip_prefix('+').unwrap_or(&lowered)),
            };
            let cmp: Cmp = match key {
                "address" => cmp_address,
                "default" => cmp_default,
                "name" => cmp_name,
                "port" => cmp_port,
                "private" => cmp_private,
                "size" => cmp_size,
                "type" => cmp_type,
                _ => return Err(format!("unknown sort type: {clause:?}")),
            };
            Ok((cmp, descending))
        })
        .collect()
}

fn sort_by(addrs: &mut Vec<IfAddr>, clauses: &[(Cmp, bool)]) {
    // The clauses are not a total order (families defer), so std's sort could
    // panic; Go's small-slice insertion sort and a merge sort cannot.
    let less = |a: &IfAddr, b: &IfAddr| {
        for (cmp, descending) in clauses {
            let order = if *descending { cmp(a, b).reverse() } else { cmp(a, b) };
            if order != Ordering::Equal {
                return order == Ordering::Less;
            }
        }
        false
    };
    if addrs.len() <= INSERTION_SORT_MAX {
        for i in 1..addrs.len() {
            let mut j = i;
            while j > 0 && less(&addrs[j], &addrs[j - 1]) {
                addrs.swap(j, j - 1);
                j -= 1;
            }
        }
    } else {
        let taken = std::mem::take(addrs);
        *addrs = merge_sort(taken, &less);
    }
}

fn merge_sort(mut items: Vec<IfAddr>, less: &impl Fn(&IfAddr, &IfAddr) -> bool) -> Vec<IfAddr> {
    if items.len() <= 1 {
        return items;
    }
    let right = merge_sort(items.split_off(items.len() / 2), less);
    let left = merge_sort(items, less);
    let mut merged = Vec::with_capacity(left.len() + right.len());
    let (mut left, mut right) = (left.into_iter().peekable(), right.into_iter().peekable());
    while let (Some(l), Some(r)) = (left.peek(), right.peek()) {
        // Stable: take from the right only when it is strictly first.
        let next = if less(r, l) { right.next() } else { left.next() };
        merged.extend(next);
    }
    merged.extend(left);
    merged.extend(right);
    merged
}

fn sorted(addrs: &[IfAddr], param: &str) -> Result<Vec<IfAddr>, String> {
    let clauses = sort_clauses(param)?;
    let mut out = addrs.to_vec();
    sort_by(&mut out, &clauses);
    Ok(out)
}

// ---------------------------------------------------------------- math

/// go-sockaddr's `math` on one address.
fn math(op: &str, value: &str, addr: &IfAddr) -> Result<IfAddr, String> {
    let net = addr.net();
    let is_v4 = net.is_v4();
    let host_mask = net.host_mask();
    let op_lower = op.to_lowercase();
    let new_net = match op_lower.as_str() {
        "address" | "network" => {
            if !value.trim_start().starts_with(['+', '-']) {
                return Err(format!("sign (+/-) is required for operation {op:?}"));
            }
            let delta = parse_delta(value, is_v4, op)?;
            if op_lower == "address" {
                // Wraps within the family's address space.
                Net::from_bits(is_v4, net.bits().wrapping_add(delta as u128) & host_mask, net.prefix)
            } else {
                // Offsets from the network address; negative ones count back from its last address.
                let host_part = !net.mask() & host_mask;
                let bits = if delta >= 0 {
                    net.network_bits() + (delta as u128 & host_part)
                } else {
                    net.last_bits() - ((-delta - 1) as u128 & host_part)
                };
                Net::from_bits(is_v4, bits, net.prefix)
            }
        }
        "mask" => {
            let bits: u8 = value.parse().map_err(|e| format!("unable to convert {value:?} to int for operation {op:?}: {e}"))?;
            if bits > net.width() {
                // go-sockaddr's own wording, including its "64" for IPv6.
                let range = if is_v4 { "0 and 32" } else { "0 and 64" };
                return Err(format!(
                    "parameter for operation {op:?} on ipv{} addresses must be between {range}",
                    if is_v4 { 4 } else { 6 }
                ));
            }
            // Masking never lengthens the prefix.
            Net::from_bits(is_v4, net.bits() & prefix_mask(net.width(), bits), bits.min(net.prefix))
        }
        _ => return Err(format!("unsupported math operation: {op:?}")),
    };
    Ok(IfAddr { address: new_net.addr, prefix_len: new_net.prefix, ..addr.clone() })
}

/// A signed decimal offset: 33 bits for IPv4 (any u32 either way), 64 for IPv6.
fn parse_delta(value: &str, is_v4: bool, op: &str) -> Result<i128, String> {
    let parsed: i64 = value.parse().map_err(|e| format!("unable to convert {value:?} to int for operation {op:?}: {e}"))?;
    let limit = 1i64 << 32;
    if is_v4 && !(-limit..limit).contains(&parsed) {
        return Err(format!("unable to convert {value:?} to int for operation {op:?}: value out of range"));
    }
    Ok(i128::from(parsed))
}

// ---------------------------------------------------------------- template glue

/// The addresses one evaluation has handed to the template, by their Go string.
#[derive(Default)]
struct Arena {
    by_key: Mutex<HashMap<String, IfAddr>>,
}

impl Arena {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, IfAddr>> {
        // Entries are only ever inserted whole; a poisoned map is still usable.
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn value_of(&self, addr: &IfAddr) -> Result<Value, String> {
        let key = addr.go_string();
        let mut map = self.lock();
        if !map.contains_key(&key) {
            if map.len() >= MAX_ARENA_ENTRIES {
                return Err(format!("more than {MAX_ARENA_ENTRIES} addresses created"));
            }
            map.insert(key.clone(), addr.clone());
        }
        Ok(Value::String(key.into()))
    }

    fn list_value(&self, addrs: &[IfAddr]) -> Result<Value, String> {
        let items = addrs.iter().map(|a| self.value_of(a)).collect::<Result<Vec<_>, _>>()?;
        Ok(Value::List(items.into()))
    }

    fn addr_of(&self, v: &Value) -> Option<IfAddr> {
        match v {
            Value::String(s) => self.lock().get(&**s).cloned(),
            _ => None,
        }
    }

    /// The IfAddrs a pipeline passed in.
    fn addrs_of(&self, v: &Value) -> Result<Vec<IfAddr>, String> {
        match v {
            Value::List(items) => items.iter().map(|item| self.addr_of(item).ok_or_else(|| not_addrs(v))).collect(),
            _ => Err(not_addrs(v)),
        }
    }
}

fn not_addrs(v: &Value) -> String {
    format!("expected IfAddrs, got {} ({v})", v.type_name())
}

fn call_error(func: &str, message: impl std::fmt::Display) -> TemplateError {
    TemplateError::Exec(format!("error calling {func}: {message}"))
}

fn want_args(args: &[Value], n: usize) -> Result<(), String> {
    if args.len() == n { Ok(()) } else { Err(format!("wrong number of args: want {n} got {}", args.len())) }
}

fn str_arg(args: &[Value], i: usize) -> Result<&str, String> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("argument {} must be a string, got {}", i + 1, other.type_name())),
        None => Err(format!("missing argument {}", i + 1)),
    }
}

fn int_arg(args: &[Value], i: usize) -> Result<i64, String> {
    match args.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        Some(Value::Uint(n)) => i64::try_from(*n).map_err(|_| format!("{n} overflows int")),
        Some(other) => Err(format!("argument {} must be an integer, got {}", i + 1, other.type_name())),
        None => Err(format!("missing argument {}", i + 1)),
    }
}

fn addresses_joined(addrs: &[IfAddr]) -> String {
    addrs.iter().map(|a| go_ip_string(&a.address)).collect::<Vec<_>>().join(" ")
}

fn first_address(addrs: &[IfAddr]) -> String {
    addrs.first().map(|a| go_ip_string(&a.address)).unwrap_or_default()
}

/// IP addresses that are up, forwardable, default interface first, then IPv4, then larger networks.
fn candidates(all: &[IfAddr]) -> Result<Vec<IfAddr>, String> {
    let (forwardable, _) = by_flag("forwardable", all)?;
    let (up, _) = by_flag("up", &forwardable)?;
    sorted(&up, "default,type,size")
}

fn private_interfaces(all: &[IfAddr]) -> Result<Vec<IfAddr>, String> {
    Ok(candidates(all)?.into_iter().filter(is_private).collect())
}

fn public_interfaces(all: &[IfAddr]) -> Result<Vec<IfAddr>, String> {
    Ok(candidates(all)?.into_iter().filter(|a| !is_private(a)).collect())
}

fn named(all: &[IfAddr], pattern: &str) -> Result<Vec<IfAddr>, String> {
    select("name", pattern, all, true)
}

/// Registers `f` as `name`, prefixing its errors as Go's text/template does.
fn put(funcs: &mut FuncMap, name: &'static str, f: impl Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static) {
    let func: ValueFunc = Arc::new(move |args: &[Value]| f(args).map_err(|m| call_error(name, m)));
    funcs.insert(name.to_string(), func);
}

/// The go-sockaddr template functions over `all` (the host's addresses).
fn sockaddr_funcs(all: Arc<Vec<IfAddr>>, arena: Arc<Arena>) -> FuncMap {
    let mut funcs = FuncMap::new();
    type Source = fn(&[IfAddr]) -> Result<Vec<IfAddr>, String>;
    let sources: [(&'static str, Source); 4] = [
        ("GetAllInterfaces", |all| Ok(all.to_vec())),
        ("GetDefaultInterfaces", |all| {
            let defaults: Vec<IfAddr> = all.iter().filter(|a| a.is_default).cloned().collect();
            if defaults.is_empty() { Err("no default interface found".to_string()) } else { Ok(defaults) }
        }),
        ("GetPrivateInterfaces", private_interfaces),
        ("GetPublicInterfaces", public_interfaces),
    ];
    for (name, source) in sources {
        let (all, arena) = (all.clone(), arena.clone());
        put(&mut funcs, name, move |args| {
            want_args(args, 0)?;
            arena.list_value(&source(&all)?)
        });
    }

    type Report = fn(&[IfAddr]) -> Result<String, String>;
    let reports: [(&'static str, Report); 4] = [
        ("GetPrivateIP", |all| Ok(first_address(&private_interfaces(all)?))),
        ("GetPublicIP", |all| Ok(first_address(&public_interfaces(all)?))),
        // Every private address, default route or not, minus non-forwardable ones.
        ("GetPrivateIPs", |all| {
            let by_size = sorted(all, "type,size")?;
            Ok(addresses_joined(&by_size.into_iter().filter(|a| is_private(a) && is_forwardable(a)).collect::<Vec<_>>()))
        }),
        ("GetPublicIPs", |all| Ok(addresses_joined(&sorted(all, "type,size")?.into_iter().filter(|a| !is_private(a)).collect::<Vec<_>>()))),
    ];
    for (name, report) in reports {
        let all = all.clone();
        put(&mut funcs, name, move |args| {
            want_args(args, 0)?;
            Ok(Value::String(report(&all)?.into()))
        });
    }

    let all_ip = all.clone();
    put(&mut funcs, "GetInterfaceIP", move |args| {
        want_args(args, 1)?;
        let (forwardable, _) = by_flag("forwardable", &named(&all_ip, str_arg(args, 0)?)?)?;
        Ok(Value::String(first_address(&sorted(&forwardable, "+type,+size")?).into()))
    });
    let all_ips = all.clone();
    put(&mut funcs, "GetInterfaceIPs", move |args| {
        want_args(args, 1)?;
        let on_interface = named(&all_ips, str_arg(args, 0)?)?;
        Ok(Value::String(addresses_joined(&sorted(&on_interface, "+type,+size")?).into()))
    });

    for (name, keep_matched) in [("include", true), ("exclude", false)] {
        let arena = arena.clone();
        put(&mut funcs, name, move |args| {
            want_args(args, 3)?;
            let (selector, param) = (str_arg(args, 0)?, str_arg(args, 1)?);
            arena.list_value(&select(selector, param, &arena.addrs_of(&args[2])?, keep_matched)?)
        });
    }

    let a = arena.clone();
    put(&mut funcs, "sort", move |args| {
        want_args(args, 2)?;
        a.list_value(&sorted(&a.addrs_of(&args[1])?, str_arg(args, 0)?)?)
    });

    let a = arena.clone();
    put(&mut funcs, "limit", move |args| {
        want_args(args, 2)?;
        let limit = int_arg(args, 0)?;
        let limit = usize::try_from(limit).map_err(|_| format!("limit must not be negative, got {limit}"))?;
        let addrs = a.addrs_of(&args[1])?;
        a.list_value(&addrs[..limit.min(addrs.len())])
    });

    let a = arena.clone();
    put(&mut funcs, "offset", move |args| {
        want_args(args, 2)?;
        let offset = int_arg(args, 0)?;
        let addrs = a.addrs_of(&args[1])?;
        let skip = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
        if skip > addrs.len() {
            return Err(format!(
                "unable to seek past the end of the interface array: offset ({skip}) exceeds the number of interfaces ({})",
                addrs.len()
            ));
        }
        a.list_value(if offset < 0 { &addrs[addrs.len() - skip..] } else { &addrs[skip..] })
    });

    let a = arena.clone();
    put(&mut funcs, "unique", move |args| {
        want_args(args, 2)?;
        let selector = str_arg(args, 0)?;
        let key_of: fn(&IfAddr) -> String = match selector.to_lowercase().as_str() {
            "address" => |addr| addr.net().sockaddr_string(),
            "name" => |addr| addr.name.clone(),
            _ => return Err(format!("unsupported unique constraint {selector:?}")),
        };
        // Drops an address equal to the one before it: the input is expected sorted.
        let mut kept = Vec::new();
        let mut last = String::new();
        for addr in a.addrs_of(&args[1])? {
            let key = key_of(&addr);
            if last.is_empty() || last != key {
                last = key;
                kept.push(addr);
            }
        }
        a.list_value(&kept)
    });

    let a = arena.clone();
    put(&mut funcs, "attr", move |args| {
        want_args(args, 2)?;
        let name = str_arg(args, 0)?;
        let value = match (&args[1], a.addr_of(&args[1])) {
            (_, Some(addr)) => attr(&addr, name)?,
            (Value::List(_), None) => match a.addrs_of(&args[1])?.first() {
                Some(first) => attr(first, name)?,
                None => String::new(),
            },
            (other, None) => return Err(format!("unable to obtain attribute {name} from type {} ({other})", other.type_name())),
        };
        Ok(Value::String(value.into()))
    });

    let a = arena.clone();
    put(&mut funcs, "join", move |args| {
        want_args(args, 3)?;
        let (name, separator) = (str_arg(args, 0)?, str_arg(args, 1)?);
        let values = a.addrs_of(&args[2])?.iter().map(|addr| attr(addr, name)).collect::<Result<Vec<_>, _>>()?;
        Ok(Value::String(values.join(separator).into()))
    });

    let a = arena;
    put(&mut funcs, "math", move |args| {
        want_args(args, 3)?;
        let (op, value) = (str_arg(args, 0)?, str_arg(args, 1)?);
        let mut out = Vec::new();
        for addr in a.addrs_of(&args[2])? {
            let result =
                math(op, value, &addr).map_err(|e| format!("unable to perform an IPMath operation on {}: {e}", addr.go_string()))?;
            out.push(result);
        }
        a.list_value(&out)
    });
    funcs
}

/// An error's text without gotmpl's "execution error: " prefix for function errors.
fn message_of(e: TemplateError) -> String {
    match e {
        TemplateError::Exec(message) => message,
        other => other.to_string(),
    }
}

/// Evaluates the go-sockaddr template `{{ <expr> }}` against `ifaces`.
pub fn eval(expr: &str, ifaces: &[IfAddr]) -> Result<String, String> {
    if expr.len() > MAX_EXPRESSION_LEN {
        return Err(format!("expression is {} bytes, more than the {MAX_EXPRESSION_LEN} allowed", expr.len()));
    }
    let source = format!("{{{{ {expr} }}}}");
    let arena = Arc::new(Arena::default());
    let all = Arc::new(ifaces.to_vec());
    let dot = arena.list_value(&all)?;
    let template = Template::new("sockaddr.Parse")
        .missing_key(MissingKey::Error)
        .max_range_iters(MAX_RANGE_ITERS)
        .funcs(sockaddr_funcs(all, arena))
        .parse(&source)
        .map_err(|e| format!("unable to parse template {source:?}: {e}"))?;
    let out = template.execute_to_string(&dot).map_err(|e| format!("unable to execute sockaddr input {source:?}: {}", message_of(e)))?;
    if out.len() > MAX_OUTPUT_LEN {
        return Err(format!("output is {} bytes, more than the {MAX_OUTPUT_LEN} allowed", out.len()));
    }
    Ok(out)
}

// ---------------------------------------------------------------- host discovery

/// The interface of the first IPv4 default route through a gateway, as
/// go-sockaddr reads `ip route` ("default via X dev Y").
fn default_route_v4(proc_net_route: &str) -> Option<String> {
    proc_net_route.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (iface, destination, flags, mask) = (fields.first()?, fields.get(1)?, fields.get(3)?, fields.get(7)?);
        let flags = u32::from_str_radix(flags, 16).ok()?;
        let is_default = *destination == "00000000" && *mask == "00000000";
        (is_default && flags & (RTF_UP | RTF_GATEWAY) == (RTF_UP | RTF_GATEWAY)).then(|| iface.to_string())
    })
}

/// The interface of the lowest-metric IPv6 default route through a gateway.
fn default_route_v6(proc_net_ipv6_route: &str) -> Option<String> {
    proc_net_ipv6_route
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (destination, prefix, metric, flags, iface) =
                (fields.first()?, fields.get(1)?, fields.get(5)?, fields.get(8)?, fields.get(9)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let metric = u32::from_str_radix(metric, 16).ok()?;
            let usable = flags & (RTF_UP | RTF_GATEWAY) == (RTF_UP | RTF_GATEWAY) && flags & RTF_REJECT == 0 && *iface != "lo";
            let is_default = destination.bytes().all(|b| b == b'0') && *prefix == "00";
            (usable && is_default).then(|| (metric, iface.to_string()))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, iface)| iface)
}

/// The host's default-route interface: IPv4 first (as go-sockaddr), then IPv6.
fn default_interface() -> Option<String> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    read("/proc/net/route")
        .and_then(|table| default_route_v4(&table))
        .or_else(|| read("/proc/net/ipv6_route").and_then(|table| default_route_v6(&table)))
}

fn mac_string(mac: &[u8]) -> String {
    let mut out = String::new();
    for (i, byte) in mac.iter().enumerate() {
        let sep = if i == 0 { "" } else { ":" };
        let _ = write!(out, "{sep}{byte:02x}");
    }
    out
}

/// Every IP address of every interface, ordered by interface index (IPv4
/// before IPv6 within one), as Go's `net.Interfaces` + `Addrs` give them.
pub fn host_interfaces() -> Result<Vec<IfAddr>, String> {
    use nix::net::if_::InterfaceFlags;

    let entries = nix::ifaddrs::getifaddrs().map_err(|e| format!("unable to query interface addresses: {e}"))?;
    let default_iface = default_interface();
    let mut hardware: HashMap<String, String> = HashMap::new();
    let mut found = Vec::new();
    for entry in entries {
        // glibc names labelled IPv4 aliases "eth0:1"; link names cannot hold ':'.
        let name = entry.interface_name.split(':').next().unwrap_or_default().to_string();
        let Some(address) = entry.address else { continue };
        if let Some(link) = address.as_link_addr() {
            // Go leaves an all-zero hardware address (loopback) empty.
            if let Some(mac) = link.addr().filter(|mac| mac.iter().any(|b| *b != 0)) {
                hardware.insert(name, mac_string(&mac));
            }
            continue;
        }
        let (ip, prefix_len) = if let Some(sin) = address.as_sockaddr_in() {
            let bits = entry.netmask.as_ref().and_then(|m| m.as_sockaddr_in()).map_or(32, |m| u32::from(m.ip()).count_ones());
            (IpAddr::V4(sin.ip()), bits)
        } else if let Some(sin6) = address.as_sockaddr_in6() {
            let bits = entry.netmask.as_ref().and_then(|m| m.as_sockaddr_in6()).map_or(128, |m| u128::from(m.ip()).count_ones());
            (IpAddr::V6(sin6.ip()), bits)
        } else {
            continue;
        };
        let flags = IfFlags {
            up: entry.flags.contains(InterfaceFlags::IFF_UP),
            broadcast: entry.flags.contains(InterfaceFlags::IFF_BROADCAST),
            loopback: entry.flags.contains(InterfaceFlags::IFF_LOOPBACK),
            point_to_point: entry.flags.contains(InterfaceFlags::IFF_POINTOPOINT),
            multicast: entry.flags.contains(InterfaceFlags::IFF_MULTICAST),
            running: entry.flags.contains(InterfaceFlags::IFF_RUNNING),
        };
        let index = nix::net::if_::if_nametoindex(name.as_str()).unwrap_or(0);
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let is_default = default_iface.as_deref() == Some(name.as_str());
        // A netmask has at most 128 bits set.
        let prefix_len = u8::try_from(prefix_len).unwrap_or(128);
        found.push(IfAddr { name, index, mtu, hardware_addr: String::new(), flags, address: ip, prefix_len, is_default });
    }
    for addr in &mut found {
        addr.hardware_addr = hardware.get(&addr.name).cloned().unwrap_or_default();
    }
    // Stable: keeps the kernel's address order within an interface.
    found.sort_by_key(|a| a.index);
    Ok(found)
}

/// consul-template's `sockaddr` template function.
pub(super) fn sockaddr_func() -> ValueFunc {
    Arc::new(|args: &[Value]| {
        let mut parts = Vec::with_capacity(args.len());
        for (i, arg) in args.iter().enumerate() {
            match arg {
                Value::String(s) => parts.push(&**s),
                other => return Err(call_error("sockaddr", format!("argument {} must be a string, got {}", i + 1, other.type_name()))),
            }
        }
        let expr = parts.join(" ");
        if expr.len() > MAX_EXPRESSION_LEN {
            return Err(call_error("sockaddr", format!("expression is {} bytes, more than the {MAX_EXPRESSION_LEN} allowed", expr.len())));
        }
        let ifaces = host_interfaces().map_err(|e| call_error("sockaddr", e))?;
        eval(&expr, &ifaces).map(|out| Value::String(out.into())).map_err(|e| call_error("sockaddr", e))
    })
}

#[cfg(test)]
#[path = "sockaddr_tests.rs"]
mod tests;
