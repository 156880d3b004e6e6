//! `NodeResources` from the fingerprint (with the configured overrides) and `ReservedResources`
//! from `client { reserved { ... } }`.

use nomad_proto::NetworkResource;
use nomad_proto::resources::{
    NodeCpuResources, NodeDiskResources, NodeMemoryResources, NodeNetworkAddress, NodeNetworkResource, NodeReservedCpuResources,
    NodeReservedDiskResources, NodeReservedMemoryResources, NodeReservedNetworkResources, NodeReservedResources, NodeResources,
};

use super::Fingerprint;
use crate::config::ClientSettings;

/// What the node offers.
pub fn node_resources(fp: &Fingerprint, s: &ClientSettings) -> NodeResources {
    let cpu_shares = s.cpu_total_compute.unwrap_or(fp.cpu_mhz * i64::from(fp.cpu_cores));
    let (node_networks, networks) = match &fp.network {
        Some(addr) => {
            let family = if addr.ip.contains(':') { "ipv6" } else { "ipv4" };
            let prefix = if family == "ipv6" { 128 } else { 32 };
            (
                vec![NodeNetworkResource {
                    mode: "host".into(),
                    device: addr.device.clone(),
                    addresses: vec![NodeNetworkAddress {
                        family: family.into(),
                        alias: "default".into(),
                        address: addr.ip.clone(),
                        ..NodeNetworkAddress::default()
                    }],
                    ..NodeNetworkResource::default()
                }],
                vec![NetworkResource {
                    mode: "host".into(),
                    device: addr.device.clone(),
                    cidr: format!("{}/{prefix}", addr.ip),
                    ip: addr.ip.clone(),
                    mbits: 1000,
                    ..NetworkResource::default()
                }],
            )
        }
        None => (Vec::new(), Vec::new()),
    };
    NodeResources {
        cpu: NodeCpuResources { cpu_shares, total_cpu_cores: fp.cpu_cores, reservable_cpu_cores: (0..fp.cpu_cores).collect() },
        memory: NodeMemoryResources { memory_mb: s.memory_total_mb.unwrap_or(fp.memory_mb) },
        disk: NodeDiskResources { disk_mb: fp.disk_free_mb },
        devices: Vec::new(),
        node_networks,
        networks,
        min_dynamic_port: s.dynamic_ports.0,
        max_dynamic_port: s.dynamic_ports.1,
    }
}

/// What the node holds back for the OS.
pub fn reserved_resources(s: &ClientSettings) -> NodeReservedResources {
    let r = &s.reserved;
    NodeReservedResources {
        cpu: NodeReservedCpuResources { cpu_shares: r.cpu.unwrap_or(0), reserved_cpu_cores: Vec::new() },
        memory: NodeReservedMemoryResources { memory_mb: r.memory.unwrap_or(0) },
        disk: NodeReservedDiskResources { disk_mb: r.disk.unwrap_or(0) },
        networks: NodeReservedNetworkResources { reserved_host_ports: r.reserved_ports.clone().unwrap_or_default() },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::client::fingerprint::network::HostAddress;
    use crate::config::file::Reserved;

    pub(crate) fn settings() -> ClientSettings {
        ClientSettings {
            servers: vec!["127.0.0.1:4647".into()],
            state_dir: "/tmp/s".into(),
            alloc_dir: "/tmp/a".into(),
            node_class: String::new(),
            node_pool: "default".into(),
            meta: BTreeMap::new(),
            options: BTreeMap::new(),
            reserved: Reserved::default(),
            host_volumes: BTreeMap::new(),
            dynamic_ports: (20000, 32000),
            cpu_total_compute: None,
            memory_total_mb: None,
            network_interface: None,
            cni: crate::config::CniSettings::default(),
            chroot_env: None,
            artifact: Default::default(),
            template: Default::default(),
            gc: Default::default(),
        }
    }

    #[test]
    fn overrides_win_over_the_fingerprint_and_reserved_comes_from_config() {
        let fp = Fingerprint {
            cpu_cores: 4,
            cpu_mhz: 2000,
            memory_mb: 8192,
            disk_free_mb: 500,
            network: Some(HostAddress { device: "lo".into(), ip: "127.0.0.1".into() }),
            ..Fingerprint::default()
        };
        let mut s = settings();
        let r = node_resources(&fp, &s);
        assert_eq!((r.cpu.cpu_shares, r.cpu.total_cpu_cores, r.memory.memory_mb, r.disk.disk_mb), (8000, 4, 8192, 500));
        assert_eq!((r.min_dynamic_port, r.max_dynamic_port), (20000, 32000));
        assert_eq!(r.node_networks[0].addresses[0].address, "127.0.0.1");
        assert_eq!(r.networks[0].cidr, "127.0.0.1/32");

        s.cpu_total_compute = Some(1234);
        s.memory_total_mb = Some(99);
        s.reserved = Reserved { cpu: Some(100), memory: Some(256), disk: Some(1024), reserved_ports: Some("22,80".into()) };
        let r = node_resources(&fp, &s);
        assert_eq!((r.cpu.cpu_shares, r.memory.memory_mb), (1234, 99));
        let reserved = reserved_resources(&s);
        assert_eq!((reserved.cpu.cpu_shares, reserved.memory.memory_mb, reserved.disk.disk_mb), (100, 256, 1024));
        assert_eq!(reserved.networks.reserved_host_ports, "22,80");
    }
}
