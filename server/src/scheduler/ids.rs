//! The IDs a scheduler run gives new allocs and evals, derived from the eval and the
//! snapshot, so a run on the same snapshot and eval makes the same plan, IDs included.
//!
//! Each ID is SHA-256 of (eval ID, snapshot index, a counter), shaped as a UUIDv4. The
//! snapshot index is part of the key because a worker runs an eval again on a newer
//! snapshot when the plan applier refused part of its plan: the allocs it accepted already
//! carry the IDs of the first run, and the second run must not make them again. The same
//! eval is never run twice on the same index with a different outcome committed.

use std::cell::Cell;

use sha2::{Digest, Sha256};

/// Hands out the run's IDs in order.
pub(crate) struct IdSource {
    /// The hash state after the key; each ID adds its counter to a copy.
    keyed: Sha256,
    next: Cell<u64>,
}

impl IdSource {
    /// The IDs of the run of `eval_id` on the snapshot at `snapshot_index`.
    pub(crate) fn new(eval_id: &str, snapshot_index: u64) -> IdSource {
        let mut keyed = Sha256::new();
        keyed.update(b"nomad-rs scheduler ids v1\0");
        keyed.update((eval_id.len() as u64).to_be_bytes());
        keyed.update(eval_id.as_bytes());
        keyed.update(snapshot_index.to_be_bytes());
        IdSource { keyed, next: Cell::new(0) }
    }

    /// The next ID.
    pub(crate) fn next_id(&self) -> String {
        let n = self.next.get();
        self.next.set(n + 1);
        let mut h = self.keyed.clone();
        h.update(n.to_be_bytes());
        let digest = h.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_random_bytes(bytes).into_uuid().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_from_the_eval_and_the_snapshot_and_never_repeat() {
        let (a, b) = (IdSource::new("eval-1", 7), IdSource::new("eval-1", 7));
        let first: Vec<String> = (0..3).map(|_| a.next_id()).collect();
        assert_eq!(first, (0..3).map(|_| b.next_id()).collect::<Vec<_>>());
        assert!(first[0] != first[1] && first[1] != first[2]);
        let parsed = uuid::Uuid::parse_str(&first[0]).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_ne!(IdSource::new("eval-1", 8).next_id(), first[0], "a newer snapshot gives new IDs");
        assert_ne!(IdSource::new("eval-2", 7).next_id(), first[0]);
    }
}
