//! The `nomad-rs` CLI end to end: the real binary against an in-process
//! server (TestServer, or a Raft-backed Server) served on 127.0.0.1:0, and
//! against fake API servers that answer with canned eval/alloc sequences for
//! the `job run` monitor. One test binary with modules, to keep link time down.

mod support;

mod acl;
mod errors;
mod eval_delete;
mod examples;
mod jobs;
mod monitor;
mod objects;
mod snapshot;
mod variables;
mod volumes;
