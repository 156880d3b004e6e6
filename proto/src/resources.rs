//! Resources: what a task asks for, what a node offers, what an alloc holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A task's resource ask (`resources { cpu memory ... }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Resources {
    /// CPU in MHz.
    #[serde(rename = "CPU")]
    pub cpu: i64,
    /// Whole reserved cores (replaces `CPU` when set).
    pub cores: i64,
    /// Memory in MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: i64,
    /// Memory the task may burst to, in MiB (0: no oversubscription).
    #[serde(rename = "MemoryMaxMB")]
    pub memory_max_mb: i64,
    /// Disk in MiB (deprecated at task level; kept for shape).
    #[serde(rename = "DiskMB")]
    pub disk_mb: i64,
    /// Task-level networks (deprecated in Nomad, group networks preferred).
    pub networks: Vec<NetworkResource>,
    /// Device requests.
    pub devices: Vec<RequestedDevice>,
}

/// Nomad's task defaults: 100 MHz and 300 MiB.
pub const DEFAULT_TASK_CPU: i64 = 100;
/// Default task memory in MiB.
pub const DEFAULT_TASK_MEMORY_MB: i64 = 300;

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpu: DEFAULT_TASK_CPU,
            cores: 0,
            memory_mb: DEFAULT_TASK_MEMORY_MB,
            memory_max_mb: 0,
            disk_mb: 0,
            networks: Vec::new(),
            devices: Vec::new(),
        }
    }
}

/// A device request (`device "nvidia/gpu" { count = 1 }`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RequestedDevice {
    /// Device name, `vendor/type/name` or a prefix of it.
    pub name: String,
    /// How many.
    pub count: u64,
    /// Device constraints.
    pub constraints: Vec<crate::Constraint>,
    /// Device affinities.
    pub affinities: Vec<crate::Affinity>,
}

/// A network ask or assignment (`network { mode port "http" {} }`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NetworkResource {
    /// `host` (default), `bridge`, `none`, `cni/<name>`.
    pub mode: String,
    /// Host device the ports are on.
    pub device: String,
    /// CIDR of the device.
    #[serde(rename = "CIDR")]
    pub cidr: String,
    /// IP chosen for the alloc.
    #[serde(rename = "IP")]
    pub ip: String,
    /// Hostname inside the network namespace.
    pub hostname: String,
    /// Bandwidth in Mbit/s (deprecated).
    #[serde(rename = "MBits")]
    pub mbits: i64,
    /// DNS settings for bridge networks.
    #[serde(rename = "DNS")]
    pub dns: Option<DnsConfig>,
    /// Ports with a fixed host value.
    pub reserved_ports: Vec<Port>,
    /// Ports whose host value the scheduler picks.
    pub dynamic_ports: Vec<Port>,
}

/// DNS configuration of a network namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DnsConfig {
    /// Name servers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

/// One port: a label and, once assigned, its host value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Port {
    /// The name tasks refer to (`NOMAD_PORT_<label>`).
    pub label: String,
    /// Host port (static, or assigned for dynamic ports).
    pub value: i64,
    /// Port inside the task's network namespace (0: same as `Value`, -1: no mapping).
    pub to: i64,
    /// Named host network the port binds on.
    pub host_network: String,
}

/// What a node offers (`NodeResources`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeResources {
    /// CPU.
    pub cpu: NodeCpuResources,
    /// Memory.
    pub memory: NodeMemoryResources,
    /// Disk for alloc dirs.
    pub disk: NodeDiskResources,
    /// Devices found by fingerprinting.
    pub devices: Vec<NodeDeviceResource>,
    /// Host network interfaces.
    pub node_networks: Vec<NodeNetworkResource>,
    /// Legacy network list.
    pub networks: Vec<NetworkResource>,
    /// Lowest dynamic port (default 20000).
    pub min_dynamic_port: i64,
    /// Highest dynamic port (default 32000).
    pub max_dynamic_port: i64,
}

/// A node's CPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeCpuResources {
    /// Total compute in MHz.
    pub cpu_shares: i64,
    /// Number of cores.
    pub total_cpu_cores: u16,
    /// Core IDs tasks may reserve.
    pub reservable_cpu_cores: Vec<u16>,
}

/// A node's memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeMemoryResources {
    /// Total memory in MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: i64,
}

/// A node's disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeDiskResources {
    /// Free disk in MiB for alloc dirs.
    #[serde(rename = "DiskMB")]
    pub disk_mb: i64,
}

/// A device group on a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeDeviceResource {
    /// Vendor.
    pub vendor: String,
    /// Type.
    #[serde(rename = "Type")]
    pub device_type: String,
    /// Name.
    pub name: String,
    /// Device instances.
    pub instances: Vec<NodeDevice>,
    /// Attributes.
    pub attributes: BTreeMap<String, serde_json::Value>,
}

/// One device instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeDevice {
    /// Device ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Healthy.
    pub healthy: bool,
    /// Why not healthy.
    pub health_description: String,
}

/// A host network interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeNetworkResource {
    /// `host`, `bridge`, ...
    pub mode: String,
    /// Interface name.
    pub device: String,
    /// MAC address.
    pub mac_address: String,
    /// Link speed in Mbit/s.
    pub speed: i64,
    /// Addresses on the interface.
    pub addresses: Vec<NodeNetworkAddress>,
}

/// An address on a host interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeNetworkAddress {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// Host network alias.
    pub alias: String,
    /// The address.
    pub address: String,
    /// Ports reserved on it.
    pub reserved_ports: String,
    /// Gateway.
    pub gateway: String,
}

/// What a node holds back for the OS (`ReservedResources`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeReservedResources {
    /// Reserved CPU.
    pub cpu: NodeReservedCpuResources,
    /// Reserved memory.
    pub memory: NodeReservedMemoryResources,
    /// Reserved disk.
    pub disk: NodeReservedDiskResources,
    /// Reserved host ports.
    pub networks: NodeReservedNetworkResources,
}

/// Reserved CPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeReservedCpuResources {
    /// MHz held back.
    pub cpu_shares: i64,
    /// Cores held back.
    pub reserved_cpu_cores: Vec<u16>,
}

/// Reserved memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeReservedMemoryResources {
    /// MiB held back.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: i64,
}

/// Reserved disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeReservedDiskResources {
    /// MiB held back.
    #[serde(rename = "DiskMB")]
    pub disk_mb: i64,
}

/// Reserved host ports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeReservedNetworkResources {
    /// Port list such as `22,80,8000-8100`.
    pub reserved_host_ports: String,
}

/// What an allocation holds on its node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocatedResources {
    /// Per task.
    pub tasks: BTreeMap<String, AllocatedTaskResources>,
    /// Lifecycle of each task (for the client's ordering).
    pub task_lifecycles: BTreeMap<String, Option<crate::TaskLifecycle>>,
    /// Group-level resources.
    pub shared: AllocatedSharedResources,
}

/// A task's share of an allocation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocatedTaskResources {
    /// CPU.
    pub cpu: AllocatedCpuResources,
    /// Memory.
    pub memory: AllocatedMemoryResources,
    /// Task-level networks.
    pub networks: Vec<NetworkResource>,
    /// Devices.
    pub devices: Vec<serde_json::Value>,
}

/// Allocated CPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocatedCpuResources {
    /// MHz.
    pub cpu_shares: i64,
    /// Reserved core IDs.
    pub reserved_cores: Vec<u16>,
}

/// Allocated memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocatedMemoryResources {
    /// MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: i64,
    /// Burst limit in MiB.
    #[serde(rename = "MemoryMaxMB")]
    pub memory_max_mb: i64,
}

/// Group-level allocated resources.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocatedSharedResources {
    /// Group networks with assigned ports.
    pub networks: Vec<NetworkResource>,
    /// Ephemeral disk in MiB.
    #[serde(rename = "DiskMB")]
    pub disk_mb: i64,
    /// Flat port list.
    pub ports: Vec<AllocatedPortMapping>,
}

/// One assigned port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocatedPortMapping {
    /// Label.
    pub label: String,
    /// Host port.
    pub value: i64,
    /// Port in the task's namespace.
    pub to: i64,
    /// Host IP.
    #[serde(rename = "HostIP")]
    pub host_ip: String,
}

impl AllocatedResources {
    /// Total CPU MHz over all tasks.
    pub fn cpu_shares(&self) -> i64 {
        self.tasks.values().map(|t| t.cpu.cpu_shares).sum()
    }

    /// Total memory MiB over all tasks.
    pub fn memory_mb(&self) -> i64 {
        self.tasks.values().map(|t| t.memory.memory_mb).sum()
    }

    /// Every host port this alloc holds, group and task level, once each.
    pub fn host_ports(&self) -> std::collections::BTreeSet<i64> {
        let group = self.shared.ports.iter().map(|p| p.value);
        let nets = self
            .shared
            .networks
            .iter()
            .chain(self.tasks.values().flat_map(|t| t.networks.iter()))
            .flat_map(|n| n.reserved_ports.iter().chain(n.dynamic_ports.iter()))
            .map(|p| p.value);
        group.chain(nets).filter(|v| *v > 0).collect()
    }
}
