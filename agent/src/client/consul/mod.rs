//! The client role's Consul work: service registrations (`services.rs`) and their sync loop
//! (`sync.rs`). The HTTP client they use is shared with the server role (`crate::consul`).

pub use crate::consul::*;

pub mod agent_services;
pub mod checks;
pub mod services;
pub mod sync;
