//! What the server's unit tests share: waiting on the state store (the generic waits are
//! `nomad_testkit`'s).

use std::time::Duration;

pub use nomad_testkit::{DEADLINE, wait_until};

use crate::state::{State, Table};
use crate::testing::TestServer;

/// Waits until `cond` holds on the current state, waking on every change (and every 100 ms);
/// panics after [`DEADLINE`] naming `what`. Returns the state it held on.
pub async fn eventually(ts: &TestServer, what: &str, mut cond: impl FnMut(&State) -> bool) -> State {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let snap = ts.store.snapshot();
        if cond(&snap) {
            return snap;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {DEADLINE:?} waiting for: {what}");
        ts.store.wait_for_change(&Table::ALL, snap.index, Duration::from_millis(100)).await;
    }
}
