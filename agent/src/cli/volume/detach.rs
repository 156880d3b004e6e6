//! `nomad-rs volume detach <vol> <node>`: `DELETE /v1/volume/csi/<id>/detach?node=`
//! (`command/volume_detach.go`).
//!
//! The node may be given by prefix, and may be down or already garbage collected: then the
//! node ID is looked for among the volume's allocations, or sent as given. The servers
//! node-detach the volume's past claims on that node (unless it is down or gone),
//! controller-detach it, and the volume watcher frees the claims.

use clap::Args;
use nomad_proto::{AllocListStub, NodeListStub};
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query};
use crate::cli::{CmdResult, Ctx, Failure, exit, tables};

/// The long help.
pub const LONG_ABOUT: &str = "Detach a volume from a Nomad client. The node may be given by a prefix of its ID, and may be down or \
                        already garbage collected: the claims of the node's finished allocations are then released without \
                        asking it.";

/// Arguments of `volume detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// The volume's ID or a prefix of it.
    #[arg(value_name = "VOL_ID")]
    pub volume: String,
    /// The node's ID or a prefix of it.
    #[arg(value_name = "NODE_ID")]
    pub node: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct VolumeAllocations {
    allocations: Vec<AllocListStub>,
}

/// Runs `volume detach`.
pub async fn run(api: &ApiFlags, args: DetachArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let mut node_id = sanitize_uuid_prefix(&args.node);
    let nodes = ctx
        .client
        .get::<Option<Vec<NodeListStub>>>("/v1/nodes", &Query::new().prefix(&node_id))
        .await
        .map_err(|e| Failure::new(format!("Error detaching volume: {e}")))?
        .value
        .unwrap_or_default();
    let nodes: Vec<NodeListStub> = nodes.into_iter().filter(|n| n.id.starts_with(&node_id)).collect();
    if nodes.len() > 1 {
        return Err(Failure::new(format!("Prefix matched multiple nodes\n\n{}", tables::nodes(&nodes, usize::MAX, false))));
    }
    let vol = super::resolve(&ctx, &args.volume).await?;
    if let [node] = nodes.as_slice() {
        node_id = node.id.clone();
    } else {
        // The node is gone (garbage collected): find it among the volume's allocations.
        let v = ctx
            .client
            .get::<VolumeAllocations>(&super::volume_path(&vol.id), &super::in_namespace(&vol.namespace))
            .await
            .map_err(|e| Failure::new(format!("Error querying volume: {e}")))?
            .value;
        let mut ids: Vec<String> = v.allocations.into_iter().map(|a| a.node_id).filter(|n| n.starts_with(&node_id)).collect();
        ids.sort();
        ids.dedup();
        match ids.as_slice() {
            [one] => node_id = one.clone(),
            [] => {}
            many => return Err(Failure::new(format!("Prefix matched multiple node IDs\n\n{}", many.join("\n")))),
        }
    }
    let q = super::in_namespace(&vol.namespace).param("node", node_id);
    ctx.client
        .delete::<serde_json::Value>(&format!("{}/detach", super::volume_path(&vol.id)), &q)
        .await
        .map_err(|e| Failure::new(format!("Error detaching volume: {e}")))?;
    Ok(exit::OK)
}

/// Nomad's `sanitizeUUIDPrefix`: a UUID prefix that ends in `-` or has an odd number of hex
/// digits is cut so the servers' prefix index can use it.
fn sanitize_uuid_prefix(prefix: &str) -> String {
    let hyphens = prefix.matches('-').count();
    let length = prefix.len() - hyphens;
    let mut out = prefix.to_string();
    if length % 2 == 1 {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_prefixes_are_cut_to_an_even_number_of_digits() {
        assert_eq!(sanitize_uuid_prefix("abc"), "ab");
        assert_eq!(sanitize_uuid_prefix("abcd"), "abcd");
        assert_eq!(sanitize_uuid_prefix("abcd1234-"), "abcd1234-");
        assert_eq!(sanitize_uuid_prefix("abcd1234-a"), "abcd1234-");
    }
}
