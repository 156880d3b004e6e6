//! The calls servers make to clients for CSI (Nomad's `ClientCSI.*`), behind one narrow trait.
//!
//! The claim and release paths, the volume watcher and the create/delete routes reach a
//! controller plugin or a claim's node plugin only through `ClientCsi`; the transport (the
//! channel each client keeps open to its server, forwarded between servers with the server
//! proof) is one implementation, a recording fake in tests is another. Every call names its
//! target node in the request and has a deadline in the transport.

use std::sync::Arc;

use nomad_proto::rpc::client_csi::{
    ClientCsiControllerAttachRequest, ClientCsiControllerAttachResponse, ClientCsiControllerCreateRequest,
    ClientCsiControllerCreateResponse, ClientCsiControllerDeleteRequest, ClientCsiControllerDetachRequest,
    ClientCsiControllerValidateVolumeRequest, ClientCsiNodeDetachRequest,
};

use crate::consensus::BoxFuture;

/// Why a call to a client did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ClientCallError {
    /// The node has no connection to any server right now (down, disconnected, or never
    /// connected): the caller may pick another node or retry later.
    #[error("no path to node {node_id}: {reason}")]
    NoPath {
        /// Target node.
        node_id: String,
        /// Why.
        reason: String,
    },
    /// The client answered with an error (its text, e.g. the plugin's gRPC status).
    #[error("{0}")]
    Failed(String),
    /// No answer within the call's deadline.
    #[error("node {node_id} did not answer within {seconds}s")]
    Timeout {
        /// Target node.
        node_id: String,
        /// The deadline.
        seconds: u64,
    },
}

/// Server-to-client CSI calls.
pub trait ClientCsi: Send + Sync + 'static {
    /// `ClientCSI.ControllerAttachVolume` on `req.controller.controller_node_id`.
    fn controller_attach(
        &self,
        req: ClientCsiControllerAttachRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerAttachResponse, ClientCallError>>;
    /// `ClientCSI.ControllerDetachVolume` on `req.controller.controller_node_id`.
    fn controller_detach(&self, req: ClientCsiControllerDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>>;
    /// `ClientCSI.ControllerCreateVolume` on `req.controller.controller_node_id`.
    fn controller_create(
        &self,
        req: ClientCsiControllerCreateRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerCreateResponse, ClientCallError>>;
    /// `ClientCSI.ControllerDeleteVolume` on `req.controller.controller_node_id`.
    fn controller_delete(&self, req: ClientCsiControllerDeleteRequest) -> BoxFuture<'_, Result<(), ClientCallError>>;
    /// `ClientCSI.ControllerValidateVolume` on `req.controller.controller_node_id`: `Ok` when
    /// the plugin accepts the volume's capabilities.
    fn controller_validate(&self, req: ClientCsiControllerValidateVolumeRequest) -> BoxFuture<'_, Result<(), ClientCallError>>;
    /// `ClientCSI.NodeDetachVolume` on `req.node_id`.
    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>>;
}

/// Where no transport is wired (in-process tests of other things): every call has no path.
pub struct NoClientCalls;

impl NoClientCalls {
    fn no_path<T: Send + 'static>(node_id: &str) -> BoxFuture<'static, Result<T, ClientCallError>> {
        let err = ClientCallError::NoPath { node_id: node_id.to_string(), reason: "server-to-client calls are not wired here".into() };
        Box::pin(async move { Err(err) })
    }

    /// As a shared handle.
    pub fn shared() -> Arc<dyn ClientCsi> {
        Arc::new(NoClientCalls)
    }
}

impl ClientCsi for NoClientCalls {
    fn controller_attach(
        &self,
        req: ClientCsiControllerAttachRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerAttachResponse, ClientCallError>> {
        Self::no_path(&req.controller.controller_node_id)
    }
    fn controller_detach(&self, req: ClientCsiControllerDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Self::no_path(&req.controller.controller_node_id)
    }
    fn controller_create(
        &self,
        req: ClientCsiControllerCreateRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerCreateResponse, ClientCallError>> {
        Self::no_path(&req.controller.controller_node_id)
    }
    fn controller_delete(&self, req: ClientCsiControllerDeleteRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Self::no_path(&req.controller.controller_node_id)
    }
    fn controller_validate(&self, req: ClientCsiControllerValidateVolumeRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Self::no_path(&req.controller.controller_node_id)
    }
    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Self::no_path(&req.node_id)
    }
}
