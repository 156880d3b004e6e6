//! The nomad-rs agent: the client role, the in-process server role, and the CLI.

pub mod client;
pub mod executor;
