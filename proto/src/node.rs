//! Client nodes (`structs.Node`), their status and their API encodings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resources::{NodeReservedResources, NodeResources};
use crate::time::Timestamp;

/// Node events kept per node; older ones are dropped.
pub const MAX_RETAINED_NODE_EVENTS: usize = 10;

/// A node's status as the servers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// Registered, not yet schedulable (also: reconnecting and not yet synced).
    #[default]
    #[serde(alias = "")]
    Initializing,
    /// Heartbeating and schedulable.
    Ready,
    /// Missed its heartbeat; its allocs are lost.
    Down,
    /// Missed its heartbeat while running allocs that tolerate it.
    Disconnected,
}

impl NodeStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Initializing => "initializing",
            NodeStatus::Ready => "ready",
            NodeStatus::Down => "down",
            NodeStatus::Disconnected => "disconnected",
        }
    }

    /// Down is the only terminal status.
    pub fn is_terminal(self) -> bool {
        self == NodeStatus::Down
    }

    /// Down or disconnected: the node is not talking to us.
    pub fn is_unresponsive(self) -> bool {
        matches!(self, NodeStatus::Down | NodeStatus::Disconnected)
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<NodeStatus> {
        match s {
            "initializing" => Some(NodeStatus::Initializing),
            "ready" => Some(NodeStatus::Ready),
            "down" => Some(NodeStatus::Down),
            "disconnected" => Some(NodeStatus::Disconnected),
            _ => None,
        }
    }
}

impl std::fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the scheduler may place on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingEligibility {
    /// New placements allowed.
    #[default]
    #[serde(alias = "")]
    Eligible,
    /// No new placements.
    Ineligible,
}

impl SchedulingEligibility {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingEligibility::Eligible => "eligible",
            SchedulingEligibility::Ineligible => "ineligible",
        }
    }
}

/// A client node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Node {
    /// Node ID (a UUID, kept in the client's state dir).
    #[serde(rename = "ID")]
    pub id: String,
    /// Secret the node authenticates with. Never leaves the servers over HTTP.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Datacenter.
    pub datacenter: String,
    /// Name (defaults to the hostname).
    pub name: String,
    /// Address of the client's HTTP API (`host:port`), as the node declares it.
    #[serde(rename = "HTTPAddr")]
    pub http_addr: String,
    /// The IP the node's RPC connection to the servers came from, recorded by the servers at
    /// registration (whatever the node sends here is replaced). Requests the servers forward to
    /// the node's HTTP API go to this IP (with the declared port), never to a host the node names.
    /// Not shown by the HTTP API.
    #[serde(rename = "RPCPeerIP", skip_serializing_if = "String::is_empty")]
    pub rpc_peer_ip: String,
    /// TLS on the HTTP API.
    #[serde(rename = "TLSEnabled")]
    pub tls_enabled: bool,
    /// Fingerprinted attributes (`kernel.name`, `cpu.numcores`, `driver.raw_exec`, ...).
    pub attributes: BTreeMap<String, String>,
    /// Resources offered.
    pub node_resources: Option<NodeResources>,
    /// Resources held back.
    pub reserved_resources: Option<NodeReservedResources>,
    /// Links to external systems.
    pub links: BTreeMap<String, String>,
    /// User metadata (`client { meta {} }`).
    pub meta: BTreeMap<String, String>,
    /// Node class.
    pub node_class: String,
    /// Node pool.
    pub node_pool: String,
    /// Hash of the fields feasibility depends on.
    pub computed_class: String,
    /// Present while draining.
    pub drain_strategy: Option<DrainStrategy>,
    /// Eligibility for new placements.
    pub scheduling_eligibility: SchedulingEligibility,
    /// Status.
    pub status: NodeStatus,
    /// Why.
    pub status_description: String,
    /// When the status last changed, Unix seconds.
    pub status_updated_at: i64,
    /// Recent events, oldest first, at most [`MAX_RETAINED_NODE_EVENTS`].
    pub events: Vec<NodeEvent>,
    /// Drivers and their health.
    pub drivers: BTreeMap<String, DriverInfo>,
    /// CSI controller plugins on the node.
    #[serde(rename = "CSIControllerPlugins")]
    pub csi_controller_plugins: BTreeMap<String, crate::csi::CsiInfo>,
    /// CSI node plugins on the node.
    #[serde(rename = "CSINodePlugins")]
    pub csi_node_plugins: BTreeMap<String, crate::csi::CsiInfo>,
    /// Host volumes.
    pub host_volumes: BTreeMap<String, HostVolume>,
    /// Host networks.
    pub host_networks: BTreeMap<String, serde_json::Value>,
    /// The last drain.
    pub last_drain: Option<DrainMetadata>,
    /// Raft index at which the node last became unresponsive (0 once ready again).
    pub last_missed_heartbeat_index: u64,
    /// Raft index of the node's last client alloc update.
    pub last_alloc_update_index: u64,
    /// Raft index that created the node.
    pub create_index: u64,
    /// Raft index of the last change.
    pub modify_index: u64,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            id: String::new(),
            secret_id: String::new(),
            datacenter: String::new(),
            name: String::new(),
            http_addr: String::new(),
            rpc_peer_ip: String::new(),
            tls_enabled: false,
            attributes: BTreeMap::new(),
            node_resources: None,
            reserved_resources: None,
            links: BTreeMap::new(),
            meta: BTreeMap::new(),
            node_class: String::new(),
            node_pool: String::new(),
            computed_class: String::new(),
            drain_strategy: None,
            scheduling_eligibility: SchedulingEligibility::Eligible,
            status: NodeStatus::Initializing,
            status_description: String::new(),
            status_updated_at: 0,
            events: Vec::new(),
            drivers: BTreeMap::new(),
            csi_controller_plugins: BTreeMap::new(),
            csi_node_plugins: BTreeMap::new(),
            host_volumes: BTreeMap::new(),
            host_networks: BTreeMap::new(),
            last_drain: None,
            last_missed_heartbeat_index: 0,
            last_alloc_update_index: 0,
            create_index: 0,
            modify_index: 0,
        }
    }
}

/// A driver's fingerprint on a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DriverInfo {
    /// Driver attributes.
    pub attributes: BTreeMap<String, String>,
    /// The driver is present.
    pub detected: bool,
    /// The driver can run tasks.
    pub healthy: bool,
    /// Why it is (un)healthy.
    pub health_description: String,
    /// When this was fingerprinted.
    pub update_time: Timestamp,
}

/// Something that happened to a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeEvent {
    /// What happened.
    pub message: String,
    /// `Cluster`, `Drain`, `Driver`, ...
    pub subsystem: String,
    /// Details.
    pub details: BTreeMap<String, String>,
    /// When.
    pub timestamp: Timestamp,
    /// Raft index the event was stored at.
    pub create_index: u64,
}

/// Node event subsystems.
pub mod event_subsystem {
    /// Cluster membership and heartbeats.
    pub const CLUSTER: &str = "Cluster";
    /// Drains.
    pub const DRAIN: &str = "Drain";
    /// Drivers.
    pub const DRIVER: &str = "Driver";
    /// Scheduling eligibility.
    pub const SCHEDULER: &str = "Scheduler";
}

/// A drain in progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DrainStrategy {
    /// How long to wait before forcing, ns (<0: force now, 0: no deadline).
    pub deadline: i64,
    /// Leave system allocs running.
    pub ignore_system_jobs: bool,
    /// When the remaining allocs are forced off.
    pub force_deadline: Timestamp,
    /// When the drain started.
    pub started_at: Timestamp,
}

/// What the last drain did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DrainMetadata {
    /// Start.
    pub started_at: Timestamp,
    /// Last update.
    pub updated_at: Timestamp,
    /// `draining`, `complete` or `canceled`.
    pub status: String,
    /// Token accessor that set it.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// User metadata.
    pub meta: BTreeMap<String, String>,
}

/// A host volume offered by a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct HostVolume {
    /// Name.
    pub name: String,
    /// Host path.
    pub path: String,
    /// Read-only.
    pub read_only: bool,
}

impl Node {
    /// Ready, not draining and eligible: new allocs may go here.
    pub fn is_ready_for_placement(&self) -> bool {
        self.status == NodeStatus::Ready && self.drain_strategy.is_none() && self.scheduling_eligibility == SchedulingEligibility::Eligible
    }

    /// The node's datacenter matches one of `patterns` (`*` globs, as Nomad 1.5+).
    pub fn in_any_datacenter(&self, patterns: &[String]) -> bool {
        patterns.iter().any(|p| glob_match(p, &self.datacenter))
    }

    /// The node belongs to `pool` (`all` matches every node).
    pub fn in_pool(&self, pool: &str) -> bool {
        pool == crate::job::ALL_NODE_POOL || pool == self.node_pool || (pool.is_empty() && self.node_pool == crate::job::DEFAULT_NODE_POOL)
    }

    /// A copy that is safe to show: the SecretID blanked (and the servers' own record of where
    /// the node connected from left out, as Nomad's API has no such field).
    pub fn sanitized(&self) -> Node {
        let mut n = self.clone();
        n.secret_id.clear();
        n.rpc_peer_ip.clear();
        n
    }

    /// Where the servers send requests for this node's HTTP API: the IP its RPC connection came
    /// from with the port of its declared `HTTPAddr`. `None` when either is unknown.
    pub fn forwarding_http_addr(&self) -> Option<String> {
        let ip: std::net::IpAddr = self.rpc_peer_ip.parse().ok()?;
        let port: u16 = self.http_addr.rsplit_once(':')?.1.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, port).to_string())
    }

    /// Appends events, keeping the newest [`MAX_RETAINED_NODE_EVENTS`].
    pub fn append_events(&mut self, events: impl IntoIterator<Item = NodeEvent>) {
        self.events.extend(events);
        if self.events.len() > MAX_RETAINED_NODE_EVENTS {
            let extra = self.events.len() - MAX_RETAINED_NODE_EVENTS;
            self.events.drain(..extra);
        }
    }

    /// Computes the class hash over what feasibility checks read: datacenter,
    /// class, pool, non-unique attributes and meta, and drivers' health.
    /// `unique.*` keys are per-node and would defeat class caching.
    pub fn compute_class(&mut self) {
        let mut h = Fnv64::new();
        h.field(&self.datacenter);
        h.field(&self.node_class);
        h.field(&self.node_pool);
        for (k, v) in &self.attributes {
            if !k.starts_with("unique.") {
                h.field(k);
                h.field(v);
            }
        }
        h.field("\u{1}meta");
        for (k, v) in &self.meta {
            if !k.starts_with("unique.") {
                h.field(k);
                h.field(v);
            }
        }
        h.field("\u{1}drivers");
        for (k, d) in &self.drivers {
            h.field(k);
            h.field(if d.detected { "d" } else { "-" });
            h.field(if d.healthy { "h" } else { "-" });
        }
        self.computed_class = format!("v1:{}", h.finish());
    }

    /// The stub `/v1/nodes` lists.
    pub fn stub(&self, fields: NodeStubFields) -> NodeListStub {
        let address = host_of(&self.http_addr);
        NodeListStub {
            address,
            id: self.id.clone(),
            attributes: if fields.os {
                let mut m = BTreeMap::new();
                if let Some(os) = self.attributes.get("os.name") {
                    m.insert("os.name".to_string(), os.clone());
                }
                Some(m)
            } else {
                None
            },
            datacenter: self.datacenter.clone(),
            name: self.name.clone(),
            node_pool: self.node_pool.clone(),
            node_class: self.node_class.clone(),
            version: self.attributes.get("nomad.version").cloned().unwrap_or_default(),
            drain: self.drain_strategy.is_some(),
            scheduling_eligibility: self.scheduling_eligibility,
            status: self.status,
            status_description: self.status_description.clone(),
            drivers: self.drivers.clone(),
            host_volumes: self.host_volumes.clone(),
            node_resources: if fields.resources { self.node_resources.clone() } else { None },
            reserved_resources: if fields.resources { self.reserved_resources.clone() } else { None },
            last_drain: self.last_drain.clone(),
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }
}

/// Matches `text` against a pattern where `*` stands for any run of characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

fn host_of(addr: &str) -> String {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default().to_string();
    }
    match addr.rsplit_once(':') {
        Some((h, _)) if !h.contains(':') => h.to_string(),
        _ => addr.to_string(),
    }
}

/// Optional fields of the node list (`?resources=true`, `?os=true`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStubFields {
    /// Fill `NodeResources` and `ReservedResources`.
    pub resources: bool,
    /// Fill `Attributes` with `os.name` only.
    pub os: bool,
}

/// An entry of `/v1/nodes`; field order follows Nomad's.
// `default`: clients decode these lists, and Go servers send `null` (or nothing) for empty fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeListStub {
    /// Host part of the HTTP address.
    pub address: String,
    /// ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Only with `os=true`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub attributes: Option<BTreeMap<String, String>>,
    /// Datacenter.
    pub datacenter: String,
    /// Name.
    pub name: String,
    /// Node pool.
    pub node_pool: String,
    /// Class.
    pub node_class: String,
    /// Agent version.
    pub version: String,
    /// Draining.
    pub drain: bool,
    /// Eligibility.
    pub scheduling_eligibility: SchedulingEligibility,
    /// Status.
    pub status: NodeStatus,
    /// Why.
    pub status_description: String,
    /// Drivers.
    pub drivers: BTreeMap<String, DriverInfo>,
    /// Host volumes.
    pub host_volumes: BTreeMap<String, HostVolume>,
    /// Only with `resources=true`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub node_resources: Option<NodeResources>,
    /// Only with `resources=true`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reserved_resources: Option<NodeReservedResources>,
    /// Last drain.
    pub last_drain: Option<DrainMetadata>,
    /// Create index.
    pub create_index: u64,
    /// Modify index.
    pub modify_index: u64,
}

/// A full node as the HTTP API and event stream show it: SecretID blank,
/// plus the derived `Drain` flag Nomad's encoder appends.
#[derive(Debug, Clone, Serialize)]
pub struct ApiNode {
    #[serde(flatten)]
    node: Node,
    #[serde(rename = "Drain")]
    drain: bool,
}

impl From<&Node> for ApiNode {
    fn from(n: &Node) -> ApiNode {
        ApiNode { drain: n.drain_strategy.is_some(), node: n.sanitized() }
    }
}

/// 64-bit FNV-1a: stable across processes and releases, unlike std's hasher.
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Fnv64 {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }

    fn field(&mut self, s: &str) {
        for b in s.as_bytes().iter().chain(std::iter::once(&0u8)) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_node_never_carries_the_secret_and_adds_drain() {
        let n = Node { id: "n1".into(), secret_id: "s3cr3t".into(), drain_strategy: Some(DrainStrategy::default()), ..Node::default() };
        let v = serde_json::to_value(ApiNode::from(&n)).unwrap();
        assert_eq!(v["SecretID"], "");
        assert_eq!(v["Drain"], true);
        assert!(!v.to_string().contains("s3cr3t"));
    }

    #[test]
    fn datacenter_globs_match_like_nomad() {
        assert!(glob_match("*", "dc1"));
        assert!(glob_match("dc*", "dc1"));
        assert!(glob_match("*-east-*", "us-east-1"));
        assert!(!glob_match("dc2", "dc1"));
        assert!(!glob_match("eu-*", "us-east-1"));
        assert!(!glob_match("a*a", "a"));
        let n = Node { datacenter: "dc1".into(), node_pool: "default".into(), ..Node::default() };
        assert!(n.in_any_datacenter(&["dc2".into(), "dc*".into()]));
        assert!(n.in_pool("all") && n.in_pool("default") && !n.in_pool("gpu"));
    }

    #[test]
    fn events_are_capped_oldest_first_out() {
        let mut n = Node::default();
        n.append_events((0..15).map(|i| NodeEvent { message: format!("e{i}"), ..NodeEvent::default() }));
        assert_eq!(n.events.len(), MAX_RETAINED_NODE_EVENTS);
        assert_eq!(n.events[0].message, "e5");
        assert_eq!(n.events[9].message, "e14");
    }

    #[test]
    fn computed_class_ignores_unique_attributes() {
        let mut a = Node { datacenter: "dc1".into(), ..Node::default() };
        a.attributes.insert("kernel.name".into(), "linux".into());
        a.attributes.insert("unique.hostname".into(), "a".into());
        let mut b = a.clone();
        b.attributes.insert("unique.hostname".into(), "b".into());
        a.compute_class();
        b.compute_class();
        assert_eq!(a.computed_class, b.computed_class);
        b.attributes.insert("kernel.name".into(), "darwin".into());
        b.compute_class();
        assert_ne!(a.computed_class, b.computed_class);
        assert!(a.computed_class.starts_with("v1:"));
    }

    #[test]
    fn stub_fields_follow_the_query_options() {
        let mut n = Node { http_addr: "10.0.0.5:4646".into(), node_resources: Some(NodeResources::default()), ..Node::default() };
        n.attributes.insert("os.name".into(), "debian".into());
        n.attributes.insert("kernel.name".into(), "linux".into());
        let plain = serde_json::to_value(n.stub(NodeStubFields::default())).unwrap();
        assert_eq!(plain["Address"], "10.0.0.5");
        assert!(plain.get("NodeResources").is_none());
        assert!(plain.get("Attributes").is_none());
        let full = serde_json::to_value(n.stub(NodeStubFields { resources: true, os: true })).unwrap();
        assert!(full.get("NodeResources").is_some());
        assert_eq!(full["Attributes"], serde_json::json!({"os.name": "debian"}));
    }
}
