//! The client role: runs allocations on this host.

pub mod driver;
