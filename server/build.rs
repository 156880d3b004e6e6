//! Generates the server-to-server gRPC services (Raft, Forward, ClientConn). Messages are serde types
//! (openraft's own RPC structs plus a few of ours in `src/raft/rpc.rs`)
//! carried by the JSON codec, so there is no protobuf copy of any of them.

use tonic_build::manual::{Builder, Method, Service};

fn unary(name: &str, route: &str, input: &str, output: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(input)
        .output_type(output)
        .codec_path("nomad_proto::rpc::codec::JsonCodec")
        .build()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let raft = Service::builder()
        .name("Raft")
        .package("nomad.raft")
        .comment("Server-to-server RPCs: Raft replication, joining and bootstrap discovery.")
        .method(unary("append_entries", "AppendEntries", "crate::raft::rpc::AppendEntriesArgs", "crate::raft::rpc::AppendEntriesReply"))
        .method(unary("vote", "Vote", "crate::raft::rpc::VoteArgs", "crate::raft::rpc::VoteReply"))
        .method(unary(
            "install_snapshot",
            "InstallSnapshot",
            "crate::raft::rpc::InstallSnapshotArgs",
            "crate::raft::rpc::InstallSnapshotReply",
        ))
        .method(unary("join", "Join", "crate::raft::rpc::JoinRequest", "crate::raft::rpc::JoinReply"))
        .method(unary("info", "Info", "crate::raft::rpc::InfoRequest", "crate::raft::rpc::InfoReply"))
        .build();
    let forward = Service::builder()
        .name("Forward")
        .package("nomad.server")
        .comment("A follower hands an API request it may not answer (a write, a plan) to the leader, with the caller's credentials.")
        .method(unary("http", "Http", "crate::http::forward::ForwardedRequest", "crate::http::forward::ForwardedResponse"))
        .build();
    let client_conn = Service::builder()
        .name("ClientConn")
        .package("nomad.server")
        .comment("A server asks another to pass a call to a client whose request stream that server holds (one hop).")
        .method(unary("call", "Call", "crate::client_conn::ForwardedCall", "crate::client_conn::ForwardedCallReply"))
        .build();
    Builder::new().compile(&[raft, forward, client_conn]);
}
