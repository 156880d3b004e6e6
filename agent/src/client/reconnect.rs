//! The reconnect decision (GH-15068): what a client does with a pulled alloc the servers marked
//! `unknown` while it was away.
//!
//! Only an `unknown` server copy that is newer than the client's (higher `AllocModifyIndex`) and
//! that the servers still want running is *reconnected*: the runner keeps its tasks, records a
//! `Reconnected` event on each, adopts the server's indexes and reports its real state, which
//! lets the servers keep the original alloc. A desired-stop (or evict) `unknown` alloc goes
//! through the ordinary update path and is stopped: the client never resumes an alloc whose
//! server-side desired status is stop.

use nomad_proto::Allocation;

/// True when `update` must go through the runner's reconnect rather than its update. The rule
/// lives with the alloc type ([`Allocation::client_should_reconnect`]) so the servers' protocol
/// tests exercise exactly the decision the client makes.
pub fn should_reconnect(local_alloc_modify_index: u64, update: &Allocation) -> bool {
    update.client_should_reconnect(local_alloc_modify_index)
}

#[cfg(test)]
mod tests {
    use nomad_proto::{ClientStatus, DesiredStatus};

    use super::*;

    #[test]
    fn only_newer_unknown_allocs_the_servers_still_want_are_reconnected() {
        let a = |status, desired, ami| Allocation {
            client_status: status,
            desired_status: desired,
            alloc_modify_index: ami,
            ..Allocation::default()
        };
        assert!(should_reconnect(10, &a(ClientStatus::Unknown, DesiredStatus::Run, 11)));
        assert!(!should_reconnect(10, &a(ClientStatus::Unknown, DesiredStatus::Run, 10)), "not newer");
        assert!(!should_reconnect(10, &a(ClientStatus::Unknown, DesiredStatus::Stop, 11)), "desired stop is stopped");
        assert!(!should_reconnect(10, &a(ClientStatus::Unknown, DesiredStatus::Evict, 11)), "evicted is stopped");
        assert!(!should_reconnect(10, &a(ClientStatus::Running, DesiredStatus::Run, 11)), "not unknown: a plain update");
    }
}
