//! The finite state machine: the only code that mutates cluster state.
//!
//! Raft hands every committed [`Command`] to [`Fsm::apply`] with its log
//! index; [`ServerFsm`] applies it to the state store as one transaction
//! stamped with that index.

mod apply;
mod command;

pub use apply::ServerFsm;
#[cfg(test)]
pub(crate) use apply::apply_command;
pub use command::{AllocStop, ApplyResult, Command, DrainComplete, PlanApply, StateImage};

/// What the Raft layer needs from the state machine.
///
/// **Invariant:** `apply` is deterministic: it reads no clock, no randomness
/// and no local configuration, so every server and every replay reach the
/// same state.
pub trait Fsm: Send + Sync + 'static {
    /// Applies one committed command at Raft index `index`.
    fn apply(&self, index: u64, cmd: Command) -> ApplyResult;
    /// Serializes the whole state for a Raft snapshot.
    fn snapshot(&self) -> Result<Vec<u8>, String>;
    /// Replaces the whole state with a snapshot produced by [`Fsm::snapshot`].
    fn restore(&self, data: &[u8]) -> Result<(), String>;
}

#[cfg(test)]
mod tests;
