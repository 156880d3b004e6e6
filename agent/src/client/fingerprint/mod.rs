//! Fingerprinting: what this host is and offers, as node attributes and resources.
//!
//! Each fingerprinter (one file each) reads one aspect of the host and fills a [`Fingerprint`];
//! [`fingerprinters`] is the registry, run in order. [`build_node`] turns the result, the
//! drivers' fingerprints and the client configuration into the [`Node`] the client registers.
//! A fingerprinter that cannot read its source logs a warning and leaves its attributes out:
//! a missing `/etc/os-release` must not stop the agent.

pub mod consul;
mod cpu;
mod drivers;
mod host;
mod kernel;
mod memory;
pub(crate) mod network;
mod nomad;
mod os;
mod resources;
mod storage;

use std::collections::BTreeMap;
use std::path::PathBuf;

use nomad_proto::Node;

pub use drivers::{apply_drivers, drivers_changed};
pub use resources::{node_resources, reserved_resources};

use crate::config::ClientSettings;

/// What the fingerprinters read from.
#[derive(Debug, Clone)]
pub struct FingerprintContext {
    /// The alloc dir: its file system is the node's disk.
    pub alloc_dir: PathBuf,
    /// The address the agent advertises; the node's IP when it is a concrete address.
    pub advertise_ip: Option<String>,
    /// The agent's advertised HTTP address (`nomad.advertise.address`).
    pub http_addr: String,
    /// The configured `network_interface`: its address is the node's.
    pub network_interface: Option<String>,
}

/// What the fingerprinters found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fingerprint {
    /// Node attributes.
    pub attributes: BTreeMap<String, String>,
    /// Number of cores.
    pub cpu_cores: u16,
    /// Speed of one core, MHz.
    pub cpu_mhz: i64,
    /// Total memory, MiB.
    pub memory_mb: i64,
    /// Free disk under the alloc dir, MiB.
    pub disk_free_mb: i64,
    /// The host interface and address allocs get.
    pub network: Option<network::HostAddress>,
}

/// One aspect of the host.
pub trait Fingerprinter: Send + Sync {
    /// Name, for logs.
    fn name(&self) -> &'static str;
    /// Adds what it finds to `out`; an error says what could not be read.
    fn fingerprint(&self, ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String>;
}

/// Every host fingerprinter, in the order they run.
pub fn fingerprinters() -> Vec<Box<dyn Fingerprinter>> {
    vec![
        Box::new(cpu::Cpu),
        Box::new(memory::Memory),
        Box::new(storage::Storage),
        Box::new(kernel::Kernel),
        Box::new(os::Os),
        Box::new(host::Host),
        Box::new(network::Network),
        Box::new(nomad::Nomad),
    ]
}

/// Runs every host fingerprinter.
pub fn fingerprint_host(ctx: &FingerprintContext) -> Fingerprint {
    let mut out = Fingerprint::default();
    for f in fingerprinters() {
        if let Err(e) = f.fingerprint(ctx, &mut out) {
            tracing::warn!(fingerprinter = f.name(), error = %e, "fingerprinting failed");
        }
    }
    out
}

/// Everything about the node that does not come from the host.
#[derive(Debug, Clone)]
pub struct NodeSpec<'a> {
    /// Node ID.
    pub id: &'a str,
    /// SecretID.
    pub secret_id: &'a str,
    /// Node name.
    pub name: &'a str,
    /// Datacenter.
    pub datacenter: &'a str,
    /// The agent's advertised HTTP address.
    pub http_addr: &'a str,
    /// `client { ... }`.
    pub settings: &'a ClientSettings,
}

/// The node to register: host fingerprint, configuration and identity. Drivers are added with
/// [`apply_drivers`].
pub fn build_node(spec: &NodeSpec<'_>, fp: &Fingerprint) -> Node {
    let s = spec.settings;
    let host_volumes = s
        .host_volumes
        .iter()
        .map(|(name, v)| {
            let volume =
                nomad_proto::node::HostVolume { name: name.clone(), path: v.path.clone(), read_only: v.read_only.unwrap_or(false) };
            (name.clone(), volume)
        })
        .collect();
    Node {
        id: spec.id.to_string(),
        secret_id: spec.secret_id.to_string(),
        datacenter: spec.datacenter.to_string(),
        name: spec.name.to_string(),
        http_addr: spec.http_addr.to_string(),
        attributes: fp.attributes.clone(),
        node_resources: Some(node_resources(fp, s)),
        reserved_resources: Some(reserved_resources(s)),
        meta: s.meta.clone(),
        node_class: s.node_class.clone(),
        node_pool: s.node_pool.clone(),
        host_volumes,
        ..Node::default()
    }
}

/// Reads a whole file as text.
fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("read {path}: {e}"))
}
