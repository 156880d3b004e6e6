use std::sync::Mutex;

use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources};
use serde_json::json;

use super::cni::*;
use super::*;

#[test]
fn the_bridge_conflist_is_nomads() {
    let list = bridge_conflist("nomad", "172.26.64.0/20", false);
    let expected = json!({
        "cniVersion": "0.4.0",
        "name": "nomad",
        "plugins": [
            {"type": "loopback"},
            {
                "type": "bridge",
                "bridge": "nomad",
                "ipMasq": true,
                "isGateway": true,
                "forceAddress": true,
                "hairpinMode": false,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "172.26.64.0/20"}]], "routes": [{"dst": "0.0.0.0/0"}]}
            },
            {"type": "firewall", "backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN"},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    });
    assert_eq!(list, expected);
    let hairpin = bridge_conflist("br0", "10.1.0.0/24", true);
    assert_eq!(hairpin["plugins"][1]["hairpinMode"], json!(true));
    assert_eq!(hairpin["plugins"][1]["bridge"], json!("br0"));
}

fn alloc_with_ports(ports: &[(i64, i64)]) -> Allocation {
    let mut resources = AllocatedResources::default();
    resources.shared.ports = ports
        .iter()
        .map(|(value, to)| AllocatedPortMapping { label: "p".into(), value: *value, to: *to, host_ip: "10.0.0.9".into() })
        .collect();
    Allocation { id: "a1".into(), allocated_resources: Some(resources), ..Allocation::default() }
}

#[test]
fn each_port_maps_tcp_and_udp_to_its_to_or_its_own_value() {
    let maps = port_mappings(&alloc_with_ports(&[(25000, 8080), (25001, 0)]));
    let got: Vec<(i64, i64, &str, &str)> =
        maps.iter().map(|m| (m.host_port, m.container_port, m.protocol.as_str(), m.host_ip.as_str())).collect();
    assert_eq!(got, [(25000, 8080, "tcp", ""), (25000, 8080, "udp", ""), (25001, 25001, "tcp", ""), (25001, 25001, "udp", "")]);
    assert_eq!(serde_json::to_value(&maps[0]).unwrap(), json!({"hostPort": 25000, "containerPort": 8080, "protocol": "tcp"}));
    assert!(port_mappings(&Allocation::default()).is_empty());
}

fn inv(ports: Vec<PortMapping>) -> Invocation {
    Invocation {
        container_id: "a1".into(),
        netns: "/var/run/netns/a1".into(),
        ifname: "eth0".into(),
        path: vec!["/x".into()],
        port_mappings: ports,
    }
}

#[test]
fn a_plugin_gets_the_list_name_version_its_capabilities_runtime_config_and_the_previous_result() {
    let list = NetworkList::from_conflist(&bridge_conflist("nomad", "172.26.64.0/20", false)).unwrap();
    let ports = port_mappings(&alloc_with_ports(&[(25000, 8080)]));
    let prev = json!({"cniVersion": "0.4.0", "ips": []});
    let portmap = plugin_stdin(&list, &list.plugins[3], &inv(ports.clone()), Some(&prev));
    assert_eq!(
        portmap,
        json!({
            "type": "portmap", "snat": true, "cniVersion": "0.4.0", "name": "nomad",
            "runtimeConfig": {"portMappings": [
                {"hostPort": 25000, "containerPort": 8080, "protocol": "tcp"},
                {"hostPort": 25000, "containerPort": 8080, "protocol": "udp"}
            ]},
            "prevResult": prev
        })
    );
    // No capability declared: no runtime config, even with ports. The first plugin has no prevResult.
    let loopback = plugin_stdin(&list, &list.plugins[0], &inv(ports), None);
    assert_eq!(loopback, json!({"type": "loopback", "cniVersion": "0.4.0", "name": "nomad"}));
}

/// Records calls; fails the plugin named in `fail` `fail_times` times.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<(String, String, Value)>>,
    fail: Option<(&'static str, usize)>,
}

impl PluginExec for Fake {
    fn exec(&self, command: &str, plugin: &str, _inv: &Invocation, stdin: &[u8]) -> Result<Value, String> {
        let conf: Value = serde_json::from_slice(stdin).unwrap();
        let mut calls = self.calls.lock().unwrap();
        calls.push((command.to_string(), plugin.to_string(), conf.clone()));
        if command == "ADD"
            && let Some((name, times)) = self.fail
            && name == plugin
            && calls.iter().filter(|c| c.0 == "ADD" && c.1 == name).count() <= times
        {
            return Err("boom".into());
        }
        Ok(match plugin {
            "bridge" => bridge_result(),
            "loopback" => json!({"cniVersion": "0.4.0", "interfaces": [{"name": "lo", "sandbox": "/var/run/netns/a1"}]}),
            _ => conf.get("prevResult").cloned().unwrap_or(Value::Null),
        })
    }
}

fn bridge_result() -> Value {
    json!({
        "cniVersion": "0.4.0",
        "interfaces": [
            {"name": "nomad", "mac": "aa:aa:aa:aa:aa:aa"},
            {"name": "veth1234", "mac": "bb:bb:bb:bb:bb:bb"},
            {"name": "eth0", "mac": "cc:cc:cc:cc:cc:cc", "sandbox": "/var/run/netns/a1"}
        ],
        "ips": [{"version": "4", "interface": 2, "address": "172.26.64.7/20", "gateway": "172.26.64.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.0.0.53"], "search": ["svc"]}
    })
}

#[test]
fn add_runs_the_list_in_order_chaining_results_and_del_runs_it_in_reverse_with_the_cached_one() {
    let fake = Fake::default();
    let list = NetworkList::from_conflist(&bridge_conflist("nomad", "172.26.64.0/20", false)).unwrap();
    let result = add(&fake, &list, &inv(Vec::new())).unwrap();
    assert_eq!(result, bridge_result(), "firewall and portmap pass the bridge's result through");
    {
        let calls = fake.calls.lock().unwrap();
        let order: Vec<&str> = calls.iter().map(|c| c.1.as_str()).collect();
        assert_eq!(order, ["loopback", "bridge", "firewall", "portmap"]);
        assert!(calls[0].2.get("prevResult").is_none());
        assert_eq!(calls[2].2["prevResult"], bridge_result());
    }
    fake.calls.lock().unwrap().clear();
    del(&fake, &list, &inv(Vec::new()), Some(&result)).unwrap();
    let calls = fake.calls.lock().unwrap();
    let order: Vec<(&str, &str)> = calls.iter().map(|c| (c.0.as_str(), c.1.as_str())).collect();
    assert_eq!(order, [("DEL", "portmap"), ("DEL", "firewall"), ("DEL", "bridge"), ("DEL", "loopback")]);
    assert!(calls.iter().all(|c| c.2["prevResult"] == result));
}

#[test]
fn a_failing_plugin_is_named_as_libcni_names_it() {
    let fake = Fake { fail: Some(("firewall", 1)), ..Fake::default() };
    let list = NetworkList::from_conflist(&bridge_conflist("nomad", "172.26.64.0/20", false)).unwrap();
    let err = add(&fake, &list, &inv(Vec::new())).unwrap_err();
    assert_eq!(err, "plugin type=\"firewall\" failed (add): boom");
    let missing = find_plugin("loopback", &["/opt/cni/bin".into()]).unwrap_err();
    assert_eq!(missing, "failed to find plugin \"loopback\" in path [/opt/cni/bin]");
}

#[test]
fn the_status_is_the_sandbox_interface_with_an_address_and_the_results_dns() {
    let status = status_from_result(&bridge_result()).unwrap();
    assert_eq!(status.interface_name, "eth0");
    assert_eq!(status.address, "172.26.64.7");
    let dns = status.dns.as_ref().unwrap();
    assert_eq!((dns.servers.as_slice(), dns.searches.as_slice()), (&["10.0.0.53".to_string()][..], &["svc".to_string()][..]));
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        json!({"InterfaceName": "eth0", "Address": "172.26.64.7", "DNS": {"Servers": ["10.0.0.53"], "Searches": ["svc"], "Options": []}})
    );
    // No sandbox interface with an address: the first (by name) with any address.
    let host_only = json!({"interfaces": [{"name": "zz"}, {"name": "br"}], "ips": [{"interface": 0, "address": "10.0.0.2/24"}]});
    assert_eq!(status_from_result(&host_only).unwrap().interface_name, "zz");
    assert_eq!(status_from_result(&json!({"interfaces": []})).unwrap_err(), "no interfaces found");
    assert_eq!(status_from_result(&json!({"interfaces": [{"name": "eth0"}]})).unwrap_err(), "no interface with an address");
}

fn manager(dir: &Path, fake: Arc<Fake>) -> CniNetworks {
    let settings = CniSettings { config_dir: dir.join("conf"), ..CniSettings::default() };
    CniNetworks {
        settings,
        netns_dir: dir.join("netns"),
        cache_dir: dir.join("cache"),
        exec: fake,
        retry_wait: || Duration::ZERO,
        maker: None,
    }
}

#[test]
fn add_is_tried_three_times_undoing_each_failed_try_and_the_first_error_is_returned() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake { fail: Some(("bridge", 5)), ..Fake::default() });
    let m = manager(dir.path(), fake.clone());
    // cni/<name> so no iptables is touched.
    std::fs::create_dir_all(dir.path().join("conf")).unwrap();
    std::fs::write(
        dir.path().join("conf/10-mine.conflist"),
        serde_json::to_vec(&json!({"cniVersion": "0.4.0", "name": "mine", "plugins": [{"type": "loopback"}, {"type": "bridge"}]})).unwrap(),
    )
    .unwrap();
    let alloc = Allocation { id: "a1".into(), ..Allocation::default() };
    let err = m.setup(&alloc, Mode::Cni("mine")).unwrap_err();
    assert_eq!(err, "failed to configure network: plugin type=\"bridge\" failed (add): boom");
    let calls = fake.calls.lock().unwrap();
    let adds = calls.iter().filter(|c| c.0 == "ADD" && c.1 == "bridge").count();
    let dels = calls.iter().filter(|c| c.0 == "DEL" && c.1 == "loopback").count();
    assert_eq!((adds, dels), (3, 3));
    assert!(m.restored("a1").is_none(), "nothing cached for a failed setup");
}

#[test]
fn a_successful_add_is_cached_for_the_restarted_agent_and_del_uses_it_then_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake { fail: Some(("bridge", 1)), ..Fake::default() });
    let m = manager(dir.path(), fake.clone());
    std::fs::create_dir_all(dir.path().join("conf")).unwrap();
    std::fs::write(
        dir.path().join("conf/mine.conf"),
        serde_json::to_vec(&json!({"cniVersion": "0.4.0", "name": "mine", "type": "bridge"})).unwrap(),
    )
    .unwrap();
    let alloc = alloc_with_ports(&[(25000, 80)]);
    let status = m.setup(&alloc, Mode::Cni("mine")).unwrap().unwrap();
    assert_eq!(status.address, "172.26.64.7", "the second try succeeded");
    // The config changes on disk; DEL still runs what ADD ran, with the ports ADD had.
    std::fs::remove_file(dir.path().join("conf/mine.conf")).unwrap();
    let again = manager(dir.path(), fake.clone());
    assert_eq!(again.restored("a1"), Some(status));
    fake.calls.lock().unwrap().clear();
    again.teardown("a1").unwrap();
    {
        let calls = fake.calls.lock().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].0.as_str(), calls[0].1.as_str()), ("DEL", "bridge"));
        assert_eq!(calls[0].2["prevResult"], bridge_result());
    }
    assert!(again.restored("a1").is_none());
    again.teardown("a1").unwrap();
    assert_eq!(fake.calls.lock().unwrap().len(), 1, "a second teardown has nothing to undo");
}

#[test]
fn cni_networks_are_found_by_name_in_file_order_with_nomads_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_named(dir.path(), "x").unwrap_err();
    assert_eq!(err, format!("no CNI network config found in {}", dir.path().display()));
    std::fs::write(dir.path().join("a.conflist"), r#"{"cniVersion":"0.4.0","name":"one","plugins":[{"type":"bridge"}]}"#).unwrap();
    std::fs::write(dir.path().join("b.json"), r#"{"cniVersion":"1.0.0","name":"two","type":"ptp","ipam":{}}"#).unwrap();
    std::fs::write(dir.path().join("c.conf"), r#"{"cniVersion":"1.0.0","name":"one","type":"macvlan"}"#).unwrap();
    std::fs::write(dir.path().join("d.conf"), "not json").unwrap();
    std::fs::write(dir.path().join("e.txt"), r#"{"name":"three","type":"x"}"#).unwrap();
    let one = load_named(dir.path(), "one").unwrap();
    assert_eq!(one.plugins[0]["type"], json!("bridge"), "a.conflist comes first");
    let two = load_named(dir.path(), "two").unwrap();
    assert_eq!((two.cni_version.as_str(), two.plugins.len()), ("1.0.0", 1));
    assert!(two.plugins[0].get("name").is_none() && two.plugins[0]["ipam"] == json!({}));
    assert_eq!(load_named(dir.path(), "three").unwrap_err(), "CNI network config not found for name \"three\"");
    assert_eq!(network_names(dir.path()), ["one", "two"]);
    let bad = NetworkList::from_conflist(&json!({"name": "n", "plugins": [{"type": "../../bin/sh"}]})).unwrap_err();
    assert!(bad.contains("not a file name"), "{bad}");
}

#[test]
fn modes_parse_as_nomad_names_them() {
    assert_eq!(Mode::parse("").unwrap(), Mode::Host);
    assert_eq!(Mode::parse("host").unwrap(), Mode::Host);
    assert_eq!(Mode::parse("bridge").unwrap(), Mode::Bridge);
    assert_eq!(Mode::parse("none").unwrap(), Mode::None);
    assert_eq!(Mode::parse("cni/mine").unwrap(), Mode::Cni("mine"));
    assert!(Mode::parse("cni/").is_err() && Mode::parse("driver").is_err());
    assert_eq!(parse_cidr("172.26.64.0/20"), Some((Ipv4Addr::new(172, 26, 64, 0), 20)));
    assert_eq!(parse_cidr("172.26.64.0/33"), None);
    assert_eq!(parse_cidr("nomad"), None);
}

#[test]
fn fingerprints_the_bridge_module_and_plugin_versions() {
    let root = tempfile::tempdir().unwrap();
    assert!(!fingerprint::bridge_module(root.path(), "6.1.0"));
    std::fs::create_dir_all(root.path().join("lib/modules/6.1.0")).unwrap();
    std::fs::write(root.path().join("lib/modules/6.1.0/modules.dep"), "kernel/net/bridge/bridge.ko.xz: kernel/net/802/stp.ko.xz\n")
        .unwrap();
    assert!(fingerprint::bridge_module(root.path(), "6.1.0"));
    assert!(!fingerprint::bridge_module(root.path(), "6.2.0"));
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    std::fs::write(root.path().join("proc/modules"), "bridge 311296 1 br_netfilter, Live 0x0\n").unwrap();
    assert!(fingerprint::bridge_module(root.path(), "6.2.0"));
    let debian = "CNI bridge plugin version unknown\nCNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0\n";
    assert_eq!(fingerprint::version_token(debian), Some("1.0.0"));
    assert_eq!(fingerprint::version_token("CNI portmap plugin v1.3.0"), None, "a leading v is not semver");
    assert_eq!(fingerprint::version_token("portmap 1.3.0-rc1"), Some("1.3.0-rc1"));
}

#[test]
fn the_node_gets_the_bridge_and_cni_networks_and_the_hairpin_attribute() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.conflist"), r#"{"cniVersion":"0.4.0","name":"mine","plugins":[{"type":"bridge"}]}"#).unwrap();
    let settings = CniSettings { config_dir: dir.path().to_path_buf(), path: Vec::new(), ..CniSettings::default() };
    let mut node = nomad_proto::Node::default();
    fingerprint::apply(&mut node, &settings, true);
    let r = node.node_resources.as_ref().unwrap();
    let modes: Vec<&str> = r.networks.iter().map(|n| n.mode.as_str()).collect();
    assert_eq!(modes, ["bridge", "cni/mine"]);
    assert_eq!((r.node_networks[0].mode.as_str(), r.node_networks[0].device.as_str()), ("bridge", "nomad"));
    assert_eq!(node.attributes["nomad.bridge.hairpin_mode"], "false");
    let mut without = nomad_proto::Node::default();
    fingerprint::apply(&mut without, &settings, false);
    let modes: Vec<String> = without.node_resources.unwrap().networks.into_iter().map(|n| n.mode).collect();
    assert_eq!(modes, ["cni/mine"]);
    assert!(!without.attributes.contains_key("nomad.bridge.hairpin_mode"));
}

/// A maker whose next answers the test sets, recording what it is asked to destroy.
#[derive(Default)]
struct FakeMaker {
    next: Mutex<Vec<(PathBuf, bool)>>,
    destroyed: Mutex<Vec<String>>,
}

impl NetnsMaker for FakeMaker {
    fn makes(&self, alloc: &Allocation) -> bool {
        alloc.task_group == "docker"
    }
    fn create(&self, _alloc: &Allocation) -> Result<(PathBuf, bool), String> {
        self.next.lock().unwrap().pop().ok_or_else(|| "nothing to make".to_string())
    }
    fn destroy(&self, alloc_id: &str) -> Result<(), String> {
        self.destroyed.lock().unwrap().push(alloc_id.to_string());
        Ok(())
    }
}

/// A namespace another owner made is mounted at the alloc's path; found again it is kept (no
/// second ADD); made again (the Engine restarted the infra container) the old one is torn down
/// and the new one mounted; destroy unmounts it and asks the maker to remove its side.
#[test]
fn a_made_namespace_is_mounted_at_the_allocs_path_replaced_when_remade_and_destroyed_with_its_maker() {
    nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root); // to mount namespaces
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    let maker = Arc::new(FakeMaker::default());
    let m = manager(dir.path(), fake.clone()).with_maker(maker.clone());
    let (first, second) = (dir.path().join("made/1"), dir.path().join("made/2"));
    assert!(netns::create(&first).unwrap() && netns::create(&second).unwrap());
    std::fs::create_dir_all(dir.path().join("conf")).unwrap();
    std::fs::write(
        dir.path().join("conf/mine.conf"),
        serde_json::to_vec(&json!({"cniVersion": "0.4.0", "name": "mine", "type": "bridge"})).unwrap(),
    )
    .unwrap();
    let alloc = Allocation { id: "a1".into(), task_group: "docker".into(), ..Allocation::default() };
    let path = m.netns_path("a1");

    maker.next.lock().unwrap().push((first.clone(), true));
    assert!(m.create(&alloc).unwrap());
    assert!(netns::is_netns(&path) && netns::same(&path, &first));
    m.setup(&alloc, Mode::Cni("mine")).unwrap();

    maker.next.lock().unwrap().push((first.clone(), false));
    assert!(!m.create(&alloc).unwrap(), "the same namespace: nothing to configure again");
    assert!(m.restored("a1").is_some());

    fake.calls.lock().unwrap().clear();
    maker.next.lock().unwrap().push((second.clone(), true));
    assert!(m.create(&alloc).unwrap());
    assert!(netns::same(&path, &second) && !netns::same(&path, &first));
    assert_eq!(fake.calls.lock().unwrap().iter().filter(|c| c.0 == "DEL").count(), 1, "the old one's configuration is undone");
    assert!(m.restored("a1").is_none());

    m.destroy(&alloc).unwrap();
    assert!(!path.exists());
    assert_eq!(*maker.destroyed.lock().unwrap(), ["a1"]);

    // A group the maker does not make gets a namespace of its own; the maker is not asked.
    let plain = Allocation { id: "a2".into(), task_group: "exec".into(), ..Allocation::default() };
    assert!(m.create(&plain).unwrap() && netns::is_netns(&m.netns_path("a2")));
    m.destroy(&plain).unwrap();
    assert_eq!(maker.destroyed.lock().unwrap().len(), 1);
    for made in [&first, &second] {
        netns::remove(made).unwrap();
    }
}
