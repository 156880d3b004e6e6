//! CSI volumes on the servers: the rules, without I/O.
//!
//! ```text
//!  claim.rs        Claim(claim, alloc): read/write claims under the access-mode rules, release
//!  unpublish.rs    taken → unpublishing → node-detached → controller-detached → ready-to-free:
//!                  which step a checkpointed claim runs next, and what each step decides
//!  denormalize.rs  plugin health → volume schedulability; terminal or GC'd allocs → past claims
//!  plugin.rs       node fingerprints → plugin instances and health counts
//!  client_calls.rs ClientCsi: the narrow handle to controller and node plugins on clients
//! ```
//!
//! Everything here is a function of its arguments (a volume, a plugin, the allocs and nodes it
//! names), so the state store, the endpoints, the volume watcher and the scheduler share one
//! copy of Nomad's rules and every state of the claim machine is a unit test.

pub mod claim;
pub mod client_calls;
pub mod denormalize;
pub mod plugin;
pub mod unpublish;

pub use claim::{ClaimError, claim};
pub use client_calls::{ClientCallError, ClientCsi, NoClientCalls};
pub use denormalize::{denormalize_allocs, denormalize_plugin};
pub use unpublish::{UnpublishStep, next_step};
