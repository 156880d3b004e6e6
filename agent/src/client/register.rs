//! The node's identity and the node the client registers.
//!
//! The node ID and SecretID are random UUIDs created the first time the client starts and kept
//! in the local state forever after; the node is the host fingerprint plus the configuration
//! plus the drivers' fingerprints. The first registration sends status `initializing`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use nomad_proto::{DriverInfo, Node, NodeStatus};

use super::ClientConfig;
use super::fingerprint::{FingerprintContext, NodeSpec, apply_drivers, build_node, fingerprint_host};
use super::state::{NodeIdentity, StateDb, StateError};

/// The stored identity, or a new one (stored durably before it is used).
pub fn load_or_create_identity(state: &StateDb) -> Result<NodeIdentity, StateError> {
    if let Some(id) = state.identity()? {
        return Ok(id);
    }
    let id = NodeIdentity { node_id: nomad_proto::new_id(), secret_id: nomad_proto::new_id() };
    state.put_identity(&id)?;
    Ok(id)
}

/// The host part of the advertised HTTP address, when it is an IP.
fn advertise_ip(http_addr: &str) -> Option<String> {
    http_addr.parse::<SocketAddr>().ok().map(|a| a.ip().to_string())
}

/// The node this client registers.
pub fn node(config: &ClientConfig, identity: &NodeIdentity, drivers: &BTreeMap<String, DriverInfo>) -> Node {
    let ctx = FingerprintContext {
        alloc_dir: config.settings.alloc_dir.clone(),
        advertise_ip: advertise_ip(&config.http_addr),
        http_addr: config.http_addr.clone(),
        network_interface: config.settings.network_interface.clone(),
    };
    let fp = fingerprint_host(&ctx);
    let spec = NodeSpec {
        id: &identity.node_id,
        secret_id: &identity.secret_id,
        name: &config.node_name,
        datacenter: &config.datacenter,
        http_addr: &config.http_addr,
        settings: &config.settings,
    };
    let mut node = build_node(&spec, &fp);
    super::connect::default_node_meta(&mut node.meta);
    let cni = &config.settings.cni;
    let bridge = super::network::fingerprint::bridge_module(std::path::Path::new("/"), &super::network::fingerprint::kernel_release());
    super::network::fingerprint::apply(&mut node, cni, bridge);
    apply_drivers(&mut node, drivers);
    node.status = NodeStatus::Initializing;
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_created_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let db = StateDb::open(dir.path()).unwrap();
            load_or_create_identity(&db).unwrap()
        };
        let db = StateDb::open(dir.path()).unwrap();
        assert_eq!(load_or_create_identity(&db).unwrap(), first);
        assert_ne!(first.node_id, first.secret_id);
        assert_eq!(advertise_ip("127.0.0.1:4646").as_deref(), Some("127.0.0.1"));
        assert_eq!(advertise_ip("host:4646"), None);
    }
}
