//! Driver tests, one binary: raw_exec, exec, oci, docker, and recovery of tasks across agent restarts.

mod docker;
mod exec;
mod oci;
mod raw_exec;
mod recover;
mod stats;
mod support;
