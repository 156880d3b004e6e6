//! How Nomad's client drives one CSI plugin: the narrow [`CsiPluginClient`] interface (so the
//! client's CSI code and its tests can use a fake) and [`GrpcPluginClient`], which speaks gRPC
//! to the plugin's unix socket.
//!
//! As in Nomad (`plugins/csi/client.go`, `client/csi_endpoint.go`,
//! `client/pluginmanager/csimanager/volume.go` at v1.6):
//! - every call has a deadline: 5 s for `Probe`, 30 s for the fingerprint calls (plugin info and
//!   capabilities, node info and capabilities), 2 min for each try of a volume call;
//! - volume calls (stage, publish, unpublish, unstage, and the controller calls) are tried up to 3
//!   times, with 100 ms then 200 ms between tries, when the plugin answers `UNAVAILABLE` or
//!   `RESOURCE_EXHAUSTED`, when a try runs out of time, when the connection is lost mid-call
//!   (tonic says `CANCELLED`, reported here as `UNAVAILABLE` as Go does), or when the socket is
//!   not there (yet);
//!   every other code is final. `Probe` and the fingerprint calls are tried once: their callers
//!   loop ([`wait_until_ready`] is the supervisor's first loop);
//! - requests are checked for the fields the specification requires before anything is sent;
//! - the codes CSI gives a meaning to are explained in Nomad's words, and a `NOT_FOUND` from an
//!   unpublish or unstage is ignorable (the volume is already gone from that node): its message
//!   carries Nomad's `CSI client error (ignorable)`, and [`CsiError::is_ignorable`] says so.
//!
//! Staging and target paths are the caller's: this module passes them through unchanged.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::capability::check_confirmed;
use crate::endpoint::{self, EndpointError};
use crate::v1;
use crate::v1::controller_client::ControllerClient;
use crate::v1::identity_client::IdentityClient;
use crate::v1::node_client::NodeClient;

/// Nomad's marker for an error the caller may treat as success (`ErrCSIClientRPCIgnorable`).
pub const IGNORABLE: &str = "CSI client error (ignorable)";

/// What the plugin reports about itself (`GetPluginInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The plugin's name, e.g. `hostpath.csi.k8s.io` (Nomad's plugin "Provider").
    pub name: String,
    /// The plugin's version.
    pub vendor_version: String,
}

/// The plugin-wide capabilities Nomad reads (`GetPluginCapabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginCapabilities {
    /// `CONTROLLER_SERVICE`: volumes need the controller (Nomad's `RequiresControllerPlugin`).
    pub controller_service: bool,
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS` (Nomad's `RequiresTopologies`).
    pub accessibility_constraints: bool,
}

/// What a node plugin says about its node (`NodeGetInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The plugin's ID for this node: the node ID of controller calls (Nomad's ExternalNodeID).
    pub node_id: String,
    /// The most volumes the node takes; `i64::MAX` when the plugin sets no limit, as in Nomad.
    pub max_volumes: i64,
    /// The topology segments this node can reach volumes in, if the plugin reports them.
    pub accessible_topology: Option<HashMap<String, String>>,
}

/// A node plugin's capabilities (`NodeGetCapabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`: `NodeStageVolume` comes before `NodePublishVolume`.
    pub stage_unstage_volume: bool,
    /// `GET_VOLUME_STATS`.
    pub get_volume_stats: bool,
    /// `EXPAND_VOLUME`.
    pub expand_volume: bool,
    /// `VOLUME_CONDITION`.
    pub volume_condition: bool,
}

/// A controller plugin's capabilities (`ControllerGetCapabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControllerCapabilities {
    /// `CREATE_DELETE_VOLUME`.
    pub create_delete_volume: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`: volumes are attached to a node before they are staged.
    pub publish_unpublish_volume: bool,
    /// `LIST_VOLUMES`.
    pub list_volumes: bool,
    /// `GET_CAPACITY`.
    pub get_capacity: bool,
    /// `CREATE_DELETE_SNAPSHOT`.
    pub create_delete_snapshot: bool,
    /// `LIST_SNAPSHOTS`.
    pub list_snapshots: bool,
    /// `CLONE_VOLUME`.
    pub clone_volume: bool,
    /// `PUBLISH_READONLY`.
    pub publish_readonly: bool,
    /// `EXPAND_VOLUME`.
    pub expand_volume: bool,
    /// `LIST_VOLUMES_PUBLISHED_NODES`.
    pub list_volumes_published_nodes: bool,
    /// `VOLUME_CONDITION`.
    pub volume_condition: bool,
    /// `GET_VOLUME`.
    pub get_volume: bool,
}

/// Why a call to a plugin failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsiError {
    /// The request lacks a field the specification requires; nothing was sent.
    #[error("{method}: {what}")]
    InvalidRequest {
        /// The RPC.
        method: &'static str,
        /// What is missing or wrong.
        what: String,
    },
    /// The plugin's socket is not there, or the endpoint is unusable.
    #[error("{method}: {reason}")]
    Unreachable {
        /// The RPC.
        method: &'static str,
        /// Why, naming the socket.
        reason: String,
    },
    /// The plugin (or the connection to it) answered with an error status.
    #[error("{message}")]
    Status {
        /// The RPC.
        method: &'static str,
        /// The gRPC status code.
        code: Code,
        /// The whole message, Nomad's: its explanation of the code where CSI gives it a
        /// meaning, and the plugin's own message (the RPC is in `method`, not here).
        message: String,
        /// The caller may treat it as success (an unpublish of a volume that is gone).
        ignorable: bool,
    },
    /// The last try did not finish within its deadline.
    #[error("{method}: the plugin did not answer within {after:?} (try {attempts})")]
    Timeout {
        /// The RPC.
        method: &'static str,
        /// The deadline of one try.
        after: Duration,
        /// How many tries were made.
        attempts: u32,
    },
    /// The plugin's answer breaks the specification.
    #[error("{method}: {what}")]
    BadResponse {
        /// The RPC.
        method: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// The plugin did not become ready within the health timeout ([`wait_until_ready`]).
    #[error("CSI plugin failed probe within {after:?}: {last}")]
    NotReady {
        /// The health timeout.
        after: Duration,
        /// The last probe's error, or that it answered "not ready".
        last: String,
    },
}

impl CsiError {
    /// Whether trying again may succeed: the codes and conditions Nomad retries on.
    pub fn is_retryable(&self) -> bool {
        match self {
            CsiError::Status { code, .. } => is_retryable_code(*code),
            CsiError::Timeout { .. } | CsiError::Unreachable { .. } => true,
            CsiError::InvalidRequest { .. } | CsiError::BadResponse { .. } | CsiError::NotReady { .. } => false,
        }
    }

    /// Whether the caller may treat the failure as success (Nomad's `ErrCSIClientRPCIgnorable`).
    pub fn is_ignorable(&self) -> bool {
        matches!(self, CsiError::Status { ignorable: true, .. })
    }

    /// The gRPC status code, when the plugin answered with one.
    pub fn code(&self) -> Option<Code> {
        match self {
            CsiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn is_retryable_code(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::ResourceExhausted)
}

/// The calls Nomad's client makes to a CSI plugin. Every method has a deadline.
///
/// Paths are the caller's: Nomad's layout (`<root>/staging/<vol>/<usage>`,
/// `<root>/per-alloc/<alloc>/<vol>/<usage>`, as the plugin sees them) is built by the caller.
pub trait CsiPluginClient: Send + Sync {
    /// `Probe`, once: whether the plugin is ready (an unset `ready` counts as ready).
    fn probe(&self) -> BoxFuture<'_, Result<bool, CsiError>>;
    /// `GetPluginInfo`, once; an empty name is an error.
    fn plugin_info(&self) -> BoxFuture<'_, Result<PluginInfo, CsiError>>;
    /// `GetPluginCapabilities`, once.
    fn plugin_capabilities(&self) -> BoxFuture<'_, Result<PluginCapabilities, CsiError>>;
    /// `NodeGetInfo`, once; an empty node ID is an error.
    fn node_info(&self) -> BoxFuture<'_, Result<NodeInfo, CsiError>>;
    /// `NodeGetCapabilities`, once.
    fn node_capabilities(&self) -> BoxFuture<'_, Result<NodeCapabilities, CsiError>>;
    /// `NodeStageVolume`, with retries; needs `volume_id`, `staging_target_path` and
    /// `volume_capability`.
    fn node_stage_volume(&self, request: v1::NodeStageVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>>;
    /// `NodeUnstageVolume`, with retries; `NOT_FOUND` is ignorable.
    fn node_unstage_volume(&self, volume_id: String, staging_target_path: String) -> BoxFuture<'_, Result<(), CsiError>>;
    /// `NodePublishVolume`, with retries; needs `volume_id`, `target_path` and
    /// `volume_capability` (and `staging_target_path` when the plugin stages).
    fn node_publish_volume(&self, request: v1::NodePublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>>;
    /// `NodeUnpublishVolume`, with retries; `NOT_FOUND` is ignorable.
    fn node_unpublish_volume(&self, volume_id: String, target_path: String) -> BoxFuture<'_, Result<(), CsiError>>;
    /// `ControllerGetCapabilities`, once.
    fn controller_capabilities(&self) -> BoxFuture<'_, Result<ControllerCapabilities, CsiError>>;
    /// `ControllerPublishVolume`, with retries; the publish context for the node calls.
    fn controller_publish_volume(
        &self,
        request: v1::ControllerPublishVolumeRequest,
    ) -> BoxFuture<'_, Result<HashMap<String, String>, CsiError>>;
    /// `ControllerUnpublishVolume`, with retries; `NOT_FOUND` is ignorable.
    fn controller_unpublish_volume(&self, request: v1::ControllerUnpublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>>;
    /// `CreateVolume`, with retries: the volume as created (or as it already was).
    fn create_volume(&self, request: v1::CreateVolumeRequest) -> BoxFuture<'_, Result<v1::Volume, CsiError>>;
    /// `DeleteVolume`, with retries.
    fn delete_volume(&self, request: v1::DeleteVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>>;
    /// `ValidateVolumeCapabilities`, with retries; fails when a confirmed capability
    /// contradicts the request ([`check_confirmed`]).
    fn validate_volume_capabilities(&self, request: v1::ValidateVolumeCapabilitiesRequest) -> BoxFuture<'_, Result<(), CsiError>>;
}

/// Probes every `interval` until the plugin is ready, for at most `health_timeout` (Nomad's
/// supervisor: `csi_plugin { health_timeout }`, default 30 s, probing every 5 s).
pub async fn wait_until_ready(client: &dyn CsiPluginClient, health_timeout: Duration, interval: Duration) -> Result<(), CsiError> {
    let deadline = tokio::time::Instant::now() + health_timeout;
    loop {
        let last = match tokio::time::timeout_at(deadline, client.probe()).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => "the plugin is not ready".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the probe did not finish in time".to_string(),
        };
        let next = tokio::time::Instant::now() + interval;
        if next >= deadline {
            return Err(CsiError::NotReady { after: health_timeout, last });
        }
        tracing::debug!(error = %last, "CSI plugin not ready");
        tokio::time::sleep_until(next).await;
    }
}

/// How long calls may take and how often volume calls are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One `Probe` (Nomad: 5 s).
    pub probe: Duration,
    /// One fingerprint call (Nomad: the 30 s fingerprint interval).
    pub fingerprint: Duration,
    /// One try of a volume call (Nomad: 2 min).
    pub volume_try: Duration,
    /// Tries of a volume call (Nomad: 3).
    pub volume_attempts: u32,
    /// The wait before the second try, doubled before each later one (Nomad: 100 ms).
    pub backoff: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            probe: Duration::from_secs(5),
            fingerprint: Duration::from_secs(30),
            volume_try: Duration::from_secs(120),
            volume_attempts: 3,
            backoff: Duration::from_millis(100),
        }
    }
}

/// A [`CsiPluginClient`] over gRPC to the plugin's unix socket. Cheap to clone; it dials on
/// first use and again after the plugin restarts.
#[derive(Debug, Clone)]
pub struct GrpcPluginClient {
    socket: PathBuf,
    channel: Channel,
    timeouts: Timeouts,
}

/// One try's outcome, before the RPC's own explanations are added.
enum Failure {
    NoSocket,
    Status(Status),
    Timeout,
}

impl Failure {
    fn retryable(&self) -> bool {
        match self {
            Failure::NoSocket | Failure::Timeout => true,
            Failure::Status(s) => is_retryable_code(s.code()),
        }
    }
}

/// Nomad's explanation of a status code for one RPC: `(ignorable, sentence)`.
type Explain<'a> = &'a (dyn Fn(Code) -> Option<(bool, String)> + Sync);

const INTERNAL_NODE: &str = "node plugin returned an internal error, check the plugin allocation logs for more information";
const INTERNAL_CONTROLLER: &str = "controller plugin returned an internal error, check the plugin allocation logs for more information";

impl GrpcPluginClient {
    /// A client for the plugin listening at `socket`, with Nomad's timeouts.
    pub fn new(socket: &Path) -> Result<GrpcPluginClient, EndpointError> {
        GrpcPluginClient::with_timeouts(socket, Timeouts::default())
    }

    /// A client with other timeouts (tests).
    pub fn with_timeouts(socket: &Path, timeouts: Timeouts) -> Result<GrpcPluginClient, EndpointError> {
        Ok(GrpcPluginClient { socket: socket.to_path_buf(), channel: endpoint::channel(socket)?, timeouts })
    }

    /// The plugin's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Runs one call, trying up to `attempts` times while it fails in a retryable way.
    async fn call<T, F, Fut>(&self, method: &'static str, per_try: Duration, attempts: u32, mut attempt: F) -> Result<T, (Failure, u32)>
    where
        F: FnMut(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut tries = 0;
        loop {
            if tries > 0 {
                tokio::time::sleep(self.timeouts.backoff * 2u32.saturating_pow(tries - 1)).await;
            }
            tries += 1;
            let failure = if !self.socket.exists() {
                Failure::NoSocket
            } else {
                let started = tokio::time::Instant::now();
                match tokio::time::timeout(per_try, attempt(self.channel.clone(), per_try)).await {
                    Ok(Ok(response)) => return Ok(response.into_inner()),
                    // The deadline travels in the grpc-timeout header, and tonic's server and
                    // client end a call that outlives it with CANCELLED (Go: DEADLINE_EXCEEDED).
                    Ok(Err(status))
                        if status.code() == Code::DeadlineExceeded
                            || (status.code() == Code::Cancelled && started.elapsed() >= per_try) =>
                    {
                        Failure::Timeout
                    }
                    // Nothing here cancels a call before its deadline: a CANCELLED now is
                    // hyper giving up on a connection the plugin dropped (it died or
                    // restarted), which Go reports as UNAVAILABLE and retries.
                    Ok(Err(status)) if status.code() == Code::Cancelled => {
                        Failure::Status(Status::unavailable(format!("the connection to the plugin was lost: {}", status.message())))
                    }
                    Ok(Err(status)) => Failure::Status(status),
                    Err(_) => Failure::Timeout,
                }
            };
            if tries >= attempts || !failure.retryable() {
                return Err((failure, tries));
            }
            tracing::debug!(method, socket = %self.socket.display(), attempt = tries, "retrying a CSI call");
        }
    }

    /// A call tried once (probe, fingerprint).
    async fn once<T, F, Fut>(&self, method: &'static str, per_try: Duration, attempt: F) -> Result<T, CsiError>
    where
        F: FnMut(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call(method, per_try, 1, attempt).await.map_err(|(failure, tries)| self.error(method, per_try, failure, tries, &|_| None))
    }

    /// A volume call, with retries and the RPC's explanations of codes.
    async fn volume_call<T, F, Fut>(&self, method: &'static str, explain: Explain<'_>, attempt: F) -> Result<T, CsiError>
    where
        F: FnMut(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let per_try = self.timeouts.volume_try;
        self.call(method, per_try, self.timeouts.volume_attempts.max(1), attempt)
            .await
            .map_err(|(failure, tries)| self.error(method, per_try, failure, tries, explain))
    }

    fn error(&self, method: &'static str, per_try: Duration, failure: Failure, attempts: u32, explain: Explain<'_>) -> CsiError {
        match failure {
            Failure::NoSocket => {
                CsiError::Unreachable { method, reason: format!("CSI plugin socket {} does not exist", self.socket.display()) }
            }
            Failure::Timeout => CsiError::Timeout { method, after: per_try, attempts },
            Failure::Status(status) => {
                let code = status.code();
                // Go's rendering of a status, which Nomad's servers match on ("FailedPrecondition").
                let rpc = format!("rpc error: code = {code:?} desc = {}", status.message());
                // Nomad's text, which names no RPC: callers say which call failed.
                let (ignorable, message) = match explain(code) {
                    Some((true, sentence)) => (true, format!("{IGNORABLE}: {sentence}: {rpc}")),
                    Some((false, sentence)) => (false, format!("{sentence}: {rpc}")),
                    None => (false, rpc),
                };
                CsiError::Status { method, code, message, ignorable }
            }
        }
    }
}

/// A request with a deadline the plugin sees too (the `grpc-timeout` header).
fn request<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

fn require(method: &'static str, present: bool, what: &str) -> Result<(), CsiError> {
    if present { Ok(()) } else { Err(CsiError::InvalidRequest { method, what: format!("missing {what}") }) }
}

impl CsiPluginClient for GrpcPluginClient {
    fn probe(&self) -> BoxFuture<'_, Result<bool, CsiError>> {
        Box::pin(async move {
            let response = self
                .once("Probe", self.timeouts.probe, |channel, timeout| async move {
                    IdentityClient::new(channel).probe(request(v1::ProbeRequest {}, timeout)).await
                })
                .await?;
            // A plugin without a readiness notion leaves `ready` unset: ready.
            Ok(response.ready.is_none_or(|ready| ready))
        })
    }

    fn plugin_info(&self) -> BoxFuture<'_, Result<PluginInfo, CsiError>> {
        Box::pin(async move {
            let method = "GetPluginInfo";
            let response = self
                .once(method, self.timeouts.fingerprint, |channel, timeout| async move {
                    IdentityClient::new(channel).get_plugin_info(request(v1::GetPluginInfoRequest {}, timeout)).await
                })
                .await?;
            if response.name.is_empty() {
                return Err(CsiError::BadResponse { method, what: "plugin returned empty name field".to_string() });
            }
            Ok(PluginInfo { name: response.name, vendor_version: response.vendor_version })
        })
    }

    fn plugin_capabilities(&self) -> BoxFuture<'_, Result<PluginCapabilities, CsiError>> {
        Box::pin(async move {
            let response = self
                .once("GetPluginCapabilities", self.timeouts.fingerprint, |channel, timeout| async move {
                    IdentityClient::new(channel).get_plugin_capabilities(request(v1::GetPluginCapabilitiesRequest {}, timeout)).await
                })
                .await?;
            Ok(PluginCapabilities::from(&response))
        })
    }

    fn node_info(&self) -> BoxFuture<'_, Result<NodeInfo, CsiError>> {
        Box::pin(async move {
            let method = "NodeGetInfo";
            let response = self
                .once(method, self.timeouts.fingerprint, |channel, timeout| async move {
                    NodeClient::new(channel).node_get_info(request(v1::NodeGetInfoRequest {}, timeout)).await
                })
                .await?;
            if response.node_id.is_empty() {
                return Err(CsiError::BadResponse { method, what: "plugin failed to return nodeid".to_string() });
            }
            Ok(NodeInfo {
                node_id: response.node_id,
                // No limit: a value the scheduler never reaches.
                max_volumes: if response.max_volumes_per_node <= 0 { i64::MAX } else { response.max_volumes_per_node },
                accessible_topology: response.accessible_topology.map(|t| t.segments),
            })
        })
    }

    fn node_capabilities(&self) -> BoxFuture<'_, Result<NodeCapabilities, CsiError>> {
        Box::pin(async move {
            let response = self
                .once("NodeGetCapabilities", self.timeouts.fingerprint, |channel, timeout| async move {
                    NodeClient::new(channel).node_get_capabilities(request(v1::NodeGetCapabilitiesRequest {}, timeout)).await
                })
                .await?;
            Ok(NodeCapabilities::from(&response))
        })
    }

    fn node_stage_volume(&self, req: v1::NodeStageVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "NodeStageVolume";
            require(method, !req.volume_id.is_empty(), "volume ID")?;
            require(method, !req.staging_target_path.is_empty(), "StagingTargetPath")?;
            require(method, req.volume_capability.is_some(), "VolumeCapabilities")?;
            let (id, path) = (req.volume_id.clone(), req.staging_target_path.clone());
            let explain = move |code| match code {
                Code::NotFound => Some((false, format!("volume {id:?} could not be found"))),
                Code::AlreadyExists => Some((
                    false,
                    format!("volume {id:?} is already staged to {path:?} but with incompatible capabilities for this request"),
                )),
                Code::FailedPrecondition => Some((
                    false,
                    format!("volume {id:?} is already published on another node and does not have MULTI_NODE volume capability"),
                )),
                Code::Internal => Some((false, INTERNAL_NODE.to_string())),
                _ => None,
            };
            self.volume_call(method, &explain, |channel, timeout| {
                let req = req.clone();
                async move { NodeClient::new(channel).node_stage_volume(request(req, timeout)).await }
            })
            .await
            .map(drop)
        })
    }

    fn node_unstage_volume(&self, volume_id: String, staging_target_path: String) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "NodeUnstageVolume";
            require(method, !volume_id.is_empty(), "volumeID")?;
            require(method, !staging_target_path.is_empty(), "stagingTargetPath")?;
            let id = volume_id.clone();
            let explain = move |code| match code {
                Code::NotFound => Some((true, format!("volume {id:?} could not be found"))),
                Code::Internal => Some((false, INTERNAL_NODE.to_string())),
                _ => None,
            };
            let req = v1::NodeUnstageVolumeRequest { volume_id, staging_target_path };
            self.volume_call(method, &explain, |channel, timeout| {
                let req = req.clone();
                async move { NodeClient::new(channel).node_unstage_volume(request(req, timeout)).await }
            })
            .await
            .map(drop)
        })
    }

    fn node_publish_volume(&self, req: v1::NodePublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "NodePublishVolume";
            require(method, !req.volume_id.is_empty(), "volume ID")?;
            require(method, !req.target_path.is_empty(), "TargetPath")?;
            require(method, req.volume_capability.is_some(), "VolumeCapabilities")?;
            let (id, path) = (req.volume_id.clone(), req.target_path.clone());
            let explain = move |code| match code {
                Code::NotFound => Some((false, format!("volume {id:?} could not be found"))),
                Code::AlreadyExists => Some((
                    false,
                    format!(
                        "volume {id:?} is already published at target path {path:?} but with capabilities or a read_only setting incompatible with this request"
                    ),
                )),
                Code::FailedPrecondition => Some((
                    false,
                    format!("volume {id:?} is already published on another node and does not have MULTI_NODE volume capability"),
                )),
                Code::Internal => Some((false, INTERNAL_NODE.to_string())),
                _ => None,
            };
            self.volume_call(method, &explain, |channel, timeout| {
                let req = req.clone();
                async move { NodeClient::new(channel).node_publish_volume(request(req, timeout)).await }
            })
            .await
            .map(drop)
        })
    }

    fn node_unpublish_volume(&self, volume_id: String, target_path: String) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "NodeUnpublishVolume";
            require(method, !volume_id.is_empty(), "volumeID")?;
            require(method, !target_path.is_empty(), "targetPath")?;
            let id = volume_id.clone();
            let explain = move |code| match code {
                Code::NotFound => Some((true, format!("volume {id:?} could not be found"))),
                Code::Internal => Some((false, INTERNAL_NODE.to_string())),
                _ => None,
            };
            let req = v1::NodeUnpublishVolumeRequest { volume_id, target_path };
            self.volume_call(method, &explain, |channel, timeout| {
                let req = req.clone();
                async move { NodeClient::new(channel).node_unpublish_volume(request(req, timeout)).await }
            })
            .await
            .map(drop)
        })
    }

    fn controller_capabilities(&self) -> BoxFuture<'_, Result<ControllerCapabilities, CsiError>> {
        Box::pin(async move {
            let response = self
                .once("ControllerGetCapabilities", self.timeouts.fingerprint, |channel, timeout| async move {
                    ControllerClient::new(channel)
                        .controller_get_capabilities(request(v1::ControllerGetCapabilitiesRequest {}, timeout))
                        .await
                })
                .await?;
            Ok(ControllerCapabilities::from(&response))
        })
    }

    fn controller_publish_volume(
        &self,
        req: v1::ControllerPublishVolumeRequest,
    ) -> BoxFuture<'_, Result<HashMap<String, String>, CsiError>> {
        Box::pin(async move {
            let method = "ControllerPublishVolume";
            require(method, !req.volume_id.is_empty(), "volume ID")?;
            require(method, !req.node_id.is_empty(), "NodeID")?;
            require(method, req.volume_capability.is_some(), "VolumeCapabilities")?;
            let (id, node) = (req.volume_id.clone(), req.node_id.clone());
            let explain = move |code| match code {
                Code::NotFound => Some((false, format!("volume {id:?} or node {node:?} could not be found"))),
                Code::AlreadyExists => Some((
                    false,
                    format!(
                        "volume {id:?} is already published at node {node:?} but with capabilities or a read_only setting incompatible with this request"
                    ),
                )),
                Code::ResourceExhausted => {
                    Some((false, format!("node {node:?} has reached the maximum allowable number of attached volumes")))
                }
                Code::FailedPrecondition => Some((
                    false,
                    format!("volume {id:?} is already published on another node and does not have MULTI_NODE volume capability"),
                )),
                Code::Internal => Some((false, INTERNAL_CONTROLLER.to_string())),
                _ => None,
            };
            let response = self
                .volume_call(method, &explain, |channel, timeout| {
                    let req = req.clone();
                    async move { ControllerClient::new(channel).controller_publish_volume(request(req, timeout)).await }
                })
                .await?;
            Ok(response.publish_context)
        })
    }

    fn controller_unpublish_volume(&self, req: v1::ControllerUnpublishVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "ControllerUnpublishVolume";
            require(method, !req.volume_id.is_empty(), "ExternalID")?;
            require(method, !req.node_id.is_empty(), "NodeID")?;
            let (id, node) = (req.volume_id.clone(), req.node_id.clone());
            let explain = move |code| match code {
                // The server checked that both exist: a NOT_FOUND means an earlier try succeeded.
                Code::NotFound => Some((true, format!("volume {id:?} or node {node:?} could not be found"))),
                Code::Internal => Some((false, INTERNAL_CONTROLLER.to_string())),
                _ => None,
            };
            self.volume_call(method, &explain, |channel, timeout| {
                let req = req.clone();
                async move { ControllerClient::new(channel).controller_unpublish_volume(request(req, timeout)).await }
            })
            .await
            .map(drop)
        })
    }

    fn create_volume(&self, req: v1::CreateVolumeRequest) -> BoxFuture<'_, Result<v1::Volume, CsiError>> {
        Box::pin(async move {
            let method = "CreateVolume";
            require(method, !req.name.is_empty(), "Name")?;
            require(method, !req.volume_capabilities.is_empty(), "VolumeCapabilities")?;
            if let Some(range) = &req.capacity_range {
                let invalid = |what: &str| Err(CsiError::InvalidRequest { method, what: what.to_string() });
                if range.required_bytes == 0 && range.limit_bytes == 0 {
                    return invalid("one of LimitBytes or RequiredBytes must be set if CapacityRange is set");
                }
                if range.required_bytes < 0 || range.limit_bytes < 0 {
                    return invalid("capacity bytes cannot be negative");
                }
                if range.limit_bytes != 0 && range.limit_bytes < range.required_bytes {
                    return invalid("LimitBytes cannot be less than RequiredBytes");
                }
            }
            let name = req.name.clone();
            let explain = move |code| match code {
                Code::InvalidArgument => Some((false, format!("volume {name:?} snapshot source is not compatible with these parameters"))),
                Code::NotFound => Some((false, format!("volume {name:?} content source does not exist"))),
                Code::AlreadyExists => Some((false, format!("volume {name:?} already exists but is incompatible with these parameters"))),
                Code::ResourceExhausted => Some((false, format!("unable to provision {name:?} in accessible_topology"))),
                Code::OutOfRange => Some((false, format!("unsupported capacity_range for volume {name:?}"))),
                Code::Internal => Some((false, INTERNAL_CONTROLLER.to_string())),
                _ => None,
            };
            let response = self
                .volume_call(method, &explain, |channel, timeout| {
                    let req = req.clone();
                    async move { ControllerClient::new(channel).create_volume(request(req, timeout)).await }
                })
                .await?;
            match response.volume {
                Some(volume) if !volume.volume_id.is_empty() => Ok(volume),
                _ => Err(CsiError::BadResponse { method, what: "plugin returned no volume ID".to_string() }),
            }
        })
    }

    fn delete_volume(&self, req: v1::DeleteVolumeRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "DeleteVolume";
            require(method, !req.volume_id.is_empty(), "ExternalVolumeID")?;
            let id = req.volume_id.clone();
            let explain = move |code| match code {
                Code::FailedPrecondition => Some((false, format!("volume {id:?} is in use"))),
                Code::Internal => Some((false, INTERNAL_CONTROLLER.to_string())),
                _ => None,
            };
            self.volume_call(method, &explain, |channel, timeout| {
                let req = req.clone();
                async move { ControllerClient::new(channel).delete_volume(request(req, timeout)).await }
            })
            .await
            .map(drop)
        })
    }

    fn validate_volume_capabilities(&self, req: v1::ValidateVolumeCapabilitiesRequest) -> BoxFuture<'_, Result<(), CsiError>> {
        Box::pin(async move {
            let method = "ValidateVolumeCapabilities";
            require(method, !req.volume_id.is_empty(), "volume ID")?;
            require(method, !req.volume_capabilities.is_empty(), "Capabilities")?;
            let id = req.volume_id.clone();
            let explain = move |code| match code {
                Code::NotFound => Some((false, format!("volume {id:?} could not be found"))),
                Code::Internal => Some((false, INTERNAL_CONTROLLER.to_string())),
                _ => None,
            };
            let requested = req.volume_capabilities.clone();
            let response = self
                .volume_call(method, &explain, |channel, timeout| {
                    let req = req.clone();
                    async move { ControllerClient::new(channel).validate_volume_capabilities(request(req, timeout)).await }
                })
                .await?;
            if !response.message.is_empty() {
                tracing::debug!(method, message = %response.message, "CSI plugin message");
            }
            // The specification lets a plugin confirm only what it checked: an unset
            // `confirmed` is not a refusal.
            let Some(confirmed) = response.confirmed.filter(|c| !c.volume_capabilities.is_empty()) else { return Ok(()) };
            for capability in &requested {
                check_confirmed(capability, &confirmed.volume_capabilities)
                    .map_err(|why| CsiError::BadResponse { method, what: format!("volume capability validation failed: {why}") })?;
            }
            Ok(())
        })
    }
}

impl From<&v1::GetPluginCapabilitiesResponse> for PluginCapabilities {
    fn from(response: &v1::GetPluginCapabilitiesResponse) -> Self {
        use v1::plugin_capability::{Type, service::Type as Service};
        let mut caps = PluginCapabilities::default();
        for capability in &response.capabilities {
            if let Some(Type::Service(service)) = &capability.r#type {
                match service.r#type() {
                    Service::ControllerService => caps.controller_service = true,
                    Service::VolumeAccessibilityConstraints => caps.accessibility_constraints = true,
                    Service::Unknown => {}
                }
            }
        }
        caps
    }
}

impl From<&v1::NodeGetCapabilitiesResponse> for NodeCapabilities {
    fn from(response: &v1::NodeGetCapabilitiesResponse) -> Self {
        use v1::node_service_capability::{Type, rpc::Type as Rpc};
        let mut caps = NodeCapabilities::default();
        for capability in &response.capabilities {
            let Some(Type::Rpc(rpc)) = &capability.r#type else { continue };
            match rpc.r#type() {
                Rpc::StageUnstageVolume => caps.stage_unstage_volume = true,
                Rpc::GetVolumeStats => caps.get_volume_stats = true,
                Rpc::ExpandVolume => caps.expand_volume = true,
                Rpc::VolumeCondition => caps.volume_condition = true,
                Rpc::Unknown | Rpc::SingleNodeMultiWriter | Rpc::VolumeMountGroup => {}
            }
        }
        caps
    }
}

impl From<&v1::ControllerGetCapabilitiesResponse> for ControllerCapabilities {
    fn from(response: &v1::ControllerGetCapabilitiesResponse) -> Self {
        use v1::controller_service_capability::{Type, rpc::Type as Rpc};
        let mut caps = ControllerCapabilities::default();
        for capability in &response.capabilities {
            let Some(Type::Rpc(rpc)) = &capability.r#type else { continue };
            match rpc.r#type() {
                Rpc::CreateDeleteVolume => caps.create_delete_volume = true,
                Rpc::PublishUnpublishVolume => caps.publish_unpublish_volume = true,
                Rpc::ListVolumes => caps.list_volumes = true,
                Rpc::GetCapacity => caps.get_capacity = true,
                Rpc::CreateDeleteSnapshot => caps.create_delete_snapshot = true,
                Rpc::ListSnapshots => caps.list_snapshots = true,
                Rpc::CloneVolume => caps.clone_volume = true,
                Rpc::PublishReadonly => caps.publish_readonly = true,
                Rpc::ExpandVolume => caps.expand_volume = true,
                Rpc::ListVolumesPublishedNodes => caps.list_volumes_published_nodes = true,
                Rpc::VolumeCondition => caps.volume_condition = true,
                Rpc::GetVolume => caps.get_volume = true,
                Rpc::Unknown | Rpc::SingleNodeMultiWriter => {}
            }
        }
        caps
    }
}

#[cfg(test)]
mod tests;
