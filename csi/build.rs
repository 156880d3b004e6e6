//! Compiles `proto/csi.proto` with protox (a protobuf compiler in Rust, so no `protoc` is needed)
//! and generates the prost messages and tonic clients and servers from its descriptors.

fn main() {
    let proto = "proto/csi.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = match protox::compile([proto], ["proto"]) {
        Ok(descriptors) => descriptors,
        // protox's error names the file, line and column.
        Err(e) => panic!("{proto}: {e}"),
    };
    if let Err(e) = tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors) {
        panic!("generating the CSI services from {proto}: {e}");
    }
}
