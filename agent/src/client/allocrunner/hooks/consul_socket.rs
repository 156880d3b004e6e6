//! `consul_grpc_socket` and `consul_http_socket`: unix sockets in the alloc's shared `tmp` dir
//! that reach the Consul agent on the host from inside the group's network namespace (Nomad's
//! `consul_grpc_sock_hook.go` and `consul_http_sock_hook.go`).
//!
//! Only for a group whose first network is `bridge`: `alloc/tmp/consul_grpc.sock` when a group
//! service has a Connect sidecar or gateway (its Envoy's xDS stream, see
//! `connect::proxy::grpc_address`), `alloc/tmp/consul_http.sock` when one is Connect native.
//! Destinations: the agent's `consul { grpc_address }`, else the host of `consul { address }`
//! with the port the node fingerprinted (`consul.grpc`), else 8502; and `consul { address }`.
//!
//! Prerun makes the socket and serves it from the agent ([`SocketProxy`]); an update that adds
//! such a service starts it too. Postrun stops it and removes the socket. The proxy lives in
//! the agent, so an agent that stops takes it along: the hook is never marked done, and the
//! restarted agent's prerun makes the socket again (the old entry is removed first); an Envoy
//! that kept running reconnects to it.

use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, NodeFn, PostrunHook, PrerunHook, UpdateHook};
use crate::client::connect::proxy::{self, ALLOC_GRPC_SOCKET, ALLOC_HTTP_SOCKET};
use crate::client::connect::socket_proxy::{SocketProxy, alloc_tmp, bind_beneath};
use crate::client::state::HookState;
use crate::client::taskrunner::lock;
use crate::config::consul::ConsulSettings;
use crate::fs_beneath::Beneath;

/// Consul's gRPC port when neither the agent's config nor the fingerprint names one.
pub const GRPC_FALLBACK_PORT: &str = "8502";

/// Which of Consul's endpoints a hook proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// gRPC (xDS), for Envoy.
    Grpc,
    /// The HTTP API, for Connect native tasks.
    Http,
}

impl Endpoint {
    fn socket(self) -> &'static str {
        match self {
            Endpoint::Grpc => ALLOC_GRPC_SOCKET,
            Endpoint::Http => ALLOC_HTTP_SOCKET,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Endpoint::Grpc => "gRPC",
            Endpoint::Http => "HTTP",
        }
    }
}

/// See the module docs.
pub struct ConsulSocketHook {
    endpoint: Endpoint,
    consul: Option<ConsulSettings>,
    node: NodeFn,
    /// Cancelled when the agent shuts down or the alloc is destroyed.
    cancel: CancellationToken,
    proxy: Mutex<Serving>,
}

/// The hook's proxy: not yet started, serving, or stopped for good (never started again, as
/// Nomad's `runOnce`).
enum Serving {
    Idle,
    Running(SocketProxy),
    Stopped,
}

/// Does the alloc want the socket? Its group's first network is bridge, and a group service is
/// a Connect sidecar or gateway (gRPC) or Connect native (HTTP).
pub fn wants(endpoint: Endpoint, alloc: &nomad_proto::Allocation) -> bool {
    if !proxy::first_network_is_bridge(alloc) {
        return false;
    }
    let services = proxy::group(alloc).map(|g| g.services.as_slice()).unwrap_or_default();
    services.iter().filter_map(|s| s.connect.as_ref()).any(|c| match endpoint {
        Endpoint::Grpc => c.sidecar_service.is_some() || c.gateway.is_some(),
        Endpoint::Http => c.native,
    })
}

/// Where the socket's connections go (see the module docs).
pub fn destination(endpoint: Endpoint, consul: &ConsulSettings, node: &nomad_proto::Node) -> Result<String, String> {
    if consul.address.is_empty() && (endpoint == Endpoint::Http || consul.grpc_address.is_empty()) {
        return Err("consul address must be set on nomad client".into());
    }
    match endpoint {
        Endpoint::Http => Ok(consul.address.clone()),
        Endpoint::Grpc if !consul.grpc_address.is_empty() => Ok(consul.grpc_address.clone()),
        Endpoint::Grpc => {
            let (host, _) = consul.address.rsplit_once(':').ok_or_else(|| format!("error parsing Consul address {:?}", consul.address))?;
            let port = node
                .attributes
                .get("consul.grpc")
                .filter(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
                .map(String::as_str)
                .unwrap_or(GRPC_FALLBACK_PORT);
            Ok(format!("{host}:{port}"))
        }
    }
}

impl ConsulSocketHook {
    /// A hook for `endpoint`, with the agent's Consul settings.
    pub fn new(endpoint: Endpoint, consul: Option<ConsulSettings>, node: NodeFn, cancel: CancellationToken) -> ConsulSocketHook {
        ConsulSocketHook { endpoint, consul, node, cancel, proxy: Mutex::new(Serving::Idle) }
    }

    /// Makes the socket and starts serving it, once.
    fn run(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        let mut serving = lock(&self.proxy);
        if !matches!(*serving, Serving::Idle) || self.cancel.is_cancelled() || !wants(self.endpoint, req.alloc) {
            return Ok(());
        }
        let label = self.endpoint.label();
        let consul = self.consul.as_ref().ok_or_else(|| AllocHookError("consul address must be set on nomad client".into()))?;
        let dest = destination(self.endpoint, consul, &(self.node)()).map_err(AllocHookError)?;
        let name = std::path::Path::new(self.endpoint.socket()).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let listener = Beneath::open(req.alloc_dir)
            .and_then(|d| alloc_tmp(&d))
            .map_err(|e| e.to_string())
            .and_then(|tmp| bind_beneath(&tmp, name).map_err(|e| e.to_string()))
            .map_err(|e| AllocHookError(format!("unable to create unix socket for Consul {label} endpoint: {e}")))?;
        tracing::debug!(alloc_id = %req.alloc.id, socket = self.endpoint.socket(), dest, "serving the Consul {label} socket");
        *serving = Serving::Running(SocketProxy::start(listener, dest, self.cancel.child_token()));
        Ok(())
    }

    /// Stops serving and removes the socket.
    fn stop(&self, req: &AllocHookRequest<'_>) {
        if let Serving::Running(p) = std::mem::replace(&mut *lock(&self.proxy), Serving::Stopped) {
            // Cancelling closes the listener and every connection at once.
            p.cancel();
        }
        let name = std::path::Path::new(self.endpoint.socket()).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Ok(tmp) = Beneath::open(req.alloc_dir).and_then(|d| alloc_tmp(&d))
            && let Err(e) = tmp.remove_file(std::path::Path::new(name))
            && !e.is_not_found()
        {
            tracing::debug!(alloc_id = %req.alloc.id, error = %e, "removing the Consul socket");
        }
    }
}

impl AllocHook for ConsulSocketHook {
    fn name(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Grpc => "consul_grpc_socket",
            Endpoint::Http => "consul_http_socket",
        }
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn update(&self) -> Option<&dyn UpdateHook> {
        Some(self)
    }
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        Some(self)
    }
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        Some(self)
    }
}

impl PrerunHook for ConsulSocketHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        // No state: a restarted agent runs this again and serves the socket anew.
        Box::pin(std::future::ready(self.run(req).map(|()| None)))
    }
}

impl UpdateHook for ConsulSocketHook {
    fn update(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.run(req)
    }
}

impl PostrunHook for ConsulSocketHook {
    fn postrun(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.stop(req);
        Ok(())
    }
}

impl DestroyHook for ConsulSocketHook {
    fn destroy(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.stop(req);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
