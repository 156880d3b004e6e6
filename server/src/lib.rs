//! The nomad-rs server role.

pub mod fsm;
pub mod raft;
