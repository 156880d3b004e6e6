//! The nomad-rs agent: the client role, the in-process server role, and the CLI.

pub mod cli;
pub mod client;
pub mod config;
pub mod consul;
pub mod executor;
pub mod fs_beneath;
pub mod http_forward;
pub mod logging;
pub mod tls;
