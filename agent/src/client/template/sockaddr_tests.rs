use std::net::IpAddr;

use super::*;

const UP: IfFlags = IfFlags { up: true, broadcast: true, loopback: false, point_to_point: false, multicast: true, running: true };
const LOOPBACK: IfFlags = IfFlags { up: true, broadcast: false, loopback: true, point_to_point: false, multicast: false, running: true };
const DOWN: IfFlags = IfFlags { up: false, broadcast: true, loopback: false, point_to_point: false, multicast: true, running: false };

fn ifaddr(name: &str, index: u32, flags: IfFlags, cidr: &str, is_default: bool) -> IfAddr {
    let (ip, prefix) = cidr.split_once('/').expect("test CIDR has a prefix");
    IfAddr {
        name: name.to_string(),
        index,
        mtu: if flags.loopback { 65536 } else { 1500 },
        hardware_addr: if flags.loopback { String::new() } else { format!("02:42:ac:11:00:{index:02x}") },
        flags,
        address: ip.parse::<IpAddr>().expect("test address parses"),
        prefix_len: prefix.parse().expect("test prefix parses"),
        is_default,
    }
}

/// A host whose default route is on eth0, with a second public NIC, a
/// docker bridge with a larger private network, and a down WLAN.
fn host() -> Vec<IfAddr> {
    vec![
        ifaddr("lo", 1, LOOPBACK, "127.0.0.1/8", false),
        ifaddr("lo", 1, LOOPBACK, "::1/128", false),
        ifaddr("eth0", 2, UP, "10.0.0.5/24", true),
        ifaddr("eth0", 2, UP, "2600::1/64", true),
        ifaddr("eth0", 2, UP, "fd00::5/64", true),
        ifaddr("eth0", 2, UP, "fe80::1/64", true),
        ifaddr("eth1", 3, UP, "203.0.114.7/24", false),
        ifaddr("docker0", 4, UP, "172.17.0.1/16", false),
        ifaddr("wlan0", 5, DOWN, "192.168.1.9/24", false),
    ]
}

fn run(expr: &str) -> String {
    match eval(expr, &host()) {
        Ok(out) => out,
        Err(e) => panic!("{expr}: {e}"),
    }
}

fn run_err(expr: &str) -> String {
    match eval(expr, &host()) {
        Ok(out) => panic!("{expr}: expected an error, got {out:?}"),
        Err(e) => e,
    }
}

#[test]
fn private_ip_prefers_the_default_route_interface() {
    // docker0's /16 is a larger network, but eth0 carries the default route.
    assert_eq!(run("GetPrivateIP"), "10.0.0.5");
}

#[test]
fn private_ip_without_default_route_takes_the_largest_up_network() {
    let no_default: Vec<IfAddr> = host().into_iter().map(|a| IfAddr { is_default: false, ..a }).collect();
    assert_eq!(eval("GetPrivateIP", &no_default).as_deref(), Ok("172.17.0.1"));
    assert_eq!(eval("GetDefaultInterfaces", &no_default), Err("unable to execute sockaddr input \"{{ GetDefaultInterfaces }}\": error calling GetDefaultInterfaces: no default interface found".to_string()));
}

#[test]
fn private_ip_skips_loopback_link_local_and_down_interfaces() {
    let only = vec![
        ifaddr("lo", 1, LOOPBACK, "127.0.0.1/8", true),
        ifaddr("eth0", 2, UP, "169.254.3.4/16", true),
        ifaddr("wlan0", 3, DOWN, "192.168.1.9/24", true),
    ];
    assert_eq!(eval("GetPrivateIP", &only).as_deref(), Ok(""));
}

#[test]
fn public_ip_is_a_forwardable_non_rfc6890_address() {
    // The default route's interface wins over IPv4-first: eth0's IPv6 address beats eth1.
    assert_eq!(run("GetPublicIP"), "2600::1");
    assert_eq!(run("GetPublicIPs"), "203.0.114.7 2600::1");
    let v4_only: Vec<IfAddr> = host().into_iter().filter(|a| a.address != "2600::1".parse::<IpAddr>().expect("parses")).collect();
    assert_eq!(eval("GetPublicIP", &v4_only).as_deref(), Ok("203.0.114.7"));
}

#[test]
fn private_ips_lists_every_forwardable_private_address_by_type_then_size() {
    // Loopback and fe80:: are private but not forwardable; wlan0 being down does not matter here.
    assert_eq!(run("GetPrivateIPs"), "172.17.0.1 10.0.0.5 192.168.1.9 fd00::5");
}

#[test]
fn rfc6890_includes_shared_address_space_and_the_2001_superblock() {
    let only = vec![ifaddr("eth0", 2, UP, "100.64.1.2/24", true), ifaddr("eth0", 2, UP, "2001:470::1/64", true)];
    assert_eq!(eval("GetPrivateIPs", &only).as_deref(), Ok("100.64.1.2 2001:470::1"));
    assert_eq!(eval("GetPublicIP", &only).as_deref(), Ok(""));
}

#[test]
fn interface_ip_by_name() {
    assert_eq!(run(r#"GetInterfaceIP "eth0""#), "10.0.0.5");
    assert_eq!(run(r#"GetInterfaceIPs "eth0""#), "10.0.0.5 2600::1 fd00::5 fe80::1");
    // Only forwardable addresses count for GetInterfaceIP.
    assert_eq!(run(r#"GetInterfaceIP "^lo$""#), "");
    assert_eq!(run(r#"GetInterfaceIPs "^lo$""#), "127.0.0.1 ::1");
    assert_eq!(run(r#"GetInterfaceIP "nope0""#), "");
}

#[test]
fn include_by_name_and_type_then_attr() {
    assert_eq!(run(r#"GetAllInterfaces | include "name" "lo" | include "type" "IPv4" | attr "address""#), "127.0.0.1");
    assert_eq!(run(r#"GetAllInterfaces | include "type" "ipv6" | include "name" "eth0" | join "address" ",""#), "2600::1,fd00::5,fe80::1");
}

#[test]
fn include_and_exclude_by_flags_rfc_network_and_size() {
    assert_eq!(run(r#"GetAllInterfaces | include "flags" "loopback" | join "address" " ""#), "127.0.0.1 ::1");
    assert_eq!(run(r#"GetAllInterfaces | exclude "flags" "up" | join "name" " ""#), "wlan0");
    assert_eq!(
        run(r#"GetAllInterfaces | include "flag" "forwardable" | include "type" "ipv4" | join "address" " ""#),
        "10.0.0.5 203.0.114.7 172.17.0.1 192.168.1.9"
    );
    assert_eq!(run(r#"GetAllInterfaces | include "rfc" "1918" | join "address" " ""#), "10.0.0.5 172.17.0.1 192.168.1.9");
    assert_eq!(run(r#"GetAllInterfaces | exclude "RFC" "6890" | join "address" " ""#), "2600::1 203.0.114.7");
    assert_eq!(run(r#"GetAllInterfaces | include "network" "10.0.0.0/8|172.16.0.0/12" | join "address" " ""#), "10.0.0.5 172.17.0.1");
    assert_eq!(run(r#"GetAllInterfaces | include "size" "16" | attr "address""#), "172.17.0.1");
    assert_eq!(run(r#"GetAllInterfaces | include "address" "^fd" | attr "string""#), "fd00::5/64");
}

#[test]
fn sort_limit_offset_and_unique() {
    assert_eq!(
        run(r#"GetAllInterfaces | include "type" "ipv4" | sort "-size" | join "address" " ""#),
        "10.0.0.5 203.0.114.7 192.168.1.9 172.17.0.1 127.0.0.1"
    );
    assert_eq!(run(r#"GetAllInterfaces | sort "name,address" | unique "name" | join "name" " ""#), "docker0 eth0 eth1 lo wlan0");
    assert_eq!(run(r#"GetAllInterfaces | include "type" "ipv4" | sort "address" | limit 2 | join "address" " ""#), "10.0.0.5 127.0.0.1");
    assert_eq!(run(r#"GetAllInterfaces | include "type" "ipv4" | sort "+address" | offset -1 | attr "address""#), "203.0.114.7");
    assert_eq!(run(r#"GetAllInterfaces | include "type" "ipv4" | sort "-private" | attr "address""#), "203.0.114.7");
    // As in go-sockaddr, a private address sorts before any address of the other family.
    assert_eq!(run(r#"GetAllInterfaces | sort "private,type" | attr "address""#), "::1");
    assert_eq!(run(r#"GetAllInterfaces | sort "default" | attr "name""#), "eth0");
    assert_eq!(run(r#"GetAllInterfaces | include "name" "^lo$" | limit 9 | len"#), "2");
}

#[test]
fn attributes_match_go_sockaddr_strings() {
    let eth0 = r#"GetAllInterfaces | include "name" "eth0" | include "type" "ipv4" | attr "#;
    let expected = [
        ("name", "eth0"),
        ("type", "IPv4"),
        ("address", "10.0.0.5"),
        ("string", "10.0.0.5/24"),
        ("network", "10.0.0.0"),
        ("mask_bits", "24"),
        ("netmask", "255.255.255.0"),
        ("broadcast", "255.255.255.255"),
        ("first_usable", "10.0.0.1"),
        ("last_usable", "10.0.0.254"),
        ("size", "256"),
        ("uint32", "167772165"),
        ("hex", "0a000005"),
        ("octets", "10 0 0 5"),
        ("port", "0"),
        ("flags", "up|broadcast|multicast|running"),
        ("NAME", "eth0"),
    ];
    for (attr_name, want) in expected {
        if attr_name == "broadcast" {
            assert_eq!(run(&format!("{eth0}\"{attr_name}\"")), "10.0.0.255", "broadcast is the subnet's");
            continue;
        }
        assert_eq!(run(&format!("{eth0}\"{attr_name}\"")), want, "attr {attr_name}");
    }
    let v6 = r#"GetAllInterfaces | include "address" "^fd00" | attr "#;
    assert_eq!(run(&format!("{v6}\"netmask\"")), "ffff:ffff:ffff:ffff::");
    assert_eq!(run(&format!("{v6}\"network\"")), "fd00::");
    assert_eq!(run(&format!("{v6}\"size\"")), "18446744073709551616");
    assert_eq!(run(&format!("{v6}\"type\"")), "IPv6");
    assert!(run_err(&format!("{v6}\"broadcast\"")).contains("unsupported attribute name \"broadcast\""));
    // attr on an empty list is empty, as go-sockaddr's IfAttrs.
    assert_eq!(run(r#"GetAllInterfaces | include "name" "nothing" | attr "address""#), "");
    assert_eq!(run(r#"GetAllInterfaces | include "name" "lo" | attr "flags""#), "up|loopback|running");
}

#[test]
fn attr_works_on_a_single_address() {
    assert_eq!(run(r#"attr "name" (index GetAllInterfaces 2)"#), "eth0");
}

#[test]
fn bare_lists_print_like_go() {
    assert_eq!(run(r#"GetDefaultInterfaces | limit 1"#), "[10.0.0.5/24 {2 1500 eth0 02:42:ac:11:00:02 up|broadcast|multicast|running}]");
    assert_eq!(
        run(r#"GetAllInterfaces | include "name" "^lo$""#),
        "[127.0.0.1/8 {1 65536 lo  up|loopback|running} ::1 {1 65536 lo  up|loopback|running}]"
    );
    assert_eq!(run(r#"GetAllInterfaces | include "name" "none""#), "[]");
    // The dot is every address.
    assert_eq!(run(r#". | len"#), "9");
}

#[test]
fn math_on_addresses() {
    let eth0 = r#"GetAllInterfaces | include "name" "eth0" | include "type" "ipv4" | "#;
    assert_eq!(run(&format!(r#"{eth0}math "address" "+2" | attr "address""#)), "10.0.0.7");
    assert_eq!(run(&format!(r#"{eth0}math "address" "-6" | attr "address""#)), "9.255.255.255");
    assert_eq!(run(&format!(r#"{eth0}math "network" "+7" | attr "address""#)), "10.0.0.7");
    assert_eq!(run(&format!(r#"{eth0}math "network" "-1" | attr "address""#)), "10.0.0.255");
    assert_eq!(run(&format!(r#"{eth0}math "mask" "8" | attr "string""#)), "10.0.0.0/8");
    let v6 = r#"GetAllInterfaces | include "address" "^fd00" | "#;
    assert_eq!(run(&format!(r#"{v6}math "address" "+1" | attr "address""#)), "fd00::6");
    assert_eq!(run(&format!(r#"{v6}math "network" "-1" | attr "address""#)), "fd00::ffff:ffff:ffff:ffff");
    assert!(run_err(&format!(r#"{eth0}math "address" "2""#)).contains("sign (+/-) is required"));
    assert!(run_err(&format!(r#"{eth0}math "mask" "33""#)).contains("must be between 0 and 32"));
    assert!(run_err(&format!(r#"{eth0}math "rotate" "+1""#)).contains("unsupported math operation: \"rotate\""));
}

#[test]
fn unknown_functions_and_bad_arguments_are_errors() {
    assert!(run_err("GetFavouriteIP").contains("GetFavouriteIP"));
    assert!(run_err(r#"GetAllInterfaces | include "colour" "red""#).contains("error calling include: invalid include selector \"colour\""));
    assert!(run_err(r#"GetAllInterfaces | exclude "colour" "red""#).contains("invalid exclude selector \"colour\""));
    assert!(run_err(r#"GetAllInterfaces | sort "speed""#).contains("unknown sort type: \"speed\""));
    assert!(run_err(r#"GetAllInterfaces | include "name" "(""#).contains("unable to compile name regexp"));
    assert!(run_err(r#"GetAllInterfaces | include "flags" "up,loopback""#).contains("unknown interface flag: \"up,loopback\""));
    assert!(run_err(r#"GetAllInterfaces | include "type" "ipx""#).contains("unsupported type \"ipx\""));
    assert!(run_err(r#"GetAllInterfaces | include "rfc" "1""#).contains("unsupported RFC 1"));
    assert!(
        run_err(r#"GetAllInterfaces | include "network" "10.0.0.0/33""#).contains("unable to create an IP address from \"10.0.0.0/33\"")
    );
    assert!(run_err(r#"GetAllInterfaces | attr "colour""#).contains("unsupported attribute name \"colour\""));
    assert!(run_err(r#"GetAllInterfaces | join "colour" ",""#).contains("unsupported attribute name \"colour\""));
    assert!(run_err(r#"GetAllInterfaces | unique "type""#).contains("unsupported unique constraint \"type\""));
    assert!(run_err(r#"GetAllInterfaces | limit "2""#).contains("argument 1 must be an integer"));
    assert!(run_err(r#"GetAllInterfaces | limit -1"#).contains("limit must not be negative"));
    assert!(run_err(r#"GetAllInterfaces | offset 10"#).contains("offset (10) exceeds the number of interfaces (9)"));
    assert!(run_err(r#"GetAllInterfaces | include "name""#).contains("wrong number of args: want 3 got 2"));
    assert!(run_err(r#""10.0.0.1/8 {1 1500 x  up}" | include "name" "x""#).contains("expected IfAddrs, got string"));
    assert!(run_err(r#"GetPrivateIP "extra""#).contains("wrong number of args: want 0 got 1"));
    assert!(run_err(r#"{{ GetPrivateIP"#).contains("unable to parse template"));
}

#[test]
fn long_expressions_are_refused() {
    let long = format!("GetPrivateIP {}", " ".repeat(MAX_EXPRESSION_LEN));
    assert!(eval(&long, &host()).is_err_and(|e| e.contains("more than the 4096 allowed")));
}

#[test]
fn range_iterations_are_bounded() {
    let nested = "range $a := GetAllInterfaces }}{{ range $b := GetAllInterfaces }}{{ range $c := GetAllInterfaces }}{{ range $d := GetAllInterfaces }}{{ range $e := GetAllInterfaces }}x{{ end }}{{ end }}{{ end }}{{ end }}{{ end";
    assert!(eval(nested, &host()).is_err());
}

#[test]
fn sorting_a_long_mixed_list_is_stable_and_total() {
    // More entries than the insertion-sort cutoff, mixing families whose size comparison defers.
    let mut many = Vec::new();
    for i in 0..40u32 {
        let cidr = if i % 2 == 0 { format!("10.0.{i}.1/{}", 8 + i % 17) } else { format!("fd00::{i:x}/{}", 48 + i % 33) };
        many.push(ifaddr(&format!("eth{i}"), i, UP, &cidr, i == 7));
    }
    let out = eval(r#"GetAllInterfaces | sort "type,size,name" | join "name" " ""#, &many).expect("sorts");
    let names: Vec<&str> = out.split(' ').collect();
    assert_eq!(names.len(), 40);
    // IPv4 (even indexes) first, each family by ascending prefix.
    assert!(names[..20].iter().all(|n| n.trim_start_matches("eth").parse::<u32>().is_ok_and(|i| i % 2 == 0)));
    assert_eq!(eval(r#"GetPrivateIP"#, &many).as_deref(), Ok("fd00::7"));
}

#[test]
fn default_route_from_proc_net_route() {
    let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 tun0\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n\
                 eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                 eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                 eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n";
    // tun0's default has no gateway, which `ip route` prints without "via".
    assert_eq!(default_route_v4(table).as_deref(), Some("eth0"));
    assert_eq!(default_route_v4("Iface\tDestination\n"), None);
    assert_eq!(default_route_v4("Iface\nbroken line\n"), None);
}

#[test]
fn default_route_from_proc_net_ipv6_route() {
    let zero = "00000000000000000000000000000000";
    let table = format!(
        "{zero} 00 {zero} 00 {zero} ffffffff 00000001 00000000 00200200       lo\n\
         fe800000000000000000000000000000 40 {zero} 00 {zero} 00000100 00000001 00000000 00000001     eth0\n\
         {zero} 00 {zero} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth1\n\
         {zero} 00 {zero} 00 fe800000000000000000000000000001 00000064 00000001 00000000 00000003     eth0\n"
    );
    // The reject route on lo is skipped; the lower metric wins.
    assert_eq!(default_route_v6(&table).as_deref(), Some("eth0"));
    assert_eq!(default_route_v6(""), None);
}

#[test]
fn host_interfaces_include_loopback() {
    let ifaces = host_interfaces().expect("getifaddrs works");
    let lo = ifaces.iter().find(|a| a.address == IpAddr::from([127, 0, 0, 1])).expect("127.0.0.1 is configured");
    assert!(lo.flags.loopback);
    assert!(lo.flags.up);
    assert_eq!(lo.prefix_len, 8);
    assert_eq!(lo.name, "lo");
    assert!(lo.index > 0);
    assert!(lo.hardware_addr.is_empty());
    // Ordered by interface index.
    assert!(ifaces.windows(2).all(|w| w[0].index <= w[1].index));
}

#[test]
fn sockaddr_func_joins_its_arguments_and_evaluates_on_the_host() {
    let func = sockaddr_func();
    let args: Vec<Value> = ["GetAllInterfaces", r#"| include "name" "^lo$""#, r#"| include "type" "IPv4""#, r#"| attr "address""#]
        .into_iter()
        .map(|s| Value::String(s.into()))
        .collect();
    match func(&args) {
        Ok(Value::String(s)) => assert_eq!(&*s, "127.0.0.1"),
        other => panic!("unexpected {other:?}"),
    }
    let err = func(&[Value::Int(1)]).expect_err("non-string argument");
    assert!(matches!(&err, TemplateError::Exec(m) if m == "error calling sockaddr: argument 1 must be a string, got int"), "{err}");
    let err = func(&[Value::String("GetNothing".into())]).expect_err("unknown function");
    assert!(matches!(&err, TemplateError::Exec(m) if m.starts_with("error calling sockaddr: unable to execute sockaddr input")), "{err}");
    assert!(err.to_string().contains("GetNothing"), "{err}");
}
