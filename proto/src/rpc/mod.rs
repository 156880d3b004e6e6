//! The client-server RPC: messages and the generated gRPC services.
//!
//! Method names follow Nomad's (`Node.Register`, `Node.UpdateStatus`,
//! `Node.UpdateAlloc`, `Node.GetClientAllocs`, `Alloc.GetAllocs`). Every call
//! carries the node's SecretID; servers refuse a call whose secret does not
//! match the stored node and change nothing.

pub mod client_csi;
pub mod codec;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::alloc::Allocation;
use crate::node::{Node, NodeEvent, NodeStatus};

#[allow(missing_docs, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/nomad.Node.rs"));
    include!(concat!(env!("OUT_DIR"), "/nomad.Alloc.rs"));
    include!(concat!(env!("OUT_DIR"), "/nomad.ServiceRegistration.rs"));
    include!(concat!(env!("OUT_DIR"), "/nomad.CSIVolume.rs"));
}

/// Requests come from nodes: held to the request depth limit. Replies come from servers.
macro_rules! decode_limits {
    (requests: $($req:ty),*; replies: $($reply:ty),*) => {
        $(impl codec::DecodeLimit for $req {
            const MAX_DEPTH: Option<usize> = Some(crate::lenient::MAX_REQUEST_DEPTH);
        })*
        $(impl codec::DecodeLimit for $reply {})*
    };
}

decode_limits!(
    requests: NodeRegisterRequest, NodeUpdateStatusRequest, AllocUpdateRequest, NodeSpecificRequest, AllocsGetRequest,
        ServiceRegistrationUpsertRequest, ServiceRegistrationDeleteRequest, ServiceRegistrationDeleteByIdRequest, CsiVolumeClaimRequest, CsiVolumeUnpublishRequest,
        NodeServerRequestsRequest, ServerRequestReply;
    replies: NodeUpdateResponse, GenericResponse, NodeClientAllocsResponse, AllocsGetResponse, CsiVolumeClaimResponse, ServerRequest
);

decode_limits!(requests: DeriveSiTokenRequest, SignIdentitiesRequest; replies: DeriveSiTokenResponse, SignIdentitiesResponse);
decode_limits!(requests: NodeResolveTokenRequest; replies: NodeResolveTokenResponse);

pub use generated::alloc_client::AllocClient;
pub use generated::alloc_server::{Alloc as AllocRpc, AllocServer};
pub use generated::c_s_i_volume_client::CSIVolumeClient as CsiVolumeClient;
pub use generated::c_s_i_volume_server::{CSIVolume as CsiVolumeRpc, CSIVolumeServer as CsiVolumeServer};
pub use generated::node_client::NodeClient;
pub use generated::node_server::{Node as NodeRpc, NodeServer};
pub use generated::service_registration_client::ServiceRegistrationClient;
pub use generated::service_registration_server::{ServiceRegistration as ServiceRegistrationRpc, ServiceRegistrationServer};

/// `Node.Register`: upsert the whole node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeRegisterRequest {
    /// The node, including its SecretID.
    pub node: Node,
    /// Region.
    pub region: String,
}

/// Reply to `Node.Register` and `Node.UpdateStatus`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeUpdateResponse {
    /// Heartbeat within this long, ns (0 when no timer was set, e.g. the node is down).
    #[serde(rename = "HeartbeatTTL")]
    pub heartbeat_ttl: i64,
    /// Evals created.
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Vec<String>,
    /// Index of the eval write.
    pub eval_create_index: u64,
    /// Index of the node write.
    pub node_modify_index: u64,
    /// Leader's RPC address.
    #[serde(rename = "LeaderRPCAddr")]
    pub leader_rpc_addr: String,
    /// HTTP address of the server that answered (the leader: node RPCs are
    /// forwarded to it). A client-only agent proxies API requests there.
    #[serde(rename = "LeaderHTTPAddr")]
    pub leader_http_addr: String,
    /// Nodes in the cluster.
    pub num_nodes: i64,
    /// Servers the client may use.
    pub servers: Vec<NodeServerInfo>,
    /// The node's status after the call.
    pub status: NodeStatus,
    /// Index of the write (0 when nothing was written).
    pub index: u64,
}

/// A server a client may talk to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeServerInfo {
    /// RPC address.
    #[serde(rename = "RPCAdvertiseAddr")]
    pub rpc_advertise_addr: String,
    /// Datacenter.
    pub datacenter: String,
}

/// `Node.UpdateStatus`: the heartbeat, or a status change.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeUpdateStatusRequest {
    /// Node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Requested status (clients always send `ready`).
    pub status: NodeStatus,
    /// Event to record with the change.
    pub node_event: Option<NodeEvent>,
    /// Client time of the update, Unix seconds.
    pub updated_at: i64,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// `Node.UpdateAlloc`: client-side alloc status.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocUpdateRequest {
    /// Stripped allocs: ID, NodeID, ClientStatus, ClientDescription, TaskStates, ...
    pub alloc: Vec<Allocation>,
    /// Must be empty; evals are created by the server.
    pub evals: Vec<crate::Evaluation>,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// A reply that only carries the write index.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct GenericResponse {
    /// Raft index of the write.
    pub index: u64,
}

/// A blocking query about one node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeSpecificRequest {
    /// Node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Block until the result's index is above this.
    pub min_query_index: u64,
    /// Longest wait, ns (0: server default).
    pub max_query_time: i64,
}

/// Reply to `Node.GetClientAllocs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeClientAllocsResponse {
    /// Alloc ID to AllocModifyIndex, for every alloc on the node.
    pub allocs: BTreeMap<String, u64>,
    /// Migrate tokens.
    pub migrate_tokens: BTreeMap<String, String>,
    /// Index of the result.
    pub index: u64,
}

/// `Alloc.GetAllocs`: fetch allocs by ID.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocsGetRequest {
    /// Alloc IDs.
    #[serde(rename = "AllocIDs")]
    pub alloc_ids: Vec<String>,
    /// Node asking (its allocs only).
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Wait until the state is at least this index.
    pub min_query_index: u64,
    /// Longest wait, ns.
    pub max_query_time: i64,
}

/// Reply to `Alloc.GetAllocs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocsGetResponse {
    /// The allocs found.
    pub allocs: Vec<Allocation>,
    /// Index of the result.
    pub index: u64,
}

/// `ServiceRegistration.Upsert`: a client registers its allocs' services.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationUpsertRequest {
    /// Registrations; every one must be on the calling node.
    pub services: Vec<crate::ServiceRegistration>,
    /// Calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// `ServiceRegistration.DeleteByAlloc`: a client removes an alloc's services.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationDeleteRequest {
    /// Allocs whose registrations go.
    #[serde(rename = "AllocIDs")]
    pub alloc_ids: Vec<String>,
    /// Calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// `ServiceRegistration.DeleteByID`: a client removes one registration of its own (a task's
/// service when the task stops).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationDeleteByIdRequest {
    /// Registration ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Namespace of the registration.
    pub namespace: String,
    /// Calling node; the registration must be on it.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// `CSIVolume.Claim`: a client claims a volume for one of its allocs (Nomad's
/// `CSIVolumeClaimRequest`), or releases it (`State` past `taken`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolumeClaimRequest {
    /// Volume.
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// The claiming alloc.
    #[serde(rename = "AllocationID")]
    pub allocation_id: String,
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The provider's ID of the node.
    #[serde(rename = "ExternalNodeID")]
    pub external_node_id: String,
    /// `read`, `write` or `gc`.
    pub claim: crate::csi::CsiVolumeClaimMode,
    /// Access mode asked.
    pub access_mode: crate::csi::CsiVolumeAccessMode,
    /// Attachment mode asked.
    pub attachment_mode: crate::csi::CsiVolumeAttachmentMode,
    /// Claim state (`taken` for a new claim).
    pub state: crate::csi::CsiVolumeClaimState,
    /// Namespace of the volume.
    pub namespace: String,
    /// Region.
    pub region: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

impl CsiVolumeClaimRequest {
    /// The claim this request makes (`ToClaim`).
    pub fn to_claim(&self) -> crate::csi::CsiVolumeClaim {
        crate::csi::CsiVolumeClaim {
            allocation_id: self.allocation_id.clone(),
            node_id: self.node_id.clone(),
            external_node_id: self.external_node_id.clone(),
            mode: self.claim,
            access_mode: self.access_mode,
            attachment_mode: self.attachment_mode,
            state: self.state,
        }
    }
}

/// The reply to `CSIVolume.Claim`: the volume as claimed (secrets included: the client hands
/// them to its node plugin) and the controller's publish context.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolumeClaimResponse {
    /// Opaque publish context from the controller (empty without one).
    pub publish_context: BTreeMap<String, String>,
    /// The volume, for a new claim.
    pub volume: Option<crate::csi::CsiVolume>,
    /// Raft index of the claim.
    pub index: u64,
}

/// `CSIVolume.Unpublish`: a client reports it unpublished an alloc's volume; the servers walk
/// the claim on to `ready-to-free`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CsiVolumeUnpublishRequest {
    /// Volume.
    #[serde(rename = "VolumeID")]
    pub volume_id: String,
    /// The claim to release, in the state the client reached.
    pub claim: Option<crate::csi::CsiVolumeClaim>,
    /// Namespace of the volume.
    pub namespace: String,
    /// Region.
    pub region: String,
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// Largest request body a server sends a client over `Node.ServerRequests` (a CSI volume create
/// with its parameters, secrets and topologies is far smaller), and the largest result a client
/// sends back: both sides refuse to send more, and the client reads the stream with this limit
/// (plus [`SERVER_REQUEST_ENVELOPE_BYTES`]).
pub const MAX_SERVER_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Room for the envelope (`ID`, `Method`) around a server request's body.
pub const SERVER_REQUEST_ENVELOPE_BYTES: usize = 4096;

/// `Node.ServerRequests`: a client opens the channel servers send it requests over. It stays
/// open on the server the client talks to (never forwarded), for as long as the client keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeServerRequestsRequest {
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

/// One request a server sends a client over `Node.ServerRequests` (Nomad's server-to-client
/// RPCs, e.g. `CSI.ControllerAttachVolume`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServerRequest {
    /// Unique on the sending server; the client's reply names it.
    #[serde(rename = "ID")]
    pub id: u64,
    /// The client RPC (`CSI.ControllerAttachVolume`, ...).
    pub method: String,
    /// Its request (the method's request type, as JSON).
    pub body: serde_json::Value,
}

/// `Node.ServerRequestReply`: the client's answer to one [`ServerRequest`], sent to the server
/// that sent it. Accepted only from the node the request went to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServerRequestReply {
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// The request answered.
    #[serde(rename = "ID")]
    pub id: u64,
    /// The method's response (as JSON), when it succeeded.
    pub result: Option<serde_json::Value>,
    /// Why it failed (Nomad's error text, e.g. with `CSI client error (retryable)`).
    pub error: Option<String>,
}

/// `Node.DeriveSIToken`: a client asks for Consul Service Identity tokens for Connect tasks of
/// one of its allocs (Nomad's `DeriveSITokenRequest`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DeriveSiTokenRequest {
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// The alloc.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Tasks of the alloc wanting a token.
    pub tasks: Vec<String>,
    /// Region.
    pub region: String,
}

/// `Node.SignIdentities`: a client asks for the workload identities (signed JWTs) of tasks of one
/// of its allocs that have an `identity` block.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SignIdentitiesRequest {
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// The alloc.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Its tasks wanting an identity.
    pub tasks: Vec<String>,
    /// Region.
    pub region: String,
}

/// The reply to `Node.SignIdentities`: a JWT per task, or why none were signed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SignIdentitiesResponse {
    /// Task name to its identity.
    pub identities: BTreeMap<String, String>,
    /// Why none were signed.
    pub error: Option<RecoverableError>,
}

/// `Node.ResolveToken`: a client agent asks its servers who a caller of its HTTP API is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeResolveTokenRequest {
    /// The calling node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The node's secret.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// The caller's secret (empty: the anonymous token).
    pub auth_token: String,
    /// Region.
    pub region: String,
}

/// A policy's name and its rules, as the servers store them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AclPolicyRules {
    /// Name.
    pub name: String,
    /// The rules (HCL).
    pub rules: String,
}

/// Reply to `Node.ResolveToken`: the token and the policies it carries (through its roles
/// too), or why it was refused (`ACL token not found`, `ACL token expired`, `Permission denied`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeResolveTokenResponse {
    /// The token's accessor.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// `client` or `management`.
    #[serde(rename = "Type")]
    pub token_type: String,
    /// When the token expires, if it does.
    pub expiration_time: Option<crate::Timestamp>,
    /// The policies' documents (those that exist).
    pub policies: Vec<AclPolicyRules>,
    /// Why the secret was refused; empty when it resolved.
    pub error: String,
}

/// Nomad's `structs.RecoverableError`: an error and whether trying again may help.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RecoverableError {
    /// The message.
    pub err: String,
    /// Trying again may help.
    pub recoverable: bool,
}

/// The reply to `Node.DeriveSIToken` (Nomad's `DeriveSITokenResponse`): the tokens' secrets by
/// task, or why none were made.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DeriveSiTokenResponse {
    /// Task name to the token's SecretID.
    pub tokens: BTreeMap<String, String>,
    /// Why no tokens were made.
    pub error: Option<RecoverableError>,
    /// Raft index of the accessors' write.
    pub index: u64,
}
