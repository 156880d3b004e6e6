//! [`RpcClientCsi`]: the servers' [`ClientCsi`] calls over the clients' request streams.
//!
//! Method names are the client RPCs Nomad's servers call (`CSI.ControllerAttachVolume`, ...,
//! `client/csi_endpoint.go`); bodies are Nomad's `ClientCSI*Request` shapes.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::rpc::client_csi::{
    ClientCsiControllerAttachRequest, ClientCsiControllerAttachResponse, ClientCsiControllerCreateRequest,
    ClientCsiControllerCreateResponse, ClientCsiControllerDeleteRequest, ClientCsiControllerDetachRequest,
    ClientCsiControllerValidateVolumeRequest, ClientCsiNodeDetachRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{ClientCallError, ClientCalls};
use crate::consensus::BoxFuture;
use crate::csi::ClientCsi;

/// How long a server waits for a client's CSI answer: the client's own budget for one plugin
/// call (Nomad's `CSIPluginRequestTimeout`, 2 min) and a margin, so the client's error (a
/// plugin timeout, say) is what comes back rather than this deadline.
pub const CSI_CALL_TIMEOUT: Duration = Duration::from_secs(135);

/// The client RPC names.
pub mod methods {
    /// `ClientCSI.ControllerAttachVolume` on the client.
    pub const CONTROLLER_ATTACH: &str = "CSI.ControllerAttachVolume";
    /// `ClientCSI.ControllerDetachVolume` on the client.
    pub const CONTROLLER_DETACH: &str = "CSI.ControllerDetachVolume";
    /// `ClientCSI.ControllerCreateVolume` on the client.
    pub const CONTROLLER_CREATE: &str = "CSI.ControllerCreateVolume";
    /// `ClientCSI.ControllerDeleteVolume` on the client.
    pub const CONTROLLER_DELETE: &str = "CSI.ControllerDeleteVolume";
    /// `ClientCSI.ControllerValidateVolume` on the client.
    pub const CONTROLLER_VALIDATE: &str = "CSI.ControllerValidateVolume";
    /// `ClientCSI.NodeDetachVolume` on the client.
    pub const NODE_DETACH: &str = "CSI.NodeDetachVolume";
}

/// [`ClientCsi`] over [`ClientCalls`].
pub struct RpcClientCsi {
    calls: Arc<ClientCalls>,
    timeout: Duration,
}

impl RpcClientCsi {
    /// Calls through `calls`, each with [`CSI_CALL_TIMEOUT`].
    pub fn new(calls: Arc<ClientCalls>) -> RpcClientCsi {
        RpcClientCsi::with_timeout(calls, CSI_CALL_TIMEOUT)
    }

    /// Calls with another deadline (tests).
    pub fn with_timeout(calls: Arc<ClientCalls>, timeout: Duration) -> RpcClientCsi {
        RpcClientCsi { calls, timeout }
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(&self, node_id: &str, method: &str, req: &Req) -> Result<Resp, ClientCallError> {
        if node_id.is_empty() {
            return Err(ClientCallError::NoPath { node_id: String::new(), reason: format!("{method}: no target node") });
        }
        let body = serde_json::to_value(req).map_err(|e| ClientCallError::Failed(format!("{method}: encoding the request: {e}")))?;
        let answer = self.calls.call(node_id, method, body, self.timeout).await?;
        serde_json::from_value(answer)
            .map_err(|e| ClientCallError::Failed(format!("{method}: node {node_id} answered with a malformed reply: {e}")))
    }
}

impl ClientCsi for RpcClientCsi {
    fn controller_attach(
        &self,
        req: ClientCsiControllerAttachRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerAttachResponse, ClientCallError>> {
        Box::pin(async move { self.call(&req.controller.controller_node_id, methods::CONTROLLER_ATTACH, &req).await })
    }

    fn controller_detach(&self, req: ClientCsiControllerDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Box::pin(async move {
            self.call::<_, serde_json::Value>(&req.controller.controller_node_id, methods::CONTROLLER_DETACH, &req).await.map(drop)
        })
    }

    fn controller_create(
        &self,
        req: ClientCsiControllerCreateRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerCreateResponse, ClientCallError>> {
        Box::pin(async move { self.call(&req.controller.controller_node_id, methods::CONTROLLER_CREATE, &req).await })
    }

    fn controller_delete(&self, req: ClientCsiControllerDeleteRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Box::pin(async move {
            self.call::<_, serde_json::Value>(&req.controller.controller_node_id, methods::CONTROLLER_DELETE, &req).await.map(drop)
        })
    }

    fn controller_validate(&self, req: ClientCsiControllerValidateVolumeRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Box::pin(async move {
            self.call::<_, serde_json::Value>(&req.controller.controller_node_id, methods::CONTROLLER_VALIDATE, &req).await.map(drop)
        })
    }

    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        Box::pin(async move { self.call::<_, serde_json::Value>(&req.node_id, methods::NODE_DETACH, &req).await.map(drop) })
    }
}
