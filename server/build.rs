//! Generates the server-to-server Raft gRPC service. Messages are serde types
//! (openraft's own RPC structs plus a few of ours in `src/raft/rpc.rs`)
//! carried by the JSON codec, so there is no protobuf copy of any of them.

use tonic_build::manual::{Builder, Method, Service};

fn unary(name: &str, route: &str, input: &str, output: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::raft::rpc::{input}"))
        .output_type(format!("crate::raft::rpc::{output}"))
        .codec_path("nomad_proto::rpc::codec::JsonCodec")
        .build()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let raft = Service::builder()
        .name("Raft")
        .package("nomad.raft")
        .comment("Server-to-server RPCs: Raft replication plus forwarding, joining and bootstrap discovery.")
        .method(unary("append_entries", "AppendEntries", "AppendEntriesArgs", "AppendEntriesReply"))
        .method(unary("vote", "Vote", "VoteArgs", "VoteReply"))
        .method(unary("install_snapshot", "InstallSnapshot", "InstallSnapshotArgs", "InstallSnapshotReply"))
        .method(unary("forward", "Forward", "ForwardRequest", "ForwardReply"))
        .method(unary("join", "Join", "JoinRequest", "JoinReply"))
        .method(unary("remove_peer", "RemovePeer", "RemovePeerRequest", "RemovePeerReply"))
        .method(unary("info", "Info", "InfoRequest", "InfoReply"))
        .build();
    Builder::new().compile(&[raft]);
}
