//! Helpers every test in the workspace shares (a dev-dependency only).
//!
//! - [`prereq`]: a test that needs root, runc, busybox or iproute2 either runs, or is skipped
//!   loudly and counted, or (under CI, `NOMAD_RS_REQUIRE_PREREQS=1`) fails naming what is missing.
//! - [`docker`]: busybox images imported into the local Docker Engine (no registry).
//! - [`wait`]: polling a condition until it holds, failing after a deadline: the one way tests
//!   synchronise with background work.

pub mod docker;
pub mod prereq;
pub mod wait;

pub use prereq::Prereq;
pub use wait::{DEADLINE, wait_for, wait_for_blocking, wait_until};
