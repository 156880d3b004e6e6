//! `cidrhost`, `cidrnetmask`, `cidrsubnet`, `cidrsubnets` (go-cty-funcs on
//! apparentlymart/go-cidr), for IPv4 and IPv6. Addresses are computed as
//! integers of the family's width.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hcl::Value;

use super::{arity, string_arg, whole};

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "cidrhost" => {
            arity(args, 2, 2)?;
            let net = Network::parse(&string_arg(&args[0])?)?;
            let host = whole(&args[1])?;
            let host_bits = net.bits - net.prefix;
            let size: i128 = if host_bits >= 127 { i128::MAX } else { 1i128 << host_bits };
            let offset = if host < 0 { size + i128::from(host) } else { i128::from(host) };
            if offset < 0 || offset >= size {
                return Err(format!("prefix of {} does not accommodate a host numbered {host}", net.prefix));
            }
            Ok(Value::String(net.address_string(net.base + offset as u128)))
        }
        "cidrnetmask" => {
            arity(args, 1, 1)?;
            let net = Network::parse(&string_arg(&args[0])?)?;
            Ok(Value::String(net.address_string(mask(net.bits, net.prefix))))
        }
        "cidrsubnet" => {
            arity(args, 3, 3)?;
            let net = Network::parse(&string_arg(&args[0])?)?;
            let newbits = whole(&args[1])?;
            let netnum = whole(&args[2])?;
            if newbits > 32 {
                return Err("may not extend prefix by more than 32 bits".to_string());
            }
            if newbits < 0 || net.prefix + newbits as u32 > net.bits {
                return Err(format!("insufficient address space to extend prefix of {} by {newbits}", net.prefix));
            }
            let new_prefix = net.prefix + newbits as u32;
            if netnum < 0 || netnum as u128 >= 1u128 << newbits {
                return Err(format!("prefix extension of {newbits} does not accommodate a subnet numbered {netnum}"));
            }
            let base = net.base | ((netnum as u128) << (net.bits - new_prefix));
            Ok(Value::String(format!("{}/{new_prefix}", net.address_string(base))))
        }
        "cidrsubnets" => subnets(args),
        _ => unreachable!("{name} is not a cidr function"),
    }
}

/// A parsed prefix: its family width, prefix length and first address.
struct Network {
    bits: u32,
    prefix: u32,
    base: u128,
}

impl Network {
    /// Go's `net.ParseCIDR`: an address and a prefix length; host bits are cleared.
    fn parse(s: &str) -> Result<Network, String> {
        let invalid = || format!("invalid CIDR expression: invalid CIDR address: {s}");
        let (addr, len) = s.split_once('/').ok_or_else(invalid)?;
        if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        let prefix: u32 = len.parse().map_err(|_| invalid())?;
        let (bits, value) = match addr.parse::<IpAddr>().map_err(|_| invalid())? {
            IpAddr::V4(a) => (32, u128::from(u32::from(a))),
            IpAddr::V6(a) => (128, u128::from(a)),
        };
        if prefix > bits {
            return Err(invalid());
        }
        Ok(Network { bits, prefix, base: value & mask(bits, prefix) })
    }

    fn address_string(&self, value: u128) -> String {
        if self.bits == 32 { Ipv4Addr::from(value as u32).to_string() } else { Ipv6Addr::from(value).to_string() }
    }

    fn last(&self, prefix: u32) -> u128 {
        self.base | !mask(self.bits, prefix) & all_ones(self.bits)
    }
}

fn all_ones(bits: u32) -> u128 {
    if bits == 128 { u128::MAX } else { (1u128 << bits) - 1 }
}

fn mask(bits: u32, prefix: u32) -> u128 {
    if prefix == 0 { 0 } else { all_ones(bits) & !(all_ones(bits) >> prefix) }
}

/// Consecutive subnets of the given extensions, each aligned after the previous one (go-cidr's
/// `PreviousSubnet`/`NextSubnet` walk).
fn subnets(args: &[Value]) -> Result<Value, String> {
    arity(args, 1, usize::MAX)?;
    let net = Network::parse(&string_arg(&args[0])?)?;
    if args.len() == 1 {
        return Ok(Value::Array(Vec::new()));
    }
    let family = if net.bits == 32 { "IPv4" } else { "IPv6" };
    let wrap = all_ones(net.bits);
    let first = net.prefix + whole(&args[1])?.clamp(0, 128) as u32;
    // The subnet of the first length just before the network, so the first step lands on its start.
    let mut current = Network { bits: net.bits, prefix: first.min(net.bits), base: 0 };
    current.base = net.base.wrapping_sub(1) & wrap & mask(net.bits, current.prefix);
    let mut out = Vec::with_capacity(args.len() - 1);
    for (i, arg) in args[1..].iter().enumerate() {
        let newbits = whole(arg).map_err(|e| format!("argument {}: {e}", i + 2))?;
        if newbits < 1 {
            return Err(format!("argument {}: must extend prefix by at least one bit", i + 2));
        }
        if newbits > 32 {
            return Err(format!("argument {}: may not extend prefix by more than 32 bits", i + 2));
        }
        let length = net.prefix + newbits as u32;
        if length > net.bits {
            return Err(format!("argument {}: would extend prefix to {length} bits, which is too long for an {family} address", i + 2));
        }
        let last = current.last(current.prefix);
        let aligned = Network { bits: net.bits, prefix: length, base: last & mask(net.bits, length) };
        let next_start = aligned.last(length).wrapping_add(1) & wrap;
        let next = Network { bits: net.bits, prefix: length, base: next_start & mask(net.bits, length) };
        let rollover = next_start == 0;
        if rollover || next.base & mask(net.bits, net.prefix) != net.base {
            return Err(format!(
                "argument {}: not enough remaining address space for a subnet with a prefix of {length} bits after {}/{}",
                i + 2,
                current.address_string(current.base),
                current.prefix
            ));
        }
        out.push(Value::String(format!("{}/{length}", next.address_string(next.base))));
        current = next;
    }
    Ok(Value::Array(out))
}
