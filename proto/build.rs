//! Generates the client-server gRPC services. Messages are the serde types in
//! `src/rpc/`, carried by a JSON codec, so there is no second copy of any type.

use tonic_build::manual::{Builder, Method, Service};

fn unary(name: &str, route: &str, input: &str, output: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::rpc::{input}"))
        .output_type(format!("crate::rpc::{output}"))
        .codec_path("crate::rpc::codec::NodeRpcCodec")
        .build()
}

/// A server-streaming call: one request, a stream of replies.
fn server_streaming(name: &str, route: &str, input: &str, output: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::rpc::{input}"))
        .output_type(format!("crate::rpc::{output}"))
        .codec_path("crate::rpc::codec::NodeRpcCodec")
        .server_streaming()
        .build()
}

fn main() {
    let node = Service::builder()
        .name("Node")
        .package("nomad")
        .comment("RPCs a client node makes; every call is authenticated by the node's SecretID.")
        .method(unary("register", "Register", "NodeRegisterRequest", "NodeUpdateResponse"))
        .method(unary("update_status", "UpdateStatus", "NodeUpdateStatusRequest", "NodeUpdateResponse"))
        .method(unary("update_alloc", "UpdateAlloc", "AllocUpdateRequest", "GenericResponse"))
        .method(unary("get_client_allocs", "GetClientAllocs", "NodeSpecificRequest", "NodeClientAllocsResponse"))
        // The channel servers call the client over (servers never dial clients): the client
        // keeps this stream open to the server it talks to and answers each request with
        // `ServerRequestReply` on the same connection.
        .method(server_streaming("server_requests", "ServerRequests", "NodeServerRequestsRequest", "ServerRequest"))
        .method(unary("server_request_reply", "ServerRequestReply", "ServerRequestReply", "GenericResponse"))
        .method(unary("derive_si_token", "DeriveSIToken", "DeriveSiTokenRequest", "DeriveSiTokenResponse"))
        // Workload identities (JWTs the servers' keyring signs) for tasks with an `identity` block.
        .method(unary("sign_identities", "SignIdentities", "SignIdentitiesRequest", "SignIdentitiesResponse"))
        // A caller's ACL token, for a client agent authorizing its own HTTP routes (Nomad's
        // client calls `ACL.ResolveToken`/`WhoAmI`).
        .method(unary("resolve_token", "ResolveToken", "NodeResolveTokenRequest", "NodeResolveTokenResponse"))
        .build();
    let alloc = Service::builder()
        .name("Alloc")
        .package("nomad")
        .comment("Alloc reads for client nodes.")
        .method(unary("get_allocs", "GetAllocs", "AllocsGetRequest", "AllocsGetResponse"))
        .build();
    let services = Service::builder()
        .name("ServiceRegistration")
        .package("nomad")
        .comment("Nomad-native service registrations, written by the client running the alloc.")
        .method(unary("upsert", "Upsert", "ServiceRegistrationUpsertRequest", "GenericResponse"))
        .method(unary("delete_by_alloc", "DeleteByAlloc", "ServiceRegistrationDeleteRequest", "GenericResponse"))
        .method(unary("delete_by_id", "DeleteByID", "ServiceRegistrationDeleteByIdRequest", "GenericResponse"))
        .build();
    let csi_volume = Service::builder()
        .name("CSIVolume")
        .package("nomad")
        .comment("CSI volume claims and their release, made by the client running the alloc.")
        .method(unary("claim", "Claim", "CsiVolumeClaimRequest", "CsiVolumeClaimResponse"))
        .method(unary("unpublish", "Unpublish", "CsiVolumeUnpublishRequest", "GenericResponse"))
        .build();
    Builder::new().compile(&[node, alloc, services, csi_volume]);
}
