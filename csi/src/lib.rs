//! The Container Storage Interface for nomad-rs.
//!
//! - [`v1`]: the CSI 1.7 protobuf messages and the Identity, Controller and Node gRPC services,
//!   generated at build time from `proto/csi.proto` (the one copy of these types).
//! - [`endpoint`]: CSI's `unix://` endpoints: a gRPC channel to a plugin's socket, and the
//!   listener a plugin serves on.
//! - [`client`]: [`CsiPluginClient`], the narrow interface Nomad's client drives a plugin
//!   through, with Nomad's timeouts, retries and error wording; [`GrpcPluginClient`] implements it
//!   over a socket.
//! - [`capability`]: volume capabilities from Nomad's attachment and access mode names.
//!
//! The `csi-hostpath` binary (`src/bin/csi-hostpath/`) is a plugin in the manner of the
//! Kubernetes reference hostpath driver, to run as a task and test against.

#![warn(missing_docs)]

pub mod capability;
pub mod client;
pub mod endpoint;

pub use client::{CsiError, CsiPluginClient, GrpcPluginClient};

/// CSI 1.7, package `csi.v1`: messages, clients (`identity_client`, `controller_client`,
/// `node_client`) and servers (`identity_server`, `controller_server`, `node_server`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}
