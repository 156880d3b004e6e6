//! The nomad-rs server role.

pub mod acl;
pub mod broker;
pub mod client_conn;
pub mod consensus;
pub mod consul;
pub mod csi;
pub mod drainer;
pub mod endpoints;
pub mod events;
pub mod fsm;
pub mod heartbeat;
pub mod http;
pub mod keyring;
pub mod leader;
pub mod log_hub;
pub mod metrics;
pub mod plan_apply;
pub mod raft;
pub mod rpc;
pub mod rpc_auth;
pub mod rpc_listener;
pub mod rpc_tls;
pub mod scheduler;
pub mod server;
pub mod sim;
pub mod snapshot;
pub mod state;
#[cfg(test)]
mod test_support;
pub mod testing;
pub mod worker;
