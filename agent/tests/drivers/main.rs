//! Driver tests, one binary: raw_exec, exec, oci, and recovery of tasks across agent restarts.

mod exec;
mod oci;
mod raw_exec;
mod recover;
mod stats;
mod support;
